//! Server sessions and paths: the kernel's `struct rtrs_srv_sess` (one per client
//! session, owning the chunk pool shared by all its paths) and `struct rtrs_srv_path`
//! (one per client path: its connections, its chunk keys, its state).
//!
//! Both are shared across cores (`Arc`): a path's connections are polled by several
//! cores. What changes on the data path is atomic — the path state, the per-path and
//! per-session in-flight buf-id tables, counters — and everything else is written under
//! the session table lock on the control path (connect, INFO_REQ, close).
//!
//! **Buf-id ownership** (docs/PROTOCOL.md §6.2 [NOTE], docs/ARCHITECTURE.md, "Failover
//! without double execution hazards"): `Path::busy` marks a buf id from the IO_REQ's
//! arrival until its answer on that path (a second arrival is a broken client: the path
//! closes). `ServerSession::owner` names the path whose request is executing on a chunk; a
//! failed-over request finding its chunk owned by another (dying) path waits until that
//! owner releases it, so two requests never use a chunk at once. `ServerSession::done` counts,
//! per chunk, the requests that finished executing on it: a request that arrived before
//! the latest of them finished is a failed-over copy of it (a client re-uses a buf id
//! only once it has the answer, which comes later), so it is answered with that
//! execution's result instead of running a second time.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::{IuPool, Uuid};
use crate::fabric::{Fabric, FastMr, Hca};
use crate::proto::{ImmLayout, SgDesc};
use crate::sync::lock;
use crate::Errno;

use super::chunks::ChunkPool;
use super::stats::{PathCounters, ServerPathStats};

/// Identifies a server session (one client session, all its paths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "session#{}", self.0)
    }
}

/// Path states (docs/PROTOCOL.md §6.5).
pub(crate) const CONNECTING: u8 = 0;
pub(crate) const CONNECTED: u8 = 1;
pub(crate) const CLOSING: u8 = 2;
pub(crate) const CLOSED: u8 = 3;

pub(crate) fn state_name(s: u8) -> &'static str {
    match s {
        CONNECTING => "connecting",
        CONNECTED => "connected",
        CLOSING => "closing",
        _ => "closed",
    }
}

/// A client session on this server.
pub(crate) struct ServerSession {
    pub id: SessionId,
    pub paths_uuid: Uuid,
    /// Core polling cid 0 of every path (heartbeats, INFO, link events, teardown).
    pub home: usize,
    pub layout: ImmLayout,
    /// The session's own protection domain (`Fabric::domain`): its chunk pool, its paths'
    /// buffers and key slots are registered there and its connections accepted into it,
    /// so no key of it is valid on another session's connections.
    pub fabric: Arc<dyn Fabric>,
    /// The chunk pool: queue_depth × chunk_size, registered once.
    pub chunks: ChunkPool,
    /// Path id executing on each chunk, 0 when free.
    pub owner: Box<[AtomicU32]>,
    /// Per chunk: requests that finished executing on it (high 32 bits) and the result of
    /// the latest (low 32 bits: its positive errno, 0 for success). Written only by the
    /// chunk's owner.
    pub done: Box<[AtomicU64]>,
    pub name: Mutex<String>,
    /// Every path not yet finalised, by id, with its client's address: what an OPEN's
    /// host check covers ([`super::SrvPath::with_session_peers`]). Written under the
    /// session table's lock, and held from a joining path's check until it is recorded
    /// here, so an OPEN and a join are checked one after the other (lock order: table,
    /// peers, the layer above's).
    pub peers: Mutex<Vec<(u32, IpAddr)>>,
}

/// Claims an owner word for `pid` (non-zero); `Err(owner)` when another holds it.
fn claim(owner: &AtomicU32, pid: u32) -> Result<(), u32> {
    owner
        .compare_exchange(0, pid, Ordering::AcqRel, Ordering::Acquire)
        .map(|_| ())
}

/// Releases an owner word the caller [claimed](claim): nobody else writes it meanwhile,
/// so a plain store (with release ordering) suffices.
fn release_claim(owner: &AtomicU32) {
    owner.store(0, Ordering::Release);
}

/// Sets a flag; true if it was clear (the caller is the one that set it).
fn set_flag(f: &AtomicBool) -> bool {
    !f.swap(true, Ordering::AcqRel)
}

/// Clears a flag the caller [set](set_flag): a plain store.
fn clear_flag(f: &AtomicBool) {
    f.store(false, Ordering::Release);
}

