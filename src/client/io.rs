//! The data path of a [`SessionCore`]: posting requests (the kernel's
//! `rtrs_clt_write_req`/`rtrs_clt_read_req`, docs/PROTOCOL.md §4.3–§4.4), handling responses
//! (`rtrs_clt_rdma_done`, §4.6, validated per §9.6), and failing requests over when
//! their path dies (`fail_all_outstanding_reqs` and `rtrs_clt_failover_req`, §6.2).
//!
//! WRITE: `[data][usr][rdma_write]` in one RDMA_WRITE_WITH_IMM at chunk offset 0; the
//! data goes straight from the caller's single segment, or from the permit's bounce
//! area when there are several. READ: the permit's fast-registration slot is bound to
//! its bounce area (REG_MR with a new rkey), `[usr][rdma_read{desc}]` goes to chunk
//! offset `data_len`, the server writes the reply there, and the key is retired before
//! the request completes: on verbs the READ asks for it (`NEED_INVAL_F`) and the
//! server's SEND_WITH_INV does it, on the software fabrics the response's handling does
//! it at once ([`retire_key`]; docs/ARCHITECTURE.md, "always_invalidate on the software
//! fabrics"); the reply is copied into the caller's segments on completion. A slot
//! whose invalidation was not seen (error, failover) is replaced by a fresh one before
//! its next use, so a binding is never stacked on a live one and a stale server
//! operation can never reach memory under a new key.

use std::sync::atomic::Ordering;

use super::core_cq::Hub;
use super::policy::{Candidate, MpPolicy, PathSet};
use super::request::{
    slot_sgl, CorePath, Out, PollScratch, Posted, RState, ReadKey, MAX_SGL, NO_ROUTE, WC_BATCH,
};
use super::session_core::{hold, SessionCore, Sizing};

use crate::common::{ConPostError, Dir};
use crate::fabric::{
    device_index, next_rkey, Access, KeyScope, RecvWr, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use crate::proto::{
    read_placement, write_placement, Imm, IoRsp, RdmaRead, RdmaWrite, RkeyRsp, SgDesc,
};
use crate::sync::lock;
use crate::Errno;

/// Polls of a core between connection-manager checks of its IO connections.
const CM_POLL_EVERY: u64 = 64;

/// What [`take_recvs`] saw in a batch of completions.
#[derive(Clone, Copy, Default)]
struct Seen {
    /// A successful receive.
    received: bool,
    /// A failed (or flushed) completion.
    flushed: bool,
}

/// Retires READ key `i` of path `slot`, whose response arrived: the server's
/// SEND_WITH_INV did (`w_inv`), else it is invalidated here at once
/// ([`Conn::local_now`](crate::fabric::Conn::local_now)), before the request completes,
/// as the kernel's client does with a LOCAL_INV when no remote invalidation came. False
/// only when the fabric could not do it at once (the key still live). A connection that
/// broke meanwhile counts as done: the key is of that connection alone, so nothing
/// reaches the memory through it any more, and a slot left bound is replaced before its
/// next use.
fn retire_key(paths: &mut [Option<CorePath>], slot: usize, i: usize, w_inv: bool) -> bool {
    let Some(cp) = paths.get_mut(slot).and_then(Option::as_mut) else {
        return true;
    };
    let Some(key) = cp.keys.get_mut(i).and_then(Option::as_mut) else {
        return true;
    };
    if !w_inv {
        match cp.io.con.local_now(&SendOp::LocalInv { slot: &key.slot }) {
            Some(Ok(())) => {}
            Some(Err(_)) => return true,
            None => return false,
        }
    }
    key.bound = false;
    true
}

/// Copies the first bytes of every successful receive among `wcs` into `payloads` (same
/// index) and reposts all of those receives in one call, before any is handled (the
/// kernel reposts first too; the buffer may be reused once reposted). Says whether the
/// batch held a receive and a failed completion (one pass over the batch).
fn take_recvs(
    cp: &mut CorePath,
    wcs: &[Wc],
    payloads: &mut [[u8; RkeyRsp::LEN]; WC_BATCH],
    posts: &mut [RecvWr; WC_BATCH],
) -> Result<Seen, ConPostError> {
    let mut k = 0;
    let mut seen = Seen::default();
    for (wc, payload) in wcs.iter().zip(payloads.iter_mut()) {
        if !wc.status.is_ok() {
            seen.flushed = true;
            continue;
        }
        if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            continue;
        }
        if let Some(pool) = &cp.io.recv {
            let got = (wc.byte_len as usize).min(RkeyRsp::LEN);
            pool.read(wc.wr_id as usize, &mut payload[..got]);
            posts[k] = pool.recv_wr(wc.wr_id as usize, wc.wr_id);
        }
        k += 1;
    }
    if k == 0 {
        return Ok(seen);
    }
    seen.received = true;
    cp.io.con.post_recv(&posts[..k]).map(|()| seen)
}

