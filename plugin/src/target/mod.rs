//! The RTRS target inside SPDK (server side): SPDK bdevs exported as RNBD
//! devices over RTRS. It is the `rtrs_target` SPDK subsystem (depending on `bdev`, so
//! `save_config` writes it after the bdevs it exports and `--json` replays it after
//! them), configured by the `rtrs_target_*` RPCs ([`rpc`]).
//!
//! - The first listener spawns one SPDK thread per core of the application's cpumask
//!   ([`Driver::spawn`], like nvmf poll groups) and starts the RTRS server with the RNBD
//!   handler on them: accepted connection `c` is served on thread `(c-1) mod n`, whose
//!   pollers submit bdev IO through that thread's own IO channel.
//! - Listeners come and go under one server per transport ([`mux`]): tcp listens on the
//!   tcp fabric, rdma on the verbs fabric (first RDMA device; without one the listen
//!   fails with the fabric's "no RDMA device found" error). Exports come and go in one
//!   shared [`Exports`] set used by both servers, each an SPDK bdev descriptor
//!   ([`BdevExport`]).
//! - Session chunk pools are SPDK DMA memory ([`SpdkDmaChunks`], checked with
//!   `spdk_vtophys`): bdev IO is submitted straight on the chunks, so bdevs that DMA
//!   (NVMe over PCIe) can be exported.
//! - A hot-removed bdev removes its export: IO through existing mappings fails with
//!   −EIO, each thread drops its channel, the descriptor closes.
//! - Each export has a host list checked at OPEN ([`hosts`]): `allowed_hosts`,
//!   `rtrs_target_export_add_host` / `_remove_host`, `rtrs_target_get_exports`.
//! - The operator's controls ([`TargetControl`], shared with `rtrs-target ctl`): each
//!   export's openers (`rtrs_target_get_exports`, and each session's devices in
//!   `rtrs_target_get_sessions`), `rtrs_target_force_close` (the kernel's
//!   `force_close`) and `rtrs_target_disconnect` (a session or one path).
//! - A resized bdev (`SPDK_BDEV_EVENT_RESIZE`) is reported to clients at their next
//!   OPEN; its geometry (write cache and FUA, physical block, unmap granularity, largest
//!   transfer) goes into every OPEN_RSP ([`BdevExport`]).
//!
//! State lives in one [`SpdkTarget`] behind a mutex: RPCs, `config_json`, hot-remove events
//! and the subsystem's init/fini run on the application thread; the data path never
//! takes it.

mod hosts;
mod mux;
mod rpc;
mod stats;

use rtrs_spdk::fabric::ListenOptions;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use rtrs_spdk::fabric::tcp::{TcpFabric, TcpReadiness};
use rtrs_spdk::fabric::verbs::VerbsFabric;
use rtrs_spdk::fabric::{Admission, Fabric, FabricError, Psk};
use rtrs_spdk::rnbd::server::{
    Exports, HostPattern, RnbdServer, RnbdSessions, Served, TargetControl,
};
use rtrs_spdk::server::{ChunkAllocator, Server, ServerConfig, SessionId};
use rtrs_spdk::spdk::dma::SpdkDmaChunks;
use rtrs_spdk::spdk::export::BdevExport;
use rtrs_spdk::spdk::{interrupt_mode, poll_until, sys, Driver, SpdkThread};
use rtrs_spdk::sync::lock;
use serde_json::{json, Value};

pub use rpc::register_rpcs;

use crate::rpc::Transport;
use mux::{Listeners, MuxFabric};

/// Most exports over the life of the application (ids are not reused).
const MAX_EXPORTS: usize = 4096;
/// How long the subsystem's fini waits for sessions to close.
const STOP_WAIT_US: u64 = 5_000_000;

/// `rtrs_target_set_options`: the server parameters, fixed once the first listener runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetOptions {
    pub always_invalidate: bool,
    pub queue_depth: u16,
    pub chunk_size: u32,
    /// Connections still in their handshake: deadline and caps (every listener).
    pub admission: Admission,
    /// Established sessions in all (0: derived from the machine's memory) and from one
    /// source address (`ServerConfig::max_sessions`, `max_sessions_per_source`).
    pub max_sessions: usize,
    pub max_sessions_per_source: usize,
    /// How long a session without a device keeps its slot (`ServerConfig::open_grace`).
    pub open_grace: Duration,
    /// Connections per path, in all and per source (`ServerConfig::max_path_connections`,
    /// `max_connections`, `max_connections_per_source`; 0: derived).
    pub max_path_connections: u16,
    pub max_connections: usize,
    pub max_connections_per_source: usize,
}

