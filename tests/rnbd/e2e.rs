//! RNBD end to end over RTRS on the loopback fabric: an RTRS server whose per-core
//! handlers are `RnbdServer`s over RAM exports, and RTRS client sessions carrying
//! `RnbdClient`s, all on two simulated reactors stepped by hand. Access modes across
//! sessions, data verification at every size up to max_io_size, flush / discard /
//! write-zeroes, close, unknown device ids, a path disconnect and reconnect after
//! which the device is re-opened under the id the new server session gives, and a
//! session with more IO cores than reactors.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rtrs_spdk::client::{ClientConfig, ClientError, ClientSession, PathAddr, SessionCore};
use rtrs_spdk::engine::Simulation;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr};
use rtrs_spdk::proto::rnbd::{AccessMode, Io, RnbdFlags, RnbdOp};
use rtrs_spdk::rnbd::backend::{ExportSpec, FileOptions};
use rtrs_spdk::rnbd::client::{
    completion_result, open_rnbd_session, BlockRequest, BringUpError, ClientCompletion,
    ClientEvent, ClientIo, DevHandle, DevState, RnbdAdmin, RnbdClient, RnbdClientSession,
    RnbdQueue, SessionHandle, Sgl, WriteZeroesMode,
};
use rtrs_spdk::rnbd::server::{Exports, RnbdServer};
use rtrs_spdk::rnbd::Dir;
use rtrs_spdk::server::{Server, ServerConfig};
use rtrs_spdk::Errno;

/// Upper bound of simulation steps for one wait.
const MAX_STEPS: usize = 50_000;
const CHUNK: u32 = 64 << 10;

struct Rig {
    sim: Simulation,
    fabric: Arc<dyn Fabric>,
    addr: SocketAddr,
    exports: Arc<Exports>,
    server: Server,
}

struct Clt {
    session: ClientSession,
    /// Core 0, the session's home core: admin requests, link events, IO.
    rnbd: RnbdClient<SessionCore>,
    /// Core 1: IO of the same devices.
    other: RnbdQueue<SessionCore>,
    path: PathAddr,
}

impl Rig {
    fn new() -> Rig {
        let exports = Exports::ram(&[("vol", 8 << 20), ("aux", 1 << 20)]).unwrap();
        Rig::with(exports, true)
    }

    fn with(exports: Exports, always_invalidate: bool) -> Rig {
        let mut sim = Simulation::new(2, 4096);
        let fabric: Arc<dyn Fabric> = Arc::new(LoopbackFabric::new());
        let exports = Arc::new(exports);
        let cfg = ServerConfig {
            queue_depth: 32,
            chunk_size: CHUNK,
            always_invalidate,
            ..ServerConfig::default()
        };
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let (f, ex) = (Arc::clone(&fabric), Arc::clone(&exports));
        let server = sim
            .reactor(0)
            .with_ctx(|cx| Server::start(cx, f, &[listen], cfg, RnbdServer::factory(ex)))
            .expect("server start");
        let addr = server.local_addrs()[0];
        sim.run_until_idle(100);
        Rig {
            sim,
            fabric,
            addr,
            exports,
            server,
        }
    }

    /// Stops the server and steps until its pollers are gone.
    fn stop(mut self) {
        self.server.stop();
        for _ in 0..MAX_STEPS {
            self.sim.step();
            if self.server.is_stopped() {
                return;
            }
        }
        panic!("server did not stop");
    }

    fn mr(&self, len: usize) -> Mr {
        self.fabric
            .register(MemBuf::zeroed(len), Access::LOCAL_WRITE)
            .unwrap()
    }

    /// A client session named `name`: its home core 0 runs the `RnbdClient`, core 1 an
    /// `RnbdQueue` over the same devices (both polled by `turn`).
    fn client(&mut self, name: &str) -> Clt {
        let path = PathAddr::new(self.addr);
        let mut cfg = ClientConfig::new(name, vec![path]);
        cfg.reconnect_delay = Duration::from_millis(10);
        cfg.reconnect_jitter = Duration::from_millis(1);
        let f = Arc::clone(&self.fabric);
        let RnbdClientSession {
            session,
            admin,
            mut queues,
        } = self
            .sim
            .reactor(0)
            .with_ctx(|cx| open_rnbd_session(cx, 2, f, cfg))
            .expect("session open");
        let other = queues.pop().unwrap();
        let rnbd = RnbdClient::from_parts(admin, queues.pop().unwrap());
        Clt {
            session,
            rnbd,
            other,
            path,
        }
    }

