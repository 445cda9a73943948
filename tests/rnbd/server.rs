//! The RNBD server without a transport: exports with their access rules across
//! sessions, the per-session device table, and each core's dispatcher turning user
//! headers and data areas into replies and block IO (docs/PROTOCOL.md §7, §9.8).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::proto::rnbd::{
    AccessMode, Close, Io, Open, OpenRsp, RnbdFlags, RnbdOp, SessInfo, SessInfoRsp,
};
use rtrs_spdk::rnbd::backend::{BlockCompletion, ExportSpec, FileOptions, IoBuf};
use rtrs_spdk::rnbd::server::{
    Dir, Dispatcher, Exports, ExportsError, Outcome, Request, RnbdServerSession, SessionView,
};
use rtrs_spdk::Errno;

/// The wire's −EINVAL, as [`run`] reports it.
const EINVAL: i32 = -libc::EINVAL;

/// A chunk-like data area.
struct Area {
    mem: MemBuf,
}

impl Area {
    fn new(len: usize) -> Area {
        Area {
            mem: MemBuf::zeroed(len),
        }
    }

    /// The first `len` bytes as a request's data area.
    fn buf(&self, len: usize) -> IoBuf {
        assert!(len <= self.mem.len());
        // SAFETY: the area outlives every request of these tests, and the tests touch it
        // only between requests.
        unsafe { IoBuf::new(self.mem.as_ptr(), len) }
    }

    fn fill(&self, byte: u8) {
        let all = self.buf(self.mem.len());
        // SAFETY: no request is using the area now.
        unsafe { all.copy_in(0, &vec![byte; self.mem.len()]) }
    }

    fn bytes(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        // SAFETY: no request is using the area now.
        unsafe { self.buf(len).copy_out(0, &mut v) }
        v
    }
}

fn open_msg(name: &[u8], mode: AccessMode) -> [u8; Open::LEN] {
    let mut b = [0u8; Open::LEN];
    Open {
        access_mode: mode,
        dev_name: name,
    }
    .encode(&mut b)
    .unwrap();
    b
}

fn io_msg(device_id: u32, op: RnbdOp, flags: RnbdFlags, sector: u64, bi_size: u32) -> [u8; 32] {
    Io {
        device_id,
        sector,
        op,
        flags,
        bi_size,
        prio: 0,
    }
    .to_bytes()
}

fn req(usr: &[u8], dir: Dir, data: IoBuf) -> Request<'_> {
    Request {
        tag: 1,
        dir,
        usr,
        data,
        peer: None,
        paths: &[],
    }
}

/// Opens `name` in `mode` on `sess`: the errno and, on success, the reply.
fn open(
    d: &mut Dispatcher,
    sess: &RnbdServerSession,
    name: &[u8],
    mode: AccessMode,
) -> Result<OpenRsp, Errno> {
    let area = Area::new(4096);
    area.fill(0xee);
    let msg = open_msg(name, mode);
    match d.process(sess, req(&msg, Dir::Read, area.buf(OpenRsp::LEN))) {
        Outcome::Done(Ok(())) => {
            let b = area.bytes(OpenRsp::LEN);
            // Reserved bytes and obsolete_rotational are zeroed.
            assert!(b[44] == 0 && b[46..].iter().all(|&x| x == 0), "{b:?}");
            Ok(OpenRsp::decode(&b).unwrap())
        }
        Outcome::Done(Err(e)) => Err(e),
        Outcome::Submitted => panic!("OPEN must answer at once"),
    }
}

/// Runs one IO to completion (bounded wait) and returns its wire status (0 or a
/// negative errno).
fn run(d: &mut Dispatcher, sess: &RnbdServerSession, usr: &[u8], dir: Dir, data: IoBuf) -> i32 {
    match d.process(sess, req(usr, dir, data)) {
        Outcome::Done(r) => Errno::neg_of(r),
        Outcome::Submitted => wait_one(d),
    }
}

fn wait_one(d: &mut Dispatcher) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = [BlockCompletion::default(); 4];
    loop {
        let n = d.poll(&mut out);
        if n > 0 {
            assert_eq!(n, 1);
            assert_eq!(out[0].tag, 1);
            return Errno::neg_of(out[0].result);
        }
        assert!(Instant::now() < deadline, "IO did not complete");
        std::thread::yield_now();
    }
}

