//! The RTRS target inside SPDK (server side, issue 4 §4): SPDK bdevs exported as RNBD
//! devices over RTRS. It is the `rtrs_target` SPDK subsystem (depending on `bdev`, so
//! `save_config` writes it after the bdevs it exports and `--json` replays it after
//! them), configured by the `rtrs_target_*` RPCs ([`rpc`]).
//!
//! State lives in one [`Target`] behind a mutex: RPCs, `config_json` and the
//! subsystem's init/fini all run on the application thread; the data path never takes it.

mod rpc;

use std::sync::{Mutex, MutexGuard};

use rtrs_spdk::spdk::sys;
use serde_json::{json, Value};

pub use rpc::register_rpcs;

/// `rtrs_target_set_options`: the server parameters, fixed once the first listener runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetOptions {
    pub always_invalidate: bool,
    pub queue_depth: u16,
    pub chunk_size: u32,
}

impl Default for TargetOptions {
    fn default() -> Self {
        let d = rtrs_spdk::server::ServerConfig::default();
        TargetOptions {
            always_invalidate: d.always_invalidate,
            queue_depth: d.queue_depth,
            chunk_size: d.chunk_size,
        }
    }
}

/// Everything the target has been told.
#[derive(Default)]
pub struct Target {
    options: TargetOptions,
    /// Whether `rtrs_target_set_options` was called (so `config_json` re-emits it).
    options_set: bool,
}

static TARGET: Mutex<Option<Target>> = Mutex::new(None);

/// The target state (created on first use).
pub fn target() -> MutexGuard<'static, Option<Target>> {
    let mut g = TARGET
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if g.is_none() {
        *g = Some(Target::default());
    }
    g
}

impl Target {
    /// The config entries that rebuild this target (`save_config`).
    pub fn config(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.options_set {
            let o = self.options;
            out.push(json!({
                "method": "rtrs_target_set_options",
                "params": {
                    "always_invalidate": o.always_invalidate,
                    "queue_depth": o.queue_depth,
                    "chunk_size": o.chunk_size,
                }
            }));
        }
        out
    }

    /// `rtrs_target_get_sessions`.
    pub fn sessions(&self) -> Value {
        Value::Array(Vec::new())
    }
}

/// Subsystem init (the shim then calls `spdk_subsystem_init_next`).
#[no_mangle]
pub extern "C" fn rtrs_target_subsystem_init() {
    drop(target());
}

/// Subsystem fini: stops everything, then calls `done` (`spdk_subsystem_fini_next`).
#[no_mangle]
pub extern "C" fn rtrs_target_subsystem_fini(done: Option<unsafe extern "C" fn()>) {
    if let Some(f) = done {
        // SAFETY: SPDK's continuation, called once on the thread that called us.
        unsafe { f() };
    }
}

/// `write_config_json` of the subsystem: an array of RPC calls.
///
/// # Safety
/// `w` is the live write context SPDK passes.
#[no_mangle]
pub unsafe extern "C" fn rtrs_target_write_config_json(w: *mut sys::spdk_json_write_ctx) {
    let entries = target().as_ref().map(Target::config).unwrap_or_default();
    // SAFETY: `w` is live for this callback.
    unsafe { rtrs_spdk::spdk::json::write_value(w, &Value::Array(entries)) };
}
