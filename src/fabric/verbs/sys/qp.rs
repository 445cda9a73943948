//! Queue pairs and completion queues (the kernel's `ib_qp`/`ib_cq` as `rtrs.c` creates
//! them in `create_con`/`create_qp`): one RC queue pair per cm_id, on a CQ of its own
//! for both queues or on a CQ shared with other queue pairs, with work-request and
//! completion arrays allocated once so posting and polling never allocate.

use std::mem;
use std::ptr;
use std::sync::Arc;

use rdma_sys as ffi;

use super::{CmId, Device, MemRegion, MemWindow, Pd, SysError, WindowKind};
use crate::fabric::{QpCaps, RecvWr, Sge};

/// Longest chain handed to one `ibv_post_send`/`ibv_post_recv`; longer chains are posted
/// in pieces by the caller.
pub(in crate::fabric::verbs) const MAX_CHAIN: usize = 16;

/// Completions fetched by one `ibv_poll_cq`.
const POLL_BATCH: usize = 32;

/// Written into `ibv_wc::opcode` before polling: providers leave the opcode of a failed
/// completion unset, and this tells "unset" apart from a real opcode.
const OPCODE_UNSET: u32 = u32::MAX;

/// One send work request with its objects resolved to this backend's handles.
#[derive(Clone, Copy)]
pub(in crate::fabric::verbs) struct SendReq<'a> {
    pub wr_id: u64,
    pub op: SendReqOp<'a>,
    pub sges: &'a [Sge],
    pub signaled: bool,
}

impl SendReq<'static> {
    /// A placeholder for fixed-size arrays.
    pub const EMPTY: SendReq<'static> = SendReq {
        wr_id: 0,
        op: SendReqOp::Send,
        sges: &[],
        signaled: false,
    };
}

/// The verbs opcode of a [`SendReq`] and its operands. Immediates are in host order here.
#[derive(Clone, Copy)]
pub(in crate::fabric::verbs) enum SendReqOp<'a> {
    Send,
    SendWithImm(u32),
    SendWithInv(u32),
    Write {
        remote_addr: u64,
        rkey: u32,
    },
    WriteWithImm {
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    },
    /// `IBV_WR_BIND_MW`: binds `mw` over `[addr, addr+len)` of `mr` under `rkey`.
    /// `access` is raw `IBV_ACCESS_*` bits.
    ///
    /// Type-1 windows are bound by the same work request: libibverbs' `ibv_bind_mw` is
    /// this request posted with the next key, which the provider then records in the
    /// window, as [`Qp::post_chain`] does here. Posting it in the chain keeps the key
    /// the caller's and the binding in send-queue order with the rest.
    BindMw {
        mw: &'a MemWindow,
        mr: &'a Arc<MemRegion>,
        addr: u64,
        len: u64,
        access: u32,
        rkey: u32,
    },
    /// Retires `mw`'s current key: `IBV_WR_LOCAL_INV` for a type-2 window; for a type-1
    /// window (which no invalidation can retire) a zero-length `IBV_WR_BIND_MW` under
    /// the same key, after which nothing is reachable through it.
    Invalidate(&'a MemWindow),
}

/// A refused post: index of the first request not accepted, and the errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::fabric::verbs) struct PostFailure {
    pub index: usize,
    pub errno: i32,
}

/// A work completion as the provider reported it (immediates still in network order).
#[derive(Clone, Copy, Debug)]
pub(in crate::fabric::verbs) struct RawWc {
    pub wr_id: u64,
    pub status: u32,
    /// `None` when the provider left it unset (failed completions).
    pub opcode: Option<u32>,
    pub byte_len: u32,
    pub wc_flags: u32,
    /// `imm_data` (network order) or `invalidated_rkey`, as `wc_flags` says.
    pub imm_or_rkey: u32,
    /// The queue pair the work request was posted on.
    pub qp_num: u32,
}

