//! One end of a loopback connection: what the kernel's RTRS holds as an `rdma_cm_id`
//! with its RC `ib_qp` and `ib_cq` — here a soft RC queue pair driven over a [`Link`].
//!
//! Posting executes an operation at once, as a NIC's DMA does (see `super::rq`): the
//! peer's checks (rkey, bounds, access, receive length), the copy from our memory into
//! the peer's, the peer's receive consumed and its completion pushed into the ring the
//! peer drains, and our own completion, with no ack round. What cannot execute at post
//! time (no receive posted, a delivery fault on the link, or anything queued before it)
//! goes the queued way, in order, and progress in `poll_cq` and `poll_cm` moves it:
//! 1. take the receive completions the peer's posts made for us;
//! 2. read what the peer published: cumulative ack, refusal, "closed";
//! 3. hand queued operations to the peer's ring (header plus source `MemRef`s, written
//!    in place into the ring's slot);
//! 4. execute the peer's queued operations in order, in place in the ring: the soft
//!    core checks each one and says where its payload goes, and the payload is copied
//!    there straight from the sender's memory, the only copy a transfer makes; an
//!    operation that finds no receive posted stays at the ring's front until one is
//!    (RNR), and everything behind it waits;
//! 5. publish our own ack, refusal and "closed"; on a break, flush our receives once
//!    the peer is no longer posting into them.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::link::{EndState, Handshake, Link, Rings, CLIENT};
use super::ring::{ring, Producer};
use super::rq::{execute_at_post, AtPost, RecvQueue};
use crate::fabric::soft::cq::Member;
use crate::fabric::soft::{recv_error, Handed, InboundError, MrTable, PostedRecv, SoftQp};
use crate::fabric::{
    CmEvent, Conn, ConnState, PostError, PostErrorKind, PrivateData, QpCaps, RecvWr, SendOp,
    SendWr, Wc, WcStatus,
};

/// Most peer operations executed per poll, so one poll stays short.
const DELIVERY_BUDGET: usize = 64;

/// A loopback connection endpoint.
pub struct LoopbackConn {
    link: Arc<Link>,
    end: End,
    /// The client's address, handed back to the fabric's name table on drop.
    _name: Option<super::EphemeralName>,
}

/// Everything of an endpoint but the link, so its steps can borrow the link alongside.
pub(super) struct End {
    qp: SoftQp,
    /// Our receive queue: we produce, the consumer role moves (see `super::rq`).
    rq: Producer<PostedRecv>,
    own_rq: Arc<RecvQueue>,
    /// Receives posted, and retired (their completions taken into our CQ, or staged
    /// for a queued operation, or flushed): at most `max_recv_wr` apart, which bounds
    /// both the receive ring and the peer's ring of our receive completions.
    posted: u64,
    retired: u64,
    /// Which end of the link this is (`CLIENT` or `SERVER`).
    me: usize,
    events: VecDeque<CmEvent>,
    /// Our halves of the link's rings (the client's arrive with the acceptor's answer).
    rings: Option<Rings>,
    /// The client has seen the answer to its request (always true on the acceptor).
    answered: bool,
}

impl LoopbackConn {
    /// The connecting end (made by [`End::new`]), waiting for the acceptor's answer.
    pub(super) fn client(end: End, link: Arc<Link>, name: super::EphemeralName) -> LoopbackConn {
        LoopbackConn {
            link,
            end,
            _name: Some(name),
        }
    }

    /// The accepting end (made by [`End::new`]), established at once.
    pub(super) fn server(mut end: End, link: Arc<Link>, rings: Rings) -> LoopbackConn {
        end.qp.set_connected();
        end.events.push_back(CmEvent::Established {
            private_data: PrivateData::empty(),
        });
        end.rings = Some(rings);
        end.answered = true;
        LoopbackConn {
            link,
            end,
            _name: None,
        }
    }

