//! The file backend on a real block device, which a test cannot create on its own: set
//! `RTRS_BACKEND_BLOCKDEV` to a scratch device (its contents are destroyed), e.g.
//!
//! ```text
//! truncate -s 64M /tmp/scratch.img && dev=$(losetup -f --show /tmp/scratch.img)
//! RTRS_BACKEND_BLOCKDEV=$dev cargo test --test backend blockdev::
//! losetup -d $dev
//! ```
//!
//! Without it the test only reports that it did not run.

use std::time::{Duration, Instant};

use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::rnbd::backend::{
    BlockBackend, BlockCompletion, BlockFlags, BlockIo, FileBackend, FileOptions, IoBuf, IoMode,
};

fn run_one(b: &mut dyn BlockBackend, io: BlockIo) -> Result<(), rtrs_spdk::Errno> {
    b.submit(io).expect("submit");
    let mut out = [BlockCompletion::default(); 2];
    let start = Instant::now();
    loop {
        let n = b.poll(&mut out);
        if n > 0 {
            assert_eq!((n, out[0].tag), (1, io.tag));
            return out[0].result;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "IO never completed"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn buf(mem: &MemBuf, offset: usize, len: usize) -> IoBuf {
    assert!(offset + len <= mem.len());
    // SAFETY: `mem` outlives every IO and is not touched while one is in flight.
    unsafe { IoBuf::new(mem.as_ptr().add(offset), len) }
}

fn bytes(mem: &MemBuf) -> Vec<u8> {
    // SAFETY: no IO in flight on `mem`.
    unsafe { std::slice::from_raw_parts(mem.as_ptr(), mem.len()) }.to_vec()
}

#[test]
fn block_device_round_trip() {
    let Ok(dev) = std::env::var("RTRS_BACKEND_BLOCKDEV") else {
        eprintln!("RTRS_BACKEND_BLOCKDEV not set: block-device test not run");
        return;
    };
    for mode in [IoMode::Auto, IoMode::ThreadPool] {
        let opts = FileOptions {
            mode,
            ..FileOptions::default()
        };
        let mut b = FileBackend::open(&dev, &opts).unwrap_or_else(|e| panic!("{e}"));
        assert!(b.is_block_device());
        let g = *b.geometry();
        eprintln!("{}: {g:?}", b.describe());
        assert!(g.size >= 1 << 20 && g.logical_block_size >= 512);
        let lbs = g.logical_block_size as usize;
        let end = g.size - 64 * 1024;
        let mem = MemBuf::zeroed(64 * 1024);
        // SAFETY: no IO in flight on `mem` yet.
        unsafe { std::ptr::write_bytes(mem.as_ptr(), 0x5a, 64 * 1024) };
        let w = BlockIo::write(1, end, buf(&mem, 0, 64 * 1024)).with_flags(BlockFlags::FUA);
        assert_eq!(run_one(&mut b, w), Ok(()));
        assert_eq!(run_one(&mut b, BlockIo::flush(2)), Ok(()));
        let zero_at = end + 4096;
        let z = BlockIo::write_zeroes(3, zero_at, 4096);
        assert_eq!(run_one(&mut b, z), Ok(()));
        let back = MemBuf::zeroed(64 * 1024);
        assert_eq!(
            run_one(&mut b, BlockIo::read(4, end, buf(&back, 0, 64 * 1024))),
            Ok(())
        );
        let got = bytes(&back);
        assert!(got[..4096].iter().all(|&x| x == 0x5a));
        assert!(got[4096..8192].iter().all(|&x| x == 0));
        assert!(got[8192..].iter().all(|&x| x == 0x5a));
        if g.max_discard > 0 {
            let d = BlockIo::discard(5, end, 16 * 1024);
            assert_eq!(run_one(&mut b, d), Ok(()), "discard");
        }
        let past = BlockIo::read(6, g.size, buf(&back, 0, lbs));
        assert_eq!(b.submit(past).unwrap_err().errno().neg(), -libc::EIO);
    }
}
