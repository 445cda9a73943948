//! An SPDK bdev as an RNBD export's backend: the target side's `struct block_device`.
//! [`BdevExport`] is one descriptor (`spdk_bdev_open_ext`, with a hot-remove callback);
//! each core's instance ([`BdevChannel`], a [`BlockBackend`]) owns that SPDK thread's IO
//! channel and submits `spdk_bdev_readv_blocks` / `writev` / `flush` / `unmap` /
//! `write_zeroes` from the polling thread. SPDK has no write-same: one is a chain of
//! `writev`s whose iovecs all point at the request's one block (at most [`SAME_BLOCKS`]
//! blocks each, started one after the other). Nor has it FUA: on a bdev with a volatile
//! write cache a FUA write is the write and then a flush, as the kernel's block layer
//! does for a device without FUA.
//!
//! The geometry goes to the client as the kernel's server derives it from its block
//! device (docs/PROTOCOL.md §2.10): the bdev's write cache (and so FUA), physical block
//! size, preferred unmap granularity and alignment, and as the largest transfer its
//! `max_rw_size` or, on a bdev that splits at its optimal IO boundary, that boundary.
//! A resize of the bdev (`SPDK_BDEV_EVENT_RESIZE`) is kept here and reported at the next
//! OPEN ([`ExportBackend::geometry`]). A submission refused with −ENOMEM waits with
//! `spdk_bdev_queue_io_wait` and is retried when the bdev layer has room; completions are
//! collected in the channel and returned by [`BlockBackend::poll`] on the same thread.
//!
//! The descriptor closes (on the thread that opened it) once the export and every core's
//! channel let go of it; a channel dropped with IO in flight is drained by a poller first.

