//! The rtrs bdev's per-core ports: core `k` of a disk has that core's RTRS session handle
//! (connection `k+1` of every path) and the IO waiting for it; the *home* core (0) also
//! runs RNBD's admin side — SESS_INFO, OPEN, CLOSE and the re-open after a reconnect (the
//! kernel's `rnbd_clt_session` and its `link_ev`). The home port hands its admin events
//! to the disk and lets it take its life's next step after every poll ([`PortDisk`], which
//! the disk implements: this layer sits below it).
//!
//! A port ([`PortState`]) is polled by exactly one party at a time, its *owner*: the IO
//! channel that took it (see [`super::channel`]) or, when no channel holds it, the disk's
//! own thread on that core ([`CorePoller`]). It moves between them through its
//! [`CoreSlot`]: a channel that may own it announces itself ([`CoreSlot::want`]), the core
//! poller then parks the port in the slot and the channel takes it; a channel that goes
//! parks it again, for the next channel that wants it or, when none does, for the core
//! poller. The IO of channels that do not own their core's port goes through the slot's
//! queue, which every owner pumps.
//!
//! IO that finds the device unreachable (no path, reconnecting, re-open pending) is not
//! failed at once: the library's RNBD client keeps it and sends it again once the device
//! is re-opened, up to `io_timeout_sec` after submission (the session's
//! `io_wait_timeout`), like NVMe-oF's controller-loss timeout. A port only retries
//! requests the session had no free permit for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rtrs_spdk::client::SessionCore;
use rtrs_spdk::engine::{Ctx, PollResult, Poller};
use rtrs_spdk::rnbd::client::{ClientEvent, DevHandle, PortCompletion, RnbdClient, RnbdCore};

use super::task::{ChanShared, TaskRef};

const BATCH: usize = 64;

/// What a port needs of the disk it carries IO for.
pub trait PortDisk: Send + Sync {
    /// Core `core`'s slot.
    fn slot(&self, core: usize) -> &CoreSlot;
    /// A request was refused for good (logged, rate-limited).
    fn io_refused(&self, e: &dyn std::fmt::Display);
    /// An admin event of the home port (OPEN's answer, CLOSE's, a re-open).
    fn admin_event(&self, ev: ClientEvent);
    /// After each poll of the home port: the disk's life moves on (the opening
    /// deadline, CLOSE, closing the session, stopping).
    fn home_step(&self, cx: &mut dyn Ctx, rnbd: &mut RnbdClient<SessionCore>, dev: DevHandle);
}

/// Where core `k`'s port is when no one polls it, and the IO of channels that do not
/// own it.
pub struct CoreSlot {
    /// Tasks waiting for the port's owner.
    queue: Mutex<VecDeque<TaskRef>>,
    parked: Mutex<Option<Box<PortState>>>,
    /// Channels that may own the port and do not yet.
    waiting: AtomicUsize,
    /// The CPU core whose reactor thread(s) may own the port (`u32::MAX`: none).
    pub cpu: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CoreSlot {
    pub fn new(cpu: u32) -> CoreSlot {
        CoreSlot {
            queue: Mutex::new(VecDeque::new()),
            parked: Mutex::new(None),
            waiting: AtomicUsize::new(0),
            cpu,
        }
    }

    pub fn enqueue(&self, task: TaskRef) {
        lock(&self.queue).push_back(task);
    }

    fn take_queued(&self, into: &mut VecDeque<TaskRef>) {
        let mut q = lock(&self.queue);
        if !q.is_empty() {
            into.extend(q.drain(..));
        }
    }

    /// The parked port, waiting for its lock if needed (a disk going: no channel is left).
    fn take_parked(&self) -> Option<Box<PortState>> {
        lock(&self.parked).take()
    }

    /// A channel that may own the port asks for it.
    pub fn want(&self) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
    }