fn setup() -> (Arc<Exports>, Dispatcher, Dispatcher) {
    let ex = Arc::new(Exports::ram(&[("disk0", 1 << 20), ("disk1", 64 << 10)]).unwrap());
    let d0 = Dispatcher::new(ex.clone(), 0).unwrap();
    let d1 = Dispatcher::new(ex.clone(), 1).unwrap();
    (ex, d0, d1)
}

#[test]
fn sess_info_negotiates_and_checks_the_reply_space() {
    let (ex, mut d, _) = setup();
    let s = RnbdServerSession::new("c1", ex);
    let area = Area::new(64);
    area.fill(0xaa);
    let msg = SessInfo { ver: 5 }.to_bytes();
    assert_eq!(
        d.process(&s, req(&msg, Dir::Read, area.buf(36))),
        Outcome::Done(Ok(()))
    );
    let b = area.bytes(36);
    assert_eq!(SessInfoRsp::decode(&b), Ok(SessInfoRsp { ver: 2 }));
    assert!(b[5..].iter().all(|&x| x == 0));
    assert_eq!(s.ver(), 2);
    // Too little reply space, or a WRITE: refused, nothing written.
    area.fill(0xaa);
    assert_eq!(
        d.process(&s, req(&msg, Dir::Read, area.buf(35))),
        Outcome::Done(Err(Errno::EINVAL))
    );
    assert_eq!(
        d.process(&s, req(&msg, Dir::Write, area.buf(36))),
        Outcome::Done(Err(Errno::EINVAL))
    );
    assert!(area.bytes(64).iter().all(|&x| x == 0xaa));
    let old = SessInfo { ver: 1 }.to_bytes();
    assert_eq!(
        d.process(&s, req(&old, Dir::Read, area.buf(36))),
        Outcome::Done(Ok(()))
    );
    assert_eq!(s.ver(), 1);
}

#[test]
fn access_modes_across_sessions() {
    let (ex, mut d0, mut d1) = setup();
    let a = RnbdServerSession::new("a", ex.clone());
    let b = RnbdServerSession::new("b", ex.clone());
    let c = RnbdServerSession::new("c", ex.clone());
    let disk0 = ex.lookup(b"disk0").unwrap();

    assert_eq!(
        open(&mut d0, &a, b"disk0", AccessMode::ReadWrite)
            .unwrap()
            .device_id,
        0
    );
    assert_eq!(
        open(&mut d1, &b, b"disk0", AccessMode::ReadWrite),
        Err(Errno::EPERM)
    );
    // Read-only is always granted.
    assert_eq!(
        open(&mut d1, &b, b"disk0", AccessMode::ReadOnly)
            .unwrap()
            .device_id,
        0
    );
    assert_eq!(
        open(&mut d0, &c, b"disk0", AccessMode::ReadOnly)
            .unwrap()
            .device_id,
        0
    );
    // Migration allows a second writer, not a third.
    assert_eq!(
        open(&mut d0, &c, b"disk1", AccessMode::Migration)
            .unwrap()
            .device_id,
        1
    );
    let b2 = RnbdServerSession::new("b2", ex.clone());
    assert!(open(&mut d0, &b2, b"disk0", AccessMode::Migration).is_ok());
    assert_eq!(ex.writers(disk0), 2);
    let c2 = RnbdServerSession::new("c2", ex.clone());
    assert_eq!(
        open(&mut d1, &c2, b"disk0", AccessMode::Migration),
        Err(Errno::EPERM)
    );
    // An idempotent re-open returns the same answer without a new writer.
    let again = open(&mut d0, &a, b"disk0", AccessMode::ReadWrite).unwrap();
    assert_eq!(again.device_id, 0);
    assert_eq!(ex.writers(disk0), 2);

    // CLOSE of a writer frees a slot; CLOSE of an unknown id is still 0.
    let close = Close { device_id: 0 }.to_bytes();
    let none = Area::new(8);
    assert_eq!(
        d1.process(&a, req(&close, Dir::Write, none.buf(0))),
        Outcome::Done(Ok(()))
    );
    assert_eq!(
        d1.process(&a, req(&close, Dir::Write, none.buf(0))),
        Outcome::Done(Ok(()))
    );
    assert_eq!(ex.writers(disk0), 1);
    assert!(open(&mut d1, &c2, b"disk0", AccessMode::Migration).is_ok());
    // Ending a session drops its writers.
    b2.end();
    c2.end();
    assert_eq!(ex.writers(disk0), 0);
    assert!(open(&mut d0, &a, b"disk0", AccessMode::ReadWrite).is_ok());
    // Closing a read-only mapping does not touch the count.
    let close_b = Close { device_id: 0 }.to_bytes();
    assert_eq!(
        d0.process(&b, req(&close_b, Dir::Write, none.buf(0))),
        Outcome::Done(Ok(()))
    );
    assert_eq!(ex.writers(disk0), 1);
}

