//! The transmit side of one tcp-fabric connection: turns the soft queue pair's posted
//! wire operations, its cumulative acks and the connection's control frames into frames,
//! and writes them with one gathered `sendmsg` for many frames (the software counterpart
//! of a NIC's send engine walking the send queue).
//!
//! A *batch* is a list of iovecs: 40-byte headers from a fixed header buffer and payload
//! pieces pointing straight at the source memory (no copy). The batch keeps a handle on
//! the registered memory of every source (one per registration), so a frame that is half
//! written when the queue pair breaks (and flushes its requests) can still be finished,
//! which keeps the stream parseable for the NAK or DISCONNECT that follows it. The
//! handles outlive their batch, for the next ones (mostly over the same registrations,
//! so that no reference count moves per batch, at QD1 per IO), up to [`KEEP_MAX`]. A new
//! batch is built only when the previous one is completely written.

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::frame::{Header, Opcode, CM_FRAME_MAX, HEADER_LEN};
use super::sys::{self, IoVecs};
use crate::fabric::soft::{MemRef, SoftQp, WireKind, WireOp};

/// Frames per batch (headers buffer size).
const MAX_FRAMES: usize = 256;
/// Iovecs per batch.
const IOV_CAP: usize = sys::IOV_MAX;
/// Handles on registrations kept between batches; beyond, all are let go at the end of a
/// batch (as many as a queue pair's leases).
const KEEP_MAX: usize = 8;

/// Header slots and iovecs a batch keeps for the ack and the closing frame.
const RESERVED: usize = 2;
/// Largest rest of a half-written frame [`Tx::detach`] copies.
const MAX_TAIL: usize = 64 << 20;
/// Batches written per [`Tx::flush`] call before yielding to other work.
const BATCH_BUDGET: usize = 16;
/// An owed ack goes alone (with no frame to ride on) once it covers this many frames (or
/// a quarter of the send queue, if smaller: queue pairs are usually sized alike on both
/// sides, so a peer streaming one way never waits on a full send queue)...
const ACK_EVERY: u64 = 64;
/// ...or once it has been owed this long. Requests are normally answered well within
/// it, so request/response traffic never pays a syscall for acknowledgement; a one-way
/// stream still gets its send completions.
const ACK_DELAY: Duration = Duration::from_micros(100);
/// A waiting ack reads the clock once every this many polls (an idle poll of a busy
/// reactor costs less than a clock read).
const ACK_CLOCK_ROUNDS: u32 = 8;

pub(crate) struct Tx {
    /// The frame version of the connection.
    version: u8,
    hdrs: Box<[[u8; HEADER_LEN]; MAX_FRAMES]>,
    nhdrs: usize,
    cm: Box<[u8; CM_FRAME_MAX]>,
    cm_len: usize,
    cm_pending: bool,
    /// NAK or DISCONNECT: written after everything already in a batch, then nothing else.
    last: Option<Header>,
    last_written: bool,
    iov: IoVecs,
    /// First iovec of `iov` not completely written.
    pos: usize,
    /// Whether `iov[pos]` is partly written.
    partial: bool,
    /// For each frame of the batch, the index of the iovec after its last one.
    frame_ends: Vec<usize>,
    /// Per operation frame of the batch: where it ends (as `frame_ends`) and its
    /// sequence number; the first `op_left` were reported wholly written.
    op_ends: Vec<(usize, u64)>,
    op_left: usize,
    /// One handle per registration the batches read (see the module doc).
    keep: Vec<MemRef>,
    /// Handles `keep` took: for tests.
    #[cfg(test)]
    kept: u64,
    /// The rest of the frame in flight when the connection broke (see [`Tx::detach`]).
    tail: Vec<u8>,
    /// Cumulative ack owed to the peer, not yet in a batch.
    ack: Option<u64>,
    /// When the owed ack was first found with nothing to ride on.
    ack_since: Option<Instant>,
    /// Polls the owed ack has waited for a frame to ride on.
    ack_rounds: u32,
    /// The last sequence number acknowledged to the peer.
    acked: u64,
    /// Frames an owed ack may cover before it goes alone (see [`ACK_EVERY`]).
    ack_every: u64,
    /// [`ACK_DELAY`] (a field so that tests need not sleep).
    ack_delay: Duration,
}

