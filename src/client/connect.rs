//! Bringing a client path up (the kernel's `init_path`, `init_conns`,
//! `create_con_cq_qp`, `rtrs_rdma_conn_established`, `rtrs_send_path_info` and
//! `rtrs_clt_rdma_done` for INFO_RSP; docs/PROTOCOL.md §3.2, §3.6, §4.6, §9.2, §9.4): the
//! connections one after the other (cid 0 first: its REP carries the queue depth that
//! sizes the others), INFO_REQ/INFO_RSP on cid 0, the receives (2×512 on cid 0, 2×qd on
//! the others, empty or 8-byte buffers under NEW_RKEY_F), and the hand-over of
//! connection `k+1` to core `k`. A failure at any step schedules a reconnect.

use crate::fabric::ConnectOptions;
use std::sync::atomic::Ordering;

use super::cross_core::{IoConn, PathCmd, SessShared, SessionParams};
use super::ctl::{ns, Ctl, PathCtl, PathProgress};
use super::refusal::{reject_kind, reject_reason, RejectKind};
use super::state::PathState;
use crate::common::{IuPool, LinkEvent, RtrsCon};
use crate::engine::Ctx;
use crate::fabric::{
    Access, CmEvent, Conn, Fabric, FabricError, QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode,
};
use crate::proto::constants::SERVICE_CON_QUEUE_DEPTH;
use crate::proto::{ConnAccept, ConnReq, ConnRsp, InfoReq, InfoRsp, RkeyRsp};
use crate::sync::lock;

/// How long a path waits at most for another path to create the server session
/// ([`Ctl::start_connect`]).
pub(super) const HOLD_AT_MOST: std::time::Duration = std::time::Duration::from_secs(2);

impl Ctl {
    pub(super) fn caps(&self, cid0: bool, qd: u16) -> QpCaps {
        let f = self.fabric.caps();
        let (s, r, sge) = if cid0 {
            let n = 2 * SERVICE_CON_QUEUE_DEPTH + 2;
            (n, n, 1)
        } else {
            let qd = u32::from(qd);
            (4 * qd + 1, 3 * qd + 1, 2)
        };
        QpCaps {
            max_send_wr: s.min(f.max_send_wr),
            max_recv_wr: r.min(f.max_recv_wr),
            max_send_sge: sge.min(f.max_send_sge),
        }
    }

    pub(super) fn conn_req(&self, pc: &PathCtl, cid: u16) -> [u8; ConnReq::LEN] {
        ConnReq::new(
            cid,
            self.cid_num(),
            pc.recon_cnt,
            pc.sess_uuid,
            self.paths_uuid,
            pc.for_new_clt,
        )
        .to_bytes()
        .expect("cid < cid_num <= 4096 checked at open")
    }

    /// Whether another path may be creating the server session now: no path is up,
    /// and a path that may create it (`first_conn`) has its first connection under way,
    /// not yet accepted. (`pc`, the path asking, is out of `paths` meanwhile.)
    fn session_being_created(&self) -> bool {
        self.up == 0 && self.paths[..self.slots_hi].iter().flatten().any(|p| {
            p.for_new_clt
                && matches!(&p.phase, PathProgress::Connecting { conns, .. } if conns.is_empty())
        })
    }

