//! The session's home-core poller: per path, the connection sequence (the kernel's
//! `init_path`/`init_conns`/`create_con_cq_qp`/`rtrs_rdma_conn_established` and
//! `rtrs_send_path_info`, docs/PROTOCOL.md §3.2), the heartbeat on cid 0 (§5), error
//! recovery and teardown (`rtrs_rdma_error_recovery`, `rtrs_clt_stop_and_destroy_conns`,
//! §6.1), reconnects (`rtrs_clt_reconnect_work`, §6.4), link events (§6.3) and the
//! runtime commands (`add_path`, `remove_path`, `disconnect`, `reconnect`).
//!
//! Everything is a non-blocking state machine advanced from [`Poller::poll`]: a
//! connection request is started and its CM event picked up on a later poll, never
//! waited for. Connections of a path are made one after the other (cid 0 first: its
//! REP carries the queue depth that sizes the others); once INFO_RSP has arrived and
//! every receive is posted, connection `k+1` is handed to core `k` (`PathCmd::Up`, in `connect`).
//! Tearing a path down asks every core to drop its connection and fail its requests
//! over (`PathCmd::Down`, in `recovery`) and waits for all of them to acknowledge.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::config::{ClientConfig, PathAddr};
use super::cross_core::{PathShared, SessCmd, SessShared, SessionParams};
use super::reconnect::Reconnect;
use super::refusal::Refusal;
use super::state::PathState;
use crate::common::{Heartbeat, IuPool, LinkEvent, RtrsCon, Uuid};
use crate::engine::{Ctx, PollResult, Poller};
use crate::fabric::{Conn, Fabric, Psk};
use crate::proto::ConnAccept;
use crate::sync::lock;
use crate::Errno;

/// The layer above (RNBD's client), told on the home core when the session gains its
/// first connected path ([`LinkEvent::Connected`]) or loses its last one.
pub trait ClientEvents {
    fn link_event(&mut self, cx: &mut dyn Ctx, ev: LinkEvent);
}

/// What follows a teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// Schedule a reconnect (delay + jitter, attempts permitting).
    Reconnect,
    /// Reconnect at once (manual reconnect).
    ReconnectNow,
    /// Stay closed until a manual reconnect.
    Close,
    /// Forget the path.
    Remove,
}

/// Where the home core is in bringing one path up or taking it down (the kernel spreads
/// this over `rtrs_clt_path.state` and its work items).
pub(super) enum PathProgress {
    /// Connection `conns.len()` is being established.
    Connecting {
        conns: Vec<RtrsCon>,
        cur: Box<dyn Conn>,
        /// `cur` was made on its core's shared CQ.
        cur_on_cq: bool,
        acc: Option<ConnAccept>,
        deadline: u64,
    },
    /// Every connection is up; INFO_REQ sent on cid 0, waiting for INFO_RSP.
    Info {
        conns: Vec<RtrsCon>,
        acc: ConnAccept,
        rsp: IuPool,
        _req: IuPool,
        deadline: u64,
    },
    Connected {
        con0: RtrsCon,
        recv0: Option<IuPool>,
    },
    /// Waiting for every core to drop its connection.
    Teardown { then: After },
    /// Reconnect due at `at`.
    Waiting { at: u64 },
    /// Due to connect, but another path of the session is creating the server session
    /// (its first connection not yet accepted): connects once that one is accepted or
    /// has failed, or at `until` at the latest (`Ctl::start_connect`).
    Held { until: u64 },
    /// Closed; only a manual reconnect or removal follows.
    Idle,
}

pub(super) struct PathCtl {
    pub(super) shared: Arc<PathShared>,
    pub(super) sess_uuid: Uuid,
    pub(super) recon_cnt: u16,
    pub(super) for_new_clt: bool,
    pub(super) reconnect: Reconnect,
    pub(super) hb: Heartbeat,
    pub(super) hb_next: u64,
    pub(super) phase: PathProgress,
    /// The latest attempt was refused with this errno, which a retry will not change.
    pub(super) refused: Option<Errno>,
    /// Connection attempts started: an establishment by any but the first is a
    /// successful reconnect.
    pub(super) attempts: u64,
    /// Attempts that failed since the path was last connected (or manually reconnected),
    /// for the message of a path that gives up.
    pub(super) failed_in_row: u32,
}

