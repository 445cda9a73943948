//! Listeners and CONNECT_REQUEST handling: the kernel's `rtrs_srv_rdma_cm_handler` /
//! `rtrs_rdma_connect` (docs/PROTOCOL.md §3.3, §6.4, §6.5, §9.1), as one poller on the core
//! that started the server.
//!
//! A request is decoded and checked by [`ConnReq::decode`], then given its session and
//! path, or refused, by [`super::admit`] (caps, evictions, join checks). Refusals carry
//! a conn_rsp with the kernel's errno and are logged (rate-limited) with the reason.
//! Beyond the kernel: a connection request for cid 0 whose `recon_cnt` differs from the
//! stored path's is a reconnect, so the stale path is closed and replaced at once (the
//! kernel refuses until its heartbeat kills the old path). A path whose handshake is not
//! done within `admission.handshake_timeout` of its first connection request is closed,
//! by a periodic check as well as on collision (the kernel waits 30 s, and only on
//! collision); the same check closes sessions not in use for `open_grace`
//! (docs/ARCHITECTURE.md, "Session slots"). An accepted connection gets its receives
//! posted (the INFO_REQ buffer on cid 0, `queue_depth` empty receives on IO cids) and is
//! moved to its core in a [`Msg`].

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::RtrsCon;
use crate::engine::{Ctx, Msg, PollResult, Poller};
use crate::fabric::{ConnRequest, Listener, QpCaps};
use crate::proto::constants::SERVICE_CON_QUEUE_DEPTH;
use crate::proto::{signal_interval, ConnReq, ConnRsp};
use crate::ratelimit::log_limited;
use crate::sync::lock;

use super::admit::{self, is_zombie};
use super::session::Path;
use super::state::{PathWork, ServerState};
use super::wr::WrId;
use crate::Errno;

/// How often half-open paths and idle sessions are looked for, at most (a quarter of the
/// handshake timeout or of the grace when that is shorter).
const REAP_EVERY_NS: u64 = 1_000_000_000;

/// The listeners' poller.
pub(crate) struct Acceptor {
    sh: Arc<ServerState>,
    listeners: Vec<Box<dyn Listener>>,
    /// Connections whose move to their core met a full mailbox.
    pending: Vec<(usize, Msg)>,
    last_reap: u64,
    /// The handshake deadline, the grace of sessions not in use, the reaping period, in ns.
    timeout_ns: u64,
    grace_ns: u64,
    reap_every_ns: u64,
    /// When the listeners are polled next.
    pacing: ListenPacing,
    done: bool,
    /// The driver was asked to wake this poller on the listeners' descriptors (at the
    /// first poll: a driver watches for the poller being run).
    wake_asked: bool,
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

impl Acceptor {
    pub fn new(sh: Arc<ServerState>, listeners: Vec<Box<dyn Listener>>) -> Acceptor {
        let timeout_ns = sh.cfg.admission.handshake_timeout_ns();
        let grace_ns = u64::try_from(sh.cfg.open_grace.as_nanos()).unwrap_or(u64::MAX);
        Acceptor {
            sh,
            listeners,
            pending: Vec::new(),
            last_reap: 0,
            timeout_ns,
            grace_ns,
            reap_every_ns: (timeout_ns.min(grace_ns) / 4).clamp(1_000_000, REAP_EVERY_NS),
            pacing: ListenPacing::new(),
            done: false,
            wake_asked: false,
        }
    }

    fn refuse(&self, cx: &mut dyn Ctx, req: ConnRequest, errno: Errno, why: &str) {
        log_limited!(
            self.sh.log,
            cx.now(),
            WARN,
            "rtrs-srv: refusing connection from {}: {why} ({errno:?}, errno {})",
            req.peer,
            errno.neg()
        );
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
        // Each step of a path's bring-up is logged at debug level (operators and the VM's
        // bring-up rows follow a path by them).
        tracing::debug!(peer = %req.peer, cid = msg.cid, cid_num = msg.cid_num, "connection request");
        let r = admit::Request {
            msg: &msg,
            peer: req.peer,
            local,
            hca: hca.as_ref(),
            authenticated: req.authenticated(),
            now: cx.now(),
        };
        let out = admit::admit(&self.sh, self.timeout_ns, &r);
        for z in &out.zombies {
            self.sh
                .close_path(cx, z, format_args!("stale or half-open path replaced"));
        }
        for (paths, why) in &out.evicted {
            for z in paths {
                self.sh.close_path(cx, z, format_args!("{why}"));
            }
        }
        match out.path {
            Ok(path) => self.accept(cx, req, &msg, path),
            Err((errno, why)) => self.refuse(cx, req, errno, &why),
        }
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

    /// Closes half-open paths and the sessions whose grace ran out (not in use for
    /// `open_grace`).
    fn reap(&self, cx: &mut dyn Ctx, now: u64) {
        let (zombies, idle): (Vec<Arc<Path>>, Vec<Arc<Path>>) = {
            let mut t = lock(&self.sh.table);
            let zombies = t
                .sessions
                .iter()
                .flat_map(|e| e.all.iter())
                .filter(|p| is_zombie(p, now, self.timeout_ns))
                .cloned()
                .collect();
            (zombies, t.idle_overdue(now, self.grace_ns))
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
        for p in &idle {
            self.sh.close_path(
                cx,
                p,
                format_args!(
                    "the session was not in use (no device open) for {:?} (open_grace)",
                    self.sh.cfg.open_grace
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
        if !self.wake_asked {
            self.wake_asked = true;
            for l in &self.listeners {
                if let Some(fd) = l.wait_fd() {
                    cx.wake_on_readable(fd);
                }
            }
        }
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
            self.sh.info_log.flush(now);
        }
        busy
    }

    fn shutdown(&mut self, _cx: &mut dyn Ctx) {
        self.sh.stop.store(true, Ordering::Release);
    }

    fn name(&self) -> &str {
        "rtrs-srv-accept"
    }

    /// Not while connections wait for room in their core's mailbox.
    fn may_sleep(&self) -> bool {
        self.pending.is_empty()
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
