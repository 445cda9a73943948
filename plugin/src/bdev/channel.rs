//! The rtrs bdev's IO channels and requests (the SPDK side of the kernel's
//! `rnbd_queue_rq` / `rnbd_softirq_done_fn`).
//!
//! A bdev IO arrives in `submit_request` on the SPDK thread of one of our IO channels,
//! read through the safe [`BdevIo`]. Its iovecs become SGEs of registered memory there
//! (the session's [`MemMap`](super::memmap::MemMap)), in its task, whose [`TaskRef`]
//! carries it to a session core's queue and back. A channel holds its thread's poll
//! group ([`GroupRef`], docs/ARCHITECTURE.md, "The SPDK bdev: poll groups"): the task is
//! sent on the queue at once when the group owns the session's core of this CPU, else it
//! goes through that core's inbox to the queue's owner; the group's poller completes it
//! on this thread either way.
//!
//! Reset: SPDK freezes every channel of the bdev before it submits a reset, so nothing new
//! arrives while it waits. The reset completes once every channel's requests have come
//! back, counted by two counters per channel that only the channel's thread writes
//! (plain stores, no read-modify-write), or fails after `io_timeout_sec`; a poller of
//! the channel's watches it meanwhile.

use std::cell::RefCell;
use std::ptr;
use std::sync::Arc;

use rtrs_spdk::rnbd::client::BlockRequest;
use rtrs_spdk::spdk::{
    channel_ctx, loop_now_ns, sys, BdevIo, BdevIoType, ChannelCtx, GotBuf, SpdkPoll, SpdkPoller,
};
use rtrs_spdk::Errno;

use super::group::GroupRef;
use super::sess::disk::Disk;
use super::task::{ChanShared, TaskRef};

/// How often (µs) a channel with a reset pending looks whether its requests drained.
const RESET_POLL_US: u64 = 100;

/// The channel context (in SPDK's channel memory). Used on the channel's thread only.
pub struct ChanCtx {
    disk: Arc<Disk>,
    shared: Arc<ChanShared>,
    /// The session's core on this CPU core.
    core: usize,
    group: GroupRef,
    /// Resets waiting for the bdev's requests to drain, with their deadlines (ns), and
    /// the poller watching them while there are any.
    resets: RefCell<Vec<(BdevIo, u64)>>,
    /// Runs while a reset is pending (see [`reset_poll`]).
    reset_poller: RefCell<Option<SpdkPoller>>,
}

impl ChannelCtx for ChanCtx {
    type Device = Disk;

    /// A channel of `disk` on the calling thread: joins its thread's poll group for the
    /// session's core of this CPU.
    fn create(disk: &Arc<Disk>) -> Result<ChanCtx, Errno> {
        let group = GroupRef::get()?;
        // SAFETY: plain query of the calling thread's core.
        let cpu = unsafe { sys::spdk_env_get_current_core() };
        let core = disk.sess.core_of_cpu(cpu);
        group.with(|g| {
            if let Some(g) = g {
                g.join(&disk.sess, core);
            }
        });
        let shared = Arc::new(ChanShared::new(group.shared()));
        disk.add_channel(&shared);
        Ok(ChanCtx {
            disk: Arc::clone(disk),
            shared,
            core,
            group,
            resets: RefCell::new(Vec::new()),
            reset_poller: RefCell::new(None),
        })
    }

    /// The bdev was destructed and its last channel is gone: the disk closes.
    fn device_gone(disk: Arc<Disk>) {
        disk.close();
    }
}

impl Drop for ChanCtx {
    /// The channel goes (on its thread): its reset poller first, then its place in the
    /// poll group and the disk; the group's channel is put with the field.
    fn drop(&mut self) {
        drop(self.reset_poller.take());
        self.group.with(|g| {
            if let Some(g) = g {
                g.leave(&self.disk.sess, self.core);
            }
        });
        self.disk.remove_channel(&self.shared);
    }
}

/// The reset poller's run: completes the resets whose requests have drained, fails those
/// past their deadline, and drops the poller once none is left (before completing them,
/// so that a reset submitted from a completion starts a poller of its own).
fn reset_poll(ctx: &ChanCtx) -> SpdkPoll {
    let drained = ctx.disk.outstanding() == 0;
    let now = loop_now_ns();
    let mut finished = Vec::new();
    {
        let mut resets = ctx.resets.borrow_mut();
        let mut waiting = Vec::with_capacity(resets.len());
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
        if resets.is_empty() {
            // Dropped from inside its own run: it runs no more (SpdkPoller's contract).
            drop(ctx.reset_poller.take());
        }
    }
    let any = !finished.is_empty();
    for (io, errno) in finished {
        // A reset of this channel, completed once, here, on its thread.
        io.complete(errno);
    }
    SpdkPoll::from_busy(any)
}

/// The context of one of our channels.
///
/// # Safety
/// `ch` must be a live channel of a disk's io_device, used on its thread.
unsafe fn ctx_of<'a>(ch: *mut sys::spdk_io_channel) -> &'a ChanCtx {
    // SAFETY: per the contract: the disk's io_device is an IoDevice<ChanCtx>.
    unsafe { channel_ctx::<ChanCtx>(ch) }
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
        let mut p = ctx.reset_poller.borrow_mut();
        if p.is_none() {
            let chan = ptr::from_ref(ctx);
            let run = move || {
                // SAFETY: the channel context outlives its poller (its Drop drops the
                // poller first), which runs on the channel's thread only.
                let ctx = unsafe { &*chan };
                reset_poll(ctx)
            };
            *p = SpdkPoller::start(c"rtrs_reset", RESET_POLL_US, run);
            if p.is_none() {
                drop(p);
                tracing::error!(
                    "rtrs bdev {}: reset: SPDK refused the poller that waits for the requests to drain",
                    ctx.disk.params.name
                );
                let last = ctx.resets.borrow_mut().pop();
                if let Some((io, _)) = last {
                    io.complete(Errno::ENOMEM.neg());
                }
            }
        }
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
            done(ctx, io, Err(Errno::ENOMEM));
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

/// Builds the task and sends it on the session core's queue (or its inbox), or completes
/// it at once.
fn prepare(ctx: &ChanCtx, io: BdevIo) {
    let req = match block_request(&io) {
        Ok(r) => r,
        Err(errno) => return done(ctx, io, Err(errno)),
    };
    let Some(dev) = ctx.disk.dev() else {
        return done(ctx, io, Err(Errno::ENODEV));
    };
    let mut task = TaskRef::new(io, &ctx.shared, dev, req);
    if req.data_len() > 0 {
        let (io, sgl, nsge) = task.sgl_mut();
        let mut left = u64::from(req.data_len());
        let mut failed = None;
        for iov in io.iovs() {
            if left == 0 {
                break;
            }
            let l = (iov.iov_len as u64).min(left);
            if let Err(e) = ctx.disk.sess.mem.sges(iov.iov_base as u64, l, sgl, nsge) {
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
            return task.complete(Err(errno));
        }
    }
    let sess = &ctx.disk.sess;
    ctx.group.with(|g| match g {
        Some(g) => g.submit(loop_now_ns(), sess, ctx.core, task),
        None => sess.cores[ctx.core].push(task, &*sess.home),
    });
}

/// Completes one of this channel's bdev IO that never became a task (counted in
/// `submitted`).
fn done(ctx: &ChanCtx, io: BdevIo, result: Result<(), Errno>) {
    ctx.shared.count_completed();
    io.complete_with(result);
}
