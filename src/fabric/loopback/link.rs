//! The shared state of one loopback connection: what the two endpoints exchange.
//!
//! This is the loopback fabric's "wire". An operation normally executes at post time
//! (see [`super::rq`]): the sender consumes the peer's receive from the peer's
//! [`RecvQueue`] and pushes the peer's completion into a ring of [`Wc`]s the peer drains
//! (sized by the peer's `max_recv_wr`). The queued way, for an operation that finds no
//! receive or a fault on the link, is a bounded single-producer single-consumer ring of
//! [`Frame`]s per direction (a wire operation header plus the sender's source memory),
//! sized by the sender's `max_send_wr`: every frame in flight holds a send-queue slot
//! until the peer acknowledges it, so the ring can never overflow. What flows back (the
//! cumulative ack, a refusal, "this end closed") is a few atomics per end, written only
//! by that end.
//! The connection manager's handshake (the kernel's REQ/REP/REJ) is a small state under
//! a mutex, touched only while connecting.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::ring::{ring, Consumer, Producer};
use super::rq::RecvQueue;
use crate::fabric::soft::qp::Srcs;
use crate::fabric::soft::{WireKind, WireOp};
use crate::fabric::{PrivateData, QpCaps, Wc, WcStatus};
use crate::sync::{lock, membarrier};

/// Most SGEs a loopback work request may carry: every frame's source list is allocated
/// for this many when the ring is made, so a transfer never allocates.
pub const MAX_SGE: usize = 4;

/// The client end is 0, the accepting end 1.
pub const CLIENT: usize = 0;
pub const SERVER: usize = 1;

/// One operation in flight: the header and the sender's source memory, kept alive by the
/// `MemRef`s' handles until the receiver has copied from it. A frame lives in a ring
/// slot: the sender fills it in place, the receiver executes it in place and hands the
/// slot back with the handles still in it, and the sender drops them when it fills the
/// slot again (a handle's count is written by its own queue pair's thread only).
pub struct Frame {
    pub op: WireOp,
    pub srcs: Srcs,
}

impl Default for Frame {
    fn default() -> Frame {
        Frame {
            op: WireOp {
                seq: 0,
                kind: WireKind::Send,
                len: 0,
                remote_addr: 0,
                rkey: 0,
                imm: 0,
                inv_rkey: 0,
            },
            srcs: Srcs::with_capacity(MAX_SGE),
        }
    }
}

/// One end's halves of the link's rings: it writes frames and the peer's receive
/// completions to the peer, reads the peer's frames and its own receive completions,
/// and consumes the peer's receives when it executes at post time.
pub struct Rings {
    pub tx: Producer<Frame>,
    pub rx: Consumer<Frame>,
    pub wc_tx: Producer<Wc>,
    pub wc_rx: Consumer<Wc>,
    pub peer_rq: Arc<RecvQueue>,
}

/// The rings of a new connection: the client's ends and the server's. Frames in each
/// direction are bounded by the sender's `max_send_wr`, receive completions by the
/// receiver's `max_recv_wr` (an end lets no more receives be posted than it has
/// drained completions for, see `End::post_recvs`).
pub fn rings(client: (QpCaps, Arc<RecvQueue>), server: (QpCaps, Arc<RecvQueue>)) -> (Rings, Rings) {
    let (to_server, from_client) = ring(client.0.max_send_wr as usize);
    let (to_client, from_server) = ring(server.0.max_send_wr as usize);
    let (wc_to_server, wc_at_server) = ring(server.0.max_recv_wr as usize);
    let (wc_to_client, wc_at_client) = ring(client.0.max_recv_wr as usize);
    (
        Rings {
            tx: to_server,
            rx: from_server,
            wc_tx: wc_to_server,
            wc_rx: wc_at_client,
            peer_rq: server.1,
        },
        Rings {
            tx: to_client,
            rx: from_client,
            wc_tx: wc_to_client,
            wc_rx: wc_at_server,
            peer_rq: client.1,
        },
    )
}

/// Where the handshake is.
pub enum Handshake {
    /// The request waits in the listener's queue or in the acceptor's hands.
    Requested,
    Accepted {
        private_data: PrivateData,
    },
    Rejected {
        private_data: PrivateData,
    },
    /// The connecting end went away before an answer.
    ClientGone,
    /// Nobody listens on the address (the loopback "connection refused").
    Unreachable,
}

