//! The client side's JSON-RPC methods: decode the parameters (errors name the field),
//! call the disk's API, answer. `bdev_rtrs_create` answers later, when OPEN completes and
//! the bdev is registered.
//! Like every bdev-creating method in SPDK it is a RUNTIME method: `--json` configurations
//! replay it right after the subsystems are initialized (in the STARTUP phase the bdev
//! and accel layers do not exist yet, so a bdev registered then has no channels).
//! The kernel's counterparts are `rnbd-clt`'s sysfs files (`map_device`, `unmap_device`,
//! `remap_device`, `resize`) and `rtrs-clt`'s (`add_path`, `remove_path`, a path's
//! `reconnect` and `disconnect`, `max_reconnect_attempts`, `mpath_policy`, the stats).
//! `bdev_rtrs_remap` answers once the target answered its OPEN.

use std::ffi::{c_void, CString};
use std::sync::Arc;

use rtrs_spdk::spdk::{sys, RpcRequest};
use rtrs_spdk::sync::lock;
use serde_json::{json, Value};

use super::fabric::client_fabric;
use super::group::Home;
use super::info::describe_session;
use super::module::{self, module_ptr};
use super::params::{
    decode_path_rpc, opt_str, parse_loss_timeout, parse_policy, parse_reconnect_attempts,
    path_keys, req_str, CreateParams, PathParam,
};
use super::sess::disk::{self, errno_str, find, CreateError, Disk};
use super::sess::{self, SessHome};
use crate::rpc::{register, rpc_handler, RpcParams, RUNTIME};

rpc_handler!(c_create => create);
rpc_handler!(c_delete => delete);
rpc_handler!(c_get_sessions => get_sessions);
rpc_handler!(c_add_path => add_path);
rpc_handler!(c_remove_path => remove_path);
rpc_handler!(c_set_mp_policy => set_mp_policy);
rpc_handler!(c_reset_stats => reset_stats);
rpc_handler!(c_disconnect_path => disconnect_path);
rpc_handler!(c_reconnect_path => reconnect_path);
rpc_handler!(c_set_session_options => set_session_options);
rpc_handler!(c_remap => remap);

/// Registers the `bdev_rtrs_*` methods.
pub fn register_rpcs() {
    register(c"bdev_rtrs_create", Some(c_create), RUNTIME);
    register(c"bdev_rtrs_delete", Some(c_delete), RUNTIME);
    register(c"bdev_rtrs_get_sessions", Some(c_get_sessions), RUNTIME);
    register(c"bdev_rtrs_add_path", Some(c_add_path), RUNTIME);
    register(c"bdev_rtrs_remove_path", Some(c_remove_path), RUNTIME);
    register(c"bdev_rtrs_set_mp_policy", Some(c_set_mp_policy), RUNTIME);
    register(c"bdev_rtrs_reset_stats", Some(c_reset_stats), RUNTIME);
    register(
        c"bdev_rtrs_disconnect_path",
        Some(c_disconnect_path),
        RUNTIME,
    );
    register(c"bdev_rtrs_reconnect_path", Some(c_reconnect_path), RUNTIME);
    register(
        c"bdev_rtrs_set_session_options",
        Some(c_set_session_options),
        RUNTIME,
    );
    register(c"bdev_rtrs_remap", Some(c_remap), RUNTIME);
}

/// Answered once the disk is open and its bdev registered (with the bdev's name), or
/// with why not.
fn create(req: RpcRequest, v: Value) {
    let params = match CreateParams::decode(&v) {
        Ok(p) => p,
        Err(e) => return req.invalid(&e),
    };
    let name = params.name.clone();
    disk::create(
        params,
        || Home::get().map(|h| h as Arc<dyn SessHome>),
        Box::new(move |opened| {
            let registered = opened.and_then(|d| {
                module::register(d).map_err(|why| {
                    let msg = d.open_failed(&why);
                    d.sess.close_device(d);
                    CreateError::OpenFailed(msg)
                })
            });
            match registered {
                Ok(()) => req.ok(json!(name)),
                Err(CreateError::Invalid(e)) => req.invalid(&e),
                Err(CreateError::NoMemory(e)) => req.error(-libc::ENOMEM, &e),
                Err(CreateError::OpenFailed(e)) => req.error(-libc::ENODEV, &e),
            }
        }),
    );
}

