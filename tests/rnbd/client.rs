//! The RNBD client device state machine, alone and paired with the server's dispatcher
//! through a direct in-process "transport" (the data area is the client's buffer, as
//! RTRS would copy it): open rules across sessions, data, flush/discard/write-zeroes,
//! close, disconnect and re-open adopting a new device id.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::proto::rnbd::{AccessMode, CachePolicy, Io, OpenRsp, RnbdFlags, RnbdOp};
use rtrs_spdk::rnbd::backend::{BlockCompletion, IoBuf};
use rtrs_spdk::rnbd::client::{
    msg, sess_info_done, BlockRequest, DevState, DeviceError, RnbdDevice, WriteZeroesMode,
};
use rtrs_spdk::rnbd::server::{Dispatcher, Exports, Outcome, Request, RnbdServerSession};
use rtrs_spdk::rnbd::Dir;
use rtrs_spdk::Errno;

/// One client session talking to one server core without RTRS in between.
struct Link {
    disp: Dispatcher,
    sess: RnbdServerSession,
    mem: MemBuf,
}

impl Link {
    fn new(ex: &Arc<Exports>, name: &str, core: usize) -> Link {
        Link {
            disp: Dispatcher::new(ex.clone(), core).unwrap(),
            sess: RnbdServerSession::new(name, ex.clone()),
            mem: MemBuf::zeroed(1 << 20),
        }
    }

    /// Sends `usr` with `len` bytes of the link's buffer as data area (holding `data`
    /// first for a WRITE); returns the errno and the area's bytes afterwards.
    fn send(&mut self, usr: &[u8], dir: Dir, len: usize, data: &[u8]) -> (i32, Vec<u8>) {
        // SAFETY: the link's buffer is used by one request at a time, here.
        let area = unsafe { IoBuf::new(self.mem.as_ptr(), len) };
        // SAFETY: as above; no request is in flight.
        unsafe { area.copy_in(0, data) };
        let req = Request {
            tag: 9,
            dir,
            usr,
            data: area,
            peer: None,
            paths: &[],
        };
        let errno = match self.disp.process(&self.sess, req) {
            Outcome::Done(r) => Errno::neg_of(r),
            Outcome::Submitted => {
                let mut out = [BlockCompletion::default(); 1];
                let deadline = Instant::now() + Duration::from_secs(20);
                while self.disp.poll(&mut out) == 0 {
                    assert!(Instant::now() < deadline, "IO did not complete");
                }
                assert_eq!(out[0].tag, 9);
                Errno::neg_of(out[0].result)
            }
        };
        let mut back = vec![0; len];
        // SAFETY: the request is finished.
        unsafe { area.copy_out(0, &mut back) };
        (errno, back)
    }

    fn handshake(&mut self) -> u8 {
        let (e, reply) = self.send(&msg::sess_info(), Dir::Read, 36, &[]);
        sess_info_done(Errno::result_from_neg(e), &reply).unwrap()
    }

    fn open(&mut self, dev: &mut RnbdDevice) -> Result<u32, DeviceError> {
        let (e, reply) = self.send(&dev.open_msg(), Dir::Read, OpenRsp::LEN, &[]);
        dev.open_done(Errno::result_from_neg(e), &reply)
            .map(|i| i.device_id)
    }

    /// Runs a block request; `data` is the payload of a write, the result the bytes of
    /// a read.
    fn io(&mut self, dev: &RnbdDevice, req: BlockRequest, data: &[u8]) -> Result<Vec<u8>, i32> {
        let (msg, dir) = dev.io_msg(&req).map_err(|e| e.errno().neg())?;
        assert_eq!(dir, req.dir());
        let (e, back) = self.send(&msg.to_bytes(), dir, req.data_len() as usize, data);
        if e == 0 {
            Ok(back)
        } else {
            Err(e)
        }
    }

    fn close(&mut self, dev: &mut RnbdDevice) {
        if let Some(c) = dev.close() {
            assert_eq!(self.send(&c, Dir::Write, 0, &[]).0, 0);
        }
    }
}

const MAX_IO: u32 = 128 << 10;

