//! What an rtrs bdev says of itself: its `bdev_rtrs_get_sessions` entry (also the
//! `rtrs` object of `bdev_get_bdevs`' driver_specific) and the `bdev_rtrs_create`
//! parameters that rebuild it (`save_config`).

use rtrs_spdk::client::Session;
use serde_json::{json, Value};

use super::disk::Disk;
use super::params::access_name;

/// `bdev_rtrs_create`'s params as they would rebuild this disk now.
pub fn config(disk: &Disk) -> Value {
    let paths = disk.paths.lock().map(|p| p.clone()).unwrap_or_default();
    disk.params.to_json(disk.policy(), &paths)
}

/// `bdev_rtrs_get_sessions`' entry.
pub fn describe(disk: &Disk) -> Value {
    let stats: Value = disk
        .session()
        .and_then(|s| serde_json::from_str(&s.stats().to_json()).ok())
        .unwrap_or(Value::Null);
    let paths: Vec<Value> = disk.session().map_or_else(Vec::new, |s| {
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
    let state = disk.state_name();
    let mut v = json!({
        "name": disk.params.name,
        "sessname": disk.params.sessname,
        "device": disk.params.device,
        "access_mode": access_name(disk.params.access_mode),
        "mp_policy": disk.policy().name(),
        "write_zeroes": disk.params.write_zeroes.as_str(),
        "state": state,
        "paths_up": disk.session().map_or(0, Session::paths_up),
        "paths": paths,
        "stats": stats,
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
        });
    }
    v
}
