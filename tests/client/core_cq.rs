//! A core's shared completion queue on the client (`CoreCq`, docs/ARCHITECTURE.md
//! "Completion queues"): the IO connections of every session and every path on a core
//! report to one CQ, polled once per loop, and each completion reaches its own
//! session's request exactly once, with verified data — also while one of the paths
//! breaks and the other keeps working. Against the real server (whose cores share their
//! CQs too) on simulated reactors, over loopback and tcp.

use crate::util;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtrs_spdk::client::{ClientConfig, ClientSession, CoreCq, MpPolicy, PathAddr, PathState};
use rtrs_spdk::engine::{Ctx, Simulation};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::server::{Server, ServerConfig, ServerHandler};
use util::real::{Ram, RamHandler, RealHarness, RecordingFabric};
use util::{register_core_cq, Events, Load, LoadStats, Rig, Setup};

const QD: usize = 16;

fn server_cfg() -> ServerConfig {
    ServerConfig {
        queue_depth: 64,
        chunk_size: 128 * 1024,
        ..ServerConfig::default()
    }
}

fn clean(name: &str, t: &LoadStats) {
    assert!(t.errors.is_empty(), "{name}: errors: {:?}", t.errors);
    assert_eq!(t.mismatches, 0, "{name}: corrupted reads");
    assert_eq!(t.strays, 0, "{name}: double or stray completions");
    assert_eq!(
        t.submitted, t.completed,
        "{name}: every request completes exactly once"
    );
}

/// Two sessions on the one core of a simulation, each with its own path to the same
/// server (two listening addresses), both attached to the core's one CQ.
struct TwoSessions {
    sim: Simulation,
    /// Loopback only: to break the connections of one address.
    rec: Option<Arc<RecordingFabric>>,
    sess: Vec<ClientSession>,
    loads: Vec<Rc<RefCell<Load>>>,
    cq: Rc<RefCell<CoreCq>>,
    addrs: Vec<SocketAddr>,
    _server: Server,
}

impl TwoSessions {
    fn new(tcp: bool) -> TwoSessions {
        let cfg = server_cfg();
        let (fabric, rec): (Arc<dyn Fabric>, Option<Arc<RecordingFabric>>) = if tcp {
            (Arc::new(TcpFabric::new()), None)
        } else {
            let rec = Arc::new(RecordingFabric {
                lo: Arc::new(LoopbackFabric::new()),
                conns: Mutex::new(Vec::new()),
            });
            (rec.clone(), Some(rec))
        };
        let ram = Arc::new(Ram {
            bytes: Mutex::new(vec![0; 2 * QD * cfg.max_io_size() as usize]),
            events: Mutex::new(Vec::new()),
        });
        let mut sim = Simulation::new(1, 1024);
        let listen: Vec<SocketAddr> = (0..2).map(|_| "127.0.0.1:0".parse().unwrap()).collect();
        let f = fabric.clone();
        let server = sim
            .reactor(0)
            .with_ctx(|cx| {
                Server::start(cx, f, &listen, cfg, move |_core| {
                    Box::new(RamHandler(ram.clone())) as Box<dyn ServerHandler>
                })
            })
            .expect("server start");
        let addrs = server.local_addrs().to_vec();
        let cq = Rc::new(RefCell::new(
            CoreCq::new(&*fabric, 0).expect("the fabric has shared CQs"),
        ));
        register_core_cq(&mut sim, 0, &cq);
        let mut sess = Vec::new();
        let mut loads = Vec::new();
        for (k, a) in addrs.iter().enumerate() {
            let mut c = ClientConfig::new(format!("sess-{k}"), vec![PathAddr::new(*a)]);
            c.reconnect_delay = Duration::from_millis(200);
            c.reconnect_jitter = Duration::from_millis(100);
            c.io_wait_timeout = Duration::from_secs(10);
            let f = fabric.clone();
            let ev = Box::new(Events(Rc::new(RefCell::new(Vec::new()))));
            let (s, cores) = sim
                .reactor(0)
                .with_ctx(|cx| ClientSession::open(cx, f, c, ev))
                .expect("open");
            let mut core = cores.into_iter().next().expect("one core");
            assert!(core.attach(&cq.borrow()), "attached to its core's CQ");
            let load = Rc::new(RefCell::new(Load::new(
                core,
                fabric.clone(),
                QD,
                vec![4096, 512, 65536],
                k,
                false,
            )));
            let l2 = load.clone();
            sim.reactor(0)
                .register(Box::new(move |cx: &mut dyn Ctx| l2.borrow_mut().poll(cx)));
            sess.push(s);
            loads.push(load);
        }
        let mut h = TwoSessions {
            sim,
            rec,
            sess,
            loads,
            cq,
            addrs,
            _server: server,
        };
        assert!(
            h.run_until(200_000, 1000, |h| h.sess.iter().all(|s| s.paths_up() == 1)),
            "sessions did not connect"
        );
        h.run_until(100, 1000, |_| false);
        h
    }

