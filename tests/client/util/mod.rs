//! Shared helpers of the client tests: a simulated set of reactors with a loopback
//! fabric, a scripted server ([`fake_server`]), and a per-core workload that writes a
//! pattern, reads it back and checks it, counting every completion exactly once.

pub mod fake_server;
pub mod real;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use rtrs_spdk::client::{
    ClientCompletion, ClientConfig, ClientEvents, ClientIo, ClientSession, CoreCq, Dir, LinkEvent,
    PathAddr, SessionCore, Sgl, SubmitError,
};
use rtrs_spdk::engine::{Ctx, PollResult, Simulation};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr, Sge};
use rtrs_spdk::Errno;

pub use fake_server::FakeServer;

pub const MS: u64 = 1_000_000;

/// Records link events.
pub struct Events(pub Rc<RefCell<Vec<LinkEvent>>>);

impl ClientEvents for Events {
    fn link_event(&mut self, _cx: &mut dyn Ctx, ev: LinkEvent) {
        self.0.borrow_mut().push(ev);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Idle,
    Writing,
    Reading,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    state: SlotState,
    tag: u64,
    seq: u64,
    len: u32,
}

/// What a workload saw.
#[derive(Debug, Default, Clone)]
pub struct LoadStats {
    pub submitted: u64,
    pub completed: u64,
    pub verified: u64,
    pub errors: Vec<Errno>,
    pub mismatches: u64,
    /// Completions for no request in flight (a double or stray completion).
    pub strays: u64,
    pub busy: u64,
}

/// One core's workload: `qd` slots, each writing then reading back its own disk region.
pub struct Load {
    pub core: SessionCore,
    buf: Option<Arc<Mr>>,
    /// Register the buffer with the core for zero-copy single-segment READs.
    direct: bool,
    fabric: Arc<dyn Fabric>,
    slots: Vec<Slot>,
    qd: usize,
    sizes: Vec<u32>,
    pub stats: LoadStats,
    /// Start no new requests.
    pub stop: bool,
    /// Stop after this many verified reads per core (0: no limit).
    pub target: u64,
    region: usize,
    core_idx: usize,
    /// Called with `true` before and `false` after every call into the client (to count
    /// allocations made by the client alone).
    pub measure: Option<fn(bool)>,
}

/// The data of write `seq` of `slot`: 8-byte words that differ per word, slot and seq
/// (cheap enough for debug builds).
fn pattern(slot: usize, seq: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let base = (seq << 32) ^ ((slot as u64) << 48) ^ 0x9e37_79b9_7f4a_7c15;
    for (w, c) in v.chunks_mut(8).enumerate() {
        let word = base
            .wrapping_add((w as u64).wrapping_mul(0x1000_0001))
            .to_le_bytes();
        c.copy_from_slice(&word[..c.len()]);
    }
    v
}

impl Load {
    /// A stopped workload of `qd` slots on `core`, whose disk regions are those of
    /// index `core_idx` (distinct per workload sharing a disk).
    pub fn new(
        core: SessionCore,
        fabric: Arc<dyn Fabric>,
        qd: usize,
        sizes: Vec<u32>,
        core_idx: usize,
        direct: bool,
    ) -> Load {
        Load {
            core,
            buf: None,
            direct,
            fabric,
            slots: vec![
                Slot {
                    state: SlotState::Idle,
                    tag: u64::MAX,
                    seq: 0,
                    len: 0
                };
                qd
            ],
            qd,
            sizes,
            stats: LoadStats::default(),
            stop: true,
            target: 0,
            region: 0,
            core_idx,
            measure: None,
        }
    }

    fn max_io(&self) -> usize {
        self.core.max_io_size() as usize
    }

    fn disk_off(&self, slot: usize) -> u64 {
        ((self.core_idx * self.qd + slot) * self.region) as u64
    }

    fn sgl(&self, slot: usize, len: u32, seq: u64) -> ([Sge; 3], usize) {
        let mr = self.buf.as_ref().unwrap();
        let base = slot * self.max_io();
        let len = len as usize;
        if seq % 3 == 1 && len >= 3 * 512 {
            let a = (len / 3) & !511;
            let b = a;
            (
                [
                    mr.sge(base, a),
                    mr.sge(base + a, b),
                    mr.sge(base + a + b, len - a - b),
                ],
                3,
            )
        } else {
            ([mr.sge(base, len), Sge::default(), Sge::default()], 1)
        }
    }

