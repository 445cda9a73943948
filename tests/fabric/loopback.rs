//! The loopback fabric beyond the shared contract: fault injection (break, blackhole,
//! held delivery, refused posts), determinism, and ends polled from two threads.

use crate::conformance;
use crate::counting;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use conformance::{
    connect, next_wc, pattern, read, settle, wait_both_disconnected, wait_wr, wr, Backend, Pair,
    DEADLINE,
};
use rtrs_spdk::fabric::loopback::{Faults, LoopbackFabric};
use rtrs_spdk::fabric::{
    Access, CmEvent, Conn, ConnState, Fabric, MemBuf, Mr, PostErrorKind, QpCaps, RecvWr, SendOp,
    Wc, WcOpcode, WcStatus,
};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

struct Loopback(Arc<LoopbackFabric>);

impl Backend for Loopback {
    fn server_fabric(&self) -> Arc<dyn Fabric> {
        self.0.clone()
    }
    fn client_fabric(&self) -> Arc<dyn Fabric> {
        self.0.clone()
    }
    fn listen_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }
}

/// A connected pair plus the fault controls of both ends.
fn faulty_pair() -> (Pair, Faults, Faults) {
    let fabric = Arc::new(LoopbackFabric::new());
    let p = connect(&Loopback(fabric.clone()));
    let client = fabric.faults(&*p.client.conn).expect("client faults");
    let server = fabric.faults(&*p.server.conn).expect("server faults");
    (p, client, server)
}

/// Posts an RDMA_WRITE_WITH_IMM of `seed`'s pattern from the client into `dst`.
fn client_write_imm(p: &mut Pair, dst: &Mr, seed: u8, wr_id: u64) -> Mr {
    let src = p.client.reg(256, Access::NONE);
    src.write_at(0, &pattern(seed, 256));
    let sges = [src.sge(0, 256)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        imm: seed as u32,
    };
    p.client.post_send(&[wr(wr_id, op, &sges)]);
    src
}

fn no_cm_events(conn: &mut dyn Conn) -> bool {
    conn.poll_cm().is_none()
}

#[test]
fn break_now_flushes_and_disconnects_both_ends() {
    let (mut p, faults, _) = faulty_pair();
    let buf = p.server.reg(64, Access::LOCAL_WRITE);
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: Some(buf.sge(0, 64)),
    }]);
    p.client.post_recv(&[RecvWr {
        wr_id: 2,
        sge: None,
    }]);
    faults.break_now();
    let wc = wait_wr(&mut p.client, &mut p.server, 2);
    assert_eq!(wc.status, WcStatus::WrFlush, "{wc:?}");
    let wc = wait_wr(&mut p.server, &mut p.client, 1);
    assert_eq!(wc.status, WcStatus::WrFlush, "{wc:?}");
    wait_both_disconnected(&mut p);
    let err = p
        .client
        .conn
        .post_recv(&[RecvWr {
            wr_id: 3,
            sge: None,
        }])
        .unwrap_err();
    assert_eq!(err.kind, PostErrorKind::NotConnected);
}

#[test]
fn blackhole_loses_everything_silently() {
    let (mut p, faults, _) = faulty_pair();
    let dst = p.server.reg(256, RW);
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }]);
    faults.blackhole();
    let _src = client_write_imm(&mut p, &dst, 7, 2);
    settle(&mut p.client, &mut p.server);
    assert!(
        p.server.drain_wcs().is_empty(),
        "a blackholed operation arrived"
    );
    assert!(
        p.client.drain_wcs().is_empty(),
        "a blackholed operation completed"
    );
    assert!(
        read(&dst, 0, 256).iter().all(|&x| x == 0),
        "blackholed data landed"
    );
    assert_eq!(
        p.server.conn.state(),
        ConnState::Connected,
        "nobody is told"
    );
    // Even a disconnect does not cross: only the local end learns of it.
    p.client.conn.disconnect();
    assert_eq!(p.client.conn.poll_cm(), Some(CmEvent::Disconnected));
    settle(&mut p.client, &mut p.server);
    assert!(
        no_cm_events(&mut *p.server.conn),
        "the peer heard through a blackhole"
    );
    assert_eq!(p.server.conn.state(), ConnState::Connected);
}

