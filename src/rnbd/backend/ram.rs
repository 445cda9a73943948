//! A block device in memory (the role `brd`, the kernel's RAM disk, plays behind an
//! `rnbd-srv` export). IO is done at submission and reported on the next poll, so callers
//! see the same asynchronous shape as with a real device.
//!
//! One RAM disk can be driven from several reactors: [`RamBackend::share`] makes another
//! instance (own queue, for another core) over the same memory. Copies take the locks of
//! the stripes they touch (shared for reads, exclusive for writes; stripes of at least
//! 1 MiB, each lock on a cache line of its own), so instances on different threads never
//! race on the bytes, cores working on different parts of the disk share no lock word
//! (docs/ARCHITECTURE.md, "Who writes what per IO"), and overlapping concurrent IO
//! behaves as on a disk (one of the writes wins as a whole).

use std::collections::VecDeque;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::error::{BlockSubmitError, OpenError};
use super::{
    sys, BlockBackend, BlockCompletion, BlockIo, BlockOp, Geometry, DEFAULT_MAX_DISCARD,
    DEFAULT_MAX_TRANSFER, DEFAULT_QUEUE_DEPTH,
};
use crate::fabric::mem::MemBuf;

/// Largest accepted queue depth (any backend).
pub(super) const MAX_QUEUE_DEPTH: usize = 32768;

/// Largest block size: `rnbd_msg_open_rsp` carries block sizes in 16 bits.
pub(super) const MAX_BLOCK_SIZE: u32 = 32768;

/// Checks a logical block size: a power of two in 512..=[`MAX_BLOCK_SIZE`].
pub(super) fn check_block_size(block_size: u32) -> Result<(), OpenError> {
    if block_size.is_power_of_two() && (512..=MAX_BLOCK_SIZE).contains(&block_size) {
        Ok(())
    } else {
        Err(OpenError::BadBlockSize { block_size })
    }
}

pub(super) fn check_queue_depth(depth: usize) -> Result<(), OpenError> {
    if (1..=MAX_QUEUE_DEPTH).contains(&depth) {
        Ok(())
    } else {
        Err(OpenError::BadQueueDepth { depth })
    }
}

/// The memory of a RAM disk, shared by its per-core instances.
struct Store {
    mem: MemBuf,
    /// Orders copies between instances, per stripe of `1 << shift` bytes: readers share
    /// a stripe's lock, writers hold it alone. They guard no Rust data (the bytes live in
    /// `mem`), hence the unit type.
    stripes: Box<[Stripe]>,
    shift: u32,
}

/// One stripe's lock, alone on its cache line (and the next, which adjacent-line
/// prefetch pairs with it).
#[repr(align(128))]
struct Stripe(RwLock<()>);

/// Most stripes of a RAM disk; the smallest stripe is 1 MiB.
const MAX_STRIPES: u64 = 4096;
const MIN_STRIPE_SHIFT: u32 = 20;

