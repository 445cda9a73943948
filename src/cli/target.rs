//! An RNBD target on an engine: exports declared from specs, served by one RTRS server per
//! fabric (each with one [`RnbdServer`] per core; every server shares the exports), which
//! is what loading the kernel's `rnbd_server` and `rtrs_server` modules does, with exports
//! given up front. `rtrs-target` runs it over tcp and/or rdma; `rtrs-bench
//! --inline-target` runs it over the loopback fabric in its own process. Host lists
//! (`rtrs-target --allow NAME=PATTERN`) are set before the first listener opens.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engine::Engine;
use crate::fabric::Fabric;
use crate::rnbd::backend::{BackendSpec, ExportSpec, FileOptions};
use crate::rnbd::server::{Exports, HostPattern, RnbdServer, RnbdSessions, Served, TargetControl};
use crate::server::{Server, ServerConfig};

use super::human_size;

/// The addresses one fabric listens on.
pub struct Listen {
    /// The URL scheme shown in the ready line (`tcp`, `rdma`, `loopback`).
    pub scheme: &'static str,
    pub fabric: Arc<dyn Fabric>,
    pub addrs: Vec<SocketAddr>,
}

/// A running target.
pub struct StandaloneTarget {
    /// One server per fabric, in the order the fabrics were given, with its scheme.
    pub servers: Vec<(&'static str, Server)>,
    /// `name (ram 1 GiB)` / `name (file PATH, 1 GiB, ro)`, in declaration order.
    pub described: Vec<String>,
    exports: Arc<Exports>,
    /// Each server's RNBD sessions, for [`StandaloneTarget::control`].
    served: Vec<Served>,
}

/// Declares `specs`, restricts the exports named in `allow` to their patterns (the
/// others stay open to every host) and starts one server per entry of `listen` on
/// reactor 0 of `engine`.
///
/// # Errors
/// One line naming the export, file, parameter or address that failed; servers already
/// started are stopped again.
pub fn start_target(
    engine: &Engine,
    listen: Vec<Listen>,
    specs: &[ExportSpec],
    allow: &[(String, HostPattern)],
    config: ServerConfig,
) -> Result<StandaloneTarget, String> {
    config.validate().map_err(|e| e.to_string())?;
    let exports = Exports::new(specs, &FileOptions::default()).map_err(|e| e.to_string())?;
    for (name, pattern) in allow {
        let id = exports
            .lookup(name.as_bytes())
            .ok_or_else(|| format!("--allow {name}={pattern}: no --export named '{name}'"))?;
        exports.hosts(id).add(pattern.clone());
    }
    for (id, name) in exports.iter() {
        if let Some(list) = exports.hosts(id).get() {
            let list: Vec<String> = list.iter().map(ToString::to_string).collect();
            tracing::info!("export {name}: allowed hosts {}", list.join(", "));
        }
    }
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
    let exports = Arc::new(exports);
    let mut target = StandaloneTarget {
        servers: Vec::with_capacity(listen.len()),
        described,
        exports: Arc::clone(&exports),
        served: Vec::with_capacity(listen.len()),
    };
    for l in listen {
        let sessions = Arc::new(RnbdSessions::new(Arc::clone(&exports)));
        let started = Server::start_on_engine(
            engine,
            0,
            l.fabric,
            &l.addrs,
            config.clone(),
            RnbdServer::factory_with(Arc::clone(&sessions)),
        );
        match started {
            Ok(s) => {
                target.served.push(Served {
                    transport: l.scheme,
                    server: s.clone(),
                    sessions,
                });
                target.servers.push((l.scheme, s));
            }
            Err(e) => {
                target.stop(Duration::from_secs(5));
                return Err(format!("{}://: {e}", l.scheme));
            }
        }
    }
    Ok(target)
}

impl StandaloneTarget {
    /// The operator's view of the target: openers, forced close, disconnects.
    pub fn control(&self) -> TargetControl {
        TargetControl::new(Arc::clone(&self.exports), self.served.clone())
    }

    /// Every listening address as a URL (`tcp://127.0.0.1:1234`), server by server.
    pub fn urls(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|(scheme, s)| {
                s.local_addrs()
                    .iter()
                    .map(move |a| format!("{scheme}://{a}"))
            })
            .collect()
    }

    /// Stops listening, closes every session and waits (at most `limit`) until every
    /// server's pollers are done. Returns whether they finished.
    pub fn stop(&self, limit: Duration) -> bool {
        for (_, s) in &self.servers {
            s.stop();
        }
        let start = Instant::now();
        while !self.servers.iter().all(|(_, s)| s.is_stopped()) {
            if start.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }
}
