//! What the RNBD client needs from one core's handle on an RTRS client session: submit a
//! request ([`ClientIo`]: user header + scatter-gather list, READ or WRITE, admin or not)
//! and poll its completions ([`ClientCompletion`]) on the same core, given the time. The
//! kernel's `rtrs_clt_request` / the `conf` callback. The RTRS client's per-core
//! `SessionCore` implements it (`rtrs.rs`); tests may put anything that carries requests
//! to an RNBD server behind it. Requests and completions are the RTRS client's own
//! types, passed through untouched.

use std::sync::Arc;
use std::time::Duration;

use crate::client::{ClientCompletion, ClientIo};
use crate::fabric::Mr;
use crate::Errno;

/// Why a session handle refused a request (nothing was sent).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RnbdSendError {
    /// No free permit now: submit again after completions were polled.
    #[error("no free permit: retry after completions")]
    Busy,
    /// No path of the session can carry the request now, and one may come back: submit
    /// again once [`path_epoch`](SessionHandle::path_epoch) moved.
    #[error("no path of the session can carry the request now")]
    Unreachable,
    /// The request cannot be carried; `errno` for the block layer.
    #[error("{reason}")]
    Refused { errno: Errno, reason: String },
}

/// One core's handle on an RTRS client session, as RNBD uses it.
pub trait SessionHandle {
    /// Sends `io`; its completion comes out of [`poll`](Self::poll) on this core.
    /// `now`: the reactor's clock (ns).
    ///
    /// A request with [`PathWait::Caller`](crate::client::PathWait::Caller) (every block
    /// request of the RNBD queue) does not wait in the handle for a path: it is refused
    /// with `Unreachable`, or completes with −ECONNRESET when its path dies.
    ///
    /// # Errors
    /// [`RnbdSendError::Busy`] or [`RnbdSendError::Unreachable`] to retry later,
    /// [`RnbdSendError::Refused`] otherwise.
    fn submit(&mut self, now: u64, io: ClientIo<'_>) -> Result<(), RnbdSendError>;

    /// Moves whenever this core's handle got a path (connected, reconnected, added): a
    /// request refused `Unreachable` is worth sending again then. Constant for a handle
    /// that never answers `Unreachable`.
    fn path_epoch(&self) -> u64 {
        0
    }

    /// Makes progress and moves finished requests into `out`; returns how many.
    fn poll(&mut self, now: u64, out: &mut [ClientCompletion]) -> usize;

    /// Transmits what was submitted since the last push now instead of at the next
    /// poll (see `SessionCore::push`); nothing by default.
    fn push(&mut self) {}

    /// Largest data size of one request (0 while unknown).
    fn max_io_size(&self) -> u32;

    /// How long a block request may wait for the device to be reachable (for a path, for
    /// the device's re-open after a reconnect, for a permit), all in the RNBD client's
    /// per-core queue, [`RnbdQueue`](super::RnbdQueue). Zero: requests fail at once.
    fn io_wait_timeout(&self) -> Duration;

    /// Registers `len` bytes of zeros with the session's fabric: the source of the
    /// zero-filled WRITEs of emulated write-zeroes (read by the fabric, never written).
    /// Called once per session.
    ///
    /// # Errors
    /// [`RnbdSendError::Refused`] naming why the memory could not be registered.
    fn zero_region(&self, len: usize) -> Result<Mr, RnbdSendError>;

    /// Tells this core's handle that its requests will name `mr` (the zero buffer), so
    /// it can resolve their segments against it without asking the fabric (the verbs
    /// fabric keeps no table to ask). Called once per core, before the first use.
    fn use_region(&mut self, mr: Arc<Mr>) {
        let _ = mr;
    }
}
