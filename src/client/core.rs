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
//! back or `io_wait_timeout` passes, then fails with −ENOTCONN. When a path dies, the
//! requests in flight on it on this core are re-sent on this core over another path
//! with the same permit (failover); each completes exactly once.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::error::SubmitError;
use super::permit::{partition, Permits};
use super::policy::{Candidate, MpPolicy, Selector, MAX_PATHS};
use super::shared::{CoreCmd, IoConn, Params, PathShared, SessShared};
use crate::common::{Dir, IuPool};
use crate::fabric::{Access, Fabric, FastMr, MemBuf, Mr, Sge};
use crate::proto::constants::MAX_SEGMENTS;

/// Most scatter-gather entries per request (`RTRS_MAX_SEGMENTS`).
pub const MAX_SGL: usize = MAX_SEGMENTS as usize;
/// Errno of a request that found no path within the wait (positive value).
pub const ENOTCONN: i32 = 107;
/// Errno of a request that cannot be encoded for the session (positive value).
pub const EINVAL: i32 = 22;
/// Errno of a waiting request dropped by a queue-depth change (positive value).
pub const ECONNRESET: i32 = 104;

/// One request for [`SessionCore::submit`].
///
/// `sgl` names memory registered with the session's fabric. It must stay valid, and
/// must not be read (for a READ) or written (for a WRITE) by anyone else, until the
/// request's completion comes out of [`SessionCore::poll`]: the client copies from it
/// (multi-segment WRITE) and into it (READ) by address, as a DMA engine would.
#[derive(Debug, Clone, Copy)]
pub struct ClientIo<'a> {
    /// Returned in the completion.
    pub tag: u64,
    pub dir: Dir,
    /// User header (≤ [`SessionCore::max_usr_hdr`]).
    pub usr: &'a [u8],
    /// Data (WRITE) or reply space (READ), ≤ [`SessionCore::max_io_size`] in total.
    pub sgl: &'a [Sge],
    /// An administrative request (RNBD's SESS_INFO/OPEN/CLOSE). Carried like any other
    /// request on this core's connection (see the module doc of `client`).
    pub admin: bool,
}

/// A finished request: 0 or a negative errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClientCompletion {
    pub tag: u64,
    pub errno: i32,
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
    pub deadline: u64,
    pub failed_over: bool,
    /// The READ reply went straight into the caller's registered region.
    pub direct: bool,
}

impl Req {
    const FREE: Req = Req {
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
        deadline: 0,
        failed_over: false,
        direct: false,
    };

    pub fn has_desc(&self) -> bool {
        self.dir == Dir::Read && self.data_len > 0
    }
}

/// Per-permit registered memory of a core.
pub(super) struct Res {
    /// `max_hdr_size` bytes per permit: user header then the RTRS trailer.
    pub hdr: IuPool,
    /// `max_io_size` bytes per permit: READ replies, multi-segment WRITE data.
    pub bounce: Mr,
    /// The READ reply's key slot per permit.
    pub fmr: Vec<FastMr>,
    /// Whether each slot's binding is retired, live, or unknown.
    pub fmr_state: Vec<FmrState>,
}

/// The binding of a permit's fast-registration slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FmrState {
    /// Never bound, or retired (the server's SEND_WITH_INV, IO_RSP_W_INV).
    Free,
    /// Bound and not retired: a LOCAL_INV goes before the next binding (the kernel's
    /// local invalidation when the response came without W_INV).
    Bound,
    /// Unknown (the path died with the request in flight): the slot is replaced by a
    /// fresh one, so a late write through the old key can never reach reused memory.
    Unknown,
}

/// This core's connection of one path.
pub(super) struct CorePath {
    pub io: Box<IoConn>,
    pub shared: Arc<PathShared>,
    pub inflight: u32,
}

