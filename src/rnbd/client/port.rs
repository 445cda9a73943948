//! What the RNBD client needs from one core's RTRS session handle: submit a request
//! (user header + scatter-gather list, READ or WRITE, admin or not) and poll its
//! completions on the same core. The kernel's `rtrs_clt_request` / the `conf` callback.
//! The RTRS client's per-core `SessionCore` implements it; tests may put anything that
//! carries requests to an RNBD server behind it.

use std::time::Duration;

use crate::engine::Ctx;
use crate::fabric::{Mr, Sge};
use crate::rnbd::Dir;

/// One request for [`RtrsPort::submit`].
#[derive(Clone, Copy, Debug)]
pub struct PortIo<'a> {
    /// Comes back in the completion.
    pub tag: u64,
    pub dir: Dir,
    /// The RNBD message.
    pub usr: &'a [u8],
    /// Data (WRITE) or reply space (READ), registered with the session's fabric; valid
    /// and untouched by anyone else until the completion.
    pub sgl: &'a [Sge],
    /// SESS_INFO / OPEN / CLOSE (the kernel sends them on the service connection).
    pub admin: bool,
}

/// A finished request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCompletion {
    pub tag: u64,
    /// 0 or a negative errno.
    pub errno: i32,
}

/// Why a port refused a request (nothing was sent).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PortError {
    /// No free permit now: submit again after completions were polled.
    #[error("no free permit: retry after completions")]
    Busy,
    /// The request cannot be carried; `errno` for the block layer.
    #[error("{reason}")]
    Refused { errno: i32, reason: String },
}

/// One core's RTRS session, as RNBD uses it.
pub trait RtrsPort {
    /// Sends `io`; its completion comes out of [`poll`](Self::poll) on this core.
    ///
    /// # Errors
    /// [`PortError::Busy`] to retry later, [`PortError::Refused`] otherwise.
    fn submit(&mut self, cx: &mut dyn Ctx, io: PortIo<'_>) -> Result<(), PortError>;

    /// Makes progress and moves finished requests into `out`; returns how many.
    fn poll(&mut self, cx: &mut dyn Ctx, out: &mut [PortCompletion]) -> usize;

    /// Largest data size of one request (0 while unknown).
    fn max_io_size(&self) -> u32;

    /// How long a block request may wait for the device to be reachable: for a path
    /// (the session's own wait) and, above it, for the device's re-open after a
    /// reconnect (the RNBD client's per-core IO, `io.rs`). Zero: requests fail at once.
    fn io_wait_timeout(&self) -> Duration;

    /// Registers `len` bytes of zeros with the session's fabric: the source of the
    /// zero-filled WRITEs of emulated write-zeroes (read by the fabric, never written).
    /// Called once per session.
    ///
    /// # Errors
    /// [`PortError::Refused`] naming why the memory could not be registered.
    fn zero_region(&self, len: usize) -> Result<Mr, PortError>;
}
