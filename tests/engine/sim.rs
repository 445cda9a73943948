//! Deterministic engine tests: several reactors stepped by hand on one thread with a
//! virtual clock (the `Simulation` driver). No sleeping, no threads, no timing.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtrs_spdk::engine::{Ctx, Msg, PollResult, Poller, SendError, Simulation, Timer};

fn idle_poller() -> Box<dyn Poller> {
    Box::new(|_: &mut dyn Ctx| PollResult::Idle)
}

/// A timed poller that records the virtual time of each run.
fn recorder(log: &Rc<RefCell<Vec<u64>>>) -> Box<dyn Poller> {
    let log = Rc::clone(log);
    Box::new(move |ctx: &mut dyn Ctx| {
        log.borrow_mut().push(ctx.now());
        PollResult::Busy
    })
}

#[test]
fn one_shot_timer_fires_exactly_when_due_and_once() {
    let mut sim = Simulation::new(1, 16);
    let log = Rc::new(RefCell::new(Vec::new()));
    sim.reactor(0)
        .register_timer(Timer::once_ns(100), recorder(&log));
    assert_eq!(sim.reactor(0).next_deadline(), Some(100));

    sim.advance(99);
    sim.step();
    assert!(log.borrow().is_empty(), "fired before its deadline");
    sim.advance(1);
    sim.step();
    assert_eq!(*log.borrow(), [100]);
    sim.advance(1000);
    sim.step();
    sim.step();
    assert_eq!(*log.borrow(), [100], "one-shot timer fired twice");
    assert_eq!(
        sim.reactor(0).pollers(),
        0,
        "one-shot timer not removed after firing"
    );
    assert_eq!(sim.reactor(0).stats().timers_fired, 1);
}

#[test]
fn periodic_timer_fires_on_every_period() {
    let mut sim = Simulation::new(1, 16);
    let log = Rc::new(RefCell::new(Vec::new()));
    sim.advance(5);
    sim.reactor(0)
        .register_timer(Timer::periodic_ns(10), recorder(&log));
    // Step every nanosecond: the timer must run exactly at 15, 25, 35, 45, 55.
    for _ in 0..55 {
        sim.advance(1);
        sim.step();
    }
    assert_eq!(*log.borrow(), [15, 25, 35, 45, 55]);

    // A reactor that falls behind runs the timer once, then keeps the phase.
    sim.advance(37); // now 97: deadlines 65..95 were missed
    sim.step();
    assert_eq!(log.borrow().last(), Some(&97));
    assert_eq!(sim.reactor(0).next_deadline(), Some(107));
}

#[test]
fn timers_can_be_cancelled_from_outside_and_from_themselves() {
    let mut sim = Simulation::new(1, 16);
    let periodic_log = Rc::new(RefCell::new(Vec::new()));
    let once_log = Rc::new(RefCell::new(Vec::new()));
    let periodic = sim.reactor(0).register_timer(
        Timer::periodic(Duration::from_nanos(10)),
        recorder(&periodic_log),
    );
    let once = sim
        .reactor(0)
        .register_timer(Timer::once(Duration::from_nanos(50)), recorder(&once_log));

    // A periodic timer that cancels itself on its third run.
    let runs = Rc::new(Cell::new(0));
    let r = Rc::clone(&runs);
    let selfish = sim.reactor(0).with_ctx(|ctx| {
        ctx.every(Duration::from_nanos(10), move |ctx: &mut dyn Ctx| {
            r.set(r.get() + 1);
            if r.get() == 3 {
                let me = ctx.current().expect("a timer knows its own id");
                assert!(ctx.unregister(me));
            }
            PollResult::Busy
        })
    });

    for _ in 0..2 {
        sim.advance(10);
        sim.step();
    }
    assert_eq!(*periodic_log.borrow(), [10, 20]);
    assert!(sim.reactor(0).unregister(periodic));
    assert!(
        !sim.reactor(0).unregister(periodic),
        "cancelling twice must fail"
    );
    assert!(sim.reactor(0).unregister(once));

    for _ in 0..10 {
        sim.advance(10);
        sim.step();
    }
    assert_eq!(
        *periodic_log.borrow(),
        [10, 20],
        "cancelled periodic timer fired"
    );
    assert!(
        once_log.borrow().is_empty(),
        "cancelled one-shot timer fired"
    );
    assert_eq!(runs.get(), 3, "self-cancelled timer kept running");
    assert!(!sim.reactor(0).unregister(selfish));
    assert_eq!(sim.reactor(0).pollers(), 0);
    assert_eq!(sim.reactor(0).next_deadline(), None);
}

