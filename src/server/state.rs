//! State shared by every core of one server: configuration, the session table, the per-core
//! inboxes that carry connections and teardown work between cores, and the rate limit of
//! messages about peers (refusals, violations, closed paths). Also the one place a path is
//! closed from (the kernel's `close_path` → `rtrs_srv_close_work` trigger).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::common::Inbox;

use crate::common::RtrsCon;
use crate::engine::{Ctx, Msg};
use crate::fabric::{CqRef, Fabric};
use crate::ratelimit::{log_limited, RateLimit};

use super::config::ServerConfig;
use super::session::{Path, Sessions, CLOSING, CONNECTED, CONNECTING};
use super::slots::Caps;

/// Work for one core, delivered through its inbox.
pub(crate) enum PathWork {
    /// Serve this connection (a cid of `path`) on this core.
    AddCon { path: Arc<Path>, con: RtrsCon },
    /// Home core: finalise `path` once it has drained.
    Finalize(Arc<Path>),
    /// Close `path` (an administrative disconnect).
    Close(Arc<Path>),
}

pub(crate) struct ServerState {
    pub cfg: ServerConfig,
    /// The caps in effect ([`ServerConfig::session_cap`], `connection_cap`).
    pub caps: Caps,
    pub fabric: Arc<dyn Fabric>,
    /// The fabric's [`FabricCaps::local_ops_at_post`](crate::fabric::FabricCaps): a
    /// request's LOCAL_INV of its chunk key is done once posted, so the request goes on
    /// at once instead of one poll later, with the completion.
    pub inv_at_post: bool,
    pub ncores: usize,
    pub table: Mutex<Sessions>,
    pub inbox: Vec<Inbox<PathWork>>,
    pub stop: AtomicBool,
    pub next_home: AtomicUsize,
    pub next_id: AtomicU64,
    /// Pollers (acceptor and cores) still registered.
    pub pollers: AtomicUsize,
    /// Messages about peers: refused connections, protocol violations, closed paths.
    pub log: RateLimit,
    /// Paths connected (info): a budget of their own, so that a flood of sessions does
    /// not crowd the refusals out of the log where info lines are printed (SPDK).
    pub info_log: RateLimit,
    /// Each core's shared completion queue, to accept its connections on (set by the
    /// core's poller when it starts; unset where the fabric has none: then each
    /// connection has its own).
    pub cqs: Vec<OnceLock<CqRef>>,
}

fn wake(_: &mut dyn Ctx, _: u64) {}

impl ServerState {
    /// Delivers `cmd` to `core`'s inbox and wakes that core.
    pub fn post(&self, cx: &mut dyn Ctx, core: usize, cmd: PathWork) {
        self.inbox[core].push(cmd);
        if core != cx.core() {
            // Only a wake-up: the inbox is drained on every poll, so a full mailbox
            // delays nothing beyond the reactor's next loop.
            let _ = cx.send(core, Msg::call(wake, 0));
        }
    }

    /// Core serving connection `cid` of a path whose session lives on `home`.
    pub fn core_of(&self, cid: u16, home: usize) -> usize {
        if cid == 0 {
            home
        } else {
            (usize::from(cid) - 1) % self.ncores
        }
    }

    /// Closes `path` (from CONNECTING or CONNECTED; later calls do nothing): every core
    /// disconnects its connections of the path on its next poll, requests still with the
    /// handler are answered into the void, and the home core finalises the path once all
    /// of that has drained. `why` is logged (rate-limited).
    pub fn close_path(&self, cx: &mut dyn Ctx, path: &Arc<Path>, why: fmt::Arguments<'_>) {
        let mut cur = path.state();
        loop {
            if cur != CONNECTING && cur != CONNECTED {
                return;
            }
            match path
                .state
                .compare_exchange(cur, CLOSING, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        log_limited!(
            self.log,
            cx.now(),
            WARN,
            "rtrs-srv: {} path {:?} ({}@{}): closing: {why}",
            path.sess.id,
            path.name(),
            path.peer,
            path.local
        );
        self.post(cx, path.sess.home, PathWork::Finalize(Arc::clone(path)));
        for core in 0..self.ncores {
            if core != path.sess.home && core != cx.core() {
                let _ = cx.send(core, Msg::call(wake, 0));
            }
        }
    }
}
