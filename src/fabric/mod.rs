//! The fabric: the subset of RDMA verbs that RTRS uses, as a trait every backend meets.
//!
//! RTRS (like the kernel's `rtrs.c`) needs reliable-connected queue pairs, memory
//! registration with remote keys, fast re-registration and invalidation of those keys,
//! one-sided RDMA WRITE (with and without immediate data), two-sided SEND, and a
//! connection manager that carries 56 bytes of private data on REQ, REP and REJ.
//! Nothing here knows about RTRS; nothing in RTRS knows which backend it runs on.
//!
//! # The contract every backend meets
//!
//! The conformance suite (`tests/conformance/`, instantiated by one
//! `tests/fabric/conformance_<backend>.rs` per backend, `tests/fabric_verbs.rs` for verbs)
//! checks each point below against every backend, unchanged.
//!
//! **Memory.** [`Fabric::register`] registers memory and returns an [`Mr`] with an lkey
//! and an rkey. Addresses are virtual addresses of the registering process: an
//! [`Sge`] names local memory as `(addr, len, lkey)`, a remote operation names peer
//! memory as `(remote_addr, rkey)`. A backend checks every local SGE against its lkey
//! (a violation completes that work request with [`WcStatus::LocalProtection`]) and
//! every incoming remote access against its own registrations: rkey known and valid,
//! the access right granted, `[addr, addr+len)` inside the region. A violation
//! completes the sender's work request with [`WcStatus::RemoteAccess`] and breaks the
//! connection on both sides. Zero-length remote writes check no key.
//!
//! **Fast registration.** A [`FastMr`] is a key slot with no memory of its own, of one of
//! two [`KeyScope`]s chosen at [`Fabric::alloc_fast_mr`]. Posting [`SendOp::RegMr`] binds
//! it to a range of a registered [`Mr`] with the given access and the given new rkey
//! (callers pass [`inc_rkey`] of the slot's current rkey, as the kernel's `ib_inc_rkey`).
//! A bound slot must be invalidated before it is bound again (binding a bound slot
//! completes with [`WcStatus::LocalQpOperation`]). The binding takes effect in send-queue
//! order: operations posted after it on the same connection, and every peer operation
//! that learned the key from one of them, see it. [`SendOp::LocalInv`] retires a slot's
//! current rkey; later accesses with it are remote-access errors. The scopes:
//! - [`KeyScope::Domain`]: the key is valid on every connection of the fabric (the
//!   protection domain), whichever connection posted the binding, as a kernel
//!   fast-registration MR's is. A peer cannot retire it: only [`SendOp::LocalInv`] can.
//!   RTRS's server chunk keys, which the client uses on whichever connection its core
//!   owns.
//! - [`KeyScope::Connection`]: the key is valid on the connection that posted the binding
//!   (a backend may accept it on others of the domain too), and an incoming
//!   [`SendOp::SendWithInv`] on that connection retires it. RTRS's client READ keys,
//!   which the server writes and invalidates on the connection the request came on.
//!
//! Over verbs a `Domain` slot is a type-1 memory window and a `Connection` slot a type-2
//! window (userspace verbs has no REG_MR work request, and neither window type has both
//! properties); the peer only ever sees rkeys, so the wire is the same as the kernel's.
//! A slot keeps the memory it was last bound over registered while it lives, so a region
//! is never deregistered under a binding. Where [`FabricCaps::local_ops_at_post`] says so
//! (the software fabrics), a posted LOCAL_INV or REG_MR has taken effect when `post_send`
//! returns, before its completion is polled. See `docs/ARCHITECTURE.md`, "Chunk keys on
//! verbs".
//!
//! **Work requests.** [`Conn::post_send`] takes a chain: all of it is accepted or, on the
//! first bad request, nothing from that one on ([`PostError::index`] says which). A send
//! work request occupies a send-queue slot from posting until a completion is generated
//! for it or for a later request on the same connection; with the queue full a post fails
//! with [`PostErrorKind::QueueFull`] (verbs' `ENOMEM`) and the caller retries after
//! polling. Unsignaled requests generate no completion when they succeed, so a caller
//! must signal at least every `max_send_wr`-th request (RTRS signals every
//! `signal_interval`-th). Receives ([`Conn::post_recv`]) have no buffer (for
//! RDMA_WRITE_WITH_IMM and data-less SEND_WITH_INV) or one small buffer.
//!
//! **Completions.** [`Conn::poll_cq`] fills a caller-owned slice with [`Wc`]s and returns
//! how many; it never blocks and never allocates. On the software fabrics it is also
//! where the connection makes progress (socket reads and writes, delivery), so a
//! connection that nobody polls makes none. A receive completion reports the opcode
//! ([`WcOpcode::Recv`] or [`WcOpcode::RecvRdmaWithImm`]), `byte_len` (bytes received, or
//! bytes written by an RDMA_WRITE_WITH_IMM), the immediate data in host order, and the
//! rkey invalidated by a SEND_WITH_INV. Every completion carries its connection's
//! [`Conn::qp_num`] in [`Wc::qp_num`].
//!
//! **Shared completion queues.** [`Fabric::create_cq`] makes a [`Cq`] with a number of
//! entries; [`ConnectOptions::on`] and [`ConnRequest::accept_into`] make a connection on
//! it. Its completions then come out of [`Cq::poll`] (never out of [`Conn::poll_cq`],
//! which on such a connection only makes progress), tagged with its `qp_num`; on the
//! software fabrics that one poll drives every connection of the CQ. A connection made
//! without a CQ has a private one, polled through [`Conn::poll_cq`], as before.
//! On a shared CQ:
//! - completions of one connection come out in their order, as on a private CQ;
//! - one connection breaking flushes its own work (its `qp_num` on the flush
//!   completions) and nobody else's: the other connections go on;
//! - no connection is starved: a connection with a stream of completions does not hold
//!   back another's (verbs' CQ is first in, first out; the software CQs take their
//!   connections in turn);
//! - more completions outstanding (generated and not yet polled) than the CQ has entries
//!   is an overrun, reported as verbs reports `IBV_EVENT_CQ_ERR`: [`Cq::poll_event`]
//!   yields [`CqEvent::Overrun`] once, every connection of the CQ breaks (its peer sees
//!   `Disconnected`), and no connection can be added to it. The software fabrics count
//!   completions held by the CQ's connections after each poll's progress; they lose
//!   none, where verbs may.
//!
//! A CQ is polled by whoever holds it (`&mut`; it is `Send`, not `Sync`); connections
//! are made on it through a [`CqRef`] ([`Cq::share`]) from any thread, and each
//! connection is used by one thread at a time; peers may be on other threads. A
//! connection belongs to the thread that made it; to serve it on the thread that polls
//! its CQ (as RTRS makes connections on a control thread and serves them on a core), the
//! maker calls [`Conn::release_thread`] and hands it over, and the first thread to post
//! to it or poll it (a [`Conn::poll_cq`] with no room will do) then holds it. A CQ
//! drives and reports only the connections held by the thread polling it, so a
//! connection's completions come out once that thread has taken it (where maker and
//! poller are one thread, at once: possibly before the poller's code has been handed
//! the connection).
//! On the software fabrics this is checked ([`cq::OwnedByThread`]: a plain load per
//! call, no lock; another thread is refused with [`PostErrorKind::WrongThread`]). See
//! `docs/ARCHITECTURE.md`, "Completion queues".
//!
//! **Ordering.** As on an RC queue pair: operations from one connection reach the peer in
//! posting order, and the data of an RDMA WRITE is in place before the peer sees the
//! completion of any later operation (for example the immediate of a response).
//! Completions of one connection come out in the order the work completed.
//!
//! **Receive not ready.** A SEND or RDMA_WRITE_WITH_IMM arriving when the peer has no
//! receive posted waits until one is posted (RTRS connects with `rnr_retry_count = 7`,
//! which retries for ever); nothing is dropped and later operations wait behind it.
//!
//! **Errors and disconnect.** After a connection breaks (error, peer gone, or
//! [`Conn::disconnect`]) every receive still posted and every send request not yet
//! completed comes out of [`Conn::poll_cq`] with [`WcStatus::WrFlush`], and further posts
//! fail with [`PostErrorKind::NotConnected`]. Both sides see [`CmEvent::Disconnected`].
//!
//! **Connection manager.** [`Fabric::connect`] returns at once with a connection whose
//! [`Conn::poll_cm`] later yields [`CmEvent::Established`] with the acceptor's private
//! data, [`CmEvent::Rejected`] with the rejector's, or [`CmEvent::Error`]. A
//! [`Listener`] yields [`ConnRequest`]s carrying the initiator's private data; the
//! acceptor answers with [`ConnRequest::accept`] or [`ConnRequest::reject`], each with up
//! to [`PRIVATE_DATA_LEN`] bytes. An accepted connection also yields `Established`.
//! A listener bounds the connections it holds before their request is complete
//! ([`ListenOptions::admission`], [`admission`]): a deadline, and caps per source and in total
//! under which a newcomer is always admitted.
//! Private data arrives zero-padded to the length the transport carries, never shorter
//! than what was sent.
//!
//! **Authentication** (optional). [`ListenOptions::psk`] and [`ConnectOptions::psk`]
//! take a pre-shared key ([`Psk`]); a connection between a listener and an initiator
//! that hold the same key is established as usual, any other combination (different
//! keys, a key on one side only) ends in [`CmEvent::AuthFailed`] on the initiator and
//! never reaches the listener's application. A backend that cannot authenticate refuses
//! a key with [`FabricError::AuthUnsupported`] (only `tcp` can).
//!
//! **Threads.** A connection is polled and posted to by one thread at a time (it is
//! `Send`, not `Sync`), on a shared CQ the thread that holds the CQ; registrations
//! ([`Mr`], [`FastMr`]) may be used from any thread. Peers may live on different threads.