#[test]
fn closure_one_shot_timer_runs_once() {
    let mut sim = Simulation::new(1, 16);
    let hit = Rc::new(Cell::new(0u64));
    let h = Rc::clone(&hit);
    sim.reactor(0)
        .with_ctx(|ctx| ctx.after(Duration::from_micros(3), move |ctx| h.set(ctx.now())));
    sim.run_for(10_000, 500);
    assert_eq!(hit.get(), 3_000);
}

thread_local! {
    static CALLS: RefCell<Vec<(usize, u64)>> = const { RefCell::new(Vec::new()) };
}

fn note(ctx: &mut dyn Ctx, arg: u64) {
    CALLS.with(|c| c.borrow_mut().push((ctx.core(), arg)));
}

#[test]
fn cross_reactor_messages_arrive_in_order() {
    CALLS.with(|c| c.borrow_mut().clear());
    let mut sim = Simulation::new(3, 256);
    // Reactor 0 sends 0..100 to reactor 2, alternating the allocation-free and the
    // closure form, all in one poll.
    let mut sent = false;
    sim.reactor(0).register(Box::new(move |ctx: &mut dyn Ctx| {
        if sent {
            return PollResult::Idle;
        }
        sent = true;
        for i in 0..100u64 {
            let msg = if i % 2 == 0 {
                Msg::call(note, i)
            } else {
                Msg::new(move |ctx| note(ctx, i))
            };
            ctx.send(2, msg).expect("mailbox has room for 100");
        }
        PollResult::Busy
    }));
    assert_eq!(sim.run_until_idle(10), Some(2));
    let calls = CALLS.with(|c| c.borrow().clone());
    let expected: Vec<(usize, u64)> = (0..100).map(|i| (2, i)).collect();
    assert_eq!(calls, expected);
    assert_eq!(sim.reactor(2).stats().messages, 100);
    assert_eq!(sim.reactor(1).stats().messages, 0);
}

#[test]
fn message_to_own_core_runs_on_a_later_loop() {
    let mut sim = Simulation::new(1, 8);
    let order = Arc::new(Mutex::new(Vec::new()));
    let o = Arc::clone(&order);
    sim.reactor(0).with_ctx(move |ctx| {
        let o2 = Arc::clone(&o);
        ctx.defer(0, move |_| o2.lock().unwrap().push("message"))
            .expect("room");
        o.lock().unwrap().push("sender");
    });
    assert_eq!(*order.lock().unwrap(), ["sender"]);
    sim.step();
    assert_eq!(*order.lock().unwrap(), ["sender", "message"]);
}

#[test]
fn full_mailbox_gives_the_message_back() {
    let mut sim = Simulation::new(2, 4);
    let ran = Arc::new(AtomicU64::new(0));
    let msg = |ran: &Arc<AtomicU64>| {
        let ran = Arc::clone(ran);
        Msg::new(move |_| {
            ran.fetch_add(1, Ordering::Relaxed);
        })
    };
    for _ in 0..4 {
        sim.send(1, msg(&ran)).expect("mailbox has room");
    }
    let err = sim
        .send(1, msg(&ran))
        .expect_err("fifth message must bounce");
    assert!(err.is_full());
    assert!(err.to_string().contains("reactor 1 is full"), "{err}");
    let back = err.into_msg();

    sim.step();
    assert_eq!(ran.load(Ordering::Relaxed), 4);
    sim.send(1, back).expect("room again after a step");
    sim.step();
    assert_eq!(ran.load(Ordering::Relaxed), 5, "returned message was lost");

    match sim.send(7, msg(&ran)) {
        Err(SendError::NoSuchCore {
            core: 7, cores: 2, ..
        }) => {}
        other => panic!("expected NoSuchCore, got {other:?}"),
    }
}