/// A stripe lock one copy holds; the guard is kept for its drop (the unlock).
#[allow(dead_code)]
enum Held<'a> {
    Read(RwLockReadGuard<'a, ()>),
    Write(RwLockWriteGuard<'a, ()>),
}

/// The stripe size (a power of two) of a disk of `size` bytes: 1 MiB, or more where
/// that would make more than [`MAX_STRIPES`].
fn stripe_shift(size: u64) -> u32 {
    let mut shift = MIN_STRIPE_SHIFT;
    while size.div_ceil(1 << shift) > MAX_STRIPES {
        shift += 1;
    }
    shift
}

impl Store {
    fn new(mem: MemBuf) -> Store {
        let size = mem.len() as u64;
        let shift = stripe_shift(size);
        let n = size.div_ceil(1 << shift).max(1) as usize;
        Store {
            mem,
            stripes: (0..n).map(|_| Stripe(RwLock::new(()))).collect(),
            shift,
        }
    }

    /// Locks the stripes of `[offset, offset + len)` in ascending order (so two copies
    /// never wait on each other crosswise). A poisoned lock only means another instance
    /// panicked mid-copy; the bytes are still memory, so carry on.
    /// The guards of the stripes: the first two in place (no allocation for any IO up to
    /// a stripe long), the others, of larger IO, in a vector.
    fn hold(
        &self,
        offset: usize,
        len: usize,
        write: bool,
    ) -> ([Option<Held<'_>>; 2], Vec<Held<'_>>) {
        let first = offset >> self.shift;
        let last = (offset + len.max(1) - 1) >> self.shift;
        let take = |i: usize| {
            let l = &self.stripes[i].0;
            if write {
                Held::Write(l.write().unwrap_or_else(|e| e.into_inner()))
            } else {
                Held::Read(l.read().unwrap_or_else(|e| e.into_inner()))
            }
        };
        let two = [Some(take(first)), (last > first).then(|| take(first + 1))];
        let more = (first + 2..=last).map(take).collect();
        (two, more)
    }
}

/// A zero-filled RAM disk.
pub struct RamBackend {
    store: Arc<Store>,
    geometry: Geometry,
    depth: usize,
    done: VecDeque<BlockCompletion>,
}

impl RamBackend {
    /// `size` bytes of zeros in `block_size`-byte blocks, writable, with the default
    /// queue depth. Memory is reserved up front but pages are touched lazily.
    ///
    /// # Errors
    /// A block size that is not a power of two in 512..=32768, or a size that is not a
    /// positive multiple of it (or does not fit in memory's address space).
    pub fn new(size: u64, block_size: u32) -> Result<RamBackend, OpenError> {
        check_block_size(block_size)?;
        let bad = OpenError::BadSize { size, block_size };
        if size == 0 || size % u64::from(block_size) != 0 || size > isize::MAX as u64 {
            return Err(bad);
        }
        let mem = MemBuf::zeroed(usize::try_from(size).map_err(|_| bad)?);
        let store = Arc::new(Store::new(mem));
        let granularity = block_size.max(4096);
        Ok(RamBackend {
            store,
            geometry: Geometry {
                size,
                logical_block_size: block_size,
                physical_block_size: block_size,
                max_transfer: DEFAULT_MAX_TRANSFER,
                max_discard: DEFAULT_MAX_DISCARD,
                discard_granularity: granularity,
                discard_alignment: 0,
                max_write_zeroes: DEFAULT_MAX_DISCARD,
                max_secure_erase: 0,
                max_segments: u16::MAX,
                write_cache: false,
                fua: false,
                read_only: false,
            },
            depth: DEFAULT_QUEUE_DEPTH,
            done: VecDeque::with_capacity(DEFAULT_QUEUE_DEPTH),
        })
    }

    /// Another instance over the same memory, with the same geometry and queue depth
    /// and an empty queue of its own: how each reactor core gets its RAM disk.
    pub fn share(&self) -> RamBackend {
        RamBackend {
            store: Arc::clone(&self.store),
            geometry: self.geometry,
            depth: self.depth,
            done: VecDeque::with_capacity(self.depth),
        }
    }

    /// How many instances use this memory (this one included).
    pub fn instances(&self) -> usize {
        Arc::strong_count(&self.store)
    }

    /// Refuses writes from now on (this instance only).
    pub fn with_read_only(mut self, read_only: bool) -> RamBackend {
        self.geometry.read_only = read_only;
        self
    }

    /// Sets how many IOs may wait for a poll before [`BlockSubmitError::Busy`].
    ///
    /// # Errors
    /// A depth outside 1..=32768.
    pub fn with_queue_depth(mut self, depth: usize) -> Result<RamBackend, OpenError> {
        check_queue_depth(depth)?;
        self.depth = depth;
        self.done = VecDeque::with_capacity(depth);
        Ok(self)
    }
}

impl BlockBackend for RamBackend {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn queue_depth(&self) -> usize {
        self.depth
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn submit(&mut self, io: BlockIo) -> Result<(), BlockSubmitError> {
        self.geometry.validate(&io)?;
        if self.done.len() >= self.depth {
            return Err(BlockSubmitError::Busy { depth: self.depth });
        }
        // Validation bounds the range by the store's size, which fits in usize.
        let (offset, len) = (io.offset as usize, io.len as usize);
        let store = &*self.store;
        match (io.op, io.buf) {
            (BlockOp::Read, Some(buf)) => {
                let _shared = store.hold(offset, len, false);
                sys::ram_read(&store.mem, offset, buf, len);
            }
            (BlockOp::Write, Some(buf)) => {
                let _excl = store.hold(offset, len, true);
                sys::ram_write(&store.mem, offset, buf, len);
            }
            (BlockOp::WriteSame, Some(block)) => {
                let _excl = store.hold(offset, len, true);
                sys::ram_fill(&store.mem, offset, block, len);
            }
            (BlockOp::Discard | BlockOp::WriteZeroes | BlockOp::SecureErase, _) => {
                let _excl = store.hold(offset, len, true);
                sys::ram_zero(&store.mem, offset, len);
            }
            // Flush: nothing volatile. Read/Write/WriteSame without a buffer fail
            // validation.
            _ => {}
        }
        self.done.push_back(BlockCompletion::new(io.tag, Ok(())));
        Ok(())
    }

    fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        let n = out.len().min(self.done.len());
        for (slot, c) in out.iter_mut().zip(self.done.drain(..n)) {
            *slot = c;
        }
        n
    }

    fn describe(&self) -> String {
        format!("ram {} bytes", self.geometry.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rnbd::backend::IoBuf;

    #[test]
    fn shared_instances_see_one_memory() {
        let mut a = RamBackend::new(8192, 512).unwrap();
        let mut b = a.share();
        assert_eq!(a.instances(), 2);
        assert_eq!(b.geometry(), a.geometry());
        let src = MemBuf::zeroed(512);
        // SAFETY: `src` outlives the IO and nothing else touches it.
        let sbuf = unsafe { IoBuf::from_mem(&src) };
        // SAFETY: as above.
        unsafe { sbuf.copy_in(0, &[0xab; 512]) };
        a.submit(BlockIo::write(1, 4096, sbuf)).unwrap();
        let dst = MemBuf::zeroed(512);
        // SAFETY: `dst` outlives the IO and nothing else touches it.
        let dbuf = unsafe { IoBuf::from_mem(&dst) };
        b.submit(BlockIo::read(2, 4096, dbuf)).unwrap();
        let mut out = [BlockCompletion::default(); 4];
        // Each instance reports only its own IO.
        assert_eq!(a.poll(&mut out), 1);
        assert_eq!(out[0].tag, 1);
        assert_eq!(b.poll(&mut out), 1);
        assert_eq!(out[0], BlockCompletion::new(2, Ok(())));
        let mut got = [0u8; 512];
        // SAFETY: the read completed; nobody else uses `dst`.
        unsafe { dbuf.copy_out(0, &mut got) };
        assert_eq!(got, [0xab; 512]);
        drop(a);
        assert_eq!(b.instances(), 1);
    }

    #[test]
    fn stripes_cover_the_disk_and_an_io_across_two_holds_both() {
        let small = Store::new(MemBuf::zeroed(3 << 20));
        assert_eq!((small.stripes.len(), small.shift), (3, 20));
        // A disk too large for 1 MiB stripes gets larger ones, never more than the cap
        // (sizes checked on the arithmetic alone: no such memory is mapped here).
        assert_eq!(stripe_shift(4 << 30), 20);
        assert_eq!(stripe_shift((4 << 30) + 1), 21);
        assert_eq!(stripe_shift(64 << 30), 24);
        let (two, more) = small.hold((1 << 20) - 512, 1024, true);
        assert!(
            matches!(two, [Some(Held::Write(_)), Some(Held::Write(_))]),
            "an IO across a stripe boundary holds both stripes"
        );
        assert!(more.is_empty());
        // Both stripes are held: neither can be taken meanwhile.
        assert!(small.stripes[0].0.try_read().is_err());
        assert!(small.stripes[1].0.try_read().is_err());
        assert!(small.stripes[2].0.try_write().is_ok());
        drop((two, more));
        assert!(small.stripes[0].0.try_write().is_ok());
        let (two, more) = small.hold(512, (2 << 20) + 1024, false);
        assert!(matches!(two, [Some(Held::Read(_)), Some(Held::Read(_))]));
        assert_eq!(more.len(), 1, "three stripes");
        assert!(small.stripes[2].0.try_write().is_err());
        drop((two, more));

        // The copy across the boundary lands whole.
        let mut d = RamBackend::new(3 << 20, 512).unwrap();
        let src = MemBuf::zeroed(8192);
        // SAFETY: `src` outlives the IO and nothing else touches it.
        let sbuf = unsafe { IoBuf::from_mem(&src) };
        let pattern: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        // SAFETY: as above.
        unsafe { sbuf.copy_in(0, &pattern) };
        d.submit(BlockIo::write(1, (1 << 20) - 4096, sbuf)).unwrap();
        let dst = MemBuf::zeroed(8192);
        // SAFETY: `dst` outlives the IO and nothing else touches it.
        let dbuf = unsafe { IoBuf::from_mem(&dst) };
        d.submit(BlockIo::read(2, (1 << 20) - 4096, dbuf)).unwrap();
        let mut out = [BlockCompletion::default(); 4];
        assert_eq!(d.poll(&mut out), 2);
        let mut got = vec![0u8; 8192];
        // SAFETY: the read completed; nobody else uses `dst`.
        unsafe { dbuf.copy_out(0, &mut got) };
        assert_eq!(got, pattern);
    }
}
