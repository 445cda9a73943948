//! A block device in memory (the role `brd`, the kernel's RAM disk, plays behind an
//! `rnbd-srv` export). IO is reported on the next poll, so callers see the same
//! asynchronous shape as with a real device. Writes, zeroes and fills are done at
//! submission; a read asks the memory system for its first bytes at submission and copies
//! at the poll, so that the reads a server's poll submits fetch their memory while it
//! handles the rest of its batch instead of one after the other (`docs/BENCHMARKS.md`,
//! "A RAM disk's reads fetched ahead").
//!
//! One RAM disk can be driven from several reactors: [`RamBackend::share`] makes another
//! instance (own queue, for another core) over the same memory. Instances take no lock:
//! every copy into or out of the memory is a byte-wise relaxed atomic copy (`sys::ram_*`:
//! the string instructions on x86_64, at memory speed), so cores share no lock word per
//! IO (docs/ARCHITECTURE.md, "Who writes what per IO") and never race on the bytes.
//! Overlapping IO in flight together behaves as on the kernel's `brd` or SPDK's malloc
//! bdev: a read may see parts of either write, two writes may interleave, byte by byte.

use std::collections::VecDeque;
use std::sync::Arc;

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

/// The memory of a RAM disk, shared by its per-core instances: touched only through
/// `sys::ram_*`, whose copies are byte-wise relaxed atomic ones, so the instances take
/// no lock (docs/ARCHITECTURE.md, "Who writes what per IO").
struct Store {
    mem: MemBuf,
}

/// A zero-filled RAM disk.
pub struct RamBackend {
    store: Arc<Store>,
    geometry: Geometry,
    depth: usize,
    /// Accepted IO in order, each reported by a poll.
    done: VecDeque<Accepted>,
}

