//! RNBD op 5 at the server, for clients of every kernel version: with one logical block
//! of data it is a pre-5.18 client's WRITE_SAME (the block repeated over the range,
//! read back), without data a 6.8+ client's WRITE_ZEROES; data of another length, or
//! data sent as an RTRS READ, is refused with −EINVAL and changes nothing. Run on a RAM
//! export and a file export (io_uring or threads, whichever the machine allows).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rtrs_spdk::fabric::mem::MemBuf;
use rtrs_spdk::proto::rnbd::{AccessMode, Io, Open, OpenRsp, RnbdFlags, RnbdOp};
use rtrs_spdk::rnbd::backend::{BlockCompletion, ExportSpec, FileOptions, IoBuf};
use rtrs_spdk::rnbd::server::{Dir, Dispatcher, Exports, Outcome, Request, RnbdServerSession};
use rtrs_spdk::Errno;

const SIZE: usize = 1 << 20;
const BS: usize = 512;

/// A chunk-like data area.
struct Area(MemBuf);

impl Area {
    fn new(len: usize) -> Area {
        Area(MemBuf::zeroed(len))
    }

    fn buf(&self, len: usize) -> IoBuf {
        assert!(len <= self.0.len());
        // SAFETY: the area outlives every request of these tests, which touch it only
        // between requests.
        unsafe { IoBuf::new(self.0.as_ptr(), len) }
    }

    fn put(&self, data: &[u8]) {
        // SAFETY: no request is using the area now.
        unsafe { self.buf(data.len()).copy_in(0, data) }
    }

    fn bytes(&self, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        // SAFETY: no request is using the area now.
        unsafe { self.buf(len).copy_out(0, &mut v) }
        v
    }
}

fn io_msg(device_id: u32, op: RnbdOp, sector: u64, bi_size: u32) -> [u8; 32] {
    Io {
        device_id,
        sector,
        op,
        flags: RnbdFlags::SYNC,
        bi_size,
        prio: 0,
    }
    .to_bytes()
}

