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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::Dir;
use crate::engine::Ctx;
use crate::fabric::{inc_rkey, Access, SendOp, SendWr};
use crate::proto::{ChunkOp, ChunkReq, IoRsp, RkeyRsp, RDMA_READ_MAX_TRAILER_LEN};

use super::handler::{DataArea, IoId, Response, SrvIo, SrvPath};
use super::poller::{CorePoller, WR_INV, WR_RSP};
use super::session::Path;
use super::stats::CoreCounters;
use crate::Errno;

/// A response chain (at most RDMA_WRITE, REG_MR, SEND_WITH_INV and the imm): built in
/// place on the stack.
struct Chain<'a> {
    buf: [SendWr<'a>; 4],
    len: usize,
}

impl<'a> Chain<'a> {
    fn new() -> Chain<'a> {
        let empty = SendWr {
            wr_id: 0,
            op: SendOp::Send,
            sges: &[],
            signaled: false,
        };
        Chain {
            buf: [empty; 4],
            len: 0,
        }
    }

    fn push(&mut self, wr: SendWr<'a>) {
        self.buf[self.len] = wr;
        self.len += 1;
    }

    fn push_opt(&mut self, wr: Option<SendWr<'a>>) {
        if let Some(wr) = wr {
            self.push(wr);
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn as_mut(&mut self) -> &mut [SendWr<'a>] {
        &mut self.buf[..self.len]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Free,
    /// LOCAL_INV posted, waiting for its completion.
    Inv,
    /// Waiting for the chunk to be released by another path.
    Waiting,
    /// With the handler.
    Handler,
    /// Answered; the response waits for send slots.
    RspQueued,
}

/// One request on this core.
pub(crate) struct Op {
    gen: u32,
    stage: Stage,
    path: Option<Arc<Path>>,
    con: usize,
    buf_id: u16,
    req: Option<ChunkReq>,
    result: Result<(), Errno>,
    counted_wait: bool,
    /// The chunk's count of finished executions when the request arrived.
    ticket: u32,
    /// When the handler got it (ns).
    t0: u64,
}

impl Op {
    fn free(gen: u32) -> Op {
        Op {
            gen,
            stage: Stage::Free,
            path: None,
            con: 0,
            buf_id: 0,
            req: None,
            result: Ok(()),
            counted_wait: false,
            ticket: 0,
            t0: 0,
        }
    }

    /// Whether this slot still holds the request a LOCAL_INV with this generation
    /// (24 bits, as carried in the work request id) was posted for.
    pub fn inv_matches(&self, gen24: u32) -> bool {
        self.stage == Stage::Inv && self.gen & 0xff_ffff == gen24
    }

    /// Whether this request waits for a LOCAL_INV on connection `con`.
    pub fn pending_inv_on(&self, con: usize) -> bool {
        self.stage == Stage::Inv && self.con == con
    }
}

impl CorePoller {
    fn alloc_op(&mut self, path: Arc<Path>, con: usize, buf_id: u16, req: ChunkReq) -> u32 {
        path.ops.fetch_add(1, Ordering::AcqRel);
        let ticket = path.sess.done_ticket(buf_id);
        let idx = match self.free_ops.pop() {
            Some(i) => i,
            None => {
                self.ops.push(Op::free(0));
                (self.ops.len() - 1) as u32
            }
        };
        let op = &mut self.ops[idx as usize];
        op.stage = Stage::Inv;
        op.path = Some(path);
        op.con = con;
        op.buf_id = buf_id;
        op.req = Some(req);
        op.result = Ok(());
        op.counted_wait = false;
        op.ticket = ticket;
        idx
    }

    /// Ends request `idx`: releases its chunk and buf id and frees the slot. `dropped`
    /// counts it as dropped unanswered.
    pub(crate) fn drop_op(&mut self, idx: u32, dropped: bool) {
        let op = &mut self.ops[idx as usize];
        if op.stage == Stage::Free {
            return;
        }
        if let Some(p) = op.path.take() {
            p.sess.release(op.buf_id, p.id);
            p.clear_busy(op.buf_id);
            if dropped {
                CoreCounters::add(&p.counters.core(self.core).dropped, 1);
            }
            p.ops.fetch_sub(1, Ordering::AcqRel);
        }
        op.stage = Stage::Free;
        op.gen = op.gen.wrapping_add(1);
        self.free_ops.push(idx);
    }

    /// An IO_REQ imm arrived on connection `i`.
    pub(crate) fn on_io_req(&mut self, cx: &mut dyn Ctx, i: usize, payload: u32) {
        let Some(slot) = self.cons[i].as_ref() else {
            return;
        };
        let imm = match slot.path.sess.layout.decode_io_req(payload) {
            Ok(r) => r,
            Err(e) => return self.close_con_path(cx, i, format_args!("IO_REQ: {e}")),
        };
        let buf_id = imm.buf_id;
        if !slot.path.mark_busy(buf_id) {
            return self.close_con_path(
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
        let req = match ChunkReq::decode(&tr[..n], imm.offset, cs) {
            Ok(r) if u32::from(r.usr_len) > self.sh.cfg.max_hdr => {
                slot.path.clear_busy(buf_id);
                return self.close_con_path(
                    cx,
                    i,
                    format_args!(
                        "buf_id {buf_id}: usr_len {} exceeds max_hdr_size {}",
                        r.usr_len, self.sh.cfg.max_hdr
                    ),
                );
            }
            Ok(r) => r,
            Err(e) => {
                slot.path.clear_busy(buf_id);
                return self.close_con_path(cx, i, format_args!("buf_id {buf_id}: {e}"));
            }
        };
        let path = Arc::clone(&slot.path);
        let idx = self.alloc_op(path, i, buf_id, req);
        if !self.sh.cfg.always_invalidate {
            return self.after_inv(cx, idx);
        }
        if !self.post_inv(cx, idx) {
            if let Some(slot) = self.cons[i].as_mut() {
                slot.inv_wait.push_back(idx);
            }
        }
    }

    /// Posts the LOCAL_INV of request `idx`'s chunk key on its connection. False when
    /// the send budget is exhausted (retry later); a failed post closes the path.
    pub(crate) fn post_inv(&mut self, cx: &mut dyn Ctx, idx: u32) -> bool {
        let op = &self.ops[idx as usize];
        let (i, gen) = (op.con, op.gen);
        let Some(rkey) = op
            .path
            .as_ref()
            .map(|p| p.mrs[usize::from(op.buf_id)].rkey())
        else {
            return true;
        };
        let Some(slot) = self.cons[i].as_mut() else {
            self.drop_op(idx, false);
            return true;
        };
        let wr = SendWr {
            wr_id: WR_INV | u64::from(gen & 0xff_ffff) << 32 | u64::from(idx),
            op: SendOp::LocalInv { rkey },
            sges: &[],
            signaled: true,
        };
        match slot.con.post_send(&[wr]) {
            Ok(()) => true,
            Err(e) if e.is_budget() => false,
            Err(e) => {
                self.drop_op(idx, false);
                self.close_con_path(cx, i, format_args!("LOCAL_INV of chunk key: {e}"));
                true
            }
        }
    }

    /// Retries LOCAL_INVs of connection `i` that waited for send slots.
    pub(crate) fn retry_invs(&mut self, cx: &mut dyn Ctx, i: usize) -> bool {
        let mut any = false;
        while let Some(&idx) = self.cons[i].as_ref().and_then(|s| s.inv_wait.front()) {
            if !self.post_inv(cx, idx) {
                break;
            }
            any = true;
            if let Some(s) = self.cons[i].as_mut() {
                s.inv_wait.pop_front();
            }
        }
        any
    }

    /// The chunk key is retired (or there is none): claim the chunk and run the request.
    pub(crate) fn after_inv(&mut self, cx: &mut dyn Ctx, idx: u32) {
        if self.ops[idx as usize].stage != Stage::Inv {
            return;
        }
        if !self.try_dispatch(cx, idx) {
            self.waiting.push_back(idx);
        }
    }

    /// Dispatches `idx` if its chunk is free; false if it must wait.
    fn try_dispatch(&mut self, cx: &mut dyn Ctx, idx: u32) -> bool {
        let Op {
            path,
            stage,
            counted_wait,
            buf_id,
            ..
        } = &mut self.ops[idx as usize];
        let Some(path) = path.as_ref() else {
            return true;
        };
        if !path.is_connected() {
            self.drop_op(idx, true);
            return true;
        }
        if path.sess.try_own(*buf_id, path.id).is_err() {
            *stage = Stage::Waiting;
            if !*counted_wait {
                *counted_wait = true;
                CoreCounters::add(&path.counters.core(self.core).failover_waits, 1);
            }
            return false;
        }
        self.dispatch(cx, idx);
        true
    }

    /// Gives request `idx` (its chunk owned by its path) to the handler, or answers it
    /// with the result of the request it copies (module doc, step 4).
    fn dispatch(&mut self, cx: &mut dyn Ctx, idx: u32) {
        let op = &mut self.ops[idx as usize];
        let (Some(req), Some(path)) = (op.req, op.path.as_ref()) else {
            return;
        };
        if let Some(result) = path.sess.executed_since(op.buf_id, op.ticket) {
            CoreCounters::add(&path.counters.core(self.core).failover_dups, 1);
            op.stage = Stage::Handler;
            op.result = result;
            self.send_response(cx, idx, false);
            return;
        }
        op.stage = Stage::Handler;
        op.t0 = self.now;
        let id = IoId::new(idx, op.gen);
        let sess = &path.sess;
        let base = sess.chunk_off(op.buf_id);
        let usr = req.usr_range();
        let ulen = usr.len();
        sess.chunks.read_at(base + usr.start, &mut self.usr[..ulen]);
        let c = path.counters.core(self.core);
        let dir = if req.is_read() {
            CoreCounters::add(&c.read_cnt, 1);
            CoreCounters::add(&c.read_bytes, req.offset.into());
            Dir::Read
        } else {
            CoreCounters::add(&c.write_cnt, 1);
            CoreCounters::add(&c.write_bytes, req.offset.into());
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
        self.handler.request(cx, io, &mut self.responses);
    }

    /// Retries waiting requests once each; true if any moved.
    pub(crate) fn run_waiting(&mut self, cx: &mut dyn Ctx) -> bool {
        let mut moved = false;
        for _ in 0..self.waiting.len() {
            let Some(idx) = self.waiting.pop_front() else {
                break;
            };
            if self.ops[idx as usize].stage != Stage::Waiting {
                continue;
            }
            if self.try_dispatch(cx, idx) {
                moved = true;
            } else {
                self.waiting.push_back(idx);
            }
        }
        moved
    }

    /// Sends the handler's answers.
    pub(crate) fn drain_responses(&mut self, cx: &mut dyn Ctx) -> bool {
        if self.responses.is_empty() {
            return false;
        }
        // Taken out while sending (an empty `Responses` does not allocate) and put back
        // with its storage.
        let mut responses = std::mem::take(&mut self.responses);
        let mut now = None;
        for Response { id, result } in responses.drain() {
            let idx = id.slot();
            let ok = self
                .ops
                .get(idx as usize)
                .is_some_and(|o| o.gen == id.gen() && o.stage == Stage::Handler);
            if !ok {
                tracing::debug!("rtrs-srv: answer for unknown or finished request {id:?}");
                continue;
            }
            let op = &mut self.ops[idx as usize];
            op.result = result;
            if let Some(p) = &op.path {
                // Executed: copies of this request still pending take this answer.
                p.sess.record_done(op.buf_id, result);
                let now = *now.get_or_insert_with(|| cx.now());
                p.counters
                    .core(self.core)
                    .record_latency(now.saturating_sub(op.t0));
            }
            self.send_response(cx, idx, false);
        }
        self.responses = responses;
        true
    }

    /// Retries responses of connection `i` that waited for send slots.
    pub(crate) fn retry_responses(&mut self, cx: &mut dyn Ctx, i: usize) -> bool {
        let mut any = false;
        while let Some(&idx) = self.cons[i].as_ref().and_then(|s| s.rsp_wait.front()) {
            if !self.send_response(cx, idx, true) {
                break;
            }
            any = true;
            if let Some(s) = self.cons[i].as_mut() {
                s.rsp_wait.pop_front();
            }
        }
        any
    }

    /// Posts the response of `idx`. Returns false when it had to wait for send slots
    /// (it is then on its connection's wait list).
    fn send_response(&mut self, cx: &mut dyn Ctx, idx: u32, queued: bool) -> bool {
        let op = &self.ops[idx as usize];
        let (Some(path), Some(req)) = (op.path.clone(), op.req) else {
            return true;
        };
        let (ci, buf_id, result) = (op.con, op.buf_id, op.result);
        let usable = path.is_connected()
            && self.cons[ci]
                .as_ref()
                .is_some_and(|s| !s.closing && Arc::ptr_eq(&s.path, &path));
        if !usable {
            // A queued one is popped from its wait list by the caller.
            self.drop_op(idx, true);
            return true;
        }
        let sess = &path.sess;
        let ai = self.sh.cfg.always_invalidate;
        let (desc, need_inval) = match req.op {
            ChunkOp::Read { desc, need_inval } => (desc, need_inval && desc.is_some()),
            ChunkOp::Write => (None, false),
        };
        let case_b = result.is_ok() && desc.is_some();
        let rsp = IoRsp::new(buf_id.into(), Errno::neg_of(result), need_inval)
            .or_else(|_| IoRsp::new(buf_id.into(), Errno::EIO.neg(), need_inval));
        let Ok(rsp) = rsp else {
            self.drop_op(idx, true);
            return true;
        };
        let imm = rsp.to_imm();
        let base = sess.chunk_off(buf_id);
        let chunk_addr = sess.chunks.addr() + base as u64;
        let new_rkey = ai.then(|| inc_rkey(path.mrs[usize::from(buf_id)].rkey()));
        let data_sge;
        let rkey_sge;
        let mut chain = Chain::new();
        let reg = new_rkey.map(|rkey| SendWr {
            wr_id: WR_RSP,
            op: SendOp::RegMr {
                slot: &path.mrs[usize::from(buf_id)],
                region: &sess.chunks,
                addr: chunk_addr,
                len: sess.chunk_size(),
                access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                rkey,
            },
            sges: &[],
            signaled: false,
        });
        let inv = desc.filter(|_| need_inval).map(|d| SendWr {
            wr_id: WR_RSP,
            op: SendOp::SendWithInv { rkey: d.key },
            sges: &[],
            signaled: false,
        });
        if let (true, Some(d)) = (case_b, desc) {
            data_sge = [sess.chunks.sge(base, d.len as usize)];
            chain.push(SendWr {
                wr_id: WR_RSP,
                op: SendOp::RdmaWrite {
                    remote_addr: d.addr,
                    rkey: d.key,
                },
                sges: &data_sge,
                signaled: false,
            });
            chain.push_opt(reg);
            chain.push_opt(inv);
        } else {
            chain.push_opt(inv);
            chain.push_opt(reg);
        }
        match (new_rkey, &path.rkey_ius) {
            (Some(rkey), Some(ius)) => {
                ius.write(usize::from(buf_id), &RkeyRsp { buf_id, rkey }.to_bytes());
                rkey_sge = [ius.sge(usize::from(buf_id), RkeyRsp::LEN)];
                chain.push(SendWr {
                    wr_id: WR_RSP,
                    op: SendOp::SendWithImm { imm },
                    sges: &rkey_sge,
                    signaled: false,
                });
            }
            _ => chain.push(SendWr {
                wr_id: WR_RSP,
                op: SendOp::RdmaWriteWithImm {
                    remote_addr: 0,
                    rkey: 0,
                    imm,
                },
                sges: &[],
                signaled: false,
            }),
        }
        let Some(slot) = self.cons[ci].as_mut() else {
            return true;
        };
        if chain.len() > slot.con.sq_avail() as usize {
            if !queued {
                self.ops[idx as usize].stage = Stage::RspQueued;
                slot.rsp_wait.push_back(idx);
                CoreCounters::add(&path.counters.core(self.core).rsp_queued, 1);
            }
            return false;
        }
        // Release the chunk and the buf id before the response can reach the client:
        // once it has the response it may send the next request for this buf id, on
        // any connection of the path, and that one must not look like a duplicate.
        self.drop_op(idx, false);
        let Some(slot) = self.cons[ci].as_mut() else {
            return true;
        };
        if let Err(e) = slot.con.post_chain(chain.as_mut()) {
            CoreCounters::add(&path.counters.core(self.core).dropped, 1);
            self.close_con_path(cx, ci, format_args!("posting the response: {e}"));
        }
        true
    }
}
