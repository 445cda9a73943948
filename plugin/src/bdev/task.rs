//! One bdev IO's request as the rtrs bdev carries it (the kernel's `rnbd_iu`): the
//! [`Task`] lives in the IO's `driver_ctx` (SPDK's per-IO context, `get_ctx_size` bytes),
//! and a [`TaskRef`] is the one handle to it that travels — through a session core's
//! queue, as the tag of the RTRS request, back to its channel's poll group — until the IO
//! is completed. What a channel shares with the rest is [`ChanShared`]: its poll group
//! (where a task finished by another group goes back to) and its counters.
//!
//! This is the one place that converts between the IO's `driver_ctx` and our task, and
//! between a task and a request tag.

use std::mem::{align_of, size_of};
use std::ptr::NonNull;
use std::sync::Arc;

use rtrs_spdk::client::SglRef;
use rtrs_spdk::fabric::Sge;
use rtrs_spdk::rnbd::client::{BlockRequest, DevHandle};
use rtrs_spdk::spdk::{sys, BdevIo};
use rtrs_spdk::sync::SoloCounter;
use rtrs_spdk::Errno;

/// Most iovecs one bdev IO may have (the bdev layer splits larger ones: `max_num_segments`).
pub const MAX_IOVS: u32 = 16;
/// An iovec becomes at most two SGEs (it may straddle two fabric registrations).
pub const TASK_SGES: usize = 2 * MAX_IOVS as usize;

/// Our part of a bdev IO (its `driver_ctx`).
pub struct Task {
    io: BdevIo,
    /// The channel the completion goes back to; it lives while the IO is outstanding
    /// (SPDK destroys a channel only once its IO completed).
    chan: NonNull<ChanShared>,
    /// The device of the session the request is for.
    pub dev: DevHandle,
    pub req: BlockRequest,
    nsge: usize,
    sgl: [Sge; TASK_SGES],
}

// The task is written at the start of `driver_ctx`, which is aligned as the IO.
const _: () = assert!(align_of::<Task>() <= align_of::<sys::spdk_bdev_io>());

/// Size of [`Task`] for the module's `get_ctx_size`.
pub fn task_size() -> i32 {
    size_of::<Task>() as i32
}

impl Task {
    pub fn sges(&self) -> &[Sge] {
        &self.sgl[..self.nsge]
    }

    /// The bdev IO with the scatter list to fill from its buffer, and the list's length.
    pub fn sgl_mut(&mut self) -> (&BdevIo, &mut [Sge; TASK_SGES], &mut usize) {
        (&self.io, &mut self.sgl, &mut self.nsge)
    }

    /// The channel the task belongs to.
    pub fn chan(&self) -> &ChanShared {
        // SAFETY: the channel outlives its outstanding IO (see the field).
        unsafe { self.chan.as_ref() }
    }
}

/// A task as a session core's queue takes it ([`TaskRef::into_submission`]).
pub struct Submission {
    pub tag: u64,
    pub dev: DevHandle,
    pub req: BlockRequest,
    /// The scatter list, where it lies in the task.
    pub sgl: SglRef,
}

/// The handle of a live task: created once per bdev IO, moved (never copied) until the
/// IO completes, which consumes it.
pub struct TaskRef(NonNull<Task>);

// SAFETY: the task is owned by whoever holds its one TaskRef; the handle moves between
// threads through lock-free queues (a session core's inbox, a group's `done`), and the
// task's contents (a BdevIo, which is Send, plain data, a pointer to the Sync
// ChanShared) may be used from any thread.
unsafe impl Send for TaskRef {}

impl TaskRef {
    /// Writes the task of `io` into its `driver_ctx`; `chan` is the submitting channel,
    /// `dev` the device of the session.
    pub fn new(io: BdevIo, chan: &ChanShared, dev: DevHandle, req: BlockRequest) -> TaskRef {
        let at = io.driver_ctx().cast::<Task>();
        // SAFETY: driver_ctx is `task_size()` bytes (our get_ctx_size), aligned for Task
        // (checked above), ours until the IO completes; nothing else refers to it.
        unsafe {
            at.as_ptr().write(Task {
                io,
                chan: NonNull::from(chan),
                dev,
                req,
                nsge: 0,
                sgl: [Sge::default(); TASK_SGES],
            });
        }
        TaskRef(at)
    }

