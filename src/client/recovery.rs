//! A connected client path's life on its home core: the heartbeat on cid 0 (the
//! kernel's `hb_work` and HB_ACK handling, docs/PROTOCOL.md §5), error recovery when cid 0,
//! an IO connection or the heartbeat fails (`rtrs_rdma_error_recovery`, §6.1), and the
//! teardown that asks every core to drop its connection and fail its requests over,
//! then decides between reconnecting, closing and removing the path (§6.2–§6.4), as a
//! failed connect sequence does too (scheduling the next attempt, or giving up).

use std::sync::atomic::Ordering;

use super::cross_core::PathCmd;
use super::ctl::{ns, After, Ctl, PathCtl, PathProgress};
use super::reconnect::ReconnectStep;
use super::state::PathState;
use crate::common::{random_u64, LinkEvent, RtrsCon};
use crate::engine::Ctx;
use crate::fabric::{CmEvent, RecvWr, Wc, WcOpcode, WcStatus};
use crate::proto::{Imm, RkeyRsp, HB_ACK_IMM, HB_MSG_IMM};
use crate::sync::lock;

impl Ctl {
    pub(super) fn drive_connected(&mut self, cx: &mut dyn Ctx, pc: &mut PathCtl, now: u64) -> bool {
        let PathProgress::Connected { con0, recv0 } = &mut pc.phase else {
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
        if pc.shared.rx_seen.load(Ordering::Relaxed)
            && pc.shared.rx_seen.swap(false, Ordering::Relaxed)
        {
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
            *lock(&pc.shared.last_error) = Some(format!("connection lost: {why}"));
            self.begin_teardown(cx, pc, After::Reconnect);
            return true;
        }
        n > 0
    }

    /// Starts tearing a path down; cores drop their connections and fail over.
    pub(super) fn begin_teardown(&mut self, cx: &mut dyn Ctx, pc: &mut PathCtl, then: After) {
        let was = std::mem::replace(&mut pc.phase, PathProgress::Idle);
        let was_up = matches!(was, PathProgress::Connected { .. });
        match was {
            PathProgress::Connected { mut con0, .. } => con0.disconnect(),
            PathProgress::Connecting {
                mut conns, mut cur, ..
            } => {
                cur.disconnect();
                conns.iter_mut().for_each(RtrsCon::disconnect);
            }
            PathProgress::Info { mut conns, .. } => conns.iter_mut().for_each(RtrsCon::disconnect),
            PathProgress::Teardown { .. }
            | PathProgress::Waiting { .. }
            | PathProgress::Held { .. }
            | PathProgress::Idle => {}
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
        for (k, q) in self.sess.to_core.iter().enumerate() {
            q.push(PathCmd::Down {
                slot: pc.shared.slot,
            });
            // A dropped core handle answers nothing; count it here. (If it dropped
            // after the push, its drop acknowledged too: one ack too many only lets
            // the teardown finish while the remaining cores still work through their
            // queues, where any later `Up` waits behind the `Down`.)
            if self.sess.core_gone[k].load(Ordering::Acquire) {
                pc.shared.acks.fetch_add(1, Ordering::AcqRel);
            }
        }
        pc.phase = PathProgress::Teardown { then };
    }

    /// Returns whether the path is gone for good.
    pub(super) fn drive_teardown(&mut self, pc: &mut PathCtl, now: u64) -> bool {
        let PathProgress::Teardown { then } = pc.phase else {
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

    pub(super) fn schedule_reconnect(&mut self, pc: &mut PathCtl, now: u64, at_once: bool) {
        if at_once {
            pc.phase = PathProgress::Waiting { at: now };
            return;
        }
        match pc.reconnect.next(random_u64()) {
            ReconnectStep::After(d) => {
                pc.phase = PathProgress::Waiting {
                    at: now.saturating_add(ns(d)),
                }
            }
            ReconnectStep::GiveUp => self.give_up(pc),
        }
    }

    /// No reconnect attempts left (`max_reconnect_attempts`): the path is closed until a
    /// manual reconnect, and says so, with how many attempts failed and the last error
    /// ([`super::ClientSession::path_failure`], the statistics' `failure`).
    fn give_up(&mut self, pc: &mut PathCtl) {
        let last = lock(&pc.shared.last_error)
            .clone()
            .unwrap_or_else(|| "no error recorded".into());
        let max = self.cfg.max_reconnect_attempts;
        let why = match pc.failed_in_row {
            0 => format!("not reconnected (max_reconnect_attempts {max}): {last}"),
            1 => format!("gave up after 1 failed attempt (max_reconnect_attempts {max}): {last}"),
            n => {
                format!("gave up after {n} failed attempts (max_reconnect_attempts {max}): {last}")
            }
        };
        tracing::warn!(sess = %self.sess.sessname, path = %pc.shared.addr, "{why}; the path stays closed until a manual reconnect");
        *lock(&pc.shared.failure) = Some(why);
        self.close_now(pc);
    }

    /// A path not connected and not in a teardown goes to Closed at once.
    pub(super) fn close_now(&mut self, pc: &mut PathCtl) {
        let _ = pc.shared.state.change(PathState::Closing);
        if pc.shared.state.change(PathState::Closed).is_ok() {
            self.sess.live_paths.fetch_sub(1, Ordering::AcqRel);
        }
        pc.phase = PathProgress::Idle;
    }
}
