//! Shared pieces of the server tests: a minimal RTRS test client written directly on
//! `proto` + `fabric` (the real handshake, READ/WRITE requests, responses with and
//! without NEW_RKEY, heartbeats), a RAM-like test handler, and a simulation harness
//! that steps the server's reactors between client polls. Every wait is bounded by a
//! step count and panics with what it waited for.

// Test code: a failed unwrap is a failed test that names its line.
#![allow(clippy::unwrap_used)]

pub mod client;
pub mod handler;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rtrs_spdk::engine::{CpuMask, Engine, EngineConfig, IdleStrategy, Simulation};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::server::{Server, ServerConfig, ServerHandler};

pub use client::{Event, TestPath};
pub use handler::{RamHandler, Shared};

/// Upper bound of simulation steps for one wait.
pub const MAX_STEPS: usize = 20_000;

/// What the test client needs from whoever runs the server.
pub trait Driver {
    /// Lets the server make progress (one simulation step, or a short pause).
    fn step(&mut self);
    /// The fabric the client connects and registers with.
    fn client_fabric(&self) -> Arc<dyn Fabric>;
    /// The server's first listening address.
    fn addr(&self) -> SocketAddr;
    /// Bound of the steps one wait may take.
    fn max_steps(&self) -> usize {
        MAX_STEPS
    }
}

impl Driver for Harness {
    fn step(&mut self) {
        self.sim.step();
    }
    fn client_fabric(&self) -> Arc<dyn Fabric> {
        Arc::new(self.fabric.clone())
    }
    fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// A server on `cores` simulated reactors over one loopback fabric.
pub struct Harness {
    pub sim: Simulation,
    pub fabric: LoopbackFabric,
    pub server: Server,
    pub addr: SocketAddr,
    /// A second listening address (for a second path of one session).
    pub addr2: SocketAddr,
    pub shared: Arc<Shared>,
}

impl Harness {
    pub fn new(cores: usize, cfg: ServerConfig) -> Harness {
        let fabric = LoopbackFabric::new();
        let f: Arc<dyn Fabric> = Arc::new(fabric.clone());
        Harness::with_fabric(cores, cfg, fabric, f)
    }

    /// The server on `server_fabric` (which must share `fabric`'s name table and
    /// registrations, e.g. a wrapper around it); the test client uses `fabric`.
    pub fn with_fabric(
        cores: usize,
        cfg: ServerConfig,
        fabric: LoopbackFabric,
        f: Arc<dyn Fabric>,
    ) -> Harness {
        let shared = Arc::new(Shared::default());
        let sh = Arc::clone(&shared);
        let mut h = Harness::start_on(Simulation::new(cores, 4096), cfg, fabric, f, move |core| {
            Box::new(RamHandler::new(core, Arc::clone(&sh)))
        });
        h.shared = shared;
        h
    }

    /// A server started on `sim` (its reactor 0 listening) with the handlers `factory`
    /// makes; `shared` is a fresh one the handlers do not see.
    pub fn start_on(
        mut sim: Simulation,
        cfg: ServerConfig,
        fabric: LoopbackFabric,
        f: Arc<dyn Fabric>,
        factory: impl Fn(usize) -> Box<dyn ServerHandler> + Send + Sync + 'static,
    ) -> Harness {
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = sim
            .reactor(0)
            .with_ctx(|cx| Server::start(cx, f, &[listen, listen], cfg, factory))
            .expect("server start");
        let addr = server.local_addrs()[0];
        let addr2 = server.local_addrs()[1];
        sim.run_until_idle(100);
        Harness {
            sim,
            fabric,
            server,
            addr,
            addr2,
            shared: Arc::default(),
        }
    }

    /// Small, fast defaults for tests.
    pub fn config(always_invalidate: bool) -> ServerConfig {
        ServerConfig {
            queue_depth: 16,
            chunk_size: 16384,
            always_invalidate,
            ..ServerConfig::default()
        }
    }

    /// One step of every reactor.
    pub fn step(&mut self) {
        self.sim.step();
    }

    /// Connects a path with `cid_num` connections and the given session name.
    pub fn connect(&mut self, name: &str, cid_num: u16) -> TestPath {
        TestPath::connect(self, name, cid_num, client::Ids::random(), true)
            .unwrap_or_else(|e| panic!("connecting {name}: errno {e}"))
    }

    /// Stops the server and steps until its pollers are gone.
    pub fn stop(mut self) {
        self.server.stop();
        for _ in 0..MAX_STEPS {
            self.sim.step();
            if self.server.is_stopped() {
                return;
            }
        }
        panic!("server did not stop: {:?}", self.server.stats());
    }
}

/// The server on two real reactor threads (adaptive idle, not pinned), with the test
/// client on the test thread.
pub struct Threaded {
    pub engine: Option<Engine>,
    pub server: Server,
    client: Arc<dyn Fabric>,
    addr: SocketAddr,
}

impl Driver for Threaded {
    fn step(&mut self) {
        std::thread::sleep(Duration::from_micros(100));
    }
    fn client_fabric(&self) -> Arc<dyn Fabric> {
        Arc::clone(&self.client)
    }
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn max_steps(&self) -> usize {
        // ~100 µs each: at least 10 s of wall time.
        100_000
    }
}

impl Threaded {
    pub fn start(
        server_fabric: Arc<dyn Fabric>,
        client: Arc<dyn Fabric>,
        cfg: ServerConfig,
    ) -> Threaded {
        let mut ec = EngineConfig::new(CpuMask::from_cpus(&[0, 1]).unwrap());
        ec.idle = IdleStrategy::adaptive();
        ec.pin = false;
        let engine = Engine::start(ec).expect("engine");
        let shared = Arc::new(Shared::default());
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server =
            Server::start_on_engine(&engine, 0, server_fabric, &[listen], cfg, move |core| {
                Box::new(RamHandler::new(core, Arc::clone(&shared)))
            })
            .expect("server");
        let addr = server.local_addrs()[0];
        Threaded {
            engine: Some(engine),
            server,
            client,
            addr,
        }
    }

    pub fn stop(mut self) {
        self.server.stop();
        for _ in 0..100_000 {
            if self.server.is_stopped() {
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        assert!(self.server.is_stopped(), "server pollers still running");
        self.engine
            .take()
            .unwrap()
            .shutdown()
            .expect("engine shutdown");
    }
}
