//! An end's receive queue as both ends use it, and the execution of an operation at post
//! time: what a NIC's responder does when a packet arrives, done by the sending end's
//! own `post_send` on loopback (see docs/ARCHITECTURE.md, "The loopback fabric").
//!
//! Each end's receive queue is a single-producer single-consumer ring ([`super::ring`]).
//! The producer is its owner (`post_recv`). The consumer *role* is held by exactly one
//! party at a time, handed over by the link's existing synchronisation:
//! - the **peer's poster** (the end sending to us), while its ring of frames to us is
//!   drained (it read our hand-back of the last frame with acquire) and it is inside its
//!   busy section having seen us not gone (`EndState::gone`, read after setting `busy`,
//!   both sequentially consistent);
//! - **the owner delivering a frame** (the fallback path), while it holds a frame at the
//!   front of that ring: the poster cannot see the ring drained until the owner hands
//!   the frame back with a release store, after its last use of the queue, and the
//!   poster's last use before it pushed the frame happens before the owner's acquire of
//!   it;
//! - **the owner flushing it** once it is gone and has waited for the poster's busy flag
//!   to clear (`EndState::close_and_quiesce`): a poster that set busy later sees `gone`
//!   and stays away; one that set it earlier has finished, and its release of `busy`
//!   happens before the owner's acquire;
//! - **the owner** of a connection that was never accepted (no peer ever had the
//!   queue).
//!
//! The consumer's state (its cached positions included) moves with the role, so every
//! access is ordered after the previous holder's by those happens-before edges.

use std::cell::UnsafeCell;
use std::sync::Arc;

use super::ring::{Consumer, Producer};
use crate::fabric::soft::qp::Srcs;
use crate::fabric::soft::WireOp;
use crate::fabric::soft::{
    recv_completion, recv_error, respond, Leases, MrTable, Payload, PostedRecv, Respond,
};
use crate::fabric::{Wc, WcStatus};

/// One end's receive queue, consumer side, with what a poster needs to act as that
/// end's responder: its protection domain and its queue pair's number.
pub struct RecvQueue {
    consumer: UnsafeCell<Consumer<PostedRecv>>,
    /// The responder's handles on its registered memory, used by whoever executes into
    /// this queue; they move with the consumer role.
    leases: UnsafeCell<Leases>,
    table: Arc<MrTable>,
    qp_num: u32,
}

// SAFETY: the consumer is reached only through `with_consumer`, whose callers hold the
// consumer role (module doc), so one thread at a time uses it and each holder's uses
// happen after the previous holder's; `Consumer<PostedRecv>` is `Send` (a `PostedRecv`
// holds `MemRef`s, which are), which is what moving it between threads needs; the
// leases go with the consumer, under the same role. The table is `Sync` and the number
// plain data.
unsafe impl Sync for RecvQueue {}

impl RecvQueue {
    pub fn new(consumer: Consumer<PostedRecv>, table: Arc<MrTable>, qp_num: u32) -> RecvQueue {
        RecvQueue {
            consumer: UnsafeCell::new(consumer),
            leases: UnsafeCell::new(Leases::default()),
            table,
            qp_num,
        }
    }

    /// Runs `f` on the queue's consumer.
    ///
    /// # Safety
    /// The caller holds the consumer role (see the module doc) for the whole call, and
    /// `f` does not call `with_consumer` on the same queue.
    pub unsafe fn with_consumer<R>(
        &self,
        f: impl FnOnce(&mut Consumer<PostedRecv>, &mut Leases) -> R,
    ) -> R {
        // SAFETY: the caller holds the role, so no other reference to the consumer or
        // the leases exists during this call, and `f` makes no second one.
        f(unsafe { &mut *self.consumer.get() }, unsafe {
            &mut *self.leases.get()
        })
    }
}

/// What became of an operation offered for execution at post time.
pub enum AtPost {
    /// Executed: its data is in place and the receive it consumed (if any) completed
    /// into the peer's completion ring.
    Done,
    /// Not executed, nothing changed: it needs a receive and none is posted (or the
    /// completion ring has no room); it goes the queued way, and everything behind it.
    Defer,
    /// Refused by the peer's checks: the sender's request completes with this status.
    /// A receive the refusal consumed completed with its error.
    Refused(WcStatus),
}

/// Executes `op` (with the sender's source memory `srcs`) at the peer whose receive
/// queue is `rq`, pushing the peer's receive completion into `wcs`: the checks of
/// [`respond`], the copy, the completion.
///
/// # Safety
/// The caller holds the consumer role of `rq` (module doc), is the producer of `wcs`
/// toward the same peer, and the peer's memory is not yet released: it is not gone and
/// waits for the caller's busy flag before it releases anything.
pub unsafe fn execute_at_post(
    op: &WireOp,
    srcs: &Srcs,
    rq: &RecvQueue,
    wcs: &mut Producer<Wc>,
) -> AtPost {
    // Every receive consumed completes, so room is checked before anything is consumed.
    if !wcs.has_room() {
        return AtPost::Defer;
    }
    let consumes = op.kind.consumes_recv();
    // SAFETY: the caller holds the consumer role for this call; the closure does not
    // reenter.
    unsafe {
        rq.with_consumer(|c, leases| {
            let recv = if consumes {
                match c.front() {
                    Some(r) => Some(r),
                    None => return AtPost::Defer,
                }
            } else {
                None
            };
            let wr_id = recv.as_ref().map_or(0, |r| r.wr_id);
            let (wc, outcome) = match respond(
                &rq.table,
                leases,
                rq.qp_num,
                recv,
                op,
                Payload::Gather(srcs),
            ) {
                Ok(placed) => {
                    debug_assert!(placed.place.is_none(), "a gathered payload left to place");
                    if !consumes {
                        return AtPost::Done;
                    }
                    let wc = recv_completion(op, wr_id, rq.qp_num, placed.invalidated);
                    (wc, AtPost::Done)
                }
                Err(Respond::NotReady) => return AtPost::Defer,
                Err(Respond::Refuse { status, recv: None }) => return AtPost::Refused(status),
                Err(Respond::Refuse {
                    status,
                    recv: Some(recv_status),
                }) => (
                    recv_error(wr_id, recv_status, rq.qp_num),
                    AtPost::Refused(status),
                ),
            };
            // The receive is consumed: the slot goes back to its owner with the buffer's
            // handle still in it (filled in place by `respond`; the owner gives it back
            // to its lease when it posts into the slot again, so that only the owner's
            // thread ever touches its handles:
            // docs/ARCHITECTURE.md, "Who writes what per IO"), the completion into the
            // peer's ring (room was checked above; the peer drains it on its own polls).
            c.pop();
            wcs.push_with(|slot| {
                *slot = wc;
                true
            });
            outcome
        })
    }
}
