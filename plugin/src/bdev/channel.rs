//! The rtrs bdev's IO channels and requests (the SPDK side of the kernel's
//! `rnbd_queue_rq` / `rnbd_softirq_done_fn`).
//!
//! A bdev IO arrives in `submit_request` on the SPDK thread of one of our IO channels. Its
//! iovecs become SGEs of registered memory there ([`MemMap`](super::memmap::MemMap)).
//! Connection `k+1` of every path belongs to the disk's core `k` (DESIGN.md §3), and
//! the first channel created on that CPU core *owns* it: it holds the core's
//! [`PortState`] in its context, submits its requests on it directly from
//! `submit_request`, and its SPDK poller polls the port and completes the bdev IO it
//! reaps on the spot — no queue, no hop, no lock per IO. The port moves in and out of a
//! channel through its [`CoreSlot`](super::core::CoreSlot) (one uncontended lock per
//! move); while no channel owns it the disk's own thread on that core polls it.
//!
//! Requests of the other channels of the core (two bdevperf jobs on one core, or fio's
//! threads, which run on no core of the application) go through the slot's queue, which
//! the port's owner pumps, and come back through the channel's `done` queue: two locks,
//! uncontended in practice. A port is `Send` and owned by one channel at a time, so
//! whichever OS thread polls the owner's SPDK thread may drive it. A channel on one of
//! the application's cores may own that core's port (one whose thread is later moved to
//! another CPU core gives it back, so that the port stays with its core's connection);
//! a channel on a thread off the cpumask — fio's job threads, which fio polls itself —
//! may own core 0's port, so fio's IO needs no other thread: fio's initialisation thread,
//! where the disk's core 0 lives, then only runs timed work and sleeps in between.
//!
//! Reset: SPDK freezes every channel of the bdev before it submits a reset, so nothing new
//! arrives while it waits. The reset completes once every channel's requests have come
//! back, counted by two counters per channel that only the channel's thread writes
//! (plain stores, no read-modify-write), or fails after `io_timeout_sec`.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::mem::{size_of, MaybeUninit};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rtrs_spdk::fabric::Sge;
use rtrs_spdk::rnbd::client::BlockRequest;
use rtrs_spdk::spdk::{now_ns, sys};

use super::core::PortState;
use super::disk::Disk;

/// Most iovecs one bdev IO may have (the bdev layer splits larger ones: `max_num_segments`).
pub const MAX_IOVS: u32 = 16;
/// An iovec becomes at most two SGEs (it may straddle two fabric registrations).
const TASK_SGES: usize = 2 * MAX_IOVS as usize;
/// `spdk_env_get_current_core` off any core.
const NO_CORE: u32 = u32::MAX;

/// Our part of a bdev IO (its `driver_ctx`).
#[repr(C)]
pub struct Task {
    pub io: *mut sys::spdk_bdev_io,
    /// The channel the completion goes back to.
    chan: *const ChanShared,
    pub req: BlockRequest,
    nsge: usize,
    sgl: [Sge; TASK_SGES],
}

impl Task {
    pub fn sges(&self) -> &[Sge] {
        &self.sgl[..self.nsge]
    }

    pub fn chan(&self) -> *const ChanShared {
        self.chan
    }
}

/// Size of [`Task`] for the module's `get_ctx_size`.
pub fn task_size() -> c_int {
    size_of::<Task>() as c_int
}

/// What a channel shares with the ports that carry its IO and with resets.
#[derive(Default)]
pub struct ChanShared {
    /// Finished requests handed back by a port this channel does not own: task, errno.
    done: Mutex<Vec<(usize, i32)>>,
    /// Bdev IO taken (resets aside) and completed; written by the channel's thread only.
    submitted: AtomicU64,
    completed: AtomicU64,
}

impl ChanShared {
    /// Requests of this channel not completed yet.
    pub fn outstanding(&self) -> u64 {
        let done = self.completed.load(Ordering::Acquire);
        self.submitted.load(Ordering::Acquire).saturating_sub(done)
    }
}

/// Adds one to a counter only the calling thread writes: a plain load and store.
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Release);
}

