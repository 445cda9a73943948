//! One endpoint of a software reliable connection: the send queue, the receive queue,
//! the completion queue, and the responder's checks — what an RC queue pair does in a
//! NIC, with the wire left to a transport.
//!
//! # How a transport drives it
//! Sending: [`SoftQp::outbound`] lists the posted wire operations not yet handed over, in
//! order, each a [`WireOp`] header plus its source memory; the transport moves them and
//! calls [`SoftQp::mark_transmitted`]. The peer answers with cumulative acks
//! ([`SoftQp::on_ack`]) or one nak ([`SoftQp::on_nak`]); send completions come from
//! those, as RC ACKs, so a remote refusal becomes the sender's own completion error and
//! a send-queue slot is held until the peer has executed the operation.
//!
//! Receiving: for each incoming operation, in order, [`SoftQp::inbound`] checks it and
//! says where its payload goes (or that no receive is posted: stall and retry, the
//! `rnr_retry = 7` behaviour; or that it is refused: nak it and close). The transport
//! puts the payload there and calls [`SoftQp::inbound_done`]; a transport that has the
//! payload at hand (loopback) does all three with [`SoftQp::execute`]. [`SoftQp::take_ack`]
//! gives the cumulative ack to send back.
//!
//! Executing at post time (loopback, see docs/ARCHITECTURE.md, "The loopback fabric"):
//! the sender runs the responder's checks itself with [`respond`] against the peer's
//! table and receive, and reports each operation's fate to
//! [`SoftQp::transmit_or_execute`]; an executed one is complete without an ack. Such a
//! transport keeps the receive queue itself ([`SoftQp::check_recv`],
//! [`SoftQp::stage_recv`], [`SoftQp::push_completion`]) and moves completions made at
//! post time to the CQ with [`SoftQp::settle`], once per poll.
//!
//! Why two ways of driving and not one: the ack-driven way holds every operation's
//! sources and send slot until the peer said what became of it, because a wire lies in
//! between (tcp); a transport that reaches the peer's queue pair and memory in the same
//! process can learn that at once, and doing so keeps the loopback deterministic (its
//! fault injection decides each operation's fate at post) with no ack traffic to
//! simulate. Both share the queues, the responder's checks ([`respond`]) and the
//! completion rules, so an operation's outcome is the same either way (the fabric
//! conformance suite runs both).
//!
//! Breaking ([`SoftQp::fail`], or a refusal either way) flushes every posted receive and
//! every uncompleted send request with [`WcStatus::WrFlush`]. The transport learns that
//! it must tell its peer and raise `CmEvent::Disconnected` from
//! [`SoftQp::take_disconnect`], which is true exactly once.
//!
//! The queues are sized by use, not by the caps: the send ring starts at
//! [`SQ_INITIAL`] slots and doubles when a post needs more, up to the caps' `max_send_wr`
//! (rounded up to a power of two); the completion and receive queues grow the same way.
//! So an idle connection costs a few KiB whatever its caps allow, and the memory a busy
//! one took is given back when it is dropped (docs/ARCHITECTURE.md, "Caps and what
//! they cost"). Once a connection has carried its busiest load nothing allocates again:
//! each send slot keeps its source list's capacity.
//!
//! An ack is believed only for operations handed to the transport ([`SoftQp::on_ack`]):
//! a peer that acknowledges what was never sent would make us drop our own unsent
//! requests as done.

use std::collections::VecDeque;
use std::sync::Arc;

use super::table::{Leases, MemRef, MrTable, PendingBind};
use crate::fabric::{
    Access, ConnState, PostError, PostErrorKind, QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode,
    WcStatus,
};

/// What a wire operation does at the responder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireKind {
    Send,
    SendWithImm,
    SendWithInv,
    RdmaWrite,
    RdmaWriteWithImm,
}

impl WireKind {
    /// Whether the operation takes the responder's next posted receive.
    pub fn consumes_recv(self) -> bool {
        !matches!(self, WireKind::RdmaWrite)
    }
}

/// A one-sided or two-sided operation as it travels: the header; the payload (`len`
/// bytes) travels beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireOp {
    /// Position in the sender's stream of wire operations, from 1; acks name it.
    pub seq: u64,
    pub kind: WireKind,
    pub len: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    /// Immediate data (host order) for the `*WithImm` kinds, else 0.
    pub imm: u32,
    /// The responder's rkey to retire, for [`WireKind::SendWithInv`], else 0.
    pub inv_rkey: u32,
}

/// Why [`SoftQp::inbound`] did not place an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InboundError {
    /// No receive is posted: keep the operation (and everything behind it) pending and
    /// retry once a receive is posted.
    NotReady,
    /// Refused: nak `seq` with this status to the sender. The queue pair is already
    /// broken.
    Refuse(WcStatus),
}

struct SqSlot {
    wr_id: u64,
    signaled: bool,
    opcode: WcOpcode,
    /// The wire operation, for transmitted kinds; `None` for local ones.
    wire: Option<WireOp>,
    /// Set when the slot completed locally (local operations, post-time errors, flushes).
    status: Option<WcStatus>,
    /// A REG_MR waiting for the bytes of the operations before it to leave their
    /// sources (see [`SoftQp::post_send`]); made, and completed, then.
    bind: Option<PendingBind>,
    srcs: Srcs,
}

impl SqSlot {
    fn new(max_send_sge: u32) -> SqSlot {
        SqSlot {
            wr_id: 0,
            signaled: false,
            opcode: WcOpcode::Send,
            wire: None,
            status: None,
            bind: None,
            srcs: Srcs::with_capacity(max_send_sge as usize),
        }
    }
}

/// A send request's checked source list. Every list is allocated once, at
/// construction, for the queue pair's `max_send_sge`, and never grows after: a post
/// takes at most that many SGEs. A plain vector rather than an inline one: each push and
/// clear is a length test and no inline-or-heap test, and a transport hands a list over
/// by swapping three words.
pub type Srcs = Vec<MemRef>;

/// A posted receive, its buffer's lkey already checked.
#[derive(Debug)]
pub struct PostedRecv {
    pub wr_id: u64,
    /// The buffer, `None` for an empty receive, or the lkey check's failure.
    pub buf: Result<Option<MemRef>, WcStatus>,
}

