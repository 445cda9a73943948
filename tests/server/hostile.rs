//! Hostile peers: every malformed connection request is refused with the right errno,
//! and every malformed INFO_REQ or IO request closes only the offending path while
//! another session keeps working.

use crate::server_util;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use rtrs_spdk::common::random_uuid;
use rtrs_spdk::fabric::{CmEvent, Conn, ConnState, SendOp, SendWr};
use rtrs_spdk::proto::{to_imm, ConnReq, ImmType, RdmaWrite, HB_MSG_IMM};
use server_util::client::{info_req, raw_connect, raw_connect_from, Ids};
use server_util::{Harness, TestPath, MAX_STEPS};

const ECONNRESET: i32 = -104;

fn req(cid: u16, cid_num: u16, first: bool) -> [u8; 56] {
    ConnReq::new(cid, cid_num, 1, random_uuid(), random_uuid(), first)
        .to_bytes()
        .unwrap()
}

#[test]
fn bad_conn_requests_are_refused_with_errno() {
    let mut h = Harness::new(2, Harness::config(true));
    let mut b = req(0, 2, true);
    b[2] ^= 0xff; // magic
    assert_eq!(raw_connect(&mut h, &b).err(), Some(ECONNRESET));
    let mut b = req(0, 2, true);
    b[5] = 3; // major version 3
    assert_eq!(raw_connect(&mut h, &b).err(), Some(ECONNRESET));
    let mut b = req(0, 2, true);
    b[6..8].copy_from_slice(&2u16.to_le_bytes()); // cid == cid_num
    assert_eq!(raw_connect(&mut h, &b).err(), Some(ECONNRESET));
    let mut b = req(0, 2, true);
    b[8..10].copy_from_slice(&0u16.to_le_bytes()); // cid_num 0
    assert_eq!(raw_connect(&mut h, &b).err(), Some(ECONNRESET));
    let mut b = req(0, 2, true);
    b[8..10].copy_from_slice(&5000u16.to_le_bytes()); // cid_num > 4096
    assert_eq!(raw_connect(&mut h, &b).err(), Some(ECONNRESET));
    assert_eq!(
        raw_connect(&mut h, &req(0, 2, true)[..20]).err(),
        Some(ECONNRESET)
    );
    // Unknown session without first_conn.
    assert_eq!(raw_connect(&mut h, &req(0, 2, false)).err(), Some(-6));
    assert_eq!(h.server.session_count(), 0);
    // A path whose cid_num changes between its connections, and a duplicate cid.
    let ids = Ids::random();
    let r = |cid, n| {
        ConnReq::new(cid, n, 1, ids.sess_uuid, ids.paths_uuid, true)
            .to_bytes()
            .unwrap()
    };
    let _c0 = raw_connect(&mut h, &r(0, 3)).expect("cid 0");
    assert_eq!(raw_connect(&mut h, &r(1, 4)).err(), Some(ECONNRESET));
    assert_eq!(raw_connect(&mut h, &r(0, 3)).err(), Some(ECONNRESET));
    let _c1 = raw_connect(&mut h, &r(1, 3)).expect("cid 1");
    // Still usable by a well-behaved client.
    let mut p = h.connect("fine", 2);
    assert_eq!(p.write(&mut h, 1, 0, 0, b"ok"), 0);
    h.stop();
}

fn from(ip: &str) -> Option<SocketAddr> {
    Some(SocketAddr::new(ip.parse().unwrap(), 0))
}

/// Steps until the server has closed `c` (bounded); whether it did.
fn closed_by_server(h: &mut Harness, c: &mut Box<dyn Conn>) -> bool {
    for _ in 0..MAX_STEPS {
        h.step();
        match c.poll_cm() {
            Some(CmEvent::Disconnected | CmEvent::Error { .. }) => return true,
            Some(ev) => panic!("unexpected {ev:?}"),
            None => {}
        }
    }
    false
}

/// Steps a while and checks `c` is still up.
fn still_up(h: &mut Harness, c: &mut Box<dyn Conn>) -> bool {
    for _ in 0..200 {
        h.step();
        if c.poll_cm().is_some() {
            return false;
        }
    }
    c.state() == ConnState::Connected
}

