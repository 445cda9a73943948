//! Requests that wait for their device or for a free permit (see "Waiting for the
//! device" in the [`queue`](super) module doc): the waiting queue is looked at when the
//! published device table changed, the session got a path, a wait ends, or a send found
//! no free permit; what the device allows again is sent, what it refuses or what waited
//! `io_wait_timeout` fails.

use std::time::Duration;

use super::{look, Look, RnbdQueue, Stage, Why};
use crate::client::{ClientCompletion, ClientIo, PathWait, Sgl};
use crate::rnbd::client::device::DevState;
use crate::rnbd::client::handle::{RnbdSendError, SessionHandle};
use crate::rnbd::client::rtrs::completion;
use crate::rnbd::client::IoError;
use crate::Errno;

/// At most one log line a second about requests whose wait ran out.
const LOG_EVERY_NS: u64 = 1_000_000_000;

/// Whether a request that ended with `result` may succeed once the device is open again.
pub(super) fn waits_for_device(result: Result<(), Errno>) -> bool {
    matches!(result, Err(Errno::ENOTCONN | Errno::ECONNRESET))
}

impl<S: SessionHandle> RnbdQueue<S> {
    /// Goes through the waiting queue when something changed: sends what the device
    /// allows again, fails what it refuses or what waited too long (into `out`).
    pub(super) fn drive(&mut self, now: u64, out: &mut [ClientCompletion]) -> usize {
        let version = self.snap.version();
        let epoch = self.session.path_epoch();
        if version == self.seen && epoch == self.epoch_seen && !self.again && now < self.next_end {
            return 0;
        }
        self.seen = version;
        self.epoch_seen = epoch;
        self.again = false;
        self.next_end = u64::MAX;
        let mut k = 0;
        let mut busy = false;
        for _ in 0..self.waiting.len() {
            let Some(i) = self.waiting.pop_front() else {
                break;
            };
            let i = i as usize;
            let for_permit = std::mem::take(&mut self.reqs[i].for_permit);
            if for_permit {
                self.permit_waits -= 1;
            }
            let s = &self.reqs[i];
            // An id the server did not know is tried again only with a newer table, a
            // request no path could carry only once the session got a path.
            let may_send = !busy
                && match s.why {
                    Why::Back(Errno::ENOTCONN) => s.version != version,
                    Why::NoPath => s.epoch != epoch,
                    Why::Device | Why::Back(_) => true,
                };
            // Whether it goes on waiting for a permit (not for its device), or for a path.
            let mut permit = false;
            let mut no_path = false;
            let result: Result<(), Option<Errno>> = match self.snap.device(s.dev) {
                None => Err(Some(Errno::ENODEV)),
                Some(d) => match look(d, &s.req, true) {
                    Look::Send(msg, dir) if may_send => {
                        let usr = msg.to_bytes();
                        let io = ClientIo {
                            tag: i as u64,
                            dir,
                            usr: &usr,
                            sgl: Sgl::Held(s.sgl()),
                            admin: false,
                            wait: PathWait::Caller,
                        };
                        match self.session.submit(now, io) {
                            Ok(()) => {
                                self.mark_sent(i);
                                continue;
                            }
                            Err(RnbdSendError::Busy) => {
                                busy = true;
                                permit = true;
                                Err(None)
                            }
                            Err(RnbdSendError::Unreachable) => {
                                no_path = true;
                                Err(None)
                            }
                            Err(RnbdSendError::Refused { errno, .. }) => Err(Some(errno)),
                        }
                    }
                    Look::Send(..) => {
                        permit = for_permit;
                        Err(None)
                    }
                    Look::Wait => Err(None),
                    Look::Fail(e) => Err(Some(e.errno())),
                },
            };
            if no_path {
                self.reqs[i].why = Why::NoPath;
                self.reqs[i].epoch = epoch;
            }
            let errno = match result {
                Err(None) if now < self.end(i) => {
                    self.next_end = self.next_end.min(self.end(i));
                    if permit {
                        self.reqs[i].for_permit = true;
                        self.permit_waits += 1;
                    }
                    self.waiting.push_back(i as u32);
                    continue;
                }
                Err(None) if permit => {
                    self.reqs[i].for_permit = true;
                    self.ran_out(i, now)
                }
                Ok(()) | Err(None) => self.ran_out(i, now),
                Err(Some(e)) => e,
            };
            if self.reqs[i].piece {
                let tag = self.reqs[i].tag;
                self.free_request(i);
                self.zero.piece_done(tag, Err(errno));
                continue;
            }
            if k == out.len() {
                // No room to hand it back now: next poll.
                self.waiting.push_back(i as u32);
                self.again = true;
                continue;
            }
            self.reqs[i].for_permit = false;
            out[k] = completion(self.reqs[i].tag, Err(errno));
            k += 1;
            self.free_request(i);
        }
        self.again |= busy;
        k
    }

    /// The end of entry `i`'s wait (ns).
    pub(super) fn end(&self, i: usize) -> u64 {
        self.reqs[i].since.saturating_add(self.wait_ns)
    }

    /// Entry `i` waited `io_wait_timeout` for its device: records and logs why it
    /// fails; returns its errno.
    pub(super) fn ran_out(&mut self, i: usize, now: u64) -> Errno {
        let s = &self.reqs[i];
        let Some(d) = self.snap.device(s.dev) else {
            return Errno::ENODEV;
        };
        let (name, state) = (d.name().to_string(), d.state());
        // The OS's text of the errno, as the log has always shown it.
        let text = |e: Errno| std::io::Error::from_raw_os_error(e.get()).to_string();
        let reason = match (s.why, state) {
            _ if s.for_permit => {
                "no free request slot on the session (all of its queue depth in use)".to_string()
            }
            (Why::Device | Why::NoPath, DevState::MappedDisconnected) => {
                "no connection to the server (waiting for a reconnect and the device's re-open)"
                    .to_string()
            }
            (Why::Back(e), DevState::MappedDisconnected) => format!(
                "no connection to the server (waiting for a reconnect and the device's \
                 re-open; last attempt: {})",
                text(e)
            ),
            (Why::NoPath, _) => {
                "no path of the session connected on this core (waiting for one)".to_string()
            }
            (Why::Device, _) => "the device was disconnected (waiting for its re-open)".to_string(),
            (Why::Back(e), _) => format!("every attempt failed: {}", text(e)),
        };
        let e = IoError::Unreachable {
            name,
            waited: Duration::from_nanos(self.wait_ns),
            reason,
        };
        self.log(now, &e);
        self.last_error = Some(e);
        Errno::ENOTCONN
    }

    pub(super) fn log(&mut self, now: u64, what: &dyn std::fmt::Display) {
        if now < self.log_next {
            self.log_suppressed += 1;
            return;
        }
        if self.log_suppressed > 0 {
            tracing::error!(
                "rnbd: {what} (and {} more failures in the last second)",
                self.log_suppressed
            );
        } else {
            tracing::error!("rnbd: {what}");
        }
        self.log_next = now.saturating_add(LOG_EVERY_NS);
        self.log_suppressed = 0;
    }

    /// Entry `i` waits for a free permit, behind the others that do.
    pub(super) fn wait_permit(&mut self, i: usize) {
        self.wait(i, Why::Device);
        self.reqs[i].for_permit = true;
        self.permit_waits += 1;
        self.again = true;
    }

    pub(super) fn wait(&mut self, i: usize, why: Why) {
        self.reqs[i].stage = Stage::Waiting;
        self.reqs[i].why = why;
        self.next_end = self.next_end.min(self.end(i));
        self.waiting.push_back(i as u32);
    }
}
