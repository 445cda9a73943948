//! The block backends (`rtrs_spdk::rnbd::backend`): export specs, one conformance suite
//! for every flavour (RAM, file through io_uring, the thread pool, automatic), a backend
//! driven from a reactor, and a real block device when one is given.
//!
//! One test binary; each module is one capability. Run one module with e.g.
//! `cargo test --test backend spec::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

mod blockdev;
mod conformance;
mod reactor;
mod spec;
