//! The per-core server poller: polls every connection this core serves (CM events and
//! completions), runs the handler's answers, retries queued responses and waiting
//! requests, and on the session's home core also runs heartbeats, INFO_REQ and path
//! finalisation. It corresponds to the kernel's `rtrs_srv_rdma_done` CQ handler plus
//! `rtrs_srv_close_work`, on one reactor.
//!
//! Work request ids carry a kind in the top byte ([`WR_RECV`] ...) and, for a request's
//! LOCAL_INV, the request's slot.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{Con, Heartbeat};
use crate::engine::{Ctx, PollResult, Poller};
use crate::fabric::{CmEvent, ConnState, Wc, WcOpcode, WcStatus};
use crate::proto::{Imm, HB_ACK_IMM};

use super::handler::{Responses, ServerHandler};
use super::io::Op;
use super::session::{lock, Path, CLOSED, CONNECTED};
use super::shared::{CoreCmd, Shared};
use crate::common::LinkEvent;

/// Polls of a core between connection-manager checks of a healthy connection.
const CM_POLL_EVERY: u64 = 16;
pub(crate) const WR_RECV: u64 = 1 << 56;
pub(crate) const WR_INFO_REQ: u64 = 2 << 56;
pub(crate) const WR_INV: u64 = 3 << 56;
pub(crate) const WR_INFO_RSP: u64 = 4 << 56;
pub(crate) const WR_RSP: u64 = 5 << 56;
pub(crate) const WR_HB: u64 = 6 << 56;
const KIND_MASK: u64 = 0xff << 56;

/// Completions taken per poll of one connection.
const WC_BATCH: usize = 32;

/// INFO_RSP progress on a cid 0 connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InfoState {
    /// Not asked yet (or not cid 0).
    Idle,
    /// Posting the REG_MR chain: next chunk to bind, then the SEND of `len` bytes.
    Posting {
        next: usize,
        len: usize,
    },
    Done,
}

/// One connection served here.
pub(crate) struct ConSlot {
    pub path: Arc<Path>,
    pub con: Con,
    /// Disconnect issued; dropped once drained.
    pub closing: bool,
    /// Requests whose response waits for send slots.
    pub rsp_wait: VecDeque<u32>,
    /// Requests whose LOCAL_INV waits for send slots.
    pub inv_wait: VecDeque<u32>,
    /// cid 0 once connected: heartbeat and its next tick.
    pub hb: Option<(Heartbeat, u64)>,
    pub info: InfoState,
    /// Ask the connection manager at the next poll (see `poll_con`).
    pub cm_due: bool,
}

pub(crate) struct CorePoller {
    pub sh: Arc<Shared>,
    pub core: usize,
    pub handler: Box<dyn ServerHandler>,
    pub cons: Vec<Option<ConSlot>>,
    pub ops: Vec<Op>,
    pub free_ops: Vec<u32>,
    /// Requests waiting for their chunk to be released by another path.
    pub waiting: VecDeque<u32>,
    /// The handler's answers, sent after each call into it.
    pub responses: Responses,
    /// Copy of the current request's user header.
    pub usr: Vec<u8>,
    /// Home core: paths being torn down, finalised once drained.
    pub closing: Vec<Arc<Path>>,
    wcs: [Wc; WC_BATCH],
    done: bool,
    /// The reactor's time at the start of this poll (one clock read per loop).
    pub now: u64,
    /// Calls of `poll` so far (paces connection-manager checks).
    polls: u64,
}

impl CorePoller {
    pub fn new(sh: Arc<Shared>, core: usize, handler: Box<dyn ServerHandler>) -> CorePoller {
        let qd = usize::from(sh.cfg.queue_depth);
        let max_hdr = sh.cfg.max_hdr as usize;
        CorePoller {
            sh,
            core,
            handler,
            cons: Vec::new(),
            ops: Vec::with_capacity(qd),
            free_ops: Vec::with_capacity(qd),
            waiting: VecDeque::with_capacity(qd),
            responses: Responses::with_capacity(qd),
            usr: vec![0; max_hdr],
            closing: Vec::new(),
            wcs: [Wc::default(); WC_BATCH],
            done: false,
            now: 0,
            polls: 0,
        }
    }

