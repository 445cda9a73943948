//! Connection management: private data both ways, rejection, refusal, versions.

use super::*;
use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};

#[test]
fn caps_and_kind() {
    let f = TcpFabric::new();
    assert_eq!(f.kind(), FabricKind::Tcp);
    assert!(f.caps().max_send_sge >= 32 && f.caps().max_mr_size >= 1 << 30);
    let caps = QpCaps {
        max_send_sge: 33,
        ..QpCaps::default()
    };
    let err = f
        .connect(
            "127.0.0.1:1".parse().unwrap(),
            &ConnectOptions::new(caps, b""),
        )
        .err()
        .unwrap();
    assert!(err.to_string().contains("max_send_sge"), "{err}");
}

#[test]
fn connect_accept_with_private_data_both_ways() {
    let p = Pair::new(QpCaps::default());
    assert_eq!(p.c.state(), ConnState::Connected);
    assert_eq!(p.s.state(), ConnState::Connected);
    assert_eq!(p.c.peer_addr(), p.s.local_addr());
    assert_eq!(p.s.peer_addr(), p.c.local_addr());
    assert!(p.c.peer_addr().is_some());
}

#[test]
fn reject_with_private_data_and_keep_serving() {
    let (cf, sf) = (TcpFabric::new(), TcpFabric::new());
    let mut l = sf.listen(localhost(), &ListenOptions::default()).unwrap();
    let mut c = cf
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), &[9; 56]),
        )
        .unwrap();
    c.post_recv(&[RecvWr {
        wr_id: 5,
        sge: None,
    }])
    .unwrap();
    let req = until("request", || {
        c.poll_cm();
        l.poll()
    });
    assert_eq!(req.private_data.as_bytes(), &[9; 56]);
    req.reject(b"go away").unwrap();
    let ev = until("rejection", || c.poll_cm());
    assert_eq!(
        ev,
        CmEvent::Rejected {
            private_data: PrivateData::new(b"go away").unwrap()
        }
    );
    assert_eq!(c.state(), ConnState::Disconnected);
    let mut wcs = [Wc::default(); 4];
    assert_eq!(c.poll_cq(&mut wcs), 1);
    assert_eq!((wcs[0].wr_id, wcs[0].status), (5, WcStatus::WrFlush));
    assert_eq!(c.poll_cm(), None, "no Disconnected after Rejected");

    // Dropping a request unanswered rejects it with no data; the listener goes on.
    let mut c2 = cf
        .connect(l.local_addr(), &ConnectOptions::new(QpCaps::default(), b""))
        .unwrap();
    drop(until("second request", || {
        c2.poll_cm();
        l.poll()
    }));
    let ev = until("second rejection", || c2.poll_cm());
    assert_eq!(
        ev,
        CmEvent::Rejected {
            private_data: PrivateData::empty()
        }
    );
}

#[test]
fn connect_to_a_closed_port_is_an_error_event() {
    let port = {
        let l = std::net::TcpListener::bind(localhost()).unwrap();
        l.local_addr().unwrap()
    };
    let f = TcpFabric::new();
    let mut c = f
        .connect(port, &ConnectOptions::new(QpCaps::default(), b""))
        .unwrap();
    match until("error", || c.poll_cm()) {
        CmEvent::Error { reason } => assert!(reason.contains(&port.to_string()), "{reason}"),
        e => panic!("expected an error, got {e:?}"),
    }
}

/// A version-1 CM_REQ whose version byte says `version`.
pub(crate) fn cm_req_bytes(version: u8) -> Vec<u8> {
    let mut f = frame::cm_frame(
        frame::V1,
        Opcode::CmReq,
        &CmPayload::new(RejectReason::None, PrivateData::new(b"raw").unwrap()),
    )
    .to_vec();
    f[4] = version;
    f
}

#[test]
fn unknown_version_is_rejected_at_connect() {
    let sf = TcpFabric::new();
    let mut l = sf.listen(localhost(), &ListenOptions::default()).unwrap();
    // A future initiator: the listener answers CM_REJ "unsupported version" by itself.
    let mut raw = TcpStream::connect(l.local_addr()).unwrap();
    raw.set_nonblocking(true).unwrap();
    raw.write_all(&cm_req_bytes(3)).unwrap();
    let mut got = Vec::new();
    until("the version rejection and EOF", || {
        assert!(
            l.poll().is_none(),
            "a foreign version reached the application"
        );
        let mut b = [0u8; 256];
        match raw.read(&mut b) {
            Ok(0) => Some(()),
            Ok(n) => {
                got.extend_from_slice(&b[..n]);
                None
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => panic!("{e}"),
        }
    });
    assert_eq!(got.len(), frame::CM_FRAME_LEN);
    // The answer is a version-1 frame, which every build reads.
    let h = Header::decode_as(got[..frame::HEADER_LEN].try_into().unwrap(), frame::V1).unwrap();
    assert_eq!(h.opcode, Opcode::CmRej);
    let p = CmPayload::decode(got[frame::HEADER_LEN..].try_into().unwrap()).unwrap();
    assert_eq!(
        (p.reason, p.max_version),
        (RejectReason::UnsupportedVersion, 2)
    );

    // A future acceptor answering in version 3: the initiator reports a clear error.
    let fake = std::net::TcpListener::bind(localhost()).unwrap();
    let cf = TcpFabric::new();
    let mut c = cf
        .connect(
            fake.local_addr().unwrap(),
            &ConnectOptions::new(QpCaps::default(), b""),
        )
        .unwrap();
    c.poll_cm();
    let (mut peer, _) = fake.accept().unwrap();
    let mut req = [0u8; frame::CM_FRAME_LEN];
    peer.set_nonblocking(true).unwrap();
    until("the request at the fake acceptor", || {
        assert_eq!(c.poll_cm(), None);
        let r = peer.peek(&mut req);
        (r.ok() == Some(frame::CM_FRAME_LEN)).then_some(())
    });
    let mut rep = frame::cm_frame(
        frame::V1,
        Opcode::CmRep,
        &CmPayload::new(RejectReason::None, PrivateData::empty()),
    );
    rep[4] = 3;
    peer.set_nonblocking(false).unwrap();
    peer.write_all(&rep).unwrap();
    match until("the version error", || c.poll_cm()) {
        CmEvent::Error { reason } => {
            assert!(
                reason.contains("frame version 3") && reason.contains("versions 1 to 2"),
                "{reason}"
            )
        }
        e => panic!("expected an error, got {e:?}"),
    }
}

#[test]
fn ipv6_loopback_works_too() {
    let (cf, sf) = (TcpFabric::new(), TcpFabric::new());
    let addr: SocketAddr = "[::1]:0".parse().unwrap();
    let mut l = match sf.listen(addr, &ListenOptions::default()) {
        Ok(l) => l,
        // A host without IPv6 cannot run this scenario; the error must name the address.
        Err(e) => return assert!(e.to_string().contains("::1"), "{e}"),
    };
    let mut c = cf
        .connect(
            l.local_addr(),
            &ConnectOptions::new(QpCaps::default(), b"v6"),
        )
        .unwrap();
    let req = until("request over ::1", || {
        c.poll_cm();
        l.poll()
    });
    assert_eq!(req.private_data.as_bytes(), b"v6");
    assert!(req.peer.is_ipv6());
    let s = req.accept(QpCaps::default(), b"").unwrap();
    assert!(matches!(
        until("established", || c.poll_cm()),
        CmEvent::Established { .. }
    ));
    assert_eq!(c.peer_addr(), s.local_addr());
}
