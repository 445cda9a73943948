//! Remote access violations, disconnect with work in flight, and hostile raw peers.

use super::*;
use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};

#[test]
fn rkey_violation_fails_the_sender_and_breaks_both() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 4096, Access::NONE);
    let dst = reg(&p.sf, 4096, RW);
    p.s.post_recv(&[RecvWr {
        wr_id: 77,
        sge: None,
    }])
    .unwrap();
    let s = [src.sge(0, 16)];
    p.c.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey() ^ 0x100,
            },
            &s,
            true,
        ),
        wr(2, SendOp::Send, &s, true),
    ])
    .unwrap();
    p.both_disconnected();
    p.wait("the sender's completions", |p| {
        p.cw.len() == 2 && !p.sw.is_empty()
    });
    assert_eq!((p.cw[0].wr_id, p.cw[0].status), (1, WcStatus::RemoteAccess));
    assert_eq!((p.cw[1].wr_id, p.cw[1].status), (2, WcStatus::WrFlush));
    assert_eq!((p.sw[0].wr_id, p.sw[0].status), (77, WcStatus::WrFlush));
    let err = p.c.post_send(&[wr(3, SendOp::Send, &s, true)]).unwrap_err();
    assert_eq!(err.kind, PostErrorKind::NotConnected);
    assert_eq!(
        p.s.post_recv(&[RecvWr {
            wr_id: 1,
            sge: None
        }])
        .unwrap_err()
        .kind,
        PostErrorKind::NotConnected
    );
}

#[test]
fn bounds_violation_is_a_remote_access_error() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 4096, Access::NONE);
    let dst = reg(&p.sf, 4096, RW);
    let s = [src.sge(0, 17)];
    p.c.post_send(&[wr(
        1,
        SendOp::RdmaWrite {
            remote_addr: dst.addr() + 4080,
            rkey: dst.rkey(),
        },
        &s,
        true,
    )])
    .unwrap();
    p.both_disconnected();
    p.wait("the completion", |p| p.cw.len() == 1);
    assert_eq!(p.cw[0].status, WcStatus::RemoteAccess);
    // Not a byte was written.
    let mut out = [1u8; 16];
    dst.read_at(4080, &mut out);
    assert_eq!(out, [0; 16]);
}

#[test]
fn disconnect_mid_transfer_flushes_everything() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 1 << 20, Access::NONE);
    let dst = reg(&p.sf, 1 << 20, RW);
    p.s.post_recv(&[
        RecvWr {
            wr_id: 100,
            sge: None,
        },
        RecvWr {
            wr_id: 101,
            sge: None,
        },
    ])
    .unwrap();
    let s = [src.sge(0, 1 << 20)];
    let wrs: Vec<SendWr> = (0..32)
        .map(|i| {
            wr(
                i,
                SendOp::RdmaWrite {
                    remote_addr: dst.addr(),
                    rkey: dst.rkey(),
                },
                &s,
                true,
            )
        })
        .collect();
    p.c.post_send(&wrs).unwrap();
    p.drive();
    p.c.disconnect();
    p.both_disconnected();
    p.wait("every completion", |p| p.cw.len() == 32 && p.sw.len() == 2);
    let ids: Vec<u64> = p.cw.iter().map(|w| w.wr_id).collect();
    assert_eq!(
        ids,
        (0..32).collect::<Vec<_>>(),
        "each request completes once, in order"
    );
    assert!(p.cw.iter().any(|w| w.status == WcStatus::WrFlush));
    assert!(p
        .cw
        .iter()
        .all(|w| matches!(w.status, WcStatus::Success | WcStatus::WrFlush)));
    assert!(p.sw.iter().all(|w| w.status == WcStatus::WrFlush));
    assert_eq!(
        p.cev
            .iter()
            .filter(|e| **e == CmEvent::Disconnected)
            .count(),
        1
    );
}

/// A raw peer that completes a version-1 (unauthenticated) handshake by hand.
fn raw_client(l: &mut Box<dyn Listener>) -> (TcpStream, Box<dyn Conn>) {
    let mut raw = TcpStream::connect(l.local_addr()).unwrap();
    raw.write_all(&super::cm::cm_req_bytes(1)).unwrap();
    let req = until("raw request", || l.poll());
    let s = req.accept(QpCaps::default(), b"").unwrap();
    let mut rep = [0u8; frame::CM_FRAME_LEN];
    raw.set_read_timeout(Some(DEADLINE)).unwrap();
    raw.read_exact(&mut rep).unwrap();
    assert_eq!(
        Header::decode_as(rep[..frame::HEADER_LEN].try_into().unwrap(), frame::V1)
            .unwrap()
            .opcode,
        Opcode::CmRep
    );
    (raw, s)
}