#[test]
fn open_errors() {
    let (ex, mut d, _) = setup();
    let s = RnbdServerSession::new("s", ex.clone());
    assert_eq!(
        open(&mut d, &s, b"nope", AccessMode::ReadOnly),
        Err(Errno::ENOENT)
    );
    assert_eq!(
        open(&mut d, &s, b"../disk0", AccessMode::ReadOnly),
        Err(Errno::EINVAL)
    );
    assert_eq!(
        open(&mut d, &s, b"disk0/..", AccessMode::ReadOnly),
        Err(Errno::EINVAL)
    );
    // A bad access mode byte.
    let mut msg = open_msg(b"disk0", AccessMode::ReadWrite);
    msg[4] = 3;
    let area = Area::new(64);
    assert_eq!(
        d.process(&s, req(&msg, Dir::Read, area.buf(56))),
        Outcome::Done(Err(Errno::EINVAL))
    );
    // dev_name without its NUL.
    let mut msg = open_msg(b"disk0", AccessMode::ReadWrite);
    msg[6..261].fill(b'x');
    assert_eq!(
        d.process(&s, req(&msg, Dir::Read, area.buf(56))),
        Outcome::Done(Err(Errno::EINVAL))
    );
    // Reply space too small: refused before anything is mapped.
    let msg = open_msg(b"disk0", AccessMode::ReadWrite);
    assert_eq!(
        d.process(&s, req(&msg, Dir::Read, area.buf(55))),
        Outcome::Done(Err(Errno::EINVAL))
    );
    assert_eq!(ex.writers(ex.lookup(b"disk0").unwrap()), 0);
    assert!(s.mappings().is_empty());
    // A truncated OPEN header.
    assert_eq!(
        d.process(&s, req(&msg[..263], Dir::Read, area.buf(56))),
        Outcome::Done(Err(Errno::EINVAL))
    );
    // Unknown and reply message types, and junk.
    for usr in [&[9u8, 0, 0, 0][..], &[1, 0, 0, 0], &[3, 0], &[]] {
        assert_eq!(
            d.process(&s, req(usr, Dir::Read, area.buf(56))),
            Outcome::Done(Err(Errno::EINVAL))
        );
    }
}

#[test]
fn io_across_cores_on_one_ram_disk() {
    let (ex, mut d0, mut d1) = setup();
    let s = RnbdServerSession::new("s", ex.clone());
    let id = open(&mut d0, &s, b"disk0", AccessMode::ReadWrite)
        .unwrap()
        .device_id;
    let wbuf = Area::new(8192);
    wbuf.fill(0x5a);
    let w = io_msg(
        id,
        RnbdOp::Write,
        RnbdFlags::FUA | RnbdFlags::SYNC,
        16,
        8192,
    );
    assert_eq!(run(&mut d0, &s, &w, Dir::Write, wbuf.buf(8192)), 0);
    // Core 1's instance sees core 0's write.
    let rbuf = Area::new(8192);
    let r = io_msg(id, RnbdOp::Read, RnbdFlags::NONE, 16, 8192);
    assert_eq!(run(&mut d1, &s, &r, Dir::Read, rbuf.buf(8192)), 0);
    assert!(rbuf.bytes(8192).iter().all(|&x| x == 0x5a));

    // Discard and write-zeroes take their size from the message.
    let z = io_msg(id, RnbdOp::WriteZeroes, RnbdFlags::NOUNMAP, 16, 1024);
    assert_eq!(run(&mut d1, &s, &z, Dir::Write, rbuf.buf(0)), 0);
    let dsc = io_msg(id, RnbdOp::Discard, RnbdFlags::NONE, 24, 512);
    assert_eq!(run(&mut d0, &s, &dsc, Dir::Write, rbuf.buf(0)), 0);
    assert_eq!(run(&mut d0, &s, &r, Dir::Read, rbuf.buf(8192)), 0);
    let got = rbuf.bytes(8192);
    assert!(got[..1024].iter().all(|&x| x == 0));
    assert!(got[1024..4096].iter().all(|&x| x == 0x5a));
    assert!(got[4096..4608].iter().all(|&x| x == 0));
    assert!(got[4608..].iter().all(|&x| x == 0x5a));

    // Flush: an RTRS READ with no data.
    let f = io_msg(
        id,
        RnbdOp::Flush,
        RnbdFlags::FUA | RnbdFlags::PREFLUSH,
        0,
        0,
    );
    assert_eq!(run(&mut d1, &s, &f, Dir::Read, rbuf.buf(0)), 0);
    // A 24-byte (pre-prio) IO header is accepted.
    assert_eq!(run(&mut d1, &s, &r[..24], Dir::Read, rbuf.buf(8192)), 0);
    assert_eq!(d0.in_flight() + d1.in_flight(), 0);
}

