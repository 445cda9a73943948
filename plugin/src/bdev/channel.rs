//! The rtrs bdev's IO channels and requests (the SPDK side of the kernel's
//! `rnbd_queue_rq` / `rnbd_softirq_done_fn`).
//!
//! A bdev IO arrives in `submit_request` on the SPDK thread of one of our IO channels,
//! read through the safe [`BdevIo`]. Its iovecs become SGEs of registered memory there
//! ([`MemMap`](super::memmap::MemMap)), in its task, whose [`TaskRef`] carries it to a
//! queue and back.
//! Connection `k+1` of every path belongs to the disk's core `k` (docs/ARCHITECTURE.md,
//! "Sessions on cores"), and the first channel created on that CPU core *owns* it: it
//! holds the core's [`CoreQueue`] in its context, submits its requests on it directly
//! from `submit_request`, and its SPDK poller polls the queue and completes the bdev IO
//! it reaps on the spot — no hand-over, no hop, no lock per IO. The queue moves in and out
//! of a channel through its [`CoreSlot`](super::core_queue::CoreSlot) (one uncontended lock
//! per move); while no channel owns it the disk's own thread on that core polls it.
//!
//! Requests of the other channels of the core (two bdevperf jobs on one core, or fio's
//! threads, which run on no core of the application) go through the slot's task queue, which
//! the queue's owner pumps, and come back through the channel's `done` queue: two locks,
//! uncontended in practice. A queue is `Send` and owned by one channel at a time, so
//! whichever OS thread polls the owner's SPDK thread may drive it. A channel on one of
//! the application's cores may own that core's queue (one whose thread is later moved to
//! another CPU core gives it back, so that the queue stays with its core's connection);
//! a channel on a thread off the cpumask — fio's job threads, which fio polls itself —
//! may own core 0's queue, so fio's IO needs no other thread: fio's initialisation thread,
//! where the disk's core 0 lives, then only runs timed work and sleeps in between.
//!
//! Reset: SPDK freezes every channel of the bdev before it submits a reset, so nothing new
//! arrives while it waits. The reset completes once every channel's requests have come
//! back, counted by two counters per channel that only the channel's thread writes
//! (plain stores, no read-modify-write), or fails after `io_timeout_sec`.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::mem::size_of;
use std::ptr;
use std::sync::Arc;

use rtrs_spdk::rnbd::client::BlockRequest;
use rtrs_spdk::spdk::{loop_now_ns, sys, BdevIo, BdevIoType, GotBuf};
use rtrs_spdk::Errno;

use super::core_queue::{CoreDisk, CoreQueue};
use super::disk::Disk;
use super::task::{ChanShared, TaskRef};

/// `spdk_env_get_current_core` off any core.
const NO_CORE: u32 = u32::MAX;

/// The channel context (in SPDK's channel memory). Used on the channel's thread only.
struct ChanCtx {
    disk: Arc<Disk>,
    shared: Arc<ChanShared>,
    /// Index of the disk's core on this CPU core.
    core: usize,
    /// This channel may own its core's queue (see the module doc).
    eligible: Cell<bool>,
    /// Eligible because its thread runs on the queue's CPU core (and must stay there).
    pinned: bool,
    /// Polls of the queue since this channel last checked that its thread is still on
    /// the queue's CPU core (a thread moves rarely; the check is a library call).
    unchecked: Cell<u32>,
    /// The core's queue, while this channel owns it.
    queue: RefCell<Option<Box<CoreQueue>>>,
    poller: *mut sys::spdk_poller,
    scratch: RefCell<Vec<(TaskRef, Result<(), Errno>)>>,
    /// Resets waiting for the bdev's requests to drain, with their deadlines (ns).
    resets: RefCell<Vec<(BdevIo, u64)>>,
}

impl ChanCtx {
    /// Completes one of this channel's bdev IO (not a reset), counted in `submitted`,
    /// on the channel's thread.
    fn done(&self, io: BdevIo, result: Result<(), Errno>) {
        self.shared.count_completed();
        io.complete(Errno::neg_of(result));
    }

