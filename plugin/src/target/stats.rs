//! `rtrs_target_get_sessions`' answer: the RTRS server's session and path statistics
//! (the kernel's `/sys/class/rtrs-server/<session>/paths/<path>/stats`) as JSON.

use rtrs_spdk::server::ServerStats;
use serde_json::{json, Value};

/// One object per session of a server on `transport`.
pub fn sessions_json(transport: &str, stats: &ServerStats) -> Vec<Value> {
    stats
        .sessions
        .iter()
        .map(|s| {
            let paths: Vec<Value> = s
                .paths
                .iter()
                .map(|p| {
                    json!({
                        "pathname": p.name,
                        "addr": p.addr,
                        "state": p.state,
                        "cid_num": p.cid_num,
                        "recon_cnt": p.recon_cnt,
                        "read_cnt": p.read_cnt,
                        "read_bytes": p.read_bytes,
                        "write_cnt": p.write_cnt,
                        "write_bytes": p.write_bytes,
                        "inflight": p.inflight,
                        "failover_waits": p.failover_waits,
                        "failover_dups": p.failover_dups,
                        "rsp_queued": p.rsp_queued,
                        "dropped": p.dropped,
                        "handler_lat_sum_ns": p.handler_lat_sum_ns,
                        "handler_lat_us_log2": p.handler_lat_us_log2,
                    })
                })
                .collect();
            json!({
                "transport": transport,
                "id": s.id,
                "sessname": s.name,
                "queue_depth": s.queue_depth,
                "chunk_size": s.chunk_size,
                "chunk_memory": s.chunk_memory,
                "paths": paths,
            })
        })
        .collect()
}
