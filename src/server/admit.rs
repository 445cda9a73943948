//! Which session and path a connection request belongs to, and whether it may have them:
//! the kernel's lookup in `rtrs_rdma_connect` (docs/PROTOCOL.md §3.3, §6.4) — the session
//! by `paths_uuid` (created only with `first_conn`: its chunk pool is allocated here), the
//! path by `sess_uuid` — with what the kernel leaves to its closed network:
//! - sessions being set up are capped in total and per source, a newcomer evicting the
//!   oldest of the busiest source ([`room_to_set_up`]);
//! - a new session takes a slot, and its chunk pool, under the session caps, sessions
//!   not in use giving way (docs/ARCHITECTURE.md, "Session slots"; −EUSERS when none
//!   can);
//! - a path may ask for at most `max_path_connections` connections (−EINVAL), and its
//!   connections must fit the connection caps, sessions not in use giving way
//!   (docs/ARCHITECTURE.md, "Session slots"; −EUSERS when none can);
//! - every connection of a path comes from the address of its first;
//! - a path joining a session that exists is *authorised*: its address already carries
//!   a path of the session, or the layer above allows it (`SessionUse::may_join`: RNBD
//!   checks the host lists of the session's open devices), else −EACCES. `paths_uuid`
//!   travels in clear in every request, so it names a session but proves nothing.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::{IuPool, Uuid};
use crate::fabric::admission::{self, victim};
use crate::fabric::{next_rkey, Access, FabricError, Hca, KeyScope};
use crate::proto::constants::MAX_PATHS_NUM;
use crate::proto::{ConnReq, EncodeError, ImmLayout, InfoReq, InfoRsp, RkeyRsp};
use crate::sync::lock;
use crate::Errno;

use super::chunks::ChunkError;
use super::session::{
    state_name, Path, ServerSession, SessEntry, SessionId, Sessions, Usage, CONNECTING,
};
use super::slots::Need;
use super::state::ServerState;
use super::stats::PathCounters;

/// A path to accept the connection into, or a refusal (errno, reason).
pub(crate) type Admit = Result<Arc<Path>, (Errno, String)>;

/// One connection request, as the acceptor received it.
pub(crate) struct Request<'a> {
    pub msg: &'a ConnReq,
    pub peer: SocketAddr,
    pub local: SocketAddr,
    pub hca: Option<&'a Hca>,
    /// The initiator proved the listener's key.
    pub authenticated: bool,
    pub now: u64,
}

/// What [`admit`] decided, and the paths it closes to make it so.
pub(crate) struct Admitted {
    pub path: Admit,
    /// Stale or half-open paths replaced.
    pub zombies: Vec<Arc<Path>>,
    /// Paths of sessions that gave way to this request, each group with why.
    pub evicted: Vec<(Vec<Arc<Path>>, String)>,
}

/// Whether `p` is still connecting `timeout_ns` after its first connection request.
pub(crate) fn is_zombie(p: &Path, now: u64, timeout_ns: u64) -> bool {
    let ts = p.conn_ts.load(Ordering::Acquire);
    p.state() == CONNECTING && ts != 0 && now.saturating_sub(ts) >= timeout_ns
}

/// Whether a session is being set up: no connected path, and one still connecting.
fn setting_up(e: &SessEntry) -> bool {
    e.up == 0 && e.all.iter().any(|p| p.state() == CONNECTING)
}

/// Finds or creates the session and path for `req` (under the table lock).
pub(crate) fn admit(sh: &ServerState, timeout_ns: u64, req: &Request<'_>) -> Admitted {
    let mut out = Admitted {
        path: Err((Errno::ECONNRESET, String::new())),
        zombies: Vec::new(),
        evicted: Vec::new(),
    };
    let msg = req.msg;
    let max = sh.cfg.max_path_connections;
    if msg.cid_num > max {
        out.path = Err((
            Errno::EINVAL,
            format!(
                "the path asks for {} connections, at most {max} per path \
                 (max_path_connections)",
                msg.cid_num
            ),
        ));
        return out;
    }
    let mut t = lock(&sh.table);
    let idx = match t
        .sessions
        .iter()
        .position(|e| e.sess.paths_uuid == msg.paths_uuid)
    {
        Some(i) if t.sessions[i].evicted => {
            out.path = Err((
                Errno::ECONNRESET,
                format!("{} is closing: it gave way", t.sessions[i].sess.id),
            ));
            return out;
        }
        Some(i) => i,
        None if !msg.first_conn => {
            let why = "unknown session (paths_uuid) and first_conn not set".to_string();
            out.path = Err((Errno::ENXIO, why));
            return out;
        }
        None => match new_entry(sh, &mut t, req, &mut out) {
            Ok(e) => {
                t.sessions.push(e);
                t.sessions.len() - 1
            }
            Err(refusal) => {
                out.path = Err(refusal);
                return out;
            }
        },
    };
    out.path = admit_path(sh, timeout_ns, &mut t, idx, req, &mut out);
    if out.path.is_err() && t.sessions[idx].all.is_empty() {
        t.sessions.remove(idx);
    }
    out
}