impl Default for PostedRecv {
    fn default() -> PostedRecv {
        PostedRecv {
            wr_id: 0,
            buf: Ok(None),
        }
    }
}

/// Why [`respond`] did not place an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Respond {
    /// It needs a receive and none is posted.
    NotReady,
    /// Refused: the sender's request completes with `status`; `recv`, when set, is the
    /// error the responder's front receive completes with (it is consumed).
    Refuse {
        status: WcStatus,
        recv: Option<WcStatus>,
    },
}

/// Where an incoming operation's payload is, as [`respond`] takes it.
#[derive(Clone, Copy, Debug)]
pub enum Payload<'a> {
    /// Not at hand: the caller places it where [`Placed::place`] says.
    Later,
    /// Whole, in a buffer of the transport's own (the tcp fabric's staging buffer), of
    /// the operation's length.
    Staged(&'a [u8]),
    /// In the sender's registered memory, these ranges in order, of the operation's
    /// length in all (the loopback copies straight from them).
    Gather(&'a [MemRef]),
}

/// Where [`respond`] placed an operation.
#[derive(Debug)]
pub struct Placed {
    /// Where the payload goes: `None` when it carries none or `respond` placed it
    /// (every payload but [`Payload::Later`]).
    pub place: Option<MemRef>,
    /// The rkey a SEND_WITH_INV invalidated.
    pub invalidated: Option<u32>,
}

/// The responder's checks of one incoming operation, given the receive at the front of
/// its receive queue (`None` when none is posted): where the payload goes, or why not.
/// On success a SEND's buffer is filled in place, or moved out of `recv` for the caller
/// to fill ([`Payload::Later`]); the caller then consumes `recv`
/// (if the kind consumes one) with the completion [`recv_completion`] describes. The
/// same checks whoever runs them: the responder's queue pair for an operation that
/// arrived ([`SoftQp::execute`]), or the loopback sender executing at post time.
///
/// # Errors
/// [`Respond::NotReady`] when the kind needs a receive and `recv` is `None`;
/// [`Respond::Refuse`] when the responder refuses it.
///
/// With the payload at hand ([`Payload::Staged`], [`Payload::Gather`]) `respond` places
/// it: a remote placement is written under the lease alone ([`MrTable::remote_write`],
/// [`MrTable::remote_gather`]), with no handle made for it, and a receive's buffer is
/// filled; `place` then comes back `None`.
///
/// `leases` and `qp` are the responder's: its queue pair's handles on registered memory
/// and its number (a `Connection` key is valid only on the queue pair that bound it).
#[inline(always)]
pub fn respond(
    table: &MrTable,
    leases: &mut Leases,
    qp: u32,
    recv: Option<&mut PostedRecv>,
    op: &WireOp,
    payload: Payload<'_>,
) -> Result<Placed, Respond> {
    let mut invalidated = None;
    let place = if op.kind.consumes_recv() {
        let Some(recv) = recv else {
            return Err(Respond::NotReady);
        };
        match &mut recv.buf {
            Err(status) => {
                return Err(Respond::Refuse {
                    status: WcStatus::RemoteInvalidRequest,
                    recv: Some(*status),
                })
            }
            Ok(buf) if op.kind != WireKind::RdmaWriteWithImm => {
                let room = buf.as_ref().map_or(0, |b| b.len());
                if op.len as usize > room {
                    return Err(Respond::Refuse {
                        status: WcStatus::RemoteInvalidRequest,
                        recv: Some(WcStatus::LocalLength),
                    });
                }
                if op.kind == WireKind::SendWithInv {
                    if table.invalidate_remote(op.inv_rkey, qp).is_err() {
                        return Err(Respond::Refuse {
                            status: WcStatus::RemoteInvalidRequest,
                            recv: None,
                        });
                    }
                    invalidated = Some(op.inv_rkey);
                }
                // The payload at hand fills the buffer where it is: its handle stays
                // with the receive, for the receive's owner to take back (no count
                // moves here, nor on another thread). Else the buffer moves out for
                // the caller to fill: no count touched either.
                match (buf.as_ref(), payload) {
                    _ if op.len == 0 => None,
                    (Some(b), Payload::Staged(data)) => {
                        b.write_at(0, data);
                        None
                    }
                    (Some(b), Payload::Gather(srcs)) => {
                        b.gather_prefix(op.len as usize, srcs);
                        None
                    }
                    _ => buf.take().map(|b| b.truncate(op.len as usize)),
                }
            }
            Ok(_) => remote_place(table, leases, qp, op, payload)?,
        }
    } else {
        remote_place(table, leases, qp, op, payload)?
    };
    Ok(Placed { place, invalidated })
}

fn remote_place(
    table: &MrTable,
    leases: &mut Leases,
    qp: u32,
    op: &WireOp,
    payload: Payload<'_>,
) -> Result<Option<MemRef>, Respond> {
    if op.len == 0 {
        return Ok(None);
    }
    let refused = |status| Respond::Refuse { status, recv: None };
    match payload {
        // `execute_staged` checked that the payload is the operation's length.
        Payload::Staged(data) => table
            .remote_write(leases, qp, op.rkey, op.remote_addr, data)
            .map(|()| None)
            .map_err(refused),
        // The sender made the operation's length the sum of its sources'.
        Payload::Gather(srcs) => table
            .remote_gather(leases, qp, op.rkey, op.remote_addr, op.len, srcs)
            .map(|()| None)
            .map_err(refused),
        Payload::Later => table
            .remote(
                leases,
                qp,
                op.rkey,
                op.remote_addr,
                op.len,
                Access::REMOTE_WRITE,
            )
            .map(Some)
            .map_err(refused),
    }
}

/// The completion of the receive an executed operation consumed (kinds that consume
/// one; see [`WireKind::consumes_recv`]).
pub fn recv_completion(op: &WireOp, wr_id: u64, qp_num: u32, invalidated: Option<u32>) -> Wc {
    let (opcode, imm) = match op.kind {
        WireKind::RdmaWriteWithImm => (WcOpcode::RecvRdmaWithImm, Some(op.imm)),
        WireKind::SendWithImm => (WcOpcode::Recv, Some(op.imm)),
        _ => (WcOpcode::Recv, None),
    };
    Wc {
        wr_id,
        status: WcStatus::Success,
        opcode,
        byte_len: op.len,
        imm,
        invalidated_rkey: invalidated,
        qp_num,
    }
}

/// The completion of a receive that failed (`status`) or was flushed.
pub fn recv_error(wr_id: u64, status: WcStatus, qp_num: u32) -> Wc {
    Wc {
        wr_id,
        status,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm: None,
        invalidated_rkey: None,
        qp_num,
    }
}

/// What a transport did with a wire operation [`SoftQp::transmit_or_execute`] handed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Handed {
    /// Queued for the peer: it completes on the peer's ack (or nak).
    Queued,
    /// Executed at the peer already: it completes now, successfully.
    Executed,
    /// Refused by the peer's checks: it completes with this status and the queue pair
    /// breaks.
    Refused(WcStatus),
    /// Not taken: it and everything behind it stay for a later call.
    Stop,
}