#[test]
fn poller_retries_a_bounced_message_later() {
    // Reactor 0 produces 10 messages for reactor 1 whose mailbox holds 2; it keeps the
    // bounced one and retries on its next poll. Nothing is lost, order is kept.
    let mut sim = Simulation::new(2, 2);
    let got = Arc::new(Mutex::new(Vec::new()));
    let mut next = 0u64;
    let mut held: Option<Msg> = None;
    let mut bounces = 0u32;
    let g = Arc::clone(&got);
    let bounces_seen = Rc::new(Cell::new(0));
    let bs = Rc::clone(&bounces_seen);
    sim.reactor(0).register(Box::new(move |ctx: &mut dyn Ctx| {
        let mut busy = PollResult::Idle;
        loop {
            let msg = match held.take() {
                Some(m) => m,
                None if next < 10 => {
                    let g = Arc::clone(&g);
                    let i = next;
                    next += 1;
                    Msg::new(move |_| g.lock().unwrap().push(i))
                }
                None => return busy,
            };
            match ctx.send(1, msg) {
                Ok(()) => busy = PollResult::Busy,
                Err(e) if e.is_full() => {
                    held = Some(e.into_msg());
                    bounces += 1;
                    bs.set(bounces);
                    return busy;
                }
                Err(e) => panic!("{e}"),
            }
        }
    }));
    assert!(sim.run_until_idle(100).is_some());
    assert_eq!(*got.lock().unwrap(), (0..10).collect::<Vec<_>>());
    assert!(bounces_seen.get() > 0, "the mailbox never pushed back");
}

#[test]
fn pollers_register_and_unregister_from_inside_a_poller() {
    let mut sim = Simulation::new(1, 8);
    let child_runs = Rc::new(Cell::new(0u32));
    let victim_runs = Rc::new(Cell::new(0u32));

    let v = Rc::clone(&victim_runs);
    let victim = sim.reactor(0).register(Box::new(move |_: &mut dyn Ctx| {
        v.set(v.get() + 1);
        PollResult::Busy
    }));

    let c = Rc::clone(&child_runs);
    let mut step = 0;
    sim.reactor(0).register(Box::new(move |ctx: &mut dyn Ctx| {
        step += 1;
        match step {
            1 => {
                let c = Rc::clone(&c);
                ctx.register(Box::new(move |_: &mut dyn Ctx| {
                    c.set(c.get() + 1);
                    PollResult::Busy
                }));
            }
            2 => assert!(ctx.unregister(victim)),
            3 => {
                let me = ctx.current().expect("running poller has an id");
                assert!(ctx.unregister(me));
            }
            _ => panic!("poller ran after unregistering itself"),
        }
        PollResult::Busy
    }));
    assert_eq!(sim.reactor(0).pollers(), 2);

    sim.step();
    assert_eq!(
        child_runs.get(),
        0,
        "a poller registered in a loop ran in that loop"
    );
    assert_eq!(sim.reactor(0).pollers(), 3);
    sim.step();
    assert_eq!(child_runs.get(), 1);
    sim.step();
    sim.step();
    assert_eq!(child_runs.get(), 3);
    // The victim sits before its killer in poll order: it ran in steps 1 and 2, then
    // was unregistered in step 2.
    assert_eq!(victim_runs.get(), 2, "victim ran after being unregistered");
    assert_eq!(sim.reactor(0).pollers(), 1, "only the child remains");
}

#[test]
fn message_registers_a_timer_on_the_target_reactor() {
    let mut sim = Simulation::new(2, 8);
    let fired_on = Arc::new(Mutex::new(None));
    let f = Arc::clone(&fired_on);
    sim.send(
        1,
        Msg::new(move |ctx| {
            ctx.after(Duration::from_nanos(20), move |ctx| {
                *f.lock().unwrap() = Some((ctx.core(), ctx.now()));
            });
        }),
    )
    .unwrap();
    sim.step();
    assert_eq!(sim.reactor(1).pollers(), 1);
    sim.run_for(100, 10);
    assert_eq!(*fired_on.lock().unwrap(), Some((1, 20)));
}

#[test]
fn stale_ids_and_foreign_ids_are_refused() {
    let mut sim = Simulation::new(2, 8);
    let on0 = sim.reactor(0).register(idle_poller());
    assert_eq!(on0.core(), 0);
    assert!(
        !sim.reactor(1).unregister(on0),
        "reactor 1 removed reactor 0's poller"
    );
    assert!(sim.reactor(0).unregister(on0));
    let again = sim.reactor(0).register(idle_poller());
    assert!(
        !sim.reactor(0).unregister(on0),
        "stale id removed a newer poller"
    );
    assert!(sim.reactor(0).unregister(again));
}

