//! Shared completion queues: connections made on one CQ report there, tagged with their
//! `qp_num`, in per-connection order; one breaking disturbs no other; a busy one starves
//! no other; more outstanding completions than entries is an overrun, as verbs reports
//! `IBV_EVENT_CQ_ERR`; and a software CQ hands out a connection's completions before
//! it places another connection's data.

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use rtrs_spdk::fabric::{
    Access, CmEvent, Conn, ConnState, Cq, CqEvent, Fabric, FabricKind, Listener, MemBuf,
    PostErrorKind, QpCaps, RecvWr, SendOp, Wc, WcOpcode, WcStatus,
};

use super::{bogus_rkey, connect, expect, pattern, read, wait_wr, wr, Backend, DEADLINE};

/// One host's CQ with its connections and what came out of them.
pub struct CqSide {
    pub name: &'static str,
    pub fabric: Arc<dyn Fabric>,
    pub cq: Cq,
    pub conns: Vec<Box<dyn Conn>>,
    /// Completions polled from the CQ, per connection (index into `conns`).
    pub wcs: Vec<VecDeque<Wc>>,
    /// CM events polled, per connection.
    pub cm: Vec<VecDeque<CmEvent>>,
    /// Completions the CQ gave that belong to none of `conns`.
    pub strays: Vec<Wc>,
    /// Poll size: how many completions one `Cq::poll` may return.
    pub batch: usize,
}

impl CqSide {
    pub fn new(name: &'static str, fabric: Arc<dyn Fabric>, entries: u32) -> CqSide {
        let cq = fabric
            .create_cq(entries)
            .unwrap_or_else(|e| panic!("{name}: create_cq({entries}): {e}"));
        CqSide {
            name,
            fabric,
            cq,
            conns: Vec::new(),
            wcs: Vec::new(),
            cm: Vec::new(),
            strays: Vec::new(),
            batch: 16,
        }
    }

    fn add(&mut self, conn: Box<dyn Conn>) -> usize {
        self.conns.push(conn);
        self.wcs.push(VecDeque::new());
        self.cm.push(VecDeque::new());
        self.conns.len() - 1
    }

    /// Which connection a completion belongs to, by `qp_num`.
    pub fn owner(&self, wc: &Wc) -> Option<usize> {
        self.conns.iter().position(|c| c.qp_num() == wc.qp_num)
    }

    /// One poll of the CQ (and of every connection's CM); whether anything came out.
    pub fn pump(&mut self) -> bool {
        let mut buf = vec![Wc::default(); self.batch];
        let n = self.cq.poll(&mut buf);
        for wc in &buf[..n] {
            match self.owner(wc) {
                Some(i) => self.wcs[i].push_back(*wc),
                None => self.strays.push(*wc),
            }
        }
        let mut any = n > 0;
        for (i, c) in self.conns.iter_mut().enumerate() {
            while let Some(ev) = c.poll_cm() {
                self.cm[i].push_back(ev);
                any = true;
            }
        }
        any
    }

    pub fn reg(&self, len: usize, access: Access) -> rtrs_spdk::fabric::Mr {
        self.fabric
            .register(rtrs_spdk::fabric::MemBuf::zeroed(len), access)
            .unwrap_or_else(|e| panic!("{}: register: {e}", self.name))
    }
}

/// Polls both sides until `done`, panicking after [`DEADLINE`] with `what`.
pub fn pump_until(
    a: &mut CqSide,
    b: &mut CqSide,
    what: &str,
    mut done: impl FnMut(&mut CqSide, &mut CqSide) -> bool,
) {
    let start = Instant::now();
    while !done(a, b) {
        let progressed = a.pump() | b.pump();
        assert!(
            start.elapsed() < DEADLINE,
            "timed out after {DEADLINE:?} waiting for {what}; {} completions {:?} CM {:?} \
             strays {:?}; {} completions {:?} CM {:?} strays {:?}",
            a.name,
            a.wcs,
            a.cm,
            a.strays,
            b.name,
            b.wcs,
            b.cm,
            b.strays
        );
        if !progressed {
            std::thread::yield_now();
        }
    }
}