/// The receive an operation in progress will consume.
struct InProgress {
    seq: u64,
    invalidated: Option<u32>,
}

/// An empty [`SoftQp::src_span`].
const NO_SPAN: (u64, u64) = (u64::MAX, 0);

/// What a LOCAL_INV or REG_MR does at post on queue pair `qp_num` (a posted one in
/// [`SoftQp::push_send`], one done at once in [`SoftQp::local_now`]).
enum Local {
    /// Done, with this status (a failure breaks the connection: the caller's part).
    Done(WcStatus),
    /// A REG_MR checked, its key on the slot, to be made once the bytes posted before it
    /// have left their sources.
    Wait(PendingBind),
}

/// The effect of the local operation `op` (anything else fails as a local operation
/// that cannot be done). A REG_MR exposes its range to the peer: as a NIC's ordered send
/// queue does, it takes effect only once the operations posted before it have taken
/// their bytes out of their sources (a READ response's RDMA WRITE from the very chunk
/// being rebound, say), at once when none is waiting (`wait` false).
// Always inlined into its one caller: its result, returned through memory, stalled the
// caller's wide load of it (docs/BENCHMARKS.md, "Small values returned through memory").
#[inline(always)]
fn local_effect(table: &Arc<MrTable>, qp_num: u32, op: &SendOp<'_>, wait: bool) -> Local {
    Local::Done(match *op {
        SendOp::LocalInv { slot } => match table.invalidate_slot(slot, qp_num) {
            Ok(()) => WcStatus::Success,
            Err(()) => WcStatus::LocalQpOperation,
        },
        SendOp::RegMr {
            slot,
            region,
            addr,
            len,
            access,
            rkey,
        } => match table.check_bind(slot, region, addr, len, access, rkey) {
            Err(status) => status,
            Ok(b) => {
                slot.set_rkey(rkey);
                if wait {
                    return Local::Wait(b);
                }
                match table.apply_bind(&b, qp_num) {
                    Ok(()) => WcStatus::Success,
                    Err(status) => status,
                }
            }
        },
        _ => WcStatus::LocalQpOperation,
    })
}

/// The end of the range `[addr, addr + len)` a REG_MR exposes.
fn end(addr: u64, len: u32) -> u64 {
    addr.saturating_add(u64::from(len))
}

/// Widens `span` to cover the bytes of `src`.
fn widen(span: &mut (u64, u64), src: &MemRef) {
    let a = src.as_ptr() as u64;
    span.0 = span.0.min(a);
    span.1 = span.1.max(a + src.len() as u64);
}

/// Send slots of a new queue pair: enough for a service connection's steady state; a
/// busier one grows its ring (see the module doc).
pub const SQ_INITIAL: usize = 64;

/// Receive and completion entries a new queue pair reserves before they grow.
const QUEUE_INITIAL: usize = 64;

/// An ack for an operation never handed to the transport ([`SoftQp::on_ack`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("ack for operation {acked}, but only {sent} were sent")]
pub struct BadAck {
    pub acked: u64,
    pub sent: u64,
}

/// A software RC queue pair.
pub struct SoftQp {
    table: Arc<MrTable>,
    /// The connection's number, on every completion (`Wc::qp_num`).
    qp_num: u32,
    /// Handles on the registered memory this queue pair used recently (see [`Leases`]).
    leases: Leases,
    caps: QpCaps,
    state: ConnState,
    disconnect_pending: bool,
    /// The send ring: a power of two long (indexing is a mask), of which `sq_cap`
    /// (`max_send_wr`) slots may be in use; it grows on demand up to `sq_cap` rounded up.
    sq: Vec<SqSlot>,
    sq_mask: usize,
    sq_cap: usize,
    sq_head: usize,
    sq_len: usize,
    /// Slots from `sq_head` known complete (acked, or completed locally); an unsignaled
    /// one waits there for a later completion to free it.
    sq_done: usize,
    /// Slots from `sq_head` already handed to the transport (only wire kinds count, but
    /// local ones in between are skipped over too).
    sq_sent: usize,
    /// Slots from `sq_head` whose bytes have left their source memory, as the transport
    /// last said ([`SoftQp::sent_left`], [`SoftQp::left_through`]); a REG_MR waits behind
    /// any that have not.
    sq_left: usize,
    /// The transport said every wire operation up to this sequence number has taken its
    /// bytes out of its sources.
    left_seq: u64,
    /// REG_MRs posted and waiting for the bytes before them (`SqSlot::bind`).
    binds_waiting: usize,
    /// Bounds `[lo, hi)` of every source of the slots a REG_MR's check may have to look
    /// at (from `sq_left.max(sq_done)` on): a REG_MR whose range lies outside them waits
    /// for nothing and looks at no slot. Emptied when a post finds no such slot before
    /// it, widened by every source posted after.
    src_span: (u64, u64),
    next_seq: u64,
    /// The last sequence number handed to the transport: no ack may go beyond it.
    sent_seq: u64,
    peer_acked: u64,
    rq: VecDeque<PostedRecv>,
    cq: VecDeque<Wc>,
    executed: u64,
    ack_sent: u64,
    in_progress: Option<InProgress>,
}