/// Reads what the server sends until it closes; returns the bytes and the server's
/// completions meanwhile.
fn read_to_end_bounded(raw: &mut TcpStream, s: &mut Box<dyn Conn>) -> (Vec<u8>, Vec<Wc>) {
    raw.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    let mut all = Vec::new();
    let mut wcs = [Wc::default(); 8];
    until("the server to close", || {
        let n = s.poll_cq(&mut wcs);
        all.extend_from_slice(&wcs[..n]);
        let mut b = [0u8; 4096];
        match raw.read(&mut b) {
            Ok(0) => Some(()),
            Ok(n) => {
                got.extend_from_slice(&b[..n]);
                None
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(_) => Some(()),
        }
    });
    (got, all)
}

#[test]
fn hostile_peers_are_closed_and_the_listener_keeps_serving() {
    let sf = TcpFabric::new();
    let mut l = sf.listen(localhost(), &ListenOptions::default()).unwrap();

    // Garbage instead of a connect request.
    let mut junk = TcpStream::connect(l.local_addr()).unwrap();
    junk.write_all(&[0xa5; 40]).unwrap();
    junk.set_read_timeout(Some(DEADLINE)).unwrap();
    until("the listener to read the junk", || {
        assert!(l.poll().is_none());
        let mut b = [0u8; 1];
        junk.set_nonblocking(true).unwrap();
        match junk.read(&mut b) {
            Ok(0) => Some(()),
            Ok(_) => panic!("the listener answered garbage"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(_) => Some(()),
        }
    });

    // Garbage after the handshake: the connection breaks and flushes.
    let (mut raw, mut s) = raw_client(&mut l);
    s.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }])
    .unwrap();
    raw.write_all(&[0x5a; 40]).unwrap();
    let (_, wcs) = read_to_end_bounded(&mut raw, &mut s);
    assert_eq!(wcs.len(), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (1, WcStatus::WrFlush));
    assert_eq!(
        s.poll_cm(),
        Some(CmEvent::Established {
            private_data: PrivateData::empty()
        })
    );
    assert_eq!(s.poll_cm(), Some(CmEvent::Disconnected));

    // A well-formed write to a key that does not exist: NAK, then close.
    let (mut raw, mut s) = raw_client(&mut l);
    let h = Header {
        len: 1 << 30,
        rkey: 0x1234_5600,
        remote_addr: 4096,
        seq: 1,
        ..Header::new(Opcode::RdmaWrite)
    };
    raw.write_all(&h.to_bytes_as(frame::V1)).unwrap();
    raw.write_all(&[0; 1024]).unwrap();
    let (got, _) = read_to_end_bounded(&mut raw, &mut s);
    assert_eq!(got.len(), frame::HEADER_LEN, "exactly one NAK frame");
    let nak = Header::decode_as(got[..].try_into().unwrap(), frame::V1).unwrap();
    assert_eq!(
        (nak.opcode, nak.seq, nak.nak_status()),
        (Opcode::Nak, 1, WcStatus::RemoteAccess)
    );

    // A write out of sequence is refused too.
    let (mut raw, mut s) = raw_client(&mut l);
    let h = Header {
        len: 0,
        seq: 5,
        ..Header::new(Opcode::RdmaWrite)
    };
    raw.write_all(&h.to_bytes_as(frame::V1)).unwrap();
    let (got, _) = read_to_end_bounded(&mut raw, &mut s);
    let nak = Header::decode_as(got[..frame::HEADER_LEN].try_into().unwrap(), frame::V1).unwrap();
    assert_eq!((nak.opcode, nak.seq), (Opcode::Nak, 5));

    // And the listener still serves real clients.
    let cf = TcpFabric::new();
    let mut c = cf
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), b"ok"),
        )
        .unwrap();
    let req = until("a real request", || {
        c.poll_cm();
        l.poll()
    });
    assert_eq!(req.private_data.as_bytes(), b"ok");
    let _s = req.accept(QpCaps::default(), b"").unwrap();
    assert!(matches!(
        until("established", || c.poll_cm()),
        CmEvent::Established { .. }
    ));
}

/// An ack is believed only for what was sent: a peer that acknowledges operations it
/// never received (the sender would drop its own unsent work as done) is refused, the
/// connection closes, the work flushes, and the connection says why.
#[test]
fn an_ack_for_operations_never_sent_closes_the_connection() {
    let sf = TcpFabric::new();
    let mut l = sf.listen(localhost(), &ListenOptions::default()).unwrap();
    let (mut raw, mut s) = raw_client(&mut l);
    let send = |wr_id| SendWr {
        wr_id,
        op: SendOp::Send,
        sges: &[],
        signaled: true,
    };
    let mut wcs = [Wc::default(); 8];
    // One send goes out (seq 1); the peer acknowledges it: it completes.
    s.post_send(&[send(1)]).unwrap();
    let ack = |seq| {
        Header {
            seq,
            ..Header::new(Opcode::Ack)
        }
        .to_bytes_as(frame::V1)
    };
    // Read the send's frame off the wire first: acknowledged bytes have been sent.
    let mut frame_bytes = [0u8; frame::HEADER_LEN];
    until("the send on the wire", || {
        s.poll_cq(&mut wcs);
        raw.set_read_timeout(Some(Duration::from_millis(10)))
            .unwrap();
        raw.read_exact(&mut frame_bytes).ok()
    });
    raw.write_all(&ack(1)).unwrap();
    let wc = until("the acknowledged send", || {
        (s.poll_cq(&mut wcs) == 1).then_some(wcs[0])
    });
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    // Two more are posted (seq 2 and 3); the peer acknowledges 9 before any arrived.
    s.post_send(&[send(2), send(3)]).unwrap();
    raw.write_all(&ack(9)).unwrap();
    let (_, got) = read_to_end_bounded(&mut raw, &mut s);
    assert_eq!(
        got.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(2, WcStatus::WrFlush), (3, WcStatus::WrFlush)],
        "an ack for unsent work completed it"
    );
    let why = s.failure().expect("the connection says why it broke");
    assert!(
        why.contains("forged ack") && why.contains("ack for operation 9"),
        "{why}"
    );
}