    /// The channel's thread left the queue's CPU core: the queue goes back to its slot and
    /// the channel stops asking for it.
    fn leave_queue(&self) {
        self.eligible.set(false);
        if let Some(p) = self.queue.borrow_mut().take() {
            self.disk.slot(self.core).park(p);
        }
    }
}

pub fn chan_ctx_size() -> u32 {
    size_of::<ChanCtx>() as u32
}

/// `spdk_io_device_register`'s create callback; `io_device` is the disk.
pub unsafe extern "C" fn chan_create(io_device: *mut c_void, ctx_buf: *mut c_void) -> c_int {
    // SAFETY: the io_device is the address of a disk kept alive by the bdev (see
    // Disk::register), which outlives its channels.
    let disk = unsafe {
        Arc::increment_strong_count(io_device as *const Disk);
        Arc::from_raw(io_device as *const Disk)
    };
    // SAFETY: plain query of the calling thread's core.
    let cpu = unsafe { sys::spdk_env_get_current_core() };
    let core = disk.core_of_cpu(cpu);
    let pinned = cpu != NO_CORE && disk.slot(core).cpu == cpu;
    let eligible = pinned || !disk.on_mask(cpu);
    let shared = Arc::new(ChanShared::default());
    disk.add_channel(&shared);
    if eligible {
        disk.slot(core).want();
        disk.wake(core);
    }
    let ctx = ctx_buf.cast::<ChanCtx>();
    // SAFETY: SPDK gives `chan_ctx_size()` bytes, suitably aligned, ours until destroy.
    unsafe {
        ptr::write(
            ctx,
            ChanCtx {
                disk,
                shared,
                core,
                eligible: Cell::new(eligible),
                pinned,
                unchecked: Cell::new(0),
                queue: RefCell::new(None),
                poller: ptr::null_mut(),
                scratch: RefCell::new(Vec::with_capacity(256)),
                resets: RefCell::new(Vec::new()),
            },
        );
        (*ctx).poller = sys::spdk_poller_register(Some(chan_poll), ctx_buf, 0);
        if (*ctx).poller.is_null() {
            release(&*ctx);
            ptr::drop_in_place(ctx);
            return Errno::ENOMEM.neg();
        }
    }
    0
}

/// Gives up the channel's claim on its core's queue (and the queue, if it owns it).
fn release(ctx: &ChanCtx) {
    let slot = ctx.disk.slot(ctx.core);
    match ctx.queue.borrow_mut().take() {
        // SPDK destroys a channel once all its IO completed: the queue carries none of
        // ours any more, only other channels' tasks, which go on to the next owner.
        Some(p) => {
            debug_assert!(
                p.mine.is_empty(),
                "a channel goes with requests outstanding"
            );
            slot.park(p);
        }
        None if ctx.eligible.get() => slot.unwant(),
        None => {}
    }
    ctx.disk.remove_channel(&ctx.shared);
}

/// `spdk_io_device_register`'s destroy callback.
pub unsafe extern "C" fn chan_destroy(_io_device: *mut c_void, ctx_buf: *mut c_void) {
    let ctx = ctx_buf.cast::<ChanCtx>();
    // SAFETY: the context written by chan_create, destroyed once, on its thread.
    unsafe {
        sys::spdk_poller_unregister(&mut (*ctx).poller);
        release(&*ctx);
        ptr::drop_in_place(ctx);
    }
}

/// The channel's poller: takes or polls the core's queue, completes finished bdev IO on
/// the channel's thread, and finishes resets.
unsafe extern "C" fn chan_poll(arg: *mut c_void) -> c_int {
    // SAFETY: the channel context this poller was registered with, alive until destroy
    // unregisters the poller.
    let ctx = unsafe { &*arg.cast::<ChanCtx>() };
    let mut busy = false;
    let mut local = ctx.scratch.borrow_mut();
    if ctx.eligible.get() {
        busy |= poll_queue(ctx, &mut local);
    }
    ctx.shared.take_done(&mut local);
    busy |= !local.is_empty();
    for (task, result) in local.drain(..) {
        // A task of this channel, finished once by a core queue: completed on our
        // thread.
        ctx.done(task.into_io(), result);
    }
    drop(local);
    // What the poll and the completions' resubmissions posted goes out now, not at the
    // next poll (docs/ARCHITECTURE.md, "Posting and pushing").
    if let Ok(mut queue) = ctx.queue.try_borrow_mut() {
        if let Some(q) = queue.as_mut() {
            q.push();
        }
    }
    if !ctx.resets.borrow().is_empty() {
        busy |= poll_resets(ctx);
    }
    if busy {
        sys::spdk_thread_poller_rc_SPDK_POLLER_BUSY as c_int
    } else {
        sys::spdk_thread_poller_rc_SPDK_POLLER_IDLE as c_int
    }
}