/// Hands a finished request back to its channel (from a port the channel does not own).
///
/// # Safety
/// `task` must be a task submitted through [`submit_request`] and not finished yet.
pub unsafe fn finish(task: usize, errno: i32) {
    // SAFETY: per the contract the task is live; its channel lives while the bdev IO is
    // outstanding (SPDK destroys a channel only once its IO completed).
    let chan = unsafe { &*(*(task as *const Task)).chan };
    if let Ok(mut d) = chan.done.lock() {
        d.push((task, errno));
    }
}

/// The channel context (in SPDK's channel memory). Used on the channel's thread only.
struct ChanCtx {
    disk: Arc<Disk>,
    shared: Arc<ChanShared>,
    /// Index of the disk's core on this CPU core.
    core: usize,
    /// This channel may own its core's port (see the module doc).
    eligible: Cell<bool>,
    /// Eligible because its thread runs on the port's CPU core (and must stay there).
    pinned: bool,
    /// The core's port, while this channel owns it.
    port: RefCell<Option<Box<PortState>>>,
    poller: *mut sys::spdk_poller,
    scratch: RefCell<Vec<(usize, i32)>>,
    /// Resets waiting for the bdev's requests to drain, with their deadlines (ns).
    resets: RefCell<Vec<(*mut sys::spdk_bdev_io, u64)>>,
}

impl ChanCtx {
    /// Completes one of this channel's bdev IO (not a reset).
    ///
    /// # Safety
    /// As [`complete`]; `io` was counted in `submitted`.
    unsafe fn done(&self, io: *mut sys::spdk_bdev_io, errno: i32) {
        bump(&self.shared.completed);
        // SAFETY: per the contract.
        unsafe { complete(io, errno) };
    }

    fn me(&self) -> *const ChanShared {
        Arc::as_ptr(&self.shared)
    }

    /// The channel's thread left the port's CPU core: the port goes back to its slot and
    /// the channel stops asking for it.
    fn leave_port(&self) {
        self.eligible.set(false);
        if let Some(p) = self.port.borrow_mut().take() {
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
                port: RefCell::new(None),
                poller: ptr::null_mut(),
                scratch: RefCell::new(Vec::with_capacity(256)),
                resets: RefCell::new(Vec::new()),
            },
        );
        (*ctx).poller = sys::spdk_poller_register(Some(chan_poll), ctx_buf, 0);
        if (*ctx).poller.is_null() {
            release(&*ctx);
            ptr::drop_in_place(ctx);
            return -libc::ENOMEM;
        }
    }
    0
}

