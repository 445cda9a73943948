//! The RTRS client (`rtrs_spdk::client`) end to end: against a scripted server
//! (`util::fake_server`) and the real server, on simulated reactors and on real
//! threads; paths failing at each step of bring-up; the per-core shared completion
//! queue; a data path that never allocates; the statistics JSON. The client's pure pieces (permits, policies, path states, reconnect,
//! statistics) have unit tests in `src/client/`.
//!
//! One test binary; each module is one capability, `util` is their harness. Run one
//! module with e.g. `cargo test --test client fake::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

// The no-allocation tests count with this allocator. It counts per thread, so the other
// tests of this binary, running on threads of their own, do not disturb the count.
#[path = "../util/counting_alloc.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

mod bringup;
mod core_cq;
mod fake;
mod noalloc;
mod server;
mod stats_json;
mod threads;
mod util;