#[test]
fn held_delivery_waits_for_release() {
    let (mut p, _, server) = faulty_pair();
    let dst = p.server.reg(256, RW);
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }]);
    server.hold();
    let _src = client_write_imm(&mut p, &dst, 8, 2);
    settle(&mut p.client, &mut p.server);
    assert!(p.server.drain_wcs().is_empty(), "delivered while held");
    assert!(
        read(&dst, 0, 256).iter().all(|&x| x == 0),
        "data landed while held"
    );
    server.release();
    let wc = wait_wr(&mut p.server, &mut p.client, 1);
    assert_eq!((wc.status, wc.imm), (WcStatus::Success, Some(8)), "{wc:?}");
    assert_eq!(read(&dst, 0, 256), pattern(8, 256));
    let wc = wait_wr(&mut p.client, &mut p.server, 2);
    assert_eq!(wc.status, WcStatus::Success);
}

#[test]
fn hold_for_polls_counts_the_receivers_polls() {
    let (mut p, _, server) = faulty_pair();
    let dst = p.server.reg(256, RW);
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }]);
    server.hold_for_polls(5);
    let _src = client_write_imm(&mut p, &dst, 9, 2);
    let mut wcs = [Wc::default(); 4];
    for poll in 0..5 {
        assert_eq!(
            p.server.conn.poll_cq(&mut wcs),
            0,
            "delivered at held poll {poll}"
        );
    }
    assert_eq!(
        p.server.conn.poll_cq(&mut wcs),
        1,
        "delivered at the first poll after the hold"
    );
    assert_eq!(
        (wcs[0].wr_id, wcs[0].opcode),
        (1, WcOpcode::RecvRdmaWithImm)
    );
}

#[test]
fn injected_post_failures_post_nothing() {
    let (mut p, client, _) = faulty_pair();
    let dst = p.server.reg(256, RW);
    p.server.post_recv(&[
        RecvWr {
            wr_id: 1,
            sge: None,
        },
        RecvWr {
            wr_id: 2,
            sge: None,
        },
    ]);
    client.fail_posts(2);
    let src = p.client.reg(256, Access::NONE);
    let sges = [src.sge(0, 256)];
    let op = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        imm: 1,
    };
    let err = p.client.try_post_send(&[wr(10, op, &sges)]).unwrap_err();
    assert_eq!((err.index, err.kind), (0, PostErrorKind::Injected));
    let err = p
        .client
        .conn
        .post_recv(&[RecvWr {
            wr_id: 11,
            sge: None,
        }])
        .unwrap_err();
    assert_eq!((err.index, err.kind), (0, PostErrorKind::Injected));
    p.client.post_send(&[wr(12, op, &sges)]);
    let wc = next_wc(&mut p.server, &mut p.client, "the one write posted");
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success), "{wc:?}");
    let wc = next_wc(&mut p.client, &mut p.server, "its completion");
    assert_eq!((wc.wr_id, wc.status), (12, WcStatus::Success), "{wc:?}");
    settle(&mut p.client, &mut p.server);
    assert!(p.server.drain_wcs().is_empty(), "a refused post executed");
}

#[test]
fn dropping_an_end_disconnects_the_peer() {
    let (mut p, _, _) = faulty_pair();
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }]);
    let Pair {
        client,
        mut server,
        listener,
    } = p;
    drop(client);
    let start = Instant::now();
    let mut wcs = [Wc::default(); 4];
    let mut seen = (None, false);
    while seen.0.is_none() || !seen.1 {
        if server.conn.poll_cq(&mut wcs) > 0 {
            seen.0 = Some(wcs[0]);
        }
        seen.1 |= server.conn.poll_cm() == Some(CmEvent::Disconnected);
        assert!(
            start.elapsed() < DEADLINE,
            "peer drop not noticed: {seen:?}"
        );
    }
    assert_eq!(
        seen.0.map(|wc| (wc.wr_id, wc.status)),
        Some((1, WcStatus::WrFlush))
    );
    drop(listener);
}

