//! The `rtrs_target_*` RPC methods: decode the parameters (every error names the
//! field), call the [`SpdkTarget`](super::SpdkTarget), answer. Registered for the runtime state,
//! except `rtrs_target_set_options`, which may also run before the framework starts.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;

use super::hosts::{parse_allowed, parse_host};
use super::{with_target, ExportAccess, ExportEntry, TargetOptions};
use crate::rpc::Transport;
use crate::rpc::{register, rpc_handler, RpcParams, RUNTIME, STARTUP};
use rtrs_spdk::spdk::RpcRequest;

/// RTRS's default port.
pub const DEFAULT_PORT: u16 = 1234;

/// Registers the target's methods.
pub fn register_rpcs() {
    register(
        c"rtrs_target_set_options",
        Some(c_set_options),
        STARTUP | RUNTIME,
    );
    register(c"rtrs_target_listen", Some(c_listen), RUNTIME);
    register(c"rtrs_target_stop_listener", Some(c_stop_listener), RUNTIME);
    register(c"rtrs_target_export", Some(c_export), RUNTIME);
    register(c"rtrs_target_unexport", Some(c_unexport), RUNTIME);
    register(
        c"rtrs_target_export_add_host",
        Some(c_export_add_host),
        RUNTIME,
    );
    register(
        c"rtrs_target_export_remove_host",
        Some(c_export_remove_host),
        RUNTIME,
    );
    register(c"rtrs_target_get_exports", Some(c_get_exports), RUNTIME);
    register(c"rtrs_target_get_sessions", Some(c_get_sessions), RUNTIME);
    register(c"rtrs_target_force_close", Some(c_force_close), RUNTIME);
    register(c"rtrs_target_disconnect", Some(c_disconnect), RUNTIME);
}

rpc_handler!(c_set_options => set_options);
rpc_handler!(c_listen => listen);
rpc_handler!(c_stop_listener => stop_listener);
rpc_handler!(c_export => export);
rpc_handler!(c_unexport => unexport);
rpc_handler!(c_export_add_host => export_add_host);
rpc_handler!(c_export_remove_host => export_remove_host);
rpc_handler!(c_get_exports => get_exports);
rpc_handler!(c_get_sessions => get_sessions);
rpc_handler!(c_force_close => force_close);
rpc_handler!(c_disconnect => disconnect);

fn answer(req: RpcRequest, r: Result<(), String>) {
    match r {
        Ok(()) => req.ok(Value::Bool(true)),
        Err(e) => req.invalid(&e),
    }
}

fn set_options(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_set_options";
    let r = (|| -> Result<(), String> {
        let p = RpcParams::new(M, &v)?;
        p.only(&[
            "always_invalidate",
            "queue_depth",
            "chunk_size",
            "handshake_timeout_ms",
            "max_pending",
            "max_pending_per_source",
            "max_sessions",
            "max_sessions_per_source",
            "open_grace_ms",
            "max_path_connections",
            "max_connections",
            "max_connections_per_source",
        ])?;
        with_target(|t| {
            let mut o: TargetOptions = t.options;
            if let Some(b) = p.opt_bool("always_invalidate")? {
                o.always_invalidate = b;
            }
            if let Some(q) = p.opt_uint("queue_depth", u64::from(u16::MAX))? {
                o.queue_depth = q as u16;
            }
            if let Some(c) = p.opt_uint("chunk_size", u64::from(u32::MAX))? {
                o.chunk_size = c as u32;
            }
            let a = &mut o.admission;
            if let Some(ms) = p.opt_uint("handshake_timeout_ms", u64::from(u32::MAX))? {
                a.handshake_timeout = Duration::from_millis(ms);
            }
            if let Some(n) = p.opt_uint("max_pending", u64::from(u32::MAX))? {
                a.max_pending = n as usize;
            }
            if let Some(n) = p.opt_uint("max_pending_per_source", u64::from(u32::MAX))? {
                a.max_pending_per_source = n as usize;
            }
            if let Some(n) = p.opt_uint("max_sessions", u64::from(u32::MAX))? {
                o.max_sessions = n as usize;
            }
            if let Some(n) = p.opt_uint("max_sessions_per_source", u64::from(u32::MAX))? {
                o.max_sessions_per_source = n as usize;
            }
            if let Some(ms) = p.opt_uint("open_grace_ms", u64::from(u32::MAX))? {
                o.open_grace = Duration::from_millis(ms);
            }
            if let Some(n) = p.opt_uint("max_path_connections", u64::from(u16::MAX))? {
                o.max_path_connections = n as u16;
            }
            if let Some(n) = p.opt_uint("max_connections", u64::from(u32::MAX))? {
                o.max_connections = n as usize;
            }
            if let Some(n) = p.opt_uint("max_connections_per_source", u64::from(u32::MAX))? {
                o.max_connections_per_source = n as usize;
            }
            t.set_options(o)
        })
    })();
    answer(req, r);
}

