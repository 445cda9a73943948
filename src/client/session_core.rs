//! [`SessionCore`]: one core's handle of a client session — the kernel's per-CPU side
//! of `rtrs_clt_request`, `rtrs_clt_rdma_done` and `rtrs_clt_failover_req`, without its
//! locks (docs/ARCHITECTURE.md "Sessions on cores").
//!
//! A core owns a fixed slice of the session's permits ([`super::permit`]), the
//! per-permit buffers (user header + RTRS trailer, a bounce area of `max_io_size`, a
//! fast-registration slot) and its IO connection (`cid = core + 1`) of every connected
//! path. Requests submitted here go out on this core's connections and complete here,
//! from [`SessionCore::poll`]. Nothing here allocates per request: request state,
//! scatter lists and completions live in arrays sized once from the queue depth.
//!
//! While no path is usable a request waits (keeping its permit) until a path comes
//! back or `io_wait_timeout` passes, then fails with −ENOTCONN; one that waits with its
//! caller ([`PathWait::Caller`]) is refused instead and never waits here. When a path
//! dies, the requests in flight on it on this core are re-sent on this core over another
//! path with the same permit (failover); each completes exactly once.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::core_cq::{CoreCq, Hub};
use super::cross_core::{PathCmd, PathShared, SessShared, SessionParams};
use super::error::SubmitError;
use super::permit::{partition, Permits};
use super::policy::{Candidate, MpPolicy, Selector, MAX_PATHS};
use super::request::{
    covers, slot_sgl, ClientCompletion, ClientIo, CorePath, Out, PathWait, PollScratch, Posted,
    RState, ReadKey, Regions, Req, Res, Sgl, MAX_SGL, NO_ROUTE,
};
use crate::common::{Dir, IuPool};
use crate::fabric::mem::Backing;
use crate::fabric::{device_index, Access, Fabric, FabricError, KeyScope, MemBuf, Mr, Sge};
use crate::sync::lock;
use crate::Errno;

/// What one core knows of the session's limits and what it built from them: one value,
/// so the limits, the permits and their buffers cannot disagree.
pub(super) enum Sizing {
    /// The session has not connected yet: no limits, no permits.
    Unknown,
    /// The limits are known but this core's per-permit buffers could not be allocated:
    /// it has no permits, and submit answers `Busy` with capacity 0.
    Starved(SessionParams),
    /// The limits and this core's permits with their buffers.
    Ready(Ready),
}

/// A core's share of the session, sized from its limits: the permits and, per permit,
/// the registered header, bounce area and fast-registration slot. A request exists only
/// while it holds one of these permits.
pub(super) struct Ready {
    pub params: SessionParams,
    pub permits: Permits,
    pub res: Res,
}

impl Sizing {
    /// The session's limits, once known.
    pub(super) fn params(&self) -> Option<SessionParams> {
        match self {
            Sizing::Unknown => None,
            Sizing::Starved(p) => Some(*p),
            Sizing::Ready(rd) => Some(rd.params),
        }
    }
}

