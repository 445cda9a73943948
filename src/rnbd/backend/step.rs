//! One syscall's worth of a block IO ([`Step`]), as the plan (`plan.rs`) makes it and
//! the syscall layer (`sys.rs`) carries it out: a leaf both build on, so neither imports
//! the other's back.

/// One syscall's worth of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Read {
        offset: u64,
        ptr: *mut u8,
        len: u32,
    },
    Write {
        offset: u64,
        ptr: *mut u8,
        len: u32,
        dsync: bool,
    },
    /// Part of a write-same: `len` bytes at `offset`, the pattern of `block` bytes at
    /// `ptr` repeated, starting `skew` bytes into it (after a short write). One
    /// `pwritev` whose iovecs all point into the pattern ([`same_iovecs`]).
    WriteSame {
        offset: u64,
        ptr: *mut u8,
        block: u32,
        skew: u32,
        len: u32,
        dsync: bool,
    },
    /// `fdatasync`: the file never grows, so data sync is enough.
    Sync,
    Fallocate {
        offset: u64,
        len: u64,
        mode: i32,
    },
    /// `ioctl(BLKDISCARD)`: block devices only, and only on a thread (no io_uring opcode).
    BlkDiscard {
        offset: u64,
        len: u64,
    },
}

/// Most iovecs of one write-same syscall (the pattern repeated; 4 KiB of iovecs).
pub(crate) const SAME_IOVS: usize = 256;

/// The iovecs of a [`Step::WriteSame`] in `iovs` (at most [`SAME_IOVS`] are used);
/// returns how many. Only addresses are computed: nothing is dereferenced.
pub(crate) fn same_iovecs(step: &Step, iovs: &mut [libc::iovec]) -> usize {
    let Step::WriteSame {
        ptr,
        block,
        skew,
        len,
        ..
    } = *step
    else {
        return 0;
    };
    let (block, mut left) = (block as usize, len as usize);
    let mut at = skew as usize % block.max(1);
    let mut n = 0;
    while left > 0 && n < iovs.len().min(SAME_IOVS) {
        let piece = (block - at).min(left);
        iovs[n] = libc::iovec {
            iov_base: ptr.wrapping_add(at).cast(),
            iov_len: piece,
        };
        left -= piece;
        at = 0;
        n += 1;
    }
    n
}
