//! Session chunk pools from SPDK DMA memory (the server's [`ChunkAlloc`] hook inside
//! SPDK). The kernel's `rtrs-srv` maps its chunks for the device with `ib_dma_map_sg`;
//! here the chunks must also be what SPDK bdevs accept as IO buffers: NVMe over PCIe
//! (and other bdevs doing DMA) need memory that `spdk_vtophys` translates, which heap
//! memory is not. So the pool comes from `spdk_zmalloc(.., SPDK_MALLOC_DMA)`, 4 KiB
//! aligned, is checked page by page with `spdk_vtophys`, registered with the fabric
//! through [`Fabric::register_raw`], and freed with `spdk_free` once the registration
//! is gone.

use std::ffi::c_void;
use std::ptr::NonNull;

use crate::fabric::{Access, Fabric};
use crate::server::{ChunkAlloc, ChunkError, ChunkPool};

use super::sys;

/// Alignment of the pool (a page, as the server's chunks are page multiples).
const ALIGN: usize = 4096;
/// `SPDK_VTOPHYS_ERROR`.
const VTOPHYS_ERROR: u64 = u64::MAX;
/// `SPDK_ENV_NUMA_ID_ANY`.
const NUMA_ANY: i32 = sys::SPDK_ENV_NUMA_ID_ANY;

/// The name of this memory in statistics.
pub const KIND: &str = "spdk_dma";

/// Chunk pools from SPDK's DMA-able memory.
#[derive(Debug, Default)]
pub struct SpdkDmaChunks;

/// An `spdk_zmalloc` buffer, freed on drop.
struct DmaBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: SPDK's allocator is thread-safe (spdk_free may run on any thread); the buffer
// is plain memory owned by this value.
unsafe impl Send for DmaBuf {}
// SAFETY: the value only holds the pointer; accesses go through the registration.
unsafe impl Sync for DmaBuf {}

impl DmaBuf {
    fn zeroed(len: usize) -> Result<DmaBuf, ChunkError> {
        // SAFETY: plain allocation call; a null result is handled below.
        let raw = unsafe {
            sys::spdk_zmalloc(
                len,
                ALIGN,
                std::ptr::null_mut(),
                NUMA_ANY,
                sys::SPDK_MALLOC_DMA,
            )
        };
        NonNull::new(raw.cast::<u8>())
            .map(|ptr| DmaBuf { ptr, len })
            .ok_or_else(|| ChunkError::NoMemory {
                what: format!(
                    "spdk_zmalloc({len} bytes, SPDK_MALLOC_DMA) failed: SPDK's memory is \
                     exhausted (start the application with more memory, -s/--mem-size, or \
                     lower rtrs_target_set_options queue_depth/chunk_size)"
                ),
            })
    }

    /// Checks that `spdk_vtophys` translates every byte of the buffer.
    fn check_translated(&self) -> Result<(), ChunkError> {
        let mut off = 0usize;
        while off < self.len {
            let mut size = (self.len - off) as u64;
            // SAFETY: the address lies in our live allocation; vtophys only reads SPDK's
            // page tables.
            let pa = unsafe {
                sys::spdk_vtophys(self.ptr.as_ptr().add(off).cast::<c_void>(), &mut size)
            };
            if pa == VTOPHYS_ERROR || size == 0 {
                return Err(ChunkError::Unusable {
                    what: format!(
                        "spdk_vtophys cannot translate byte {off} of the {}-byte pool at {:p}: \
                         the memory is not DMA-able, so bdevs doing DMA could not use it",
                        self.len, self.ptr
                    ),
                });
            }
            off = off.saturating_add(size as usize);
        }
        Ok(())
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by spdk_zmalloc, freed once; the registration over it was
        // dropped before (ChunkPool's field order).
        unsafe { sys::spdk_free(self.ptr.as_ptr().cast::<c_void>()) }
    }
}

impl ChunkAlloc for SpdkDmaChunks {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn alloc(
        &self,
        fabric: &dyn Fabric,
        len: usize,
        access: Access,
    ) -> Result<ChunkPool, ChunkError> {
        if len == 0 {
            return Err(ChunkError::Empty);
        }
        let buf = DmaBuf::zeroed(len)?;
        buf.check_translated()?;
        // SAFETY: the buffer is valid for reads and writes and stays allocated until the
        // ChunkPool drops `buf`, which it does after dropping the registration; the
        // server drops the pool only with its session, after every path (and so every
        // operation on the pool) is gone. Nothing holds a Rust reference to it.
        let mr = unsafe { fabric.register_raw(buf.ptr.as_ptr(), len, access) }?;
        Ok(ChunkPool::foreign(mr, Box::new(buf), KIND))
    }
}
