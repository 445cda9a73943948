//! One core's block IO of an RNBD client session ([`CoreIo`]): the per-hardware-queue
//! part of the kernel's `rnbd_queue_rq` and `msg_io_conf`, shared by
//! [`RnbdClient`](super::RnbdClient) on the session's home core and
//! [`RnbdCore`](super::RnbdCore) on the others. It sends block requests on the core's
//! [`RtrsPort`], hands their completions back, and keeps the requests that find the
//! device unreachable until it is reachable again.
//!
//! # Waiting for the device
//! A device is unreachable while its session has lost every path, is reconnecting, or
//! has reconnected but not re-opened the device yet (MAPPED_DISCONNECTED). A request
//! submitted then is accepted and waits here. A request in flight when the session lost
//! its paths comes back from the new server session with −ENOTCONN (it carries the id of
//! the old one) or from RTRS with −ECONNRESET (dropped at a queue-depth change); it waits
//! here too. A waiting request is sent again, built with the device's new id, once the
//! device is open again (one the server answered with −ENOTCONN only once the device
//! table has changed since it was sent: an id the server did not know is not tried
//! twice). A request still waiting `io_wait_timeout` after its submission fails with
//! −ENOTCONN; [`IoError::Unreachable`] says why (kept for `last_wait_error`, logged at
//! most once a second). A device closed meanwhile fails its waiting requests at once.
//! Every request completes exactly once.
//!
//! Every request handed to the port has a slot here, whose index is its tag on the port
//! and which keeps what sending it again needs: the block request and the scatter-gather
//! list. Slots, their lists and the waiting queue keep their memory once grown, so
//! nothing is allocated per request in steady state, and no lock is added to the data
//! path: the device table is read once per submission, as before, and per waiting
//! request only when the table changed (an epoch says so), a wait ends, or a re-send
//! found no free permit.
//!
//! An emulated write-zeroes ([`zeroes`](super::zeroes)) is split into WRITE pieces that
//! take slots here like any request, marked as pieces: their ends go to the
//! write-zeroes, whose own end is handed back with the caller's tag.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::config::WriteZeroesMode;
use super::device::{DevState, DeviceError, RnbdDevice};
use super::msg::BlockRequest;
use super::port::{PortCompletion, PortError, PortIo, RtrsPort};
use super::session::{DevHandle, IoError, ADMIN_TAG};
use super::shared::SharedDevices;
use super::zeroes::{PieceSink, ZeroWrites};
use crate::engine::Ctx;
use crate::fabric::{Mr, Sge};
use crate::proto::rnbd::{Io, RnbdOp};
use crate::rnbd::Dir;

/// At most one log line a second about requests whose wait ran out.
const LOG_EVERY_NS: u64 = 1_000_000_000;

/// The devices as one core sees them: the home core's own table or the published one.
pub(super) trait DevLookup {
    /// Runs `f` on device `dev`, unless it is closed or unknown.
    fn with_dev<R>(&self, dev: DevHandle, f: impl FnOnce(&RnbdDevice) -> R) -> Option<R>;
}

impl DevLookup for SharedDevices {
    fn with_dev<R>(&self, dev: DevHandle, f: impl FnOnce(&RnbdDevice) -> R) -> Option<R> {
        self.with(dev, f)
    }
}

/// Whether a request that ended with `errno` may succeed once the device is open again.
fn waits_for_device(errno: i32) -> bool {
    errno == -libc::ENOTCONN || errno == -libc::ECONNRESET
}

/// What a device allows for a request now.
enum Look {
    /// Send it: the IO message and the RTRS direction.
    Send([u8; Io::LEN], Dir),
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Free,
    /// Handed to the port.
    Sent,
    /// In the waiting queue.
    Waiting,
}

/// One request of the core (see the module doc).
struct Slot {
    stage: Stage,
    /// The caller's tag.
    tag: u64,
    dev: DevHandle,
    req: BlockRequest,
    sgl: Vec<Sge>,
    /// Submission time (ns); the wait ends `io_wait_timeout` later.
    since: u64,
    /// The device table's epoch when last sent.
    epoch: u64,
    /// Why it waits: 0 (the device was disconnected) or the errno it came back with.
    cause: i32,
    /// A piece of an emulated write-zeroes (`tag` is the piece's).
    piece: bool,
}

/// One core's block IO over its RTRS port (see the module doc).
pub(super) struct CoreIo<P> {
    pub(super) port: P,
    shared: Arc<SharedDevices>,
    /// This core's requests handed to the port (one of `shared`'s counters).
    inflight: Arc<AtomicUsize>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    waiting: VecDeque<u32>,
    wait_ns: u64,
    /// The device table's epoch when the waiting queue was last looked at.
    seen: u64,
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
}

