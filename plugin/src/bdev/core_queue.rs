//! The rtrs bdev's per-core queues: core `k` of a disk has that core's RNBD queue
//! ([`RnbdQueue`] over the core's RTRS session handle, connection `k+1` of every path)
//! and the bdev IO waiting for it, the same on every core. Core 0's queue also carries
//! the session's [`RnbdAdmin`] — SESS_INFO, OPEN, CLOSE and the re-open after a
//! reconnect (the kernel's `rnbd_clt_session` and its `link_ev`) — which sends its
//! requests through that queue; it hands its events to the disk and lets it take its
//! life's next step after every poll ([`CoreDisk`], which the disk implements: this
//! layer sits below it).
//!
//! A core's queue ([`CoreQueue`]) is polled by exactly one party at a time, its
//! *owner*: the IO channel that took it (see [`super::channel`]) or, when no channel
//! holds it, the disk's own thread on that core ([`SlotPoller`]). It moves between them
//! through its [`CoreSlot`]: a channel that may own it announces itself
//! ([`CoreSlot::want`]), the slot poller then parks the queue in the slot and the
//! channel takes it; a channel that goes parks it again, for the next channel that
//! wants it or, when none does, for the slot poller. The IO of channels that do not own
//! their core's queue goes through the slot's task queue, which every owner pumps.
//!
//! IO that finds the device unreachable (no path, reconnecting, re-open pending) is not
//! failed at once: the library's RNBD queue keeps it and sends it again once the device
//! is re-opened, up to `io_timeout_sec` after submission (the session's
//! `io_wait_timeout`), like NVMe-oF's controller-loss timeout. A core queue only retries
//! requests the session had no free permit for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rtrs_spdk::client::SessionCore;
use rtrs_spdk::engine::{Ctx, PollResult, Poller};
use rtrs_spdk::rnbd::client::{
    completion_result, ClientCompletion, ClientEvent, DevHandle, RnbdAdmin, RnbdQueue,
};
use rtrs_spdk::Errno;

use super::handoff::Handoff;
use super::task::{ChanShared, TaskRef};

const BATCH: usize = 64;

/// What a core queue needs of the disk it carries IO for.
pub trait CoreDisk: Send + Sync {
    /// Core `core`'s slot.
    fn slot(&self, core: usize) -> &CoreSlot;
    /// A request was refused for good (logged, rate-limited).
    fn io_refused(&self, e: &dyn std::fmt::Display);
    /// An admin event (OPEN's answer, CLOSE's, a re-open).
    fn admin_event(&self, ev: ClientEvent);
    /// After each poll of core 0's queue: the disk's life moves on (the opening
    /// deadline, CLOSE, closing the session, stopping).
    fn home_step(
        &self,
        now: u64,
        admin: &mut RnbdAdmin,
        queue: &mut RnbdQueue<SessionCore>,
        dev: DevHandle,
    );
}

/// Where core `k`'s queue is when no one polls it, and the IO of channels that do not
/// own it.
pub struct CoreSlot {
    /// Tasks waiting for the queue's owner.
    tasks: Handoff<TaskRef>,
    parked: Mutex<Option<Box<CoreQueue>>>,
    /// Channels that may own the queue and do not yet.
    waiting: AtomicUsize,
    /// The CPU core whose reactor thread(s) may own the queue (`u32::MAX`: none).
    pub cpu: u32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl CoreSlot {
    pub fn new(cpu: u32) -> CoreSlot {
        CoreSlot {
            tasks: Handoff::default(),
            parked: Mutex::new(None),
            waiting: AtomicUsize::new(0),
            cpu,
        }
    }

    pub fn enqueue(&self, task: TaskRef) {
        self.tasks.push(task);
    }

    fn take_queued(&self, into: &mut VecDeque<TaskRef>) {
        self.tasks.take_into(into);
    }

    /// The parked queue, waiting for its lock if needed (a disk going: no channel is
    /// left).
    fn take_parked(&self) -> Option<Box<CoreQueue>> {
        lock(&self.parked).take()
    }

    /// A channel that may own the queue asks for it.
    pub fn want(&self) {
        self.waiting.fetch_add(1, Ordering::AcqRel);
    }

    /// A channel that asked for the queue no longer does (it took it, or it goes).
    pub fn unwant(&self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }

    fn wanted(&self) -> bool {
        self.waiting.load(Ordering::Acquire) > 0
    }

    /// The parked queue, if it is parked (never blocks: the slot's lock is only held to
    /// move the queue in or out).
    pub fn try_take(&self) -> Option<Box<CoreQueue>> {
        self.parked.try_lock().ok()?.take()
    }

    /// Leaves the queue in the slot for its next owner.
    pub fn park(&self, queue: Box<CoreQueue>) {
        *lock(&self.parked) = Some(queue);
    }
}

/// The session's admin, on core 0's queue.
struct Admin {
    admin: RnbdAdmin,
    events: Vec<ClientEvent>,
}

/// One core's RNBD queue of a disk and the bdev IO it carries.
pub struct CoreQueue {
    disk: Arc<dyn CoreDisk>,
    core: usize,
    dev: DevHandle,
    queue: RnbdQueue<SessionCore>,
    /// On core 0 only.
    admin: Option<Box<Admin>>,
    /// Tasks not accepted yet (no free permit): tried again on every poll.
    retry: VecDeque<TaskRef>,
    comps: Vec<ClientCompletion>,
    /// Finished tasks of the owning channel, which completes them after its poll.
    pub mine: Vec<(TaskRef, Result<(), Errno>)>,
}

impl CoreQueue {
    /// Core `core`'s queue for device `dev`; core 0's carries the session's `admin`.
    pub fn new(
        disk: Arc<dyn CoreDisk>,
        core: usize,
        queue: RnbdQueue<SessionCore>,
        admin: Option<RnbdAdmin>,
        dev: DevHandle,
    ) -> CoreQueue {
        CoreQueue {
            disk,
            core,
            dev,
            queue,
            admin: admin.map(|admin| {
                Box::new(Admin {
                    admin,
                    events: vec![ClientEvent::Closed { dev }; BATCH],
                })
            }),
            retry: VecDeque::with_capacity(1024),
            comps: vec![ClientCompletion::default(); BATCH],
            mine: Vec::with_capacity(256),
        }
    }