#[test]
fn busy_and_idle_loops_and_time_are_counted() {
    let mut sim = Simulation::new(1, 8);
    let mut left = 3;
    sim.reactor(0).register(Box::new(move |_: &mut dyn Ctx| {
        if left > 0 {
            left -= 1;
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }));
    let mut results = Vec::new();
    for i in 0..5 {
        if i > 0 {
            sim.advance(10);
        }
        results.push(sim.step());
    }
    use PollResult::{Busy, Idle};
    assert_eq!(results, [Busy, Busy, Busy, Idle, Idle]);
    let s = sim.reactor(0).stats();
    assert_eq!((s.loops, s.busy_loops, s.idle_loops), (5, 3, 2));
    // Loop k's time runs until loop k+1 starts: 3 busy intervals of 10 ns, 1 idle one.
    assert_eq!((s.busy_ns, s.idle_ns), (30, 10));
    assert_eq!(sim.mailboxes().cores(), 1);
}

/// A poller with outstanding "requests" that it fails on shutdown by reporting each
/// failure to reactor 0, and records being dropped.
struct Outstanding {
    inflight: Vec<u64>,
    failed: Arc<Mutex<Vec<(usize, u64)>>>,
    dropped: Rc<Cell<u32>>,
}

impl Poller for Outstanding {
    fn poll(&mut self, _ctx: &mut dyn Ctx) -> PollResult {
        PollResult::Idle
    }

    fn shutdown(&mut self, ctx: &mut dyn Ctx) {
        let from = ctx.core();
        for id in self.inflight.drain(..) {
            let failed = Arc::clone(&self.failed);
            ctx.defer(0, move |_| failed.lock().unwrap().push((from, id)))
                .expect("room for the failure notes");
        }
    }

    fn name(&self) -> &str {
        "outstanding"
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.dropped.set(self.dropped.get() + 1);
    }
}

#[test]
fn shutdown_lets_pollers_fail_outstanding_work_then_drops_everything() {
    let mut sim = Simulation::new(2, 64);
    let failed = Arc::new(Mutex::new(Vec::new()));
    let dropped = Rc::new(Cell::new(0));
    for core in 0..2 {
        sim.reactor(core).register(Box::new(Outstanding {
            inflight: vec![core as u64 * 10, core as u64 * 10 + 1],
            failed: Arc::clone(&failed),
            dropped: Rc::clone(&dropped),
        }));
    }
    // A timer far in the future must never fire.
    let late = Rc::new(RefCell::new(Vec::new()));
    sim.reactor(1)
        .register_timer(Timer::once(Duration::from_secs(60)), recorder(&late));
    // A message sent to reactor 1 before shutdown is still run by the drain.
    let pre = Arc::new(AtomicU64::new(0));
    let p = Arc::clone(&pre);
    sim.send(
        1,
        Msg::new(move |_| {
            p.fetch_add(1, Ordering::Relaxed);
        }),
    )
    .unwrap();

    let report = sim.shutdown(100);
    assert!(report.drained, "{report:?}");
    let mut f = failed.lock().unwrap().clone();
    f.sort_unstable();
    assert_eq!(f, [(0, 0), (0, 1), (1, 10), (1, 11)]);
    assert_eq!(pre.load(Ordering::Relaxed), 1);
    assert!(late.borrow().is_empty());
    assert_eq!(dropped.get(), 2, "pollers were not dropped at close");
    assert_eq!(report.dropped[0].pollers, 1);
    assert_eq!(report.dropped[1].pollers, 1);
    assert_eq!(report.dropped[1].timers, 1);
    assert_eq!(report.dropped[0].messages + report.dropped[1].messages, 0);
}

#[test]
fn shutdown_is_bounded_when_a_poller_never_goes_idle() {
    let mut sim = Simulation::new(1, 8);
    sim.reactor(0)
        .register(Box::new(|_: &mut dyn Ctx| PollResult::Busy));
    let report = sim.shutdown(50);
    assert!(!report.drained);
    assert_eq!(report.steps, 50);
    assert_eq!(report.dropped[0].pollers, 1);
}

#[test]
fn heartbeat_style_timers_on_two_reactors_share_one_clock() {
    // Two "paths" on two reactors send heartbeats every 5 s to each other; each counts
    // what it received. 60 virtual seconds pass in 1 s ticks, instantly.
    let mut sim = Simulation::new(2, 64);
    let received = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    for core in 0..2 {
        let received = Arc::clone(&received);
        sim.reactor(core).with_ctx(|ctx| {
            ctx.every(Duration::from_secs(5), move |ctx: &mut dyn Ctx| {
                let peer = 1 - ctx.core();
                let received = Arc::clone(&received);
                ctx.defer(peer, move |ctx| {
                    received[ctx.core()].fetch_add(1, Ordering::Relaxed);
                })
                .expect("room");
                PollResult::Busy
            })
        });
    }
    sim.run_for(60_000_000_000, 1_000_000_000);
    // Reactor 1's last heartbeat was sent after reactor 0 had looped at t = 60 s.
    assert_eq!(received[0].load(Ordering::Relaxed), 11);
    assert_eq!(sim.run_until_idle(10), Some(2));
    assert_eq!(received[0].load(Ordering::Relaxed), 12);
    assert_eq!(received[1].load(Ordering::Relaxed), 12);
}

fn self_chain(ctx: &mut dyn Ctx, left: u64) {
    CHAIN.with(|c| c.set(c.get() + 1));
    if left > 0 {
        let me = ctx.core();
        ctx.send(me, Msg::call(self_chain, left - 1)).expect("room");
    }
}

thread_local! {
    static CHAIN: Cell<u64> = const { Cell::new(0) };
}

#[test]
fn a_message_sent_during_a_loop_runs_on_the_next_loop() {
    CHAIN.with(|c| c.set(0));
    let mut sim = Simulation::new(1, 4);
    sim.send(0, Msg::call(self_chain, 5)).unwrap();
    for expected in 1..=6 {
        sim.step();
        assert_eq!(
            CHAIN.with(Cell::get),
            expected,
            "a self-sent chain ran ahead"
        );
    }
    assert!(!sim.step().is_busy());
}

/// A clock that moves on by 1 µs at every read and counts its reads.
#[derive(Debug, Default)]
struct CountingClock(AtomicU64);

impl rtrs_spdk::engine::Clock for CountingClock {
    fn now_ns(&self) -> u64 {
        1000 * (self.0.fetch_add(1, Ordering::Relaxed) + 1)
    }
}

#[test]
fn a_loop_reads_the_clock_once_and_all_its_code_sees_that_time() {
    let clock = Arc::new(CountingClock::default());
    let mailboxes = rtrs_spdk::engine::Mailboxes::new(1, 16);
    let mut r = rtrs_spdk::engine::Reactor::new(0, mailboxes, clock.clone());
    let seen = Rc::new(RefCell::new(Vec::new()));
    // Three pollers and a message, each asking for the time several times.
    for _ in 0..3 {
        let seen = Rc::clone(&seen);
        r.register(Box::new(move |ctx: &mut dyn Ctx| {
            seen.borrow_mut().push(ctx.now());
            seen.borrow_mut().push(ctx.now());
            PollResult::Busy
        }));
    }
    let s2 = Arc::new(Mutex::new(Vec::new()));
    let s3 = Arc::clone(&s2);
    r.mailboxes()
        .send(
            0,
            Msg::new(move |ctx: &mut dyn Ctx| s3.lock().unwrap().push(ctx.now())),
        )
        .unwrap();
    let before = clock.0.load(Ordering::Relaxed);
    r.run_once();
    assert_eq!(
        clock.0.load(Ordering::Relaxed) - before,
        1,
        "one loop read the clock more than once"
    );
    let first = seen.borrow()[0];
    assert!(
        seen.borrow().iter().all(|&t| t == first),
        "{:?}",
        seen.borrow()
    );
    assert_eq!(*s2.lock().unwrap(), [first]);
    r.run_once();
    assert_eq!(seen.borrow().len(), 12);
    assert!(
        seen.borrow()[6] > first,
        "the next loop sees a later time: {:?}",
        seen.borrow()
    );
}