impl<P: RtrsPort> CoreIo<P> {
    /// Block IO over `port` for the devices of `shared`, waiting up to the port's
    /// [`io_wait_timeout`](RtrsPort::io_wait_timeout) for an unreachable device.
    pub(super) fn new(port: P, shared: Arc<SharedDevices>) -> CoreIo<P> {
        let inflight = shared.counter();
        let wait_ns = u64::try_from(port.io_wait_timeout().as_nanos()).unwrap_or(u64::MAX);
        CoreIo {
            port,
            seen: shared.epoch(),
            shared,
            inflight,
            slots: Vec::new(),
            free: Vec::new(),
            waiting: VecDeque::new(),
            wait_ns,
            again: false,
            next_end: u64::MAX,
            last_error: None,
            log_next: 0,
            log_suppressed: 0,
            zero: ZeroWrites::default(),
            zeroes: None,
        }
    }

    /// Why the last request whose wait ran out failed.
    pub(super) fn last_wait_error(&self) -> Option<&IoError> {
        self.last_error.as_ref()
    }

    /// Checks and sends (or, while the device is disconnected, keeps) one block request;
    /// an emulated write-zeroes starts its pieces.
    pub(super) fn submit(
        &mut self,
        cx: &mut dyn Ctx,
        devs: &impl DevLookup,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError> {
        if tag & ADMIN_TAG != 0 {
            return Err(IoError::BadTag { tag });
        }
        let have: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
        if have != u64::from(req.data_len()) {
            return Err(IoError::SglLength {
                have,
                want: req.data_len(),
            });
        }
        let wait = self.wait_ns > 0;
        // An emulated write-zeroes is checked as a whole (unless its device is
        // disconnected: its pieces are checked when they go out).
        let emulate = devs.with_dev(dev, |d| {
            if !emulated(d, req) {
                return Ok(false);
            }
            if !(wait && d.state() == DevState::MappedDisconnected) {
                d.check(req)?;
            }
            Ok::<bool, DeviceError>(true)
        });
        match emulate {
            None => return Err(IoError::NoDevice),
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(true)) => return self.start_zeroes(cx, devs, dev, tag, req),
            Some(Ok(false)) => {}
        }
        self.submit_slot(cx, devs, dev, tag, req, sgl, false)
    }

    /// Sends (or keeps) one request in a new slot; `piece`: one of a write-zeroes.
    #[allow(clippy::too_many_arguments)]
    fn submit_slot(
        &mut self,
        cx: &mut dyn Ctx,
        devs: &impl DevLookup,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
        piece: bool,
    ) -> Result<(), IoError> {
        // Read before the device: a table published in between makes the request look
        // older than it is, which at worst sends it once more after an −ENOTCONN.
        let epoch = self.shared.epoch();
        let wait = self.wait_ns > 0;
        match devs.with_dev(dev, |d| look(d, req, wait)) {
            None => Err(IoError::NoDevice),
            Some(Look::Send(usr, dir)) => {
                let i = self.take_slot(tag, dev, req, sgl, cx.now(), piece);
                let io = PortIo {
                    tag: i as u64,
                    dir,
                    usr: &usr,
                    sgl,
                    admin: false,
                };
                match self.port.submit(cx, io) {
                    Ok(()) => {
                        self.sent(i, epoch);
                        Ok(())
                    }
                    Err(e) => {
                        self.free_slot(i);
                        Err(e.into())
                    }
                }
            }
            Some(Look::Wait) => {
                let i = self.take_slot(tag, dev, req, sgl, cx.now(), piece);
                self.wait(i, 0);
                Ok(())
            }
            Some(Look::Fail(e)) => Err(e.into()),
        }
    }

    /// Starts an emulated write-zeroes (see [`zeroes`](super::zeroes)).
    fn start_zeroes(
        &mut self,
        cx: &mut dyn Ctx,
        devs: &impl DevLookup,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
    ) -> Result<(), IoError> {
        let zeroes = match &self.zeroes {
            Some(z) => Arc::clone(z),
            None => {
                let z = self.shared.zeroes(&self.port)?;
                self.zeroes = Some(Arc::clone(&z));
                z
            }
        };
        let mut zero = std::mem::take(&mut self.zero);
        let r = zero.start(&mut Pieces { io: self, devs }, &zeroes, cx, dev, tag, req);
        self.zero = zero;
        r
    }