/// The open disk named by the `name` parameter.
fn named(method: &'static str, v: &Value, known: &[&str]) -> Result<Arc<Disk>, String> {
    let p = RpcParams::new(method, v)?;
    p.only(known)?;
    let name = req_str(method, v, "name")?;
    find(name).ok_or_else(|| format!("{method}: 'name' = {name:?}: no rtrs bdev of that name"))
}

struct Unregister {
    req: RpcRequest,
}

unsafe extern "C" fn unregistered(arg: *mut c_void, rc: i32) {
    // SAFETY: the box given to spdk_bdev_unregister, returned once.
    let u = unsafe { Box::from_raw(arg.cast::<Unregister>()) };
    if rc == 0 {
        u.req.ok(json!(true));
    } else {
        u.req
            .error(rc, &format!("bdev_rtrs_delete: {}", errno_str(rc)));
    }
}

fn delete(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_delete";
    let d = match named(M, &v, &["name"]) {
        Ok(d) => d,
        Err(e) => return req.invalid(&e),
    };
    if !d.is_open() {
        return req.invalid(&format!(
            "{M}: 'name' = {:?}: the bdev is still being created or already being deleted",
            d.name()
        ));
    }
    let name = CString::new(d.name()).unwrap_or_default();
    let arg = Box::into_raw(Box::new(Unregister { req })).cast::<c_void>();
    // SAFETY: unregister by name on the RPC (application) thread; the callback takes
    // the box back exactly once.
    let rc = unsafe {
        sys::spdk_bdev_unregister_by_name(name.as_ptr(), module_ptr(), Some(unregistered), arg)
    };
    if rc != 0 {
        // SAFETY: not queued: the box is still ours.
        let u = unsafe { Box::from_raw(arg.cast::<Unregister>()) };
        u.req.error(
            rc,
            &format!("{M}: spdk_bdev_unregister_by_name: {}", errno_str(rc)),
        );
    }
}

fn get_sessions(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_get_sessions";
    let p = match RpcParams::new(M, &v) {
        Ok(p) => p,
        Err(e) => return req.invalid(&e),
    };
    if let Err(e) = p.only(&["name"]) {
        return req.invalid(&e);
    }
    match opt_str(M, &v, "name") {
        Err(e) => req.invalid(&e),
        Ok(Some(name)) => match find(name) {
            Some(d) => req.ok(json!([describe_session(&d.sess)])),
            None => req.invalid(&format!(
                "{M}: 'name' = {name:?}: no rtrs bdev of that name"
            )),
        },
        Ok(None) => {
            let all: Vec<Value> = sess::all()
                .iter()
                .filter(|s| !s.is_down())
                .map(|s| describe_session(s))
                .collect();
            req.ok(Value::Array(all));
        }
    }
}

/// Decodes a path method's parameters and finds its bdev, whose session must be open.
fn path_rpc(m: &'static str, v: &Value) -> Result<(Arc<Disk>, PathParam), String> {
    let (name, path) = decode_path_rpc(m, v, m == "bdev_rtrs_add_path")?;
    let d =
        find(&name).ok_or_else(|| format!("{m}: 'name' = {name:?}: no rtrs bdev of that name"))?;
    if d.sess.session().is_none() {
        return Err(format!(
            "{m}: 'name' = {name:?}: the session is not open yet"
        ));
    }
    Ok((d, path))
}

/// Logs that a session method acted on the whole session, naming its devices.
fn acted(m: &str, d: &Disk, what: &str) {
    let devs: Vec<String> = d
        .sess
        .devices()
        .iter()
        .map(|x| x.name().to_string())
        .collect();
    tracing::info!(
        "{m}: {what} on session {:?}, shared by bdev(s) {}",
        d.sess.sessname,
        devs.join(", ")
    );
}

