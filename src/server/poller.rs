//! [`ServerCore`]: the server on one core, registered as that core's poller. It polls
//! every connection this core serves (CM events and completions), lets the handler
//! answer (its [`ServerHandler::poll`]) and sends the answers, retries queued responses
//! and waiting requests, and on the session's home core also runs heartbeats, INFO_REQ
//! and path finalisation. It corresponds to the kernel's `rtrs_srv_rdma_done` CQ handler
//! plus `rtrs_srv_close_work`, on one reactor.
//!
//! It owns the parts and hands them out: the connections ([`ConSlot`]), the requests
//! ([`Requests`], with the op table), the service connection's control work
//! ([`super::info`]); completions are told apart by their [`WrId`].

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{ConPostError, LinkEvent, RtrsCon};
use crate::engine::{Ctx, PollResult, Poller, PollerId};
use crate::fabric::{CmEvent, ConnState, Cq, Wc, WcOpcode, WcStatus};
use crate::proto::{Imm, HB_ACK_IMM};
use crate::sync::lock;

use super::conn::{close_path_of, ConSlot};
use super::handler::ServerHandler;
use super::info;
use super::io::{Env, Requests};
use super::session::{Path, Usage, CLOSED, CONNECTED};
use super::state::{PathWork, ServerState};
use super::wr::WrId;

/// Polls of a core between connection-manager checks of a healthy connection.
const CM_POLL_EVERY: u64 = 16;

/// Completions taken per poll of one connection.
const WC_BATCH: usize = 32;

/// Completions taken per call of the core's shared CQ (each call gives at most one
/// connection's).
const CQ_BATCH: usize = 64;

/// Calls of the core's shared CQ per loop, at most, per connection on it (a round is
/// one call per connection with completions, more for one with more than a batch).
const CQ_CALLS_PER_CON: usize = 16;

/// `": why"` when the fabric broke connection `con` because it refused the peer (a
/// remote access error with its key and range, an invalid frame, a forged ack), else
/// nothing: the peer's own disconnect needs no reason.
fn broke(con: &RtrsCon) -> String {
    con.conn()
        .failure()
        .map(|f| format!(": {f}"))
        .unwrap_or_default()
}

/// The server's poller on one core.
pub(crate) struct ServerCore {
    sh: Arc<ServerState>,
    core: usize,
    handler: Box<dyn ServerHandler>,
    cons: Vec<Option<ConSlot>>,
    /// The core's shared CQ, polled once per loop (none where the fabric has none: then
    /// each connection is polled on its own CQ).
    cq: Option<Cq>,
    cq_wcs: [Wc; CQ_BATCH],
    /// Per entry of `cq_wcs`: its connection's index in `cons` (`u32::MAX`: none).
    cq_at: [u32; CQ_BATCH],
    /// This loop's CQ poll ended its round: every connection on the CQ had its turn.
    cq_quiet: bool,
    requests: Requests,
    /// Home core: paths being torn down, finalised once drained.
    closing: Vec<Arc<Path>>,
    wcs: [Wc; WC_BATCH],
    done: bool,
    /// The reactor's time at the start of this poll (one clock read per loop).
    now: u64,
    /// Calls of `poll` so far (paces connection-manager checks).
    polls: u64,
    /// Home core: a path was finalised since the freed memory was last handed back
    /// ([`crate::process::release_free_memory`], at most every [`TRIM_EVERY_NS`]), and when.
    trim_due: bool,
    last_trim: u64,
    /// The driver was asked to wake this poller on the CQ's descriptor (once, at the first
    /// poll: a driver watches for the poller being run).
    wake_asked: bool,
    /// The core's [`Answers`] poller, where it has one: unregistered with this one.
    answers: Option<PollerId>,
    /// The handler's [`ServerHandler::backends_opened`] when the whole poll was last
    /// registered (with [`Answers`] only).
    opened_seen: u64,
}

/// How often freed memory is handed back to the system, at most, while paths close.
const TRIM_EVERY_NS: u64 = 1_000_000_000;