/// `transport`, `addr`, `port` of listen / stop_listener (`extra`: further fields the
/// method takes).
fn endpoint(
    m: &'static str,
    v: &Value,
    extra: &[&str],
) -> Result<(Transport, String, u16, SocketAddr), String> {
    let p = RpcParams::new(m, v)?;
    let mut known = vec!["transport", "addr", "port"];
    known.extend_from_slice(extra);
    p.only(&known)?;
    let transport = p.str("transport")?;
    let transport = Transport::parse(transport).ok_or_else(|| {
        format!("{m}: 'transport' must be \"tcp\" or \"rdma\", got \"{transport}\"")
    })?;
    let addr = p.str("addr")?.to_string();
    let ip: IpAddr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("{m}: 'addr' must be an IPv4 or IPv6 address, got \"{addr}\""))?;
    let port = p
        .opt_uint("port", u64::from(u16::MAX))?
        .map_or(DEFAULT_PORT, |n| n as u16);
    Ok((transport, addr, port, SocketAddr::new(ip, port)))
}

fn listen(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_listen";
    let (transport, addr, port, sa) = match endpoint(M, &v, &["psk"]) {
        Ok(x) => x,
        Err(e) => return req.invalid(&e),
    };
    let psk = match psk_param(M, &v, transport) {
        Ok(k) => k,
        Err(e) => return req.invalid(&e),
    };
    with_target(move |t| t.listen(transport, addr, port, sa, psk, move |r| answer(req, r)));
}

/// The optional `psk`: the name of a key in SPDK's keyring, and the key read from it
/// (tcp only: the rdma transport cannot authenticate).
fn psk_param(
    m: &'static str,
    v: &Value,
    transport: Transport,
) -> Result<Option<(String, rtrs_spdk::fabric::Psk)>, String> {
    let p = RpcParams::new(m, v)?;
    let Some(name) = p.opt_str("psk")? else {
        return Ok(None);
    };
    if name.is_empty() {
        return Err(format!("{m}: 'psk' must name a key, got \"\""));
    }
    if transport != Transport::Tcp {
        return Err(format!(
            "{m}: 'psk' is supported on the tcp transport only (rdma connections cannot be authenticated)"
        ));
    }
    let key = rtrs_spdk::spdk::keyring::psk(name).map_err(|e| format!("{m}: 'psk': {e}"))?;
    Ok(Some((name.to_string(), key)))
}

fn stop_listener(req: RpcRequest, v: Value) {
    let r = endpoint("rtrs_target_stop_listener", &v, &[])
        .and_then(|(tr, addr, port, _)| with_target(|t| t.stop_listener(tr, &addr, port)));
    answer(req, r);
}

