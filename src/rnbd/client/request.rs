//! The names a core queue, the device table and write-zeroes share: a device's handle
//! ([`DevHandle`]), the admin tag bit ([`ADMIN_TAG`]) and why a block request was refused
//! ([`IoError`]). A leaf, so the modules that use them need not import each other.

use std::time::Duration;

use super::device::DeviceError;
use super::handle::RnbdSendError;
use crate::Errno;

/// Tags with this bit are the admin's requests; block IO tags must not use it.
pub const ADMIN_TAG: u64 = 1 << 63;

/// A device of a client session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevHandle(pub(super) usize);

impl DevHandle {
    /// Position among the session's devices (handles are never reused).
    pub fn index(self) -> usize {
        self.0
    }
}

/// Why a queue refused a block request (nothing was sent).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    #[error("no such device handle")]
    NoDevice,
    #[error("tag {tag:#x} has the admin bit (1 << 63) set")]
    BadTag { tag: u64 },
    #[error("scatter-gather list of {have} bytes for a request carrying {want}")]
    SglLength { have: u64, want: u32 },
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("rtrs: {0}")]
    Send(#[from] RnbdSendError),
    /// A request waited `io_wait_timeout` for its device to be reachable (a path up and
    /// the device re-opened after a reconnect) and failed with −ENOTCONN.
    #[error("device '{name}' unreachable for {} s: {reason}", waited.as_secs_f64())]
    Unreachable {
        name: String,
        waited: Duration,
        reason: String,
    },
}

impl IoError {
    /// Whether to submit again later (the session has no free permit now).
    pub fn is_busy(&self) -> bool {
        matches!(self, IoError::Send(RnbdSendError::Busy))
    }

    /// The errno for a block layer.
    pub fn errno(&self) -> Errno {
        match self {
            IoError::NoDevice => Errno::ENODEV,
            IoError::BadTag { .. } | IoError::SglLength { .. } => Errno::EINVAL,
            IoError::Device(e) => e.errno(),
            IoError::Send(RnbdSendError::Busy) => Errno::EAGAIN,
            IoError::Send(RnbdSendError::Unreachable) => Errno::ENOTCONN,
            IoError::Send(RnbdSendError::Refused { errno, .. }) => *errno,
            IoError::Unreachable { .. } => Errno::ENOTCONN,
        }
    }
}