use std::collections::VecDeque;
use std::ffi::{c_int, c_void, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::poller::{SpdkPoll, SpdkPoller};
use super::sys;
use super::thread::SpdkThread;
use crate::rnbd::backend::{
    drain_completions, BlockBackend, BlockCompletion, BlockFlags, BlockIo, BlockOp,
    BlockSubmitError, Geometry,
};
use crate::rnbd::server::ExportBackend;
use crate::sync::lock;
use crate::Errno;

mod geometry;

use geometry::geometry_of;

/// IOs a channel accepts before it answers [`BlockSubmitError::Busy`].
pub const CHANNEL_DEPTH: usize = 1024;
/// Most blocks of one `writev` of a write-same (each an iovec over the same block).
pub const SAME_BLOCKS: usize = 256;

type RemoveFn = Box<dyn FnOnce() + Send>;

struct EventCtx {
    name: String,
    on_remove: Mutex<Option<RemoveFn>>,
    /// The bdev's size in blocks as its last resize event said.
    blocks: Arc<AtomicU64>,
}

/// An open descriptor; closed on its opening thread when the last user drops it.
struct Desc {
    desc: *mut sys::spdk_bdev_desc,
    bdev: *mut sys::spdk_bdev,
    thread: SpdkThread,
    event: *mut EventCtx,
}

// SAFETY: the descriptor is used from any SPDK thread (channels are per thread, as SPDK
// allows) and closed only on `thread`; the event context is a Mutex-guarded box.
unsafe impl Send for Desc {}
// SAFETY: as above: shared use only reads the pointers.
unsafe impl Sync for Desc {}

impl Drop for Desc {
    fn drop(&mut self) {
        let (desc, event) = (self.desc as usize, self.event as usize);
        let close = move || {
            // SAFETY: the descriptor is closed once, on its opening thread; after the
            // close no event arrives, so the event context can be freed.
            unsafe {
                sys::spdk_bdev_close(desc as *mut sys::spdk_bdev_desc);
                drop(Box::from_raw(event as *mut EventCtx));
            }
        };
        if self.thread.is_current() {
            close();
        } else if let Err(e) = self.thread.send(close) {
            tracing::error!("spdk bdev: could not post the descriptor close: {e}");
        }
    }
}

/// A bdev opened for export.
pub struct BdevExport {
    desc: Arc<Desc>,
    /// As opened; the size is `blocks`.
    geometry: Geometry,
    blocks: Arc<AtomicU64>,
    name: String,
}

impl std::fmt::Debug for BdevExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BdevExport")
            .field("bdev", &self.name)
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl BdevExport {
    /// Opens bdev `name` (for writing unless `read_only`) on the calling SPDK thread.
    /// `on_remove` runs once, on that thread, when SPDK hot-removes the bdev; it should
    /// remove the export so the descriptor can close.
    ///
    /// # Errors
    /// A message naming the bdev and the failing call (no such bdev, claimed, an
    /// unsupported block size, not on an SPDK thread).
    pub fn open<F>(name: &str, read_only: bool, on_remove: F) -> Result<BdevExport, String>
    where
        F: FnOnce() + Send + 'static,
    {
        let thread =
            SpdkThread::current().ok_or_else(|| format!("bdev '{name}': not on an SPDK thread"))?;
        let cname = CString::new(name).map_err(|_| format!("bdev '{name}': NUL in the name"))?;
        let blocks = Arc::new(AtomicU64::new(0));
        let event = Box::into_raw(Box::new(EventCtx {
            name: name.to_string(),
            on_remove: Mutex::new(Some(Box::new(on_remove))),
            blocks: Arc::clone(&blocks),
        }));
        let mut desc: *mut sys::spdk_bdev_desc = std::ptr::null_mut();
        // SAFETY: valid name and out-pointer; `event` outlives the descriptor (freed
        // after spdk_bdev_close in Desc::drop, or below on failure).
        let rc = unsafe {
            sys::spdk_bdev_open_ext(
                cname.as_ptr(),
                !read_only,
                Some(bdev_event),
                event.cast::<c_void>(),
                &mut desc,
            )
        };
        if rc != 0 || desc.is_null() {
            // SAFETY: not handed to SPDK (the open failed).
            drop(unsafe { Box::from_raw(event) });
            let why = match -rc {
                libc::ENODEV => "no such bdev".to_string(),
                libc::EPERM => "the bdev is claimed for writing by another module".to_string(),
                e => format!(
                    "spdk_bdev_open_ext failed: {}",
                    std::io::Error::from_raw_os_error(e)
                ),
            };
            return Err(format!("bdev '{name}': {why}"));
        }
        // SAFETY: `desc` is open.
        let bdev = unsafe { sys::spdk_bdev_desc_get_bdev(desc) };
        let desc = Arc::new(Desc {
            desc,
            bdev,
            thread,
            event,
        });
        let geometry =
            geometry_of(bdev, read_only).map_err(|why| format!("bdev '{name}': {why}"))?;
        blocks.store(
            geometry.size / u64::from(geometry.logical_block_size),
            Ordering::Release,
        );
        Ok(BdevExport {
            desc,
            geometry,
            blocks,
            name: name.to_string(),
        })
    }

    /// The bdev's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

unsafe extern "C" fn bdev_event(
    kind: sys::spdk_bdev_event_type,
    bdev: *mut sys::spdk_bdev,
    ctx: *mut c_void,
) {
    // SAFETY: the event context lives until the descriptor is closed, and SPDK sends
    // events only to open descriptors.
    let ev = unsafe { &*ctx.cast::<EventCtx>() };
    if kind == sys::spdk_bdev_event_type_SPDK_BDEV_EVENT_RESIZE {
        // SAFETY: the event's bdev is the descriptor's, registered while it is open.
        let blocks = unsafe { sys::spdk_bdev_get_num_blocks(bdev) };
        let old = ev.blocks.swap(blocks, Ordering::AcqRel);
        tracing::info!(
            "spdk bdev '{}': resized from {old} to {blocks} blocks; clients see it at their \
             next OPEN",
            ev.name
        );
        return;
    }
    if kind != sys::spdk_bdev_event_type_SPDK_BDEV_EVENT_REMOVE {
        return;
    }
    tracing::warn!("spdk bdev '{}': hot-removed; closing its export", ev.name);
    // A poisoned lock still holds the callback: the export is closed all the same.
    let f = lock(&ev.on_remove).take();
    if let Some(f) = f {
        f();
    }
}

impl ExportBackend for BdevExport {
    /// With the size of the bdev's last resize event.
    fn geometry(&self) -> Geometry {
        let bs = u64::from(self.geometry.logical_block_size);
        Geometry {
            size: self.blocks.load(Ordering::Acquire).saturating_mul(bs),
            ..self.geometry
        }
    }

    fn open_core(&self, _core: usize) -> Result<Box<dyn BlockBackend>, String> {
        BdevChannel::new(Arc::clone(&self.desc), self.geometry(), &self.name)
            .map(|c| Box::new(c) as Box<dyn BlockBackend>)
    }
}

/// One IO in flight: what its completion needs.
struct InFlight {
    chan: *mut ChanState,
    index: u32,
    tag: u64,
    iov: libc::iovec,
    /// The iovecs of a write-same piece, allocated at the slot's first write-same and
    /// kept (steady state allocates nothing).
    same: Option<Box<[libc::iovec]>>,
    /// Started when this one succeeds (the write after a PREFLUSH's flush, the rest of
    /// a write-same).
    then: Option<BlockIo>,
}

struct ChanState {
    desc: Arc<Desc>,
    ch: *mut sys::spdk_io_channel,
    block_size: u64,
    size_blocks: u64,
    /// The bdev has a volatile cache: PREFLUSH on a write issues a flush first.
    write_cache: bool,
    slots: Box<[InFlight]>,
    free: Vec<u32>,
    done: VecDeque<BlockCompletion>,
    /// Refused with −ENOMEM, in order, until `spdk_bdev_queue_io_wait` calls back.
    waiting: VecDeque<BlockIo>,
    wait_armed: bool,
    wait: sys::spdk_bdev_io_wait_entry,
    in_flight: usize,
    /// Times the bdev layer answered −ENOMEM and the channel waited.
    nomem_waits: u64,
    name: String,
}

/// One SPDK thread's instance of an exported bdev (its IO channel).
pub struct BdevChannel {
    /// Owned (from `Box::into_raw`): freed in `Drop`, or by the drain poller when IO is
    /// still in flight then. Raw because SPDK callbacks reach it through slot pointers.
    state: NonNull<ChanState>,
    geometry: Geometry,
    name: String,
}

impl BdevChannel {
    fn new(desc: Arc<Desc>, geometry: Geometry, name: &str) -> Result<BdevChannel, String> {
        // SAFETY: the descriptor is open; the channel belongs to the calling thread.
        let ch = unsafe { sys::spdk_bdev_get_io_channel(desc.desc) };
        if ch.is_null() {
            return Err(format!("bdev '{name}': spdk_bdev_get_io_channel failed"));
        }
        let bs = u64::from(geometry.logical_block_size);
        let state = Box::new(ChanState {
            desc,
            ch,
            block_size: bs,
            size_blocks: geometry.size / bs,
            write_cache: geometry.write_cache,
            slots: Box::new([]),
            free: (0..CHANNEL_DEPTH as u32).rev().collect(),
            done: VecDeque::with_capacity(CHANNEL_DEPTH),
            waiting: VecDeque::with_capacity(CHANNEL_DEPTH),
            wait_armed: false,
            wait: sys::spdk_bdev_io_wait_entry::default(),
            in_flight: 0,
            nomem_waits: 0,
            name: name.to_string(),
        });
        let p = Box::into_raw(state);
        // SAFETY: exclusive access during construction; the slots point back at the
        // boxed state, whose address never changes.
        unsafe {
            (*p).slots = (0..CHANNEL_DEPTH as u32)
                .map(|index| InFlight {
                    chan: p,
                    index,
                    tag: 0,
                    iov: libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    },
                    same: None,
                    then: None,
                })
                .collect();
        }
        Ok(BdevChannel {
            // SAFETY: from Box::into_raw, never NULL.
            state: unsafe { NonNull::new_unchecked(p) },
            geometry,
            name: name.to_string(),
        })
    }
}

/// Starts `io` in a free slot: 0, −ENOMEM (retry later), or another negative errno.
/// A write with PREFLUSH on a bdev with a volatile cache starts as a flush whose
/// success starts the write (the kernel's REQ_PREFLUSH order); a write-same starts its
/// first [`SAME_BLOCKS`] blocks, whose success starts the rest; a FUA write on such a
/// bdev is the write, whose success starts a flush.
///
/// # Safety
/// `st` is a live channel state, used on its own thread, not borrowed elsewhere.
unsafe fn start(st: *mut ChanState, io: &BlockIo) -> c_int {
    // SAFETY: per the contract; a short read.
    let (write_cache, bs) = unsafe { ((*st).write_cache, (*st).block_size) };
    let preflush = write_cache
        && matches!(io.op, BlockOp::Write | BlockOp::WriteSame)
        && io.flags.contains(BlockFlags::PREFLUSH);
    let fua = write_cache
        && matches!(io.op, BlockOp::Write | BlockOp::WriteSame)
        && io.flags.contains(BlockFlags::FUA);
    let (io, then) = if preflush {
        let write = BlockIo {
            flags: io.flags.without(BlockFlags::PREFLUSH),
            ..*io
        };
        (BlockIo::flush(io.tag), Some(write))
    } else if io.op == BlockOp::WriteSame && u64::from(io.len) > SAME_BLOCKS as u64 * bs {
        let first = (SAME_BLOCKS as u64 * bs) as u32;
        let rest = BlockIo {
            offset: io.offset + u64::from(first),
            len: io.len - first,
            ..*io
        };
        let piece = BlockIo {
            len: first,
            flags: io.flags.without(BlockFlags::FUA),
            ..*io
        };
        (piece, Some(rest))
    } else if fua {
        let write = BlockIo {
            flags: io.flags.without(BlockFlags::FUA),
            ..*io
        };
        (write, Some(BlockIo::flush(io.tag)))
    } else {
        (*io, None)
    };
    let io = &io;
    // SAFETY: per the contract; the borrow ends before SPDK is called.
    let (desc, ch, bs, total, slot) = unsafe {
        let s = &mut *st;
        let Some(i) = s.free.pop() else {
            return -libc::ENOMEM;
        };
        let slot = &mut s.slots[i as usize] as *mut InFlight;
        (*slot).tag = io.tag;
        (*slot).then = then;
        match (io.op, io.buf) {
            (BlockOp::WriteSame, Some(block)) => {
                let empty = libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                };
                let same = (*slot)
                    .same
                    .get_or_insert_with(|| vec![empty; SAME_BLOCKS].into_boxed_slice());
                for v in same.iter_mut() {
                    *v = libc::iovec {
                        iov_base: block.as_ptr().cast::<c_void>(),
                        iov_len: block.len(),
                    };
                }
            }
            (_, Some(buf)) => {
                (*slot).iov = libc::iovec {
                    iov_base: buf.as_ptr().cast::<c_void>(),
                    iov_len: io.len as usize,
                };
            }
            (_, None) => {}
        }
        (s.desc.desc, s.ch, s.block_size, s.size_blocks, slot)
    };
    let off = io.offset / bs;
    let n = u64::from(io.len) / bs;
    let arg = slot.cast::<c_void>();
    let cb = Some(io_done as unsafe extern "C" fn(*mut sys::spdk_bdev_io, bool, *mut c_void));
    // SAFETY: the slot's iovecs and the buffer stay valid until the completion (the
    // request owns its chunk until answered); the callback gets the slot back. A
    // write-same piece has at most SAME_BLOCKS blocks, one iovec each.
    let rc = unsafe {
        let iov = std::ptr::addr_of_mut!((*slot).iov).cast::<sys::iovec>();
        match io.op {
            BlockOp::Read => sys::spdk_bdev_readv_blocks(desc, ch, iov, 1, off, n, cb, arg),
            BlockOp::Write => sys::spdk_bdev_writev_blocks(desc, ch, iov, 1, off, n, cb, arg),
            BlockOp::WriteSame => match (*slot).same.as_mut() {
                Some(same) => {
                    let iov = same.as_mut_ptr().cast::<sys::iovec>();
                    sys::spdk_bdev_writev_blocks(desc, ch, iov, n as c_int, off, n, cb, arg)
                }
                None => -libc::EINVAL,
            },
            BlockOp::Flush => sys::spdk_bdev_flush_blocks(desc, ch, 0, total, cb, arg),
            BlockOp::Discard => sys::spdk_bdev_unmap_blocks(desc, ch, off, n, cb, arg),
            BlockOp::WriteZeroes => sys::spdk_bdev_write_zeroes_blocks(desc, ch, off, n, cb, arg),
            BlockOp::SecureErase => -libc::EOPNOTSUPP,
        }
    };
    // SAFETY: per the contract; a short borrow.
    unsafe {
        let s = &mut *st;
        if rc == 0 {
            s.in_flight += 1;
        } else {
            s.free.push((*slot).index);
        }
    }
    rc
}

