//! The tcp fabric over 127.0.0.1: connection management, every wire operation, the
//! receiver's checks, RNR, flush on disconnect, large and many operations, and hostile
//! peers speaking raw bytes. Both ends are driven from the test thread; loops are
//! bounded by a generous deadline (an upper bound, never a performance assertion).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::tcp::frame::{self, CmPayload, Header, Opcode, RejectReason};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{
    inc_rkey, Access, CmEvent, Conn, ConnState, Fabric, FabricKind, Listener, MemBuf, Mr,
    PostErrorKind, PrivateData, QpCaps, RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
const DEADLINE: Duration = Duration::from_secs(30);

fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < DEADLINE, "gave up waiting for {what}");
        std::thread::yield_now();
    }
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Two hosts (two fabrics) with one connection between them.
struct Pair {
    cf: TcpFabric,
    sf: TcpFabric,
    c: Box<dyn Conn>,
    s: Box<dyn Conn>,
    cw: Vec<Wc>,
    sw: Vec<Wc>,
    cev: Vec<CmEvent>,
    sev: Vec<CmEvent>,
}

impl Pair {
    fn new(caps: QpCaps) -> Pair {
        let (cf, sf) = (TcpFabric::new(), TcpFabric::new());
        let mut l = sf.listen(localhost()).unwrap();
        let mut c = cf.connect(l.local_addr(), caps, b"client").unwrap();
        let req = until("the connect request", || {
            assert_eq!(c.poll_cm(), None);
            l.poll()
        });
        assert_eq!(req.private_data.as_bytes(), b"client");
        let mut s = req.accept(caps, b"server").unwrap();
        assert_eq!(
            s.poll_cm(),
            Some(CmEvent::Established {
                private_data: PrivateData::empty()
            })
        );
        let ev = until("established", || c.poll_cm());
        assert_eq!(
            ev,
            CmEvent::Established {
                private_data: PrivateData::new(b"server").unwrap()
            }
        );
        Pair {
            cf,
            sf,
            c,
            s,
            cw: vec![],
            sw: vec![],
            cev: vec![],
            sev: vec![],
        }
    }

    /// Polls both ends once, collecting completions and CM events.
    fn drive(&mut self) {
        let mut wcs = [Wc::default(); 64];
        let n = self.c.poll_cq(&mut wcs);
        self.cw.extend_from_slice(&wcs[..n]);
        let n = self.s.poll_cq(&mut wcs);
        self.sw.extend_from_slice(&wcs[..n]);
        if let Some(e) = self.c.poll_cm() {
            self.cev.push(e);
        }
        if let Some(e) = self.s.poll_cm() {
            self.sev.push(e);
        }
    }

    fn wait(&mut self, what: &str, mut done: impl FnMut(&Pair) -> bool) {
        until(what, || {
            self.drive();
            done(self).then_some(())
        })
    }

    fn both_disconnected(&mut self) {
        self.wait("both sides disconnected", |p| {
            p.cev.contains(&CmEvent::Disconnected) && p.sev.contains(&CmEvent::Disconnected)
        });
        assert_eq!(self.c.state(), ConnState::Disconnected);
        assert_eq!(self.s.state(), ConnState::Disconnected);
    }
}

fn reg(f: &TcpFabric, len: usize, access: Access) -> Mr {
    f.register(MemBuf::zeroed(len), access).unwrap()
}

