//! PSK authentication (frame version 2): matching keys connect and move data; every
//! other combination, a version-1 peer at a listener that requires a key, and hostile
//! peers at either end are refused with "authentication failed" (or the version
//! reason), never reaching the listener's application.

use super::*;
use rtrs_spdk::fabric::Psk;
use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};

fn key(byte: u8) -> Psk {
    Psk::from_bytes(format!("test key {byte}"), &[byte; 32]).unwrap()
}

/// Connects with `ckey` to a listener with `lkey`; returns the initiator's final CM
/// event and whether the listener's application saw a request (accepted if so).
fn attempt(lkey: Option<Psk>, ckey: Option<&Psk>) -> (CmEvent, bool) {
    let (cf, sf) = (TcpFabric::new(), TcpFabric::new());
    let mut l = sf
        .listen(localhost(), &ListenOptions::with_psk(lkey))
        .unwrap();
    let mut c = cf
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), b"hello").psk(ckey),
        )
        .unwrap();
    let mut seen = false;
    let mut server = None;
    let ev = until("the initiator's outcome", || {
        if let Some(req) = l.poll() {
            assert_eq!(req.private_data.as_bytes(), b"hello");
            seen = true;
            server = Some(req.accept(QpCaps::default(), b"welcome").unwrap());
        }
        c.poll_cm()
    });
    (ev, seen)
}

fn assert_auth_failed(ev: &CmEvent, what: &str) {
    match ev {
        CmEvent::AuthFailed { reason } => {
            assert!(reason.contains("authentication failed"), "{what}: {reason}");
            // Nothing of the key, its name, or which side was wrong.
            for word in [
                "key",
                "wrong",
                "missing",
                "proof",
                "listener has",
                "initiator",
            ] {
                assert!(!reason.contains(word), "{what}: {reason:?} says {word:?}");
            }
        }
        other => panic!("{what}: expected AuthFailed, got {other:?}"),
    }
}

#[test]
fn the_same_key_on_both_sides_connects_and_moves_data() {
    let (cf, sf) = (TcpFabric::new(), TcpFabric::new());
    let mut l = sf
        .listen(localhost(), &ListenOptions::with_psk(Some(key(1))))
        .unwrap();
    // Another instance of the same key (equal bytes, another name) proves it.
    let ckey = Psk::from_bytes("client's copy", &[1; 32]).unwrap();
    let mut c = cf
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), b"hi").psk(Some(&ckey)),
        )
        .unwrap();
    let req = until("the authenticated request", || {
        assert_eq!(c.poll_cm(), None);
        l.poll()
    });
    assert_eq!(req.private_data.as_bytes(), b"hi");
    let mut s = req.accept(QpCaps::default(), b"ok").unwrap();
    assert_eq!(
        until("established", || c.poll_cm()),
        CmEvent::Established {
            private_data: PrivateData::new(b"ok").unwrap()
        }
    );
    // A SEND and an RDMA WRITE over the authenticated connection.
    let src = reg(&cf, 4096, Access::LOCAL_WRITE);
    let data = pattern(4096, 7);
    src.write_at(0, &data);
    let dst = reg(&sf, 4096, RW);
    let rbuf = reg(&sf, 64, Access::LOCAL_WRITE);
    s.post_recv(&[RecvWr {
        wr_id: 9,
        sge: Some(rbuf.sge(0, 64)),
    }])
    .unwrap();
    let sges = [src.sge(0, 4096)];
    let small = [src.sge(0, 16)];
    c.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &sges,
            false,
        ),
        wr(2, SendOp::Send, &small, true),
    ])
    .unwrap();
    let mut wcs = [Wc::default(); 4];
    let mut got = Vec::new();
    until("the send at the server", || {
        c.poll_cq(&mut wcs);
        let n = s.poll_cq(&mut wcs);
        got.extend_from_slice(&wcs[..n]);
        (!got.is_empty()).then_some(())
    });
    assert_eq!((got[0].wr_id, got[0].status), (9, WcStatus::Success));
    let mut back = vec![0u8; 4096];
    dst.read_at(0, &mut back);
    assert_eq!(back, data);
    let mut msg = [0u8; 16];
    rbuf.read_at(0, &mut msg);
    assert_eq!(msg, data[..16]);
}

