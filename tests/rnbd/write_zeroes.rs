//! How the RNBD client sends write-zeroes (the device's `WriteZeroesMode`, given at
//! open), seen on the wire of a direct in-process port to the server's dispatcher:
//! - `emulate` (the default, safe with servers of every kernel version): WRITEs of
//!   zeros, at most `max_io_size` each, and never an op-5 header; one completion for
//!   the request, from the home core and from another core's `RnbdQueue`; the first
//!   error of a piece fails the request, once; a piece RTRS drops is sent again;
//! - `native`: one data-less op-5 header (golden bytes);
//! - two devices of one session, each with its own mode.
//!
//! The data is read back each time.

use crate::direct;

use std::sync::Arc;

use rtrs_spdk::engine::{Ctx, Simulation};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr, Sge};
use rtrs_spdk::proto::rnbd::{AccessMode, Io, RnbdOp};
use rtrs_spdk::rnbd::client::{
    completion, BlockRequest, ClientCompletion, ClientEvent, DevHandle, DeviceError, RnbdClient,
    RnbdQueue, WriteZeroesMode,
};
use rtrs_spdk::rnbd::server::{Exports, RnbdSessions};
use rtrs_spdk::rnbd::Dir;
use rtrs_spdk::Errno;

use direct::{DirectPort, Sent, CHUNK};

const SIZE: usize = 1 << 20;
/// Bounded polling: far more rounds than any test needs.
const ROUNDS: usize = 10_000;

struct Rig {
    sim: Simulation,
    fabric: LoopbackFabric,
    ex: Arc<Exports>,
    table: Arc<RnbdSessions<u64>>,
}

impl Rig {
    fn new() -> Rig {
        let ex = Arc::new(Exports::ram(&[("vol", SIZE as u64), ("aux", SIZE as u64)]).unwrap());
        Rig {
            sim: Simulation::new(1, 16),
            fabric: LoopbackFabric::new(),
            table: Arc::new(RnbdSessions::new(ex.clone())),
            ex,
        }
    }

    fn mr(&self, len: usize) -> Mr {
        self.fabric
            .register(MemBuf::zeroed(len), Access::LOCAL_WRITE)
            .unwrap()
    }

    fn port(&self, depth: usize) -> DirectPort {
        DirectPort::new(&self.ex, &self.table, 1, depth)
    }

    fn cx<R>(&mut self, f: impl FnOnce(&mut dyn Ctx) -> R) -> R {
        self.sim.reactor(0).with_ctx(f)
    }

    /// A client with "vol" open read-write in write-zeroes mode `mode` (`None`: the
    /// default).
    fn client(
        &mut self,
        mode: Option<WriteZeroesMode>,
        depth: usize,
    ) -> (RnbdClient<DirectPort>, DevHandle) {
        let mut c = RnbdClient::new(self.port(depth), self.mr(4096)).unwrap();
        if let Some(m) = mode {
            c.set_write_zeroes(m);
        }
        let h = self
            .cx(|cx| c.open(cx.now(), "vol", AccessMode::ReadWrite))
            .unwrap();
        let ev = self.events(&mut c, 2);
        assert!(
            matches!(ev[1], ClientEvent::Opened { dev, .. } if dev == h),
            "{ev:?}"
        );
        (c, h)
    }

    /// Opens `name` read-write on `c`, whose session info is done, in mode `mode`.
    fn open(
        &mut self,
        c: &mut RnbdClient<DirectPort>,
        name: &str,
        mode: WriteZeroesMode,
    ) -> DevHandle {
        c.set_write_zeroes(mode);
        let h = self
            .cx(|cx| c.open(cx.now(), name, AccessMode::ReadWrite))
            .unwrap();
        let ev = self.events(c, 1);
        assert!(
            matches!(ev[0], ClientEvent::Opened { dev, .. } if dev == h),
            "{ev:?}"
        );
        h
    }

