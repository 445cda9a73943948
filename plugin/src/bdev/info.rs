//! What the rtrs bdevs say of themselves: a session's `bdev_rtrs_get_sessions` entry
//! (the session once, with its devices), a bdev's `rtrs` object in `bdev_get_bdevs`'
//! driver_specific (the device and its session), and the `bdev_rtrs_create` parameters
//! that rebuild a bdev (`save_config`).

use rtrs_spdk::client::ClientSession;
use serde_json::{json, Value};

use super::params::access_name;
use super::sess::disk::Disk;
use super::sess::Sess;

/// `bdev_rtrs_create`'s params as they would rebuild this disk now (over its session's
/// paths as they are now).
pub fn config(disk: &Disk) -> Value {
    let paths = disk
        .sess
        .paths
        .lock()
        .map(|p| p.clone())
        .unwrap_or_default();
    disk.params
        .to_json(disk.policy(), &paths, &disk.sess.live())
}

/// `bdev_rtrs_get_sessions`' entry of a session: its paths and statistics once, and its
/// devices.
pub fn describe_session(sess: &Sess) -> Value {
    let devices: Vec<Value> = sess.devices().iter().map(|d| device(d)).collect();
    let mut v = session(sess);
    v["devices"] = Value::Array(devices);
    v
}

/// The `rtrs` object of a bdev's driver_specific: the device, and its session's paths.
pub fn describe(disk: &Disk) -> Value {
    let mut v = session(&disk.sess);
    if let (Value::Object(o), Value::Object(d)) = (&mut v, device(disk)) {
        o.extend(d);
    }
    v
}

/// One device.
fn device(disk: &Disk) -> Value {
    let mut v = json!({
        "name": disk.params.name,
        "device": disk.params.device,
        "access_mode": access_name(disk.params.access_mode),
        "write_zeroes": disk.params.write_zeroes.as_str(),
        "state": disk.state_name(),
        "device_state": disk.sess.device_state(disk).map(|s| s.to_string()),
    });
    if let Some(i) = disk.info() {
        v["device_info"] = json!({
            "device_id": i.device_id,
            "size": i.size,
            "logical_block_size": i.logical_block_size,
            "physical_block_size": i.physical_block_size,
            "max_io_size": i.max_io_size,
            "max_discard": i.max_discard,
            "max_write_zeroes": i.max_write_zeroes,
            "server_max_write_zeroes": i.server_max_write_zeroes,
            "write_cache": i.write_cache,
            "fua": i.fua,
            "discard_granularity": i.discard_granularity,
            "discard_alignment": i.discard_alignment,
            "io_boundary": i.io_boundary,
        });
    }
    v
}

/// A session: its paths, policy and statistics.
fn session(sess: &Sess) -> Value {
    let s = sess.session();
    let stats: Value = s
        .and_then(|s| serde_json::from_str(&s.stats().to_json()).ok())
        .unwrap_or(Value::Null);
    let paths: Vec<Value> = s.map_or_else(Vec::new, |s| {
        s.paths()
            .into_iter()
            .map(|(a, st)| {
                let mut p = json!({"path": a.to_string(), "state": st.name()});
                if let Some(f) = s.path_failure(a) {
                    p["failure"] = json!(f);
                }
                p
            })
            .collect()
    });
    let policy = s.map_or(sess.settings.mp_policy, ClientSession::policy);
    let live = sess.live();
    json!({
        "sessname": sess.sessname,
        "mp_policy": policy.name(),
        "max_reconnect_attempts": live.max_reconnect_attempts,
        "reconnect_delay_sec": live.reconnect_delay_sec,
        "loss_timeout_sec": live.loss_timeout_sec,
        "paths_up": s.map_or(0, ClientSession::paths_up),
        "paths": paths,
        "stats": stats,
    })
}
