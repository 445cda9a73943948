//! Export specs (`NAME=ram:SIZE`, `NAME=file:PATH[:ro]`) and opening backends: good and
//! bad specs with their messages, file sizes and kinds, read-only files, persistence, the
//! geometry RNBD reports, and write-zeroes on tmpfs (no ZERO_RANGE there).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::rnbd::backend::{
    BackendSpec, BlockBackend, BlockCompletion, BlockFlags, BlockIo, BlockSubmitError, ExportSpec,
    FileBackend, FileOptions, IoBuf, IoMode, OpenError, RamBackend, SpecProblem, RNBD_FUA,
    RNBD_WRITEBACK,
};

struct TempFile(PathBuf);

impl TempFile {
    fn in_dir(dir: &Path, contents: &[u8]) -> TempFile {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "rtrs-backend-spec-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write temp file");
        TempFile(path)
    }

    fn new(contents: &[u8]) -> TempFile {
        TempFile::in_dir(&std::env::temp_dir(), contents)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run_one(b: &mut dyn BlockBackend, io: BlockIo) -> Result<(), rtrs_spdk::Errno> {
    b.submit(io).expect("submit");
    let mut out = [BlockCompletion::default(); 2];
    let start = Instant::now();
    loop {
        let n = b.poll(&mut out);
        if n > 0 {
            assert_eq!(n, 1);
            assert_eq!(out[0].tag, io.tag);
            return out[0].result;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "IO never completed"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn io_buf(mem: &MemBuf) -> IoBuf {
    // SAFETY: each test keeps `mem` alive and untouched until its IO has completed.
    unsafe { IoBuf::from_mem(mem) }
}

fn mem_bytes(mem: &MemBuf) -> Vec<u8> {
    // SAFETY: no IO on `mem` is in flight when this is called.
    unsafe { std::slice::from_raw_parts(mem.as_ptr(), mem.len()) }.to_vec()
}

#[test]
fn good_specs() {
    let cases = [
        ("disk0=ram:1G", BackendSpec::Ram { size: 1 << 30 }),
        ("a=ram:4096", BackendSpec::Ram { size: 4096 }),
        ("b=ram:64K", BackendSpec::Ram { size: 64 << 10 }),
        ("c=ram:512M", BackendSpec::Ram { size: 512 << 20 }),
        (
            "vol/1=file:/dev/sdb",
            BackendSpec::File {
                path: "/dev/sdb".into(),
                read_only: false,
            },
        ),
        (
            "d=file:/srv/img:ro",
            BackendSpec::File {
                path: "/srv/img".into(),
                read_only: true,
            },
        ),
        (
            "e=file:/srv/a:b",
            BackendSpec::File {
                path: "/srv/a:b".into(),
                read_only: false,
            },
        ),
        (
            "f=file:rel.img:rw",
            BackendSpec::File {
                path: "rel.img".into(),
                read_only: false,
            },
        ),
    ];
    for (text, backend) in cases {
        let spec: ExportSpec = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(spec.backend, backend, "{text}");
        assert_eq!(spec.name, text.split_once('=').unwrap().0);
        // Display gives back a spec that parses to the same thing.
        assert_eq!(ExportSpec::parse(&spec.to_string()).unwrap(), spec);
    }
}

#[test]
fn bad_specs_say_what_is_wrong() {
    let cases: [(&str, &str); 10] = [
        ("noequals", "expected NAME=ram:SIZE or NAME=file:PATH[:ro]"),
        ("x=ram", "expected NAME=ram:SIZE"),
        ("=ram:1G", "bad name '': empty"),
        ("a..b=ram:1M", "bad name 'a..b': contains '..'"),
        ("a b=ram:1M", "bad name 'a b': contains whitespace"),
        ("x=ram:12Q", "bad size '12Q' (use e.g. 512M, 1G)"),
        (
            "x=ram:1000",
            "size 1000 is not a positive multiple of the 512-byte block size",
        ),
        ("x=ram:0", "size 0 is not a positive multiple"),
        ("x=disk:1G", "unknown backend 'disk' (use ram or file)"),
        ("x=file::ro", "missing file path"),
    ];
    for (text, needle) in cases {
        let e = ExportSpec::parse(text).expect_err(text);
        let msg = e.to_string();
        assert!(msg.starts_with(&format!("export '{text}': ")), "{msg}");
        assert!(msg.contains(needle), "{text}: '{msg}' lacks '{needle}'");
    }
    let long = format!("{}=ram:1M", "n".repeat(255));
    assert!(matches!(
        ExportSpec::parse(&long).unwrap_err().problem,
        SpecProblem::BadName { .. }
    ));
    assert_eq!(
        ExportSpec::parse("x=file:").unwrap_err().problem,
        SpecProblem::MissingPath
    );
}

#[test]
fn ram_spec_opens_with_rnbd_geometry() {
    let spec = ExportSpec::parse("r=ram:8M").unwrap();
    let b = spec.open(&FileOptions::default()).unwrap();
    let g = b.geometry();
    assert_eq!(g.size, 8 << 20);
    assert_eq!(g.nsectors(), (8 << 20) / 512);
    assert_eq!(g.logical_block_size, 512);
    assert_eq!(g.cache_policy(), 0, "RAM has no volatile cache");
    assert_eq!(g.max_discard_sectors(), g.max_discard / 512);
    assert!(g.max_write_zeroes_sectors() > 0);
    assert_eq!(g.secure_discard(), 0);
    assert!(b.describe().contains("ram"));
    assert!(matches!(
        RamBackend::new(1000, 512),
        Err(OpenError::BadSize { size: 1000, .. })
    ));
    assert!(matches!(
        RamBackend::new(4096, 1000),
        Err(OpenError::BadBlockSize { block_size: 1000 })
    ));
    // Block sizes travel in 16 bits: 64 KiB cannot be exported.
    assert!(matches!(
        RamBackend::new(1 << 20, 65536),
        Err(OpenError::BadBlockSize { block_size: 65536 })
    ));
    let mut big = RamBackend::new(1 << 20, 4096).unwrap();
    assert_eq!(big.geometry().logical_block_size, 4096);
    let mem = MemBuf::zeroed(8192);
    let e = big.submit(BlockIo::read(1, 512, io_buf(&mem))).unwrap_err();
    assert!(
        matches!(
            e,
            BlockSubmitError::Misaligned {
                block_size: 4096,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(
        run_one(&mut big, BlockIo::read(2, 4096, io_buf(&mem))),
        Ok(())
    );
    assert!(matches!(
        RamBackend::new(4096, 512).unwrap().with_queue_depth(0),
        Err(OpenError::BadQueueDepth { depth: 0 })
    ));
}

#[test]
fn missing_file_and_non_files_are_reported_with_the_path() {
    let missing = std::env::temp_dir().join("rtrs-backend-definitely-missing.img");
    let spec = ExportSpec::parse(&format!("m=file:{}", missing.display())).unwrap();
    let e = spec
        .open(&FileOptions::default())
        .err()
        .expect("missing file opened");
    assert!(
        matches!(&e, OpenError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    );
    assert!(
        e.to_string().contains(&missing.display().to_string()),
        "{e}"
    );

    let dir = std::env::temp_dir();
    let e = FileBackend::open(&dir, &FileOptions::default()).expect_err("directory opened");
    assert!(
        matches!(
            e,
            OpenError::NotFileOrDevice { .. } | OpenError::Open { .. }
        ),
        "{e}"
    );
}

#[test]
fn file_size_is_rounded_down_to_blocks_and_tiny_files_refused() {
    let f = TempFile::new(&[7u8; 1000]);
    let b = FileBackend::open(&f.0, &FileOptions::default()).unwrap();
    assert_eq!(b.geometry().size, 512);
    assert_eq!(b.geometry().cache_policy(), RNBD_FUA | RNBD_WRITEBACK);
    assert!(!b.is_block_device());
    drop(b);
    let tiny = TempFile::new(&[7u8; 100]);
    let e = FileBackend::open(&tiny.0, &FileOptions::default()).unwrap_err();
    assert!(matches!(e, OpenError::TooSmall { size: 100, .. }), "{e}");
    let opts = FileOptions {
        block_size: 4096,
        ..FileOptions::default()
    };
    let e = FileBackend::open(&f.0, &opts).unwrap_err();
    assert!(matches!(e, OpenError::TooSmall { .. }), "{e}");
    let opts = FileOptions {
        queue_depth: 0,
        ..FileOptions::default()
    };
    assert!(matches!(
        FileBackend::open(&f.0, &opts),
        Err(OpenError::BadQueueDepth { .. })
    ));
}

#[test]
fn read_only_file_spec_reads_and_refuses_writes() {
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
    let f = TempFile::new(&data);
    for mode in [IoMode::Auto, IoMode::ThreadPool] {
        let spec = ExportSpec::parse(&format!("ro=file:{}:ro", f.0.display())).unwrap();
        let opts = FileOptions {
            mode,
            ..FileOptions::default()
        };
        let mut b = spec.open(&opts).unwrap();
        assert!(b.read_only());
        let mem = MemBuf::zeroed(8192);
        assert_eq!(
            run_one(b.as_mut(), BlockIo::read(1, 0, io_buf(&mem))),
            Ok(())
        );
        assert_eq!(mem_bytes(&mem), data);
        let e = b.submit(BlockIo::write(2, 0, io_buf(&mem))).unwrap_err();
        assert_eq!(
            e,
            BlockSubmitError::ReadOnly {
                op: rtrs_spdk::rnbd::backend::BlockOp::Write
            }
        );
    }
    assert_eq!(
        std::fs::read(&f.0).unwrap(),
        data,
        "read-only export changed the file"
    );
}

#[test]
fn writes_reach_the_file() {
    let f = TempFile::new(&vec![0u8; 64 << 10]);
    for (i, mode) in [IoMode::Auto, IoMode::ThreadPool].into_iter().enumerate() {
        let opts = FileOptions {
            mode,
            ..FileOptions::default()
        };
        let mut b = FileBackend::open(&f.0, &opts).unwrap();
        let mem = MemBuf::zeroed(4096);
        let fill = 0x30 + i as u8;
        // SAFETY: no IO is in flight on `mem` yet.
        unsafe { std::ptr::write_bytes(mem.as_ptr(), fill, 4096) };
        let io = BlockIo::write(1, 8192, io_buf(&mem)).with_flags(BlockFlags::FUA);
        assert_eq!(run_one(&mut b, io), Ok(()));
        drop(b);
        let on_disk = std::fs::read(&f.0).unwrap();
        assert!(on_disk[8192..12288].iter().all(|&x| x == fill));
        assert!(on_disk[..8192].iter().all(|&x| x == 0));
    }
}

/// tmpfs has no FALLOC_FL_ZERO_RANGE: write-zeroes falls back to punching holes.
#[test]
fn write_zeroes_on_tmpfs_falls_back_and_reads_zero() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("no /dev/shm here; tmpfs fallback not exercised");
        return;
    }
    let f = TempFile::in_dir(shm, &vec![0xffu8; 64 << 10]);
    for mode in [IoMode::Auto, IoMode::ThreadPool] {
        let opts = FileOptions {
            mode,
            ..FileOptions::default()
        };
        let mut b = FileBackend::open(&f.0, &opts).unwrap();
        for (tag, flags) in [
            (1, BlockFlags::NONE),
            (2, BlockFlags::NOUNMAP | BlockFlags::FUA),
        ] {
            let off = 4096 * tag;
            let io = BlockIo::write_zeroes(tag, off, 4096).with_flags(flags);
            assert_eq!(run_one(&mut b, io), Ok(()), "{mode:?} {flags:?}");
        }
        let mem = MemBuf::zeroed(64 << 10);
        assert_eq!(run_one(&mut b, BlockIo::read(3, 0, io_buf(&mem))), Ok(()));
        let got = mem_bytes(&mem);
        assert!(got[4096..12288].iter().all(|&x| x == 0), "{mode:?}");
        assert!(got[..4096].iter().all(|&x| x == 0xff), "{mode:?}");
        assert!(got[12288..].iter().all(|&x| x == 0xff), "{mode:?}");
        // Restore for the next mode.
        // SAFETY: no IO in flight on `mem`.
        unsafe { std::ptr::write_bytes(mem.as_ptr(), 0xff, 64 << 10) };
        assert_eq!(run_one(&mut b, BlockIo::write(4, 0, io_buf(&mem))), Ok(()));
    }
}

/// A file truncated behind the export's back: reads past the new end fail with EIO
/// (end of file inside the device), they neither hang nor return stale data.
#[test]
fn file_shrunk_under_the_export_gives_eio() {
    for mode in [IoMode::Auto, IoMode::ThreadPool] {
        let f = TempFile::new(&vec![1u8; 64 << 10]);
        let opts = FileOptions {
            mode,
            ..FileOptions::default()
        };
        let mut b = FileBackend::open(&f.0, &opts).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&f.0)
            .and_then(|file| file.set_len(16 << 10))
            .unwrap();
        let mem = MemBuf::zeroed(4096);
        let past = BlockIo::read(1, 32 << 10, io_buf(&mem));
        assert_eq!(
            run_one(&mut b, past),
            Err(rtrs_spdk::Errno::EIO),
            "{mode:?}"
        );
        let inside = BlockIo::read(2, 8 << 10, io_buf(&mem));
        assert_eq!(run_one(&mut b, inside), Ok(()), "{mode:?}");
        assert!(mem_bytes(&mem).iter().all(|&x| x == 1));
    }
}
