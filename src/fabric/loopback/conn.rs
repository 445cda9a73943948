//! One end of a loopback connection: what the kernel's RTRS holds as an `rdma_cm_id`
//! with its RC `ib_qp` and `ib_cq` — here a soft RC queue pair driven over a [`Link`].
//!
//! Progress happens in `poll_cq` and `poll_cm` (and posting hands new operations to the
//! link at once, so a peer polled on another thread need not wait for our next poll):
//! 1. read what the peer published: cumulative ack, refusal, "closed";
//! 2. hand newly posted operations to the peer's ring (header plus source `MemRef`s,
//!    written in place into the ring's slot);
//! 3. execute the peer's queued operations in order, in place in the ring: the soft
//!    core checks each one and says where its payload goes, and the payload is copied
//!    there straight from the sender's memory, the only copy a transfer makes; an
//!    operation that finds no receive posted stays at the ring's front until one is
//!    (RNR), and everything behind it waits;
//! 4. publish our own ack, refusal and "closed".

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::link::{EndState, Handshake, Link, Rings, CLIENT, SERVER};
use crate::fabric::soft::cq::Member;
use crate::fabric::soft::{InboundError, MrTable, SoftQp};
use crate::fabric::{
    CmEvent, Conn, ConnState, PostError, PostErrorKind, PrivateData, QpCaps, RecvWr, SendWr, Wc,
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
struct End {
    qp: SoftQp,
    /// Which end of the link this is (`CLIENT` or `SERVER`).
    me: usize,
    events: VecDeque<CmEvent>,
    /// Our halves of the link's rings (the client's arrive with the acceptor's answer).
    rings: Option<Rings>,
    /// The client has seen the answer to its request (always true on the acceptor).
    answered: bool,
}

impl LoopbackConn {
    /// The connecting end, waiting for the acceptor's answer.
    pub(super) fn client(
        table: Arc<MrTable>,
        caps: QpCaps,
        link: Arc<Link>,
        name: super::EphemeralName,
    ) -> LoopbackConn {
        let end = End {
            qp: SoftQp::new(table, caps),
            me: CLIENT,
            events: VecDeque::new(),
            rings: None,
            answered: false,
        };
        LoopbackConn {
            link,
            end,
            _name: Some(name),
        }
    }

    /// The accepting end, established at once.
    pub(super) fn server(
        table: Arc<MrTable>,
        caps: QpCaps,
        link: Arc<Link>,
        rings: Rings,
    ) -> LoopbackConn {
        let mut qp = SoftQp::new(table, caps);
        qp.set_connected();
        let mut events = VecDeque::new();
        events.push_back(CmEvent::Established {
            private_data: PrivateData::empty(),
        });
        let end = End {
            qp,
            me: SERVER,
            events,
            rings: Some(rings),
            answered: true,
        };
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
    fn peer(&self) -> usize {
        1 - self.me
    }

    fn progress(&mut self, link: &Link) {
        self.check_answer(link);
        self.check_broken(link);
        if self.qp.state() == ConnState::Connecting {
            return;
        }
        self.read_peer(link);
        self.transmit(link);
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
            self.rings = link
                .client_rings
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            self.qp.set_connected();
        } else {
            // Posted receives flush; the failed attempt raises no Disconnected.
            self.qp.fail();
            self.qp.take_disconnect();
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
        if ack > 0 {
            self.qp.on_ack(ack);
        }
        if let Some((seq, status)) = peer.take_nak() {
            self.qp.on_nak(seq, status);
        }
        if closed {
            self.qp.fail();
        }
    }

    /// Step 2: newly posted operations go to the peer's ring (or vanish, blackholed).
    fn transmit(&mut self, link: &Link) {
        if !self.qp.has_outbound() {
            return;
        }
        let Some(rings) = self.rings.as_mut() else {
            return;
        };
        let out = &mut rings.tx;
        let vanish = link.is_blackholed();
        self.qp.transmit_with(|op, srcs| {
            if vanish {
                return true;
            }
            // The ring holds the sender's max_send_wr frames and every frame holds a
            // send slot until acked, so it cannot be full; stop rather than lose. The
            // sources move into the frame (the slot needs them no more) by a swap with
            // the frame's emptied list, so neither list ever allocates: every list of
            // this direction was made for at least the sender's max_send_sge.
            out.push_with(|frame| {
                frame.op = *op;
                std::mem::swap(&mut frame.srcs, srcs);
                true
            })
        });
    }

    /// Step 3: executes the peer's operations, in order, up to the budget.
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
            self.execute(mine);
        }
    }

    fn execute(&mut self, mine: &EndState) {
        let (qp, Some(rings)) = (&mut self.qp, self.rings.as_mut()) else {
            return;
        };
        let inbox = &mut rings.rx;
        for _ in 0..DELIVERY_BUDGET {
            let Some(frame) = inbox.front() else {
                return;
            };
            // Checked, copied straight from the sender's memory, and completed in one
            // step (see `SoftQp::execute`).
            let srcs = &frame.srcs;
            match qp.execute(&frame.op, |dst| dst.gather_from(srcs)) {
                Ok(()) => {
                    // The sender's memory is no longer needed; the emptied list goes
                    // back with the slot.
                    frame.srcs.clear();
                    inbox.pop();
                }
                // The operation stays at the front until a receive is posted.
                Err(InboundError::NotReady) => return,
                Err(InboundError::Refuse(status)) => {
                    mine.set_nak(frame.op.seq, status);
                    frame.srcs.clear();
                    inbox.pop();
                    return;
                }
            }
        }
    }

    /// Step 4: our ack, then (after any refusal stored by `deliver`) our close.
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
            mine.close_and_quiesce(&link.ends[self.peer()], !silent);
            self.events.push_back(CmEvent::Disconnected);
        }
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
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let (end, link) = (&mut self.end, &*self.link);
        end.injected(link)?;
        end.check_broken(link);
        let result = end.qp.post_send(wrs);
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
        let result = end.qp.post_recv(wrs);
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
        if !self.link.is_blackholed() {
            self.link.ends[self.end.me]
                .closed
                .store(true, Ordering::Release);
        }
    }
}
