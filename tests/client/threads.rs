//! The client and the real server on real reactor threads (`Engine`, adaptive idle)
//! over the tcp fabric on 127.0.0.1: the session is opened on core 0, each core's
//! `SessionCore` is moved to its reactor, and every core writes, reads back and
//! verifies its own blocks. Bounded by generous wall-clock timeouts only.

use crate::util;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rtrs_spdk::client::{
    ClientCompletion, ClientConfig, ClientIo, ClientSession, CoreCq, Dir, PathAddr, SessionCore,
    Sgl, SubmitError,
};
use rtrs_spdk::engine::{
    Adaptive, CpuMask, Ctx, Engine, EngineConfig, IdleStrategy, Msg, PollResult,
};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr};
use rtrs_spdk::server::{Server, ServerConfig, ServerHandler};
use util::real::{Ram, RamHandler};
use util::Events;

const QD: usize = 4;
const TARGET: u64 = 150;

#[derive(Default)]
struct Counters {
    verified: AtomicU64,
    errors: AtomicU64,
    mismatches: AtomicU64,
    /// Most connections a core's shared CQ routed at once, over all cores.
    routed: AtomicU64,
}

struct Worker {
    /// The core's shared CQ, polled once per loop before the session.
    cq: Option<CoreCq>,
    core: SessionCore,
    fabric: Arc<dyn Fabric>,
    buf: Option<Mr>,
    /// Per slot: 0 idle, 1 writing, 2 reading; and its sequence number.
    state: [u8; QD],
    seq: [u64; QD],
    c: Arc<Counters>,
    k: usize,
}

fn fill(k: usize, slot: usize, seq: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64 ^ seq.wrapping_mul(131) ^ (slot as u64 * 7) ^ (k as u64 * 3)) as u8)
        .collect()
}

const LEN: usize = 8192;

impl Worker {
    fn submit(&mut self, cx: &mut dyn Ctx, slot: usize, read: bool) -> bool {
        let mr = self.buf.as_ref().unwrap();
        let sgl = [mr.sge(slot * LEN, LEN)];
        let off = (((self.k * QD + slot) * LEN) as u64).to_le_bytes();
        let tag = (slot as u64) << 1 | u64::from(read);
        let io = ClientIo {
            tag,
            dir: if read { Dir::Read } else { Dir::Write },
            usr: &off,
            sgl: Sgl::Copy(&sgl),
            admin: false,
            wait: rtrs_spdk::client::PathWait::Session,
        };
        match self.core.submit(cx.now(), io) {
            Ok(()) => true,
            Err(SubmitError::Busy { .. }) => false,
            // The test closed the session.
            Err(SubmitError::NoPath) => false,
            Err(e) => panic!("{e}"),
        }
    }

    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let mut out = [ClientCompletion::default(); 16];
        if let Some(cq) = self.cq.as_mut() {
            cq.poll();
            self.c
                .routed
                .fetch_max(cq.connections() as u64, Ordering::Relaxed);
        }
        let n = self.core.poll(cx.now(), &mut out);
        if self.buf.is_none() {
            if self.core.max_io_size() == 0 {
                return PollResult::Idle;
            }
            self.buf = Some(
                self.fabric
                    .register(
                        MemBuf::zeroed(QD * LEN),
                        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    )
                    .unwrap(),
            );
        }
        for c in &out[..n] {
            let slot = (c.tag >> 1) as usize;
            if c.result.is_err() {
                self.c.errors.fetch_add(1, Ordering::Relaxed);
                self.state[slot] = 0;
                continue;
            }
            if self.state[slot] == 1 {
                self.buf.as_ref().unwrap().write_at(slot * LEN, &[0u8; LEN]);
                self.state[slot] = if self.submit(cx, slot, true) { 2 } else { 0 };
            } else {
                let mut got = vec![0u8; LEN];
                self.buf.as_ref().unwrap().read_at(slot * LEN, &mut got);
                if got != fill(self.k, slot, self.seq[slot], LEN) {
                    self.c.mismatches.fetch_add(1, Ordering::Relaxed);
                }
                self.c.verified.fetch_add(1, Ordering::Relaxed);
                self.state[slot] = 0;
            }
        }
        for slot in 0..QD {
            if self.state[slot] == 0 && self.c.verified.load(Ordering::Relaxed) < TARGET * 2 {
                self.seq[slot] += 1;
                let data = fill(self.k, slot, self.seq[slot], LEN);
                self.buf.as_ref().unwrap().write_at(slot * LEN, &data);
                if self.submit(cx, slot, false) {
                    self.state[slot] = 1;
                }
            }
        }
        if n > 0 {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }
}