    /// Sends more pieces of this core's write-zeroes.
    fn pump_zeroes(&mut self, cx: &mut dyn Ctx, devs: &impl DevLookup) {
        let Some(zeroes) = self.zeroes.clone() else {
            return;
        };
        let mut zero = std::mem::take(&mut self.zero);
        zero.pump(&mut Pieces { io: self, devs }, &zeroes, cx);
        self.zero = zero;
    }

    /// The end of slot `i` (freed here): into `out` at `*n` (caller's requests), or to
    /// its write-zeroes (pieces).
    fn finish_slot(&mut self, i: usize, errno: i32, out: &mut [PortCompletion], n: &mut usize) {
        let (tag, piece) = (self.slots[i].tag, self.slots[i].piece);
        self.free_slot(i);
        if piece {
            self.zero.piece_done(tag, errno);
        } else {
            out[*n] = PortCompletion { tag, errno };
            *n += 1;
        }
    }

    /// Polls the port into `out` and hands back finished requests with the caller's
    /// tags (admin completions pass through untouched), keeping those that found the
    /// device unreachable; then sends waiting requests the device allows again and
    /// fails those whose wait ran out. Returns how many entries of `out` are filled, and
    /// whether the port filled all of `out` (poll again: it may have more).
    pub(super) fn poll(
        &mut self,
        cx: &mut dyn Ctx,
        devs: &impl DevLookup,
        out: &mut [PortCompletion],
    ) -> (usize, bool) {
        let got = self.port.poll(cx, out);
        let now = cx.now();
        let mut n = 0;
        let mut done = 0;
        for r in 0..got {
            let c = out[r];
            if c.tag & ADMIN_TAG != 0 {
                out[n] = c;
                n += 1;
                continue;
            }
            done += 1;
            let i = c.tag as usize;
            if self.slots.get(i).map(|s| s.stage) != Some(Stage::Sent) {
                self.log(now, &format!("completion for unknown request {i} dropped"));
                continue;
            }
            let mut errno = c.errno;
            if self.wait_ns > 0 && waits_for_device(errno) {
                if now < self.end(i) {
                    self.wait(i, errno);
                    // The device may be open (−ECONNRESET, or a table changed already).
                    self.again = true;
                    continue;
                }
                self.slots[i].cause = errno;
                errno = self.ran_out(devs, i, now);
            }
            self.finish_slot(i, errno, out, &mut n);
        }
        if done > 0 {
            self.inflight.fetch_sub(done, Ordering::SeqCst);
        }
        if !self.waiting.is_empty() {
            n += self.drive(cx, devs, now, &mut out[n..]);
        }
        if self.zero.has_queued() {
            self.pump_zeroes(cx, devs);
        }
        while n < out.len() {
            let Some(c) = self.zero.take_ready() else {
                break;
            };
            out[n] = c;
            n += 1;
        }
        (n, got == out.len() || self.zero.has_ready())
    }

    /// Goes through the waiting queue when something changed: sends what the device
    /// allows again, fails what it refuses or what waited too long (into `out`).
    fn drive(
        &mut self,
        cx: &mut dyn Ctx,
        devs: &impl DevLookup,
        now: u64,
        out: &mut [PortCompletion],
    ) -> usize {
        let epoch = self.shared.epoch();
        if epoch == self.seen && !self.again && now < self.next_end {
            return 0;
        }
        self.seen = epoch;
        self.again = false;
        self.next_end = u64::MAX;
        let mut k = 0;
        let mut busy = false;
        for _ in 0..self.waiting.len() {
            let Some(i) = self.waiting.pop_front() else {
                break;
            };
            let i = i as usize;
            let s = &self.slots[i];
            // An id the server did not know is tried again only with a newer table.
            let may_send = !busy && (s.cause != -libc::ENOTCONN || s.epoch != epoch);
            let errno = match devs.with_dev(s.dev, |d| look(d, &s.req, true)) {
                None => -libc::ENODEV,
                Some(Look::Send(usr, dir)) if may_send => {
                    let io = PortIo {
                        tag: i as u64,
                        dir,
                        usr: &usr,
                        sgl: &self.slots[i].sgl,
                        admin: false,
                    };
                    match self.port.submit(cx, io) {
                        Ok(()) => {
                            self.sent(i, epoch);
                            continue;
                        }
                        Err(PortError::Busy) => {
                            busy = true;
                            0
                        }
                        Err(PortError::Refused { errno, .. }) => errno,
                    }
                }
                Some(Look::Send(..) | Look::Wait) => 0,
                Some(Look::Fail(e)) => e.errno(),
            };
            let errno = match errno {
                0 if now < self.end(i) => {
                    self.next_end = self.next_end.min(self.end(i));
                    self.waiting.push_back(i as u32);
                    continue;
                }
                0 => self.ran_out(devs, i, now),
                e => e,
            };
            if self.slots[i].piece {
                let tag = self.slots[i].tag;
                self.free_slot(i);
                self.zero.piece_done(tag, errno);
                continue;
            }
            if k == out.len() {
                // No room to hand it back now: next poll.
                self.waiting.push_back(i as u32);
                self.again = true;
                continue;
            }
            out[k] = PortCompletion {
                tag: self.slots[i].tag,
                errno,
            };
            k += 1;
            self.free_slot(i);
        }
        self.again |= busy;
        k
    }