    /// Starts connecting `pc` (its cid 0), or holds it ([`PathProgress::Held`]) while
    /// another path creates the server session: a session's paths create it one at a
    /// time, as the kernel's client does (it brings its paths up one after the other).
    /// The kernel's server looks a session up by `paths_uuid` and, finding none, creates
    /// it without holding its lookup lock, so two first connections of one new session
    /// at once make two server sessions of the same name; Linux 6.1 then fails the
    /// second's sysfs folder and releases a reference twice (docs/INTEROP.md).
    ///
    /// The hold lasts [`HOLD_AT_MOST`] at the most: a first connection that has not been
    /// accepted by then has most likely been lost on the way (and a lost request races
    /// with nothing), and an unreachable path must not keep the others out for its whole
    /// connect timeout.
    pub(super) fn start_connect(&mut self, pc: &mut PathCtl, now: u64) {
        let hold = match pc.phase {
            PathProgress::Held { until } => now < until,
            _ => true,
        };
        if hold && pc.for_new_clt && self.session_being_created() {
            if !matches!(pc.phase, PathProgress::Held { .. }) {
                tracing::debug!(sess = %self.sess.sessname, path = %pc.shared.addr, "held until another path has created the server session");
                pc.phase = PathProgress::Held {
                    until: now.saturating_add(ns(HOLD_AT_MOST)),
                };
            }
            return;
        }
        pc.recon_cnt = pc.recon_cnt.wrapping_add(1);
        pc.attempts = pc.attempts.saturating_add(1);
        let pd = self.conn_req(pc, 0);
        match self.fabric.connect(
            pc.shared.addr.dst,
            &ConnectOptions::new(self.caps(true, 0), &pd)
                .from(pc.shared.addr.src)
                .psk(pc.shared.psk.as_ref()),
        ) {
            Ok(cur) => {
                pc.phase = PathProgress::Connecting {
                    conns: Vec::with_capacity(usize::from(self.cid_num())),
                    cur,
                    cur_on_cq: false,
                    acc: None,
                    deadline: now.saturating_add(ns(self.cfg.connect_timeout)),
                };
            }
            Err(e @ FabricError::AuthUnsupported { .. }) => {
                self.path_refused(pc, 0, &e.to_string())
            }
            Err(e) => self.connect_failed(pc, now, &format!("connect cid 0: {e}")),
        }
    }

    /// The path cannot connect as configured, and trying again would fail the same way
    /// (authentication failed): it is closed without a reconnect, and the reason is kept
    /// for the user ([`super::ClientSession::path_failure`]) until a manual reconnect.
    pub(super) fn path_refused(&mut self, pc: &mut PathCtl, cid: u16, why: &str) {
        tracing::warn!(sess = %self.sess.sessname, path = %pc.shared.addr, "connecting cid {cid} failed: {why}; the path is closed (no reconnect)");
        if let PathProgress::Connecting { conns, cur, .. } = &mut pc.phase {
            cur.disconnect();
            conns.iter_mut().for_each(RtrsCon::disconnect);
        }
        *lock(&pc.shared.failure) = Some(why.to_string());
        *lock(&pc.shared.last_error) = Some(why.to_string());
        pc.failed_in_row = pc.failed_in_row.saturating_add(1);
        pc.shared
            .home
            .reconnect_fail
            .fetch_add(1, Ordering::Relaxed);
        let _ = pc.shared.state.change(PathState::ConnectingErr);
        self.close_now(pc);
    }

    /// The connect sequence failed: clean up and schedule the next attempt.
    pub(super) fn connect_failed(&mut self, pc: &mut PathCtl, now: u64, why: &str) {
        tracing::warn!(sess = %self.sess.sessname, path = %pc.shared.addr, "connecting failed: {why}");
        pc.refused = None;
        *lock(&pc.shared.last_error) = Some(why.to_string());
        if let PathProgress::Connecting { conns, cur, .. } = &mut pc.phase {
            cur.disconnect();
            conns.iter_mut().for_each(RtrsCon::disconnect);
        } else if let PathProgress::Info { conns, .. } = &mut pc.phase {
            conns.iter_mut().for_each(RtrsCon::disconnect);
        }
        pc.phase = PathProgress::Idle;
        pc.failed_in_row = pc.failed_in_row.saturating_add(1);
        pc.shared
            .home
            .reconnect_fail
            .fetch_add(1, Ordering::Relaxed);
        let _ = pc.shared.state.change(PathState::ConnectingErr);
        let _ = pc.shared.state.change(PathState::Reconnecting);
        self.schedule_reconnect(pc, now, false);
    }