/// One core's handle of a session (see the module doc). Made by
/// [`super::Session::open`], one per core; move each to its core and poll it there.
pub struct SessionCore {
    pub(super) core: usize,
    pub(super) sess: Arc<SessShared>,
    pub(super) fabric: Arc<dyn Fabric>,
    pub(super) io_wait_ns: u64,
    pub(super) params: Option<Params>,
    pub(super) permits: Permits,
    pub(super) reqs: Vec<Req>,
    /// `MAX_SGL` entries per permit.
    pub(super) sgl: Vec<Sge>,
    pub(super) res: Option<Res>,
    pub(super) paths: Vec<Option<CorePath>>,
    pub(super) cands: Vec<Candidate>,
    pub(super) sel: Selector,
    pub(super) wait: VecDeque<u16>,
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
    pub(super) regions: Vec<Arc<Mr>>,
    /// Completion arrays of [`SessionCore::poll`] (`None` only while it runs).
    pub(super) scratch: Option<Box<super::io::PollScratch>>,
}

impl std::fmt::Debug for SessionCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionCore")
            .field("sess", &self.sess.sessname)
            .field("core", &self.core)
            .field("permits", &self.permits.capacity())
            .field("in_use", &self.permits.in_use())
            .finish()
    }
}

impl Drop for SessionCore {
    /// A core handle going away disconnects its connections and stops taking part in
    /// teardowns, so the other cores' paths are not held up waiting for it.
    fn drop(&mut self) {
        self.sess.core_gone[self.core].store(true, Ordering::Release);
        for cp in self.paths.iter_mut().flatten() {
            cp.io.con.disconnect();
        }
        while let Some(cmd) = self.sess.to_core[self.core].pop() {
            match cmd {
                CoreCmd::Down { slot } => {
                    let p = self.sess.paths.lock().unwrap_or_else(|e| e.into_inner())[slot].clone();
                    if let Some(p) = p {
                        p.acks.fetch_add(1, Ordering::AcqRel);
                    }
                }
                CoreCmd::Up { mut conn, .. } => conn.con.disconnect(),
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
            fabric,
            io_wait_ns,
            params: None,
            permits: Permits::new(0..0),
            reqs: Vec::new(),
            sgl: Vec::new(),
            res: None,
            paths: (0..MAX_PATHS).map(|_| None).collect(),
            cands: vec![Candidate::default(); MAX_PATHS],
            sel: Selector::new(),
            wait: VecDeque::new(),
            done: VecDeque::new(),
            max_send_sge: 1,
            nslots: 0,
            warn_next_ns: 0,
            warn_suppressed: 0,
            polls: 0,
            regions: Vec::new(),
            scratch: Some(Box::default()),
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

    /// Largest data size of one request (0 before the session first connected).
    pub fn max_io_size(&self) -> u32 {
        self.params.map_or(0, |p| p.max_io_size)
    }

    /// How long a request waits for a path (the session's
    /// [`io_wait_timeout`](super::ClientConfig::io_wait_timeout)).
    pub fn io_wait_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.io_wait_ns)
    }

    /// Largest user header (0 before the session first connected).
    pub fn max_usr_hdr(&self) -> u32 {
        self.params.map_or(0, |p| p.max_usr_hdr())
    }

    /// The session's queue depth (0 before the session first connected).
    pub fn queue_depth(&self) -> u16 {
        self.params.map_or(0, |p| p.queue_depth)
    }

    /// Permits this core owns (its share of the queue depth).
    pub fn permits(&self) -> u32 {
        self.permits.capacity()
    }

    /// Lets single-segment READs into `mr` skip the bounce area: the permit's
    /// fast-registration slot is bound to the caller's segment inside `mr` and the
    /// server writes there directly (the kernel's way; zero copy). `mr` must come from
    /// the session's fabric; it is kept alive here until [`remove_region`](Self::remove_region).
    pub fn add_region(&mut self, mr: Arc<Mr>) {
        if !self.regions.iter().any(|m| Arc::ptr_eq(m, &mr)) {
            self.regions.push(mr);
        }
    }

    /// Stops using the region with local key `lkey` for zero-copy READs. Requests
    /// already posted into it still complete into it.
    pub fn remove_region(&mut self, lkey: u32) {
        self.regions.retain(|m| m.lkey() != lkey);
    }

    /// Why the target refused the session, if it did (see `Session::refusal`).
    pub fn refusal(&self) -> Option<super::Refusal> {
        self.sess
            .refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Requests submitted here and not yet completed.
    pub fn outstanding(&self) -> u32 {
        self.permits.in_use()
    }

    /// Submits a request; its completion comes out of [`poll`](Self::poll) on this core.
    ///
    /// # Errors
    /// [`SubmitError::Busy`] when this core's permits are all in use (retry after
    /// completions); `TooLarge`, `HeaderTooLarge`, `TooManySegments` for a request the
    /// session cannot carry; `NoPath` when the session is closed, has no path that may
    /// come back, or has not connected yet (wait for the `Connected` link event);
    /// `Refused` when it never connected and the target refused every path for good
    /// ([`refusal`](Self::refusal) says why).
    pub fn submit(&mut self, now: u64, io: ClientIo<'_>) -> Result<(), SubmitError> {
        let Some(p) = self.params else {
            return Err(match self.refusal() {
                Some(r) => SubmitError::Refused { errno: r.errno },
                None => SubmitError::NoPath,
            });
        };
        if self.sess.closed.load(Ordering::Acquire) {
            return Err(SubmitError::NoPath);
        }
        if io.usr.len() > p.max_usr_hdr() as usize {
            return Err(SubmitError::HeaderTooLarge {
                len: io.usr.len(),
                max: p.max_usr_hdr(),
            });
        }
        if io.sgl.len() > MAX_SGL {
            return Err(SubmitError::TooManySegments {
                n: io.sgl.len(),
                max: MAX_SGL,
            });
        }
        let len: u64 = io.sgl.iter().map(|s| u64::from(s.len)).sum();
        if len > u64::from(p.max_io_size) {
            return Err(SubmitError::TooLarge {
                len,
                max: p.max_io_size,
            });
        }
        let Some(buf_id) = self.permits.get() else {
            return Err(SubmitError::Busy {
                capacity: self.permits.capacity(),
            });
        };
        let i = usize::from(buf_id - self.permits.range().start);
        let res = self
            .res
            .as_ref()
            .expect("resources exist once params are known");
        res.hdr.write(i, io.usr);
        self.sgl[i * MAX_SGL..i * MAX_SGL + io.sgl.len()].copy_from_slice(io.sgl);
        let bounced =
            io.dir == Dir::Write && len > 0 && (io.sgl.len() > 1 || self.max_send_sge < 2);
        if bounced {
            let mut off = i * p.max_io_size as usize;
            for s in io.sgl {
                // SAFETY: the caller guarantees (ClientIo's contract) that each SGE names
                // valid memory not written by anyone until completion; the bounce area of
                // permit `i` is ours alone until the permit is returned.
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
        self.reqs[i] = Req {
            state: RState::Waiting,
            tag: io.tag,
            dir: io.dir,
            usr_len: io.usr.len() as u16,
            nsg: io.sgl.len() as u8,
            data_len: len as u32,
            bounced,
            path: 0,
            policy: MpPolicy::MinInflight,
            start_ns: now,
            deadline: now.saturating_add(self.io_wait_ns),
            failed_over: false,
            direct: false,
        };
        match self.try_post(i, now) {
            super::io::Posted::Yes => {}
            super::io::Posted::Invalid => self.finish(i, -EINVAL, now),
            super::io::Posted::NoPath | super::io::Posted::Retry => self.wait.push_back(buf_id),
        }
        Ok(())
    }

    /// Makes progress (connections, failover, waiting requests) and moves up to
    /// `out.len()` completions into `out`; returns how many.
    pub fn poll(&mut self, now: u64, out: &mut [ClientCompletion]) -> usize {
        self.polls = self.polls.wrapping_add(1);
        while let Some(cmd) = self.sess.to_core[self.core].pop() {
            self.on_cmd(cmd, now);
        }
        // The completion arrays live in the handle (not re-initialised on the stack by
        // every poll); taken out while the paths are polled.
        let mut scratch = self.scratch.take().unwrap_or_default();
        for slot in 0..self.nslots {
            if self.paths[slot].is_none() {
                continue;
            }
            self.poll_path(slot, &mut scratch, now);
        }
        self.scratch = Some(scratch);
        if !self.wait.is_empty() {
            self.drive_wait(now);
        }
        let n = out.len().min(self.done.len());
        for (o, c) in out.iter_mut().zip(self.done.drain(..n)) {
            *o = c;
        }
        n
    }

    fn on_cmd(&mut self, cmd: CoreCmd, now: u64) {
        match cmd {
            CoreCmd::Up { path, params, conn } => {
                if self.params != Some(params) {
                    self.setup(params, now);
                }
                self.max_send_sge = conn.con.conn().caps().max_send_sge;
                let slot = path.slot;
                self.nslots = self.nslots.max(slot + 1);
                self.paths[slot] = Some(super::core::CorePath {
                    io: conn,
                    shared: path,
                    inflight: 0,
                });
            }
            CoreCmd::Down { slot } => {
                if let Some(path) = self.paths[slot].as_ref().map(|c| c.shared.clone()) {
                    self.teardown(slot, now);
                    path.acks.fetch_add(1, Ordering::AcqRel);
                } else if let Some(p) =
                    self.sess.paths.lock().unwrap_or_else(|e| e.into_inner())[slot].clone()
                {
                    p.acks.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// (Re)sizes the per-permit state for new session limits. Requests waiting from
    /// before a queue-depth change cannot keep their permit and fail with −ECONNRESET.
    fn setup(&mut self, params: Params, now: u64) {
        let _ = now;
        while let Some(b) = self.wait.pop_front() {
            let i = usize::from(b - self.permits.range().start);
            self.finish(i, -ECONNRESET, now);
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
        let bounce = self.fabric.register(
            MemBuf::zeroed(cnt * params.max_io_size as usize),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        );
        let fmr: Result<Vec<FastMr>, _> = (0..n).map(|_| self.fabric.alloc_fast_mr()).collect();
        match (hdr, bounce, fmr) {
            (Ok(hdr), Ok(bounce), Ok(fmr)) => {
                self.res = Some(Res {
                    hdr,
                    bounce,
                    fmr,
                    fmr_state: vec![FmrState::Free; n],
                });
                self.permits = Permits::new(range);
            }
            (h, b, f) => {
                let err = h.err().or(b.err()).or(f.err());
                tracing::error!(sess = %self.sess.sessname, core = self.core, "cannot allocate per-permit buffers: {err:?}; this core gets no permits");
                self.res = None;
                self.permits = Permits::new(0..0);
            }
        }
        self.reqs = vec![Req::FREE; n];
        self.sgl = vec![Sge::default(); n * MAX_SGL];
        self.wait = VecDeque::with_capacity(n);
        self.done.reserve(2 * n);
        self.params = Some(params);
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

    /// Completes request `i` with `errno` and returns its permit.
    pub(super) fn finish(&mut self, i: usize, errno: i32, now: u64) {
        let r = self.reqs[i];
        if r.state == RState::InFlight {
            if let Some(cp) = self.paths[r.path].as_mut() {
                let st = &cp.shared.core_stats[self.core];
                st.on_latency(now.saturating_sub(r.start_ns));
                if r.policy == MpPolicy::MinInflight {
                    cp.inflight = cp.inflight.saturating_sub(1);
                    st.inflight.sub(1);
                }
            }
        }
        self.reqs[i].state = RState::Free;
        self.done.push_back(ClientCompletion { tag: r.tag, errno });
        let b = self.permits.range().start + i as u16;
        self.permits.put(b);
    }
}