    /// One step of both reactors, then both of `c`'s cores polled: what they reported
    /// (core 1's completions as `ClientEvent::Io`).
    fn turn(&mut self, c: &mut Clt) -> Vec<ClientEvent> {
        self.sim.step();
        let mut out = vec![
            ClientEvent::Io {
                tag: 0,
                result: Ok(())
            };
            8
        ];
        let n = self
            .sim
            .reactor(0)
            .with_ctx(|cx| c.rnbd.poll(cx.now(), &mut out));
        out.truncate(n);
        let mut done = [ClientCompletion::default(); 8];
        let n = self
            .sim
            .reactor(1)
            .with_ctx(|cx| c.other.poll(cx.now(), &mut done));
        out.extend(done[..n].iter().map(|d| ClientEvent::Io {
            tag: d.tag,
            result: completion_result(d),
        }));
        out
    }

    /// Steps and polls until `want` events arrived.
    fn events(&mut self, c: &mut Clt, want: usize) -> Vec<ClientEvent> {
        let mut got = Vec::new();
        for _ in 0..MAX_STEPS {
            got.extend(self.turn(c));
            if got.len() >= want {
                break;
            }
        }
        assert_eq!(got.len(), want, "events: {got:?}");
        got
    }

    /// Opens `name`; the device id or the errno.
    fn open(&mut self, c: &mut Clt, name: &str, mode: AccessMode) -> (DevHandle, Result<u32, i32>) {
        let first = c.rnbd.ver().is_none();
        let h = self
            .sim
            .reactor(0)
            .with_ctx(|cx| c.rnbd.open(cx.now(), name, mode))
            .unwrap();
        let ev = self.events(c, if first { 2 } else { 1 });
        if first {
            assert_eq!(ev[0], ClientEvent::SessInfo(Ok(2)));
        }
        match ev.last().unwrap() {
            ClientEvent::Opened { dev, info, .. } if *dev == h => (h, Ok(info.device_id)),
            ClientEvent::OpenFailed { dev, error } if *dev == h => (h, Err(error.errno().neg())),
            other => panic!("{other:?}"),
        }
    }

    /// Sends raw `usr` on core 0's port (bypassing the client's checks) and polls the
    /// port itself for the answer (the client hands back only its own requests): the
    /// errno.
    fn raw(
        &mut self,
        c: &mut Clt,
        usr: &[u8],
        dir: Dir,
        reply: &Mr,
        len: usize,
        admin: bool,
    ) -> i32 {
        let sge = [reply.sge(0, len.max(1))];
        let sgl: &[_] = if len == 0 { &[] } else { &sge };
        self.sim.reactor(0).with_ctx(|cx| {
            let io = ClientIo {
                tag: 5,
                dir,
                usr,
                sgl: Sgl::Copy(sgl),
                admin,
                wait: rtrs_spdk::client::PathWait::Session,
            };
            SessionHandle::submit(c.rnbd.session_mut(), cx.now(), io).unwrap()
        });
        self.raw_done(c, 5)
    }

    /// Polls core 0's port (not the client) for the completion of a request sent on it
    /// directly with `tag`: its errno.
    fn raw_done(&mut self, c: &mut Clt, tag: u64) -> i32 {
        for _ in 0..MAX_STEPS {
            self.sim.step();
            let mut done = [ClientCompletion::default(); 1];
            let port = c.rnbd.session_mut();
            if self
                .sim
                .reactor(0)
                .with_ctx(|cx| SessionHandle::poll(port, cx.now(), &mut done))
                == 1
            {
                assert_eq!(done[0].tag, tag, "{:?}", done[0]);
                return Errno::neg_of(completion_result(&done[0]));
            }
        }
        panic!("the raw request {tag} did not complete");
    }

    /// One block request to completion from core 0, with `buf` as its data or reply
    /// space.
    fn io(&mut self, c: &mut Clt, dev: DevHandle, req: BlockRequest, buf: &Mr) -> i32 {
        self.io_on(0, c, dev, req, buf)
    }