    pub(super) fn drive_connecting(&mut self, pc: &mut PathCtl, now: u64) -> bool {
        let PathProgress::Connecting {
            conns,
            cur,
            acc,
            deadline,
            ..
        } = &mut pc.phase
        else {
            return false;
        };
        let Some(ev) = cur.poll_cm() else {
            if now > *deadline {
                let cid = conns.len();
                self.connect_failed(
                    pc,
                    now,
                    &format!("cid {cid}: no answer within the connect timeout"),
                );
                return true;
            }
            return false;
        };
        let cid = conns.len() as u16;
        let pd = match ev {
            CmEvent::Established { private_data } => private_data,
            CmEvent::Rejected { private_data } => {
                let errno = ConnRsp::refusal(private_data.as_bytes());
                let permanent = reject_kind(errno) == RejectKind::Permanent;
                pc.shared.target_refused.store(permanent, Ordering::Release);
                self.connect_failed(
                    pc,
                    now,
                    &format!(
                        "cid {cid}: target refused the connection: {}",
                        reject_reason(errno)
                    ),
                );
                if permanent {
                    pc.refused = Some(errno);
                }
                return true;
            }
            CmEvent::Error { reason } => {
                pc.shared.target_refused.store(false, Ordering::Release);
                self.connect_failed(pc, now, &format!("cid {cid}: {reason}"));
                return true;
            }
            CmEvent::AuthFailed { reason } => {
                self.path_refused(pc, cid, &reason);
                return true;
            }
            CmEvent::Disconnected => {
                self.connect_failed(
                    pc,
                    now,
                    &format!("cid {cid}: disconnected while connecting"),
                );
                return true;
            }
        };
        let a = match ConnRsp::decode_accept(pd.as_bytes(), 0) {
            Ok(a) => a,
            Err(e) => {
                self.connect_failed(pc, now, &format!("cid {cid}: bad conn_rsp: {e}"));
                return true;
            }
        };
        let mismatch = match acc {
            Some(first) if a != *first => Some(format!("cid {cid}: conn_rsp {a:?} differs from cid 0's {first:?}")),
            Some(_) => None,
            None => match self.params {
                Some(p)
                    if (p.queue_depth != a.queue_depth
                        || p.max_io_size != a.max_io_size
                        || p.max_hdr_size != a.max_hdr_size
                        || p.new_rkey != a.new_rkey)
                        && self.up > 0 =>
                {
                    Some(format!("server offers {a:?}, other paths use queue depth {}; waiting until they are gone to re-negotiate", p.queue_depth))
                }
                _ => None,
            },
        };
        if let Some(why) = mismatch {
            self.connect_failed(pc, now, &why);
            return true;
        }
        let PathProgress::Connecting {
            conns,
            cur,
            cur_on_cq,
            acc,
            ..
        } = &mut pc.phase
        else {
            return false;
        };
        if acc.is_none() {
            if self.params.is_some_and(|p| p.queue_depth != a.queue_depth) {
                tracing::info!(sess = %self.sess.sessname, path = %pc.shared.addr, "queue depth changed to {}: re-negotiating", a.queue_depth);
            }
            *acc = Some(a);
            pc.for_new_clt = true;
        }
        let conn = std::mem::replace(cur, Box::new(NoConn));
        conns.push(if std::mem::take(cur_on_cq) {
            RtrsCon::on_shared_cq(cid, conn, a.signal_interval())
        } else {
            RtrsCon::new(cid, conn, a.signal_interval())
        });
        let next = cid + 1;
        if next < self.cid_num() {
            let req = ConnReq::new(
                next,
                self.cid_num(),
                pc.recon_cnt,
                pc.sess_uuid,
                self.paths_uuid,
                pc.for_new_clt,
            )
            .to_bytes()
            .expect("valid cid");
            match connect_io(
                &*self.fabric,
                &self.sess,
                pc,
                next,
                self.caps(false, a.queue_depth),
                &req,
            ) {
                Ok((c, on_cq)) => {
                    if let PathProgress::Connecting { cur, cur_on_cq, .. } = &mut pc.phase {
                        *cur = c;
                        *cur_on_cq = on_cq;
                    }
                }
                Err(e @ FabricError::AuthUnsupported { .. }) => {
                    self.path_refused(pc, next, &e.to_string())
                }
                Err(e) => self.connect_failed(pc, now, &format!("connect cid {next}: {e}")),
            }
            return true;
        }
        let PathProgress::Connecting { conns, .. } =
            std::mem::replace(&mut pc.phase, PathProgress::Idle)
        else {
            unreachable!("phase checked above")
        };
        self.start_info(pc, conns, a, now);
        true
    }

