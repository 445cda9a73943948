//! One core of a client session as the rtrs bdev drives it ([`CoreQueue`]): the library's
//! RNBD queue over that core's RTRS session handle (connection `k+1` of every path),
//! carrying the IO of every device of the session. Core 0's queue also carries the
//! session's [`RnbdAdmin`] — SESS_INFO, OPEN, CLOSE and the re-open after a reconnect (the
//! kernel's `rnbd_clt_session` and its `link_ev`) — which sends its requests through it.
//!
//! A queue is polled by exactly one poll group at a time, its owner
//! (the module's `group`); it moves between groups as a value, through their mailboxes. IO
//! submitted on another thread reaches it through its session core's inbox
//! ([`super::CoreInbox`]), which the owner drains at every poll.
//!
//! A request is kept in one place from submission to completion: the library's RNBD
//! queue, which sends it when the session has a permit and its device is reachable (no
//! path, reconnecting, re-open pending: it waits, and is sent again once the device is
//! re-opened), up to `io_timeout_sec` after submission (the session's
//! `io_wait_timeout`), like NVMe-oF's controller-loss timeout. Its scatter list stays
//! in its task and is read there ([`TaskRef::into_submission`]; docs/ARCHITECTURE.md,
//! "One request, one owner").

use std::sync::Arc;

use rtrs_spdk::client::SessionCore;
use rtrs_spdk::fabric::Mr;
use rtrs_spdk::rnbd::client::{
    completion_result, ClientCompletion, ClientEvent, RnbdAdmin, RnbdQueue,
};
use rtrs_spdk::Errno;

use super::Sess;
use crate::bdev::task::{ReturnTo, TaskRef};

const BATCH: usize = 64;

/// A finished task and how it ended.
pub type Finished = (TaskRef, Result<(), Errno>);

/// The session's admin, on core 0's queue.
struct Admin {
    admin: RnbdAdmin,
    events: Vec<ClientEvent>,
    /// The session is closed and its paths are going, until then (ns).
    drain: Option<u64>,
}

/// One core's RNBD queue of a session and the bdev IO waiting for it.
pub struct CoreQueue {
    pub sess: Arc<Sess>,
    pub core: usize,
    queue: RnbdQueue<SessionCore>,
    /// On core 0 only.
    admin: Option<Box<Admin>>,
    comps: Vec<ClientCompletion>,
    /// SPDK's memory as this core last took it from the session's map.
    regions: Vec<Arc<Mr>>,
    mem_seen: u64,
}

impl CoreQueue {
    /// Core `core`'s queue of `sess`; core 0's carries the session's `admin`.
    pub fn new(
        sess: Arc<Sess>,
        core: usize,
        queue: RnbdQueue<SessionCore>,
        admin: Option<RnbdAdmin>,
    ) -> CoreQueue {
        CoreQueue {
            sess,
            core,
            queue,
            admin: admin.map(|admin| {
                Box::new(Admin {
                    admin,
                    events: vec![ClientEvent::SessInfo(Ok(0)); BATCH],
                    drain: None,
                })
            }),
            comps: vec![ClientCompletion::default(); BATCH],
            regions: Vec::new(),
            mem_seen: 0,
        }
    }

    /// Whether this queue is `sess`'s core `core`.
    pub fn is(&self, sess: &Sess, core: usize) -> bool {
        std::ptr::eq(&*self.sess, sess) && self.core == core
    }

    /// Sends `task` (on the owner's thread). From here the library's RNBD queue keeps
    /// it — waiting for a permit, for its device, or in flight — until its one
    /// completion, within the session's one `io_wait_timeout` (`io_timeout_sec`).
    pub fn submit(&mut self, now: u64, task: TaskRef, me: &dyn ReturnTo, out: &mut Vec<Finished>) {
        // Its buffer may lie in memory SPDK registered since the last poll.
        self.sync_memory();
        let s = task.into_submission();
        if let Err(e) = self.queue.submit_held(now, s.dev, s.tag, &s.req, s.sgl) {
            // Never busy: the session waits (io_timeout_sec is at least 1 s).
            self.sess.io_refused(&e);
            // SAFETY: the tag of a task just given up; the queue refused it and keeps
            // nothing of it: the task comes back here, once.
            let task = unsafe { TaskRef::from_tag(s.tag) };
            finish(out, task, Err(e.errno()), me);
        }
    }

