//! [`ClientSession`]: opening a client session and managing it at runtime — the kernel's
//! `rtrs_clt_open`, `rtrs_clt_close`, `rtrs_clt_query` and the sysfs controls
//! (`add_path`, `remove_path`, `disconnect`, `reconnect`, `mpath_policy`,
//! `max_reconnect_attempts`, `stats/`).
//!
//! [`ClientSession::open`] runs on the session's home core: it registers the home-core
//! poller that connects every path (non-blocking) and returns one [`SessionCore`] per
//! reactor core ([`ClientSession::open_on_cores`]: as many as the caller asks for). The
//! [`ClientSession`] handle is cheap to clone and usable from any thread; management
//! requests reach the home core through a queue.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::config::{ClientConfig, PathAddr};
use super::cross_core::{PathShared, SessCmd, SessShared};
use super::ctl::{ClientEvents, Ctl};
use super::error::ClientError;
use super::policy::{MpPolicy, PolicyCell, MAX_PATHS};
use super::refusal::Refusal;
use super::session_core::SessionCore;
use super::state::PathState;
use super::stats::{ClientPathStats, ClientStats};
use crate::common::random_uuid;
use crate::engine::Ctx;
use crate::fabric::{Fabric, Psk};
use crate::proto::constants::MAX_CID_NUM;
use crate::sync::lock;

/// A client session handle (cheap to clone, usable from any thread).
#[derive(Clone)]
pub struct ClientSession {
    sess: Arc<SessShared>,
}

impl std::fmt::Debug for ClientSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("sessname", &self.sess.sessname)
            .field("paths_up", &self.paths_up())
            .finish()
    }
}

/// Checks a session name as the kernel does: 1..255 bytes, no `/` or `.`.
///
/// # Errors
/// [`ClientError::BadSessname`].
pub fn check_sessname(name: &str) -> Result<(), ClientError> {
    let bad = |reason| ClientError::BadSessname {
        name: name.to_string(),
        reason,
    };
    if name.is_empty() || name.len() >= 255 {
        return Err(bad("must be 1 to 254 bytes long"));
    }
    if name.contains(['/', '.']) {
        return Err(bad("must not contain '/' or '.'"));
    }
    if name.contains('\0') {
        return Err(bad("must not contain NUL"));
    }
    Ok(())
}

impl ClientSession {
    /// Opens a session: called on the home core (`cx`), with one IO connection per
    /// reactor core (`cx.cores()`) plus cid 0 per path. Returns at once; paths connect
    /// in the background, and `events` hears `Connected` when the first path is up.
    /// The returned cores are in core order: move core `k`'s handle to reactor `k` and
    /// poll it there (every core must be polled, for failover and teardown to finish).
    ///
    /// # Errors
    /// As [`open_on_cores`](Self::open_on_cores).
    pub fn open(
        cx: &mut dyn Ctx,
        fabric: Arc<dyn Fabric>,
        config: ClientConfig,
        events: Box<dyn ClientEvents>,
    ) -> Result<(ClientSession, Vec<SessionCore>), ClientError> {
        let cores = cx.cores();
        ClientSession::open_on_cores(cx, cores, fabric, config, events)
    }

    /// [`open`](Self::open) with `cores` IO connections per path, whatever the number
    /// of reactors: the control poller still runs on `cx`'s core, and the returned
    /// handles (one per IO connection, `SessionCore::core` 0..`cores`) are polled
    /// wherever their owner wants, by one owner at a time. A handle attached to a
    /// [`CoreCq`](super::CoreCq) (of its own index) stays on the thread that polls that
    /// CQ: its connections there belong to that thread. Every handle must be polled, or
    /// dropped, for failover and teardown to finish.
    ///
    /// # Errors
    /// A bad session name, no or too many or duplicate paths, no or too many cores.
    pub fn open_on_cores(
        cx: &mut dyn Ctx,
        cores: usize,
        fabric: Arc<dyn Fabric>,
        config: ClientConfig,
        events: Box<dyn ClientEvents>,
    ) -> Result<(ClientSession, Vec<SessionCore>), ClientError> {
        check_sessname(&config.sessname)?;
        let sess = config.sessname.clone();
        if config.paths.is_empty() || config.paths.len() > MAX_PATHS {
            return Err(ClientError::PathCount {
                sess,
                n: config.paths.len(),
                max: MAX_PATHS,
            });
        }
        for (i, p) in config.paths.iter().enumerate() {
            if config.paths[..i].contains(p) {
                return Err(ClientError::DuplicatePath {
                    sess,
                    path: p.to_string(),
                });
            }
        }
        if cores == 0 || cores + 1 > usize::from(MAX_CID_NUM) {
            return Err(ClientError::Cores { sess, cores });
        }
        let shared = Arc::new(SessShared::new(
            config.sessname.clone(),
            cores,
            PolicyCell::new(config.mp_policy),
        ));
        let io_wait = u64::try_from(config.io_wait_timeout.as_nanos()).unwrap_or(u64::MAX);
        let handles = (0..cores)
            .map(|c| SessionCore::new(c, shared.clone(), fabric.clone(), io_wait))
            .collect();
        let paths: Vec<_> = config
            .paths
            .iter()
            .map(|p| (*p, config.psk_for(p).cloned()))
            .collect();
        let mut ctl = Ctl::new(shared.clone(), fabric, config, events, random_uuid());
        let now = cx.now();
        for (p, psk) in paths {
            ctl.add_path(p, psk, now);
        }
        cx.register(Box::new(ctl));
        Ok((ClientSession { sess: shared }, handles))
    }

    pub fn sessname(&self) -> &str {
        &self.sess.sessname
    }