#[test]
fn sessions_being_set_up_evict_the_oldest_of_the_busiest_source() {
    let cfg = rtrs_spdk::server::ServerConfig {
        max_pending_sessions: 2,
        ..Harness::config(true)
    };
    let mut h = Harness::new(1, cfg);
    let addr = h.addr;
    // Two half-open sessions from 127.0.0.5 fill the cap.
    let (mut a, _) =
        raw_connect_from(&mut h, from("127.0.0.5"), addr, &req(0, 2, true)).expect("a");
    let (mut b, _) =
        raw_connect_from(&mut h, from("127.0.0.5"), addr, &req(0, 2, true)).expect("b");
    // A newcomer (from 127.0.0.1) is not refused: the oldest of 127.0.0.5 gives way.
    let mut p = h.connect("newcomer", 2);
    assert_eq!(p.write(&mut h, 1, 0, 0, b"ok"), 0);
    assert!(
        closed_by_server(&mut h, &mut a),
        "the oldest half-open session stays"
    );
    assert!(still_up(&mut h, &mut b), "the younger one was closed too");
    assert_eq!(h.server.session_count(), 2, "{:?}", h.server.stats());
    h.stop();
}

#[test]
fn sessions_being_set_up_are_capped_per_source() {
    let mut cfg = Harness::config(true);
    cfg.admission.max_pending_per_source = 1;
    let mut h = Harness::new(1, cfg);
    let addr = h.addr;
    let (mut a, _) =
        raw_connect_from(&mut h, from("127.0.0.5"), addr, &req(0, 2, true)).expect("a");
    let (mut b, _) =
        raw_connect_from(&mut h, from("127.0.0.5"), addr, &req(0, 2, true)).expect("b");
    assert!(
        closed_by_server(&mut h, &mut a),
        "127.0.0.5 holds two sessions being set up"
    );
    let (mut c, _) =
        raw_connect_from(&mut h, from("127.0.0.6"), addr, &req(0, 2, true)).expect("c");
    assert!(
        still_up(&mut h, &mut b),
        "another source's newcomer evicted 127.0.0.5's session"
    );
    assert!(still_up(&mut h, &mut c));
    // A complete session from a third source gets through.
    let mut p = h.connect("fine", 2);
    assert_eq!(p.write(&mut h, 1, 0, 0, b"ok"), 0);
    h.stop();
}

/// A path with cid 0 of 3 connected and no INFO_REQ: closed once `timeout_s` passed
/// since its connection request (at the next periodic check, at most a second later),
/// not before.
fn half_open_path_is_closed_at(cfg: rtrs_spdk::server::ServerConfig, timeout_s: u64) {
    let mut h = Harness::new(1, cfg);
    let ids = Ids::random();
    let r = ConnReq::new(0, 3, 1, ids.sess_uuid, ids.paths_uuid, true)
        .to_bytes()
        .unwrap();
    let (mut c0, _) = raw_connect(&mut h, &r).expect("cid 0");
    assert_eq!(h.server.session_count(), 1);
    // Virtual time: just before the deadline the path is still there.
    h.sim
        .run_for(timeout_s * 1_000_000_000 - 300_000_000, 100_000_000);
    assert!(still_up(&mut h, &mut c0), "closed before {timeout_s} s");
    assert_eq!(h.server.session_count(), 1);
    h.sim.run_for(1_500_000_000, 100_000_000);
    assert!(
        closed_by_server(&mut h, &mut c0),
        "still open after {timeout_s} s + 1 s"
    );
    h.sim.run_until_idle(1000);
    assert_eq!(h.server.session_count(), 0, "{:?}", h.server.stats());
    h.stop();
}

#[test]
fn connections_of_a_path_come_from_its_address_and_within_its_cap() {
    let cfg = rtrs_spdk::server::ServerConfig {
        max_path_connections: 8,
        ..Harness::config(true)
    };
    let mut h = Harness::new(2, cfg);
    let addr = h.addr;
    let from = |last: u8| Some(SocketAddr::from(([127, 0, 0, last], 0)));
    // A path asking for more connections than a path may have: refused at once.
    assert_eq!(
        raw_connect_from(&mut h, from(2), addr, &req(0, 9, true)).err(),
        Some(-libc::EINVAL)
    );
    assert_eq!(h.server.session_count(), 0);
    // The uuids travel in clear: a connection of another host's path, still being made,
    // is refused; the path's own host makes it.
    let ids = Ids::random();
    let r = |cid| {
        ConnReq::new(cid, 3, 1, ids.sess_uuid, ids.paths_uuid, true)
            .to_bytes()
            .unwrap()
    };
    let _c0 = raw_connect_from(&mut h, from(2), addr, &r(0)).expect("cid 0");
    assert_eq!(
        raw_connect_from(&mut h, from(3), addr, &r(1)).err(),
        Some(ECONNRESET)
    );
    let _c1 = raw_connect_from(&mut h, from(2), addr, &r(1)).expect("cid 1 from its host");
}