impl ServerCore {
    pub fn new(sh: Arc<ServerState>, core: usize, handler: Box<dyn ServerHandler>) -> ServerCore {
        let qd = usize::from(sh.cfg.queue_depth);
        let max_hdr = sh.cfg.max_hdr as usize;
        let cq = match sh.fabric.create_cq(sh.fabric.caps().core_cq_entries) {
            Ok(cq) => {
                let _ = sh.cqs[core].set(cq.share());
                Some(cq)
            }
            Err(e) => {
                tracing::debug!(core, "no shared completion queue: {e}");
                None
            }
        };
        ServerCore {
            sh,
            core,
            handler,
            cons: Vec::new(),
            cq,
            cq_wcs: [Wc::default(); CQ_BATCH],
            cq_at: [u32::MAX; CQ_BATCH],
            cq_quiet: false,
            requests: Requests::new(core, qd, max_hdr),
            closing: Vec::new(),
            wcs: [Wc::default(); WC_BATCH],
            done: false,
            now: 0,
            polls: 0,
            trim_due: false,
            last_trim: 0,
            wake_asked: false,
            answers: None,
            opened_seen: 0,
        }
    }

    /// The request path's view of this core, and the requests.
    fn split(&mut self) -> (&mut Requests, Env<'_>) {
        (
            &mut self.requests,
            Env {
                sh: &self.sh,
                cons: &mut self.cons,
                handler: &mut *self.handler,
                now: self.now,
            },
        )
    }

    /// Closes the path of connection `i` with a reason.
    fn close_con_path(&self, cx: &mut dyn Ctx, i: usize, why: std::fmt::Arguments<'_>) {
        close_path_of(&self.sh, cx, &self.cons, i, why);
    }

    /// Closes the path of connection `i`, whose repost of `reposts` receives failed with
    /// `e`. The usual case: the peer went away right after these requests (a client
    /// closing or dying resets its sockets); say so, not "post refused".
    fn close_after_repost(&self, cx: &mut dyn Ctx, i: usize, reposts: u32, e: ConPostError) {
        match self.cons.get(i).and_then(Option::as_ref) {
            Some(slot) if slot.con.state() == ConnState::Disconnected => {
                let (cid, why) = (slot.con.cid(), broke(&slot.con));
                self.close_con_path(
                    cx,
                    i,
                    format_args!("connection cid {cid}: Disconnected{why}"),
                );
            }
            _ => self.close_con_path(cx, i, format_args!("reposting {reposts} receives: {e}")),
        }
    }

