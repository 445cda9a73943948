//! One verbs connection (the kernel's `rtrs_con` with its `rdma_cm_id`, QP and CQ): the
//! [`Conn`] trait over an [`Endpoint`], driven by polling its own rdma_cm event channel.
//! Its CQ is its own, or shared (`cq.rs`): then its queue shadow lives with the CQ.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::cm::{self, CmPhase, Step};
use super::cq::{shadow, CqShare, ShadowCell};
use super::keys::{LkeyCache, Regions};
use super::slots::{self, QueueSlots};
use super::sys::{
    self, CmId, Endpoint, EventChannel, MemWindow, SendReq, SendReqOp, WindowKind, MAX_CHAIN,
};
use super::{wc, Domain, Shared};
use crate::fabric::SetupCause;
use crate::fabric::{
    CmEvent, Conn, ConnState, FabricError, Hca, PostError, PostErrorKind, PrivateData, QpCaps,
    RecvWr, SendOp, SendWr, Sge, Wc,
};

/// Address and route resolution timeout (the kernel's `RTRS_CONNECT_TIMEOUT_MS`).
const RESOLVE_TIMEOUT_MS: i32 = 30_000;
/// Transport and RNR retries on connect and accept; 7 RNR retries means for ever.
const RETRY_COUNT: u8 = 7;
const RNR_RETRY_COUNT: u8 = 7;

pub(super) struct VerbsConn {
    /// The fabric's devices in this connection's domain (the active side picks its
    /// device among them once the address is resolved).
    dom: Arc<Domain>,
    /// The device the connection lives on (device 0 until an active connection's
    /// address is resolved).
    shared: Arc<Shared>,
    /// The SGE keys on that device.
    lkeys: LkeyCache,
    ep: Endpoint,
    /// Active side: where we connect to (for messages and before the CM knows it).
    dst: Option<SocketAddr>,
    caps: QpCaps,
    private_data: PrivateData,
    phase: CmPhase,
    passive: bool,
    /// An event decided outside `poll_cm` (local disconnect, failure), reported next.
    pending: Option<CmEvent>,
    /// A failed `ibv_poll_cq` is logged once per connection, not per poll.
    poll_error_logged: bool,
    /// A post refused for another reason than a full queue or a broken connection is
    /// logged once per connection, with its cause (the layers above see only the kind).
    refusal_logged: bool,
    slots: Slots,
}

/// Where a connection's queue shadow lives.
pub(super) enum Slots {
    /// With the connection, whose CQ is its own.
    Own(QueueSlots),
    /// In a cell the shared CQ (`cq.rs`) finds by `qp_num`.
    Shared {
        share: Arc<CqShare>,
        cell: Arc<ShadowCell>,
    },
}

impl Slots {
    /// A shadow for a connection with queues of `caps`, on `cq` or on its own CQ.
    pub(super) fn new(cq: Option<&Arc<CqShare>>, caps: QpCaps) -> Result<Slots, Box<SetupCause>> {
        match cq {
            None => Ok(Slots::Own(QueueSlots::new(caps))),
            Some(s) if s.overrun.load(Ordering::Relaxed) => Err(SetupCause::refused(
                "the completion queue overran and is in error",
            )),
            Some(s) => Ok(Slots::Shared {
                share: s.clone(),
                cell: shadow(caps),
            }),
        }
    }

    /// The shared CQ's queue on the device of `shared`, or `None` for a connection with
    /// its own CQ; an error when that device has gone.
    pub(super) fn device_cq(&self, shared: &Shared) -> Result<Option<Arc<sys::Cq>>, String> {
        match self {
            Slots::Own(_) => Ok(None),
            Slots::Shared { share, .. } => share
                .device_cq(shared)
                .map(Some)
                .ok_or_else(|| format!("the RDMA device {} has gone", shared.pd.device().name())),
        }
    }

    /// Runs `f` on the shadow; `None` when another thread holds the connection.
    fn with<R>(&mut self, f: impl FnOnce(&mut QueueSlots) -> R) -> Option<R> {
        match self {
            Slots::Own(s) => Some(f(s)),
            Slots::Shared { cell, .. } => cell.with(|s| f(&mut s.slots)),
        }
    }

