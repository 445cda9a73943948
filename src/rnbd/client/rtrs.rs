//! [`RnbdClient`](super::RnbdClient) over the RTRS client: [`RtrsPort`] for one core's
//! [`SessionCore`], and [`LinkListener`], the [`ClientEvents`] that hands the session's
//! link events (kernel: `rnbd_clt_link_ev`) to the client on the home core.

use std::sync::Arc;
use std::time::Duration;

use crossbeam_queue::SegQueue;

use super::port::{PortCompletion, PortError, PortIo, RtrsPort};
use crate::client::{ClientCompletion, ClientEvents, ClientIo, SessionCore, SubmitError};
use crate::common::LinkEvent;
use crate::engine::Ctx;
use crate::fabric::{Access, MemBuf, Mr};

const BATCH: usize = 64;

impl RtrsPort for SessionCore {
    fn submit(&mut self, cx: &mut dyn Ctx, io: PortIo<'_>) -> Result<(), PortError> {
        let cio = ClientIo {
            tag: io.tag,
            dir: io.dir,
            usr: io.usr,
            sgl: io.sgl,
            admin: io.admin,
        };
        match SessionCore::submit(self, cx.now(), cio) {
            Ok(()) => Ok(()),
            Err(SubmitError::Busy { .. }) => Err(PortError::Busy),
            // Not connected yet (limits unknown): wait for the first Connected.
            Err(SubmitError::NoPath) if SessionCore::max_io_size(self) == 0 => Err(PortError::Busy),
            // Never connected and refused for good: say why, at once.
            Err(e @ SubmitError::Refused { errno }) => Err(PortError::Refused {
                errno: errno.neg(),
                reason: self
                    .refusal()
                    .map_or_else(|| e.to_string(), |r| r.to_string()),
            }),
            Err(e) => Err(PortError::Refused {
                errno: match e {
                    SubmitError::NoPath => -libc::ENOTCONN,
                    _ => -libc::EINVAL,
                },
                reason: e.to_string(),
            }),
        }
    }

    fn poll(&mut self, cx: &mut dyn Ctx, out: &mut [PortCompletion]) -> usize {
        let mut buf = [ClientCompletion::default(); BATCH];
        let want = out.len().min(BATCH);
        let n = SessionCore::poll(self, cx.now(), &mut buf[..want]);
        for (o, c) in out.iter_mut().zip(&buf[..n]) {
            *o = PortCompletion {
                tag: c.tag,
                errno: crate::Errno::neg_of(c.result),
            };
        }
        n
    }

    fn max_io_size(&self) -> u32 {
        SessionCore::max_io_size(self)
    }

    fn io_wait_timeout(&self) -> Duration {
        SessionCore::io_wait_timeout(self)
    }

    fn zero_region(&self, len: usize) -> Result<Mr, PortError> {
        self.fabric()
            .register(MemBuf::zeroed(len), Access::NONE)
            .map_err(|e| PortError::Refused {
                errno: -libc::ENOMEM,
                reason: format!("registering {len} bytes of zeros for write-zeroes: {e}"),
            })
    }
}

/// Link events of an RTRS client session, queued by the session's control poller for the
/// [`RnbdClient`](super::RnbdClient) (give a clone to `Session::open` and one to
/// [`RnbdClient::listen`](super::RnbdClient::listen)). Lock-free, so the client may be
/// polled from another thread than the control poller (an SPDK IO channel's).
#[derive(Clone, Default)]
pub struct LinkListener {
    queue: Arc<SegQueue<LinkEvent>>,
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