    fn run_until(&mut self, steps: usize, tick: u64, mut cond: impl FnMut(&Self) -> bool) -> bool {
        for _ in 0..steps {
            if cond(self) {
                return true;
            }
            self.sim.advance(tick);
            self.sim.step();
        }
        cond(self)
    }

    fn stats(&self, k: usize) -> LoadStats {
        self.loads[k].borrow().stats.clone()
    }

    fn set_load(&self, on: bool) {
        for l in &self.loads {
            l.borrow_mut().stop = !on;
        }
    }

    /// Breaks every connection to server address `i` (loopback), as a transport failure.
    fn break_addr(&self, i: usize) {
        let rec = self.rec.as_ref().expect("loopback");
        let ends: Vec<_> = rec
            .conns
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| *p == self.addrs[i])
            .copied()
            .collect();
        assert!(!ends.is_empty());
        for (l, p) in ends {
            if let Some(f) = rec.lo.faults_between(l, p) {
                f.break_now();
            }
        }
    }

    fn drain(&mut self) {
        self.set_load(false);
        assert!(
            self.run_until(2_000_000, 1000, |h| h
                .loads
                .iter()
                .all(|l| l.borrow().outstanding() == 0)),
            "requests still outstanding"
        );
    }
}

/// Both sessions' IO connections on the one CQ; IO in flight on both at once, every
/// request verified and completed once.
fn two_sessions_share_one_cq(tcp: bool) {
    let mut h = TwoSessions::new(tcp);
    assert_eq!(
        h.cq.borrow().connections(),
        2,
        "one IO connection of each session on the core's CQ"
    );
    h.set_load(true);
    let want = 4 * QD as u64;
    assert!(
        h.run_until(2_000_000, 1000, |h| (0..2)
            .all(|k| h.stats(k).verified >= want)),
        "both sessions verify IO: {:?} {:?}",
        h.stats(0),
        h.stats(1)
    );
    h.drain();
    for k in 0..2 {
        clean(&format!("session {k}"), &h.stats(k));
    }
}

#[test]
fn two_sessions_on_one_core_share_its_cq_loopback() {
    two_sessions_share_one_cq(false);
}

#[test]
fn two_sessions_on_one_core_share_its_cq_tcp() {
    two_sessions_share_one_cq(true);
}

/// One session's path breaks under load: the other session keeps completing verified
/// IO on the same CQ meanwhile, the broken one reconnects (on the CQ again) and its
/// requests complete once each; nothing completes twice.
#[test]
fn one_session_breaks_the_other_keeps_completing_on_the_shared_cq() {
    let mut h = TwoSessions::new(false);
    h.set_load(true);
    assert!(h.run_until(2_000_000, 1000, |h| (0..2)
        .all(|k| h.stats(k).verified >= 16)));
    h.break_addr(0);
    assert!(
        h.run_until(200_000, 1000, |h| h.sess[0].paths_up() == 0),
        "session 0's path went down"
    );
    let before = h.stats(1).verified;
    let broken_at = h.stats(0).completed;
    // While session 0 is down (reconnect delay 200 ms), session 1 goes on.
    assert!(
        h.run_until(150_000, 1000, |h| h.stats(1).verified
            >= before + 4 * QD as u64),
        "session 1 kept completing: {:?}",
        h.stats(1)
    );
    assert_eq!(h.sess[1].paths()[0].1, PathState::Connected);
    // Session 0 comes back on the same core's CQ and verifies IO again: steps of 1 ms
    // of virtual time (session 1's load runs at every step), up to 2 s.
    assert!(
        h.run_until(2_000, 1_000_000, |h| h.sess[0].paths_up() == 1),
        "session 0 reconnected: {:?}",
        h.sess[0].paths()
    );
    assert!(
        h.run_until(2_000_000, 1000, |h| h.stats(0).completed
            >= broken_at + 4 * QD as u64),
        "session 0 completes IO again: {:?}",
        h.stats(0)
    );
    assert_eq!(
        h.cq.borrow().connections(),
        2,
        "the new connection is routed, the dead one is not"
    );
    h.drain();
    for k in 0..2 {
        clean(&format!("session {k}"), &h.stats(k));
    }
}

/// One session with two paths on one core, both paths' connections on the core's CQ:
/// breaking one under load fails its requests over to the other, each completing once
/// with verified data.
#[test]
fn two_paths_on_one_cq_one_broken_under_load() {
    let mut h = RealHarness::new(
        Setup {
            cores: 1,
            paths: 2,
            load_qd: QD,
            sizes: vec![4096, 65536, 512],
            core_cq: true,
            ..Setup::default()
        },
        server_cfg(),
    );
    h.connect();
    assert_eq!(h.core_cqs[0].borrow().connections(), 2);
    h.sess.set_policy(MpPolicy::RoundRobin);
    h.start_load(0);
    assert!(h.run_until(1_000_000, 1000, |h| h.total().verified >= 64));
    h.break_path(0);
    let at = h.total().verified;
    assert!(
        h.run_until(1_000_000, 1000, |h: &Rig| h.total().verified >= at + 128),
        "IO goes on over path 1: {:?}",
        h.total()
    );
    h.drain(2_000_000, 1000);
    clean("two paths", &h.total());
}