/// As [`run`], through a core's own copy of the session's devices.
fn run_view(d: &mut Dispatcher, v: &mut SessionView, usr: &[u8], dir: Dir, data: IoBuf) -> i32 {
    match d.process_view(v, req(usr, dir, data)) {
        Outcome::Done(r) => Errno::neg_of(r),
        Outcome::Submitted => wait_one(d),
    }
}

#[test]
fn each_core_sees_open_and_close_of_another() {
    let (ex, mut d0, mut d1) = setup();
    let s = Arc::new(RnbdServerSession::new("s", ex.clone()));
    let mut v0 = SessionView::new(Arc::clone(&s));
    let mut v1 = SessionView::new(Arc::clone(&s));
    let buf = Area::new(4096);
    // Core 1 took its copy before the OPEN on core 0: the IO still finds the device.
    let area = Area::new(4096);
    let msg = open_msg(b"disk0", AccessMode::ReadWrite);
    assert_eq!(
        d0.process_view(&mut v0, req(&msg, Dir::Read, area.buf(OpenRsp::LEN))),
        Outcome::Done(Ok(()))
    );
    let id = OpenRsp::decode(&area.bytes(OpenRsp::LEN))
        .unwrap()
        .device_id;
    let r = io_msg(id, RnbdOp::Read, RnbdFlags::NONE, 0, 4096);
    assert_eq!(run_view(&mut d1, &mut v1, &r, Dir::Read, buf.buf(4096)), 0);
    // CLOSE on core 0: core 1's next IO on that id is refused as unconnected.
    let close = Close { device_id: id }.to_bytes();
    assert_eq!(
        run_view(&mut d0, &mut v0, &close, Dir::Write, buf.buf(0)),
        0
    );
    assert_eq!(
        run_view(&mut d1, &mut v1, &r, Dir::Read, buf.buf(4096)),
        -libc::ENOTCONN
    );
    assert_eq!(
        run_view(&mut d0, &mut v0, &r, Dir::Read, buf.buf(4096)),
        -libc::ENOTCONN
    );
    // The id comes back for another export; core 1 follows it (a read-only mapping
    // refuses a write, so the new mapping is the one used).
    let id2 = open(&mut d0, &s, b"disk1", AccessMode::ReadOnly)
        .unwrap()
        .device_id;
    assert_eq!(id2, id);
    let w = io_msg(id, RnbdOp::Write, RnbdFlags::NONE, 0, 4096);
    assert_eq!(
        run_view(&mut d1, &mut v1, &w, Dir::Write, buf.buf(4096)),
        -libc::EROFS
    );
    // The session's end closes everything for every core.
    s.end();
    assert_eq!(
        run_view(&mut d1, &mut v1, &r, Dir::Read, buf.buf(4096)),
        -libc::ENOTCONN
    );
    assert_eq!(d0.in_flight() + d1.in_flight(), 0);
}