#[test]
fn any_other_key_combination_fails_and_never_reaches_the_application() {
    let cases: [(&str, Option<Psk>, Option<Psk>); 3] = [
        ("different keys", Some(key(1)), Some(key(2))),
        ("key at the listener only", Some(key(1)), None),
        ("key at the initiator only", None, Some(key(1))),
    ];
    for (what, lkey, ckey) in cases {
        let (ev, seen) = attempt(lkey, ckey.as_ref());
        assert_auth_failed(&ev, what);
        assert!(!seen, "{what}: the listener's application saw the request");
    }
    // Neither side with a key: plain version 1, as before.
    let (ev, seen) = attempt(None, None);
    assert!(matches!(ev, CmEvent::Established { .. }), "{ev:?}");
    assert!(seen);
}

#[test]
fn a_failed_initiator_flushes_and_stays_down() {
    let (cf, sf) = (TcpFabric::new(), TcpFabric::new());
    let mut l = sf
        .listen(localhost(), &ListenOptions::with_psk(Some(key(1))))
        .unwrap();
    let mut c = cf
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), b"").psk(Some(&key(3))),
        )
        .unwrap();
    c.post_recv(&[RecvWr {
        wr_id: 4,
        sge: None,
    }])
    .unwrap();
    let ev = until("the refusal", || {
        assert!(l.poll().is_none());
        c.poll_cm()
    });
    assert_auth_failed(&ev, "wrong key");
    assert_eq!(c.state(), ConnState::Disconnected);
    let mut wcs = [Wc::default(); 4];
    assert_eq!(c.poll_cq(&mut wcs), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (4, WcStatus::WrFlush));
    assert_eq!(c.poll_cm(), None, "no Disconnected after AuthFailed");
}

