//! Errors of the RTRS client: opening and managing a session, and submitting IO.

use crate::fabric::FabricError;
use crate::Errno;

/// Session set-up and management failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("session name {name:?}: {reason}")]
    BadSessname { name: String, reason: &'static str },
    #[error("session {sess}: {n} paths given, must be 1..={max}")]
    PathCount { sess: String, n: usize, max: usize },
    #[error("session {sess}: path {path} is already part of the session")]
    DuplicatePath { sess: String, path: String },
    #[error("session {sess}: no path {path}")]
    NoSuchPath { sess: String, path: String },
    /// No IO core, or more than a conn_req's `cid_num` can name besides cid 0.
    #[error("session {sess}: {cores} IO cores asked for, must be 1..=4095 (one connection per core plus the control connection, at most 4096 in a conn_req's cid_num)")]
    Cores { sess: String, cores: usize },
    #[error("session {sess}: {source}")]
    Fabric {
        sess: String,
        #[source]
        source: FabricError,
    },
    #[error("session {sess}: the session is closed")]
    Closed { sess: String },
}

/// Why [`super::SessionCore::submit`] refused a request. Nothing was posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// Every permit of this core is in use: retry after completions.
    #[error("no free permit on this core (queue depth share {capacity} in use): retry after completions")]
    Busy { capacity: u32 },
    /// Data larger than the session's max IO size.
    #[error("request of {len} bytes exceeds the session's max_io_size {max}")]
    TooLarge { len: u64, max: u32 },
    /// User header larger than the session allows.
    #[error("user header of {len} bytes exceeds the session's maximum {max}")]
    HeaderTooLarge { len: usize, max: u32 },
    /// More scatter-gather entries than allowed.
    #[error("{n} scatter-gather entries exceed the maximum {max}")]
    TooManySegments { n: usize, max: usize },
    /// The session never connected (its limits are unknown) and no path can come back
    /// within the wait, or the session is closed.
    #[error("no path of the session is connected or coming back")]
    NoPath,
    /// No path of this core can carry the request now, and one may come back (the
    /// session is connecting or reconnecting): for a request that waits with its caller
    /// ([`PathWait::Caller`](super::PathWait::Caller)). Send it again once
    /// [`path_epoch`](super::SessionCore::path_epoch) moved.
    #[error("no path of the session can carry the request on this core now")]
    Unreachable,
    /// The session never connected and the target refused every path for a reason a
    /// retry will not change; `ClientSession::refusal` says why.
    #[error("the target refused the session: {errno}")]
    Refused { errno: Errno },
    /// Scatter-gather entry `index` (`len` bytes at `addr` under `lkey`) is not inside a
    /// live registration of the session's fabric granting what the request needs (local
    /// write for a READ's reply space). Checked for every entry the client itself copies
    /// from or into, so a wrong address is refused here rather than dereferenced.
    #[error("scatter-gather entry {index} ({len} bytes at {addr:#x}, lkey {lkey:#x}) is not inside a live registration of the session's fabric with the access the request needs")]
    BadSge {
        index: usize,
        addr: u64,
        len: u32,
        lkey: u32,
    },
}
