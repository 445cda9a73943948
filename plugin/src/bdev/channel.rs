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
//! A reset waits in the channel's poll group ([`reset`](super::reset)) for the disk's
//! requests, counted by two counters per channel that only the channel's thread writes
//! (plain stores, no read-modify-write).

use std::sync::Arc;

use rtrs_spdk::rnbd::client::BlockRequest;
use rtrs_spdk::spdk::{channel_ctx, loop_now_ns, sys, BdevIo, BdevIoType, ChannelCtx, GotBuf};
use rtrs_spdk::Errno;

use super::group::GroupRef;
use super::reset::Reset;
use super::sess::disk::Disk;
use super::task::{ChanShared, TaskRef};

/// The channel context (in SPDK's channel memory). Used on the channel's thread only.
pub struct ChanCtx {
    disk: Arc<Disk>,
    shared: Arc<ChanShared>,
    /// The session's core on this CPU core.
    core: usize,
    group: GroupRef,
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
        })
    }

    /// The bdev was destructed and its last channel is gone: the disk closes.
    fn device_gone(disk: Arc<Disk>) {
        disk.close();
    }
}

impl Drop for ChanCtx {
    /// The channel goes (on its thread, with no IO of its own out, resets included):
    /// its place in the poll group and the disk; the group's channel is put with the
    /// field.
    fn drop(&mut self) {
        self.group.with(|g| {
            if let Some(g) = g {
                g.leave(&self.disk.sess, self.core);
            }
        });
        self.disk.remove_channel(&self.shared);
    }
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
        ctx.group
            .reset(Reset::new(io, Arc::clone(&ctx.disk), loop_now_ns()));
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
