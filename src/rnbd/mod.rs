//! RNBD, the block protocol carried over RTRS (the kernel's `drivers/block/rnbd/`):
//! a client maps a remote device by name and sends block IO as RTRS requests; the
//! server exports named block devices.
//!
//! - [`backend`]: what the server exports — a name bound to a block backend (RAM or a
//!   file/block device), driven from a polled reactor without blocking it. It plays the
//!   part of the `struct block_device` that `rnbd-srv` opens and submits bios to.
//! - [`server`]: exports with their access rules, per-session device tables, the
//!   per-core request processor and [`server::RnbdServer`], the RTRS server's handler
//!   (`rnbd-srv`).
//! - [`client`]: message building, the device state machine, one
//!   [`client::RnbdQueue`] per core over the RTRS client's per-core session handles and
//!   one [`client::RnbdAdmin`] per session (`rnbd-clt`).
//!
//! # Cores
//! Both sides follow the RTRS layers' plan (docs/ARCHITECTURE.md, "Sessions on cores"):
//! - Server: every core has its own backend instances (RAM disks share one memory, files
//!   are opened once per core) and answers the requests of the connections it polls;
//!   exports (writer counts) and sessions (device tables) are shared, behind locks
//!   taken per OPEN/CLOSE only; an IO reads its core's copy of the session's device
//!   table, refreshed when the published version moves (`server/session.rs`).
//! - Client: the session's home core runs SESS_INFO/OPEN/CLOSE and the link events;
//!   block IO goes out from any core on that core's connection and completes there.
//!
//! # Beyond the kernel
//! - Every message length is checked before use; replies are written only into a data
//!   area large enough; data areas must match `bi_size`; ranges are checked; a
//!   read-only mapping refuses writes (docs/PROTOCOL.md §9.8).
//! - The RTRS client keeps IO while no path is up, so requests built with a device id
//!   of the old server session can be re-sent after a reconnect. The client re-opens
//!   its devices (which may get other ids) only once none of them is in flight, so an
//!   old id never reaches a device it did not mean: the new server session answers it
//!   with −ENOTCONN. The RNBD client then keeps such a request, like one submitted while
//!   the device is unreachable, and sends it again with the device's new id once it is
//!   re-opened; only a request still waiting `io_wait_timeout` after its submission
//!   fails (`client::IoError::Unreachable` says why).

pub mod backend;
pub mod client;
pub mod server;

/// The RTRS direction of an RNBD request: READ (the server fills the data area: a reply
/// or read data; also a bare flush, which carries nothing) or WRITE (the data area holds
/// the client's data, or nothing for CLOSE, discard and write-zeroes).
pub use crate::common::Dir;