fn export(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_export";
    let r = (|| -> Result<(), String> {
        let p = RpcParams::new(M, &v)?;
        p.only(&["bdev_name", "export_name", "access", "allowed_hosts"])?;
        let bdev_name = p.str("bdev_name")?.to_string();
        let export_name = p.opt_str("export_name")?.unwrap_or(&bdev_name).to_string();
        let access = match p.opt_str("access")? {
            None | Some("rw") => ExportAccess::Rw,
            Some("ro") => ExportAccess::Ro,
            Some(other) => {
                return Err(format!(
                    "{M}: 'access' must be \"ro\" or \"rw\", got \"{other}\""
                ))
            }
        };
        let allowed = match v.get("allowed_hosts") {
            None | Some(Value::Null) => None,
            Some(a) => Some(parse_allowed(M, a)?),
        };
        with_target(|t| {
            t.export(
                ExportEntry {
                    bdev_name,
                    export_name,
                    access,
                },
                allowed,
            )
        })
    })();
    answer(req, r);
}

fn unexport(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_unexport";
    let r = RpcParams::new(M, &v).and_then(|p| {
        p.only(&["export_name"])?;
        let name = p.str("export_name")?;
        with_target(|t| t.unexport(name))
    });
    answer(req, r);
}

/// `{export_name, host}` of add_host / remove_host.
fn export_host(
    m: &'static str,
    v: &Value,
) -> Result<(String, rtrs_spdk::rnbd::server::HostPattern), String> {
    let p = RpcParams::new(m, v)?;
    p.only(&["export_name", "host"])?;
    let name = p.str("export_name")?.to_string();
    let host = parse_host(m, "host", p.str("host")?)?;
    Ok((name, host))
}

fn export_add_host(req: RpcRequest, v: Value) {
    let r = export_host("rtrs_target_export_add_host", &v)
        .and_then(|(name, host)| with_target(|t| t.add_host(&name, host)));
    answer(req, r);
}

fn export_remove_host(req: RpcRequest, v: Value) {
    let r = export_host("rtrs_target_export_remove_host", &v)
        .and_then(|(name, host)| with_target(|t| t.remove_host(&name, &host)));
    answer(req, r);
}

fn get_exports(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_get_exports";
    let r = RpcParams::new(M, &v).and_then(|p| {
        p.only(&["export_name"])?;
        let name = p.opt_str("export_name")?.map(str::to_string);
        with_target(|t| t.get_exports(name.as_deref()))
    });
    match r {
        Ok(list) => req.ok(list),
        Err(e) => req.invalid(&e),
    }
}

fn get_sessions(req: RpcRequest, v: Value) {
    if let Err(e) = RpcParams::new("rtrs_target_get_sessions", &v).and_then(|p| p.only(&[])) {
        return req.invalid(&e);
    }
    req.ok(with_target(|t| t.sessions()));
}

/// The kernel server's `force_close`: session `sessname`'s mapping of `export_name` is
/// closed (its IO fails, its writer slot is free, its next OPEN is checked again).
/// Answers the mappings closed.
fn force_close(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_force_close";
    let r = RpcParams::new(M, &v).and_then(|p| {
        p.only(&["export_name", "sessname"])?;
        let export = p.str("export_name")?;
        let sessname = p.str("sessname")?;
        with_target(|t| t.control().force_close(export, sessname)).map_err(|e| format!("{M}: {e}"))
    });
    match r {
        Ok(closed) => req.ok(serde_json::to_value(closed).unwrap_or(Value::Null)),
        Err(e) => req.invalid(&e),
    }
}

/// `rtrs-server`'s `disconnect`: every path of session `sessname`, or only `path` (its
/// `client@server` address or the client's address). Answers how many paths close.
fn disconnect(req: RpcRequest, v: Value) {
    const M: &str = "rtrs_target_disconnect";
    let r = RpcParams::new(M, &v).and_then(|p| {
        p.only(&["sessname", "path"])?;
        let sessname = p.str("sessname")?;
        let path = p.opt_str("path")?;
        with_target(|t| t.control().disconnect(sessname, path)).map_err(|e| format!("{M}: {e}"))
    });
    match r {
        Ok(n) => req.ok(Value::from(n)),
        Err(e) => req.invalid(&e),
    }
}