/// An IO [`RamBackend::submit`] accepted.
#[derive(Clone, Copy)]
enum Accepted {
    /// Done at submission.
    Done(BlockCompletion),
    /// A read (validated) whose copy waits for the poll.
    Read {
        tag: u64,
        offset: usize,
        buf: sys::IoBuf,
        len: usize,
    },
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
        let len = usize::try_from(size).map_err(|_| bad)?;
        // Random 4 KiB accesses all over the disk: on huge pages where the kernel has them.
        let mem = MemBuf::try_zeroed_huge(len).map_err(|e| OpenError::NoMemory { len: e.len })?;
        let store = Arc::new(Store { mem });
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
                sys::ram_prefetch(&store.mem, offset, len);
                self.done.push_back(Accepted::Read {
                    tag: io.tag,
                    offset,
                    buf,
                    len,
                });
                return Ok(());
            }
            (BlockOp::Write, Some(buf)) => {
                sys::ram_write(&store.mem, offset, buf, len);
            }
            (BlockOp::WriteSame, Some(block)) => {
                sys::ram_fill(&store.mem, offset, block, len);
            }
            (BlockOp::Discard | BlockOp::WriteZeroes | BlockOp::SecureErase, _) => {
                sys::ram_zero(&store.mem, offset, len);
            }
            // Flush: nothing volatile. Read/Write/WriteSame without a buffer fail
            // validation.
            _ => {}
        }
        self.done
            .push_back(Accepted::Done(BlockCompletion::new(io.tag, Ok(()))));
        Ok(())
    }

    fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        let n = out.len().min(self.done.len());
        let store = &*self.store;
        for (slot, a) in out.iter_mut().zip(self.done.drain(..n)) {
            *slot = match a {
                Accepted::Done(c) => c,
                Accepted::Read {
                    tag,
                    offset,
                    buf,
                    len,
                } => {
                    // The buffer is the IO's until this completion (the contract of
                    // `BlockBackend`), and the range was validated at submission.
                    sys::ram_read(&store.mem, offset, buf, len);
                    BlockCompletion::new(tag, Ok(()))
                }
            };
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
    fn the_disk_is_on_huge_pages_where_the_kernel_has_them() {
        let disk = RamBackend::new(8 << 20, 4096).unwrap();
        let asks = crate::fabric::mem::asks_huge_pages(disk.store.mem.as_ptr() as usize);
        assert_ne!(asks, Some(false), "the RAM disk did not ask for huge pages");
    }

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

    /// Reads waiting for their copy (fetched ahead at submission) complete in order, each
    /// into its own buffer from its own offset, also when polls take fewer than wait and
    /// a write and a flush sit between them.
    #[test]
    fn reads_copied_at_the_poll_keep_their_tags_and_buffers() {
        let mut d = RamBackend::new(64 << 10, 512).unwrap();
        let src = MemBuf::zeroed(64 << 10);
        // SAFETY: `src` outlives the IO and nothing else touches it.
        let sbuf = unsafe { IoBuf::from_mem(&src) };
        let pattern: Vec<u8> = (0..64 << 10)
            .map(|i: usize| (i / 512) as u8 ^ 0x5a)
            .collect();
        // SAFETY: as above.
        unsafe { sbuf.copy_in(0, &pattern) };
        d.submit(BlockIo::write(100, 0, sbuf)).unwrap();
        let mut out = [BlockCompletion::default(); 8];
        assert_eq!(d.poll(&mut out), 1);
        let dsts: Vec<MemBuf> = (0..5).map(|_| MemBuf::zeroed(4096)).collect();
        // SAFETY: each `dsts[i]` outlives its IO and nothing else touches it.
        let bufs: Vec<IoBuf> = dsts.iter().map(|m| unsafe { IoBuf::from_mem(m) }).collect();
        let offsets = [8192u64, 0, 61440, 4096, 32768];
        for (i, (&off, &buf)) in offsets.iter().zip(&bufs).enumerate().take(3) {
            d.submit(BlockIo::read(i as u64, off, buf)).unwrap();
        }
        d.submit(BlockIo::flush(50)).unwrap();
        for (i, (&off, &buf)) in offsets.iter().zip(&bufs).enumerate().skip(3) {
            d.submit(BlockIo::read(i as u64, off, buf)).unwrap();
        }
        assert_eq!(d.in_flight(), 6);
        let mut tags = Vec::new();
        for _ in 0..3 {
            let n = d.poll(&mut out[..2]);
            tags.extend(out[..n].iter().map(|c| (c.tag, c.result)));
        }
        let ok = |t| (t, Ok(()));
        assert_eq!(tags, [ok(0), ok(1), ok(2), ok(50), ok(3), ok(4)]);
        assert_eq!(d.in_flight(), 0);
        for (i, (&off, buf)) in offsets.iter().zip(&bufs).enumerate() {
            let mut got = [0u8; 4096];
            // SAFETY: the read completed; nobody else uses its buffer.
            unsafe { buf.copy_out(0, &mut got) };
            let want = &pattern[off as usize..off as usize + 4096];
            assert_eq!(&got[..], want, "read {i} at {off}");
        }
    }

    /// Instances on several threads write the same blocks at once, each a pattern of its
    /// own, while another reads them: no lock is taken, and every byte read is the byte
    /// one of the patterns (or the zeroes before them) has there, never another value.
    #[test]
    fn instances_on_several_threads_read_only_written_bytes() {
        const LEN: usize = 64 << 10;
        let disk = RamBackend::new(LEN as u64, 512).unwrap();
        // Writer k's byte at i: k in the top two bits, the position below.
        let byte = |k: u8, i: usize| (k << 6) | (i % 64) as u8;
        let writers: Vec<_> = (1..=2u8)
            .map(|k| {
                let mut d = disk.share();
                std::thread::spawn(move || {
                    let src = MemBuf::zeroed(LEN);
                    // SAFETY: `src` outlives every IO and nothing else touches it.
                    let buf = unsafe { IoBuf::from_mem(&src) };
                    let bytes: Vec<u8> = (0..LEN).map(|i| byte(k, i)).collect();
                    // SAFETY: as above.
                    unsafe { buf.copy_in(0, &bytes) };
                    let mut out = [BlockCompletion::default(); 1];
                    for n in 0..200 {
                        d.submit(BlockIo::write(n, 0, buf)).unwrap();
                        assert_eq!(d.poll(&mut out), 1);
                    }
                })
            })
            .collect();
        let mut r = disk.share();
        let dst = MemBuf::zeroed(LEN);
        // SAFETY: `dst` outlives every IO and nothing else touches it.
        let dbuf = unsafe { IoBuf::from_mem(&dst) };
        let mut got = vec![0u8; LEN];
        let mut out = [BlockCompletion::default(); 1];
        let mut seen = [0usize; 3];
        for n in 0..200 {
            r.submit(BlockIo::read(n, 0, dbuf)).unwrap();
            assert_eq!(r.poll(&mut out), 1);
            // SAFETY: the read completed; nobody else uses `dst`.
            unsafe { dbuf.copy_out(0, &mut got) };
            for (i, &v) in got.iter().enumerate() {
                let k = (0..3u8)
                    .find(|&k| v == if k == 0 { 0 } else { byte(k, i) })
                    .unwrap_or_else(|| panic!("read {n}, byte {i}: {v:#x} is no writer's"));
                seen[usize::from(k)] += 1;
            }
        }
        for w in writers {
            w.join().unwrap();
        }
        assert!(
            seen[1] + seen[2] > 0,
            "the writers' bytes were read: {seen:?}"
        );
    }

    /// Reads, writes, write-same and zeroes land where they are aimed, at offsets and
    /// lengths of every alignment the disk accepts, and nowhere else.
    #[test]
    fn copies_land_exactly() {
        let mut d = RamBackend::new(64 << 10, 512).unwrap();
        let mut out = [BlockCompletion::default(); 1];
        let mut run = |d: &mut RamBackend, io: BlockIo| {
            d.submit(io).unwrap();
            assert_eq!(d.poll(&mut out), 1);
            assert_eq!(out[0].result, Ok(()));
        };
        let src = MemBuf::zeroed(8192);
        // SAFETY: `src` outlives every IO and nothing else touches it.
        let sbuf = unsafe { IoBuf::from_mem(&src) };
        let pattern: Vec<u8> = (0..8192).map(|i| (i * 7 + 3) as u8).collect();
        // SAFETY: as above.
        unsafe { sbuf.copy_in(0, &pattern) };
        // SAFETY: `src` outlives the IO; 1536 bytes of it.
        let part = unsafe { IoBuf::new(sbuf.as_ptr(), 1536) };
        run(&mut d, BlockIo::write(1, 512, part));
        let blk = MemBuf::zeroed(512);
        // SAFETY: `blk` outlives the IO and nothing else touches it.
        let bbuf = unsafe { IoBuf::from_mem(&blk) };
        // SAFETY: as above.
        unsafe { bbuf.copy_in(0, &[0x5a; 512]) };
        run(&mut d, BlockIo::write_same(2, 8192, 2048, bbuf));
        run(&mut d, BlockIo::write(3, 16384, sbuf));
        run(&mut d, BlockIo::write_zeroes(4, 17408, 1024));
        let dst = MemBuf::zeroed(32768);
        // SAFETY: `dst` outlives the IO and nothing else touches it.
        let dbuf = unsafe { IoBuf::from_mem(&dst) };
        run(&mut d, BlockIo::read(5, 0, dbuf));
        let mut got = vec![0u8; 32768];
        // SAFETY: the read completed; nobody else uses `dst`.
        unsafe { dbuf.copy_out(0, &mut got) };
        let mut want = vec![0u8; 32768];
        want[512..2048].copy_from_slice(&pattern[..1536]);
        want[8192..10240].fill(0x5a);
        want[16384..24576].copy_from_slice(&pattern);
        want[17408..18432].fill(0);
        assert!(
            got == want,
            "the disk's first 32 KiB differ from what was written"
        );
    }
}
