//! Thread hand-over and fabric checks of the software shared CQ (over loopback).

use crate::fabric::{ConnectOptions, ListenOptions};
use std::net::SocketAddr;

use crate::fabric::loopback::LoopbackFabric;
use crate::fabric::{CmEvent, Conn, CqRef, Fabric, FabricError, PostErrorKind, QpCaps, RecvWr, Wc};

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A client connection on `cq`, accepted on a private CQ, both established.
fn pair(f: &LoopbackFabric, cq: &CqRef) -> (Box<dyn Conn>, Box<dyn Conn>) {
    let mut l = f.listen(addr(), &ListenOptions::default()).unwrap();
    let mut c = f
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), &[]).on(cq),
        )
        .unwrap();
    let req = l.poll().expect("the request is queued at once on loopback");
    let mut s = req.accept(QpCaps::default(), &[]).unwrap();
    let est = |e: Option<CmEvent>| matches!(e, Some(CmEvent::Established { .. }));
    assert!(est(c.poll_cm()), "client established");
    assert!(est(s.poll_cm()), "server established");
    (c, s)
}

fn recv(wr_id: u64) -> RecvWr {
    RecvWr { wr_id, sge: None }
}

#[test]
fn another_thread_is_refused_until_the_connection_is_released() {
    let f = LoopbackFabric::new();
    let mut cq = f.create_cq(64).unwrap();
    let (mut c, _s) = pair(&f, &cq.share());
    c.post_recv(&[recv(1)])
        .expect("the making thread holds the connection");
    let (c, refused) = std::thread::spawn(move || {
        let r = c.post_recv(&[recv(2)]);
        (c, r)
    })
    .join()
    .unwrap();
    assert_eq!(refused.unwrap_err().kind, PostErrorKind::WrongThread);

    c.release_thread();
    let (c, taken) = std::thread::spawn(move || {
        let mut c = c;
        let r = c.post_recv(&[recv(3)]);
        c.release_thread();
        (c, r)
    })
    .join()
    .unwrap();
    assert!(
        taken.is_ok(),
        "a released connection is taken over: {taken:?}"
    );
    let mut c = c;
    c.disconnect();
    let mut wcs = [Wc::default(); 8];
    let n = cq.poll(&mut wcs);
    let mut ids: Vec<u64> = wcs[..n].iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 3], "both receives flushed on the CQ, taken back");
    assert!(wcs[..n].iter().all(|w| w.qp_num == c.qp_num()));
}

#[test]
fn a_connection_made_elsewhere_reports_once_handed_to_the_cq_thread() {
    use std::sync::mpsc;
    let f = LoopbackFabric::new();
    let cq = f.create_cq(64).unwrap();
    let share = cq.share();
    // The core: polls its CQ; reports what came out before and after the hand-over.
    let (to_core, from_ctl) = mpsc::channel::<Box<dyn Conn>>();
    let (report, reports) = mpsc::channel::<Vec<Wc>>();
    let (go, went) = mpsc::channel::<()>();
    let core = std::thread::spawn(move || {
        let mut cq = cq;
        let mut wcs = [Wc::default(); 8];
        // Until the connection is handed over: it is not this thread's, nothing of it
        // comes out (its receive completed meanwhile, see below).
        went.recv().unwrap();
        let n = cq.poll(&mut wcs);
        report.send(wcs[..n].to_vec()).unwrap();
        let mut c = from_ctl.recv().unwrap();
        assert_eq!(c.state(), crate::fabric::ConnState::Connected, "taken over");
        c.post_recv(&[recv(2)]).expect("the core holds it now");
        let mut got = Vec::new();
        for _ in 0..10_000 {
            let n = cq.poll(&mut wcs);
            got.extend_from_slice(&wcs[..n]);
            if got.len() >= 2 {
                break;
            }
            std::thread::yield_now();
        }
        report.send(got).unwrap();
        c
    });
    // The control thread makes the connection on the core's CQ and sets it up.
    let mut l = f.listen(addr(), &ListenOptions::default()).unwrap();
    let mut c = f
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), &[]).on(&share),
        )
        .unwrap();
    let mut s = l.poll().unwrap().accept(QpCaps::default(), &[]).unwrap();
    assert!(matches!(c.poll_cm(), Some(CmEvent::Established { .. })));
    assert!(matches!(s.poll_cm(), Some(CmEvent::Established { .. })));
    c.post_recv(&[recv(1)]).unwrap();
    let imm = crate::fabric::SendWr {
        wr_id: 7,
        op: crate::fabric::SendOp::SendWithImm { imm: 5 },
        sges: &[],
        signaled: true,
    };
    s.post_send(&[imm]).unwrap();
    // Progress on the control thread completes the receive; it waits in the connection.
    assert_eq!(
        c.poll_cq(&mut [Wc::default(); 4]),
        0,
        "completions are the CQ's"
    );
    go.send(()).unwrap();
    let before = reports.recv().unwrap();
    assert!(
        before.is_empty(),
        "nothing of a connection the core does not hold: {before:?}"
    );
    c.release_thread();
    to_core.send(c).unwrap();
    s.post_send(&[crate::fabric::SendWr { wr_id: 8, ..imm }])
        .unwrap();
    let after = reports.recv().unwrap();
    let c = core.join().unwrap();
    let ids: Vec<u64> = after.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        [1, 2],
        "both receives, in order, on the core's CQ: {after:?}"
    );
    assert!(after
        .iter()
        .all(|w| w.qp_num == c.qp_num() && w.imm == Some(5)));
}

