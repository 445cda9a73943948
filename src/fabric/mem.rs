//! Registered memory: owned buffers ([`MemBuf`]), registrations ([`Mr`]) and
//! fast-registration slots ([`FastMr`]).
//!
//! RDMA memory is shared with the hardware (or, on the software fabrics, with the
//! peer's receive path): a peer may write into a registration at any time its rkey is
//! valid. So registered memory is never handed out as a long-lived `&mut [u8]`; it is
//! read and written by copying ([`Mr::read_at`], [`Mr::write_at`]) or through the
//! `unsafe` slice accessors whose callers state why nobody else writes meanwhile (RTRS
//! owns a chunk or a buffer between a request's post and its response).

use std::alloc::{self, Layout};
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Alignment of [`MemBuf`]: a page, as registered memory usually is.
pub const MEM_ALIGN: usize = 4096;

/// From this size on a [`MemBuf`] is its own anonymous mapping (see [`MemBuf::zeroed`]).
pub const MMAP_MIN: usize = 256 * 1024;

/// A transparent huge page: buffers from [`MemBuf::try_zeroed_huge`] of at least this
/// size ask for them.
pub const HUGE_PAGE: usize = 2 << 20;

/// A zeroed, page-aligned heap buffer, the usual thing to register.
pub struct MemBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: MemBuf owns its allocation exclusively; the bytes are plain data.
unsafe impl Send for MemBuf {}
// SAFETY: shared access only hands out raw pointers or copies; see the module doc.
unsafe impl Sync for MemBuf {}

/// A [`MemBuf`] could not be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocError {
    pub len: usize,
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot allocate {} bytes of memory", self.len)
    }
}

impl std::error::Error for AllocError {}

/// Where a large mapping is asked to go: at random in the lower half of the user address
/// space (2 MiB aligned), so that one buffer's address says nothing of another's (a
/// session's chunk pool is not found from a neighbour's). The kernel treats it as a hint.
fn random_hint() -> *mut libc::c_void {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        return std::ptr::null_mut();
    }
    const LO: u64 = 1 << 40;
    const SPAN: u64 = (1 << 46) - LO;
    let at = LO + (u64::from_le_bytes(b) % SPAN);
    (at & !((2 << 20) - 1)) as *mut libc::c_void
}

impl MemBuf {
    /// Allocates `len` zeroed bytes aligned to [`MEM_ALIGN`].
    ///
    /// Buffers of [`MMAP_MIN`] bytes or more are anonymous mappings at a random address:
    /// the kernel hands out zero pages on first touch, so a pool sized for the worst case
    /// (a session's bounce buffers, a target's chunks) costs resident memory only for
    /// what is used.
    ///
    /// # Errors
    /// [`AllocError`] when the memory cannot be had (address-space limit, overcommit
    /// policy): whatever a peer can make us allocate goes through here, so that a
    /// refusal, not an abort, answers it.
    ///
    /// # Panics
    /// When `len` is 0.
    pub fn try_zeroed(len: usize) -> Result<MemBuf, AllocError> {
        MemBuf::allocate(len, false)
    }

    /// [`MemBuf::try_zeroed`] for memory that is touched all over at random, as a RAM
    /// disk is: a buffer of [`HUGE_PAGE`] bytes or more asks the kernel for transparent
    /// huge pages (`MADV_HUGEPAGE`), so that one translation covers 2 MiB instead of
    /// 4 KiB and a random access seldom misses the TLB. Memory is still committed on
    /// first touch, but 2 MiB at a time. Where the kernel has no transparent huge pages
    /// (or they are set to `never`) the advice is refused and the buffer is an ordinary
    /// one (`docs/BENCHMARKS.md`, "A RAM disk on huge pages").
    ///
    /// # Errors
    /// As [`MemBuf::try_zeroed`].
    ///
    /// # Panics
    /// When `len` is 0.
    pub fn try_zeroed_huge(len: usize) -> Result<MemBuf, AllocError> {
        MemBuf::allocate(len, true)
    }

