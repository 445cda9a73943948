//! What one core keeps about its requests: the public request and completion types of
//! [`super::SessionCore`], one [`Req`] per permit (the kernel's `rtrs_clt_io_req`), the
//! per-permit registered memory ([`Res`]) and this core's connection of each path
//! ([`CorePath`]). A leaf: the handle (`session_core`) and the data path (`io`) both
//! build on it, neither on the other's types (docs/ARCHITECTURE.md "Sessions on cores").

use std::collections::VecDeque;
use std::sync::Arc;

use super::cross_core::{IoConn, PathShared};
use super::policy::MpPolicy;
use crate::common::{Dir, IuPool};
use crate::fabric::{FastMr, Mr, RecvWr, Sge, Wc};
use crate::proto::constants::MAX_SEGMENTS;
use crate::proto::RkeyRsp;
use crate::Errno;

/// Most scatter-gather entries per request (`RTRS_MAX_SEGMENTS`).
pub const MAX_SGL: usize = MAX_SEGMENTS as usize;

/// Most completions taken from a connection per poll.
pub(super) const WC_BATCH: usize = 32;

/// A scatter-gather list that stays where it is, unchanged, until the request it was
/// submitted with completes: the client reads it there (at every post, a failover's
/// included, and at the completion) and keeps no copy. Made only through the unsafe
/// [`SglRef::new`], whose caller promises that; the RNBD queue makes one for its own
/// entries, and the rtrs bdev for the list in its task (docs/ARCHITECTURE.md, "One
/// request, one owner").
#[derive(Clone, Copy)]
pub struct SglRef {
    ptr: *const Sge,
    len: usize,
}

// SAFETY: an SglRef is a read-only view of plain data (`Sge` is `Copy`, `Send`, `Sync`)
// that its maker keeps alive and unchanged (see `new`); it moves with its request.
unsafe impl Send for SglRef {}
// SAFETY: as for Send: shared, it is only read.
unsafe impl Sync for SglRef {}

impl SglRef {
    /// A view of `sgl` that outlives the borrow.
    ///
    /// # Safety
    /// `sgl` must stay allocated and unchanged until every request submitted with this
    /// view has completed (its completion came out of the session's poll) or was refused
    /// (its submit returned an error): the client reads the entries during that time and
    /// writes a READ's data where they point.
    pub unsafe fn new(sgl: &[Sge]) -> SglRef {
        SglRef {
            ptr: sgl.as_ptr(),
            len: sgl.len(),
        }
    }

    /// The entries.
    pub fn as_slice(&self) -> &[Sge] {
        // SAFETY: `new`'s caller keeps the list alive and unchanged while it is used.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for SglRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// The scatter-gather list of a [`ClientIo`]: copied by the client at submit, or held
/// where it is until the completion ([`SglRef`]).
#[derive(Debug, Clone, Copy)]
pub enum Sgl<'a> {
    Copy(&'a [Sge]),
    Held(SglRef),
}

impl<'a> Sgl<'a> {
    /// The entries.
    pub fn as_slice(&self) -> &[Sge] {
        match self {
            Sgl::Copy(s) => s,
            Sgl::Held(r) => r.as_slice(),
        }
    }
}

impl std::ops::Deref for Sgl<'_> {
    type Target = [Sge];
    fn deref(&self) -> &[Sge] {
        self.as_slice()
    }
}

/// One request for [`SessionCore::submit`](super::SessionCore::submit).
///
/// `sgl` names memory registered with the session's fabric. Every entry the client copies
/// itself (the segments of a multi-segment WRITE, a READ's reply space outside a region
/// given to [`SessionCore::add_region`](super::SessionCore::add_region)) is checked at
/// submit against the registrations (`SubmitError::BadSge` otherwise), and the
/// registration is kept alive until the completion. The memory must still not be read
/// (for a READ) or written (for a WRITE) by anyone else until the request's completion
/// comes out of [`SessionCore::poll`](super::SessionCore::poll): the client and the
/// server write into it, as a DMA engine would.
#[derive(Debug, Clone, Copy)]
pub struct ClientIo<'a> {
    /// Returned in the completion.
    pub tag: u64,
    pub dir: Dir,
    /// User header (≤ [`SessionCore::max_usr_hdr`](super::SessionCore::max_usr_hdr)).
    pub usr: &'a [u8],
    /// Data (WRITE) or reply space (READ), ≤
    /// [`SessionCore::max_io_size`](super::SessionCore::max_io_size) in total: copied at
    /// submit ([`Sgl::Copy`]) or read where it lies until the completion ([`Sgl::Held`]).
    pub sgl: Sgl<'a>,
    /// An administrative request (RNBD's SESS_INFO/OPEN/CLOSE). Carried like any other
    /// request on this core's connection (see the module doc of `client`).
    pub admin: bool,
    /// Where the request waits while no path of this core can carry it.
    pub wait: PathWait,
}

