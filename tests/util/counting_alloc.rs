//! A global allocator that counts the current thread's allocations, for the tests that
//! show a hot path never touches the heap. Per thread, so other tests' threads do not
//! interfere. A test binary installs it with
//! `#[global_allocator] static GLOBAL: counting::Counting = counting::Counting;`.

// Every binary that installs it reads `allocations`; only some also reset the count or
// count just a part of a test (`set_counting`).
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

pub struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(true) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    if ON.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds the
// GlobalAlloc contract; the counters are const-initialised thread-local `Cell`s with no
// destructor, so touching them never allocates or re-enters the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds new_size rules.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations (and reallocations) counted on this thread so far.
pub fn allocations() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Sets this thread's count back to zero.
pub fn reset() {
    ALLOCS.with(|c| c.set(0));
}

/// Counts only while `on` (counting is on unless a test turns it off), so a test can
/// measure just the calls it cares about.
pub fn set_counting(on: bool) {
    ON.with(|c| c.set(on));
}