impl Default for TargetOptions {
    fn default() -> Self {
        let d = ServerConfig::default();
        TargetOptions {
            always_invalidate: d.always_invalidate,
            queue_depth: d.queue_depth,
            chunk_size: d.chunk_size,
            admission: d.admission,
            max_sessions: d.max_sessions,
            max_sessions_per_source: d.max_sessions_per_source,
            open_grace: d.open_grace,
            max_path_connections: d.max_path_connections,
            max_connections: d.max_connections,
            max_connections_per_source: d.max_connections_per_source,
        }
    }
}

impl TargetOptions {
    /// The server configuration these options give: session chunk pools come from SPDK
    /// DMA memory, so exported bdevs doing DMA (NVMe over PCIe) can use them as-is.
    pub fn server_config(&self) -> ServerConfig {
        ServerConfig {
            queue_depth: self.queue_depth,
            chunk_size: self.chunk_size,
            always_invalidate: self.always_invalidate,
            admission: self.admission,
            max_sessions: self.max_sessions,
            max_sessions_per_source: self.max_sessions_per_source,
            open_grace: self.open_grace,
            max_path_connections: self.max_path_connections,
            max_connections: self.max_connections,
            max_connections_per_source: self.max_connections_per_source,
            chunk_alloc: ChunkAllocator::new(Arc::new(SpdkDmaChunks)),
            ..ServerConfig::default()
        }
    }
}

/// `rtrs_target_export`'s access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportAccess {
    Ro,
    Rw,
}

impl ExportAccess {
    pub fn as_str(self) -> &'static str {
        match self {
            ExportAccess::Ro => "ro",
            ExportAccess::Rw => "rw",
        }
    }
}

/// One listener as configured (`addr` as given, for `config_json`).
#[derive(Debug, Clone)]
pub struct ListenerEntry {
    pub transport: Transport,
    pub addr: String,
    pub port: u16,
    pub bound: SocketAddr,
    /// The name of the keyring key clients must prove (never the key itself).
    pub psk: Option<String>,
}

/// One export as configured (its host list lives in the shared `Exports`).
#[derive(Debug, Clone)]
pub struct ExportEntry {
    pub bdev_name: String,
    pub export_name: String,
    pub access: ExportAccess,
}

/// The RTRS server of one transport; `server` is set once it started on the threads.
pub struct Running {
    pub transport: Transport,
    /// The fabric every listener of this transport binds on: the server registered its
    /// memory there, so connections must come from the same fabric.
    pub fabric: Arc<dyn Fabric>,
    pub listeners: Arc<Listeners>,
    pub server: Arc<OnceLock<Server>>,
    /// The RNBD sessions of this server's handlers (openers, forced closes).
    pub sessions: Arc<RnbdSessions<SessionId>>,
}

/// Everything the target has been told, and what runs.
pub struct SpdkTarget {
    options: TargetOptions,
    /// Whether `rtrs_target_set_options` was called (so `config_json` re-emits it).
    options_set: bool,
    exports: Arc<Exports>,
    export_list: Vec<ExportEntry>,
    listeners: Vec<ListenerEntry>,
    driver: Option<Arc<Driver>>,
    running: Vec<Running>,
    /// Set by the subsystem's fini: no new listeners.
    stopping: bool,
}

impl Default for SpdkTarget {
    fn default() -> Self {
        SpdkTarget {
            options: TargetOptions::default(),
            options_set: false,
            exports: Arc::new(Exports::dynamic(MAX_EXPORTS)),
            export_list: Vec::new(),
            listeners: Vec::new(),
            driver: None,
            running: Vec::new(),
            stopping: false,
        }
    }
}

static TARGET: Mutex<Option<SpdkTarget>> = Mutex::new(None);

/// Runs `f` on the target state (created on first use).
pub fn with_target<R>(f: impl FnOnce(&mut SpdkTarget) -> R) -> R {
    let mut g: MutexGuard<'_, Option<SpdkTarget>> = lock(&TARGET);
    f(g.get_or_insert_with(SpdkTarget::default))
}

impl SpdkTarget {
    /// Whether a server has been started (options are then fixed).
    pub fn started(&self) -> bool {
        !self.running.is_empty()
    }

