//! The engine's hot path does not allocate: idle loops, due periodic timers and
//! function-pointer messages run without touching the heap. Checked with a counting
//! global allocator (per thread, so other tests' threads do not interfere).

use crate::counting;

use std::time::Duration;

use rtrs_spdk::engine::{Ctx, Msg, PollResult, Simulation, Timer};

fn allocs() -> u64 {
    counting::allocations()
}

fn bounce(ctx: &mut dyn Ctx, left: u64) {
    if left > 0 {
        let next = (ctx.core() + 1) % ctx.cores();
        ctx.send(next, Msg::call(bounce, left - 1))
            .expect("one message in flight");
    }
}

#[test]
fn steady_state_loops_do_not_allocate() {
    let mut sim = Simulation::new(2, 16);
    for core in 0..2 {
        sim.reactor(core)
            .register(Box::new(|_: &mut dyn Ctx| PollResult::Idle));
        sim.reactor(core).register_timer(
            Timer::periodic(Duration::from_nanos(10)),
            Box::new(|_: &mut dyn Ctx| PollResult::Busy),
        );
        sim.reactor(core).register_timer(
            Timer::once(Duration::from_secs(1)),
            Box::new(|_: &mut dyn Ctx| PollResult::Busy),
        );
    }
    // Warm up: the first loops may size internal vectors.
    for _ in 0..10 {
        sim.advance(10);
        sim.step();
    }

    let before = allocs();
    for _ in 0..1000 {
        sim.step(); // idle: nothing due
    }
    for _ in 0..100 {
        sim.advance(10);
        sim.step(); // periodic timers due on both reactors
    }
    sim.send(0, Msg::call(bounce, 500)).expect("room");
    assert!(sim.run_until_idle(1000).is_some());
    let after = allocs();
    assert_eq!(after - before, 0, "the hot path allocated");

    let s = sim.reactor(0).stats();
    assert!(s.timers_fired >= 100 && s.messages >= 250, "{s:?}");
}
