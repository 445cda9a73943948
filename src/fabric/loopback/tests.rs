//! Unit tests of the loopback fabric's name table, handshake and fault lookup (the data
//! path is covered by the conformance suite and `tests/fabric/loopback.rs`).

use super::*;
use crate::fabric::{CmEvent, ConnState};
use crate::fabric::{ConnectOptions, ListenOptions};

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("test address")
}

fn listen(f: &LoopbackFabric, at: &str) -> Box<dyn Listener> {
    f.listen(addr(at), &ListenOptions::default()).unwrap()
}

/// A connection to `to` with default queue sizes and no private data.
fn connect(f: &LoopbackFabric, to: SocketAddr) -> Box<dyn Conn> {
    f.connect(to, &ConnectOptions::new(QpCaps::default(), &[]))
        .unwrap()
}

#[test]
fn listen_port_zero_picks_distinct_ports() {
    let f = LoopbackFabric::new();
    let a = listen(&f, "127.0.0.1:0");
    let b = listen(&f, "127.0.0.1:0");
    assert_ne!(a.local_addr(), b.local_addr());
    assert_ne!(a.local_addr().port(), 0);
    let err = f
        .listen(a.local_addr(), &ListenOptions::default())
        .err()
        .expect("the same address twice");
    assert!(err.to_string().contains("already in use"), "{err}");
    let addr_a = a.local_addr();
    drop(a);
    assert!(
        f.listen(addr_a, &ListenOptions::default()).is_ok(),
        "a dropped listener frees its address"
    );
}

#[test]
fn connect_to_nobody_is_a_cm_error() {
    let f = LoopbackFabric::new();
    let mut c = f
        .connect(
            addr("127.0.0.1:9"),
            &ConnectOptions::new(QpCaps::default(), b"x"),
        )
        .unwrap();
    match c.poll_cm() {
        Some(CmEvent::Error { reason }) => assert!(reason.contains("127.0.0.1:9"), "{reason}"),
        other => panic!("expected CmEvent::Error, got {other:?}"),
    }
    assert_eq!(c.state(), ConnState::Disconnected);
    assert_eq!(c.poll_cm(), None, "no Disconnected after a failed attempt");
}

#[test]
fn caps_beyond_the_limits_are_refused() {
    let f = LoopbackFabric::new();
    let l = listen(&f, "127.0.0.1:0");
    let caps = QpCaps {
        max_send_sge: MAX_SGE as u32 + 1,
        ..QpCaps::default()
    };
    let err = f
        .connect(l.local_addr(), &ConnectOptions::new(caps, &[]))
        .err()
        .expect("too many SGEs");
    assert!(err.to_string().contains("max_send_sge"), "{err}");
}

#[test]
fn dropped_request_and_dropped_listener_reject() {
    let f = LoopbackFabric::new();
    let mut l = listen(&f, "[::1]:0");
    let mut c1 = connect(&f, l.local_addr());
    let mut c2 = connect(&f, l.local_addr());
    assert!(c1.local_addr().unwrap().is_ipv6());
    drop(l.poll().expect("first request"));
    drop(l);
    for c in [&mut c1, &mut c2] {
        match c.poll_cm() {
            Some(CmEvent::Rejected { private_data }) => assert!(private_data.as_bytes().is_empty()),
            other => panic!("expected CmEvent::Rejected, got {other:?}"),
        }
    }
}

#[test]
fn accept_after_the_client_left_fails() {
    let f = LoopbackFabric::new();
    let mut l = listen(&f, "127.0.0.1:0");
    let mut c = connect(&f, l.local_addr());
    let req = l.poll().expect("request");
    c.disconnect();
    let err = req
        .accept(QpCaps::default(), &[])
        .err()
        .expect("accept of a withdrawn request");
    assert!(err.to_string().contains("went away"), "{err}");
}

#[test]
fn faults_are_found_from_either_end() {
    let f = LoopbackFabric::new();
    let mut l = listen(&f, "127.0.0.1:0");
    let c = connect(&f, l.local_addr());
    let s = l.poll().unwrap().accept(QpCaps::default(), &[]).unwrap();
    let fc = f.faults(&*c).expect("client end");
    let fs = f.faults(&*s).expect("server end");
    assert_eq!(format!("{:?}", fc.peer()), format!("{fs:?}"));
    assert!(
        LoopbackFabric::new().faults(&*c).is_none(),
        "another fabric's connection"
    );
}

#[test]
fn connecting_ends_release_their_address() {
    let f = LoopbackFabric::new();
    let l = listen(&f, "127.0.0.1:0");
    let c = connect(&f, l.local_addr());
    let local = c.local_addr().unwrap();
    assert!(f.inner.names().ephemeral.contains(&local));
    drop(c);
    assert!(
        f.inner.names().ephemeral.is_empty(),
        "address kept after the end dropped"
    );
}

#[test]
fn a_closing_end_waits_for_the_peers_copy() {
    use std::sync::mpsc;
    let ends = Arc::new([link::EndState::default(), link::EndState::default()]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let (busy_tx, busy_rx) = mpsc::channel();
    let copier = {
        let (ends, log) = (ends.clone(), log.clone());
        std::thread::spawn(move || {
            let _busy = ends[1].busy_guard();
            busy_tx.send(()).unwrap();
            // Long enough that a closer which did not wait would log first.
            std::thread::sleep(std::time::Duration::from_millis(50));
            log.lock().unwrap().push("copy done");
        })
    };
    busy_rx.recv().unwrap();
    ends[0].close_and_quiesce(&ends[1], true);
    log.lock().unwrap().push("closed");
    copier.join().unwrap();
    assert!(ends[0].closed.load(std::sync::atomic::Ordering::Acquire));
    assert_eq!(*log.lock().unwrap(), ["copy done", "closed"]);
}

#[test]
fn a_client_that_leaves_before_the_answer_keeps_what_was_executed() {
    use crate::fabric::{RecvWr, SendOp, SendWr, Wc, WcStatus};
    let f = LoopbackFabric::new();
    let mut l = listen(&f, "127.0.0.1:0");
    let mut c = connect(&f, l.local_addr());
    c.post_recv(&[
        RecvWr {
            wr_id: 1,
            sge: None,
        },
        RecvWr {
            wr_id: 2,
            sge: None,
        },
    ])
    .unwrap();
    let mut s = l.poll().unwrap().accept(QpCaps::default(), &[]).unwrap();
    // Executed into the client's first receive at post time, before the client learnt
    // that it was accepted.
    s.post_send(&[SendWr {
        wr_id: 9,
        op: SendOp::SendWithImm { imm: 5 },
        sges: &[],
        signaled: true,
    }])
    .unwrap();
    c.disconnect();
    let mut wcs = [Wc::default(); 4];
    let n = c.poll_cq(&mut wcs);
    let got: Vec<_> = wcs[..n]
        .iter()
        .map(|w| (w.wr_id, w.status, w.imm))
        .collect();
    assert_eq!(
        got,
        [
            (1, WcStatus::Success, Some(5)),
            (2, WcStatus::WrFlush, None)
        ]
    );
    assert_eq!(c.poll_cm(), Some(CmEvent::Disconnected));
}