#[test]
fn open_modes_across_two_sessions() {
    let ex = Arc::new(Exports::ram(&[("vol", 1 << 20)]).unwrap());
    let mut a = Link::new(&ex, "a", 0);
    let mut b = Link::new(&ex, "b", 1);
    assert_eq!(a.handshake(), 2);
    assert_eq!(b.handshake(), 2);

    let mut a_rw = RnbdDevice::new("vol", AccessMode::ReadWrite, MAX_IO).unwrap();
    assert_eq!(a.open(&mut a_rw), Ok(0));
    assert_eq!(a_rw.state(), DevState::Mapped);
    let mut b_rw = RnbdDevice::new("vol", AccessMode::ReadWrite, MAX_IO).unwrap();
    let err = b.open(&mut b_rw).unwrap_err();
    assert_eq!(err.errno().neg(), -libc::EPERM);
    assert_eq!(
        err.to_string(),
        "server refused open of device 'vol': -EPERM (access mode refused: the export has its writers)"
    );
    assert_eq!(b_rw.state(), DevState::Init);
    let mut b_mig = RnbdDevice::new("vol", AccessMode::Migration, MAX_IO).unwrap();
    // Re-opening by the same name in session b would return the same mapping, so use a
    // third session for the migration writer.
    let mut c = Link::new(&ex, "c", 1);
    assert_eq!(c.open(&mut b_mig), Ok(0));
    let mut c_ro = RnbdDevice::new("vol", AccessMode::ReadOnly, MAX_IO).unwrap();
    assert!(b.open(&mut c_ro).is_ok());

    // Both writers write; the reader sees the last write.
    a.io(&a_rw, BlockRequest::write(0, 4096), &[1; 4096])
        .unwrap();
    c.io(&b_mig, BlockRequest::write(4096, 4096).fua(), &[2; 4096])
        .unwrap();
    let got = b.io(&c_ro, BlockRequest::read(0, 8192), &[]).unwrap();
    assert!(got[..4096].iter().all(|&x| x == 1) && got[4096..].iter().all(|&x| x == 2));
    // The read-only device refuses writes locally.
    let e = c_ro.io_msg(&BlockRequest::write(0, 512)).unwrap_err();
    assert_eq!(e.errno().neg(), -libc::EROFS);

    // Unknown device name.
    let mut missing = RnbdDevice::new("nope", AccessMode::ReadOnly, MAX_IO).unwrap();
    assert_eq!(
        a.open(&mut missing).unwrap_err().errno().neg(),
        -libc::ENOENT
    );

    // Closing the RW mapping lets session b's writer in.
    a.close(&mut a_rw);
    assert_eq!(a_rw.state(), DevState::Unmapped);
    assert!(a_rw.io_msg(&BlockRequest::read(0, 512)).is_err());
    let mut b_rw2 = RnbdDevice::new("vol", AccessMode::ReadWrite, MAX_IO).unwrap();
    let mut d = Link::new(&ex, "d", 0);
    assert_eq!(d.open(&mut b_rw2).unwrap_err().errno().neg(), -libc::EPERM); // c still writes
    c.close(&mut b_mig);
    assert_eq!(d.open(&mut b_rw2), Ok(0));
}

