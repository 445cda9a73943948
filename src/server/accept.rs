//! Listeners and CONNECT_REQUEST handling: the kernel's `rtrs_srv_rdma_cm_handler` /
//! `rtrs_rdma_connect` (docs/PROTOCOL.md §3.3, §6.4, §6.5, §9.1), as one poller on the core
//! that started the server.
//!
//! A request is decoded and checked by [`ConnReq::decode`]; the session is found by
//! `paths_uuid` (created only with `first_conn`: the chunk pool is registered here), the
//! path by `sess_uuid`. Refusals carry a conn_rsp with the kernel's errno. Beyond the
//! kernel: a connection request for cid 0 whose `recon_cnt` differs from the stored
//! path's is a reconnect, so the stale path is closed and replaced at once (the kernel
//! refuses until its heartbeat kills the old path). Admission (beyond the kernel): a path
//! whose handshake is not done within `admission.handshake_timeout` of its first
//! connection request is closed, by a periodic check as well as on collision (the kernel
//! waits 30 s, and only on collision); a new session at the cap of sessions being set up
//! evicts the oldest one of the busiest source ([`victim`]). An accepted connection gets
//! its receives posted (the INFO_REQ buffer on cid 0, `queue_depth` empty receives on IO
//! cids) and is moved to its core in a [`Msg`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::common::{IuPool, RtrsCon, Uuid};
use crate::engine::{Ctx, Msg, PollResult, Poller};
use crate::fabric::admission::{self, victim};
use crate::fabric::{next_rkey, Access, ConnRequest, Hca, KeyScope, Listener, QpCaps};
use crate::proto::constants::{MAX_PATHS_NUM, SERVICE_CON_QUEUE_DEPTH};
use crate::proto::{signal_interval, ConnReq, ConnRsp, ImmLayout, InfoReq, InfoRsp, RkeyRsp};
use crate::sync::lock;

use super::session::{state_name, Path, SessEntry, Session, SessionId, Sessions, CONNECTING};
use super::state::{PathWork, ServerState};
use super::stats::PathCounters;
use super::wr::WrId;
use crate::Errno;

/// How often half-open paths are looked for, at most (a quarter of the handshake timeout
/// when that is shorter).
const REAP_EVERY_NS: u64 = 1_000_000_000;

/// A path to accept the connection into, or a refusal (errno, reason).
type Admit = Result<Arc<Path>, (Errno, String)>;

/// The listeners' poller.
pub(crate) struct Acceptor {
    sh: Arc<ServerState>,
    listeners: Vec<Box<dyn Listener>>,
    /// Connections whose move to their core met a full mailbox.
    pending: Vec<(usize, Msg)>,
    last_reap: u64,
    /// The handshake deadline and the reaping period, in ns.
    timeout_ns: u64,
    reap_every_ns: u64,
    /// When the listeners are polled next.
    pacing: ListenPacing,
    done: bool,
}

/// Listeners are polled every this many loops while connections arrive (a tcp listener
/// costs an `accept` system call per poll, which the reactor's IO loop should not pay
/// every time); a loop that found a request polls again on the next one.
const LISTEN_EVERY: u32 = 32;
/// ... and every this many once nothing arrives (each empty poll doubles the gap): a
/// busy reactor loops a million times a second or more, and at every 32nd loop the
/// idle `accept` calls were as many as the IO's own system calls at queue depth 1
/// (docs/BENCHMARKS.md, "Syscalls per IO").
const LISTEN_EVERY_IDLE: u32 = 1024;
/// ... and at least this often (ns): a reactor that sleeps when idle makes few loops,
/// and a burst of connections must not overflow the accept queue (whose overflow
/// drops SYNs: a client would wait for its retransmission, a second or more).
const LISTEN_PERIOD_NS: u64 = 1_000_000;

/// When the listeners are polled: every [`LISTEN_EVERY`] loops while connections
/// arrive, the gap doubling with every poll that finds nothing up to
/// [`LISTEN_EVERY_IDLE`], and at least every [`LISTEN_PERIOD_NS`]; the loop after a poll
/// that found a request polls again.
#[derive(Debug)]
struct ListenPacing {
    /// Loops since the last poll.
    skipped: u32,
    /// Loops between two polls now.
    every: u32,
    /// When the listeners were last polled (ns).
    last: u64,
}