impl ServerSession {
    pub fn chunk_size(&self) -> u32 {
        self.layout.chunk_size()
    }

    pub fn queue_depth(&self) -> u16 {
        self.layout.queue_depth()
    }

    /// Offset of chunk `buf_id` in the pool.
    pub fn chunk_off(&self, buf_id: u16) -> usize {
        usize::from(buf_id) * self.chunk_size() as usize
    }

    /// Claims chunk `buf_id` for path `pid`; `Err(owner)` when another holds it.
    pub fn try_own(&self, buf_id: u16, pid: u32) -> Result<(), u32> {
        claim(&self.owner[usize::from(buf_id)], pid)
    }

    /// Releases chunk `buf_id`, which the caller's request claimed ([`ServerSession::try_own`]
    /// succeeded for it and it has not released it since). A plain store: while a
    /// request owns the chunk nobody else writes its owner word (every other claim
    /// fails its compare-exchange), so no read-modify-write is needed; the release
    /// ordering publishes the request's writes to the chunk to the next owner.
    pub fn release_owned(&self, buf_id: u16) {
        release_claim(&self.owner[usize::from(buf_id)]);
    }

    /// The count of executions finished on chunk `buf_id`: a request takes it when it
    /// arrives (see [`ServerSession::executed_since`]).
    pub fn done_ticket(&self, buf_id: u16) -> u32 {
        (self.done[usize::from(buf_id)].load(Ordering::Acquire) >> 32) as u32
    }

    /// Records that a request executing on chunk `buf_id` (its owner) finished with
    /// `result`.
    pub fn record_done(&self, buf_id: u16, result: Result<(), Errno>) {
        let d = &self.done[usize::from(buf_id)];
        // Only the chunk's owner writes, so a load and a store suffice. The result is
        // kept as the positive errno, 0 for success.
        let count = (d.load(Ordering::Relaxed) >> 32).wrapping_add(1);
        let errno = result.err().map_or(0, Errno::get);
        d.store(count << 32 | u64::from(errno as u32), Ordering::Release);
    }

    /// The result of the latest execution on chunk `buf_id` if one finished after a
    /// request that took `ticket` arrived: that request is a copy of it (see the module
    /// doc).
    pub fn executed_since(&self, buf_id: u16, ticket: u32) -> Option<Result<(), Errno>> {
        let v = self.done[usize::from(buf_id)].load(Ordering::Acquire);
        ((v >> 32) as u32 != ticket).then(|| match Errno::from_raw(v as u32 as i32) {
            Some(e) => Err(e),
            None => Ok(()),
        })
    }

    pub fn name(&self) -> String {
        lock(&self.name).clone()
    }
}

/// One client path of a session.
pub(crate) struct Path {
    /// Unique, non-zero (chunk owner tag).
    pub id: u32,
    pub sess: Arc<ServerSession>,
    pub sess_uuid: Uuid,
    pub cid_num: u16,
    pub recon_cnt: u16,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// The RDMA device and port the path lives on (its first connection's); `None` on
    /// the software fabrics.
    pub hca: Option<Hca>,
    pub state: AtomicU8,
    /// Connections accepted so far, by cid (control path only, under the table lock).
    pub present: Mutex<Vec<bool>>,
    /// Time of the path's first connection request while CONNECTING (its handshake
    /// deadline counts from there), 0 once INFO_REQ completed.
    pub conn_ts: AtomicU64,
    /// always_invalidate: one fast-registration slot per chunk.
    pub mrs: Vec<FastMr>,
    /// always_invalidate: the key of each chunk's first binding, chosen with the slots
    /// (INFO_RSP announces them and its REG_MRs install them).
    pub first_keys: Vec<u32>,
    /// always_invalidate: one RKEY_RSP buffer per chunk.
    pub rkey_ius: Option<IuPool>,
    /// INFO_REQ receive buffer (slot 0) — INFO_RSP is built in `info_rsp`.
    pub info_req: IuPool,
    pub info_rsp: IuPool,
    /// Buf ids with a request on this path, one flag each (a flag of its own, so that
    /// clearing it is a plain store).
    pub busy: Box<[AtomicBool]>,
    /// Connections of this path still held by some core.
    pub live_cons: AtomicU32,
    /// Set by any receive on the path; consumed by the heartbeat on the home core.
    pub traffic: AtomicBool,
    pub name: Mutex<String>,
    pub counters: PathCounters,
}

