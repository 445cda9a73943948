//! [`CoreCq`]: one core's completion queue, shared by the IO connections of every path
//! of every session on that core (docs/ARCHITECTURE.md, "Completion queues" and
//! "Sessions on cores").
//!
//! Whoever runs the core's loop makes it, attaches each [`SessionCore`] of the core to
//! it ([`SessionCore::attach`]) and calls [`CoreCq::poll`] once per loop, before it
//! polls the sessions. That poll takes a batch from the CQ (a round of calls, each
//! giving one connection's completions) and marks each completion
//! with its connection's route (found by `qp_num`); each session's poll then takes the
//! completions of its own connections out of the batch, in order, and handles them as
//! it handles its private CQ's. A completion taken is marked taken, so it is handled
//! once; one not taken yet (its session was not polled this loop) stays, in order,
//! ahead of what the next poll adds.
//!
//! The hub and its sessions are on one thread: the state sits in an
//! [`OwnedByThread`] (the fabric's own one-thread cell), reached with a load and two
//! plain stores, no lock and no read-modify-write. A connection is made on the CQ by the
//! session's control (`Fabric::connect` with `ConnectOptions::on`), released, and taken by
//! the session when it arrives ([`RtrsCon::adopt`]) together with its route: the CQ reports
//! nothing of a connection before the core took it, and nothing after its route went (a
//! completion of no route is dropped, so a flush of a dead connection can never reach a
//! later connection given the same `qp_num`).
//!
//! [`SessionCore`]: super::SessionCore
//! [`SessionCore::attach`]: super::SessionCore::attach
//! [`RtrsCon::adopt`]: crate::common::RtrsCon::adopt

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::cross_core::SessShared;
use crate::fabric::cq::OwnedByThread;
use crate::fabric::{Cq, CqEvent, CqRef, Fabric, FabricError, Wc};
use crate::sync::lock;

/// Completions taken from the CQ per loop (at most; fewer while some wait untaken).
const HUB_BATCH: usize = 64;

/// A batch entry already taken (or dropped); no route.
const TAKEN: u32 = u32::MAX;

/// The `qp_num` of a free route: none (verbs' are 24 bits; the software fabrics count
/// theirs from 1 and never reach it).
const NO_QP: u32 = u32::MAX;

/// Loops between looks at the CQ's events (overrun) and sweeps of dead routes; verbs
/// reads its events with a system call.
const EVENT_EVERY: u64 = 256;

/// One connection on the CQ: the session whose core holds it (its `qp_num` is in
/// [`HubState::qps`]).
struct Route {
    sess: Arc<SessShared>,
}

/// The CQ and the batch of the current loop.
pub(super) struct HubState {
    cq: Cq,
    wcs: [Wc; HUB_BATCH],
    /// Per batch entry: its route, or [`TAKEN`].
    dest: [u32; HUB_BATCH],
    /// Entries in the batch (taken ones included).
    n: usize,
    /// Entries not taken yet.
    left: usize,
    routes: Vec<Option<Route>>,
    /// Per route, its connection's `qp_num` ([`NO_QP`] for a free route): what the
    /// lookup per completion reads.
    qps: Vec<u32>,
    /// The route of the last completion (consecutive completions are often one
    /// connection's).
    last: u32,
    polls: u64,
    /// The core (its sessions' `core_gone` entry says whether a route is dead).
    core: usize,
    broken: bool,
}

/// What a core's CQ and the sessions attached to it share (see the module doc).
pub(super) struct Hub {
    pub core: usize,
    pub share: CqRef,
    pub st: OwnedByThread<HubState>,
    /// Sessions attached, told when the CQ fails (overrun): their new connections then
    /// get private CQs. Touched when a session attaches and on overrun only.
    attached: Mutex<Vec<Weak<SessShared>>>,
    /// Set (under `attached`'s lock) when the CQ overran.
    broken: AtomicBool,
}

/// One core's shared completion queue for its sessions' IO connections (see the
/// module doc). Made by the owner of the core's loop, polled once per loop on the
/// core's thread.
pub struct CoreCq {
    hub: Arc<Hub>,
}

