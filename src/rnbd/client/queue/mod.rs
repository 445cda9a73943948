//! One core's block IO of an RNBD client session ([`RnbdQueue`]; the kernel's
//! `rnbd_queue_rq` and `msg_io_conf`): it owns the core's RTRS session handle
//! ([`SessionHandle`]), sends block requests on it and hands their completions back
//! (docs/ARCHITECTURE.md, "One request, one owner").
//!
//! What holds here:
//! - Every request handed to the session has one entry ([`Request`], whose index is its
//!   tag) from submission to completion, and completes exactly once whatever it waited
//!   for: a free permit (in order), or its device while unreachable (no path,
//!   reconnecting, re-open pending; a request back with −ENOTCONN or −ECONNRESET waits
//!   too). It waits here and nowhere else: the session refuses what it has no path for
//!   ([`PathWait::Caller`]). One still waiting `io_wait_timeout` after submission fails
//!   with −ENOTCONN ([`IoError::Unreachable`] says why); a device closed meanwhile fails
//!   its waiters.
//! - An id the server did not know is not tried twice: a −ENOTCONN is retried only once
//!   the device table has changed since the request went out.
//! - The scatter list is the caller's ([`submit_held`](RnbdQueue::submit_held)) or one
//!   copy made at [`submit`](RnbdQueue::submit), never copied again; nothing is allocated
//!   per request in steady state; the device table (the [`RnbdAdmin`](super::RnbdAdmin)'s
//!   published [`Snapshot`]) costs one Acquire load per request.
//! - The admin's own requests and the WRITE pieces of an emulated write-zeroes
//!   ([`zeroes`](super::zeroes)) take entries like any request.

use std::collections::VecDeque;
use std::sync::Arc;

mod wait;

use self::wait::waits_for_device;
use super::config::WriteZeroesMode;
use super::device::{DevState, DeviceError, RnbdDevice};
use super::handle::{RnbdSendError, SessionHandle};
use super::msg::BlockRequest;
pub use super::request::{DevHandle, IoError, ADMIN_TAG};
use super::rtrs::{completion, completion_result};
use super::table::{DeviceTable, InFlight, Snapshot};
use super::zeroes::{PieceSink, ZeroWrites};
use crate::client::{ClientCompletion, ClientIo, PathWait, Sgl, SglRef};
use crate::fabric::{Mr, Sge};
use crate::proto::rnbd::{Io, RnbdOp};
use crate::rnbd::Dir;
use crate::Errno;

/// What a device allows for a request now.
enum Look {
    /// Send it: the IO message and the RTRS direction.
    Send(Io, Dir),
    /// Disconnected: wait for the re-open.
    Wait,
    Fail(DeviceError),
}

/// Whether `req` on `d` goes out as zero-filled WRITEs.
fn emulated(d: &RnbdDevice, req: &BlockRequest) -> bool {
    req.op == RnbdOp::WriteZeroes && d.write_zeroes() == WriteZeroesMode::Emulate
}

/// `wait`: whether a disconnected device keeps the request (a wait is configured).
fn look(d: &RnbdDevice, req: &BlockRequest, wait: bool) -> Look {
    if wait && d.state() == DevState::MappedDisconnected {
        return Look::Wait;
    }
    match d.io_msg(req) {
        Ok((usr, dir)) => Look::Send(usr, dir),
        Err(e) => Look::Fail(e),
    }
}

/// Why a request waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Why {
    /// Its device is disconnected: the re-open after a reconnect.
    Device,
    /// No path of the session could carry it on this core.
    NoPath,
    /// It came back with this errno (−ENOTCONN, −ECONNRESET).
    Back(Errno),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Free,
    /// Handed to the session.
    Sent,
    /// In the waiting queue.
    Waiting,
}

/// One request of the queue (see the module doc).
struct Request {
    stage: Stage,
    /// The caller's tag.
    tag: u64,
    dev: DevHandle,
    req: BlockRequest,
    /// The caller's scatter-gather list, where it lies ([`RnbdQueue::submit_held`]);
    /// `None`: the copy in `own`.
    held: Option<SglRef>,
    own: Vec<Sge>,
    /// Submission time (ns); the wait ends `io_wait_timeout` later.
    since: u64,
    /// The device table's version when last sent.
    version: u64,
    /// The session's `path_epoch` when it last found no path.
    epoch: u64,
    /// Why it waits (or last waited).
    why: Why,
    /// It waits for a free permit of the session (not for its device).
    for_permit: bool,
    /// A piece of an emulated write-zeroes (`tag` is the piece's).
    piece: bool,
}

