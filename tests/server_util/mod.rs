//! Shared pieces of the server tests: a minimal RTRS test client written directly on
//! `proto` + `fabric` (the real handshake, READ/WRITE requests, responses with and
//! without NEW_RKEY, heartbeats), a RAM-like test handler, and a simulation harness
//! that steps the server's reactors between client polls. Every wait is bounded by a
//! step count and panics with what it waited for.

#![allow(dead_code)]

pub mod client;
pub mod handler;

use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::engine::Simulation;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::server::{Server, ServerConfig};

pub use client::{Event, TestPath};
pub use handler::{RamHandler, Shared};

/// Upper bound of simulation steps for one wait.
pub const MAX_STEPS: usize = 20_000;

/// A server on `cores` simulated reactors over one loopback fabric.
pub struct Harness {
    pub sim: Simulation,
    pub fabric: LoopbackFabric,
    pub server: Server,
    pub addr: SocketAddr,
    pub shared: Arc<Shared>,
}

impl Harness {
    pub fn new(cores: usize, cfg: ServerConfig) -> Harness {
        let mut sim = Simulation::new(cores, 4096);
        let fabric = LoopbackFabric::new();
        let shared = Arc::new(Shared::default());
        let sh = Arc::clone(&shared);
        let f: Arc<dyn Fabric> = Arc::new(fabric.clone());
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let server = sim
            .reactor(0)
            .with_ctx(|cx| {
                Server::start(cx, f, &[listen], cfg, move |core| {
                    Box::new(RamHandler::new(core, Arc::clone(&sh)))
                })
            })
            .expect("server start");
        let addr = server.local_addrs()[0];
        sim.run_until_idle(100);
        Harness {
            sim,
            fabric,
            server,
            addr,
            shared,
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