impl Path {
    pub fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub fn is_connected(&self) -> bool {
        self.state() == CONNECTED
    }

    /// Marks `buf_id` busy on this path; false if it already was (a duplicate). The one
    /// read-modify-write of the flag: a broken client may send a buf id on two cores at
    /// once, and exactly one of them must see it free.
    pub fn mark_busy(&self, buf_id: u16) -> bool {
        self.busy.get(usize::from(buf_id)).is_some_and(set_flag)
    }

    /// Clears `buf_id`'s flag, set by the caller's request ([`Path::mark_busy`]
    /// returned true for it): nobody else writes a set flag, so a plain store.
    pub fn clear_busy(&self, buf_id: u16) {
        if let Some(b) = self.busy.get(usize::from(buf_id)) {
            clear_flag(b);
        }
    }

    /// Requests of this path that some core holds (any state): the sum of the cores'
    /// counts ([`PathCounters::held`]). Once the path has no connection left no core can
    /// take a new one, so a zero sum stays zero.
    pub fn ops_held(&self) -> u64 {
        self.counters.held()
    }

    pub fn name(&self) -> String {
        lock(&self.name).clone()
    }

    /// The INFO_RSP descriptors: one per chunk (always_invalidate, keys as the pending
    /// REG_MRs will install them) or the pool cut into equal regions under its own key.
    pub fn descs(&self, always_invalidate: bool) -> Vec<SgDesc> {
        let s = &self.sess;
        let cs = u64::from(s.chunk_size());
        let qd = u64::from(s.queue_depth());
        let base = s.chunks.addr();
        if always_invalidate {
            return self
                .mrs
                .iter()
                .enumerate()
                .map(|(i, _)| SgDesc {
                    addr: base + i as u64 * cs,
                    key: self.first_keys[i],
                    len: cs as u32,
                })
                .collect();
        }
        // The most chunks per descriptor that divides the depth evenly (kernel clients
        // require queue_depth % sg_cnt == 0) and keeps len within 32 bits.
        let per = (1..=qd)
            .rev()
            .find(|&n| qd % n == 0 && n * cs <= u64::from(u32::MAX))
            .unwrap_or(1);
        (0..qd / per)
            .map(|k| SgDesc {
                addr: base + k * per * cs,
                key: s.chunks.rkey_on(self.hca.as_ref().map_or(0, |h| h.index)),
                len: (per * cs) as u32,
            })
            .collect()
    }

    pub fn stats(&self) -> ServerPathStats {
        let [read_cnt, read_bytes, write_cnt, write_bytes, failover_waits, failover_dups, rsp_queued, dropped] =
            self.counters.snapshot();
        let (handler_lat_us_log2, handler_lat_sum_ns) = self.counters.latency();
        ServerPathStats {
            name: self.name(),
            addr: format!("{}@{}", self.peer, self.local),
            state: state_name(self.state()),
            hca_name: self.hca.as_ref().map(|h| h.name.to_string()),
            hca_port: self.hca.as_ref().map(|h| h.port),
            cid_num: self.cid_num,
            recon_cnt: self.recon_cnt,
            read_cnt,
            read_bytes,
            write_cnt,
            write_bytes,
            inflight: self.ops_held(),
            failover_waits,
            failover_dups,
            rsp_queued,
            dropped,
            handler_lat_us_log2,
            handler_lat_sum_ns,
        }
    }
}

/// A session with its paths, as kept in the table.
pub(crate) struct SessEntry {
    pub sess: Arc<ServerSession>,
    /// Paths found by sess_uuid (a stale path replaced by a reconnect leaves this list
    /// at once but stays in `all` until drained).
    pub paths: Vec<Arc<Path>>,
    /// Every path not yet finalised.
    pub all: Vec<Arc<Path>>,
    /// Paths that reached CONNECTED and are not finalised.
    pub up: usize,
    /// A path of it reached CONNECTED once (every session counts against the session
    /// caps from its first connection request: it holds its chunk pool from then).
    pub established: bool,
    /// The client address it came from (its first connection request), as the session
    /// caps count sources (`fabric::admission::source_of`: IPv6 per /64).
    pub source: std::net::IpAddr,
    /// The layer above's account of its use (docs/ARCHITECTURE.md, "Session slots").
    pub usage: Usage,
    /// Since when it has been established and not in use (`None`: in use, or not
    /// established); it is closed `open_grace` after.
    pub idle_since: Option<u64>,
    /// It gave way (to a newcomer at a cap, or at the end of its grace): its paths are
    /// closing and it counts against no cap (at most `slots::MAX_DRAINING` such at once).
    pub evicted: bool,
}