    /// Sends `task` for the channel `owner` (its own task, on its thread): no queue.
    pub fn submit_own(&mut self, now: u64, task: TaskRef, owner: &ChanShared) {
        if self.retry.is_empty() {
            self.send(now, task, Some(owner));
        } else {
            // Keep the order of tasks waiting for a permit.
            self.retry.push_back(task);
        }
    }

    /// Tries to send `task`; returns false when it has to wait for a permit.
    /// An accepted task's handle is given up: its completion's tag brings it back.
    fn send(&mut self, now: u64, task: TaskRef, owner: Option<&ChanShared>) -> bool {
        let t = &*task;
        match self
            .queue
            .submit(now, self.dev, task.tag(), &t.req, t.sges())
        {
            Ok(()) => true,
            Err(e) if e.is_busy() => {
                self.retry.push_back(task);
                false
            }
            Err(e) => {
                self.disk.io_refused(&e);
                finish(&mut self.mine, task, Err(e.errno()), owner);
                true
            }
        }
    }

    /// Sends waiting tasks until the session has no free permit.
    fn pump(&mut self, now: u64, owner: Option<&ChanShared>) -> bool {
        self.disk.slot(self.core).take_queued(&mut self.retry);
        let mut busy = false;
        while let Some(task) = self.retry.pop_front() {
            // Retried tasks must not cycle back into `retry` within one pump.
            let n = self.retry.len();
            if !self.send(now, task, owner) {
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

    /// Takes finished requests from the queue and hands their tasks back.
    fn reap(&mut self, now: u64, owner: Option<&ChanShared>) -> bool {
        let mut busy = false;
        loop {
            let n = self.queue.poll(now, &mut self.comps);
            for c in &self.comps[..n] {
                // SAFETY: a completion's tag is that of a task we sent, handed back once.
                let task = unsafe { TaskRef::from_tag(c.tag) };
                finish(&mut self.mine, task, completion_result(c), owner);
            }
            busy |= n > 0;
            if n < BATCH {
                return busy;
            }
        }
    }

    /// Transmits the requests sent since the last push now (see `RnbdQueue::push`): the
    /// owner calls it once the completions of its poll, which may submit again, are done.
    pub fn push(&mut self) {
        self.queue.push();
    }

    /// Makes progress: sends waiting tasks, reaps completions (the owner's own ones go
    /// to [`mine`](Self::mine)), and on core 0 runs the admin and the disk's life.
    pub fn poll(&mut self, now: u64, owner: Option<&ChanShared>) -> bool {
        let mut busy = self.pump(now, owner);
        busy |= self.reap(now, owner);
        if let Some(a) = self.admin.as_mut() {
            let n = a.admin.poll(&mut self.queue, now, &mut a.events);
            for ev in &a.events[..n] {
                self.disk.admin_event(ev.clone());
            }
            busy |= n > 0;
            self.disk
                .home_step(now, &mut a.admin, &mut self.queue, self.dev);
        }
        busy
    }
}

/// A request is over: into the owner's `mine`, or handed back to its channel.
fn finish(
    mine: &mut Vec<(TaskRef, Result<(), Errno>)>,
    task: TaskRef,
    result: Result<(), Errno>,
    owner: Option<&ChanShared>,
) {
    if owner.is_some_and(|o| task.is_of(o)) {
        mine.push((task, result));
    } else {
        task.hand_back(result);
    }
}

/// The disk's thread on core `k`: polls the core's queue while no IO channel owns it.
pub struct SlotPoller {
    disk: Arc<dyn CoreDisk>,
    core: usize,
    queue: Option<Box<CoreQueue>>,
}

impl SlotPoller {
    pub fn new(queue: CoreQueue) -> SlotPoller {
        SlotPoller {
            disk: Arc::clone(&queue.disk),
            core: queue.core,
            queue: Some(Box::new(queue)),
        }
    }
}

impl Poller for SlotPoller {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let slot = self.disk.slot(self.core);
        if self.queue.is_none() && !slot.wanted() {
            self.queue = slot.try_take();
        }
        let Some(queue) = self.queue.as_mut() else {
            return PollResult::Idle;
        };
        if slot.wanted() {
            if let Some(q) = self.queue.take() {
                slot.park(q);
            }
            return PollResult::Busy;
        }
        let busy = queue.poll(cx.now(), None);
        queue.push();
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    fn shutdown(&mut self, _cx: &mut dyn Ctx) {
        // The disk is going: every channel is gone, so a parked queue is taken back to
        // be dropped here, on its core (it holds the disk: left in the slot it would
        // never go).
        if self.queue.is_none() {
            self.queue = self.disk.slot(self.core).take_parked();
        }
    }
}