    /// Polls until `want` events came (bounded); no more may come.
    fn events(&mut self, c: &mut RnbdClient<DirectPort>, want: usize) -> Vec<ClientEvent> {
        let mut got = Vec::new();
        for _ in 0..ROUNDS {
            let mut out = vec![
                ClientEvent::Io {
                    tag: 0,
                    result: Ok(())
                };
                8
            ];
            let n = self.cx(|cx| c.poll(cx.now(), &mut out));
            got.extend(out.drain(..n));
            if got.len() >= want {
                break;
            }
        }
        assert_eq!(got.len(), want, "{got:?}");
        got
    }

    /// One block request under tag 42 to its end: the errno.
    fn io(
        &mut self,
        c: &mut RnbdClient<DirectPort>,
        dev: DevHandle,
        req: BlockRequest,
        buf: &Mr,
    ) -> i32 {
        let sgl: Vec<Sge> = if req.data_len() > 0 {
            vec![buf.sge(0, req.data_len() as usize)]
        } else {
            vec![]
        };
        self.cx(|cx| c.submit(cx.now(), dev, 42, &req, &sgl))
            .unwrap();
        match self.events(c, 1)[..] {
            [ClientEvent::Io { tag: 42, result }] => Errno::neg_of(result),
            ref other => panic!("{other:?}"),
        }
    }

    /// Fills the device with a pattern; returns it.
    fn fill(&mut self, c: &mut RnbdClient<DirectPort>, dev: DevHandle) -> Vec<u8> {
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 + i / 4096) as u8 | 1).collect();
        let buf = self.mr(CHUNK);
        for (k, part) in data.chunks(CHUNK).enumerate() {
            buf.write_at(0, part);
            let req = BlockRequest::write((k * CHUNK) as u64, CHUNK as u32);
            assert_eq!(self.io(c, dev, req, &buf), 0);
        }
        data
    }

    /// Reads the whole device back.
    fn read_all(&mut self, c: &mut RnbdClient<DirectPort>, dev: DevHandle) -> Vec<u8> {
        let buf = self.mr(CHUNK);
        let mut all = vec![0u8; SIZE];
        for (k, part) in all.chunks_mut(CHUNK).enumerate() {
            let req = BlockRequest::read((k * CHUNK) as u64, CHUNK as u32);
            assert_eq!(self.io(c, dev, req, &buf), 0);
            buf.read_at(0, part);
        }
        all
    }
}

/// The block IO headers among `sent` (admin requests left out).
fn block_ios(sent: &[Sent]) -> Vec<(Io, Dir, usize)> {
    sent.iter()
        .filter(|s| !s.admin)
        .map(|s| (Io::decode(&s.usr).unwrap(), s.dir, s.data_len))
        .collect()
}

#[test]
fn emulate_is_the_default_and_sends_writes_of_zeros() {
    let mut rig = Rig::new();
    // Depth 2: the pieces of one request wait for permits, sent from polls.
    let (mut c, dev) = rig.client(None, 2);
    assert_eq!(
        c.device(dev).unwrap().write_zeroes(),
        WriteZeroesMode::Emulate
    );
    let info = *c.device(dev).unwrap().info().unwrap();
    assert!(info.server_max_write_zeroes > 0);
    let mut model = rig.fill(&mut c, dev);
    let before = c.session().sent.len();

    // 300 KiB at 4 KiB: three pieces of at most 128 KiB (the port's max_io_size).
    let (at, len) = (4096usize, 300 << 10);
    let req = BlockRequest::write_zeroes(at as u64, len as u32)
        .nounmap()
        .fua();
    assert_eq!(rig.io(&mut c, dev, req, &rig.mr(512)), 0);
    model[at..at + len].fill(0);
    let ios = block_ios(&c.session().sent[before..]);
    assert_eq!(ios.len(), 3, "{ios:?}");
    let mut next = at as u64;
    for (io, dir, data_len) in &ios {
        assert_eq!(io.op, RnbdOp::Write, "{io:?}");
        assert_eq!((*dir, *data_len), (Dir::Write, io.bi_size as usize));
        assert!(io.bi_size as usize <= CHUNK);
        // Flags ride on every piece; NOUNMAP has no meaning for a WRITE.
        assert_eq!(io.flags.bits(), 0x200, "FUA only");
        assert_eq!(io.sector * 512, next);
        next += u64::from(io.bi_size);
    }
    assert_eq!(next, (at + len) as u64);
    // The zero buffer was announced to this core's session handle before its pieces
    // named it, so a fabric without a registration table can resolve them (the admin's
    // reply buffer, for OPEN, the other one).
    assert_eq!(c.session().regions.len(), 2);
    assert_eq!(c.session().unannounced, 0);
    assert!(c
        .session()
        .sent
        .iter()
        .all(|s| s.admin || Io::decode(&s.usr).unwrap().op != RnbdOp::WriteZeroes));
    assert!(
        rig.read_all(&mut c, dev) == model,
        "device differs from the model"
    );

    // The device has no op-5 message in this mode.
    let e = c
        .device(dev)
        .unwrap()
        .io_msg(&BlockRequest::write_zeroes(0, 4096))
        .unwrap_err();
    assert!(matches!(e, DeviceError::Emulated { .. }), "{e}");
    assert_eq!(e.errno().neg(), -libc::EINVAL);
}

