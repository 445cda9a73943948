//! RNBD (`rtrs_spdk::rnbd`) on top of RTRS: the server without a transport, the client
//! device over a direct in-process port (`direct`), both end to end over loopback and
//! tcp, a path lost during the OPEN, host lists, refusals, IO waiting while a device is
//! unreachable, mappings the target closes, devices lost after the loss timeout, exports that
//! change size, write-zeroes and op 5 for every kernel version, exports changing while
//! serving, and an IO path that never allocates.
//!
//! One test binary; each module is one capability, `direct` is the port the client
//! tests share. Run one module with e.g. `cargo test --test rnbd wait::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

// The no-allocation tests count with this allocator. It counts per thread, so the other
// tests of this binary, running on threads of their own, do not disturb the count.
#[path = "../util/counting_alloc.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[path = "../util/legacy_client.rs"]
mod legacy_client;
#[path = "../util/rnbd_workload.rs"]
mod rnbd_workload;

mod bringup;
mod client;
mod direct;
mod e2e;
mod exports_dynamic;
mod force_close;
mod hosts;
mod loss;
mod noalloc;
mod op5_server;
mod refused;
mod resize;
mod server;
mod session;
mod tcp;
mod wait;
mod write_zeroes;