pub mod admission;
pub mod cq;
mod error;
pub mod mem;
pub mod psk;
pub(crate) mod soft;

pub mod loopback;
pub mod tcp;
pub mod verbs;

use std::fmt;
use std::net::SocketAddr;

pub use admission::Admission;
pub use cq::{Cq, CqBackend, CqEvent, CqRef};
pub use error::{CapsError, FabricError, PostError, PostErrorKind, SetupCause};
pub use mem::{FastMr, MemBuf, Mr};
pub use psk::{Psk, PskError};

/// Largest private data carried on a connect request, accept or reject (as RDMA CM over
/// InfiniBand: 56 bytes; RTRS's conn_req and conn_rsp are exactly this long).
pub const PRIVATE_DATA_LEN: usize = 56;

/// The next rkey of a fast-registration slot: the low 8 bits (the "key" part) advance,
/// the index bits stay. The kernel's `ib_inc_rkey`.
#[inline]
pub fn inc_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | (rkey.wrapping_add(1) & 0xff)
}

/// A new rkey for a fast-registration slot whose key is `rkey`: the index bits stay, the
/// key byte changes to another one at random, so that a peer that saw one key cannot
/// tell the next. What the project's RTRS binds with (`inc_rkey` is the kernel's
/// predictable choice; both are valid on the wire).
#[inline]
pub fn next_rkey(rkey: u32) -> u32 {
    (rkey & 0xffff_ff00) | u32::from(soft::random_key_byte(rkey as u8))
}

