//! Requests on one core: the kernel's `rtrs_srv_rdma_done` IO_REQ branch,
//! `process_read`/`process_write` and `rtrs_srv_resp_rdma` with `rdma_write_sg` /
//! `send_io_resp_imm` (docs/PROTOCOL.md §4.5, §9.5).
//!
//! A request lives in a slot of the core's table from its IO_REQ imm to its response:
//! 1. the imm is split and checked ([`crate::proto::ImmLayout::decode_io_req`]); the
//!    buf id is marked busy on the path (already busy: a broken client, the path closes);
//! 2. the trailer is read from the chunk at once and checked ([`ChunkReq::decode`]: type,
//!    usr_len ≤ offset, trailer inside the chunk, sg_cnt, desc len ≤ data len; and
//!    usr_len ≤ max_hdr_size, the most a client may send), and the request takes the
//!    chunk's count of finished executions (its ticket). At once, because the chunk is
//!    shared by every path of the session: when a path dies, the client re-sends its
//!    requests on another path with the same buf ids while the dead path's last writes
//!    may still be placed into the same chunks, and the trailer (whose READ descriptor
//!    carries the client's new rkey) must be the one this imm came with;
//! 3. under always_invalidate the chunk's key on this path is retired with a signaled
//!    LOCAL_INV, so the client can no longer write the chunk, before anything else;
//! 4. the chunk is claimed for the path in the session; if another (dying) path still
//!    runs a request on it — a failed-over request — this one waits on this core. Once
//!    claimed, a request whose ticket is older than the chunk's count is a copy of a
//!    request that executed meanwhile (see `super::session`): it is answered with that
//!    result and not executed again, so a stale copy never runs after the client moved
//!    on (and a write is never applied twice);
//! 5. the handler gets it; its answer builds the response chain (case A or B) on the
//!    request's connection, queued when the send budget is exhausted, dropped when the
//!    path is no longer connected. The chunk and buf id are released just before the
//!    response is posted (the client may reuse the buf id as soon as it sees it).

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use super::conn::{close_path_of, ConSlot};
use super::handler::{DataArea, Response, Responses, ServerHandler, SrvIo, SrvPath};
use super::ops::{OpTable, Stage};
use super::state::ServerState;
use super::wr::WrId;
use crate::common::Dir;
use crate::engine::Ctx;
use crate::fabric::{next_rkey, Access, SendOp, SendWr, Sge, WcStatus};
use crate::proto::{ChunkOp, ChunkReq, IoRsp, RkeyRsp, RDMA_READ_MAX_TRAILER_LEN};
use crate::Errno;

/// A response chain (at most RDMA_WRITE, REG_MR, SEND_WITH_INV and the imm): built in
/// place on the stack, every request unsignaled under one work request id.
struct Chain<'a> {
    buf: [SendWr<'a>; 4],
    len: usize,
}

impl<'a> Chain<'a> {
    fn new(wr_id: u64) -> Chain<'a> {
        let empty = SendWr {
            wr_id,
            op: SendOp::Send,
            sges: &[],
            signaled: false,
        };
        Chain {
            buf: [empty; 4],
            len: 0,
        }
    }

    /// Appends a request, written in place: one made elsewhere and copied in whole was
    /// a store-forwarding stall per request (docs/BENCHMARKS.md, "Small values returned
    /// through memory").
    #[inline(always)]
    fn push(&mut self, op: SendOp<'a>, sges: &'a [Sge]) {
        let wr = &mut self.buf[self.len];
        wr.op = op;
        wr.sges = sges;
        self.len += 1;
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_mut(&mut self) -> &mut [SendWr<'a>] {
        &mut self.buf[..self.len]
    }
}

/// What the request path borrows from the core's poller for one call.
pub(crate) struct Env<'a> {
    pub sh: &'a ServerState,
    /// The core's connections, by index.
    pub cons: &'a mut [Option<ConSlot>],
    /// The handler (on this core).
    pub handler: &'a mut dyn ServerHandler,
    /// The reactor's time at the start of this poll.
    pub now: u64,
}