    /// Closes the path of connection `i` with a reason.
    pub fn close_con_path(&self, cx: &mut dyn Ctx, i: usize, why: std::fmt::Arguments<'_>) {
        if let Some(s) = &self.cons[i] {
            let p = Arc::clone(&s.path);
            self.sh.close_path(cx, &p, why);
        }
    }

    fn on_cmd(&mut self, cx: &mut dyn Ctx, cmd: CoreCmd) {
        match cmd {
            CoreCmd::AddCon { path, mut con } => {
                if path.state() > CONNECTED || self.sh.stop.load(Ordering::Acquire) {
                    con.disconnect();
                    path.live_cons.fetch_sub(1, Ordering::AcqRel);
                    return;
                }
                let slot = ConSlot {
                    path,
                    con,
                    closing: false,
                    rsp_wait: VecDeque::new(),
                    inv_wait: VecDeque::new(),
                    hb: None,
                    info: InfoState::Idle,
                    cm_due: true,
                };
                match self.cons.iter().position(Option::is_none) {
                    Some(i) => self.cons[i] = Some(slot),
                    None => self.cons.push(Some(slot)),
                }
            }
            CoreCmd::Finalize(path) => {
                if !self.closing.iter().any(|p| Arc::ptr_eq(p, &path)) {
                    self.closing.push(path);
                }
            }
            CoreCmd::Close(path) => {
                self.sh
                    .close_path(cx, &path, format_args!("disconnect requested"));
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
                let p = Arc::clone(&slot.path);
                let cid = slot.con.cid();
                self.sh
                    .close_path(cx, &p, format_args!("connection cid {cid}: {ev:?}"));
                break;
            }
        }
        let Some(slot) = self.cons[i].as_mut() else {
            return busy;
        };
        let n = slot.con.poll(&mut self.wcs);
        slot.cm_due = self.wcs[..n].iter().any(|w| !w.status.is_ok());
        // Every consumed receive (a request's WRITE_WITH_IMM) is reposted before the
        // batch is handled, as the kernel does per completion, but in one call.
        let reposts = self.wcs[..n]
            .iter()
            .filter(|w| w.status.is_ok() && w.opcode == WcOpcode::RecvRdmaWithImm)
            .count() as u32;
        if reposts > 0 {
            if let Err(e) = slot.con.post_recv_empty(reposts, WR_RECV) {
                // The usual case: the peer went away right after these requests (a
                // client closing or dying resets its sockets); say so, not "post refused".
                if slot.con.state() == ConnState::Disconnected {
                    let cid = slot.con.cid();
                    self.close_con_path(cx, i, format_args!("connection cid {cid}: Disconnected"));
                } else {
                    self.close_con_path(cx, i, format_args!("reposting {reposts} receives: {e}"));
                }
                return true;
            }
        }
        for k in 0..n {
            let wc = self.wcs[k];
            self.on_wc(cx, i, wc);
        }
        busy |= n > 0;
        let Some(slot) = self.cons[i].as_mut() else {
            return busy;
        };
        if slot.closing {
            if n == 0 && slot.con.state() == ConnState::Disconnected {
                self.drop_con(i);
                busy = true;
            }
            return busy;
        }
        busy |= self.retry_responses(cx, i);
        busy |= self.retry_invs(cx, i);
        busy |= self.heartbeat(cx, i);
        busy |= self.post_info_rsp(cx, i);
        busy
    }