/// Reads from a raw socket until EOF (or a reset: garbage is closed with unread bytes)
/// while polling the listener, which must not hand the connection to the application.
fn read_answer(raw: &mut TcpStream, l: &mut Box<dyn Listener>) -> Vec<u8> {
    raw.set_nonblocking(true).unwrap();
    let mut got = Vec::new();
    until("the listener's answer and EOF", || {
        assert!(l.poll().is_none(), "a refused peer reached the application");
        let mut b = [0u8; 256];
        match raw.read(&mut b) {
            Ok(0) => Some(()),
            Ok(n) => {
                got.extend_from_slice(&b[..n]);
                None
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => Some(()),
            Err(e) => panic!("{e}"),
        }
    });
    got
}

fn rej_reason(frame_bytes: &[u8], version: u8) -> (RejectReason, u16) {
    assert_eq!(frame_bytes.len(), frame::CM_FRAME_LEN, "one CM_REJ");
    let h = Header::decode_as(
        frame_bytes[..frame::HEADER_LEN].try_into().unwrap(),
        version,
    )
    .unwrap();
    assert_eq!(h.opcode, Opcode::CmRej);
    let p = CmPayload::decode(frame_bytes[frame::HEADER_LEN..].try_into().unwrap()).unwrap();
    assert!(p.private_data.as_bytes().is_empty());
    (p.reason, p.max_version)
}

/// A version-2 CM_REQ with `nonce`.
fn v2_req(nonce: &[u8; 32]) -> Vec<u8> {
    let mut p = [0u8; frame::CM_PAYLOAD_LEN];
    CmPayload::new(RejectReason::None, PrivateData::new(b"raw").unwrap()).encode(&mut p);
    let (f, n) = frame::v2_frame(Opcode::CmReq, &[&p, nonce]);
    f[..n].to_vec()
}

#[test]
fn a_version_1_peer_is_refused_by_a_listener_that_requires_a_key() {
    let sf = TcpFabric::new();
    let mut l = sf
        .listen(localhost(), &ListenOptions::with_psk(Some(key(1))))
        .unwrap();
    let mut raw = TcpStream::connect(l.local_addr()).unwrap();
    raw.write_all(&super::cm::cm_req_bytes(frame::V1)).unwrap();
    let got = read_answer(&mut raw, &mut l);
    // A version-1 frame, so that a version-1 build reads it: "unsupported version,
    // this listener speaks up to 2".
    assert_eq!(
        rej_reason(&got, frame::V1),
        (RejectReason::UnsupportedVersion, 2)
    );
    // A listener without a key still accepts version 1.
    let plain = TcpFabric::new();
    let mut l2 = plain
        .listen(localhost(), &ListenOptions::default())
        .unwrap();
    let mut raw = TcpStream::connect(l2.local_addr()).unwrap();
    raw.write_all(&super::cm::cm_req_bytes(frame::V1)).unwrap();
    let req = until("the version 1 request", || l2.poll());
    assert_eq!(req.private_data.as_bytes(), b"raw");
}

#[test]
fn raw_initiators_with_a_bad_proof_or_none_are_refused() {
    let sf = TcpFabric::new();
    let mut l = sf
        .listen(localhost(), &ListenOptions::with_psk(Some(key(1))))
        .unwrap();

    // A wrong proof: CM_REJ "authentication failed" in version 2, then EOF.
    let mut raw = TcpStream::connect(l.local_addr()).unwrap();
    raw.write_all(&v2_req(&[5; 32])).unwrap();
    let mut ch = [0u8; frame::HEADER_LEN + frame::CHALLENGE_LEN];
    raw.set_read_timeout(Some(DEADLINE)).unwrap();
    let reader = std::thread::scope(|s| {
        let t = s.spawn(|| raw.read_exact(&mut ch));
        until("the challenge", || {
            assert!(l.poll().is_none());
            t.is_finished().then_some(())
        });
        t.join().unwrap()
    });
    reader.unwrap();
    let h = Header::decode_as(ch[..frame::HEADER_LEN].try_into().unwrap(), frame::V2).unwrap();
    assert_eq!((h.opcode, h.len), (Opcode::CmChallenge, 64));
    let (proof, n) = frame::v2_frame(Opcode::CmProof, &[&ch[frame::HEADER_LEN + 32..]]);
    // Reflecting the listener's own proof back is no proof of the key.
    raw.write_all(&proof[..n]).unwrap();
    let got = read_answer(&mut raw, &mut l);
    assert_eq!(rej_reason(&got, frame::V2).0, RejectReason::AuthFailed);

    // A request that never sends its proof holds up nobody; one that sends garbage
    // instead is closed; a version-2 request to a listener without a key is refused.
    let mut silent = TcpStream::connect(l.local_addr()).unwrap();
    silent.write_all(&v2_req(&[6; 32])).unwrap();
    let mut junk = TcpStream::connect(l.local_addr()).unwrap();
    junk.write_all(&v2_req(&[7; 32])).unwrap();
    junk.write_all(&[0xa5; 72]).unwrap();
    let got = read_answer(&mut junk, &mut l);
    assert_eq!(
        got.len(),
        frame::HEADER_LEN + frame::CHALLENGE_LEN,
        "challenge only"
    );

    let plain = TcpFabric::new();
    let mut l2 = plain
        .listen(localhost(), &ListenOptions::default())
        .unwrap();
    let mut raw = TcpStream::connect(l2.local_addr()).unwrap();
    raw.write_all(&v2_req(&[8; 32])).unwrap();
    let got = read_answer(&mut raw, &mut l2);
    assert_eq!(rej_reason(&got, frame::V2).0, RejectReason::AuthFailed);

    // The listener still serves a real client with the key.
    let (cf, _) = (TcpFabric::new(), ());
    let mut c = cf
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), b"real").psk(Some(&key(1))),
        )
        .unwrap();
    let req = until("the real request", || {
        c.poll_cm();
        l.poll()
    });
    assert_eq!(req.private_data.as_bytes(), b"real");
    drop(silent);
}

/// A fake listener: accepts one socket and reads the initiator's request.
fn fake_listener() -> (std::net::TcpListener, SocketAddr) {
    let l = std::net::TcpListener::bind(localhost()).unwrap();
    let a = l.local_addr().unwrap();
    (l, a)
}

fn read_request(peer: &mut TcpStream, c: &mut Box<dyn Conn>, len: usize) -> Vec<u8> {
    let mut req = vec![0u8; len];
    peer.set_nonblocking(true).unwrap();
    until("the request at the fake listener", || {
        assert_eq!(c.poll_cm(), None);
        (peer.peek(&mut req).ok() == Some(len)).then_some(())
    });
    peer.set_nonblocking(false).unwrap();
    peer.read_exact(&mut req).unwrap();
    req
}