impl std::fmt::Debug for CoreCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreCq")
            .field("core", &self.hub.core)
            .finish()
    }
}

impl CoreCq {
    /// A CQ of `fabric` for core `core`'s sessions.
    ///
    /// # Errors
    /// The fabric's, when it has no shared CQs ([`Fabric::create_cq`]): the core's
    /// sessions then keep a private CQ per connection, as when no `CoreCq` is attached.
    pub fn new(fabric: &dyn Fabric, core: usize) -> Result<CoreCq, FabricError> {
        let cq = fabric.create_cq(fabric.caps().core_cq_entries)?;
        let share = cq.share();
        Ok(CoreCq {
            hub: Arc::new(Hub {
                core,
                share,
                st: OwnedByThread::new(HubState {
                    cq,
                    wcs: [Wc::default(); HUB_BATCH],
                    dest: [TAKEN; HUB_BATCH],
                    n: 0,
                    left: 0,
                    routes: Vec::new(),
                    qps: Vec::new(),
                    last: TAKEN,
                    polls: 0,
                    core,
                    broken: false,
                }),
                attached: Mutex::new(Vec::new()),
                broken: AtomicBool::new(false),
            }),
        })
    }

    /// The core whose sessions it serves.
    pub fn core(&self) -> usize {
        self.hub.core
    }

    /// Polls the CQ, once per loop of the core, before the core's sessions are polled;
    /// returns how many completions it took. On the core's thread only: the first poll
    /// binds it there, with the connections its sessions take.
    pub fn poll(&mut self) -> usize {
        let (got, overran) = self.hub.st.with(HubState::poll).unwrap_or((0, false));
        if overran {
            tracing::error!(core = self.hub.core, "a core's completion queue overran: its connections break; new ones get private completion queues");
            let mut att = lock(&self.hub.attached);
            self.hub.broken.store(true, Ordering::Relaxed);
            for s in att.iter().filter_map(Weak::upgrade) {
                s.forget_cq(self.hub.core);
            }
            att.clear();
        }
        got
    }

    /// Connections routed through it now (asked on the core's thread, after a poll;
    /// 0 from another thread).
    pub fn connections(&self) -> usize {
        self.hub
            .st
            .with_held(|st| st.routes.iter().flatten().count())
            .unwrap_or(0)
    }

    pub(super) fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }
}

impl Hub {
    /// Records that `sess` connects on this CQ (told if it fails); false once it failed.
    pub(super) fn attach(&self, sess: &Arc<SessShared>) -> bool {
        let mut att = lock(&self.attached);
        // Set under the lock the overrun takes: either the CQ is still good, or the
        // overrun already told every session attached before.
        if self.broken.load(Ordering::Relaxed) {
            return false;
        }
        att.retain(|w| w.strong_count() > 0);
        if !att.iter().any(|w| w.as_ptr() == Arc::as_ptr(sess)) {
            att.push(Arc::downgrade(sess));
        }
        true
    }
}

impl HubState {
    /// The loop's poll; also says whether the CQ just overran.
    fn poll(&mut self) -> (usize, bool) {
        self.polls = self.polls.wrapping_add(1);
        let overran = self.polls % EVENT_EVERY == 0 && self.events();
        // What no session took yet keeps its place, in order, ahead of the new batch.
        let start = if self.left > 0 { self.compact() } else { 0 };
        // A software CQ's call gives one connection's completions, and the calls until
        // one returns nothing are a round, one turn per connection (docs/ARCHITECTURE.md,
        // "Completion queues"): calls until the round ends or the batch is full (a call
        // per connection with completions, and one more), so a loop takes what every
        // connection has. Each call's completions go after the last call's, so one
        // connection's stay in order (the rest of a turn that did not fit comes first in
        // the next loop's call). They are handled after the loop, unlike the server's,
        // which handles each call's before the next: the client needs no read order
        // across connections, since a request is re-sent on another path only after the
        // dying connection was drained and dropped with its route, so nothing of the
        // old path can land after the new copy's answer.
        let mut got = 0;
        loop {
            let n = self.cq.poll(&mut self.wcs[start + got..]);
            got += n;
            if n == 0 || start + got == self.wcs.len() {
                break;
            }
        }
        let mut left = start;
        for k in start..start + got {
            let r = self.route_of(self.wcs[k].qp_num);
            if r == TAKEN {
                tracing::debug!(
                    qp_num = self.wcs[k].qp_num,
                    "completion of a connection gone from this core"
                );
            } else {
                left += 1;
            }
            self.dest[k] = r;
        }
        self.n = start + got;
        self.left = left;
        (got, overran)
    }

