//! Exports added and removed while a dispatcher serves (the SPDK target's
//! `rtrs_target_export` / `rtrs_target_unexport` and bdev hot removal): a core opens its
//! instance of a new export at the first IO, IO through a mapping of a removed export
//! fails with −EIO, the core drops its instance once the IO in flight has completed, and
//! the name can be exported again; names, duplicates, read-only exports and capacity;
//! a file that grows is reported at its next OPEN and served to its new end by a core
//! that had it open already.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::proto::rnbd::{AccessMode, Io, Open, OpenRsp, RnbdFlags, RnbdOp};
use rtrs_spdk::rnbd::backend::{
    BlockBackend, BlockCompletion, BlockIo, BlockSubmitError, Geometry, IoBuf, RamBackend,
};
use rtrs_spdk::rnbd::server::{
    AccessError, Dir, Dispatcher, ExportBackend, Exports, ExportsError, Outcome, Request,
    RnbdServerSession,
};

use rtrs_spdk::Errno;

/// A RAM disk whose per-core instances are counted (opened, dropped).
struct Counted {
    ram: Mutex<RamBackend>,
    opened: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

impl ExportBackend for Counted {
    fn geometry(&self) -> Geometry {
        *self.ram.lock().unwrap().geometry()
    }

    fn open_core(&self, _core: usize) -> Result<Box<dyn BlockBackend>, String> {
        self.opened.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(Instance {
            inner: self.ram.lock().unwrap().share(),
            dropped: Arc::clone(&self.dropped),
        }))
    }
}

struct Instance {
    inner: RamBackend,
    dropped: Arc<AtomicUsize>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl BlockBackend for Instance {
    fn geometry(&self) -> &Geometry {
        self.inner.geometry()
    }
    fn queue_depth(&self) -> usize {
        self.inner.queue_depth()
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
    fn submit(&mut self, io: BlockIo) -> Result<(), BlockSubmitError> {
        self.inner.submit(io)
    }
    fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        self.inner.poll(out)
    }
    fn describe(&self) -> String {
        format!("counted {}", self.inner.describe())
    }
}

struct Disk {
    backend: Arc<dyn ExportBackend>,
    opened: Arc<AtomicUsize>,
    dropped: Arc<AtomicUsize>,
}

fn disk(size: u64) -> Disk {
    let (opened, dropped) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    Disk {
        backend: Arc::new(Counted {
            ram: Mutex::new(RamBackend::new(size, 512).unwrap()),
            opened: Arc::clone(&opened),
            dropped: Arc::clone(&dropped),
        }),
        opened,
        dropped,
    }
}

fn area(len: usize) -> (MemBuf, IoBuf) {
    let mem = MemBuf::zeroed(len);
    // SAFETY: the memory outlives every request of the test (returned with the view).
    let buf = unsafe { IoBuf::new(mem.as_ptr(), len) };
    (mem, buf)
}

fn open(d: &mut Dispatcher, sess: &RnbdServerSession, name: &[u8]) -> Result<u32, Errno> {
    open_rsp(d, sess, name).map(|r| r.device_id)
}

fn open_rsp(d: &mut Dispatcher, sess: &RnbdServerSession, name: &[u8]) -> Result<OpenRsp, Errno> {
    let mut msg = [0u8; Open::LEN];
    Open {
        access_mode: AccessMode::ReadWrite,
        dev_name: name,
    }
    .encode(&mut msg)
    .unwrap();
    let (mem, buf) = area(OpenRsp::LEN);
    let r = d.process(
        sess,
        Request {
            tag: 0,
            dir: Dir::Read,
            usr: &msg,
            data: buf,
            peer: None,
            paths: &[],
        },
    );
    match r {
        Outcome::Done(Ok(())) => {
            let mut b = [0u8; OpenRsp::LEN];
            // SAFETY: the request was answered; nobody uses the area.
            unsafe { buf.copy_out(0, &mut b) };
            drop(mem);
            Ok(OpenRsp::decode(&b).unwrap())
        }
        Outcome::Done(Err(e)) => Err(e),
        Outcome::Submitted => panic!("OPEN answers at once"),
    }
}

fn write(d: &mut Dispatcher, sess: &RnbdServerSession, dev: u32, tag: u64, data: IoBuf) -> Outcome {
    write_at(d, sess, dev, tag, 0, data)
}

fn write_at(
    d: &mut Dispatcher,
    sess: &RnbdServerSession,
    dev: u32,
    tag: u64,
    sector: u64,
    data: IoBuf,
) -> Outcome {
    let usr = Io {
        device_id: dev,
        sector,
        op: RnbdOp::Write,
        flags: RnbdFlags::default(),
        bi_size: data.len() as u32,
        prio: 0,
    }
    .to_bytes();
    d.process(
        sess,
        Request {
            tag,
            dir: Dir::Write,
            usr: &usr,
            data,
            peer: None,
            paths: &[],
        },
    )
}

/// Polls until `n` completions came (bounded), returning them.
fn reap(d: &mut Dispatcher, n: usize) -> Vec<BlockCompletion> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    let mut out = [BlockCompletion::default(); 8];
    while got.len() < n {
        let k = d.poll(&mut out);
        got.extend_from_slice(&out[..k]);
        assert!(Instant::now() < deadline, "no completion within 20 s");
    }
    got
}