    /// The queue pair now has a number: completions find the shadow by it.
    fn bind(&self, device: u8, qp_num: Option<u32>) {
        if let (Slots::Shared { share, cell }, Some(n)) = (self, qp_num) {
            share.bind(device, n, cell);
        }
    }

    /// Whether the shared CQ saw a failed completion of ours, or overran (once each).
    fn take_failed(&self) -> bool {
        let Slots::Shared { share, cell } = self else {
            return false;
        };
        let overrun = share.overrun.load(Ordering::Relaxed);
        cell.with(|s| {
            let broke = !s.overrun_seen && overrun;
            s.overrun_seen |= overrun;
            std::mem::take(&mut s.failed) || broke
        })
        .unwrap_or(false)
    }

    fn release(&self) {
        if let Slots::Shared { cell, .. } = self {
            cell.release();
        }
    }
}

impl VerbsConn {
    /// Starts an active connection: own event channel, cm_id, `rdma_resolve_addr`.
    pub fn connect(
        dom: Arc<Domain>,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        caps: QpCaps,
        private_data: PrivateData,
        cq: Option<&Arc<CqShare>>,
    ) -> Result<VerbsConn, FabricError> {
        let err = |e: super::sys::SysError| FabricError::Connect {
            addr: dst,
            cause: e.into(),
        };
        let slots = Slots::new(cq, caps).map_err(|cause| FabricError::Cq { cause })?;
        let channel = EventChannel::create().map_err(err)?;
        let id = CmId::create(&channel).map_err(err)?;
        // Until the address is resolved, any present device stands in.
        let shared = dom
            .present()
            .into_iter()
            .next()
            .ok_or_else(|| FabricError::Connect {
                addr: dst,
                cause: SetupCause::refused("no RDMA device is present now"),
            })?;
        id.resolve_addr(src, dst, RESOLVE_TIMEOUT_MS).map_err(err)?;
        Ok(VerbsConn {
            lkeys: LkeyCache::new(shared.index, shared.keys.clone()),
            dom,
            shared,
            ep: Endpoint::new(id),
            dst: Some(dst),
            caps,
            private_data,
            phase: CmPhase::ResolvingAddr,
            passive: false,
            pending: None,
            poll_error_logged: false,
            refusal_logged: false,
            slots,
        })
    }

    /// A passive connection whose QP exists (on the CQ of `slots`) and whose
    /// `rdma_accept` was issued.
    pub fn accepted(
        dom: Arc<Domain>,
        shared: Arc<Shared>,
        ep: Endpoint,
        caps: QpCaps,
        slots: Slots,
    ) -> VerbsConn {
        slots.bind(shared.index, ep.qp_num());
        VerbsConn {
            lkeys: LkeyCache::new(shared.index, shared.keys.clone()),
            dom,
            shared,
            ep,
            dst: None,
            caps,
            private_data: PrivateData::empty(),
            phase: CmPhase::Accepting,
            passive: true,
            pending: None,
            poll_error_logged: false,
            refusal_logged: false,
            slots,
        }
    }

    fn can_send(&self) -> bool {
        self.ep.has_qp() && matches!(self.phase, CmPhase::Accepting | CmPhase::Established)
    }

    fn can_recv(&self) -> bool {
        self.ep.has_qp() && !matches!(self.phase, CmPhase::Closing | CmPhase::Closed)
    }

    fn describe(&self) -> String {
        match (self.dst, self.peer_addr()) {
            (Some(dst), _) => format!("connect to {dst}"),
            (None, Some(peer)) => format!("connection from {peer}"),
            (None, None) => "connection".to_owned(),
        }
    }

    /// Ends the connection after a local failure; the event to report.
    fn fail(&mut self, reason: String) -> CmEvent {
        let was_up = !self.phase.before_established();
        self.phase = CmPhase::Closed;
        self.flush();
        if was_up {
            CmEvent::Disconnected
        } else {
            CmEvent::Error {
                reason: format!("{}: {reason}", self.describe()),
            }
        }
    }