    /// A connecting end withdraws its request, if still unanswered.
    fn withdraw(&self) {
        if self.end.me == CLIENT {
            let mut hs = self.link.handshake();
            if matches!(*hs, Handshake::Requested) {
                *hs = Handshake::ClientGone;
            }
        }
    }
}

impl End {
    /// End `me` of a new connection, with its receive queue.
    pub(super) fn new(table: Arc<MrTable>, caps: QpCaps, me: usize) -> End {
        let qp = SoftQp::new(table.clone(), caps);
        let (rq, consumer) = ring(caps.max_recv_wr as usize);
        let own_rq = Arc::new(RecvQueue::new(consumer, table, qp.qp_num()));
        End {
            qp,
            rq,
            own_rq,
            posted: 0,
            retired: 0,
            me,
            events: VecDeque::new(),
            rings: None,
            answered: false,
        }
    }

    /// Our receive queue, for the peer to execute into.
    pub(super) fn recv_queue(&self) -> Arc<RecvQueue> {
        self.own_rq.clone()
    }

    fn peer(&self) -> usize {
        1 - self.me
    }

    fn progress(&mut self, link: &Link) {
        self.check_answer(link);
        self.drain_incoming();
        self.check_broken(link);
        if self.qp.state() == ConnState::Connecting {
            return;
        }
        self.read_peer(link);
        self.transmit(link);
        // What our posts completed at once moves to the CQ, in one walk per poll.
        self.qp.settle();
        self.deliver(link);
        self.publish(link);
    }

    /// The client learns the acceptor's answer.
    fn check_answer(&mut self, link: &Link) {
        if self.answered {
            return;
        }
        let event = match &*link.handshake() {
            Handshake::Requested | Handshake::ClientGone => return,
            Handshake::Accepted { private_data } => CmEvent::Established {
                private_data: *private_data,
            },
            Handshake::Rejected { private_data } => CmEvent::Rejected {
                private_data: *private_data,
            },
            Handshake::Unreachable => CmEvent::Error {
                reason: format!(
                    "no loopback listener on {} (connection refused)",
                    link.addrs[self.peer()]
                ),
            },
        };
        self.answered = true;
        if matches!(event, CmEvent::Established { .. }) {
            // (None if a disconnect took them already.)
            if let Some(rings) = link.take_client_rings() {
                self.rings = Some(rings);
            }
            self.qp.set_connected();
        } else {
            // Posted receives flush; the failed attempt raises no Disconnected.
            self.qp.fail();
            self.qp.take_disconnect();
            // SAFETY: the connection was never accepted, so no peer ever had our receive
            // queue: the consumer role is ours (see `super::rq`).
            unsafe { self.flush_own_rq() };
        }
        self.events.push_back(event);
    }

    /// Applies an injected break.
    fn check_broken(&mut self, link: &Link) {
        if link.broken.load(Ordering::Acquire) {
            self.qp.fail();
        }
    }

    /// Step 1: the peer's ack, refusal and close, read in the reverse of the order they
    /// were written, so that a close is never seen without what preceded it.
    fn read_peer(&mut self, link: &Link) {
        if link.is_blackholed() {
            return;
        }
        let peer = &link.ends[self.peer()];
        let closed = peer.closed.load(Ordering::Acquire);
        let ack = peer.ack.load(Ordering::Acquire);
        // The peer is this process's own code: an ack beyond what was handed over is a
        // bug, and breaks the connection as a tcp peer's would.
        if ack > 0 && self.qp.on_ack(ack).is_err() {
            debug_assert!(false, "loopback ack {ack} beyond what was sent");
            self.qp.fail();
        }
        if let Some((seq, status)) = peer.take_nak() {
            self.qp.on_nak(seq, status);
        }
        if closed {
            self.qp.fail();
        }
    }