impl Env<'_> {
    fn close(&self, cx: &mut dyn Ctx, i: usize, why: std::fmt::Arguments<'_>) {
        close_path_of(self.sh, cx, self.cons, i, why);
    }
}

/// The requests of one core: the op table, the requests waiting for their chunk, and
/// the handler's answers not yet sent.
pub(crate) struct Requests {
    ops: OpTable,
    /// Requests waiting for their chunk to be released by another path.
    waiting: VecDeque<u32>,
    /// The handler's answers, sent after each call into it.
    responses: Responses,
    /// Copy of the current request's user header.
    usr: Vec<u8>,
    core: usize,
}

impl Requests {
    /// The requests of `core`: room for `qd` before anything grows, user headers of up
    /// to `max_hdr` bytes.
    pub fn new(core: usize, qd: usize, max_hdr: usize) -> Requests {
        Requests {
            ops: OpTable::new(core, qd),
            waiting: VecDeque::with_capacity(qd),
            responses: Responses::with_capacity(qd),
            usr: vec![0; max_hdr],
            core,
        }
    }

    /// Whether no request is under way on this core.
    pub fn is_idle(&self) -> bool {
        self.ops.is_empty()
    }

    /// An IO_REQ imm arrived on connection `i`.
    pub fn on_io_req(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>, i: usize, payload: u32) {
        let Some(slot) = env.cons[i].as_ref() else {
            return;
        };
        let imm = match slot.path.sess.layout.decode_io_req(payload) {
            Ok(r) => r,
            Err(e) => return env.close(cx, i, format_args!("IO_REQ: {e}")),
        };
        let buf_id = imm.buf_id;
        if !slot.path.mark_busy(buf_id) {
            return env.close(
                cx,
                i,
                format_args!("IO_REQ for buf_id {buf_id} already in flight on this path"),
            );
        }
        // The trailer now, in the poll that placed it (see the module doc, step 2).
        let sess = &slot.path.sess;
        let cs = sess.chunk_size();
        let mut tr = [0u8; RDMA_READ_MAX_TRAILER_LEN];
        let n = tr.len().min(cs.saturating_sub(imm.offset) as usize);
        sess.chunks
            .read_at(sess.chunk_off(buf_id) + imm.offset as usize, &mut tr[..n]);
        let max_hdr = env.sh.cfg.max_hdr;
        let req = match ChunkReq::decode(&tr[..n], imm.offset, cs) {
            Ok(r) if u32::from(r.usr_len) > max_hdr => {
                slot.path.clear_busy(buf_id);
                return env.close(
                    cx,
                    i,
                    format_args!(
                        "buf_id {buf_id}: usr_len {} exceeds max_hdr_size {max_hdr}",
                        r.usr_len
                    ),
                );
            }
            Ok(r) => r,
            Err(e) => {
                slot.path.clear_busy(buf_id);
                return env.close(cx, i, format_args!("buf_id {buf_id}: {e}"));
            }
        };
        let path = Rc::clone(&slot.path);
        let idx = self.ops.alloc(path, i, buf_id, req);
        if !env.sh.cfg.always_invalidate {
            return self.after_inv(cx, env, idx);
        }
        if !self.post_inv(cx, env, idx) {
            if let Some(slot) = env.cons[i].as_mut() {
                slot.inv_wait.push_back(idx);
            }
        }
    }