#[test]
fn data_flush_discard_write_zeroes() {
    let ex = Arc::new(Exports::ram(&[("vol", 4 << 20)]).unwrap());
    let mut l = Link::new(&ex, "s", 0);
    l.handshake();
    // Op 5 as a 6.8+ server (or ours) takes it; the default sends writes instead.
    let mut dev = RnbdDevice::new("vol", AccessMode::ReadWrite, MAX_IO)
        .unwrap()
        .with_write_zeroes(WriteZeroesMode::Native);
    l.open(&mut dev).unwrap();
    let info = *dev.info().unwrap();
    assert_eq!(info.size, 4 << 20);
    assert_eq!(info.logical_block_size, 512);
    assert_eq!(info.max_io_size, MAX_IO);

    // Sizes 512 B .. max_io_size at varied offsets, each verified.
    let mut size = 512u32;
    let mut offset = 0u64;
    while size <= MAX_IO {
        let pattern: Vec<u8> = (0..size)
            .map(|i| (i as u64 * 7 + offset / 512) as u8)
            .collect();
        l.io(&dev, BlockRequest::write(offset, size).sync(), &pattern)
            .unwrap();
        assert_eq!(
            l.io(&dev, BlockRequest::read(offset, size), &[]).unwrap(),
            pattern
        );
        offset += u64::from(size) + 512;
        size *= 2;
    }
    l.io(&dev, BlockRequest::flush(), &[]).unwrap();
    l.io(
        &dev,
        BlockRequest::write(0, 4096).preflush().fua(),
        &[0xff; 4096],
    )
    .unwrap();
    l.io(&dev, BlockRequest::discard(1024, 1024), &[]).unwrap();
    l.io(&dev, BlockRequest::write_zeroes(3072, 512).nounmap(), &[])
        .unwrap();
    let got = l.io(&dev, BlockRequest::read(0, 4096), &[]).unwrap();
    let mut want = vec![0xff; 4096];
    want[1024..2048].fill(0);
    want[3072..3584].fill(0);
    assert_eq!(got, want);

    // Local checks mirror the server's limits.
    let bad = |r: BlockRequest| dev.io_msg(&r).unwrap_err().errno().neg();
    assert_eq!(bad(BlockRequest::read(100, 512)), -libc::EINVAL);
    assert_eq!(bad(BlockRequest::read(4 << 20, 512)), -libc::EIO);
    assert_eq!(bad(BlockRequest::read(0, MAX_IO + 512)), -libc::EINVAL);
    assert_eq!(bad(BlockRequest::read(0, 0)), -libc::EINVAL);
    assert_eq!(bad(BlockRequest::secure_erase(0, 512)), -libc::EOPNOTSUPP);
    // The header the device builds is what the server decodes.
    let (msg, dir) = dev
        .io_msg(&BlockRequest::write_zeroes(4096, 8192).nounmap().fua())
        .unwrap();
    assert_eq!(dir, Dir::Write);
    let usr = msg.to_bytes();
    let io = Io::decode(&usr).unwrap();
    assert_eq!(
        (io.op, io.sector, io.bi_size),
        (RnbdOp::WriteZeroes, 8, 8192)
    );
    assert_eq!(io.flags, RnbdFlags::NOUNMAP | RnbdFlags::FUA);
    assert!(usr[26..].iter().all(|&b| b == 0));
    // A device in the default mode has no op-5 message (its client sends writes).
    // (The server answers a second OPEN of a name with the session's mapping.)
    let mut emu = RnbdDevice::new("vol", AccessMode::ReadWrite, MAX_IO).unwrap();
    assert_eq!(emu.write_zeroes(), WriteZeroesMode::Emulate);
    l.open(&mut emu).unwrap();
    let e = emu.io_msg(&BlockRequest::write_zeroes(0, 512)).unwrap_err();
    assert!(matches!(e, DeviceError::Emulated { .. }), "{e}");
    assert!(emu.io_msg(&BlockRequest::write(0, 512)).is_ok());
}

#[test]
fn reconnect_reopens_and_adopts_the_new_device_id() {
    let ex = Arc::new(Exports::ram(&[("x", 1 << 20), ("y", 2 << 20)]).unwrap());
    let mut l = Link::new(&ex, "s", 0);
    l.handshake();
    let mut x = RnbdDevice::new("x", AccessMode::ReadWrite, MAX_IO).unwrap();
    let mut y = RnbdDevice::new("y", AccessMode::ReadWrite, MAX_IO).unwrap();
    assert_eq!(l.open(&mut x), Ok(0));
    assert_eq!(l.open(&mut y), Ok(1));
    l.io(&y, BlockRequest::write(0, 512), &[7; 512]).unwrap();

    // The session loses its last path: the server session ends, the devices wait.
    l.sess.end();
    x.link_down();
    y.link_down();
    assert_eq!(y.state(), DevState::MappedDisconnected);
    assert!(y.needs_reopen());
    assert_eq!(y.device_id(), None);
    assert_eq!(
        y.io_msg(&BlockRequest::read(0, 512))
            .unwrap_err()
            .errno()
            .neg(),
        -libc::ENOTCONN
    );
    assert_eq!(y.info().unwrap().device_id, 1);
    // The writers were released with the old session.
    assert_eq!(ex.writers(ex.lookup(b"y").unwrap()), 0);

    // Reconnected: a new server session; re-open in another order, so ids change.
    l.sess = RnbdServerSession::new("s", ex.clone());
    l.handshake();
    assert_eq!(l.open(&mut y), Ok(0));
    assert_eq!(l.open(&mut x), Ok(1));
    assert_eq!(y.device_id(), Some(0));
    assert_eq!(
        l.io(&y, BlockRequest::read(0, 512), &[]).unwrap(),
        vec![7; 512]
    );
    // Closing while disconnected sends nothing (the server forgot the id).
    x.link_down();
    assert_eq!(x.close(), None);
    assert_eq!(x.state(), DevState::Unmapped);
    assert!(x.open_done(Ok(()), &[0; 56]).is_err());
}