/// Runs one request to its end (bounded wait) and returns its wire status (0 or a
/// negative errno).
fn run(d: &mut Dispatcher, s: &RnbdServerSession, usr: &[u8], dir: Dir, data: IoBuf) -> i32 {
    let req = Request {
        tag: 1,
        dir,
        usr,
        data,
        peer: None,
        paths: &[],
    };
    match d.process(s, req) {
        Outcome::Done(r) => return Errno::neg_of(r),
        Outcome::Submitted => {}
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut out = [BlockCompletion::default(); 4];
    loop {
        let n = d.poll(&mut out);
        if n > 0 {
            assert_eq!((n, out[0].tag), (1, 1));
            return Errno::neg_of(out[0].result);
        }
        assert!(Instant::now() < deadline, "IO did not complete");
        std::thread::yield_now();
    }
}

fn open(d: &mut Dispatcher, s: &RnbdServerSession) -> u32 {
    let mut msg = [0u8; Open::LEN];
    Open {
        access_mode: AccessMode::ReadWrite,
        dev_name: b"vol",
    }
    .encode(&mut msg)
    .unwrap();
    let area = Area::new(64);
    assert_eq!(
        d.process(
            s,
            Request {
                tag: 1,
                dir: Dir::Read,
                usr: &msg,
                data: area.buf(OpenRsp::LEN),
                peer: None,
                paths: &[],
            }
        ),
        Outcome::Done(Ok(()))
    );
    let rsp = OpenRsp::decode(&area.bytes(OpenRsp::LEN)).unwrap();
    // Byte 20 (max_write_same_sectors before 5.18, max_write_zeroes_sectors since 6.8)
    // announces op 5 either way.
    assert!(rsp.max_write_zeroes_sectors > 0);
    rsp.device_id
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn op5_both_meanings(ex: Exports) {
    let ex = Arc::new(ex);
    let mut d = Dispatcher::new(ex.clone(), 0).unwrap();
    let s = RnbdServerSession::new("s", ex);
    let id = open(&mut d, &s);
    let data = Area::new(SIZE);
    let mut model = pattern(1, SIZE);
    data.put(&model);
    let w = io_msg(id, RnbdOp::Write, 0, SIZE as u32);
    assert_eq!(run(&mut d, &s, &w, Dir::Write, data.buf(SIZE)), 0);

    // WRITE_SAME: one block of data, 300 blocks of range from sector 8.
    let block = pattern(7, BS);
    let one = Area::new(BS);
    one.put(&block);
    let ws = io_msg(id, RnbdOp::WriteZeroes, 8, (300 * BS) as u32);
    assert_eq!(run(&mut d, &s, &ws, Dir::Write, one.buf(BS)), 0);
    for k in 0..300 {
        model[(8 + k) * BS..(9 + k) * BS].copy_from_slice(&block);
    }

    // WRITE_ZEROES: no data, 16 blocks from sector 400.
    let wz = io_msg(id, RnbdOp::WriteZeroes, 400, (16 * BS) as u32);
    assert_eq!(run(&mut d, &s, &wz, Dir::Write, one.buf(0)), 0);
    model[400 * BS..416 * BS].fill(0);

    // Refused, nothing written: two blocks of data, half a block, the whole range's
    // worth of data (what the server used to take as a plain write), and data that
    // came as an RTRS READ.
    let big = Area::new(4 * BS);
    big.put(&[0xee; 4 * BS]);
    let ws4 = io_msg(id, RnbdOp::WriteZeroes, 600, (4 * BS) as u32);
    for len in [2 * BS, BS / 2, 4 * BS] {
        assert_eq!(
            run(&mut d, &s, &ws4, Dir::Write, big.buf(len)),
            -libc::EINVAL,
            "{len} bytes of data"
        );
    }
    assert_eq!(run(&mut d, &s, &ws4, Dir::Read, one.buf(BS)), -libc::EINVAL);
    // A range that is not a whole number of blocks.
    let odd = io_msg(id, RnbdOp::WriteZeroes, 600, (4 * BS + 100) as u32);
    assert_eq!(
        run(&mut d, &s, &odd, Dir::Write, one.buf(BS)),
        -libc::EINVAL
    );

    let back = Area::new(SIZE);
    let r = io_msg(id, RnbdOp::Read, 0, SIZE as u32);
    assert_eq!(run(&mut d, &s, &r, Dir::Read, back.buf(SIZE)), 0);
    let got = back.bytes(SIZE);
    let first_bad = got.iter().zip(&model).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "device differs from the model");
    assert_eq!(d.in_flight(), 0);
}

#[test]
fn op5_on_a_ram_export() {
    op5_both_meanings(Exports::ram(&[("vol", SIZE as u64)]).unwrap());
}

#[test]
fn op5_on_a_file_export() {
    let path = std::env::temp_dir().join(format!("rtrs-op5-{}", std::process::id()));
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(SIZE as u64))
        .expect("temp file");
    let spec = ExportSpec::parse(&format!("vol=file:{}", path.display())).unwrap();
    let ex = Exports::new(&[spec], &FileOptions::default()).unwrap();
    op5_both_meanings(ex);
    let _ = std::fs::remove_file(&path);
}

/// The header a pre-5.18 kernel client sends for a WRITE_SAME of 8 sectors at sector
/// 16 (`rnbd_client_xfer_request` with `RNBD_OP_WRITE_SAME` | `RNBD_F_SYNC`), with one
/// 512-byte block as data: the server reads op 5 and the range from it.
#[test]
fn write_same_header_golden_bytes() {
    #[rustfmt::skip]
    let golden: [u8; 32] = [
        0x04, 0x00, 0x00, 0x00, // hdr: type RNBD_MSG_IO, reserved
        0x03, 0x00, 0x00, 0x00, // device_id 3
        0x10, 0, 0, 0, 0, 0, 0, 0, // sector 16
        0x05, 0x01, 0x00, 0x00, // rw: op 5 | RNBD_F_SYNC
        0x00, 0x10, 0x00, 0x00, // bi_size 4096: the range, not the data
        0x00, 0x00, // prio
        0, 0, 0, 0, 0, 0, // padding
    ];
    let io = Io::decode(&golden).unwrap();
    assert_eq!(
        (io.device_id, io.sector, io.op, io.bi_size),
        (3, 16, RnbdOp::WriteZeroes, 4096)
    );
    assert_eq!(io.flags, RnbdFlags::SYNC);
    assert_eq!(io.to_bytes(), golden);
}