/// One core's handle of a session (see the module doc). Made by
/// [`super::ClientSession::open`], one per core: move each to its core and poll it there; or
/// by [`super::ClientSession::open_on_cores`], polled wherever its owner wants (one owner at
/// a time; once [`attach`](Self::attach)ed, on the thread that polls the CQ).
pub struct SessionCore {
    pub(super) core: usize,
    pub(super) sess: Arc<SessShared>,
    pub(super) fabric: Arc<dyn Fabric>,
    /// The fabric does LOCAL_INV at once ([`FabricCaps::local_ops_at_post`](crate::fabric::FabricCaps)):
    /// a READ asks no remote invalidation of its key, which the response's handling
    /// retires itself before the request completes (docs/ARCHITECTURE.md, "always_invalidate
    /// on the software fabrics").
    pub(super) inv_local: bool,
    pub(super) io_wait_ns: u64,
    /// The session's limits as this core knows them, and what it built from them.
    pub(super) sizing: Sizing,
    pub(super) reqs: Vec<Req>,
    /// `MAX_SGL` entries per permit.
    pub(super) sgl: Vec<Sge>,
    pub(super) paths: Vec<Option<CorePath>>,
    pub(super) cands: Vec<Candidate>,
    pub(super) sel: Selector,
    /// Requests waiting for a usable path or for send-queue room, by buf_id.
    pub(super) wait: VecDeque<u16>,
    /// Paths this core was given so far (see [`path_epoch`](Self::path_epoch)).
    pub(super) path_epoch: u64,
    /// `MAX_SGL` entries per permit: the registrations a READ's reply is copied into,
    /// held from submit to completion (see [`Req::kept`]).
    pub(super) keep: Vec<Held>,
    /// Completions made outside a poll, or beyond the caller's slice: handed out first
    /// by the next poll.
    pub(super) done: VecDeque<ClientCompletion>,
    pub(super) max_send_sge: u32,
    /// One past the highest path slot this core has seen (bounds the per-IO scans).
    pub(super) nslots: usize,
    /// Rate limit of data-path warnings: next time one may be logged, and how many were
    /// suppressed since the last.
    pub(super) warn_next_ns: u64,
    pub(super) warn_suppressed: u64,
    /// Calls of `poll` so far.
    pub(super) polls: u64,
    /// Regions the caller registered for zero-copy READs ([`SessionCore::add_region`]).
    pub(super) regions: Regions,
    /// Completion arrays of [`SessionCore::poll`] (`None` only while it runs).
    pub(super) scratch: Option<Box<PollScratch>>,
    /// The core's shared CQ, once attached ([`SessionCore::attach`]).
    pub(super) hub: Option<Arc<Hub>>,
    /// Routes of connections gone that the hub could not be told of at once (another
    /// thread held it): told at the next poll.
    pub(super) dead_routes: Vec<u32>,
}

impl std::fmt::Debug for SessionCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCore")
            .field("sess", &self.sess.sessname)
            .field("core", &self.core)
            .field("permits", &self.permits())
            .field("in_use", &self.outstanding())
            .finish()
    }
}

impl Drop for SessionCore {
    /// A core handle going away disconnects its connections and stops taking part in
    /// teardowns, so the other cores' paths are not held up waiting for it.
    fn drop(&mut self) {
        self.sess.core_gone[self.core].store(true, Ordering::Release);
        let mut routes = Vec::new();
        for cp in self.paths.iter_mut().flatten() {
            cp.io.con.disconnect();
            routes.push(cp.route);
        }
        // The hub forgets them now if this thread holds it, else once it sees the core
        // gone.
        for r in routes {
            self.drop_route(r);
        }
        self.dead_routes.clear();
        while let Some(cmd) = self.sess.to_core[self.core].pop() {
            match cmd {
                PathCmd::Down { slot } => {
                    let p = lock(&self.sess.paths)[slot].clone();
                    if let Some(p) = p {
                        p.acks.fetch_add(1, Ordering::AcqRel);
                    }
                }
                PathCmd::Up { mut conn, .. } => conn.con.disconnect(),
            }
        }
    }
}

impl SessionCore {
    pub(super) fn new(
        core: usize,
        sess: Arc<SessShared>,
        fabric: Arc<dyn Fabric>,
        io_wait_ns: u64,
    ) -> SessionCore {
        SessionCore {
            core,
            sess,
            inv_local: fabric.caps().local_ops_at_post,
            fabric,
            io_wait_ns,
            sizing: Sizing::Unknown,
            reqs: Vec::new(),
            sgl: Vec::new(),
            keep: Vec::new(),
            paths: (0..MAX_PATHS).map(|_| None).collect(),
            cands: vec![Candidate::default(); MAX_PATHS],
            sel: Selector::new(),
            wait: VecDeque::new(),
            path_epoch: 0,
            done: VecDeque::new(),
            max_send_sge: 1,
            nslots: 0,
            warn_next_ns: 0,
            warn_suppressed: 0,
            polls: 0,
            regions: Regions::default(),
            scratch: Some(Box::default()),
            hub: None,
            dead_routes: Vec::new(),
        }
    }

    /// Makes this core's IO connections, from the next one on, on `cq`, the core's
    /// shared CQ, which the owner of the core's loop polls once per loop before it
    /// polls this handle (docs/ARCHITECTURE.md, "Completion queues"). Call it on the
    /// core, before the session connects if every connection is to be on it; once.
    /// A `cq` of another core is refused (false), and so is one that failed.
    pub fn attach(&mut self, cq: &CoreCq) -> bool {
        let hub = cq.hub();
        if hub.core != self.core || self.hub.is_some() || !hub.attach(&self.sess) {
            return false;
        }
        self.sess.use_cq(self.core, hub.share.clone());
        self.hub = Some(Arc::clone(hub));
        true
    }