impl ListenPacing {
    fn new() -> ListenPacing {
        ListenPacing {
            skipped: LISTEN_EVERY,
            every: LISTEN_EVERY,
            last: 0,
        }
    }

    /// One more loop at `now`: whether it polls the listeners (then [`polled`](Self::polled)
    /// must follow).
    fn due(&mut self, now: u64) -> bool {
        self.skipped += 1;
        if self.skipped < self.every && now.saturating_sub(self.last) < LISTEN_PERIOD_NS {
            return false;
        }
        self.skipped = 0;
        self.last = now;
        true
    }

    /// The listeners were polled; `found`: some request came.
    fn polled(&mut self, found: bool) {
        if found {
            self.every = LISTEN_EVERY;
            self.skipped = LISTEN_EVERY;
        } else {
            self.every = (self.every * 2).min(LISTEN_EVERY_IDLE);
        }
    }
}

/// Whether `p` is still connecting `timeout_ns` after its first connection request.
fn is_zombie(p: &Path, now: u64, timeout_ns: u64) -> bool {
    let ts = p.conn_ts.load(Ordering::Acquire);
    p.state() == CONNECTING && ts != 0 && now.saturating_sub(ts) >= timeout_ns
}

/// Whether a session is being set up: no connected path, and one still connecting.
fn setting_up(e: &SessEntry) -> bool {
    e.up == 0 && e.all.iter().any(|p| p.state() == CONNECTING)
}

impl Acceptor {
    pub fn new(sh: Arc<ServerState>, listeners: Vec<Box<dyn Listener>>) -> Acceptor {
        let timeout_ns = sh.cfg.admission.handshake_timeout_ns();
        Acceptor {
            sh,
            listeners,
            pending: Vec::new(),
            last_reap: 0,
            timeout_ns,
            reap_every_ns: (timeout_ns / 4).clamp(1_000_000, REAP_EVERY_NS),
            pacing: ListenPacing::new(),
            done: false,
        }
    }

    fn refuse(&self, cx: &mut dyn Ctx, req: ConnRequest, errno: Errno, why: &str) {
        if self.sh.log.allow(cx.now()) {
            tracing::warn!(
                "rtrs-srv: refusing connection from {}: {why} (errno {})",
                req.peer,
                errno.neg()
            );
        }
        // The wire's negative errno, made here.
        let rsp = ConnRsp::reject(errno.neg())
            .to_bytes()
            .unwrap_or([0; ConnRsp::LEN]);
        let _ = req.reject(&rsp);
    }

    fn on_request(&mut self, cx: &mut dyn Ctx, req: ConnRequest, local: SocketAddr) {
        let msg = match ConnReq::decode(req.private_data.as_bytes()) {
            Ok(m) => m,
            Err(e) => return self.refuse(cx, req, Errno::ECONNRESET, &e.to_string()),
        };
        let hca = req.hca();
        let (res, zombies, evicted) = self.admit(cx.now(), &msg, req.peer, local, hca.as_ref());
        for z in &zombies {
            self.sh
                .close_path(cx, z, format_args!("stale or half-open path replaced"));
        }
        for z in &evicted {
            self.sh.close_path(
                cx,
                z,
                format_args!(
                    "session still being set up, evicted for a new one from {}: at most {} \
                     sessions being set up ({} per source)",
                    req.peer.ip(),
                    self.sh.cfg.max_pending_sessions,
                    self.sh.cfg.admission.max_pending_per_source
                ),
            );
        }
        match res {
            Ok(path) => self.accept(cx, req, &msg, path),
            Err((errno, why)) => self.refuse(cx, req, errno, &why),
        }
    }