/// Gives up the channel's claim on its core's port (and the port, if it owns it).
fn release(ctx: &ChanCtx) {
    let slot = ctx.disk.slot(ctx.core);
    match ctx.port.borrow_mut().take() {
        // SPDK destroys a channel once all its IO completed: the port carries none of
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

/// The channel's poller: takes or polls the core's port, completes finished bdev IO on
/// the channel's thread, and finishes resets.
unsafe extern "C" fn chan_poll(arg: *mut c_void) -> c_int {
    // SAFETY: the channel context this poller was registered with, alive until destroy
    // unregisters the poller.
    let ctx = unsafe { &*arg.cast::<ChanCtx>() };
    let mut busy = false;
    let mut local = ctx.scratch.borrow_mut();
    if ctx.eligible.get() {
        busy |= poll_port(ctx, &mut local);
    }
    if let Ok(mut d) = ctx.shared.done.lock() {
        if !d.is_empty() {
            local.append(&mut d);
        }
    }
    for &(task, errno) in local.iter() {
        // SAFETY: a task of this channel, finished once by a port.
        let io = unsafe { (*(task as *const Task)).io };
        // SAFETY: the live bdev IO, completed exactly once, on its submitting thread.
        unsafe { ctx.done(io, errno) };
    }
    busy |= !local.is_empty();
    local.clear();
    drop(local);
    if !ctx.resets.borrow().is_empty() {
        busy |= poll_resets(ctx);
    }
    if busy {
        sys::spdk_thread_poller_rc_SPDK_POLLER_BUSY as c_int
    } else {
        sys::spdk_thread_poller_rc_SPDK_POLLER_IDLE as c_int
    }
}

/// Takes the core's port if it is parked for us, polls it, and moves our finished
/// requests into `out` (completed after the port is released: a completion callback may
/// submit again, which uses the port).
fn poll_port(ctx: &ChanCtx, out: &mut Vec<(usize, i32)>) -> bool {
    let mut port = ctx.port.borrow_mut();
    if port.is_none() {
        let Some(p) = ctx.disk.slot(ctx.core).try_take() else {
            return false;
        };
        ctx.disk.slot(ctx.core).unwant();
        *port = Some(p);
    }
    let Some(p) = port.as_mut() else {
        return false;
    };
    // SAFETY: plain query of the calling thread's core.
    if ctx.pinned && unsafe { sys::spdk_env_get_current_core() } != ctx.disk.slot(ctx.core).cpu {
        // The thread was moved off the port's CPU core: the port stays on its reactor.
        // Our requests it finished (refused at submission) are completed here first.
        out.append(&mut p.mine);
        drop(port);
        ctx.leave_port();
        return true;
    }
    let me = ctx.me();
    let busy = ctx.disk.driver().with_ctx(ctx.core, |cx| p.poll(cx, me));
    out.append(&mut p.mine);
    busy
}

/// Completes the resets whose requests have drained, fails those past their deadline.
fn poll_resets(ctx: &ChanCtx) -> bool {
    let drained = ctx.disk.outstanding() == 0;
    let now = now_ns();
    let mut resets = ctx.resets.borrow_mut();
    let before = resets.len();
    let mut finished = Vec::new();
    resets.retain(|&(io, deadline)| {
        if drained {
            finished.push((io, 0));
            false
        } else if now >= deadline {
            tracing::error!(
                "rtrs bdev {}: reset: requests still outstanding after io_timeout_sec = {} s",
                ctx.disk.params.name,
                ctx.disk.params.io_timeout_sec
            );
            finished.push((io, -libc::ETIMEDOUT));
            false
        } else {
            true
        }
    });
    drop(resets);
    for (io, errno) in finished.iter().copied() {
        // SAFETY: a reset of this channel, completed once, here, on its thread.
        unsafe { complete(io, errno) };
    }
    before != 0 && !finished.is_empty()
}

/// Completes `io` with `errno` (0, −ENOMEM/−EAGAIN for "retry", other negative errnos).
///
/// # Safety
/// `io` must be a live bdev IO of this module, completed once, on its thread.
unsafe fn complete(io: *mut sys::spdk_bdev_io, errno: i32) {
    // SAFETY: per the contract.
    unsafe {
        if errno == 0 {
            sys::spdk_bdev_io_complete(io, sys::spdk_bdev_io_status_SPDK_BDEV_IO_STATUS_SUCCESS);
        } else if errno == -libc::ENOMEM || errno == -libc::EAGAIN {
            sys::spdk_bdev_io_complete(io, sys::spdk_bdev_io_status_SPDK_BDEV_IO_STATUS_NOMEM);
        } else {
            sys::spdk_bdev_io_complete_aio_status(io, errno);
        }
    }
}

fn ctx_of(ch: *mut sys::spdk_io_channel) -> *mut ChanCtx {
    // SAFETY: the context follows the channel header (what spdk_io_channel_get_ctx, a
    // static inline, computes).
    unsafe {
        ch.cast::<u8>()
            .add(sys::SPDK_IO_CHANNEL_STRUCT_SIZE as usize)
            .cast()
    }
}

/// `fn_table.submit_request`.
pub unsafe extern "C" fn submit_request(ch: *mut sys::spdk_io_channel, io: *mut sys::spdk_bdev_io) {
    // SAFETY: a channel of our io_device, used on its thread.
    let ctx = unsafe { &*ctx_of(ch) };
    // SAFETY: SPDK hands a live IO of our bdev.
    let ty = u32::from(unsafe { (*io).type_ });
    if ty == sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_RESET {
        let wait = ctx.disk.params.io_timeout_sec.saturating_mul(1_000_000_000);
        ctx.resets
            .borrow_mut()
            .push((io, now_ns().saturating_add(wait)));
        return;
    }
    bump(&ctx.shared.submitted);
    if ty == sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_READ {
        // SAFETY: as above.
        let has_buf =
            unsafe { !(*io).u.bdev.iovs.is_null() && !(*(*io).u.bdev.iovs).iov_base.is_null() };
        if !has_buf {
            // SAFETY: the IO's size in bytes; the callback runs on this thread.
            unsafe {
                let len = (*io).u.bdev.num_blocks * u64::from((*(*io).bdev).blocklen);
                sys::spdk_bdev_io_get_buf(io, Some(got_buf), len);
            }
            return;
        }
    }
    // SAFETY: as above.
    unsafe { prepare(ctx, io) };
}

unsafe extern "C" fn got_buf(ch: *mut sys::spdk_io_channel, io: *mut sys::spdk_bdev_io, ok: bool) {
    // SAFETY: our channel, on its thread.
    let ctx = unsafe { &*ctx_of(ch) };
    if !ok {
        // SAFETY: the live IO, counted in submit_request, completed once on its thread.
        unsafe { ctx.done(io, -libc::ENOMEM) };
        return;
    }
    // SAFETY: the IO now has its buffer.
    unsafe { prepare(ctx, io) };
}

/// Builds the task and sends it on the core's port, or queues it for the port's owner
/// (or completes it at once).
unsafe fn prepare(ctx: &ChanCtx, io: *mut sys::spdk_bdev_io) {
    // SAFETY: live IO of our bdev; its fields are read on its thread.
    let (ty, off, nblocks, bs) = unsafe {
        (
            u32::from((*io).type_),
            (*io).u.bdev.offset_blocks,
            (*io).u.bdev.num_blocks,
            u64::from((*(*io).bdev).blocklen),
        )
    };
    let (offset, len) = (off * bs, nblocks * bs);
    let Ok(len32) = u32::try_from(len) else {
        // SAFETY: as above.
        unsafe { ctx.done(io, -libc::EINVAL) };
        return;
    };
    let req = match ty {
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_READ => BlockRequest::read(offset, len32),
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE => BlockRequest::write(offset, len32),
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_FLUSH => BlockRequest::flush(),
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_UNMAP => BlockRequest::discard(offset, len32),
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE_ZEROES => {
            BlockRequest::write_zeroes(offset, len32)
        }
        _ => {
            // SAFETY: as above.
            unsafe { ctx.done(io, -libc::ENOTSUP) };
            return;
        }
    };
    // SAFETY: the IO's driver_ctx is `task_size()` bytes, ours until completion.
    let task = unsafe { (*io).driver_ctx.as_mut_ptr().cast::<MaybeUninit<Task>>() };
    // SAFETY: as above; written before any read.
    let t = unsafe {
        (*task).write(Task {
            io,
            chan: ctx.me(),
            req,
            nsge: 0,
            sgl: [Sge::default(); TASK_SGES],
        })
    };
    if req.data_len() > 0 {
        // SAFETY: the IO's iovec array, valid until completion.
        let iovs = unsafe {
            std::slice::from_raw_parts((*io).u.bdev.iovs, (*io).u.bdev.iovcnt.max(0) as usize)
        };
        let mut left = u64::from(req.data_len());
        for iov in iovs {
            if left == 0 {
                break;
            }
            let l = (iov.iov_len as u64).min(left);
            if let Err(e) = ctx
                .disk
                .mem()
                .sges(iov.iov_base as u64, l, &mut t.sgl, &mut t.nsge)
            {
                tracing::error!("rtrs bdev {}: {e}", ctx.disk.params.name);
                // SAFETY: as above.
                unsafe { ctx.done(io, -libc::EFAULT) };
                return;
            }
            left -= l;
        }
        if left != 0 {
            // SAFETY: as above.
            unsafe { ctx.done(io, -libc::EINVAL) };
            return;
        }
    }
    let task = t as *mut Task as usize;
    // The port is never borrowed here in practice (completions run after the poll let it
    // go); should it be, the task takes the queue, which the next poll pumps.
    if let Ok(mut port) = ctx.port.try_borrow_mut() {
        if let Some(p) = port.as_mut() {
            let me = ctx.me();
            ctx.disk
                .driver()
                .with_ctx(ctx.core, |cx| p.submit_own(cx, task, me));
            return;
        }
    }
    ctx.disk.slot(ctx.core).enqueue(task);
}
