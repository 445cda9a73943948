//! One session cannot touch another's memory: attacks by a second session on a victim's
//! chunks while the victim has READs in flight, over loopback (simulated reactors) and
//! over tcp on 127.0.0.1 (real reactor threads); and the session caps.
//!
//! The attacker knows what a real one could at best learn: the victim's chunk addresses
//! and current keys (the test reads them off the victim), the kernel's next key of each
//! (`inc_rkey`), and guesses of the key byte. Each attempt is an RDMA WRITE with an
//! immediate into a victim chunk on the attacker's own connection, which belongs to the
//! attacker's protection domain: every one must be refused (the attacker's path goes
//! down with a remote access error), and the victim's READs must return exactly what it
//! wrote. Every wait is bounded; nothing is timed.

use crate::server_util;

use std::sync::Arc;

use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{inc_rkey, next_rkey, SendOp, SendWr, WcStatus};
use rtrs_spdk::server::ServerConfig;
use server_util::client::{Ids, TestPath};
use server_util::{Driver, Event, Harness, Threaded};

const BS: usize = 4096;

/// The victim's data at RAM offset `off`.
fn pattern(off: u64) -> Vec<u8> {
    (0..BS)
        .map(|i| (off as usize / BS * 131 + i * 7 + 3) as u8)
        .collect()
}

/// One attack attempt from a fresh session of the attacker's: a plain RDMA WRITE (no
/// immediate, so no request of the attacker's own follows it) of 0xEE bytes into the
/// victim's chunk at `addr` under `rkey`. It must be refused: the attacker's path goes
/// down with a remote access error. (Were it accepted, the path would stay up.)
fn attempt(h: &mut dyn Driver, n: usize, addr: u64, rkey: u32) {
    let mut a = TestPath::connect(h, &format!("attacker-{n}"), 2, Ids::random(), true)
        .expect("the attacker's own session");
    a.stage.write_at(0, &[0xEE; BS]);
    let sge = [a.stage.sge(0, BS)];
    a.cons[1]
        .post_send(&[SendWr {
            wr_id: 77,
            op: SendOp::RdmaWrite {
                remote_addr: addr,
                rkey,
            },
            sges: &sge,
            signaled: true,
        }])
        .expect("post");
    assert!(
        a.wait_down(h),
        "attempt {n}: a write into another session's chunk was not refused"
    );
    assert!(
        a.events.iter().any(|e| matches!(
            e,
            Event::Error {
                status: WcStatus::RemoteAccess,
                ..
            }
        )),
        "attempt {n}: {:?}",
        a.events
    );
}

/// The attack: `rounds` rounds; in each, one chunk of the victim's is idle with a live
/// key (the one its last response installed) while the victim's READs are in flight on
/// every other chunk, and the attacker tries that key, the kernel's next one and a
/// guess. Then every READ is checked byte by byte.
fn attack(h: &mut dyn Driver, rounds: usize) {
    let mut v = TestPath::connect(h, "victim", 2, Ids::random(), true).expect("victim");
    let qd = v.acc.queue_depth;
    for b in 0..qd {
        let off = u64::from(b) * BS as u64;
        assert_eq!(v.write(h, 1, b, off, &pattern(off)), 0);
    }
    let (mut attempts, mut reads) = (0, 0);
    for round in 0..rounds {
        let idle = (round % usize::from(qd)) as u16;
        let busy: Vec<u16> = (0..qd).filter(|&b| b != idle).collect();
        for &b in &busy {
            let off = u64::from(b) * BS as u64;
            v.post_read(1, b, &off.to_le_bytes(), BS as u32, true);
        }
        let (addr, key) = v.rbuf[usize::from(idle)];
        for rkey in [key, inc_rkey(key), next_rkey(key)] {
            attempt(h, attempts, addr, rkey);
            attempts += 1;
        }
        for &b in &busy {
            match v.wait_rsp(h, b) {
                Event::Rsp { errno: 0, .. } => {}
                e => panic!("victim READ of chunk {b}: {e:?}"),
            }
            let off = u64::from(b) * BS as u64;
            let mut got = vec![0u8; BS];
            v.reply.read_at(usize::from(b) * v.cs(), &mut got);
            let bad = got
                .iter()
                .zip(pattern(off))
                .filter(|(g, w)| **g != *w)
                .count();
            assert_eq!(bad, 0, "round {round}: {bad} corrupted bytes in chunk {b}");
            reads += 1;
        }
        assert!(!v.down, "the victim's path went down");
    }
    // And the chunks the attacker aimed at still serve the victim's data.
    for b in 0..qd {
        let off = u64::from(b) * BS as u64;
        let (e, got) = v.read(h, 1, b, off, BS as u32, true);
        assert_eq!((e, got == pattern(off)), (0, true), "chunk {b} at the end");
    }
    assert!(reads >= 200, "only {reads} READs");
    assert_eq!(attempts, 3 * rounds);
}

#[test]
fn another_session_cannot_write_a_victims_chunks_loopback() {
    let mut h = Harness::new(2, Harness::config(true));
    // 14 rounds of 15 READs in flight.
    attack(&mut h, 14);
    h.stop();
}

#[test]
fn another_session_cannot_write_a_victims_chunks_tcp() {
    let mut t = Threaded::start(
        Arc::new(TcpFabric::new()),
        Arc::new(TcpFabric::new()),
        Harness::config(true),
    );
    attack(&mut t, 14);
    t.stop();
}

#[test]
fn without_always_invalidate_the_pool_key_is_the_sessions_own_too() {
    let mut h = Harness::new(2, Harness::config(false));
    attack(&mut h, 14);
    h.stop();
}

/// Connects a session named `name` from source address `ip`.
fn from(h: &mut Harness, ip: [u8; 4], name: &str) -> Result<TestPath, i32> {
    let (src, addr) = (Some(std::net::SocketAddr::from((ip, 0))), h.addr);
    TestPath::connect_info_from(
        h,
        src,
        addr,
        &server_util::client::info_req(name),
        2,
        Ids::random(),
        true,
    )
}

/// Caps: two established sessions in all, one per source; the sessions beyond are
/// refused with −EUSERS (which the client reports at once: `client::refusal`), and a
/// place freed by a session that goes is taken again.
#[test]
fn established_sessions_are_capped_in_all_and_per_source() {
    let cfg = ServerConfig {
        max_sessions: 2,
        max_sessions_per_source: 1,
        ..Harness::config(true)
    };
    let mut h = Harness::new(2, cfg);
    let a = from(&mut h, [127, 0, 0, 2], "a").expect("the first session");
    assert_eq!(
        from(&mut h, [127, 0, 0, 2], "b").err(),
        Some(-libc::EUSERS),
        "a second session from one source"
    );
    let _c = from(&mut h, [127, 0, 0, 3], "c").expect("another source");
    assert_eq!(
        from(&mut h, [127, 0, 0, 4], "d").err(),
        Some(-libc::EUSERS),
        "a third session in all"
    );
    // The first one goes: its place is free once the server has let it go.
    drop(a);
    let mut admitted = None;
    for _ in 0..200 {
        for _ in 0..50 {
            h.step();
        }
        match from(&mut h, [127, 0, 0, 4], "e") {
            Ok(p) => {
                admitted = Some(p);
                break;
            }
            Err(e) => assert_eq!(e, -libc::EUSERS),
        }
    }
    assert!(admitted.is_some(), "the freed place was never taken");
    h.stop();
}