    /// The end of slot `i`'s wait (ns).
    fn end(&self, i: usize) -> u64 {
        self.slots[i].since.saturating_add(self.wait_ns)
    }

    /// Slot `i` waited `io_wait_timeout` for its device: records and logs why it fails;
    /// returns its errno.
    fn ran_out(&mut self, devs: &impl DevLookup, i: usize, now: u64) -> i32 {
        let s = &self.slots[i];
        let cause = s.cause;
        let Some((name, state)) = devs.with_dev(s.dev, |d| (d.name().to_string(), d.state()))
        else {
            return -libc::ENODEV;
        };
        let last = || std::io::Error::from_raw_os_error(-cause).to_string();
        let reason = match state {
            DevState::MappedDisconnected if cause == 0 => {
                "no connection to the server (waiting for a reconnect and the device's re-open)"
                    .to_string()
            }
            DevState::MappedDisconnected => format!(
                "no connection to the server (waiting for a reconnect and the device's \
                 re-open; last attempt: {})",
                last()
            ),
            _ => format!("every attempt failed: {}", last()),
        };
        let e = IoError::Unreachable {
            name,
            waited: Duration::from_nanos(self.wait_ns),
            reason,
        };
        self.log(now, &e);
        self.last_error = Some(e);
        -libc::ENOTCONN
    }

    fn log(&mut self, now: u64, what: &dyn std::fmt::Display) {
        if now < self.log_next {
            self.log_suppressed += 1;
            return;
        }
        if self.log_suppressed > 0 {
            tracing::error!(
                "rnbd: {what} (and {} more failures in the last second)",
                self.log_suppressed
            );
        } else {
            tracing::error!("rnbd: {what}");
        }
        self.log_next = now.saturating_add(LOG_EVERY_NS);
        self.log_suppressed = 0;
    }

    fn take_slot(
        &mut self,
        tag: u64,
        dev: DevHandle,
        req: &BlockRequest,
        sgl: &[Sge],
        now: u64,
        piece: bool,
    ) -> usize {
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                self.slots.push(Slot {
                    stage: Stage::Free,
                    tag: 0,
                    dev,
                    req: *req,
                    sgl: Vec::with_capacity(sgl.len().max(4)),
                    since: 0,
                    epoch: 0,
                    cause: 0,
                    piece: false,
                });
                self.slots.len() - 1
            }
        };
        let s = &mut self.slots[i];
        debug_assert_eq!(s.stage, Stage::Free);
        s.tag = tag;
        s.dev = dev;
        s.req = *req;
        s.sgl.clear();
        s.sgl.extend_from_slice(sgl);
        s.since = now;
        s.cause = 0;
        s.piece = piece;
        i
    }

    fn sent(&mut self, i: usize, epoch: u64) {
        let s = &mut self.slots[i];
        s.stage = Stage::Sent;
        s.epoch = epoch;
        self.inflight.fetch_add(1, Ordering::SeqCst);
    }

    fn wait(&mut self, i: usize, cause: i32) {
        self.slots[i].stage = Stage::Waiting;
        self.slots[i].cause = cause;
        self.next_end = self.next_end.min(self.end(i));
        self.waiting.push_back(i as u32);
    }

    fn free_slot(&mut self, i: usize) {
        self.slots[i].stage = Stage::Free;
        self.free.push(i as u32);
    }
}

/// [`CoreIo`] as the sender of write-zeroes pieces.
struct Pieces<'a, P, D> {
    io: &'a mut CoreIo<P>,
    devs: &'a D,
}

impl<P: RtrsPort, D: DevLookup> PieceSink for Pieces<'_, P, D> {
    fn limits(&self, dev: DevHandle) -> Result<(u32, u32), IoError> {
        self.devs
            .with_dev(dev, |d| {
                d.info().map(|i| (i.logical_block_size, i.max_io_size))
            })
            .flatten()
            .ok_or(IoError::NoDevice)
    }

    fn send_piece(
        &mut self,
        cx: &mut dyn Ctx,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError> {
        self.io.submit_slot(cx, self.devs, dev, tag, req, sgl, true)
    }
}
