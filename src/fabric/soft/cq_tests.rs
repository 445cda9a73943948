//! Thread hand-over and fabric checks of the software shared CQ (over loopback).

use std::net::SocketAddr;

use crate::fabric::loopback::LoopbackFabric;
use crate::fabric::{CmEvent, Conn, Cq, Fabric, FabricError, PostErrorKind, QpCaps, RecvWr, Wc};

fn addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// A client connection on `cq`, accepted on a private CQ, both established.
fn pair(f: &LoopbackFabric, cq: &Cq) -> (Box<dyn Conn>, Box<dyn Conn>) {
    let mut l = f.listen(addr()).unwrap();
    let mut c = f
        .connect_on(cq, None, l.local_addr(), QpCaps::default(), &[], None)
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
fn another_thread_is_refused_until_the_cq_is_released() {
    let f = LoopbackFabric::new();
    let cq = f.create_cq(64).unwrap();
    let (mut c, _s) = pair(&f, &cq);
    c.post_recv(&[recv(1)])
        .expect("the creating thread holds the CQ");
    let (c, refused) = std::thread::spawn(move || {
        let r = c.post_recv(&[recv(2)]);
        (c, r)
    })
    .join()
    .unwrap();
    let mut c = c;
    assert_eq!(refused.unwrap_err().kind, PostErrorKind::WrongThread);

    cq.release_thread();
    let (c2, cq2, taken) = std::thread::spawn(move || {
        let r = c.post_recv(&[recv(3)]);
        cq.release_thread();
        (c, cq, r)
    })
    .join()
    .unwrap();
    assert!(taken.is_ok(), "a released CQ is taken over: {taken:?}");
    let (mut c, mut cq) = (c2, cq2);
    c.disconnect();
    let mut wcs = [Wc::default(); 8];
    let n = cq.poll(&mut wcs);
    let mut ids: Vec<u64> = wcs[..n].iter().map(|w| w.wr_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, [1, 3], "both receives flushed on the CQ, taken back");
    assert!(wcs[..n].iter().all(|w| w.qp_num == c.qp_num()));
}

#[test]
fn a_cq_takes_connections_of_its_own_fabric_only() {
    let a = LoopbackFabric::new();
    let b = LoopbackFabric::new();
    let cq = a.create_cq(16).unwrap();
    let l = b.listen(addr()).unwrap();
    let err = b
        .connect_on(&cq, None, l.local_addr(), QpCaps::default(), &[], None)
        .err()
        .expect("another fabric's CQ");
    assert!(matches!(err, FabricError::Cq { .. }), "{err}");
    assert!(a.create_cq(0).is_err(), "a CQ has at least one entry");
}

#[test]
fn a_dropped_connection_leaves_the_cq_working() {
    let f = LoopbackFabric::new();
    let mut cq = f.create_cq(64).unwrap();
    let (c1, mut s1) = pair(&f, &cq);
    let (mut c2, _s2) = pair(&f, &cq);
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
