//! `--verify` data: every 512-byte sector a write sends carries a stamp — a magic word,
//! the run's id, the sector's byte offset on the device, the write's generation — and a
//! pattern derived from them; a read checks all of it. A sector written somewhere else,
//! by another run, by an older write or torn inside shows up as a mismatch. A unit last
//! written by a write-zeroes (`--rw zero`) has generation [`ZEROED`] and must read as
//! zeros.

use rtrs_spdk::fabric::Mr;

/// Stamped unit: the RNBD sector.
pub const SECTOR: usize = 512;
const WORDS: usize = SECTOR / 8;
const MAGIC: u64 = 0x5254_5253_4245_4e43; // "RTRSBENC"
/// The generation of a unit whose last write was a write-zeroes.
pub const ZEROED: u32 = u32::MAX;

/// The generation after `gen` for a stamped write (never 0 or [`ZEROED`]).
pub fn next_gen(gen: u32) -> u32 {
    match gen.wrapping_add(1) {
        0 | ZEROED => 1,
        g => g,
    }
}

fn sector(run: u64, dev_off: u64, gen: u32) -> [u8; SECTOR] {
    let mut out = [0u8; SECTOR];
    let head = [MAGIC, run, dev_off, u64::from(gen)];
    let mut x = run ^ dev_off.rotate_left(23) ^ (u64::from(gen) << 40) ^ MAGIC;
    for w in 0..WORDS {
        let v = if w < head.len() {
            head[w]
        } else {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            x ^ (x >> 29)
        };
        out[w * 8..w * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// Stamps `len` bytes of `buf` at `at` for device offset `dev_off`, generation `gen`.
pub fn stamp(buf: &Mr, at: usize, dev_off: u64, len: usize, run: u64, gen: u32) {
    for s in (0..len).step_by(SECTOR) {
        buf.write_at(at + s, &sector(run, dev_off + s as u64, gen));
    }
}

/// Checks `len` bytes of `buf` at `at` against the stamp of (`dev_off`, `gen`), or
/// zeros for [`ZEROED`]; returns the device offset of the first sector that differs.
pub fn check(buf: &Mr, at: usize, dev_off: u64, len: usize, run: u64, gen: u32) -> Option<u64> {
    let mut got = [0u8; SECTOR];
    for s in (0..len).step_by(SECTOR) {
        let off = dev_off + s as u64;
        buf.read_at(at + s, &mut got);
        let want = if gen == ZEROED {
            [0u8; SECTOR]
        } else {
            sector(run, off, gen)
        };
        if got != want {
            return Some(off);
        }
    }
    None
}

/// [`check`] of a range discarded since generation `gen` was written: each sector holds
/// that stamp or zeros (a discard may or may not clear what it covers); the device offset
/// of the first sector that is neither.
pub fn check_discarded(
    buf: &Mr,
    at: usize,
    dev_off: u64,
    len: usize,
    run: u64,
    gen: u32,
) -> Option<u64> {
    (0..len).step_by(SECTOR).find_map(|s| {
        let (at, off) = (at + s, dev_off + s as u64);
        check(buf, at, off, SECTOR, run, gen).and(check(buf, at, off, SECTOR, run, ZEROED))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtrs_spdk::fabric::loopback::LoopbackFabric;
    use rtrs_spdk::fabric::{Access, Fabric, MemBuf};

    #[test]
    fn stamps_check_and_catch_every_kind_of_wrong_data() {
        let f = LoopbackFabric::new();
        let buf = f
            .register(MemBuf::zeroed(8192), Access::LOCAL_WRITE)
            .unwrap();
        stamp(&buf, 0, 1 << 20, 4096, 7, 3);
        assert_eq!(check(&buf, 0, 1 << 20, 4096, 7, 3), None);
        // Another generation, another run, another place: all mismatch at the start.
        assert_eq!(check(&buf, 0, 1 << 20, 4096, 7, 2), Some(1 << 20));
        assert_eq!(check(&buf, 0, 1 << 20, 4096, 8, 3), Some(1 << 20));
        assert_eq!(check(&buf, 0, 2 << 20, 4096, 7, 3), Some(2 << 20));
        // A torn sector in the middle is found at its offset.
        buf.write_at(3 * SECTOR + 100, &[0xff]);
        assert_eq!(
            check(&buf, 0, 1 << 20, 4096, 7, 3),
            Some((1 << 20) + 3 * SECTOR as u64)
        );
        // Zeroes (never written) do not pass, except where a write-zeroes was last.
        assert_eq!(check(&buf, 4096, 0, 4096, 7, 1), Some(0));
        assert_eq!(check(&buf, 4096, 0, 4096, 7, ZEROED), None);
        assert_eq!(check(&buf, 0, 1 << 20, 4096, 7, ZEROED), Some(1 << 20));
        assert_eq!(
            (next_gen(ZEROED), next_gen(ZEROED - 1), next_gen(4)),
            (1, 1, 5)
        );
    }

    #[test]
    fn a_discarded_range_reads_as_its_data_or_zeros_sector_by_sector() {
        let f = LoopbackFabric::new();
        let buf = f
            .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
            .unwrap();
        stamp(&buf, 0, 0, 4096, 7, 3);
        assert_eq!(check_discarded(&buf, 0, 0, 4096, 7, 3), None);
        buf.write_at(SECTOR, &[0u8; SECTOR]);
        assert_eq!(
            check_discarded(&buf, 0, 0, 4096, 7, 3),
            None,
            "one sector cleared"
        );
        buf.write_at(2 * SECTOR + 8, &[1u8]);
        assert_eq!(
            check_discarded(&buf, 0, 0, 4096, 7, 3),
            Some(2 * SECTOR as u64),
            "a sector that is neither"
        );
        stamp(&buf, 0, 0, 4096, 7, 4);
        assert_eq!(
            check_discarded(&buf, 0, 0, 4096, 7, 3),
            Some(0),
            "another generation's data"
        );
    }
}