    /// Finds or creates the session and path for `msg` (under the table lock). Returns
    /// the path or a refusal, paths to close (zombies, stale paths), and the paths of a
    /// session evicted to make room for a new one.
    fn admit(
        &self,
        now: u64,
        msg: &ConnReq,
        peer: SocketAddr,
        local: SocketAddr,
        hca: Option<&Hca>,
    ) -> (Admit, Vec<Arc<Path>>, Vec<Arc<Path>>) {
        let mut zombies = Vec::new();
        let mut evicted = Vec::new();
        let mut t = lock(&self.sh.table);
        let idx = match t
            .sessions
            .iter()
            .position(|e| e.sess.paths_uuid == msg.paths_uuid)
        {
            Some(i) => i,
            None if !msg.first_conn => {
                let why = "unknown session (paths_uuid) and first_conn not set".to_string();
                return (Err((Errno::ENXIO, why)), zombies, evicted);
            }
            None => match self.make_room(&t, peer, &mut evicted).and_then(|()| {
                let source = admission::source_of(peer.ip());
                let cfg = &self.sh.cfg;
                if let Some(why) = t.over_cap(
                    self.sh.session_cap,
                    cfg.max_sessions_per_source,
                    source,
                    None,
                ) {
                    return Err((Errno::EUSERS, why));
                }
                self.new_session(msg.paths_uuid)
                    .map_err(|w| (Errno::ENOMEM, w))
            }) {
                Ok(sess) => {
                    t.sessions.push(SessEntry {
                        sess,
                        paths: Vec::new(),
                        all: Vec::new(),
                        up: 0,
                        established: false,
                        source: admission::source_of(peer.ip()),
                    });
                    t.sessions.len() - 1
                }
                Err(refusal) => return (Err(refusal), zombies, evicted),
            },
        };
        let res = self.admit_path(
            &mut t.sessions[idx],
            now,
            msg,
            (peer, local, hca),
            &mut zombies,
        );
        if res.is_err() && t.sessions[idx].all.is_empty() {
            t.sessions.remove(idx);
        }
        (res, zombies, evicted)
    }

    /// Before a new session from `peer`: picks the session being set up that must give
    /// way (the caps of `max_pending_sessions` and the admission's per-source limit) and
    /// puts its connecting paths in `evicted`. Refuses (−EBUSY) only when sessions without
    /// a connected path, those still closing included, reach twice the cap.
    fn make_room(
        &self,
        t: &Sessions,
        peer: SocketAddr,
        evicted: &mut Vec<Arc<Path>>,
    ) -> Result<(), (Errno, String)> {
        let cap = self.sh.cfg.max_pending_sessions;
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
        let per_source = self.sh.cfg.admission.max_pending_per_source;
        if let Some(i) = victim(&pending, peer.ip(), per_source, cap, key) {
            evicted.extend(
                pending[i]
                    .all
                    .iter()
                    .filter(|p| p.state() == CONNECTING)
                    .cloned(),
            );
        }
        Ok(())
    }