/// Moves the completions of route `route` in the core's shared CQ's current batch into
/// `wcs` (none when the hub is held by another thread: they wait for a later poll).
#[inline]
fn take_routed(hub: Option<&Hub>, route: u32, wcs: &mut [Wc]) -> usize {
    hub.and_then(|h| h.st.with_held(|st| st.take(route, wcs)))
        .unwrap_or(0)
}

/// Why a post on one path failed.
enum PostFail {
    Budget,
    Broken,
    Invalid,
}

impl SessionCore {
    fn refresh_cands(&mut self) {
        let n = self.nslots;
        let core = self.core;
        for (c, p) in self.cands[..n].iter_mut().zip(&self.paths[..n]) {
            *c = match p {
                Some(cp) => Candidate {
                    usable: cp.shared.connected(),
                    inflight: cp.shared.core_stats[core].inflight.get() as u32,
                    latency_ns: cp.shared.home.hb_latency_ns.load(Ordering::Relaxed),
                },
                None => Candidate::default(),
            };
        }
    }

    /// Posts request `i` on a path chosen by the policy, trying each usable path once.
    pub(super) fn try_post(&mut self, i: usize, now: u64) -> Posted {
        let mut tried = PathSet::EMPTY;
        let policy = self.sess.policy.get();
        loop {
            let picked = if self.nslots == 1 {
                // One path slot (the usual case): only whether it is usable matters, so
                // the candidates' counters are not gathered per request.
                let usable = self.paths[0]
                    .as_ref()
                    .is_some_and(|cp| cp.shared.connected());
                self.sel.select_only(policy, usable && !tried.contains(0))
            } else {
                self.refresh_cands();
                self.sel.select(policy, &self.cands[..self.nslots], tried)
            };
            let Some(p) = picked else {
                return Posted::NoPath;
            };
            match self.post_on(i, p, policy, now) {
                Ok(()) => return Posted::Yes,
                Err(PostFail::Budget) => return Posted::Retry,
                Err(PostFail::Invalid) => return Posted::Invalid,
                Err(PostFail::Broken) => {
                    tried.insert(p);
                    self.path_failed(p);
                }
            }
        }
    }

