//! The RTRS server (`rtrs_spdk::server`) against a minimal test client written on
//! `proto` + `fabric` (`tests/util/server/`): the handshake and IO, heartbeats,
//! failover hazards, hostile peers, isolation between sessions, real reactor threads, a
//! data path that never allocates, the statistics JSON.
//!
//! One test binary; each module is one capability. Run one module with e.g.
//! `cargo test --test server hostile::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

// The no-allocation tests count with this allocator. It counts per thread, so the other
// tests of this binary, running on threads of their own, do not disturb the count.
#[path = "../util/counting_alloc.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[path = "../util/server/mod.rs"]
mod server_util;

mod answers;
mod failover;
mod heartbeat;
mod hostile;
mod io;
mod isolation;
mod noalloc;
mod stats_json;
mod threads;