/// Takes the core's queue if it is parked for us, polls it, and moves our finished
/// requests into `out` (completed after the queue is released: a completion callback may
/// submit again, which uses the queue).
fn poll_queue(ctx: &ChanCtx, out: &mut Vec<(TaskRef, Result<(), Errno>)>) -> bool {
    let mut queue = ctx.queue.borrow_mut();
    if queue.is_none() {
        let Some(p) = ctx.disk.slot(ctx.core).try_take() else {
            return false;
        };
        ctx.disk.slot(ctx.core).unwant();
        *queue = Some(p);
    }
    let Some(p) = queue.as_mut() else {
        return false;
    };
    if ctx.pinned && moved_off(ctx) {
        // The thread was moved off the queue's CPU core: the queue stays on its reactor.
        // Our requests it finished (refused at submission) are completed here first.
        out.append(&mut p.mine);
        drop(queue);
        ctx.leave_queue();
        return true;
    }
    let busy = p.poll(loop_now_ns(), Some(&*ctx.shared));
    out.append(&mut p.mine);
    busy
}

/// Whether the channel's thread now runs off its queue's CPU core, checked every
/// [`CORE_CHECK_POLLS`]th poll (a queue polled from another core for a few more polls
/// is still polled by its one owner, only farther from its connection).
fn moved_off(ctx: &ChanCtx) -> bool {
    let n = ctx.unchecked.get();
    if n + 1 < CORE_CHECK_POLLS {
        ctx.unchecked.set(n + 1);
        return false;
    }
    ctx.unchecked.set(0);
    // SAFETY: plain query of the calling thread's core.
    unsafe { sys::spdk_env_get_current_core() != ctx.disk.slot(ctx.core).cpu }
}

/// Completes the resets whose requests have drained, fails those past their deadline.
fn poll_resets(ctx: &ChanCtx) -> bool {
    let mut resets = ctx.resets.borrow_mut();
    if resets.is_empty() {
        return false;
    }
    let drained = ctx.disk.outstanding() == 0;
    let now = loop_now_ns();
    let before = resets.len();
    let mut finished = Vec::new();
    let mut waiting = Vec::with_capacity(before);
    for (io, deadline) in resets.drain(..) {
        if drained {
            finished.push((io, 0));
        } else if now >= deadline {
            tracing::error!(
                "rtrs bdev {}: reset: requests still outstanding after io_timeout_sec = {} s",
                ctx.disk.params.name,
                ctx.disk.params.io_timeout_sec
            );
            finished.push((io, Errno::ETIMEDOUT.neg()));
        } else {
            waiting.push((io, deadline));
        }
    }
    *resets = waiting;
    drop(resets);
    let any = !finished.is_empty();
    for (io, errno) in finished {
        // A reset of this channel, completed once, here, on its thread.
        io.complete(errno);
    }
    before != 0 && any
}

/// How often an owning channel checks that its thread stayed on the queue's CPU core.
const CORE_CHECK_POLLS: u32 = 16;

/// The context of one of our channels.
///
/// # Safety
/// `ch` must be a live channel of our io_device, used on its thread: its context
/// (written by chan_create, alive until chan_destroy) follows the channel header.
unsafe fn ctx_of<'a>(ch: *mut sys::spdk_io_channel) -> &'a ChanCtx {
    // SAFETY: per the contract (what spdk_io_channel_get_ctx, a static inline, computes).
    unsafe {
        &*ch.cast::<u8>()
            .add(sys::SPDK_IO_CHANNEL_STRUCT_SIZE as usize)
            .cast::<ChanCtx>()
    }
}

