//! [`RtrsCon`]: one reliable connection of an RTRS path, with the bookkeeping both sides
//! need around it — the kernel's `struct rtrs_con` plus `rtrs_post_recv_empty`,
//! `rtrs_post_rdma_write_imm_empty` and the `signal_interval` / `sq_wr_avail` rules of
//! `rtrs-srv.c` and `rtrs-clt.c` (docs/PROTOCOL.md §4.7).
//!
//! # Send-queue budget and signaling
//! A fabric send slot stays held from posting until a completion is generated for that
//! work request or a later one of the same connection. Most requests are posted
//! unsignaled, so slots come back only with the completion of a later *signaled* one.
//! `RtrsCon` keeps that account exactly, in work requests:
//! - every posted request takes one slot of the budget (`max_send_wr` of the queue pair);
//! - the last request of a chain is signaled when `signal_interval` requests have gone
//!   out since the previous signaled one, or when the budget is running low (so slots
//!   held by unsignaled requests always have a signaled request behind them that will
//!   return them); a request the caller marks signaled stays signaled;
//! - each signaled request remembers how many slots it covers, and its successful
//!   completion (seen by [`RtrsCon::poll`], in order, as RC delivers them) returns them.
//!
//! A chain that does not fit the budget is refused with [`ConPostError::Budget`] before
//! anything is posted: the caller queues it and retries after polling (the kernel's
//! `rsp_wr_wait_list`). Nothing here allocates after construction.
//!
//! Unsignaled LOCAL_INVs and REG_MRs at the head of a chain are done at once where the
//! fabric can ([`Conn::local_now`]: the software fabrics, where a posted one takes
//! effect at post anyway) and take no slot; the rest of the chain is posted.
//!
//! # On a core's shared completion queue
//! A `RtrsCon` made with [`RtrsCon::on_shared_cq`] does not poll a CQ of its own: the core polls
//! its shared CQ once per loop, finds each completion's connection by `qp_num` and has
//! it accounted here ([`RtrsCon::account`], what [`RtrsCon::poll`] does for its own CQ)
//! (docs/ARCHITECTURE.md, "Completion queues").

use std::collections::VecDeque;

use smallvec::SmallVec;

use crate::fabric::{
    CmEvent, Conn, ConnState, PostError, RecvWr, SendOp, SendWr, Wc, WcOpcode, WcStatus,
};

/// Receives posted per `post_recv` call by [`RtrsCon::post_recv_empty`].
pub const RECV_BATCH: usize = 32;

/// Why [`RtrsCon::post_send`] refused a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConPostError {
    /// Not enough send-queue slots: retry after [`RtrsCon::poll`] returned some.
    #[error("connection cid {cid}: send queue budget exhausted (chain of {need} work requests, {avail} slots free); retry after polling")]
    Budget { cid: u16, need: usize, avail: u32 },
    /// The fabric refused the post; requests before `index` were accepted.
    #[error("connection cid {cid}: {source}")]
    Post {
        cid: u16,
        #[source]
        source: PostError,
    },
    /// The local operation at `index` of the chain, done at once
    /// ([`Conn::local_now`]), failed with `status`: the connection is broken; the
    /// requests before it were done, none after it posted.
    #[error("connection cid {cid}: local operation {index} of the chain failed: {status:?}")]
    Local {
        cid: u16,
        index: usize,
        status: WcStatus,
    },
}

impl ConPostError {
    /// Whether this is only a full budget (worth queueing), not a broken connection.
    pub fn is_budget(&self) -> bool {
        matches!(self, ConPostError::Budget { .. })
    }
}

/// One connection of a path: its index (`cid`) and the fabric connection, with
/// signaling and send-budget bookkeeping.
pub struct RtrsCon {
    cid: u16,
    conn: Box<dyn Conn>,
    /// Signal at least every this many work requests.
    signal_interval: u32,
    /// Signal whenever the budget left after a chain is at most this.
    low_water: u32,
    /// Work requests posted since the last signaled one.
    pending: u32,
    /// Something was posted since the last [`RtrsCon::push`].
    posted: bool,
    /// Free send slots.
    sq_avail: u32,
    /// Slots each outstanding signaled request returns on completion, oldest first.
    credits: VecDeque<u32>,
    /// The fabric connection's number (its completions carry it).
    qp_num: u32,
    /// On a core's shared CQ (see [`RtrsCon::on_shared_cq`]).
    shared: bool,
}