/// The layer above's account of one session, which the server consults on its control
/// path (connection requests, and about once a second): whether the session uses the
/// slot it holds, and who may join it. Called with the server's session table locked:
/// keep both cheap and free of calls back into the server.
pub trait SessionUse: Send + Sync {
    /// Whether the session is in use (RNBD: it has a device open). One that is not gives
    /// way at the caps and is closed `open_grace` after it stopped being in use.
    fn in_use(&self) -> bool;

    /// Whether a new path from `peer` may join the session (RNBD: the host list of every
    /// device it has open allows `peer`; `authenticated`: the connection proved the
    /// listener's key). `Err` says why not, for the refusal (−EACCES) and its log line.
    ///
    /// # Errors
    /// The reason the path is refused.
    fn may_join(&self, peer: IpAddr, authenticated: bool) -> Result<(), String>;
}

/// What the layer above says of a session's use ([`SessionUse`]).
#[derive(Clone)]
pub(crate) enum Usage {
    /// Not asked yet: being set up, or between its last path going down and the next
    /// coming up. Counts as in use (never gives way) for the moment this lasts.
    Unknown,
    /// The handler keeps no account: always in use, joins unchecked (the kernel's way).
    Always,
    By(Arc<dyn SessionUse>),
}

impl Usage {
    /// Whether the session is in use (see [`Usage::Unknown`]).
    pub fn in_use(&self) -> bool {
        match self {
            Usage::By(u) => u.in_use(),
            Usage::Unknown | Usage::Always => true,
        }
    }
}

/// All sessions, under one lock (control path only).
#[derive(Default)]
pub(crate) struct Sessions {
    pub sessions: Vec<SessEntry>,
}

impl Sessions {
    pub fn by_id(&mut self, id: SessionId) -> Option<&mut SessEntry> {
        self.sessions.iter_mut().find(|e| e.sess.id == id)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Threads that take `take`, count under it with a plain load and store, and give
    /// it back: no count may be lost, so no two ever hold it at once.
    fn exclusive(
        take: impl Fn(u32) -> bool + Send + Sync + 'static,
        give: impl Fn() + Send + Sync + 'static,
    ) {
        let take = Arc::new(take);
        let give = Arc::new(give);
        let count = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (1..=4u32)
            .map(|pid| {
                let (take, give, count) =
                    (Arc::clone(&take), Arc::clone(&give), Arc::clone(&count));
                std::thread::spawn(move || {
                    let mut mine = 0u64;
                    while mine < 20_000 {
                        if take(pid) {
                            let n = count.load(Ordering::Relaxed);
                            std::hint::spin_loop();
                            count.store(n + 1, Ordering::Relaxed);
                            mine += 1;
                            give();
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        assert_eq!(count.load(Ordering::Relaxed), 4 * 20_000);
    }

    #[test]
    fn a_claimed_chunk_is_released_by_a_plain_store() {
        let owner = Arc::new(AtomicU32::new(0));
        assert_eq!(claim(&owner, 7), Ok(()));
        assert_eq!(claim(&owner, 9), Err(7));
        release_claim(&owner);
        assert_eq!(claim(&owner, 9), Ok(()));
        release_claim(&owner);
        let (a, b) = (Arc::clone(&owner), Arc::clone(&owner));
        exclusive(move |pid| claim(&a, pid).is_ok(), move || release_claim(&b));
        assert_eq!(owner.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_busy_flag_is_set_once_and_cleared_by_a_plain_store() {
        let flag = Arc::new(AtomicBool::new(false));
        assert!(set_flag(&flag));
        assert!(
            !set_flag(&flag),
            "a second request on a busy buf id is a duplicate"
        );
        clear_flag(&flag);
        assert!(set_flag(&flag));
        clear_flag(&flag);
        let (a, b) = (Arc::clone(&flag), Arc::clone(&flag));
        exclusive(move |_| set_flag(&a), move || clear_flag(&b));
        assert!(!flag.load(Ordering::Relaxed));
    }
}
