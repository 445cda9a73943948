//! The rtrs bdev's per-core pollers: core `k` of a disk owns that core's RTRS session
//! handle (connection `k+1` of every path) and carries the IO its CPU core's channels
//! queue; the *home* core (0) also runs RNBD's admin side — SESS_INFO, OPEN, CLOSE and
//! the re-open after a reconnect (the kernel's `rnbd_clt_session` and its `link_ev`).
//! The home poller drives a disk through its life: opening, open, closing, drained.

use std::collections::VecDeque;

use rtrs_spdk::client::SessionCore;
use rtrs_spdk::engine::{Ctx, PollResult, Poller};
use rtrs_spdk::rnbd::client::{
    ClientEvent, DevHandle, IoError, PortCompletion, RnbdClient, RnbdCore,
};
use std::sync::Arc;

use super::channel::{finish, Task};
use super::disk::Disk;

const BATCH: usize = 64;
/// How long a closing disk waits for CLOSE's answer, then for its paths to go.
const CLOSE_WAIT_NS: u64 = 3_000_000_000;
/// bdev_rtrs_create waits at least this long (seconds) for the session and OPEN.
pub const OPEN_WAIT_MIN_S: u64 = 5;

enum Port {
    Home(Box<Home>),
    Other(Box<RnbdCore<SessionCore>>),
}

struct Home {
    rnbd: RnbdClient<SessionCore>,
    phase: Phase,
    events: Vec<ClientEvent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// OPEN sent; the RPC waits for its answer until the deadline (ns): before the first
    /// path connects the session has no permits, so OPEN would wait for ever.
    Opening(u64),
    Open,
    /// CLOSE sent (deadline in ns).
    Closing(u64),
    /// Session closed, waiting for its paths to go (deadline in ns).
    Draining(u64),
    Done,
}

/// One core of a disk.
pub struct CorePoller {
    disk: Arc<Disk>,
    core: usize,
    dev: DevHandle,
    port: Port,
    /// Tasks taken from the queue but not accepted yet (no free permit).
    retry: VecDeque<usize>,
    comps: Vec<PortCompletion>,
}

impl CorePoller {
    /// The home core's poller; OPEN must succeed before `open_deadline` (ns).
    pub fn home(
        disk: Arc<Disk>,
        rnbd: RnbdClient<SessionCore>,
        dev: DevHandle,
        open_deadline: u64,
    ) -> CorePoller {
        CorePoller {
            disk,
            core: 0,
            dev,
            port: Port::Home(Box::new(Home {
                rnbd,
                phase: Phase::Opening(open_deadline),
                events: vec![ClientEvent::Closed { dev }; BATCH],
            })),
            retry: VecDeque::with_capacity(1024),
            comps: Vec::new(),
        }
    }

    pub fn other(
        disk: Arc<Disk>,
        core: usize,
        rnbd: RnbdCore<SessionCore>,
        dev: DevHandle,
    ) -> CorePoller {
        CorePoller {
            disk,
            core,
            dev,
            port: Port::Other(Box::new(rnbd)),
            retry: VecDeque::with_capacity(1024),
            comps: vec![PortCompletion::default(); BATCH],
        }
    }

    fn submit(&mut self, cx: &mut dyn Ctx, task: usize) -> Result<(), IoError> {
        // SAFETY: tasks in our queue are live until finished.
        let t = unsafe { &*(task as *const Task) };
        match &mut self.port {
            Port::Home(h) => h.rnbd.submit(cx, self.dev, task as u64, &t.req, t.sges()),
            Port::Other(o) => o.submit(cx, self.dev, task as u64, &t.req, t.sges()),
        }
    }

    /// Sends queued tasks until the session has no free permit.
    fn pump(&mut self, cx: &mut dyn Ctx) -> bool {
        self.disk.take_queued(self.core, &mut self.retry);
        let mut busy = false;
        while let Some(task) = self.retry.pop_front() {
            match self.submit(cx, task) {
                Ok(()) => busy = true,
                Err(e) if e.is_busy() => {
                    self.retry.push_front(task);
                    break;
                }
                Err(e) => {
                    busy = true;
                    self.disk.log_io_error(&e);
                    // SAFETY: the task is live and finished once, here.
                    unsafe { finish(task, e.errno()) };
                }
            }
        }
        busy
    }