/// Where a request waits while no path of its core can carry it: in the session, up to a
/// deadline, or with its caller. One place per request, so one timer: a caller that keeps
/// its own waiting requests (the RNBD queue) asks for [`PathWait::Caller`] and the session
/// keeps none of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PathWait {
    /// In the session, up to its `io_wait_timeout` after this submission; then −ENOTCONN.
    #[default]
    Session,
    /// In the session, until this time (ns of the caller's clock); then −ENOTCONN.
    /// Failing over does not move it.
    Until(u64),
    /// With the caller: [`submit`](super::SessionCore::submit) refuses the request with
    /// [`SubmitError::Unreachable`](super::SubmitError::Unreachable) while no path is
    /// usable, and a request whose path dies when no other can take it completes with
    /// −ECONNRESET. [`SessionCore::path_epoch`](super::SessionCore::path_epoch) says
    /// when sending again may find a path.
    Caller,
}

/// A finished request: the server's status, or why the client failed it (`ENOTCONN`
/// when no path came back within the wait, `EINVAL` when it no longer fits the session,
/// `ECONNRESET` when a queue-depth change dropped it while it waited, or when its path
/// died with no other to take it and it waits with its caller, [`PathWait::Caller`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientCompletion {
    pub tag: u64,
    pub result: Result<(), Errno>,
}

impl Default for ClientCompletion {
    fn default() -> ClientCompletion {
        ClientCompletion {
            tag: 0,
            result: Ok(()),
        }
    }
}

/// Where the completions of one [`SessionCore::poll`](super::SessionCore::poll) go:
/// straight into the caller's slice, and into the core's overflow queue once it is full
/// (or for completions made outside a poll).
pub(super) struct Out<'a> {
    buf: &'a mut [ClientCompletion],
    n: usize,
}