#[test]
fn a_cq_takes_connections_of_its_own_fabric_only() {
    let a = LoopbackFabric::new();
    let b = LoopbackFabric::new();
    let cq = a.create_cq(16).unwrap();
    let l = b.listen(addr(), &ListenOptions::default()).unwrap();
    let err = b
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), &[]).on(&cq.share()),
        )
        .err()
        .expect("another fabric's CQ");
    assert!(matches!(err, FabricError::Cq { .. }), "{err}");
    assert!(a.create_cq(0).is_err(), "a CQ has at least one entry");
}

#[test]
fn a_dropped_connection_leaves_the_cq_working() {
    let f = LoopbackFabric::new();
    let mut cq = f.create_cq(64).unwrap();
    let (c1, mut s1) = pair(&f, &cq.share());
    let (mut c2, _s2) = pair(&f, &cq.share());
    drop(c1);
    let mut wcs = [Wc::default(); 8];
    cq.poll(&mut wcs);
    assert!(
        matches!(s1.poll_cm(), Some(CmEvent::Disconnected)),
        "the peer of a dropped connection sees it go"
    );
    c2.post_recv(&[recv(9)]).unwrap();
    c2.disconnect();
    let n = cq.poll(&mut wcs);
    assert_eq!(n, 1);
    assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (9, c2.qp_num()));
}

/// A readiness set that reports what the test scripts and records what it was asked.
struct Script {
    events: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    watched: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
    refuse: bool,
}

impl super::Readiness for Script {
    fn name(&self) -> &'static str {
        "script"
    }
    fn watch(&mut self, _fd: std::os::fd::RawFd, key: u64) -> std::io::Result<()> {
        if self.refuse {
            return Err(std::io::Error::other("refused"));
        }
        self.watched.lock().unwrap().push(key);
        Ok(())
    }
    fn unwatch(&mut self, _fd: std::os::fd::RawFd, key: u64) {
        self.watched.lock().unwrap().retain(|&k| k != key);
    }
    fn collect(&mut self, ready: &mut dyn FnMut(u64)) {
        for k in self.events.lock().unwrap().drain(..) {
            ready(k);
        }
    }
}

fn scripted(refuse: bool) -> (super::Ready, Script) {
    let s = Script {
        events: Default::default(),
        watched: Default::default(),
        refuse,
    };
    let handle = Script {
        events: s.events.clone(),
        watched: s.watched.clone(),
        refuse,
    };
    let r = super::Ready {
        set: Box::new(s),
        slots: Vec::new(),
        free: Vec::new(),
        direct_ok: false,
        direct: Vec::new(),
    };
    (r, handle)
}