/// The header of a wire operation.
pub(crate) fn wire_header(op: &WireOp) -> Header {
    let opcode = match op.kind {
        WireKind::Send => Opcode::Send,
        WireKind::SendWithImm => Opcode::SendWithImm,
        WireKind::SendWithInv => Opcode::SendWithInv,
        WireKind::RdmaWrite => Opcode::RdmaWrite,
        WireKind::RdmaWriteWithImm => Opcode::RdmaWriteWithImm,
    };
    let remote = matches!(op.kind, WireKind::RdmaWrite | WireKind::RdmaWriteWithImm);
    let imm = matches!(op.kind, WireKind::SendWithImm | WireKind::RdmaWriteWithImm);
    Header {
        opcode,
        len: op.len,
        rkey: if remote { op.rkey } else { 0 },
        remote_addr: if remote { op.remote_addr } else { 0 },
        imm: if imm { op.imm } else { 0 },
        inv_rkey: if op.kind == WireKind::SendWithInv {
            op.inv_rkey
        } else {
            0
        },
        seq: op.seq,
    }
}

impl Tx {
    /// A transmit side for a queue pair with `max_send_wr` send slots, writing frames of
    /// version `version`.
    pub(crate) fn new(max_send_wr: u32, version: u8) -> Tx {
        Tx {
            version,
            hdrs: Box::new([[0; HEADER_LEN]; MAX_FRAMES]),
            nhdrs: 0,
            cm: Box::new([0; CM_FRAME_MAX]),
            cm_len: 0,
            cm_pending: false,
            last: None,
            last_written: false,
            iov: IoVecs::with_capacity(IOV_CAP),
            pos: 0,
            partial: false,
            frame_ends: Vec::with_capacity(MAX_FRAMES + 1),
            op_ends: Vec::with_capacity(MAX_FRAMES + 1),
            op_left: 0,
            keep: Vec::with_capacity(IOV_CAP + KEEP_MAX),
            #[cfg(test)]
            kept: 0,
            tail: Vec::new(),
            ack: None,
            ack_since: None,
            ack_rounds: 0,
            acked: 0,
            ack_every: (u64::from(max_send_wr) / 4).clamp(1, ACK_EVERY),
            ack_delay: ACK_DELAY,
        }
    }

    /// Queues a whole CM frame (REQ, PROOF or REP) to go first. The previous one must be
    /// written completely ([`Tx::drained`]): its bytes are in the same buffer.
    pub(crate) fn queue_cm(&mut self, frame: &[u8]) {
        assert!(
            self.drained() && frame.len() <= CM_FRAME_MAX,
            "a CM frame is queued only on an idle transmit side"
        );
        self.cm[..frame.len()].copy_from_slice(frame);
        self.cm_len = frame.len();
        self.cm_pending = true;
    }

    /// Queues the closing frame (NAK or DISCONNECT); later calls are ignored.
    pub(crate) fn queue_last(&mut self, h: Header) {
        if self.last.is_none() && !self.last_written {
            self.last = Some(h);
        }
    }

    /// Whether the closing frame (if any was queued) and everything before it is written.
    pub(crate) fn drained(&self) -> bool {
        self.pos == self.iov.len() && !self.cm_pending && self.last.is_none()
    }

