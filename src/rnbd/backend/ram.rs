//! A block device in memory (the role `brd`, the kernel's RAM disk, plays behind an
//! `rnbd-srv` export). IO is done at submission and reported on the next poll, so callers
//! see the same asynchronous shape as with a real device.

use std::collections::VecDeque;

use super::error::{OpenError, SubmitError};
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

/// A zero-filled RAM disk.
pub struct RamBackend {
    store: MemBuf,
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
        let store = MemBuf::zeroed(usize::try_from(size).map_err(|_| bad)?);
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

    /// Refuses writes from now on.
    pub fn with_read_only(mut self, read_only: bool) -> RamBackend {
        self.geometry.read_only = read_only;
        self
    }

    /// Sets how many IOs may wait for a poll before [`SubmitError::Busy`].
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

    fn submit(&mut self, io: BlockIo) -> Result<(), SubmitError> {
        self.geometry.validate(&io)?;
        if self.done.len() >= self.depth {
            return Err(SubmitError::Busy { depth: self.depth });
        }
        // Validation bounds the range by the store's size, which fits in usize.
        let (offset, len) = (io.offset as usize, io.len as usize);
        match (io.op, io.buf) {
            (BlockOp::Read, Some(buf)) => sys::ram_read(&self.store, offset, buf, len),
            (BlockOp::Write, Some(buf)) => sys::ram_write(&self.store, offset, buf, len),
            (BlockOp::Discard | BlockOp::WriteZeroes | BlockOp::SecureErase, _) => {
                sys::ram_zero(&self.store, offset, len)
            }
            // Flush: nothing volatile. Read/Write without a buffer fail validation.
            _ => {}
        }
        self.done.push_back(BlockCompletion::new(io.tag, 0));
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