impl std::fmt::Debug for RtrsCon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RtrsCon")
            .field("cid", &self.cid)
            .field("state", &self.conn.state())
            .field("sq_avail", &self.sq_avail)
            .field("pending", &self.pending)
            .finish()
    }
}

impl RtrsCon {
    /// Wraps connection `cid`. `signal_interval` is the path's (`min(queue_depth, 512)`);
    /// the budget is the connection's `max_send_wr`. The effective interval is capped at
    /// half the budget so that a signaled request is always outstanding before the
    /// budget runs out.
    pub fn new(cid: u16, conn: Box<dyn Conn>, signal_interval: u32) -> RtrsCon {
        let max = conn.caps().max_send_wr.max(1);
        let interval = signal_interval.clamp(1, (max / 2).max(1));
        RtrsCon {
            cid,
            signal_interval: interval,
            low_water: interval.min(max / 4),
            pending: 0,
            posted: false,
            sq_avail: max,
            credits: VecDeque::with_capacity(max as usize + 1),
            qp_num: conn.qp_num(),
            shared: false,
            conn,
        }
    }

    /// [`RtrsCon::new`] for a connection made on a core's shared CQ: the core polls that
    /// CQ and hands each of its completions to [`RtrsCon::account`]; [`RtrsCon::poll`] has
    /// nothing to take.
    pub fn on_shared_cq(cid: u16, conn: Box<dyn Conn>, signal_interval: u32) -> RtrsCon {
        let mut con = RtrsCon::new(cid, conn, signal_interval);
        con.shared = true;
        con
    }

    /// Transmits what was posted since the last push, now (see [`Conn::push`]); nothing
    /// when nothing was.
    #[inline]
    pub fn push(&mut self) {
        if self.posted {
            self.posted = false;
            self.conn.push();
        }
    }

    /// Whether the connection is on a shared CQ (see [`RtrsCon::on_shared_cq`]).
    pub fn on_shared(&self) -> bool {
        self.shared
    }

    /// The fabric connection's number, which its completions carry.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Accounts one completion of this connection (from the core's shared CQ, or from
    /// [`RtrsCon::poll`]): a successful send-side one returns its slots to the budget.
    #[inline]
    pub fn account(&mut self, wc: &Wc) {
        let send_side = matches!(
            wc.opcode,
            WcOpcode::Send | WcOpcode::RdmaWrite | WcOpcode::RegMr | WcOpcode::LocalInv
        );
        if send_side && wc.status.is_ok() {
            if let Some(c) = self.credits.pop_front() {
                self.sq_avail += c;
            }
        }
    }

    /// The making thread lets the connection go, to hand it to the core that polls its
    /// CQ ([`Conn::release_thread`]).
    pub fn release_thread(&self) {
        self.conn.release_thread();
    }

    /// The core takes the connection over (after [`RtrsCon::release_thread`] elsewhere):
    /// a poll without room, whose only effect is that this thread now holds it.
    pub fn adopt(&mut self) {
        self.conn.poll_cq(&mut []);
    }

    /// The connection index in its path (0 = service connection).
    pub fn cid(&self) -> u16 {
        self.cid
    }

    /// The effective signal interval.
    pub fn signal_interval(&self) -> u32 {
        self.signal_interval
    }

    /// Free send-queue slots.
    pub fn sq_avail(&self) -> u32 {
        self.sq_avail
    }

    /// The fabric connection (for addresses, state, fault injection in tests).
    pub fn conn(&self) -> &dyn Conn {
        &*self.conn
    }