impl Request {
    /// The request's scatter-gather list as the session reads it, where it lies: the
    /// caller's, or this entry's copy. Either stays unchanged until the entry is freed,
    /// which is after the session's completion of every submit made with it.
    fn sgl(&self) -> SglRef {
        match self.held {
            Some(h) => h,
            // SAFETY: `own` is written only in `take_request`, on a free entry, and its
            // heap buffer does not move when `reqs` grows; the entry is freed only once
            // the session gave the request back (completed or refused).
            None => unsafe { SglRef::new(&self.own) },
        }
    }
}

/// One core's block IO over its RTRS session handle (see the module doc).
pub struct RnbdQueue<S> {
    session: S,
    table: Arc<DeviceTable>,
    /// The devices as this queue last took them from `table`.
    snap: Arc<Snapshot>,
    /// This queue's requests handed to the session.
    in_flight: Arc<InFlight>,
    reqs: Vec<Request>,
    free: Vec<u32>,
    waiting: VecDeque<u32>,
    /// Entries of `waiting` that wait for a permit.
    permit_waits: usize,
    wait_ns: u64,
    /// The table's version when the waiting queue was last looked at.
    seen: u64,
    /// The session's [`path_epoch`](SessionHandle::path_epoch) then.
    epoch_seen: u64,
    /// Look at the waiting queue again at the next poll.
    again: bool,
    /// The earliest end of a wait in the queue (ns).
    next_end: u64,
    last_error: Option<IoError>,
    log_next: u64,
    log_suppressed: u64,
    /// Emulated write-zeroes of this core.
    zero: ZeroWrites,
    /// This core's handle on the session's zero buffer (at the first one).
    zeroes: Option<Arc<Mr>>,
    /// Completions of the admin's requests, kept for it.
    admin_done: VecDeque<ClientCompletion>,
}

impl<S: SessionHandle> RnbdQueue<S> {
    /// Whether the queue holds no request: none in flight, none waiting, no admin
    /// completion kept (a poller with nothing outstanding here may sleep).
    pub fn is_idle(&self) -> bool {
        self.free.len() == self.reqs.len() && self.admin_done.is_empty()
    }

    /// Block IO over `session` for the devices of `table` (the admin's
    /// [`table`](super::RnbdAdmin::table)), waiting up to the session's
    /// [`io_wait_timeout`](SessionHandle::io_wait_timeout) for an unreachable device.
    pub fn new(session: S, table: Arc<DeviceTable>) -> RnbdQueue<S> {
        let in_flight = table.in_flight_counter();
        let wait_ns = u64::try_from(session.io_wait_timeout().as_nanos()).unwrap_or(u64::MAX);
        let snap = table.snapshot();
        let epoch_seen = session.path_epoch();
        RnbdQueue {
            session,
            seen: snap.version(),
            epoch_seen,
            snap,
            table,
            in_flight,
            reqs: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            permit_waits: 0,
            wait_ns,
            again: false,
            next_end: u64::MAX,
            last_error: None,
            log_next: 0,
            log_suppressed: 0,
            zero: ZeroWrites::default(),
            zeroes: None,
            admin_done: VecDeque::with_capacity(16),
        }
    }

    /// This core's session handle.
    pub fn session(&self) -> &S {
        &self.session
    }

    /// This core's session handle itself. A request sent on it directly completes
    /// through it: poll the session for it ([`poll`](Self::poll) hands back only the
    /// queue's own requests and drops, with a log line, block completions it did not
    /// send).
    pub fn session_mut(&mut self) -> &mut S {
        &mut self.session
    }

    /// The devices this queue sends to.
    pub fn table(&self) -> &Arc<DeviceTable> {
        &self.table
    }

    /// Why the last request whose wait for its device ran out failed.
    pub fn last_wait_error(&self) -> Option<&IoError> {
        self.last_error.as_ref()
    }