    pub(super) fn start_info(
        &mut self,
        pc: &mut PathCtl,
        mut conns: Vec<RtrsCon>,
        acc: ConnAccept,
        now: u64,
    ) {
        let f = &*self.fabric;
        let rsp = IuPool::new(
            f,
            1,
            InfoRsp::wire_len(acc.queue_depth),
            Access::LOCAL_WRITE,
        );
        let req = IuPool::new(f, 1, InfoReq::LEN, Access::LOCAL_WRITE);
        let (rsp, req) = match (rsp, req) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                let e = a
                    .err()
                    .or(b.err())
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                pc.phase = PathProgress::Connecting {
                    conns,
                    cur: Box::new(NoConn),
                    cur_on_cq: false,
                    acc: None,
                    deadline: 0,
                };
                self.connect_failed(pc, now, &format!("INFO buffers: {e}"));
                return;
            }
        };
        let mut buf = [0u8; InfoReq::LEN];
        let posted = InfoReq::new(&self.sess.sessname)
            .encode(&mut buf)
            .map_err(|e| e.to_string())
            .and_then(|_| {
                req.write(0, &buf);
                conns[0]
                    .post_recv(&[rsp.recv_wr(0, 0)])
                    .map_err(|e| e.to_string())?;
                conns[0]
                    .post_send(&[SendWr {
                        wr_id: 0,
                        op: SendOp::Send,
                        sges: &[req.sge(0, InfoReq::LEN)],
                        signaled: true,
                    }])
                    .map_err(|e| e.to_string())
            });
        pc.phase = PathProgress::Info {
            conns,
            acc,
            rsp,
            _req: req,
            deadline: now.saturating_add(ns(self.cfg.connect_timeout)),
        };
        if let Err(e) = posted {
            self.connect_failed(pc, now, &format!("INFO_REQ: {e}"));
        }
    }

    pub(super) fn drive_info(&mut self, cx: &mut dyn Ctx, pc: &mut PathCtl, now: u64) -> bool {
        let PathProgress::Info {
            conns,
            acc,
            rsp,
            deadline,
            ..
        } = &mut pc.phase
        else {
            return false;
        };
        let acc = *acc;
        let mut wcs = [Wc::default(); 4];
        let mut info: Option<Vec<u8>> = None;
        let mut fail: Option<String> = None;
        // Any connection of the path lost now fails the attempt here, rather than after
        // its hand-over to its core.
        for con in conns.iter_mut() {
            while let Some(ev) = con.poll_cm() {
                if matches!(ev, CmEvent::Disconnected | CmEvent::Error { .. }) {
                    fail.get_or_insert_with(|| {
                        format!("cid {} disconnected during the INFO exchange", con.cid())
                    });
                }
            }
        }
        let n = conns[0].poll(&mut wcs);
        for wc in &wcs[..n] {
            if !wc.status.is_ok() {
                // The first cause wins: a flush follows a disconnect seen above.
                fail.get_or_insert_with(|| {
                    format!("INFO exchange: {:?} completion {:?}", wc.opcode, wc.status)
                });
            } else if wc.opcode == WcOpcode::Recv {
                let mut b = vec![0u8; (wc.byte_len as usize).min(rsp.size())];
                rsp.read(0, &mut b);
                info = Some(b);
            }
        }
        if fail.is_none() && info.is_none() && now > *deadline {
            fail = Some("no INFO_RSP within the connect timeout".into());
        }
        if let Some(why) = fail {
            self.connect_failed(pc, now, &why);
            return true;
        }
        let Some(info) = info else {
            return n > 0;
        };
        let chunk = acc.chunk_size() as u32;
        let rbuf: Vec<(u64, u32)> = match InfoRsp::decode(&info, acc.queue_depth, chunk) {
            Ok(r) => r.chunks().collect(),
            Err(e) => {
                self.connect_failed(pc, now, &format!("bad INFO_RSP: {e}"));
                return true;
            }
        };
        let layout = match acc.imm_layout() {
            Ok(l) => l,
            Err(e) => {
                self.connect_failed(pc, now, &format!("{e}"));
                return true;
            }
        };
        let params = SessionParams {
            queue_depth: acc.queue_depth,
            max_io_size: acc.max_io_size,
            max_hdr_size: acc.max_hdr_size,
            chunk_size: chunk,
            new_rkey: acc.new_rkey,
            layout,
        };
        let PathProgress::Info { conns, .. } = std::mem::replace(&mut pc.phase, PathProgress::Idle)
        else {
            unreachable!("phase checked above")
        };
        self.establish(cx, pc, conns, params, rbuf, now);
        true
    }

    /// INFO_RSP is in: post every receive, hand the IO connections to their cores and
    /// declare the path connected.
    pub(super) fn establish(
        &mut self,
        cx: &mut dyn Ctx,
        pc: &mut PathCtl,
        conns: Vec<RtrsCon>,
        params: SessionParams,
        rbuf: Vec<(u64, u32)>,
        now: u64,
    ) {
        let mut it = conns.into_iter();
        let Some(mut con0) = it.next() else { return };
        let recv0 = match post_recvs(
            &*self.fabric,
            &mut con0,
            2 * SERVICE_CON_QUEUE_DEPTH as usize,
            params.new_rkey,
        ) {
            Ok(r) => r,
            Err(e) => {
                con0.disconnect();
                pc.phase = PathProgress::Idle;
                self.connect_failed(pc, now, &format!("posting receives on cid 0: {e}"));
                return;
            }
        };
        let mut ios = Vec::with_capacity(self.sess.cores);
        for mut con in it {
            match post_recvs(
                &*self.fabric,
                &mut con,
                2 * usize::from(params.queue_depth),
                params.new_rkey,
            ) {
                Ok(recv) => {
                    // Its core takes it over on arrival (docs/ARCHITECTURE.md,
                    // "Completion queues").
                    if con.on_shared() {
                        con.release_thread();
                    }
                    ios.push(IoConn {
                        con,
                        recv,
                        rbuf: rbuf.clone(),
                    });
                }
                Err(e) => {
                    con0.disconnect();
                    pc.phase = PathProgress::Idle;
                    self.connect_failed(pc, now, &format!("posting receives: {e}"));
                    return;
                }
            }
        }
        self.params = Some(params);
        if let Err(e) = pc.shared.state.change(PathState::Connected) {
            con0.disconnect();
            pc.phase = PathProgress::Idle;
            self.connect_failed(pc, now, &e.to_string());
            return;
        }
        for (core, io) in ios.into_iter().enumerate() {
            self.sess.to_core[core].push(PathCmd::Up {
                path: pc.shared.clone(),
                params,
                conn: Box::new(io),
            });
        }
        if pc.attempts > 1 {
            pc.shared.home.reconnect_ok.fetch_add(1, Ordering::Relaxed);
        }
        pc.failed_in_row = 0;
        *lock(&pc.shared.last_error) = None;
        pc.shared.target_refused.store(false, Ordering::Release);
        let hca = con0.conn().hca();
        let on = hca
            .as_ref()
            .map(|h| format!(" on {} port {}", h.name, h.port))
            .unwrap_or_default();
        *lock(&pc.shared.hca) = hca;
        pc.refused = None;
        pc.reconnect.on_success();
        pc.shared.error.store(false, Ordering::Release);
        pc.hb.reset();
        pc.hb_next = now.saturating_add(pc.hb.interval_ns());
        pc.phase = PathProgress::Connected { con0, recv0 };
        self.up += 1;
        self.sess.paths_up.store(self.up, Ordering::Release);
        tracing::info!(sess = %self.sess.sessname, path = %pc.shared.addr, "path connected{on} (queue depth {}, max_io_size {})", params.queue_depth, params.max_io_size);
        if self.up == 1 {
            self.events.link_event(cx, LinkEvent::Connected);
        }
    }
}