#[test]
fn half_open_path_is_closed_at_the_default_handshake_timeout() {
    half_open_path_is_closed_at(Harness::config(true), 5);
}

#[test]
fn half_open_path_is_closed_at_a_configured_handshake_timeout() {
    let mut cfg = Harness::config(true);
    cfg.admission.handshake_timeout = std::time::Duration::from_secs(2);
    half_open_path_is_closed_at(cfg, 2);
}

fn bad_info(info: [u8; 272]) {
    let mut h = Harness::new(2, Harness::config(true));
    let mut good = h.connect("good", 2);
    let addr = h.addr;
    let r = TestPath::connect_info(&mut h, addr, &info, 2, Ids::random(), true);
    assert_eq!(r.err(), Some(-1), "the server must close the path");
    assert_eq!(good.write(&mut h, 1, 3, 0, b"still here"), 0);
    h.stop();
}

#[test]
fn info_req_without_nul_closes_path() {
    let mut b = info_req("x");
    b[2..257].fill(b'a');
    bad_info(b);
}

#[test]
fn info_req_with_slash_or_dot_closes_path() {
    let mut b = info_req("abc");
    b[3] = b'/';
    bad_info(b);
    let mut b = info_req("abc");
    b[4] = b'.';
    bad_info(b);
}

#[test]
fn info_req_bad_type_closes_path() {
    let mut b = info_req("abc");
    b[0] = 1;
    bad_info(b);
}

#[test]
fn info_req_name_of_another_session_closes_path() {
    let mut h = Harness::new(2, Harness::config(false));
    let mut good = h.connect("taken", 2);
    let r = TestPath::connect(&mut h, "taken", 2, Ids::random(), true);
    assert_eq!(r.err(), Some(-1));
    assert_eq!(good.write(&mut h, 1, 3, 0, b"still here"), 0);
    h.stop();
}

/// Runs `attack` on a fresh path and checks that only that path closes.
fn only_attacker_closes(always_invalidate: bool, qd: u16, attack: impl FnOnce(&mut TestPath)) {
    let cfg = rtrs_spdk::server::ServerConfig {
        queue_depth: qd,
        ..Harness::config(always_invalidate)
    };
    let mut h = Harness::new(2, cfg);
    let mut good = h.connect("good", 3);
    let mut bad = h.connect("bad", 3);
    assert_eq!(bad.write(&mut h, 1, 0, 0, b"warm-up"), 0);
    attack(&mut bad);
    assert!(bad.wait_down(&mut h), "the attacking path was not closed");
    assert_eq!(good.write(&mut h, 2, 1, 64, b"good data"), 0);
    let (e, d) = good.read(&mut h, 1, 2, 64, 9, true);
    assert_eq!((e, &d[..]), (0, &b"good data"[..]));
    for _ in 0..200 {
        h.step();
    }
    let st = h.server.stats();
    assert_eq!(st.sessions.len(), 1, "{st:?}");
    assert_eq!(st.sessions[0].name, "good");
    h.stop();
}

fn io_imm(qd: u16, buf_id: u32, offset: u32) -> u32 {
    let mem_bits = 28 - rtrs_spdk::proto::chunk_bits(qd);
    to_imm(ImmType::IoReq, buf_id << mem_bits | offset)
}

#[test]
fn buf_id_beyond_queue_depth() {
    for ai in [true, false] {
        only_attacker_closes(ai, 12, |p| p.post_raw(1, 0, 0, &[], io_imm(12, 13, 8)));
    }
}

#[test]
fn offset_beyond_chunk() {
    only_attacker_closes(true, 16, |p| p.post_raw(1, 0, 0, &[], io_imm(16, 1, 20000)));
}

#[test]
fn usr_len_above_offset() {
    only_attacker_closes(true, 16, |p| {
        let t = RdmaWrite { usr_len: 200 }.to_bytes();
        let mut b = vec![0u8; 100];
        b.extend_from_slice(&t);
        p.post_raw(1, 2, 0, &b, io_imm(16, 2, 100));
    });
}

#[test]
fn usr_len_above_max_hdr() {
    only_attacker_closes(false, 16, |p| {
        let t = RdmaWrite { usr_len: 5000 }.to_bytes();
        let mut b = vec![0u8; 6000];
        b.extend_from_slice(&t);
        p.post_raw(1, 2, 0, &b, io_imm(16, 2, 6000));
    });
}