/// A listener and `n` connections, each made on the client's CQ and accepted on the
/// server's, all established (their CM queues empty).
pub fn shared_pairs(
    b: &dyn Backend,
    n: usize,
    caps: QpCaps,
    client_entries: u32,
    server_entries: u32,
) -> (CqSide, CqSide, Box<dyn Listener>) {
    let mut client = CqSide::new("client", b.client_fabric(), client_entries);
    let mut server = CqSide::new("server", b.server_fabric(), server_entries);
    let mut listener = server
        .fabric
        .listen(b.listen_addr(), &ListenOptions::default())
        .unwrap_or_else(|e| panic!("listen on {}: {e}", b.listen_addr()));
    for i in 0..n {
        let conn = client
            .fabric
            .connect(
                listener.local_addr(),
                &ConnectOptions::new(caps, &[i as u8]).on(&client.cq.share()),
            )
            .unwrap_or_else(|e| panic!("connect_on: {e}"));
        client.add(conn);
        let start = Instant::now();
        let req = loop {
            if let Some(req) = listener.poll() {
                break req;
            }
            client.pump();
            assert!(start.elapsed() < DEADLINE, "no connection request {i}");
            std::thread::yield_now();
        };
        assert_eq!(req.private_data.as_bytes()[0], i as u8, "request {i}");
        let conn = req
            .accept_into(&*server.fabric, Some(&server.cq.share()), caps, &[])
            .unwrap_or_else(|e| panic!("accept on the server's CQ: {e}"));
        server.add(conn);
        let est = |e: &CmEvent| matches!(e, CmEvent::Established { .. });
        pump_until(&mut client, &mut server, "Established", |c, s| {
            c.cm[i].iter().any(est) && s.cm[i].iter().any(est)
        });
        client.cm[i].clear();
        server.cm[i].clear();
    }
    let nums: Vec<u32> = client
        .conns
        .iter()
        .chain(&server.conns)
        .map(|c| c.qp_num())
        .collect();
    for (side, conns) in [("client", &client.conns), ("server", &server.conns)] {
        for (i, c) in conns.iter().enumerate() {
            let q = c.qp_num();
            assert!(
                conns.iter().filter(|o| o.qp_num() == q).count() == 1,
                "{side} connection {i}: qp_num {q} is not unique on its CQ ({nums:?})"
            );
        }
    }
    (client, server, listener)
}

fn recv(wr_id: u64) -> RecvWr {
    RecvWr { wr_id, sge: None }
}

/// Completions of one connection's receives on a private CQ carry its `qp_num` too.
pub fn private_cq_completions_carry_qp_num(b: &dyn Backend) {
    let mut p = connect(b);
    p.server.post_recv(&[recv(5)]);
    p.client
        .post_send(&[wr(6, SendOp::SendWithImm { imm: 1 }, &[])]);
    let wc = wait_wr(&mut p.server, &mut p.client, 5);
    expect(&wc, WcStatus::Success, WcOpcode::Recv, "receive");
    assert_eq!(wc.qp_num, p.server.conn.qp_num(), "server qp_num on {wc:?}");
    let wc = wait_wr(&mut p.client, &mut p.server, 6);
    assert_eq!(wc.qp_num, p.client.conn.qp_num(), "client qp_num on {wc:?}");
    assert_ne!(p.client.conn.qp_num(), 0, "a connection has a number");
}

