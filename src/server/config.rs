//! The server's configuration (the kernel's module parameters) and the errors of
//! starting a server.

use std::net::SocketAddr;
use std::time::Duration;

use super::chunks::ChunkAllocator;
use crate::common::HbConfig;
use crate::fabric::{Admission, FabricError, Psk};
use crate::process::{fds_left, mem_total};
use crate::proto::constants::{
    DEFAULT_MAX_CHUNK_SIZE, DEFAULT_MAX_HDR_SIZE, DEFAULT_SESS_QUEUE_DEPTH, MAX_CID_NUM,
    MIN_CHUNK_SIZE,
};
use crate::proto::fits_imm_budget;

/// Default [`ServerConfig::open_grace`].
pub const DEFAULT_OPEN_GRACE: Duration = Duration::from_secs(10);
/// Default [`ServerConfig::max_path_connections`].
pub const DEFAULT_MAX_PATH_CONNECTIONS: u16 = 513;
/// Longest [`ServerConfig::open_grace`] accepted.
pub const MAX_OPEN_GRACE: Duration = Duration::from_secs(3600);

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
    /// Most sessions, each holding its chunk pool (`queue_depth × chunk_size` bytes) from
    /// its first connection request: at the cap a session not in use (or still being
    /// set up) gives way to a new one, which is refused with −EUSERS only when none can
    /// (docs/ARCHITECTURE.md, "Session slots"). 0 (the default) derives it from the
    /// machine: as many pools as fit in a quarter of its memory, at least 4 and at most
    /// 1024 ([`ServerConfig::session_cap`]).
    pub max_sessions: usize,
    /// Most sessions from one client address (IPv6: one /64), the same way; default 16
    /// (at most `max_sessions`).
    pub max_sessions_per_source: usize,
    /// How long an established session may hold its slot without being in use (the
    /// handler's account, [`super::SessionUse`]: for RNBD, no device open), from its
    /// first path's INFO_REQ or its last device's close; it is closed after. Default 10 s.
    /// At a cap such sessions give way to newcomers before that (docs/ARCHITECTURE.md,
    /// "Session slots").
    pub open_grace: Duration,
    /// Most connections one path may ask for (`cid_num`); a path asking for more is
    /// refused with −EINVAL. Default 513: the kernel's client makes one per CPU plus the
    /// service connection, so 512 CPUs.
    pub max_path_connections: u16,
    /// Most connections of every path of every session, those still being made included:
    /// a path whose connections would pass it is refused (−EUSERS), after sessions
    /// not in use gave way. 0 (the default) derives it from the machine
    /// ([`ServerConfig::connection_cap`]).
    pub max_connections: usize,
    /// Most connections of the sessions from one client address (IPv6: one /64). 0 (the
    /// default): half of the connection cap.
    pub max_connections_per_source: usize,
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
            max_sessions: 0,
            max_sessions_per_source: 16,
            open_grace: DEFAULT_OPEN_GRACE,
            max_path_connections: DEFAULT_MAX_PATH_CONNECTIONS,
            max_connections: 0,
            max_connections_per_source: 0,
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

    /// The bytes of one session's chunk pool.
    pub fn pool_bytes(&self) -> u64 {
        u64::from(self.queue_depth) * u64::from(self.chunk_size)
    }

    /// The cap on sessions in effect: `max_sessions`, or where it is 0 as
    /// many chunk pools as fit in a quarter of the machine's memory (`MemTotal` of
    /// /proc/meminfo; 16 GiB where it cannot be read), between 4 and 1024.
    pub fn session_cap(&self) -> usize {
        if self.max_sessions > 0 {
            return self.max_sessions;
        }
        let fit = mem_total() / 4 / self.pool_bytes().max(1);
        fit.clamp(4, 1024) as usize
    }

    /// The most memory one connection of a session may come to hold (an estimate, for
    /// the caps' arithmetic): its send queue grown to `5 × queue_depth + 1` slots (of up
    /// to 256 bytes with their source lists, completions and credits) and its frame
    /// buffers (256 KiB). About 0.9 MiB at the default queue depth; an idle connection
    /// holds a few KiB of it.
    pub fn connection_bytes(&self) -> u64 {
        (u64::from(self.queue_depth) * 5 + 1) * 256 + (256 << 10)
    }

    /// The caps on connections in effect, in all and per source: `max_connections`, or
    /// where it is 0 the smaller of what an eighth of the machine's memory holds
    /// ([`ServerConfig::connection_bytes`] each) and two fifths of the file descriptors
    /// this process has left under its soft `RLIMIT_NOFILE` (a tcp connection is one
    /// descriptor; the rest is headroom for the listeners' sockets still in their
    /// handshake, files and the runtime, so that the limit is never reached), between 16
    /// and 65536; per source `max_connections_per_source`, or half of that.
    pub fn connection_cap(&self) -> (usize, usize) {
        let all = if self.max_connections > 0 {
            self.max_connections
        } else {
            let by_mem = mem_total() / 8 / self.connection_bytes().max(1);
            let by_fd = fds_left().map_or(u64::MAX, |n| n * 2 / 5);
            by_mem.min(by_fd).clamp(16, 65536) as usize
        };
        let per_source = if self.max_connections_per_source > 0 {
            self.max_connections_per_source
        } else {
            (all / 2).max(1)
        };
        (all, per_source.min(all))
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
        if self.max_sessions_per_source == 0 {
            return bad("max_sessions_per_source", 0, "must be at least 1");
        }
        let grace = self.open_grace;
        if grace < Duration::from_millis(1) || grace > MAX_OPEN_GRACE {
            return Err(ServerError::Config {
                field: "open_grace",
                value: format!("{grace:?}"),
                reason: "must be between 1 ms and 1 hour",
            });
        }
        if self.max_path_connections < 2 || self.max_path_connections > MAX_CID_NUM {
            return bad(
                "max_path_connections",
                self.max_path_connections.into(),
                "must be 2 to 4096 (the service connection and at least one for IO)",
            );
        }
        if self.max_connections == 1 {
            return bad(
                "max_connections",
                1,
                "must be 0 (derived from the machine) or at least 2 (one path)",
            );
        }
        if self.max_connections > 0 && self.max_connections_per_source > self.max_connections {
            return bad(
                "max_connections_per_source",
                self.max_connections_per_source as u64,
                "must be at most max_connections",
            );
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