impl SoftQp {
    pub fn new(table: Arc<MrTable>, caps: QpCaps) -> SoftQp {
        let sq_cap = caps.max_send_wr.max(1) as usize;
        let sq: Vec<SqSlot> = (0..sq_cap.next_power_of_two().min(SQ_INITIAL))
            .map(|_| SqSlot::new(caps.max_send_sge))
            .collect();
        let cq_len = (caps.max_send_wr + caps.max_recv_wr) as usize;
        SoftQp {
            qp_num: table.next_qp_num(),
            table,
            leases: Leases::default(),
            caps,
            state: ConnState::Connecting,
            disconnect_pending: false,
            sq_mask: sq.len() - 1,
            sq_cap,
            sq,
            sq_head: 0,
            sq_len: 0,
            sq_done: 0,
            sq_sent: 0,
            sq_left: 0,
            left_seq: 0,
            binds_waiting: 0,
            src_span: NO_SPAN,
            next_seq: 1,
            sent_seq: 0,
            peer_acked: 0,
            rq: VecDeque::with_capacity((caps.max_recv_wr as usize).min(QUEUE_INITIAL)),
            cq: VecDeque::with_capacity(cq_len.min(QUEUE_INITIAL)),
            executed: 0,
            ack_sent: 0,
            in_progress: None,
        }
    }

    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The connection's number (unique among its fabric's queue pairs).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Completions generated and not yet polled.
    pub fn queued(&self) -> usize {
        self.cq.len()
    }

    pub fn state(&self) -> ConnState {
        self.state
    }

    pub fn table(&self) -> &Arc<MrTable> {
        &self.table
    }

    /// The connection manager established the connection: sends may be posted.
    pub fn set_connected(&mut self) {
        if self.state == ConnState::Connecting {
            self.state = ConnState::Connected;
        }
    }

    fn slot(&self, i: usize) -> &SqSlot {
        &self.sq[(self.sq_head + i) & self.sq_mask]
    }

    fn slot_mut(&mut self, i: usize) -> &mut SqSlot {
        &mut self.sq[(self.sq_head + i) & self.sq_mask]
    }

    /// Posts a chain of send requests (see `Conn::post_send`).
    ///
    /// # Errors
    /// [`PostError`] naming the first request not accepted.
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let result = self.post_send_unsettled(wrs);
        self.settle();
        result
    }

    /// [`SoftQp::post_send`] without moving completions made at post time to the CQ:
    /// for a transport that completes more at once (the loopback executes at post
    /// time) and calls [`SoftQp::settle`] once before its next poll takes completions
    /// (a post that finds the send queue full settles first).
    ///
    /// # Errors
    /// [`PostError`] naming the first request not accepted.
    #[inline]
    pub fn post_send_unsettled(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        for (index, wr) in wrs.iter().enumerate() {
            let refuse = |kind| Err(PostError { index, kind });
            if self.state != ConnState::Connected
                && !(self.state == ConnState::Disconnected && index > 0)
            {
                return refuse(PostErrorKind::NotConnected);
            }
            if self.sq_len == self.sq_cap {
                // Slots completed at post time and not settled yet are free.
                self.settle();
                if self.sq_len == self.sq_cap {
                    return refuse(PostErrorKind::QueueFull);
                }
            }
            let local_op = matches!(wr.op, SendOp::RegMr { .. } | SendOp::LocalInv { .. });
            if wr.sges.len() > self.caps.max_send_sge as usize || (local_op && !wr.sges.is_empty())
            {
                return refuse(PostErrorKind::TooManySge);
            }
            let total = wr
                .sges
                .iter()
                .try_fold(0u32, |acc, s| acc.checked_add(s.len));
            let Some(len) = total else {
                return refuse(PostErrorKind::Invalid);
            };
            self.push_send(wr, len);
        }
        Ok(())
    }

    /// A LOCAL_INV or REG_MR done at once, with no send-queue slot and no completion
    /// (`Conn::local_now`): what [`SoftQp::push_send`] does for a posted one, whose
    /// effect is at post too ([`local_effect`], shared by the two). `Some(Err(status))`
    /// is the status the operation would complete with: `WrFlush` on a broken
    /// connection; a failed check breaks the connection as a failed posted one does.
    /// `None` for a REG_MR that a posted one would leave waiting (bytes posted before it
    /// still read its range) or, more cautious than a post, one behind a REG_MR still
    /// waiting; and for any other operation: post it.
    pub fn local_now(&mut self, op: &SendOp<'_>) -> Option<Result<(), WcStatus>> {
        let wait = match *op {
            SendOp::LocalInv { .. } => false,
            SendOp::RegMr { addr, len, .. } => {
                self.binds_waiting > 0
                    || self.earlier_bytes_pending(self.sq_len, (addr, end(addr, len)))
            }
            _ => return None,
        };
        if self.state != ConnState::Connected {
            return Some(Err(WcStatus::WrFlush));
        }
        if wait {
            return None;
        }
        match local_effect(&self.table, self.qp_num, op, false) {
            Local::Done(WcStatus::Success) => Some(Ok(())),
            Local::Done(status) => {
                self.break_now();
                Some(Err(status))
            }
            // Not without `wait`.
            Local::Wait(_) => None,
        }
    }

    /// Moves the send requests completed at post time to the CQ. Every earlier change
    /// (an ack, a break) ran `advance`, so the slot at `sq_done` is the first incomplete
    /// one; a post completes only requests that complete at once (local operations,
    /// errors, flushes, operations executed at post time): the walk can move on only
    /// when the first incomplete slot is now one of those.
    #[inline]
    pub fn settle(&mut self) {
        if self.sq_done < self.sq_len && self.slot(self.sq_done).status.is_some() {
            self.advance();
        }
    }

    fn push_send(&mut self, wr: &SendWr<'_>, len: u32) {
        let i = self.sq_len;
        if i == self.sq.len() {
            self.grow_sq();
        }
        self.sq_len += 1;
        if self.sq_left.max(self.sq_done) >= i {
            // No earlier slot is left for a REG_MR to wait on.
            self.src_span = NO_SPAN;
        }
        let broken = self.state == ConnState::Disconnected;
        let seq = self.next_seq;
        // A REG_MR exposing memory that an earlier operation still reads waits for it.
        let bytes_pending = match wr.op {
            SendOp::RegMr { addr, len, .. } => {
                self.earlier_bytes_pending(i, (addr, end(addr, len)))
            }
            _ => false,
        };
        // Disjoint borrows: the table beside the slot, no reference count touched.
        let (table, leases, qp_num) = (&self.table, &mut self.leases, self.qp_num);
        let slot = &mut self.sq[(self.sq_head + i) & self.sq_mask];
        slot.wr_id = wr.wr_id;
        slot.signaled = wr.signaled;
        slot.wire = None;
        slot.status = None;
        slot.bind = None;
        // A slot leaves the ring with its sources released (`advance`, `break_now`).
        debug_assert!(slot.srcs.is_empty(), "a free send slot holds sources");
        debug_assert!(
            slot.srcs.capacity() >= wr.sges.len(),
            "a source list would grow"
        );
        let (kind, remote_addr, rkey, imm, inv_rkey) = match wr.op {
            SendOp::Send => (WireKind::Send, 0, 0, 0, 0),
            SendOp::SendWithImm { imm } => (WireKind::SendWithImm, 0, 0, imm, 0),
            SendOp::SendWithInv { rkey } => (WireKind::SendWithInv, 0, 0, 0, rkey),
            SendOp::RdmaWrite { remote_addr, rkey } => {
                (WireKind::RdmaWrite, remote_addr, rkey, 0, 0)
            }
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => (WireKind::RdmaWriteWithImm, remote_addr, rkey, imm, 0),
            SendOp::RegMr { .. } | SendOp::LocalInv { .. } => {
                slot.opcode = if matches!(wr.op, SendOp::RegMr { .. }) {
                    WcOpcode::RegMr
                } else {
                    WcOpcode::LocalInv
                };
                let effect = if broken {
                    Local::Done(WcStatus::WrFlush)
                } else {
                    local_effect(table, qp_num, &wr.op, bytes_pending)
                };
                match effect {
                    Local::Wait(b) => {
                        slot.bind = Some(b);
                        self.binds_waiting += 1;
                    }
                    Local::Done(status) => {
                        slot.status = Some(status);
                        self.break_on_local_error(i);
                    }
                }
                return;
            }
        };
        slot.opcode = match kind {
            WireKind::RdmaWrite | WireKind::RdmaWriteWithImm => WcOpcode::RdmaWrite,
            _ => WcOpcode::Send,
        };
        if broken {
            slot.status = Some(WcStatus::WrFlush);
            return;
        }
        for sge in wr.sges {
            match table.local(leases, sge, Access::NONE) {
                Ok(m) => {
                    widen(&mut self.src_span, &m);
                    slot.srcs.push(m);
                }
                Err(s) => {
                    slot.srcs.clear();
                    slot.status = Some(s);
                    self.break_on_local_error(i);
                    return;
                }
            }
        }
        slot.wire = Some(WireOp {
            seq,
            kind,
            len,
            remote_addr,
            rkey,
            imm,
            inv_rkey,
        });
        self.next_seq += 1;
    }

    /// Doubles the send ring (a post found every slot in use, fewer than `sq_cap`): the
    /// slots keep their order from `sq_head`, which becomes 0, and their source lists.
    /// Allocates only while the connection's busiest load so far is being exceeded.
    #[cold]
    fn grow_sq(&mut self) {
        let mut ring = std::mem::take(&mut self.sq);
        let n = ring.len() * 2;
        debug_assert!(
            n <= self.sq_cap.next_power_of_two(),
            "the ring outgrew its caps"
        );
        ring.rotate_left(self.sq_head);
        ring.reserve_exact(n - ring.len());
        let sge = self.caps.max_send_sge;
        ring.resize_with(n, || SqSlot::new(sge));
        self.sq = ring;
        self.sq_head = 0;
        self.sq_mask = n - 1;
    }

    fn break_on_local_error(&mut self, i: usize) {
        if self
            .slot(i)
            .status
            .is_some_and(|s| !s.is_ok() && s != WcStatus::WrFlush)
        {
            self.break_now();
        }
    }

    /// Posts receives (allowed before the connection is established, as verbs allows in
    /// the INIT and RTR states).
    ///
    /// # Errors
    /// [`PostError`] naming the first receive not accepted.
    #[inline]
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        for (index, wr) in wrs.iter().enumerate() {
            if self.state == ConnState::Disconnected {
                return Err(PostError {
                    index,
                    kind: PostErrorKind::NotConnected,
                });
            }
            if self.rq.len() >= self.caps.max_recv_wr as usize {
                return Err(PostError {
                    index,
                    kind: PostErrorKind::QueueFull,
                });
            }
            let r = self.check_recv(wr);
            self.rq.push_back(r);
        }
        Ok(())
    }

    /// A receive's lkey check, for a transport that keeps the receive queue itself (the
    /// loopback's is shared with the peer's poster): the failure, if any, is the
    /// receive's completion status once an operation consumes it.
    #[inline]
    pub fn check_recv(&mut self, wr: &RecvWr) -> PostedRecv {
        let buf = match wr.sge {
            None => Ok(None),
            Some(sge) => self
                .table
                .local(&mut self.leases, &sge, Access::LOCAL_WRITE)
                .map(Some),
        };
        PostedRecv {
            wr_id: wr.wr_id,
            buf,
        }
    }

    /// Puts a receive checked by [`SoftQp::check_recv`] at the back of this queue pair's
    /// own receive queue, for the next incoming operation (no capacity check: the
    /// transport that keeps the receive queue counts).
    pub fn stage_recv(&mut self, r: PostedRecv) {
        self.rq.push_back(r);
    }

    /// A completion generated outside this queue pair (a receive the peer's poster
    /// consumed, or flushed by the transport), queued behind the ones generated so far.
    #[inline]
    pub fn push_completion(&mut self, wc: Wc) {
        self.cq.push_back(wc);
    }

    /// The peer executed our operations before `seq` itself (the loopback does at post
    /// time): the next one expected is `seq`.
    #[inline]
    pub fn skip_to(&mut self, seq: u64) {
        if seq > self.executed + 1 {
            self.executed = seq - 1;
        }
    }

    /// Whether a receive is posted (an operation stalled on [`InboundError::NotReady`]
    /// can be retried).
    pub fn recv_ready(&self) -> bool {
        !self.rq.is_empty()
    }

    /// Whether a wire operation among the first `i` slots may still read source memory in
    /// `[range.0, range.1)`: handed to the transport or not, its bytes have not left (the
    /// transport has not said so, the peer has not acked it, it did not complete). The
    /// newest slots are looked at first: the operation a REG_MR waits for is most often
    /// the one posted just before it (a READ response's RDMA WRITE from the chunk).
    fn earlier_bytes_pending(&self, i: usize, range: (u64, u64)) -> bool {
        let (lo, hi) = range;
        if !(lo < self.src_span.1 && self.src_span.0 < hi) {
            return false;
        }
        (self.sq_left.max(self.sq_done).min(i)..i)
            .rev()
            .any(|j| self.reads_pending(self.slot(j), range))
    }

    /// Whether `s` may still read its sources: a wire operation not complete whose bytes
    /// the transport has not said have left.
    fn still_reading(&self, s: &SqSlot) -> bool {
        let gone = self.peer_acked.max(self.left_seq);
        s.status.is_none() && s.wire.is_some_and(|w| w.seq > gone)
    }

    /// Whether `s` may still read source memory in `[range.0, range.1)`.
    fn reads_pending(&self, s: &SqSlot, (lo, hi): (u64, u64)) -> bool {
        self.still_reading(s)
            && s.srcs.iter().any(|m| {
                let a = m.as_ptr() as u64;
                a < hi && lo < a + m.len() as u64
            })
    }

    /// Makes the waiting REG_MRs whose turn has come (no operation before them may still
    /// read the memory they expose), in send-queue order, stopping at the first that must
    /// go on waiting. Returns whether one was made. One walk: the bounds of the sources
    /// still pending before the slot at hand grow as it goes, and only a REG_MR whose
    /// range meets them looks back at the slots.
    fn take_binds(&mut self) -> bool {
        self.advance_left();
        let mut made = false;
        let mut pending = NO_SPAN;
        let mut i = self.sq_left.max(self.sq_done);
        while self.binds_waiting > 0 && i < self.sq_len {
            if let Some(b) = self.slot(i).bind {
                let (lo, hi) = b.range();
                if lo < pending.1 && pending.0 < hi && self.earlier_bytes_pending(i, (lo, hi)) {
                    break;
                }
                let status = match self.table.apply_bind(&b, self.qp_num) {
                    Ok(()) => WcStatus::Success,
                    Err(st) => st,
                };
                let slot = self.slot_mut(i);
                slot.bind = None;
                slot.status = Some(status);
                self.binds_waiting -= 1;
                made = true;
                if !status.is_ok() {
                    self.break_now();
                    return true;
                }
            } else if self.still_reading(self.slot(i)) {
                for m in &self.slot(i).srcs {
                    widen(&mut pending, m);
                }
            }
            i += 1;
        }
        if made {
            self.advance();
            self.advance_left();
        }
        made
    }

    /// The transport says every operation handed to it so far has taken its bytes out
    /// of their sources (the tcp fabric: its batch is written into the socket): the
    /// REG_MRs waiting behind them are made now.
    pub fn sent_left(&mut self) {
        self.left_seq = self.left_seq.max(self.sent_seq);
        self.take_binds();
    }

    /// The transport says the wire operations up to sequence number `seq` (of those
    /// handed to it) have taken their bytes out of their sources (the tcp fabric: their
    /// frames are written into the socket, which the rest of its batch may not be yet):
    /// the REG_MRs waiting on them only are made now. Called before anything else runs
    /// on the queue pair, so a peer that learns a new key from a frame written after the
    /// REG_MR finds it in effect.
    pub fn left_through(&mut self, seq: u64) {
        if seq > self.left_seq {
            self.left_seq = seq;
            if self.binds_waiting > 0 {
                self.take_binds();
            }
        }
    }

    /// The wire operations posted and not yet handed to the transport, in order. Those
    /// behind a REG_MR still waiting for the bytes before it come too: the transport
    /// writes them in order, says which have left ([`SoftQp::left_through`]) and so makes
    /// the REG_MR before any frame behind it can reach the peer whole (a peer learns a
    /// new key only from a frame written after its REG_MR).
    pub fn outbound(&self) -> impl Iterator<Item = (WireOp, &[MemRef])> + '_ {
        (self.sq_sent..self.sq_len).filter_map(move |i| {
            let s = self.slot(i);
            s.wire
                .filter(|_| s.status.is_none())
                .map(|w| (w, s.srcs.as_slice()))
        })
    }

    /// Whether posted requests wait to be handed to the transport (a cheap test before
    /// [`SoftQp::outbound`] or [`SoftQp::transmit_or_execute`] on an idle poll).
    pub fn has_outbound(&self) -> bool {
        self.sq_sent < self.sq_len
    }

    /// Hands the wire operations not yet handed over to `go`, in order, each with its
    /// source list to move out of, for a transport that may execute an operation at the
    /// peer at once (the loopback, at post time): `go` says what became of each
    /// operation (see [`Handed`]). An executed operation is complete, with no ack
    /// round (its completion reaches the CQ at the next [`SoftQp::settle`]); a refused
    /// one completes with the refusal's status and breaks the queue pair, flushing
    /// everything behind it, as a nak does.
    pub fn transmit_or_execute(&mut self, mut go: impl FnMut(&WireOp, &mut Srcs) -> Handed) {
        let mut i = self.sq_sent;
        let mut refused = false;
        while i < self.sq_len {
            if self.slot(i).bind.is_some() {
                // A REG_MR: made once the operations before it executed at the peer, and
                // nothing behind it goes before (the peer would learn its key at once).
                self.sq_sent = i;
                self.take_binds();
                if self.state == ConnState::Disconnected {
                    return;
                }
                // `take_binds` may have freed slots before it: its index moved.
                i = self.sq_sent;
                if self.slot(i).bind.is_some() {
                    return;
                }
                continue;
            }
            let s = &mut self.sq[(self.sq_head + i) & self.sq_mask];
            if let (Some(w), None) = (&s.wire, s.status) {
                let seq = w.seq;
                let handed = go(w, &mut s.srcs);
                if !matches!(handed, Handed::Stop) {
                    self.sent_seq = seq;
                }
                match handed {
                    Handed::Queued => {}
                    Handed::Executed => {
                        // The sources are let go when the slot is freed (`advance`, at
                        // the next settle): not here, where the copy's stores are still
                        // draining and the handles' atomic decrements would wait on them.
                        s.status = Some(WcStatus::Success);
                    }
                    Handed::Refused(status) => {
                        s.srcs.clear();
                        s.status = Some(status);
                        refused = true;
                        i += 1;
                        break;
                    }
                    Handed::Stop => break,
                }
            }
            i += 1;
        }
        self.sq_sent = i;
        if refused {
            self.break_now();
        } else {
            self.advance_left();
        }
    }

    /// Moves the frontier of operations whose bytes have left over those that completed
    /// (executed at the peer, or failed) and over local ones, so that a REG_MR's check
    /// ([`SoftQp::earlier_bytes_pending`]) starts after them: amortized, each slot is
    /// stepped over once.
    fn advance_left(&mut self) {
        while self.sq_left < self.sq_sent {
            let s = self.slot(self.sq_left);
            let done = s.status.is_some()
                || (s.wire.is_none() && s.bind.is_none())
                || s.wire.is_some_and(|w| w.seq <= self.left_seq);
            if !done {
                break;
            }
            self.sq_left += 1;
        }
    }

    /// The first `n` operations of [`SoftQp::outbound`] were handed over.
    pub fn mark_transmitted(&mut self, mut n: usize) {
        while n > 0 && self.sq_sent < self.sq_len {
            let s = self.slot(self.sq_sent);
            if let (Some(w), None) = (s.wire, s.status) {
                n -= 1;
                self.sent_seq = w.seq;
            }
            self.sq_sent += 1;
        }
        // Local operations right behind the last transmitted one are "sent" too (a
        // REG_MR still waiting for the bytes before it included: `left_through` makes it).
        while self.sq_sent < self.sq_len {
            if self.slot(self.sq_sent).wire.is_some() {
                break;
            }
            self.sq_sent += 1;
        }
    }

    /// The peer executed every operation up to `seq`.
    ///
    /// # Errors
    /// [`BadAck`] when `seq` is beyond the last operation handed to the transport: the
    /// peer claims to have executed what it cannot have received. Nothing is completed;
    /// the transport closes the connection.
    pub fn on_ack(&mut self, seq: u64) -> Result<(), BadAck> {
        if seq > self.sent_seq {
            return Err(BadAck {
                acked: seq,
                sent: self.sent_seq,
            });
        }
        // A repeated ack completes nothing: local completions were already moved on
        // by the post (or break) that made them.
        if seq > self.peer_acked {
            self.peer_acked = seq;
            self.advance();
            // Acked operations' bytes have left for sure.
            self.take_binds();
        }
        Ok(())
    }

    /// The peer refused operation `seq` with `status`: it completes with that status and
    /// the queue pair breaks.
    pub fn on_nak(&mut self, seq: u64, status: WcStatus) {
        // A nak beyond what was sent acknowledges nothing; the queue pair breaks anyway.
        let _ = self.on_ack(seq.saturating_sub(1));
        for i in 0..self.sq_len {
            let s = self.slot_mut(i);
            if s.status.is_none() && s.wire.is_some_and(|w| w.seq == seq) {
                s.status = Some(status);
            }
        }
        self.break_now();
    }

    /// Moves completed send requests to the CQ and frees their slots, in one walk. As on
    /// a NIC, an unsignaled request that succeeded keeps its slot until a later request
    /// of the same queue generates a completion; that completion frees everything before
    /// it. Slots before `sq_done` are known complete and generate no completion (one
    /// that did would have freed them), so the walk starts there.
    fn advance(&mut self) {
        let (acked, mask, head, qp_num) =
            (self.peer_acked, self.sq_mask, self.sq_head, self.qp_num);
        let mut done = self.sq_done;
        // Ends just after the last request that generates a completion.
        let mut free = 0;
        while done < self.sq_len {
            let s = &mut self.sq[(head + done) & mask];
            // The header by reference: only its seq is needed here.
            let status = match (s.status, &s.wire) {
                (Some(st), _) => st,
                // Acked: the peer executed it. No need to record the status: a slot
                // before `sq_done` is never looked at again except to be freed.
                (None, Some(w)) if w.seq <= acked => WcStatus::Success,
                _ => break,
            };
            done += 1;
            // Complete: its sources are needed no more (a transmitted operation's are
            // with the transport or the peer; a failed one's were never sent). Their
            // handles go back to the leases they came from, no count moved.
            self.leases.recycle_all(&mut s.srcs);
            if s.signaled || !status.is_ok() {
                self.cq.push_back(Wc {
                    wr_id: s.wr_id,
                    status,
                    opcode: s.opcode,
                    byte_len: 0,
                    imm: None,
                    invalidated_rkey: None,
                    qp_num,
                });
                free = done;
            }
        }
        self.sq_done = done - free;
        self.sq_head = (head + free) & mask;
        self.sq_len -= free;
        self.sq_sent = self.sq_sent.saturating_sub(free);
        self.sq_left = self.sq_left.saturating_sub(free);
    }

    /// Checks the next incoming operation and says where its payload goes (`None` when
    /// it carries none).
    ///
    /// # Errors
    /// [`InboundError::NotReady`] when it needs a receive and none is posted;
    /// [`InboundError::Refuse`] when the responder refuses it (the queue pair is then
    /// broken).
    pub fn inbound(&mut self, op: &WireOp) -> Result<Option<MemRef>, InboundError> {
        let (place, invalidated) = self.accept(op, Payload::Later)?;
        self.in_progress = Some(InProgress {
            seq: op.seq,
            invalidated,
        });
        Ok(place)
    }

    /// [`SoftQp::inbound`], the payload gathered from the sender's memory `srcs` (of the
    /// operation's length in all), and [`SoftQp::inbound_done`] in one step: for a
    /// transport that has the payload at hand when the operation arrives (the loopback
    /// fabric copies it from the sender's memory), so nothing is kept in between and no
    /// handle is made for the destination.
    ///
    /// # Errors
    /// As [`SoftQp::inbound`]; nothing is written then.
    ///
    /// # Panics
    /// When the sources' total length is not the operation's (a transport bug).
    #[inline]
    pub fn execute(&mut self, op: &WireOp, srcs: &[MemRef]) -> Result<(), InboundError> {
        let (place, invalidated) = self.accept(op, Payload::Gather(srcs))?;
        debug_assert!(place.is_none(), "a gathered payload was left to place");
        self.finish(op, invalidated);
        Ok(())
    }

    /// [`SoftQp::execute`] for a transport that holds the whole `payload` in a buffer of
    /// its own (the tcp fabric's staging buffer): a remote write is checked and copied at
    /// once, held by the queue pair's lease, with no [`MemRef`] made for it.
    ///
    /// # Errors
    /// As [`SoftQp::inbound`]; nothing is written then.
    pub fn execute_staged(&mut self, op: &WireOp, payload: &[u8]) -> Result<(), InboundError> {
        if payload.len() != op.len as usize {
            return Err(self.refuse(WcStatus::RemoteInvalidRequest));
        }
        let (place, invalidated) = self.accept(op, Payload::Staged(payload))?;
        debug_assert!(place.is_none(), "a staged payload was left to place");
        self.finish(op, invalidated);
        Ok(())
    }

    /// The checks of [`SoftQp::inbound`]: where the payload goes, and the rkey the
    /// operation invalidated (with `payload`, see [`respond`]).
    fn accept(
        &mut self,
        op: &WireOp,
        payload: Payload<'_>,
    ) -> Result<(Option<MemRef>, Option<u32>), InboundError> {
        if self.state == ConnState::Disconnected {
            return Err(InboundError::Refuse(WcStatus::WrFlush));
        }
        if op.seq != self.executed + 1 {
            return Err(self.refuse(WcStatus::RemoteInvalidRequest));
        }
        match respond(
            &self.table,
            &mut self.leases,
            self.qp_num,
            self.rq.front_mut(),
            op,
            payload,
        ) {
            Ok(p) => Ok((p.place, p.invalidated)),
            Err(Respond::NotReady) => Err(InboundError::NotReady),
            Err(Respond::Refuse { status, recv }) => {
                if let Some(recv_status) = recv {
                    self.complete_recv(recv_status, WcOpcode::Recv, 0, None, None);
                }
                Err(self.refuse(status))
            }
        }
    }

    fn refuse(&mut self, status: WcStatus) -> InboundError {
        self.break_now();
        InboundError::Refuse(status)
    }

    /// Takes back a handle this queue pair made and needs no more (a payload's
    /// destination placed by the transport): see [`Leases::recycle`].
    #[inline]
    pub fn recycle(&mut self, m: MemRef) {
        self.leases.recycle(m);
    }

    /// Takes back the buffer of a receive this queue pair checked ([`SoftQp::check_recv`])
    /// once it is consumed or replaced: see [`Leases::recycle`].
    #[inline]
    pub fn recycle_recv(&mut self, r: PostedRecv) {
        if let Ok(Some(b)) = r.buf {
            self.leases.recycle(b);
        }
    }

    /// The payload of the operation [`SoftQp::inbound`] placed is in memory: consume its
    /// receive and record the ack.
    ///
    /// # Panics
    /// When `op` is not the operation `inbound` accepted last (a transport bug).
    pub fn inbound_done(&mut self, op: &WireOp) {
        let p = self
            .in_progress
            .take()
            .expect("inbound_done without inbound");
        assert_eq!(p.seq, op.seq, "inbound_done for another operation");
        self.finish(op, p.invalidated);
    }

    /// The operation `accept` placed is executed: consume its receive, record the ack.
    #[inline]
    fn finish(&mut self, op: &WireOp, invalidated: Option<u32>) {
        self.executed = op.seq;
        match op.kind {
            WireKind::RdmaWrite => {}
            WireKind::RdmaWriteWithImm => self.complete_recv(
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                op.len,
                Some(op.imm),
                None,
            ),
            WireKind::SendWithImm => self.complete_recv(
                WcStatus::Success,
                WcOpcode::Recv,
                op.len,
                Some(op.imm),
                None,
            ),
            WireKind::Send | WireKind::SendWithInv => {
                self.complete_recv(WcStatus::Success, WcOpcode::Recv, op.len, None, invalidated)
            }
        }
    }

    fn complete_recv(
        &mut self,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        inv: Option<u32>,
    ) {
        if let Some(r) = self.rq.pop_front() {
            let wr_id = r.wr_id;
            self.recycle_recv(r);
            let wc = Wc {
                wr_id,
                status,
                opcode,
                byte_len,
                imm,
                invalidated_rkey: inv,
                qp_num: self.qp_num,
            };
            self.cq.push_back(wc);
        }
    }

    /// The cumulative ack owed to the peer, once per new executed operation.
    pub fn take_ack(&mut self) -> Option<u64> {
        (self.executed > self.ack_sent).then(|| {
            self.ack_sent = self.executed;
            self.executed
        })
    }

    /// Moves up to `wcs.len()` completions out.
    pub fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        let n = wcs.len().min(self.cq.len());
        for (slot, wc) in wcs.iter_mut().zip(self.cq.drain(..n)) {
            *slot = wc;
        }
        n
    }

    /// The connection broke (transport error, peer disconnect, local disconnect).
    pub fn fail(&mut self) {
        self.break_now();
    }

    /// True exactly once after the queue pair broke: tell the peer (if the break is ours)
    /// and raise `CmEvent::Disconnected`.
    pub fn take_disconnect(&mut self) -> bool {
        std::mem::take(&mut self.disconnect_pending)
    }

    fn break_now(&mut self) {
        if self.state == ConnState::Disconnected {
            return;
        }
        self.state = ConnState::Disconnected;
        self.disconnect_pending = true;
        self.leases.clear();
        self.in_progress = None;
        self.advance();
        for i in 0..self.sq_len {
            let s = self.slot_mut(i);
            s.bind = None;
            s.status.get_or_insert(WcStatus::WrFlush);
        }
        self.advance();
        // What is left succeeded unsignaled with no completion after it: it just goes.
        for i in 0..self.sq_len {
            let s = self.slot_mut(i);
            s.srcs.clear();
        }
        self.sq_len = 0;
        self.sq_done = 0;
        self.sq_sent = 0;
        self.sq_left = 0;
        self.binds_waiting = 0;
        while !self.rq.is_empty() {
            self.complete_recv(WcStatus::WrFlush, WcOpcode::Recv, 0, None, None);
        }
    }
}

#[cfg(test)]
mod tests;
