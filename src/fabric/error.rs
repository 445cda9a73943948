//! The fabric's errors: refused posts ([`PostError`]) and failed set-up operations
//! ([`FabricError`]: registration, listen, connect, accept), each naming what failed and
//! keeping why as a typed [`SetupCause`] (a failed call's `io::Error` whole).

use std::borrow::Cow;
use std::net::SocketAddr;

use super::admission::AdmissionError;
use super::mem::AllocError;
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
    #[error("memory registration of {len} bytes failed: {cause}")]
    Register {
        len: usize,
        #[source]
        cause: Box<SetupCause>,
    },
    #[error("listen on {addr} failed: {cause}")]
    Listen {
        addr: SocketAddr,
        #[source]
        cause: Box<SetupCause>,
    },
    #[error("connect to {addr} failed: {cause}")]
    Connect {
        addr: SocketAddr,
        #[source]
        cause: Box<SetupCause>,
    },
    #[error("accept failed: {cause}")]
    Accept {
        #[source]
        cause: Box<SetupCause>,
    },
    #[error("private data of {len} bytes exceeds the {max}-byte limit", max = PRIVATE_DATA_LEN)]
    PrivateDataTooLong { len: usize },
    #[error("the {kind} fabric cannot authenticate connections: a pre-shared key (psk) is supported on the tcp fabric only")]
    AuthUnsupported { kind: FabricKind },
    #[error("completion queue: {cause}")]
    Cq {
        #[source]
        cause: Box<SetupCause>,
    },
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

impl FabricError {
    /// Why a registration, listen, connect, accept or completion-queue set-up failed
    /// (`None` for the other variants, whose fields say it all).
    pub fn cause(&self) -> Option<&SetupCause> {
        match self {
            FabricError::Register { cause, .. }
            | FabricError::Listen { cause, .. }
            | FabricError::Connect { cause, .. }
            | FabricError::Accept { cause }
            | FabricError::Cq { cause } => Some(cause),
            _ => None,
        }
    }
}

impl From<AllocError> for FabricError {
    fn from(e: AllocError) -> FabricError {
        FabricError::Register {
            len: e.len,
            cause: e.into(),
        }
    }
}

/// Why a set-up operation failed, under [`FabricError`]'s `Register`, `Listen`,
/// `Connect`, `Accept` and `Cq` (boxed there: errors stay small on the paths that return
/// them): a failed system or verbs call with its `io::Error`, a
/// typed refusal of the caller's numbers, or — where nothing below the fabric failed — the
/// fabric's own words for the state that refused (another fabric's domain, a peer gone).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupCause {
    /// A system or verbs call failed.
    #[error("{call}: {source}")]
    Os {
        call: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A verbs call on one RDMA device failed.
    #[error("{call} on {device}: {source}")]
    OnDevice {
        call: &'static str,
        device: String,
        #[source]
        source: std::io::Error,
    },
    /// Binding to the source address a connection was asked to leave from failed.
    #[error("bind to source {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// Queue sizes beyond what the fabric or device allows.
    #[error(transparent)]
    Caps(#[from] CapsError),
    /// A listener's admission limits out of range.
    #[error("admission limits: {0}")]
    Admission(#[from] AdmissionError),
    /// The memory could not be allocated.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// Refused by the fabric itself; the text names what and why.
    #[error("{0}")]
    Refused(Cow<'static, str>),
}

impl SetupCause {
    /// A refusal in the fabric's own words, boxed as [`FabricError`] holds it.
    pub fn refused(why: impl Into<Cow<'static, str>>) -> Box<SetupCause> {
        Box::new(SetupCause::Refused(why.into()))
    }

    /// The system call `call` failed with `source`, boxed as [`FabricError`] holds it.
    pub fn os(call: &'static str, source: std::io::Error) -> Box<SetupCause> {
        Box::new(SetupCause::Os { call, source })
    }
}

impl From<CapsError> for Box<SetupCause> {
    fn from(e: CapsError) -> Self {
        Box::new(e.into())
    }
}

impl From<AdmissionError> for Box<SetupCause> {
    fn from(e: AdmissionError) -> Self {
        Box::new(e.into())
    }
}

impl From<AllocError> for Box<SetupCause> {
    fn from(e: AllocError) -> Self {
        Box::new(e.into())
    }
}

/// Queue sizes ([`super::QpCaps`]) a fabric or device cannot give.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapsError {
    /// One field outside its range; `whose` names the limits ("the device's").
    #[error("{field} {asked} is outside {min}..={max} ({whose} limit)")]
    Field {
        field: &'static str,
        asked: u32,
        min: u32,
        max: u32,
        whose: &'static str,
    },
    /// Send and receive work requests together exceed the device's completion queue.
    #[error(
        "max_send_wr + max_recv_wr = {cqe} exceeds the device's max_cqe of {max_cqe} (one \
         CQ serves both queues)"
    )]
    Cqe { cqe: u64, max_cqe: u32 },
    /// No device of the fabric is present to check against.
    #[error("no RDMA device is present")]
    NoDevice,
}
#[cfg(test)]
mod size_probe {
    #[test]
    fn sizes() {
        eprintln!(
            "SIZES setup={} caps={} fabric={} adm={}",
            std::mem::size_of::<super::SetupCause>(),
            std::mem::size_of::<super::CapsError>(),
            std::mem::size_of::<super::FabricError>(),
            std::mem::size_of::<super::AdmissionError>()
        );
    }
}