fn wr<'a>(wr_id: u64, op: SendOp<'a>, sges: &'a [Sge], signaled: bool) -> SendWr<'a> {
    SendWr {
        wr_id,
        op,
        sges,
        signaled,
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

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
        .connect("127.0.0.1:1".parse().unwrap(), caps, b"")
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
    let mut l = sf.listen(localhost()).unwrap();
    let mut c = cf
        .connect(l.local_addr(), QpCaps::default(), &[9; 56])
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
    let mut c2 = cf.connect(l.local_addr(), QpCaps::default(), b"").unwrap();
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
    let mut c = f.connect(port, QpCaps::default(), b"").unwrap();
    match until("error", || c.poll_cm()) {
        CmEvent::Error { reason } => assert!(reason.contains(&port.to_string()), "{reason}"),
        e => panic!("expected an error, got {e:?}"),
    }
}

fn cm_req_bytes(version: u8) -> Vec<u8> {
    let mut f = frame::cm_frame(
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
    let mut l = sf.listen(localhost()).unwrap();
    // A future initiator: the listener answers CM_REJ "unsupported version" by itself.
    let mut raw = TcpStream::connect(l.local_addr()).unwrap();
    raw.set_nonblocking(true).unwrap();
    raw.write_all(&cm_req_bytes(2)).unwrap();
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
    let h = Header::decode(got[..frame::HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(h.opcode, Opcode::CmRej);
    let p = CmPayload::decode(got[frame::HEADER_LEN..].try_into().unwrap()).unwrap();
    assert_eq!(
        (p.reason, p.max_version),
        (RejectReason::UnsupportedVersion, 1)
    );

    // A future acceptor answering in version 2: the initiator reports a clear error.
    let fake = std::net::TcpListener::bind(localhost()).unwrap();
    let cf = TcpFabric::new();
    let mut c = cf
        .connect(fake.local_addr().unwrap(), QpCaps::default(), b"")
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
        Opcode::CmRep,
        &CmPayload::new(RejectReason::None, PrivateData::empty()),
    );
    rep[4] = 2;
    peer.set_nonblocking(false).unwrap();
    peer.write_all(&rep).unwrap();
    match until("the version error", || c.poll_cm()) {
        CmEvent::Error { reason } => {
            assert!(
                reason.contains("version 2") && reason.contains("version 1"),
                "{reason}"
            )
        }
        e => panic!("expected an error, got {e:?}"),
    }
}

#[test]
fn send_and_send_with_imm_into_receive_buffers() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 4096, Access::NONE);
    let dst = reg(&p.sf, 4096, Access::LOCAL_WRITE);
    src.write_at(0, &pattern(300, 1));
    p.s.post_recv(&[
        RecvWr {
            wr_id: 10,
            sge: Some(dst.sge(0, 1024)),
        },
        RecvWr {
            wr_id: 11,
            sge: Some(dst.sge(1024, 1024)),
        },
    ])
    .unwrap();
    let sges = [src.sge(0, 100), src.sge(100, 200)];
    p.c.post_send(&[
        wr(1, SendOp::Send, &sges, true),
        wr(
            2,
            SendOp::SendWithImm { imm: 0xfeed_beef },
            &sges[..1],
            true,
        ),
    ])
    .unwrap();
    p.wait("two receives and two sends", |p| {
        p.sw.len() == 2 && p.cw.len() == 2
    });
    assert_eq!(
        (p.sw[0].wr_id, p.sw[0].status, p.sw[0].opcode),
        (10, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!((p.sw[0].byte_len, p.sw[0].imm), (300, None));
    assert_eq!(
        (p.sw[1].wr_id, p.sw[1].byte_len, p.sw[1].imm),
        (11, 100, Some(0xfeed_beef))
    );
    let mut out = vec![0u8; 300];
    dst.read_at(0, &mut out);
    assert_eq!(out, pattern(300, 1));
    dst.read_at(1024, &mut out[..100]);
    assert_eq!(out[..100], pattern(100, 1)[..]);
    assert!(p
        .cw
        .iter()
        .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send));
    assert_eq!((p.cw[0].wr_id, p.cw[1].wr_id), (1, 2));
}

#[test]
fn write_data_is_visible_before_the_immediate() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 64 * 1024, Access::NONE);
    let dst = reg(&p.sf, 64 * 1024, RW);
    src.write_at(0, &pattern(64 * 1024, 7));
    p.s.post_recv(&[
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
    let a = [src.sge(0, 60_000)];
    let b = [src.sge(60_000, 4096)];
    p.c.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &a,
            false,
        ),
        wr(
            2,
            SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr() + 60_000,
                rkey: dst.rkey(),
                imm: 42,
            },
            &b,
            true,
        ),
    ])
    .unwrap();
    let mut out = vec![0u8; 64_096];
    let wc = until("the immediate", || {
        let mut wcs = [Wc::default(); 4];
        p.c.poll_cq(&mut wcs);
        (p.s.poll_cq(&mut wcs) == 1).then_some(wcs[0])
    });
    // Checked right at the completion: every byte of both writes is already there.
    dst.read_at(0, &mut out);
    assert_eq!(out[..], pattern(64 * 1024, 7)[..64_096]);
    assert_eq!(
        (wc.opcode, wc.imm, wc.byte_len, wc.wr_id),
        (WcOpcode::RecvRdmaWithImm, Some(42), 4096, 1)
    );
    p.wait("the write completion", |p| p.cw.len() == 1);
    assert_eq!(
        (p.cw[0].wr_id, p.cw[0].status, p.cw[0].opcode),
        (2, WcStatus::Success, WcOpcode::RdmaWrite)
    );
}

#[test]
fn zero_length_write_with_imm() {
    let mut p = Pair::new(QpCaps::default());
    p.s.post_recv(&[RecvWr {
        wr_id: 3,
        sge: None,
    }])
    .unwrap();
    p.c.post_send(&[wr(
        9,
        SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm: 7,
        },
        &[],
        true,
    )])
    .unwrap();
    p.wait("the zero-length write", |p| {
        p.sw.len() == 1 && p.cw.len() == 1
    });
    assert_eq!(
        (p.sw[0].opcode, p.sw[0].byte_len, p.sw[0].imm),
        (WcOpcode::RecvRdmaWithImm, 0, Some(7))
    );
    assert_eq!((p.cw[0].wr_id, p.cw[0].status), (9, WcStatus::Success));
}

