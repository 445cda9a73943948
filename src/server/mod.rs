//! The RTRS server: the kernel's `rtrs-srv.c` as engine pollers.
//!
//! - **Listeners** (`accept`): one per fabric address, polled on the core that started
//!   the server. Each CONNECT_REQUEST is validated (conn_req through [`crate::proto`]),
//!   matched to a session by `paths_uuid` (created only with `first_conn`) and to a path
//!   by `sess_uuid`; refusals carry a conn_rsp with the kernel's errno (−ECONNRESET,
//!   −ENXIO, −EEXIST, −ENOMEM). A reconnect whose `recon_cnt` differs from the stored
//!   one replaces the stale path at once instead of being refused until the old path
//!   times out.
//! - **Admission** (beyond the kernel, which trusts its RDMA network): the listeners hold
//!   connections still in the fabric's handshake under [`ServerConfig::admission`]; a
//!   path that has not completed the RTRS handshake (every connection, then INFO_REQ)
//!   within its `handshake_timeout` of its first connection request is closed (on
//!   collision and by a periodic check); sessions still being set up are capped in total
//!   (`max_pending_sessions`) and per source, a newcomer evicting the oldest of the
//!   busiest source instead of being refused.
//! - **Sessions** (`session`): one chunk pool (queue depth × chunk size) registered
//!   once; under always_invalidate (default) one fast-registration key per chunk per
//!   path, else the pool's own key.
//! - **Cores** (`poller`, `io`, `info`): accepted connection `c` is served by core
//!   `(c-1) mod n`, cid 0 by the session's home core (INFO_REQ, heartbeats, link events,
//!   teardown). Requests go to that core's [`ServerHandler`]; responses follow docs/PROTOCOL.md
//!   §4.5 with the send-queue budget and queueing of [`crate::common::Con`].
//! - Every value from the peer is checked; a violation closes that path only, with a
//!   rate-limited log line naming the field.
//!
//! Start it on a reactor with [`Server::start`] (or [`Server::start_on_engine`] from
//! outside the reactors); [`Server::stats`] gives the kernel's counters as JSON-ready
//! structs; [`Server::stop`] closes everything.

mod accept;
pub mod chunks;
pub mod handler;
mod info;
mod io;
mod poller;
mod session;
mod shared;
pub mod stats;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crossbeam_queue::SegQueue;

pub use crate::common::{Dir, HbConfig, LinkEvent};
pub use chunks::{ChunkAlloc, ChunkAllocator, ChunkPool, HeapChunks};
pub use handler::{DataArea, IoId, Response, Responses, ServerHandler, SessionId, SrvIo, SrvPath};
pub use stats::{PathStats, ServerStats, SessionStats};

use crate::engine::{Ctx, Engine, Msg};
use crate::fabric::{Admission, Fabric, FabricError, Psk};
use crate::proto::constants::{
    DEFAULT_MAX_CHUNK_SIZE, DEFAULT_MAX_HDR_SIZE, DEFAULT_SESS_QUEUE_DEPTH, MIN_CHUNK_SIZE,
};
use crate::proto::fits_imm_budget;

use crate::ratelimit::RateLimit;
use session::{lock, SessionTable};
use shared::Shared;

/// Server parameters; defaults are the kernel's module parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Chunks per session (`sess_queue_depth`, default 512).
    pub queue_depth: u16,
    /// Bytes per chunk (`max_chunk_size`, a power of two ≥ 8192, default 128 KiB).
    pub chunk_size: u32,
    /// New rkey per IO and RKEY_RSP responses (default on).
    pub always_invalidate: bool,
    /// Largest user header plus RTRS trailer (`MAX_HDR_SIZE`, default 4096).
    pub max_hdr: u32,
    /// Heartbeat interval and missed limit.
    pub hb: HbConfig,
    /// Most sessions being set up (no connected path, one still connecting). At the cap
    /// — or at `admission.max_pending_per_source` from one source — a new session evicts
    /// the oldest such session of the busiest source (of its own source), whose paths
    /// are closed, so a newcomer is never starved. Each session costs a whole chunk pool,
    /// so this bounds what connection requests alone can make the server allocate
    /// (docs/PROTOCOL.md §9.1 "rate-limit session creation"): sessions without a connected
    /// path, including those still closing, never exceed twice the cap (beyond, new
    /// sessions are refused with −EBUSY). Default 256.
    pub max_pending_sessions: usize,
    /// Connections still in their handshake: the deadline (default 5 s; for the fabric's
    /// handshake, and for a path's RTRS handshake from its first connection request to
    /// INFO_REQ) and the caps on such connections per listener (default 256 in total,
    /// 32 per source address). See [`crate::fabric::admission`].
    pub admission: Admission,
    /// Where session chunk pools come from (default: the heap). The SPDK target sets
    /// an allocator of SPDK DMA memory.
    pub chunk_alloc: ChunkAllocator,
    /// The pre-shared key every client must prove on connect (tcp fabric,
    /// `docs/tcp-fabric.md`, "Authentication"); default none.
    pub psk: Option<Psk>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            queue_depth: DEFAULT_SESS_QUEUE_DEPTH,
            chunk_size: DEFAULT_MAX_CHUNK_SIZE,
            always_invalidate: true,
            max_hdr: DEFAULT_MAX_HDR_SIZE,
            hb: HbConfig::default(),
            max_pending_sessions: 256,
            admission: Admission::default(),
            chunk_alloc: ChunkAllocator::default(),
            psk: None,
        }
    }
}

