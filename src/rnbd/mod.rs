//! RNBD, the block protocol carried over RTRS (the kernel's `drivers/block/rnbd/`):
//! a client maps a remote device by name and sends block IO as RTRS requests; the
//! server exports named block devices.
//!
//! - [`backend`]: what the server exports — a name bound to a block backend (RAM or a
//!   file/block device), driven from a polled reactor without blocking it. It plays the
//!   part of the `struct block_device` that `rnbd-srv` opens and submits bios to.

pub mod backend;