/// Where a fast-registration slot's key is valid and who may retire it (see the module
/// doc, "Fast registration").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyScope {
    /// Every connection of the fabric; retired only by the owner's LOCAL_INV.
    Domain,
    /// The connection that posted the binding; the peer's SEND_WITH_INV retires it too.
    Connection,
}

/// Access rights of a registration, as verbs' `IBV_ACCESS_*`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No remote access; the memory may still be read locally as a send source.
    pub const NONE: Access = Access(0);
    /// The HCA may write the memory locally (receive buffers, RDMA READ targets).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE into the memory. Verbs requires `LOCAL_WRITE` with it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA READ the memory (RTRS never issues reads; kept for completeness).
    pub const REMOTE_READ: Access = Access(4);

    /// The raw bits, as `IBV_ACCESS_*` values.
    pub const fn bits(self) -> u32 {
        self.0
    }
    /// The rights among `bits` (`IBV_ACCESS_*` values; others are ignored).
    pub const fn from_bits(bits: u32) -> Access {
        Access(bits & (Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0 | Access::REMOTE_READ.0))
    }
    /// Whether every right in `other` is granted here.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
    /// Both sets of rights.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if self.contains(Access::LOCAL_WRITE) {
            parts.push("LOCAL_WRITE");
        }
        if self.contains(Access::REMOTE_WRITE) {
            parts.push("REMOTE_WRITE");
        }
        if self.contains(Access::REMOTE_READ) {
            parts.push("REMOTE_READ");
        }
        if parts.is_empty() {
            parts.push("NONE");
        }
        write!(f, "{}", parts.join("|"))
    }
}

/// A scatter/gather element naming local registered memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Sge {
    /// Virtual address inside the registration named by `lkey`.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the registration ([`Mr::lkey`]).
    pub lkey: u32,
}

/// What a send work request does.
#[derive(Clone, Copy, Debug)]
pub enum SendOp<'a> {
    /// Two-sided send of the SGEs' bytes into the peer's next receive.
    Send,
    /// Send with 32 bits of immediate data (host order) reported in the peer's completion.
    SendWithImm { imm: u32 },
    /// Send that also invalidates `rkey` in the peer's registrations (remote invalidation).
    SendWithInv { rkey: u32 },
    /// One-sided write of the SGEs' bytes to peer memory; the peer sees no completion.
    RdmaWrite { remote_addr: u64, rkey: u32 },
    /// One-sided write that also consumes a peer receive and reports `imm` (host order)
    /// there. With no SGEs it writes nothing and `remote_addr`/`rkey` are ignored.
    RdmaWriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    /// Fast registration: bind `slot` to `[addr, addr+len)` of `region` with `access`
    /// and the new key `rkey` (normally `inc_rkey(slot.rkey())`).
    RegMr {
        slot: &'a FastMr,
        region: &'a Mr,
        addr: u64,
        len: u32,
        access: Access,
        rkey: u32,
    },
    /// Retire `slot`'s current rkey locally. The slot must be bound (a binding posted
    /// and not yet retired); invalidating an unbound slot is a local error where the
    /// backend can tell, and undefined on some devices.
    LocalInv { slot: &'a FastMr },
}

/// A send work request: one element of a chain given to [`Conn::post_send`].
#[derive(Clone, Copy, Debug)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    pub op: SendOp<'a>,
    /// Local memory to send or write. Must be empty for `RegMr` and `LocalInv`.
    pub sges: &'a [Sge],
    /// Generate a completion on success (failures always generate one).
    pub signaled: bool,
}

impl SendOp<'_> {
    /// An RDMA_WRITE_WITH_IMM with no data: the peer sees only `imm`.
    #[inline]
    pub fn imm_only(imm: u32) -> SendOp<'static> {
        SendOp::RdmaWriteWithImm {
            remote_addr: 0,
            rkey: 0,
            imm,
        }
    }
}

impl SendWr<'_> {
    /// An unsignaled RDMA_WRITE_WITH_IMM with no data: the peer sees only `imm`.
    #[inline]
    pub fn imm_only(wr_id: u64, imm: u32) -> SendWr<'static> {
        SendWr {
            wr_id,
            op: SendOp::imm_only(imm),
            sges: &[],
            signaled: false,
        }
    }
}