    fn on_work(&mut self, cx: &mut dyn Ctx, work: PathWork) {
        match work {
            PathWork::AddCon { path, mut con } => {
                if path.state() > CONNECTED || self.sh.stop.load(Ordering::Acquire) {
                    con.disconnect();
                    path.live_cons.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
                if con.on_shared() {
                    // Made and released by the acceptor (which may be this very thread):
                    // the CQ reports nothing of it until this core takes it, here,
                    // before its next poll of the CQ.
                    con.adopt();
                }
                let slot = ConSlot::new(path, con);
                match self.cons.iter().position(Option::is_none) {
                    Some(i) => self.cons[i] = Some(slot),
                    None => self.cons.push(Some(slot)),
                }
            }
            PathWork::Finalize(path) => {
                if !self.closing.iter().any(|p| Arc::ptr_eq(p, &path)) {
                    self.closing.push(path);
                }
            }
            PathWork::Close(path) => {
                self.sh
                    .close_path(cx, &path, format_args!("disconnect requested"));
            }
        }
    }

    /// Polls the core's shared CQ, once per loop, and handles each completion for its
    /// connection as [`ServerCore::poll_con`] does for a connection with its own CQ.
    ///
    /// A software CQ's call hands out one connection's completions, placed by driving
    /// that connection alone, and drives no other connection before the next call; the
    /// calls until one returns nothing are a round, one turn per connection
    /// (docs/ARCHITECTURE.md, "Completion queues"). Each batch is handled before the
    /// next call, so the request a completion announces is read before another
    /// connection, maybe another path's carrying a copy into the same chunk, is read
    /// ("Failover without double execution hazards"). One round per loop, within a
    /// bound of calls; `cq_quiet` says whether the round ended.
    fn poll_cq(&mut self, cx: &mut dyn Ctx) -> bool {
        let Some(mut cq) = self.cq.take() else {
            return false;
        };
        let shared = self.cons.iter().flatten().filter(|s| s.con.on_shared());
        let cap = CQ_CALLS_PER_CON * (shared.count() + 1);
        let (mut calls, mut any) = (0, false);
        self.cq_quiet = false;
        loop {
            let n = cq.poll(&mut self.cq_wcs);
            if n == 0 {
                self.cq_quiet = true;
                break;
            }
            self.on_cq_batch(cx, n);
            any = true;
            calls += 1;
            if calls >= cap {
                break;
            }
        }
        self.cq = Some(cq);
        any
    }

    /// Handles `cq_wcs[..n]`: each completion's connection accounts it; every consumed
    /// receive is reposted before the completions are handled, in one call per
    /// connection (as `poll_con`).
    fn on_cq_batch(&mut self, cx: &mut dyn Ctx, n: usize) {
        const NONE: u32 = u32::MAX;
        let mut last = NONE;
        let mut reposting = false;
        for k in 0..n {
            let wc = &self.cq_wcs[k];
            let hit = |i: u32, cons: &[Option<ConSlot>]| {
                cons.get(i as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|s| s.con.on_shared() && s.con.qp_num() == wc.qp_num)
            };
            let i = if hit(last, &self.cons) {
                last
            } else {
                match (0..self.cons.len() as u32).find(|&i| hit(i, &self.cons)) {
                    Some(i) => i,
                    None => {
                        // A connection of this CQ reports only once this core took it
                        // (the acceptor releases it before the hand-over, see
                        // `on_work`), and is dropped only after a quiet poll
                        // (`after_wcs`): a completion of no connection here belongs to
                        // one refused at hand-over (or, on verbs, to a queue pair
                        // already destroyed). Its work died with it; holding it could
                        // hand it to a later connection given the same qp_num.
                        tracing::debug!(
                            core = self.core,
                            qp_num = wc.qp_num,
                            "completion of a connection gone from this core"
                        );
                        self.cq_at[k] = NONE;
                        continue;
                    }
                }
            };
            last = i;
            self.cq_at[k] = i;
            if let Some(slot) = self.cons[i as usize].as_mut() {
                slot.con.account(wc);
                slot.got += 1;
                if !wc.status.is_ok() {
                    slot.cm_due = true;
                } else if wc.opcode == WcOpcode::RecvRdmaWithImm {
                    slot.reposts += 1;
                    reposting = true;
                }
            }
        }
        // Every consumed receive is reposted before any completion is handled, in one
        // call per connection.
        let mut failed = false;
        for k in 0..n {
            if !reposting {
                break;
            }
            let i = self.cq_at[k] as usize;
            let Some(slot) = self.cons.get_mut(i).and_then(Option::as_mut) else {
                continue;
            };
            let reposts = std::mem::take(&mut slot.reposts);
            if reposts == 0 {
                continue;
            }
            if let Err(e) = slot.con.post_recv_empty(reposts, WrId::Recv.encode()) {
                // Its completions are left unhandled, as poll_con leaves them.
                slot.repost_failed = true;
                failed = true;
                self.close_after_repost(cx, i, reposts, e);
            }
        }
        for k in 0..n {
            let i = self.cq_at[k] as usize;
            match self.cons.get(i).and_then(Option::as_ref) {
                Some(slot) if !slot.repost_failed => {}
                _ => continue,
            }
            let wc = self.cq_wcs[k];
            self.on_wc(cx, i, wc);
        }
        if failed {
            for slot in self.cons.iter_mut().flatten() {
                slot.repost_failed = false;
            }
        }
    }

    /// Polls connection `i`; true if anything happened.
    fn poll_con(&mut self, cx: &mut dyn Ctx, i: usize) -> bool {
        let mut busy = false;
        let Some(slot) = self.cons[i].as_mut() else {
            return false;
        };
        if !slot.closing && slot.path.state() > CONNECTED {
            slot.con.disconnect();
            slot.closing = true;
            slot.hb = None;
            busy = true;
        }
        // The connection manager is asked every CM_POLL_EVERY polls, and at once while
        // closing or after a failed completion (a break shows in the CQ first: the
        // posted receives flush); on the software fabrics each ask is a progress pass.
        let cm_due = slot.closing || slot.cm_due || self.polls % CM_POLL_EVERY == 0;
        slot.cm_due = false;
        while let Some(ev) = cm_due.then(|| slot.con.poll_cm()).flatten() {
            busy = true;
            if let CmEvent::Disconnected | CmEvent::Error { .. } | CmEvent::Rejected { .. } = ev {
                let (cid, why) = (slot.con.cid(), broke(&slot.con));
                slot.close_path(
                    &self.sh,
                    cx,
                    format_args!("connection cid {cid}: {ev:?}{why}"),
                );
                break;
            }
        }
        let Some(slot) = self.cons[i].as_mut() else {
            return busy;
        };
        if slot.con.on_shared() {
            // Its completions were handled by this loop's poll_cq.
            let got = std::mem::take(&mut slot.got) as usize;
            busy |= got > 0;
            self.after_wcs(cx, i, got, busy)
        } else {
            self.poll_own_cq(cx, i, busy)
        }
    }

    /// Polls the own CQ of connection `i` and handles its completions.
    fn poll_own_cq(&mut self, cx: &mut dyn Ctx, i: usize, mut busy: bool) -> bool {
        let Some(slot) = self.cons[i].as_mut() else {
            return busy;
        };
        let n = slot.con.poll(&mut self.wcs);
        // Every consumed receive (a request's WRITE_WITH_IMM) is reposted before the
        // batch is handled, as the kernel does per completion, but in one call; a failed
        // completion has the connection manager asked (one pass over the batch).
        let mut failed = false;
        let mut reposts = 0u32;
        for w in &self.wcs[..n] {
            if !w.status.is_ok() {
                failed = true;
            } else if w.opcode == WcOpcode::RecvRdmaWithImm {
                reposts += 1;
            }
        }
        slot.cm_due = failed;
        if reposts > 0 {
            if let Err(e) = slot.con.post_recv_empty(reposts, WrId::Recv.encode()) {
                self.close_after_repost(cx, i, reposts, e);
                return true;
            }
        }
        for k in 0..n {
            let wc = self.wcs[k];
            self.on_wc(cx, i, wc);
        }
        busy |= n > 0;
        self.after_wcs(cx, i, n, busy)
    }

    /// The rest of a poll of connection `i`, after its `n` completions of this loop were
    /// handled: closing, waiting responses and invalidations, heartbeat, INFO_RSP.
    fn after_wcs(&mut self, cx: &mut dyn Ctx, i: usize, n: usize, mut busy: bool) -> bool {
        let Some(slot) = self.cons[i].as_mut() else {
            return busy;
        };
        if slot.closing {
            if n == 0 && slot.con.state() == ConnState::Disconnected {
                // On a shared CQ, drained only once a CQ poll after the break found
                // nothing more (docs/ARCHITECTURE.md, "Completion queues"): two loops
                // whose CQ round, its turn included, ended with nothing of it.
                if !slot.con.on_shared() || (self.cq_quiet && slot.quiet_once) {
                    self.drop_con(i);
                } else if self.cq_quiet {
                    slot.quiet_once = true;
                }
                busy = true;
            }
            return busy;
        }
        let now = self.now;
        let (requests, mut env) = self.split();
        busy |= requests.retry_responses(cx, &mut env, i);
        busy |= requests.retry_invs(cx, &mut env, i);
        if let Some(slot) = self.cons[i].as_mut() {
            busy |= info::heartbeat(cx, &self.sh, slot, now);
        }
        if let Some(slot) = self.cons[i].as_mut() {
            busy |= info::post_info_rsp(cx, &self.sh, slot);
        }
        busy
    }

    fn on_wc(&mut self, cx: &mut dyn Ctx, i: usize, wc: Wc) {
        let wr = WrId::decode(wc.wr_id);
        if let WrId::Inv { op, gen24 } = wr {
            let (requests, mut env) = self.split();
            return requests.on_inv_done(cx, &mut env, i, op, gen24, wc.status);
        }
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
            || matches!(wr, WrId::Recv | WrId::InfoReq);
        if !wc.status.is_ok() {
            if wc.status != WcStatus::WrFlush {
                self.close_con_path(
                    cx,
                    i,
                    format_args!(
                        "completion error {:?} (wr kind {})",
                        wc.status,
                        WrId::kind(wc.wr_id)
                    ),
                );
            }
            return;
        }
        if !recv {
            return;
        }
        let Some(slot) = self.cons[i].as_mut() else {
            return;
        };
        // Only when not set yet: the home core clears it once per heartbeat interval.
        if !slot.path.traffic.load(Ordering::Relaxed) {
            slot.path.traffic.store(true, Ordering::Release);
        }
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                // Already reposted, with the rest of its batch (`poll_con`).
                let Some(imm) = wc.imm else {
                    return self.close_con_path(cx, i, format_args!("write-with-imm without imm"));
                };
                self.on_imm(cx, i, imm);
            }
            _ if wr == WrId::InfoReq => {
                info::on_info_req(cx, &self.sh, slot, wc.byte_len, &mut *self.handler)
            }
            _ => self.close_con_path(
                cx,
                i,
                format_args!("unexpected SEND of {} bytes from the client", wc.byte_len),
            ),
        }
    }

    fn on_imm(&mut self, cx: &mut dyn Ctx, i: usize, imm: u32) {
        let cid = self.cons[i].as_ref().map_or(0, |s| s.con.cid());
        match Imm::decode(imm) {
            Err(e) => self.close_con_path(cx, i, format_args!("{e}")),
            Ok(Imm::IoReq { payload }) => {
                let (requests, mut env) = self.split();
                requests.on_io_req(cx, &mut env, i, payload);
            }
            Ok(Imm::HbMsg) if cid == 0 => {
                let Some(slot) = self.cons[i].as_mut() else {
                    return;
                };
                // Out of send slots the ack is skipped: traffic is flowing anyway.
                match slot.con.post_imm_empty(WrId::Hb.encode(), HB_ACK_IMM) {
                    Err(e) if !e.is_budget() => {
                        self.close_con_path(cx, i, format_args!("sending HB_ACK: {e}"))
                    }
                    _ => {}
                }
            }
            Ok(Imm::HbAck) if cid == 0 => {}
            Ok(Imm::HbMsg | Imm::HbAck) => {
                self.close_con_path(cx, i, format_args!("heartbeat imm on cid {cid}, not 0"))
            }
            Ok(Imm::IoRsp(_)) => {
                self.close_con_path(cx, i, format_args!("client sent a response imm {imm:#x}"))
            }
        }
    }

    /// Drops connection `i` (drained after disconnect) and every request waiting on it.
    fn drop_con(&mut self, i: usize) {
        let Some(slot) = self.cons[i].take() else {
            return;
        };
        let path = Arc::clone(&slot.path);
        self.requests.drop_con(slot, i);
        path.live_cons.fetch_sub(1, Ordering::AcqRel);
    }

    /// Writes what was posted on every connection since its last push.
    fn push_all(&mut self) {
        for slot in self.cons.iter_mut().flatten() {
            slot.con.push();
        }
    }

    /// Home core: finalises drained paths (link event, removal, session release).
    fn finalize(&mut self, cx: &mut dyn Ctx) -> bool {
        let mut busy = false;
        let mut k = 0;
        while k < self.closing.len() {
            let p = &self.closing[k];
            if p.live_cons.load(Ordering::Acquire) != 0 || p.ops_held() != 0 {
                k += 1;
                continue;
            }
            let p = self.closing.swap_remove(k);
            busy = true;
            let was_up = p.conn_ts.load(Ordering::Acquire) == 0;
            p.state.store(CLOSED, Ordering::Release);
            let mut last_up = false;
            {
                let mut t = lock(&self.sh.table);
                if let Some(pos) = t.sessions.iter().position(|e| e.sess.id == p.sess.id) {
                    let e = &mut t.sessions[pos];
                    e.paths.retain(|q| !Arc::ptr_eq(q, &p));
                    e.all.retain(|q| !Arc::ptr_eq(q, &p));
                    lock(&e.sess.peers).retain(|&(id, _)| id != p.id);
                    if was_up && e.up > 0 {
                        e.up -= 1;
                        last_up = e.up == 0;
                    }
                    if last_up {
                        // The layer above ends its session now; a later path up asks anew.
                        e.usage = Usage::Unknown;
                        e.idle_since = None;
                    }
                    if e.all.is_empty() {
                        t.sessions.remove(pos);
                    }
                }
            }
            self.trim_due = true;
            if last_up {
                let name = p.sess.name();
                self.handler
                    .link_event(cx, p.sess.id, &name, LinkEvent::Disconnected);
            }
        }
        busy
    }

    fn stop_all(&mut self, cx: &mut dyn Ctx) {
        for s in self.cons.iter().flatten() {
            s.close_path(&self.sh, cx, format_args!("server stopping"));
        }
    }
}

