//! The interface to the layer above the RTRS server (the RNBD server): the kernel's
//! `struct rtrs_srv_ops` (`rdma_ev` for requests, `link_ev` for session events) and
//! `rtrs_srv_resp_rdma` for the answer.
//!
//! One [`ServerHandler`] instance runs per reactor core, made by the factory given to
//! [`super::Server::start`]; it is only ever called on its own core, for the connections
//! that core polls, so it needs no locks. A request's chunk belongs to the handler from
//! [`ServerHandler::request`] until it answers into the server's [`Responses`]: at once,
//! from `request`, or later from [`ServerHandler::poll`], which the core's server poller
//! calls on every loop (no poller of its own, nothing shared).
//!
//! A handler may also give the server an account of each session's use
//! ([`ServerHandler::session_use`], a [`SessionUse`]): whether the session uses its slot
//! (RNBD: has a device open) and which addresses may join it. Sessions not in use give
//! way at the caps and after `open_grace`; a path joining a session is checked against
//! it (docs/ARCHITECTURE.md, "Session slots").

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::session::{Path, SessionId, SessionUse};
use crate::common::{Dir, LinkEvent};
use crate::engine::Ctx;
use crate::sync::lock;
use crate::Errno;

/// Identifies one request on the core that received it (slot and generation, so a late
/// or repeated answer for a finished request is recognised and ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoId(pub u64);

impl IoId {
    pub(crate) fn new(slot: u32, gen: u32) -> IoId {
        IoId(u64::from(gen) << 32 | u64::from(slot))
    }
    pub(crate) fn slot(self) -> u32 {
        self.0 as u32
    }
    pub(crate) fn gen(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// The data area of a request's chunk: for a WRITE the client's data, for a READ the
/// space where the handler puts the reply (`len()` bytes, the request's data length).
#[derive(Debug, Clone, Copy)]
pub struct DataArea {
    ptr: *mut u8,
    len: usize,
}

impl DataArea {
    pub(crate) fn new(ptr: *mut u8, len: usize) -> DataArea {
        DataArea { ptr, len }
    }

    /// Bytes in the area.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the request carries no data (a flush, a data-less READ).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the area (registered memory of the session's chunk pool).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Borrows the area.
    ///
    /// # Safety
    /// Only between the [`ServerHandler::request`] call that handed out this area and
    /// the [`Responses::respond`] for it: in that window the request owns its chunk
    /// (under always_invalidate the client's key is revoked; otherwise a correct client
    /// does not touch a chunk it has a request outstanding on). The slice must not
    /// outlive the answer.
    pub unsafe fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: ptr/len describe chunk memory kept alive by the session for as long
        // as the request is outstanding; exclusivity is the caller's contract above.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// Borrows the area mutably (to produce READ data).
    ///
    /// # Safety
    /// As [`DataArea::as_slice`], and no other borrow of the area may exist meanwhile.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in as_slice; uniqueness is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

// SAFETY: the area is plain memory of a registration that outlives the request; the
// handler may pass it to a backend thread that completes back on the owning core.
unsafe impl Send for DataArea {}

/// The path a request came on.
#[derive(Clone, Copy)]
pub struct SrvPath<'a>(pub(crate) &'a Path);

impl SrvPath<'_> {
    /// The client's address of the path (its source address).
    pub fn peer(&self) -> SocketAddr {
        self.0.peer
    }

    /// The server's address of the path.
    pub fn local(&self) -> SocketAddr {
        self.0.local
    }

    /// The session's name (the client's `sessname`, known once the path's INFO_REQ
    /// arrived, so for every request). Takes a lock: not for every IO.
    pub fn sessname(&self) -> String {
        self.0.sess.name()
    }

    /// Runs `f` with the source address of every path of the session (this one
    /// included, those still connecting too), while no path can join: a path joining
    /// meanwhile is checked by [`SessionUse::may_join`] after `f` has returned. For an
    /// OPEN's host check, which must cover every path that can carry the device's IO.
    /// Takes a lock: not for every IO.
    pub fn with_session_peers<R>(&self, f: impl FnOnce(&[IpAddr]) -> R) -> R {
        let peers = lock(&self.0.sess.peers);
        let addrs: Vec<IpAddr> = peers.iter().map(|&(_, ip)| ip).collect();
        f(&addrs)
    }
}

impl fmt::Debug for SrvPath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SrvPath({}@{})", self.0.peer, self.0.local)
    }
}

