//! The session's home-core poller: per path, the connection sequence (the kernel's
//! `init_path`/`init_conns`/`create_con_cq_qp`/`rtrs_rdma_conn_established` and
//! `rtrs_send_path_info`, PROTOCOL.md §3.2), the heartbeat on cid 0 (§5), error
//! recovery and teardown (`rtrs_rdma_error_recovery`, `rtrs_clt_stop_and_destroy_conns`,
//! §6.1), reconnects (`rtrs_clt_reconnect_work`, §6.4), link events (§6.3) and the
//! runtime commands (`add_path`, `remove_path`, `disconnect`, `reconnect`).
//!
//! Everything is a non-blocking state machine advanced from [`Poller::poll`]: a
//! connection request is started and its CM event picked up on a later poll, never
//! waited for. Connections of a path are made one after the other (cid 0 first: its
//! REP carries the queue depth that sizes the others); once INFO_RSP has arrived and
//! every receive is posted, connection `k+1` is handed to core `k` ([`CoreCmd::Up`]).
//! Tearing a path down asks every core to drop its connection and fail its requests
//! over ([`CoreCmd::Down`]) and waits for all of them to acknowledge.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::config::{ClientConfig, PathAddr};
use super::reconnect::{Reconnect, ReconnectStep};
use super::shared::{CoreCmd, IoConn, Params, PathShared, SessCmd, SessShared};
use super::state::PathState;
use crate::common::{random_u64, Con, Heartbeat, IuPool, LinkEvent, Uuid};
use crate::engine::{Ctx, PollResult, Poller};
use crate::fabric::{
    Access, CmEvent, Conn, Fabric, QpCaps, RecvWr, SendOp, SendWr, Wc, WcOpcode, WcStatus,
};
use crate::proto::constants::SERVICE_CON_QUEUE_DEPTH;
use crate::proto::{
    ConnAccept, ConnReq, ConnRsp, Imm, InfoReq, InfoRsp, RkeyRsp, HB_ACK_IMM, HB_MSG_IMM,
};

/// The layer above (RNBD's client), told on the home core when the session gains its
/// first connected path ([`LinkEvent::Connected`]) or loses its last one.
pub trait ClientEvents {
    fn link_event(&mut self, cx: &mut dyn Ctx, ev: LinkEvent);
}

/// What follows a teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    /// Schedule a reconnect (delay + jitter, attempts permitting).
    Reconnect,
    /// Reconnect at once (manual reconnect).
    ReconnectNow,
    /// Stay closed until a manual reconnect.
    Close,
    /// Forget the path.
    Remove,
}

enum Phase {
    /// Connection `conns.len()` is being established.
    Connecting {
        conns: Vec<Con>,
        cur: Box<dyn Conn>,
        acc: Option<ConnAccept>,
        deadline: u64,
    },
    /// Every connection is up; INFO_REQ sent on cid 0, waiting for INFO_RSP.
    Info {
        conns: Vec<Con>,
        acc: ConnAccept,
        rsp: IuPool,
        _req: IuPool,
        deadline: u64,
    },
    Connected {
        con0: Con,
        recv0: Option<IuPool>,
    },
    /// Waiting for every core to drop its connection.
    Teardown {
        then: After,
    },
    /// Reconnect due at `at`.
    Waiting {
        at: u64,
    },
    /// Closed; only a manual reconnect or removal follows.
    Idle,
}

struct PathCtl {
    shared: Arc<PathShared>,
    sess_uuid: Uuid,
    recon_cnt: u16,
    for_new_clt: bool,
    reconnect: Reconnect,
    hb: Heartbeat,
    hb_next: u64,
    phase: Phase,
}

/// The home-core poller of a session.
pub(super) struct Ctl {
    sess: Arc<SessShared>,
    fabric: Arc<dyn Fabric>,
    cfg: ClientConfig,
    events: Box<dyn ClientEvents>,
    paths_uuid: Uuid,
    paths: Vec<Option<PathCtl>>,
    up: u32,
    params: Option<Params>,
}