/// Connects IO connection `cid` of `pc`'s path on its core's shared CQ when the core
/// has one (docs/ARCHITECTURE.md, "Completion queues"), else with a private CQ; says
/// which. A CQ that refuses the connection (it overran) is not used again.
fn connect_io(
    f: &dyn Fabric,
    sess: &SessShared,
    pc: &PathCtl,
    cid: u16,
    caps: QpCaps,
    req: &[u8],
) -> Result<(Box<dyn Conn>, bool), FabricError> {
    let (src, dst, psk) = (
        pc.shared.addr.src,
        pc.shared.addr.dst,
        pc.shared.psk.as_ref(),
    );
    let core = usize::from(cid.saturating_sub(1));
    if let Some(cq) = sess.cq_of(core) {
        match f.connect(
            dst,
            &ConnectOptions::new(caps, req).from(src).psk(psk).on(&cq),
        ) {
            Ok(c) => return Ok((c, true)),
            Err(FabricError::Cq { cause }) => {
                tracing::warn!(sess = %sess.sessname, core, "core's completion queue refused a connection ({cause}): private completion queues from now on");
                sess.forget_cq(core);
            }
            Err(e) => return Err(e),
        }
    }
    f.connect(dst, &ConnectOptions::new(caps, req).from(src).psk(psk))
        .map(|c| (c, false))
}

