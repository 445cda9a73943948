//! Shared RPC glue: registering a method with `spdk_rpc_register_method` and turning a
//! Rust handler `fn(RpcRequest, Value)` into the C callback SPDK calls; parameters are
//! decoded with [`RpcParams`] (errors name the field).

use std::ffi::CStr;

use rtrs_spdk::spdk::sys;

/// The RPC may run before the framework is initialized (`--json` start-up phase).
pub const STARTUP: u32 = sys::SPDK_RPC_STARTUP;
/// The RPC may run once the application runs.
pub const RUNTIME: u32 = sys::SPDK_RPC_RUNTIME;

/// The fabric of a path or a listener, as every RPC names it (`trtype`-style: "tcp" or
/// "rdma", either case).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Rdma,
}

impl Transport {
    /// The name `save_config` writes.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }

    /// `s` as a transport; `None` for any other name (the caller's error names the field).
    pub fn parse(s: &str) -> Option<Transport> {
        match s {
            "tcp" | "TCP" => Some(Transport::Tcp),
            "rdma" | "RDMA" => Some(Transport::Rdma),
            _ => None,
        }
    }
}

/// Registers `handler` as method `name` for the given states.
pub fn register(name: &'static CStr, handler: sys::spdk_rpc_method_handler, state_mask: u32) {
    // SAFETY: `name` is a static C string, as SPDK keeps the pointer; the handler is a
    // valid extern "C" function for the whole life of the library.
    unsafe { sys::spdk_rpc_register_method(name.as_ptr(), handler, state_mask) };
}

/// Defines `extern "C" fn $c(request, params)` calling `$rust(RpcRequest, Value)`.
macro_rules! rpc_handler {
    ($c:ident => $rust:path) => {
        unsafe extern "C" fn $c(
            request: *mut rtrs_spdk::spdk::sys::spdk_jsonrpc_request,
            params: *const rtrs_spdk::spdk::sys::spdk_json_val,
        ) {
            // SAFETY: SPDK hands the handler a live request and its parsed params.
            let value = unsafe { rtrs_spdk::spdk::json::params_to_value(params) };
            // SAFETY: the running handler's request, answered once through the wrapper.
            if let Some(req) = unsafe { rtrs_spdk::spdk::RpcRequest::from_raw(request) } {
                $rust(req, value);
            }
        }
    };
}
pub(crate) use rpc_handler;

pub use rtrs_spdk::spdk::json::RpcParams;
