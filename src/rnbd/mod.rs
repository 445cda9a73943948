//! RNBD, the block protocol carried over RTRS (the kernel's `drivers/block/rnbd/`):
//! a client maps a remote device by name and sends block IO as RTRS requests; the
//! server exports named block devices.
//!
//! - [`backend`]: what the server exports — a name bound to a block backend (RAM or a
//!   file/block device), driven from a polled reactor without blocking it. It plays the
//!   part of the `struct block_device` that `rnbd-srv` opens and submits bios to.
//! - [`server`]: exports with their access rules, per-session device tables and the
//!   per-core request processor (`rnbd-srv`).
//! - [`client`]: message building and the device state machine (`rnbd-clt`).

pub mod backend;
pub mod client;
pub mod server;

/// The RTRS direction of an RNBD request: READ (the server fills the data area: a reply
/// or read data; also a bare flush, which carries nothing) or WRITE (the data area holds
/// the client's data, or nothing for CLOSE, discard and write-zeroes).
pub use crate::common::Dir;