    /// Posts the LOCAL_INV of request `idx`'s chunk key on its connection. False when
    /// the send budget is exhausted (retry later); a failed post closes the path.
    fn post_inv(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>, idx: u32) -> bool {
        let op = self.ops.get(idx);
        let (i, gen, buf_id) = (op.con, op.gen, usize::from(op.buf_id));
        if op.path.is_none() {
            return true;
        }
        let Some(slot) = env.cons[i].as_mut() else {
            self.ops.end(idx, false);
            return true;
        };
        // Where the post itself retires the key (docs/ARCHITECTURE.md, "always_invalidate
        // on the software fabrics") the request goes on at once and its completion is not
        // asked for: a failure completes all the same, and one the connection's signaling
        // interval asks for finds the request past this stage (and `RtrsCon::post_chain`
        // does an unsignaled LOCAL_INV without a work request where the fabric can).
        let at_post = env.sh.inv_at_post;
        let posted = {
            let Some(path) = self.ops.get(idx).path.as_ref() else {
                return true;
            };
            let wr = SendWr {
                wr_id: WrId::inv(idx, gen).encode(),
                op: SendOp::LocalInv {
                    slot: &path.mrs[buf_id],
                },
                sges: &[],
                signaled: !at_post,
            };
            slot.con.post_chain(&mut [wr])
        };
        match posted {
            Ok(()) => {
                if at_post {
                    self.after_inv(cx, env, idx);
                }
                true
            }
            Err(e) if e.is_budget() => false,
            Err(e) => {
                self.ops.end(idx, false);
                env.close(cx, i, format_args!("LOCAL_INV of chunk key: {e}"));
                true
            }
        }
    }

    /// The LOCAL_INV of slot `op` (generation `gen24`), posted on connection `i`,
    /// completed with `status`.
    pub fn on_inv_done(
        &mut self,
        cx: &mut dyn Ctx,
        env: &mut Env<'_>,
        i: usize,
        op: u32,
        gen24: u32,
        status: WcStatus,
    ) {
        if !self.ops.inv_matches(op, gen24) {
            // Stale, or the request went on at post (`inv_at_post`): only a failure
            // still matters (the connection is broken then).
            if !status.is_ok() && status != WcStatus::WrFlush {
                env.close(cx, i, format_args!("LOCAL_INV failed: {status:?}"));
            }
            return;
        }
        if status.is_ok() {
            self.after_inv(cx, env, op);
        } else {
            self.ops.end(op, false);
            if status != WcStatus::WrFlush {
                env.close(cx, i, format_args!("LOCAL_INV failed: {status:?}"));
            }
        }
    }

    /// Retries LOCAL_INVs of connection `i` that waited for send slots.
    pub fn retry_invs(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>, i: usize) -> bool {
        let mut any = false;
        while let Some(&idx) = env.cons[i].as_ref().and_then(|s| s.inv_wait.front()) {
            if !self.post_inv(cx, env, idx) {
                break;
            }
            any = true;
            if let Some(s) = env.cons[i].as_mut() {
                s.inv_wait.pop_front();
            }
        }
        any
    }

    /// The chunk key is retired (or there is none): claim the chunk and run the request.
    fn after_inv(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>, idx: u32) {
        if self.ops.get(idx).stage != Stage::Inv {
            return;
        }
        if !self.try_dispatch(cx, env, idx) {
            self.waiting.push_back(idx);
        }
    }

    /// Dispatches `idx` if its chunk is free; false if it must wait.
    fn try_dispatch(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>, idx: u32) -> bool {
        let core = self.core;
        let op = self.ops.get_mut(idx);
        let Some(path) = op.path.as_ref() else {
            return true;
        };
        if !path.is_connected() {
            self.ops.end(idx, true);
            return true;
        }
        if path.sess.try_own(op.buf_id, path.id).is_err() {
            op.stage = Stage::Waiting;
            if !op.counted_wait {
                op.counted_wait = true;
                path.counters.core(core).failover_waits.add(1);
            }
            return false;
        }
        op.owns = true;
        self.dispatch(cx, env, idx);
        true
    }