    fn post_on(&mut self, i: usize, p: usize, policy: MpPolicy, now: u64) -> Result<(), PostFail> {
        // A request holds one of the permits, which exist only while ready.
        let Sizing::Ready(rd) = &mut self.sizing else {
            return Err(PostFail::Invalid);
        };
        let params = rd.params;
        let buf_id = rd.permits.range().start + i as u16;
        let mut r = self.reqs[i];
        // A single segment inside a region the caller registered with this core is
        // written by the server directly; otherwise the bounce area, whose copy needs the
        // segments held (done at submit unless the region was meant; done here when the
        // region has been removed since).
        if r.has_desc() && r.region.is_none() && !r.kept {
            let seg = slot_sgl(&self.sgl, &r, i)[0];
            // Only a single-segment READ meant for a region that was removed since
            // (`remove_region` cleared its hint) gets here.
            match self.regions.index(&seg).and_then(|k| u16::try_from(k).ok()) {
                Some(k) => self.reqs[i].region = Some(k),
                None => {
                    hold(&mut self.keep, &self.regions, &*self.fabric, i, &[seg])
                        .map_err(|_| PostFail::Invalid)?;
                    self.reqs[i].kept = true;
                }
            }
            r = self.reqs[i];
        }
        let in_region = r.region.map(usize::from);
        let res = &mut rd.res;
        let cp: &mut CorePath = self.paths[p].as_mut().ok_or(PostFail::Broken)?;
        let (raddr, rkey) = cp.io.rbuf[usize::from(buf_id)];
        let bounce_addr = res.bounce.addr() + (i * params.max_io_size as usize) as u64;
        let mut sges = [Sge::default(); 2];
        let mut reg: Option<SendWr<'_>> = None;
        let mut inv: Option<SendWr<'_>> = None;
        let mut direct = false;
        let (hdr_len, imm_offset, remote) = match r.dir {
            Dir::Write => {
                let pl = write_placement(
                    r.data_len,
                    r.usr_len,
                    params.chunk_size,
                    params.max_hdr_size,
                )
                .map_err(|_| PostFail::Invalid)?;
                res.hdr.mr().write_at(
                    i * res.hdr.size() + usize::from(r.usr_len),
                    &RdmaWrite { usr_len: r.usr_len }.to_bytes(),
                );
                (pl.hdr_len, pl.imm_offset, raddr)
            }
            Dir::Read => {
                let sg_cnt = u16::from(r.data_len > 0);
                let pl = read_placement(
                    r.data_len,
                    r.usr_len,
                    sg_cnt,
                    params.chunk_size,
                    params.max_hdr_size,
                )
                .map_err(|_| PostFail::Invalid)?;
                let mut desc = None;
                if r.data_len > 0 {
                    if cp.keys.len() <= i {
                        cp.keys.resize_with(i + 1, || None);
                    }
                    if cp.keys[i].is_none() {
                        let device = device_index(cp.io.con.conn());
                        match self.fabric.alloc_fast_mr_on(KeyScope::Connection, device) {
                            Ok(slot) => cp.keys[i] = Some(ReadKey { slot, bound: false }),
                            Err(e) => {
                                tracing::warn!("cannot make a READ key slot: {e}");
                                return Err(PostFail::Budget);
                            }
                        }
                    }
                    let Some(key) = cp.keys[i].as_ref() else {
                        return Err(PostFail::Budget);
                    };
                    if key.bound {
                        inv = Some(SendWr {
                            wr_id: 0,
                            op: SendOp::LocalInv { slot: &key.slot },
                            sges: &[],
                            signaled: false,
                        });
                    }
                    let region = in_region.map(|k| &self.regions[k]);
                    direct = region.is_some();
                    let (region, target) = match region {
                        Some(m) => (&**m, slot_sgl(&self.sgl, &r, i)[0].addr),
                        None => (&res.bounce, bounce_addr),
                    };
                    let new_key = next_rkey(key.slot.rkey());
                    reg = Some(SendWr {
                        wr_id: 0,
                        op: SendOp::RegMr {
                            slot: &key.slot,
                            region,
                            addr: target,
                            len: r.data_len,
                            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                            rkey: new_key,
                        },
                        sges: &[],
                        signaled: false,
                    });
                    desc = Some(SgDesc {
                        addr: target,
                        key: new_key,
                        len: r.data_len,
                    });
                }
                let trailer = RdmaRead {
                    usr_len: r.usr_len,
                    desc,
                    need_inval: desc.is_some() && !self.inv_local,
                };
                let mut t = [0u8; crate::proto::RDMA_READ_MAX_TRAILER_LEN];
                let n = trailer.encode(&mut t).map_err(|_| PostFail::Invalid)?;
                res.hdr
                    .mr()
                    .write_at(i * res.hdr.size() + usize::from(r.usr_len), &t[..n]);
                (pl.hdr_len, pl.imm_offset, raddr + u64::from(r.data_len))
            }
        };
        let hdr_sge = res.hdr.sge(i, hdr_len as usize);
        let nsge = if r.dir == Dir::Write && r.data_len > 0 {
            sges[0] = if r.bounced {
                res.bounce
                    .sge(i * params.max_io_size as usize, r.data_len as usize)
            } else {
                slot_sgl(&self.sgl, &r, i)[0]
            };
            sges[1] = hdr_sge;
            2
        } else {
            sges[0] = hdr_sge;
            1
        };
        let imm = params
            .layout
            .io_req(buf_id, imm_offset)
            .map_err(|_| PostFail::Invalid)?;
        let io_wr = SendWr {
            wr_id: u64::from(buf_id),
            op: SendOp::RdmaWriteWithImm {
                remote_addr: remote,
                rkey,
                imm,
            },
            sges: &sges[..nsge],
            signaled: false,
        };
        // [LOCAL_INV] [REG_MR] IO: built in place, each request written once.
        let (mut c3, mut c2, mut c1);
        let chain: &mut [SendWr<'_>] = match (inv, reg) {
            (Some(a), Some(b)) => {
                c3 = [a, b, io_wr];
                &mut c3
            }
            (Some(a), None) | (None, Some(a)) => {
                c2 = [a, io_wr];
                &mut c2
            }
            (None, None) => {
                c1 = [io_wr];
                &mut c1
            }
        };
        let result = cp.io.con.post_chain(chain);
        match result {
            Ok(()) => {}
            Err(ConPostError::Budget { .. }) => return Err(PostFail::Budget),
            Err(e) => {
                if r.has_desc() {
                    cp.keys[i] = None;
                }
                tracing::warn!(sess = %self.sess.sessname, path = %cp.shared.addr, "post failed: {e}");
                return Err(PostFail::Broken);
            }
        }
        if let Some(key) = cp.keys.get_mut(i).and_then(Option::as_mut) {
            key.bound |= r.has_desc();
        }
        let st = &cp.shared.core_stats[self.core];
        st.on_post(
            r.dir == Dir::Write,
            u64::from(r.data_len) + u64::from(r.usr_len),
            usize::from(r.nsg),
        );
        if r.failed_over {
            st.failover_cnt.add(1);
        }
        if policy == MpPolicy::MinInflight {
            st.inflight.add(1);
        }
        if direct {
            st.direct_reads.add(1);
        }
        let q = &mut self.reqs[i];
        q.direct = direct;
        q.state = RState::InFlight;
        q.path = p;
        q.policy = policy;
        let _ = now;
        Ok(())
    }