/// A completion queue, shared by the queue pairs created on it (each holds an `Arc`).
pub(in crate::fabric::verbs) struct Cq {
    raw: *mut ffi::ibv_cq,
    /// The completion channel the CQ reports to once armed ([`Cq::create_notified`]).
    /// Destroyed after the CQ (`Drop`), which verbs requires.
    channel: Option<CompChannel>,
    // Dropped after ibv_destroy_cq: the context goes last.
    _dev: Arc<Device>,
}

/// An `ibv_comp_channel` whose descriptor is non-blocking: readable while an event of an
/// armed CQ waits to be read (`ibv_get_cq_event`).
struct CompChannel(*mut ffi::ibv_comp_channel);

impl CompChannel {
    fn create(dev: &Device) -> Result<CompChannel, SysError> {
        // SAFETY: the context is open (the caller holds the device).
        let raw = unsafe { ffi::ibv_create_comp_channel(dev.ctx) };
        if raw.is_null() {
            return Err(SysError::last("ibv_create_comp_channel"));
        }
        let ch = CompChannel(raw);
        let fd = ch.fd();
        // SAFETY: fcntl on the channel's own descriptor; only the status flags change.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(SysError::last("fcntl(comp_channel, F_SETFL, O_NONBLOCK)"));
        }
        Ok(ch)
    }

    fn fd(&self) -> libc::c_int {
        // SAFETY: the channel is live; `fd` is set by ibv_create_comp_channel.
        unsafe { (*self.0).fd }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel, destroyed once, after its CQ.
        let ret = unsafe { ffi::ibv_destroy_comp_channel(self.0) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_comp_channel failed");
        }
    }
}

// SAFETY: a CQ is only passed to verbs calls, which are thread-safe; polling needs
// `&mut PollBuf`, so one poller per buffer.
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

/// The array `ibv_poll_cq` fills, allocated once.
pub(in crate::fabric::verbs) struct PollBuf(Box<[ffi::ibv_wc]>);

// SAFETY: plain data (the `wr_id`s are the caller's numbers, never dereferenced).
unsafe impl Send for PollBuf {}

impl PollBuf {
    pub fn new() -> PollBuf {
        PollBuf(zeroed_slice(POLL_BATCH))
    }
}

impl Cq {
    /// A CQ of `cqe` entries (clamped to 1..=`max_cqe`) on `pd`'s context.
    pub fn create(pd: &Arc<Pd>, cqe: u32, max_cqe: u32) -> Result<Arc<Cq>, SysError> {
        Cq::make(pd, cqe, max_cqe, None)
    }

    /// As [`Cq::create`], with a completion channel of its own: [`Cq::event_fd`] becomes
    /// readable at the first completion after [`Cq::arm`].
    pub fn create_notified(pd: &Arc<Pd>, cqe: u32, max_cqe: u32) -> Result<Arc<Cq>, SysError> {
        let ch = CompChannel::create(pd.device())?;
        Cq::make(pd, cqe, max_cqe, Some(ch))
    }

    fn make(
        pd: &Arc<Pd>,
        cqe: u32,
        max_cqe: u32,
        channel: Option<CompChannel>,
    ) -> Result<Arc<Cq>, SysError> {
        let cqe = cqe.clamp(1, max_cqe.max(1));
        let ch = channel.as_ref().map_or(ptr::null_mut(), |c| c.0);
        // SAFETY: the context is open (held by the PD); the channel, if any, is of the
        // same context and outlives the CQ (dropped after it).
        let raw = unsafe {
            ffi::ibv_create_cq(pd.device().ctx, cqe as libc::c_int, ptr::null_mut(), ch, 0)
        };
        if raw.is_null() {
            return Err(SysError::last("ibv_create_cq"));
        }
        Ok(Arc::new(Cq {
            raw,
            channel,
            _dev: pd.device().clone(),
        }))
    }

    /// The descriptor of the CQ's completion channel (none without one).
    pub fn event_fd(&self) -> Option<libc::c_int> {
        self.channel.as_ref().map(CompChannel::fd)
    }

