//! The engine (`rtrs_spdk::engine`): reactors stepped by hand on a virtual clock, real
//! reactor threads, and a hot path that never allocates.
//!
//! One test binary; each module is one capability. Run one module with e.g.
//! `cargo test --test engine sim::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

// The no-allocation tests count with this allocator. It counts per thread, so the other
// tests of this binary, running on threads of their own, do not disturb the count.
#[path = "../util/counting_alloc.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

mod noalloc;
mod sim;
mod threads;
