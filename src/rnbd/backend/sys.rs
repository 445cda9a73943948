//! Every `unsafe` of the block backends, fenced in one place: the IO buffer handle
//! ([`IoBuf`], raw chunk memory), RAM copies, the libc calls of the file backend
//! (`pread`, `pwritev2`, `fdatasync`, `fallocate`, the `BLK*` ioctls) and pushing io_uring
//! submission entries that point at raw buffers.
//!
//! The kernel's `rnbd-srv` hands the block layer a bio mapped over the RTRS chunk
//! (`rnbd_bio_map_kern`); here the chunk travels as an [`IoBuf`] and is touched only
//! through the functions below.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU64;
#[cfg(not(target_arch = "x86_64"))]
use std::sync::atomic::Ordering;

use io_uring::{opcode, squeue, types};

use super::step::{same_iovecs, Step, SAME_IOVS};
use crate::fabric::mem::MemBuf;

/// Raw memory an IO reads into or writes from: usually (part of) an RTRS chunk, which a
/// request owns exclusively from its arrival until its response.
///
/// Copyable on purpose: a submission refused with
/// [`BlockSubmitError::Busy`](super::BlockSubmitError::Busy) is retried with the same value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: `IoBuf::new`'s contract makes the memory valid from any thread until the IO
// completes; backends hand it to worker threads or the kernel only for that span.
unsafe impl Send for IoBuf {}
// SAFETY: as above; an `IoBuf` itself is an address and a length.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// Describes `len` bytes at `ptr`.
    ///
    /// # Safety
    /// From the submission of an IO carrying this buffer until its completion has been
    /// returned by [`poll`](super::BlockBackend::poll) (or the backend has been dropped,
    /// which waits for in-flight IO), the memory must stay allocated, be valid for reads
    /// and writes of `len` bytes from any thread, and nothing else may access it (a read
    /// writes into it; a write is read by the kernel or a worker thread meanwhile).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> IoBuf {
        IoBuf { ptr, len }
    }

    /// The whole of an owned buffer.
    ///
    /// # Safety
    /// As for [`IoBuf::new`]: `mem` must outlive the IO and nothing else may touch it
    /// meanwhile.
    pub unsafe fn from_mem(mem: &MemBuf) -> IoBuf {
        IoBuf {
            ptr: mem.as_ptr(),
            len: mem.len(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Copies `src` into the buffer at `offset` (how RNBD writes a reply into a READ
    /// request's data area).
    ///
    /// # Panics
    /// When `offset + src.len()` exceeds the buffer.
    ///
    /// # Safety
    /// The memory must be valid and unused by anyone else for the copy, as
    /// [`IoBuf::new`] requires while an IO runs.
    pub unsafe fn copy_in(&self, offset: usize, src: &[u8]) {
        assert!(offset
            .checked_add(src.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (asserted), valid and unshared (the caller's promise); `src`
        // is a Rust slice, so it cannot be this raw memory being written.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(offset), src.len()) }
    }

    /// Copies bytes of the buffer at `offset` into `dst`.
    ///
    /// # Panics
    /// When `offset + dst.len()` exceeds the buffer.
    ///
    /// # Safety
    /// As for [`copy_in`](Self::copy_in): valid memory nobody writes meanwhile.
    pub unsafe fn copy_out(&self, offset: usize, dst: &mut [u8]) {
        assert!(offset
            .checked_add(dst.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: in bounds (asserted), valid and not written concurrently (the caller's
        // promise); `dst` is an exclusive Rust slice, so it does not overlap.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(offset), dst.as_mut_ptr(), dst.len()) }
    }

    /// The address `offset` bytes in (no dereference, so no `unsafe`).
    pub(super) fn ptr_at(&self, offset: usize) -> *mut u8 {
        self.ptr.wrapping_add(offset)
    }
}

// A RAM disk's store is shared by the disk's instances on several cores, which copy into
// and out of the same bytes with no lock: IOs to overlapping ranges in flight together
// may each see some bytes of the other, as on any block device (docs/ARCHITECTURE.md,
// "Who writes what per IO"). Every access to a store's bytes after it is shared goes
// through the four functions below, and all of them access it the same way, so that no
// access is a data race:
// - on x86_64, through the string instructions (`rep movsb`, `rep stosb`) in `asm!`
//   blocks, which copy at memory speed; to the language an `asm!` block is opaque code
//   whose effect here is that of a byte-wise relaxed atomic copy (each byte a
//   single-copy-atomic access, which is what the processor guarantees for them);
// - elsewhere, relaxed 8-byte atomic loads and stores.

/// The address of `[offset, offset + len)` of `store`.
///
/// # Panics
/// When the range leaves `store`, or `offset` or `len` is not a multiple of 8 (a RAM disk
/// validates block alignment first, and its blocks are 512 bytes or more).
fn store_at(store: &MemBuf, offset: usize, len: usize) -> *mut u8 {
    assert!(
        offset % 8 == 0
            && len % 8 == 0
            && store.len() % 8 == 0
            && store.as_ptr() as usize % std::mem::align_of::<AtomicU64>() == 0
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= store.len())
    );
    store.as_ptr().wrapping_add(offset)
}

/// Copies `len` bytes from `src` to `dst` as a byte-wise relaxed atomic copy.
///
/// # Safety
/// Both ranges are valid for `len` bytes and do not overlap; bytes of a store are
/// accessed only through this module's functions.
#[cfg(target_arch = "x86_64")]
unsafe fn racy_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's promise; `rep movsb` moves `rcx` bytes from `[rsi]` to
    // `[rdi]` upwards (the direction flag is clear on entry to any Rust code, as the
    // ABI requires) and changes only those three registers.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags)
        );
    }
}

/// Sets `len` bytes at `dst` to zero as a byte-wise relaxed atomic store.
///
/// # Safety
/// As [`racy_copy`], for `dst`.
#[cfg(target_arch = "x86_64")]
unsafe fn racy_zero(dst: *mut u8, len: usize) {
    // SAFETY: the caller's promise; `rep stosb` stores `al` into `rcx` bytes from
    // `[rdi]` upwards.
    unsafe {
        std::arch::asm!(
            "rep stosb",
            inout("rcx") len => _,
            inout("rdi") dst => _,
            in("al") 0u8,
            options(nostack, preserves_flags)
        );
    }
}

/// Copies `len` bytes from `src` to `dst` through relaxed 8-byte atomic accesses of
/// whichever side is a store (both may be).
///
/// # Safety
/// As the x86_64 version; `len` is a multiple of 8 and a store's side is 8-aligned.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn racy_copy(dst: *mut u8, src: *const u8, len: usize) {
    for i in (0..len).step_by(8) {
        // SAFETY: in bounds (the caller's promise); an 8-aligned store word is only
        // ever accessed atomically, and the other side is an IO buffer nobody else
        // touches meanwhile, for which an atomic access is as good as a plain one.
        unsafe {
            let v = if src as usize % 8 == 0 {
                (*src.add(i).cast::<AtomicU64>()).load(Ordering::Relaxed)
            } else {
                src.add(i).cast::<u64>().read_unaligned()
            };
            if dst as usize % 8 == 0 {
                (*dst.add(i).cast::<AtomicU64>()).store(v, Ordering::Relaxed);
            } else {
                dst.add(i).cast::<u64>().write_unaligned(v);
            }
        }
    }
}

/// Sets `len` bytes at `dst` (an 8-aligned store range) to zero.
///
/// # Safety
/// As [`racy_copy`].
#[cfg(not(target_arch = "x86_64"))]
unsafe fn racy_zero(dst: *mut u8, len: usize) {
    for i in (0..len).step_by(8) {
        // SAFETY: in bounds and aligned (the caller's promise).
        unsafe { (*dst.add(i).cast::<AtomicU64>()).store(0, Ordering::Relaxed) };
    }
}

/// Copies `len` bytes of `store` at `offset` into `buf`.
///
/// # Panics
/// When the range leaves `store` or is not in whole words ([`store_at`]), or `buf` is
/// shorter than `len`.
pub(super) fn ram_read(store: &MemBuf, offset: usize, buf: IoBuf, len: usize) {
    assert!(len <= buf.len);
    let at = store_at(store, offset, len);
    // SAFETY: `at` is `len` bytes of the store (asserted); `buf` is valid for `len`
    // bytes (asserted), exclusively ours until the IO completes (IoBuf::new's contract)
    // and not part of the store.
    unsafe { racy_copy(buf.ptr, at, len) }
}

/// How much of a read [`ram_prefetch`] asks for: the first 1 KiB, after which the
/// processor's own prefetcher follows; asking for more fills the line fill buffers and
/// stalls the asking (`docs/BENCHMARKS.md`, "A RAM disk's reads fetched ahead").
const PREFETCH_BYTES: usize = 1024;

/// Asks the memory system for the first bytes of `[offset, offset + len)` of `store`, for
/// a [`ram_read`] to come: a hint, which reads nothing the program sees.
///
/// # Panics
/// As [`ram_read`], for the range.
pub(super) fn ram_prefetch(store: &MemBuf, offset: usize, len: usize) {
    let at = store_at(store, offset, len);
    #[cfg(target_arch = "x86_64")]
    for i in (0..len.min(PREFETCH_BYTES)).step_by(64) {
        // SAFETY: a prefetch never faults and changes no memory; the address is inside
        // the store (asserted by `store_at`).
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                at.wrapping_add(i).cast::<i8>(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Copies the first `len` bytes of `buf` into `store` at `offset`.
///
/// # Panics
/// As [`ram_read`].
pub(super) fn ram_write(store: &MemBuf, offset: usize, buf: IoBuf, len: usize) {
    assert!(len <= buf.len);
    let at = store_at(store, offset, len);
    // SAFETY: as in ram_read, the other way.
    unsafe { racy_copy(at, buf.ptr, len) }
}

/// Zeroes `len` bytes of `store` at `offset`.
///
/// # Panics
/// As [`store_at`].
pub(super) fn ram_zero(store: &MemBuf, offset: usize, len: usize) {
    let at = store_at(store, offset, len);
    // SAFETY: `at` is `len` bytes of the store (asserted).
    unsafe { racy_zero(at, len) }
}

/// Writes `block` (the pattern: all of it) over `len` bytes of `store` at `offset`, over
/// and over (a write-same).
///
/// # Panics
/// As [`store_at`], or when `len` is not a multiple of the pattern's length, or the
/// pattern's length not one of 8 (callers validate first; this is the last guard).
pub(super) fn ram_fill(store: &MemBuf, offset: usize, block: IoBuf, len: usize) {
    let bs = block.len;
    assert!(bs > 0 && bs % 8 == 0 && len % bs == 0);
    let at = store_at(store, offset, len);
    for k in (0..len).step_by(bs) {
        // SAFETY: `k + bs <= len`, within the store's range (asserted); `block` is valid
        // for `bs` bytes, exclusively ours until the IO completes (IoBuf::new's
        // contract) and not part of the store.
        unsafe { racy_copy(at.add(k), block.ptr, bs) }
    }
}

// <linux/fs.h>: _IOR(0x12, 114, size_t), _IO(0x12, 104), _IO(0x12, 123), _IO(0x12, 119).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKPBSZGET: libc::c_ulong = 0x127b;
const BLKDISCARD: libc::c_ulong = 0x1277;

/// Size, logical and physical block size of a block device.
pub(super) fn blockdev_geometry(fd: RawFd) -> Result<(u64, u32, u32), (&'static str, io::Error)> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64 as _, &mut size as *mut u64) } < 0 {
        return Err(("ioctl(BLKGETSIZE64)", io::Error::last_os_error()));
    }
    let mut lbs: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which is valid.
    if unsafe { libc::ioctl(fd, BLKSSZGET as _, &mut lbs as *mut libc::c_int) } < 0 {
        return Err(("ioctl(BLKSSZGET)", io::Error::last_os_error()));
    }
    let mut pbs: libc::c_uint = 0;
    // SAFETY: BLKPBSZGET writes one unsigned int through the pointer, which is valid.
    if unsafe { libc::ioctl(fd, BLKPBSZGET as _, &mut pbs as *mut libc::c_uint) } < 0 {
        return Err(("ioctl(BLKPBSZGET)", io::Error::last_os_error()));
    }
    Ok((size, lbs as u32, pbs))
}

fn neg_errno() -> i32 {
    -io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Runs one step synchronously (the thread pool's way): the byte count or 0 on success,
/// a negative errno on failure. Blocks; never call it on a reactor thread.
pub(super) fn exec(fd: RawFd, step: Step) -> i32 {
    let ret: isize = match step {
        // SAFETY: `ptr` is valid for `len` bytes and exclusively ours until the IO
        // completes (IoBuf::new's contract, checked against `len` at submission).
        Step::Read { offset, ptr, len } => unsafe {
            libc::pread(fd, ptr.cast(), len as usize, offset as libc::off_t)
        },
        Step::Write {
            offset,
            ptr,
            len,
            dsync,
        } => {
            let iov = libc::iovec {
                iov_base: ptr.cast(),
                iov_len: len as usize,
            };
            let flags = if dsync { libc::RWF_DSYNC } else { 0 };
            // SAFETY: one iovec over memory valid for `len` bytes (as for Read).
            unsafe { libc::pwritev2(fd, &iov, 1, offset as libc::off_t, flags) }
        }
        Step::WriteSame { offset, dsync, .. } => {
            let mut iovs = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; SAME_IOVS];
            let n = same_iovecs(&step, &mut iovs);
            let flags = if dsync { libc::RWF_DSYNC } else { 0 };
            // SAFETY: `n` iovecs, each inside the pattern block, which is valid and
            // exclusively ours until the IO completes (IoBuf::new's contract, its length
            // checked at submission).
            unsafe { libc::pwritev2(fd, iovs.as_ptr(), n as i32, offset as libc::off_t, flags) }
        }
        // SAFETY: plain syscall on an fd the backend keeps open.
        Step::Sync => unsafe { libc::fdatasync(fd) as isize },
        Step::Fallocate { offset, len, mode } => {
            // SAFETY: plain syscall on an fd the backend keeps open.
            unsafe { libc::fallocate(fd, mode, offset as libc::off_t, len as libc::off_t) as isize }
        }
        Step::BlkDiscard { offset, len } => {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads two u64 (start, length) through the pointer.
            unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) as isize }
        }
    };
    if ret < 0 {
        neg_errno()
    } else {
        ret as i32
    }
}

/// The io_uring entry for `step`, or `None` for a step io_uring cannot run
/// ([`Step::BlkDiscard`], an ioctl). A [`Step::WriteSame`] writes from `iovs`, filled
/// here.
fn entry(fd: RawFd, step: Step, iovs: &mut [libc::iovec]) -> Option<squeue::Entry> {
    let fd = types::Fd(fd);
    Some(match step {
        Step::Read { offset, ptr, len } => opcode::Read::new(fd, ptr, len).offset(offset).build(),
        Step::Write {
            offset,
            ptr,
            len,
            dsync,
        } => opcode::Write::new(fd, ptr, len)
            .offset(offset)
            .rw_flags(if dsync { libc::RWF_DSYNC } else { 0 })
            .build(),
        Step::WriteSame { offset, dsync, .. } => {
            let n = same_iovecs(&step, iovs);
            opcode::Writev::new(fd, iovs.as_ptr(), n as u32)
                .offset(offset)
                .rw_flags(if dsync { libc::RWF_DSYNC } else { 0 })
                .build()
        }
        Step::Sync => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        Step::Fallocate { offset, len, mode } => opcode::Fallocate::new(fd, len)
            .offset(offset)
            .mode(mode)
            .build(),
        Step::BlkDiscard { .. } => return None,
    })
}

/// Why a step could not be queued on the ring.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PushFailed {
    /// The submission queue is full; submit and try again.
    Full,
    /// io_uring has no opcode for this step.
    NotRingable,
}

/// Queues `step` on the ring with `user_data`; a write-same's iovecs are written into
/// `iovs` (at least [`SAME_IOVS`] entries for one).
///
/// The caller keeps the step's plan (and so the buffer's ownership) and `iovs` in the
/// slot that `user_data` names, untouched, until the matching completion has been
/// reaped; [`IoBuf::new`]'s contract keeps the memory valid that long.
pub(super) fn push(
    sq: &mut squeue::SubmissionQueue<'_>,
    fd: RawFd,
    step: Step,
    user_data: u64,
    iovs: &mut [libc::iovec],
) -> Result<(), PushFailed> {
    let entry = entry(fd, step, iovs)
        .ok_or(PushFailed::NotRingable)?
        .user_data(user_data);
    // SAFETY: the entry's buffer or iovecs (if any) are valid until its completion (see
    // above) and the fd stays open while the ring lives (the file backend drops the
    // ring, after draining it, before closing the file).
    unsafe { sq.push(&entry) }.map_err(|_| PushFailed::Full)
}
