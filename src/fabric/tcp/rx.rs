//! The receive side of one tcp-fabric connection: parses frames from the socket and
//! executes them through the soft queue pair, in stream order (the responder half of an
//! RC queue pair).
//!
//! Headers and small frames come through a staging buffer, read in large pieces. A
//! payload goes straight into the memory the queue pair placed it at: whatever of it is
//! already staged is copied, the rest is read with one `readv` into the target memory
//! *and* the staging buffer, so the same call also fetches the headers that follow. No
//! payload ever passes through a bounce buffer. An operation that needs a receive when
//! none is posted stalls the stream (RNR) until one is.
//!
//! On a shared CQ with a readiness set the socket is read only while the [`ReadGate`]
//! says it may have data: a readiness event opens the gate, a read that found the socket
//! empty (`EAGAIN`, or fewer bytes than asked: the socket was drained at that instant,
//! and a later arrival raises a new event) closes it. Nothing else closes it (a stall or
//! the frame budget leaves bytes in the socket).

use std::io::{self, Read};
use std::os::fd::AsRawFd;

use super::frame::{peek_version, FrameError, Header, Opcode};
use super::frame::{CHALLENGE_LEN, CM_FRAME_LEN, CM_PAYLOAD_LEN, HEADER_LEN, MAGIC, V1, VERSION};
use super::sys;
use crate::fabric::soft::{BadAck, InboundError, MemRef, SoftQp, WireKind, WireOp};
use crate::fabric::WcStatus;

/// Size of the staging buffer.
const STAGE_LEN: usize = 64 * 1024;
/// Frames (or socket reads) handled per [`Rx::progress`] call before yielding.
const FRAME_BUDGET: usize = 1024;
/// A payload at least this long makes the stream "bulk" (see [`Rx::read_limit`]).
const BULK_PAYLOAD: u32 = 16 * 1024;
/// How far a bulk stream reads ahead into the staging buffer: a few headers, little of
/// the next payload (which would have to be copied out of the staging buffer again).
const BULK_READ_AHEAD: usize = 512;
/// Small payloads a bulk stream stays bulk through: a large READ's response is the data
/// then small frames (an RTRS response's SEND_WITH_INV and its 8-byte RKEY_RSP), and the
/// next response's data should still be read into place.
const BULK_SMALL_FRAMES: u8 = 8;

enum State {
    Header,
    Payload {
        op: WireOp,
        dest: MemRef,
        done: usize,
    },
    /// Receive not ready: `op` waits for a posted receive.
    Stalled(WireOp),
}

/// Why [`Rx::progress`] returned.
#[derive(Debug)]
pub(crate) enum RxStop {
    /// Nothing more to read now, stalled on RNR, or out of budget.
    Idle,
    /// The peer closed its side.
    Eof,
    Io(io::Error),
    /// The peer broke the frame format.
    Garbage(FrameError),
    /// A frame that is valid but not allowed here (for example a CM frame mid-stream).
    Unexpected(Opcode),
    /// The queue pair refused operation `op`: NAK it and close.
    Refused {
        op: WireOp,
        status: WcStatus,
    },
    /// The peer acknowledged operations never sent: not believed, the connection closes.
    BadAck(BadAck),
    /// The peer refused one of ours (the queue pair has the status already).
    PeerNak,
    /// The peer disconnected gracefully.
    PeerDisconnect,
}

/// A CM frame the initiator received while connecting: CM_REP, CM_REJ or CM_CHALLENGE,
/// whose payloads are all 64 bytes.
pub(crate) struct CmIn {
    /// The frame's version (a listener of another version may answer in its own).
    pub version: u8,
    pub opcode: Opcode,
    pub payload: [u8; CM_PAYLOAD_LEN],
}

const _: () = assert!(CHALLENGE_LEN == CM_PAYLOAD_LEN);

/// Why the initiator's wait for CM_REP / CM_REJ failed.
#[derive(Debug)]
pub(crate) enum CmReadError {
    Eof,
    Io(io::Error),
    BadMagic(u32),
    Version(u8),
    Garbage(FrameError),
    Unexpected(Opcode),
}