#[test]
fn send_with_inv_invalidates_the_rkey() {
    let mut p = Pair::new(QpCaps::default());
    let region = reg(&p.sf, 8192, RW);
    let slot = p.sf.alloc_fast_mr().unwrap();
    let rkey = inc_rkey(slot.rkey());
    p.s.post_send(&[wr(
        1,
        SendOp::RegMr {
            slot: &slot,
            region: &region,
            addr: region.addr(),
            len: 4096,
            access: RW,
            rkey,
        },
        &[],
        true,
    )])
    .unwrap();
    p.wait("the registration", |p| p.sw.len() == 1);
    assert_eq!(
        (p.sw[0].opcode, p.sw[0].status),
        (WcOpcode::RegMr, WcStatus::Success)
    );
    p.sw.clear();

    let src = reg(&p.cf, 4096, Access::NONE);
    src.write_at(0, b"through the fast registration");
    p.s.post_recv(&[RecvWr {
        wr_id: 2,
        sge: None,
    }])
    .unwrap();
    let s = [src.sge(0, 29)];
    p.c.post_send(&[
        wr(
            1,
            SendOp::RdmaWrite {
                remote_addr: region.addr() + 8,
                rkey,
            },
            &s,
            false,
        ),
        wr(2, SendOp::SendWithInv { rkey }, &[], true),
    ])
    .unwrap();
    p.wait("the invalidating send", |p| {
        p.sw.len() == 1 && p.cw.len() == 1
    });
    assert_eq!(p.sw[0].invalidated_rkey, Some(rkey));
    let mut out = [0u8; 29];
    region.read_at(8, &mut out);
    assert_eq!(&out, b"through the fast registration");

    // The key is retired: a write with it is a remote access error, and both break.
    p.c.post_send(&[wr(
        3,
        SendOp::RdmaWrite {
            remote_addr: region.addr(),
            rkey,
        },
        &s,
        true,
    )])
    .unwrap();
    p.wait("the refused write", |p| p.cw.len() == 2);
    assert_eq!((p.cw[1].wr_id, p.cw[1].status), (3, WcStatus::RemoteAccess));
    p.both_disconnected();
}

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
fn rnr_stalls_then_delivers_in_order() {
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, 4096, Access::NONE);
    let dst = reg(&p.sf, 4096, RW);
    src.write_at(0, &pattern(64, 3));
    let s = [src.sge(0, 64)];
    p.c.post_send(&[
        wr(1, SendOp::SendWithImm { imm: 1 }, &[], true),
        wr(
            2,
            SendOp::RdmaWrite {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
            },
            &s,
            true,
        ),
        wr(
            3,
            SendOp::RdmaWriteWithImm {
                remote_addr: 0,
                rkey: 0,
                imm: 3,
            },
            &[],
            true,
        ),
    ])
    .unwrap();
    for _ in 0..200 {
        p.drive();
    }
    assert!(
        p.sw.is_empty() && p.cw.is_empty(),
        "nothing executes without a receive"
    );
    assert!(p.cev.is_empty() && p.sev.is_empty(), "RNR is not an error");
    let mut out = [0u8; 64];
    dst.read_at(0, &mut out);
    assert_eq!(out, [0; 64], "the write behind the stalled send waits too");
    p.s.post_recv(&[RecvWr {
        wr_id: 10,
        sge: None,
    }])
    .unwrap();
    p.wait("the first receive", |p| p.sw.len() == 1 && p.cw.len() == 2);
    assert_eq!(p.sw[0].imm, Some(1));
    dst.read_at(0, &mut out);
    assert_eq!(out[..], pattern(64, 3)[..]);
    p.s.post_recv(&[RecvWr {
        wr_id: 11,
        sge: None,
    }])
    .unwrap();
    p.wait("the second receive", |p| p.sw.len() == 2 && p.cw.len() == 3);
    assert_eq!((p.sw[1].wr_id, p.sw[1].imm), (11, Some(3)));
    assert_eq!(p.cw.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
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

#[test]
fn a_large_write_arrives_intact() {
    const LEN: usize = 3 * 1024 * 1024 + 123;
    let mut p = Pair::new(QpCaps::default());
    let src = reg(&p.cf, LEN, Access::NONE);
    let dst = reg(&p.sf, LEN + 4096, RW);
    let data = pattern(LEN, 99);
    src.write_at(0, &data);
    p.s.post_recv(&[RecvWr {
        wr_id: 1,
        sge: None,
    }])
    .unwrap();
    let s = [src.sge(0, LEN / 2), src.sge(LEN / 2, LEN - LEN / 2)];
    p.c.post_send(&[wr(
        1,
        SendOp::RdmaWriteWithImm {
            remote_addr: dst.addr() + 1,
            rkey: dst.rkey(),
            imm: 5,
        },
        &s,
        true,
    )])
    .unwrap();
    p.wait("the large write", |p| p.sw.len() == 1 && p.cw.len() == 1);
    assert_eq!(p.sw[0].byte_len as usize, LEN);
    let mut out = vec![0u8; LEN];
    dst.read_at(1, &mut out);
    assert!(out == data, "payload corrupted");
}

#[test]
fn thousands_of_operations_in_flight_in_order() {
    const N: u64 = 3000;
    let caps = QpCaps {
        max_send_wr: 256,
        max_recv_wr: 4096,
        max_send_sge: 2,
    };
    let mut p = Pair::new(caps);
    let src = reg(&p.cf, 8 * N as usize, Access::NONE);
    let dst = reg(&p.sf, 8 * N as usize, RW);
    let recvs: Vec<RecvWr> = (0..N)
        .map(|i| RecvWr {
            wr_id: i,
            sge: None,
        })
        .collect();
    p.s.post_recv(&recvs).unwrap();
    for i in 0..N {
        src.write_at(8 * i as usize, &i.to_le_bytes());
    }
    let mut next = 0u64;
    until("all operations", || {
        while next < N {
            let at = 8 * next as usize;
            let s = [src.sge(at, 8)];
            // Alternate a plain write with a write-with-imm naming the same bytes; signal
            // every 16th so the unsignaled ones are retired by later completions.
            let op = if next % 2 == 0 {
                SendOp::RdmaWrite {
                    remote_addr: dst.addr() + at as u64,
                    rkey: dst.rkey(),
                }
            } else {
                SendOp::RdmaWriteWithImm {
                    remote_addr: dst.addr() + at as u64,
                    rkey: dst.rkey(),
                    imm: next as u32,
                }
            };
            match p
                .c
                .post_send(&[wr(next, op, &s, next % 16 == 15 || next == N - 1)])
            {
                Ok(()) => next += 1,
                Err(e) if e.kind == PostErrorKind::QueueFull => break,
                Err(e) => panic!("{e}"),
            }
        }
        p.drive();
        (p.sw.len() as u64 == N / 2 && p.cw.last().is_some_and(|w| w.wr_id == N - 1)).then_some(())
    });
    for (k, w) in p.sw.iter().enumerate() {
        let i = 2 * k as u64 + 1;
        assert_eq!(
            (w.wr_id, w.imm, w.status),
            (k as u64, Some(i as u32), WcStatus::Success)
        );
        let mut b = [0u8; 8];
        dst.read_at(8 * (i - 1) as usize, &mut b);
        assert_eq!(
            u64::from_le_bytes(b),
            i - 1,
            "the write before imm {i} is in place"
        );
    }
    assert!(p.cw.iter().all(|w| w.status == WcStatus::Success));
    let ids: Vec<u64> = p.cw.iter().map(|w| w.wr_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
}

/// A raw peer that completes the handshake by hand.
fn raw_client(l: &mut Box<dyn Listener>) -> (TcpStream, Box<dyn Conn>) {
    let mut raw = TcpStream::connect(l.local_addr()).unwrap();
    raw.write_all(&cm_req_bytes(1)).unwrap();
    let req = until("raw request", || l.poll());
    let s = req.accept(QpCaps::default(), b"").unwrap();
    let mut rep = [0u8; frame::CM_FRAME_LEN];
    raw.set_read_timeout(Some(DEADLINE)).unwrap();
    raw.read_exact(&mut rep).unwrap();
    assert_eq!(
        Header::decode(rep[..frame::HEADER_LEN].try_into().unwrap())
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
    let mut l = sf.listen(localhost()).unwrap();

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
    raw.write_all(&h.to_bytes()).unwrap();
    raw.write_all(&[0; 1024]).unwrap();
    let (got, _) = read_to_end_bounded(&mut raw, &mut s);
    assert_eq!(got.len(), frame::HEADER_LEN, "exactly one NAK frame");
    let nak = Header::decode(got[..].try_into().unwrap()).unwrap();
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
    raw.write_all(&h.to_bytes()).unwrap();
    let (got, _) = read_to_end_bounded(&mut raw, &mut s);
    let nak = Header::decode(got[..frame::HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!((nak.opcode, nak.seq), (Opcode::Nak, 5));

    // And the listener still serves real clients.
    let cf = TcpFabric::new();
    let mut c = cf
        .connect(l.local_addr(), QpCaps::default(), b"ok")
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