impl Ctl {
    pub(super) fn new(
        sess: Arc<SessShared>,
        fabric: Arc<dyn Fabric>,
        cfg: ClientConfig,
        events: Box<dyn ClientEvents>,
        paths_uuid: Uuid,
    ) -> Ctl {
        Ctl {
            sess,
            fabric,
            cfg,
            events,
            paths_uuid,
            paths: (0..super::policy::MAX_PATHS).map(|_| None).collect(),
            up: 0,
            params: None,
        }
    }

    fn cid_num(&self) -> u16 {
        (self.sess.cores + 1) as u16
    }

    /// Adds a path and starts connecting it.
    pub(super) fn add_path(&mut self, addr: PathAddr, now: u64) {
        let list = self.sess.path_list();
        if list.iter().any(|p| p.addr == addr) {
            tracing::warn!(sess = %self.sess.sessname, path = %addr, "add_path: path already exists");
            return;
        }
        let Some(slot) = self.paths.iter().position(Option::is_none) else {
            tracing::warn!(sess = %self.sess.sessname, path = %addr, "add_path: 128 paths already");
            return;
        };
        let shared = Arc::new(PathShared::new(slot, addr, self.sess.cores));
        self.sess.paths.lock().unwrap_or_else(|e| e.into_inner())[slot] = Some(shared.clone());
        self.sess.live_paths.fetch_add(1, Ordering::AcqRel);
        let mut pc = PathCtl {
            shared,
            sess_uuid: crate::common::random_uuid(),
            recon_cnt: 0,
            // The kernel lets a path create the server session when the session has no
            // path up (the first path of a new session, or an added one after all died).
            for_new_clt: self.up == 0,
            reconnect: Reconnect::new(self.cfg.reconnect_policy()),
            hb: Heartbeat::from_config(&self.cfg.hb),
            hb_next: 0,
            phase: Phase::Idle,
        };
        self.start_connect(&mut pc, now);
        self.paths[slot] = Some(pc);
    }

