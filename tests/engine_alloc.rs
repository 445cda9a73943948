//! The engine's hot path does not allocate: idle loops, due periodic timers and
//! function-pointer messages run without touching the heap. Checked with a counting
//! global allocator (per thread, so other tests' threads do not interfere).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use rtrs_spdk::engine::{Ctx, Msg, PollResult, Simulation, Timer};

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds the
// GlobalAlloc contract; the counter is a const-initialised thread-local `Cell` with no
// destructor, so touching it never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds new_size rules.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
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