    fn start(&mut self, cx: &mut dyn Ctx, slot: usize, read: bool) -> bool {
        let s = self.slots[slot];
        let (sgl, n) = self.sgl(slot, s.len, s.seq);
        let tag = ((slot as u64) << 40) | (s.seq << 1) | u64::from(read);
        let usr = self.disk_off(slot).to_le_bytes();
        let io = ClientIo {
            tag,
            dir: if read { Dir::Read } else { Dir::Write },
            usr: &usr,
            sgl: Sgl::Copy(&sgl[..n]),
            admin: false,
            wait: rtrs_spdk::client::PathWait::Session,
        };
        if let Some(m) = self.measure {
            m(true);
        }
        let res = self.core.submit(cx.now(), io);
        if let Some(m) = self.measure {
            m(false);
        }
        match res {
            Ok(()) => {
                self.stats.submitted += 1;
                let s = &mut self.slots[slot];
                s.tag = tag;
                s.state = if read {
                    SlotState::Reading
                } else {
                    SlotState::Writing
                };
                true
            }
            Err(SubmitError::Busy { .. }) => {
                self.stats.busy += 1;
                false
            }
            Err(e) => panic!("submit refused: {e}"),
        }
    }

    pub fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let mut out = [ClientCompletion::default(); 32];
        if let Some(m) = self.measure {
            m(true);
        }
        let n = self.core.poll(cx.now(), &mut out);
        if let Some(m) = self.measure {
            m(false);
        }
        if self.buf.is_none() && self.core.max_io_size() > 0 {
            let len = self.qd.max(1) * self.max_io();
            let mr = Arc::new(
                self.fabric
                    .register(
                        MemBuf::zeroed(len),
                        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    )
                    .unwrap(),
            );
            if self.direct {
                self.core.add_region(mr.clone());
            }
            self.buf = Some(mr);
            self.region = self.max_io();
        }
        for c in &out[..n] {
            self.complete(cx, *c);
        }
        if self.buf.is_some() && !self.stop {
            for slot in 0..self.qd {
                if self.slots[slot].state == SlotState::Idle
                    && (self.target == 0 || self.stats.verified < self.target)
                {
                    let seq = self.slots[slot].seq + 1;
                    let len = self.sizes[(seq as usize + slot) % self.sizes.len()]
                        .min(self.max_io() as u32);
                    self.slots[slot].seq = seq;
                    self.slots[slot].len = len;
                    let mr = self.buf.as_ref().unwrap();
                    let data = pattern(slot, seq, len as usize);
                    mr.write_at(slot * self.max_io(), &data);
                    if !self.start(cx, slot, false) {
                        break;
                    }
                }
            }
        }
        if n > 0 {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    fn complete(&mut self, cx: &mut dyn Ctx, c: ClientCompletion) {
        self.stats.completed += 1;
        let slot = (c.tag >> 40) as usize;
        if slot >= self.qd
            || self.slots[slot].tag != c.tag
            || self.slots[slot].state == SlotState::Idle
        {
            self.stats.strays += 1;
            return;
        }
        if let Err(e) = c.result {
            self.stats.errors.push(e);
            self.slots[slot].state = SlotState::Idle;
            return;
        }
        match self.slots[slot].state {
            SlotState::Writing => {
                let mr = self.buf.as_ref().unwrap();
                mr.write_at(
                    slot * self.max_io(),
                    &vec![0u8; self.slots[slot].len as usize],
                );
                if !self.start(cx, slot, true) {
                    // Retry the read later by re-writing: keep it simple, count as idle.
                    self.slots[slot].state = SlotState::Idle;
                }
            }
            SlotState::Reading => {
                let s = self.slots[slot];
                let mut got = vec![0u8; s.len as usize];
                self.buf
                    .as_ref()
                    .unwrap()
                    .read_at(slot * self.max_io(), &mut got);
                if got != pattern(slot, s.seq, s.len as usize) {
                    self.stats.mismatches += 1;
                }
                self.stats.verified += 1;
                self.slots[slot].state = SlotState::Idle;
            }
            SlotState::Idle => unreachable!(),
        }
    }

    /// Requests of this workload still outstanding.
    pub fn outstanding(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.state != SlotState::Idle)
            .count()
    }
}

/// A client session on simulated reactors with a per-core workload, whatever the
/// target.
pub struct Rig {
    pub sim: Simulation,
    pub sess: ClientSession,
    pub loads: Vec<Rc<RefCell<Load>>>,
    pub events: Rc<RefCell<Vec<LinkEvent>>>,
    pub paths: Vec<PathAddr>,
    /// Per core, with [`Setup::core_cq`].
    pub core_cqs: Vec<Rc<RefCell<CoreCq>>>,
}

/// Registers on reactor `k` a poller that polls `cq` once per loop; registered before
/// the core's workloads, it runs before them in every loop.
pub fn register_core_cq(sim: &mut Simulation, k: usize, cq: &Rc<RefCell<CoreCq>>) {
    let cq = cq.clone();
    sim.reactor(k).register(Box::new(move |_cx: &mut dyn Ctx| {
        if cq.borrow_mut().poll() > 0 {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }));
}

pub struct Setup {
    pub cores: usize,
    pub paths: usize,
    pub qd: u16,
    pub chunk: u32,
    pub new_rkey: bool,
    pub load_qd: usize,
    pub sizes: Vec<u32>,
    pub tweak: fn(&mut ClientConfig),
    /// Run over the tcp fabric on 127.0.0.1 instead of loopback (no fault injection).
    pub tcp: bool,
    /// Zero-copy READs into the workload's registered buffer.
    pub direct: bool,
    /// Each core's IO connections on one shared CQ per core ([`CoreCq`]), polled once
    /// per loop before the core's workload.
    pub core_cq: bool,
    /// Wraps the client's fabric (the server keeps the plain one), e.g. to change what
    /// the fabric says of itself.
    pub client_fabric: Option<WrapFabric>,
}

/// What [`Setup::client_fabric`] holds.
pub type WrapFabric = fn(Arc<dyn Fabric>) -> Arc<dyn Fabric>;

impl Default for Setup {
    fn default() -> Self {
        Setup {
            cores: 2,
            paths: 1,
            qd: 64,
            chunk: 64 * 1024,
            new_rkey: false,
            load_qd: 4,
            sizes: vec![4096],
            tweak: |_| {},
            tcp: false,
            direct: false,
            core_cq: false,
            client_fabric: None,
        }
    }
}

impl Harness {
    pub fn new(s: Setup) -> Harness {
        let (fabric, lo): (Arc<dyn Fabric>, Option<Arc<LoopbackFabric>>) = if s.tcp {
            (Arc::new(rtrs_spdk::fabric::tcp::TcpFabric::new()), None)
        } else {
            let lo = Arc::new(LoopbackFabric::new());
            (lo.clone(), Some(lo))
        };
        let disk = s.cores * s.load_qd.max(1) * s.chunk as usize;
        let srv = Rc::new(RefCell::new(FakeServer::on(
            fabric.clone(),
            lo,
            s.paths,
            s.qd,
            s.chunk,
            s.new_rkey,
            disk,
        )));
        let mut sim = Simulation::new(s.cores, 1024);
        let s2 = srv.clone();
        sim.reactor(0).register(Box::new(move |_cx: &mut dyn Ctx| {
            if s2.borrow_mut().poll() {
                PollResult::Busy
            } else {
                PollResult::Idle
            }
        }));
        let addrs = srv.borrow().addrs.clone();
        let fabric = s.client_fabric.map_or(fabric.clone(), |wrap| wrap(fabric));
        let rig = Rig::open(sim, fabric, &addrs, &s);
        Harness { rig, srv }
    }
}

/// A [`Rig`] against the scripted [`FakeServer`].
pub struct Harness {
    pub rig: Rig,
    pub srv: Rc<RefCell<FakeServer>>,
}

impl std::ops::Deref for Harness {
    type Target = Rig;
    fn deref(&self) -> &Rig {
        &self.rig
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Rig {
        &mut self.rig
    }
}

impl Rig {
    /// Opens the session (on reactor 0) over `addrs` and sets up one workload per core.
    pub fn open(
        mut sim: Simulation,
        fabric: Arc<dyn Fabric>,
        addrs: &[std::net::SocketAddr],
        s: &Setup,
    ) -> Rig {
        let paths: Vec<PathAddr> = addrs.iter().map(|a| PathAddr::new(*a)).collect();
        let mut cfg = ClientConfig::new("test-sess", paths.clone());
        cfg.reconnect_delay = Duration::from_millis(200);
        cfg.reconnect_jitter = Duration::from_millis(300);
        cfg.io_wait_timeout = Duration::from_secs(10);
        (s.tweak)(&mut cfg);
        let events = Rc::new(RefCell::new(Vec::new()));
        let f = fabric.clone();
        let ev = Box::new(Events(events.clone()));
        let (sess, cores) = sim
            .reactor(0)
            .with_ctx(|cx| ClientSession::open(cx, f, cfg, ev))
            .expect("open");
        let mut loads = Vec::new();
        let mut core_cqs = Vec::new();
        for (k, mut core) in cores.into_iter().enumerate() {
            if s.core_cq {
                let cq = CoreCq::new(&*fabric, k).expect("the fabric has shared CQs");
                assert!(core.attach(&cq));
                let cq = Rc::new(RefCell::new(cq));
                register_core_cq(&mut sim, k, &cq);
                core_cqs.push(cq);
            }
            let load = Rc::new(RefCell::new(Load::new(
                core,
                fabric.clone(),
                s.load_qd,
                s.sizes.clone(),
                k,
                s.direct,
            )));
            let l2 = load.clone();
            sim.reactor(k)
                .register(Box::new(move |cx: &mut dyn Ctx| l2.borrow_mut().poll(cx)));
            loads.push(load);
        }
        Rig {
            sim,
            sess,
            loads,
            events,
            paths,
            core_cqs,
        }
    }

    /// Steps (at most `max_steps` of 1 µs) until the load has verified `more` requests
    /// beyond what it had; panics with the totals if it has not.
    #[track_caller]
    pub fn verify_more(&mut self, more: u64, max_steps: usize) {
        let v = self.total().verified;
        assert!(
            self.run_until(max_steps, 1000, |h| h.total().verified >= v + more),
            "the load did not verify {more} more requests: {:?}",
            self.total()
        );
    }

    /// Steps with `tick_ns` of virtual time per step until `cond` or `max_steps`.
    pub fn run_until(
        &mut self,
        max_steps: usize,
        tick_ns: u64,
        mut cond: impl FnMut(&Rig) -> bool,
    ) -> bool {
        for _ in 0..max_steps {
            if cond(self) {
                return true;
            }
            self.sim.advance(tick_ns);
            self.sim.step();
        }
        cond(self)
    }

    pub fn connect(&mut self) {
        let n = self.paths.len() as u32;
        assert!(
            self.run_until(10_000, 1000, |h| h.sess.paths_up() == n),
            "session did not connect: {:?}",
            self.sess.paths()
        );
        // Let the cores pick up their connections.
        self.run_until(100, 1000, |_| false);
    }

    pub fn start_load(&mut self, target: u64) {
        for l in &self.loads {
            let mut l = l.borrow_mut();
            l.stop = false;
            l.target = target;
        }
    }

    pub fn stop_load(&mut self) {
        for l in &self.loads {
            l.borrow_mut().stop = true;
        }
    }

    pub fn total(&self) -> LoadStats {
        let mut t = LoadStats::default();
        for l in &self.loads {
            let s = l.borrow().stats.clone();
            t.submitted += s.submitted;
            t.completed += s.completed;
            t.verified += s.verified;
            t.errors.extend(s.errors);
            t.mismatches += s.mismatches;
            t.strays += s.strays;
            t.busy += s.busy;
        }
        t
    }

    pub fn outstanding(&self) -> usize {
        self.loads.iter().map(|l| l.borrow().outstanding()).sum()
    }

    /// Stops the load and steps until every request completed.
    pub fn drain(&mut self, max_steps: usize, tick_ns: u64) {
        self.stop_load();
        assert!(
            self.run_until(max_steps, tick_ns, |h| h.outstanding() == 0),
            "requests still outstanding: {}",
            self.outstanding()
        );
    }
}