    /// The tag the task's RTRS request carries.
    pub fn tag(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    /// What a session core's queue takes of the task, the handle given up: it comes back
    /// through the tag ([`from_tag`](Self::from_tag)), once, at the request's completion
    /// or when the queue refuses it. The scatter list is not copied: the queue and the
    /// session read it in the task (docs/ARCHITECTURE.md, "One request, one owner").
    pub fn into_submission(self) -> Submission {
        let t = &*self;
        Submission {
            tag: self.tag(),
            dev: t.dev,
            req: t.req,
            // SAFETY: the task lives in its IO's driver_ctx until the IO completes, which
            // is after the request's completion or refusal; this handle, the only one, is
            // consumed here, so nothing changes the task (its list included) until the
            // tag brings it back.
            sgl: unsafe { SglRef::new(t.sges()) },
        }
    }

    /// The task whose request carried `tag`.
    ///
    /// # Safety
    /// `tag` must come from [`tag`](Self::tag) or a [`Submission`] of a task that is still
    /// live and whose `TaskRef` was given up (the request's completion, or its refusal,
    /// hands it back, once).
    pub unsafe fn from_tag(tag: u64) -> TaskRef {
        // SAFETY: per the contract the tag is a live task's address.
        TaskRef(unsafe { NonNull::new_unchecked(tag as *mut Task) })
    }

    /// Whether the task's channel is served by `group` (runs on its thread).
    pub fn is_on(&self, group: &dyn ReturnTo) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.chan().group), group)
    }

    /// Hands the finished task back to its channel's group, which completes it on its
    /// thread.
    pub fn hand_back(self, result: Result<(), Errno>) {
        let chan = self.chan;
        // SAFETY: the channel outlives the task (see Task::chan).
        let chan = unsafe { chan.as_ref() };
        chan.group.finished(self, result);
    }

    /// Completes the bdev IO on its channel's thread (the caller's): the task is over.
    pub fn complete(self, result: Result<(), Errno>) {
        self.chan().count_completed();
        self.into_io().complete_with(result);
    }

    /// The bdev IO, for completion: the task is over.
    pub fn into_io(self) -> BdevIo {
        // SAFETY: the task is live and this is its last use: the IO moves out once, and
        // Task has no drop of its own to run.
        unsafe { std::ptr::read(&self.0.as_ref().io) }
    }
}

impl std::ops::Deref for TaskRef {
    type Target = Task;
    fn deref(&self) -> &Task {
        // SAFETY: the task is live while its one handle exists.
        unsafe { self.0.as_ref() }
    }
}

impl std::ops::DerefMut for TaskRef {
    fn deref_mut(&mut self) -> &mut Task {
        // SAFETY: as in deref; the handle is unique, so the borrow is exclusive.
        unsafe { self.0.as_mut() }
    }
}

/// Where a task finished on another thread goes: the poll group of its channel's thread
/// (the module's `group::GroupShared`), which completes it there.
pub trait ReturnTo: Send + Sync {
    /// `task` is over with `result`; complete it on the group's thread.
    fn finished(&self, task: TaskRef, result: Result<(), Errno>);
}

/// What a channel shares with the session cores that carry its IO and with resets.
pub struct ChanShared {
    /// The poll group of the channel's thread: a task another group finished goes there.
    group: Arc<dyn ReturnTo>,
    /// Bdev IO taken (resets aside) and completed; written by the channel's thread only.
    submitted: SoloCounter,
    completed: SoloCounter,
}

impl ChanShared {
    pub fn new(group: Arc<dyn ReturnTo>) -> ChanShared {
        ChanShared {
            group,
            submitted: SoloCounter::new(0),
            completed: SoloCounter::new(0),
        }
    }

    /// Requests of this channel not completed yet.
    pub fn outstanding(&self) -> u64 {
        let done = self.completed.get();
        self.submitted.get().saturating_sub(done)
    }

    /// One more IO taken (on the channel's thread only).
    pub fn count_submitted(&self) {
        self.submitted.add(1);
    }

    /// One more IO completed (on the channel's thread only).
    pub fn count_completed(&self) {
        self.completed.add(1);
    }
}
