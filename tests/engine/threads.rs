//! The threaded engine: real reactor threads on the cpumask, adaptive idling (this
//! machine is shared: no two busy loops), short runs, clean shutdown. Timeouts are
//! generous upper bounds only.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rtrs_spdk::engine::{
    Adaptive, CpuMask, Ctx, Engine, EngineConfig, EngineError, IdleStrategy, Msg, PollResult,
    Poller,
};

const WAIT: Duration = Duration::from_secs(30);

fn config() -> EngineConfig {
    let mut cfg = EngineConfig::new(CpuMask::parse("[0-1]").expect("valid mask"));
    cfg.idle = IdleStrategy::Adaptive(Adaptive {
        spin_loops: 64,
        min_sleep: Duration::from_micros(20),
        max_sleep: Duration::from_millis(2),
    });
    cfg.mailbox_capacity = 64;
    cfg
}

/// One hop of the ping-pong: runs on `ctx.core()`, which must alternate, and sends the
/// ball to the other reactor until `left` reaches zero.
fn hop(
    ctx: &mut dyn Ctx,
    left: u32,
    expect_core: usize,
    done: mpsc::Sender<Result<usize, String>>,
) {
    if ctx.core() != expect_core {
        let _ = done.send(Err(format!(
            "hop {left} ran on reactor {}, expected {expect_core}",
            ctx.core()
        )));
        return;
    }
    if left == 0 {
        let _ = done.send(Ok(ctx.core()));
        return;
    }
    let next = 1 - ctx.core();
    let sent = ctx.send(next, Msg::new(move |ctx| hop(ctx, left - 1, next, done)));
    // One ball in flight never fills a mailbox.
    sent.expect("ping-pong mailbox full");
}

#[test]
fn ping_pong_between_two_reactors_then_clean_shutdown() {
    const HOPS: u32 = 2000;
    let engine = Engine::start(config()).expect("engine starts");
    assert_eq!(engine.cores(), 2);
    assert_eq!(engine.cpus(), [0, 1]);

    let (tx, rx) = mpsc::channel();
    engine
        .send(0, Msg::new(move |ctx| hop(ctx, HOPS, 0, tx)))
        .expect("first serve");
    // HOPS is even: the ball ends where it started.
    let end = rx.recv_timeout(WAIT).expect("ping-pong finished in time");
    assert_eq!(end, Ok(0));

    // Live counters are readable from outside (a racy snapshot while reactors run).
    let live = engine.stats(0).expect("reactor 0");
    assert_eq!(live.loops, live.busy_loops + live.idle_loops);
    assert!(engine.stats(2).is_none());

    let reports = engine.shutdown().expect("no reactor panicked");
    assert_eq!(reports.len(), 2);
    for r in &reports {
        assert!(r.drained, "{r:?}");
        assert_eq!(r.dropped.messages, 0, "{r:?}");
        assert!(r.stats.loops > 0, "{r:?}");
    }
    let messages: u64 = reports.iter().map(|r| r.stats.messages).sum();
    assert_eq!(messages, u64::from(HOPS) + 1);
}

/// A poller holding outstanding work that its shutdown hook fails, reporting to the
/// test thread; counts its polls before shutdown in a reactor-local `Rc`.
struct Outstanding {
    inflight: u32,
    polls: Rc<Cell<u64>>,
    failed: mpsc::Sender<(usize, u32)>,
    dropped: Arc<AtomicU64>,
}

impl Poller for Outstanding {
    fn poll(&mut self, _ctx: &mut dyn Ctx) -> PollResult {
        self.polls.set(self.polls.get() + 1);
        PollResult::Idle
    }

    fn shutdown(&mut self, ctx: &mut dyn Ctx) {
        for id in 0..self.inflight {
            let _ = self.failed.send((ctx.core(), id));
        }
        self.inflight = 0;
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn shutdown_runs_hooks_and_drops_pollers_and_timers() {
    let engine = Engine::start(config()).expect("engine starts");
    let (failed_tx, failed_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let dropped = Arc::new(AtomicU64::new(0));
    let ticks = Arc::new(AtomicU64::new(0));
    for core in 0..engine.cores() {
        let failed = failed_tx.clone();
        let ready = ready_tx.clone();
        let dropped = Arc::clone(&dropped);
        let ticks = Arc::clone(&ticks);
        engine
            .send(
                core,
                Msg::new(move |ctx| {
                    ctx.register(Box::new(Outstanding {
                        inflight: 3,
                        polls: Rc::new(Cell::new(0)),
                        failed,
                        dropped,
                    }));
                    ctx.every(Duration::from_millis(1), move |_: &mut dyn Ctx| {
                        ticks.fetch_add(1, Ordering::SeqCst);
                        PollResult::Busy
                    });
                    // A timer that must never fire: it is dropped at shutdown.
                    ctx.after(Duration::from_secs(3600), |_| panic!("far timer fired"));
                    let _ = ready.send(());
                }),
            )
            .expect("room");
    }
    drop(failed_tx);
    for _ in 0..2 {
        ready_rx.recv_timeout(WAIT).expect("registration ran");
    }
    // Let the periodic timers run a few times (upper bound only).
    let started = std::time::Instant::now();
    while ticks.load(Ordering::SeqCst) < 6 {
        assert!(started.elapsed() < WAIT, "periodic timers did not run");
        std::thread::sleep(Duration::from_millis(1));
    }

    let reports = engine.shutdown().expect("no reactor panicked");
    let mut failed: Vec<_> = failed_rx.iter().collect();
    failed.sort_unstable();
    assert_eq!(failed, [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]);
    assert_eq!(dropped.load(Ordering::SeqCst), 2);
    for r in &reports {
        assert_eq!(r.dropped.pollers, 1, "{r:?}");
        assert_eq!(r.dropped.timers, 2, "{r:?}");
    }
}

#[test]
fn dropping_the_engine_stops_it() {
    let engine = Engine::start(config()).expect("engine starts");
    let (tx, rx) = mpsc::channel();
    engine
        .send(1, Msg::new(move |ctx| tx.send(ctx.core()).unwrap()))
        .unwrap();
    assert_eq!(rx.recv_timeout(WAIT), Ok(1));
    drop(engine);
}

#[test]
fn panicking_reactor_is_reported() {
    let engine = Engine::start(config()).expect("engine starts");
    engine
        .send(
            1,
            Msg::new(|_| panic!("deliberate test panic in a message")),
        )
        .unwrap();
    match engine.shutdown() {
        Err(EngineError::ReactorPanicked { core: 1, .. }) => {}
        other => panic!("expected reactor 1 to be reported, got {other:?}"),
    }
}

#[test]
fn zero_mailbox_capacity_is_refused() {
    let mut cfg = config();
    cfg.mailbox_capacity = 0;
    let err = Engine::start(cfg).expect_err("capacity 0 must be refused");
    assert!(err.to_string().contains("mailbox_capacity"), "{err}");
}
