//! # rtrs-spdk
//!
//! The Linux kernel's RTRS transport (RDMA Transport, protocol 2.0) and the RNBD block
//! protocol above it, as a userspace, polled-mode engine: byte-compatible with the
//! kernel's `rtrs-clt`/`rtrs-srv` and `rnbd-clt`/`rnbd-srv`, and built to run inside
//! SPDK applications as well as in its own reactors.
//!
//! ## Layers
//! - [`proto`]: the wire format only. Bytes in, typed messages or a typed error out.
//! - [`fabric`]: the subset of RDMA verbs RTRS needs, as a trait, with three backends:
//!   `loopback` (in-process, with fault injection), `tcp` (one-sided semantics carried
//!   over TCP, keys and bounds checked as a NIC would) and `verbs` (rdma-core).
//! - [`engine`]: when code runs: pollers, timers and cross-core mailboxes, driven by our
//!   pinned reactors or, inside SPDK, by SPDK pollers.
//! - [`common`]: what the RTRS client and server share: connections, message buffers,
//!   the heartbeat.
//! - [`client`]: the RTRS client: sessions of several paths, per-core permits and IO,
//!   multipath policies, failover, reconnect, statistics.
//! - [`server`]: the RTRS server: listeners, sessions and paths, the chunk pool, IO
//!   dispatch to a per-core handler.
//! - [`rnbd`]: the block protocol above RTRS, with the block backends it exports.
//! - [`ratelimit`]: the rate limiter every layer's messages about peers go through.
//! - [`sync`]: the lock that ignores poisoning and the single-writer counter.
//!
//! - [`cli`]: what the standalone binaries (`rtrs-target`, `rtrs-bench`) share: fabric
//!   URLs, option parsers, logging, starting a target.
//!
//! Each layer has its own precise error type; [`Error`] gathers them.

#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
pub mod common;
pub mod engine;
pub mod errno;
pub mod error;
pub mod fabric;
pub mod process;
pub mod proto;
pub mod ratelimit;
pub mod rnbd;
pub mod server;
#[cfg(feature = "spdk")]
pub mod spdk;
pub mod sync;

pub use errno::Errno;
pub use error::{Error, Result};
