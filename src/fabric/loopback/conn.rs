//! One end of a loopback connection: a soft RC queue pair driven over a [`Link`].
//!
//! Progress happens in `poll_cq` and `poll_cm` (and posting hands new operations to the
//! link at once, so a peer polled on another thread need not wait for our next poll):
//! 1. read what the peer published: cumulative ack, refusal, "closed";
//! 2. hand newly posted operations to the peer's queue (header plus source `MemRef`s);
//! 3. execute the peer's queued operations in order: the soft core checks each one and
//!    says where its payload goes, and the payload is copied there straight from the
//!    sender's memory, the only copy a transfer makes; an operation that finds no
//!    receive posted stays here until one is (RNR), and everything behind it waits;
//! 4. publish our own ack, refusal and "closed".

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::link::{Frame, Handshake, Link, Queues, CLIENT};
use crate::fabric::soft::{InboundError, MrTable, SoftQp};
use crate::fabric::{
    CmEvent, Conn, ConnState, PostError, PostErrorKind, PrivateData, QpCaps, RecvWr, SendWr, Wc,
};

/// Most peer operations executed per poll, so one poll stays short.
const DELIVERY_BUDGET: usize = 64;

/// A loopback connection endpoint.
pub struct LoopbackConn {
    qp: SoftQp,
    link: Arc<Link>,
    /// Which end of the link this is (`CLIENT` or `SERVER`).
    me: usize,
    events: VecDeque<CmEvent>,
    /// A peer operation waiting for a receive to be posted.
    stalled: Option<Frame>,
    /// The client has seen the answer to its request (always true on the acceptor).
    answered: bool,
    /// The client's address, handed back to the fabric's name table on drop.
    _name: Option<super::EphemeralName>,
}

impl LoopbackConn {
    /// The connecting end, waiting for the acceptor's answer.
    pub(super) fn client(
        table: Arc<MrTable>,
        caps: QpCaps,
        link: Arc<Link>,
        name: super::EphemeralName,
    ) -> LoopbackConn {
        LoopbackConn {
            qp: SoftQp::new(table, caps),
            link,
            me: CLIENT,
            events: VecDeque::new(),
            stalled: None,
            answered: false,
            _name: Some(name),
        }
    }

    /// The accepting end, established at once.
    pub(super) fn server(table: Arc<MrTable>, caps: QpCaps, link: Arc<Link>) -> LoopbackConn {
        let mut qp = SoftQp::new(table, caps);
        qp.set_connected();
        let mut events = VecDeque::new();
        events.push_back(CmEvent::Established {
            private_data: PrivateData::empty(),
        });
        LoopbackConn {
            qp,
            link,
            me: super::link::SERVER,
            events,
            stalled: None,
            answered: true,
            _name: None,
        }
    }

    fn peer(&self) -> usize {
        1 - self.me
    }

