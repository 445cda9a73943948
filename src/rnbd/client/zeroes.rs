//! Write-zeroes sent as zero-filled WRITEs ([`WriteZeroesMode::Emulate`], see
//! [`config`](super::config) for why): what the kernel's block layer does for a device
//! without write-zeroes (`__blkdev_issue_zero_pages`, bios of `ZERO_PAGE`).
//!
//! One write-zeroes becomes *pieces*: WRITEs of at most the device's `max_io_size`
//! whose scatter-gather list points into one registered buffer of zeros, shared by the
//! session's cores and registered at the first emulated write-zeroes (so steady state
//! allocates and copies nothing). Pieces carry the request's flags and go through the
//! core's [`RnbdQueue`](super::RnbdQueue) like any request (so they wait for an unreachable device
//! and are sent again after a re-open), under tags of their own that the caller never
//! sees. The first piece is sent from `submit` (a submission that cannot send it is
//! refused as busy, nothing sent), the rest from each poll, at most
//! [`MAX_OUTSTANDING`] of one request at a time. The request completes, once, when its
//! last piece did, with the first error of any piece; after an error no further piece
//! is sent.
//!
//! [`WriteZeroesMode::Emulate`]: super::WriteZeroesMode::Emulate

use std::collections::VecDeque;

use super::msg::BlockRequest;
use super::request::{DevHandle, IoError};
use crate::fabric::{Mr, Sge};
use crate::proto::rnbd::RnbdOp;
use crate::Errno;

/// Most pieces of one request sent and not completed (bounds what a huge write-zeroes
/// holds of the session's permits, and of the core's request slots while it waits).
pub(super) const MAX_OUTSTANDING: u32 = 16;
/// Most entries of a piece's scatter-gather list (all over the one zero buffer).
const MAX_PIECE_SGES: usize = 16;

/// What [`ZeroWrites`] needs from the core's block IO.
pub(super) trait PieceSink {
    /// `(logical block size, max_io_size)` of `dev`.
    ///
    /// # Errors
    /// The device is closed or was never open.
    fn limits(&self, dev: DevHandle) -> Result<(u32, u32), IoError>;