    fn admit_path(
        &self,
        e: &mut SessEntry,
        now: u64,
        msg: &ConnReq,
        (peer, local, hca): (SocketAddr, SocketAddr, Option<&Hca>),
        zombies: &mut Vec<Arc<Path>>,
    ) -> Admit {
        let cid = usize::from(msg.cid);
        if let Some(pi) = e.paths.iter().position(|p| p.sess_uuid == msg.sess_uuid) {
            let p = Arc::clone(&e.paths[pi]);
            if p.recon_cnt != msg.recon_cnt {
                if msg.cid != 0 {
                    return Err((
                        Errno::ECONNRESET,
                        format!(
                            "cid {} of reconnect attempt {} before its cid 0 (path is at attempt {})",
                            msg.cid, msg.recon_cnt, p.recon_cnt
                        ),
                    ));
                }
                e.paths.remove(pi);
                zombies.push(p);
            } else {
                if p.state() != CONNECTING {
                    return Err((
                        Errno::ECONNRESET,
                        format!("path is {}, not connecting", state_name(p.state())),
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
                    if is_zombie(&p, now, self.timeout_ns) {
                        zombies.push(p);
                    }
                    return Err((
                        Errno::ECONNRESET,
                        format!("connection cid {cid} already exists"),
                    ));
                }
                present[cid] = true;
                drop(present);
                return Ok(p);
            }
        }
        if e.all.len() >= MAX_PATHS_NUM {
            return Err((
                Errno::ECONNRESET,
                format!("session already has {MAX_PATHS_NUM} paths"),
            ));
        }
        if let Some(dup) = e
            .paths
            .iter()
            .find(|p| p.peer.ip() == peer.ip() && p.local == local)
        {
            if is_zombie(dup, now, self.timeout_ns) {
                zombies.push(Arc::clone(dup));
            }
            return Err((
                Errno::EEXIST,
                format!("session already has a path from {} to {local}", peer.ip()),
            ));
        }
        let path = self
            .new_path(&e.sess, msg, (peer, local, hca), now)
            .map_err(|why| (Errno::ENOMEM, why))?;
        e.paths.push(Arc::clone(&path));
        e.all.push(Arc::clone(&path));
        Ok(path)
    }

    fn new_session(&self, paths_uuid: Uuid) -> Result<Arc<Session>, String> {
        let cfg = &self.sh.cfg;
        let (qd, cs) = (cfg.queue_depth, cfg.chunk_size);
        let layout = ImmLayout::new(qd, cs).map_err(|e| e.to_string())?;
        let access = if cfg.always_invalidate {
            Access::LOCAL_WRITE
        } else {
            Access::LOCAL_WRITE | Access::REMOTE_WRITE
        };
        let len = usize::from(qd) * cs as usize;
        let fabric = self
            .sh
            .fabric
            .domain()
            .map_err(|e| format!("protection domain: {e}"))?;
        let chunks = cfg.chunk_alloc.alloc(&*fabric, len, access).map_err(|e| {
            format!(
                "chunk pool of {qd} x {cs} bytes ({} memory): {e}",
                cfg.chunk_alloc.kind()
            )
        })?;
        let id = self.sh.next_id.fetch_add(1, Ordering::Relaxed);
        let home = self.sh.next_home.fetch_add(1, Ordering::Relaxed) % self.sh.ncores;
        Ok(Arc::new(Session {
            id: SessionId(id),
            paths_uuid,
            home,
            layout,
            fabric,
            chunks,
            owner: (0..qd).map(|_| AtomicU32::new(0)).collect(),
            done: (0..qd).map(|_| AtomicU64::new(0)).collect(),
            name: Mutex::new(String::new()),
        }))
    }

    fn new_path(
        &self,
        sess: &Arc<Session>,
        msg: &ConnReq,
        (peer, local, hca): (SocketAddr, SocketAddr, Option<&Hca>),
        now: u64,
    ) -> Result<Arc<Path>, String> {
        let fabric = &*sess.fabric;
        let qd = sess.queue_depth();
        let ai = self.sh.cfg.always_invalidate;
        // The chunk keys of a path live on its device (docs/ARCHITECTURE.md, "Several
        // RDMA devices").
        let device = hca.map_or(0, |h| h.index);
        let mrs = if ai {
            (0..qd)
                .map(|_| fabric.alloc_fast_mr_on(KeyScope::Domain, device))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("chunk keys: {e}"))?
        } else {
            Vec::new()
        };
        let io =
            |n, size| IuPool::new(fabric, n, size, Access::LOCAL_WRITE).map_err(|e| e.to_string());
        let rkey_ius = if ai {
            Some(io(usize::from(qd), RkeyRsp::LEN)?)
        } else {
            None
        };
        let mut present = vec![false; usize::from(msg.cid_num)];
        present[usize::from(msg.cid)] = true;
        Ok(Arc::new(Path {
            id: (self.sh.next_id.fetch_add(1, Ordering::Relaxed) as u32).max(1),
            sess: Arc::clone(sess),
            sess_uuid: msg.sess_uuid,
            cid_num: msg.cid_num,
            recon_cnt: msg.recon_cnt,
            peer,
            local,
            hca: hca.cloned(),
            state: AtomicU8::new(CONNECTING),
            present: Mutex::new(present),
            conn_ts: AtomicU64::new(now.max(1)),
            first_keys: mrs.iter().map(|m| next_rkey(m.rkey())).collect(),
            mrs,
            rkey_ius,
            info_req: io(1, InfoReq::LEN)?,
            info_rsp: io(1, InfoRsp::wire_len(qd))?,
            busy: (0..qd).map(|_| AtomicBool::new(false)).collect(),
            live_cons: AtomicU32::new(0),
            traffic: AtomicBool::new(false),
            name: Mutex::new(String::new()),
            counters: PathCounters::new(self.sh.ncores),
        }))
    }

    fn caps_for(&self, cid: u16) -> QpCaps {
        let fc = self.sh.fabric.caps();
        let qd = u32::from(self.sh.cfg.queue_depth);
        let ai = self.sh.cfg.always_invalidate;
        let (send, recv) = if cid == 0 {
            let base = 2 * SERVICE_CON_QUEUE_DEPTH + 2;
            (base + if ai { qd } else { 0 }, base)
        } else {
            (qd * if ai { 5 } else { 3 } + 1, qd + 1)
        };
        QpCaps {
            max_send_wr: send.min(fc.max_send_wr).max(8),
            max_recv_wr: recv.min(fc.max_recv_wr),
            max_send_sge: 1,
        }
    }

    fn accept(&mut self, cx: &mut dyn Ctx, req: ConnRequest, msg: &ConnReq, path: Arc<Path>) {
        let sh = Arc::clone(&self.sh);
        let cfg = &sh.cfg;
        let qd = cfg.queue_depth;
        let rsp = ConnRsp::accept(qd, cfg.max_io_size(), cfg.max_hdr, cfg.always_invalidate);
        let rsp = match rsp.to_bytes() {
            Ok(b) => b,
            Err(e) => {
                sh.close_path(cx, &path, format_args!("conn_rsp: {e}"));
                return self.refuse(cx, req, Errno::ECONNRESET, &e.to_string());
            }
        };
        // On the serving core's shared CQ when it has one, every path's connection of
        // every cid (docs/ARCHITECTURE.md, "Completion queues"); the core takes the
        // connection over when it arrives.
        let core = sh.core_of(msg.cid, path.sess.home);
        let caps = self.caps_for(msg.cid);
        let cq = sh.cqs[core].get();
        let accepted = req.accept_into(&*path.sess.fabric, cq, caps, &rsp);
        let conn = match accepted {
            Ok(c) => c,
            Err(e) => {
                sh.close_path(cx, &path, format_args!("accept of cid {}: {e}", msg.cid));
                return;
            }
        };
        let mut con = match cq {
            Some(_) => RtrsCon::on_shared_cq(msg.cid, conn, signal_interval(qd)),
            None => RtrsCon::new(msg.cid, conn, signal_interval(qd)),
        };
        let posted = if msg.cid == 0 {
            con.post_recv(&[path.info_req.recv_wr(0, WrId::InfoReq.encode())])
        } else {
            con.post_recv_empty(qd.into(), WrId::Recv.encode())
        };
        if let Err(e) = posted {
            sh.close_path(cx, &path, format_args!("posting receives: {e}"));
            con.disconnect();
            return;
        }
        path.live_cons.fetch_add(1, Ordering::AcqRel);
        con.release_thread();
        let sh2 = Arc::clone(&sh);
        let m = Msg::new(move |cx: &mut dyn Ctx| {
            sh2.inbox[cx.core()].push(PathWork::AddCon { path, con });
        });
        if let Err(e) = cx.send(core, m) {
            self.pending.push((core, e.into_msg()));
        }
    }

    fn reap(&self, cx: &mut dyn Ctx, now: u64) {
        let zombies: Vec<Arc<Path>> = {
            let t = lock(&self.sh.table);
            t.sessions
                .iter()
                .flat_map(|e| e.all.iter())
                .filter(|p| is_zombie(p, now, self.timeout_ns))
                .cloned()
                .collect()
        };
        for z in &zombies {
            self.sh.close_path(
                cx,
                z,
                format_args!(
                    "handshake not done within {:?} of its first connection request",
                    self.sh.cfg.admission.handshake_timeout
                ),
            );
        }
    }
}

impl Poller for Acceptor {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        if self.done {
            return PollResult::Idle;
        }
        let mut busy = PollResult::Idle;
        while let Some((core, m)) = self.pending.pop() {
            if let Err(e) = cx.send(core, m) {
                self.pending.push((core, e.into_msg()));
                break;
            }
            busy = PollResult::Busy;
        }
        if self.sh.stop.load(Ordering::Acquire) {
            if self.pending.is_empty() {
                self.listeners.clear();
                self.done = true;
                self.sh.pollers.fetch_sub(1, Ordering::AcqRel);
                if let Some(id) = cx.current() {
                    cx.unregister(id);
                }
            } else {
                // Connections still to hand over: keep a draining driver running us.
                busy = PollResult::Busy;
            }
            return busy;
        }
        let now = cx.now();
        if self.pacing.due(now) {
            let mut found = false;
            for i in 0..self.listeners.len() {
                while let Some(req) = self.listeners[i].poll() {
                    let local = self.listeners[i].local_addr();
                    self.on_request(cx, req, local);
                    found = true;
                }
            }
            self.pacing.polled(found);
            if found {
                busy = PollResult::Busy;
            }
        }
        if now.saturating_sub(self.last_reap) >= self.reap_every_ns {
            self.last_reap = now;
            self.reap(cx, now);
            self.sh.log.flush(now);
        }
        busy
    }