/// A new session for `req`: room among the sessions being set up, a slot (sessions
/// not in use giving way), its chunk pool. The slot is taken here, with the pool, not
/// once the session is established: a pool is memory whether its session finished its
/// handshake or not (SPDK DMA memory in the SPDK target).
fn new_entry(
    sh: &ServerState,
    t: &mut Sessions,
    req: &Request<'_>,
    out: &mut Admitted,
) -> Result<SessEntry, (Errno, String)> {
    room_to_set_up(sh, t, req.peer, out)?;
    let source = admission::source_of(req.peer.ip());
    let room = t.plan_room(&sh.caps, source, Need::ServerSession, None)?;
    let sess = new_session(sh, req.msg.paths_uuid).map_err(|e| (Errno::ENOMEM, e.to_string()))?;
    if !room.victims.is_empty() {
        let paths = t.evict(&room);
        out.evicted.push((
            paths,
            format!(
                "the session was not in use (no device open) and gave way to a new one from \
                 {}: {}",
                req.peer.ip(),
                room.why
            ),
        ));
    }
    Ok(SessEntry {
        sess,
        paths: Vec::new(),
        all: Vec::new(),
        up: 0,
        established: false,
        source,
        usage: Usage::Unknown,
        idle_since: None,
        evicted: false,
    })
}

/// Before a new session from `peer`: picks the session being set up that must give way
/// (the caps of `max_pending_sessions` and the admission's per-source limit) and puts
/// its connecting paths in `out.evicted`. Refuses (−EBUSY) only when sessions without a
/// connected path, those still closing included, reach twice the cap.
fn room_to_set_up(
    sh: &ServerState,
    t: &Sessions,
    peer: SocketAddr,
    out: &mut Admitted,
) -> Result<(), (Errno, String)> {
    let cap = sh.cfg.max_pending_sessions;
    let unfinished = t.sessions.iter().filter(|e| e.up == 0).count();
    if unfinished >= cap.saturating_mul(2) {
        return Err((
            Errno::EBUSY,
            format!(
                "{unfinished} sessions are being set up or closed \
                 (twice max_pending_sessions, {cap})"
            ),
        ));
    }
    let pending: Vec<&SessEntry> = t.sessions.iter().filter(|e| setting_up(e)).collect();
    let key = |e: &&SessEntry| {
        let src = e.all.first().map_or(peer.ip(), |p| p.peer.ip());
        (src, e.sess.id.0)
    };
    let per_source = sh.cfg.admission.max_pending_per_source;
    if let Some(i) = victim(&pending, peer.ip(), per_source, cap, key) {
        let paths = pending[i]
            .all
            .iter()
            .filter(|p| p.state() == CONNECTING)
            .cloned()
            .collect();
        out.evicted.push((
            paths,
            format!(
                "session still being set up, evicted for a new one from {}: at most {} \
                 sessions being set up ({per_source} per source)",
                peer.ip(),
                cap,
            ),
        ));
    }
    Ok(())
}