fn add_path(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_add_path";
    let (d, path) = match path_rpc(M, &v) {
        Ok(x) => x,
        Err(e) => return req.invalid(&e),
    };
    // The path's fabric must open (rdma: an RDMA device) before anything else is said.
    if let Err(e) = client_fabric(path.transport) {
        return req.invalid(&format!(
            "{M}: 'transport' = {:?}: {e}",
            path.transport.as_str()
        ));
    }
    let psk = match path_keys(std::slice::from_ref(&path), |_| String::new()) {
        Ok(mut k) => k.pop().map(|(_, k)| k),
        Err(e) => return req.invalid(&format!("{M}: {e}")),
    };
    let s = d.sess.session().expect("path_rpc checked the session");
    let mut paths = lock(&d.sess.paths);
    if paths.iter().any(|p| p.addr == path.addr) {
        return req.invalid(&format!(
            "{M}: 'dst_addr': path {} is already part of the session",
            path.addr
        ));
    }
    if paths.first().is_some_and(|p| p.transport != path.transport) {
        return req.invalid(&format!(
            "{M}: 'transport' = {}: the session's paths use {}",
            path.transport.as_str(),
            paths[0].transport.as_str()
        ));
    }
    s.add_path_psk(path.addr, psk);
    acted(M, &d, &format!("path {} added", path.addr));
    paths.push(path);
    d.sess.home.kick();
    req.ok(json!(true));
}

/// The session path `path` names (its source address is optional: matched on the
/// destination when absent), in `paths`.
fn find_path(m: &str, d: &Disk, paths: &[PathParam], path: &PathParam) -> Result<usize, String> {
    paths
        .iter()
        .position(|p| {
            p.addr.dst == path.addr.dst && (path.addr.src.is_none() || p.addr.src == path.addr.src)
        })
        .ok_or_else(|| {
            format!(
                "{m}: 'dst_addr'/'port' = {}: no such path in session {:?}",
                path.addr.dst, d.sess.sessname
            )
        })
}

fn remove_path(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_remove_path";
    let (d, path) = match path_rpc(M, &v) {
        Ok(x) => x,
        Err(e) => return req.invalid(&e),
    };
    let s = d.sess.session().expect("path_rpc checked the session");
    let mut paths = lock(&d.sess.paths);
    let i = match find_path(M, &d, &paths, &path) {
        Ok(i) => i,
        Err(e) => return req.invalid(&e),
    };
    if paths.len() == 1 {
        return req.invalid(&format!(
            "{M}: 'dst_addr' = {}: the last path of a session cannot be removed (delete the bdev)",
            path.addr.dst
        ));
    }
    s.remove_path(paths[i].addr);
    acted(M, &d, &format!("path {} removed", paths[i].addr));
    paths.remove(i);
    d.sess.home.kick();
    req.ok(json!(true));
}

fn set_mp_policy(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_set_mp_policy";
    let d = match named(M, &v, &["name", "mp_policy"]) {
        Ok(d) => d,
        Err(e) => return req.invalid(&e),
    };
    let p = match req_str(M, &v, "mp_policy").map(str::to_string) {
        Ok(s) => s,
        Err(e) => return req.invalid(&e),
    };
    let policy = match parse_policy(M, "mp_policy", &p) {
        Ok(x) => x,
        Err(e) => return req.invalid(&e),
    };
    match d.sess.session() {
        Some(s) => {
            s.set_policy(policy);
            acted(M, &d, &format!("policy set to {}", policy.name()));
            req.ok(json!(true));
        }
        None => req.invalid(&format!(
            "{M}: 'name' = {:?}: the session is not open yet",
            d.name()
        )),
    }
}

/// The kernel's `reset_all` (rtrs-clt's stats): the bdev's session counts every path's
/// statistics from now on (gauges such as in-flight stay as they are).
fn reset_stats(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_reset_stats";
    let d = match named(M, &v, &["name"]) {
        Ok(d) => d,
        Err(e) => return req.invalid(&e),
    };
    match d.sess.session() {
        Some(s) => {
            s.reset_stats();
            acted(M, &d, "statistics reset");
            req.ok(json!(true));
        }
        None => req.invalid(&format!(
            "{M}: 'name' = {:?}: the session is not open yet",
            d.name()
        )),
    }
}