/// One request handed to the handler.
#[derive(Debug)]
pub struct SrvIo<'a> {
    /// Answer with this id.
    pub id: IoId,
    /// The session it came from.
    pub sess: SessionId,
    /// The path it came on.
    pub path: SrvPath<'a>,
    /// READ (produce `data.len()` bytes into `data`) or WRITE (consume `data`).
    pub dir: Dir,
    /// The user header (a copy; valid during the call).
    pub usr: &'a [u8],
    /// The chunk's data area.
    pub data: DataArea,
}

/// One answer: the request and its result (an error goes on the wire as its negative
/// errno; numbers above 511 do not fit there and are sent as EIO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    pub id: IoId,
    pub result: Result<(), Errno>,
}

/// The answers a handler gives during one call, owned by the core's server poller and
/// sent by it when the call returns. Its storage is kept from call to call: answering
/// allocates only while the core's busiest loop so far is being exceeded.
#[derive(Debug, Default)]
pub struct Responses {
    buf: Vec<Response>,
}

impl Responses {
    /// Room for `n` answers.
    pub fn with_capacity(n: usize) -> Responses {
        Responses {
            buf: Vec::with_capacity(n),
        }
    }

    /// Answers request `id`. An id already answered (or unknown) is ignored by the
    /// server.
    pub fn respond(&mut self, id: IoId, result: Result<(), Errno>) {
        self.buf.push(Response { id, result });
    }

    /// Answers given and not yet sent.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether no answer waits.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes the answers out, in the order given (the storage stays).
    pub fn drain(&mut self) -> std::vec::Drain<'_, Response> {
        self.buf.drain(..)
    }
}

/// The layer above: one instance per core, called on that core only.
pub trait ServerHandler {
    /// First path of a session up ([`LinkEvent::Connected`]) or last path gone
    /// ([`LinkEvent::Disconnected`]). Called on the session's home core.
    fn link_event(&mut self, cx: &mut dyn Ctx, sess: SessionId, sessname: &str, ev: LinkEvent);

    /// The account of session `sess`'s use the server is to consult (see [`SessionUse`]),
    /// asked on the home core right after its [`LinkEvent::Connected`]. `None` (the
    /// default): the session is always in use and any address may join it, as in the
    /// kernel.
    fn session_use(&mut self, sess: SessionId) -> Option<Arc<dyn SessionUse>> {
        let _ = sess;
        None
    }

    /// A request; answer it with [`Responses::respond`]`(io.id, result)`, into `out`
    /// now or into the `out` of a later [`poll`](Self::poll).
    fn request(&mut self, cx: &mut dyn Ctx, io: SrvIo<'_>, out: &mut Responses);

    /// Called by this core's server poller on every loop: answer requests that finished
    /// since. Returns whether anything happened (the poller reports itself busy then).
    /// The default answers nothing (a handler that answers every request at once).
    fn poll(&mut self, cx: &mut dyn Ctx, out: &mut Responses) -> bool {
        let _ = (cx, out);
        false
    }

    /// Called once on the handler's core, just after the factory made it and before the
    /// core's server first polls: a handler whose backends complete IO in pollers of
    /// their own registers those here (as an SPDK bdev channel registers its poller when
    /// the factory opens it), so that where the driver runs pollers newest first the
    /// core's answers run after them in each loop (docs/ARCHITECTURE.md, "Answers in the
    /// loop that completed them"). The default registers nothing.
    fn start(&mut self, cx: &mut dyn Ctx) {
        let _ = cx;
    }

    /// How many backends the handler has opened on this core so far (at its making and
    /// since): an SPDK bdev channel registers its poller when it opens, so where the
    /// driver runs pollers newest first the core's server moves its whole poll ahead of
    /// the new one when this changes (docs/ARCHITECTURE.md, "Answers in the loop that
    /// completed them"). One call per loop: a field's load. The default: none.
    fn backends_opened(&self) -> u64 {
        0
    }
}