impl<'a> Out<'a> {
    pub fn new(buf: &'a mut [ClientCompletion]) -> Out<'a> {
        Out { buf, n: 0 }
    }

    /// Completions written into the caller's slice.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Moves the oldest overflowed completions into the slice.
    pub fn drain(&mut self, overflow: &mut VecDeque<ClientCompletion>) {
        let k = (self.buf.len() - self.n).min(overflow.len());
        for (o, c) in self.buf[self.n..].iter_mut().zip(overflow.drain(..k)) {
            *o = c;
        }
        self.n += k;
    }

    #[inline]
    pub fn put(&mut self, c: ClientCompletion, overflow: &mut VecDeque<ClientCompletion>) {
        match self.buf.get_mut(self.n) {
            Some(o) => {
                *o = c;
                self.n += 1;
            }
            None => overflow.push_back(c),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RState {
    Free,
    /// Holding its permit, waiting for a usable path (or send-queue room).
    Waiting,
    InFlight,
}

/// One permit's request state.
#[derive(Debug, Clone, Copy)]
pub(super) struct Req {
    pub state: RState,
    pub tag: u64,
    pub dir: Dir,
    pub usr_len: u16,
    pub nsg: u8,
    pub data_len: u32,
    /// WRITE data copied into the bounce area (several segments).
    pub bounced: bool,
    pub path: usize,
    pub policy: MpPolicy,
    pub start_ns: u64,
    /// Until when it may wait in the session for a path (ns); `None`: not at all, it
    /// waits with its caller ([`PathWait::Caller`]).
    pub deadline: Option<u64>,
    pub failed_over: bool,
    /// The READ reply went straight into the caller's registered region.
    pub direct: bool,
    /// The registrations of the READ's segments are held (in the core's `keep`), so
    /// the reply may be copied into them.
    pub kept: bool,
    /// The single-segment READ lies in `regions[k]` (found at submit; cleared by
    /// `remove_region`, which alone moves regions): bound in place when posted.
    pub region: Option<u16>,
    /// The caller's list, held where it lies ([`Sgl::Held`]); `None`: copied into the
    /// core's own entries of this permit (see [`slot_sgl`]).
    pub held: Option<SglRef>,
}

impl Req {
    pub const FREE: Req = Req {
        state: RState::Free,
        tag: 0,
        dir: Dir::Read,
        usr_len: 0,
        nsg: 0,
        data_len: 0,
        bounced: false,
        path: 0,
        policy: MpPolicy::MinInflight,
        start_ns: 0,
        deadline: None,
        failed_over: false,
        direct: false,
        kept: false,
        region: None,
        held: None,
    };

    pub fn has_desc(&self) -> bool {
        self.dir == Dir::Read && self.data_len > 0
    }
}

/// The scatter-gather list of permit `i`, whose state is `r`: the caller's, where it
/// lies, or the copy in `own` (the core's `MAX_SGL` entries per permit).
pub(super) fn slot_sgl<'a>(own: &'a [Sge], r: &'a Req, i: usize) -> &'a [Sge] {
    match &r.held {
        Some(h) => h.as_slice(),
        None => &own[i * MAX_SGL..i * MAX_SGL + usize::from(r.nsg)],
    }
}

/// Per-permit registered memory of a core.
pub(super) struct Res {
    /// `max_hdr_size` bytes per permit: user header then the RTRS trailer.
    pub hdr: IuPool,
    /// `max_io_size` bytes per permit: READ replies, multi-segment WRITE data.
    pub bounce: Mr,
}

/// A permit's READ key on one connection: a [`KeyScope::Connection`] slot, bound by
/// the connection that carries the request and written and retired (SEND_WITH_INV)
/// by the server on it.
///
/// [`KeyScope::Connection`]: crate::fabric::KeyScope::Connection
pub(super) struct ReadKey {
    pub slot: FastMr,
    /// Bound and not retired: a LOCAL_INV goes before the next binding (the kernel's
    /// local invalidation when the response came without W_INV).
    pub bound: bool,
}

/// This core's connection of one path. Its requests in flight under min-inflight are
/// counted once, in `shared.core_stats[core].inflight`.
pub(super) struct CorePath {
    /// The READ key of each of this core's permits on this connection, made at its
    /// first READ here; `None` also when its state is unknown (a post failed with it
    /// bound), so that a late write through the old key never reaches reused memory.
    /// A key belongs to the connection that binds it, so the keys go with the
    /// connection, and before it (declared first: dropped first), as a device wants
    /// its windows gone before their queue pair.
    pub keys: Vec<Option<ReadKey>>,
    pub io: Box<IoConn>,
    pub shared: Arc<PathShared>,
    /// The connection's route in the core's shared CQ ([`super::CoreCq`]), or
    /// [`NO_ROUTE`] on a private CQ.
    pub route: u32,
}

/// [`CorePath::route`] of a connection on a private CQ.
pub(super) const NO_ROUTE: u32 = u32::MAX;

/// Whether `seg` lies in `m`, under its lkey.
pub(super) fn covers(m: &Mr, seg: &Sge) -> bool {
    m.lkey() == seg.lkey
        && seg.addr >= m.addr()
        && seg
            .addr
            .checked_add(u64::from(seg.len))
            .is_some_and(|end| end <= m.addr() + m.len() as u64)
}

/// The regions a core was given ([`add_region`](super::SessionCore::add_region)), in the
/// order given (an index names one until a removal) and found by lkey: an SPDK
/// application in dynamic memory mode registers its memory 2 MiB at a time, hundreds of
/// regions, and every READ looks its segment up here.
#[derive(Default)]
pub(super) struct Regions {
    list: Vec<Arc<Mr>>,
    /// `(lkey, index in list)`, sorted by lkey.
    by_key: Vec<(u32, u16)>,
}

impl Regions {
    /// Adds `mr` at the end (false when it is there already, or the list is full).
    pub fn add(&mut self, mr: Arc<Mr>) -> bool {
        if self.list.iter().any(|m| Arc::ptr_eq(m, &mr)) {
            return false;
        }
        let Ok(k) = u16::try_from(self.list.len()) else {
            return false;
        };
        let key = mr.lkey();
        let at = self.by_key.partition_point(|&(l, _)| l < key);
        self.by_key.insert(at, (key, k));
        self.list.push(mr);
        true
    }

    /// Removes the region of `lkey`, returning it; the indices after it move.
    pub fn remove(&mut self, lkey: u32) -> Option<Arc<Mr>> {
        let k = self.list.iter().position(|m| m.lkey() == lkey)?;
        let mr = self.list.remove(k);
        self.by_key = self
            .list
            .iter()
            .enumerate()
            .map(|(i, m)| (m.lkey(), i as u16))
            .collect();
        self.by_key.sort_unstable();
        Some(mr)
    }

    /// The region that holds all of `seg` under its lkey: a single-segment READ there is
    /// bound in place. The check shared by submit and post.
    #[inline]
    pub fn index(&self, seg: &Sge) -> Option<usize> {
        let at = self.by_key.partition_point(|&(l, _)| l < seg.lkey);
        let &(_, k) = self.by_key.get(at)?;
        covers(&self.list[usize::from(k)], seg).then_some(usize::from(k))
    }

    /// [`index`](Self::index), as the region.
    #[inline]
    pub fn of(&self, seg: &Sge) -> Option<&Arc<Mr>> {
        self.index(seg).map(|k| &self.list[k])
    }

    /// The region of `lkey`.
    pub fn find(&self, lkey: u32) -> Option<&Arc<Mr>> {
        self.list.iter().find(|m| m.lkey() == lkey)
    }
}

impl std::ops::Index<usize> for Regions {
    type Output = Arc<Mr>;
    fn index(&self, k: usize) -> &Arc<Mr> {
        &self.list[k]
    }
}

impl std::iter::FromIterator<Arc<Mr>> for Regions {
    fn from_iter<I: IntoIterator<Item = Arc<Mr>>>(it: I) -> Regions {
        let mut r = Regions::default();
        for m in it {
            r.add(m);
        }
        r
    }
}

/// Result of trying to post a request.
pub(super) enum Posted {
    Yes,
    /// No usable path right now.
    NoPath,
    /// A path is usable but its send queue is full: retry on a later poll.
    Retry,
    /// The request cannot be encoded for this session (checked at submit, so only a
    /// session whose limits changed underneath it gets here): fail it with −EINVAL.
    Invalid,
}

/// The arrays one [`SessionCore::poll`](super::SessionCore::poll) fills: completions,
/// the first bytes of each receive, and the receives to repost.
pub(super) struct PollScratch {
    pub wcs: [Wc; WC_BATCH],
    pub payloads: [[u8; RkeyRsp::LEN]; WC_BATCH],
    pub posts: [RecvWr; WC_BATCH],
}

impl Default for PollScratch {
    fn default() -> PollScratch {
        PollScratch {
            wcs: [Wc::default(); WC_BATCH],
            payloads: [[0; RkeyRsp::LEN]; WC_BATCH],
            posts: [RecvWr {
                wr_id: 0,
                sge: None,
            }; WC_BATCH],
        }
    }
}
