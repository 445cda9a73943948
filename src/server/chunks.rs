//! Where a session's chunk pool comes from: the kernel's `rtrs-srv.c` allocates it with
//! `alloc_pages` and maps it for the device (`ib_dma_map_sg` of `srv->chunks`); here an
//! allocator hook of the server configuration ([`ChunkAllocator`]) gives the memory and
//! registers it with the fabric. The default takes it from the heap; the SPDK target
//! sets one that takes SPDK DMA memory, so the chunks can be handed as-is to bdevs that
//! need `spdk_vtophys`-translatable buffers (NVMe over PCIe).

use std::any::Any;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use crate::fabric::{Access, Fabric, FabricError, MemBuf, Mr};

/// A session's registered chunk pool, with whatever keeps foreign memory alive.
///
/// Dereferences to the registration. Dropping it deregisters first, then releases the
/// memory (field order).
pub struct ChunkPool {
    mr: Mr,
    /// Frees foreign memory on drop (after `mr` is gone); `()` for owned memory.
    _keep: Box<dyn Any + Send + Sync>,
    kind: &'static str,
}

impl ChunkPool {
    /// A pool whose registration owns its memory (from [`Fabric::register`]).
    pub fn owned(mr: Mr, kind: &'static str) -> ChunkPool {
        ChunkPool {
            mr,
            _keep: Box::new(()),
            kind,
        }
    }

    /// A pool over foreign memory: `mr` comes from [`Fabric::register_raw`] over memory
    /// that `keep` releases when dropped, which happens after `mr` is deregistered.
    pub fn foreign(mr: Mr, keep: Box<dyn Any + Send + Sync>, kind: &'static str) -> ChunkPool {
        ChunkPool {
            mr,
            _keep: keep,
            kind,
        }
    }

    /// The allocator's name for this memory (`"heap"`, `"spdk_dma"`), for statistics.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}

impl Deref for ChunkPool {
    type Target = Mr;

    fn deref(&self) -> &Mr {
        &self.mr
    }
}

impl fmt::Debug for ChunkPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChunkPool")
            .field("kind", &self.kind)
            .field("mr", &self.mr)
            .finish()
    }
}

/// Why a chunk pool could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChunkError {
    /// A pool of no bytes was asked for.
    #[error("chunk pool of 0 bytes")]
    Empty,
    /// The memory could not be allocated (`what` names the allocator and the call).
    #[error("{what}")]
    NoMemory { what: String },
    /// The memory is not usable as asked (`what` names the check that failed).
    #[error("{what}")]
    Unusable { what: String },
    /// The fabric refused to allocate or register it.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

impl From<crate::fabric::mem::AllocError> for ChunkError {
    fn from(e: crate::fabric::mem::AllocError) -> ChunkError {
        ChunkError::Fabric(e.into())
    }
}

/// Allocates and registers session chunk pools.
pub trait ChunkAlloc: Send + Sync {
    /// The memory's name in statistics (`"heap"`, `"spdk_dma"`).
    fn kind(&self) -> &'static str;

    /// `len` zeroed bytes, 4 KiB aligned, registered with `fabric` with `access`.
    ///
    /// # Errors
    /// [`ChunkError`]: what failed (allocation, registration, a check of the memory).
    fn alloc(
        &self,
        fabric: &dyn Fabric,
        len: usize,
        access: Access,
    ) -> Result<ChunkPool, ChunkError>;
}

/// The default: page-aligned heap memory ([`MemBuf`]) owned by the registration.
#[derive(Debug, Default)]
pub struct HeapChunks;

impl ChunkAlloc for HeapChunks {
    fn kind(&self) -> &'static str {
        "heap"
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
        let buf = MemBuf::try_zeroed(len)?;
        let mr = fabric.register(buf, access)?;
        Ok(ChunkPool::owned(mr, self.kind()))
    }
}

/// The allocator hook of [`ServerConfig`](crate::server::ServerConfig): shared, compared
/// by identity.
#[derive(Clone)]
pub struct ChunkAllocator(pub Arc<dyn ChunkAlloc>);

impl ChunkAllocator {
    pub fn new(a: Arc<dyn ChunkAlloc>) -> ChunkAllocator {
        ChunkAllocator(a)
    }

    pub fn kind(&self) -> &'static str {
        self.0.kind()
    }

    /// As [`ChunkAlloc::alloc`].
    ///
    /// # Errors
    /// As [`ChunkAlloc::alloc`].
    pub fn alloc(
        &self,
        fabric: &dyn Fabric,
        len: usize,
        access: Access,
    ) -> Result<ChunkPool, ChunkError> {
        self.0.alloc(fabric, len, access)
    }
}

impl Default for ChunkAllocator {
    fn default() -> Self {
        ChunkAllocator(Arc::new(HeapChunks))
    }
}

impl fmt::Debug for ChunkAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChunkAllocator({})", self.kind())
    }
}

impl PartialEq for ChunkAllocator {
    fn eq(&self, other: &Self) -> bool {
        // Same allocator object (the data pointers; vtables may differ per unit).
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl Eq for ChunkAllocator {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::loopback::LoopbackFabric;

    #[test]
    fn heap_pool_is_registered_zeroed_and_aligned() {
        let fabric = LoopbackFabric::new();
        let a = ChunkAllocator::default();
        assert_eq!(a.kind(), "heap");
        let pool = a.alloc(&fabric, 3 * 8192, Access::LOCAL_WRITE).unwrap();
        assert_eq!((pool.kind(), pool.len()), ("heap", 3 * 8192));
        assert_eq!(pool.addr() % 4096, 0);
        let mut b = [1u8; 16];
        pool.read_at(8192, &mut b);
        assert_eq!(b, [0; 16]);
        assert!(a.alloc(&fabric, 0, Access::LOCAL_WRITE).is_err());
    }

    /// Foreign memory whose release is observable.
    struct Guard {
        mem: Box<[u8]>,
        freed: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            self.freed.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn foreign_pool_keeps_its_memory_until_dropped() {
        let fabric = LoopbackFabric::new();
        let freed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut g = Guard {
            mem: vec![0u8; 8192].into_boxed_slice(),
            freed: Arc::clone(&freed),
        };
        let (ptr, len) = (g.mem.as_mut_ptr(), g.mem.len());
        // SAFETY: the boxed slice lives in the guard, which the pool drops only after its
        // registration; nothing else uses it.
        let mr = unsafe { fabric.register_raw(ptr, len, Access::LOCAL_WRITE) }.unwrap();
        let pool = ChunkPool::foreign(mr, Box::new(g), "test");
        pool.write_at(100, b"abc");
        let mut out = [0u8; 3];
        pool.read_at(100, &mut out);
        assert_eq!(
            (&out, pool.kind(), pool.addr()),
            (b"abc", "test", ptr as u64)
        );
        assert!(!freed.load(std::sync::atomic::Ordering::SeqCst));
        drop(pool);
        assert!(freed.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn allocators_compare_by_identity() {
        let a = ChunkAllocator::default();
        assert_eq!(a, a.clone());
        assert_ne!(a, ChunkAllocator::default());
        assert_eq!(format!("{a:?}"), "ChunkAllocator(heap)");
    }
}
