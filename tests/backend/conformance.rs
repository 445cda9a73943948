//! One conformance suite for every block backend flavour: RAM, file through io_uring,
//! file through the thread pool, file in automatic mode. Data is checked against an
//! in-memory model; completions are counted per tag.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::rnbd::backend::{
    BlockBackend, BlockCompletion, BlockFlags, BlockIo, BlockOp, BlockSubmitError, FileBackend,
    FileOptions, IoBuf, IoMode, OpenError, RamBackend,
};

const DEADLINE: Duration = Duration::from_secs(60);
const BS: u32 = 512;

/// A file under the temp dir, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, size: u64) -> TempFile {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "rtrs-backend-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        let f = std::fs::File::create(&path).expect("create temp file");
        f.set_len(size).expect("size temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A backend under test plus what must outlive it. Field order: backend drops first.
struct Dut {
    backend: Box<dyn BlockBackend>,
    _file: Option<TempFile>,
}

#[derive(Clone, Copy)]
enum Flavour {
    Ram,
    File(IoMode),
}

impl Flavour {
    /// `None` when the flavour cannot run here (io_uring refused by the kernel).
    fn make(self, size: u64, depth: usize, read_only: bool) -> Option<Dut> {
        match self {
            Flavour::Ram => {
                let ram = RamBackend::new(size, BS)
                    .unwrap()
                    .with_queue_depth(depth)
                    .unwrap()
                    .with_read_only(read_only);
                Some(Dut {
                    backend: Box::new(ram),
                    _file: None,
                })
            }
            Flavour::File(mode) => {
                let file = TempFile::new("suite", size);
                let opts = FileOptions {
                    read_only,
                    mode,
                    queue_depth: depth,
                    threads: 3,
                    block_size: BS,
                };
                match FileBackend::open(&file.0, &opts) {
                    Ok(b) => {
                        if mode != IoMode::Auto {
                            assert_eq!(b.mode(), mode);
                        }
                        Some(Dut {
                            backend: Box::new(b),
                            _file: Some(file),
                        })
                    }
                    Err(e @ (OpenError::IoUring { .. } | OpenError::IoUringOpcode { .. })) => {
                        eprintln!("io_uring unavailable here, flavour skipped: {e}");
                        None
                    }
                    Err(e) => panic!("open {}: {e}", file.0.display()),
                }
            }
        }
    }
}

/// Small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn io_buf(mem: &MemBuf, offset: usize, len: usize) -> IoBuf {
    assert!(offset + len <= mem.len());
    // SAFETY: every test keeps `mem` alive and untouched until the IO using this buffer
    // has been reaped by `wait_for` (or the backend dropped).
    unsafe { IoBuf::new(mem.as_ptr().add(offset), len) }
}

fn mem_bytes(mem: &MemBuf, offset: usize, len: usize) -> Vec<u8> {
    assert!(offset + len <= mem.len());
    // SAFETY: no IO on `mem` is in flight when tests look at it.
    unsafe { std::slice::from_raw_parts(mem.as_ptr().add(offset), len) }.to_vec()
}

fn fill_mem(mem: &MemBuf, offset: usize, data: &[u8]) {
    assert!(offset + data.len() <= mem.len());
    // SAFETY: as in mem_bytes.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), mem.as_ptr().add(offset), data.len()) }
}