/// Everything one scripted run observes, in order.
fn scripted_run() -> Vec<String> {
    let (mut p, _, _) = faulty_pair();
    let mut log = Vec::new();
    let dst = p.server.reg(4096, RW);
    let src = p.client.reg(4096, Access::NONE);
    let sges = [src.sge(0, 512)];
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    let bad = SendOp::RdmaWrite {
        remote_addr: dst.addr() + 4000,
        rkey: dst.rkey(),
    };
    p.client.post_send(&[
        wr(1, SendOp::Send, &sges),
        wr(2, write, &sges),
        wr(3, SendOp::SendWithImm { imm: 4 }, &sges),
    ]);
    let mut wcs = [Wc::default(); 8];
    for round in 0..40u64 {
        if round == 5 {
            p.server.post_recv(&[RecvWr {
                wr_id: 10,
                sge: Some(dst.sge(1024, 512)),
            }]);
        }
        if round == 9 {
            p.server.post_recv(&[RecvWr {
                wr_id: 11,
                sge: Some(dst.sge(2048, 512)),
            }]);
            p.client
                .post_send(&[wr(4, write, &sges), wr(5, bad, &sges), wr(6, write, &sges)]);
        }
        for (name, side) in [("client", &mut p.client), ("server", &mut p.server)] {
            let n = side.conn.poll_cq(&mut wcs);
            for wc in &wcs[..n] {
                log.push(format!("{round} {name} {wc:?}"));
            }
            while let Some(ev) = side.conn.poll_cm() {
                log.push(format!("{round} {name} {ev:?}"));
            }
        }
    }
    log
}

#[test]
fn one_thread_runs_are_deterministic() {
    let first = scripted_run();
    assert!(
        first.iter().any(|l| l.contains("RemoteAccess")),
        "the script hits an error: {first:#?}"
    );
    assert!(
        first.iter().any(|l| l.contains("Disconnected")),
        "and a disconnect: {first:#?}"
    );
    for _ in 0..3 {
        assert_eq!(
            scripted_run(),
            first,
            "a second run observed something else"
        );
    }
}

/// Polls `conn` until `want` completions arrived, bounded by the deadline.
fn poll_until(conn: &mut dyn Conn, start: Instant, what: &str, mut take: impl FnMut(&Wc) -> bool) {
    let mut wcs = [Wc::default(); 16];
    loop {
        let n = conn.poll_cq(&mut wcs);
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{what}: {wc:?}");
            if take(wc) {
                return;
            }
        }
        assert!(start.elapsed() < DEADLINE, "{what}: timed out");
        if n == 0 {
            thread::yield_now();
        }
    }
}

#[test]
fn ends_on_two_threads_ping_pong() {
    const ROUNDS: u32 = 2000;
    const LEN: usize = 512;
    let (p, _, _) = faulty_pair();
    let Pair {
        client,
        server,
        listener,
    } = p;
    let (mut cconn, mut sconn) = (client.conn, server.conn);
    let fabric = client.fabric;
    let reg = |len| fabric.register(MemBuf::zeroed(len), RW).expect("register");
    // Client: a request buffer it sends from and a response area the server writes to.
    let (creq, cresp) = (reg(LEN), reg(LEN));
    let (sreq, sresp) = (reg(LEN), reg(LEN));
    let (resp_addr, resp_rkey) = (cresp.addr(), cresp.rkey());
    let start = Instant::now();

    let server_thread = thread::spawn(move || {
        for i in 0..ROUNDS {
            sconn
                .post_recv(&[RecvWr {
                    wr_id: u64::from(i),
                    sge: Some(sreq.sge(0, LEN)),
                }])
                .expect("recv");
            poll_until(&mut *sconn, start, "server: request", |wc| {
                wc.opcode == WcOpcode::Recv
            });
            let mut req = [0u8; LEN];
            sreq.read_at(0, &mut req);
            assert_eq!(req.to_vec(), pattern(i as u8, LEN), "request {i} intact");
            sresp.write_at(0, &pattern(!(i as u8), LEN));
            let sges = [sresp.sge(0, LEN)];
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: resp_addr,
                rkey: resp_rkey,
                imm: i,
            };
            sconn
                .post_send(&[wr(u64::from(i), op, &sges)])
                .expect("respond");
            poll_until(&mut *sconn, start, "server: response sent", |wc| {
                wc.opcode == WcOpcode::RdmaWrite
            });
        }
        sconn
    });
    for i in 0..ROUNDS {
        cconn
            .post_recv(&[RecvWr {
                wr_id: u64::from(i),
                sge: None,
            }])
            .expect("recv");
        creq.write_at(0, &pattern(i as u8, LEN));
        let sges = [creq.sge(0, LEN)];
        cconn
            .post_send(&[wr(u64::from(i), SendOp::Send, &sges)])
            .expect("request");
        let mut imm = None;
        poll_until(&mut *cconn, start, "client: response", |wc| {
            imm = wc.imm;
            wc.opcode == WcOpcode::RecvRdmaWithImm
        });
        assert_eq!(imm, Some(i), "responses in order");
        assert_eq!(
            read(&cresp, 0, LEN),
            pattern(!(i as u8), LEN),
            "response {i} in place"
        );
    }
    let mut sconn = server_thread.join().expect("server thread");
    cconn.disconnect();
    let mut got = false;
    while !got {
        got = sconn.poll_cm() == Some(CmEvent::Disconnected);
        assert!(
            start.elapsed() < DEADLINE,
            "server never saw the disconnect"
        );
    }
    drop(listener);
}

