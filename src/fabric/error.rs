//! The fabric's errors: refused posts ([`PostError`]) and failed set-up operations
//! ([`FabricError`]: registration, listen, connect, accept), each naming what failed.

use std::net::SocketAddr;

use super::{FabricKind, PRIVATE_DATA_LEN};

/// Why a post was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostErrorKind {
    /// The send or receive queue is full; poll and retry.
    QueueFull,
    /// More SGEs than the connection's `max_send_sge`, or SGEs on a request that takes none.
    TooManySge,
    /// The connection is not (or no longer) connected.
    NotConnected,
    /// The request itself is malformed (for example a bind longer than the backend allows).
    Invalid,
    /// Fault injection refused the post (loopback only).
    Injected,
    /// The connection (on a shared completion queue) is held by another thread; software
    /// backends check this (see `Conn::release_thread`).
    WrongThread,
}

/// A refused post: which request of the chain, and why. Requests before `index` were
/// accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("post refused at work request {index}: {kind:?}")]
pub struct PostError {
    pub index: usize,
    pub kind: PostErrorKind,
}

/// Errors of fabric set-up operations (registration, listen, connect, accept).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    #[error("no RDMA device found{0}")]
    NoDevice(String),
    #[error("memory registration of {len} bytes failed: {reason}")]
    Register { len: usize, reason: String },
    #[error("listen on {addr} failed: {reason}")]
    Listen { addr: SocketAddr, reason: String },
    #[error("connect to {addr} failed: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("accept failed: {reason}")]
    Accept { reason: String },
    #[error("private data of {len} bytes exceeds the {max}-byte limit", max = PRIVATE_DATA_LEN)]
    PrivateDataTooLong { len: usize },
    #[error("the {kind} fabric cannot authenticate connections: a pre-shared key (psk) is supported on the tcp fabric only")]
    AuthUnsupported { kind: FabricKind },
    #[error("completion queue: {reason}")]
    Cq { reason: String },
    /// The RDMA device a resource was asked on is not the fabric's now (it has gone, or
    /// never was): what lives on it cannot be made until it is back.
    #[error("no RDMA device {device} in this fabric now (present: {present})")]
    DeviceGone { device: u8, present: String },
    #[error("{call} failed: {source}")]
    Os {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
}

impl From<super::mem::AllocError> for FabricError {
    fn from(e: super::mem::AllocError) -> FabricError {
        FabricError::Register {
            len: e.len,
            reason: "out of memory".into(),
        }
    }
}