/// The path of session `idx` that `req` belongs to, created when new.
fn admit_path(
    sh: &ServerState,
    timeout_ns: u64,
    t: &mut Sessions,
    idx: usize,
    req: &Request<'_>,
    out: &mut Admitted,
) -> Admit {
    let (msg, peer, now) = (req.msg, req.peer, req.now);
    let sess = Arc::clone(&t.sessions[idx].sess);
    // Held until the new path is among them: an OPEN checking the session's paths runs
    // wholly before this join's check or after the path is in (see `ServerSession::peers`).
    let mut peers = lock(&sess.peers);
    let e = &mut t.sessions[idx];
    if let Some(pi) = e.paths.iter().position(|p| p.sess_uuid == msg.sess_uuid) {
        let p = Arc::clone(&e.paths[pi]);
        if p.recon_cnt == msg.recon_cnt {
            return another_connection(p, req, timeout_ns, &mut out.zombies);
        }
        if msg.cid != 0 {
            return Err((
                Errno::ECONNRESET,
                format!(
                    "cid {} of reconnect attempt {} before its cid 0 (path is at attempt {})",
                    msg.cid, msg.recon_cnt, p.recon_cnt
                ),
            ));
        }
        // A reconnect replaces the stale path; as a new path it joins the session.
        may_join(e, &peers, req)?;
        let e = &mut t.sessions[idx];
        e.paths.remove(pi);
        out.zombies.push(p);
    } else if !e.all.is_empty() {
        may_join(e, &peers, req)?;
    }
    let e = &t.sessions[idx];
    if e.all.len() >= MAX_PATHS_NUM {
        return Err((
            Errno::ECONNRESET,
            format!("session already has {MAX_PATHS_NUM} paths"),
        ));
    }
    if let Some(dup) = e
        .paths
        .iter()
        .find(|p| p.peer.ip() == peer.ip() && p.local == req.local)
    {
        if is_zombie(dup, now, timeout_ns) {
            out.zombies.push(Arc::clone(dup));
        }
        return Err((
            Errno::EEXIST,
            format!(
                "session already has a path from {} to {}",
                peer.ip(),
                req.local
            ),
        ));
    }
    let room = t.plan_room(
        &sh.caps,
        e.source,
        Need::Conns(usize::from(msg.cid_num)),
        Some(e.sess.id),
    )?;
    let path = new_path(sh, &sess, req).map_err(|e| (Errno::ENOMEM, e.to_string()))?;
    if !room.victims.is_empty() {
        let paths = t.evict(&room);
        out.evicted.push((
            paths,
            format!(
                "the session gave way to a path from {} (it was not in use, or still being \
                 set up): {}",
                peer.ip(),
                room.why
            ),
        ));
    }
    peers.push((path.id, peer.ip()));
    drop(peers);
    let e = &mut t.sessions[idx];
    e.paths.push(Arc::clone(&path));
    e.all.push(Arc::clone(&path));
    Ok(path)
}

/// One more connection (cid) of path `p`, which is still connecting.
fn another_connection(
    p: Arc<Path>,
    req: &Request<'_>,
    timeout_ns: u64,
    zombies: &mut Vec<Arc<Path>>,
) -> Admit {
    let (msg, hca) = (req.msg, req.hca);
    let cid = usize::from(msg.cid);
    if p.state() != CONNECTING {
        return Err((
            Errno::ECONNRESET,
            format!("path is {}, not connecting", state_name(p.state())),
        ));
    }
    if req.peer.ip() != p.peer.ip() {
        // The uuids travel in clear: a connection of someone else's path must not ride
        // on its handshake.
        return Err((
            Errno::ECONNRESET,
            format!(
                "connection cid {cid} comes from {}, its path's first from {}",
                req.peer.ip(),
                p.peer.ip()
            ),
        ));
    }
    if p.hca.as_ref().map(|h| h.index) != hca.map(|h| h.index) {
        // The path's keys live on the device of its first connection.
        return Err((
            Errno::ECONNRESET,
            format!(
                "connection cid {cid} arrived through another RDMA device ({}) than \
                 its path's ({})",
                hca.map_or("none", |h| &*h.name),
                p.hca.as_ref().map_or("none", |h| &*h.name)
            ),
        ));
    }
    if p.cid_num != msg.cid_num {
        return Err((
            Errno::ECONNRESET,
            format!(
                "cid_num {} differs from the path's {}",
                msg.cid_num, p.cid_num
            ),
        ));
    }
    let mut present = lock(&p.present);
    if present[cid] {
        drop(present);
        if is_zombie(&p, req.now, timeout_ns) {
            zombies.push(p);
        }
        return Err((
            Errno::ECONNRESET,
            format!("connection cid {cid} already exists"),
        ));
    }
    present[cid] = true;
    drop(present);
    Ok(p)
}

/// Whether the new path of `req` may join session `e`, whose paths come from `peers`
/// (the caller holds their lock): its address already carries a path of the session,
/// or the layer above allows it.
fn may_join(
    e: &SessEntry,
    peers: &[(u32, IpAddr)],
    req: &Request<'_>,
) -> Result<(), (Errno, String)> {
    let ip = req.peer.ip();
    if peers.iter().any(|&(_, p)| p == ip) {
        return Ok(());
    }
    let Usage::By(u) = &e.usage else {
        return Ok(());
    };
    u.may_join(ip, req.authenticated).map_err(|why| {
        (
            Errno::EACCES,
            format!("path joining {} {:?}: {why}", e.sess.id, e.sess.name()),
        )
    })
}