/// The home-core poller of a session.
pub(super) struct Ctl {
    pub(super) sess: Arc<SessShared>,
    pub(super) fabric: Arc<dyn Fabric>,
    pub(super) cfg: ClientConfig,
    pub(super) events: Box<dyn ClientEvents>,
    pub(super) paths_uuid: Uuid,
    pub(super) paths: Vec<Option<PathCtl>>,
    pub(super) up: u32,
    pub(super) params: Option<SessionParams>,
    /// Calls of `poll` so far (paces the idle work of connected paths).
    pub(super) polls: u64,
    /// One past the highest path slot ever used (bounds the scan of every poll).
    pub(super) slots_hi: usize,
}

impl Ctl {
    pub(super) fn new(
        sess: Arc<SessShared>,
        fabric: Arc<dyn Fabric>,
        cfg: ClientConfig,
        events: Box<dyn ClientEvents>,
        paths_uuid: Uuid,
    ) -> Ctl {
        Ctl {
            sess,
            fabric,
            cfg,
            events,
            paths_uuid,
            paths: (0..super::policy::MAX_PATHS).map(|_| None).collect(),
            up: 0,
            params: None,
            polls: 0,
            slots_hi: 0,
        }
    }

    pub(super) fn cid_num(&self) -> u16 {
        (self.sess.cores + 1) as u16
    }

    /// Adds a path (authenticated with `psk`, if given) and starts connecting it.
    pub(super) fn add_path(&mut self, addr: PathAddr, psk: Option<Psk>, now: u64) {
        let list = self.sess.path_list();
        if list.iter().any(|p| p.addr == addr) {
            tracing::warn!(sess = %self.sess.sessname, path = %addr, "add_path: path already exists");
            return;
        }
        let Some(slot) = self.paths.iter().position(Option::is_none) else {
            tracing::warn!(sess = %self.sess.sessname, path = %addr, "add_path: 128 paths already");
            return;
        };
        let shared = Arc::new(PathShared::new(slot, addr, self.sess.cores, psk));
        lock(&self.sess.paths)[slot] = Some(shared.clone());
        self.sess.live_paths.fetch_add(1, Ordering::AcqRel);
        let mut pc = PathCtl {
            shared,
            sess_uuid: crate::common::random_uuid(),
            recon_cnt: 0,
            // The kernel lets a path create the server session when the session has no
            // path up (the first path of a new session, or an added one after all died).
            for_new_clt: self.up == 0,
            reconnect: Reconnect::new(self.cfg.reconnect_policy()),
            hb: Heartbeat::from_config(&self.cfg.hb),
            hb_next: 0,
            phase: PathProgress::Idle,
            refused: None,
            attempts: 0,
            failed_in_row: 0,
        };
        self.start_connect(&mut pc, now);
        self.paths[slot] = Some(pc);
        self.slots_hi = self.slots_hi.max(slot + 1);
    }

    fn run_cmd(&mut self, cx: &mut dyn Ctx, cmd: SessCmd, now: u64) {
        let find = |ctl: &Ctl, a: &PathAddr| {
            ctl.paths
                .iter()
                .position(|p| p.as_ref().is_some_and(|p| p.shared.addr == *a))
        };
        let (slot, then) = match cmd {
            SessCmd::AddPath(a, psk) => return self.add_path(a, psk, now),
            SessCmd::SetMaxReconnectAttempts(n) => {
                self.cfg.max_reconnect_attempts = n;
                self.paths
                    .iter_mut()
                    .flatten()
                    .for_each(|p| p.reconnect.set_max_attempts(n));
                return;
            }
            SessCmd::SetReconnectDelay(d) => {
                self.cfg.reconnect_delay = d;
                self.paths
                    .iter_mut()
                    .flatten()
                    .for_each(|p| p.reconnect.set_delay(d));
                return;
            }
            SessCmd::Close => {
                self.sess.closed.store(true, Ordering::Release);
                for s in 0..self.paths.len() {
                    if self.paths[s].is_some() {
                        self.stop_path(cx, s, After::Remove, now);
                    }
                }
                return;
            }
            SessCmd::RemovePath(a) => (find(self, &a), After::Remove),
            SessCmd::Disconnect(a) => (find(self, &a), After::Close),
            SessCmd::Reconnect(a) => (find(self, &a), After::ReconnectNow),
        };
        match slot {
            Some(s) => self.stop_path(cx, s, then, now),
            None => tracing::warn!(sess = %self.sess.sessname, "no such path for {then:?}"),
        }
    }