/// A receive work request: no buffer, or one small buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sge: Option<Sge>,
}

/// Completion status, as verbs' `ibv_wc_status` (the subset RTRS can see).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WcStatus {
    #[default]
    Success,
    /// An incoming message was longer than the receive buffer.
    LocalLength,
    /// A local SGE was outside its registration or named an unknown lkey.
    LocalProtection,
    /// A local operation failed (for example a bind of a range outside its region).
    LocalQpOperation,
    /// The peer refused the access: unknown or retired rkey, missing right, out of bounds.
    RemoteAccess,
    /// The peer could not execute the request (for example invalidating an unknown key).
    RemoteInvalidRequest,
    /// The connection broke before the request completed.
    WrFlush,
    /// The transport failed (peer unreachable, connection reset).
    Transport,
}

impl WcStatus {
    pub fn is_ok(self) -> bool {
        self == WcStatus::Success
    }
}

/// What completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WcOpcode {
    #[default]
    Send,
    RdmaWrite,
    RegMr,
    LocalInv,
    /// A receive consumed by a SEND (with or without imm or invalidate).
    Recv,
    /// A receive consumed by an RDMA_WRITE_WITH_IMM.
    RecvRdmaWithImm,
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Wc {
    pub wr_id: u64,
    pub status: WcStatus,
    pub opcode: WcOpcode,
    /// Receives: bytes received, or bytes written by an RDMA_WRITE_WITH_IMM.
    pub byte_len: u32,
    /// Immediate data, host order.
    pub imm: Option<u32>,
    /// The local rkey a SEND_WITH_INV invalidated.
    pub invalidated_rkey: Option<u32>,
    /// The connection the work request was posted on ([`Conn::qp_num`]), as verbs'
    /// `ibv_wc::qp_num`: tells connections apart on a shared [`Cq`].
    pub qp_num: u32,
}

/// Queue sizes of a connection (as `ibv_qp_cap` plus the CQ size derived from them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
}

impl QpCaps {
    /// Checks the sizes against a fabric's or device's `limits` (`whose` names them in
    /// the error): at least one send WR, and nothing beyond a limit; the error names the
    /// field. Every fabric checks a new queue pair with this one rule.
    ///
    /// # Errors
    /// [`CapsError::Field`] naming the first field out of range.
    pub fn check_within(&self, limits: &FabricCaps, whose: &'static str) -> Result<(), CapsError> {
        let fields = [
            ("max_send_wr", self.max_send_wr, limits.max_send_wr, 1),
            ("max_recv_wr", self.max_recv_wr, limits.max_recv_wr, 0),
            ("max_send_sge", self.max_send_sge, limits.max_send_sge, 0),
        ];
        for (field, asked, max, min) in fields {
            if asked < min || asked > max {
                return Err(CapsError::Field {
                    field,
                    asked,
                    min,
                    max,
                    whose,
                });
            }
        }
        Ok(())
    }
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 1024,
            max_recv_wr: 1024,
            max_send_sge: 2,
        }
    }
}

/// Private data of a CM exchange: up to [`PRIVATE_DATA_LEN`] bytes, inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PrivateData {
    bytes: [u8; PRIVATE_DATA_LEN],
    len: u8,
}

impl PrivateData {
    /// Copies `data`; fails with its length when it is longer than [`PRIVATE_DATA_LEN`].
    pub fn new(data: &[u8]) -> Result<PrivateData, FabricError> {
        if data.len() > PRIVATE_DATA_LEN {
            return Err(FabricError::PrivateDataTooLong { len: data.len() });
        }
        let mut bytes = [0u8; PRIVATE_DATA_LEN];
        bytes[..data.len()].copy_from_slice(data);
        Ok(PrivateData {
            bytes,
            len: data.len() as u8,
        })
    }

    pub fn empty() -> PrivateData {
        PrivateData {
            bytes: [0; PRIVATE_DATA_LEN],
            len: 0,
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateData({} bytes)", self.len)
    }
}

/// A connection-manager event of one connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmEvent {
    /// The connection is up; carries the acceptor's private data (empty on the acceptor).
    Established { private_data: PrivateData },
    /// The acceptor refused; carries its private data (RTRS puts a conn_rsp with the
    /// errno there; the kernel reads it only when the length is right).
    Rejected { private_data: PrivateData },
    /// The connection went away: peer disconnect, local disconnect, or a transport error
    /// after establishment.
    Disconnected,
    /// Establishment failed (address unreachable, refused, timed out).
    Error { reason: String },
    /// Establishment failed because the peers did not authenticate each other (a
    /// different key, a key on one side only). Retrying with the same keys fails the
    /// same way. The reason says "authentication failed" and nothing of what was wrong.
    AuthFailed { reason: String },
}

/// State of a connection as the connection manager sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnState {
    Connecting,
    Connected,
    /// Broken or disconnected; outstanding work flushes.
    Disconnected,
}

/// Which backend a fabric is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FabricKind {
    Loopback,
    Tcp,
    Verbs,
}

impl fmt::Display for FabricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FabricKind::Loopback => "loopback",
            FabricKind::Tcp => "tcp",
            FabricKind::Verbs => "verbs",
        })
    }
}

