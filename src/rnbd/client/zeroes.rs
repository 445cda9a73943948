//! Write-zeroes sent as zero-filled WRITEs ([`WriteZeroesMode::Emulate`], see
//! [`config`](super::config) for why): what the kernel's block layer does for a device
//! without write-zeroes (`__blkdev_issue_zero_pages`, bios of `ZERO_PAGE`).
//!
//! One write-zeroes becomes *pieces*: WRITEs of at most the device's `max_io_size`
//! whose scatter-gather list points into one registered buffer of zeros, shared by the
//! session's cores and registered at the first emulated write-zeroes (so steady state
//! allocates and copies nothing). Pieces carry the request's flags and are sent as
//! permits allow: the first one from `submit` (a submission that cannot send it is
//! refused as busy, nothing sent), the rest from each poll. The request completes,
//! once, when its last piece did, with the first error of any piece; after an error no
//! further piece is sent. Pieces use internal tags (`ADMIN_TAG | ZERO_TAG`, the
//! request's slot in bits 32.., the piece's number below), unique among requests in
//! flight, so the caller's tags stay untouched.

use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::msg::BlockRequest;
use super::port::{PortCompletion, RtrsPort};
use super::session::{DevHandle, IoError, ADMIN_TAG};
use super::shared::{send_tagged, SharedDevices};
use crate::engine::Ctx;
use crate::fabric::{Mr, Sge};
use crate::proto::rnbd::RnbdOp;

/// With [`ADMIN_TAG`], marks the tag of a piece (see the module doc).
pub(super) const ZERO_TAG: u64 = 1 << 62;
/// Most entries of a piece's scatter-gather list (all over the one zero buffer).
const MAX_PIECE_SGES: usize = 16;

/// Whether `tag` is a piece's.
pub(super) fn is_piece(tag: u64) -> bool {
    tag & (ADMIN_TAG | ZERO_TAG) == ADMIN_TAG | ZERO_TAG
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
    /// First error of a piece (0: none).
    errno: i32,
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
    ready: VecDeque<PortCompletion>,
    /// This core's handle on the session's zero buffer.
    zeroes: Option<Arc<Mr>>,
}

impl ZeroWrites {
    /// Starts the write-zeroes `req` (already checked against the device) of `dev` under
    /// the caller's `tag`: sends its first pieces.
    ///
    /// # Errors
    /// [`IoError::is_busy`] when not even the first piece could be sent (nothing was);
    /// otherwise why the first piece was refused, or the zero buffer could not be
    /// registered. Once a piece is out, the request's end comes from [`take_ready`].
    ///
    /// [`take_ready`]: Self::take_ready
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start<P: RtrsPort + ?Sized>(
        &mut self,
        port: &mut P,
        inflight: &AtomicUsize,
        shared: &SharedDevices,
        cx: &mut dyn Ctx,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
    ) -> Result<(), IoError> {
        let zeroes = match &self.zeroes {
            Some(z) => Arc::clone(z),
            None => {
                let z = shared.zeroes(&*port)?;
                self.zeroes = Some(Arc::clone(&z));
                z
            }
        };
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
            errno: 0,
            queued: false,
        });
        if let Err(e) = self.send_piece(i, &zeroes, port, inflight, shared, cx) {
            self.ops[i] = None;
            self.free.push(i);
            return Err(e);
        }
        if self.op(i).next < self.op(i).end {
            self.queue.push_back(i);
            self.op_mut(i).queued = true;
            self.pump(port, inflight, shared, cx);
        }
        Ok(())
    }

    /// Sends pieces of waiting requests, oldest first, while permits last.
    pub(super) fn pump<P: RtrsPort + ?Sized>(
        &mut self,
        port: &mut P,
        inflight: &AtomicUsize,
        shared: &SharedDevices,
        cx: &mut dyn Ctx,
    ) {
        if self.queue.is_empty() {
            return;
        }
        // Set by the `start` that queued anything.
        let Some(zeroes) = self.zeroes.clone() else {
            return;
        };
        while let Some(&i) = self.queue.front() {
            let op = self.op(i);
            if op.errno != 0 || op.next >= op.end {
                self.unqueue_front();
                continue;
            }
            match self.send_piece(i, &zeroes, port, inflight, shared, cx) {
                Ok(()) => {}
                Err(e) if e.is_busy() => return,
                Err(e) => {
                    self.op_mut(i).errno = e.errno();
                    self.unqueue_front();
                    if self.op(i).outstanding == 0 {
                        self.finish(i);
                    }
                }
            }
        }
    }

    fn unqueue_front(&mut self) {
        if let Some(i) = self.queue.pop_front() {
            self.op_mut(i).queued = false;
        }
    }

    /// Sends the next piece of request `i`, its data from `zeroes`.
    fn send_piece<P: RtrsPort + ?Sized>(
        &mut self,
        i: usize,
        zeroes: &Mr,
        port: &mut P,
        inflight: &AtomicUsize,
        shared: &SharedDevices,
        cx: &mut dyn Ctx,
    ) -> Result<(), IoError> {
        let op = self.op(i);
        let sent = shared
            .with(op.dev, |d| {
                let info = d.check(&op.req)?;
                let bs = u64::from(info.logical_block_size);
                let most = (zeroes.len() as u64 * MAX_PIECE_SGES as u64)
                    .min(u64::from(info.max_io_size))
                    / bs
                    * bs;
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
                let tag = ADMIN_TAG | ZERO_TAG | (i as u64) << 32 | u64::from(op.pieces);
                send_tagged(port, inflight, cx, d, tag, &piece, &sgl[..n]).map(|()| len)
            })
            .unwrap_or(Err(IoError::NoDevice))?;
        let op = self.op_mut(i);
        op.next += sent;
        op.outstanding += 1;
        op.pieces = op.pieces.wrapping_add(1);
        Ok(())
    }

    /// A piece ended (its tag satisfies [`is_piece`]).
    pub(super) fn piece_done(&mut self, tag: u64, errno: i32) {
        let i = ((tag & !(ADMIN_TAG | ZERO_TAG)) >> 32) as usize;
        let Some(op) = self.ops.get_mut(i).and_then(Option::as_mut) else {
            tracing::error!(tag, "rnbd: completion of an unknown write-zeroes piece");
            return;
        };
        op.outstanding -= 1;
        if errno != 0 && op.errno == 0 {
            op.errno = errno;
        }
        if op.outstanding == 0 && (op.errno != 0 || op.next >= op.end) {
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
        self.ready.push_back(PortCompletion {
            tag: op.tag,
            errno: op.errno,
        });
    }

    /// The oldest finished request.
    pub(super) fn take_ready(&mut self) -> Option<PortCompletion> {
        self.ready.pop_front()
    }

    fn op(&self, i: usize) -> ZeroOp {
        self.ops[i].expect("a live write-zeroes slot")
    }

    fn op_mut(&mut self, i: usize) -> &mut ZeroOp {
        self.ops[i].as_mut().expect("a live write-zeroes slot")
    }
}