#[test]
fn io_errors() {
    let (ex, mut d, _) = setup();
    let s = RnbdServerSession::new("s", ex.clone());
    let id = open(&mut d, &s, b"disk1", AccessMode::ReadWrite)
        .unwrap()
        .device_id;
    let ro = open(&mut d, &s, b"disk0", AccessMode::ReadOnly)
        .unwrap()
        .device_id;
    let buf = Area::new(8192);
    let read = |dev, sector, len| io_msg(dev, RnbdOp::Read, RnbdFlags::NONE, sector, len);
    // Unknown device id.
    assert_eq!(
        run(&mut d, &s, &read(7, 0, 512), Dir::Read, buf.buf(512)),
        -libc::ENOTCONN
    );
    // datalen present but not bi_size.
    assert_eq!(
        run(&mut d, &s, &read(id, 0, 1024), Dir::Read, buf.buf(512)),
        EINVAL
    );
    // A read without reply space; a write sent as an RTRS READ.
    assert_eq!(
        run(&mut d, &s, &read(id, 0, 512), Dir::Read, buf.buf(0)),
        EINVAL
    );
    let w = io_msg(id, RnbdOp::Write, RnbdFlags::NONE, 0, 512);
    assert_eq!(run(&mut d, &s, &w, Dir::Read, buf.buf(512)), EINVAL);
    // Past the end (64 KiB = 128 sectors), and a sector whose byte offset overflows.
    assert_eq!(
        run(&mut d, &s, &read(id, 127, 1024), Dir::Read, buf.buf(1024)),
        -libc::EIO
    );
    assert_eq!(
        run(
            &mut d,
            &s,
            &read(id, u64::MAX / 4, 512),
            Dir::Read,
            buf.buf(512)
        ),
        -libc::EIO
    );
    let dsc = io_msg(id, RnbdOp::Discard, RnbdFlags::NONE, 120, 8192);
    assert_eq!(run(&mut d, &s, &dsc, Dir::Write, buf.buf(0)), -libc::EIO);
    // Not a multiple of the block size.
    assert_eq!(
        run(&mut d, &s, &read(id, 0, 100), Dir::Read, buf.buf(100)),
        EINVAL
    );
    // Secure erase is not offered by RAM disks.
    let se = io_msg(id, RnbdOp::SecureErase, RnbdFlags::NONE, 0, 512);
    assert_eq!(
        run(&mut d, &s, &se, Dir::Write, buf.buf(0)),
        -libc::EOPNOTSUPP
    );
    // A read-only mapping refuses writes.
    let w = io_msg(ro, RnbdOp::Write, RnbdFlags::NONE, 0, 512);
    assert_eq!(run(&mut d, &s, &w, Dir::Write, buf.buf(512)), -libc::EROFS);
    let z = io_msg(ro, RnbdOp::WriteZeroes, RnbdFlags::NONE, 0, 512);
    assert_eq!(run(&mut d, &s, &z, Dir::Write, buf.buf(0)), -libc::EROFS);
    // An unknown op code.
    let mut bad = read(id, 0, 512);
    bad[16] = 6;
    assert_eq!(run(&mut d, &s, &bad, Dir::Read, buf.buf(512)), EINVAL);
    // After CLOSE the id is unknown.
    let close = Close { device_id: id }.to_bytes();
    assert_eq!(run(&mut d, &s, &close, Dir::Write, buf.buf(0)), 0);
    assert_eq!(
        run(&mut d, &s, &read(id, 0, 512), Dir::Read, buf.buf(512)),
        -libc::ENOTCONN
    );
}

#[test]
fn a_busy_backend_queues_and_everything_completes() {
    let (ex, mut d, _) = setup();
    let s = RnbdServerSession::new("s", ex.clone());
    let id = open(&mut d, &s, b"disk0", AccessMode::ReadWrite)
        .unwrap()
        .device_id;
    // More IOs than the RAM disk's queue depth (128), without polling in between.
    const N: usize = 300;
    let area = Area::new(N * 512);
    let all = area.buf(N * 512);
    for i in 0..N {
        // SAFETY: nothing uses the area before the writes are submitted.
        unsafe { all.copy_in(i * 512, &[i as u8; 512]) };
    }
    let msgs: Vec<[u8; 32]> = (0..N)
        .map(|i| io_msg(id, RnbdOp::Write, RnbdFlags::NONE, i as u64, 512))
        .collect();
    for (i, m) in msgs.iter().enumerate() {
        // SAFETY: each request owns its own 512 bytes of the area until it completes.
        let data = unsafe { IoBuf::new(all.as_ptr().add(i * 512), 512) };
        let r = Request {
            tag: i as u64,
            dir: Dir::Write,
            usr: m,
            data,
            peer: None,
            paths: &[],
        };
        assert_eq!(d.process(&s, r), Outcome::Submitted);
    }
    let mut seen = vec![false; N];
    let mut out = [BlockCompletion::default(); 32];
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.iter().any(|s| !s) {
        let n = d.poll(&mut out);
        for c in &out[..n] {
            assert_eq!(c.result, Ok(()));
            assert!(
                !std::mem::replace(&mut seen[c.tag as usize], true),
                "tag {} twice",
                c.tag
            );
        }
        assert!(Instant::now() < deadline);
    }
    assert_eq!(d.in_flight(), 0);
    let back = Area::new(N * 512);
    let r = io_msg(id, RnbdOp::Read, RnbdFlags::NONE, 0, (N * 512) as u32);
    assert_eq!(run(&mut d, &s, &r, Dir::Read, back.buf(N * 512)), 0);
    let got = back.bytes(N * 512);
    for i in 0..N {
        assert!(
            got[i * 512..(i + 1) * 512].iter().all(|&x| x == i as u8),
            "block {i}"
        );
    }
}

struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(tag: &str, len: u64) -> TempFile {
        let path = std::env::temp_dir().join(format!("rnbd-test-{}-{tag}", std::process::id()));
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(len).unwrap();
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn file_exports_open_per_core() {
    let rw = TempFile::new("rw", 1 << 20);
    let ro = TempFile::new("ro", 1 << 20);
    let specs = [
        ExportSpec::parse(&format!("f=file:{}", rw.0.display())).unwrap(),
        ExportSpec::parse(&format!("r=file:{}:ro", ro.0.display())).unwrap(),
    ];
    let ex = Arc::new(Exports::new(&specs, &FileOptions::default()).unwrap());
    let mut d0 = Dispatcher::new(ex.clone(), 0).unwrap();
    let mut d1 = Dispatcher::new(ex.clone(), 1).unwrap();
    let s = RnbdServerSession::new("s", ex.clone());
    let id = open(&mut d0, &s, b"f", AccessMode::ReadWrite)
        .unwrap()
        .device_id;
    // Write-mode open of a read-only export: EACCES; read-only works.
    assert_eq!(
        open(&mut d0, &s, b"r", AccessMode::ReadWrite),
        Err(Errno::EACCES)
    );
    assert_eq!(
        open(&mut d0, &s, b"r", AccessMode::Migration),
        Err(Errno::EACCES)
    );
    assert!(open(&mut d1, &s, b"r", AccessMode::ReadOnly).is_ok());

    let w = Area::new(4096);
    w.fill(0xc3);
    let wm = io_msg(
        id,
        RnbdOp::Write,
        RnbdFlags::FUA | RnbdFlags::PREFLUSH,
        8,
        4096,
    );
    assert_eq!(run(&mut d0, &s, &wm, Dir::Write, w.buf(4096)), 0);
    let r = Area::new(4096);
    let rm = io_msg(id, RnbdOp::Read, RnbdFlags::NONE, 8, 4096);
    assert_eq!(run(&mut d1, &s, &rm, Dir::Read, r.buf(4096)), 0);
    assert!(r.bytes(4096).iter().all(|&x| x == 0xc3));
    let f = io_msg(
        id,
        RnbdOp::Flush,
        RnbdFlags::FUA | RnbdFlags::PREFLUSH,
        0,
        0,
    );
    assert_eq!(run(&mut d1, &s, &f, Dir::Read, r.buf(0)), 0);
    let z = io_msg(id, RnbdOp::WriteZeroes, RnbdFlags::NONE, 8, 4096);
    assert_eq!(run(&mut d0, &s, &z, Dir::Write, r.buf(0)), 0);
    assert_eq!(run(&mut d1, &s, &rm, Dir::Read, r.buf(4096)), 0);
    assert!(r.bytes(4096).iter().all(|&x| x == 0));

    // A missing file is reported with its export name.
    let missing = ExportSpec::parse("m=file:/nonexistent/rnbd-test").unwrap();
    let err = Exports::new(&[missing], &FileOptions::default()).unwrap_err();
    assert!(matches!(err, ExportsError::Open { .. }));
    assert!(
        err.to_string()
            .starts_with("export 'm': open /nonexistent/rnbd-test"),
        "{err}"
    );
}