#[test]
fn ends_on_two_threads_stream_in_order() {
    const N: u32 = 20_000;
    let fabric = Arc::new(LoopbackFabric::new());
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 256,
        max_send_sge: 1,
    };
    let p = conformance::connect_with(&Loopback(fabric.clone()), caps, &[], &[]);
    let Pair {
        client,
        server,
        listener,
    } = p;
    let (mut cconn, mut sconn) = (client.conn, server.conn);
    let dst = fabric
        .register(MemBuf::zeroed(64 * 1024), RW)
        .expect("register");
    let src = fabric
        .register(MemBuf::zeroed(64 * 1024), RW)
        .expect("register");
    src.write_at(0, &pattern(1, 64 * 1024));
    let (daddr, drkey) = (dst.addr(), dst.rkey());
    let start = Instant::now();

    let receiver = thread::spawn(move || {
        let mut wcs = [Wc::default(); 32];
        let mut posted = 0u32;
        let mut next = 0u32;
        while next < N {
            while posted < N && posted - next < 256 {
                sconn
                    .post_recv(&[RecvWr {
                        wr_id: u64::from(posted),
                        sge: None,
                    }])
                    .expect("recv");
                posted += 1;
            }
            let n = sconn.poll_cq(&mut wcs);
            for wc in &wcs[..n] {
                assert_eq!(
                    (wc.status, wc.imm),
                    (WcStatus::Success, Some(next)),
                    "{wc:?}"
                );
                next += 1;
            }
            assert!(start.elapsed() < DEADLINE, "receiver stuck at {next}");
            if n == 0 {
                thread::yield_now();
            }
        }
        assert_eq!(
            read(&dst, 0, 64 * 1024),
            pattern(1, 64 * 1024),
            "the streamed data"
        );
        sconn
    });
    let mut wcs = [Wc::default(); 32];
    let mut i = 0u32;
    while i < N {
        let off = (i as usize % 64) * 1024;
        let sges = [src.sge(off, 1024)];
        let op = SendOp::RdmaWriteWithImm {
            remote_addr: daddr + off as u64,
            rkey: drkey,
            imm: i,
        };
        let mut w = wr(u64::from(i), op, &sges);
        w.signaled = i % 16 == 15;
        match cconn.post_send(&[w]) {
            Ok(()) => i += 1,
            Err(e) => assert_eq!(e.kind, PostErrorKind::QueueFull, "{e}"),
        }
        let n = cconn.poll_cq(&mut wcs);
        assert!(
            wcs[..n].iter().all(|wc| wc.status == WcStatus::Success),
            "{:?}",
            &wcs[..n]
        );
        assert!(start.elapsed() < DEADLINE, "sender stuck at {i}");
    }
    let sconn = receiver.join().expect("receiver thread");
    drop((cconn, sconn, listener));
}