    /// Moves the QP to the error state so everything outstanding completes as flushed.
    fn flush(&mut self) {
        if self.ep.has_qp() {
            // Fails harmlessly when the CM already considers the id disconnected; the
            // QP is moved to the error state before the CM call either way.
            let _ = self.ep.id().disconnect();
        }
    }

    fn handle(
        &mut self,
        kind: super::sys::CmEventKind,
        status: i32,
        data: PrivateData,
    ) -> Option<CmEvent> {
        if kind == super::sys::CmEventKind::DeviceRemoval && self.ep.id().is_bound() {
            // Every domain lets the device go, so that the kernel can finish removing it.
            self.dom.table.device_removed(
                self.shared.index,
                &self.shared.gone,
                "a connection saw RDMA_CM_EVENT_DEVICE_REMOVAL",
            );
        }
        let (phase, step) = cm::on_event(self.phase, kind, status, data, self.passive);
        self.phase = phase;
        match step {
            Step::Nothing => None,
            Step::CreateQpThenResolveRoute => {
                // The address is resolved: the connection lives on its device.
                let Some(shared) = self.dom.on(self.ep.id()) else {
                    return Some(self.fail(
                        "the address resolved to an RDMA device this fabric did not open".into(),
                    ));
                };
                if let Err(reason) = super::check_caps(&shared, self.caps) {
                    return Some(self.fail(format!("{} ({})", reason, shared.pd.device().name())));
                }
                if !Arc::ptr_eq(&shared, &self.shared) {
                    self.lkeys = LkeyCache::new(shared.index, shared.keys.clone());
                    self.shared = shared;
                }
                let cq = match self.slots.device_cq(&self.shared) {
                    Ok(cq) => cq,
                    Err(reason) => return Some(self.fail(reason)),
                };
                let res = self
                    .ep
                    .create_qp(
                        &self.shared.pd,
                        self.caps,
                        self.shared.attr.max_cqe,
                        cq.as_ref(),
                    )
                    .and_then(|granted| {
                        self.caps = granted;
                        self.slots.bind(self.shared.index, self.ep.qp_num());
                        self.ep.id().resolve_route(RESOLVE_TIMEOUT_MS)
                    });
                res.err().map(|e| self.fail(e.to_string()))
            }
            Step::Connect => {
                let res = self
                    .ep
                    .id()
                    .connect(&self.private_data, RETRY_COUNT, RNR_RETRY_COUNT);
                res.err().map(|e| self.fail(e.to_string()))
            }
            Step::Report(ev) => Some(ev),
            Step::FlushAndReport(ev) => {
                self.flush();
                Some(match ev {
                    CmEvent::Error { reason } => CmEvent::Error {
                        reason: format!("{}: {reason}", self.describe()),
                    },
                    other => other,
                })
            }
        }
    }

    /// After a failed completion: break the connection on both sides, as RTRS's error
    /// recovery does (the peer sees DISCONNECTED, outstanding work flushes here).
    fn on_cq_error(&mut self) {
        let (phase, disconnect, report) = cm::on_local_disconnect(self.phase);
        self.phase = phase;
        if disconnect {
            self.flush();
        }
        if report.is_some() && self.pending.is_none() {
            self.pending = report;
        }
    }

