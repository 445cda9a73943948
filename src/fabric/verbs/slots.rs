//! A shadow of the send and receive queues: what was posted and is not yet covered by a
//! completion. It serves two parts of the fabric contract that the hardware alone does
//! not give:
//!
//! - **Queue sizes.** A send work request holds its slot until a completion is generated
//!   for it or for a later request on the same queue pair; a receive until it completes.
//!   Providers round queue sizes up (mlx5 to powers of two), so counting here makes
//!   `PostErrorKind::QueueFull` arrive exactly at the requested `max_send_wr` and
//!   `max_recv_wr` on every device.
//! - **Opcodes of failed completions.** Verbs leaves the opcode of a failed completion
//!   undefined (mlx5 does not set it). Send completions come in posting order and
//!   receive completions in posting order, so the failed request is found here by its
//!   `wr_id` and its opcode filled in.
//!
//! Both rings are allocated once with the requested queue sizes and never grow.

use std::collections::VecDeque;

use crate::fabric::{QpCaps, SendOp, Wc, WcOpcode};

#[derive(Clone, Copy, Debug)]
struct Posted {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
}

pub(super) struct QueueSlots {
    send: VecDeque<Posted>,
    send_max: usize,
    recv: VecDeque<u64>,
    recv_max: usize,
}

/// The completion opcode a send operation produces.
pub(super) fn send_opcode(op: &SendOp<'_>) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RegMr { .. } => WcOpcode::RegMr,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

fn is_recv(op: WcOpcode) -> bool {
    matches!(op, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm)
}

impl QueueSlots {
    pub fn new(caps: QpCaps) -> QueueSlots {
        QueueSlots {
            send: VecDeque::with_capacity(caps.max_send_wr as usize),
            send_max: caps.max_send_wr as usize,
            recv: VecDeque::with_capacity(caps.max_recv_wr as usize),
            recv_max: caps.max_recv_wr as usize,
        }
    }

    pub fn send_room(&self) -> usize {
        self.send_max.saturating_sub(self.send.len())
    }

    pub fn recv_room(&self) -> usize {
        self.recv_max.saturating_sub(self.recv.len())
    }

    /// Records a posted send request (the caller checked [`Self::send_room`]).
    pub fn sent(&mut self, wr_id: u64, opcode: WcOpcode, signaled: bool) {
        debug_assert!(self.send.len() < self.send_max);
        self.send.push_back(Posted {
            wr_id,
            opcode,
            signaled,
        });
    }

    /// Records a posted receive (the caller checked [`Self::recv_room`]).
    pub fn recv_posted(&mut self, wr_id: u64) {
        debug_assert!(self.recv.len() < self.recv_max);
        self.recv.push_back(wr_id);
    }

    /// Frees the slots `wc` covers. A send completion's opcode, and a failed completion's
    /// whatever the provider said (`opcode_known`), is taken from what was posted.
    pub fn completed(&mut self, wc: &mut Wc, opcode_known: bool) {
        // Verbs defines the opcode of successful completions only (rxe, for one, reports
        // a failed one as a SEND): a failed one's comes from what was posted.
        let opcode_known = opcode_known && wc.status.is_ok();
        let send_pos = || self.send.iter().position(|p| p.wr_id == wc.wr_id);
        let recv_queue = if opcode_known {
            is_recv(wc.opcode)
        } else {
            // A failed receive is the oldest one held; prefer the send queue only when
            // the wr_id is not that receive's.
            self.recv.front() == Some(&wc.wr_id) || send_pos().is_none() && !self.recv.is_empty()
        };
        if recv_queue {
            self.recv.pop_front();
            if !opcode_known {
                wc.opcode = WcOpcode::Recv;
            }
            return;
        }
        if wc.status.is_ok() {
            // This completion is for the oldest signaled request still held, and it
            // covers every unsignaled request before it.
            while let Some(p) = self.send.pop_front() {
                if p.signaled {
                    // A type-1 window's unbinding completes as a binding (it is one,
                    // of length zero): the posted operation says which it was.
                    if p.wr_id == wc.wr_id {
                        wc.opcode = p.opcode;
                    }
                    break;
                }
            }
            return;
        }
        // Failed requests complete whether signaled or not; the ones before this one
        // that are still held completed without a completion.
        if let Some(pos) = self.send.iter().position(|p| p.wr_id == wc.wr_id) {
            if !opcode_known {
                wc.opcode = self.send[pos].opcode;
            }
            self.send.drain(..=pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::WcStatus;

    fn caps(send: u32, recv: u32) -> QpCaps {
        QpCaps {
            max_send_wr: send,
            max_recv_wr: recv,
            max_send_sge: 1,
        }
    }

    fn wc(wr_id: u64, opcode: WcOpcode, status: WcStatus) -> Wc {
        Wc {
            wr_id,
            opcode,
            status,
            ..Wc::default()
        }
    }

    #[test]
    fn a_signaled_completion_frees_the_unsignaled_requests_before_it() {
        let mut s = QueueSlots::new(caps(4, 2));
        s.sent(1, WcOpcode::RdmaWrite, false);
        s.sent(2, WcOpcode::RdmaWrite, false);
        s.sent(3, WcOpcode::RdmaWrite, true);
        s.sent(4, WcOpcode::Send, false);
        assert_eq!(s.send_room(), 0);
        s.completed(&mut wc(3, WcOpcode::RdmaWrite, WcStatus::Success), true);
        assert_eq!(s.send_room(), 3);
    }

    #[test]
    fn unsignaled_requests_hold_their_slots() {
        let mut s = QueueSlots::new(caps(2, 2));
        s.sent(1, WcOpcode::Send, false);
        s.sent(2, WcOpcode::Send, false);
        s.recv_posted(9);
        s.completed(&mut wc(9, WcOpcode::Recv, WcStatus::Success), true);
        assert_eq!((s.send_room(), s.recv_room()), (0, 2));
    }

    #[test]
    fn flushed_completions_get_the_posted_opcode() {
        let mut s = QueueSlots::new(caps(4, 4));
        s.sent(1, WcOpcode::RdmaWrite, true);
        s.sent(2, WcOpcode::RegMr, false);
        s.sent(3, WcOpcode::Send, true);
        s.recv_posted(60);
        s.recv_posted(61);
        let mut first = wc(1, WcOpcode::Send, WcStatus::RemoteAccess);
        s.completed(&mut first, false);
        assert_eq!(first.opcode, WcOpcode::RdmaWrite);
        for (id, op) in [
            (60, WcOpcode::Recv),
            (2, WcOpcode::RegMr),
            (61, WcOpcode::Recv),
        ] {
            let mut w = wc(id, WcOpcode::Send, WcStatus::WrFlush);
            s.completed(&mut w, false);
            assert_eq!(w.opcode, op, "wr_id {id}");
        }
        let mut last = wc(3, WcOpcode::Send, WcStatus::WrFlush);
        s.completed(&mut last, false);
        assert_eq!(last.opcode, WcOpcode::Send);
        assert_eq!((s.send_room(), s.recv_room()), (4, 4));
    }

    #[test]
    fn a_known_opcode_is_kept() {
        let mut s = QueueSlots::new(caps(2, 2));
        s.recv_posted(5);
        let mut w = wc(5, WcOpcode::RecvRdmaWithImm, WcStatus::Success);
        s.completed(&mut w, true);
        assert_eq!(w.opcode, WcOpcode::RecvRdmaWithImm);
        assert_eq!(s.recv_room(), 2);
    }
}