/// Posts `n` receives on `con`: 8-byte buffers for RKEY_RSP under NEW_RKEY_F, else empty.
fn post_recvs(
    f: &dyn Fabric,
    con: &mut RtrsCon,
    n: usize,
    new_rkey: bool,
) -> Result<Option<IuPool>, String> {
    if !new_rkey {
        con.post_recv_empty(n as u32, 0)
            .map_err(|e| e.to_string())?;
        return Ok(None);
    }
    let pool = IuPool::new(f, n, RkeyRsp::LEN, Access::LOCAL_WRITE).map_err(|e| e.to_string())?;
    let wrs: Vec<RecvWr> = (0..n).map(|i| pool.recv_wr(i, i as u64)).collect();
    for c in wrs.chunks(32) {
        con.post_recv(c).map_err(|e| e.to_string())?;
    }
    Ok(Some(pool))
}

/// A placeholder connection while the real one is moved out (never posted to).
struct NoConn;

impl Conn for NoConn {
    fn post_send(&mut self, _: &[SendWr<'_>]) -> Result<(), crate::fabric::PostError> {
        Err(crate::fabric::PostError {
            index: 0,
            kind: crate::fabric::PostErrorKind::NotConnected,
        })
    }
    fn post_recv(&mut self, _: &[RecvWr]) -> Result<(), crate::fabric::PostError> {
        Err(crate::fabric::PostError {
            index: 0,
            kind: crate::fabric::PostErrorKind::NotConnected,
        })
    }
    fn poll_cq(&mut self, _: &mut [Wc]) -> usize {
        0
    }
    fn poll_cm(&mut self) -> Option<CmEvent> {
        None
    }
    fn disconnect(&mut self) {}
    fn state(&self) -> crate::fabric::ConnState {
        crate::fabric::ConnState::Disconnected
    }
    fn caps(&self) -> QpCaps {
        QpCaps::default()
    }
    fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        None
    }
    fn local_addr(&self) -> Option<std::net::SocketAddr> {
        None
    }
}