    /// Sets the options (before the first listener).
    ///
    /// # Errors
    /// After the first listener, or options the server refuses (naming the field).
    pub fn set_options(&mut self, o: TargetOptions) -> Result<(), String> {
        if self.started() {
            return Err(
                "rtrs_target_set_options: options are fixed once the first listener \
                        runs (call it before rtrs_target_listen)"
                    .to_string(),
            );
        }
        if let Err(e) = o.admission.validate() {
            let (field, value) = match e.field {
                "handshake_timeout" => (
                    "handshake_timeout_ms",
                    o.admission.handshake_timeout.as_millis().to_string(),
                ),
                f => (f, e.value),
            };
            return Err(format!(
                "rtrs_target_set_options: '{field}' = {value}: {}",
                e.reason
            ));
        }
        o.server_config().validate().map_err(|e| match e {
            // The option's name in this RPC.
            rtrs_spdk::server::ServerError::Config {
                field: "open_grace",
                ..
            } => format!(
                "rtrs_target_set_options: 'open_grace_ms' = {}: must be 1 to 3600000",
                o.open_grace.as_millis()
            ),
            e => format!("rtrs_target_set_options: {e}"),
        })?;
        self.options = o;
        self.options_set = true;
        Ok(())
    }

    /// Exports bdev `bdev_name` as `export_name`, open to the hosts `allowed` matches
    /// (`None`: every host). Runs on the application thread.
    ///
    /// # Errors
    /// The bdev cannot be opened, the name is taken or invalid.
    pub fn export(
        &mut self,
        e: ExportEntry,
        allowed: Option<Vec<HostPattern>>,
    ) -> Result<(), String> {
        const M: &str = "rtrs_target_export";
        if self
            .export_list
            .iter()
            .any(|x| x.export_name == e.export_name)
        {
            return Err(format!(
                "{M}: export_name '{}' is already exported",
                e.export_name
            ));
        }
        let name = e.export_name.clone();
        let bdev = BdevExport::open(&e.bdev_name, e.access == ExportAccess::Ro, move || {
            with_target(|t| t.hot_removed(&name));
        })
        .map_err(|why| format!("{M}: bdev_name: {why}"))?;
        self.exports
            .add_with_hosts(
                &e.export_name,
                Arc::new(bdev),
                e.access == ExportAccess::Ro,
                hosts::initial(allowed),
            )
            .map_err(|why| format!("{M}: export_name: {why}"))?;
        self.export_list.push(e);
        Ok(())
    }

    /// Removes export `name`.
    ///
    /// # Errors
    /// No such export.
    pub fn unexport(&mut self, name: &str) -> Result<(), String> {
        let Some(i) = self.export_list.iter().position(|x| x.export_name == name) else {
            return Err(format!(
                "rtrs_target_unexport: export_name '{name}': no such export"
            ));
        };
        self.export_list.remove(i);
        self.exports.remove(name);
        Ok(())
    }

    fn hot_removed(&mut self, name: &str) {
        if self.unexport(name).is_ok() {
            tracing::warn!("rtrs target: export '{name}' closed: its bdev was removed");
        }
    }