    /// As [`io`](Self::io), from core `core`.
    fn io_on(
        &mut self,
        core: usize,
        c: &mut Clt,
        dev: DevHandle,
        req: BlockRequest,
        buf: &Mr,
    ) -> i32 {
        let sgl = if req.data_len() > 0 {
            vec![buf.sge(0, req.data_len() as usize)]
        } else {
            vec![]
        };
        self.sim
            .reactor(core)
            .with_ctx(|cx| match core {
                0 => c.rnbd.submit(cx.now(), dev, 77, &req, &sgl),
                _ => c.other.submit(cx.now(), dev, 77, &req, &sgl),
            })
            .unwrap();
        match &self.events(c, 1)[0] {
            ClientEvent::Io { tag: 77, result } => Errno::neg_of(*result),
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn modes_data_and_close_over_rtrs() {
    let mut rig = Rig::new();
    let mut a = rig.client("clt-a");
    let mut b = rig.client("clt-b");
    let (a_vol, id) = rig.open(&mut a, "vol", AccessMode::ReadWrite);
    assert_eq!(id, Ok(0));
    assert_eq!(
        rig.open(&mut b, "vol", AccessMode::ReadWrite).1,
        Err(-libc::EPERM)
    );
    let (b_vol, _) = rig.open(&mut b, "vol", AccessMode::ReadOnly);
    assert_eq!(
        rig.open(&mut b, "missing", AccessMode::ReadOnly).1,
        Err(-libc::ENOENT)
    );
    let (b_aux, _) = rig.open(&mut b, "aux", AccessMode::Migration);
    let (a_aux, _) = rig.open(&mut a, "aux", AccessMode::Migration);
    let mut c = rig.client("clt-c");
    assert_eq!(
        rig.open(&mut c, "aux", AccessMode::Migration).1,
        Err(-libc::EPERM)
    );

    let info = *a.rnbd.device(a_vol).unwrap().info().unwrap();
    assert_eq!(info.size, 8 << 20);
    let max_io = info.max_io_size;
    assert!(max_io > 0 && max_io <= CHUNK, "max_io_size {max_io}");

    // Data written by A's RW mapping, read back through B's RO mapping.
    let wbuf = rig.mr(max_io as usize);
    let rbuf = rig.mr(max_io as usize);
    let mut sizes: Vec<u32> = (0..)
        .map(|k| 512u32 << k)
        .take_while(|&s| s < max_io)
        .collect();
    sizes.push(max_io);
    let mut off = 0u64;
    for &len in &sizes {
        let pattern: Vec<u8> = (0..len)
            .map(|i| (i / 512 + len / 512 + (i % 251)) as u8)
            .collect();
        wbuf.write_at(0, &pattern);
        assert_eq!(
            rig.io(&mut a, a_vol, BlockRequest::write(off, len).fua(), &wbuf),
            0
        );
        assert_eq!(
            rig.io(&mut b, b_vol, BlockRequest::read(off, len), &rbuf),
            0
        );
        let mut got = vec![0; len as usize];
        rbuf.read_at(0, &mut got);
        assert!(got == pattern, "mismatch at size {len}");
        off += u64::from(len);
    }
    assert_eq!(rig.io(&mut a, a_vol, BlockRequest::flush(), &wbuf), 0);
    assert_eq!(
        rig.io(&mut a, a_vol, BlockRequest::discard(0, 4096), &wbuf),
        0
    );
    assert_eq!(
        rig.io(
            &mut a,
            a_vol,
            BlockRequest::write_zeroes(4096, 4096).nounmap(),
            &wbuf
        ),
        0
    );
    assert_eq!(rig.io(&mut b, b_vol, BlockRequest::read(0, 8192), &rbuf), 0);
    let mut got = vec![1; 8192];
    rbuf.read_at(0, &mut got);
    assert!(got.iter().all(|&x| x == 0));
    // Both migration writers write.
    wbuf.write_at(0, &[3; 512]);
    assert_eq!(rig.io(&mut a, a_aux, BlockRequest::write(0, 512), &wbuf), 0);
    assert_eq!(rig.io(&mut b, b_aux, BlockRequest::read(0, 512), &rbuf), 0);
    let mut one = [0; 512];
    rbuf.read_at(0, &mut one);
    assert_eq!(one, [3; 512]);

    // An IO naming a device id the server never gave: ENOTCONN.
    let usr = Io {
        device_id: 99,
        sector: 0,
        op: RnbdOp::Read,
        flags: RnbdFlags::NONE,
        bi_size: 512,
        prio: 0,
    }
    .to_bytes();
    assert_eq!(
        rig.raw(&mut c, &usr, Dir::Read, &rbuf, 512, false),
        -libc::ENOTCONN
    );
    // Malformed RNBD messages: EINVAL, and the session carries on.
    let junk: [&[u8]; 4] = [&[9, 0, 0, 0], &[3, 0, 0, 0], &[2, 0, 0, 0, 1], &usr[..20]];
    for j in junk {
        assert_eq!(
            rig.raw(&mut c, j, Dir::Read, &rbuf, 56, true),
            -libc::EINVAL
        );
    }
    let open_vol = {
        let mut b = [0u8; 264];
        rtrs_spdk::proto::rnbd::Open {
            access_mode: AccessMode::ReadOnly,
            dev_name: b"vol",
        }
        .encode(&mut b)
        .unwrap();
        b
    };
    // OPEN with too little reply space.
    assert_eq!(
        rig.raw(&mut c, &open_vol, Dir::Read, &rbuf, 40, true),
        -libc::EINVAL
    );
    // IO whose data length is not bi_size.
    let (b_usr, _) = b
        .rnbd
        .device(b_vol)
        .unwrap()
        .io_msg(&BlockRequest::read(0, 1024))
        .unwrap();
    let sge = [rbuf.sge(0, 512)];
    rig.sim.reactor(0).with_ctx(|cx| {
        let io = ClientIo {
            tag: 6,
            dir: Dir::Read,
            usr: &b_usr.to_bytes(),
            sgl: Sgl::Copy(&sge),
            admin: false,
            wait: rtrs_spdk::client::PathWait::Session,
        };
        SessionHandle::submit(b.rnbd.session_mut(), cx.now(), io).unwrap()
    });
    assert_eq!(rig.raw_done(&mut b, 6), -libc::EINVAL);
    assert_eq!(rig.io(&mut b, b_vol, BlockRequest::read(0, 512), &rbuf), 0);

    // A closes its RW mapping: C may now open vol RW.
    rig.sim
        .reactor(0)
        .with_ctx(|cx| a.rnbd.close(cx.now(), a_vol))
        .unwrap();
    assert_eq!(
        rig.events(&mut a, 1),
        vec![ClientEvent::Closed { dev: a_vol }]
    );
    let vol = rig.exports.lookup(b"vol").unwrap();
    assert_eq!(rig.exports.writers(vol), 0);
    let (c_vol, _) = rig.open(&mut c, "vol", AccessMode::ReadWrite);
    assert_eq!(rig.io(&mut c, c_vol, BlockRequest::read(0, 512), &rbuf), 0);
    rig.stop();
}

#[test]
fn reconnect_reopens_the_device() {
    let mut rig = Rig::new();
    let mut a = rig.client("clt-r");
    let (x, _) = rig.open(&mut a, "aux", AccessMode::ReadWrite);
    let (y, id) = rig.open(&mut a, "vol", AccessMode::ReadWrite);
    assert_eq!(id, Ok(1));
    let buf = rig.mr(4096);
    buf.write_at(0, &[0x42; 4096]);
    assert_eq!(
        rig.io(&mut a, y, BlockRequest::write(1 << 20, 4096), &buf),
        0
    );
    rig.sim
        .reactor(0)
        .with_ctx(|cx| a.rnbd.close(cx.now(), x))
        .unwrap();
    rig.events(&mut a, 1);

    // The only path goes down: the server ends the RNBD session (writers released).
    a.session.disconnect_path(a.path);
    let vol = rig.exports.lookup(b"vol").unwrap();
    for _ in 0..MAX_STEPS {
        assert_eq!(rig.turn(&mut a), vec![]);
        if a.rnbd.device(y).unwrap().state() == DevState::MappedDisconnected
            && rig.exports.writers(vol) == 0
        {
            break;
        }
    }
    assert_eq!(
        a.rnbd.device(y).unwrap().state(),
        DevState::MappedDisconnected
    );
    assert_eq!(rig.exports.writers(vol), 0);

    // Back: SESS_INFO and the re-open, which adopts id 0 from the new server session.
    a.session.reconnect_path(a.path);
    let ev = rig.events(&mut a, 2);
    assert_eq!(ev[0], ClientEvent::SessInfo(Ok(2)));
    match &ev[1] {
        ClientEvent::Opened { dev, info, remap } => {
            assert_eq!((*dev, info.device_id, *remap), (y, 0, true));
        }
        other => panic!("{other:?}"),
    }
    let back = rig.mr(4096);
    assert_eq!(
        rig.io(&mut a, y, BlockRequest::read(1 << 20, 4096), &back),
        0
    );
    let mut got = vec![0; 4096];
    back.read_at(0, &mut got);
    assert_eq!(got, vec![0x42; 4096]);
    assert_eq!(rig.exports.writers(vol), 1);
    rig.stop();
}

#[test]
fn file_export_without_always_invalidate() {
    let path = std::env::temp_dir().join(format!("rnbd-e2e-{}", std::process::id()));
    std::fs::File::create(&path)
        .unwrap()
        .set_len(2 << 20)
        .unwrap();
    let spec = ExportSpec::parse(&format!("disk=file:{}", path.display())).unwrap();
    let exports = Exports::new(&[spec], &FileOptions::default()).unwrap();
    let mut rig = Rig::with(exports, false);
    let mut a = rig.client("clt-f");
    let (d, id) = rig.open(&mut a, "disk", AccessMode::ReadWrite);
    assert_eq!(id, Ok(0));
    let max_io = a.rnbd.device(d).unwrap().info().unwrap().max_io_size;
    let wbuf = rig.mr(max_io as usize);
    let rbuf = rig.mr(max_io as usize);
    let mut off = 0u64;
    for len in [512, 4096, 12288, max_io] {
        let data: Vec<u8> = (0..len)
            .map(|i| (i % 253) as u8 ^ (len / 512) as u8)
            .collect();
        wbuf.write_at(0, &data);
        assert_eq!(
            rig.io(&mut a, d, BlockRequest::write(off, len).fua(), &wbuf),
            0
        );
        assert_eq!(
            rig.io_on(1, &mut a, d, BlockRequest::read(off, len), &rbuf),
            0
        );
        let mut got = vec![0; len as usize];
        rbuf.read_at(0, &mut got);
        assert!(got == data, "size {len}");
        off += u64::from(len);
    }
    assert_eq!(rig.io(&mut a, d, BlockRequest::flush(), &wbuf), 0);
    assert_eq!(
        rig.io(&mut a, d, BlockRequest::write_zeroes(0, 4096), &wbuf),
        0
    );
    assert_eq!(rig.io(&mut a, d, BlockRequest::read(0, 4096), &rbuf), 0);
    let mut got = vec![1; 4096];
    rbuf.read_at(0, &mut got);
    assert!(got.iter().all(|&x| x == 0));
    // Past the end of the 2 MiB file: refused locally, and by the server.
    let e = rig.sim.reactor(0).with_ctx(|cx| {
        a.rnbd.submit(
            cx.now(),
            d,
            1,
            &BlockRequest::read(2 << 20, 512),
            &[rbuf.sge(0, 512)],
        )
    });
    assert_eq!(e.unwrap_err().errno().neg(), -libc::EIO);
    let past = Io {
        device_id: 0,
        sector: (2 << 20) / 512,
        op: RnbdOp::Read,
        flags: RnbdFlags::NONE,
        bi_size: 512,
        prio: 0,
    }
    .to_bytes();
    assert_eq!(
        rig.raw(&mut a, &past, Dir::Read, &rbuf, 512, false),
        -libc::EIO
    );
    rig.stop();
    let _ = std::fs::remove_file(&path);
}

/// Block completions (queue, tag, result) and admin events of one step of both reactors,
/// with every queue and the admin polled on reactor 0.
type Turn = (Vec<(usize, u64, Result<(), Errno>)>, Vec<ClientEvent>);

fn turn_all(rig: &mut Rig, admin: &mut RnbdAdmin, queues: &mut [RnbdQueue<SessionCore>]) -> Turn {
    rig.sim.step();
    rig.sim.reactor(0).with_ctx(|cx| {
        let mut done = Vec::new();
        for (k, q) in queues.iter_mut().enumerate() {
            let mut out = [ClientCompletion::default(); 8];
            let n = q.poll(cx.now(), &mut out);
            done.extend(out[..n].iter().map(|c| (k, c.tag, completion_result(c))));
        }
        let mut ev = vec![ClientEvent::SessInfo(Ok(0)); 8];
        let n = admin.poll(&mut queues[0], cx.now(), &mut ev);
        ev.truncate(n);
        (done, ev)
    })
}

/// A session's IO cores need not be the reactors: three queues of one session, all
/// polled on reactor 0 of two, each carry IO of the device the admin opened through
/// the first; no core at all is refused before anything is opened.
#[test]
fn more_queues_than_reactors_polled_on_one() {
    let mut rig = Rig::new();
    let cfg = ClientConfig::new("clt-3", vec![PathAddr::new(rig.addr)]);
    let f = Arc::clone(&rig.fabric);
    let RnbdClientSession {
        session,
        mut admin,
        mut queues,
    } = rig
        .sim
        .reactor(0)
        .with_ctx(|cx| open_rnbd_session(cx, 3, f, cfg))
        .expect("session open");
    assert_eq!(queues.len(), 3);
    for (k, q) in queues.iter().enumerate() {
        assert_eq!(q.session().core(), k);
    }
    let dev = rig
        .sim
        .reactor(0)
        .with_ctx(|cx| {
            let (name, rw, wz) = ("vol", AccessMode::ReadWrite, WriteZeroesMode::default());
            admin.open(&mut queues[0], cx.now(), name, rw, wz)
        })
        .unwrap();
    let mut opened = false;
    for _ in 0..MAX_STEPS {
        let (_, ev) = turn_all(&mut rig, &mut admin, &mut queues);
        if ev.iter().any(|e| matches!(e, ClientEvent::Opened { .. })) {
            opened = true;
            break;
        }
    }
    assert!(opened, "vol did not open: {:?}", session.paths());
    // Queue k writes block k; queue (k + 1) % 3 reads it back.
    let (wbuf, rbuf) = (rig.mr(4096), rig.mr(4096));
    for k in 0..3 {
        wbuf.write_at(0, &[k as u8 + 1; 4096]);
        for (q, req, buf) in [
            (k, BlockRequest::write(k as u64 * 4096, 4096), &wbuf),
            (
                (k + 1) % 3,
                BlockRequest::read(k as u64 * 4096, 4096),
                &rbuf,
            ),
        ] {
            let sgl = [buf.sge(0, 4096)];
            rig.sim
                .reactor(0)
                .with_ctx(|cx| queues[q].submit(cx.now(), dev, 7, &req, &sgl))
                .unwrap();
            let mut done = Vec::new();
            for _ in 0..MAX_STEPS {
                done = turn_all(&mut rig, &mut admin, &mut queues).0;
                if !done.is_empty() {
                    break;
                }
            }
            assert_eq!(done, vec![(q, 7, Ok(()))]);
        }
        let mut got = vec![0; 4096];
        rbuf.read_at(0, &mut got);
        assert_eq!(got, vec![k as u8 + 1; 4096]);
    }
    session.close();
    drop(queues);

    let cfg = ClientConfig::new("clt-0", vec![PathAddr::new(rig.addr)]);
    let f = Arc::clone(&rig.fabric);
    let e = rig
        .sim
        .reactor(0)
        .with_ctx(|cx| open_rnbd_session(cx, 0, f, cfg))
        .unwrap_err();
    assert!(
        matches!(
            e,
            BringUpError::ClientSession(ClientError::Cores { cores: 0, .. })
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "opening the RTRS session: session clt-0: 0 IO cores asked for, must be 1..=4095 \
         (one connection per core plus the control connection, at most 4096 in a conn_req's \
         cid_num)"
    );
    rig.stop();
}