    /// Asks for one event on the channel at the next completion (`ibv_req_notify_cq`,
    /// every completion, not only solicited ones). Completions already in the CQ may not
    /// raise it: poll once more after arming.
    pub fn arm(&self) -> Result<(), SysError> {
        if self.channel.is_none() {
            return Err(SysError::invalid(
                "ibv_req_notify_cq",
                "the CQ has no completion channel",
            ));
        }
        // SAFETY: the CQ is live.
        let ret = unsafe { ffi::ibv_req_notify_cq(self.raw, 0) };
        SysError::check("ibv_req_notify_cq", ret)
    }

    /// Reads and acknowledges every event waiting on the channel, without blocking; how
    /// many there were (0 without a channel).
    pub fn take_events(&self) -> Result<u32, SysError> {
        let Some(ch) = &self.channel else {
            return Ok(0);
        };
        let mut n = 0u32;
        loop {
            let mut cq = ptr::null_mut();
            let mut ctx = ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; both out-pointers are valid.
            let ret = unsafe { ffi::ibv_get_cq_event(ch.0, &mut cq, &mut ctx) };
            if ret != 0 {
                let e = std::io::Error::last_os_error();
                if n > 0 {
                    // SAFETY: `n` events of this CQ (the channel's only one) were read
                    // and not yet acknowledged.
                    unsafe { ffi::ibv_ack_cq_events(self.raw, n) };
                }
                if e.kind() == std::io::ErrorKind::WouldBlock {
                    return Ok(n);
                }
                return Err(SysError {
                    call: "ibv_get_cq_event",
                    source: e,
                });
            }
            n += 1;
        }
    }

    /// Whether `raw` (from an asynchronous event) names this CQ.
    /// The entries the device gave the CQ (at least the number asked for).
    pub fn entries(&self) -> u32 {
        // SAFETY: the CQ is live; `cqe` is set by ibv_create_cq.
        let cqe = unsafe { (*self.raw).cqe };
        cqe.max(0) as u32
    }

    pub fn is(&self, raw: usize) -> bool {
        self.raw as usize == raw
    }

    /// Polls up to `max` completions (at most one batch) and hands each to `f`.
    pub fn poll(
        &self,
        buf: &mut PollBuf,
        max: usize,
        mut f: impl FnMut(RawWc),
    ) -> Result<usize, SysError> {
        let n = max.min(buf.0.len());
        if n == 0 {
            return Ok(0);
        }
        let base = buf.0.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i < n <= buf.len().
            unsafe { (*base.add(i)).opcode = OPCODE_UNSET };
        }
        // SAFETY: the CQ is live; `base` has room for `n` completions.
        let got = unsafe { ffi::ibv_poll_cq(self.raw, n as libc::c_int, base) };
        if got < 0 {
            return Err(SysError {
                call: "ibv_poll_cq",
                source: std::io::Error::from_raw_os_error(-got),
            });
        }
        let got = (got as usize).min(n);
        for i in 0..got {
            // SAFETY: the provider filled the first `got` entries; both union members
            // are 32-bit integers, so reading either is defined.
            let raw = unsafe {
                let wc = &*base.add(i);
                RawWc {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    opcode: (wc.opcode != OPCODE_UNSET).then_some(wc.opcode),
                    byte_len: wc.byte_len,
                    wc_flags: wc.wc_flags,
                    imm_or_rkey: wc.imm_data_invalidated_rkey_union.imm_data,
                    qp_num: wc.qp_num,
                }
            };
            f(raw);
        }
        Ok(got)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // After every QP that uses it (they hold an Arc), before the device.
        // SAFETY: created by ibv_create_cq, destroyed once, no QP attached any more.
        let ret = unsafe { ffi::ibv_destroy_cq(self.raw) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_destroy_cq failed");
        }
    }
}

struct Qp {
    raw: *mut ffi::ibv_qp,
    caps: QpCaps,
    send_wrs: Box<[ffi::ibv_send_wr]>,
    send_sges: Box<[ffi::ibv_sge]>,
    recv_wrs: Box<[ffi::ibv_recv_wr]>,
    recv_sges: Box<[ffi::ibv_sge]>,
    wcs: PollBuf,
    // Dropped only after rdma_destroy_qp (Endpoint::drop): the CQ (when this was its
    // last queue pair), then the PD.
    cq: Arc<Cq>,
    _pd: Arc<Pd>,
}