#[test]
fn native_sends_one_data_less_op5() {
    let mut rig = Rig::new();
    let (mut c, dev) = rig.client(Some(WriteZeroesMode::Native), 8);
    assert_eq!(
        c.device(dev).unwrap().write_zeroes(),
        WriteZeroesMode::Native
    );
    let info = *c.device(dev).unwrap().info().unwrap();
    assert_eq!(info.max_write_zeroes, info.server_max_write_zeroes);
    let mut model = rig.fill(&mut c, dev);
    let before = c.session().sent.len();
    let req = BlockRequest::write_zeroes(8192, 300 << 10).nounmap();
    assert_eq!(rig.io(&mut c, dev, req, &rig.mr(512)), 0);
    model[8192..8192 + (300 << 10)].fill(0);
    let sent = &c.session().sent[before..];
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].dir, sent[0].data_len, sent[0].admin),
        (Dir::Write, 0, false)
    );
    #[rustfmt::skip]
    let golden: [u8; 32] = [
        0x04, 0x00, 0x00, 0x00, // RNBD_MSG_IO
        0x00, 0x00, 0x00, 0x00, // device_id 0
        0x10, 0, 0, 0, 0, 0, 0, 0, // sector 16
        0x05, 0x08, 0x00, 0x00, // op 5 | RNBD_F_NOUNMAP
        0x00, 0xb0, 0x04, 0x00, // bi_size 300 KiB
        0, 0, 0, 0, 0, 0, 0, 0, // prio 0, padding
    ];
    assert_eq!(sent[0].usr, golden);
    assert!(
        rig.read_all(&mut c, dev) == model,
        "device differs from the model"
    );
}

#[test]
fn devices_of_one_session_keep_their_own_mode() {
    let mut rig = Rig::new();
    let (mut c, vol) = rig.client(Some(WriteZeroesMode::Native), 8);
    let aux = rig.open(&mut c, "aux", WriteZeroesMode::Emulate);
    assert_eq!(
        c.device(vol).unwrap().write_zeroes(),
        WriteZeroesMode::Native
    );
    assert_eq!(
        c.device(aux).unwrap().write_zeroes(),
        WriteZeroesMode::Emulate
    );
    // One session, one queue: each device's write-zeroes go as its own mode says.
    for (dev, op, data_len) in [(vol, RnbdOp::WriteZeroes, 0), (aux, RnbdOp::Write, 8192)] {
        let mut model = rig.fill(&mut c, dev);
        let before = c.session().sent.len();
        let req = BlockRequest::write_zeroes(4096, 8192);
        assert_eq!(rig.io(&mut c, dev, req, &rig.mr(512)), 0);
        model[4096..4096 + 8192].fill(0);
        let ios = block_ios(&c.session().sent[before..]);
        assert_eq!(ios.len(), 1, "{ios:?}");
        let (io, dir, len) = &ios[0];
        assert_eq!(
            (io.op, io.bi_size, *dir, *len),
            (op, 8192, Dir::Write, data_len)
        );
        assert!(
            rig.read_all(&mut c, dev) == model,
            "device differs from the model"
        );
    }
}