/// What a new session or path could not have: its REJ says ENOMEM, the log this.
#[derive(Debug, thiserror::Error)]
enum NoResources {
    #[error("imm layout: {0}")]
    Layout(#[source] EncodeError),
    #[error("protection domain: {0}")]
    Domain(#[source] FabricError),
    #[error("chunk pool of {qd} x {cs} bytes ({kind} memory): {source}")]
    Chunks {
        qd: u16,
        cs: u32,
        kind: &'static str,
        #[source]
        source: ChunkError,
    },
    #[error("chunk keys: {0}")]
    Keys(#[source] FabricError),
    #[error("message buffers: {0}")]
    Buffers(#[source] FabricError),
}

fn new_session(sh: &ServerState, paths_uuid: Uuid) -> Result<Arc<ServerSession>, NoResources> {
    let cfg = &sh.cfg;
    let (qd, cs) = (cfg.queue_depth, cfg.chunk_size);
    let layout = ImmLayout::new(qd, cs).map_err(NoResources::Layout)?;
    let access = if cfg.always_invalidate {
        Access::LOCAL_WRITE
    } else {
        Access::LOCAL_WRITE | Access::REMOTE_WRITE
    };
    let len = usize::from(qd) * cs as usize;
    let fabric = sh.fabric.domain().map_err(NoResources::Domain)?;
    let chunks = cfg
        .chunk_alloc
        .alloc(&*fabric, len, access)
        .map_err(|source| NoResources::Chunks {
            qd,
            cs,
            kind: cfg.chunk_alloc.kind(),
            source,
        })?;
    let id = sh.next_id.fetch_add(1, Ordering::Relaxed);
    let home = sh.next_home.fetch_add(1, Ordering::Relaxed) % sh.ncores;
    Ok(Arc::new(ServerSession {
        id: SessionId(id),
        paths_uuid,
        home,
        layout,
        fabric,
        chunks,
        owner: (0..qd).map(|_| AtomicU32::new(0)).collect(),
        done: (0..qd).map(|_| AtomicU64::new(0)).collect(),
        name: Mutex::new(String::new()),
        peers: Mutex::new(Vec::new()),
    }))
}

fn new_path(
    sh: &ServerState,
    sess: &Arc<ServerSession>,
    req: &Request<'_>,
) -> Result<Arc<Path>, NoResources> {
    let msg = req.msg;
    let fabric = &*sess.fabric;
    let qd = sess.queue_depth();
    let ai = sh.cfg.always_invalidate;
    // The chunk keys of a path live on its device (docs/ARCHITECTURE.md, "Several
    // RDMA devices").
    let device = req.hca.map_or(0, |h| h.index);
    let mrs = if ai {
        (0..qd)
            .map(|_| fabric.alloc_fast_mr_on(KeyScope::Domain, device))
            .collect::<Result<Vec<_>, _>>()
            .map_err(NoResources::Keys)?
    } else {
        Vec::new()
    };
    let io =
        |n, size| IuPool::new(fabric, n, size, Access::LOCAL_WRITE).map_err(NoResources::Buffers);
    let rkey_ius = if ai {
        Some(io(usize::from(qd), RkeyRsp::LEN)?)
    } else {
        None
    };
    let mut present = vec![false; usize::from(msg.cid_num)];
    present[usize::from(msg.cid)] = true;
    Ok(Arc::new(Path {
        id: (sh.next_id.fetch_add(1, Ordering::Relaxed) as u32).max(1),
        sess: Arc::clone(sess),
        sess_uuid: msg.sess_uuid,
        cid_num: msg.cid_num,
        recon_cnt: msg.recon_cnt,
        peer: req.peer,
        local: req.local,
        hca: req.hca.cloned(),
        state: AtomicU8::new(CONNECTING),
        present: Mutex::new(present),
        conn_ts: AtomicU64::new(req.now.max(1)),
        first_keys: mrs.iter().map(|m| next_rkey(m.rkey())).collect(),
        mrs,
        rkey_ius,
        info_req: io(1, InfoReq::LEN)?,
        info_rsp: io(1, InfoRsp::wire_len(qd))?,
        busy: (0..qd).map(|_| AtomicBool::new(false)).collect(),
        live_cons: AtomicU32::new(0),
        traffic: AtomicBool::new(false),
        name: Mutex::new(String::new()),
        counters: PathCounters::new(sh.ncores),
    }))
}