/// Three connections on one CQ each side, sends interleaved across them: every
/// completion names its connection, and each connection's completions come in order.
pub fn shared_cq_keeps_per_connection_order(b: &dyn Backend) {
    const N: usize = 3;
    const K: u64 = 40;
    let (mut c, mut s, _l) = shared_pairs(b, N, b.caps(), 1024, 1024);
    for (i, conn) in s.conns.iter_mut().enumerate() {
        let wrs: Vec<RecvWr> = (0..K).map(|k| recv(1000 * i as u64 + k)).collect();
        conn.post_recv(&wrs).expect("post_recv");
    }
    for k in 0..K {
        for (i, conn) in c.conns.iter_mut().enumerate() {
            let imm = (i as u32) << 16 | k as u32;
            conn.post_send(&[wr(1000 * i as u64 + k, SendOp::SendWithImm { imm }, &[])])
                .expect("post_send");
        }
    }
    // Completions stay with the shared CQ: a connection's own poll returns none.
    let mut none = [Wc::default(); 4];
    assert_eq!(
        s.conns[0].poll_cq(&mut none),
        0,
        "poll_cq on a shared-CQ connection"
    );
    let total = N * K as usize;
    pump_until(
        &mut c,
        &mut s,
        "every send and receive completion",
        |c, s| {
            c.wcs.iter().map(VecDeque::len).sum::<usize>() == total
                && s.wcs.iter().map(VecDeque::len).sum::<usize>() == total
        },
    );
    for side in [&c, &s] {
        assert!(
            side.strays.is_empty(),
            "{}: stray completions {:?}",
            side.name,
            side.strays
        );
        for (i, wcs) in side.wcs.iter().enumerate() {
            let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
            let want: Vec<u64> = (0..K).map(|k| 1000 * i as u64 + k).collect();
            assert_eq!(ids, want, "{} connection {i}: completion order", side.name);
            for w in wcs {
                assert_eq!(w.status, WcStatus::Success, "{}: {w:?}", side.name);
                assert_eq!(w.qp_num, side.conns[i].qp_num(), "{}: {w:?}", side.name);
            }
        }
    }
    for (i, wcs) in s.wcs.iter().enumerate() {
        let imms: Vec<u32> = wcs.iter().map(|w| w.imm.unwrap_or(u32::MAX)).collect();
        let want: Vec<u32> = (0..K).map(|k| (i as u32) << 16 | k as u32).collect();
        assert_eq!(imms, want, "server connection {i}: immediates in order");
    }
}

/// A connection on a shared CQ that breaks (a refused write) flushes its own work only:
/// the others keep working and see no flush and no disconnect.
pub fn shared_cq_break_leaves_the_others(b: &dyn Backend) {
    const N: usize = 3;
    const BROKEN: usize = 1;
    let (mut c, mut s, _l) = shared_pairs(b, N, b.caps(), 1024, 1024);
    for (i, conn) in s.conns.iter_mut().enumerate() {
        let wrs: Vec<RecvWr> = (0..4).map(|k| recv(100 * i as u64 + k)).collect();
        conn.post_recv(&wrs).expect("server post_recv");
    }
    for (i, conn) in c.conns.iter_mut().enumerate() {
        conn.post_recv(&[recv(500 + i as u64)])
            .expect("client post_recv");
    }
    let src = c.reg(64, Access::NONE);
    let sges = [src.sge(0, 8)];
    let target = s.reg(64, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let bad = SendOp::RdmaWrite {
        remote_addr: target.addr(),
        rkey: bogus_rkey(target.rkey()),
    };
    c.conns[BROKEN]
        .post_send(&[wr(7, bad, &sges)])
        .expect("post the refused write");

    let is_disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected);
    pump_until(
        &mut c,
        &mut s,
        "the broken connection's end on both sides",
        |c, s| {
            c.cm[BROKEN].iter().any(is_disc)
                && s.cm[BROKEN].iter().any(is_disc)
                && c.wcs[BROKEN].len() == 2
                && s.wcs[BROKEN].len() == 4
        },
    );
    let w = c.wcs[BROKEN]
        .iter()
        .find(|w| w.wr_id == 7)
        .copied()
        .expect("the refused write's completion");
    expect(
        &w,
        WcStatus::RemoteAccess,
        WcOpcode::RdmaWrite,
        "refused write",
    );
    let w = c.wcs[BROKEN]
        .iter()
        .find(|w| w.wr_id == 500 + BROKEN as u64)
        .copied()
        .expect("the client's flushed receive");
    assert_eq!(w.status, WcStatus::WrFlush, "{w:?}");
    for w in &s.wcs[BROKEN] {
        assert_eq!(
            w.status,
            WcStatus::WrFlush,
            "server receive of the broken one: {w:?}"
        );
        assert_eq!(w.qp_num, s.conns[BROKEN].qp_num(), "{w:?}");
    }

    // The others: traffic both ways completes, nothing flushes, nobody disconnects.
    for i in (0..N).filter(|&i| i != BROKEN) {
        for k in 0..4 {
            c.conns[i]
                .post_send(&[wr(
                    10 * i as u64 + k,
                    SendOp::SendWithImm { imm: k as u32 },
                    &[],
                )])
                .expect("send on a healthy connection");
        }
        s.conns[i]
            .post_send(&[wr(77, SendOp::SendWithImm { imm: 77 }, &[])])
            .expect("server send on a healthy connection");
    }
    pump_until(
        &mut c,
        &mut s,
        "traffic on the healthy connections",
        |c, s| {
            (0..N)
                .filter(|&i| i != BROKEN)
                .all(|i| s.wcs[i].len() == 5 && c.wcs[i].len() == 5)
        },
    );
    for side in [&c, &s] {
        assert!(
            side.strays.is_empty(),
            "{}: strays {:?}",
            side.name,
            side.strays
        );
        for i in (0..N).filter(|&i| i != BROKEN) {
            for w in &side.wcs[i] {
                assert_eq!(
                    w.status,
                    WcStatus::Success,
                    "{} connection {i}: {w:?}",
                    side.name
                );
            }
            assert!(
                side.cm[i].is_empty(),
                "{} connection {i}: {:?}",
                side.name,
                side.cm[i]
            );
            assert_eq!(side.conns[i].state(), ConnState::Connected);
        }
    }
    let err = c.conns[BROKEN]
        .post_send(&[wr(8, SendOp::Send, &[])])
        .expect_err("post on the broken connection");
    assert_eq!(err.kind, PostErrorKind::NotConnected, "{err}");
}