    /// Polls the CQ and CM of this core's connection of path `slot`.
    pub(super) fn poll_path(
        &mut self,
        slot: usize,
        sc: &mut PollScratch,
        out: &mut Out<'_>,
        now: u64,
    ) {
        let Some(cp) = self.paths[slot].as_mut() else {
            return;
        };
        let PollScratch {
            wcs,
            payloads,
            posts,
        } = sc;
        let n = if cp.route == NO_ROUTE {
            cp.io.con.poll(wcs)
        } else {
            // On the core's shared CQ, polled by the loop's owner this loop: this
            // connection's completions, taken out of its batch.
            let n = take_routed(self.hub.as_deref(), cp.route, wcs);
            for wc in &wcs[..n] {
                cp.io.con.account(wc);
            }
            n
        };
        cp.shared.core_stats[self.core].on_poll(n);
        let seen = match take_recvs(cp, &wcs[..n], payloads, posts) {
            Ok(seen) => seen,
            Err(e) => {
                self.protocol_error(slot, format_args!("receive repost failed: {e}"));
                return;
            }
        };
        if seen.received {
            // Only when not set yet (the home core clears it): no write per poll to a
            // line another core reads.
            if !cp.shared.rx_seen.load(Ordering::Relaxed) {
                cp.shared.rx_seen.store(true, Ordering::Relaxed);
            }
        }
        // A break shows in the CQ first (the posted receives flush); the CM is asked then,
        // and otherwise only every CM_POLL_EVERY polls (on the software fabrics asking
        // it costs a progress pass of its own).
        let mut broken = false;
        if seen.flushed || self.polls % CM_POLL_EVERY == 0 {
            while let Some(ev) = cp.io.con.poll_cm() {
                if matches!(
                    ev,
                    crate::fabric::CmEvent::Disconnected | crate::fabric::CmEvent::Error { .. }
                ) {
                    broken = true;
                }
            }
        }
        for (wc, payload) in wcs[..n].iter().zip(payloads.iter()) {
            if self.paths[slot].is_none() {
                return;
            }
            self.on_wc(slot, wc, payload, out, now);
        }
        if broken && self.paths[slot].is_some() {
            self.path_failed(slot);
        }
    }