    fn allocate(len: usize, huge: bool) -> Result<MemBuf, AllocError> {
        assert!(len > 0, "MemBuf of zero bytes");
        let fail = AllocError { len };
        if len >= MMAP_MIN {
            // SAFETY: a fresh private anonymous mapping (the address is only a hint, never
            // MAP_FIXED); no existing memory is affected.
            let raw = unsafe {
                libc::mmap(
                    random_hint(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if raw == libc::MAP_FAILED {
                return Err(fail);
            }
            let ptr = NonNull::new(raw.cast::<u8>()).ok_or(fail)?;
            if huge && len >= HUGE_PAGE {
                // SAFETY: advice on the mapping just made, which nothing else uses yet; it
                // changes how the kernel backs the range, never its contents (zero). A
                // refusal (no transparent huge pages here) leaves 4 KiB pages.
                unsafe { libc::madvise(raw, len, libc::MADV_HUGEPAGE) };
            }
            return Ok(MemBuf { ptr, len });
        }
        let layout = Layout::from_size_align(len, MEM_ALIGN).map_err(|_| fail)?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(fail)?;
        Ok(MemBuf { ptr, len })
    }

    /// [`MemBuf::try_zeroed`] for memory the caller sizes itself.
    ///
    /// # Panics
    /// When `len` is 0 or the allocation fails (as `Vec` does on out-of-memory).
    pub fn zeroed(len: usize) -> MemBuf {
        MemBuf::try_zeroed(len).unwrap_or_else(|e| {
            let layout = Layout::from_size_align(e.len, MEM_ALIGN).unwrap_or(Layout::new::<u8>());
            alloc::handle_alloc_error(layout)
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for MemBuf {
    fn drop(&mut self) {
        if self.len >= MMAP_MIN {
            // SAFETY: mapped in `zeroed` with this length; nothing refers to it any more.
            let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
            debug_assert_eq!(rc, 0, "munmap of a MemBuf");
            return;
        }
        let layout = Layout::from_size_align(self.len, MEM_ALIGN).expect("MemBuf layout");
        // SAFETY: allocated in `zeroed` with this very layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl fmt::Debug for MemBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemBuf({:p}, {} bytes)", self.ptr, self.len)
    }
}

/// The memory behind a registration: owned, or the caller's (see
/// [`super::Fabric::register_raw`]). Shared by the [`Mr`] and by whatever in the backend
/// may still touch it, so it outlives every access.
#[derive(Debug)]
pub enum Backing {
    Owned(MemBuf),
    External { addr: *mut u8, len: usize },
}

// SAFETY: an External backing is the caller's promise (register_raw's contract) that
// the memory is valid from any thread for the registration's lifetime.
unsafe impl Send for Backing {}
// SAFETY: as above; access goes through raw pointers and copies only.
unsafe impl Sync for Backing {}

impl Backing {
    pub fn addr(&self) -> *mut u8 {
        match self {
            Backing::Owned(b) => b.as_ptr(),
            Backing::External { addr, .. } => *addr,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Backing::Owned(b) => b.len(),
            Backing::External { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A memory registration. Dropping it deregisters first, then frees owned memory.
pub struct Mr {
    lkey: u32,
    rkey: u32,
    /// The rkey on each device of a backend with several ([`Mr::rkey_on`]), kept
    /// current by the backend as devices come and go; empty where there is one.
    device_rkeys: Arc<[AtomicU32]>,
    access: super::Access,
    /// Which of the crate's own tables made it ([`Owner`]); `None` for any other.
    pub(crate) owner: Option<Owner>,
    // Field order is drop order: the backend's registration goes before the memory.
    handle: Box<dyn Any + Send + Sync>,
    backing: Arc<Backing>,
}

impl Mr {
    /// For backends: assembles a registration. `handle` is the backend's own state
    /// (deregistration on drop); `backing` is the memory.
    pub fn from_parts(
        lkey: u32,
        rkey: u32,
        access: super::Access,
        handle: Box<dyn Any + Send + Sync>,
        backing: Arc<Backing>,
    ) -> Mr {
        Mr {
            lkey,
            rkey,
            device_rkeys: Arc::new([]),
            access,
            owner: None,
            handle,
            backing,
        }
    }

    /// For backends with several devices: the rkey on each, by device index
    /// ([`super::Hca::index`]); [`Mr::rkey`] is device 0's.
    pub fn with_device_rkeys(mut self, rkeys: Arc<[AtomicU32]>) -> Mr {
        self.device_rkeys = rkeys;
        self
    }

    /// The rkey a peer uses through a connection on device `device`
    /// ([`super::device_index`]): what goes on the wire for that connection.
    pub fn rkey_on(&self, device: u8) -> u32 {
        self.device_rkeys
            .get(usize::from(device))
            .map_or(self.rkey, |k| k.load(Ordering::Relaxed))
    }

    /// For backends: their state, to check a registration is theirs.
    pub fn handle(&self) -> &(dyn Any + Send + Sync) {
        &*self.handle
    }

    /// For backends: the memory, to keep it alive while they access it.
    pub fn backing(&self) -> &Arc<Backing> {
        &self.backing
    }

    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    pub fn access(&self) -> super::Access {
        self.access
    }

    /// Virtual address of the first byte (also the iova peers use with the rkey).
    pub fn addr(&self) -> u64 {
        self.backing.addr() as u64
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.backing.addr()
    }

    pub fn len(&self) -> usize {
        self.backing.len()
    }

    pub fn is_empty(&self) -> bool {
        self.backing.is_empty()
    }

    /// An SGE for `[offset, offset+len)` of this registration.
    ///
    /// # Panics
    /// When the range is outside the registration or `len` exceeds `u32::MAX`.
    // Inlined: an SGE returned through memory from a call, written in narrow stores and
    // read back in one wide load, stalls the caller (docs/BENCHMARKS.md, "Small values
    // returned through memory").
    #[inline(always)]
    pub fn sge(&self, offset: usize, len: usize) -> super::Sge {
        self.check(offset, len);
        super::Sge {
            addr: self.addr() + offset as u64,
            len: len as u32,
            lkey: self.lkey,
        }
    }

    /// Copies `data` into the registration at `offset`.
    ///
    /// # Panics
    /// When the range is outside the registration.
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: in bounds (checked); the memory is valid while `self` lives. Concurrent
        // remote writes to the same bytes are a protocol error of the caller, not UB in
        // this copy's own bookkeeping.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.as_ptr().add(offset), data.len())
        }
    }

    /// Copies `out.len()` bytes at `offset` out of the registration.
    ///
    /// # Panics
    /// When the range is outside the registration.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: as in write_at.
        unsafe {
            std::ptr::copy_nonoverlapping(self.as_ptr().add(offset), out.as_mut_ptr(), out.len())
        }
    }

    /// Borrows `[offset, offset+len)`.
    ///
    /// # Safety
    /// Nothing (local code or a peer through an rkey) may write those bytes while the
    /// slice lives.
    ///
    /// # Panics
    /// When the range is outside the registration.
    pub unsafe fn slice(&self, offset: usize, len: usize) -> &[u8] {
        self.check(offset, len);
        // SAFETY: in bounds; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.as_ptr().add(offset), len) }
    }

    /// Borrows `[offset, offset+len)` mutably.
    ///
    /// # Safety
    /// Nothing else may read or write those bytes while the slice lives.
    ///
    /// # Panics
    /// When the range is outside the registration.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [u8] {
        self.check(offset, len);
        // SAFETY: in bounds; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr().add(offset), len) }
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() && len <= u32::MAX as usize => {}
            _ => self.out_of_range(offset, len),
        }
    }

    #[cold]
    #[inline(never)]
    fn out_of_range(&self, offset: usize, len: usize) -> ! {
        panic!(
            "range {offset}..+{len} outside registration of {} bytes",
            self.len()
        )
    }
}

impl fmt::Debug for Mr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mr")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("access", &self.access)
            .finish()
    }
}

/// Which of the crate's own tables made an [`Mr`] or [`FastMr`], and the index it has
/// there: set only by that table (the field is the crate's), so that the table knows its
/// own from the object alone, without reaching through the backend's handle
/// (docs/ARCHITECTURE.md, "The registration table").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Owner {
    /// The table's id (ids start at 1).
    pub table: std::num::NonZeroU64,
    pub index: u32,
}

/// A fast-registration slot (an rkey with no memory until bound by
/// [`super::SendOp::RegMr`]). Its current rkey advances with every binding.
pub struct FastMr {
    rkey: AtomicU32,
    /// As [`Mr`]'s.
    pub(crate) owner: Option<Owner>,
    handle: Box<dyn Any + Send + Sync>,
}

impl FastMr {
    /// For backends: a slot with its initial rkey and the backend's state.
    pub fn from_parts(rkey: u32, handle: Box<dyn Any + Send + Sync>) -> FastMr {
        FastMr {
            rkey: AtomicU32::new(rkey),
            owner: None,
            handle,
        }
    }

    /// For backends.
    pub fn handle(&self) -> &(dyn Any + Send + Sync) {
        &*self.handle
    }

    /// For backends: records the rkey a posted binding installed.
    pub fn set_rkey(&self, rkey: u32) {
        self.rkey.store(rkey, Ordering::Release);
    }

    /// The rkey of the latest binding posted (the initial one before any).
    pub fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }
}

impl fmt::Debug for FastMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FastMr(rkey {:#x})", self.rkey())
    }
}

/// For tests: whether the mapping that holds `addr` asked for transparent huge pages
/// (`hg` among its `VmFlags` in `/proc/self/smaps`); `None` (said on stderr) where the
/// kernel has none.
#[cfg(test)]
pub(crate) fn asks_huge_pages(addr: usize) -> Option<bool> {
    if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
        eprintln!("SKIPPED: this kernel has no transparent huge pages");
        return None;
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
    let mut inside = false;
    for line in smaps.lines() {
        let range = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'));
        if let Some((lo, hi)) = range {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
                continue;
            }
        }
        if inside {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.split_whitespace().any(|f| f == "hg"));
            }
        }
    }
    panic!("no mapping holds {addr:#x}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membuf_is_zeroed_and_aligned() {
        let b = MemBuf::zeroed(10_000);
        assert_eq!(b.as_ptr() as usize % MEM_ALIGN, 0);
        // SAFETY: freshly allocated, exclusively owned here.
        let s = unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len()) };
        assert!(s.iter().all(|&x| x == 0));
    }

    /// Pages of `b` resident in memory (mincore).
    fn resident_pages(b: &MemBuf) -> usize {
        let pages = b.len().div_ceil(MEM_ALIGN);
        let mut vec = vec![0u8; pages];
        // SAFETY: `b` is a live mapping of `len` bytes; `vec` has one byte per page.
        let rc = unsafe { libc::mincore(b.as_ptr().cast(), b.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&v| v & 1 == 1).count()
    }

    /// Whether the kernel backs every anonymous mapping with transparent huge pages
    /// where it can (`always`), not only those that ask (`madvise`).
    fn thp_always() -> bool {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| s.contains("[always]"))
    }

    #[test]
    fn large_membuf_is_zeroed_and_costs_only_touched_pages() {
        let b = MemBuf::zeroed(64 * MMAP_MIN);
        assert_eq!(b.as_ptr() as usize % MEM_ALIGN, 0);
        assert_eq!(resident_pages(&b), 0, "a fresh pool is not resident");
        // SAFETY: freshly allocated, exclusively owned here.
        let s = unsafe { std::slice::from_raw_parts_mut(b.as_ptr(), b.len()) };
        assert!(s[..3 * MEM_ALIGN].iter().all(|&x| x == 0));
        s[5 * MEM_ALIGN] = 7;
        assert!(s[b.len() - 1] == 0);
        // Pages 0-2, 5 and the last one were touched. Where the kernel gives every
        // mapping transparent huge pages (`always`), a touch may bring in the whole
        // aligned 2 MiB around it: the two places touched lie in at most three.
        let resident = resident_pages(&b);
        if thp_always() {
            let most = 3 * (HUGE_PAGE / MEM_ALIGN);
            assert!(
                (5..=most).contains(&resident),
                "{resident} pages resident, 5 to {most} expected (huge pages always)"
            );
        } else {
            assert_eq!(resident, 5, "pages 0-2, 5 and the last one were touched");
        }
        drop(b);
        let small = MemBuf::zeroed(MMAP_MIN - 1);
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(small.as_ptr(), small.len()) };
        assert!(bytes.iter().all(|&x| x == 0));
    }

    #[test]
    fn a_huge_membuf_asks_for_huge_pages_and_only_it() {
        let huge = MemBuf::try_zeroed_huge(4 * HUGE_PAGE).expect("8 MiB");
        let Some(asks) = super::asks_huge_pages(huge.as_ptr() as usize) else {
            return;
        };
        assert!(asks, "MADV_HUGEPAGE not on the mapping");
        // SAFETY: freshly allocated, exclusively owned here.
        let s = unsafe { std::slice::from_raw_parts_mut(huge.as_ptr(), huge.len()) };
        s[3 * HUGE_PAGE + 5] = 9;
        assert!(s[..HUGE_PAGE].iter().all(|&x| x == 0));
        assert_eq!(s[3 * HUGE_PAGE + 5], 9);
        let plain = MemBuf::try_zeroed(4 * HUGE_PAGE).expect("8 MiB");
        assert_eq!(
            super::asks_huge_pages(plain.as_ptr() as usize),
            Some(false),
            "an ordinary pool asked for huge pages"
        );
        // Below the huge page size there is nothing to ask for.
        let small = MemBuf::try_zeroed_huge(MMAP_MIN).expect("256 KiB");
        assert_eq!(super::asks_huge_pages(small.as_ptr() as usize), Some(false));
    }

    #[test]
    fn mr_copies_and_bounds() {
        let mr = Mr::from_parts(
            1,
            2,
            crate::fabric::Access::LOCAL_WRITE,
            Box::new(()),
            Arc::new(Backing::Owned(MemBuf::zeroed(64))),
        );
        mr.write_at(60, &[1, 2, 3, 4]);
        let mut out = [0u8; 4];
        mr.read_at(60, &mut out);
        assert_eq!(out, [1, 2, 3, 4]);
        let sge = mr.sge(8, 16);
        assert_eq!((sge.addr - mr.addr(), sge.len, sge.lkey), (8, 16, 1));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mr.write_at(61, &[0; 4])));
        assert!(r.is_err());
    }
}