impl ServerConfig {
    /// `chunk_size − max_hdr`, sent as conn_rsp.max_io_size.
    pub fn max_io_size(&self) -> u32 {
        self.chunk_size.saturating_sub(self.max_hdr)
    }

    /// Checks the parameters as the kernel checks its module parameters.
    ///
    /// # Errors
    /// [`ServerError::Config`] naming the parameter.
    pub fn validate(&self) -> Result<(), ServerError> {
        let bad = |field, value: u64, reason| {
            Err(ServerError::Config {
                field,
                value: value.to_string(),
                reason,
            })
        };
        if self.queue_depth == 0 {
            return bad("queue_depth", 0, "must be at least 1");
        }
        if self.chunk_size < MIN_CHUNK_SIZE || !self.chunk_size.is_power_of_two() {
            return bad(
                "chunk_size",
                self.chunk_size.into(),
                "must be a power of two of at least 8192 bytes",
            );
        }
        if !fits_imm_budget(self.queue_depth, self.chunk_size.into()) {
            return bad(
                "queue_depth",
                self.queue_depth.into(),
                "ceil_log2(queue_depth) + ceil_log2(chunk_size) must not exceed 28",
            );
        }
        if self.max_hdr < 64 || self.max_hdr >= self.chunk_size {
            return bad(
                "max_hdr",
                self.max_hdr.into(),
                "must be at least 64 bytes and below the chunk size",
            );
        }
        if self.max_pending_sessions == 0 {
            return bad("max_pending_sessions", 0, "must be at least 1");
        }
        if let Err(e) = self.admission.validate() {
            return Err(ServerError::Config {
                field: match e.field {
                    "handshake_timeout" => "admission.handshake_timeout",
                    "max_pending" => "admission.max_pending",
                    _ => "admission.max_pending_per_source",
                },
                value: e.value,
                reason: e.reason,
            });
        }
        if self.hb.interval.is_zero() {
            return bad("hb.interval", 0, "must be non-zero");
        }
        Ok(())
    }
}

/// Errors starting a server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    #[error("rtrs server: {field} = {value}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("rtrs server: no listen address given")]
    NoListenAddr,
    #[error("rtrs server: listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: FabricError,
    },
    #[error("rtrs server: could not start on reactor {core}: {reason}")]
    Start { core: usize, reason: String },
}

/// Makes the per-core handler (called once on each core).
pub type HandlerFactory = dyn Fn(usize) -> Box<dyn ServerHandler> + Send + Sync;

/// A running server (cheap to clone): statistics and stop.
#[derive(Clone)]
pub struct Server {
    sh: Arc<Shared>,
    addrs: Vec<SocketAddr>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addrs", &self.addrs)
            .finish()
    }
}

