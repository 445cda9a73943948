//! What a target's operator sees and steers, over every RTRS server of one target (one
//! per fabric, all serving one set of [`Exports`]): each export's openers (the kernel's
//! `rnbd-server/devices/<dev>/sessions/`), the forced close of one session's mapping
//! (its `force_close`), and the disconnect of one path or a whole session
//! (`rtrs-server/<sess>/paths/<path>/disconnect`). `rtrs-target`'s control socket and
//! the SPDK target's `rtrs_target_*` RPCs both answer through it, so both say the same.
//!
//! Everything here is control path: it copies the session tables and takes a
//! statistics snapshot per call, never touching what the cores write per IO.

use std::sync::Arc;
use std::time::UNIX_EPOCH;

use serde::Serialize;

use super::exports::Exports;
use super::registry::RnbdSessions;
use crate::server::{Server, SessionId};

/// One RTRS server of a target and the RNBD session table its handlers share
/// ([`RnbdServer::factory_with`](super::RnbdServer::factory_with)).
#[derive(Clone)]
pub struct Served {
    /// The fabric's name (`tcp`, `rdma`, `loopback`), as the answers show it.
    pub transport: &'static str,
    pub server: Server,
    pub sessions: Arc<RnbdSessions<SessionId>>,
}

/// One path of an opener's session, as the RTRS server has it now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OpenerPath {
    /// `client@server`, the kernel's sysfs name of the path (what
    /// [`TargetControl::disconnect`] takes).
    pub addr: String,
    pub state: &'static str,
    /// The RDMA device and port the path lives on (`None` on the software fabrics).
    pub hca_name: Option<String>,
    pub hca_port: Option<u8>,
}

/// One session's mapping of an export.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Opener {
    pub export: String,
    pub sessname: String,
    pub transport: &'static str,
    /// The RTRS server's session id.
    pub session_id: u64,
    /// The id the client sends its IO with.
    pub device_id: u32,
    /// `ro`, `rw` or `migration`.
    pub access_mode: &'static str,
    /// When the mapping was made, in seconds since the Unix epoch.
    pub opened_at: u64,
    pub paths: Vec<OpenerPath>,
}

/// Why a control request changed nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    #[error("'export_name' = {name:?}: no such export")]
    UnknownExport { name: String },
    #[error("'sessname' = {name:?}: no such session")]
    UnknownSession { name: String },
    #[error("'export_name' = {export:?}: session {sessname:?} has no mapping of it")]
    NotMapped { export: String, sessname: String },
    #[error("'path' = {path:?}: session {sessname:?} has no such path (its paths: {})", paths.join(", "))]
    UnknownPath {
        sessname: String,
        path: String,
        paths: Vec<String>,
    },
}

/// The operator's view of a target (see the module doc).
pub struct TargetControl {
    exports: Arc<Exports>,
    servers: Vec<Served>,
}

impl TargetControl {
    pub fn new(exports: Arc<Exports>, servers: Vec<Served>) -> TargetControl {
        TargetControl { exports, servers }
    }

