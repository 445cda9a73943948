//! The RTRS server against a minimal client over loopback, driven by a simulation:
//! the real handshake and READ/WRITE requests with always_invalidate on and off.

use crate::server_util;

use rtrs_spdk::server::{LinkEvent, ServerConfig};
use server_util::{Event, Harness};

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn io_roundtrip(always_invalidate: bool, cores: usize, cid_num: u16) {
    let mut h = Harness::new(cores, Harness::config(always_invalidate));
    let mut p = h.connect("sess-a", cid_num);
    assert_eq!(p.acc.new_rkey, always_invalidate);
    assert_eq!(p.acc.queue_depth, 16);
    assert_eq!(p.acc.max_io_size, 16384 - 4096);
    let max = p.acc.max_io_size;
    let mut off = 0u64;
    for (k, len) in [1u32, 512, 4096, 5000, max - 64].into_iter().enumerate() {
        let cid = 1 + (k as u16 % (cid_num - 1));
        let buf = (k * 3 % 16) as u16;
        let data = pattern(k as u8, len as usize);
        assert_eq!(p.write(&mut h, cid, buf, off, &data), 0, "write {len}");
        let (e, got) = p.read(&mut h, cid, (buf + 1) % 16, off, len, false);
        assert_eq!(e, 0);
        assert_eq!(got, data, "read back {len} bytes");
        // The same with a fast-registered reply key the server must invalidate.
        let (e, got) = p.read(&mut h, cid, (buf + 2) % 16, off, len, true);
        assert_eq!(e, 0);
        assert_eq!(got, data);
        assert!(
            p.events
                .iter()
                .any(|e| matches!(e, Event::Inv { rkey, .. } if *rkey == p.fast[usize::from((buf + 2) % 16)].rkey())),
            "SEND_WITH_INV of the reply key: {:?}",
            p.events
        );
        p.events.clear();
        off += u64::from(len);
    }
    // Admin traffic on cid 0 works too, and every buf id can be reused many times.
    for i in 0..40u16 {
        assert_eq!(p.write(&mut h, 0, i % 16, 0, &[i as u8; 100]), 0);
    }
    // A handler error comes back as the errno.
    let (e, _) = p.read(&mut h, 1, 0, (1 << 20) - 10, 100, false);
    assert_eq!(e, -22);
    let st = h.server.stats();
    assert_eq!(st.sessions.len(), 1);
    assert_eq!(st.sessions[0].name, "sess-a");
    let ps = &st.sessions[0].paths[0];
    assert_eq!(ps.state, "connected");
    assert_eq!((ps.write_cnt, ps.read_cnt), (45, 11));
    assert!(ps.read_bytes > 0 && ps.write_bytes > 0);
    assert_eq!(ps.handler_lat_us_log2.iter().sum::<u64>(), 56);
    assert!(st.to_json().contains("\"write_cnt\":45"));
    let ev = h.shared.events.lock().unwrap().clone();
    assert_eq!(ev.len(), 1);
    assert_eq!(
        (ev[0].1.as_str(), ev[0].2),
        ("sess-a", LinkEvent::Connected)
    );
    h.stop();
}

#[test]
fn read_write_always_invalidate_on() {
    io_roundtrip(true, 2, 3);
}

#[test]
fn read_write_always_invalidate_off() {
    io_roundtrip(false, 2, 3);
}

#[test]
fn read_write_more_cids_than_cores() {
    io_roundtrip(true, 3, 6);
}

#[test]
fn dataless_read_and_write() {
    let mut h = Harness::new(1, Harness::config(true));
    let mut p = h.connect("s", 2);
    assert_eq!(p.write(&mut h, 1, 2, 0, &[]), 0);
    let (e, d) = p.read(&mut h, 1, 3, 0, 0, false);
    assert_eq!((e, d.len()), (0, 0));
    h.stop();
}

#[test]
fn client_disconnect_gives_link_down_and_frees_session() {
    let mut h = Harness::new(2, Harness::config(true));
    let mut p = h.connect("gone", 3);
    assert_eq!(p.write(&mut h, 1, 0, 0, b"abc"), 0);
    p.cons[2].disconnect();
    for _ in 0..2000 {
        h.step();
        p.poll();
        if h.server.session_count() == 0 {
            break;
        }
    }
    assert_eq!(h.server.session_count(), 0, "{:?}", h.server.stats());
    let ev = h.shared.events.lock().unwrap().clone();
    let kinds: Vec<_> = ev.iter().map(|e| e.2).collect();
    assert_eq!(kinds, [LinkEvent::Connected, LinkEvent::Disconnected]);
    // The same client can come back as a new session.
    let mut q = h.connect("gone", 3);
    assert_eq!(q.write(&mut h, 2, 0, 0, b"xyz"), 0);
    h.stop();
}