impl Qp {
    /// Posts `reqs` (at most [`MAX_CHAIN`], each within the QP's SGE limit) as one chain,
    /// each SGE's key as `lkey` gives it. A request with a key `lkey` does not know is
    /// refused (`EINVAL`), with the ones before it posted.
    fn post_chain(
        &mut self,
        reqs: &[SendReq<'_>],
        lkey: &mut dyn FnMut(u32) -> Option<u32>,
    ) -> Result<(), PostFailure> {
        let mut n = reqs.len().min(MAX_CHAIN);
        let mut unknown_key = false;
        let per = self.caps.max_send_sge.max(1) as usize;
        let wr_base = self.send_wrs.as_mut_ptr();
        let sge_base = self.send_sges.as_mut_ptr();
        'reqs: for (i, req) in reqs[..n].iter().enumerate() {
            for (j, s) in req.sges.iter().take(per).enumerate() {
                let Some(key) = lkey(s.lkey) else {
                    n = i;
                    unknown_key = true;
                    break 'reqs;
                };
                let sge = ffi::ibv_sge {
                    addr: s.addr,
                    length: s.len,
                    lkey: key,
                };
                // SAFETY: i < MAX_CHAIN and j < per, so the slot is inside `send_sges`.
                unsafe { sge_base.add(i * per + j).write(sge) };
            }
            let next = if i + 1 < n {
                // SAFETY: i + 1 < n <= MAX_CHAIN: inside `send_wrs`.
                unsafe { wr_base.add(i + 1) }
            } else {
                ptr::null_mut()
            };
            // SAFETY: the SGE slots of request i start inside `send_sges`.
            let sg_list = unsafe { sge_base.add(i * per) };
            let wr = build_send_wr(req, next, sg_list);
            // SAFETY: i < MAX_CHAIN: inside `send_wrs`.
            unsafe { wr_base.add(i).write(wr) };
        }
        // The last request built links to the one that was refused: end the chain there.
        if n > 0 && unknown_key {
            // SAFETY: n - 1 < MAX_CHAIN: inside `send_wrs`, written above.
            unsafe { (*wr_base.add(n - 1)).next = ptr::null_mut() };
        }
        if n == 0 {
            return if unknown_key {
                Err(PostFailure {
                    index: 0,
                    errno: libc::EINVAL,
                })
            } else {
                Ok(())
            };
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chain of `n` requests and their SGE lists are fully
        // initialised in our arrays; the provider copies them before returning. The
        // memory they name is the caller's registered memory.
        let ret = unsafe { ffi::ibv_post_send(self.raw, wr_base, &mut bad) };
        let accepted = if ret == 0 {
            n
        } else {
            bad_index(bad, wr_base, n)
        };
        for req in &reqs[..accepted] {
            if let SendReqOp::BindMw { mw, mr, rkey, .. } = req.op {
                mw.set_rkey(rkey);
                mw.hold(mr);
            }
        }
        if ret != 0 {
            return Err(PostFailure {
                index: accepted,
                errno: errno_of(ret),
            });
        }
        if unknown_key {
            return Err(PostFailure {
                index: n,
                errno: libc::EINVAL,
            });
        }
        Ok(())
    }
}

/// A cm_id with, once created, its queue pair and completion queue.
pub(in crate::fabric::verbs) struct Endpoint {
    qp: Option<Qp>,
    id: CmId,
}

// SAFETY: the QP, CQ and arrays are reached only through `&mut self` (one thread at a
// time); verbs objects may be used from any thread.
unsafe impl Send for Endpoint {}

/// Types for which all-zero bytes are a valid value.
///
/// # Safety
/// Implement only for types made of integers, raw pointers and unions of those.
unsafe trait ZeroValid {}
// SAFETY: C structs of integers, raw pointers and unions of those.
unsafe impl ZeroValid for ffi::ibv_send_wr {}
// SAFETY: as above.
unsafe impl ZeroValid for ffi::ibv_recv_wr {}
// SAFETY: as above.
unsafe impl ZeroValid for ffi::ibv_sge {}
// SAFETY: as above.
unsafe impl ZeroValid for ffi::ibv_wc {}

fn zeroed_slice<T: ZeroValid>(n: usize) -> Box<[T]> {
    // SAFETY: `T: ZeroValid`.
    (0..n).map(|_| unsafe { mem::zeroed::<T>() }).collect()
}

impl Endpoint {
    pub fn new(id: CmId) -> Endpoint {
        Endpoint { qp: None, id }
    }

