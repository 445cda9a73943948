//! [`RnbdClient`]: an RNBD client session on one core, the [`RnbdAdmin`] together with
//! that core's [`RnbdQueue`], for users that drive a session from one core (the
//! tests). Other cores add their own queues over [`RnbdClient::table`]; the home core's
//! block IO goes through its queue exactly as theirs does.
//!
//! The devices it opens send write-zeroes as its [`RnbdClient::set_write_zeroes`]
//! says: by default as zero-filled WRITEs ([`zeroes`](super::zeroes)), safe with
//! servers of every kernel version.

use std::sync::Arc;

use super::admin::{ClientEvent, RnbdAdmin};
use super::config::WriteZeroesMode;
use super::device::{DeviceError, RnbdDevice};
use super::handle::SessionHandle;
use super::msg::BlockRequest;
use super::queue::{DevHandle, IoError, RnbdQueue};
use super::rtrs::{completion_result, LinkListener};
use super::table::DeviceTable;
use crate::client::ClientCompletion;
use crate::fabric::{Mr, Sge};
use crate::proto::rnbd::AccessMode;

const BATCH: usize = 64;

/// RNBD devices over one core's RTRS session handle: admin and block IO.
pub struct RnbdClient<S> {
    admin: RnbdAdmin,
    queue: RnbdQueue<S>,
    scratch: Vec<ClientCompletion>,
    /// The mode [`open`](Self::open) gives each device it opens.
    write_zeroes: WriteZeroesMode,
}

impl<S: SessionHandle> RnbdClient<S> {
    /// A client over `session`, whose admin replies land in `replies` (registered with
    /// the session's fabric, local write access; one admin request in flight per 64
    /// bytes). Block requests wait up to the session's
    /// [`io_wait_timeout`](SessionHandle::io_wait_timeout) for an unreachable device.
    ///
    /// # Errors
    /// [`DeviceError::ReplyBuffer`] when `replies` is smaller than 64 bytes.
    pub fn new(session: S, replies: Mr) -> Result<RnbdClient<S>, DeviceError> {
        let admin = RnbdAdmin::new(replies)?;
        let queue = RnbdQueue::new(session, Arc::clone(admin.table()));
        Ok(RnbdClient::from_parts(admin, queue))
    }

    /// A client of `admin` sending through `queue`, a queue over the admin's
    /// [`table`](RnbdAdmin::table) (as [`open_rnbd_session`](super::open_rnbd_session)
    /// makes them: its `queues[0]`).
    pub fn from_parts(admin: RnbdAdmin, queue: RnbdQueue<S>) -> RnbdClient<S> {
        debug_assert!(
            Arc::ptr_eq(admin.table(), queue.table()),
            "the queue is not over the admin's device table"
        );
        RnbdClient {
            admin,
            queue,
            scratch: vec![ClientCompletion::default(); BATCH],
            write_zeroes: WriteZeroesMode::default(),
        }
    }

    /// The devices [`open`](Self::open) opens from now on send write-zeroes as `mode`
    /// says (default [`WriteZeroesMode::Emulate`]); those already open keep theirs.
    pub fn set_write_zeroes(&mut self, mode: WriteZeroesMode) {
        self.write_zeroes = mode;
    }

    pub fn admin(&self) -> &RnbdAdmin {
        &self.admin
    }

    pub fn queue(&self) -> &RnbdQueue<S> {
        &self.queue
    }

    pub fn session(&self) -> &S {
        self.queue.session()
    }

    /// The session handle itself (see [`RnbdQueue::session_mut`]).
    pub fn session_mut(&mut self) -> &mut S {
        self.queue.session_mut()
    }

    /// Why the last block request whose wait for its device ran out failed
    /// ([`IoError::Unreachable`]).
    pub fn last_wait_error(&self) -> Option<&IoError> {
        self.queue.last_wait_error()
    }

    /// The published devices, for other cores' [`RnbdQueue::new`].
    pub fn table(&self) -> Arc<DeviceTable> {
        Arc::clone(self.admin.table())
    }

    /// The negotiated RNBD version, once SESS_INFO was answered (reset on link down).
    pub fn ver(&self) -> Option<u8> {
        self.admin.ver()
    }

    /// The device behind `dev`, until it is closed.
    pub fn device(&self, dev: DevHandle) -> Option<&RnbdDevice> {
        self.admin.device(dev)
    }

    /// [`RnbdAdmin::sess_info`].
    pub fn sess_info(&mut self, now: u64) {
        self.admin.sess_info(&mut self.queue, now);
    }

    /// [`RnbdAdmin::open`], with the client's write-zeroes mode
    /// ([`set_write_zeroes`](Self::set_write_zeroes)).
    ///
    /// # Errors
    /// As [`RnbdAdmin::open`].
    pub fn open(
        &mut self,
        now: u64,
        name: &str,
        mode: AccessMode,
    ) -> Result<DevHandle, DeviceError> {
        self.admin
            .open(&mut self.queue, now, name, mode, self.write_zeroes)
    }

    /// [`RnbdAdmin::close`].
    ///
    /// # Errors
    /// As [`RnbdAdmin::close`].
    pub fn close(&mut self, now: u64, dev: DevHandle) -> Result<(), IoError> {
        self.admin.close(&mut self.queue, now, dev)
    }

    /// [`RnbdQueue::submit`]; the completion is a [`ClientEvent::Io`].
    ///
    /// # Errors
    /// As [`RnbdQueue::submit`].
    pub fn submit(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError> {
        self.queue.submit(now, dev, tag, req, sgl)
    }

    /// [`RnbdAdmin::remap`].
    ///
    /// # Errors
    /// As [`RnbdAdmin::remap`].
    pub fn remap(&mut self, now: u64, dev: DevHandle) -> Result<(), DeviceError> {
        self.admin.remap(&mut self.queue, now, dev)
    }

    /// [`RnbdAdmin::set_loss_timeout`].
    pub fn set_loss_timeout(&mut self, timeout: Option<std::time::Duration>) {
        self.admin.set_loss_timeout(timeout);
    }

    /// [`RnbdAdmin::link_down`].
    pub fn link_down(&mut self) {
        self.admin.link_down();
    }

    /// [`RnbdAdmin::link_up`].
    pub fn link_up(&mut self, now: u64) {
        self.admin.link_up(&mut self.queue, now);
    }

    /// [`RnbdAdmin::listen`].
    pub fn listen(&mut self, links: LinkListener) {
        self.admin.listen(links);
    }

    /// Makes progress (the queue, then the admin) and moves up to `out.len()` events
    /// into `out`; returns how many. Block completions come first, then admin events.
    pub fn poll(&mut self, now: u64, out: &mut [ClientEvent]) -> usize {
        let mut n = 0;
        loop {
            let room = (out.len() - n).min(self.scratch.len());
            if room == 0 {
                break;
            }
            let (got, more) = self.queue.poll_more(now, &mut self.scratch[..room]);
            for c in &self.scratch[..got] {
                out[n] = ClientEvent::Io {
                    tag: c.tag,
                    result: completion_result(c),
                };
                n += 1;
            }
            if !more {
                break;
            }
        }
        n + self.admin.poll(&mut self.queue, now, &mut out[n..])
    }
}

impl<S> std::fmt::Debug for RnbdClient<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdClient")
            .field("admin", &self.admin)
            .field("queue", &self.queue)
            .finish()
    }
}