    /// Newly posted operations execute at the peer at once (see `super::rq`), or go to
    /// the peer's ring (or vanish, blackholed).
    fn transmit(&mut self, link: &Link) {
        if !self.qp.has_outbound() {
            return;
        }
        let Some(rings) = self.rings.as_mut() else {
            return;
        };
        let (mine, peer) = (&link.ends[self.me], &link.ends[1 - self.me]);
        let vanish = link.is_blackholed();
        // At post time only behind nothing queued (the peer has handed back every frame,
        // so it no longer holds our view of its receive queue and order is kept), and
        // only while the peer is there and no fault acts on the link: busy first, then
        // the checks (see `EndState::busy`).
        let mut direct = !vanish && rings.tx.is_drained();
        let _busy = direct.then(|| mine.busy_guard());
        direct = direct
            && peer.accepts_at_post()
            && !link.broken.load(Ordering::SeqCst)
            && !link.blackhole.load(Ordering::SeqCst);
        let Rings {
            tx, wc_tx, peer_rq, ..
        } = rings;
        self.qp.transmit_or_execute(|op, srcs| {
            if vanish {
                return Handed::Queued;
            }
            if direct {
                // SAFETY: our ring of frames to the peer is drained (read with acquire
                // above) and we are busy having seen the peer not gone: the consumer role
                // of its receive queue is ours (see `super::rq`); we are the only
                // producer of its completion ring; and the peer releases neither its
                // memory nor its receives before our busy flag clears.
                match unsafe { execute_at_post(op, srcs, peer_rq, wc_tx) } {
                    AtPost::Done => return Handed::Executed,
                    AtPost::Refused(status) => return Handed::Refused(status),
                    // Queued from here on, so nothing overtakes it.
                    AtPost::Defer => direct = false,
                }
            }
            // The ring holds the sender's max_send_wr frames and every frame holds a
            // send slot until acked, so it cannot be full; stop rather than lose. The
            // sources move into the frame (the slot needs them no more) by a swap with
            // the list the ring slot's last frame left, so neither list ever allocates:
            // every list of this direction was made for at least the sender's
            // max_send_sge. That list still holds the handles of the last frame's sources
            // (the receiver leaves them): they are dropped here, by the thread that took
            // them (docs/ARCHITECTURE.md, "Who writes what per IO").
            let queued = tx.push_with(|frame| {
                frame.op = *op;
                std::mem::swap(&mut frame.srcs, srcs);
                true
            });
            if queued {
                srcs.clear();
                Handed::Queued
            } else {
                Handed::Stop
            }
        });
    }

    /// Takes the receive completions the peer's posts made for us, in order.
    #[inline]
    fn drain_incoming(&mut self) {
        let Some(rings) = self.rings.as_mut() else {
            return;
        };
        while let Some(wc) = rings.wc_rx.front() {
            let wc = *wc;
            rings.wc_rx.pop();
            self.qp.push_completion(wc);
            self.retired += 1;
        }
    }

    /// Flushes the receives left in our receive queue.
    ///
    /// # Safety
    /// The caller holds the consumer role of our receive queue (see `super::rq`).
    unsafe fn flush_own_rq(&mut self) {
        let (qp, retired) = (&mut self.qp, &mut self.retired);
        let qp_num = qp.qp_num();
        // SAFETY: the caller holds the role; the closure does not reenter.
        unsafe {
            self.own_rq.with_consumer(|c, _| {
                while let Some(r) = c.front() {
                    let wc = recv_error(r.wr_id, WcStatus::WrFlush, qp_num);
                    r.buf = Ok(None);
                    c.pop();
                    qp.push_completion(wc);
                    *retired += 1;
                }
            });
        }
    }