#[test]
fn exports_come_and_go_under_a_dispatcher() {
    let exports = Arc::new(Exports::dynamic(8));
    let mut d = Dispatcher::new(Arc::clone(&exports), 0).unwrap();
    let sess = RnbdServerSession::new("s", Arc::clone(&exports));
    assert_eq!(open(&mut d, &sess, b"d"), Err(Errno::ENOENT));

    let first = disk(1 << 20);
    exports.add("d", Arc::clone(&first.backend), false).unwrap();
    let dev = open(&mut d, &sess, b"d").unwrap();
    assert_eq!(
        first.opened.load(Ordering::SeqCst),
        0,
        "opened lazily, at the first IO"
    );
    let (_mem, buf) = area(4096);
    assert_eq!(write(&mut d, &sess, dev, 7, buf), Outcome::Submitted);
    assert_eq!(first.opened.load(Ordering::SeqCst), 1);
    assert_eq!(reap(&mut d, 1), [BlockCompletion::new(7, Ok(()))]);

    // Removed with an IO in flight: the IO completes, then the instance goes.
    assert_eq!(write(&mut d, &sess, dev, 8, buf), Outcome::Submitted);
    assert_eq!(
        exports.remove("d").map(|id| exports.is_closed(id)),
        Some(true)
    );
    assert_eq!(reap(&mut d, 1), [BlockCompletion::new(8, Ok(()))]);
    let mut out = [BlockCompletion::default(); 2];
    d.poll(&mut out);
    assert_eq!(first.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(d.in_flight(), 0);
    assert_eq!(
        write(&mut d, &sess, dev, 9, buf),
        Outcome::Done(Err(Errno::EIO))
    );
    drop(first.backend);

    // Exported again under the same name: a fresh mapping and a fresh instance.
    let second = disk(2 << 20);
    exports
        .add("d", Arc::clone(&second.backend), false)
        .unwrap();
    let dev2 = open(&mut d, &sess, b"d").unwrap();
    assert_eq!(write(&mut d, &sess, dev2, 10, buf), Outcome::Submitted);
    assert_eq!(reap(&mut d, 1), [BlockCompletion::new(10, Ok(()))]);
    assert_eq!(second.opened.load(Ordering::SeqCst), 1);
    assert_eq!(second.dropped.load(Ordering::SeqCst), 0);
}

#[test]
fn add_remove_lookup_and_capacity() {
    let ex = Exports::dynamic(2);
    assert!(ex.is_empty());
    let g0 = ex.generation();
    let a = ex.add("a", disk(4096).backend, false).unwrap();
    assert_ne!(ex.generation(), g0);
    assert_eq!(ex.lookup(b"a"), Some(a));
    assert!(matches!(
        ex.add("a", disk(4096).backend, false),
        Err(ExportsError::Duplicate { .. })
    ));
    assert!(matches!(
        ex.add("x/../y", disk(4096).backend, false),
        Err(ExportsError::BadName { .. })
    ));
    assert!(matches!(
        ex.add("", disk(4096).backend, false),
        Err(ExportsError::BadName { .. })
    ));
    let b = ex.add("b", disk(8192).backend, true).unwrap();
    assert!(ex.geometry(b).read_only);
    assert_eq!(
        ex.acquire(b, AccessMode::ReadWrite),
        Err(AccessError::ReadOnlyExport { mode: "rw" })
    );
    assert!(ex.open_slot(a, 3).unwrap().is_some());
    assert_eq!(ex.remove("a"), Some(a));
    assert_eq!(ex.remove("a"), None);
    assert!(ex.is_closed(a));
    assert_eq!(ex.lookup(b"a"), None);
    assert_eq!(
        ex.acquire(a, AccessMode::ReadOnly),
        Err(AccessError::UnknownName)
    );
    assert!(ex.open_slot(a, 0).unwrap().is_none());
    assert_eq!(ex.iter().map(|(_, n)| n).collect::<Vec<_>>(), ["b"]);
    // Ids are not reused: the removed slot still counts.
    let err = ex.add("c", disk(4096).backend, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "export 'c': no room for more exports (2 were made)"
    );
    let cores = ex.open_core(1).unwrap();
    assert!(cores[0].is_none() && cores[1].is_some());
}

#[test]
fn a_grown_file_is_seen_at_the_next_open_and_served_to_its_new_end() {
    use rtrs_spdk::rnbd::backend::{BackendSpec, ExportSpec, FileOptions};
    let path = std::env::temp_dir().join(format!("rtrs-grow-{}.img", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(1 << 20).unwrap();
    let spec = ExportSpec {
        name: "f".into(),
        backend: BackendSpec::File {
            path: path.clone(),
            read_only: false,
        },
    };
    let ex = Arc::new(Exports::new(&[spec], &FileOptions::default()).unwrap());
    let mut d = Dispatcher::new(Arc::clone(&ex), 0).unwrap();
    let sess = RnbdServerSession::new("s", Arc::clone(&ex));
    let first = open_rsp(&mut d, &sess, b"f").unwrap();
    assert_eq!(first.nsectors, 2048);
    let (_mem, buf) = area(4096);
    // Beyond the first megabyte: refused while the file is 1 MiB.
    assert!(matches!(
        write_at(&mut d, &sess, first.device_id, 1, 3000, buf),
        Outcome::Done(Err(_))
    ));
    let g0 = ex.generation();
    file.set_len(2 << 20).unwrap();
    // The client opens again (its remap): same mapping, the new size.
    let again = open_rsp(&mut d, &sess, b"f").unwrap();
    assert_eq!((again.device_id, again.nsectors), (first.device_id, 4096));
    assert_eq!(ex.geometry(ex.lookup(b"f").unwrap()).size, 2 << 20);
    assert_ne!(ex.generation(), g0, "a new size moves the generation");
    // The core's instance, opened at the 1 MiB size, takes the new one.
    assert_eq!(
        write_at(&mut d, &sess, first.device_id, 2, 3000, buf),
        Outcome::Submitted
    );
    assert_eq!(reap(&mut d, 1), [BlockCompletion::new(2, Ok(()))]);
    // Unchanged: the generation stays.
    let g1 = ex.generation();
    open_rsp(&mut d, &sess, b"f").unwrap();
    assert_eq!(ex.generation(), g1);
    drop(file);
    let _ = std::fs::remove_file(&path);
}