/// `fn_table.submit_request`.
pub unsafe extern "C" fn submit_request(ch: *mut sys::spdk_io_channel, io: *mut sys::spdk_bdev_io) {
    // SAFETY: SPDK submits on a channel of our bdev, on the channel's thread.
    let ctx = unsafe { ctx_of(ch) };
    // SAFETY: SPDK hands a live IO of our bdev, wrapped once here.
    let Some(io) = (unsafe { BdevIo::from_raw(io) }) else {
        return;
    };
    if io.io_type() == BdevIoType::Reset {
        let wait = ctx.disk.params.io_timeout_sec.saturating_mul(1_000_000_000);
        ctx.resets
            .borrow_mut()
            .push((io, loop_now_ns().saturating_add(wait)));
        return;
    }
    ctx.shared.count_submitted();
    if io.io_type() == BdevIoType::Read && !io.has_buf() {
        // The IO's size in bytes; the callback runs on this thread.
        let len = io.num_blocks() * u64::from(io.block_len());
        io.get_buf::<ChanCtx>(len);
        return;
    }
    prepare(ctx, io);
}

impl GotBuf for ChanCtx {
    fn got_buf(ch: *mut sys::spdk_io_channel, io: BdevIo, ok: bool) {
        // SAFETY: the bdev layer calls back on the channel the IO was submitted on
        // (ours), on its thread.
        let ctx = unsafe { ctx_of(ch) };
        if ok {
            prepare(ctx, io);
        } else {
            // Counted in submit_request.
            ctx.done(io, Err(Errno::ENOMEM));
        }
    }
}

/// The RNBD request of a bdev IO, or the errno it fails with.
fn block_request(io: &BdevIo) -> Result<BlockRequest, Errno> {
    let bs = u64::from(io.block_len());
    let (offset, len) = (io.offset_blocks() * bs, io.num_blocks() * bs);
    let len32 = u32::try_from(len).map_err(|_| Errno::EINVAL)?;
    match io.io_type() {
        BdevIoType::Read => Ok(BlockRequest::read(offset, len32)),
        BdevIoType::Write => Ok(BlockRequest::write(offset, len32)),
        BdevIoType::Flush => Ok(BlockRequest::flush()),
        BdevIoType::Unmap => Ok(BlockRequest::discard(offset, len32)),
        BdevIoType::WriteZeroes => Ok(BlockRequest::write_zeroes(offset, len32)),
        // ENOTSUP (the same number on Linux).
        BdevIoType::Reset | BdevIoType::Other(_) => Err(Errno::EOPNOTSUPP),
    }
}

/// Builds the task and sends it on the core's queue, or leaves it in the slot for the
/// queue's owner (or completes it at once).
fn prepare(ctx: &ChanCtx, io: BdevIo) {
    let req = match block_request(&io) {
        Ok(r) => r,
        Err(errno) => return ctx.done(io, Err(errno)),
    };
    let mut task = TaskRef::new(io, &ctx.shared, req);
    if req.data_len() > 0 {
        let (io, sgl, nsge) = task.sgl_mut();
        let mut left = u64::from(req.data_len());
        let mut failed = None;
        for iov in io.iovs() {
            if left == 0 {
                break;
            }
            let l = (iov.iov_len as u64).min(left);
            if let Err(e) = ctx.disk.mem().sges(iov.iov_base as u64, l, sgl, nsge) {
                tracing::error!("rtrs bdev {}: {e}", ctx.disk.params.name);
                failed = Some(Errno::EFAULT);
                break;
            }
            left -= l;
        }
        if failed.is_none() && left != 0 {
            failed = Some(Errno::EINVAL);
        }
        if let Some(errno) = failed {
            return ctx.done(task.into_io(), Err(errno));
        }
    }
    // The queue is never borrowed here in practice (completions run after the poll let it
    // go); should it be, the task takes the slot's task queue, which the next poll pumps.
    if let Ok(mut queue) = ctx.queue.try_borrow_mut() {
        if let Some(q) = queue.as_mut() {
            q.submit_own(loop_now_ns(), task, &ctx.shared);
            return;
        }
    }
    ctx.disk.slot(ctx.core).enqueue(task);
}
