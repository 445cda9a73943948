//! The wire format (`rtrs_spdk::proto`): golden bytes of every message, a deterministic
//! fuzz loop over every decoder, and codecs that never allocate.
//!
//! One test binary; each module is one capability. Run one module with e.g.
//! `cargo test --test proto golden::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

// The no-allocation tests count with this allocator. It counts per thread, so the other
// tests of this binary, running on threads of their own, do not disturb the count.
#[path = "../util/counting_alloc.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

mod fuzz;
mod golden;
mod noalloc;