    /// The client learns the acceptor's answer.
    fn check_answer(&mut self) {
        if self.answered {
            return;
        }
        let event = match &*self.link.handshake() {
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
                    self.link.addrs[self.peer()]
                ),
            },
        };
        self.answered = true;
        if matches!(event, CmEvent::Established { .. }) {
            self.qp.set_connected();
        } else {
            // Posted receives flush; the failed attempt raises no Disconnected.
            self.qp.fail();
            self.qp.take_disconnect();
        }
        self.events.push_back(event);
    }

    /// Applies an injected break.
    fn check_broken(&mut self) {
        if self.link.broken.load(Ordering::Acquire) {
            self.qp.fail();
        }
    }

    fn progress(&mut self) {
        self.check_answer();
        self.check_broken();
        if self.qp.state() == ConnState::Connecting {
            return;
        }
        let link = self.link.clone();
        if let Some(queues) = link.queues.get() {
            self.read_peer();
            self.transmit(queues);
            self.deliver(queues);
        }
        self.publish();
    }

    /// Step 1: the peer's ack, refusal and close, read in the reverse of the order they
    /// were written so that a close is never seen without what preceded it.
    fn read_peer(&mut self) {
        if self.link.is_blackholed() {
            return;
        }
        let peer = &self.link.ends[self.peer()];
        let closed = peer.closed.load(Ordering::Acquire);
        let ack = peer.ack.load(Ordering::Acquire);
        if ack > 0 {
            self.qp.on_ack(ack);
        }
        let nak = peer.nak().take();
        if let Some((seq, status)) = nak {
            self.qp.on_nak(seq, status);
        }
        if closed {
            self.qp.fail();
        }
    }

    /// Step 2: newly posted operations go to the peer's queue (or vanish, blackholed).
    fn transmit(&mut self, queues: &Queues) {
        let out = &queues.to[self.peer()];
        let vanish = self.link.is_blackholed();
        let mut moved = 0;
        for (op, srcs) in self.qp.outbound() {
            if !vanish {
                let frame = Frame {
                    op,
                    srcs: srcs.iter().cloned().collect(),
                };
                // The queue holds the sender's max_send_wr frames and every frame holds
                // a send slot until acked, so it cannot be full; stop rather than lose.
                if out.push(frame).is_err() {
                    break;
                }
            }
            moved += 1;
        }
        self.qp.mark_transmitted(moved);
    }

    /// Step 3: executes the peer's operations, in order, up to the budget.
    fn deliver(&mut self, queues: &Queues) {
        let mine = &self.link.ends[self.me];
        if self.qp.state() != ConnState::Connected
            || self.link.is_blackholed()
            || mine.delivery_held()
        {
            return;
        }
        let inbox = &queues.to[self.me];
        for _ in 0..DELIVERY_BUDGET {
            let Some(frame) = self.stalled.take().or_else(|| inbox.pop()) else {
                return;
            };
            match self.qp.inbound(&frame.op) {
                Ok(place) => {
                    if let Some(dst) = place {
                        dst.gather_from(&frame.srcs);
                    }
                    self.qp.inbound_done(&frame.op);
                }
                Err(InboundError::NotReady) => {
                    self.stalled = Some(frame);
                    return;
                }
                Err(InboundError::Refuse(status)) => {
                    *mine.nak() = Some((frame.op.seq, status));
                    return;
                }
            }
        }
    }

    /// Step 4: our ack, then (after any refusal stored by `deliver`) our close.
    fn publish(&mut self) {
        let mine = &self.link.ends[self.me];
        let silent = self.link.is_blackholed();
        if let Some(seq) = self.qp.take_ack() {
            if !silent {
                mine.ack.store(seq, Ordering::Release);
            }
        }
        if self.qp.take_disconnect() {
            if !silent {
                mine.closed.store(true, Ordering::Release);
            }
            self.events.push_back(CmEvent::Disconnected);
        }
    }

    fn injected(&self) -> Option<PostError> {
        self.link.ends[self.me].post_refused().then_some(PostError {
            index: 0,
            kind: PostErrorKind::Injected,
        })
    }
}

impl Conn for LoopbackConn {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        if let Some(e) = self.injected() {
            return Err(e);
        }
        self.check_broken();
        let result = self.qp.post_send(wrs);
        if let Some(queues) = self.link.clone().queues.get() {
            if self.qp.state() == ConnState::Connected {
                self.transmit(queues);
            }
        }
        self.publish();
        result
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        if let Some(e) = self.injected() {
            return Err(e);
        }
        self.check_broken();
        let result = self.qp.post_recv(wrs);
        self.publish();
        result
    }

    fn poll_cq(&mut self, wcs: &mut [Wc]) -> usize {
        self.progress();
        self.qp.poll(wcs)
    }

    fn poll_cm(&mut self) -> Option<CmEvent> {
        self.progress();
        self.events.pop_front()
    }

    fn disconnect(&mut self) {
        if self.me == CLIENT {
            let mut hs = self.link.handshake();
            if matches!(*hs, Handshake::Requested) {
                *hs = Handshake::ClientGone;
            }
        }
        self.qp.fail();
        self.publish();
    }

    fn state(&self) -> ConnState {
        self.qp.state()
    }

    fn caps(&self) -> QpCaps {
        self.qp.caps()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        Some(self.link.addrs[self.peer()])
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        Some(self.link.addrs[self.me])
    }
}

impl Drop for LoopbackConn {
    fn drop(&mut self) {
        if self.me == CLIENT {
            let mut hs = self.link.handshake();
            if matches!(*hs, Handshake::Requested) {
                *hs = Handshake::ClientGone;
            }
        }
        if !self.link.is_blackholed() {
            self.link.ends[self.me]
                .closed
                .store(true, Ordering::Release);
        }
    }
}
