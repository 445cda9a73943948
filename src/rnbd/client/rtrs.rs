//! The RNBD client over the RTRS client: [`SessionHandle`] for one core's
//! [`SessionCore`]; the one place that reads and builds a [`ClientCompletion`]
//! ([`completion_result`], [`completion`]); and [`LinkListener`], the [`ClientEvents`]
//! that hands the session's link events (kernel: `rnbd_clt_link_ev`) to the
//! [`RnbdAdmin`](super::RnbdAdmin).

use std::sync::Arc;
use std::time::Duration;

use crate::common::Inbox;

use super::handle::{RnbdSendError, SessionHandle};
use crate::client::{ClientCompletion, ClientEvents, ClientIo, SessionCore, SubmitError};
use crate::common::LinkEvent;
use crate::engine::Ctx;
use crate::fabric::{Access, MemBuf, Mr};
use crate::Errno;

/// How a finished request ended.
#[inline]
pub fn completion_result(c: &ClientCompletion) -> Result<(), Errno> {
    c.result
}

/// A finished request `tag` that ended with `result`.
#[inline]
pub fn completion(tag: u64, result: Result<(), Errno>) -> ClientCompletion {
    ClientCompletion { tag, result }
}

impl SessionHandle for SessionCore {
    fn submit(&mut self, now: u64, io: ClientIo<'_>) -> Result<(), RnbdSendError> {
        match SessionCore::submit(self, now, io) {
            Ok(()) => Ok(()),
            Err(SubmitError::Busy { .. }) => Err(RnbdSendError::Busy),
            Err(SubmitError::Unreachable) => Err(RnbdSendError::Unreachable),
            // Not connected yet (limits unknown), a request that waits in the session (the
            // admin's; a block request is refused `Unreachable`): retry after the first
            // Connected.
            Err(SubmitError::NoPath) if SessionCore::max_io_size(self) == 0 => {
                Err(RnbdSendError::Busy)
            }
            // Never connected and refused for good: say why, at once.
            Err(e @ SubmitError::Refused { errno }) => Err(RnbdSendError::Refused {
                errno,
                reason: self
                    .refusal()
                    .map_or_else(|| e.to_string(), |r| r.to_string()),
            }),
            Err(e) => Err(RnbdSendError::Refused {
                errno: match e {
                    SubmitError::NoPath => Errno::ENOTCONN,
                    _ => Errno::EINVAL,
                },
                reason: e.to_string(),
            }),
        }
    }

    fn poll(&mut self, now: u64, out: &mut [ClientCompletion]) -> usize {
        SessionCore::poll(self, now, out)
    }

    fn path_epoch(&self) -> u64 {
        SessionCore::path_epoch(self)
    }

    fn push(&mut self) {
        SessionCore::push(self);
    }

    fn max_io_size(&self) -> u32 {
        SessionCore::max_io_size(self)
    }

    fn io_wait_timeout(&self) -> Duration {
        SessionCore::io_wait_timeout(self)
    }

    fn use_region(&mut self, mr: Arc<Mr>) {
        SessionCore::add_region(self, mr);
    }

    fn zero_region(&self, len: usize) -> Result<Mr, RnbdSendError> {
        MemBuf::try_zeroed(len)
            .map_err(crate::fabric::FabricError::from)
            .and_then(|b| self.fabric().register(b, Access::NONE))
            .map_err(|e| RnbdSendError::Refused {
                errno: Errno::ENOMEM,
                reason: format!("registering {len} bytes of zeros for write-zeroes: {e}"),
            })
    }
}

/// Link events of an RTRS client session, queued by the session's control poller for the
/// [`RnbdAdmin`](super::RnbdAdmin) (give a clone to `ClientSession::open` and one to
/// [`RnbdAdmin::listen`](super::RnbdAdmin::listen), as
/// [`open_rnbd_session`](super::open_rnbd_session) does). Lock-free, so the admin may run on
/// another thread than the control poller (an SPDK disk's).
#[derive(Clone, Default)]
pub struct LinkListener {
    queue: Arc<Inbox<LinkEvent>>,
}

impl LinkListener {
    pub fn new() -> LinkListener {
        LinkListener::default()
    }

    /// The oldest event not yet taken.
    pub fn take(&self) -> Option<LinkEvent> {
        self.queue.pop()
    }
}

impl ClientEvents for LinkListener {
    fn link_event(&mut self, _cx: &mut dyn Ctx, ev: LinkEvent) {
        self.queue.push(ev);
    }
}

impl std::fmt::Debug for LinkListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LinkListener({} queued)", self.queue.len())
    }
}