    /// Learns the keys (and the regions of bindings) that `wrs` name on this
    /// connection's device, before they are resolved.
    fn learn(&mut self, wrs: &[SendWr<'_>]) {
        let translates = self.lkeys.prepare();
        for wr in wrs {
            if translates {
                for sge in wr.sges {
                    self.lkeys.learn(sge.lkey);
                }
            }
            if let SendOp::RegMr { region, .. } = wr.op {
                if let Some(r) = region.handle().downcast_ref::<Regions>() {
                    self.lkeys.learn(r.id());
                }
            }
        }
    }

    /// One send request checked and resolved to our handles (the regions of bindings
    /// from `lkeys`, learnt before).
    fn resolve<'a>(
        caps: QpCaps,
        shared: &Shared,
        lkeys: &'a LkeyCache,
        wr: &SendWr<'a>,
    ) -> Result<SendReq<'a>, (PostErrorKind, &'static str)> {
        if wr.sges.len() > caps.max_send_sge as usize {
            return Err((
                PostErrorKind::TooManySge,
                "more SGEs than the queue pair takes",
            ));
        }
        let op = match wr.op {
            SendOp::Send => SendReqOp::Send,
            SendOp::SendWithImm { imm } => SendReqOp::SendWithImm(imm),
            SendOp::SendWithInv { rkey } => SendReqOp::SendWithInv(rkey),
            SendOp::RdmaWrite { remote_addr, rkey } => SendReqOp::Write { remote_addr, rkey },
            SendOp::RdmaWriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => SendReqOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            },
            SendOp::RegMr {
                slot,
                region,
                addr,
                len,
                access,
                rkey,
            } => {
                if !wr.sges.is_empty() {
                    return Err((PostErrorKind::TooManySge, "a REG_MR with SGEs"));
                }
                let mw = slot.handle().downcast_ref::<MemWindow>();
                let mr = region
                    .handle()
                    .downcast_ref::<Regions>()
                    .filter(|r| lkeys.is_of(&shared.keys) && r.is_of(&shared.keys))
                    .and_then(|r| lkeys.region(r.id()));
                let Some(mw) = mw else {
                    return Err((
                        PostErrorKind::Invalid,
                        "REG_MR of a slot not of this fabric",
                    ));
                };
                let Some(mr) = mr else {
                    return Err((
                        PostErrorKind::Invalid,
                        "REG_MR over a registration this domain has not on the connection's device",
                    ));
                };
                if !mw.is_in(&shared.pd) || !mr.is_in(&shared.pd) {
                    return Err((
                        PostErrorKind::Invalid,
                        "REG_MR of a slot or region of another device or protection domain",
                    ));
                }
                if u64::from(len) > shared.caps.max_mr_size {
                    return Err((
                        PostErrorKind::Invalid,
                        "REG_MR longer than the device's max_mr_size",
                    ));
                }
                let access = wc::mw_access(access);
                SendReqOp::BindMw {
                    mw,
                    mr,
                    addr,
                    len: u64::from(len),
                    access,
                    rkey,
                }
            }
            SendOp::LocalInv { slot } => {
                if !wr.sges.is_empty() {
                    return Err((PostErrorKind::TooManySge, "a LOCAL_INV with SGEs"));
                }
                match slot.handle().downcast_ref::<MemWindow>() {
                    // A type-1 window never bound has nothing to unbind (and its
                    // unbinding would name no region).
                    Some(mw) if mw.kind() == WindowKind::Type1 && mw.bound_mr().is_none() => {
                        return Err((PostErrorKind::Invalid, "LOCAL_INV of a slot never bound"))
                    }
                    Some(mw) if mw.is_in(&shared.pd) => SendReqOp::Invalidate(mw),
                    Some(_) => {
                        return Err((
                            PostErrorKind::Invalid,
                            "LOCAL_INV of a slot of another device or protection domain",
                        ))
                    }
                    None => {
                        return Err((
                            PostErrorKind::Invalid,
                            "LOCAL_INV of a slot not of this fabric",
                        ))
                    }
                }
            }
        };
        Ok(SendReq {
            wr_id: wr.wr_id,
            op,
            sges: wr.sges,
            signaled: wr.signaled,
        })
    }

    /// Logs (once per connection) why the provider or the key cache refused work
    /// request `index` of a post: an SGE key this domain has no registration for on the
    /// connection's device, or the provider's errno. Full queues and broken connections
    /// are the layers' own business and are not logged.
    fn log_refusal(
        &mut self,
        what: &str,
        index: usize,
        kind: PostErrorKind,
        errno: i32,
        sges: &[Sge],
    ) {
        if matches!(kind, PostErrorKind::QueueFull | PostErrorKind::NotConnected) {
            return;
        }
        let unknown = sges.iter().find(|s| self.lkeys.lkey(s.lkey).is_none());
        let cause = match unknown {
            Some(s) => format!(
                "SGE key {:#x}: this domain has no registration of that id on device {}",
                s.lkey,
                self.shared.pd.device().name()
            ),
            None => format!(
                "the provider refused it: {}",
                std::io::Error::from_raw_os_error(errno)
            ),
        };
        self.log_refused(index, kind, &format!("{what} post: {cause}"));
    }

    fn log_refused(&mut self, index: usize, kind: PostErrorKind, why: &str) {
        if self.refusal_logged {
            return;
        }
        self.refusal_logged = true;
        tracing::warn!(
            conn = %self.describe(),
            device = self.shared.pd.device().name(),
            "post refused at work request {index} ({kind:?}): {why}"
        );
    }
}