    pub fn id(&self) -> &CmId {
        &self.id
    }

    pub fn has_qp(&self) -> bool {
        self.qp.is_some()
    }

    /// Creates the RC queue pair through `rdma_create_qp`, on `shared` or on a CQ of its
    /// own (sized for both queues, at most `max_cqe`); returns the capacities to use.
    /// Fails when the cm_id is bound to another device than `pd`'s.
    pub fn create_qp(
        &mut self,
        pd: &Arc<Pd>,
        caps: QpCaps,
        max_cqe: u32,
        shared: Option<&Arc<Cq>>,
    ) -> Result<QpCaps, SysError> {
        if self.qp.is_some() {
            return Err(SysError::invalid(
                "rdma_create_qp",
                "the queue pair already exists",
            ));
        }
        match self.id.is_on(pd.device()) {
            Some(true) => {}
            Some(false) => {
                return Err(SysError::invalid(
                    "rdma_create_qp",
                    "the connection was routed through another RDMA device than the fabric's",
                ))
            }
            None => {
                return Err(SysError::invalid(
                    "rdma_create_qp",
                    "the cm_id is bound to no device",
                ))
            }
        }
        let cq = match shared {
            Some(cq) if Arc::ptr_eq(&cq._dev, pd.device()) => cq.clone(),
            Some(_) => {
                return Err(SysError::invalid(
                    "rdma_create_qp",
                    "the completion queue belongs to another device context",
                ))
            }
            None => Cq::create(
                pd,
                caps.max_send_wr.saturating_add(caps.max_recv_wr),
                max_cqe,
            )?,
        };
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.raw,
            recv_cq: cq.raw,
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                max_recv_wr: caps.max_recv_wr,
                max_send_sge: caps.max_send_sge,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: id, PD and CQ are live and of the same context (checked above); `attr`
        // is valid and receives the granted capacities.
        let ret = unsafe { ffi::rdma_create_qp(self.id.raw, pd.raw, &mut attr) };
        if ret != 0 {
            return Err(SysError::last("rdma_create_qp"));
        }
        // SAFETY: a successful rdma_create_qp stored the new QP in the id.
        let raw = unsafe { (*self.id.raw).qp };
        // Providers grant at least what was asked. Report (and enforce) exactly that:
        // the CQ was sized from it, so using more send or receive slots could overrun it.
        let granted = caps;
        let per = granted.max_send_sge.max(1) as usize;
        self.qp = Some(Qp {
            raw,
            caps: granted,
            send_wrs: zeroed_slice(MAX_CHAIN),
            send_sges: zeroed_slice(MAX_CHAIN * per),
            recv_wrs: zeroed_slice(MAX_CHAIN),
            recv_sges: zeroed_slice(MAX_CHAIN),
            wcs: PollBuf::new(),
            cq,
            _pd: pd.clone(),
        });
        Ok(granted)
    }

    /// The queue pair to post on; `ENOTCONN` for the first request before it exists.
    fn posting_qp(&mut self) -> Result<&mut Qp, PostFailure> {
        self.qp.as_mut().ok_or(PostFailure {
            index: 0,
            errno: libc::ENOTCONN,
        })
    }