/// One `poll_cq` of `conn` alone (the peer is not polled).
fn poll_once(conn: &mut dyn Conn) -> Vec<Wc> {
    let mut wcs = [Wc::default(); 16];
    let n = conn.poll_cq(&mut wcs);
    wcs[..n].to_vec()
}

#[test]
fn an_operation_executes_at_post_time() {
    let (mut p, _, _) = faulty_pair();
    let rbuf = p.server.reg(256, Access::LOCAL_WRITE);
    let dst = p.server.reg(256, RW);
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: Some(rbuf.sge(0, 256)),
    }]);
    let src = p.client.reg(512, Access::NONE);
    src.write_at(0, &pattern(3, 256));
    src.write_at(256, &pattern(4, 256));
    let (s1, s2) = ([src.sge(0, 256)], [src.sge(256, 256)]);
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    p.client
        .post_send(&[wr(10, write, &s2), wr(11, SendOp::Send, &s1)]);
    // Placed by the post itself, before the server is polled at all.
    assert_eq!(read(&dst, 0, 256), pattern(4, 256), "the write landed");
    assert_eq!(read(&rbuf, 0, 256), pattern(3, 256), "the send landed");
    // The sender's completions need no ack round: its own poll has them.
    let wcs = poll_once(&mut *p.client.conn);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    assert_eq!(
        got,
        [
            (10, WcStatus::Success, WcOpcode::RdmaWrite),
            (11, WcStatus::Success, WcOpcode::Send)
        ]
    );
    let wcs = poll_once(&mut *p.server.conn);
    assert_eq!(wcs.len(), 1, "{wcs:?}");
    assert_eq!(
        (wcs[0].wr_id, wcs[0].status, wcs[0].opcode, wcs[0].byte_len),
        (1, WcStatus::Success, WcOpcode::Recv, 256)
    );
}

#[test]
fn without_a_receive_operations_queue_in_order() {
    let (mut p, _, _) = faulty_pair();
    let dst = p.server.reg(256, RW);
    let src = p.client.reg(256, Access::NONE);
    src.write_at(0, &pattern(5, 256));
    let sges = [src.sge(0, 256)];
    let write = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
    };
    // No receive posted: the first send waits (RNR), and the write behind it must not
    // overtake it, though a write needs no receive.
    p.client
        .post_send(&[wr(1, SendOp::SendWithImm { imm: 1 }, &[])]);
    p.client.post_send(&[wr(2, write, &sges)]);
    p.client
        .post_send(&[wr(3, SendOp::SendWithImm { imm: 3 }, &[])]);
    for _ in 0..4 {
        assert!(
            poll_once(&mut *p.client.conn).is_empty(),
            "completed unexecuted"
        );
    }
    assert!(
        read(&dst, 0, 256).iter().all(|&x| x == 0),
        "the write overtook the send waiting for a receive"
    );
    p.server.post_recv(&[
        RecvWr {
            wr_id: 21,
            sge: None,
        },
        RecvWr {
            wr_id: 23,
            sge: None,
        },
    ]);
    let first = wait_wr(&mut p.server, &mut p.client, 21);
    let second = next_wc(&mut p.server, &mut p.client, "the second receive");
    assert_eq!((first.status, first.imm), (WcStatus::Success, Some(1)));
    assert_eq!((second.wr_id, second.imm), (23, Some(3)), "{second:?}");
    assert_eq!(read(&dst, 0, 256), pattern(5, 256));
    for id in 1..=3 {
        let wc = next_wc(&mut p.client, &mut p.server, "the sender's completions");
        assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success), "{wc:?}");
    }
    // Once the queue drained, posts execute at post time again.
    p.server.post_recv(&[RecvWr {
        wr_id: 24,
        sge: None,
    }]);
    p.client
        .post_send(&[wr(4, SendOp::SendWithImm { imm: 4 }, &[])]);
    let wcs = poll_once(&mut *p.client.conn);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(4, WcStatus::Success)]
    );
    let wc = wait_wr(&mut p.server, &mut p.client, 24);
    assert_eq!(wc.imm, Some(4));
}