/// A core's [`ServerCore`] reached by its two pollers where the driver runs pollers
/// newest first (docs/ARCHITECTURE.md, "Answers in the loop that completed them"): empty
/// until the core is made. Both run on the core's thread, one at a time, and never
/// inside one another, so the borrow always succeeds.
type SharedCore = Rc<RefCell<Option<ServerCore>>>;

/// Registers the server of the calling core, its handler made by `handler`. Where the
/// driver runs pollers newest first ([`Ctx::runs_newest_first`]: SPDK), the core gets
/// two: [`Answers`], registered before the handler opens its backends (whose SPDK bdev
/// channels complete IO in pollers of their own, registered then), so that it runs after
/// them in each loop and sends what they completed in that loop; and the whole poll,
/// registered after them, so that it runs before them and they see the requests it
/// submitted in the same loop. Elsewhere the one poller does both.
pub(crate) fn register_core(
    cx: &mut dyn Ctx,
    sh: Arc<ServerState>,
    handler: impl FnOnce(&mut dyn Ctx) -> Box<dyn ServerHandler>,
) {
    let core = cx.core();
    if !cx.runs_newest_first() {
        let mut h = handler(cx);
        h.start(cx);
        cx.register(Box::new(ServerCore::new(sh, core, h)));
        return;
    }
    let shared: SharedCore = Rc::new(RefCell::new(None));
    let answers = cx.register(Box::new(Answers(Rc::clone(&shared))));
    let mut h = handler(cx);
    h.start(cx);
    let mut server = ServerCore::new(sh, core, h);
    server.answers = Some(answers);
    server.opened_seen = server.handler.backends_opened();
    *shared.borrow_mut() = Some(server);
    cx.register(Box::new(Whole(shared)));
}