/// A connection with a stream of completions does not starve another on the same CQ:
/// the other's completion comes out while the stream goes on, after at most what a
/// first-in-first-out CQ would put before it.
pub fn shared_cq_busy_connection_does_not_starve_another(b: &dyn Backend) {
    const BUSY: usize = 0;
    const QUIET: usize = 1;
    const DEPTH: u64 = 32;
    const STREAM: u64 = 600;
    let (mut c, mut s, _l) = shared_pairs(b, 2, b.caps(), 1024, 2048);
    c.batch = 4;
    let recvs: Vec<RecvWr> = (0..DEPTH).map(recv).collect();
    c.conns[BUSY].post_recv(&recvs).expect("busy receives");
    c.conns[QUIET]
        .post_recv(&[recv(9999)])
        .expect("quiet receive");
    let sends: Vec<_> = (0..STREAM)
        .map(|k| wr(k, SendOp::SendWithImm { imm: k as u32 }, &[]))
        .collect();
    s.conns[BUSY].post_send(&sends).expect("the stream");

    // The client drains in small polls and re-posts each receive it gets back.
    let mut busy_seen = 0u64;
    let start = Instant::now();
    while busy_seen < 2 * DEPTH {
        let quiet = stream_step(&mut c, &mut s, &mut busy_seen, DEPTH, STREAM);
        assert!(quiet.is_none(), "quiet completion before it was sent");
        assert!(
            start.elapsed() < DEADLINE,
            "the stream does not flow ({busy_seen} seen)"
        );
    }
    let at_send = busy_seen;
    s.conns[QUIET]
        .post_send(&[wr(1, SendOp::SendWithImm { imm: 1 }, &[])])
        .expect("the quiet send");
    let at_quiet = loop {
        if let Some(w) = stream_step(&mut c, &mut s, &mut busy_seen, DEPTH, STREAM) {
            assert_eq!((w.wr_id, w.status), (9999, WcStatus::Success), "{w:?}");
            break busy_seen;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "the quiet connection's completion never came ({busy_seen} of the busy one's)"
        );
    };
    // Before it, at most what was outstanding on the busy connection (its receive
    // depth) and what arrived meanwhile; never the rest of the stream.
    let behind = at_quiet - at_send;
    assert!(
        behind <= 4 * DEPTH,
        "{behind} completions of the busy connection came out before the quiet one's"
    );
    assert!(
        at_quiet + DEPTH < STREAM,
        "the quiet completion came only as the stream ended ({at_quiet} of {STREAM})"
    );
}

