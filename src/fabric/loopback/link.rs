//! The shared state of one loopback connection: what the two endpoints exchange.
//!
//! This is the loopback fabric's "wire". Each direction is a bounded lock-free queue of
//! [`Frame`]s (a wire operation header plus the sender's source memory), sized by the
//! sender's `max_send_wr`: every frame in flight holds a send-queue slot until the peer
//! acknowledges it, so the queue can never overflow. What flows back (the cumulative
//! ack, a refusal, "this end closed") is a few atomics per end, written only by that end.
//! The connection manager's handshake (the kernel's REQ/REP/REJ) is a small state under
//! a mutex, touched only while connecting.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use crossbeam_queue::ArrayQueue;
use smallvec::SmallVec;

use crate::fabric::soft::{MemRef, WireOp};
use crate::fabric::{PrivateData, QpCaps, WcStatus};

/// Most SGEs a loopback work request may carry: a frame holds its sources inline, so a
/// transfer never allocates.
pub const MAX_SGE: usize = 4;

/// The client end is 0, the accepting end 1.
pub const CLIENT: usize = 0;
pub const SERVER: usize = 1;

/// One operation in flight: the header and the sender's source memory, kept alive by the
/// `MemRef`s' Arcs until the receiver has copied from it.
pub struct Frame {
    pub op: WireOp,
    pub srcs: SmallVec<[MemRef; MAX_SGE]>,
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
    /// The peer's operation this end refused, and why (set once, before `closed`).
    pub nak: Mutex<Option<(u64, WcStatus)>>,
    /// This end broke or disconnected.
    pub closed: AtomicBool,
    /// Faults on this end (see `Faults`).
    pub hold: AtomicBool,
    pub hold_polls: AtomicU64,
    pub fail_posts: AtomicU64,
}

/// The two directions' queues, created when the acceptor answers (each sized by its
/// sender's caps).
pub struct Queues {
    /// `to[i]`: frames travelling to end `i`.
    pub to: [ArrayQueue<Frame>; 2],
}

/// One connection, shared by its two ends.
pub struct Link {
    /// `addrs[i]`: end `i`'s own address.
    pub addrs: [SocketAddr; 2],
    pub client_caps: QpCaps,
    pub handshake: Mutex<Handshake>,
    pub queues: OnceLock<Queues>,
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
            queues: OnceLock::new(),
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
    pub fn nak(&self) -> std::sync::MutexGuard<'_, Option<(u64, WcStatus)>> {
        self.nak.lock().unwrap_or_else(|e| e.into_inner())
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