    /// A channel that asked for the port no longer does (it took it, or it goes).
    pub fn unwant(&self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    fn wanted(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// The parked port, if it is parked (never blocks: the slot's lock is only held to
    /// move the port in or out).
    pub fn try_take(&self) -> Option<Box<PortState>> {
        self.parked.try_lock().ok()?.take()
    }

    /// Leaves the port in the slot for its next owner.
    pub fn park(&self, port: Box<PortState>) {
        *lock(&self.parked) = Some(port);
    }
}

enum Port {
    Home(Box<Home>),
    Other(Box<RnbdCore<SessionCore>>),
}

struct Home {
    rnbd: RnbdClient<SessionCore>,
    events: Vec<ClientEvent>,
}

/// One core's port of a disk and the IO it carries.
pub struct PortState {
    disk: Arc<dyn PortDisk>,
    core: usize,
    dev: DevHandle,
    port: Port,
    /// Tasks not accepted yet (no free permit): tried again on every poll.
    retry: VecDeque<TaskRef>,
    comps: Vec<PortCompletion>,
    /// Completions taken from the port in this poll.
    reaped: Vec<(TaskRef, i32)>,
    /// Finished tasks of the owning channel, which completes them after its poll.
    pub mine: Vec<(TaskRef, i32)>,
}

impl PortState {
    /// The home core's port (OPEN sent on `rnbd`).
    pub fn home(
        disk: Arc<dyn PortDisk>,
        rnbd: RnbdClient<SessionCore>,
        dev: DevHandle,
    ) -> PortState {
        PortState::new(
            disk,
            0,
            dev,
            Port::Home(Box::new(Home {
                rnbd,
                events: vec![ClientEvent::Closed { dev }; BATCH],
            })),
        )
    }

    pub fn other(
        disk: Arc<dyn PortDisk>,
        core: usize,
        rnbd: RnbdCore<SessionCore>,
        dev: DevHandle,
    ) -> PortState {
        PortState::new(disk, core, dev, Port::Other(Box::new(rnbd)))
    }

    fn new(disk: Arc<dyn PortDisk>, core: usize, dev: DevHandle, port: Port) -> PortState {
        PortState {
            disk,
            core,
            dev,
            port,
            retry: VecDeque::with_capacity(1024),
            comps: vec![PortCompletion::default(); BATCH],
            reaped: Vec::with_capacity(BATCH),
            mine: Vec::with_capacity(256),
        }
    }

    /// Sends `task` for the channel `owner` (its own task, on its thread): no queue.
    pub fn submit_own(&mut self, cx: &mut dyn Ctx, task: TaskRef, owner: &ChanShared) {
        if self.retry.is_empty() {
            self.send(cx, task, Some(owner));
        } else {
            // Keep the order of tasks waiting for a permit.
            self.retry.push_back(task);
        }
    }

    /// Tries to send `task`; returns false when it has to wait for a permit.
    /// An accepted task's handle is given up: its completion's tag brings it back.
    fn send(&mut self, cx: &mut dyn Ctx, task: TaskRef, owner: Option<&ChanShared>) -> bool {
        let t = &*task;
        let r = match &mut self.port {
            Port::Home(h) => h.rnbd.submit(cx, self.dev, task.tag(), &t.req, t.sges()),
            Port::Other(o) => o.submit(cx, self.dev, task.tag(), &t.req, t.sges()),
        };
        match r {
            Ok(()) => true,
            Err(e) if e.is_busy() => {
                self.retry.push_back(task);
                false
            }
            Err(e) => {
                self.disk.io_refused(&e);
                self.finish(task, e.errno(), owner);
                true
            }
        }
    }

    /// A request is over: hand it back to its channel.
    fn finish(&mut self, task: TaskRef, errno: i32, owner: Option<&ChanShared>) {
        if owner.is_some_and(|o| task.is_of(o)) {
            self.mine.push((task, errno));
        } else {
            task.hand_back(errno);
        }
    }

    /// Sends waiting tasks until the session has no free permit.
    fn pump(&mut self, cx: &mut dyn Ctx, owner: Option<&ChanShared>) -> bool {
        self.disk.slot(self.core).take_queued(&mut self.retry);
        let mut busy = false;
        while let Some(task) = self.retry.pop_front() {
            // Retried tasks must not cycle back into `retry` within one pump.
            let n = self.retry.len();
            if !self.send(cx, task, owner) {
                // Put back in front of the others: it stays first in line.
                if let Some(t) = self.retry.pop_back() {
                    debug_assert_eq!(self.retry.len(), n);
                    self.retry.push_front(t);
                }
                break;
            }
            busy = true;
        }
        busy
    }

    fn reap(&mut self, cx: &mut dyn Ctx) -> bool {
        let mut busy = false;
        loop {
            let n = match &mut self.port {
                Port::Other(o) => {
                    let n = o.poll(cx, &mut self.comps);
                    self.reaped.extend(self.comps[..n].iter().map(|c| {
                        // SAFETY: a completion's tag is that of a task we sent, handed
                        // back once.
                        (unsafe { TaskRef::from_tag(c.tag) }, c.errno)
                    }));
                    n
                }
                Port::Home(h) => {
                    let n = h.rnbd.poll(cx, &mut h.events);
                    for i in 0..n {
                        if let ClientEvent::Io { tag, errno } = h.events[i] {
                            // SAFETY: as above.
                            self.reaped.push((unsafe { TaskRef::from_tag(tag) }, errno));
                        } else {
                            self.disk.admin_event(h.events[i].clone());
                        }
                    }
                    n
                }
            };
            busy |= n > 0;
            if n < BATCH {
                return busy;
            }
        }
    }

    /// Makes progress: sends waiting tasks, reaps completions (the owner's own ones go
    /// to [`mine`](Self::mine)), and on the home core drives the disk's life.
    pub fn poll(&mut self, cx: &mut dyn Ctx, owner: Option<&ChanShared>) -> bool {
        let mut busy = self.pump(cx, owner);
        busy |= self.reap(cx);
        if !self.reaped.is_empty() {
            let mut reaped = std::mem::take(&mut self.reaped);
            for (task, errno) in reaped.drain(..) {
                self.finish(task, errno, owner);
            }
            self.reaped = reaped;
        }
        if let Port::Home(h) = &mut self.port {
            self.disk.home_step(cx, &mut h.rnbd, self.dev);
        }
        busy
    }
}

/// The disk's thread on core `k`: polls the core's port while no IO channel owns it.
pub struct CorePoller {
    disk: Arc<dyn PortDisk>,
    core: usize,
    port: Option<Box<PortState>>,
}

impl CorePoller {
    pub fn new(port: PortState) -> CorePoller {
        CorePoller {
            disk: Arc::clone(&port.disk),
            core: port.core,
            port: Some(Box::new(port)),
        }
    }
}

impl Poller for CorePoller {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let slot = self.disk.slot(self.core);
        if self.port.is_none() && !slot.wanted() {
            self.port = slot.try_take();
        }
        let Some(port) = self.port.as_mut() else {
            return PollResult::Idle;
        };
        if slot.wanted() {
            if let Some(p) = self.port.take() {
                slot.park(p);
            }
            return PollResult::Busy;
        }
        if port.poll(cx, None) {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    fn shutdown(&mut self, _cx: &mut dyn Ctx) {
        // The disk is going: every channel is gone, so a parked port is taken back to be
        // dropped here, on its core (it holds the disk: left in the slot it would never go).
        if self.port.is_none() {
            self.port = self.disk.slot(self.core).take_parked();
        }
    }
}