    /// Tells the hub that route `r`'s connection is gone (later if another thread
    /// holds the hub now).
    pub(super) fn drop_route(&mut self, r: u32) {
        if r == NO_ROUTE {
            return;
        }
        // Never claims the hub: a route exists only once the core's thread holds it.
        let told = self
            .hub
            .as_ref()
            .and_then(|h| h.st.with_held(|st| st.unregister(r)));
        if told.is_none() && self.hub.is_some() {
            self.dead_routes.push(r);
        }
    }

    /// The core this handle belongs to.
    pub fn core(&self) -> usize {
        self.core
    }

    /// The fabric the session runs on (to register memory for its requests).
    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        &self.fabric
    }

    /// Transmits what this core posted since the last push on each of its connections,
    /// now (see [`Conn::push`](crate::fabric::Conn::push)): a caller that submits from
    /// completion callbacks after [`poll`](Self::poll) calls it once they are done.
    pub fn push(&mut self) {
        for p in self.paths[..self.nslots].iter_mut().flatten() {
            p.io.con.push();
        }
    }

    /// Largest data size of one request (0 before the session first connected).
    pub fn max_io_size(&self) -> u32 {
        self.sizing.params().map_or(0, |p| p.max_io_size)
    }

    /// How long a request waits for a path (the session's
    /// [`io_wait_timeout`](super::ClientConfig::io_wait_timeout)).
    pub fn io_wait_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.io_wait_ns)
    }

    /// Largest user header (0 before the session first connected).
    pub fn max_usr_hdr(&self) -> u32 {
        self.sizing.params().map_or(0, |p| p.max_usr_hdr())
    }

    /// The session's queue depth (0 before the session first connected).
    pub fn queue_depth(&self) -> u16 {
        self.sizing.params().map_or(0, |p| p.queue_depth)
    }

    /// Permits this core owns (its share of the queue depth).
    pub fn permits(&self) -> u32 {
        match &self.sizing {
            Sizing::Ready(rd) => rd.permits.capacity(),
            Sizing::Unknown | Sizing::Starved(_) => 0,
        }
    }

    /// Lets single-segment READs into `mr` skip the bounce area: the permit's
    /// fast-registration slot is bound to the caller's segment inside `mr` and the
    /// server writes there directly (the kernel's way; zero copy). `mr` must come from
    /// the session's fabric; it is kept alive here until [`remove_region`](Self::remove_region).
    pub fn add_region(&mut self, mr: Arc<Mr>) {
        self.regions.add(mr);
    }

    /// Stops using the region with local key `lkey` for zero-copy READs. Requests
    /// already posted into it still complete into it.
    pub fn remove_region(&mut self, lkey: u32) {
        // READs whose reply is to be copied into the region held it through
        // `self.regions`: from now on they hold its memory themselves.
        if let Some(m) = self.regions.find(lkey) {
            hand_over(&mut self.keep, &self.reqs, &self.sgl, m);
        }
        self.regions.remove(lkey);
        // Indices moved: requests not posted yet look again when they are.
        for r in &mut self.reqs {
            r.region = None;
        }
    }

    /// Why the target refused the session, if it did (see `ClientSession::refusal`).
    pub fn refusal(&self) -> Option<super::Refusal> {
        lock(&self.sess.refusal).clone()
    }

    /// How many connections of paths this core was given so far (a first connect, a
    /// reconnect, another path): a request refused with
    /// [`SubmitError::Unreachable`] may find a path once this moved.
    pub fn path_epoch(&self) -> u64 {
        self.path_epoch
    }

    /// Requests submitted here and not yet completed.
    pub fn outstanding(&self) -> u32 {
        match &self.sizing {
            Sizing::Ready(rd) => rd.permits.in_use(),
            Sizing::Unknown | Sizing::Starved(_) => 0,
        }
    }

    /// Submits a request; its completion comes out of [`poll`](Self::poll) on this core.
    ///
    /// # Errors
    /// [`SubmitError::Busy`] when this core's permits are all in use (retry after
    /// completions); `TooLarge`, `HeaderTooLarge`, `TooManySegments` for a request the
    /// session cannot carry; `NoPath` when the session is closed, or has not connected
    /// yet (wait for the `Connected` link event); `Unreachable`, for a request that waits
    /// with its caller ([`PathWait::Caller`]), when no path can carry it now but the
    /// session is open (not yet connected included); `Refused` when it never connected
    /// and the target refused every path for good ([`refusal`](Self::refusal) says why).
    pub fn submit(&mut self, now: u64, io: ClientIo<'_>) -> Result<(), SubmitError> {
        let caller_waits = io.wait == PathWait::Caller;
        let closed = self.sess.closed.load(Ordering::Acquire);
        let Some(p) = self.sizing.params() else {
            return Err(match self.refusal() {
                Some(r) => SubmitError::Refused { errno: r.errno },
                None if caller_waits && !closed => SubmitError::Unreachable,
                None => SubmitError::NoPath,
            });
        };
        if closed {
            return Err(SubmitError::NoPath);
        }
        if io.usr.len() > p.max_usr_hdr() as usize {
            return Err(SubmitError::HeaderTooLarge {
                len: io.usr.len(),
                max: p.max_usr_hdr(),
            });
        }
        let sgl = io.sgl.as_slice();
        if sgl.len() > MAX_SGL {
            return Err(SubmitError::TooManySegments {
                n: sgl.len(),
                max: MAX_SGL,
            });
        }
        let len: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
        if len > u64::from(p.max_io_size) {
            return Err(SubmitError::TooLarge {
                len,
                max: p.max_io_size,
            });
        }
        // Limits known but no buffers (their allocation failed): no permits on this core.
        let Sizing::Ready(rd) = &mut self.sizing else {
            return Err(SubmitError::Busy { capacity: 0 });
        };
        let Some(buf_id) = rd.permits.get() else {
            return Err(SubmitError::Busy {
                capacity: rd.permits.capacity(),
            });
        };
        let i = usize::from(buf_id - rd.permits.range().start);
        let bounced = io.dir == Dir::Write && len > 0 && (sgl.len() > 1 || self.max_send_sge < 2);
        // A single-segment READ into a region given to add_region is bound in place and
        // never copied; every other READ's segments receive a copy of the reply.
        let region = match sgl {
            [one] if io.dir == Dir::Read => {
                self.regions.index(one).and_then(|k| u16::try_from(k).ok())
            }
            _ => None,
        };
        let kept = io.dir == Dir::Read && len > 0 && region.is_none();
        if kept {
            if let Err(e) = hold(&mut self.keep, &self.regions, &*self.fabric, i, sgl) {
                rd.permits.put(buf_id);
                return Err(e);
            }
        }
        let res = &rd.res;
        if bounced {
            let mut off = i * p.max_io_size as usize;
            for (index, s) in sgl.iter().enumerate() {
                // A region of this core's, else whatever registration of the fabric the
                // key names; held only while the copy runs.
                let held;
                let ok = match self.regions.of(s) {
                    Some(_) => true,
                    None => {
                        held = self.fabric.local_memory(s, Access::NONE);
                        held.is_some()
                    }
                };
                if !ok {
                    rd.permits.put(buf_id);
                    return Err(bad_sge(index, s));
                }
                // SAFETY: `[s.addr, s.addr + s.len)` lies inside a live registration (just
                // checked against its bounds), kept allocated by `self.regions` or `held`
                // during the copy; the bounce area of permit `i` is ours alone until the
                // permit is returned.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.addr as *const u8,
                        res.bounce.as_ptr().add(off),
                        s.len as usize,
                    );
                }
                off += s.len as usize;
            }
        }
        res.hdr.write(i, io.usr);
        // A held list is read where it lies (see `SglRef`); another is copied, once.
        let held = match io.sgl {
            Sgl::Held(h) => Some(h),
            Sgl::Copy(c) => {
                self.sgl[i * MAX_SGL..i * MAX_SGL + c.len()].copy_from_slice(c);
                None
            }
        };
        self.reqs[i] = Req {
            state: RState::Waiting,
            tag: io.tag,
            dir: io.dir,
            usr_len: io.usr.len() as u16,
            nsg: sgl.len() as u8,
            data_len: len as u32,
            bounced,
            path: 0,
            policy: MpPolicy::MinInflight,
            start_ns: now,
            deadline: match io.wait {
                PathWait::Session => Some(now.saturating_add(self.io_wait_ns)),
                PathWait::Until(t) => Some(t),
                PathWait::Caller => None,
            },
            failed_over: false,
            direct: false,
            kept,
            region,
            held,
        };
        match self.try_post(i, now) {
            Posted::Yes => {}
            Posted::Invalid => {
                let c = self.finish(i, Err(Errno::EINVAL), now);
                self.done.push_back(c);
            }
            Posted::NoPath if caller_waits => {
                // Nothing was posted: the request is the caller's again.
                let _ = self.finish(i, Err(Errno::ENOTCONN), now);
                return Err(SubmitError::Unreachable);
            }
            Posted::NoPath | Posted::Retry => self.wait.push_back(buf_id),
        }
        Ok(())
    }

    /// Makes progress (connections, failover, waiting requests) and moves up to
    /// `out.len()` completions into `out`; returns how many.
    pub fn poll(&mut self, now: u64, out: &mut [ClientCompletion]) -> usize {
        self.polls = self.polls.wrapping_add(1);
        if !self.dead_routes.is_empty() {
            self.tell_dead_routes();
        }
        while let Some(cmd) = self.sess.to_core[self.core].pop() {
            self.on_cmd(cmd, now);
        }
        // Older completions first, then this poll's straight into `out`.
        let mut out = Out::new(out);
        out.drain(&mut self.done);
        // The completion arrays live in the handle (not re-initialised on the stack by
        // every poll); taken out while the paths are polled.
        let mut scratch = self.scratch.take().unwrap_or_default();
        for slot in 0..self.nslots {
            if self.paths[slot].is_none() {
                continue;
            }
            self.poll_path(slot, &mut scratch, &mut out, now);
        }
        self.scratch = Some(scratch);
        if !self.wait.is_empty() {
            self.drive_wait(&mut out, now);
        }
        out.len()
    }

    fn tell_dead_routes(&mut self) {
        if let Some(h) = &self.hub {
            let dead = &mut self.dead_routes;
            h.st.with_held(|st| dead.drain(..).for_each(|r| st.unregister(r)));
        }
    }

    fn on_cmd(&mut self, cmd: PathCmd, now: u64) {
        match cmd {
            PathCmd::Up {
                path,
                params,
                mut conn,
            } => {
                let mut route = NO_ROUTE;
                if conn.con.on_shared() {
                    // Made on this core's CQ by the home core and released: taken here,
                    // with its route, before the CQ's next poll can report it.
                    let sess = &self.sess;
                    let routed = self.hub.as_ref().and_then(|h| {
                        conn.con.adopt();
                        h.st.with(|st| st.register(conn.con.qp_num(), sess))
                    });
                    match routed {
                        Some(r) => route = r,
                        None => {
                            tracing::warn!(sess = %self.sess.sessname, core = self.core, "a connection made on the core's completion queue cannot be polled here (no hub attached on this thread)");
                            conn.con.disconnect();
                            path.error.store(true, Ordering::Release);
                            return;
                        }
                    }
                }
                if self.sizing.params() != Some(params) {
                    self.setup(params, now);
                }
                self.path_epoch += 1;
                self.max_send_sge = conn.con.conn().caps().max_send_sge;
                let slot = path.slot;
                self.nslots = self.nslots.max(slot + 1);
                if let Some(old) = self.paths[slot].take() {
                    // A connection this core still had of the path goes with its route.
                    self.drop_route(old.route);
                }
                let keys = self.path_keys(device_index(conn.con.conn()), &path);
                self.paths[slot] = Some(CorePath {
                    keys,
                    io: conn,
                    shared: path,
                    route,
                });
            }
            PathCmd::Down { slot } => {
                if let Some(path) = self.paths[slot].as_ref().map(|c| c.shared.clone()) {
                    self.teardown(slot, now);
                    path.acks.fetch_add(1, Ordering::AcqRel);
                } else if let Some(p) = lock(&self.sess.paths)[slot].clone() {
                    p.acks.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// (Re)sizes the per-permit state for new session limits. Requests waiting from
    /// before a queue-depth change cannot keep their permit and fail with −ECONNRESET.
    fn setup(&mut self, params: SessionParams, now: u64) {
        let _ = now;
        while let Some(b) = self.wait.pop_front() {
            let i = usize::from(b - self.first_buf_id());
            let c = self.finish(i, Err(Errno::ECONNRESET), now);
            self.done.push_back(c);
        }
        let range = partition(params.queue_depth, self.sess.cores, self.core);
        let n = usize::from(range.end - range.start);
        let cnt = n.max(1);
        let hdr = IuPool::new(
            &*self.fabric,
            cnt,
            params.max_hdr_size as usize,
            Access::LOCAL_WRITE,
        );
        // Sized by the server's limits: a refusal, not an abort, when they are beyond
        // what this process can have.
        let bounce = MemBuf::try_zeroed(cnt * params.max_io_size as usize)
            .map_err(crate::fabric::FabricError::from)
            .and_then(|b| {
                self.fabric
                    .register(b, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            });
        match (hdr, bounce) {
            (Ok(hdr), Ok(bounce)) => {
                self.sizing = Sizing::Ready(Ready {
                    params,
                    permits: Permits::new(range),
                    res: Res { hdr, bounce },
                });
            }
            (h, b) => {
                let err = h.err().or(b.err());
                tracing::error!(sess = %self.sess.sessname, core = self.core, "cannot allocate per-permit buffers: {err:?}; this core gets no permits");
                self.sizing = Sizing::Starved(params);
            }
        }
        // The READ keys were made for the old permits.
        for slot in 0..self.paths.len() {
            if let Some((device, path)) = self.paths[slot]
                .as_ref()
                .map(|cp| (device_index(cp.io.con.conn()), cp.shared.clone()))
            {
                let keys = self.path_keys(device, &path);
                if let Some(cp) = self.paths[slot].as_mut() {
                    cp.keys = keys;
                }
            }
        }
        self.reqs = vec![Req::FREE; n];
        self.sgl = vec![Sge::default(); n * MAX_SGL];
        self.keep = vec![Held::None; n * MAX_SGL];
        self.wait = VecDeque::with_capacity(n);
        self.done.reserve(2 * n);
    }

    /// A READ key slot per permit of this core, for a connection of `path` on RDMA
    /// device `device` (a key slot lives on the device of its connection). When the
    /// device has gone meanwhile, the path breaks and reconnects by its policy (the other
    /// paths keep this core's permits). A core that cannot have them otherwise cannot
    /// READ, and gets no permits (as when its buffers cannot be had); while requests hold
    /// permits, each READ tries for its key again when it is posted.
    fn path_keys(&mut self, device: u8, path: &Arc<PathShared>) -> Vec<Option<ReadKey>> {
        let n = self.permits() as usize;
        let made: Result<Vec<_>, _> = (0..n)
            .map(|_| {
                self.fabric
                    .alloc_fast_mr_on(KeyScope::Connection, device)
                    .map(|slot| Some(ReadKey { slot, bound: false }))
            })
            .collect();
        match made {
            Ok(keys) => keys,
            Err(e @ FabricError::DeviceGone { .. }) => {
                tracing::warn!(sess = %self.sess.sessname, core = self.core, "cannot make READ key slots: {e}; the path breaks and reconnects");
                path.error.store(true, Ordering::Release);
                (0..n).map(|_| None).collect()
            }
            Err(e) if self.outstanding() == 0 => {
                tracing::error!(sess = %self.sess.sessname, core = self.core, "cannot make READ key slots: {e}; this core gets no permits");
                if let Some(p) = self.sizing.params() {
                    self.sizing = Sizing::Starved(p);
                }
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(sess = %self.sess.sessname, core = self.core, "cannot make READ key slots: {e}");
                (0..n).map(|_| None).collect()
            }
        }
    }

    /// The buf id of this core's first permit (its requests are numbered from it).
    pub(super) fn first_buf_id(&self) -> u16 {
        match &self.sizing {
            Sizing::Ready(rd) => rd.permits.range().start,
            Sizing::Unknown | Sizing::Starved(_) => 0,
        }
    }

    /// Whether a data-path warning may be logged now (at most one per second per core);
    /// returns how many were suppressed before it.
    pub(super) fn may_warn(&mut self, now: u64) -> Option<u64> {
        if now < self.warn_next_ns {
            self.warn_suppressed += 1;
            return None;
        }
        self.warn_next_ns = now.saturating_add(1_000_000_000);
        Some(std::mem::take(&mut self.warn_suppressed))
    }

    /// Ends request `i` with `result`, returns its permit and gives its completion (for
    /// the caller's slice or the overflow queue).
    pub(super) fn finish(
        &mut self,
        i: usize,
        result: Result<(), Errno>,
        now: u64,
    ) -> ClientCompletion {
        let r = self.reqs[i];
        if r.state == RState::InFlight {
            if let Some(cp) = self.paths[r.path].as_ref() {
                let st = &cp.shared.core_stats[self.core];
                st.on_latency(now.saturating_sub(r.start_ns));
                if r.policy == MpPolicy::MinInflight {
                    st.inflight.sub(1);
                }
            }
        }
        if r.kept {
            self.keep[i * MAX_SGL..i * MAX_SGL + usize::from(r.nsg)].fill(Held::None);
        }
        self.reqs[i].state = RState::Free;
        // The caller's list is theirs again from the completion on.
        self.reqs[i].held = None;
        if let Sizing::Ready(rd) = &mut self.sizing {
            let b = rd.permits.range().start + i as u16;
            rd.permits.put(b);
        }
        ClientCompletion { tag: r.tag, result }
    }
}

/// How a READ's segment, whose reply is copied into it, is kept allocated until the
/// completion.
#[derive(Clone, Debug, Default)]
pub(super) enum Held {
    /// No segment here.
    #[default]
    None,
    /// Inside one of the core's regions, which keeps it (`remove_region` turns it into
    /// `Memory` first): no count moves, so memory every core reads into costs no shared
    /// write per IO (docs/ARCHITECTURE.md, "Who writes what per IO").
    Region,
    /// Found in the fabric's table: held by a count on its memory (kept for its drop).
    Memory(#[allow(dead_code)] Arc<Backing>),
}

impl Held {
    pub(super) fn is_none(&self) -> bool {
        matches!(self, Held::None)
    }
}

/// Region `m` is about to be let go: every segment of a live request held through it
/// (`Held::Region`; `keep` has `MAX_SGL` entries per permit, as `own`) holds its memory
/// itself from now on.
fn hand_over(keep: &mut [Held], reqs: &[Req], own: &[Sge], m: &Arc<Mr>) {
    for (i, r) in reqs.iter().enumerate() {
        if r.state == RState::Free || !r.kept {
            continue;
        }
        let held = &mut keep[i * MAX_SGL..(i + 1) * MAX_SGL];
        for (h, s) in held.iter_mut().zip(slot_sgl(own, r, i)) {
            if matches!(h, Held::Region) && covers(m, s) {
                *h = Held::Memory(Arc::clone(m.backing()));
            }
        }
    }
}

/// Resolves the segments of permit `i`'s READ against the registrations (the core's
/// regions first, then the fabric's table) and holds each one in `keep` until the
/// completion, so the reply's copy needs no second lookup and cannot outlive the memory.
pub(super) fn hold(
    keep: &mut [Held],
    regions: &Regions,
    fabric: &dyn Fabric,
    i: usize,
    sgl: &[Sge],
) -> Result<(), SubmitError> {
    for (index, s) in sgl.iter().enumerate() {
        let held = match regions.of(s) {
            Some(m) if m.access().contains(Access::LOCAL_WRITE) => Some(Held::Region),
            _ => fabric
                .local_memory(s, Access::LOCAL_WRITE)
                .map(Held::Memory),
        };
        match held {
            Some(h) => keep[i * MAX_SGL + index] = h,
            None => {
                keep[i * MAX_SGL..i * MAX_SGL + index].fill(Held::None);
                return Err(bad_sge(index, s));
            }
        }
    }
    Ok(())
}

fn bad_sge(index: usize, s: &Sge) -> SubmitError {
    SubmitError::BadSge {
        index,
        addr: s.addr,
        len: s.len,
        lkey: s.lkey,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::SglRef;
    use crate::fabric::loopback::LoopbackFabric;
    use crate::fabric::MemBuf;

    /// Among hundreds of regions (an SPDK application's memory, 2 MiB at a time) a
    /// segment is found by its lkey and checked against that region's bounds; a segment
    /// under another region's key, or past the end, is not; a removal moves the indices
    /// after it and the lookups follow.
    #[test]
    fn regions_are_found_by_lkey_and_bounds() {
        let lo = LoopbackFabric::new();
        let mrs: Vec<Arc<Mr>> = (0..300)
            .map(|_| {
                Arc::new(
                    lo.register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
                        .unwrap(),
                )
            })
            .collect();
        let mut regions: Regions = mrs.iter().cloned().collect();
        assert!(!regions.add(Arc::clone(&mrs[7])), "added twice");
        for (k, m) in mrs.iter().enumerate() {
            assert_eq!(regions.index(&m.sge(100, 200)), Some(k));
            let past = Sge {
                len: 200,
                ..m.sge(4000, 96)
            };
            assert_eq!(regions.index(&past), None, "past the end of {k}");
            let other = Sge {
                lkey: mrs[(k + 1) % mrs.len()].lkey(),
                ..m.sge(0, 512)
            };
            assert_eq!(regions.index(&other), None, "another region's key on {k}");
        }
        let gone = regions.remove(mrs[10].lkey()).expect("it was there");
        assert!(Arc::ptr_eq(&gone, &mrs[10]));
        assert_eq!(regions.index(&mrs[10].sge(0, 512)), None);
        assert_eq!(regions.index(&mrs[11].sge(0, 512)), Some(10));
        assert!(Arc::ptr_eq(&regions[10], &mrs[11]));
        assert_eq!(regions.index(&mrs[299].sge(0, 512)), Some(298));
    }

    /// A READ into a region holds it without a count; when the region is let go while
    /// the READ is in flight, the READ's hold takes a count of its own, and only the
    /// segments inside that region do.
    #[test]
    fn segments_held_through_a_region_take_its_memory_when_it_goes() {
        let lo = LoopbackFabric::new();
        let a = Arc::new(
            lo.register(MemBuf::zeroed(8192), Access::LOCAL_WRITE)
                .unwrap(),
        );
        let b = Arc::new(
            lo.register(MemBuf::zeroed(8192), Access::LOCAL_WRITE)
                .unwrap(),
        );
        let regions: Regions = [Arc::clone(&a), Arc::clone(&b)].into_iter().collect();
        let sgl = [a.sge(0, 512), b.sge(512, 512), a.sge(4096, 512)];
        let mut keep = vec![Held::None; MAX_SGL * 2];
        let before = Arc::strong_count(a.backing());
        hold(&mut keep, &regions, &lo, 1, &sgl).unwrap();
        let held = &keep[MAX_SGL..MAX_SGL + 3];
        assert!(held.iter().all(|h| matches!(h, Held::Region)), "{held:?}");
        assert_eq!(
            Arc::strong_count(a.backing()),
            before,
            "a count moved per IO"
        );

        // Permit 1's READ: copied into the core's entries, or held where it lies.
        let mut own = vec![Sge::default(); MAX_SGL * 2];
        own[MAX_SGL..MAX_SGL + 3].copy_from_slice(&sgl);
        let read = Req {
            state: RState::InFlight,
            nsg: 3,
            kept: true,
            ..Req::FREE
        };
        let mut reqs = vec![Req::FREE, read];
        let mut copy = keep.clone();
        hand_over(&mut copy, &reqs, &own, &a);
        // SAFETY: `sgl` outlives the use below and is not changed.
        reqs[1].held = Some(unsafe { SglRef::new(&sgl) });
        hand_over(&mut keep, &reqs, &[Sge::default(); MAX_SGL * 2], &a);
        assert_eq!(
            format!("{copy:?}"),
            format!("{keep:?}"),
            "both lists read alike"
        );
        drop(copy);
        let held = &keep[MAX_SGL..MAX_SGL + 3];
        assert!(matches!(held[0], Held::Memory(_)));
        assert!(
            matches!(held[1], Held::Region),
            "b's segment is b's business"
        );
        assert!(matches!(held[2], Held::Memory(_)));
        assert_eq!(Arc::strong_count(a.backing()), before + 2);
        assert!(keep[..MAX_SGL].iter().all(Held::is_none));
    }
}