    fn on_wc(&mut self, cx: &mut dyn Ctx, i: usize, wc: Wc) {
        let kind = wc.wr_id & KIND_MASK;
        let recv = matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
            || kind == WR_RECV
            || kind == WR_INFO_REQ;
        if kind == WR_INV {
            let op = wc.wr_id as u32;
            let gen24 = ((wc.wr_id >> 32) & 0xff_ffff) as u32;
            if !self
                .ops
                .get(op as usize)
                .is_some_and(|o| o.inv_matches(gen24))
            {
                return;
            }
            if wc.status.is_ok() {
                self.after_inv(cx, op);
            } else {
                self.drop_op(op, false);
                if wc.status != WcStatus::WrFlush {
                    self.close_con_path(cx, i, format_args!("LOCAL_INV failed: {:?}", wc.status));
                }
            }
            return;
        }
        if !wc.status.is_ok() {
            if wc.status != WcStatus::WrFlush {
                self.close_con_path(
                    cx,
                    i,
                    format_args!("completion error {:?} (wr kind {})", wc.status, kind >> 56),
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
        // Only when not set yet: the home core's heartbeat reads the flag every loop.
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
            _ if kind == WR_INFO_REQ => self.on_info_req(cx, i, wc.byte_len),
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
            Ok(Imm::IoReq { payload }) => self.on_io_req(cx, i, payload),
            Ok(Imm::HbMsg) if cid == 0 => {
                let Some(slot) = self.cons[i].as_mut() else {
                    return;
                };
                // Out of send slots the ack is skipped: traffic is flowing anyway.
                match slot.con.post_imm_empty(WR_HB, HB_ACK_IMM) {
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
        for idx in slot.rsp_wait.into_iter().chain(slot.inv_wait) {
            self.drop_op(idx, true);
        }
        for idx in 0..self.ops.len() as u32 {
            if self.ops[idx as usize].pending_inv_on(i) {
                self.drop_op(idx, false);
            }
        }
        slot.path.live_cons.fetch_sub(1, Ordering::AcqRel);
    }

    /// Home core: finalises drained paths (link event, removal, session release).
    fn finalize(&mut self, cx: &mut dyn Ctx) -> bool {
        let mut busy = false;
        let mut k = 0;
        while k < self.closing.len() {
            let p = &self.closing[k];
            if p.live_cons.load(Ordering::Acquire) != 0 || p.ops.load(Ordering::Acquire) != 0 {
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
                    if was_up && e.up > 0 {
                        e.up -= 1;
                        last_up = e.up == 0;
                    }
                    if e.all.is_empty() {
                        t.sessions.remove(pos);
                    }
                }
            }
            if last_up {
                let name = p.sess.name();
                self.handler
                    .link_event(cx, p.sess.id, &name, LinkEvent::Disconnected);
            }
        }
        busy
    }

    fn stop_all(&mut self, cx: &mut dyn Ctx) {
        for i in 0..self.cons.len() {
            if let Some(s) = &self.cons[i] {
                let p = Arc::clone(&s.path);
                self.sh.close_path(cx, &p, format_args!("server stopping"));
            }
        }
    }
}

impl Poller for CorePoller {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        if self.done {
            return PollResult::Idle;
        }
        let mut busy = false;
        self.now = cx.now();
        self.polls = self.polls.wrapping_add(1);
        while let Some(cmd) = self.sh.inbox[self.core].pop() {
            self.on_cmd(cx, cmd);
            busy = true;
        }
        let stopping = self.sh.stop.load(Ordering::Acquire);
        if stopping {
            self.stop_all(cx);
        }
        for i in 0..self.cons.len() {
            busy |= self.poll_con(cx, i);
        }
        busy |= self.handler.poll(cx, &mut self.responses);
        busy |= self.drain_responses(cx);
        busy |= self.run_waiting(cx);
        busy |= self.finalize(cx);
        if stopping {
            if self.cons.iter().all(Option::is_none)
                && self.free_ops.len() == self.ops.len()
                && self.closing.is_empty()
            {
                self.done = true;
                self.sh.pollers.fetch_sub(1, Ordering::AcqRel);
                if let Some(id) = cx.current() {
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
}
