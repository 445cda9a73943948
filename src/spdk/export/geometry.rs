//! An SPDK bdev's geometry as OPEN_RSP carries it (docs/PROTOCOL.md §2.10), derived as
//! the kernel's server derives it from its block device: see the [`export`](super)
//! module doc.

use super::sys;
use crate::rnbd::backend::{Geometry, DEFAULT_MAX_DISCARD, DEFAULT_MAX_TRANSFER};

/// The geometry of `bdev` (an open descriptor's), read-only if `read_only`.
///
/// # Errors
/// A block size RNBD cannot carry.
pub(super) fn geometry_of(bdev: *mut sys::spdk_bdev, read_only: bool) -> Result<Geometry, String> {
    // SAFETY: `bdev` belongs to an open descriptor, so it stays registered; the getters
    // read fields the bdev module set at registration.
    let (pbs, unmap_gran, unmap_align, max_rw, boundary, splits) = unsafe {
        (
            sys::spdk_bdev_get_physical_block_size(bdev),
            sys::spdk_bdev_get_preferred_unmap_granularity(bdev),
            sys::spdk_bdev_get_preferred_unmap_alignment(bdev),
            (*bdev).max_rw_size,
            sys::spdk_bdev_get_optimal_io_boundary(bdev),
            (*bdev).split_on_optimal_io_boundary,
        )
    };
    // SAFETY: as above.
    let (bs, blocks, wc, unmap, wz) = unsafe {
        (
            sys::spdk_bdev_get_block_size(bdev),
            sys::spdk_bdev_get_num_blocks(bdev),
            sys::spdk_bdev_has_write_cache(bdev),
            sys::spdk_bdev_io_type_supported(bdev, sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_UNMAP),
            sys::spdk_bdev_io_type_supported(
                bdev,
                sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE_ZEROES,
            ) || sys::spdk_bdev_io_type_supported(
                bdev,
                sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE,
            ),
        )
    };
    if !bs.is_power_of_two() || !(512..=32768).contains(&bs) {
        return Err(format!(
            "block size {bs} is not a power of two between 512 and 32768 (RNBD sends it in 16 bits)"
        ));
    }
    let in_bytes = |blocks: u32| u64::from(blocks).saturating_mul(u64::from(bs));
    // The largest transfer the bdev takes whole: its own limit, and its optimal IO
    // boundary when it splits there (a request within it is never split).
    let mut max_transfer = u64::from(DEFAULT_MAX_TRANSFER);
    if max_rw != 0 {
        max_transfer = max_transfer.min(in_bytes(max_rw));
    }
    if splits && boundary != 0 {
        max_transfer = max_transfer.min(in_bytes(boundary));
    }
    let clamp = |bytes: u64| u32::try_from(bytes).unwrap_or(u32::MAX);
    Ok(Geometry {
        size: blocks.saturating_mul(u64::from(bs)),
        logical_block_size: bs,
        // Checked by the client as at least the logical block and sent in 16 bits.
        physical_block_size: pbs.clamp(bs, 32768),
        max_transfer: clamp(max_transfer.max(u64::from(bs))),
        max_discard: if unmap { DEFAULT_MAX_DISCARD } else { 0 },
        discard_granularity: if unmap_gran != 0 {
            clamp(in_bytes(unmap_gran))
        } else {
            bs
        },
        discard_alignment: clamp(in_bytes(unmap_align)),
        max_write_zeroes: if wz { DEFAULT_MAX_DISCARD } else { 0 },
        max_secure_erase: 0,
        max_segments: u16::MAX,
        write_cache: wc,
        // Honoured on a cache as a write and a flush (see the module doc); without one
        // every completed write is durable.
        fua: wc,
        read_only,
    })
}
