//! Answers in the loop that completed them: where the driver runs a reactor's pollers
//! newest first (SPDK), a backend that completes IO in a poller of its own (an SPDK bdev
//! channel) sees a request in the loop it arrived, and the server sends its answer in
//! that same loop (docs/ARCHITECTURE.md, "Answers in the loop that completed them").

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use rtrs_spdk::engine::{Ctx, PollResult, Simulation};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::server::{IoId, LinkEvent, Responses, ServerHandler, SessionId, SrvIo};

use crate::server_util::client::Ids;
use crate::server_util::{Harness, TestPath, MAX_STEPS};

/// The loops, counted by a poller registered before the server: on a reactor that runs
/// pollers newest first it runs last in each loop, so every poller of one loop reads the
/// same number.
type Loops = Arc<AtomicU64>;

#[derive(Default)]
struct Counts {
    /// Answers given in the loop that read the request (and submitted it).
    same_loop: AtomicUsize,
    /// Answers given in a later loop.
    later: AtomicUsize,
}

/// The backend's state: requests submitted and those completed, each with the loop
/// that submitted it.
#[derive(Default)]
struct Backend {
    queued: Vec<(IoId, u64)>,
    done: Vec<(IoId, u64)>,
}

/// A handler whose backend completes every request in its own poller, at its next run;
/// the backend is opened (its poller registered) when the handler starts or, `lazy`, at
/// the first request (as an export added after the server started).
struct Deferred {
    loops: Loops,
    counts: Arc<Counts>,
    backend: Rc<RefCell<Backend>>,
    lazy: bool,
    opened: u64,
}

impl Deferred {
    /// Registers the backend's poller, as an SPDK bdev channel registers its poller when
    /// it opens; it goes when the handler does.
    fn open(&mut self, cx: &mut dyn Ctx) {
        self.opened += 1;
        let weak: Weak<RefCell<Backend>> = Rc::downgrade(&self.backend);
        cx.register(Box::new(move |cx: &mut dyn Ctx| {
            let Some(b) = weak.upgrade() else {
                if let Some(id) = cx.current() {
                    cx.unregister(id);
                }
                return PollResult::Idle;
            };
            let mut b = b.borrow_mut();
            let Backend { queued, done } = &mut *b;
            let any = !queued.is_empty();
            done.append(queued);
            if any {
                PollResult::Busy
            } else {
                PollResult::Idle
            }
        }));
    }
}

impl ServerHandler for Deferred {
    fn link_event(&mut self, _: &mut dyn Ctx, _: SessionId, _: &str, _: LinkEvent) {}

    fn request(&mut self, cx: &mut dyn Ctx, io: SrvIo<'_>, _: &mut Responses) {
        if self.opened == 0 {
            self.open(cx);
        }
        let at = self.loops.load(Ordering::Relaxed);
        self.backend.borrow_mut().queued.push((io.id, at));
    }

    fn poll(&mut self, _: &mut dyn Ctx, out: &mut Responses) -> bool {
        let now = self.loops.load(Ordering::Relaxed);
        let mut b = self.backend.borrow_mut();
        let any = !b.done.is_empty();
        for (id, at) in b.done.drain(..) {
            let c = if at == now {
                &self.counts.same_loop
            } else {
                &self.counts.later
            };
            c.fetch_add(1, Ordering::Relaxed);
            out.respond(id, Ok(()));
        }
        any
    }

    fn start(&mut self, cx: &mut dyn Ctx) {
        if !self.lazy {
            self.open(cx);
        }
    }

    fn backends_opened(&self) -> u64 {
        self.opened
    }
}

/// A server on one simulated reactor that runs its pollers newest first (or not), with
/// the deferred handler; the loop counter registered before it. The counts of its
/// answers.
fn setup(newest_first: bool, lazy: bool) -> (Harness, Arc<Counts>) {
    let mut sim = Simulation::new(1, 4096);
    if newest_first {
        sim.run_newest_first();
    }
    let loops: Loops = Arc::default();
    let l = Arc::clone(&loops);
    sim.reactor(0).register(Box::new(move |_: &mut dyn Ctx| {
        l.fetch_add(1, Ordering::Relaxed);
        PollResult::Idle
    }));
    let counts = Arc::new(Counts::default());
    let c = Arc::clone(&counts);
    let fabric = LoopbackFabric::new();
    let f: Arc<dyn Fabric> = Arc::new(fabric.clone());
    let h = Harness::start_on(sim, Harness::config(true), fabric, f, move |_| {
        Box::new(Deferred {
            loops: Arc::clone(&loops),
            counts: Arc::clone(&c),
            backend: Rc::default(),
            lazy,
            opened: 0,
        })
    });
    (h, counts)
}

/// Writes and reads through every buf id; returns the answers given in the loop that
/// read their request and those given later.
fn traffic(h: &mut Harness, counts: &Counts) -> (usize, usize) {
    let mut p = TestPath::connect(h, "answers", 2, Ids::random(), true)
        .unwrap_or_else(|e| panic!("connect: errno {e}"));
    for k in 0..32u16 {
        assert_eq!(p.write(h, 1, k % 16, 0, &[k as u8; 512]), 0);
        let (e, _) = p.read(h, 1, (k + 1) % 16, 0, 512, k % 2 == 0);
        assert_eq!(e, 0);
    }
    (
        counts.same_loop.load(Ordering::Relaxed),
        counts.later.load(Ordering::Relaxed),
    )
}

/// Steps until the server and the backend's poller are gone: only the loop counter is
/// left on the reactor.
fn stop(mut h: Harness) {
    h.server.stop();
    for _ in 0..MAX_STEPS {
        h.sim.step();
        if h.server.is_stopped() && h.sim.reactor(0).pollers() == 1 {
            return;
        }
    }
    panic!(
        "server stopped: {}, pollers left: {}",
        h.server.is_stopped(),
        h.sim.reactor(0).pollers()
    );
}

#[test]
fn newest_first_answers_in_the_loop_the_backend_completed() {
    let (mut h, counts) = setup(true, false);
    let (same, later) = traffic(&mut h, &counts);
    assert_eq!(
        (same, later),
        (64, 0),
        "answers in the loop that read the request, and later"
    );
    stop(h);
}

#[test]
fn newest_first_answers_in_that_loop_for_a_backend_opened_later() {
    // The backend's poller comes after the server's: the whole poll moves ahead of it.
    // The first request, submitted before the backend's poller ran at all, is answered
    // a loop later.
    let (mut h, counts) = setup(true, true);
    let (same, later) = traffic(&mut h, &counts);
    assert_eq!(
        (same, later),
        (63, 1),
        "answers in the loop that read the request, and later"
    );
    stop(h);
}

#[test]
fn in_slot_order_a_backend_of_its_own_answers_a_loop_later() {
    // Our reactors run pollers in registration order: the backend's poller before the
    // server's, which submits after it and answers at the next loop. Their backends
    // complete in the handler's poll instead (the RAM disk, files through io_uring).
    let (mut h, counts) = setup(false, false);
    let (same, later) = traffic(&mut h, &counts);
    assert_eq!((same, later), (0, 64));
    stop(h);
}