    /// A LOCAL_INV or REG_MR done at once where the fabric can ([`Conn::local_now`]): no
    /// work request, no slot of the budget. `None`: the fabric cannot (verbs).
    pub fn local_now(&mut self, op: &SendOp<'_>) -> Option<Result<(), WcStatus>> {
        self.conn.local_now(op)
    }

    /// The connection manager's view of the connection.
    pub fn state(&self) -> ConnState {
        self.conn.state()
    }

    /// The next connection-manager event, if any.
    pub fn poll_cm(&mut self) -> Option<CmEvent> {
        self.conn.poll_cm()
    }

    /// Starts a graceful disconnect; outstanding work then flushes.
    pub fn disconnect(&mut self) {
        self.conn.disconnect();
    }

    /// Posts a chain of send work requests, choosing which are signaled (see the module
    /// doc). The chain is copied (inline up to 8 requests) to set the flags; the data
    /// path uses [`post_chain`](Self::post_chain), which sets them in place.
    ///
    /// # Errors
    /// [`ConPostError::Budget`] when the chain does not fit the free slots (nothing is
    /// posted); [`ConPostError::Local`] when a local operation done at once failed;
    /// [`ConPostError::Post`] when the fabric refuses (requests before the error's index
    /// of what was posted, after the local operations done at once, were posted and are
    /// accounted for).
    pub fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), ConPostError> {
        let mut chain: SmallVec<[SendWr<'_>; 8]> = SmallVec::from_slice(wrs);
        self.post_chain(&mut chain)
    }

    /// As [`post_send`](Self::post_send), without the copy: the signaled flags are set
    /// in `wrs` itself.
    ///
    /// # Errors
    /// As [`post_send`](Self::post_send).
    pub fn post_chain(&mut self, chain: &mut [SendWr<'_>]) -> Result<(), ConPostError> {
        if chain.len() > self.sq_avail as usize {
            return Err(ConPostError::Budget {
                cid: self.cid,
                need: chain.len(),
                avail: self.sq_avail,
            });
        }
        // Unsignaled LOCAL_INVs and REG_MRs at the head of the chain are done at once
        // where the fabric can, with no work request (`Conn::local_now`; docs/
        // ARCHITECTURE.md, "always_invalidate on the software fabrics"): what posting
        // them first would do. One behind a wire operation is posted, to wait its turn.
        let mut first = 0;
        while let Some(wr) = chain.get(first) {
            if wr.signaled || !matches!(wr.op, SendOp::LocalInv { .. } | SendOp::RegMr { .. }) {
                break;
            }
            match self.conn.local_now(&wr.op) {
                None => break,
                Some(Ok(())) => first += 1,
                Some(Err(status)) => {
                    return Err(ConPostError::Local {
                        cid: self.cid,
                        index: first,
                        status,
                    })
                }
            }
        }
        let chain = &mut chain[first..];
        let Some(last) = chain.len().checked_sub(1) else {
            return Ok(());
        };
        // One pass sets the flags and accounts the whole chain as posted (the usual
        // case); a refused post rolls back to the prefix the fabric accepted.
        let (pending0, avail0, credits0) = (self.pending, self.sq_avail, self.credits.len());
        let mut pending = pending0;
        let mut avail = avail0;
        for (i, wr) in chain.iter_mut().enumerate() {
            pending += 1;
            avail -= 1;
            if wr.signaled
                || (i == last && (pending >= self.signal_interval || avail <= self.low_water))
            {
                wr.signaled = true;
                self.credits.push_back(pending);
                pending = 0;
            }
        }
        self.pending = pending;
        self.sq_avail = avail;
        self.posted = true;
        let Err(e) = self.conn.post_send(chain) else {
            return Ok(());
        };
        let accepted = e.index.min(chain.len());
        self.pending = pending0;
        self.sq_avail = avail0;
        self.credits.truncate(credits0);
        for wr in &chain[..accepted] {
            self.pending += 1;
            self.sq_avail -= 1;
            if wr.signaled {
                self.credits.push_back(self.pending);
                self.pending = 0;
            }
        }
        Err(ConPostError::Post {
            cid: self.cid,
            source: e,
        })
    }

    /// Posts an RDMA_WRITE_WITH_IMM with no data (heartbeats, and responses without
    /// NEW_RKEY_F), as `rtrs_post_rdma_write_imm_empty`.
    ///
    /// # Errors
    /// As [`RtrsCon::post_send`].
    pub fn post_imm_empty(&mut self, wr_id: u64, imm: u32) -> Result<(), ConPostError> {
        self.post_send(&[SendWr::imm_only(wr_id, imm)])
    }

    /// Posts `n` receives without a buffer, all with `wr_id`, in batches of
    /// [`RECV_BATCH`] (as `rtrs_post_recv_empty` in a loop).
    ///
    /// # Errors
    /// The fabric's [`PostError`]; its index counts from the start of the failing batch.
    pub fn post_recv_empty(&mut self, n: u32, wr_id: u64) -> Result<(), ConPostError> {
        let batch = [RecvWr { wr_id, sge: None }; RECV_BATCH];
        let mut left = n as usize;
        while left > 0 {
            let k = left.min(RECV_BATCH);
            self.conn
                .post_recv(&batch[..k])
                .map_err(|source| ConPostError::Post {
                    cid: self.cid,
                    source,
                })?;
            left -= k;
        }
        Ok(())
    }

    /// Posts receives as given (with or without buffers).
    ///
    /// # Errors
    /// The fabric's [`PostError`].
    pub fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), ConPostError> {
        self.conn
            .post_recv(wrs)
            .map_err(|source| ConPostError::Post {
                cid: self.cid,
                source,
            })
    }

    /// Polls the completion queue into `wcs` and returns how many completions were
    /// written; successful send-side completions return their slots to the budget. On a
    /// shared CQ there is nothing to take here (see [`RtrsCon::on_shared_cq`]).
    pub fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        if self.shared {
            return 0;
        }
        let n = self.conn.poll_cq(wcs);
        for wc in &wcs[..n] {
            self.account(wc);
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::loopback::LoopbackFabric;
    use crate::fabric::{next_rkey, Access, Fabric, KeyScope, MemBuf, QpCaps, WcStatus};
    use crate::fabric::{ConnectOptions, ListenOptions};

    fn pair(send_wr: u32) -> (RtrsCon, RtrsCon) {
        pair_on(&LoopbackFabric::new(), send_wr)
    }

    fn pair_on(f: &LoopbackFabric, send_wr: u32) -> (RtrsCon, RtrsCon) {
        let mut l = f
            .listen("127.0.0.1:0".parse().unwrap(), &ListenOptions::default())
            .unwrap();
        let caps = QpCaps {
            max_send_wr: send_wr,
            max_recv_wr: 4096,
            max_send_sge: 2,
        };
        let mut c = f
            .connect(l.local_addr(), &ConnectOptions::new(caps, &[1]))
            .unwrap();
        let req = (0..1000).find_map(|_| {
            c.poll_cm();
            l.poll()
        });
        let s = req.expect("request").accept(caps, &[2]).unwrap();
        let mut s = RtrsCon::new(0, s, 512);
        let mut est = false;
        for _ in 0..1000 {
            s.poll_cm();
            if let Some(CmEvent::Established { .. }) = c.poll_cm() {
                est = true;
                break;
            }
        }
        assert!(est, "client never established");
        (RtrsCon::new(0, c, 512), s)
    }

    /// Unsignaled LOCAL_INVs and REG_MRs at the head of a chain are done at once where
    /// the fabric can (the loopback): no send slot; behind a wire operation, or signaled,
    /// they are posted and take one.
    #[test]
    fn local_operations_at_the_head_of_a_chain_take_no_slot() {
        let f = LoopbackFabric::new();
        let (mut c, _s) = pair_on(&f, 64);
        let region = f
            .register(
                MemBuf::zeroed(4096),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap();
        let slot = f.alloc_fast_mr(KeyScope::Domain).unwrap();
        let bind = |rkey| SendWr {
            wr_id: 1,
            op: SendOp::RegMr {
                slot: &slot,
                region: &region,
                addr: region.addr(),
                len: 4096,
                access: Access::REMOTE_WRITE,
                rkey,
            },
            sges: &[],
            signaled: false,
        };
        let inv = |signaled| SendWr {
            wr_id: 2,
            op: SendOp::LocalInv { slot: &slot },
            sges: &[],
            signaled,
        };
        let send = SendWr::imm_only(3, 7);
        let avail = c.sq_avail();
        let k1 = next_rkey(slot.rkey());
        c.post_chain(&mut [bind(k1), send]).unwrap();
        assert_eq!(slot.rkey(), k1);
        assert_eq!(
            avail - c.sq_avail(),
            1,
            "the REG_MR at the head took no slot"
        );
        c.post_chain(&mut [inv(false)]).unwrap();
        assert_eq!(avail - c.sq_avail(), 1, "nor an invalidation alone");
        let k2 = next_rkey(k1);
        c.post_chain(&mut [send, bind(k2)]).unwrap();
        assert_eq!(slot.rkey(), k2);
        assert_eq!(
            avail - c.sq_avail(),
            3,
            "behind a wire operation it is posted"
        );
        c.post_chain(&mut [inv(true)]).unwrap();
        assert_eq!(avail - c.sq_avail(), 4, "a signaled one is posted");
        // A failure done at once is the connection's end, named as such.
        let e = c.post_chain(&mut [inv(false), send]).unwrap_err();
        assert!(matches!(e, ConPostError::Local { index: 0, .. }), "{e}");
        assert_eq!(avail - c.sq_avail(), 4, "nothing after it posted");
    }

    #[test]
    fn interval_capped_by_queue() {
        let (c, _s) = pair(16);
        assert_eq!(c.signal_interval(), 8);
        assert_eq!(c.sq_avail(), 16);
    }

    #[test]
    fn budget_refuses_then_recovers_without_fabric_queue_full() {
        let (mut c, mut s) = pair(16);
        s.post_recv_empty(1000, 5).unwrap();
        let mut wcs = [Wc::default(); 64];
        let mut got = 0u32;
        let drain = |s: &mut RtrsCon, got: &mut u32| {
            let mut w = [Wc::default(); 64];
            let n = s.poll(&mut w);
            for wc in &w[..n] {
                assert_eq!(wc.imm, Some(*got));
                *got += 1;
            }
        };
        let mut sent = 0u32;
        let mut refused = 0u32;
        let mut rounds = 0;
        while sent < 200 {
            rounds += 1;
            assert!(rounds < 100_000, "stuck at {sent} sent, {c:?}");
            match c.post_imm_empty(sent.into(), sent) {
                Ok(()) => sent += 1,
                Err(e) => {
                    assert!(e.is_budget(), "{e}");
                    refused += 1;
                    let n = c.poll(&mut wcs);
                    assert!(wcs[..n].iter().all(|w| w.status == WcStatus::Success));
                }
            }
            drain(&mut s, &mut got);
        }
        assert!(refused > 0, "a 16-slot queue must run out with 200 posts");
        // Everything arrives, in order.
        for _ in 0..10_000 {
            c.poll(&mut wcs);
            drain(&mut s, &mut got);
            if got == 200 {
                break;
            }
        }
        assert_eq!(got, 200);
    }

    #[test]
    fn caller_signaled_stays_signaled() {
        let (mut c, mut s) = pair(64);
        s.post_recv_empty(RECV_BATCH as u32 * 2 + 3, 0).unwrap();
        c.post_send(&[SendWr {
            signaled: true,
            ..SendWr::imm_only(77, 1)
        }])
        .unwrap();
        assert_eq!(c.sq_avail(), 63);
        let mut wcs = [Wc::default(); 8];
        let mut seen = None;
        for _ in 0..1000 {
            s.poll(&mut wcs);
            let n = c.poll(&mut wcs);
            if n > 0 {
                seen = Some(wcs[0]);
                break;
            }
        }
        let wc = seen.expect("signaled completion");
        assert_eq!((wc.wr_id, wc.status), (77, WcStatus::Success));
        assert_eq!(c.sq_avail(), 64);
    }
}