    /// Posts receives into our receive queue (the lkey checked now, as
    /// `SoftQp::post_recv` does).
    fn post_recvs(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        let cap = u64::from(self.qp.caps().max_recv_wr);
        for (index, wr) in wrs.iter().enumerate() {
            let refuse = |kind| Err(PostError { index, kind });
            if self.qp.state() == ConnState::Disconnected {
                return refuse(PostErrorKind::NotConnected);
            }
            if self.posted - self.retired >= cap {
                // Receives the peer completed free their places once taken.
                self.drain_incoming();
                if self.posted - self.retired >= cap {
                    return refuse(PostErrorKind::QueueFull);
                }
            }
            let r = self.qp.check_recv(wr);
            // Fewer than `max_recv_wr` receives are outstanding, so the ring has room. The
            // slot still holds the receive it last carried (the peer leaves the buffer's
            // handle in it): that handle goes back to our lease, on our thread
            // (docs/ARCHITECTURE.md, "Who writes what per IO").
            let mut old = None;
            if !self.rq.push_with(|slot| {
                old = Some(std::mem::replace(slot, r));
                true
            }) {
                return refuse(PostErrorKind::QueueFull);
            }
            if let Some(old) = old {
                self.qp.recycle_recv(old);
            }
            self.posted += 1;
        }
        Ok(())
    }

    /// Executes the peer's queued operations, in order, up to the budget.
    fn deliver(&mut self, link: &Link) {
        let (mine, peer) = (&link.ends[self.me], &link.ends[self.peer()]);
        let Some(rings) = self.rings.as_mut() else {
            return;
        };
        if rings.rx.is_empty() || self.qp.state() != ConnState::Connected || mine.delivery_held() {
            return;
        }
        // Busy first, then check that the peer has not closed (see `EndState::busy`).
        let _busy = mine.busy_guard();
        if !peer.closed.load(Ordering::SeqCst)
            && !link.broken.load(Ordering::SeqCst)
            && !link.blackhole.load(Ordering::SeqCst)
        {
            // What the peer executed at post time before queueing these completes first.
            self.drain_incoming();
            self.execute(mine);
        }
    }

    fn execute(&mut self, mine: &EndState) {
        let End {
            qp,
            rings: Some(rings),
            own_rq,
            retired,
            ..
        } = self
        else {
            return;
        };
        let inbox = &mut rings.rx;
        for _ in 0..DELIVERY_BUDGET {
            let Some(frame) = inbox.front() else {
                return;
            };
            // The peer executed the operations before this one at post time.
            qp.skip_to(frame.op.seq);
            if frame.op.kind.consumes_recv() && !qp.recv_ready() {
                // SAFETY: we hold a frame at the front of the peer's ring to us, so the
                // consumer role of our receive queue is ours (see `super::rq`).
                let next = unsafe {
                    own_rq.with_consumer(|c, _| {
                        let r = c.front().map(std::mem::take);
                        c.pop();
                        r
                    })
                };
                if let Some(r) = next {
                    qp.stage_recv(r);
                    *retired += 1;
                }
            }
            // Checked, copied straight from the sender's memory, and completed in one
            // step (see `SoftQp::execute`).
            let srcs = &frame.srcs;
            match qp.execute(&frame.op, srcs) {
                Ok(()) => {
                    // The sender's memory is no longer needed; its handles go back with
                    // the slot, for the sender's thread to drop (see `transmit`).
                    inbox.pop();
                }
                // The operation stays at the front until a receive is posted.
                Err(InboundError::NotReady) => return,
                Err(InboundError::Refuse(status)) => {
                    // Gone before the frame goes back: a poster that sees its ring
                    // drained then sees us gone, and executes nothing behind the refused
                    // operation at post time.
                    mine.gone.store(true, Ordering::SeqCst);
                    mine.set_nak(frame.op.seq, status);
                    inbox.pop();
                    return;
                }
            }
        }
    }

    /// Our ack, then (after any refusal stored by `deliver`) our close; on a break, the
    /// receive completions the peer made before it saw us gone, then our receives
    /// flushed.
    #[inline]
    fn publish(&mut self, link: &Link) {
        let mine = &link.ends[self.me];
        let silent = link.is_blackholed();
        if let Some(seq) = self.qp.take_ack() {
            if !silent {
                mine.ack.store(seq, Ordering::Release);
            }
        }
        if self.qp.take_disconnect() {
            self.shut(link, silent);
        }
    }