    /// Moves the entries not taken (of routes still live) to the front, in order;
    /// returns how many.
    fn compact(&mut self) -> usize {
        let mut kept = 0;
        for k in 0..self.n {
            let r = self.dest[k];
            if r == TAKEN || !self.live(r) {
                continue;
            }
            self.wcs[kept] = self.wcs[k];
            self.dest[kept] = r;
            kept += 1;
        }
        kept
    }

    /// The route of `qp` ([`TAKEN`]: none), the last one hit first.
    #[inline]
    fn route_of(&mut self, qp: u32) -> u32 {
        if self.qps.get(self.last as usize) == Some(&qp) {
            return self.last;
        }
        match self.qps.iter().position(|&q| q == qp) {
            Some(i) => {
                self.last = i as u32;
                self.last
            }
            None => TAKEN,
        }
    }

    /// Whether route `r` still has a session core to take its completions (a session
    /// core dropped without unregistering has none).
    fn live(&self, r: u32) -> bool {
        match self.routes.get(r as usize) {
            Some(Some(route)) => !route.sess.core_gone[self.core].load(Ordering::Acquire),
            _ => false,
        }
    }

    /// Reads the CQ's events (true on a new overrun: every connection on it breaks)
    /// and drops the routes of session cores gone.
    fn events(&mut self) -> bool {
        let mut overran = false;
        if let Some(CqEvent::Overrun) = self.cq.poll_event() {
            overran = !self.broken;
            self.broken = true;
        }
        for k in 0..self.routes.len() {
            if self.routes[k].is_some() && !self.live(k as u32) {
                self.unregister(k as u32);
            }
        }
        overran
    }

    /// Routes the completions of connection `qp` (taken by the session core of
    /// `sess`) from the next poll on; returns the route.
    pub(super) fn register(&mut self, qp: u32, sess: &Arc<SessShared>) -> u32 {
        let route = Route {
            sess: Arc::clone(sess),
        };
        match self.routes.iter().position(Option::is_none) {
            Some(i) => {
                self.routes[i] = Some(route);
                self.qps[i] = qp;
                i as u32
            }
            None => {
                self.routes.push(Some(route));
                self.qps.push(qp);
                (self.routes.len() - 1) as u32
            }
        }
    }

    /// The connection of route `r` is gone: what of it is still in the batch is
    /// dropped with it, and the route may serve another connection.
    pub(super) fn unregister(&mut self, r: u32) {
        if let Some(slot) = self.routes.get_mut(r as usize) {
            *slot = None;
            self.qps[r as usize] = NO_QP;
        }
        for k in 0..self.n {
            if self.dest[k] == r {
                self.dest[k] = TAKEN;
                self.left -= 1;
            }
        }
    }

    /// Moves the completions of route `r` in this loop's batch into `wcs`, in order;
    /// returns how many.
    #[inline]
    pub(super) fn take(&mut self, r: u32, wcs: &mut [Wc]) -> usize {
        if self.left == 0 {
            return 0;
        }
        let mut got = 0;
        for k in 0..self.n {
            if got == wcs.len() {
                break;
            }
            if self.dest[k] == r {
                wcs[got] = self.wcs[k];
                self.dest[k] = TAKEN;
                got += 1;
            }
        }
        self.left -= got;
        got
    }
}