/// Polls until `n` completions have arrived (generous deadline), checking none is extra.
fn wait_for(b: &mut dyn BlockBackend, n: usize) -> Vec<BlockCompletion> {
    let mut got = Vec::with_capacity(n);
    let mut out = [BlockCompletion::default(); 16];
    let start = Instant::now();
    while got.len() < n {
        let k = b.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        if k == 0 {
            assert!(
                start.elapsed() < DEADLINE,
                "only {} of {n} IOs completed",
                got.len()
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(got.len(), n, "more completions than IOs");
    assert_eq!(b.in_flight(), 0);
    got
}

fn run_one(b: &mut dyn BlockBackend, io: BlockIo) -> Result<(), rtrs_spdk::Errno> {
    b.submit(io).expect("submit");
    let c = wait_for(b, 1);
    assert_eq!(c[0].tag, io.tag);
    c[0].result
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed | 1);
    (0..len).map(|_| r.next() as u8).collect()
}

/// Batches of up to 64 IOs in flight over disjoint regions; reads checked against the model.
fn random_io_matches_model(f: Flavour) {
    const SIZE: u64 = 8 << 20;
    const REGIONS: u64 = 64;
    let Some(mut dut) = f.make(SIZE, 128, false) else {
        return;
    };
    let b = dut.backend.as_mut();
    let region = SIZE / REGIONS;
    let mut model = vec![0u8; SIZE as usize];
    let mem = MemBuf::zeroed(SIZE as usize);
    let mut rng = Rng(0x5eed_1234_abcd);
    for round in 0..6u64 {
        // Writes (and some discards / write-zeroes), one per region.
        let mut tags = HashMap::new();
        for r in 0..REGIONS {
            let blocks = region / u64::from(BS);
            let first = rng.below(blocks);
            let count = 1 + rng.below((blocks - first).min(64));
            let (off, len) = (r * region + first * u64::from(BS), count * u64::from(BS));
            let tag = round * 1000 + r;
            let io = match rng.below(8) {
                0 => {
                    model[off as usize..(off + len) as usize].fill(0);
                    BlockIo::discard(tag, off, len as u32)
                }
                1 => {
                    model[off as usize..(off + len) as usize].fill(0);
                    BlockIo::write_zeroes(tag, off, len as u32)
                }
                _ => {
                    let data = pattern(rng.next(), len as usize);
                    model[off as usize..(off + len) as usize].copy_from_slice(&data);
                    fill_mem(&mem, off as usize, &data);
                    BlockIo::write(tag, off, io_buf(&mem, off as usize, len as usize))
                }
            };
            b.submit(io).expect("submit write");
            tags.insert(tag, io.op);
        }
        for c in wait_for(b, tags.len()) {
            let op = tags.remove(&c.tag).expect("unknown or repeated tag");
            assert_eq!(c.result, Ok(()), "{op} tag {} failed", c.tag);
        }
        // Reads of random (possibly overlapping) ranges into disjoint parts of `mem`.
        let mut reads = Vec::new();
        for r in 0..REGIONS {
            let len = u64::from(BS) * (1 + rng.below(128));
            let off = u64::from(BS) * rng.below((SIZE - len) / u64::from(BS) + 1);
            let dst = (r * region) as usize;
            let len = len.min(region);
            fill_mem(&mem, dst, &vec![0xee; len as usize]);
            let tag = 50_000 + round * 1000 + r;
            b.submit(BlockIo::read(tag, off, io_buf(&mem, dst, len as usize)))
                .expect("submit read");
            reads.push((tag, off, dst, len));
        }
        let done = wait_for(b, reads.len());
        for (tag, off, dst, len) in reads {
            let c = done.iter().filter(|c| c.tag == tag).collect::<Vec<_>>();
            assert_eq!(c.len(), 1, "tag {tag} completed {} times", c.len());
            assert_eq!(c[0].result, Ok(()));
            let got = mem_bytes(&mem, dst, len as usize);
            assert!(
                got == model[off as usize..(off + len) as usize],
                "round {round}: read of {len} at {off} differs from the model"
            );
        }
    }
}

/// A full queue of IOs, all in flight at once, each completing exactly once.
fn many_in_flight_complete_once(f: Flavour) {
    const DEPTH: usize = 96;
    let Some(mut dut) = f.make(1 << 20, DEPTH, false) else {
        return;
    };
    let b = dut.backend.as_mut();
    let mem = MemBuf::zeroed(DEPTH * 4096);
    for i in 0..DEPTH {
        fill_mem(&mem, i * 4096, &pattern(i as u64 + 7, 4096));
        let io = BlockIo::write(
            10_000 + i as u64,
            (i * 4096) as u64,
            io_buf(&mem, i * 4096, 4096),
        );
        b.submit(io).expect("submit");
    }
    assert_eq!(b.in_flight(), DEPTH);
    let mut seen = HashMap::new();
    for c in wait_for(b, DEPTH) {
        assert_eq!(c.result, Ok(()));
        *seen.entry(c.tag).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), DEPTH);
    assert!(seen.values().all(|&n| n == 1));
    assert!((0..DEPTH as u64).all(|i| seen.contains_key(&(10_000 + i))));
    let back = MemBuf::zeroed(1 << 20);
    // Reads of the whole range, in flight together.
    for i in 0..DEPTH {
        let io = BlockIo::read(i as u64, (i * 4096) as u64, io_buf(&back, i * 4096, 4096));
        b.submit(io).unwrap();
    }
    assert_eq!(wait_for(b, DEPTH).len(), DEPTH);
    assert!(mem_bytes(&back, 0, DEPTH * 4096) == mem_bytes(&mem, 0, DEPTH * 4096));
}

fn flush_and_fua(f: Flavour) {
    let Some(mut dut) = f.make(1 << 20, 16, false) else {
        return;
    };
    let b = dut.backend.as_mut();
    let mem = MemBuf::zeroed(8192);
    fill_mem(&mem, 0, &pattern(3, 8192));
    let w = BlockIo::write(1, 4096, io_buf(&mem, 0, 4096)).with_flags(BlockFlags::FUA);
    assert_eq!(run_one(b, w), Ok(()));
    assert_eq!(run_one(b, BlockIo::flush(2)), Ok(()));
    // A flush as the kernel's client sends it (op_is_flush sets RNBD_F_FUA).
    let f = BlockIo::flush(9).with_flags(BlockFlags::FUA);
    assert_eq!(run_one(b, f), Ok(()));
    let w = BlockIo::write(3, 65536, io_buf(&mem, 4096, 4096))
        .with_flags(BlockFlags::PREFLUSH | BlockFlags::FUA);
    assert_eq!(run_one(b, w), Ok(()));
    let z = BlockIo::write_zeroes(4, 0, 4096).with_flags(BlockFlags::FUA | BlockFlags::PREFLUSH);
    assert_eq!(run_one(b, z), Ok(()));
    let back = MemBuf::zeroed(8192);
    assert_eq!(
        run_one(b, BlockIo::read(5, 4096, io_buf(&back, 0, 4096))),
        Ok(())
    );
    assert_eq!(
        run_one(b, BlockIo::read(6, 65536, io_buf(&back, 4096, 4096))),
        Ok(())
    );
    assert!(mem_bytes(&back, 0, 8192) == mem_bytes(&mem, 0, 8192));
}

fn discard_and_write_zeroes_read_back_zero(f: Flavour) {
    let Some(mut dut) = f.make(1 << 20, 16, false) else {
        return;
    };
    let b = dut.backend.as_mut();
    let g = *b.geometry();
    assert!(g.max_discard > 0 && g.max_write_zeroes > 0);
    let data = pattern(9, 256 << 10);
    let mem = MemBuf::zeroed(256 << 10);
    fill_mem(&mem, 0, &data);
    assert_eq!(
        run_one(b, BlockIo::write(1, 0, io_buf(&mem, 0, 256 << 10))),
        Ok(())
    );
    // Discard a page-aligned range, write-zeroes an odd one, and one with NOUNMAP.
    assert_eq!(run_one(b, BlockIo::discard(2, 8192, 16384)), Ok(()));
    assert_eq!(
        run_one(b, BlockIo::write_zeroes(3, 512 * 77, 512 * 5)),
        Ok(())
    );
    let z = BlockIo::write_zeroes(4, 131072, 65536).with_flags(BlockFlags::NOUNMAP);
    assert_eq!(run_one(b, z), Ok(()));
    let mut model = data.clone();
    model[8192..8192 + 16384].fill(0);
    model[512 * 77..512 * 82].fill(0);
    model[131072..131072 + 65536].fill(0);
    let back = MemBuf::zeroed(256 << 10);
    fill_mem(&back, 0, &vec![0xaa; 256 << 10]);
    assert_eq!(
        run_one(b, BlockIo::read(5, 0, io_buf(&back, 0, 256 << 10))),
        Ok(())
    );
    assert!(mem_bytes(&back, 0, 256 << 10) == model);
}

/// Write-same (an old kernel client's op 5 with data): the one block repeated over the
/// range, read back; more blocks than one syscall's iovecs, a FUA+PREFLUSH one, and the
/// refusals of a block of the wrong length.
fn write_same_repeats_the_block(f: Flavour) {
    const SIZE: usize = 1 << 20;
    let Some(mut dut) = f.make(SIZE as u64, 16, false) else {
        return;
    };
    let b = dut.backend.as_mut();
    let data = pattern(11, SIZE);
    let mem = MemBuf::zeroed(SIZE);
    fill_mem(&mem, 0, &data);
    assert_eq!(
        run_one(b, BlockIo::write(1, 0, io_buf(&mem, 0, SIZE))),
        Ok(())
    );
    let blocks = MemBuf::zeroed(4 * BS as usize);
    let one = pattern(12, BS as usize);
    let two = pattern(13, BS as usize);
    fill_mem(&blocks, 0, &one);
    fill_mem(&blocks, BS as usize, &two);
    let mut model = data.clone();
    // 600 blocks: more than one pwritev's 256 iovecs (and one SPDK writev's 256 blocks).
    let (at, n) = (BS as usize * 10, 600);
    let ws = BlockIo::write_same(2, at as u64, BS * n, io_buf(&blocks, 0, BS as usize));
    assert_eq!(run_one(b, ws), Ok(()));
    for k in 0..n as usize {
        model[at + k * BS as usize..at + (k + 1) * BS as usize].copy_from_slice(&one);
    }
    let at2 = 700 * BS as usize;
    let ws = BlockIo::write_same(
        3,
        at2 as u64,
        BS * 3,
        io_buf(&blocks, BS as usize, BS as usize),
    )
    .with_flags(BlockFlags::FUA | BlockFlags::PREFLUSH);
    assert_eq!(run_one(b, ws), Ok(()));
    for k in 0..3 {
        model[at2 + k * BS as usize..at2 + (k + 1) * BS as usize].copy_from_slice(&two);
    }
    // The block must be exactly one logical block; nothing is written otherwise.
    for (tag, len) in [(4, 2 * BS as usize), (5, BS as usize / 2)] {
        let bad = BlockIo::write_same(tag, 0, BS * 4, io_buf(&blocks, 0, len));
        let e = b.submit(bad).unwrap_err();
        assert_eq!(
            e,
            BlockSubmitError::NotOneBlock {
                len,
                block_size: BS
            }
        );
        assert_eq!(e.errno().neg(), -libc::EINVAL);
        assert!(
            e.to_string().contains("exactly one 512-byte logical block"),
            "{e}"
        );
    }
    let no_block = BlockIo::range(6, BlockOp::WriteSame, 0, BS * 4);
    assert_eq!(b.submit(no_block).unwrap_err().errno().neg(), -libc::EINVAL);
    let misaligned = BlockIo::write_same(7, 0, BS * 4 + 100, io_buf(&blocks, 0, BS as usize));
    assert_eq!(
        b.submit(misaligned).unwrap_err().errno().neg(),
        -libc::EINVAL
    );
    assert_eq!(b.in_flight(), 0);
    let back = MemBuf::zeroed(SIZE);
    assert_eq!(
        run_one(b, BlockIo::read(8, 0, io_buf(&back, 0, SIZE))),
        Ok(())
    );
    assert!(
        mem_bytes(&back, 0, SIZE) == model,
        "write-same result differs"
    );
}

fn read_only_refuses_writes(f: Flavour) {
    let Some(mut dut) = f.make(1 << 20, 16, true) else {
        return;
    };
    let b = dut.backend.as_mut();
    assert!(b.read_only());
    let mem = MemBuf::zeroed(4096);
    for io in [
        BlockIo::write(1, 0, io_buf(&mem, 0, 4096)),
        BlockIo::discard(2, 0, 4096),
        BlockIo::write_zeroes(3, 0, 4096),
        BlockIo::write_same(6, 0, 4096, io_buf(&mem, 0, BS as usize)),
    ] {
        let e = b.submit(io).unwrap_err();
        assert_eq!(e, BlockSubmitError::ReadOnly { op: io.op });
        assert_eq!(e.errno().neg(), -libc::EROFS);
    }
    assert_eq!(b.in_flight(), 0);
    assert_eq!(
        run_one(b, BlockIo::read(4, 0, io_buf(&mem, 0, 4096))),
        Ok(())
    );
    assert_eq!(run_one(b, BlockIo::flush(5)), Ok(()));
}

fn bad_io_is_refused_synchronously(f: Flavour) {
    const SIZE: u64 = 4 << 20;
    let Some(mut dut) = f.make(SIZE, 16, false) else {
        return;
    };
    let b = dut.backend.as_mut();
    let max = b.geometry().max_transfer;
    let mem = MemBuf::zeroed(max as usize + 4096);
    let buf = |off: usize, len: usize| io_buf(&mem, off, len);
    let cases: Vec<(BlockIo, i32)> = vec![
        (BlockIo::read(1, SIZE, buf(0, 512)), -libc::EIO),
        (BlockIo::read(2, SIZE - 512, buf(0, 1024)), -libc::EIO),
        (BlockIo::write(3, u64::MAX - 511, buf(0, 512)), -libc::EIO),
        (BlockIo::discard(4, SIZE - 4096, 8192), -libc::EIO),
        (BlockIo::read(5, 100, buf(0, 512)), -libc::EINVAL),
        (BlockIo::write(6, 512, buf(0, 700)), -libc::EINVAL),
        (BlockIo::write_zeroes(7, 4096, 100), -libc::EINVAL),
        (BlockIo::read(8, 0, buf(0, 0)), -libc::EINVAL),
        (
            BlockIo::write(9, 0, buf(0, max as usize + 512)),
            -libc::EINVAL,
        ),
        (BlockIo::range(10, BlockOp::Read, 0, 512), -libc::EINVAL),
        (
            BlockIo {
                len: 4096,
                ..BlockIo::write(11, 0, buf(0, 512))
            },
            -libc::EINVAL,
        ),
        (
            BlockIo::range(12, BlockOp::SecureErase, 0, 512),
            -libc::EOPNOTSUPP,
        ),
    ];
    for (io, errno) in cases {
        let e = b.submit(io).expect_err("bad IO accepted");
        assert_eq!(e.errno().neg(), errno, "tag {}: {e}", io.tag);
        assert!(!e.is_busy());
        assert!(!e.to_string().is_empty());
    }
    assert_eq!(b.in_flight(), 0);
    let mut out = [BlockCompletion::default(); 4];
    assert_eq!(b.poll(&mut out), 0, "a refused IO produced a completion");
    // The last block is fine.
    assert_eq!(
        run_one(b, BlockIo::read(13, SIZE - 512, buf(0, 512))),
        Ok(())
    );
}

fn full_queue_is_busy_then_retried(f: Flavour) {
    const DEPTH: usize = 4;
    let Some(mut dut) = f.make(1 << 20, DEPTH, false) else {
        return;
    };
    let b = dut.backend.as_mut();
    assert_eq!(b.queue_depth(), DEPTH);
    let mem = MemBuf::zeroed(8 * 4096);
    for i in 0..DEPTH {
        b.submit(BlockIo::read(i as u64, 0, io_buf(&mem, i * 4096, 4096)))
            .unwrap();
    }
    let extra = BlockIo::read(99, 4096, io_buf(&mem, 5 * 4096, 4096));
    let e = b.submit(extra).unwrap_err();
    assert!(e.is_busy(), "{e}");
    assert_eq!(e, BlockSubmitError::Busy { depth: DEPTH });
    assert_eq!(e.errno().neg(), -libc::EAGAIN);
    // An invalid IO is still refused for what it is, not as busy.
    let bad = b
        .submit(BlockIo::read(98, 3, io_buf(&mem, 0, 512)))
        .unwrap_err();
    assert_eq!(bad.errno().neg(), -libc::EINVAL);
    // Reap one slot, then the same IO goes through.
    let mut out = [BlockCompletion::default(); 1];
    let start = Instant::now();
    while b.poll(&mut out) == 0 {
        assert!(start.elapsed() < DEADLINE, "no completion");
        std::thread::sleep(Duration::from_micros(200));
    }
    b.submit(extra).expect("retry after a completion");
    let rest = wait_for(b, DEPTH);
    let mut tags: Vec<u64> = rest.iter().map(|c| c.tag).chain([out[0].tag]).collect();
    tags.sort_unstable();
    assert_eq!(tags, vec![0, 1, 2, 3, 99]);
}

macro_rules! suite {
    ($module:ident, $flavour:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn random_io_matches_model() {
                super::random_io_matches_model($flavour);
            }
            #[test]
            fn many_in_flight_complete_once() {
                super::many_in_flight_complete_once($flavour);
            }
            #[test]
            fn flush_and_fua() {
                super::flush_and_fua($flavour);
            }
            #[test]
            fn discard_and_write_zeroes_read_back_zero() {
                super::discard_and_write_zeroes_read_back_zero($flavour);
            }
            #[test]
            fn write_same_repeats_the_block() {
                super::write_same_repeats_the_block($flavour);
            }
            #[test]
            fn read_only_refuses_writes() {
                super::read_only_refuses_writes($flavour);
            }
            #[test]
            fn bad_io_is_refused_synchronously() {
                super::bad_io_is_refused_synchronously($flavour);
            }
            #[test]
            fn full_queue_is_busy_then_retried() {
                super::full_queue_is_busy_then_retried($flavour);
            }
        }
    };
}

suite!(ram, Flavour::Ram);
suite!(file_uring, Flavour::File(IoMode::IoUring));
suite!(file_threads, Flavour::File(IoMode::ThreadPool));
suite!(file_auto, Flavour::File(IoMode::Auto));