    fn reap_other(&mut self, cx: &mut dyn Ctx) -> bool {
        let Port::Other(o) = &mut self.port else {
            return false;
        };
        let mut busy = false;
        loop {
            let n = o.poll(cx, &mut self.comps);
            for c in &self.comps[..n] {
                // SAFETY: the tag is the address of a task we submitted; finished once.
                unsafe { finish(c.tag as usize, c.errno) };
            }
            busy |= n > 0;
            if n < self.comps.len() {
                return busy;
            }
        }
    }

    fn reap_home(&mut self, cx: &mut dyn Ctx) -> bool {
        let Port::Home(h) = &mut self.port else {
            return false;
        };
        let mut busy = false;
        loop {
            let n = h.rnbd.poll(cx, &mut h.events);
            for i in 0..n {
                let ev = h.events[i].clone();
                match ev {
                    // SAFETY: the tag is the address of a task we submitted.
                    ClientEvent::Io { tag, errno } => unsafe { finish(tag as usize, errno) },
                    ClientEvent::Opened { info, remap, .. } => {
                        if remap {
                            tracing::info!(
                                "rtrs bdev {}: device {} re-opened after a reconnect",
                                self.disk.params.name,
                                self.disk.params.device
                            );
                        } else if matches!(h.phase, Phase::Opening(_)) {
                            h.phase = Phase::Open;
                            self.disk.opened(info);
                        }
                    }
                    ClientEvent::OpenFailed { error, .. } => {
                        if matches!(h.phase, Phase::Opening(_)) {
                            self.disk.open_failed(&error.to_string());
                            h.phase = Phase::Closing(0);
                        } else {
                            tracing::warn!(
                                "rtrs bdev {}: re-opening device {} failed: {error}",
                                self.disk.params.name,
                                self.disk.params.device
                            );
                        }
                    }
                    ClientEvent::Closed { .. } => {
                        if let Phase::Closing(_) = h.phase {
                            h.phase = Phase::Closing(0);
                        }
                    }
                    ClientEvent::SessInfo(Err(e)) => {
                        tracing::warn!(
                            "rtrs bdev {}: SESS_INFO failed: {e}",
                            self.disk.params.name
                        );
                    }
                    ClientEvent::SessInfo(Ok(_)) => {}
                }
            }
            busy |= n > 0;
            if n < h.events.len() {
                return busy;
            }
        }
    }

    /// The home core's part of closing: CLOSE, close the session, wait for its paths,
    /// then let the disk stop its threads.
    fn life(&mut self, cx: &mut dyn Ctx) {
        let Port::Home(h) = &mut self.port else {
            return;
        };
        let now = cx.now();
        if let Phase::Opening(deadline) = h.phase {
            if deadline <= now && !self.disk.closing() {
                self.disk.open_failed(&format!(
                    "no path connected and OPEN answered within {} s (io_timeout_sec, at least 5)",
                    self.disk.params.io_timeout_sec.max(OPEN_WAIT_MIN_S)
                ));
            }
        }
        match h.phase {
            Phase::Opening(_) | Phase::Open if self.disk.closing() => {
                if h.rnbd.close(cx, self.dev).is_ok() {
                    h.phase = Phase::Closing(now + CLOSE_WAIT_NS);
                } else {
                    h.phase = Phase::Closing(0);
                }
            }
            Phase::Closing(deadline) if deadline <= now => {
                self.disk.close_session();
                h.phase = Phase::Draining(now + CLOSE_WAIT_NS);
            }
            Phase::Draining(deadline) if deadline <= now || self.disk.session_gone() => {
                h.phase = Phase::Done;
                self.disk.stop();
            }
            _ => {}
        }
    }
}

impl Poller for CorePoller {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let mut busy = self.pump(cx);
        busy |= match self.port {
            Port::Home(_) => self.reap_home(cx),
            Port::Other(_) => self.reap_other(cx),
        };
        if matches!(self.port, Port::Home(_)) {
            self.life(cx);
        }
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }
}