    /// The queue pair broke: tell the peer (unless `silent`), wait until it no longer
    /// posts into us, take what it completed for us, flush our receives.
    #[cold]
    #[inline(never)]
    fn shut(&mut self, link: &Link, silent: bool) {
        let mine = &link.ends[self.me];
        mine.close_and_quiesce(&link.ends[self.peer()], !silent);
        // A client that gives up before it saw the answer may have been accepted
        // and executed into already: its completions are in the rings it has not
        // taken yet.
        if self.rings.is_none() {
            self.rings = link.take_client_rings();
        }
        self.drain_incoming();
        // SAFETY: we are gone and the peer is no longer busy, so the consumer role
        // of our receive queue is ours for good (see `super::rq`).
        unsafe { self.flush_own_rq() };
        self.events.push_back(CmEvent::Disconnected);
    }

    fn injected(&self, link: &Link) -> Result<(), PostError> {
        if link.ends[self.me].post_refused() {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::Injected,
            });
        }
        Ok(())
    }
}

impl Conn for LoopbackConn {
    /// Not a post: an injected post refusal (`Faults::fail_posts`) does not count it.
    fn local_now(&mut self, op: &SendOp<'_>) -> Option<Result<(), WcStatus>> {
        let (end, link) = (&mut self.end, &*self.link);
        end.check_broken(link);
        let done = end.qp.local_now(op);
        if matches!(done, Some(Err(_))) {
            end.publish(link);
        }
        done
    }

    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let (end, link) = (&mut self.end, &*self.link);
        end.injected(link)?;
        end.check_broken(link);
        // Completions made at post time (local operations, and operations executed at
        // the peer) move to the CQ at the next poll, in one walk for all the posts
        // between two polls.
        let result = end.qp.post_send_unsettled(wrs);
        if end.qp.state() == ConnState::Connected {
            end.transmit(link);
        }
        end.publish(link);
        result
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        let (end, link) = (&mut self.end, &*self.link);
        end.injected(link)?;
        end.check_broken(link);
        let result = end.post_recvs(wrs);
        end.publish(link);
        result
    }

    fn poll_cq(&mut self, wcs: &mut [Wc]) -> usize {
        self.end.progress(&self.link);
        self.end.qp.poll(wcs)
    }

    fn poll_cm(&mut self) -> Option<CmEvent> {
        self.end.progress(&self.link);
        self.end.events.pop_front()
    }

    fn disconnect(&mut self) {
        self.withdraw();
        self.end.qp.fail();
        self.end.publish(&self.link);
    }

    fn qp_num(&self) -> u32 {
        self.end.qp.qp_num()
    }

    fn state(&self) -> ConnState {
        self.end.qp.state()
    }

    fn caps(&self) -> QpCaps {
        self.end.qp.caps()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        Some(self.link.addrs[self.end.peer()])
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.link.addrs[self.end.me])
    }
}

impl Member for LoopbackConn {
    fn table(&self) -> &Arc<MrTable> {
        self.end.qp.table()
    }

    fn progress(&mut self) {
        self.end.progress(&self.link);
    }

    fn queued(&self) -> usize {
        self.end.qp.queued()
    }

    fn drain(&mut self, wcs: &mut [Wc]) -> usize {
        self.end.qp.poll(wcs)
    }
}

impl Drop for LoopbackConn {
    fn drop(&mut self) {
        self.withdraw();
        // Gone, and the peer no longer writing into our memory or consuming our receives
        // once the handle is gone (as on a break).
        let (mine, peer) = (
            &self.link.ends[self.end.me],
            &self.link.ends[self.end.peer()],
        );
        mine.close_and_quiesce(peer, !self.link.is_blackholed());
    }
}