/// Limits of a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FabricCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    /// Largest length one registration or one fast-registration binding may cover.
    pub max_mr_size: u64,
    /// Local operations take effect within the post: when [`Conn::post_send`] returns
    /// `Ok`, a posted [`SendOp::LocalInv`] has already retired its key (remote accesses
    /// through it fail from then on) and a [`SendOp::RegMr`] has already bound its slot.
    /// One that fails still completes with its error status and breaks the connection,
    /// as everywhere. True on the software fabrics, which execute them at post time;
    /// false on verbs, where the NIC executes them in send-queue order and only their
    /// completion says they are done.
    pub local_ops_at_post: bool,
    /// Entries of a CQ that the connections of one core share ([`Fabric::create_cq`]):
    /// on verbs 65,536, or the device's `max_cqe` where that is lower (Soft-RoCE's is
    /// 32,768), since each entry is memory the device keeps; on the software fabrics
    /// their largest CQ, whose entries cost nothing until used.
    pub core_cq_entries: u32,
}

/// How [`Fabric::listen`] listens.
#[derive(Clone, Default)]
pub struct ListenOptions {
    /// Limits on connections still in their handshake.
    pub admission: Admission,
    /// The key every initiator must prove (none: no authentication).
    pub psk: Option<Psk>,
}

impl ListenOptions {
    /// The default limits, requiring `psk` when there is one.
    pub fn with_psk(psk: Option<Psk>) -> ListenOptions {
        ListenOptions {
            psk,
            ..ListenOptions::default()
        }
    }

    /// What a backend with no handshake state and no authentication does with the
    /// options: checks the limits and refuses a key.
    ///
    /// # Errors
    /// [`FabricError::Listen`] for limits out of range; [`FabricError::AuthUnsupported`]
    /// with a key.
    pub fn check_plain(&self, addr: SocketAddr, kind: FabricKind) -> Result<(), FabricError> {
        self.admission.validate().map_err(|e| FabricError::Listen {
            addr,
            cause: e.into(),
        })?;
        match self.psk {
            None => Ok(()),
            Some(_) => Err(FabricError::AuthUnsupported { kind }),
        }
    }
}

impl std::fmt::Debug for ListenOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListenOptions")
            .field("admission", &self.admission)
            .field("psk", &self.psk.is_some())
            .finish()
    }
}

/// How [`Fabric::connect`] connects: built with [`ConnectOptions::new`] and the
/// `from` / `psk` / `on` steps.
#[derive(Clone, Copy)]
pub struct ConnectOptions<'a> {
    /// An address of this host to bind first (port 0 or `None`: the system chooses).
    pub src: Option<SocketAddr>,
    pub caps: QpCaps,
    /// The private data of the connect request (RTRS's `rtrs_msg_conn_req`).
    pub private_data: &'a [u8],
    /// The key to prove, and to require of the listener (none: no authentication).
    pub psk: Option<&'a Psk>,
    /// A shared completion queue of this fabric for the connection's completions
    /// (none: a private one).
    pub cq: Option<&'a CqRef>,
}

impl<'a> ConnectOptions<'a> {
    /// From any source, unauthenticated, on a private CQ.
    pub fn new(caps: QpCaps, private_data: &'a [u8]) -> ConnectOptions<'a> {
        ConnectOptions {
            src: None,
            caps,
            private_data,
            psk: None,
            cq: None,
        }
    }

    /// From `src`.
    pub fn from(self, src: Option<SocketAddr>) -> ConnectOptions<'a> {
        ConnectOptions { src, ..self }
    }

    /// Proving `psk`.
    pub fn psk(self, psk: Option<&'a Psk>) -> ConnectOptions<'a> {
        ConnectOptions { psk, ..self }
    }

    /// On the shared CQ `cq`.
    pub fn on(self, cq: &'a CqRef) -> ConnectOptions<'a> {
        ConnectOptions {
            cq: Some(cq),
            ..self
        }
    }

    /// What a backend with no authentication does with a key: refuses it.
    ///
    /// # Errors
    /// [`FabricError::AuthUnsupported`] with a key.
    pub fn check_no_key(&self, kind: FabricKind) -> Result<(), FabricError> {
        match self.psk {
            None => Ok(()),
            Some(_) => Err(FabricError::AuthUnsupported { kind }),
        }
    }
}

impl std::fmt::Debug for ConnectOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("src", &self.src)
            .field("caps", &self.caps)
            .field("private_data", &self.private_data.len())
            .field("psk", &self.psk.is_some())
            .field("cq", &self.cq.is_some())
            .finish()
    }
}

/// A device context with its protection domain: registrations and connections made
/// through one fabric belong together (as `ibv_pd` in verbs).
pub trait Fabric: Send + Sync {
    fn kind(&self) -> FabricKind;

    fn caps(&self) -> FabricCaps;

    /// A new protection domain on this fabric's device (verbs: `ibv_alloc_pd` on the
    /// same device context). Registrations and fast-registration slots made through it,
    /// and connections it makes or that are accepted into it
    /// ([`ConnRequest::accept_into`]), belong to it; a key of one domain is refused on
    /// every connection of another, as a NIC refuses it. Listeners are the device's, and
    /// the device's completion queues ([`Fabric::create_cq`] of any of its domains) take
    /// connections of every domain. RTRS gives each session its own.
    ///
    /// # Errors
    /// [`FabricError::Os`] when the device refuses a new protection domain.
    fn domain(&self) -> Result<std::sync::Arc<dyn Fabric>, FabricError>;

