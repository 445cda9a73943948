//! The whole IO path does not allocate in steady state: RNBD block reads, writes and
//! write-zeroes (emulated with writes from the shared zero buffer) from an `RnbdClient` over an RTRS client session, the loopback fabric, the RTRS
//! server, the RNBD server and a RAM export, all on one simulated reactor stepped by
//! hand on this thread. After a warm-up (queues and tables reach their working size),
//! every allocation on this thread — reactor loop, pollers, fabric, client, server —
//! is counted over hundreds of IOs and must be zero.

use crate::counting;

use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::client::{ClientConfig, ClientSession, PathAddr, SessionCore};
use rtrs_spdk::engine::Simulation;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Mr};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    open_rnbd_session, BlockRequest, ClientEvent, DevHandle, RnbdClient, RnbdClientSession,
};
use rtrs_spdk::rnbd::server::{Exports, RnbdServer};
use rtrs_spdk::server::{Server, ServerConfig};

/// Upper bound of simulation steps for one wait.
const MAX_STEPS: usize = 100_000;
const QD: usize = 8;
const BS: u32 = 4096;

struct Rig {
    sim: Simulation,
    rnbd: RnbdClient<SessionCore>,
    dev: DevHandle,
    events: Vec<ClientEvent>,
    fabric: Arc<dyn Fabric>,
    _session: ClientSession,
    _server: Server,
}

impl Rig {
    fn new(always_invalidate: bool) -> Rig {
        let mut sim = Simulation::new(1, 4096);
        let fabric: Arc<dyn Fabric> = Arc::new(LoopbackFabric::new());
        let exports = Arc::new(Exports::ram(&[("vol", 4 << 20)]).unwrap());
        let cfg = ServerConfig {
            queue_depth: 32,
            chunk_size: 64 << 10,
            always_invalidate,
            ..ServerConfig::default()
        };
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let f = Arc::clone(&fabric);
        let server = sim
            .reactor(0)
            .with_ctx(|cx| Server::start(cx, f, &[listen], cfg, RnbdServer::factory(exports)))
            .expect("server start");
        sim.run_until_idle(100);
        let ccfg = ClientConfig::new("alloc", vec![PathAddr::new(server.local_addrs()[0])]);
        let f = Arc::clone(&fabric);
        let RnbdClientSession {
            session,
            admin,
            mut queues,
        } = sim
            .reactor(0)
            .with_ctx(|cx| open_rnbd_session(cx, 1, f, ccfg))
            .expect("session open");
        let mut rnbd = RnbdClient::from_parts(admin, queues.remove(0));
        let dev = sim
            .reactor(0)
            .with_ctx(|cx| rnbd.open(cx.now(), "vol", AccessMode::ReadWrite))
            .unwrap();
        let mut rig = Rig {
            sim,
            rnbd,
            dev,
            events: vec![
                ClientEvent::Io {
                    tag: 0,
                    result: Ok(())
                };
                64
            ],
            fabric,
            _session: session,
            _server: server,
        };
        for _ in 0..MAX_STEPS {
            let n = rig.poll();
            if rig.events[..n]
                .iter()
                .any(|e| matches!(e, ClientEvent::Opened { .. }))
            {
                return rig;
            }
        }
        panic!("the device was not opened");
    }

    /// One reactor loop, then the client polled; how many events it reported.
    fn poll(&mut self) -> usize {
        self.sim.step();
        let (rnbd, out) = (&mut self.rnbd, &mut self.events);
        self.sim.reactor(0).with_ctx(|cx| rnbd.poll(cx.now(), out))
    }

    /// `ios` block IOs at queue depth [`QD`] (reads, writes and 128 KiB write-zeroes in
    /// turn, over the first `QD` 4 KiB units of `buf`); returns the allocations counted
    /// meanwhile.
    fn run(&mut self, buf: &Mr, ios: usize) -> u64 {
        counting::reset();
        let (mut sent, mut done) = (0usize, 0usize);
        let mut free: [bool; QD] = [true; QD];
        for _ in 0..MAX_STEPS {
            for (slot, f) in free.iter_mut().enumerate() {
                if !*f || sent == ios {
                    continue;
                }
                let off = u64::from(BS) * (sent % 512) as u64;
                let req = match sent % 3 {
                    0 => BlockRequest::read(off, BS),
                    1 => BlockRequest::write(off, BS),
                    _ => BlockRequest::write_zeroes(off, 32 * BS),
                };
                let sge = [buf.sge(slot * BS as usize, BS as usize)];
                let sgl: &[_] = if req.data_len() > 0 { &sge } else { &[] };
                let (rnbd, dev) = (&mut self.rnbd, self.dev);
                self.sim
                    .reactor(0)
                    .with_ctx(|cx| rnbd.submit(cx.now(), dev, slot as u64, &req, sgl))
                    .expect("submit");
                *f = false;
                sent += 1;
            }
            let n = self.poll();
            for e in &self.events[..n] {
                match e {
                    ClientEvent::Io { tag, result } => {
                        assert_eq!(*result, Ok(()), "IO {tag} failed");
                        free[*tag as usize] = true;
                        done += 1;
                    }
                    other => panic!("unexpected event {other:?}"),
                }
            }
            if done == ios {
                return counting::allocations();
            }
        }
        panic!("only {done} of {ios} IOs completed");
    }
}

fn steady_state(always_invalidate: bool) {
    counting::set_counting(false);
    let mut rig = Rig::new(always_invalidate);
    let buf = Arc::new(
        rig.fabric
            .register(
                MemBuf::zeroed(QD * BS as usize),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap(),
    );
    // Reads land in the buffer directly, as rtrs-bench does.
    rig.rnbd.session_mut().add_region(Arc::clone(&buf));
    // Warm-up: queues, tables and caches reach their working size.
    rig.run(&buf, 512);
    counting::set_counting(true);
    // The counter sees this thread's allocations (so a zero below means something).
    counting::reset();
    drop(std::hint::black_box(Box::new(0u64)));
    assert_eq!(counting::allocations(), 1);
    let allocs = rig.run(&buf, 1024);
    counting::set_counting(false);
    assert_eq!(allocs, 0, "allocations over 1024 IOs in steady state");
}

#[test]
fn io_path_does_not_allocate_always_invalidate() {
    steady_state(true);
}

#[test]
fn io_path_does_not_allocate_plain() {
    steady_state(false);
}