/// Where no thread sleeps on the set, a member that found work leaves it and is read on
/// every poll; after `DIRECT_IDLE_POLLS` polls without work it is watched again (and read
/// once more); leaving the CQ meanwhile asks the set for nothing.
#[test]
fn an_active_member_is_read_on_every_poll_until_idle() {
    let (mut r, s) = scripted(false);
    let w = r.join(10).expect("watched");
    let key = s.watched.lock().unwrap()[0];
    r.active(w);
    assert_eq!(
        *s.watched.lock().unwrap(),
        vec![key],
        "a set a thread may sleep on keeps it"
    );

    r.direct_ok = true;
    r.active(w);
    assert!(s.watched.lock().unwrap().is_empty(), "out of the set");
    for i in 0..super::DIRECT_IDLE_POLLS {
        r.collect();
        assert!(r.take(w), "read on poll {i} without an event");
    }
    r.collect();
    assert_eq!(*s.watched.lock().unwrap(), vec![key], "idle: watched again");
    assert!(r.take(w), "read once more on the way back");
    r.collect();
    assert!(!r.take(w), "watched: read only on an event");
    s.events.lock().unwrap().push(key);
    r.collect();
    assert!(r.take(w), "its event");

    // Work found again, then the member leaves while read on every poll.
    r.active(w);
    r.collect();
    r.active(w);
    assert!(s.watched.lock().unwrap().is_empty(), "out of the set again");
    r.leave(w);
    assert!(s.watched.lock().unwrap().is_empty());
    assert_eq!(r.free, vec![w.slot], "the slot is free");
    assert!(r.direct.is_empty(), "no longer read on every poll");
    r.collect();
    let again = r.join(11).expect("watched");
    assert_eq!(again.slot, w.slot);
    r.collect();
    assert!(
        !r.take(again),
        "a new member starts in the set, not read on every poll"
    );
}

#[test]
fn readiness_events_of_a_slot_s_former_member_are_ignored() {
    let (mut r, s) = scripted(false);
    let first = r.join(10).expect("watched");
    let old = s.watched.lock().unwrap()[0];
    r.leave(first);
    assert!(s.watched.lock().unwrap().is_empty(), "unwatched on leaving");
    let second = r.join(11).expect("watched");
    assert_eq!(second.slot, first.slot, "the slot is reused");
    let new = s.watched.lock().unwrap()[0];
    assert_ne!(new, old, "a new generation, a new key");

    s.events.lock().unwrap().push(old);
    r.collect();
    assert!(
        !r.take(second),
        "the former member's event is not the new one's"
    );

    s.events.lock().unwrap().extend([new, new]);
    r.collect();
    // Kept until the member takes it (it may be held by another thread meanwhile).
    r.collect();
    assert!(r.take(second), "the member's own event");
    assert!(!r.take(second), "taken once");
}

#[test]
fn a_descriptor_the_readiness_set_refuses_frees_its_slot() {
    let (mut r, _s) = scripted(true);
    assert!(r.join(10).is_none(), "refused");
    assert_eq!(r.free, vec![0], "the slot is free again");
    assert!(!r.slots[0].used);
}

/// A poll hands out one connection's completions; the rest of a turn that did not fit
/// comes first in the next poll; the polls up to one that returns nothing give every
/// connection one turn (docs/ARCHITECTURE.md, "Completion queues").
#[test]
fn a_poll_is_one_connection_s_turn_and_a_round_ends_with_nothing() {
    use crate::fabric::{SendOp, SendWr};
    let f = LoopbackFabric::new();
    let mut cq = f.create_cq(64).unwrap();
    let share = cq.share();
    let mut pairs: Vec<_> = (0..3).map(|_| pair(&f, &share)).collect();
    // Connection k gets k + 1 completions.
    for (k, (c, s)) in pairs.iter_mut().enumerate() {
        let n = k as u64 + 1;
        let recvs: Vec<RecvWr> = (0..n).map(|j| recv(10 * k as u64 + j)).collect();
        c.post_recv(&recvs).unwrap();
        let sends: Vec<SendWr<'_>> = (0..n)
            .map(|j| SendWr {
                wr_id: j,
                op: SendOp::SendWithImm { imm: j as u32 },
                sges: &[],
                signaled: false,
            })
            .collect();
        s.post_send(&sends).unwrap();
        // The server end delivers on its own polls (its private CQ).
        s.poll_cq(&mut [Wc::default(); 4]);
    }
    let qps: Vec<u32> = pairs.iter().map(|(c, _)| c.qp_num()).collect();
    let mut wcs = [Wc::default(); 2];
    let mut calls: Vec<Vec<u64>> = Vec::new();
    for _ in 0..10 {
        let n = cq.poll(&mut wcs);
        if n == 0 {
            break;
        }
        let qp = wcs[0].qp_num;
        assert!(
            wcs[..n].iter().all(|w| w.qp_num == qp),
            "one connection per poll: {:?}",
            &wcs[..n]
        );
        assert!(qps.contains(&qp));
        calls.push(wcs[..n].iter().map(|w| w.wr_id).collect());
    }
    // Connection 2's three completions come in two polls (two fit), in order.
    assert_eq!(
        calls,
        [vec![0], vec![10, 11], vec![20, 21], vec![22]],
        "one turn each, in order, the round ended by a poll with nothing"
    );
    assert_eq!(cq.poll(&mut wcs), 0, "an idle round: nothing");
}