    /// The backend itself, so that a backend recognises its own domains
    /// ([`ConnRequest::accept_into`]); a wrapper returns the fabric it wraps.
    fn as_any(&self) -> &dyn std::any::Any;

    /// Registers an owned buffer; the [`Mr`] keeps it alive.
    ///
    /// # Errors
    /// [`FabricError::Register`] when the backend refuses (size, resources).
    fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError>;

    /// Registers memory the caller owns (for example buffers from SPDK's allocator).
    ///
    /// # Safety
    /// `[addr, addr+len)` must be valid for reads and writes, must stay allocated until
    /// the returned [`Mr`] is dropped *and* every operation that used it (as a local SGE,
    /// a fast-registration binding or a remote target) has completed, and must not be used
    /// meanwhile through Rust references that assume exclusive access.
    ///
    /// # Errors
    /// As [`Fabric::register`].
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, FabricError>;

    /// The memory a local SGE names, checked as a post checks it: its lkey names a live
    /// registration of this fabric granting `need`, and the range lies inside. The
    /// returned handle keeps that memory allocated. `None` when it does not, or when the
    /// backend keeps no table of its registrations to tell (the default; verbs, whose
    /// device checks at post time): software that copies a caller's SGE itself (the RTRS
    /// client's bounce area) resolves it here first.
    fn local_memory(&self, sge: &Sge, need: Access) -> Option<std::sync::Arc<mem::Backing>> {
        let _ = (sge, need);
        None
    }

    /// Allocates a fast-registration slot of `scope`; it is bound by posting
    /// [`SendOp::RegMr`].
    ///
    /// # Errors
    /// [`FabricError::Register`] when the backend has no slot left, or the device has no
    /// memory windows of the kind `scope` needs.
    fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError>;

    /// [`Fabric::alloc_fast_mr`] on device `device` ([`Hca::index`] of the connections
    /// that will bind it): a memory window lives on one device. The default, for
    /// backends of one device, ignores it.
    ///
    /// # Errors
    /// As [`Fabric::alloc_fast_mr`], and [`FabricError::Register`] for a device the
    /// fabric does not have.
    fn alloc_fast_mr_on(&self, scope: KeyScope, device: u8) -> Result<FastMr, FabricError> {
        let _ = device;
        self.alloc_fast_mr(scope)
    }

    /// Listens on `addr` (port 0 picks a free port; see [`Listener::local_addr`]) with
    /// `opts`: the limits on connections still in their handshake, and the key every
    /// initiator must prove. A backend that keeps such connections itself applies the
    /// limits (tcp: sockets whose connect request is not complete); one whose requests
    /// arrive whole (verbs, where `rdma_cm` runs the handshake, and loopback) has nothing
    /// pending and only checks them ([`ListenOptions::check_plain`]). A backend that
    /// cannot authenticate refuses a key.
    ///
    /// # Errors
    /// [`FabricError::Listen`] naming the address and the failing call, or limits out of
    /// range; [`FabricError::AuthUnsupported`] with a key on a backend that cannot
    /// authenticate.
    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError>;

    /// Starts connecting to `dst` with `opts` (the source address, the queue sizes, the
    /// private data of the connect request, the key to prove, the shared CQ); the result
    /// arrives as a [`CmEvent`] on the connection. RTRS paths are `[src,]dst`, as in the
    /// kernel's `rdma_resolve_addr`. With a key the listener must prove it too. On a
    /// shared CQ (a CQ made by this fabric, [`Fabric::create_cq`]) the connection is held
    /// by the calling thread ([`Conn::release_thread`]).
    ///
    /// # Errors
    /// [`FabricError::Connect`] when the attempt cannot even start (bad or unusable source
    /// address, no device, no shared CQs on this backend); [`FabricError::AuthUnsupported`]
    /// with a key on a backend that cannot authenticate; [`FabricError::Cq`] when the CQ is
    /// another fabric's or is in error (overrun). Later failures come as
    /// [`CmEvent::Error`], [`CmEvent::Rejected`] or [`CmEvent::AuthFailed`].
    fn connect(
        &self,
        dst: SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError>;

    /// A completion queue of `entries` entries for connections to share (verbs'
    /// `ibv_create_cq`). A backend that has none refuses (the default, for wrappers).
    ///
    /// # Errors
    /// [`FabricError::Cq`] when the backend has no shared CQs or the size is out of
    /// range; [`FabricError::Os`] when the device refuses.
    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        let _ = entries;
        Err(FabricError::Cq {
            cause: SetupCause::refused(format!(
                "the {} fabric has no shared completion queues",
                self.kind()
            )),
        })
    }
}

/// One reliable connection: a queue pair with its own completion queue, or on a shared
/// one ([`ConnectOptions::on`]).
pub trait Conn: Send {
    /// Posts a chain of send work requests.
    ///
    /// # Errors
    /// [`PostError`] with the index of the first request not accepted.
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError>;