#[test]
fn client_and_server_on_reactor_threads_over_tcp() {
    run(false);
}

/// The same with each core's IO connection on the core's shared CQ: made on the home
/// core's thread, handed to the core's thread, which polls the CQ once per loop.
#[test]
fn client_and_server_on_reactor_threads_over_tcp_on_core_cqs() {
    run(true);
}

fn run(core_cq: bool) {
    let mut ec = EngineConfig::new(CpuMask::parse("[0-1]").expect("mask"));
    ec.idle = IdleStrategy::Adaptive(Adaptive::default());
    ec.pin = false;
    let engine = Engine::start(ec).expect("engine");
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let ram = Arc::new(Ram {
        bytes: Mutex::new(vec![0; 2 * QD * LEN]),
        events: Mutex::new(Vec::new()),
    });
    let r2 = ram.clone();
    let server = Server::start_on_engine(
        &engine,
        0,
        fabric.clone(),
        &["127.0.0.1:0".parse().unwrap()],
        ServerConfig {
            queue_depth: 32,
            ..ServerConfig::default()
        },
        move |_| Box::new(RamHandler(r2.clone())) as Box<dyn ServerHandler>,
    )
    .expect("server");
    let addr = server.local_addrs()[0];
    let counters = Arc::new(Counters::default());
    let (tx, rx) = mpsc::channel::<ClientSession>();
    let (f2, c2) = (fabric.clone(), counters.clone());
    let sent = engine.send(
        0,
        Msg::new(move |cx: &mut dyn Ctx| {
            // The path leaves from its own source address ([src,]dst).
            let path = PathAddr {
                src: Some("127.0.0.2:0".parse().unwrap()),
                dst: addr,
            };
            let cfg = ClientConfig::new("threads", vec![path]);
            let events = Box::new(Events(Default::default()));
            let (sess, cores) = ClientSession::open(cx, f2.clone(), cfg, events).expect("open");
            for (k, mut core) in cores.into_iter().enumerate() {
                // Made and attached here, before the session connects; the core's
                // thread takes it with its first poll.
                let cq = core_cq.then(|| {
                    let cq = CoreCq::new(&*f2, k).expect("tcp has shared CQs");
                    assert!(core.attach(&cq));
                    cq
                });
                let w = Worker {
                    cq,
                    core,
                    fabric: f2.clone(),
                    buf: None,
                    state: [0; QD],
                    seq: [0; QD],
                    c: c2.clone(),
                    k,
                };
                let mut w = Some(w);
                let sent = cx.send(
                    k,
                    Msg::new(move |cx: &mut dyn Ctx| {
                        let mut w = w.take().unwrap();
                        cx.register(Box::new(move |cx: &mut dyn Ctx| w.poll(cx)));
                    }),
                );
                assert!(sent.is_ok(), "mailbox of core {k}");
            }
            tx.send(sess).unwrap();
        }),
    );
    assert!(sent.is_ok(), "mailbox of core 0");
    let sess = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("session opened");
    let start = Instant::now();
    while counters.verified.load(Ordering::Relaxed) < TARGET
        && start.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let verified = counters.verified.load(Ordering::Relaxed);
    let errors = counters.errors.load(Ordering::Relaxed);
    let stats = sess.stats();
    let srv = server.stats();
    let paths: Vec<&str> = srv
        .sessions
        .iter()
        .flat_map(|s| s.paths.iter().map(|p| p.addr.as_str()))
        .collect();
    assert!(
        !paths.is_empty() && paths.iter().all(|a| a.starts_with("127.0.0.2:")),
        "the server sees the client's source address: {paths:?}"
    );
    sess.close();
    server.stop();
    engine.shutdown().expect("clean shutdown");
    assert!(verified >= TARGET, "verified {verified}");
    // (Requests still in flight when the session closes fail with -ENOTCONN.)
    assert_eq!(errors, 0);
    assert_eq!(counters.mismatches.load(Ordering::Relaxed), 0);
    assert_eq!(stats.paths[0].reconnects_ok, 0, "{}", stats.to_json());
    assert!(stats.paths[0].rdma.read_cnt > 0);
    if core_cq {
        assert_eq!(
            counters.routed.load(Ordering::Relaxed),
            1,
            "each core's IO connection routed through its CQ"
        );
    }
}