    /// Paths connected right now.
    pub fn paths_up(&self) -> u32 {
        self.sess.paths_up.load(Ordering::Acquire)
    }

    /// Every path with its state.
    pub fn paths(&self) -> Vec<(PathAddr, PathState)> {
        self.sess
            .path_list()
            .iter()
            .map(|p| (p.addr, p.state.get()))
            .collect()
    }

    /// Why the target refused the session, while it never connected and every path's
    /// latest attempt was refused for a reason a retry will not change (requests then
    /// fail at once; see [`Refusal`]).
    pub fn refusal(&self) -> Option<Refusal> {
        lock(&self.sess.refusal).clone()
    }

    /// Whether the target refused some path's latest attempt for good: the session's
    /// [`ClientSession::refusal`] follows once every path is refused.
    pub fn refused_by_target(&self) -> bool {
        self.sess
            .path_list()
            .iter()
            .any(|p| p.target_refused.load(Ordering::Acquire))
    }

    /// Every path that is not connected, with why its latest connection attempt failed
    /// or its connection was lost (paths still on their first attempt are left out).
    pub fn path_errors(&self) -> Vec<(PathAddr, String)> {
        self.sess
            .path_list()
            .iter()
            .filter_map(|p| {
                let e = lock(&p.last_error);
                e.clone().map(|e| (p.addr, e))
            })
            .collect()
    }

    /// State of one path, if it is part of the session.
    pub fn path_state(&self, addr: PathAddr) -> Option<PathState> {
        self.sess
            .path_list()
            .iter()
            .find(|p| p.addr == addr)
            .map(|p| p.state.get())
    }

    /// Why a path stopped trying to connect, until a manual reconnect: a failed
    /// authentication (the same keys would fail the same way), or no reconnect attempts
    /// left (`max_reconnect_attempts`; the text says how many failed and the last error).
    pub fn path_failure(&self, addr: PathAddr) -> Option<String> {
        let list = self.sess.path_list();
        let p = list.iter().find(|p| p.addr == addr)?;
        let f = lock(&p.failure);
        f.clone()
    }

    pub fn policy(&self) -> MpPolicy {
        self.sess.policy.get()
    }

    /// Switches the multipath policy; requests already in flight keep theirs.
    pub fn set_policy(&self, p: MpPolicy) {
        self.sess.policy.set(p);
    }

    /// Adds a path at runtime (sysfs `add_path`), without a key.
    pub fn add_path(&self, addr: PathAddr) {
        self.sess.to_home.push(SessCmd::AddPath(addr, None));
    }

    /// Adds a path at runtime, authenticated with `psk` (tcp fabric) when given.
    pub fn add_path_psk(&self, addr: PathAddr, psk: Option<Psk>) {
        self.sess.to_home.push(SessCmd::AddPath(addr, psk));
    }

    /// Tears a path down and forgets it (sysfs `remove_path`); its IO fails over.
    pub fn remove_path(&self, addr: PathAddr) {
        self.sess.to_home.push(SessCmd::RemovePath(addr));
    }

    /// Tears a path down and leaves it closed (sysfs `disconnect`).
    pub fn disconnect_path(&self, addr: PathAddr) {
        self.sess.to_home.push(SessCmd::Disconnect(addr));
    }

    /// Reconnects a path now, resetting its attempt count (sysfs `reconnect`).
    pub fn reconnect_path(&self, addr: PathAddr) {
        self.sess.to_home.push(SessCmd::Reconnect(addr));
    }

    /// −1 for ever, 0 never, N attempts (sysfs `max_reconnect_attempts`). A path that
    /// failed more times in a row than the new limit gives up at its next failure.
    pub fn set_max_reconnect_attempts(&self, n: i32) {
        self.sess.to_home.push(SessCmd::SetMaxReconnectAttempts(n));
    }

    /// The base wait before a reconnect attempt (the jitter is added to it); an attempt
    /// already scheduled keeps its time.
    pub fn set_reconnect_delay(&self, delay: std::time::Duration) {
        self.sess.to_home.push(SessCmd::SetReconnectDelay(delay));
    }

    /// Closes the session: every path is torn down and removed; waiting and later IO
    /// fails. The home-core poller goes away when the last path is gone.
    pub fn close(&self) {
        self.sess.to_home.push(SessCmd::Close);
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.sess.closed.load(Ordering::Acquire)
    }

    /// A statistics snapshot.
    pub fn stats(&self) -> ClientStats {
        let paths = self
            .sess
            .path_list()
            .iter()
            .map(|p| {
                let now = raw_stats(p);
                match &*lock(&p.stats_base) {
                    Some(base) => now.since(base),
                    None => now,
                }
            })
            .collect();
        ClientStats {
            sessname: self.sess.sessname.clone(),
            mp_policy: self.sess.policy.get().name().to_string(),
            paths,
        }
    }

    /// Resets every path's statistics (sysfs `reset_all`): later snapshots count from
    /// now. The counters themselves are left alone, each written by its core only.
    pub fn reset_stats(&self) {
        for p in self.sess.path_list() {
            *lock(&p.stats_base) = Some(raw_stats(&p));
        }
    }
}

/// A path's counters as its cores and home have them, not counting from a reset.
fn raw_stats(p: &PathShared) -> ClientPathStats {
    let cores: Vec<_> = p.core_stats.iter().collect();
    let why = (lock(&p.failure).clone(), lock(&p.last_error).clone());
    let mut s = ClientPathStats::collect(
        p.addr.to_string(),
        p.state.get().name().to_string(),
        why,
        &p.home,
        &cores,
    );
    if let Some(h) = &*lock(&p.hca) {
        s.hca_name = Some(h.name.to_string());
        s.hca_port = Some(h.port);
    }
    s
}