impl ServerCore {
    /// Sends what the handler finished since the last call, and pushes it out; whether
    /// there was any.
    fn answer_now(&mut self, cx: &mut dyn Ctx) -> bool {
        let (requests, mut env) = self.split();
        let any = requests.poll_handler(cx, &mut env);
        if any {
            self.push_all();
        }
        any
    }
}

/// `f` on the core's server; `idle` before it is made (or were it ever borrowed).
fn with_core<R>(core: &SharedCore, f: impl FnOnce(&mut ServerCore) -> R, idle: R) -> R {
    match core.try_borrow_mut().as_deref_mut() {
        Ok(Some(server)) => f(server),
        _ => idle,
    }
}

/// The core's answers, run after the pollers its handler's backends registered
/// ([`register_core`]).
struct Answers(SharedCore);

impl Poller for Answers {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let answered = with_core(
            &self.0,
            |s| {
                s.now = cx.now();
                !s.done && s.answer_now(cx)
            },
            false,
        );
        if answered {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    fn name(&self) -> &str {
        "rtrs-srv-answers"
    }
}

/// The core's whole poll where it shares the core with [`Answers`] ([`register_core`]).
struct Whole(SharedCore);

impl Whole {
    fn with<R>(&self, f: impl FnOnce(&mut ServerCore) -> R, idle: R) -> R {
        with_core(&self.0, f, idle)
    }
}

impl Poller for Whole {
    /// The core's poll; then, when the handler opened a backend since this poller was
    /// registered (its pollers now run first), registers the whole poll again, newest.
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let (r, moved) = self.with(
            |s| {
                let r = s.poll(cx);
                let n = s.handler.backends_opened();
                let moved = !s.done && n != s.opened_seen;
                s.opened_seen = n;
                (r, moved)
            },
            (PollResult::Idle, false),
        );
        if moved {
            if let Some(id) = cx.current() {
                cx.unregister(id);
            }
            cx.register(Box::new(Whole(Rc::clone(&self.0))));
        }
        r
    }

