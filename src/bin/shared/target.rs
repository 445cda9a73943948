//! An RNBD target on an engine: exports declared from specs, served by the RTRS server
//! with one [`RnbdServer`] per core (what loading the kernel's `rnbd_server` and
//! `rtrs_server` modules does, with exports given up front). `rtrs-target` runs it over
//! tcp; `rtrs-bench --inline-target` runs it over the loopback fabric in its own process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rtrs_spdk::engine::Engine;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::rnbd::backend::{BackendSpec, ExportSpec, FileOptions};
use rtrs_spdk::rnbd::server::{Exports, RnbdServer};
use rtrs_spdk::server::{Server, ServerConfig};

use super::human_size;

/// A running target.
pub struct Target {
    pub server: Server,
    /// `name (ram 1 GiB)` / `name (file PATH, 1 GiB, ro)`, in declaration order.
    pub described: Vec<String>,
}

/// Declares `specs` and starts the server on reactor 0 of `engine`, listening on
/// `listen`.
///
/// # Errors
/// One line naming the export, file, parameter or address that failed.
pub fn start_target(
    engine: &Engine,
    fabric: Arc<dyn Fabric>,
    listen: &[SocketAddr],
    specs: &[ExportSpec],
    config: ServerConfig,
) -> Result<Target, String> {
    config.validate().map_err(|e| e.to_string())?;
    let exports = Exports::new(specs, &FileOptions::default()).map_err(|e| e.to_string())?;
    let described = exports
        .iter()
        .map(|(id, name)| {
            let g = exports.geometry(id);
            let spec = specs.iter().find(|s| s.name == name);
            match spec.map(|s| &s.backend) {
                Some(BackendSpec::File { path, .. }) => format!(
                    "{name} (file {}, {}{})",
                    path.display(),
                    human_size(g.size),
                    if g.read_only { ", ro" } else { "" }
                ),
                _ => format!("{name} (ram {})", human_size(g.size)),
            }
        })
        .collect();
    let server = Server::start_on_engine(
        engine,
        0,
        fabric,
        listen,
        config,
        RnbdServer::factory(Arc::new(exports)),
    )
    .map_err(|e| e.to_string())?;
    Ok(Target { server, described })
}

impl Target {
    /// Stops listening, closes every session and waits (at most `limit`) until the
    /// server's pollers are done. Returns whether they finished.
    pub fn stop(&self, limit: Duration) -> bool {
        self.server.stop();
        let start = Instant::now();
        while !self.server.is_stopped() {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}
