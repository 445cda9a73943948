//! The fabrics (`rtrs_spdk::fabric`) without hardware: the conformance suite
//! (`tests/conformance/`) against loopback and tcp (plain, with PSK, every readiness
//! mode), then what each backend does beyond the shared contract, and source addresses.
//! The verbs fabric has a binary of its own (`tests/fabric_verbs.rs`: it needs a device
//! and runs in the kernel VM of `ci/kernel-vm.sh`).
//!
//! One test binary; each module is one capability. Run one module with e.g.
//! `cargo test --test fabric tcp::`.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

// The no-allocation tests count with this allocator. It counts per thread, so the other
// tests of this binary, running on threads of their own, do not disturb the count.
#[path = "../util/counting_alloc.rs"]
mod counting;

#[global_allocator]
static GLOBAL: counting::Counting = counting::Counting;

#[macro_use]
#[path = "../conformance/mod.rs"]
mod conformance;

mod conformance_loopback;
mod conformance_tcp;
mod conformance_tcp_psk;
mod conformance_tcp_readiness;
mod loopback;
mod source_addr;
mod tcp;