    /// Sends (or keeps, while the device is unreachable) one piece under `tag`; its end
    /// comes back through [`ZeroWrites::piece_done`].
    ///
    /// # Errors
    /// Busy (nothing sent) or why the piece cannot go.
    fn send_piece(
        &mut self,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError>;
}

/// One emulated write-zeroes in progress.
#[derive(Clone, Copy, Debug)]
struct ZeroOp {
    /// The caller's tag.
    tag: u64,
    dev: DevHandle,
    /// Start of what is still to send, and the end of the range (bytes).
    next: u64,
    end: u64,
    req: BlockRequest,
    /// Pieces sent and not yet completed.
    outstanding: u32,
    /// Pieces sent so far (numbers the next piece's tag).
    pieces: u32,
    /// How the request ends: the first error of a piece, if any.
    result: Result<(), Errno>,
    /// In `queue` (pieces left to send).
    queued: bool,
}

/// One core's emulated write-zeroes.
#[derive(Debug, Default)]
pub(super) struct ZeroWrites {
    ops: Vec<Option<ZeroOp>>,
    free: Vec<usize>,
    /// Requests with pieces left to send, oldest first.
    queue: VecDeque<usize>,
    /// Finished requests, for the caller's poll.
    ready: VecDeque<(u64, Result<(), Errno>)>,
}

/// A piece's tag: its request's slot above bit 32, its number below.
fn piece_tag(i: usize, n: u32) -> u64 {
    (i as u64) << 32 | u64::from(n)
}

impl ZeroWrites {
    /// Starts the write-zeroes `req` (already checked against the device) of `dev` under
    /// the caller's `tag`, its data from `zeroes`: sends its first pieces.
    ///
    /// # Errors
    /// Why the first piece was refused (nothing was sent). Without a free permit for it
    /// the request waits in line for [`pump`](Self::pump); its end comes from
    /// [`take_ready`](Self::take_ready).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        &mut self,
        sink: &mut dyn PieceSink,
        zeroes: &Mr,
        now: u64,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
    ) -> Result<(), IoError> {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.ops.push(None);
                self.ops.len() - 1
            }
        };
        self.ops[i] = Some(ZeroOp {
            tag,
            dev,
            next: req.offset,
            end: req.offset + u64::from(req.len),
            req: *req,
            outstanding: 0,
            pieces: 0,
            result: Ok(()),
            queued: false,
        });
        match self.send_piece(i, sink, zeroes, now) {
            // No permit for the first piece: the request waits in line like the others.
            Err(e) if e.is_busy() => {}
            Err(e) => {
                self.ops[i] = None;
                self.free.push(i);
                return Err(e);
            }
            Ok(()) => {}
        }
        if self.op(i).next < self.op(i).end {
            self.queue.push_back(i);
            self.op_mut(i).queued = true;
            self.pump(sink, zeroes, now);
        }
        Ok(())
    }

    /// Whether requests have pieces left to send.
    pub(super) fn has_queued(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Sends pieces of waiting requests, oldest first, while permits last and each
    /// request has fewer than [`MAX_OUTSTANDING`] out.
    pub(super) fn pump(&mut self, sink: &mut dyn PieceSink, zeroes: &Mr, now: u64) {
        for _ in 0..self.queue.len() {
            let Some(i) = self.queue.pop_front() else {
                return;
            };
            loop {
                let op = self.op(i);
                if op.result.is_err() || op.next >= op.end {
                    self.op_mut(i).queued = false;
                    if op.outstanding == 0 {
                        self.finish(i);
                    }
                    break;
                }
                if op.outstanding >= MAX_OUTSTANDING {
                    self.queue.push_back(i);
                    break;
                }
                match self.send_piece(i, sink, zeroes, now) {
                    Ok(()) => {}
                    Err(e) if e.is_busy() => {
                        self.queue.push_front(i);
                        return;
                    }
                    Err(e) => self.op_mut(i).result = Err(e.errno()),
                }
            }
        }
    }

    /// Sends the next piece of request `i`.
    fn send_piece(
        &mut self,
        i: usize,
        sink: &mut dyn PieceSink,
        zeroes: &Mr,
        now: u64,
    ) -> Result<(), IoError> {
        let op = self.op(i);
        let (lbs, max_io) = sink.limits(op.dev)?;
        let bs = u64::from(lbs.max(1));
        let most = (zeroes.len() as u64 * MAX_PIECE_SGES as u64).min(u64::from(max_io)) / bs * bs;
        let len = (op.end - op.next).min(most.max(bs));
        let mut sgl = [Sge::default(); MAX_PIECE_SGES];
        let mut n = 0;
        let mut left = len as usize;
        while left > 0 && n < MAX_PIECE_SGES {
            let l = left.min(zeroes.len());
            sgl[n] = zeroes.sge(0, l);
            left -= l;
            n += 1;
        }
        let piece = BlockRequest {
            op: RnbdOp::Write,
            offset: op.next,
            len: len as u32,
            ..op.req
        };
        sink.send_piece(now, op.dev, piece_tag(i, op.pieces), &piece, &sgl[..n])?;
        let op = self.op_mut(i);
        op.next += len;
        op.outstanding += 1;
        op.pieces = op.pieces.wrapping_add(1);
        Ok(())
    }

    /// A piece sent under `tag` ended with `result`.
    pub(super) fn piece_done(&mut self, tag: u64, result: Result<(), Errno>) {
        let i = (tag >> 32) as usize;
        let Some(op) = self.ops.get_mut(i).and_then(Option::as_mut) else {
            tracing::error!(tag, "rnbd: completion of an unknown write-zeroes piece");
            return;
        };
        op.outstanding -= 1;
        if op.result.is_ok() {
            op.result = result;
        }
        if op.outstanding == 0 && (op.result.is_err() || op.next >= op.end) {
            self.finish(i);
        }
    }

    fn finish(&mut self, i: usize) {
        let Some(op) = self.ops[i].take() else {
            return;
        };
        if op.queued {
            self.queue.retain(|&q| q != i);
        }
        self.free.push(i);
        self.ready.push_back((op.tag, op.result));
    }

    /// The oldest finished request: its tag and how it ended.
    pub(super) fn take_ready(&mut self) -> Option<(u64, Result<(), Errno>)> {
        self.ready.pop_front()
    }

    /// Whether finished requests wait to be taken.
    pub(super) fn has_ready(&self) -> bool {
        !self.ready.is_empty()
    }

    fn op(&self, i: usize) -> ZeroOp {
        self.ops[i].expect("a live write-zeroes slot")
    }

    fn op_mut(&mut self, i: usize) -> &mut ZeroOp {
        self.ops[i].as_mut().expect("a live write-zeroes slot")
    }
}