unsafe extern "C" fn io_done(bdev_io: *mut sys::spdk_bdev_io, success: bool, arg: *mut c_void) {
    // SAFETY: `arg` is the slot given at submission; its channel state lives until
    // every IO completed (the drain poller waits for that).
    unsafe {
        sys::spdk_bdev_free_io(bdev_io);
        let slot = arg.cast::<InFlight>();
        let st = (*slot).chan;
        let (tag, then) = ((*slot).tag, (*slot).then.take());
        (*st).in_flight -= 1;
        (*st).free.push((*slot).index);
        if let (true, Some(next)) = (success, then) {
            match start(st, &next) {
                0 => {}
                rc if rc == -libc::ENOMEM => {
                    (*st).waiting.push_front(next);
                    arm_wait(st);
                }
                rc => (*st).done.push_back(BlockCompletion::from_neg(tag, rc)),
            }
            return;
        }
        (*st).done.push_back(BlockCompletion::new(
            tag,
            if success { Ok(()) } else { Err(Errno::EIO) },
        ));
    }
}

/// Arms `spdk_bdev_queue_io_wait` for the channel (once).
///
/// # Safety
/// As [`start`].
unsafe fn arm_wait(st: *mut ChanState) {
    // SAFETY: per the contract.
    unsafe {
        let s = &mut *st;
        if s.wait_armed {
            return;
        }
        s.nomem_waits += 1;
        if s.nomem_waits.is_power_of_two() {
            tracing::info!(
                "spdk bdev '{}': bdev_io pool exhausted (-ENOMEM); waiting with \
                 spdk_bdev_queue_io_wait ({} times on this thread)",
                s.name,
                s.nomem_waits
            );
        }
        s.wait.bdev = s.desc.bdev;
        s.wait.cb_fn = Some(retry_waiting);
        s.wait.cb_arg = st.cast::<c_void>();
        let rc = sys::spdk_bdev_queue_io_wait(s.desc.bdev, s.ch, &mut s.wait);
        s.wait_armed = rc == 0;
        if rc != 0 {
            // Nothing of ours is in flight on this bdev: fail what waits.
            while let Some(io) = s.waiting.pop_front() {
                s.done
                    .push_back(BlockCompletion::new(io.tag, Err(Errno::EIO)));
            }
        }
    }
}

