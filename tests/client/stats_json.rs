//! The statistics JSON of the client (`ClientStats`; the server's is pinned the same way
//! in the server tests): golden strings pin every key, its nesting, order and JSON type
//! (scripts and the SPDK RPCs read these names), and names with quotes, backslashes and
//! control characters still give valid JSON that parses back to the same text.

use rtrs_spdk::client::stats::{ClientPathStats as ClientPath, RdmaStats, WcStats};
use rtrs_spdk::client::ClientStats;
use serde_json::Value;

/// Names a hand-written escaper tends to get wrong.
const NASTY: &str = "q\"b\\s/n\nt\tc\u{1}e\u{7f}é✓";

fn client_path(path: &str) -> ClientPath {
    ClientPath {
        path: path.into(),
        state: "connected".into(),
        hca_name: Some("mlx5_1".into()),
        hca_port: Some(1),
        failure: None,
        last_error: Some("cid 0: \"reset\"".into()),
        cur_latency_ns: 1500,
        rdma: RdmaStats {
            read_cnt: 1,
            read_bytes: 2,
            write_cnt: 3,
            write_bytes: 4,
            inflight: 5,
            failover_cnt: 6,
        },
        reconnects_ok: 20,
        reconnects_fail: 7,
        cpu_migration_from: vec![8, 9],
        cpu_migration_to: vec![10, 11],
        sg_entries: vec![12, 13],
        wc_completion: WcStats {
            polls: 14,
            completions: 15,
            max_per_poll: 16,
        },
        latency_hist: vec![17, 18],
        direct_reads: 19,
    }
}

#[test]
fn client_golden() {
    let st = ClientStats {
        sessname: "sess".into(),
        mp_policy: "min-inflight".into(),
        paths: vec![client_path("127.0.0.1:1@127.0.0.2:2")],
    };
    assert_eq!(
        st.to_json(),
        concat!(
            r#"{"sessname":"sess","mp_policy":"min-inflight","paths":[{"#,
            r#""path":"127.0.0.1:1@127.0.0.2:2","state":"connected","hca_name":"mlx5_1","#,
            r#""hca_port":1,"failure":null,"last_error":"cid 0: \"reset\"","#,
            r#""cur_latency_ns":1500,"#,
            r#""rdma":{"read_cnt":1,"read_bytes":2,"write_cnt":3,"write_bytes":4,"#,
            r#""inflight":5,"failover_cnt":6},"#,
            r#""reconnects":{"successful":20,"failed":7},"#,
            r#""cpu_migration_from":[8,9],"cpu_migration_to":[10,11],"sg_entries":[12,13],"#,
            r#""wc_completion":{"polls":14,"completions":15,"max_per_poll":16},"#,
            r#""latency_hist_log2_ns":[17,18],"direct_reads":19}]}"#,
        )
    );
    let empty = ClientStats::default().to_json();
    assert_eq!(empty, r#"{"sessname":"","mp_policy":"","paths":[]}"#);
}

#[test]
fn client_escapes() {
    let st = ClientStats {
        sessname: NASTY.into(),
        mp_policy: "round-robin".into(),
        paths: vec![ClientPath {
            state: format!("{NASTY}!"),
            failure: Some(format!("{NASTY}?")),
            ..client_path(&format!("{NASTY}@x"))
        }],
    };
    let j = st.to_json();
    let v: Value = serde_json::from_str(&j).unwrap_or_else(|e| panic!("{e}: {j}"));
    assert_eq!(v["sessname"], NASTY, "{j}");
    assert_eq!(v["paths"][0]["path"], format!("{NASTY}@x"), "{j}");
    assert_eq!(v["paths"][0]["state"], format!("{NASTY}!"), "{j}");
    assert_eq!(v["paths"][0]["failure"], format!("{NASTY}?"), "{j}");
    // Control characters never appear raw (JSON forbids them in strings).
    assert!(!j.chars().any(|c| (c as u32) < 0x20), "{j}");
}