    /// Binds a listener (requiring clients to prove `psk`, a keyring key's name and the
    /// key, when given); starts the transport's server on the first one. `done` gets the
    /// result once the server runs (at once when it already does).
    ///
    /// # Errors
    /// Returned through `done`: bad transport, address in use, start failure.
    pub fn listen(
        &mut self,
        transport: Transport,
        addr: String,
        port: u16,
        sockaddr: SocketAddr,
        psk: Option<(String, Psk)>,
        done: impl FnOnce(Result<(), String>) + Send + 'static,
    ) {
        const M: &str = "rtrs_target_listen";
        if self.stopping {
            return done(Err(format!("{M}: the application is shutting down")));
        }
        if self
            .listeners
            .iter()
            .any(|l| l.transport == transport && l.addr == addr && l.port == port)
        {
            return done(Err(format!(
                "{M}: {} {addr} port {port} is already listening",
                transport.as_str()
            )));
        }
        let fabric: Arc<dyn Fabric> = match self.running.iter().find(|r| r.transport == transport) {
            Some(r) => Arc::clone(&r.fabric),
            None => match open_fabric(transport) {
                Ok(f) => f,
                Err(e) => {
                    return done(Err(format!(
                        "{M}: 'transport' = {:?}: {e}",
                        transport.as_str()
                    )))
                }
            },
        };
        let (psk_name, key) = match psk {
            Some((n, k)) => (Some(n), Some(k)),
            None => (None, None),
        };
        let listener = match fabric.listen(
            sockaddr,
            &ListenOptions {
                admission: self.options.admission,
                psk: key,
            },
        ) {
            Ok(l) => l,
            Err(e) => return done(Err(format!("{M}: addr {addr} port {port}: {e}"))),
        };
        let bound = listener.local_addr();
        self.listeners.push(ListenerEntry {
            transport,
            addr,
            port,
            bound,
            psk: psk_name,
        });
        if let Some(r) = self.running.iter().find(|r| r.transport == transport) {
            r.listeners.add(listener);
            return done(Ok(()));
        }
        let driver = match &self.driver {
            Some(d) => Arc::clone(d),
            None => match Driver::spawn("rtrs_target") {
                Ok(d) => {
                    self.driver = Some(Arc::clone(&d));
                    d
                }
                Err(e) => {
                    self.listeners.pop();
                    return done(Err(format!("{M}: {e}")));
                }
            },
        };
        let listeners = Arc::new(Listeners::default());
        listeners.add(listener);
        let slot = Arc::new(OnceLock::new());
        let sessions = Arc::new(RnbdSessions::new(Arc::clone(&self.exports)));
        self.running.push(Running {
            transport,
            fabric: Arc::clone(&fabric),
            listeners: Arc::clone(&listeners),
            server: Arc::clone(&slot),
            sessions: Arc::clone(&sessions),
        });
        let mux: Arc<dyn Fabric> = Arc::new(MuxFabric::new(fabric, listeners));
        let config = self.options.server_config();
        let factory = RnbdServer::factory_with(sessions);
        let placeholder = SocketAddr::from(([0, 0, 0, 0], 0));
        // Answered exactly once: by the start on the first target thread, or here if
        // that thread cannot be reached.
        type Done = Box<dyn FnOnce(Result<(), String>) + Send>;
        let done: Arc<Mutex<Option<Done>>> = Arc::new(Mutex::new(Some(Box::new(done))));
        let answer = Arc::clone(&done);
        let finish = move |r: Result<(), String>| {
            let f = answer.lock().ok().and_then(|mut g| g.take());
            if let Some(f) = f {
                f(r);
            }
        };
        let started = driver.run_on(0, move |cx| {
            match Server::start(cx, mux, &[placeholder], config, factory) {
                Ok(s) => {
                    let _ = slot.set(s);
                    finish(Ok(()));
                }
                Err(e) => {
                    with_target(|t| {
                        t.running.retain(|r| r.transport != transport);
                        t.listeners.retain(|l| l.transport != transport);
                    });
                    finish(Err(format!("{M}: starting the rtrs server: {e}")));
                }
            }
        });
        if let Err(e) = started {
            self.running.retain(|r| r.transport != transport);
            self.listeners.retain(|l| l.transport != transport);
            let f = done.lock().ok().and_then(|mut g| g.take());
            if let Some(f) = f {
                f(Err(format!(
                    "{M}: could not reach the first target thread: {e}"
                )));
            }
        }
    }

    /// Closes a listener (sessions stay).
    ///
    /// # Errors
    /// No such listener.
    pub fn stop_listener(
        &mut self,
        transport: Transport,
        addr: &str,
        port: u16,
    ) -> Result<(), String> {
        let Some(i) = self
            .listeners
            .iter()
            .position(|l| l.transport == transport && l.addr == addr && l.port == port)
        else {
            return Err(format!(
                "rtrs_target_stop_listener: no {} listener on addr {addr} port {port}",
                transport.as_str()
            ));
        };
        let l = self.listeners.remove(i);
        if let Some(r) = self.running.iter().find(|r| r.transport == transport) {
            r.listeners.remove(l.bound);
        }
        Ok(())
    }

    /// `rtrs_target_get_sessions`: each session with its statistics and its devices.
    pub fn sessions(&self) -> Value {
        let openers = self.control().openers(None).unwrap_or_default();
        let mut out = Vec::new();
        for r in &self.running {
            if let Some(s) = r.server.get() {
                let t = r.transport.as_str();
                out.extend(stats::sessions_json(t, &s.stats(), &openers));
            }
        }
        Value::Array(out)
    }

    /// The operator's view over every running server.
    pub fn control(&self) -> TargetControl {
        let served = self
            .running
            .iter()
            .filter_map(|r| {
                r.server.get().map(|s| Served {
                    transport: r.transport.as_str(),
                    server: s.clone(),
                    sessions: Arc::clone(&r.sessions),
                })
            })
            .collect();
        TargetControl::new(Arc::clone(&self.exports), served)
    }