    fn stop_path(&mut self, cx: &mut dyn Ctx, slot: usize, then: After, now: u64) {
        let Some(mut pc) = self.paths[slot].take() else {
            return;
        };
        pc.reconnect.reset();
        pc.failed_in_row = 0;
        if then == After::ReconnectNow {
            *lock(&pc.shared.failure) = None;
        }
        match (&pc.phase, then) {
            (PathProgress::Teardown { .. }, _) => pc.phase = PathProgress::Teardown { then },
            (PathProgress::Idle, After::ReconnectNow) => {
                let _ = pc.shared.state.change(PathState::Reconnecting);
                pc.phase = PathProgress::Waiting { at: now };
            }
            (PathProgress::Waiting { .. }, After::ReconnectNow) => {
                pc.phase = PathProgress::Waiting { at: now }
            }
            (PathProgress::Idle, After::Remove) => {
                let _ = pc.shared.state.change(PathState::Dead);
                self.forget(&pc);
                return;
            }
            (PathProgress::Idle, _) => {}
            _ => self.begin_teardown(cx, &mut pc, then),
        }
        self.paths[slot] = Some(pc);
    }

    /// The session is refused while it never connected and every path's latest attempt
    /// was refused permanently (see [`super::refusal`]); lifted otherwise.
    fn update_refusal(&mut self) {
        let now = if self.params.is_some() {
            None
        } else {
            let mut refused = Vec::new();
            let mut all = true;
            for pc in self.paths[..self.slots_hi].iter().flatten() {
                match pc.refused {
                    Some(e) => refused.push((pc.shared.addr, e)),
                    None => all = false,
                }
            }
            if all {
                Refusal::of(&refused)
            } else {
                None
            }
        };
        let mut cur = lock(&self.sess.refusal);
        if *cur != now {
            if let Some(r) = &now {
                tracing::warn!(sess = %self.sess.sessname, "{r}; requests fail until a path connects");
            }
            *cur = now;
        }
    }

    pub(super) fn forget(&mut self, pc: &PathCtl) {
        lock(&self.sess.paths)[pc.shared.slot] = None;
    }
}

/// Loops of the home core between visits of a connected path's control connection
/// (cid 0: heartbeats only; on the software fabrics each visit costs progress passes).
/// A failed IO connection or a due heartbeat is handled at the next loop regardless.
const CTL_POLL_EVERY: u64 = 16;

impl Poller for Ctl {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let now = cx.now();
        let mut busy = false;
        while let Some(cmd) = self.sess.to_home.pop() {
            self.run_cmd(cx, cmd, now);
            busy = true;
        }
        self.polls = self.polls.wrapping_add(1);
        let paced = self.polls % CTL_POLL_EVERY != 0;
        for slot in 0..self.slots_hi {
            // Nothing to do for this path in this loop: leave it in place (moving a
            // path out and back costs a copy of it).
            match self.paths[slot].as_ref().map(|pc| &pc.phase) {
                None | Some(PathProgress::Idle) => continue,
                Some(PathProgress::Waiting { at }) if now < *at => continue,
                Some(PathProgress::Connected { .. }) if paced => {
                    let pc = self.paths[slot].as_ref().expect("matched Some above");
                    if now < pc.hb_next && !pc.shared.error.load(Ordering::Relaxed) {
                        continue;
                    }
                }
                _ => {}
            }
            let Some(mut pc) = self.paths[slot].take() else {
                continue;
            };
            let mut gone = false;
            busy |= match pc.phase {
                PathProgress::Connecting { .. } => self.drive_connecting(&mut pc, now),
                PathProgress::Info { .. } => self.drive_info(cx, &mut pc, now),
                PathProgress::Connected { .. } => self.drive_connected(cx, &mut pc, now),
                PathProgress::Teardown { .. } => {
                    gone = self.drive_teardown(&mut pc, now);
                    true
                }
                PathProgress::Waiting { at } if now >= at => {
                    if pc.shared.state.change(PathState::Connecting).is_ok() {
                        self.start_connect(&mut pc, now);
                    } else {
                        pc.phase = PathProgress::Idle;
                    }
                    true
                }
                PathProgress::Held { .. } => {
                    self.start_connect(&mut pc, now);
                    !matches!(pc.phase, PathProgress::Held { .. })
                }
                PathProgress::Waiting { .. } | PathProgress::Idle => false,
            };
            if gone {
                self.forget(&pc);
            } else {
                self.paths[slot] = Some(pc);
            }
        }
        if busy {
            self.update_refusal();
        }
        if self.sess.closed.load(Ordering::Acquire) && self.paths.iter().all(Option::is_none) {
            if let Some(id) = cx.current() {
                cx.unregister(id);
            }
        }
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    fn shutdown(&mut self, _cx: &mut dyn Ctx) {
        self.sess.closed.store(true, Ordering::Release);
    }

    fn name(&self) -> &str {
        "rtrs-clt-session"
    }
}

pub(super) fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