    /// Writes as much as the socket takes: the rest of the current batch, then new
    /// batches from `qp` (`None` once the connection is closing: only the CM and closing
    /// frames go out then).
    ///
    /// # Errors
    /// The socket's error (never `WouldBlock`: that just ends the call).
    pub(crate) fn flush(&mut self, fd: RawFd, mut qp: Option<&mut SoftQp>) -> io::Result<()> {
        for _ in 0..BATCH_BUDGET {
            while self.pos < self.iov.len() {
                // SAFETY: every iovec points into `self.hdrs`, `self.cm` (boxed, not
                // moved or rewritten while the batch is in flight) or at source memory
                // kept alive by `self.keep`.
                match unsafe { sys::send_gather(fd, &self.iov.as_slice()[self.pos..]) } {
                    Ok(n) => {
                        self.partial = self.iov.consume(&mut self.pos, n);
                        if let Some(q) = qp.as_deref_mut() {
                            self.report_left(q);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.forget_batch();
            self.nhdrs = 0;
            if !self.build(qp.as_deref_mut()) {
                return Ok(());
            }
        }
        Ok(())
    }

    /// The connection broke. Of the batch in flight only the frame being written is
    /// kept (it must be finished for the stream to stay parseable before the NAK or
    /// DISCONNECT); and since the queue pair is flushing its requests, whose memory a NIC
    /// no longer touches once they complete, the rest of that frame is copied into a
    /// buffer of our own now, before the user can see a flush completion. Returns false
    /// when the rest is too large to copy ([`MAX_TAIL`]): the caller closes abruptly.
    pub(crate) fn detach(&mut self) -> bool {
        let cut = if !self.partial && (self.pos == 0 || self.frame_ends.contains(&self.pos)) {
            self.pos
        } else {
            match self.frame_ends.iter().find(|&&e| e > self.pos) {
                Some(&e) => e,
                None => self.iov.len(),
            }
        };
        let rest = self.iov.bytes(self.pos, cut);
        if rest > MAX_TAIL {
            return false;
        }
        self.tail.clear();
        self.tail.reserve(rest);
        // SAFETY: pieces of the batch in flight point into our header buffers or at
        // source memory kept alive by `self.keep`, not released before the copy.
        unsafe { self.iov.copy_out(self.pos, cut, &mut self.tail) };
        self.forget_batch();
        if !self.tail.is_empty() {
            // The tail is not touched again until this batch is written.
            self.iov.push(self.tail.as_ptr(), self.tail.len());
            self.frame_ends.push(1);
        }
        true
    }

    /// Drops the batch in flight: its pieces and its progress (the header slots stay the
    /// caller's to reuse); the handles on its sources stay for the next batches unless
    /// there are more than [`KEEP_MAX`].
    fn forget_batch(&mut self) {
        self.iov.clear();
        if self.keep.len() > KEEP_MAX {
            self.keep.clear();
        }
        self.frame_ends.clear();
        self.op_ends.clear();
        self.op_left = 0;
        self.pos = 0;
        self.partial = false;
    }

    /// One more poll with the owed ack and nothing to send: whether it has waited
    /// [`ACK_DELAY`] (checked every [`ACK_CLOCK_ROUNDS`] polls).
    fn ack_waited_long(&mut self) -> bool {
        self.ack_rounds += 1;
        if self.ack_rounds % ACK_CLOCK_ROUNDS != 1 {
            return false;
        }
        match self.ack_since {
            None => {
                self.ack_since = Some(Instant::now());
                false
            }
            Some(t) => t.elapsed() >= self.ack_delay,
        }
    }

    /// Tells `qp` which operations of the batch in flight are now wholly in the socket
    /// (their sources are read), so the REG_MRs behind them take effect before any frame
    /// written after them can be complete at the peer.
    fn report_left(&mut self, qp: &mut SoftQp) {
        let mut last = None;
        while let Some(&(end, seq)) = self.op_ends.get(self.op_left) {
            if end > self.pos {
                break;
            }
            last = Some(seq);
            self.op_left += 1;
        }
        if let Some(seq) = last {
            qp.left_through(seq);
        }
    }

    fn push_header(&mut self, h: &Header) {
        let slot = &mut self.hdrs[self.nhdrs];
        h.encode_as(slot, self.version);
        let ptr = slot.as_ptr();
        self.nhdrs += 1;
        self.iov.push(ptr, HEADER_LEN);
    }

    /// Fills a new batch; false when there is nothing to send.
    fn build(&mut self, qp: Option<&mut SoftQp>) -> bool {
        if self.cm_pending {
            self.cm_pending = false;
            self.iov.push(self.cm.as_ptr(), self.cm_len);
            self.frame_ends.push(self.iov.len());
        }
        if let Some(qp) = qp {
            // The last batch is in the socket: its sources are read, so a REG_MR waiting
            // behind them may expose them again (see `SoftQp::sent_left`).
            qp.sent_left();
            if let Some(seq) = qp.take_ack() {
                self.ack = Some(seq);
            }
            let mut n = 0;
            for (op, srcs) in qp.outbound() {
                // Keep room for the ack and the closing frame.
                if self.nhdrs + 1 + RESERVED > MAX_FRAMES
                    || self.iov.len() + 1 + srcs.len() + RESERVED > IOV_CAP
                {
                    break;
                }
                self.push_header(&wire_header(&op));
                let seq = op.seq;
                for s in srcs.iter().filter(|s| !s.is_empty()) {
                    self.iov.push(s.as_ptr(), s.len());
                    // One handle per registration keeps all its pieces alive: `keep`
                    // holds a few distinct ones, not a reference count per piece.
                    if !self.keep.iter().any(|k| k.shares_backing(s)) {
                        self.keep.push(s.clone());
                        #[cfg(test)]
                        {
                            self.kept += 1;
                        }
                    }
                }
                self.frame_ends.push(self.iov.len());
                self.op_ends.push((self.iov.len(), seq));
                n += 1;
            }
            qp.mark_transmitted(n);
            // Delayed ack: an ack rides with the frames going out anyway; alone it goes
            // only when it covers many frames or has waited long (see ACK_DELAY).
            if let Some(seq) = self.ack {
                if n > 0 || seq - self.acked >= self.ack_every || self.ack_waited_long() {
                    self.push_header(&Header::ack(seq));
                    self.frame_ends.push(self.iov.len());
                    self.ack = None;
                    self.ack_since = None;
                    self.ack_rounds = 0;
                    self.acked = seq;
                }
            }
        }
        if let Some(h) = self.last.take() {
            self.push_header(&h);
            self.frame_ends.push(self.iov.len());
            self.last_written = true;
        }
        self.iov.len() > 0
    }
}

#[cfg(test)]
mod tests;