    /// One completion of this core's connection of `slot`; a receive's first bytes (an
    /// RKEY_RSP) are in `payload`, taken before the receive was reposted.
    fn on_wc(
        &mut self,
        slot: usize,
        wc: &Wc,
        payload: &[u8; RkeyRsp::LEN],
        out: &mut Out<'_>,
        now: u64,
    ) {
        if wc.status == WcStatus::WrFlush {
            return;
        }
        if !wc.status.is_ok() {
            self.protocol_error(
                slot,
                format_args!("work completion {:?} failed: {:?}", wc.opcode, wc.status),
            );
            return;
        }
        if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
            return;
        }
        // Paths reach a core together with the limits (`PathCmd::Up`).
        let Some(params) = self.sizing.params() else {
            return;
        };
        let Some(cp) = self.paths[slot].as_mut() else {
            return;
        };
        let rkey_buf = *payload;
        let got = (wc.byte_len as usize).min(RkeyRsp::LEN);
        let Some(imm) = wc.imm else {
            return;
        };
        let rsp = match Imm::decode(imm) {
            Ok(Imm::IoRsp(r)) => r,
            Ok(Imm::HbMsg | Imm::HbAck) => return,
            Ok(Imm::IoReq { .. }) => {
                self.protocol_error(slot, format_args!("IO_REQ imm {imm:#x} sent to the client"));
                return;
            }
            Err(e) => {
                self.protocol_error(slot, format_args!("{e}"));
                return;
            }
        };
        if wc.opcode == WcOpcode::Recv {
            if !params.new_rkey || got < RkeyRsp::LEN {
                self.protocol_error(
                    slot,
                    format_args!(
                        "response by SEND_WITH_IMM of {} bytes without NEW_RKEY_F",
                        wc.byte_len
                    ),
                );
                return;
            }
            match RkeyRsp::decode(&rkey_buf, params.queue_depth, rsp.msg_id()) {
                Ok(k) => cp.io.rbuf[usize::from(k.buf_id)].1 = k.rkey,
                Err(e) => {
                    self.protocol_error(slot, format_args!("{e}"));
                    return;
                }
            }
        }
        self.complete_rsp(slot, rsp, out, now);
    }

    fn complete_rsp(&mut self, slot: usize, rsp: IoRsp, out: &mut Out<'_>, now: u64) {
        // A response is matched to a taken permit, which exists only while ready.
        let Sizing::Ready(rd) = &mut self.sizing else {
            return;
        };
        let params = rd.params;
        if rsp.check_msg_id(params.queue_depth).is_err() {
            if let Some(suppressed) = self.may_warn(now) {
                tracing::warn!(sess = %self.sess.sessname, msg_id = rsp.msg_id(), suppressed, "response for a msg_id beyond the queue depth ignored");
            }
            return;
        }
        let buf_id = rsp.msg_id() as u16;
        if !rd.permits.is_taken(buf_id) {
            return;
        }
        let i = usize::from(buf_id - rd.permits.range().start);
        let r = self.reqs[i];
        if r.state != RState::InFlight || r.path != slot {
            return;
        }
        if rsp.w_inv() && !r.has_desc() {
            self.protocol_error(
                slot,
                format_args!("IO_RSP_W_INV for msg_id {buf_id}, which asked for no invalidation"),
            );
            return;
        }
        if r.has_desc() && !rsp.w_inv() && !self.inv_local {
            // Asked for, and a server always sends it (docs/PROTOCOL.md §4.5): without it
            // the server could still write through the key after the request completed.
            self.protocol_error(
                slot,
                format_args!(
                    "IO_RSP for msg_id {buf_id}, whose key the server was asked to invalidate"
                ),
            );
            return;
        }
        if r.has_desc() && !retire_key(&mut self.paths, slot, i, rsp.w_inv()) {
            // Not reached on a fabric that does local operations at once; never complete
            // a READ whose key may still be live.
            self.protocol_error(
                slot,
                format_args!("the key of msg_id {buf_id} could not be invalidated locally"),
            );
            return;
        }
        let res = &mut rd.res;
        let mut result = Errno::result_from_neg(rsp.errno());
        if result.is_ok() && r.has_desc() && !r.direct {
            let mut off = i * params.max_io_size as usize;
            let mut left = r.data_len as usize;
            let segs = i * MAX_SGL..i * MAX_SGL + usize::from(r.nsg);
            for (s, held) in slot_sgl(&self.sgl, &r, i).iter().zip(&self.keep[segs]) {
                let n = (s.len as usize).min(left);
                if held.is_none() {
                    // Not reached: a READ that is not direct holds its segments from its
                    // post on (`hold`). An address not proven is never written.
                    result = Err(Errno::EIO);
                    break;
                }
                // SAFETY: `[s.addr, s.addr + s.len)` was proven inside a registration
                // granting local write when the request was submitted (`hold`), and that
                // memory is kept allocated until the completion by `held` (`Memory`) or
                // by the core's regions (`Region`; `remove_region` turns such a hold into
                // `Memory` before it lets the region go); the caller
                // reserved it for this request (ClientIo's contract). The server finished
                // writing the bounce area of permit `i` before its response (RC
                // ordering) and its key is retired or replaced before reuse.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        res.bounce.as_ptr().add(off),
                        s.addr as *mut u8,
                        n,
                    );
                }
                off += n;
                left -= n;
            }
        }
        let c = self.finish(i, result, now);
        out.put(c, &mut self.done);
    }

    fn protocol_error(&mut self, slot: usize, why: std::fmt::Arguments<'_>) {
        if let Some(cp) = self.paths[slot].as_ref() {
            tracing::warn!(sess = %self.sess.sessname, path = %cp.shared.addr, core = self.core, "path error: {why}");
        }
        self.path_failed(slot);
    }

    /// This core's connection of `slot` failed: drop it, tell the home core, and fail
    /// its requests over.
    pub(super) fn path_failed(&mut self, slot: usize) {
        if let Some(mut cp) = self.paths[slot].take() {
            cp.io.con.disconnect();
            cp.shared.error.store(true, Ordering::Release);
            self.drop_route(cp.route);
        }
        self.fail_over(slot);
    }

    /// The home core tears path `slot` down: disconnect, take in what already arrived,
    /// then fail the rest over.
    pub(super) fn teardown(&mut self, slot: usize, now: u64) {
        if let Some(cp) = self.paths[slot].as_mut() {
            cp.io.con.disconnect();
        }
        let mut wcs = [Wc::default(); WC_BATCH];
        for _ in 0..64 {
            let Some(cp) = self.paths[slot].as_mut() else {
                break;
            };
            // On the shared CQ: what this loop's batch holds of it (the rest of what it
            // reported goes with its route, below).
            let n = if cp.route == NO_ROUTE {
                cp.io.con.poll(&mut wcs)
            } else {
                let n = take_routed(self.hub.as_deref(), cp.route, &mut wcs);
                for wc in &wcs[..n] {
                    cp.io.con.account(wc);
                }
                n
            };
            if n == 0 {
                break;
            }
            let mut payloads = [[0u8; RkeyRsp::LEN]; WC_BATCH];
            let mut posts = [RecvWr {
                wr_id: 0,
                sge: None,
            }; WC_BATCH];
            // The connection is going: a failed repost changes nothing.
            let _ = take_recvs(cp, &wcs[..n], &mut payloads, &mut posts);
            for (wc, payload) in wcs[..n].iter().zip(&payloads) {
                if wc.status.is_ok() {
                    // Outside a poll's slice: the completions wait for the next poll.
                    self.on_wc(slot, wc, payload, &mut Out::new(&mut []), now);
                }
            }
        }
        if let Some(cp) = self.paths[slot].take() {
            self.drop_route(cp.route);
        }
        self.fail_over(slot);
    }

    /// Requests in flight on `slot` go back to waiting; [`Self::drive_wait`] re-sends
    /// them on another path with the same permit.
    fn fail_over(&mut self, slot: usize) {
        for i in 0..self.reqs.len() {
            let r = self.reqs[i];
            if r.state != RState::InFlight || r.path != slot {
                continue;
            }
            if let Some(p) = lock(&self.sess.paths)[slot].as_ref() {
                if r.policy == MpPolicy::MinInflight {
                    p.core_stats[self.core].inflight.sub(1);
                }
            }
            let q = &mut self.reqs[i];
            q.state = RState::Waiting;
            // Its deadline stays: one per request, from its submission (ClientIo).
            q.failed_over = true;
            self.wait.push_front(self.first_buf_id() + i as u16);
        }
    }

    /// Retries waiting requests; those past their deadline, or with no path that could
    /// come back, fail with −ENOTCONN; one that waits with its caller goes back to it at
    /// once, with −ECONNRESET (its path died,
    /// [`PathWait::Caller`](super::PathWait::Caller)).
    pub(super) fn drive_wait(&mut self, out: &mut Out<'_>, now: u64) {
        let live = self.sess.live();
        for _ in 0..self.wait.len() {
            let Some(b) = self.wait.pop_front() else {
                break;
            };
            let i = usize::from(b - self.first_buf_id());
            match self.try_post(i, now) {
                Posted::Yes => {}
                Posted::Invalid => {
                    let c = self.finish(i, Err(Errno::EINVAL), now);
                    out.put(c, &mut self.done);
                }
                Posted::Retry => self.wait.push_back(b),
                Posted::NoPath => {
                    let Some(deadline) = self.reqs[i].deadline else {
                        let c = self.finish(i, Err(Errno::ECONNRESET), now);
                        out.put(c, &mut self.done);
                        continue;
                    };
                    if now >= deadline || !live {
                        let c = self.finish(i, Err(Errno::ENOTCONN), now);
                        out.put(c, &mut self.done);
                    } else {
                        self.wait.push_back(b);
                    }
                }
            }
        }
    }
}