    /// Takes the published device table if it changed (one Acquire load otherwise).
    #[inline]
    fn refresh(&mut self) {
        if self.table.version() != self.snap.version() {
            self.snap = self.table.snapshot();
        }
    }

    /// Sends a block request on a mapped device. `sgl` holds the data of a write or the
    /// space of a read (exactly [`BlockRequest::data_len`] bytes; empty otherwise), and
    /// stays untouched until the completion. While the device is unreachable (every
    /// path lost, or the re-open after a reconnect pending) the request is accepted and
    /// waits, up to `io_wait_timeout` after `now`, then fails with −ENOTCONN (see
    /// [`last_wait_error`](Self::last_wait_error)); a request that comes back because
    /// the session lost its paths waits the same way and is sent again. Its completion
    /// comes out of [`poll`](Self::poll), exactly once. An emulated write-zeroes goes
    /// out as WRITEs of zeros; its one completion comes when all of them are done.
    ///
    /// A request the session has no free permit for waits here too, in submission order,
    /// and is sent as permits free up (within the same `io_wait_timeout`): with a wait
    /// configured the caller never holds a request back itself.
    ///
    /// The list is copied once, into the request's entry;
    /// [`submit_held`](Self::submit_held) copies nothing.
    ///
    /// # Errors
    /// [`IoError::is_busy`] (only without a wait configured) to retry after polling;
    /// otherwise why it cannot be sent.
    pub fn submit(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError> {
        self.submit_sgl(now, dev, tag, req, Sgl::Copy(sgl))
    }

    /// As [`submit`](Self::submit), with a list that stays where it is until the
    /// completion ([`SglRef`]): the queue and the session read it there, at every send
    /// (a re-send after a reconnect, a failover) and at the completion, and keep no copy.
    ///
    /// # Errors
    /// As [`submit`](Self::submit).
    pub fn submit_held(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: SglRef,
    ) -> Result<(), IoError> {
        self.submit_sgl(now, dev, tag, req, Sgl::Held(sgl))
    }

    fn submit_sgl(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: Sgl<'_>,
    ) -> Result<(), IoError> {
        if tag & ADMIN_TAG != 0 {
            return Err(IoError::BadTag { tag });
        }
        let have: u64 = sgl.as_slice().iter().map(|s| u64::from(s.len)).sum();
        if have != u64::from(req.data_len()) {
            return Err(IoError::SglLength {
                have,
                want: req.data_len(),
            });
        }
        self.refresh();
        let wait = self.wait_ns > 0;
        let d = self.snap.device(dev).ok_or(IoError::NoDevice)?;
        if emulated(d, req) {
            // An emulated write-zeroes is checked as a whole (unless its device is
            // disconnected: its pieces are checked when they go out).
            if !(wait && d.state() == DevState::MappedDisconnected) {
                d.check(req)?;
            }
            return self.start_zeroes(now, dev, tag, req);
        }
        self.submit_request(now, dev, tag, req, sgl, false)
    }

    /// Sends an admin request (its tag has [`ADMIN_TAG`]); its completion is kept for
    /// [`take_admin`](Self::take_admin).
    pub(super) fn submit_admin(&mut self, now: u64, io: ClientIo<'_>) -> Result<(), RnbdSendError> {
        debug_assert!(io.admin && io.tag & ADMIN_TAG != 0);
        self.session.submit(now, io)
    }

    /// The oldest completion of an admin request not yet taken.
    pub(super) fn take_admin(&mut self) -> Option<ClientCompletion> {
        self.admin_done.pop_front()
    }

    /// The largest data size of one request (0 while unknown).
    pub fn max_io_size(&self) -> u32 {
        self.session.max_io_size()
    }

    /// Sends (or keeps) one request in a new entry; `piece`: one of a write-zeroes.
    fn submit_request(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: Sgl<'_>,
        piece: bool,
    ) -> Result<(), IoError> {
        let wait = self.wait_ns > 0;
        let d = self.snap.device(dev).ok_or(IoError::NoDevice)?;
        match look(d, req, wait) {
            // Requests already waiting for a permit go first.
            Look::Send(..) if !piece && wait && self.permit_waits > 0 => {
                let i = self.take_request(tag, dev, req, sgl, now, piece);
                self.wait_permit(i);
                Ok(())
            }
            Look::Send(msg, dir) => {
                let i = self.take_request(tag, dev, req, sgl, now, piece);
                let usr = msg.to_bytes();
                let io = ClientIo {
                    tag: i as u64,
                    dir,
                    usr: &usr,
                    sgl: Sgl::Held(self.reqs[i].sgl()),
                    admin: false,
                    wait: PathWait::Caller,
                };
                match self.session.submit(now, io) {
                    Ok(()) => {
                        self.mark_sent(i);
                        Ok(())
                    }
                    // The caller's request waits here for a permit; a write-zeroes
                    // piece is held back by its write-zeroes instead.
                    Err(RnbdSendError::Busy) if !piece && wait => {
                        self.wait_permit(i);
                        Ok(())
                    }
                    // No path now: it waits here for one (without a wait configured, it
                    // fails at the next poll).
                    Err(RnbdSendError::Unreachable) => {
                        self.reqs[i].epoch = self.session.path_epoch();
                        self.wait(i, Why::NoPath);
                        Ok(())
                    }
                    Err(e) => {
                        self.free_request(i);
                        Err(e.into())
                    }
                }
            }
            Look::Wait => {
                let i = self.take_request(tag, dev, req, sgl, now, piece);
                self.wait(i, Why::Device);
                Ok(())
            }
            Look::Fail(e) => Err(e.into()),
        }
    }

    /// Starts an emulated write-zeroes (see [`zeroes`](super::zeroes)).
    fn start_zeroes(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
    ) -> Result<(), IoError> {
        let zeroes = match &self.zeroes {
            Some(z) => Arc::clone(z),
            None => {
                let z = self.table.zeroes(&self.session)?;
                self.session.use_region(Arc::clone(&z));
                self.zeroes = Some(Arc::clone(&z));
                z
            }
        };
        let mut zero = std::mem::take(&mut self.zero);
        let r = zero.start(self, &zeroes, now, dev, tag, req);
        self.zero = zero;
        r
    }

    /// Sends more pieces of this core's write-zeroes.
    fn pump_zeroes(&mut self, now: u64) {
        let Some(zeroes) = self.zeroes.clone() else {
            return;
        };
        let mut zero = std::mem::take(&mut self.zero);
        zero.pump(self, &zeroes, now);
        self.zero = zero;
    }

    /// The end of entry `i` (freed here): into `out` at `*n` (caller's requests), or to
    /// its write-zeroes (pieces).
    fn finish_request(
        &mut self,
        i: usize,
        result: Result<(), Errno>,
        out: &mut [ClientCompletion],
        n: &mut usize,
    ) {
        let (tag, piece) = (self.reqs[i].tag, self.reqs[i].piece);
        self.free_request(i);
        if piece {
            self.zero.piece_done(tag, result);
        } else {
            out[*n] = completion(tag, result);
            *n += 1;
        }
    }

    /// Makes progress and moves finished block requests, with the caller's tags, into
    /// `out`; returns how many. Requests that found the device unreachable are kept;
    /// waiting requests the device allows again are sent, those whose wait ran out
    /// fail. Completions of the admin's requests are kept for the admin. When all of
    /// `out` is filled, poll again: there may be more.
    pub fn poll(&mut self, now: u64, out: &mut [ClientCompletion]) -> usize {
        self.poll_more(now, out).0
    }

    /// Transmits the requests submitted since the last push now (see
    /// [`SessionHandle::push`]): after a poll and the submissions its completions led to.
    pub fn push(&mut self) {
        self.session.push();
    }

    /// As [`poll`](Self::poll); also whether the session filled all of `out` or
    /// write-zeroes are ready (poll again: there may be more).
    pub(super) fn poll_more(&mut self, now: u64, out: &mut [ClientCompletion]) -> (usize, bool) {
        let got = self.session.poll(now, out);
        // What happened to the devices since the last submission (a request whose wait
        // ran out says why from the device's state now).
        self.refresh();
        let mut n = 0;
        let mut done = 0;
        for r in 0..got {
            let c = out[r];
            if c.tag & ADMIN_TAG != 0 {
                self.admin_done.push_back(c);
                continue;
            }
            done += 1;
            let i = c.tag as usize;
            if self.reqs.get(i).map(|s| s.stage) != Some(Stage::Sent) {
                self.log(now, &format!("completion for unknown request {i} dropped"));
                continue;
            }
            let mut result = completion_result(&c);
            if result == Err(Errno::ENOTCONN) {
                self.maybe_server_closed(i);
            }
            if let Err(e) = result.map_err(Why::Back) {
                if waits_for_device(result) {
                    if now < self.end(i) {
                        self.wait(i, e);
                        // The device may be open (−ECONNRESET, or a table changed already).
                        self.again = true;
                        continue;
                    }
                    self.reqs[i].why = e;
                    result = Err(self.ran_out(i, now));
                }
            }
            self.finish_request(i, result, out, &mut n);
        }
        if done > 0 {
            self.in_flight.sub(done);
        }
        if !self.waiting.is_empty() {
            n += self.drive(now, &mut out[n..]);
        }
        if self.zero.has_queued() {
            self.pump_zeroes(now);
        }
        while n < out.len() {
            let Some((tag, result)) = self.zero.take_ready() else {
                break;
            };
            out[n] = completion(tag, result);
            n += 1;
        }
        (n, got == out.len() || self.zero.has_ready())
    }

    /// Entry `i` came back −ENOTCONN: if it was built from the table as it still is and
    /// its device is mapped, the server closed the mapping; the admin is told (it
    /// decides, see [`table`](super::table)).
    fn maybe_server_closed(&self, i: usize) {
        let s = &self.reqs[i];
        let mapped = self
            .snap
            .device(s.dev)
            .is_some_and(|d| d.state() == DevState::Mapped);
        if mapped && s.version == self.snap.version() {
            self.table.report_closed(s.dev, s.version);
        }
    }

    fn take_request(
        &mut self,
        tag: u64,
        dev: DevHandle,
        req: &BlockRequest,
        sgl: Sgl<'_>,
        now: u64,
        piece: bool,
    ) -> usize {
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.reqs.push(Request {
                    stage: Stage::Free,
                    tag: 0,
                    dev,
                    req: *req,
                    held: None,
                    own: Vec::new(),
                    since: 0,
                    version: 0,
                    epoch: 0,
                    why: Why::Device,
                    for_permit: false,
                    piece: false,
                });
                self.reqs.len() - 1
            }
        };
        let s = &mut self.reqs[i];
        debug_assert_eq!(s.stage, Stage::Free);
        s.tag = tag;
        s.dev = dev;
        s.req = *req;
        match sgl {
            Sgl::Held(h) => s.held = Some(h),
            Sgl::Copy(c) => {
                s.held = None;
                s.own.clear();
                s.own.extend_from_slice(c);
            }
        }
        s.since = now;
        s.why = Why::Device;
        s.for_permit = false;
        s.piece = piece;
        i
    }

    /// Entry `i` was handed to the session, built from the current snapshot.
    fn mark_sent(&mut self, i: usize) {
        let version = self.snap.version();
        let s = &mut self.reqs[i];
        s.stage = Stage::Sent;
        s.version = version;
        self.in_flight.add(1);
    }

    fn free_request(&mut self, i: usize) {
        self.reqs[i].stage = Stage::Free;
        // The caller's list is theirs again.
        self.reqs[i].held = None;
        self.free.push(i as u32);
    }
}

/// The queue as the sender of write-zeroes pieces.
impl<S: SessionHandle> PieceSink for RnbdQueue<S> {
    fn limits(&self, dev: DevHandle) -> Result<(u32, u32), IoError> {
        self.snap
            .device(dev)
            .and_then(RnbdDevice::info)
            .map(|i| (i.logical_block_size, i.max_io_size))
            .ok_or(IoError::NoDevice)
    }

    fn send_piece(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError> {
        self.submit_request(now, dev, tag, req, Sgl::Copy(sgl), true)
    }
}

impl<S> std::fmt::Debug for RnbdQueue<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdQueue")
            .field("version", &self.snap.version())
            .field("in_flight", &self.in_flight.get())
            .field("waiting", &self.waiting.len())
            .finish_non_exhaustive()
    }
}