pub(crate) struct Rx {
    /// The frame version of the connection.
    version: u8,
    stage: Box<[u8]>,
    start: usize,
    end: usize,
    state: State,
    /// Small payloads left before the stream stops being bulk: set by a large payload
    /// ([`BULK_PAYLOAD`]), counted down by each small one ([`BULK_SMALL_FRAMES`]);
    /// while not 0, read ahead little.
    bulk: u8,
    /// Payload bytes copied out of the staging buffer (the rest was read in place).
    copied: u64,
}

/// Whether the receive side may read the socket (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct ReadGate {
    /// In a readiness set: read only while `readable`.
    watched: bool,
    readable: bool,
}

impl ReadGate {
    /// Joins (`true`) or leaves the readiness set; joining opens the gate once, for
    /// what arrived before the set watched the socket.
    pub(crate) fn set_watched(&mut self, on: bool) {
        self.watched = on;
        self.readable = true;
    }

    /// Whether the socket is in a readiness set (reads gated).
    pub(crate) fn watched(&self) -> bool {
        self.watched
    }

    /// A readiness event.
    pub(crate) fn set_readable(&mut self) {
        self.readable = true;
    }

    fn open(&self) -> bool {
        !self.watched || self.readable
    }

    /// A read asked for `asked` bytes and got `got` (`None`: `EAGAIN`).
    fn after(&mut self, asked: usize, got: Option<usize>) {
        #[cfg(test)]
        count_read();
        if got.map_or(true, |n| n != 0 && n < asked) {
            self.readable = false;
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Socket reads made by receive sides on this thread (tests count them).
    pub(crate) static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
fn count_read() {
    READS.with(|r| r.set(r.get() + 1));
}

enum Fill {
    Data,
    Eof,
    WouldBlock,
    Err(io::Error),
}

impl Rx {
    /// The receive side of a connection of frame version `version`.
    pub(crate) fn new(version: u8) -> Rx {
        Rx {
            version,
            stage: vec![0; STAGE_LEN].into_boxed_slice(),
            start: 0,
            end: 0,
            state: State::Header,
            bulk: 0,
            copied: 0,
        }
    }

    /// How many bytes a read may put into the staging buffer. Small frames come many per
    /// read (a full buffer); after a large payload only a little, so that the next large
    /// payload is read straight into place instead of staged and copied.
    fn read_limit(&self) -> usize {
        if self.bulk > 0 {
            BULK_READ_AHEAD
        } else {
            STAGE_LEN
        }
    }

    /// A payload of `len` (> 0) bytes started: a large one makes the stream bulk, a
    /// small one counts it down.
    fn count_payload(&mut self, len: u32) {
        self.bulk = if len >= BULK_PAYLOAD {
            BULK_SMALL_FRAMES
        } else {
            self.bulk.saturating_sub(1)
        };
    }

    fn staged(&self) -> usize {
        self.end - self.start
    }

    /// Reads more into the staging buffer, making room first (a frame header or CM
    /// frame always fits contiguously after this).
    fn fill<S: Read>(&mut self, stream: &mut S, gate: &mut ReadGate) -> Fill {
        if !gate.open() {
            return Fill::WouldBlock;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > STAGE_LEN / 2 || self.end == STAGE_LEN {
            self.stage.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let to = (self.end + self.read_limit()).min(STAGE_LEN);
        let asked = to - self.end;
        loop {
            match stream.read(&mut self.stage[self.end..to]) {
                Ok(0) => return Fill::Eof,
                Ok(n) => {
                    gate.after(asked, Some(n));
                    self.end += n;
                    return Fill::Data;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    gate.after(asked, None);
                    return Fill::WouldBlock;
                }
                Err(e) => return Fill::Err(e),
            }
        }
    }

    #[inline(always)]
    fn take_header(&mut self) -> Result<Header, FrameError> {
        let mut b = [0u8; HEADER_LEN];
        b.copy_from_slice(&self.stage[self.start..self.start + HEADER_LEN]);
        self.start += HEADER_LEN;
        Header::decode_as(&b, self.version)
    }

    /// Reads and executes frames until the socket has nothing more, the stream stalls
    /// (RNR), the budget is spent, or the connection must end.
    pub(crate) fn progress<S: Read + AsRawFd>(
        &mut self,
        stream: &mut S,
        qp: &mut SoftQp,
        gate: &mut ReadGate,
    ) -> RxStop {
        for _ in 0..FRAME_BUDGET {
            match &mut self.state {
                State::Stalled(op) => {
                    if !qp.recv_ready() {
                        // The peer's DISCONNECT or EOF is behind the stalled operation;
                        // a peer that went away must still break the connection (and
                        // raises a readiness event: POLLRDHUP is watched).
                        if !gate.open() {
                            return RxStop::Idle;
                        }
                        #[cfg(test)]
                        count_read();
                        return match sys::peer_hung_up(stream.as_raw_fd()) {
                            Ok(false) => RxStop::Idle,
                            Ok(true) => RxStop::Eof,
                            Err(e) => RxStop::Io(e),
                        };
                    }
                    let op = *op;
                    if let Some(stop) = self.start_op(op, qp) {
                        return stop;
                    }
                }
                State::Payload { op, dest, done } => {
                    let len = op.len as usize;
                    let staged = (self.end - self.start).min(len - *done);
                    if staged > 0 {
                        dest.write_at(*done, &self.stage[self.start..self.start + staged]);
                        self.copied += staged as u64;
                        self.start += staged;
                        *done += staged;
                    }
                    if *done < len && !gate.open() {
                        return RxStop::Idle;
                    }
                    if *done < len {
                        // Nothing staged: read the rest of the payload into place and the
                        // following frames into the staging buffer, in one call.
                        self.start = 0;
                        self.end = 0;
                        let rest = len - *done;
                        let ahead = if op.len >= BULK_PAYLOAD {
                            BULK_READ_AHEAD
                        } else {
                            STAGE_LEN
                        };
                        let iov = [
                            sys::iovec(dest.as_ptr().wrapping_add(*done), rest),
                            sys::iovec(self.stage.as_mut_ptr(), ahead),
                        ];
                        // SAFETY: the first piece is inside `dest`, registered memory
                        // checked for this remote access and kept alive by the MemRef;
                        // the second is our own staging buffer, borrowed mutably here.
                        match unsafe { sys::recv_scatter(stream.as_raw_fd(), &iov) } {
                            Ok(0) => return RxStop::Eof,
                            Ok(n) => {
                                gate.after(rest + ahead, Some(n));
                                if n <= rest {
                                    *done += n;
                                } else {
                                    *done = len;
                                    self.end = n - rest;
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                                gate.after(rest + ahead, None);
                                return RxStop::Idle;
                            }
                            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                            Err(e) => return RxStop::Io(e),
                        }
                    }
                    if *done == len {
                        let op = *op;
                        // The destination's handle goes back to the queue pair's lease.
                        if let State::Payload { dest, .. } =
                            std::mem::replace(&mut self.state, State::Header)
                        {
                            qp.recycle(dest);
                        }
                        qp.inbound_done(&op);
                    }
                }
                State::Header => {
                    if self.staged() < HEADER_LEN {
                        match self.fill(stream, gate) {
                            Fill::Data => continue,
                            Fill::Eof => return RxStop::Eof,
                            Fill::WouldBlock => return RxStop::Idle,
                            Fill::Err(e) => return RxStop::Io(e),
                        }
                    }
                    let h = match self.take_header() {
                        Ok(h) => h,
                        Err(e) => return RxStop::Garbage(e),
                    };
                    if let Some(stop) = self.dispatch(h, qp) {
                        return stop;
                    }
                }
            }
        }
        RxStop::Idle
    }

    fn dispatch(&mut self, h: Header, qp: &mut SoftQp) -> Option<RxStop> {
        let kind = match h.opcode {
            Opcode::Send => WireKind::Send,
            Opcode::SendWithImm => WireKind::SendWithImm,
            Opcode::SendWithInv => WireKind::SendWithInv,
            Opcode::RdmaWrite => WireKind::RdmaWrite,
            Opcode::RdmaWriteWithImm => WireKind::RdmaWriteWithImm,
            Opcode::Ack => {
                return qp.on_ack(h.seq).err().map(|e| {
                    qp.fail();
                    RxStop::BadAck(e)
                });
            }
            Opcode::Nak => {
                qp.on_nak(h.seq, h.nak_status());
                return Some(RxStop::PeerNak);
            }
            Opcode::Disconnect => return Some(RxStop::PeerDisconnect),
            op @ (Opcode::CmReq
            | Opcode::CmRep
            | Opcode::CmRej
            | Opcode::CmChallenge
            | Opcode::CmProof) => return Some(RxStop::Unexpected(op)),
        };
        let op = WireOp {
            seq: h.seq,
            kind,
            len: h.len,
            remote_addr: h.remote_addr,
            rkey: h.rkey,
            imm: h.imm,
            inv_rkey: h.inv_rkey,
        };
        self.start_op(op, qp)
    }

    /// Asks the queue pair where `op` goes and starts placing its payload.
    fn start_op(&mut self, op: WireOp, qp: &mut SoftQp) -> Option<RxStop> {
        let len = op.len as usize;
        // The whole payload staged: checked and copied in one step, with no destination
        // kept between polls.
        let staged = len > 0 && self.staged() >= len;
        let placed = if staged {
            let payload = &self.stage[self.start..self.start + len];
            qp.execute_staged(&op, payload).map(|()| None)
        } else {
            qp.inbound(&op)
        };
        match placed {
            Ok(None) if staged => {
                self.copied += len as u64;
                self.start += len;
                self.count_payload(op.len);
                self.state = State::Header;
                None
            }
            Ok(Some(dest)) if dest.len() == len && len > 0 => {
                self.count_payload(op.len);
                self.state = State::Payload { op, dest, done: 0 };
                None
            }
            Ok(None) if len == 0 => {
                self.state = State::Header;
                qp.inbound_done(&op);
                None
            }
            Ok(_) => {
                // A placement that does not match the payload: never accept bytes we
                // cannot put where they belong.
                qp.fail();
                Some(RxStop::Refused {
                    op,
                    status: WcStatus::RemoteInvalidRequest,
                })
            }
            Err(InboundError::NotReady) => {
                self.state = State::Stalled(op);
                Some(RxStop::Idle)
            }
            Err(InboundError::Refuse(status)) => {
                self.state = State::Header;
                Some(RxStop::Refused { op, status })
            }
        }
    }

    /// Initiator only: the listener's next CM frame (CM_CHALLENGE, CM_REP or CM_REJ)
    /// once it is completely in, `Ok(None)` while it is not. Frames after it stay staged
    /// for [`Rx::progress`]. The frame may be of any version this build speaks; the
    /// caller decides what a version other than the connection's means.
    pub(crate) fn read_cm<S: Read>(&mut self, stream: &mut S) -> Result<Option<CmIn>, CmReadError> {
        loop {
            if self.staged() >= HEADER_LEN {
                let mut b = [0u8; HEADER_LEN];
                b.copy_from_slice(&self.stage[self.start..self.start + HEADER_LEN]);
                let (magic, version, _) = peek_version(&b);
                if magic != MAGIC {
                    return Err(CmReadError::BadMagic(magic));
                }
                if !(V1..=VERSION).contains(&version) {
                    return Err(CmReadError::Version(version));
                }
                let h = Header::decode_as(&b, version).map_err(CmReadError::Garbage)?;
                if !matches!(
                    h.opcode,
                    Opcode::CmRep | Opcode::CmRej | Opcode::CmChallenge
                ) {
                    return Err(CmReadError::Unexpected(h.opcode));
                }
                if self.staged() >= CM_FRAME_LEN {
                    let mut payload = [0u8; CM_PAYLOAD_LEN];
                    let at = self.start + HEADER_LEN;
                    payload.copy_from_slice(&self.stage[at..at + CM_PAYLOAD_LEN]);
                    self.start += CM_FRAME_LEN;
                    return Ok(Some(CmIn {
                        version,
                        opcode: h.opcode,
                        payload,
                    }));
                }
            }
            match self.fill(stream, &mut ReadGate::default()) {
                Fill::Data => {}
                Fill::Eof => return Err(CmReadError::Eof),
                Fill::WouldBlock => return Ok(None),
                Fill::Err(e) => return Err(CmReadError::Io(e)),
            }
        }
    }

    /// Closing: reads and throws away whatever the peer still sends, so that closing
    /// our socket later does not reset the peer's unread data (our NAK or DISCONNECT).
    /// Returns `Eof`, `Io` or `Idle`.
    pub(crate) fn discard<S: Read>(&mut self, stream: &mut S) -> RxStop {
        self.start = 0;
        self.end = 0;
        for _ in 0..FRAME_BUDGET {
            match stream.read(&mut self.stage[..]) {
                Ok(0) => return RxStop::Eof,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return RxStop::Idle,
                Err(e) => return RxStop::Io(e),
            }
        }
        RxStop::Idle
    }
}

#[cfg(test)]
mod tests;