#[test]
fn an_initiator_with_a_key_trusts_no_listener_that_has_not_proven_it() {
    let cf = TcpFabric::new();
    let rep = frame::cm_frame(
        frame::V2,
        Opcode::CmRep,
        &CmPayload::new(RejectReason::None, PrivateData::empty()),
    );
    let consumer_rej = frame::cm_frame(
        frame::V2,
        Opcode::CmRej,
        &CmPayload::new(RejectReason::Consumer, PrivateData::new(b"x").unwrap()),
    );
    let (forged, n) = frame::v2_frame(Opcode::CmChallenge, &[&[1; 32], &[2; 32]]);
    let answers: [(&str, Vec<u8>); 3] = [
        ("CM_REP without a challenge", rep.to_vec()),
        (
            "a consumer rejection without a challenge",
            consumer_rej.to_vec(),
        ),
        ("a challenge with a forged proof", forged[..n].to_vec()),
    ];
    for (what, answer) in answers {
        let (fake, addr) = fake_listener();
        let mut c = cf
            .connect(
                addr,
                &ConnectOptions::new(QpCaps::default(), b"").psk(Some(&key(1))),
            )
            .unwrap();
        c.poll_cm();
        let (mut peer, _) = fake.accept().unwrap();
        let req = read_request(&mut peer, &mut c, frame::HEADER_LEN + 96);
        assert_eq!(
            req[4],
            frame::V2,
            "{what}: a keyed initiator speaks version 2"
        );
        peer.write_all(&answer).unwrap();
        let ev = until(what, || c.poll_cm());
        assert_auth_failed(&ev, what);
    }
}

#[test]
fn versions_between_old_and_new_builds() {
    let cf = TcpFabric::new();
    // An initiator without a key speaks version 1: a version-1 listener accepts it.
    let (fake, addr) = fake_listener();
    let mut c = cf
        .connect(addr, &ConnectOptions::new(QpCaps::default(), b"plain"))
        .unwrap();
    c.poll_cm();
    let (mut peer, _) = fake.accept().unwrap();
    let req = read_request(&mut peer, &mut c, frame::CM_FRAME_LEN);
    let h = Header::decode_as(req[..frame::HEADER_LEN].try_into().unwrap(), frame::V1).unwrap();
    assert_eq!(h.opcode, Opcode::CmReq);
    let mut rep = frame::cm_frame(
        frame::V1,
        Opcode::CmRep,
        &CmPayload::new(RejectReason::None, PrivateData::new(b"v1").unwrap()),
    );
    rep[frame::HEADER_LEN] = 1; // an old build's max_version
    peer.write_all(&rep).unwrap();
    assert_eq!(
        until("established with a version 1 listener", || c.poll_cm()),
        CmEvent::Established {
            private_data: PrivateData::new(b"v1").unwrap()
        }
    );

    // An initiator with a key at a version-1 listener: it answers "unsupported version,
    // up to 1" (in version 1), which is an authentication failure that says why.
    let (fake, addr) = fake_listener();
    let mut c = cf
        .connect(
            addr,
            &ConnectOptions::new(QpCaps::default(), b"").psk(Some(&key(1))),
        )
        .unwrap();
    c.poll_cm();
    let (mut peer, _) = fake.accept().unwrap();
    read_request(&mut peer, &mut c, frame::HEADER_LEN + 96);
    let mut rej = frame::cm_frame(
        frame::V1,
        Opcode::CmRej,
        &CmPayload::new(RejectReason::UnsupportedVersion, PrivateData::empty()),
    );
    rej[frame::HEADER_LEN] = 1;
    peer.write_all(&rej).unwrap();
    match until("the refusal by a version 1 listener", || c.poll_cm()) {
        CmEvent::AuthFailed { reason } => assert!(
            reason.contains("authentication failed") && reason.contains("version 1"),
            "{reason}"
        ),
        e => panic!("expected AuthFailed, got {e:?}"),
    }
}

#[test]
fn backends_without_authentication_refuse_a_key() {
    use rtrs_spdk::fabric::loopback::LoopbackFabric;
    let f = LoopbackFabric::new();
    let e = f
        .listen(localhost(), &ListenOptions::with_psk(Some(key(1))))
        .err()
        .unwrap();
    assert!(e.to_string().contains("tcp fabric only"), "{e}");
    let e = f
        .connect(
            localhost(),
            &ConnectOptions::new(QpCaps::default(), b"").psk(Some(&key(1))),
        )
        .err()
        .unwrap();
    assert!(e.to_string().contains("cannot authenticate"), "{e}");
}