impl Server {
    /// Starts a server from reactor `cx`: listens on every address now (so errors and
    /// the chosen ports come back here), polls the listeners on this core, and registers
    /// one poller with its own handler (`factory(core)`) on every core.
    ///
    /// # Errors
    /// [`ServerError::Config`], [`ServerError::NoListenAddr`], [`ServerError::Listen`].
    pub fn start<F>(
        cx: &mut dyn Ctx,
        fabric: Arc<dyn Fabric>,
        listen: &[SocketAddr],
        config: ServerConfig,
        factory: F,
    ) -> Result<Server, ServerError>
    where
        F: Fn(usize) -> Box<dyn ServerHandler> + Send + Sync + 'static,
    {
        config.validate()?;
        if listen.is_empty() {
            return Err(ServerError::NoListenAddr);
        }
        let mut listeners = Vec::with_capacity(listen.len());
        for &addr in listen {
            let l = fabric
                .listen_config(addr, &config.admission, config.psk.clone())
                .map_err(|source| ServerError::Listen { addr, source })?;
            listeners.push(l);
        }
        let addrs = listeners.iter().map(|l| l.local_addr()).collect();
        let ncores = cx.cores().max(1);
        let sh = Arc::new(Shared {
            cfg: config,
            fabric,
            ncores,
            table: Mutex::new(SessionTable::default()),
            inbox: (0..ncores).map(|_| SegQueue::new()).collect(),
            stop: AtomicBool::new(false),
            next_home: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            pollers: AtomicUsize::new(ncores + 1),
            log: RateLimit::per_second("rtrs-srv"),
        });
        let factory: Arc<HandlerFactory> = Arc::new(factory);
        for core in 0..ncores {
            let (sh2, f2) = (Arc::clone(&sh), Arc::clone(&factory));
            let msg = Msg::new(move |cx: &mut dyn Ctx| {
                let handler = f2(cx.core());
                let p = poller::CorePoller::new(sh2, cx.core(), handler);
                cx.register(Box::new(p));
            });
            if let Err(e) = cx.send(core, msg) {
                sh.stop.store(true, Ordering::Release);
                return Err(ServerError::Start {
                    core,
                    reason: e.to_string(),
                });
            }
        }
        cx.register(Box::new(accept::Acceptor::new(Arc::clone(&sh), listeners)));
        Ok(Server { sh, addrs })
    }

    /// [`Server::start`] from a thread outside the engine: runs it on reactor `core`
    /// and waits (at most 10 s) for the result.
    ///
    /// # Errors
    /// As [`Server::start`]; [`ServerError::Start`] if the reactor does not answer.
    pub fn start_on_engine<F>(
        engine: &Engine,
        core: usize,
        fabric: Arc<dyn Fabric>,
        listen: &[SocketAddr],
        config: ServerConfig,
        factory: F,
    ) -> Result<Server, ServerError>
    where
        F: Fn(usize) -> Box<dyn ServerHandler> + Send + Sync + 'static,
    {
        let (tx, rx) = mpsc::channel();
        let listen = listen.to_vec();
        let msg = Msg::new(move |cx: &mut dyn Ctx| {
            let _ = tx.send(Server::start(cx, fabric, &listen, config, factory));
        });
        engine.send(core, msg).map_err(|e| ServerError::Start {
            core,
            reason: e.to_string(),
        })?;
        rx.recv_timeout(Duration::from_secs(10))
            .map_err(|e| ServerError::Start {
                core,
                reason: format!("no answer from the reactor: {e}"),
            })?
    }

    /// The listening addresses (with the ports chosen for port 0).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The configuration in force.
    pub fn config(&self) -> &ServerConfig {
        &self.sh.cfg
    }

    /// Statistics of every session and path.
    pub fn stats(&self) -> ServerStats {
        let t = lock(&self.sh.table);
        ServerStats {
            sessions: t
                .sessions
                .iter()
                .map(|e| SessionStats {
                    id: e.sess.id.0,
                    name: e.sess.name(),
                    queue_depth: e.sess.queue_depth(),
                    chunk_size: e.sess.chunk_size(),
                    chunk_memory: e.sess.chunks.kind(),
                    paths: e.all.iter().map(|p| p.stats()).collect(),
                })
                .collect(),
        }
    }

    /// Number of sessions currently known.
    pub fn session_count(&self) -> usize {
        lock(&self.sh.table).sessions.len()
    }

    /// Closes every path of the session named `name` (the kernel's sysfs `disconnect`,
    /// for a whole session); the client may reconnect. Returns how many paths were
    /// asked to close.
    pub fn close_session(&self, name: &str) -> usize {
        let t = lock(&self.sh.table);
        let mut n = 0;
        for e in t.sessions.iter().filter(|e| e.sess.name() == name) {
            for p in &e.all {
                self.sh.inbox[e.sess.home].push(shared::CoreCmd::Close(Arc::clone(p)));
                n += 1;
            }
        }
        n
    }

    /// Stops listening and closes every path; the pollers unregister themselves once
    /// every request has been answered by the handlers.
    pub fn stop(&self) {
        self.sh.stop.store(true, Ordering::Release);
    }

    /// Whether every poller of the server has finished after [`Server::stop`].
    pub fn is_stopped(&self) -> bool {
        self.sh.pollers.load(Ordering::Acquire) == 0
    }
}