    fn shutdown(&mut self, _cx: &mut dyn Ctx) {
        self.sh.stop.store(true, Ordering::Release);
    }

    fn name(&self) -> &str {
        "rtrs-srv-accept"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Polls in `loops` loops of `tick` ns each, nothing arriving.
    fn polls(p: &mut ListenPacing, loops: u32, now: &mut u64, tick: u64) -> u32 {
        let mut n = 0;
        for _ in 0..loops {
            *now += tick;
            if p.due(*now) {
                p.polled(false);
                n += 1;
            }
        }
        n
    }

    #[test]
    fn idle_listeners_are_polled_ever_less_often_down_to_the_idle_rate() {
        let (mut p, mut now) = (ListenPacing::new(), 0);
        // The first loop polls; then gaps of 32, 64, ... 1024 loops.
        assert!(p.due(1));
        p.polled(false);
        now += 1;
        let gaps: Vec<u32> = (0..7)
            .map(|_| {
                let mut loops = 0;
                loop {
                    loops += 1;
                    now += 1;
                    if p.due(now) {
                        p.polled(false);
                        return loops;
                    }
                }
            })
            .collect();
        assert_eq!(gaps, [64, 128, 256, 512, 1024, 1024, 1024]);
        // A fast idle reactor (1 ns loops): 1,000,000 loops, about a thousand polls.
        let n = polls(&mut p, 1_000_000, &mut now, 1);
        assert!((976..=977).contains(&n), "{n} polls");
    }

    #[test]
    fn a_request_brings_the_next_loop_and_the_busy_rate_back() {
        let (mut p, mut now) = (ListenPacing::new(), 0);
        polls(&mut p, 100_000, &mut now, 1);
        assert_eq!(p.every, LISTEN_EVERY_IDLE);
        // A poll finds a request: the very next loop polls again.
        while !p.due(now) {
            now += 1;
        }
        p.polled(true);
        now += 1;
        assert!(p.due(now), "the loop after a found request polls");
        p.polled(false);
        // Back to short gaps: polled again within 2 × LISTEN_EVERY loops.
        let n = polls(&mut p, 2 * LISTEN_EVERY, &mut now, 1);
        assert!(n >= 1, "{n}");
    }

    #[test]
    fn a_slow_reactor_still_polls_every_period() {
        let (mut p, mut now) = (ListenPacing::new(), 0);
        polls(&mut p, 100_000, &mut now, 1);
        // Loops 100 µs apart: the period, not the loop count, decides (every 10th loop).
        let n = polls(&mut p, 1000, &mut now, 100_000);
        assert_eq!(n, 100);
    }
}