/// One round of the stream: both sides polled, the busy connection's receives counted
/// and re-posted (while the stream needs them); the quiet connection's completion, if
/// it came.
fn stream_step(
    c: &mut CqSide,
    s: &mut CqSide,
    busy_seen: &mut u64,
    depth: u64,
    stream: u64,
) -> Option<Wc> {
    c.pump();
    s.pump();
    s.wcs.iter_mut().for_each(VecDeque::clear);
    while let Some(w) = c.wcs[0].pop_front() {
        assert_eq!(w.status, WcStatus::Success, "busy: {w:?}");
        *busy_seen += 1;
        if *busy_seen + depth <= stream {
            c.conns[0].post_recv(&[recv(w.wr_id)]).expect("re-post");
        }
    }
    c.wcs[1].pop_front()
}

/// More completions outstanding than the CQ's entries: `CqEvent::Overrun` once, the
/// connections on it break on both sides, and the CQ takes no new connection.
pub fn shared_cq_overrun_is_reported(b: &dyn Backend) {
    let probe = b.client_fabric().create_cq(4).expect("create_cq(4)");
    let entries = probe.entries();
    assert!(entries >= 4, "entries {entries} below the 4 asked for");
    drop(probe);
    let n = u64::from(entries) + 4;
    let caps = QpCaps {
        max_recv_wr: (n as u32).max(b.caps().max_recv_wr),
        ..b.caps()
    };
    let (mut c, mut s, l) = shared_pairs(b, 1, caps, 4, 1024);
    assert_eq!(c.cq.entries(), entries);
    let recvs: Vec<RecvWr> = (0..n).map(recv).collect();
    c.conns[0].post_recv(&recvs).expect("receives");
    let sends: Vec<_> = (0..n)
        .map(|k| wr(k, SendOp::SendWithImm { imm: k as u32 }, &[]))
        .collect();
    s.conns[0].post_send(&sends).expect("sends");

    // Progress without taking completions (an empty poll), as completions pile up on a
    // NIC whose CQ nobody reads.
    c.batch = 0;
    let start = Instant::now();
    loop {
        c.pump();
        s.pump();
        if let Some(ev) = c.cq.poll_event() {
            assert_eq!(ev, CqEvent::Overrun);
            break;
        }
        assert!(start.elapsed() < DEADLINE, "no overrun reported");
        std::thread::yield_now();
    }
    let is_disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected);
    pump_until(&mut c, &mut s, "Disconnected after the overrun", |c, s| {
        c.cm[0].iter().any(is_disc) && s.cm[0].iter().any(is_disc)
    });
    assert_eq!(c.cq.poll_event(), None, "the overrun is reported once");
    let again = c.fabric.connect(
        l.local_addr(),
        &ConnectOptions::new(b.caps(), &[]).on(&c.cq.share()),
    );
    assert!(again.is_err(), "a CQ in error takes no new connection");
}