    /// Posts receives.
    ///
    /// # Errors
    /// [`PostError`] with the index of the first receive not accepted.
    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError>;

    /// Does the local operation `op` (a [`SendOp::LocalInv`] or [`SendOp::RegMr`]) now,
    /// as posting it on this connection does where local operations take effect at post
    /// ([`FabricCaps::local_ops_at_post`]), but without a work request: no send-queue
    /// slot, no completion, nothing counted toward a signaling interval.
    /// `Some(Ok(()))`: done (the key retired, or bound with the slot's new rkey);
    /// `Some(Err(status))`: what the operation's completion would have reported, with
    /// the same effect on the connection (a failure other than a flush breaks it).
    /// `None`: not done, post it: the default (verbs), a connection held by another
    /// thread, any other operation, and a REG_MR that has to wait its turn in the send
    /// queue (an operation posted before it still reads the memory it exposes, or an
    /// earlier REG_MR still waits).
    fn local_now(&mut self, op: &SendOp<'_>) -> Option<Result<(), WcStatus>> {
        let _ = op;
        None
    }

    /// Makes progress and moves up to `wcs.len()` completions into `wcs`. On a
    /// connection made on a shared [`Cq`] it only makes progress and returns 0: the
    /// completions come out of that CQ.
    fn poll_cq(&mut self, wcs: &mut [Wc]) -> usize;

    /// The calling thread stops using the connection, so that another (the thread that
    /// polls its shared [`Cq`]) takes it over at its first post or poll. Needed only to hand a
    /// connection made on a shared CQ to that CQ's thread (the software fabrics check
    /// which thread holds it); nothing on a connection with a private CQ.
    fn release_thread(&self) {}

    /// Starts transmitting what was posted since the connection was last polled, now.
    /// The tcp fabric sends posted work at the connection's next poll, which batches a
    /// loop's posts into one system call but leaves them waiting for the rest of the
    /// loop; a caller that has posted all it will post this loop pushes once instead.
    /// Nothing to do where a post is the doorbell (verbs) or executes the work (loopback).
    fn push(&mut self) {}

    /// The connection's number on its fabric, carried by each of its completions
    /// ([`Wc::qp_num`]); verbs' `qp_num` (0 there until the queue pair exists). The
    /// default 0 is for test doubles that need no number.
    fn qp_num(&self) -> u32 {
        0
    }

    /// The next connection-manager event, if any. Polling it also makes progress.
    fn poll_cm(&mut self) -> Option<CmEvent>;

    /// Starts a graceful disconnect; both sides then see [`CmEvent::Disconnected`].
    fn disconnect(&mut self);

    fn state(&self) -> ConnState;

    fn caps(&self) -> QpCaps;

    /// The peer's address, once known.
    fn peer_addr(&self) -> Option<SocketAddr>;

    /// This end's address, once known.
    fn local_addr(&self) -> Option<SocketAddr>;

    /// The RDMA device and port the connection lives on, once known (the kernel's
    /// `hca_name` and `hca_port` of a path); `None` on the software fabrics.
    fn hca(&self) -> Option<Hca> {
        None
    }

    /// [`Hca::index`] of the connection's device (0 where it has none), without the
    /// name [`Conn::hca`] builds: what a core asks when it makes keys for a path.
    fn device_index(&self) -> u8 {
        self.hca().map_or(0, |h| h.index)
    }

    /// Why this end broke the connection, when it refused something of the peer's: a
    /// remote access error naming the operation, key and range, an invalid frame, an
    /// ack for operations never sent. `None` otherwise (a peer's disconnect, a network
    /// error, a backend that does not say: verbs reports the peer's errors to the peer).
    fn failure(&self) -> Option<String> {
        None
    }
}

/// An RDMA device and port, as a connection reports it ([`Conn::hca`]).
///
/// `index` numbers the devices of one fabric from 0: a backend whose connections may
/// live on several devices (verbs) keeps a registration and its keys on each, and a key
/// that goes on the wire for a connection is the one of that connection's device
/// ([`Mr::rkey_on`], [`Fabric::alloc_fast_mr_on`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hca {
    pub index: u8,
    pub name: std::sync::Arc<str>,
    pub port: u8,
}

/// The device index of `conn` ([`Hca::index`]; 0 where it has none).
pub fn device_index(conn: &dyn Conn) -> u8 {
    conn.device_index()
}

/// A listening endpoint.
pub trait Listener: Send {
    /// The next incoming connection request, if any. Never blocks.
    fn poll(&mut self) -> Option<ConnRequest>;

    fn local_addr(&self) -> SocketAddr;

    /// A descriptor that becomes readable when [`poll`](Listener::poll) may have
    /// progress to make (a connection came, a handshake's bytes arrived), for an acceptor
    /// that sleeps when idle (docs/ARCHITECTURE.md, "Interrupt mode"); the same one for the
    /// listener's life. `None` (the default): poll it on an idle period at least.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
}

/// An incoming connection request, answered by [`accept`](ConnRequest::accept) or
/// [`reject`](ConnRequest::reject). Dropping it unanswered rejects it with no data.
pub struct ConnRequest {
    pub private_data: PrivateData,
    pub peer: SocketAddr,
    pub pending: Box<dyn PendingConn>,
}