    /// Gives request `idx` (its chunk owned by its path) to the handler, or answers it
    /// with the result of the request it copies (module doc, step 4).
    fn dispatch(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>, idx: u32) {
        let id = self.ops.id(idx);
        let op = self.ops.get_mut(idx);
        let (Some(req), Some(path)) = (op.req, op.path.as_ref()) else {
            return;
        };
        if let Some(result) = path.sess.executed_since(op.buf_id, op.ticket) {
            path.counters.core(self.core).failover_dups.add(1);
            op.stage = Stage::Handler;
            op.result = result;
            self.send_response(cx, env, idx, false);
            return;
        }
        op.stage = Stage::Handler;
        op.t0 = env.now;
        let sess = &path.sess;
        let base = sess.chunk_off(op.buf_id);
        let usr = req.usr_range();
        let ulen = usr.len();
        sess.chunks.read_at(base + usr.start, &mut self.usr[..ulen]);
        let c = path.counters.core(self.core);
        let dir = if req.is_read() {
            c.read_cnt.add(1);
            c.read_bytes.add(req.offset.into());
            Dir::Read
        } else {
            c.write_cnt.add(1);
            c.write_bytes.add(req.offset.into());
            Dir::Write
        };
        // SAFETY: base + data_len stays inside the pool (decode checked the request
        // against the chunk size, buf_id < queue_depth).
        let ptr = unsafe { sess.chunks.as_ptr().add(base) };
        let io = SrvIo {
            id,
            sess: sess.id,
            path: SrvPath(path),
            dir,
            usr: &self.usr[..ulen],
            data: DataArea::new(ptr, req.data_len() as usize),
        };
        env.handler.request(cx, io, &mut self.responses);
    }

    /// Retries waiting requests once each; true if any moved.
    pub fn run_waiting(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>) -> bool {
        let mut moved = false;
        for _ in 0..self.waiting.len() {
            let Some(idx) = self.waiting.pop_front() else {
                break;
            };
            if self.ops.get(idx).stage != Stage::Waiting {
                continue;
            }
            if self.try_dispatch(cx, env, idx) {
                moved = true;
            } else {
                self.waiting.push_back(idx);
            }
        }
        moved
    }

    /// Lets the handler answer what finished since its last poll, and sends every
    /// answer it gave; true if it did anything.
    pub fn poll_handler(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>) -> bool {
        let polled = env.handler.poll(cx, &mut self.responses);
        self.send_responses(cx, env) | polled
    }

    /// Sends the handler's answers.
    fn send_responses(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>) -> bool {
        if self.responses.is_empty() {
            return false;
        }
        // Taken out while sending (an empty `Responses` does not allocate) and put back
        // with its storage.
        let mut responses = std::mem::take(&mut self.responses);
        let mut now = None;
        for Response { id, result } in responses.drain() {
            let Some(idx) = self.ops.answered(id) else {
                tracing::debug!("rtrs-srv: answer for unknown or finished request {id:?}");
                continue;
            };
            let op = self.ops.get_mut(idx);
            op.result = result;
            if let Some(p) = &op.path {
                // Executed: copies of this request still pending take this answer.
                p.sess.record_done(op.buf_id, result);
                let now = *now.get_or_insert_with(|| cx.now());
                p.counters
                    .core(self.core)
                    .record_latency(now.saturating_sub(op.t0));
            }
            self.send_response(cx, env, idx, false);
        }
        self.responses = responses;
        true
    }

    /// Retries responses of connection `i` that waited for send slots.
    pub fn retry_responses(&mut self, cx: &mut dyn Ctx, env: &mut Env<'_>, i: usize) -> bool {
        let mut any = false;
        while let Some(&idx) = env.cons[i].as_ref().and_then(|s| s.rsp_wait.front()) {
            if !self.send_response(cx, env, idx, true) {
                break;
            }
            any = true;
            if let Some(s) = env.cons[i].as_mut() {
                s.rsp_wait.pop_front();
            }
        }
        any
    }

    /// Drops connection `slot` (index `i`, drained after disconnect): every request
    /// waiting on it ends unanswered.
    pub fn drop_con(&mut self, slot: ConSlot, i: usize) {
        for idx in slot.rsp_wait.into_iter().chain(slot.inv_wait) {
            self.ops.end(idx, true);
        }
        self.ops.end_invs_on(i);
    }