/// A peer's connection dropped: its partner on the shared CQ sees `Disconnected` and its
/// posted receive flushed, promptly, while it is otherwise idle (nothing is polled for it
/// but the CQ); the other connection goes on.
pub fn shared_cq_sees_a_peer_vanish(b: &dyn Backend) {
    let (mut c, mut s, _l) = shared_pairs(b, 2, b.caps(), 1024, 1024);
    for (i, conn) in c.conns.iter_mut().enumerate() {
        conn.post_recv(&[recv(40 + i as u64)])
            .expect("client post_recv");
    }
    // Idle for a while first: the partner must not depend on having read recently.
    for _ in 0..100 {
        c.pump();
        s.pump();
    }
    drop(s.conns.remove(0));
    s.wcs.remove(0);
    s.cm.remove(0);
    let is_disc = |e: &CmEvent| matches!(e, CmEvent::Disconnected);
    pump_until(&mut c, &mut s, "the vanished peer's partner", |c, _| {
        c.cm[0].iter().any(is_disc) && !c.wcs[0].is_empty()
    });
    let w = c.wcs[0][0];
    assert_eq!((w.wr_id, w.status), (40, WcStatus::WrFlush), "{w:?}");
    assert_eq!(c.conns[0].state(), ConnState::Disconnected);

    // The survivor (client 1, server 0 now) still carries traffic both ways.
    s.conns[0].post_recv(&[recv(50)]).expect("server post_recv");
    c.conns[1]
        .post_send(&[wr(51, SendOp::SendWithImm { imm: 51 }, &[])])
        .expect("client send");
    s.conns[0]
        .post_send(&[wr(52, SendOp::SendWithImm { imm: 52 }, &[])])
        .expect("server send");
    pump_until(&mut c, &mut s, "traffic on the survivor", |c, s| {
        c.wcs[1].len() == 2 && s.wcs[0].len() == 2
    });
    for w in c.wcs[1].iter().chain(&s.wcs[0]) {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
    assert!(c.cm[1].is_empty() && s.cm[0].is_empty(), "no CM event");
}

/// Connections left idle, then a burst larger than socket buffers on each, both ways:
/// every byte and completion arrives (a readiness set that missed an event would stall
/// here), and a single message after the burst still comes through.
pub fn shared_cq_idle_then_busy_loses_nothing(b: &dyn Backend) {
    const N: usize = 2;
    const LEN: usize = 64 * 1024;
    const K: u64 = 16;
    let caps = QpCaps {
        max_send_wr: b.caps().max_send_wr.max(K as u32 + 2),
        max_recv_wr: b.caps().max_recv_wr.max(K as u32 + 2),
        ..b.caps()
    };
    let (mut c, mut s, _l) = shared_pairs(b, N, caps, 1024, 1024);
    for _ in 0..200 {
        c.pump();
        s.pump();
    }
    let src = c.reg(LEN * K as usize, Access::NONE);
    for k in 0..K as usize {
        src.write_at(k * LEN, &super::pattern(k as u8, LEN));
    }
    let targets: Vec<_> = (0..N)
        .map(|_| s.reg(LEN * K as usize, Access::LOCAL_WRITE | Access::REMOTE_WRITE))
        .collect();
    for i in 0..N {
        let recvs: Vec<RecvWr> = (0..K).map(|k| recv(1000 + k)).collect();
        s.conns[i].post_recv(&recvs).expect("server receives");
        let recvs: Vec<RecvWr> = (0..K).map(|k| recv(2000 + k)).collect();
        c.conns[i].post_recv(&recvs).expect("client receives");
    }
    for (i, target) in targets.iter().enumerate() {
        let sges: Vec<_> = (0..K as usize).map(|k| [src.sge(k * LEN, LEN)]).collect();
        let wrs: Vec<_> = (0..K as usize)
            .map(|k| {
                wr(
                    k as u64,
                    SendOp::RdmaWriteWithImm {
                        remote_addr: target.addr() + (k * LEN) as u64,
                        rkey: target.rkey(),
                        imm: k as u32,
                    },
                    &sges[k],
                )
            })
            .collect();
        c.conns[i].post_send(&wrs).expect("the burst");
        let back: Vec<_> = (0..K)
            .map(|k| wr(3000 + k, SendOp::SendWithImm { imm: k as u32 }, &[]))
            .collect();
        s.conns[i].post_send(&back).expect("the answers");
    }
    let k = K as usize;
    pump_until(&mut c, &mut s, "the bursts", |c, s| {
        (0..N).all(|i| c.wcs[i].len() == 2 * k && s.wcs[i].len() == 2 * k)
    });
    for side in [&c, &s] {
        for (i, wcs) in side.wcs.iter().enumerate() {
            for w in wcs {
                assert_eq!(w.status, WcStatus::Success, "{} {i}: {w:?}", side.name);
            }
        }
    }
    for (i, t) in targets.iter().enumerate() {
        for k in 0..k {
            assert!(
                super::read(t, k * LEN, LEN) == super::pattern(k as u8, LEN),
                "connection {i}: write {k} landed wrong"
            );
        }
    }
    for i in 0..N {
        c.wcs[i].clear();
        s.wcs[i].clear();
    }
    for _ in 0..200 {
        c.pump();
        s.pump();
    }
    s.conns[1].post_recv(&[recv(7)]).expect("post_recv");
    c.conns[1]
        .post_send(&[wr(8, SendOp::SendWithImm { imm: 8 }, &[])])
        .expect("send");
    let w = super::shared_cq::pump_until_wc(&mut c, &mut s, 1, 7);
    assert_eq!((w.status, w.imm), (WcStatus::Success, Some(8)), "{w:?}");
}

/// Pumps until the server's connection `i` has completed `wr_id`.
fn pump_until_wc(c: &mut CqSide, s: &mut CqSide, i: usize, wr_id: u64) -> Wc {
    pump_until(c, s, "the message after the burst", |_, s| {
        s.wcs[i].iter().any(|w| w.wr_id == wr_id)
    });
    s.wcs[i]
        .iter()
        .find(|w| w.wr_id == wr_id)
        .copied()
        .expect("just seen")
}

/// Two connections whose peers both write one region of the server's, each a
/// write-with-imm, both arrived before the server polls: when a connection's
/// completion comes out of the CQ, the region holds that connection's data, as on a
/// private CQ per connection, read and handled one after the other. A software CQ
/// drives (places the data of) no other connection between a connection's placement
/// and the poll that hands out its completions (docs/ARCHITECTURE.md, "Completion
/// queues"); RTRS's server relies on it when two paths carry copies of a request into
/// the same chunk ("Failover without double execution hazards").
pub fn shared_cq_hands_out_a_connection_before_the_next_lands(b: &dyn Backend) {
    const ROUNDS: usize = 16;
    const LEN: usize = 4096;
    const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
    if b.server_fabric().kind() == FabricKind::Verbs {
        // A device places data as it arrives, whatever polls its CQ: this is the
        // software CQs' contract.
        eprintln!("not a software CQ: the placement order is the device's");
        return;
    }
    let (mut c, mut s, _l) = shared_pairs(b, 2, b.caps(), 256, 256);
    let dst = s
        .fabric
        .register(MemBuf::zeroed(LEN), RW)
        .expect("server region");
    let srcs: Vec<_> = (0..2)
        .map(|_| {
            c.fabric
                .register(MemBuf::zeroed(LEN), Access::NONE)
                .expect("client source")
        })
        .collect();
    for round in 0..ROUNDS {
        let seeds = [(2 * round) as u8, (2 * round + 1) as u8];
        let data = seeds.map(|seed| pattern(seed, LEN));
        // Either connection writes first, by round.
        for k in 0..2 {
            let i = (k + round) % 2;
            srcs[i].write_at(0, &data[i]);
            let sges = [srcs[i].sge(0, LEN)];
            let op = SendOp::RdmaWriteWithImm {
                remote_addr: dst.addr(),
                rkey: dst.rkey(),
                imm: (round * 2 + i) as u32,
            };
            c.conns[i]
                .post_send(&[wr((round * 2 + i) as u64, op, &sges)])
                .expect("client write");
        }
        // Both writes on their way to the server before it polls (the client's CQ
        // drives its connections; the time lets a socket's bytes arrive).
        for _ in 0..20 {
            c.pump();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // The receives only now: a fabric that executes a write at post time when a
        // receive waits (as a NIC does) queues these instead, for the server's polls.
        for (i, conn) in s.conns.iter_mut().enumerate() {
            conn.post_recv(&[recv((round * 2 + i) as u64)])
                .expect("server receive");
        }
        let mut seen = [false; 2];
        let mut buf = vec![Wc::default(); 16];
        let start = Instant::now();
        while !(seen[0] && seen[1]) {
            let n = s.cq.poll(&mut buf);
            // The region as the caller finds it on taking these completions.
            let now = read(&dst, 0, LEN);
            let holds = data.iter().position(|d| *d == now);
            for wc in &buf[..n] {
                let i = s
                    .owner(wc)
                    .unwrap_or_else(|| panic!("round {round}: stray {wc:?}"));
                expect(
                    wc,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    "write-with-imm receive",
                );
                assert_eq!(wc.imm, Some((round * 2 + i) as u32), "{wc:?}");
                assert_eq!(
                    holds,
                    Some(i),
                    "round {round}: connection {i}'s completion came out while the region \
                     held connection {holds:?}'s data (another connection was driven \
                     before it was handed out)"
                );
                seen[i] = true;
            }
            c.pump();
            assert!(
                start.elapsed() < DEADLINE,
                "round {round}: the writes' completions never came ({seen:?})"
            );
            if n == 0 {
                std::thread::yield_now();
            }
        }
        pump_until(&mut c, &mut s, "the writes' completions", |c, _| {
            c.wcs.iter().all(|w| w.len() > round)
        });
    }
    for (i, w) in c.wcs.iter().enumerate() {
        assert!(
            w.iter().all(|w| w.status == WcStatus::Success),
            "client connection {i}: {w:?}"
        );
    }
}
