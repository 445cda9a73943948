//! State shared between a session's home core and its IO cores, and the messages
//! between them (the kernel's `rtrs_clt_sess`/`rtrs_clt_path` fields that several CPUs
//! read, turned into explicit one-writer cells and queues).
//!
//! The home core ([`super::ctl`]) writes path states and pushes [`PathCmd`]s; each
//! [`super::SessionCore`] drains its own queue on its next poll, reports connection
//! errors through [`PathShared::error`] and acknowledges teardowns through
//! [`PathShared::acks`]. Runtime requests from any thread reach the home core as
//! [`SessCmd`]s.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::Inbox;
use crate::sync::lock;

use super::config::PathAddr;
use super::policy::{PolicyCell, MAX_PATHS};
use super::refusal::Refusal;
use super::state::{PathState, PathStateCell};
use super::stats::{ClientPathStats, CoreStats, HomeStats};
use crate::common::{IuPool, RtrsCon};
use crate::fabric::{CqRef, Hca, Psk};
use crate::proto::ImmLayout;

/// Session limits learnt from the first connection's conn_rsp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionParams {
    pub queue_depth: u16,
    pub max_io_size: u32,
    pub max_hdr_size: u32,
    pub chunk_size: u32,
    pub new_rkey: bool,
    pub layout: ImmLayout,
}

impl SessionParams {
    /// Largest user header: room for the READ trailer with one descriptor.
    pub fn max_usr_hdr(&self) -> u32 {
        self.max_hdr_size
            .saturating_sub(crate::proto::RDMA_READ_MAX_TRAILER_LEN as u32)
            .min(u32::from(u16::MAX))
    }
}

/// One path as every core sees it.
#[derive(Debug)]
pub struct PathShared {
    pub slot: usize,
    pub addr: PathAddr,
    pub state: PathStateCell,
    /// A core saw its connection of this path fail.
    pub error: AtomicBool,
    /// Some core received something on this path since the home core last looked
    /// (resets the heartbeat's missed count).
    pub rx_seen: AtomicBool,
    /// Cores that finished the current teardown.
    pub acks: AtomicUsize,
    pub home: HomeStats,
    /// Per core.
    pub core_stats: Vec<CoreStats>,
    /// The snapshot taken at the last statistics reset, which later snapshots count
    /// from ([`ClientPathStats::since`]); control path only.
    pub stats_base: Mutex<Option<ClientPathStats>>,
    /// The key that authenticates the path's connections (tcp fabric), if any.
    pub psk: Option<Psk>,
    /// Why the path stopped trying until a manual reconnect (a failed authentication, or
    /// no reconnect attempts left).
    pub failure: Mutex<Option<String>>,
    /// Why the latest connection attempt failed or the connection was lost (`None` once
    /// connected).
    pub last_error: Mutex<Option<String>>,
    /// The target refused the latest attempt for good (an errno trying again cannot
    /// change): set before `last_error` says so, so that a reader of both never takes
    /// the refusal for an unreachable target.
    pub target_refused: AtomicBool,
    /// The RDMA device and port of the path's latest connection (the kernel's
    /// `hca_name`, `hca_port`); `None` before it or on the software fabrics.
    pub hca: Mutex<Option<Hca>>,
}

impl PathShared {
    pub fn new(slot: usize, addr: PathAddr, cores: usize, psk: Option<Psk>) -> PathShared {
        PathShared {
            slot,
            addr,
            psk,
            failure: Mutex::new(None),
            state: PathStateCell::new(PathState::Connecting),
            error: AtomicBool::new(false),
            rx_seen: AtomicBool::new(false),
            acks: AtomicUsize::new(0),
            home: HomeStats::default(),
            core_stats: (0..cores).map(|_| CoreStats::default()).collect(),
            stats_base: Mutex::new(None),
            last_error: Mutex::new(None),
            target_refused: AtomicBool::new(false),
            hca: Mutex::new(None),
        }
    }