#[test]
fn an_rkey_refused_at_post_is_the_senders_remote_access() {
    let (mut p, _, _) = faulty_pair();
    let dst = p.server.reg(256, RW);
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }]);
    let src = p.client.reg(256, Access::NONE);
    let sges = [src.sge(0, 256)];
    let bad = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey() ^ 0x5a5a_0000,
    };
    p.client
        .post_send(&[wr(10, bad, &sges), wr(11, SendOp::Send, &[])]);
    // The refusal is the sender's at once; what follows it flushes.
    let wcs = poll_once(&mut *p.client.conn);
    let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [(10, WcStatus::RemoteAccess), (11, WcStatus::WrFlush)]);
    assert_eq!(p.client.conn.state(), ConnState::Disconnected);
    // The responder breaks too: its receive flushes, unconsumed.
    let wc = wait_wr(&mut p.server, &mut p.client, 1);
    assert_eq!(wc.status, WcStatus::WrFlush, "{wc:?}");
    wait_both_disconnected(&mut p);
    assert!(read(&dst, 0, 256).iter().all(|&x| x == 0));
}

#[test]
fn a_post_after_the_peer_refused_on_the_queued_path_flushes() {
    let (mut p, _, server) = faulty_pair();
    let dst = p.server.reg(256, RW);
    p.server.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }]);
    let src = p.client.reg(256, Access::NONE);
    let sges = [src.sge(0, 256)];
    let bad = SendOp::RdmaWrite {
        remote_addr: dst.addr(),
        rkey: dst.rkey() ^ 0x5a5a_0000,
    };
    server.hold();
    p.client.post_send(&[wr(10, bad, &sges)]);
    server.release();
    // The server refuses the queued write and breaks (its receive flushes); the client
    // has not heard of it yet when it posts a send: the send must not execute.
    let wcs = poll_once(&mut *p.server.conn);
    assert_eq!(
        wcs.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::WrFlush)]
    );
    assert_eq!(p.client.conn.state(), ConnState::Connected);
    p.client.post_send(&[wr(11, SendOp::Send, &[])]);
    let wc = wait_wr(&mut p.client, &mut p.server, 10);
    assert_eq!(wc.status, WcStatus::RemoteAccess, "{wc:?}");
    let wc = wait_wr(&mut p.client, &mut p.server, 11);
    assert_eq!(
        wc.status,
        WcStatus::WrFlush,
        "executed after the peer broke: {wc:?}"
    );
    wait_both_disconnected(&mut p);
    assert!(p.server.drain_wcs().is_empty(), "the server completed more");
}

/// Completions in order: `Success` up to some point, `WrFlush` from there on.
fn successes_then_flushes(wcs: &[Wc], who: &str) -> usize {
    let ok = wcs
        .iter()
        .take_while(|w| w.status == WcStatus::Success)
        .count();
    assert!(
        wcs[ok..].iter().all(|w| w.status == WcStatus::WrFlush),
        "{who}: a completion after the first flush is not a flush: {wcs:?}"
    );
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{who}: out of order: {ids:?}"
    );
    ok
}