#[test]
fn two_paths_one_session_and_reconnect_replaces_stale_path() {
    let mut h = Harness::new(2, Harness::config(true));
    let mut a = h.connect("multi", 3);
    // A second path of the same session needs another server address or client
    // address; the loopback client always comes from 127.0.0.1, so listen twice.
    let ids = server_util::client::Ids {
        sess_uuid: rtrs_spdk::common::random_uuid(),
        ..a.ids
    };
    // Same addresses as path a: refused with EEXIST.
    let e = server_util::TestPath::connect(&mut h, "multi", 3, ids, true).err();
    assert_eq!(e, Some(-17));
    assert_eq!(a.write(&mut h, 1, 1, 0, b"one"), 0);
    // A reconnect of path a (new recon_cnt) replaces it at once.
    let re = server_util::client::Ids {
        recon_cnt: a.ids.recon_cnt + 1,
        ..a.ids
    };
    let mut b = server_util::TestPath::connect(&mut h, "multi", 3, re, true).expect("reconnect");
    assert!(a.wait_down(&mut h), "stale path not closed");
    assert_eq!(b.write(&mut h, 2, 1, 8, b"two"), 0);
    let (e, d) = b.read(&mut h, 1, 2, 0, 11, false);
    assert_eq!((e, &d[..]), (0, &b"one\0\0\0\0\0two"[..]));
    // One session throughout: no Disconnected event in between.
    let kinds: Vec<_> = h
        .shared
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|e| e.2)
        .collect();
    assert_eq!(kinds, [LinkEvent::Connected]);
    assert_eq!(h.server.session_count(), 1);
    h.stop();
}

#[test]
fn default_config_is_the_kernels() {
    let c = ServerConfig::default();
    assert_eq!(
        (c.queue_depth, c.chunk_size, c.always_invalidate, c.max_hdr),
        (512, 131072, true, 4096)
    );
    assert_eq!(c.max_io_size(), 126976);
    c.validate().unwrap();
    let bad = ServerConfig {
        chunk_size: 10000,
        ..ServerConfig::default()
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("chunk_size"));
    let bad = ServerConfig {
        queue_depth: 65535,
        chunk_size: 1 << 20,
        ..ServerConfig::default()
    };
    assert!(bad.validate().unwrap_err().to_string().contains("28"));
}

#[test]
fn administrative_close_of_a_session() {
    let mut h = Harness::new(2, Harness::config(true));
    let mut keep = h.connect("keep", 3);
    let mut p = h.connect("drop-me", 3);
    assert_eq!(h.server.close_session("drop-me"), 1);
    assert_eq!(h.server.close_session("no-such"), 0);
    assert!(p.wait_down(&mut h));
    h.sim.run_until_idle(1000);
    let names: Vec<String> = h
        .server
        .stats()
        .sessions
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["keep"]);
    assert_eq!(keep.write(&mut h, 1, 0, 0, b"k"), 0);
    let re = server_util::client::Ids {
        recon_cnt: p.ids.recon_cnt + 1,
        ..p.ids
    };
    let mut q = server_util::TestPath::connect(&mut h, "drop-me", 3, re, true).expect("reconnect");
    assert_eq!(q.write(&mut h, 2, 0, 0, b"q"), 0);
    h.stop();
}

#[test]
fn stop_waits_for_requests_with_the_handler() {
    use std::sync::atomic::Ordering;
    let mut h = Harness::new(2, Harness::config(true));
    let mut p = h.connect("held", 3);
    h.shared.hold.on.store(true, Ordering::SeqCst);
    p.post_write(1, 4, &0u64.to_le_bytes(), b"late");
    for _ in 0..100 {
        h.step();
    }
    assert_eq!(h.shared.hold.held.load(Ordering::SeqCst), 1);
    h.server.stop();
    for _ in 0..500 {
        h.step();
        p.poll();
    }
    assert!(p.down, "stop closes the path");
    assert!(
        !h.server.is_stopped(),
        "a request is still with the handler"
    );
    h.shared.hold.on.store(false, Ordering::SeqCst);
    for _ in 0..500 {
        h.step();
    }
    assert!(h.server.is_stopped());
    let st = h.server.stats();
    assert!(st.sessions.is_empty(), "{st:?}");
}