    fn caps(&self, cid0: bool, qd: u16) -> QpCaps {
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

    fn conn_req(&self, pc: &PathCtl, cid: u16) -> [u8; ConnReq::LEN] {
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

    fn start_connect(&mut self, pc: &mut PathCtl, now: u64) {
        pc.recon_cnt = pc.recon_cnt.wrapping_add(1);
        let pd = self.conn_req(pc, 0);
        match self
            .fabric
            .connect(pc.shared.addr.dst, self.caps(true, 0), &pd)
        {
            Ok(cur) => {
                pc.phase = Phase::Connecting {
                    conns: Vec::with_capacity(usize::from(self.cid_num())),
                    cur,
                    acc: None,
                    deadline: now.saturating_add(ns(self.cfg.connect_timeout)),
                };
            }
            Err(e) => self.connect_failed(pc, now, &format!("connect cid 0: {e}")),
        }
    }

    /// The connect sequence failed: clean up and schedule the next attempt.
    fn connect_failed(&mut self, pc: &mut PathCtl, now: u64, why: &str) {
        tracing::warn!(sess = %self.sess.sessname, path = %pc.shared.addr, "connecting failed: {why}");
        if let Phase::Connecting { conns, cur, .. } = &mut pc.phase {
            cur.disconnect();
            conns.iter_mut().for_each(Con::disconnect);
        } else if let Phase::Info { conns, .. } = &mut pc.phase {
            conns.iter_mut().for_each(Con::disconnect);
        }
        pc.phase = Phase::Idle;
        pc.shared
            .home
            .reconnect_fail
            .fetch_add(1, Ordering::Relaxed);
        let _ = pc.shared.state.change(PathState::ConnectingErr);
        let _ = pc.shared.state.change(PathState::Reconnecting);
        self.schedule_reconnect(pc, now, false);
    }

    fn schedule_reconnect(&mut self, pc: &mut PathCtl, now: u64, at_once: bool) {
        if at_once {
            pc.phase = Phase::Waiting { at: now };
            return;
        }
        match pc.reconnect.next(random_u64()) {
            ReconnectStep::After(d) => {
                pc.phase = Phase::Waiting {
                    at: now.saturating_add(ns(d)),
                }
            }
            ReconnectStep::GiveUp => {
                tracing::warn!(sess = %self.sess.sessname, path = %pc.shared.addr, "no reconnect attempts left: path closed");
                self.close_now(pc);
            }
        }
    }

    /// A path not connected and not in a teardown goes to Closed at once.
    fn close_now(&mut self, pc: &mut PathCtl) {
        let _ = pc.shared.state.change(PathState::Closing);
        if pc.shared.state.change(PathState::Closed).is_ok() {
            self.sess.live_paths.fetch_sub(1, Ordering::AcqRel);
        }
        pc.phase = Phase::Idle;
    }

    fn drive_connecting(&mut self, pc: &mut PathCtl, now: u64) -> bool {
        let Phase::Connecting {
            conns,
            cur,
            acc,
            deadline,
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
                let errno = ConnRsp::reject_errno(private_data.as_bytes());
                self.connect_failed(
                    pc,
                    now,
                    &format!("cid {cid}: server rejected the connection with errno {errno}"),
                );
                return true;
            }
            CmEvent::Error { reason } => {
                self.connect_failed(pc, now, &format!("cid {cid}: {reason}"));
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
        let Phase::Connecting {
            conns, cur, acc, ..
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
        conns.push(Con::new(cid, conn, a.signal_interval()));
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
            match self
                .fabric
                .connect(pc.shared.addr.dst, self.caps(false, a.queue_depth), &req)
            {
                Ok(c) => *cur = c,
                Err(e) => self.connect_failed(pc, now, &format!("connect cid {next}: {e}")),
            }
            return true;
        }
        let Phase::Connecting { conns, .. } = std::mem::replace(&mut pc.phase, Phase::Idle) else {
            unreachable!("phase checked above")
        };
        self.start_info(pc, conns, a, now);
        true
    }

    fn start_info(&mut self, pc: &mut PathCtl, mut conns: Vec<Con>, acc: ConnAccept, now: u64) {
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
                pc.phase = Phase::Connecting {
                    conns,
                    cur: Box::new(NoConn),
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
        pc.phase = Phase::Info {
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

    fn drive_info(&mut self, cx: &mut dyn Ctx, pc: &mut PathCtl, now: u64) -> bool {
        let Phase::Info {
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
        while let Some(ev) = conns[0].poll_cm() {
            if matches!(ev, CmEvent::Disconnected | CmEvent::Error { .. }) {
                fail = Some("cid 0 disconnected during the INFO exchange".into());
            }
        }
        let n = conns[0].poll(&mut wcs);
        for wc in &wcs[..n] {
            if !wc.status.is_ok() {
                fail = Some(format!(
                    "INFO exchange: {:?} completion {:?}",
                    wc.opcode, wc.status
                ));
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
        let params = Params {
            queue_depth: acc.queue_depth,
            max_io_size: acc.max_io_size,
            max_hdr_size: acc.max_hdr_size,
            chunk_size: chunk,
            new_rkey: acc.new_rkey,
            layout,
        };
        let Phase::Info { conns, .. } = std::mem::replace(&mut pc.phase, Phase::Idle) else {
            unreachable!("phase checked above")
        };
        self.establish(cx, pc, conns, params, rbuf, now);
        true
    }

    /// INFO_RSP is in: post every receive, hand the IO connections to their cores and
    /// declare the path connected.
    fn establish(
        &mut self,
        cx: &mut dyn Ctx,
        pc: &mut PathCtl,
        conns: Vec<Con>,
        params: Params,
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
                pc.phase = Phase::Idle;
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
                Ok(recv) => ios.push(IoConn {
                    con,
                    recv,
                    rbuf: rbuf.clone(),
                }),
                Err(e) => {
                    con0.disconnect();
                    pc.phase = Phase::Idle;
                    self.connect_failed(pc, now, &format!("posting receives: {e}"));
                    return;
                }
            }
        }
        self.params = Some(params);
        *self.sess.params.lock().unwrap_or_else(|e| e.into_inner()) = Some(params);
        if pc.shared.state.change(PathState::Connected).is_err() {
            con0.disconnect();
            pc.phase = Phase::Idle;
            return;
        }
        for (core, io) in ios.into_iter().enumerate() {
            self.sess.to_core[core].push(CoreCmd::Up {
                path: pc.shared.clone(),
                params,
                conn: Box::new(io),
            });
        }
        pc.shared.home.reconnect_ok.fetch_add(1, Ordering::Relaxed);
        pc.reconnect.on_success();
        pc.shared.error.store(false, Ordering::Release);
        pc.hb.reset();
        pc.hb_next = now.saturating_add(pc.hb.interval_ns());
        pc.phase = Phase::Connected { con0, recv0 };
        self.up += 1;
        self.sess.paths_up.store(self.up, Ordering::Release);
        tracing::info!(sess = %self.sess.sessname, path = %pc.shared.addr, "path connected (queue depth {}, max_io_size {})", params.queue_depth, params.max_io_size);
        if self.up == 1 {
            self.events.link_event(cx, LinkEvent::Connected);
        }
    }

    fn drive_connected(&mut self, cx: &mut dyn Ctx, pc: &mut PathCtl, now: u64) -> bool {
        let Phase::Connected { con0, recv0 } = &mut pc.phase else {
            return false;
        };
        let mut err: Option<String> = None;
        while let Some(ev) = con0.poll_cm() {
            if matches!(ev, CmEvent::Disconnected | CmEvent::Error { .. }) {
                err = Some("cid 0 disconnected".into());
            }
        }
        let mut wcs = [Wc::default(); 16];
        let n = con0.poll(&mut wcs);
        for wc in &wcs[..n] {
            if wc.status == WcStatus::WrFlush {
                continue;
            }
            if !wc.status.is_ok() {
                err = Some(format!("cid 0 {:?} completion {:?}", wc.opcode, wc.status));
                continue;
            }
            if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                continue;
            }
            pc.hb.on_traffic();
            let repost = match recv0 {
                Some(p) => con0.post_recv(&[p.recv_wr(wc.wr_id as usize, wc.wr_id)]),
                None => con0.post_recv(&[RecvWr {
                    wr_id: 0,
                    sge: None,
                }]),
            };
            if let Err(e) = repost {
                err = Some(format!("cid 0 receive repost: {e}"));
            }
            let Some(imm) = wc.imm else { continue };
            match Imm::decode(imm) {
                Ok(Imm::HbMsg) => {
                    if let Err(e) = con0.post_imm_empty(0, HB_ACK_IMM) {
                        err = Some(format!("HB_ACK: {e}"));
                    }
                }
                Ok(Imm::HbAck) => {
                    if let Some(l) = pc.hb.on_ack(now) {
                        pc.shared.home.hb_latency_ns.store(l, Ordering::Relaxed);
                    }
                }
                // This client sends no requests on cid 0; a response there is ignored,
                // after checking an RKEY_RSP's form.
                Ok(Imm::IoRsp(r)) => {
                    if wc.opcode == WcOpcode::Recv {
                        let mut b = [0u8; RkeyRsp::LEN];
                        if let Some(p) = recv0 {
                            p.read(wc.wr_id as usize, &mut b);
                        }
                        let qd = self.params.map_or(0, |p| p.queue_depth);
                        if let Err(e) = RkeyRsp::decode(&b, qd, r.msg_id()) {
                            err = Some(format!("cid 0: {e}"));
                        }
                    }
                }
                Ok(Imm::IoReq { .. }) => {
                    err = Some(format!("cid 0: IO_REQ imm {imm:#x} sent to the client"))
                }
                Err(e) => err = Some(format!("cid 0: {e}")),
            }
        }
        if pc.shared.rx_seen.swap(false, Ordering::Relaxed) {
            pc.hb.on_traffic();
        }
        if pc.shared.error.swap(false, Ordering::AcqRel) {
            err.get_or_insert_with(|| "an IO connection failed".into());
        }
        if err.is_none() && now >= pc.hb_next {
            let iv = pc.hb.interval_ns();
            while pc.hb_next <= now {
                pc.hb_next = pc.hb_next.saturating_add(iv);
            }
            match pc.hb.on_tick(now) {
                crate::common::HbAction::Nothing => {}
                crate::common::HbAction::SendHb => {
                    if let Err(e) = con0.post_imm_empty(0, HB_MSG_IMM) {
                        err = Some(format!("HB_MSG: {e}"));
                    }
                }
                crate::common::HbAction::Dead => {
                    err = Some(format!(
                        "heartbeat: {} intervals without traffic",
                        pc.hb.missed()
                    ));
                }
            }
        }
        if let Some(why) = err {
            tracing::warn!(sess = %self.sess.sessname, path = %pc.shared.addr, "path error: {why}; failing over");
            self.begin_teardown(cx, pc, After::Reconnect);
            return true;
        }
        n > 0
    }

    /// Starts tearing a path down; cores drop their connections and fail over.
    fn begin_teardown(&mut self, cx: &mut dyn Ctx, pc: &mut PathCtl, then: After) {
        let was = std::mem::replace(&mut pc.phase, Phase::Idle);
        let was_up = matches!(was, Phase::Connected { .. });
        match was {
            Phase::Connected { mut con0, .. } => con0.disconnect(),
            Phase::Connecting {
                mut conns, mut cur, ..
            } => {
                cur.disconnect();
                conns.iter_mut().for_each(Con::disconnect);
            }
            Phase::Info { mut conns, .. } => conns.iter_mut().for_each(Con::disconnect),
            Phase::Teardown { .. } | Phase::Waiting { .. } | Phase::Idle => {}
        }
        let to = match then {
            After::Reconnect | After::ReconnectNow => PathState::Reconnecting,
            After::Close | After::Remove => PathState::Closing,
        };
        let _ = pc.shared.state.change(to);
        pc.hb.reset();
        if was_up {
            self.up -= 1;
            self.sess.paths_up.store(self.up, Ordering::Release);
            if self.up == 0 {
                self.events.link_event(cx, LinkEvent::Disconnected);
            }
        }
        pc.shared.acks.store(0, Ordering::Release);
        for q in &self.sess.to_core {
            q.push(CoreCmd::Down {
                slot: pc.shared.slot,
            });
        }
        pc.phase = Phase::Teardown { then };
    }

    /// Returns whether the path is gone for good.
    fn drive_teardown(&mut self, pc: &mut PathCtl, now: u64) -> bool {
        let Phase::Teardown { then } = pc.phase else {
            return false;
        };
        if pc.shared.acks.load(Ordering::Acquire) < self.sess.cores {
            return false;
        }
        pc.shared.error.store(false, Ordering::Release);
        match then {
            After::Reconnect => self.schedule_reconnect(pc, now, false),
            After::ReconnectNow => self.schedule_reconnect(pc, now, true),
            After::Close => self.close_now(pc),
            After::Remove => {
                self.close_now(pc);
                let _ = pc.shared.state.change(PathState::Dead);
                return true;
            }
        }
        false
    }

    fn run_cmd(&mut self, cx: &mut dyn Ctx, cmd: SessCmd, now: u64) {
        let find = |ctl: &Ctl, a: &PathAddr| {
            ctl.paths
                .iter()
                .position(|p| p.as_ref().is_some_and(|p| p.shared.addr == *a))
        };
        let (slot, then) = match cmd {
            SessCmd::AddPath(a) => return self.add_path(a, now),
            SessCmd::SetMaxReconnectAttempts(n) => {
                self.cfg.max_reconnect_attempts = n;
                self.paths
                    .iter_mut()
                    .flatten()
                    .for_each(|p| p.reconnect.set_max_attempts(n));
                return;
            }
            SessCmd::Close => {
                self.sess.closed.store(true, Ordering::Release);
                for s in 0..self.paths.len() {
                    if self.paths[s].is_some() {
                        self.stop_path(cx, s, After::Remove, now);
                    }
                }
                return;
            }
            SessCmd::RemovePath(a) => (find(self, &a), After::Remove),
            SessCmd::Disconnect(a) => (find(self, &a), After::Close),
            SessCmd::Reconnect(a) => (find(self, &a), After::ReconnectNow),
        };
        match slot {
            Some(s) => self.stop_path(cx, s, then, now),
            None => tracing::warn!(sess = %self.sess.sessname, "no such path for {then:?}"),
        }
    }

    fn stop_path(&mut self, cx: &mut dyn Ctx, slot: usize, then: After, now: u64) {
        let Some(mut pc) = self.paths[slot].take() else {
            return;
        };
        pc.reconnect.reset();
        match (&pc.phase, then) {
            (Phase::Teardown { .. }, _) => pc.phase = Phase::Teardown { then },
            (Phase::Idle, After::ReconnectNow) => {
                let _ = pc.shared.state.change(PathState::Reconnecting);
                pc.phase = Phase::Waiting { at: now };
            }
            (Phase::Waiting { .. }, After::ReconnectNow) => pc.phase = Phase::Waiting { at: now },
            (Phase::Idle, After::Remove) => {
                let _ = pc.shared.state.change(PathState::Dead);
                self.forget(&pc);
                return;
            }
            (Phase::Idle, _) => {}
            _ => self.begin_teardown(cx, &mut pc, then),
        }
        self.paths[slot] = Some(pc);
    }

    fn forget(&mut self, pc: &PathCtl) {
        self.sess.paths.lock().unwrap_or_else(|e| e.into_inner())[pc.shared.slot] = None;
    }
}

impl Poller for Ctl {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let now = cx.now();
        let mut busy = false;
        while let Some(cmd) = self.sess.to_home.pop() {
            self.run_cmd(cx, cmd, now);
            busy = true;
        }
        for slot in 0..self.paths.len() {
            let Some(mut pc) = self.paths[slot].take() else {
                continue;
            };
            let mut gone = false;
            busy |= match pc.phase {
                Phase::Connecting { .. } => self.drive_connecting(&mut pc, now),
                Phase::Info { .. } => self.drive_info(cx, &mut pc, now),
                Phase::Connected { .. } => self.drive_connected(cx, &mut pc, now),
                Phase::Teardown { .. } => {
                    gone = self.drive_teardown(&mut pc, now);
                    true
                }
                Phase::Waiting { at } if now >= at => {
                    if pc.shared.state.change(PathState::Connecting).is_ok() {
                        self.start_connect(&mut pc, now);
                    } else {
                        pc.phase = Phase::Idle;
                    }
                    true
                }
                Phase::Waiting { .. } | Phase::Idle => false,
            };
            if gone {
                self.forget(&pc);
            } else {
                self.paths[slot] = Some(pc);
            }
        }
        if self.sess.closed.load(Ordering::Acquire) && self.paths.iter().all(Option::is_none) {
            if let Some(id) = cx.current() {
                cx.unregister(id);
            }
        }
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    fn shutdown(&mut self, _cx: &mut dyn Ctx) {
        self.sess.closed.store(true, Ordering::Release);
    }

    fn name(&self) -> &str {
        "rtrs-clt-session"
    }
}

/// Posts `n` receives on `con`: 8-byte buffers for RKEY_RSP under NEW_RKEY_F, else empty.
fn post_recvs(
    f: &dyn Fabric,
    con: &mut Con,
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

fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
