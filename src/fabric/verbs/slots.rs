//! Send- and receive-queue occupancy, counted the way the fabric contract (and the
//! kernel's RTRS budget) counts it: a send work request holds its slot until a
//! completion is generated for it or for a later request on the same queue pair; a
//! receive holds its slot until it completes.
//!
//! Providers round queue sizes up (mlx5 to powers of two), so the hardware alone would
//! accept more than the caller asked for; counting here makes [`PostErrorKind::QueueFull`]
//! arrive exactly at the requested `max_send_wr`/`max_recv_wr` on every device.
//!
//! [`PostErrorKind::QueueFull`]: crate::fabric::PostErrorKind::QueueFull

use std::collections::VecDeque;

use crate::fabric::{QpCaps, Wc, WcOpcode};

pub(super) struct QueueSlots {
    /// Posted send requests not yet covered by a completion: whether each is signaled.
    /// Allocated once with room for `send_max`; it never grows beyond that.
    send: VecDeque<bool>,
    send_max: usize,
    recv: usize,
    recv_max: usize,
}

impl QueueSlots {
    pub fn new(caps: QpCaps) -> QueueSlots {
        QueueSlots {
            send: VecDeque::with_capacity(caps.max_send_wr as usize),
            send_max: caps.max_send_wr as usize,
            recv: 0,
            recv_max: caps.max_recv_wr as usize,
        }
    }

    pub fn send_room(&self) -> usize {
        self.send_max - self.send.len()
    }

    pub fn recv_room(&self) -> usize {
        self.recv_max - self.recv
    }

    /// Records a posted send request.
    pub fn sent(&mut self, signaled: bool) {
        debug_assert!(self.send.len() < self.send_max);
        self.send.push_back(signaled);
    }

    /// Records `n` posted receives.
    pub fn recvs_posted(&mut self, n: usize) {
        self.recv += n;
    }

    /// Frees the slots a completion covers. Failed completions are not counted: on a
    /// reliable connection any failure breaks it, and nothing is posted afterwards
    /// (verbs also leaves their opcode undefined, so send and receive cannot be told apart).
    pub fn completed(&mut self, wc: &Wc) {
        if !wc.status.is_ok() {
            return;
        }
        match wc.opcode {
            WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => self.recv = self.recv.saturating_sub(1),
            WcOpcode::Send | WcOpcode::RdmaWrite | WcOpcode::RegMr | WcOpcode::LocalInv => {
                // Send completions come in posting order; this one is the first signaled
                // request still held, and it frees every unsignaled one before it.
                while let Some(signaled) = self.send.pop_front() {
                    if signaled {
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::WcStatus;

    fn wc(opcode: WcOpcode, status: WcStatus) -> Wc {
        Wc {
            opcode,
            status,
            ..Wc::default()
        }
    }

    #[test]
    fn a_signaled_completion_frees_the_unsignaled_requests_before_it() {
        let mut s = QueueSlots::new(QpCaps {
            max_send_wr: 4,
            max_recv_wr: 2,
            max_send_sge: 1,
        });
        s.sent(false);
        s.sent(false);
        s.sent(true);
        s.sent(false);
        assert_eq!(s.send_room(), 0);
        s.completed(&wc(WcOpcode::RdmaWrite, WcStatus::Success));
        assert_eq!(s.send_room(), 3);
    }

    #[test]
    fn unsignaled_requests_hold_their_slots() {
        let mut s = QueueSlots::new(QpCaps {
            max_send_wr: 2,
            max_recv_wr: 2,
            max_send_sge: 1,
        });
        s.sent(false);
        s.sent(false);
        assert_eq!(s.send_room(), 0);
        s.completed(&wc(WcOpcode::Recv, WcStatus::Success));
        assert_eq!(s.send_room(), 0);
    }

    #[test]
    fn receives_free_one_slot_each_and_failures_free_nothing() {
        let mut s = QueueSlots::new(QpCaps {
            max_send_wr: 2,
            max_recv_wr: 3,
            max_send_sge: 1,
        });
        s.recvs_posted(3);
        assert_eq!(s.recv_room(), 0);
        s.completed(&wc(WcOpcode::RecvRdmaWithImm, WcStatus::Success));
        assert_eq!(s.recv_room(), 1);
        s.completed(&wc(WcOpcode::Recv, WcStatus::WrFlush));
        assert_eq!(s.recv_room(), 1);
    }
}
