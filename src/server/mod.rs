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
//! - **Cores** (`poller`'s `ServerCore` with `conn`, `io`, `ops`, `info`, `wr`; see
//!   docs/ARCHITECTURE.md, "The server's core poller"): accepted connection `c` is served
//!   by core `(c-1) mod n`, cid 0 by the session's home core (INFO_REQ, heartbeats, link
//!   events, teardown). Requests go to that core's [`ServerHandler`], which answers into
//!   the core's [`Responses`] (at once or from its `poll`, called every loop); responses
//!   follow docs/PROTOCOL.md §4.5 with the send-queue budget and queueing of
//!   [`crate::common::RtrsCon`].
//! - Every value from the peer is checked; a violation closes that path only, with a
//!   rate-limited log line naming the field.
//!
//! Start it on a reactor with [`Server::start`] (or [`Server::start_on_engine`] from
//! outside the reactors); [`Server::stats`] gives the kernel's counters as JSON-ready
//! structs; [`Server::stop`] closes everything.

mod accept;
mod admit;
pub mod chunks;
mod config;
mod conn;
pub mod handler;
mod info;
mod io;
mod ops;
mod poller;
mod session;
mod slots;
mod state;
pub mod stats;
mod wr;

use crate::fabric::ListenOptions;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::common::Inbox;
use crate::sync::lock;

pub use crate::common::{Dir, HbConfig, LinkEvent};
pub use chunks::{ChunkAlloc, ChunkAllocator, ChunkError, ChunkPool, HeapChunks};
pub use config::{
    ServerConfig, ServerError, DEFAULT_MAX_PATH_CONNECTIONS, DEFAULT_OPEN_GRACE, MAX_OPEN_GRACE,
};
pub use handler::{DataArea, IoId, Response, Responses, ServerHandler, SrvIo, SrvPath};
pub use session::{SessionId, SessionUse};
pub use stats::{ServerPathStats, ServerStats, SessionStats};

use crate::engine::{Ctx, Engine, Msg};
use crate::fabric::Fabric;
use crate::ratelimit::RateLimit;
use session::Sessions;
use state::ServerState;

/// Makes the per-core handler (called once on each core).
pub type HandlerFactory = dyn Fn(usize) -> Box<dyn ServerHandler> + Send + Sync;

/// A running server (cheap to clone): statistics and stop.
#[derive(Clone)]
pub struct Server {
    sh: Arc<ServerState>,
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
                .listen(
                    addr,
                    &ListenOptions {
                        admission: config.admission,
                        psk: config.psk.clone(),
                    },
                )
                .map_err(|source| ServerError::Listen { addr, source })?;
            listeners.push(l);
        }
        let addrs = listeners.iter().map(|l| l.local_addr()).collect();
        let ncores = cx.cores().max(1);
        let inv_at_post = fabric.caps().local_ops_at_post;
        let (conns, conns_per_source) = config.connection_cap();
        let caps = slots::Caps {
            sessions: config.session_cap(),
            sessions_per_source: config.max_sessions_per_source,
            conns,
            conns_per_source,
        };
        let sh = Arc::new(ServerState {
            caps,
            cfg: config,
            fabric,
            inv_at_post,
            ncores,
            table: Mutex::new(Sessions::default()),
            inbox: (0..ncores).map(|_| Inbox::new()).collect(),
            stop: AtomicBool::new(false),
            next_home: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            pollers: AtomicUsize::new(ncores + 1),
            log: RateLimit::per_second("rtrs-srv"),
            info_log: RateLimit::per_second("rtrs-srv: paths connected"),
            cqs: (0..ncores).map(|_| std::sync::OnceLock::new()).collect(),
        });
        let factory: Arc<HandlerFactory> = Arc::new(factory);
        for core in 0..ncores {
            let (sh2, f2) = (Arc::clone(&sh), Arc::clone(&factory));
            let msg = Msg::new(move |cx: &mut dyn Ctx| {
                poller::register_core(cx, sh2, |cx| f2(cx.core()));
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
                self.sh.inbox[e.sess.home].push(state::PathWork::Close(Arc::clone(p)));
                n += 1;
            }
        }
        n
    }

    /// Closes one path of the session named `name` (the kernel's sysfs `disconnect` of
    /// `paths/<client@server>`): `path` is the path's `client@server` address as
    /// [`stats`](Self::stats) shows it, or its client address alone. The client
    /// reconnects it under its own policy. Returns how many paths were asked to close
    /// (0: no such session or path).
    pub fn close_path(&self, name: &str, path: &str) -> usize {
        let t = lock(&self.sh.table);
        let mut n = 0;
        for e in t.sessions.iter().filter(|e| e.sess.name() == name) {
            for p in &e.all {
                let full = format!("{}@{}", p.peer, p.local);
                if path == full || path == p.peer.to_string() {
                    self.sh.inbox[e.sess.home].push(state::PathWork::Close(Arc::clone(p)));
                    n += 1;
                }
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
