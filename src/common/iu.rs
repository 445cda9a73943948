//! [`IuPool`]: registered message buffers ("information units"), the kernel's
//! `rtrs_iu_alloc`/`rtrs_iu_free` done as one registration cut into equal slots.
//!
//! Used for what RTRS sends or receives through two-sided operations: the INFO_REQ
//! receive and INFO_RSP send buffers, RKEY_RSP send buffers (one per chunk on the
//! server) and receive buffers (one per receive on the client), the client's per-permit
//! header buffers. The memory is shared with the fabric, so it is only reached by
//! copying or through `unsafe` borrows whose callers own the slot at that moment.

use crate::fabric::SetupCause;
use crate::fabric::{Access, Fabric, FabricError, MemBuf, Mr, RecvWr, Sge};

/// `count` slots of `size` bytes in one registration.
pub struct IuPool {
    mr: Mr,
    size: usize,
    count: usize,
}

impl std::fmt::Debug for IuPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IuPool({} x {} bytes)", self.count, self.size)
    }
}

impl IuPool {
    /// Registers `count` slots of `size` bytes each (both at least 1) with `access`
    /// (receive buffers need [`Access::LOCAL_WRITE`]).
    ///
    /// # Errors
    /// [`FabricError::Register`] from the fabric, or for a size that overflows.
    pub fn new(
        fabric: &dyn Fabric,
        count: usize,
        size: usize,
        access: Access,
    ) -> Result<IuPool, FabricError> {
        let count = count.max(1);
        let size = size.max(1);
        let len = count
            .checked_mul(size)
            .filter(|&l| l <= isize::MAX as usize)
            .ok_or(FabricError::Register {
                len: usize::MAX,
                cause: SetupCause::refused(format!(
                    "{count} message buffers of {size} bytes overflow"
                )),
            })?;
        let mr = fabric.register(MemBuf::try_zeroed(len)?, access)?;
        Ok(IuPool { mr, size, count })
    }

    /// Number of slots.
    #[inline]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Bytes per slot.
    #[inline]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The registration.
    #[inline]
    pub fn mr(&self) -> &Mr {
        &self.mr
    }

    /// Address of slot `i`.
    ///
    /// # Panics
    /// If `i >= count`.
    #[inline]
    pub fn addr(&self, i: usize) -> u64 {
        assert!(i < self.count, "message buffer {i} of {}", self.count);
        self.mr.addr() + (i * self.size) as u64
    }

    /// An SGE over the first `len` bytes of slot `i`.
    ///
    /// # Panics
    /// If `i >= count` or `len > size`.
    #[inline(always)]
    pub fn sge(&self, i: usize, len: usize) -> Sge {
        assert!(
            i < self.count && len <= self.size,
            "message buffer {i}/{len}"
        );
        self.mr.sge(i * self.size, len)
    }

    /// A receive into the whole of slot `i`.
    ///
    /// # Panics
    /// If `i >= count`.
    #[inline]
    pub fn recv_wr(&self, i: usize, wr_id: u64) -> RecvWr {
        RecvWr {
            wr_id,
            sge: Some(self.sge(i, self.size)),
        }
    }

    /// Copies `data` to the start of slot `i`.
    ///
    /// # Panics
    /// If `i >= count` or `data` is longer than a slot.
    #[inline]
    pub fn write(&self, i: usize, data: &[u8]) {
        assert!(
            i < self.count && data.len() <= self.size,
            "message buffer {i}"
        );
        self.mr.write_at(i * self.size, data);
    }

    /// Copies the first `out.len()` bytes of slot `i` out.
    ///
    /// # Panics
    /// If `i >= count` or `out` is longer than a slot.
    #[inline]
    pub fn read(&self, i: usize, out: &mut [u8]) {
        assert!(
            i < self.count && out.len() <= self.size,
            "message buffer {i}"
        );
        self.mr.read_at(i * self.size, out);
    }

    /// Borrows the first `len` bytes of slot `i`.
    ///
    /// # Safety
    /// Nothing may write the slot while the slice lives: no receive posted into it and
    /// no local write.
    ///
    /// # Panics
    /// If `i >= count` or `len > size`.
    pub unsafe fn slice(&self, i: usize, len: usize) -> &[u8] {
        assert!(
            i < self.count && len <= self.size,
            "message buffer {i}/{len}"
        );
        // SAFETY: exclusivity is the caller's contract; bounds are checked above and by Mr.
        unsafe { self.mr.slice(i * self.size, len) }
    }

    /// Borrows the first `len` bytes of slot `i` mutably, to build a message in place.
    ///
    /// # Safety
    /// Nothing else may read or write the slot while the slice lives (no send or
    /// receive using it is outstanding).
    ///
    /// # Panics
    /// If `i >= count` or `len > size`.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, i: usize, len: usize) -> &mut [u8] {
        assert!(
            i < self.count && len <= self.size,
            "message buffer {i}/{len}"
        );
        // SAFETY: exclusivity is the caller's contract; bounds are checked above and by Mr.
        unsafe { self.mr.slice_mut(i * self.size, len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::loopback::LoopbackFabric;

    #[test]
    fn slots_are_disjoint_and_copy() {
        let f = LoopbackFabric::new();
        let p = IuPool::new(&f, 4, 8, Access::LOCAL_WRITE).unwrap();
        assert_eq!((p.count(), p.size()), (4, 8));
        p.write(1, &[1, 2, 3]);
        p.write(2, &[9; 8]);
        let mut out = [0u8; 8];
        p.read(1, &mut out);
        assert_eq!(out, [1, 2, 3, 0, 0, 0, 0, 0]);
        assert_eq!(p.addr(2) - p.addr(1), 8);
        let s = p.sge(3, 8);
        assert_eq!((s.addr, s.len, s.lkey), (p.addr(3), 8, p.mr().lkey()));
        assert_eq!(p.recv_wr(0, 7).sge.unwrap().len, 8);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.write(4, &[0])));
        assert!(r.is_err());
    }
}