#[test]
fn a_disconnect_racing_posts_from_another_thread() {
    const RECVS: u64 = 200;
    for round in 0..20u64 {
        let fabric = Arc::new(LoopbackFabric::new());
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: 256,
            max_send_sge: 1,
        };
        let p = conformance::connect_with(&Loopback(fabric.clone()), caps, &[], &[]);
        let Pair {
            client,
            server,
            listener,
        } = p;
        let (mut cconn, mut sconn) = (client.conn, server.conn);
        let wrs: Vec<RecvWr> = (0..RECVS)
            .map(|wr_id| RecvWr { wr_id, sge: None })
            .collect();
        sconn.post_recv(&wrs).expect("receives");
        let start = Instant::now();
        // Break after some receives arrived (early in later rounds, to vary the race).
        let at = 1 + (round * 7) % 40;
        let receiver = thread::spawn(move || {
            let mut got = Vec::new();
            let mut wcs = [Wc::default(); 32];
            let mut disconnected = false;
            while !disconnected || got.len() < RECVS as usize {
                let n = sconn.poll_cq(&mut wcs);
                got.extend_from_slice(&wcs[..n]);
                if got.len() as u64 >= at {
                    sconn.disconnect();
                }
                while let Some(ev) = sconn.poll_cm() {
                    disconnected |= ev == CmEvent::Disconnected;
                }
                assert!(start.elapsed() < DEADLINE, "receiver stuck: {got:?}");
            }
            (sconn, got)
        });
        let mut sent = Vec::new();
        let mut i = 0u64;
        let mut disconnected = false;
        let mut wcs = [Wc::default(); 32];
        while !disconnected {
            match cconn.post_send(&[wr(i, SendOp::SendWithImm { imm: i as u32 }, &[])]) {
                Ok(()) => i += 1,
                Err(e) => assert!(
                    matches!(
                        e.kind,
                        PostErrorKind::QueueFull | PostErrorKind::NotConnected
                    ),
                    "{e}"
                ),
            }
            let n = cconn.poll_cq(&mut wcs);
            sent.extend_from_slice(&wcs[..n]);
            while let Some(ev) = cconn.poll_cm() {
                disconnected |= ev == CmEvent::Disconnected;
            }
            assert!(start.elapsed() < DEADLINE, "sender stuck at {i}");
        }
        let n = cconn.poll_cq(&mut wcs);
        sent.extend_from_slice(&wcs[..n]);
        let (sconn, got) = receiver.join().expect("receiver thread");
        assert_eq!(sent.len() as u64, i, "every send completed once");
        assert_eq!(got.len() as u64, RECVS, "every receive completed once");
        let sent_ok = successes_then_flushes(&sent, "sender");
        let got_ok = successes_then_flushes(&got, "receiver");
        assert!(
            got_ok as u64 >= at,
            "the receiver broke after {at} receives"
        );
        assert_eq!(
            sent_ok, got_ok,
            "a send succeeded exactly when it consumed a receive"
        );
        for (k, w) in got[..got_ok].iter().enumerate() {
            assert_eq!(w.imm, Some(k as u32), "{w:?}");
        }
        drop((cconn, sconn, listener));
    }
}

#[test]
fn the_data_path_does_not_allocate() {
    let fabric = Arc::new(LoopbackFabric::new());
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_send_sge: 2,
    };
    let p = conformance::connect_with(&Loopback(fabric.clone()), caps, &[], &[]);
    let Pair {
        client,
        server,
        listener,
    } = p;
    let (mut c, mut s) = (client.conn, server.conn);
    let dst = fabric.register(MemBuf::zeroed(8192), RW).expect("register");
    let src = fabric.register(MemBuf::zeroed(8192), RW).expect("register");
    let rbuf = fabric.register(MemBuf::zeroed(8192), RW).expect("register");
    let sges = [src.sge(0, 2048), src.sge(4096, 2048)];
    let write = SendOp::RdmaWriteWithImm {
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        imm: 1,
    };
    let mut wcs = [Wc::default(); 16];
    let mut round = |i: u64, c: &mut Box<dyn Conn>, s: &mut Box<dyn Conn>| {
        s.post_recv(&[RecvWr {
            wr_id: i,
            sge: None,
        }])
        .expect("recv");
        s.post_recv(&[RecvWr {
            wr_id: i,
            sge: Some(rbuf.sge(0, 4096)),
        }])
        .expect("recv");
        let mut w = wr(i, write, &sges);
        w.signaled = i % 4 == 0;
        let send = wr(i, SendOp::SendWithImm { imm: 2 }, &sges[..1]);
        c.post_send(&[w, send]).expect("send");
        let mut got = 0;
        let start = Instant::now();
        while got < 2 {
            got += s.poll_cq(&mut wcs);
            c.poll_cq(&mut wcs);
            assert!(start.elapsed() < DEADLINE, "round {i} stuck");
        }
    };
    for i in 0..100 {
        round(i, &mut c, &mut s);
    }
    let before = counting::allocations();
    for i in 100..2100 {
        round(i, &mut c, &mut s);
    }
    assert_eq!(
        counting::allocations() - before,
        0,
        "allocations on the loopback data path"
    );
    drop((c, s, listener));
}
