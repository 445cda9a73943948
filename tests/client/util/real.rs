//! The real RTRS server (`rtrs_spdk::server`) as the target of client tests, on the
//! same simulated reactors: a RAM-disk handler (8-byte little-endian offset in the
//! user header), and a fabric wrapper that records the client's connections so a test
//! can break or blackhole one path from the loopback fabric's fault controls.

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rtrs_spdk::engine::{Ctx, Simulation};
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{
    Access, Conn, Cq, Fabric, FabricCaps, FabricError, FabricKind, FastMr, KeyScope, Listener,
    MemBuf, Mr,
};
use rtrs_spdk::server::{
    Dir, IoId, LinkEvent, Responses, Server, ServerConfig, ServerHandler, SessionId, SrvIo,
};

use super::{Rig, Setup};

/// Delegates to a loopback fabric and remembers `(local, peer)` of every connection it
/// initiated.
pub struct RecordingFabric {
    pub lo: Arc<LoopbackFabric>,
    pub conns: Mutex<Vec<(SocketAddr, SocketAddr)>>,
}

impl Fabric for RecordingFabric {
    fn kind(&self) -> FabricKind {
        self.lo.kind()
    }
    fn caps(&self) -> FabricCaps {
        self.lo.caps()
    }
    fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
        self.lo.domain()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.lo.as_any()
    }
    fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError> {
        self.lo.register(buf, access)
    }
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, FabricError> {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.lo.register_raw(addr, len, access) }
    }
    fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError> {
        self.lo.alloc_fast_mr(scope)
    }
    fn alloc_fast_mr_on(&self, scope: KeyScope, device: u8) -> Result<FastMr, FabricError> {
        self.lo.alloc_fast_mr_on(scope, device)
    }
    fn local_memory(
        &self,
        sge: &rtrs_spdk::fabric::Sge,
        need: Access,
    ) -> Option<Arc<rtrs_spdk::fabric::mem::Backing>> {
        self.lo.local_memory(sge, need)
    }
    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError> {
        self.lo.listen(addr, opts)
    }
    fn connect(
        &self,
        dst: SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        let c = self.lo.connect(dst, opts)?;
        if let (Some(l), Some(p)) = (c.local_addr(), c.peer_addr()) {
            self.conns.lock().unwrap().push((l, p));
        }
        Ok(c)
    }
    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        self.lo.create_cq(entries)
    }
}

/// The RAM disk shared by every core's handler.
pub struct Ram {
    pub bytes: Mutex<Vec<u8>>,
    pub events: Mutex<Vec<(String, LinkEvent)>>,
}

pub struct RamHandler(pub Arc<Ram>);

impl ServerHandler for RamHandler {
    fn link_event(&mut self, _cx: &mut dyn Ctx, _sess: SessionId, name: &str, ev: LinkEvent) {
        self.0.events.lock().unwrap().push((name.to_string(), ev));
    }

    fn request(&mut self, _cx: &mut dyn Ctx, io: SrvIo<'_>, out: &mut Responses) {
        let id: IoId = io.id;
        let off = io
            .usr
            .get(..8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
        let mut ram = self.0.bytes.lock().unwrap();
        let result = match off {
            Some(off) if off + io.data.len() <= ram.len() => {
                match io.dir {
                    // SAFETY: the request owns its chunk until it is answered below.
                    Dir::Write => unsafe {
                        ram[off..off + io.data.len()].copy_from_slice(io.data.as_slice())
                    },
                    // SAFETY: as above.
                    Dir::Read => unsafe {
                        io.data
                            .as_mut_slice()
                            .copy_from_slice(&ram[off..off + io.data.len()])
                    },
                }
                Ok(())
            }
            _ => Err(rtrs_spdk::Errno::EINVAL),
        };
        out.respond(id, result);
    }
}

/// A [`Rig`] against the real server.
pub struct RealHarness {
    pub rig: Rig,
    pub server: Option<Server>,
    pub rec: Arc<RecordingFabric>,
    pub ram: Arc<Ram>,
    pub cfg: ServerConfig,
    pub addrs: Vec<SocketAddr>,
}

impl std::ops::Deref for RealHarness {
    type Target = Rig;
    fn deref(&self) -> &Rig {
        &self.rig
    }
}

impl std::ops::DerefMut for RealHarness {
    fn deref_mut(&mut self) -> &mut Rig {
        &mut self.rig
    }
}

fn start(
    sim: &mut Simulation,
    rec: &Arc<RecordingFabric>,
    addrs: &[SocketAddr],
    cfg: &ServerConfig,
    ram: &Arc<Ram>,
) -> Server {
    let f: Arc<dyn Fabric> = rec.clone();
    let ram = ram.clone();
    let cfg = cfg.clone();
    sim.reactor(0)
        .with_ctx(|cx| {
            Server::start(cx, f, addrs, cfg, move |_core| {
                Box::new(RamHandler(ram.clone())) as Box<dyn ServerHandler>
            })
        })
        .expect("server start")
}

impl RealHarness {
    /// A server with `cfg` listening on `s.paths` loopback addresses, and the client.
    pub fn new(s: Setup, cfg: ServerConfig) -> RealHarness {
        let lo = Arc::new(LoopbackFabric::new());
        let rec = Arc::new(RecordingFabric {
            lo,
            conns: Mutex::new(Vec::new()),
        });
        let disk = s.cores * s.load_qd.max(1) * cfg.max_io_size() as usize;
        let ram = Arc::new(Ram {
            bytes: Mutex::new(vec![0; disk]),
            events: Mutex::new(Vec::new()),
        });
        let mut sim = Simulation::new(s.cores, 1024);
        let listen: Vec<SocketAddr> = (0..s.paths)
            .map(|_| "127.0.0.1:0".parse().unwrap())
            .collect();
        let server = start(&mut sim, &rec, &listen, &cfg, &ram);
        let addrs = server.local_addrs().to_vec();
        let f: Arc<dyn Fabric> = rec.clone();
        let rig = Rig::open(sim, f, &addrs, &s);
        RealHarness {
            rig,
            server: Some(server),
            rec,
            ram,
            cfg,
            addrs,
        }
    }

    fn client_ends(&self, path: usize) -> Vec<(SocketAddr, SocketAddr)> {
        let dst = self.addrs[path];
        self.rec
            .conns
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p)| *p == dst)
            .copied()
            .collect()
    }

    /// Breaks every live connection of path `i`, as a transport failure.
    pub fn break_path(&self, i: usize) {
        for (l, p) in self.client_ends(i) {
            if let Some(f) = self.rec.lo.faults_between(l, p) {
                f.break_now();
            }
        }
    }

    /// Path `i` goes silent: no RST, no traffic.
    pub fn blackhole_path(&self, i: usize) {
        for (l, p) in self.client_ends(i) {
            if let Some(f) = self.rec.lo.faults_between(l, p) {
                f.blackhole();
            }
        }
    }

    /// The target goes down: the server stops, every connection breaks.
    pub fn stop_target(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
            for i in 0..self.addrs.len() {
                self.break_path(i);
            }
            let done = self.rig.run_until(100_000, 1000, |_| s.is_stopped());
            assert!(done, "server did not stop");
        }
    }

    /// The target comes back on the same addresses with `cfg` (the RAM disk is kept).
    pub fn start_target(&mut self) {
        let s = start(
            &mut self.rig.sim,
            &self.rec,
            &self.addrs,
            &self.cfg,
            &self.ram,
        );
        self.server = Some(s);
    }
}