/// `rtrs-clt`'s per-path `disconnect` (`reconnect: false`: the path stays closed until a
/// reconnect) and `reconnect` (`true`: torn down if up and connected again now, its
/// attempt count reset), for the session of the bdev named.
fn path_now(req: RpcRequest, v: Value, reconnect: bool) {
    let m = if reconnect {
        "bdev_rtrs_reconnect_path"
    } else {
        "bdev_rtrs_disconnect_path"
    };
    let (d, path) = match path_rpc(m, &v) {
        Ok(x) => x,
        Err(e) => return req.invalid(&e),
    };
    let s = d.sess.session().expect("path_rpc checked the session");
    let paths = lock(&d.sess.paths);
    let addr = match find_path(m, &d, &paths, &path) {
        Ok(i) => paths[i].addr,
        Err(e) => return req.invalid(&e),
    };
    drop(paths);
    if reconnect {
        s.reconnect_path(addr);
        acted(m, &d, &format!("path {addr} reconnects"));
    } else {
        s.disconnect_path(addr);
        acted(m, &d, &format!("path {addr} disconnected"));
    }
    d.sess.home.kick();
    req.ok(json!(true));
}

fn disconnect_path(req: RpcRequest, v: Value) {
    path_now(req, v, false);
}

fn reconnect_path(req: RpcRequest, v: Value) {
    path_now(req, v, true);
}

/// The session settings that change at run time: `max_reconnect_attempts` (the
/// kernel's sysfs file), `reconnect_delay_sec` and `loss_timeout_sec`, for the session of
/// the bdev named (every device of it; `save_config` writes them). Every field is
/// checked before anything changes.
fn set_session_options(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_set_session_options";
    let r = (|| -> Result<(), String> {
        let d = named(
            M,
            &v,
            &[
                "name",
                "max_reconnect_attempts",
                "reconnect_delay_sec",
                "loss_timeout_sec",
            ],
        )?;
        let p = RpcParams::new(M, &v)?;
        let mut live = d.sess.live();
        if let Some(n) = parse_reconnect_attempts(M, v.get("max_reconnect_attempts"))? {
            live.max_reconnect_attempts = n;
        }
        if let Some(n) = p.opt_uint("reconnect_delay_sec", 3600)? {
            live.reconnect_delay_sec = n;
        }
        if let Some(n) = parse_loss_timeout(M, v.get("loss_timeout_sec"))? {
            live.loss_timeout_sec = n;
        }
        d.sess
            .set_live(live)
            .map_err(|e| format!("{M}: 'name' = {:?}: {e}", d.name()))?;
        acted(
            M,
            &d,
            &format!(
                "max_reconnect_attempts {}, reconnect_delay_sec {}, loss_timeout_sec {}",
                live.max_reconnect_attempts, live.reconnect_delay_sec, live.loss_timeout_sec
            ),
        );
        Ok(())
    })();
    match r {
        Ok(()) => req.ok(json!(true)),
        Err(e) => req.invalid(&e),
    }
}

/// The kernel client's `remap_device` (and `resize`): OPEN the bdev's device again and
/// follow the answer: the size the target has now (given to the bdev layer), and a
/// device the target closed mapped again if its host list and access rules allow.
/// Answered once the target answered, with the device's id and size.
fn remap(req: RpcRequest, v: Value) {
    const M: &str = "bdev_rtrs_remap";
    let d = match named(M, &v, &["name"]) {
        Ok(d) => d,
        Err(e) => return req.invalid(&e),
    };
    if !d.is_open() || d.sess.session().is_none() {
        return req.invalid(&format!(
            "{M}: 'name' = {:?}: the bdev is still being created or already being deleted",
            d.name()
        ));
    }
    let name = d.name().to_string();
    // One OPEN answers every remap asked for while it is out.
    let asked = d.remapping();
    d.add_remap(Box::new(move |r| match r {
        Ok(info) => req.ok(json!({
            "name": name,
            "device_id": info.device_id,
            "size": info.size,
            "num_blocks": info.size / u64::from(info.logical_block_size),
            "block_size": info.logical_block_size,
        })),
        Err(e) => req.error(-libc::EIO, &format!("{M}: 'name' = {name:?}: {e}")),
    }));
    if !asked {
        d.sess.remap(&d);
    }
}
