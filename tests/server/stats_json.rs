//! The statistics JSON of the server (`ServerStats`; the client's is pinned the same way
//! in the client tests): golden strings pin every key, its nesting, order and JSON type
//! (scripts and the SPDK RPCs read these names), and names with quotes, backslashes and
//! control characters still give valid JSON that parses back to the same text.

use rtrs_spdk::server::{ServerPathStats as ServerPath, ServerStats, SessionStats};
use serde_json::Value;

/// Names a hand-written escaper tends to get wrong.
const NASTY: &str = "q\"b\\s/n\nt\tc\u{1}e\u{7f}é✓";

fn server_path(name: &str) -> ServerPath {
    ServerPath {
        name: name.into(),
        addr: "127.0.0.1:1@127.0.0.2:2".into(),
        state: "connected",
        hca_name: None,
        hca_port: None,
        cid_num: 3,
        recon_cnt: 4,
        read_cnt: 5,
        read_bytes: 6,
        write_cnt: 7,
        write_bytes: 8,
        inflight: 9,
        failover_waits: 10,
        failover_dups: 16,
        rsp_queued: 11,
        dropped: 12,
        handler_lat_sum_ns: 13,
        handler_lat_us_log2: vec![14, 15],
    }
}

#[test]
fn server_golden() {
    let st = ServerStats {
        sessions: vec![SessionStats {
            id: 2,
            name: "sess".into(),
            queue_depth: 512,
            chunk_size: 131_072,
            chunk_memory: "heap",
            paths: vec![server_path("p0")],
        }],
    };
    assert_eq!(
        st.to_json(),
        concat!(
            r#"{"sessions":[{"id":2,"name":"sess","queue_depth":512,"chunk_size":131072,"#,
            r#""chunk_memory":"heap","paths":[{"name":"p0","addr":"127.0.0.1:1@127.0.0.2:2","#,
            r#""state":"connected","hca_name":null,"hca_port":null,"cid_num":3,"recon_cnt":4,"read_cnt":5,"read_bytes":6,"#,
            r#""write_cnt":7,"write_bytes":8,"inflight":9,"failover_waits":10,"failover_dups":16,"#,
            r#""rsp_queued":11,"dropped":12,"handler_lat_sum_ns":13,"#,
            r#""handler_lat_us_log2":[14,15]}]}]}"#,
        )
    );
    assert_eq!(ServerStats::default().to_json(), r#"{"sessions":[]}"#);
}

#[test]
fn server_escapes() {
    let st = ServerStats {
        sessions: vec![SessionStats {
            name: NASTY.into(),
            paths: vec![ServerPath {
                addr: format!("{NASTY}@y"),
                ..server_path(&format!("{NASTY}#p"))
            }],
            ..SessionStats::default()
        }],
    };
    let j = st.to_json();
    let v: Value = serde_json::from_str(&j).unwrap_or_else(|e| panic!("{e}: {j}"));
    assert_eq!(v["sessions"][0]["name"], NASTY, "{j}");
    assert_eq!(v["sessions"][0]["paths"][0]["name"], format!("{NASTY}#p"));
    assert_eq!(v["sessions"][0]["paths"][0]["addr"], format!("{NASTY}@y"));
    assert!(!j.chars().any(|c| (c as u32) < 0x20), "{j}");
}