#[test]
fn a_failed_piece_fails_the_request_once() {
    let mut rig = Rig::new();
    // Depth 1: one piece at a time.
    let (mut c, dev) = rig.client(None, 1);
    let req = BlockRequest::write_zeroes(0, 3 * CHUNK as u32);
    rig.cx(|cx| c.submit(cx.now(), dev, 7, &req, &[])).unwrap();
    // The first piece is out; the path goes away before the next can be sent.
    c.session_mut().connected = false;
    let ev = rig.events(&mut c, 1);
    assert_eq!(
        ev,
        vec![ClientEvent::Io {
            tag: 7,
            result: Err(Errno::ENOTCONN)
        }]
    );
    assert_eq!(block_ios(&c.session().sent).len(), 1);
    // Nothing else comes, and the client works on once the path is back.
    for _ in 0..100 {
        let mut out = vec![
            ClientEvent::Io {
                tag: 0,
                result: Ok(())
            };
            4
        ];
        assert_eq!(rig.cx(|cx| c.poll(cx.now(), &mut out)), 0);
    }
    c.session_mut().connected = true;
    assert_eq!(rig.io(&mut c, dev, req, &rig.mr(512)), 0);
    // A write-zeroes carries no data; a bad range is refused before anything is sent.
    let buf = rig.mr(512);
    let e = rig.cx(|cx| c.submit(cx.now(), dev, 8, &req, &[buf.sge(0, 512)]));
    assert_eq!(e.unwrap_err().errno().neg(), -libc::EINVAL);
    let past = BlockRequest::write_zeroes(SIZE as u64 - 512, 1024);
    let e = rig.cx(|cx| c.submit(cx.now(), dev, 9, &past, &[]));
    assert_eq!(e.unwrap_err().errno().neg(), -libc::EIO);
}

#[test]
fn another_core_emulates_too() {
    let mut rig = Rig::new();
    let (mut c, dev) = rig.client(None, 8);
    let mut model = rig.fill(&mut c, dev);
    let mut core = RnbdQueue::new(rig.port(2), c.table());
    let req = BlockRequest::write_zeroes(512, 200 << 10);
    rig.cx(|cx| core.submit(cx.now(), dev, 5, &req, &[]))
        .unwrap();
    let mut done = Vec::new();
    for _ in 0..ROUNDS {
        let mut out = [ClientCompletion::default(); 4];
        let n = rig.cx(|cx| core.poll(cx.now(), &mut out));
        done.extend_from_slice(&out[..n]);
        if !done.is_empty() {
            break;
        }
    }
    // One completion under the caller's tag: the pieces stay inside.
    assert_eq!(done, vec![completion(5, Ok(()))]);
    let ios = block_ios(&core.session().sent);
    assert_eq!(ios.len(), 2);
    assert!(ios
        .iter()
        .all(|(io, _, len)| io.op == RnbdOp::Write && *len == io.bi_size as usize));
    model[512..512 + (200 << 10)].fill(0);
    assert!(
        rig.read_all(&mut c, dev) == model,
        "device differs from the model"
    );
}

#[test]
fn a_piece_dropped_by_rtrs_is_sent_again() {
    let mut rig = Rig::new();
    let (mut c, dev) = rig.client(None, 8);
    let mut model = rig.fill(&mut c, dev);
    // RTRS drops the next request unexecuted (−ECONNRESET, as at a queue-depth
    // change): the piece waits in the core and goes out again; the request succeeds.
    c.session_mut().reset_next = 1;
    let (sent, submits) = (c.session().sent.len(), c.session().block_submits);
    let req = BlockRequest::write_zeroes(0, 2 * CHUNK as u32);
    assert_eq!(rig.io(&mut c, dev, req, &rig.mr(512)), 0);
    model[..2 * CHUNK].fill(0);
    // Two pieces executed, three handed to the port (one of them twice).
    assert_eq!(c.session().sent.len() - sent, 2);
    assert_eq!(c.session().block_submits - submits, 3);
    assert!(
        rig.read_all(&mut c, dev) == model,
        "device differs from the model"
    );
}
