//! The client's data path does not allocate: once a session is connected, submitting
//! and polling reads and writes (single- and multi-segment, both response forms) makes
//! no heap allocation. Counted with a per-thread counting allocator that only counts
//! inside calls into the client.

mod client_util;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use client_util::{Harness, Setup};

struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is forwarded unchanged to the system allocator; the counters are
// const-initialised thread-local `Cell`s without destructors, so touching them neither
// allocates nor re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ON.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        }
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ON.try_with(Cell::get).unwrap_or(false) {
            let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        }
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds new_size rules.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn measure(on: bool) {
    ON.with(|c| c.set(on));
}

#[test]
fn submit_and_poll_do_not_allocate() {
    for (new_rkey, direct) in [(false, false), (true, false), (true, true)] {
        let mut h = Harness::new(Setup {
            paths: 2,
            new_rkey,
            direct,
            load_qd: 16,
            sizes: vec![512, 4096, 16384, 60000],
            ..Setup::default()
        });
        for l in &h.loads {
            l.borrow_mut().measure = Some(measure);
        }
        ALLOCS.with(|c| c.set(0));
        h.connect();
        h.start_load(0);
        assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 200));
        // The counter works: taking the connections in sized the per-permit state.
        assert!(ALLOCS.with(Cell::get) > 0);
        ALLOCS.with(|c| c.set(0));
        let v = h.total().verified;
        assert!(h.run_until(400_000, 1000, |h| h.total().verified >= v + 1000));
        let n = ALLOCS.with(Cell::get);
        assert_eq!(
            n, 0,
            "allocations inside submit/poll over 1000+ verified IOs (new_rkey {new_rkey})"
        );
        h.drain(100_000, 1000);
        let t = h.total();
        assert!(
            t.errors.is_empty() && t.mismatches == 0 && t.strays == 0,
            "{t:?}"
        );
    }
}
