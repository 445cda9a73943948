//! The tcp fabric over 127.0.0.1: connection management, every wire operation, the
//! receiver's checks, RNR, flush on disconnect, large and many operations, PSK
//! authentication, and hostile peers speaking raw bytes. Both ends are driven from the test thread; loops are
//! bounded by a generous deadline (an upper bound, never a performance assertion).

mod auth;
mod cm;
mod data;
mod errors;
mod window;

use crate::counting;
use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::tcp::frame::{self, CmPayload, Header, Opcode, RejectReason};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{
    inc_rkey, Access, CmEvent, Conn, ConnState, Fabric, FabricKind, KeyScope, Listener, MemBuf, Mr,
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
        let mut l = sf.listen(localhost(), &ListenOptions::default()).unwrap();
        let mut c = cf
            .connect(l.local_addr(), &ConnectOptions::new(caps, b"client"))
            .unwrap();
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