    pub fn connected(&self) -> bool {
        self.state.get() == PathState::Connected
    }
}

/// An IO connection handed from the home core to its core.
pub struct IoConn {
    pub con: RtrsCon,
    /// Receive buffers (8 bytes each) when the server sends RKEY_RSP, else `None`.
    pub recv: Option<IuPool>,
    /// `rbuf[buf_id] = (addr, rkey)` of every chunk on this path.
    pub rbuf: Vec<(u64, u32)>,
}

/// Home core → IO core: a path's connection for the core comes or goes.
pub enum PathCmd {
    /// Path `path` is connected; this is the core's connection of it.
    Up {
        path: Arc<PathShared>,
        params: SessionParams,
        conn: Box<IoConn>,
    },
    /// Drop the connection of slot `slot`, fail over its requests, then acknowledge.
    Down { slot: usize },
}

/// Any thread → home core.
#[derive(Debug)]
pub enum SessCmd {
    AddPath(PathAddr, Option<Psk>),
    RemovePath(PathAddr),
    Disconnect(PathAddr),
    Reconnect(PathAddr),
    SetMaxReconnectAttempts(i32),
    SetReconnectDelay(std::time::Duration),
    Close,
}

/// The session as all its cores and handles see it.
pub struct SessShared {
    pub sessname: String,
    pub cores: usize,
    pub policy: PolicyCell,
    /// Paths by slot, for statistics and management (never touched on the data path).
    pub paths: Mutex<Vec<Option<Arc<PathShared>>>>,
    pub to_home: Inbox<SessCmd>,
    pub to_core: Vec<Inbox<PathCmd>>,
    /// Core handles dropped by their owner (they acknowledge no teardown any more).
    pub core_gone: Vec<AtomicBool>,
    /// Paths not Closed or Dead: while any exists, IO may wait for a reconnect.
    pub live_paths: AtomicUsize,
    pub closed: AtomicBool,
    /// Paths connected right now.
    pub paths_up: AtomicU32,
    /// Set while the session never connected and every path was refused permanently.
    pub refusal: Mutex<Option<Refusal>>,
    /// Per core: the CQ its IO connections are made on, once the core's session handle
    /// was attached to one (`SessionCore::attach`); none: private CQs. Read by the home
    /// core when it connects, never on the data path.
    pub cqs: Vec<Mutex<Option<CqRef>>>,
}

impl SessShared {
    pub fn new(sessname: String, cores: usize, policy: PolicyCell) -> SessShared {
        SessShared {
            sessname,
            cores,
            policy,
            paths: Mutex::new(vec![None; MAX_PATHS]),
            to_home: Inbox::new(),
            to_core: (0..cores).map(|_| Inbox::new()).collect(),
            core_gone: (0..cores).map(|_| AtomicBool::new(false)).collect(),
            live_paths: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            paths_up: AtomicU32::new(0),
            refusal: Mutex::new(None),
            cqs: (0..cores).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// The CQ core `core`'s IO connections are to be made on, if any.
    pub fn cq_of(&self, core: usize) -> Option<CqRef> {
        lock(self.cqs.get(core)?).clone()
    }

    /// Core `core`'s connections are made on `cq` from now on.
    pub fn use_cq(&self, core: usize, cq: CqRef) {
        if let Some(c) = self.cqs.get(core) {
            *lock(c) = Some(cq);
        }
    }

    /// `cq` failed (overrun, or it refused a connection): core `core`'s connections get
    /// private CQs from now on.
    pub fn forget_cq(&self, core: usize) {
        if let Some(c) = self.cqs.get(core) {
            *lock(c) = None;
        }
    }

    pub fn path_list(&self) -> Vec<Arc<PathShared>> {
        lock(&self.paths).iter().flatten().cloned().collect()
    }

    pub fn live(&self) -> bool {
        self.live_paths.load(Ordering::Acquire) > 0 && !self.closed.load(Ordering::Acquire)
    }
}
