//! `rtrs_target_get_sessions`' answer: the RTRS server's session and path statistics
//! (the kernel's `/sys/class/rtrs-server/<session>/paths/<path>/stats`) as JSON. The RPC
//! names the session `sessname` and the path `pathname` (as `bdev_rtrs_create` and the
//! kernel's sysfs do) and adds the transport; the other names are the library's.

use rtrs_spdk::rnbd::server::Opener;
use rtrs_spdk::server::{ServerPathStats, ServerStats, SessionStats};
use serde::Serialize;
use serde_json::{json, Value};

/// One session of `rtrs_target_get_sessions`.
#[derive(Serialize)]
struct SessionJson<'a> {
    transport: &'a str,
    id: u64,
    sessname: &'a str,
    queue_depth: u16,
    chunk_size: u32,
    chunk_memory: &'a str,
    paths: Vec<PathJson<'a>>,
}

/// One path of a session.
#[derive(Serialize)]
struct PathJson<'a> {
    pathname: &'a str,
    addr: &'a str,
    state: &'a str,
    cid_num: u16,
    recon_cnt: u16,
    read_cnt: u64,
    read_bytes: u64,
    write_cnt: u64,
    write_bytes: u64,
    inflight: u64,
    hca_name: Option<&'a str>,
    hca_port: Option<u8>,
    failover_waits: u64,
    failover_dups: u64,
    rsp_queued: u64,
    dropped: u64,
    handler_lat_sum_ns: u64,
    handler_lat_us_log2: &'a [u64],
}

// Both views destructure the library's types, so a statistic added there cannot be left
// out of the RPC answer unnoticed.
impl<'a> PathJson<'a> {
    fn new(p: &'a ServerPathStats) -> Self {
        let ServerPathStats {
            name,
            addr,
            state,
            hca_name,
            hca_port,
            cid_num,
            recon_cnt,
            read_cnt,
            read_bytes,
            write_cnt,
            write_bytes,
            inflight,
            failover_waits,
            failover_dups,
            rsp_queued,
            dropped,
            handler_lat_sum_ns,
            handler_lat_us_log2,
        } = p;
        PathJson {
            pathname: name,
            addr,
            state,
            cid_num: *cid_num,
            recon_cnt: *recon_cnt,
            read_cnt: *read_cnt,
            read_bytes: *read_bytes,
            write_cnt: *write_cnt,
            write_bytes: *write_bytes,
            inflight: *inflight,
            hca_name: hca_name.as_deref(),
            hca_port: *hca_port,
            failover_waits: *failover_waits,
            failover_dups: *failover_dups,
            rsp_queued: *rsp_queued,
            dropped: *dropped,
            handler_lat_sum_ns: *handler_lat_sum_ns,
            handler_lat_us_log2,
        }
    }
}

impl<'a> SessionJson<'a> {
    fn new(transport: &'a str, s: &'a SessionStats) -> Self {
        let SessionStats {
            id,
            name,
            queue_depth,
            chunk_size,
            chunk_memory,
            paths,
        } = s;
        SessionJson {
            transport,
            id: *id,
            sessname: name,
            queue_depth: *queue_depth,
            chunk_size: *chunk_size,
            chunk_memory,
            paths: paths.iter().map(PathJson::new).collect(),
        }
    }
}

/// One object per session of a server on `transport`, with its `devices` (its
/// mappings among `openers`: the kernel's `rnbd-server/sessions/<sess>/`).
pub fn sessions_json(transport: &str, stats: &ServerStats, openers: &[Opener]) -> Vec<Value> {
    stats
        .sessions
        .iter()
        .map(|s| {
            // Integers, strings and arrays with string keys: serialising cannot fail.
            let mut v = serde_json::to_value(SessionJson::new(transport, s))
                .expect("session statistics serialise to JSON");
            let devices: Vec<Value> = openers
                .iter()
                .filter(|o| o.transport == transport && o.session_id == s.id)
                .map(|o| {
                    json!({
                        "device_id": o.device_id,
                        "export_name": o.export,
                        "access_mode": o.access_mode,
                        "opened_at": o.opened_at,
                    })
                })
                .collect();
            v["devices"] = Value::Array(devices);
            v
        })
        .collect()
}
