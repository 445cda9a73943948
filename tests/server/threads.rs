//! The server on real reactor threads (two, adaptive idle) with the test client on the
//! test thread: over loopback and over tcp on 127.0.0.1. Every wait is bounded.

use crate::server_util;

use std::sync::Arc;

use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::tcp::TcpFabric;
use server_util::client::Ids;
use server_util::{Harness, TestPath, Threaded};

fn exercise(t: &mut Threaded) {
    let mut p = TestPath::connect(t, "threads", 3, Ids::random(), true).expect("connect");
    let mut off = 0u64;
    for (k, len) in [512usize, 4096, 12288].into_iter().enumerate() {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + k) as u8).collect();
        let cid = 1 + (k % 2) as u16;
        assert_eq!(p.write(t, cid, k as u16, off, &data), 0);
        let (e, got) = p.read(t, cid, 8 + k as u16, off, len as u32, k % 2 == 0);
        assert_eq!(e, 0);
        assert_eq!(got, data);
        off += len as u64;
    }
    // A window of requests on both IO connections at once.
    for buf in 0..16u16 {
        p.post_write(
            1 + buf % 2,
            buf,
            &(u64::from(buf) * 64).to_le_bytes(),
            &[buf as u8; 64],
        );
    }
    for buf in 0..16u16 {
        let ev = p.wait_rsp(t, buf);
        assert!(
            matches!(ev, server_util::Event::Rsp { errno: 0, .. }),
            "{ev:?}"
        );
    }
    let st = t.server.stats();
    let ps = &st.sessions[0].paths[0];
    assert_eq!(ps.write_cnt, 19, "{st:?}");
    assert_eq!(ps.handler_lat_us_log2.iter().sum::<u64>(), 22);
}

#[test]
fn threaded_loopback() {
    let f = LoopbackFabric::new();
    let mut t = Threaded::start(Arc::new(f.clone()), Arc::new(f), Harness::config(true));
    exercise(&mut t);
    t.stop();
}

#[test]
fn threaded_tcp() {
    let mut t = Threaded::start(
        Arc::new(TcpFabric::new()),
        Arc::new(TcpFabric::new()),
        Harness::config(false),
    );
    exercise(&mut t);
    t.stop();
}

#[test]
fn threaded_tcp_always_invalidate() {
    let mut t = Threaded::start(
        Arc::new(TcpFabric::new()),
        Arc::new(TcpFabric::new()),
        Harness::config(true),
    );
    exercise(&mut t);
    t.stop();
}

#[test]
fn engine_shutdown_with_a_live_session() {
    let f = LoopbackFabric::new();
    let mut t = Threaded::start(Arc::new(f.clone()), Arc::new(f), Harness::config(true));
    let mut p = TestPath::connect(&mut t, "live", 3, Ids::random(), true).expect("connect");
    assert_eq!(p.write(&mut t, 1, 0, 0, b"x"), 0);
    // No Server::stop: the engine's shutdown hook stops the server's pollers, which
    // close the path and drain.
    let reports = t
        .engine
        .take()
        .unwrap()
        .shutdown()
        .expect("engine shutdown");
    assert!(reports.iter().all(|r| r.drained), "{reports:?}");
    assert!(t.server.is_stopped());
    assert!(p.wait_down(&mut t), "client never saw the path close");
}