    /// Sends the tasks other threads left in the session core's inbox.
    fn pump(&mut self, now: u64, me: &dyn ReturnTo, out: &mut Vec<Finished>) -> bool {
        let mut busy = false;
        while let Some(t) = self.sess.cores[self.core].inbox.pop() {
            self.submit(now, t, me, out);
            busy = true;
        }
        busy
    }

    /// Takes finished requests from the queue and hands their tasks back.
    fn reap(&mut self, now: u64, me: &dyn ReturnTo, out: &mut Vec<Finished>) -> bool {
        let mut busy = false;
        loop {
            let n = self.queue.poll(now, &mut self.comps);
            for c in &self.comps[..n] {
                // SAFETY: a completion's tag is that of a task we sent, handed back once.
                let task = unsafe { TaskRef::from_tag(c.tag) };
                finish(out, task, completion_result(c), me);
            }
            busy |= n > 0;
            if n < BATCH {
                return busy;
            }
        }
    }

    /// Takes SPDK's memory as the session's map has it now, when it changed.
    fn sync_memory(&mut self) {
        let mem = &self.sess.mem;
        if mem.version() == self.mem_seen {
            return;
        }
        let (version, now) = mem.regions();
        let sc = self.queue.session_mut();
        for r in &self.regions {
            if !now.iter().any(|m| Arc::ptr_eq(m, r)) {
                sc.remove_region(r.lkey());
            }
        }
        for r in &now {
            sc.add_region(Arc::clone(r));
        }
        self.regions = now;
        self.mem_seen = version;
    }

    /// Transmits the requests sent since the last push now (see `RnbdQueue::push`): the
    /// owner calls it once the completions of its poll, which may submit again, are done.
    pub fn push(&mut self) {
        self.queue.push();
    }

    /// Makes progress: the memory map's changes, waiting tasks, completions (the owner's
    /// own go to `out`, others back to their group), and on core 0 the admin.
    pub fn poll(&mut self, now: u64, me: &dyn ReturnTo, out: &mut Vec<Finished>) -> bool {
        self.sync_memory();
        let mut busy = self.pump(now, me, out);
        busy |= self.reap(now, me, out);
        if let Some(a) = self.admin.as_mut() {
            busy |= self
                .sess
                .admin_step(now, &mut a.admin, &mut self.queue, &mut a.drain);
            let n = a.admin.poll(&mut self.queue, now, &mut a.events);
            for ev in &a.events[..n] {
                self.sess
                    .admin_event(now, &mut a.admin, &mut self.queue, ev);
            }
            busy |= n > 0;
        }
        busy
    }

    /// Whether nothing is outstanding here: no request held by the queue, no task in the
    /// session core's inbox.
    pub fn is_idle(&self) -> bool {
        self.queue.is_idle() && self.sess.cores[self.core].inbox.is_empty()
    }

    /// Whether the session is closed and this core's part of it done: the owner drops
    /// the queue.
    pub fn finished(&self) -> bool {
        self.sess.is_down()
    }

    /// Fails the tasks still in the inbox (the session is going).
    pub fn fail_waiting(&self, me: &dyn ReturnTo, out: &mut Vec<Finished>) {
        while let Some(t) = self.sess.cores[self.core].inbox.pop() {
            finish(out, t, Err(Errno::ENODEV), me);
        }
    }
}

/// A request is over: into `out` when its channel is on this group's thread, else handed
/// back to its group.
fn finish(out: &mut Vec<Finished>, task: TaskRef, result: Result<(), Errno>, me: &dyn ReturnTo) {
    if task.is_on(me) {
        out.push((task, result));
    } else {
        task.hand_back(result);
    }
}
