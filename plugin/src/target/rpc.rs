//! The `rtrs_target_*` RPC methods: decode the parameters (errors name the field), call
//! the target, answer.

use serde_json::Value;

use super::target;
use crate::rpc::{register, rpc_handler, Params, RUNTIME, STARTUP};
use rtrs_spdk::spdk::RpcRequest;

/// Registers the target's methods.
pub fn register_rpcs() {
    register(
        c"rtrs_target_set_options",
        Some(c_set_options),
        STARTUP | RUNTIME,
    );
    register(c"rtrs_target_get_sessions", Some(c_get_sessions), RUNTIME);
}

rpc_handler!(c_set_options => set_options);
rpc_handler!(c_get_sessions => get_sessions);

fn set_options(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_set_options";
    let r = (|| -> Result<(), String> {
        let p = Params::new(M, &v)?;
        p.only(&["always_invalidate", "queue_depth", "chunk_size"])?;
        let mut g = target();
        let t = g.as_mut().ok_or("target state missing")?;
        let mut o = t.options;
        if let Some(b) = p.opt_bool("always_invalidate")? {
            o.always_invalidate = b;
        }
        if let Some(q) = p.opt_uint("queue_depth", u64::from(u16::MAX))? {
            o.queue_depth = q as u16;
        }
        if let Some(c) = p.opt_uint("chunk_size", u64::from(u32::MAX))? {
            o.chunk_size = c as u32;
        }
        let cfg = rtrs_spdk::server::ServerConfig {
            queue_depth: o.queue_depth,
            chunk_size: o.chunk_size,
            always_invalidate: o.always_invalidate,
            ..Default::default()
        };
        cfg.validate().map_err(|e| format!("{M}: {e}"))?;
        t.options = o;
        t.options_set = true;
        Ok(())
    })();
    match r {
        Ok(()) => req.ok(Value::Bool(true)),
        Err(e) => req.invalid(&e),
    }
}

fn get_sessions(req: RpcRequest, v: Value) {
    if let Err(e) = Params::new("rtrs_target_get_sessions", &v).and_then(|p| p.only(&[])) {
        return req.invalid(&e);
    }
    let s = target()
        .as_ref()
        .map(super::Target::sessions)
        .unwrap_or(Value::Array(vec![]));
    req.ok(s);
}