/// What one end publishes to the other (written only by that end).
#[derive(Default)]
pub struct EndState {
    /// Cumulative ack: every operation of the peer up to this seq has been executed.
    pub ack: AtomicU64,
    /// The peer's operation this end refused, and why (set once, before `closed`);
    /// `has_nak` spares the reader a lock on every poll.
    nak: Mutex<Option<(u64, WcStatus)>>,
    has_nak: AtomicBool,
    /// This end broke or disconnected (what the peer is told; not under a blackhole).
    pub closed: AtomicBool,
    /// This end broke, disconnected or went away, told or not: the peer no longer
    /// executes at post time into it (see `super::rq`). Set before `closed`.
    pub gone: AtomicBool,
    /// This end is executing operations between the two ends: the peer's queued ones
    /// (reading the peer's memory) or its own at post time (writing the peer's memory
    /// and consuming the peer's receives). With `closed` and `gone` it forms a
    /// handshake: an end that breaks waits until the peer is not busy, and a busy end
    /// re-checks them first, so once an end reports a flush its memory and its receive
    /// queue are no longer touched by the peer, as on a NIC.
    pub busy: AtomicBool,
    /// Faults on this end (see `Faults`).
    pub hold: AtomicBool,
    pub hold_polls: AtomicU64,
    pub fail_posts: AtomicU64,
}

/// See [`EndState::busy_guard`].
pub struct BusyGuard<'a>(&'a AtomicBool);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// One connection, shared by its two ends.
pub struct Link {
    /// `addrs[i]`: end `i`'s own address.
    pub addrs: [SocketAddr; 2],
    pub client_caps: QpCaps,
    pub handshake: Mutex<Handshake>,
    /// The client's [`Rings`], left here by the acceptor for the client to take when
    /// it learns the answer.
    pub client_rings: Mutex<Option<Rings>>,
    /// The client's receive queue, for the acceptor's end to execute into.
    pub client_rq: Arc<RecvQueue>,
    pub ends: [EndState; 2],
    /// Fault: all traffic in both directions vanishes, nobody is told.
    pub blackhole: AtomicBool,
    /// Fault: both ends break at their next call, as on a transport failure.
    pub broken: AtomicBool,
}

impl Link {
    pub fn new(
        client: SocketAddr,
        server: SocketAddr,
        client_caps: QpCaps,
        client_rq: Arc<RecvQueue>,
    ) -> Link {
        Link {
            addrs: [client, server],
            client_caps,
            handshake: Mutex::new(Handshake::Requested),
            client_rings: Mutex::new(None),
            client_rq,
            ends: [EndState::default(), EndState::default()],
            blackhole: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }
    }

    pub fn handshake(&self) -> std::sync::MutexGuard<'_, Handshake> {
        lock(&self.handshake)
    }

    /// The client's rings, once the acceptor left them (the client takes them once).
    pub fn take_client_rings(&self) -> Option<Rings> {
        lock(&self.client_rings).take()
    }

    pub fn is_blackholed(&self) -> bool {
        self.blackhole.load(Ordering::Acquire)
    }
}

impl EndState {
    /// Marks this end gone (and closed, if `tell`) and waits until `peer` no longer
    /// copies from our memory, writes into it or consumes our receives.
    pub fn close_and_quiesce(&self, peer: &EndState, tell: bool) {
        self.gone.store(true, Ordering::SeqCst);
        if tell {
            self.closed.store(true, Ordering::SeqCst);
        }
        // The rare side of the handshake: a peer that marked itself busy before this
        // barrier is seen busy below, one after it sees us gone (`sync::membarrier`).
        membarrier::heavy();
        while peer.busy.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }

    /// Whether the peer may execute into this end at post time: not gone, and no
    /// delivery fault set (a held end's operations queue up, as they did before).
    /// Read by the poster inside its busy section (`gone` after `busy`, see `busy`).
    pub fn accepts_at_post(&self) -> bool {
        !self.gone.load(Ordering::SeqCst)
            && !self.hold.load(Ordering::Acquire)
            && self.hold_polls.load(Ordering::Acquire) == 0
    }

    /// Marks this end busy until the guard drops (also on unwinding, so a panicking
    /// peer cannot leave us waiting for ever).
    pub fn busy_guard(&self) -> BusyGuard<'_> {
        self.busy.store(true, Ordering::Relaxed);
        // The hot side of the handshake, once per post: no locked instruction where the
        // kernel has the expedited barrier (`sync::membarrier`, `close_and_quiesce`).
        membarrier::light();
        BusyGuard(&self.busy)
    }

    /// Records the refusal of the peer's operation `seq`.
    pub fn set_nak(&self, seq: u64, status: WcStatus) {
        *lock(&self.nak) = Some((seq, status));
        self.has_nak.store(true, Ordering::Release);
    }

    /// The refusal recorded by this end, once.
    pub fn take_nak(&self) -> Option<(u64, WcStatus)> {
        if !self.has_nak.load(Ordering::Acquire) {
            return None;
        }
        self.has_nak.store(false, Ordering::Release);
        lock(&self.nak).take()
    }

    /// Whether delivery to this end is held for this poll (counting the poll).
    pub fn delivery_held(&self) -> bool {
        if self.hold.load(Ordering::Acquire) {
            return true;
        }
        self.hold_polls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Whether this post is refused by injection (counting it).
    pub fn post_refused(&self) -> bool {
        self.fail_posts
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }
}