    fn shutdown(&mut self, cx: &mut dyn Ctx) {
        self.with(|s| s.shutdown(cx), ());
    }

    fn name(&self) -> &str {
        "rtrs-srv-core"
    }

    fn may_sleep(&self) -> bool {
        self.with(|s| s.may_sleep(), true)
    }

    fn before_sleep(&mut self) -> bool {
        self.with(|s| s.before_sleep(), true)
    }
}

impl Poller for ServerCore {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        if self.done {
            return PollResult::Idle;
        }
        let mut busy = false;
        self.now = cx.now();
        self.polls = self.polls.wrapping_add(1);
        if !self.wake_asked {
            self.wake_asked = true;
            if let Some(fd) = self.cq.as_ref().and_then(Cq::wait_fd) {
                cx.wake_on_readable(fd);
            }
        }
        while let Some(work) = self.sh.inbox[self.core].pop() {
            self.on_work(cx, work);
            busy = true;
        }
        let stopping = self.sh.stop.load(Ordering::Acquire);
        if stopping {
            self.stop_all(cx);
        }
        // Answers first: what the backend finished since the last loop is posted and
        // pushed before this loop reads its sockets, so that a read finding nothing (the
        // stale readiness of data an early read took) is not on a response's way
        // (docs/ARCHITECTURE.md, "Posting and pushing").
        busy |= self.answer_now(cx);
        busy |= self.poll_cq(cx);
        for i in 0..self.cons.len() {
            busy |= self.poll_con(cx, i);
        }
        {
            let (requests, mut env) = self.split();
            busy |= requests.poll_handler(cx, &mut env);
            busy |= requests.run_waiting(cx, &mut env);
        }
        busy |= self.finalize(cx);
        if self.trim_due && self.now.saturating_sub(self.last_trim) >= TRIM_EVERY_NS {
            // What the closed paths' connections and the sessions gone freed (their
            // queues, buffers, chunk pools) goes back to the system, not kept at the peak.
            self.trim_due = false;
            self.last_trim = self.now;
            crate::process::release_free_memory();
        }
        // What this loop posted (responses, RKEY_RSPs, acks) goes out now, not at the
        // next loop's poll of the CQ (docs/ARCHITECTURE.md, "Posting and pushing").
        self.push_all();
        if stopping {
            if self.cons.iter().all(Option::is_none)
                && self.requests.is_idle()
                && self.closing.is_empty()
            {
                self.done = true;
                self.sh.pollers.fetch_sub(1, Ordering::AcqRel);
                if let Some(id) = cx.current() {
                    cx.unregister(id);
                }
                if let Some(id) = self.answers.take() {
                    cx.unregister(id);
                }
            } else {
                // Still closing paths or waiting for in-flight requests: report work, so
                // a driver draining before shutdown (the engine's idle-loop count) keeps
                // running us until we are done.
                busy = true;
            }
        }
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    fn shutdown(&mut self, _cx: &mut dyn Ctx) {
        self.sh.stop.store(true, Ordering::Release);
    }

    fn name(&self) -> &str {
        "rtrs-srv-core"
    }

    /// Not while requests are at the backend (their completions wake nothing) or paths
    /// wait to be finalised.
    fn may_sleep(&self) -> bool {
        self.requests.is_idle() && self.closing.is_empty()
    }

    /// Arms the shared CQ's descriptor (verbs' completion channels).
    fn before_sleep(&mut self) -> bool {
        self.cq.as_mut().map_or(true, Cq::arm)
    }
}
