//! Shared RPC glue: registering a method with `spdk_rpc_register_method`, turning a Rust
//! handler `fn(RpcRequest, Value)` into the C callback SPDK calls, and decoding
//! parameters into typed values with errors that name the field.

use std::ffi::CStr;

use rtrs_spdk::spdk::sys;
use serde_json::Value;

/// The RPC may run before the framework is initialized (`--json` start-up phase).
pub const STARTUP: u32 = sys::SPDK_RPC_STARTUP;
/// The RPC may run once the application runs.
pub const RUNTIME: u32 = sys::SPDK_RPC_RUNTIME;

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

/// Typed access to an RPC's parameter object; every error names the field.
pub struct Params<'a> {
    method: &'static str,
    obj: Option<&'a serde_json::Map<String, Value>>,
}

impl<'a> Params<'a> {
    /// The parameters of `method`; `null` counts as an empty object.
    ///
    /// # Errors
    /// A message saying the params must be an object.
    pub fn new(method: &'static str, v: &'a Value) -> Result<Params<'a>, String> {
        match v {
            Value::Null => Ok(Params { method, obj: None }),
            Value::Object(m) => Ok(Params {
                method,
                obj: Some(m),
            }),
            _ => Err(format!("{method}: params must be a JSON object")),
        }
    }

    /// Refuses names outside `known`.
    ///
    /// # Errors
    /// A message naming the unknown field.
    pub fn only(&self, known: &[&str]) -> Result<(), String> {
        if let Some(m) = self.obj {
            if let Some(k) = m.keys().find(|k| !known.contains(&k.as_str())) {
                return Err(format!(
                    "{}: unknown parameter '{k}' (known: {})",
                    self.method,
                    known.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.obj.and_then(|m| m.get(name)).filter(|v| !v.is_null())
    }

    /// A string field, if present.
    ///
    /// # Errors
    /// When present but not a string.
    pub fn opt_str(&self, name: &str) -> Result<Option<&'a str>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!(
                "{}: '{name}' must be a string, got {v}",
                self.method
            )),
        }
    }

    /// A required string field.
    ///
    /// # Errors
    /// Missing or not a string.
    pub fn str(&self, name: &str) -> Result<&'a str, String> {
        self.opt_str(name)?
            .ok_or_else(|| format!("{}: missing required parameter '{name}'", self.method))
    }

    /// An unsigned integer field within `0..=max`, if present.
    ///
    /// # Errors
    /// Not a non-negative integer, or above `max`.
    pub fn opt_uint(&self, name: &str, max: u64) -> Result<Option<u64>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n <= max => Ok(Some(n)),
                Some(n) => Err(format!("{}: '{name}' = {n} is above {max}", self.method)),
                None => Err(format!(
                    "{}: '{name}' must be a non-negative integer, got {v}",
                    self.method
                )),
            },
        }
    }

    /// A boolean field, if present.
    ///
    /// # Errors
    /// When present but not a boolean.
    pub fn opt_bool(&self, name: &str) -> Result<Option<bool>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(format!(
                "{}: '{name}' must be true or false, got {v}",
                self.method
            )),
        }
    }
}