    /// The config entries that rebuild this target (`save_config`).
    pub fn config(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if self.options_set {
            let o = self.options;
            out.push(json!({
                "method": "rtrs_target_set_options",
                "params": {
                    "always_invalidate": o.always_invalidate,
                    "queue_depth": o.queue_depth,
                    "chunk_size": o.chunk_size,
                    "handshake_timeout_ms": u64::try_from(o.admission.handshake_timeout.as_millis())
                        .unwrap_or(u64::MAX),
                    "max_pending": o.admission.max_pending,
                    "max_pending_per_source": o.admission.max_pending_per_source,
                    "max_sessions": o.max_sessions,
                    "max_sessions_per_source": o.max_sessions_per_source,
                    "open_grace_ms": u64::try_from(o.open_grace.as_millis()).unwrap_or(u64::MAX),
                    "max_path_connections": o.max_path_connections,
                    "max_connections": o.max_connections,
                    "max_connections_per_source": o.max_connections_per_source,
                }
            }));
        }
        for e in &self.export_list {
            let mut params = json!({
                "bdev_name": e.bdev_name,
                "export_name": e.export_name,
                "access": e.access.as_str(),
            });
            if let Some(hosts) = self.allowed_hosts_json(&e.export_name) {
                params["allowed_hosts"] = hosts;
            }
            out.push(json!({"method": "rtrs_target_export", "params": params}));
        }
        for l in &self.listeners {
            let mut params = json!({
                "transport": l.transport.as_str(),
                "addr": l.addr,
                "port": l.port,
            });
            // The key's name only: the key stays in the keyring (saved by its module).
            if let Some(name) = &l.psk {
                params["psk"] = json!(name);
            }
            out.push(json!({
                "method": "rtrs_target_listen",
                "params": params,
            }));
        }
        out
    }
}

/// A new fabric for `transport`: the tcp fabric, or the verbs fabric over the first
/// RDMA device (its error says when there is none).
///
/// # Errors
/// The fabric's own error (for rdma: "no RDMA device found ...").
fn open_fabric(transport: Transport) -> Result<Arc<dyn Fabric>, FabricError> {
    Ok(match transport {
        Transport::Tcp => Arc::new(TcpFabric::new_or(if interrupt_mode() {
            TcpReadiness::Epoll
        } else {
            TcpReadiness::Uring
        })),
        Transport::Rdma => Arc::new(VerbsFabric::open(None)?),
    })
}

/// Subsystem init (the shim then calls `spdk_subsystem_init_next`).
#[no_mangle]
pub extern "C" fn rtrs_target_subsystem_init() {
    with_target(|_| ());
}

/// Subsystem fini: stops the servers, waits (bounded) for their pollers, removes the
/// exports, stops the target threads, then calls `done` (`spdk_subsystem_fini_next`).
#[no_mangle]
pub extern "C" fn rtrs_target_subsystem_fini(done: Option<unsafe extern "C" fn()>) {
    let finish = move || {
        if let Some(f) = done {
            // SAFETY: SPDK's continuation, called once, on the application thread.
            unsafe { f() };
        }
    };
    let (servers, driver) = with_target(|t| {
        t.stopping = true;
        for r in &t.running {
            r.listeners.clear();
        }
        let servers: Vec<Server> = t
            .running
            .iter()
            .filter_map(|r| r.server.get().cloned())
            .collect();
        for s in &servers {
            s.stop();
        }
        (servers, t.driver.take())
    });
    let Some(driver) = driver else {
        with_target(|t| {
            for e in std::mem::take(&mut t.export_list) {
                t.exports.remove(&e.export_name);
            }
        });
        return finish();
    };
    let start = rtrs_spdk::spdk::now_ns();
    let app = SpdkThread::current();
    let mut finish = Some(finish);
    let waiting = poll_until(10_000, move || {
        let timed_out = rtrs_spdk::spdk::now_ns().saturating_sub(start) > STOP_WAIT_US * 1000;
        if !timed_out && !servers.iter().all(Server::is_stopped) {
            return false;
        }
        if timed_out {
            tracing::warn!("rtrs target: sessions did not close within 5 s; stopping anyway");
        }
        with_target(|t| {
            t.running.clear();
            for e in std::mem::take(&mut t.export_list) {
                t.exports.remove(&e.export_name);
            }
        });
        let f = finish.take();
        driver.stop(move || {
            if let Some(f) = f {
                match app {
                    Some(t) if !t.is_current() => {
                        let _ = t.send(f);
                    }
                    _ => f(),
                }
            }
        });
        true
    });
    if !waiting {
        tracing::error!("rtrs target: could not wait for the stop on this thread");
    }
}

/// `write_config_json` of the subsystem: an array of RPC calls.
///
/// # Safety
/// `w` is the live write context SPDK passes.
#[no_mangle]
pub unsafe extern "C" fn rtrs_target_write_config_json(w: *mut sys::spdk_json_write_ctx) {
    let entries = with_target(|t| t.config());
    // SAFETY: `w` is live for this callback.
    unsafe { rtrs_spdk::spdk::json::write_value(w, &Value::Array(entries)) };
}
