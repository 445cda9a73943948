//! The service connection's control work on the session's home core: INFO_REQ →
//! INFO_RSP (the kernel's `process_info_req` / `post_recv_info_req_done`, docs/PROTOCOL.md
//! §3.5, §9.3) and the heartbeat (`rtrs_srv_start_hb` / `hb_work`, §5).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::common::{HbAction, Heartbeat, LinkEvent};
use crate::engine::Ctx;
use crate::fabric::{Access, SendOp, SendWr};
use crate::proto::constants::SERVICE_CON_QUEUE_DEPTH;
use crate::proto::{InfoReq, InfoRsp, HB_MSG_IMM};
use crate::ratelimit::log_limited;
use crate::sync::lock;

use super::conn::{ConSlot, InfoState};
use super::handler::ServerHandler;
use super::session::{Usage, CONNECTED, CONNECTING};
use super::state::ServerState;
use super::wr::WrId;

/// REG_MRs posted per `post_send` call while building INFO_RSP.
const REG_BATCH: usize = 64;

/// INFO_REQ arrived on cid 0 (connection `slot`) with `byte_len` bytes; the first
/// path of a session up is reported to `handler`.
pub(crate) fn on_info_req(
    cx: &mut dyn Ctx,
    sh: &ServerState,
    slot: &mut ConSlot,
    byte_len: u32,
    handler: &mut dyn ServerHandler,
) {
    let path = Arc::clone(&slot.path);
    if slot.con.cid() != 0 || path.state() != CONNECTING {
        return slot.close_path(sh, cx, format_args!("INFO_REQ out of place"));
    }
    if (byte_len as usize) < InfoReq::LEN {
        return slot.close_path(
            sh,
            cx,
            format_args!("INFO_REQ of {byte_len} bytes, need {}", InfoReq::LEN),
        );
    }
    let mut b = [0u8; InfoReq::LEN];
    path.info_req.read(0, &mut b);
    let name = match InfoReq::decode(&b) {
        Ok(r) => String::from_utf8_lossy(r.pathname).into_owned(),
        Err(e) => return slot.close_path(sh, cx, format_args!("{e}")),
    };
    tracing::debug!(pathname = %name, peer = ?slot.con.conn().peer_addr(), "INFO_REQ");
    if !lock(&path.present).iter().all(|&p| p) {
        return slot.close_path(
            sh,
            cx,
            format_args!("INFO_REQ before all {} connections were made", path.cid_num),
        );
    }
    let first_up = {
        let mut t = lock(&sh.table);
        let taken = t.sessions.iter().any(|e| {
            e.sess.id != path.sess.id
                && (e.sess.name() == name || e.all.iter().any(|p| p.name() == name))
        });
        if taken {
            drop(t);
            return slot.close_path(
                sh,
                cx,
                format_args!("session name {name:?} is used by another session (EPERM)"),
            );
        }
        if path
            .state
            .compare_exchange(CONNECTING, CONNECTED, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        *lock(&path.name) = name.clone();
        {
            let mut sn = lock(&path.sess.name);
            if sn.is_empty() {
                *sn = name.clone();
            }
        }
        path.conn_ts.store(0, Ordering::Release);
        match t.by_id(path.sess.id) {
            Some(e) => {
                e.up += 1;
                e.established = true;
                e.up == 1
            }
            None => false,
        }
    };
    if let Err(e) = slot
        .con
        .post_recv_empty(SERVICE_CON_QUEUE_DEPTH, WrId::Recv.encode())
    {
        return slot.close_path(sh, cx, format_args!("posting cid 0 receives: {e}"));
    }
    let descs = path.descs(sh.cfg.always_invalidate);
    // SAFETY: the INFO_RSP buffer is only used by this one send, posted below after
    // this borrow ends.
    let out = unsafe { path.info_rsp.slice_mut(0, path.info_rsp.size()) };
    let len = match InfoRsp::encode(descs, out) {
        Ok(n) => n,
        Err(e) => return slot.close_path(sh, cx, format_args!("building INFO_RSP: {e}")),
    };
    let hb = Heartbeat::from_config(&sh.cfg.hb);
    let next = cx.now().saturating_add(hb.interval_ns());
    slot.hb = Some((hb, next));
    slot.info = InfoState::Posting { next: 0, len };
    let on = path
        .hca
        .as_ref()
        .map(|h| format!(" on {} port {}", h.name, h.port))
        .unwrap_or_default();
    log_limited!(
        sh.info_log,
        cx.now(),
        INFO,
        "rtrs-srv: {} {name:?}: path {}@{} connected{on} ({} connections)",
        path.sess.id,
        path.peer,
        path.local,
        path.cid_num
    );
    if first_up {
        let sname = path.sess.name();
        handler.link_event(cx, path.sess.id, &sname, LinkEvent::Connected);
        let usage = match handler.session_use(path.sess.id) {
            Some(u) => Usage::By(u),
            None => Usage::Always,
        };
        if let Some(e) = lock(&sh.table).by_id(path.sess.id) {
            e.usage = usage;
            e.idle_since = Some(cx.now());
        }
    }
    post_info_rsp(cx, sh, slot);
}

/// Posts (more of) the INFO_RSP chain on connection `slot`: the chunk REG_MRs under
/// always_invalidate, then the signaled SEND. True if something was posted.
pub(crate) fn post_info_rsp(cx: &mut dyn Ctx, sh: &ServerState, slot: &mut ConSlot) -> bool {
    let ai = sh.cfg.always_invalidate;
    let InfoState::Posting { mut next, len } = slot.info else {
        return false;
    };
    let path = Arc::clone(&slot.path);
    let sess = &path.sess;
    let cs = sess.chunk_size();
    let qd = usize::from(sess.queue_depth());
    let mut posted = false;
    let mut chain: Vec<SendWr<'_>> = Vec::with_capacity(REG_BATCH);
    while ai && next < qd {
        let room = (slot.con.sq_avail() as usize).saturating_sub(1);
        let k = REG_BATCH.min(qd - next).min(room);
        if k == 0 {
            slot.info = InfoState::Posting { next, len };
            return posted;
        }
        chain.clear();
        chain.extend((next..next + k).map(|c| {
            let m = &path.mrs[c];
            SendWr {
                wr_id: WrId::Rsp.encode(),
                op: SendOp::RegMr {
                    slot: m,
                    region: &sess.chunks,
                    addr: sess.chunks.addr() + (c as u64) * u64::from(cs),
                    len: cs,
                    access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                    rkey: path.first_keys[c],
                },
                sges: &[],
                signaled: false,
            }
        }));
        match slot.con.post_send(&chain) {
            Ok(()) => {
                next += k;
                posted = true;
            }
            Err(e) if e.is_budget() => break,
            Err(e) => {
                slot.info = InfoState::Done;
                drop(chain);
                slot.close_path(sh, cx, format_args!("INFO_RSP chunk keys: {e}"));
                return true;
            }
        }
    }
    if ai && next < qd {
        slot.info = InfoState::Posting { next, len };
        return posted;
    }
    let sge = [path.info_rsp.sge(0, len)];
    let send = SendWr {
        wr_id: WrId::InfoRsp.encode(),
        op: SendOp::Send,
        sges: &sge,
        signaled: true,
    };
    match slot.con.post_send(&[send]) {
        Ok(()) => {
            slot.info = InfoState::Done;
            true
        }
        Err(e) if e.is_budget() => {
            slot.info = InfoState::Posting { next, len };
            posted
        }
        Err(e) => {
            slot.info = InfoState::Done;
            slot.close_path(sh, cx, format_args!("sending INFO_RSP: {e}"));
            true
        }
    }
}

/// Heartbeat of the path of connection `slot` (cid 0, connected) at time `now`. True
/// if it acted.
pub(crate) fn heartbeat(cx: &mut dyn Ctx, sh: &ServerState, slot: &mut ConSlot, now: u64) -> bool {
    let Some((hb, next)) = slot.hb.as_mut() else {
        return false;
    };
    if now < *next {
        return false;
    }
    // The flag is read and cleared once per interval, at the tick (what happened since
    // the last tick is all `on_tick` needs): the IO cores that set it write its line
    // once per interval each, not once per loop of this core.
    if slot.path.traffic.load(Ordering::Relaxed) && slot.path.traffic.swap(false, Ordering::AcqRel)
    {
        hb.on_traffic();
    }
    *next = now.saturating_add(hb.interval_ns());
    match hb.on_tick(now) {
        HbAction::Nothing => false,
        HbAction::SendHb => {
            // Out of send slots the heartbeat is skipped: traffic is flowing anyway.
            match slot.con.post_imm_empty(WrId::Hb.encode(), HB_MSG_IMM) {
                Err(e) if !e.is_budget() => {
                    slot.close_path(sh, cx, format_args!("sending a heartbeat: {e}"))
                }
                _ => {}
            }
            true
        }
        HbAction::Dead => {
            let missed = hb.missed();
            slot.close_path(
                sh,
                cx,
                format_args!("heartbeat: {missed} intervals without traffic"),
            );
            true
        }
    }
}