impl Conn for VerbsConn {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        if !self.can_send() {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::NotConnected,
            });
        }
        for (c, chunk) in wrs.chunks(MAX_CHAIN).enumerate() {
            let base = c * MAX_CHAIN;
            self.learn(chunk);
            let mut reqs = [SendReq::EMPTY; MAX_CHAIN];
            let mut bad = None;
            let mut n = 0;
            for wr in chunk {
                match Self::resolve(self.caps, &self.shared, &self.lkeys, wr) {
                    Ok(r) => {
                        reqs[n] = r;
                        n += 1;
                    }
                    Err(kind) => {
                        bad = Some(kind);
                        break;
                    }
                }
            }
            // Past the requested queue size the post is refused here, even where the
            // provider rounded the queue up.
            let Some(room) = self.slots.with(|s| s.send_room()) else {
                return Err(PostError {
                    index: base,
                    kind: PostErrorKind::WrongThread,
                });
            };
            let full = n > room;
            let n = n.min(room);
            let lkeys = &self.lkeys;
            let posted = self.ep.post_send(&reqs[..n], &mut |k| lkeys.lkey(k));
            let accepted = match posted {
                Ok(()) => n,
                Err(f) => f.index,
            };
            self.slots.with(|s| {
                for wr in &chunk[..accepted] {
                    s.sent(wr.wr_id, slots::send_opcode(&wr.op), wr.signaled);
                }
            });
            for wr in &chunk[..accepted] {
                // The slots of accepted bindings now carry their new keys.
                if let SendOp::RegMr { slot, rkey, .. } = wr.op {
                    slot.set_rkey(rkey);
                }
            }
            if let Err(f) = posted {
                let kind = wc::post_error_kind(f.errno);
                let sges = chunk.get(f.index).map_or(&[][..], |wr| wr.sges);
                self.log_refusal("send", base + f.index, kind, f.errno, sges);
                return Err(PostError {
                    index: base + f.index,
                    kind,
                });
            }
            if full {
                return Err(PostError {
                    index: base + n,
                    kind: PostErrorKind::QueueFull,
                });
            }
            if let Some((kind, why)) = bad {
                self.log_refused(base + n, kind, why);
                return Err(PostError {
                    index: base + n,
                    kind,
                });
            }
        }
        Ok(())
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        if !self.can_recv() {
            return Err(PostError {
                index: 0,
                kind: PostErrorKind::NotConnected,
            });
        }
        for (c, chunk) in wrs.chunks(MAX_CHAIN).enumerate() {
            let base = c * MAX_CHAIN;
            let Some(room) = self.slots.with(|s| s.recv_room()) else {
                return Err(PostError {
                    index: base,
                    kind: PostErrorKind::WrongThread,
                });
            };
            let n = chunk.len().min(room);
            if self.lkeys.prepare() {
                for sge in chunk[..n].iter().filter_map(|w| w.sge) {
                    self.lkeys.learn(sge.lkey);
                }
            }
            let lkeys = &self.lkeys;
            let posted = self.ep.post_recv(&chunk[..n], &mut |k| lkeys.lkey(k));
            let accepted = match posted {
                Ok(()) => n,
                Err(f) => f.index,
            };
            self.slots.with(|s| {
                for w in &chunk[..accepted] {
                    s.recv_posted(w.wr_id);
                }
            });
            if let Err(f) = posted {
                let kind = wc::post_error_kind(f.errno);
                let sge = chunk.get(f.index).and_then(|w| w.sge);
                self.log_refusal("receive", base + f.index, kind, f.errno, sge.as_slice());
                return Err(PostError {
                    index: base + f.index,
                    kind,
                });
            }
            if n < chunk.len() {
                return Err(PostError {
                    index: base + n,
                    kind: PostErrorKind::QueueFull,
                });
            }
        }
        Ok(())
    }

    fn poll_cq(&mut self, wcs: &mut [Wc]) -> usize {
        let Slots::Own(slots) = &mut self.slots else {
            // The completions are the shared CQ's; it may have seen one of ours fail.
            if self.slots.take_failed() {
                self.on_cq_error();
            }
            return 0;
        };
        let mut filled = 0;
        let mut failed = false;
        let shared = &self.shared;
        while filled < wcs.len() {
            let out = &mut wcs[filled..];
            let mut k = 0;
            let res = self.ep.poll_cq(out.len(), |raw| {
                let mut w = wc::completion(&raw);
                w.qp_num = shared.tag(w.qp_num);
                slots.completed(&mut w, raw.opcode.is_some());
                failed |= !w.status.is_ok();
                out[k] = w;
                k += 1;
            });
            match res {
                Ok(0) => break,
                Ok(got) => filled += got,
                Err(e) => {
                    if !self.poll_error_logged {
                        self.poll_error_logged = true;
                        tracing::error!(conn = %self.describe(), "{e}");
                    }
                    break;
                }
            }
        }
        if failed {
            self.on_cq_error();
        }
        filled
    }

    fn poll_cm(&mut self) -> Option<CmEvent> {
        if self.slots.take_failed() {
            self.on_cq_error();
        }
        if self.ep.has_qp() && self.shared.is_gone() && self.phase != CmPhase::Closed {
            let name = self.shared.pd.device().name().to_owned();
            return Some(self.fail(format!("the RDMA device {name} has gone")));
        }
        if let Some(ev) = self.pending.take() {
            return Some(ev);
        }
        loop {
            let next = self.ep.id().channel().next_event();
            match next {
                Ok(None) => return None,
                Ok(Some(raw)) => {
                    if let Some(ev) = self.handle(raw.kind, raw.status, raw.private_data) {
                        return Some(ev);
                    }
                }
                Err(e) => {
                    if self.phase == CmPhase::Closed {
                        return None;
                    }
                    return Some(self.fail(e.to_string()));
                }
            }
        }
    }

    fn disconnect(&mut self) {
        let (phase, disconnect, report) = cm::on_local_disconnect(self.phase);
        self.phase = phase;
        if disconnect {
            self.flush();
        }
        if report.is_some() {
            self.pending = report;
        }
    }

    fn state(&self) -> ConnState {
        match self.phase {
            CmPhase::Established => ConnState::Connected,
            CmPhase::Closing | CmPhase::Closed => ConnState::Disconnected,
            _ => ConnState::Connecting,
        }
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn qp_num(&self) -> u32 {
        self.ep.qp_num().map_or(0, |n| self.shared.tag(n))
    }

    fn release_thread(&self) {
        self.slots.release();
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.ep
            .id()
            .peer_addr()
            .filter(|a| !a.ip().is_unspecified())
            .or(self.dst)
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.ep
            .id()
            .local_addr()
            .filter(|a| !a.ip().is_unspecified())
    }

    fn device_index(&self) -> u8 {
        self.shared.index
    }

    fn hca(&self) -> Option<Hca> {
        // Known once the address is resolved (the queue pair exists from then on).
        self.ep.has_qp().then(|| Hca {
            index: self.shared.index,
            name: Arc::from(self.shared.pd.device().name()),
            port: self.ep.id().port(),
        })
    }
}