#[test]
fn open_rsp_validation() {
    let mut dev = RnbdDevice::new("d", AccessMode::ReadWrite, MAX_IO).unwrap();
    let good = OpenRsp {
        device_id: 4,
        nsectors: 8,
        logical_block_size: 4096,
        physical_block_size: 4096,
        cache_policy: CachePolicy {
            fua: true,
            writeback: true,
        },
        ..OpenRsp::default()
    };
    let mut b = [0u8; 56];
    good.encode(&mut b).unwrap();
    // Stale reserved bytes (servers before the fix) are ignored.
    b[44] = 1;
    b[46..].fill(0xee);
    let info = *dev.open_done(Ok(()), &b).unwrap();
    assert_eq!(
        (info.device_id, info.size, info.max_io_size),
        (4, 4096, MAX_IO)
    );
    assert!(info.write_cache && info.fua);
    assert_eq!(info.max_discard, 0);
    assert_eq!(
        dev.io_msg(&BlockRequest::discard(0, 4096))
            .unwrap_err()
            .errno()
            .neg(),
        -libc::EOPNOTSUPP
    );

    // Bad block sizes: refused, with the id to CLOSE.
    let mut dev = RnbdDevice::new("d", AccessMode::ReadOnly, MAX_IO).unwrap();
    for (lbs, pbs) in [(0u16, 4096u16), (1000, 4096), (4096, 512), (256, 512)] {
        let mut t = b;
        t[36..38].copy_from_slice(&pbs.to_le_bytes());
        t[38..40].copy_from_slice(&lbs.to_le_bytes());
        match dev.open_done(Ok(()), &t) {
            Err(DeviceError::BadReply { device_id, .. }) => assert_eq!(device_id, Some(4)),
            other => panic!("lbs {lbs} pbs {pbs}: {other:?}"),
        }
        assert_eq!(dev.state(), DevState::Init);
    }
    // Short or mistyped replies.
    assert!(matches!(
        dev.open_done(Ok(()), &b[..55]),
        Err(DeviceError::BadReply {
            device_id: None,
            ..
        })
    ));
    let mut t = b;
    t[0] = 1;
    assert!(dev.open_done(Ok(()), &t).is_err());
    assert!(sess_info_done(Ok(()), &[0; 36]).is_err());
    assert_eq!(
        sess_info_done(Err(Errno::EIO), &[0; 36])
            .unwrap_err()
            .errno()
            .neg(),
        -libc::EIO
    );

    // Names OPEN cannot carry.
    assert!(RnbdDevice::new("", AccessMode::ReadOnly, MAX_IO).is_err());
    assert!(RnbdDevice::new(&"n".repeat(255), AccessMode::ReadOnly, MAX_IO).is_err());
    assert!(RnbdDevice::new("a\0b", AccessMode::ReadOnly, MAX_IO).is_err());
    let long = RnbdDevice::new(&"n".repeat(254), AccessMode::Migration, MAX_IO).unwrap();
    let m = long.open_msg();
    assert_eq!((m[0], m[4], m[259], m[260]), (2, 2, b'n', 0));
}
