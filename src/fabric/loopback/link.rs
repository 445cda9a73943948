//! The shared state of one loopback connection: what the two endpoints exchange.
//!
//! This is the loopback fabric's "wire". Each direction is a bounded single-producer
//! single-consumer ring of [`Frame`]s (a wire operation header plus the sender's source
//! memory), sized by the sender's `max_send_wr`: every frame in flight holds a send-queue
//! slot until the peer acknowledges it, so the ring can never overflow. What flows back (the cumulative
//! ack, a refusal, "this end closed") is a few atomics per end, written only by that end.
//! The connection manager's handshake (the kernel's REQ/REP/REJ) is a small state under
//! a mutex, touched only while connecting.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::ring::{ring, Consumer, Producer};
use crate::fabric::soft::qp::Srcs;
use crate::fabric::soft::{WireKind, WireOp};
use crate::fabric::{PrivateData, QpCaps, WcStatus};

/// Most SGEs a loopback work request may carry: every frame's source list is allocated
/// for this many when the ring is made, so a transfer never allocates.
pub const MAX_SGE: usize = 4;

/// The client end is 0, the accepting end 1.
pub const CLIENT: usize = 0;
pub const SERVER: usize = 1;

/// One operation in flight: the header and the sender's source memory, kept alive by the
/// `MemRef`s' Arcs until the receiver has copied from it. A frame lives in a ring slot:
/// the sender fills it in place and the receiver empties it in place.
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

/// One end's halves of the two rings: it writes frames to the peer and reads the
/// peer's.
pub struct Rings {
    pub tx: Producer<Frame>,
    pub rx: Consumer<Frame>,
}

/// The rings of a new connection: the client's ends and the server's (each direction
/// sized by its sender's `max_send_wr`).
pub fn rings(client_sends: usize, server_sends: usize) -> (Rings, Rings) {
    let (to_server, from_client) = ring(client_sends);
    let (to_client, from_server) = ring(server_sends);
    (
        Rings {
            tx: to_server,
            rx: from_server,
        },
        Rings {
            tx: to_client,
            rx: from_client,
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
    /// This end broke or disconnected.
    pub closed: AtomicBool,
    /// This end is executing the peer's operations (reading the peer's memory). With
    /// `closed` it forms a handshake: an end that breaks waits until the peer is not
    /// busy, and a busy end re-checks `closed` first, so once an end reports a flush its
    /// source memory is no longer read, as on a NIC.
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
    pub ends: [EndState; 2],
    /// Fault: all traffic in both directions vanishes, nobody is told.
    pub blackhole: AtomicBool,
    /// Fault: both ends break at their next call, as on a transport failure.
    pub broken: AtomicBool,
}

impl Link {
    pub fn new(client: SocketAddr, server: SocketAddr, client_caps: QpCaps) -> Link {
        Link {
            addrs: [client, server],
            client_caps,
            handshake: Mutex::new(Handshake::Requested),
            client_rings: Mutex::new(None),
            ends: [EndState::default(), EndState::default()],
            blackhole: AtomicBool::new(false),
            broken: AtomicBool::new(false),
        }
    }

    pub fn handshake(&self) -> std::sync::MutexGuard<'_, Handshake> {
        self.handshake.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn is_blackholed(&self) -> bool {
        self.blackhole.load(Ordering::Acquire)
    }
}

impl EndState {
    /// Marks this end closed and waits until `peer` no longer copies from our memory.
    pub fn close_and_quiesce(&self, peer: &EndState, tell: bool) {
        if tell {
            self.closed.store(true, Ordering::SeqCst);
        }
        while peer.busy.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }

    /// Marks this end busy until the guard drops (also on unwinding, so a panicking
    /// peer cannot leave us waiting for ever).
    pub fn busy_guard(&self) -> BusyGuard<'_> {
        self.busy.store(true, Ordering::SeqCst);
        BusyGuard(&self.busy)
    }

    /// Records the refusal of the peer's operation `seq`.
    pub fn set_nak(&self, seq: u64, status: WcStatus) {
        *self.nak.lock().unwrap_or_else(|e| e.into_inner()) = Some((seq, status));
        self.has_nak.store(true, Ordering::Release);
    }

    /// The refusal recorded by this end, once.
    pub fn take_nak(&self) -> Option<(u64, WcStatus)> {
        if !self.has_nak.load(Ordering::Acquire) {
            return None;
        }
        self.has_nak.store(false, Ordering::Release);
        self.nak.lock().unwrap_or_else(|e| e.into_inner()).take()
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