impl fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnRequest")
            .field("private_data", &self.private_data)
            .field("peer", &self.peer)
            .finish()
    }
}

impl ConnRequest {
    /// The RDMA device and port the request arrived through ([`Conn::hca`] of the
    /// connection it becomes).
    pub fn hca(&self) -> Option<Hca> {
        self.pending.hca()
    }

    /// Whether the initiator proved the listener's pre-shared key
    /// ([`ListenOptions::psk`]): a connection to a listener with a key always did.
    pub fn authenticated(&self) -> bool {
        self.pending.authenticated()
    }

    /// Accepts with `private_data` (≤ 56 bytes) and queues sized by `caps`.
    ///
    /// # Errors
    /// [`FabricError::Accept`] when the connection cannot be created or the peer is gone.
    pub fn accept(self, caps: QpCaps, private_data: &[u8]) -> Result<Box<dyn Conn>, FabricError> {
        let pd = PrivateData::new(private_data)?;
        self.pending.accept(None, None, caps, pd)
    }

    /// [`ConnRequest::accept`] into protection domain `domain` ([`Fabric::domain`] of the
    /// listener's fabric, or that fabric itself: the connection's remote accesses are
    /// checked against `domain`'s keys), with the connection's completions on `cq` (a CQ
    /// made by the listener's fabric) instead of a private CQ when one is given. A
    /// connection on a shared CQ is held by the calling thread ([`Conn::release_thread`]).
    ///
    /// # Errors
    /// As [`ConnRequest::accept`]; [`FabricError::Accept`] when `domain` is not a domain of
    /// the listener's device; [`FabricError::Cq`] when `cq` is another fabric's or is in
    /// error (overrun).
    pub fn accept_into(
        self,
        domain: &dyn Fabric,
        cq: Option<&CqRef>,
        caps: QpCaps,
        private_data: &[u8],
    ) -> Result<Box<dyn Conn>, FabricError> {
        let pd = PrivateData::new(private_data)?;
        self.pending.accept(Some(domain), cq, caps, pd)
    }

    /// Rejects with `private_data` (≤ 56 bytes), which the initiator sees in
    /// [`CmEvent::Rejected`].
    ///
    /// # Errors
    /// [`FabricError::PrivateDataTooLong`].
    pub fn reject(self, private_data: &[u8]) -> Result<(), FabricError> {
        let pd = PrivateData::new(private_data)?;
        self.pending.reject(pd);
        Ok(())
    }
}

/// Backend half of a [`ConnRequest`].
pub trait PendingConn: Send {
    /// Accepts ([`ConnRequest::accept_into`]): into `domain` (none: the listener's own),
    /// on `cq` (none: a private CQ).
    fn accept(
        self: Box<Self>,
        domain: Option<&dyn Fabric>,
        cq: Option<&CqRef>,
        caps: QpCaps,
        private_data: PrivateData,
    ) -> Result<Box<dyn Conn>, FabricError>;
    fn reject(self: Box<Self>, private_data: PrivateData);
    /// The device and port the request arrived through ([`ConnRequest::hca`]).
    fn hca(&self) -> Option<Hca> {
        None
    }
    /// Whether the initiator proved a pre-shared key ([`ConnRequest::authenticated`]).
    fn authenticated(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inc_rkey_advances_only_the_key_byte() {
        assert_eq!(inc_rkey(0x1234_5600), 0x1234_5601);
        assert_eq!(inc_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(inc_rkey(0xffff_ffff), 0xffff_ff00);
    }

    #[test]
    fn private_data_limit() {
        assert!(PrivateData::new(&[1; 56]).is_ok());
        let err = PrivateData::new(&[1; 57]).unwrap_err();
        assert!(err.to_string().contains("57 bytes"), "{err}");
        assert_eq!(PrivateData::new(&[7, 8]).unwrap().as_bytes(), &[7, 8]);
    }

    #[test]
    fn access_rights() {
        let a = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        assert!(a.contains(Access::REMOTE_WRITE));
        assert!(!a.contains(Access::REMOTE_READ));
        assert_eq!(format!("{a:?}"), "LOCAL_WRITE|REMOTE_WRITE");
    }

    #[test]
    fn queue_sizes_are_checked_against_limits_naming_the_field() {
        let limits = FabricCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 2,
            ..crate::fabric::tcp::TCP_CAPS
        };
        let ok = QpCaps {
            max_send_wr: 64,
            max_recv_wr: 0,
            max_send_sge: 2,
        };
        assert_eq!(ok.check_within(&limits, "the test's"), Ok(()));
        let no_send = QpCaps {
            max_send_wr: 0,
            ..ok
        };
        assert_eq!(
            no_send
                .check_within(&limits, "the test's")
                .map_err(|e| e.to_string()),
            Err("max_send_wr 0 is outside 1..=64 (the test's limit)".to_string())
        );
        let sges = QpCaps {
            max_send_sge: 3,
            ..ok
        };
        assert_eq!(
            sges.check_within(&limits, "the test's"),
            Err(CapsError::Field {
                field: "max_send_sge",
                asked: 3,
                min: 0,
                max: 2,
                whose: "the test's",
            })
        );
    }
}