unsafe extern "C" fn retry_waiting(arg: *mut c_void) {
    let st = arg.cast::<ChanState>();
    // SAFETY: the state outlives its armed wait entry (the drain poller waits for it).
    unsafe {
        (*st).wait_armed = false;
        while let Some(io) = (*st).waiting.pop_front() {
            match start(st, &io) {
                0 => {}
                rc if rc == -libc::ENOMEM => {
                    (*st).waiting.push_front(io);
                    arm_wait(st);
                    break;
                }
                rc => (*st).done.push_back(BlockCompletion::from_neg(io.tag, rc)),
            }
        }
    }
}

impl BlockBackend for BdevChannel {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn set_size(&mut self, size: u64) {
        self.geometry.size = size;
        // SAFETY: on the owning thread; a short write.
        unsafe {
            let s = self.state.as_ptr();
            (*s).size_blocks = size / (*s).block_size;
        }
    }

    fn queue_depth(&self) -> usize {
        CHANNEL_DEPTH
    }

    fn in_flight(&self) -> usize {
        // SAFETY: a short read on the owning thread.
        let s = unsafe { self.state.as_ref() };
        s.in_flight + s.waiting.len() + s.done.len()
    }

    fn submit(&mut self, io: BlockIo) -> Result<(), BlockSubmitError> {
        self.geometry.validate(&io)?;
        let st = self.state.as_ptr();
        // SAFETY: on the owning thread; short borrows around SPDK calls.
        unsafe {
            if (*st).in_flight + (*st).waiting.len() >= CHANNEL_DEPTH {
                return Err(BlockSubmitError::Busy {
                    depth: CHANNEL_DEPTH,
                });
            }
            if !(*st).waiting.is_empty() {
                (*st).waiting.push_back(io);
                return Ok(());
            }
            match start(st, &io) {
                0 => {}
                rc if rc == -libc::ENOMEM => {
                    (*st).waiting.push_back(io);
                    arm_wait(st);
                }
                rc => (*st).done.push_back(BlockCompletion::from_neg(io.tag, rc)),
            }
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        let st = self.state.as_ptr();
        // SAFETY: on the owning thread; completions are pushed by callbacks on this
        // same thread, never during this call.
        unsafe { drain_completions(&mut (*st).done, out) }
    }

    fn describe(&self) -> String {
        format!("spdk bdev {}", self.name)
    }
}

impl Drop for BdevChannel {
    fn drop(&mut self) {
        let st = self.state.as_ptr();
        // SAFETY: on the owning thread.
        let busy = unsafe { (*st).in_flight > 0 || (*st).wait_armed };
        if !busy {
            // SAFETY: nothing references the state any more; the channel is ours.
            unsafe {
                sys::spdk_put_io_channel((*st).ch);
                drop(Box::from_raw(st));
            }
            return;
        }
        // IO still in flight: a poller frees the state once it completed.
        let run = move || {
            // SAFETY: the state of a dropped channel, freed only here, used on this thread
            // (the poller's and the IO callbacks' thread).
            unsafe {
                if (*st).in_flight > 0 || (*st).wait_armed {
                    return SpdkPoll::Idle;
                }
                if !(*st).ch.is_null() {
                    sys::spdk_put_io_channel((*st).ch);
                }
                drop(Box::from_raw(st));
            }
            SpdkPoll::Stop
        };
        match SpdkPoller::start(c"rtrs_bdev_drain", 1000, run) {
            Some(p) => p.detach(),
            None => tracing::error!(
                "spdk bdev {}: no poller to free a channel dropped with IO in flight; its state is leaked",
                self.name
            ),
        }
    }
}