    /// Posts the response of `idx`. Returns false when it had to wait for send slots
    /// (it is then on its connection's wait list).
    fn send_response(
        &mut self,
        cx: &mut dyn Ctx,
        env: &mut Env<'_>,
        idx: u32,
        queued: bool,
    ) -> bool {
        let op = self.ops.get_mut(idx);
        // The path is taken out of the slot for the call (no reference count moves per
        // response); every way out either puts it back or ends the slot with it.
        let (Some(req), Some(path)) = (op.req, op.path.as_ref()) else {
            return true;
        };
        let (ci, buf_id, result) = (op.con, op.buf_id, op.result);
        let usable = path.is_connected()
            && env.cons[ci]
                .as_ref()
                .is_some_and(|s| !s.closing && Arc::ptr_eq(&s.path, path));
        if !usable {
            // A queued one is popped from its wait list by the caller.
            self.ops.end(idx, true);
            return true;
        }
        let Some(path) = op.path.take() else {
            return true;
        };
        let sess = &path.sess;
        let ai = env.sh.cfg.always_invalidate;
        let (desc, need_inval) = match req.op {
            ChunkOp::Read { desc, need_inval } => (desc, need_inval && desc.is_some()),
            ChunkOp::Write => (None, false),
        };
        let case_b = result.is_ok() && desc.is_some();
        // The one place the result becomes the wire's negative errno.
        let rsp = IoRsp::new(buf_id.into(), Errno::neg_of(result), need_inval)
            .or_else(|_| IoRsp::new(buf_id.into(), Errno::EIO.neg(), need_inval));
        let Ok(rsp) = rsp else {
            self.ops.end_taken(idx, &path, true);
            return true;
        };
        let imm = rsp.to_imm();
        let base = sess.chunk_off(buf_id);
        let chunk_addr = sess.chunks.addr() + base as u64;
        let new_rkey = ai.then(|| next_rkey(path.mrs[usize::from(buf_id)].rkey()));
        let data_sge;
        let rkey_sge;
        let mut chain = Chain::new(WrId::Rsp.encode());
        let reg = new_rkey.map(|rkey| SendOp::RegMr {
            slot: &path.mrs[usize::from(buf_id)],
            region: &sess.chunks,
            addr: chunk_addr,
            len: sess.chunk_size(),
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            rkey,
        });
        if let (true, Some(d)) = (case_b, desc) {
            data_sge = [sess.chunks.sge(base, d.len as usize)];
            chain.push(
                SendOp::RdmaWrite {
                    remote_addr: d.addr,
                    rkey: d.key,
                },
                &data_sge,
            );
            if let Some(op) = reg {
                chain.push(op, &[]);
            }
            if need_inval {
                chain.push(SendOp::SendWithInv { rkey: d.key }, &[]);
            }
        } else {
            if let Some(d) = desc.filter(|_| need_inval) {
                chain.push(SendOp::SendWithInv { rkey: d.key }, &[]);
            }
            if let Some(op) = reg {
                chain.push(op, &[]);
            }
        }
        match (new_rkey, &path.rkey_ius) {
            (Some(rkey), Some(ius)) => {
                ius.write(usize::from(buf_id), &RkeyRsp { buf_id, rkey }.to_bytes());
                rkey_sge = [ius.sge(usize::from(buf_id), RkeyRsp::LEN)];
                chain.push(SendOp::SendWithImm { imm }, &rkey_sge);
            }
            _ => chain.push(SendOp::imm_only(imm), &[]),
        }
        let Some(slot) = env.cons[ci].as_mut() else {
            self.ops.get_mut(idx).path = Some(path);
            return true;
        };
        if chain.len() > slot.con.sq_avail() as usize {
            if !queued {
                slot.rsp_wait.push_back(idx);
                path.counters.core(self.core).rsp_queued.add(1);
            }
            let op = self.ops.get_mut(idx);
            if !queued {
                op.stage = Stage::RspQueued;
            }
            op.path = Some(path);
            return false;
        }
        // Release the chunk and the buf id before the response can reach the client:
        // once it has the response it may send the next request for this buf id, on
        // any connection of the path, and that one must not look like a duplicate.
        self.ops.end_taken(idx, &path, false);
        let Some(slot) = env.cons[ci].as_mut() else {
            return true;
        };
        if let Err(e) = slot.con.post_chain(chain.as_mut()) {
            path.counters.core(self.core).dropped.add(1);
            env.close(cx, ci, format_args!("posting the response: {e}"));
        }
        true
    }
}
