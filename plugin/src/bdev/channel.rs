//! The rtrs bdev's IO channels and requests (the SPDK side of the kernel's
//! `rnbd_queue_rq` / `rnbd_softirq_done_fn`).
//!
//! A bdev IO arrives in `submit_request` on some SPDK thread. Its iovecs become SGEs of
//! registered memory there ([`MemMap`](super::memmap::MemMap)), then the request goes to
//! the queue of the disk's *core* on the same CPU core (DESIGN.md §3: connection `k+1`
//! of every path belongs to core `k`), where that core's poller submits it on its own
//! RTRS connection. The completion comes back to the channel's queue and the channel's
//! poller completes the bdev IO on its own thread, as SPDK requires. Both hops stay on the
//! CPU core (SPDK's threads of one reactor run one at a time), so the queues are never
//! contended; they are locks only so that any placement of threads stays correct.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::mem::{size_of, MaybeUninit};
use std::ptr;
use std::sync::{Arc, Mutex};

use rtrs_spdk::fabric::Sge;
use rtrs_spdk::rnbd::client::BlockRequest;
use rtrs_spdk::spdk::sys;

use super::disk::Disk;

/// Most iovecs one bdev IO may have (the bdev layer splits larger ones: `max_num_segments`).
pub const MAX_IOVS: u32 = 16;
/// An iovec becomes at most two SGEs (it may straddle two fabric registrations).
const TASK_SGES: usize = 2 * MAX_IOVS as usize;

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
}

/// Size of [`Task`] for the module's `get_ctx_size`.
pub fn task_size() -> c_int {
    size_of::<Task>() as c_int
}

/// What a channel shares with the core that carries its IO.
#[derive(Default)]
pub struct ChanShared {
    /// Finished requests: task address and errno.
    done: Mutex<Vec<(usize, i32)>>,
}

/// Hands a finished request back to its channel (called on the disk's core).
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

/// The channel context (in SPDK's channel memory).
struct ChanCtx {
    disk: Arc<Disk>,
    shared: Arc<ChanShared>,
    /// Index of the disk's core on this CPU core.
    core: usize,
    poller: *mut sys::spdk_poller,
    scratch: RefCell<Vec<(usize, i32)>>,
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
    let ctx = ctx_buf.cast::<ChanCtx>();
    // SAFETY: SPDK gives `chan_ctx_size()` bytes, suitably aligned, ours until destroy.
    unsafe {
        ptr::write(
            ctx,
            ChanCtx {
                disk,
                shared: Arc::new(ChanShared::default()),
                core,
                poller: ptr::null_mut(),
                scratch: RefCell::new(Vec::with_capacity(256)),
            },
        );
        (*ctx).poller = sys::spdk_poller_register(Some(chan_poll), ctx_buf, 0);
        if (*ctx).poller.is_null() {
            ptr::drop_in_place(ctx);
            return -libc::ENOMEM;
        }
    }
    0
}

/// `spdk_io_device_register`'s destroy callback.
pub unsafe extern "C" fn chan_destroy(_io_device: *mut c_void, ctx_buf: *mut c_void) {
    let ctx = ctx_buf.cast::<ChanCtx>();
    // SAFETY: the context written by chan_create, destroyed once, on its thread.
    unsafe {
        sys::spdk_poller_unregister(&mut (*ctx).poller);
        ptr::drop_in_place(ctx);
    }
}

/// Completes finished bdev IO on the channel's thread.
unsafe extern "C" fn chan_poll(arg: *mut c_void) -> c_int {
    // SAFETY: the channel context this poller was registered with, alive until destroy
    // unregisters the poller.
    let ctx = unsafe { &*arg.cast::<ChanCtx>() };
    let mut local = ctx.scratch.borrow_mut();
    if let Ok(mut d) = ctx.shared.done.lock() {
        if d.is_empty() {
            return sys::spdk_thread_poller_rc_SPDK_POLLER_IDLE as c_int;
        }
        std::mem::swap(&mut *d, &mut *local);
    }
    for &(task, errno) in local.iter() {
        // SAFETY: a task we submitted, finished once by the disk's core.
        let io = unsafe { (*(task as *const Task)).io };
        // SAFETY: the live bdev IO, completed exactly once, on its submitting thread.
        unsafe { complete(io, errno) };
    }
    local.clear();
    sys::spdk_thread_poller_rc_SPDK_POLLER_BUSY as c_int
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
    if !ok {
        // SAFETY: the live IO, completed once on its thread.
        unsafe { complete(io, -libc::ENOMEM) };
        return;
    }
    // SAFETY: our channel, on its thread; the IO now has its buffer.
    unsafe { prepare(&*ctx_of(ch), io) };
}

/// Builds the task and queues it on the disk's core (or completes at once).
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
        unsafe { complete(io, -libc::EINVAL) };
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
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_RESET => {
            // Nothing is queued below the bdev layer but requests in flight on RTRS,
            // which complete (or fail over) by themselves: the reset has nothing to do.
            // SAFETY: as above.
            unsafe { complete(io, 0) };
            return;
        }
        _ => {
            // SAFETY: as above.
            unsafe { complete(io, -libc::ENOTSUP) };
            return;
        }
    };
    // SAFETY: the IO's driver_ctx is `task_size()` bytes, ours until completion.
    let task = unsafe { (*io).driver_ctx.as_mut_ptr().cast::<MaybeUninit<Task>>() };
    // SAFETY: as above; written before any read.
    let t = unsafe {
        (*task).write(Task {
            io,
            chan: Arc::as_ptr(&ctx.shared),
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
                unsafe { complete(io, -libc::EFAULT) };
                return;
            }
            left -= l;
        }
        if left != 0 {
            // SAFETY: as above.
            unsafe { complete(io, -libc::EINVAL) };
            return;
        }
    }
    ctx.disk.enqueue(ctx.core, t as *mut Task as usize);
}

/// A core's queue of tasks waiting for its poller.
#[derive(Default)]
pub struct CoreQueue {
    pub tasks: Mutex<VecDeque<usize>>,
}
