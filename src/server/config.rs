//! The server's configuration (the kernel's module parameters) and the errors of
//! starting a server.

use std::net::SocketAddr;

use super::chunks::ChunkAllocator;
use crate::common::HbConfig;
use crate::fabric::{Admission, FabricError, Psk};
use crate::proto::constants::{
    DEFAULT_MAX_CHUNK_SIZE, DEFAULT_MAX_HDR_SIZE, DEFAULT_SESS_QUEUE_DEPTH, MIN_CHUNK_SIZE,
};
use crate::proto::fits_imm_budget;

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
    /// Most established sessions (those that had a connected path and still hold their
    /// chunk pool, each `queue_depth × chunk_size` bytes): a new session beyond it is
    /// refused with −EUSERS. 0 (the default) derives it from the machine: as many pools as
    /// fit in a quarter of its memory, at least 4 and at most 1024 ([`ServerConfig::session_cap`]).
    pub max_sessions: usize,
    /// Most established sessions from one client address (IPv6: one /64), refused with
    /// −EUSERS beyond; default 16 (at most `max_sessions`).
    pub max_sessions_per_source: usize,
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

    /// The cap on established sessions in effect: `max_sessions`, or where it is 0 as
    /// many chunk pools as fit in a quarter of the machine's memory (`MemTotal` of
    /// /proc/meminfo; 16 GiB where it cannot be read), between 4 and 1024.
    pub fn session_cap(&self) -> usize {
        if self.max_sessions > 0 {
            return self.max_sessions;
        }
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            })
            .map_or(16 << 30, |kib| kib << 10);
        let fit = total / 4 / self.pool_bytes().max(1);
        fit.clamp(4, 1024) as usize
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