#[test]
fn trailer_beyond_chunk_end() {
    only_attacker_closes(false, 16, |p| {
        // A READ header two bytes before the chunk end: its descriptor would lie outside.
        let off = 16384 - 10;
        let mut b = [0u8; 10];
        b[0] = 3; // READ
        b[6] = 1; // sg_cnt 1
        p.post_raw(1, 2, off, &b, io_imm(16, 2, off));
    });
}

#[test]
fn read_desc_longer_than_data() {
    for ai in [true, false] {
        only_attacker_closes(ai, 16, |p| {
            let base = p.reply.addr();
            p.post_read(1, 3, &[0; 8], 512, false);
            // Rewrite the descriptor's len (at usr 8 + hdr 8 + addr 8 + key 4) to 4096.
            let mut t = [0u8; 24];
            t[0] = 3;
            t[6] = 1;
            t[8..16].copy_from_slice(&base.to_le_bytes());
            t[16..20].copy_from_slice(&p.reply.rkey().to_le_bytes());
            t[20..24].copy_from_slice(&4096u32.to_le_bytes());
            let mut b = vec![0u8; 8];
            b.extend_from_slice(&t);
            p.post_raw(1, 4, 512, &b, io_imm(16, 4, 520));
        });
    }
}

#[test]
fn read_sg_cnt_two() {
    only_attacker_closes(true, 16, |p| {
        let mut b = [0u8; 8 + 8 + 32];
        b[8] = 3;
        b[14] = 2; // sg_cnt 2
        p.post_raw(1, 5, 100, &b, io_imm(16, 5, 108));
    });
}

#[test]
fn unknown_trailer_type() {
    only_attacker_closes(true, 16, |p| {
        let b = [7u8, 0, 0, 0];
        p.post_raw(1, 6, 0, &b, io_imm(16, 6, 0));
    });
}

#[test]
fn unknown_imm_type() {
    only_attacker_closes(true, 16, |p| {
        p.post_raw(1, 0, 0, &[], to_imm(ImmType::IoReq, 0) | 5 << 28)
    });
}

#[test]
fn response_imm_from_client() {
    only_attacker_closes(true, 16, |p| p.post_raw(2, 0, 0, &[], 0x1000_0003));
}

#[test]
fn heartbeat_on_io_connection() {
    only_attacker_closes(true, 16, |p| p.post_raw(2, 0, 0, &[], HB_MSG_IMM));
}

#[test]
fn send_on_io_connection() {
    only_attacker_closes(false, 16, |p| {
        let sge = [p.stage.sge(0, 16)];
        p.cons[1]
            .post_send(&[SendWr {
                wr_id: 1,
                op: SendOp::Send,
                sges: &sge,
                signaled: false,
            }])
            .unwrap();
    });
}

#[test]
fn write_past_chunk_pool_breaks_the_connection() {
    only_attacker_closes(true, 16, |p| {
        // Under always_invalidate the key covers one chunk: writing past it is a
        // remote access error at the fabric, which breaks the connection.
        p.post_raw(1, 7, 16380, &[1; 64], io_imm(16, 7, 16380));
    });
}

#[test]
fn duplicate_in_flight_buf_id_closes_path() {
    for ai in [true, false] {
        let mut h = Harness::new(2, Harness::config(ai));
        let mut good = h.connect("good", 3);
        let mut bad = h.connect("bad", 3);
        h.shared.hold.on.store(true, Ordering::SeqCst);
        bad.post_write(1, 9, &0u64.to_le_bytes(), b"first");
        for _ in 0..100 {
            h.step();
        }
        assert_eq!(h.shared.hold.held.load(Ordering::SeqCst), 1);
        // Same buf id again on the same path while the first is with the handler.
        let t = RdmaWrite { usr_len: 8 }.to_bytes();
        let mut b = vec![0u8; 8];
        b.extend_from_slice(&t);
        if ai {
            // The chunk key was revoked: the client cannot even write the chunk, so
            // send the imm alone (a zero-length write checks no key).
            bad.post_raw(2, 9, 0, &[], io_imm(16, 9, 8));
        } else {
            bad.post_raw(2, 9, 0, &b, io_imm(16, 9, 8));
        }
        assert!(bad.wait_down(&mut h), "duplicate buf id not detected");
        h.shared.hold.on.store(false, Ordering::SeqCst);
        assert_eq!(good.write(&mut h, 1, 9, 0, b"good"), 0);
        h.stop();
    }
}