    /// Posts up to [`MAX_CHAIN`] send requests as one chain. A request with more SGEs
    /// than the QP allows is refused (with the ones before it posted). Windows bound by
    /// accepted requests record their new key and hold the region they were bound over.
    pub fn post_send(
        &mut self,
        reqs: &[SendReq<'_>],
        lkey: &mut dyn FnMut(u32) -> Option<u32>,
    ) -> Result<(), PostFailure> {
        let qp = self.posting_qp()?;
        let per = qp.caps.max_send_sge.max(1) as usize;
        let n = reqs
            .iter()
            .take(MAX_CHAIN)
            .position(|r| r.sges.len() > per)
            .unwrap_or(reqs.len().min(MAX_CHAIN));
        qp.post_chain(&reqs[..n], lkey)?;
        if n < reqs.len() {
            let errno = if n < MAX_CHAIN {
                libc::EINVAL
            } else {
                libc::E2BIG
            };
            return Err(PostFailure { index: n, errno });
        }
        Ok(())
    }

    /// Posts up to [`MAX_CHAIN`] receives as one chain, each SGE's key as `lkey` gives
    /// it; a receive with a key `lkey` does not know is refused (`EINVAL`), with the ones
    /// before it posted.
    pub fn post_recv(
        &mut self,
        wrs: &[RecvWr],
        lkey: &mut dyn FnMut(u32) -> Option<u32>,
    ) -> Result<(), PostFailure> {
        let qp = self.posting_qp()?;
        let mut n = wrs.len().min(MAX_CHAIN);
        if let Some(bad) = wrs[..n]
            .iter()
            .position(|w| w.sge.is_some_and(|s| lkey(s.lkey).is_none()))
        {
            n = bad;
        }
        let unknown_key = n < wrs.len().min(MAX_CHAIN);
        let wr_base = qp.recv_wrs.as_mut_ptr();
        let sge_base = qp.recv_sges.as_mut_ptr();
        for (i, w) in wrs[..n].iter().enumerate() {
            let (sg_list, num_sge) = match w.sge {
                Some(s) => {
                    let sge = ffi::ibv_sge {
                        addr: s.addr,
                        length: s.len,
                        lkey: lkey(s.lkey).unwrap_or(s.lkey),
                    };
                    // SAFETY: i < MAX_CHAIN: inside `recv_sges`.
                    unsafe { sge_base.add(i).write(sge) };
                    // SAFETY: as above.
                    (unsafe { sge_base.add(i) }, 1)
                }
                None => (ptr::null_mut(), 0),
            };
            let next = if i + 1 < n {
                // SAFETY: i + 1 < n <= MAX_CHAIN: inside `recv_wrs`.
                unsafe { wr_base.add(i + 1) }
            } else {
                ptr::null_mut()
            };
            let wr = ffi::ibv_recv_wr {
                wr_id: w.wr_id,
                next,
                sg_list,
                num_sge,
            };
            // SAFETY: i < MAX_CHAIN: inside `recv_wrs`.
            unsafe { wr_base.add(i).write(wr) };
        }
        if n > 0 {
            let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
            // SAFETY: the QP is live; the chain is initialised in our arrays and copied
            // by the provider; the buffers are the caller's registered memory.
            let ret = unsafe { ffi::ibv_post_recv(qp.raw, wr_base, &mut bad) };
            if ret != 0 {
                return Err(PostFailure {
                    index: bad_index(bad, wr_base, n),
                    errno: errno_of(ret),
                });
            }
        }
        if unknown_key {
            return Err(PostFailure {
                index: n,
                errno: libc::EINVAL,
            });
        }
        if n < wrs.len() {
            return Err(PostFailure {
                index: n,
                errno: libc::E2BIG,
            });
        }
        Ok(())
    }

    /// Polls up to `max` completions (at most one batch) of the queue pair's own CQ and
    /// hands each to `f`.
    pub fn poll_cq(&mut self, max: usize, f: impl FnMut(RawWc)) -> Result<usize, SysError> {
        let Some(qp) = self.qp.as_mut() else {
            return Ok(0);
        };
        qp.cq.poll(&mut qp.wcs, max, f)
    }

    /// The queue pair's number, once it exists.
    pub fn qp_num(&self) -> Option<u32> {
        // SAFETY: the QP is live while `self.qp` holds it.
        self.qp.as_ref().map(|qp| unsafe { (*qp.raw).qp_num })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(qp) = self.qp.take() {
            // The QP first; then (dropping `qp`) its CQ and the PD reference; the cm_id
            // and its channel go after this function, as fields.
            // SAFETY: the QP was created on this id by rdma_create_qp; destroyed once.
            unsafe { ffi::rdma_destroy_qp(self.id.raw) };
            drop(qp);
        }
    }
}

fn build_send_wr(
    req: &SendReq<'_>,
    next: *mut ffi::ibv_send_wr,
    sg_list: *mut ffi::ibv_sge,
) -> ffi::ibv_send_wr {
    use ffi::ibv_wr_opcode::*;
    let mut opcode = IBV_WR_SEND;
    let mut ex = 0u32; // imm_data (network order) or the rkey to invalidate
    let mut rdma = ffi::rdma_t {
        remote_addr: 0,
        rkey: 0,
    };
    let mut bind = ffi::bind_mw_t {
        mw: ptr::null_mut(),
        rkey: 0,
        bind_info: ffi::ibv_mw_bind_info {
            mr: ptr::null_mut(),
            addr: 0,
            length: 0,
            mw_access_flags: 0,
        },
    };
    let mut num_sge = req.sges.len() as libc::c_int;
    match req.op {
        SendReqOp::Send => {}
        SendReqOp::SendWithImm(imm) => (opcode, ex) = (IBV_WR_SEND_WITH_IMM, imm.to_be()),
        SendReqOp::SendWithInv(rkey) => (opcode, ex) = (IBV_WR_SEND_WITH_INV, rkey),
        SendReqOp::Write { remote_addr, rkey } => {
            opcode = IBV_WR_RDMA_WRITE;
            rdma = ffi::rdma_t { remote_addr, rkey };
        }
        SendReqOp::WriteWithImm {
            remote_addr,
            rkey,
            imm,
        } => {
            (opcode, ex) = (IBV_WR_RDMA_WRITE_WITH_IMM, imm.to_be());
            rdma = ffi::rdma_t { remote_addr, rkey };
        }
        SendReqOp::BindMw {
            mw,
            mr,
            addr,
            len,
            access,
            rkey,
        } => {
            opcode = IBV_WR_BIND_MW;
            num_sge = 0;
            bind = ffi::bind_mw_t {
                mw: mw.raw,
                rkey,
                bind_info: ffi::ibv_mw_bind_info {
                    mr: mr.raw,
                    addr,
                    length: len,
                    mw_access_flags: access,
                },
            };
        }
        SendReqOp::Invalidate(mw) if mw.kind() == WindowKind::Type1 => {
            opcode = IBV_WR_BIND_MW;
            num_sge = 0;
            bind.mw = mw.raw;
            bind.rkey = mw.rkey();
            // Checked by the caller: a type-1 window is unbound only after a binding.
            bind.bind_info.mr = mw.bound_mr().unwrap_or(ptr::null_mut());
        }
        SendReqOp::Invalidate(mw) => {
            (opcode, ex) = (IBV_WR_LOCAL_INV, mw.rkey());
            num_sge = 0;
        }
    }
    let flags = if req.signaled {
        ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
    } else {
        0
    };
    ffi::ibv_send_wr {
        wr_id: req.wr_id,
        next,
        sg_list: if num_sge == 0 {
            ptr::null_mut()
        } else {
            sg_list
        },
        num_sge,
        opcode,
        send_flags: flags,
        imm_data_invalidated_rkey_union: ffi::imm_data_invalidated_rkey_union_t { imm_data: ex },
        wr: ffi::wr_t { rdma },
        qp_type: ffi::qp_type_t {
            xrc: ffi::xrc_t { remote_srqn: 0 },
        },
        bind_mw_tso_union: ffi::bind_mw_tso_union_t { bind_mw: bind },
    }
}

/// Index of `bad` in a chain starting at `base`; 0 when the provider named none.
fn bad_index<T>(bad: *mut T, base: *mut T, n: usize) -> usize {
    if bad.is_null() {
        return 0;
    }
    let off = (bad as usize).wrapping_sub(base as usize) / mem::size_of::<T>();
    off.min(n)
}

/// The errno of a failed post: providers return it, or return -1 and set errno.
fn errno_of(ret: libc::c_int) -> i32 {
    if ret > 0 {
        ret
    } else {
        std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL)
    }
}