    /// Every mapping of `export` (of every export with `None`), over every server.
    ///
    /// # Errors
    /// [`ControlError::UnknownExport`].
    pub fn openers(&self, export: Option<&str>) -> Result<Vec<Opener>, ControlError> {
        let only = match export {
            Some(name) => Some(self.export_id(name)?),
            None => None,
        };
        let mut out = Vec::new();
        for s in &self.servers {
            let stats = s.server.stats();
            for (id, sess) in s.sessions.all() {
                let paths: Vec<OpenerPath> = stats
                    .sessions
                    .iter()
                    .filter(|x| x.id == id.0)
                    .flat_map(|x| &x.paths)
                    .map(|p| OpenerPath {
                        addr: p.addr.clone(),
                        state: p.state,
                        hca_name: p.hca_name.clone(),
                        hca_port: p.hca_port,
                    })
                    .collect();
                for (device_id, m) in sess.mappings() {
                    if only.is_some_and(|e| e != m.export) {
                        continue;
                    }
                    out.push(Opener {
                        export: self.exports.name(m.export).to_string(),
                        sessname: sess.name().to_string(),
                        transport: s.transport,
                        session_id: id.0,
                        device_id,
                        access_mode: m.mode.as_str(),
                        opened_at: m
                            .opened
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs()),
                        paths: paths.clone(),
                    });
                }
            }
        }
        out.sort_by(|a, b| (&a.export, &a.sessname).cmp(&(&b.export, &b.sessname)));
        Ok(out)
    }

    /// Closes session `sessname`'s mapping of `export` for the client (the kernel's
    /// `force_close`): its writer slot is free at once, its IO gets −ENOTCONN, and a new
    /// OPEN from it goes through the host list and access rules again. Returns the
    /// mappings closed (one per server the session has it on).
    ///
    /// # Errors
    /// An unknown export or session, or a session without that mapping: nothing changes.
    pub fn force_close(&self, export: &str, sessname: &str) -> Result<Vec<Opener>, ControlError> {
        let id = self.export_id(export)?;
        let open = self.openers(Some(export))?;
        let targets: Vec<&Opener> = open.iter().filter(|o| o.sessname == sessname).collect();
        if targets.is_empty() {
            return Err(if self.has_session(sessname) {
                ControlError::NotMapped {
                    export: export.to_string(),
                    sessname: sessname.to_string(),
                }
            } else {
                ControlError::UnknownSession {
                    name: sessname.to_string(),
                }
            });
        }
        let mut closed = Vec::new();
        for s in &self.servers {
            for (sid, sess) in s.sessions.all() {
                if sess.name() != sessname {
                    continue;
                }
                for (device_id, m) in sess.mappings() {
                    if m.export != id || sess.force_close(device_id).is_none() {
                        continue;
                    }
                    tracing::warn!(
                        "rnbd server: {sid} {sessname:?}: device {device_id} (export {export:?}, \
                         {}) closed by the operator",
                        m.mode.as_str()
                    );
                    if let Some(o) = open
                        .iter()
                        .find(|o| o.transport == s.transport && o.device_id == device_id)
                    {
                        closed.push(o.clone());
                    }
                }
            }
        }
        Ok(closed)
    }

    /// Disconnects one path of session `sessname` (`path`: its `client@server` address or
    /// the client's address alone) or, with `None`, every path of it. The client
    /// reconnects under its own policy. Returns the paths asked to close.
    ///
    /// # Errors
    /// An unknown session or path: nothing changes.
    pub fn disconnect(&self, sessname: &str, path: Option<&str>) -> Result<usize, ControlError> {
        if !self.has_session(sessname) {
            return Err(ControlError::UnknownSession {
                name: sessname.to_string(),
            });
        }
        let n: usize = self
            .servers
            .iter()
            .map(|s| match path {
                Some(p) => s.server.close_path(sessname, p),
                None => s.server.close_session(sessname),
            })
            .sum();
        match path {
            Some(p) if n == 0 => Err(ControlError::UnknownPath {
                sessname: sessname.to_string(),
                path: p.to_string(),
                paths: self.path_names(sessname),
            }),
            _ => Ok(n),
        }
    }

    fn export_id(&self, name: &str) -> Result<super::ExportId, ControlError> {
        self.exports
            .lookup(name.as_bytes())
            .ok_or_else(|| ControlError::UnknownExport {
                name: name.to_string(),
            })
    }

    /// Whether any server holds an RTRS session of that name.
    fn has_session(&self, sessname: &str) -> bool {
        self.servers
            .iter()
            .any(|s| s.server.stats().sessions.iter().any(|x| x.name == sessname))
    }

    fn path_names(&self, sessname: &str) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|s| s.server.stats().sessions)
            .filter(|x| x.name == sessname)
            .flat_map(|x| x.paths.into_iter().map(|p| p.addr))
            .collect()
    }
}

impl std::fmt::Debug for TargetControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetControl")
            .field("exports", &self.exports)
            .field("servers", &self.servers.len())
            .finish()
    }
}
