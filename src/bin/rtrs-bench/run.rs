//! The benchmark on the reactors: the client session opened on core 0 (its home core,
//! which also maps the device, as `rnbd-clt` does on map), one [`RnbdCore`] per other
//! core, and one poller per core that drives that core's [`Worker`] once the main thread
//! has handed out the plans. The main thread and the reactors meet only in [`Setup`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use rtrs_spdk::client::{ClientConfig, Session, SessionCore};
use rtrs_spdk::engine::{Ctx, Msg, PollResult};
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Sge};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    BlockRequest, ClientEvent, DevHandle, DeviceError, DeviceInfo, LinkListener, PortCompletion,
    RnbdClient, RnbdClientConfig, RnbdCore,
};

use crate::worker::{CoreReport, JobSpec, Live, Plan, Worker};

const BATCH: usize = 64;

/// What the main thread and the reactors share.
pub struct Setup {
    pub fabric: Arc<dyn Fabric>,
    pub device: String,
    pub mode: AccessMode,
    pub job: JobSpec,
    /// The mapped device (or why not), set by core 0.
    pub opened: Mutex<Option<Result<DeviceInfo, String>>>,
    handle: Mutex<Option<DevHandle>>,
    /// One plan per core (`None`: the core has no share), set by the main thread
    /// before `go`.
    pub plans: Mutex<Vec<Option<Plan>>>,
    pub go: AtomicBool,
    /// The main thread asks core 0 to unmap the device (run over or aborted).
    pub unmap: AtomicBool,
    /// The device is unmapped (or was never mapped).
    pub unmapped: AtomicBool,
    pub lives: Vec<Arc<Live>>,
    /// SIGINT/SIGTERM: the workers end their run early.
    pub stop: Arc<AtomicBool>,
    reports: Mutex<mpsc::Sender<CoreReport>>,
}

impl Setup {
    pub fn new(
        fabric: Arc<dyn Fabric>,
        device: String,
        mode: AccessMode,
        job: JobSpec,
        cores: usize,
        stop: Arc<AtomicBool>,
        reports: mpsc::Sender<CoreReport>,
    ) -> Arc<Setup> {
        Arc::new(Setup {
            fabric,
            device,
            mode,
            job,
            opened: Mutex::new(None),
            handle: Mutex::new(None),
            plans: Mutex::new(vec![None; cores]),
            go: AtomicBool::new(false),
            unmap: AtomicBool::new(false),
            unmapped: AtomicBool::new(false),
            lives: (0..cores).map(|_| Arc::new(Live::default())).collect(),
            stop,
            reports: Mutex::new(reports),
        })
    }

    fn set_opened(&self, r: Result<DeviceInfo, String>) {
        let mut o = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        if o.is_none() {
            *o = Some(r);
        }
    }

    /// This core's worker, once the plans are out (`None` if it has no share).
    fn make_worker(&self, core: usize) -> Result<Option<Worker>, String> {
        let plan = self.plans.lock().unwrap_or_else(|e| e.into_inner())[core];
        let Some(plan) = plan else {
            return Ok(None);
        };
        let len = plan.qd * self.job.bs as usize;
        let buf = self
            .fabric
            .register(
                MemBuf::zeroed(len),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .map_err(|e| format!("registering the {len}-byte IO buffer of core {core}: {e}"))?;
        let tx = self
            .reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let seed = self.job.run_id ^ (core as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Ok(Some(Worker::new(
            self.job,
            plan,
            Arc::new(buf),
            seed,
            Arc::clone(&self.lives[core]),
            Arc::clone(&self.stop),
            tx,
        )))
    }
}

/// Core 0: the RNBD client (device map/unmap, link events) and core 0's worker.
struct Home {
    setup: Arc<Setup>,
    client: RnbdClient<SessionCore>,
    dev: Option<DevHandle>,
    worker: Option<Worker>,
    started: bool,
    closing: bool,
    events: Vec<ClientEvent>,
}

impl Home {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let n = self.client.poll(cx, &mut self.events);
        let now = cx.now();
        for i in 0..n {
            match &self.events[i] {
                ClientEvent::Opened { dev, info, remap } => {
                    if *remap {
                        tracing::warn!(
                            "device '{}' re-opened after a reconnect: waiting IO goes on",
                            self.setup.device
                        );
                    } else {
                        self.dev = Some(*dev);
                        *self.setup.handle.lock().unwrap_or_else(|e| e.into_inner()) = Some(*dev);
                        self.setup.set_opened(Ok(*info));
                    }
                }
                ClientEvent::OpenFailed { error, .. } => {
                    if self.dev.is_none() {
                        self.setup.set_opened(Err(error.to_string()));
                        self.setup.unmapped.store(true, Ordering::Release);
                    } else {
                        tracing::error!("re-opening the device after a reconnect failed: {error}");
                    }
                }
                ClientEvent::Closed { .. } => self.setup.unmapped.store(true, Ordering::Release),
                ClientEvent::Io { tag, errno } => {
                    if let Some(w) = self.worker.as_mut() {
                        w.complete(now, *tag, *errno);
                        if *errno != 0 {
                            w.explain(self.client.last_wait_error());
                        }
                    }
                }
                // Not sent (the session was refused or closed): the OPEN behind it
                // fails with the same reason and names the device.
                ClientEvent::SessInfo(Err(DeviceError::NotSent { .. })) => {}
                ClientEvent::SessInfo(Err(e)) => {
                    self.setup
                        .set_opened(Err(format!("session info exchange failed: {e}")));
                    self.setup.unmapped.store(true, Ordering::Release);
                }
                ClientEvent::SessInfo(Ok(_)) => {}
            }
        }
        let mut busy = n > 0;
        if !self.started && self.setup.go.load(Ordering::Acquire) {
            self.started = true;
            match self.setup.make_worker(0) {
                Ok(w) => {
                    // Reads land in the buffer directly (no bounce copy).
                    if let Some(w) = &w {
                        self.client.port_mut().add_region(w.buffer());
                    }
                    self.worker = w;
                }
                Err(e) => fail_core(&self.setup, e),
            }
        }
        if let (Some(w), Some(dev)) = (self.worker.as_mut(), self.dev) {
            let client = &mut self.client;
            busy |= w.pump(cx, &mut |cx: &mut dyn Ctx,
                                     tag,
                                     req: &BlockRequest,
                                     sgl: &[Sge]| {
                client.submit(cx, dev, tag, req, sgl)
            });
        }
        if !self.closing && self.setup.unmap.load(Ordering::Acquire) {
            self.closing = true;
            match self.dev {
                Some(dev) if self.client.close(cx, dev).is_ok() => {}
                _ => self.setup.unmapped.store(true, Ordering::Release),
            }
        }
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }
}

/// A core whose worker could not start reports an empty, failed share.
fn fail_core(setup: &Setup, why: String) {
    tracing::error!("{why}");
    let r = CoreReport {
        reads: 0,
        writes: 0,
        bytes: 0,
        errors: 1,
        first_errno: -libc::ENOMEM,
        first_error: None,
        mismatches: 0,
        first_bad: None,
        elapsed_ns: 1,
        hist: crate::hist::Hist::new(),
    };
    let _ = setup
        .reports
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(r);
}

/// Cores 1..n: block IO of the device through this core's connection.
struct Other {
    setup: Arc<Setup>,
    core: RnbdCore<SessionCore>,
    worker: Option<Worker>,
    dev: Option<DevHandle>,
    started: bool,
    done: [PortCompletion; BATCH],
}

impl Other {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let n = self.core.poll(cx, &mut self.done);
        let now = cx.now();
        if let Some(w) = self.worker.as_mut() {
            for c in &self.done[..n] {
                w.complete(now, c.tag, c.errno);
                if c.errno != 0 {
                    w.explain(self.core.last_wait_error());
                }
            }
        }
        let mut busy = n > 0;
        if !self.started && self.setup.go.load(Ordering::Acquire) {
            self.started = true;
            self.dev = *self.setup.handle.lock().unwrap_or_else(|e| e.into_inner());
            match self.setup.make_worker(cx.core()) {
                Ok(w) => {
                    if let Some(w) = &w {
                        self.core.port_mut().add_region(w.buffer());
                    }
                    self.worker = w;
                }
                Err(e) => fail_core(&self.setup, e),
            }
        }
        if let (Some(w), Some(dev)) = (self.worker.as_mut(), self.dev) {
            let core = &mut self.core;
            busy |= w.pump(cx, &mut |cx: &mut dyn Ctx,
                                     tag,
                                     req: &BlockRequest,
                                     sgl: &[Sge]| {
                core.submit(cx, dev, tag, req, sgl)
            });
        }
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }
}

/// The message that opens the session on core 0 and starts every core's poller; the
/// session handle (or why it could not open) comes back on `tx`.
pub fn start_msg(
    setup: Arc<Setup>,
    config: ClientConfig,
    tx: mpsc::Sender<Result<Session, String>>,
) -> Msg {
    Msg::new(move |cx: &mut dyn Ctx| {
        let links = LinkListener::new();
        let opened = Session::open(
            cx,
            Arc::clone(&setup.fabric),
            config,
            Box::new(links.clone()),
        );
        let (session, mut cores) = match opened {
            Ok(x) => x,
            Err(e) => {
                let _ = tx.send(Err(e.to_string()));
                return;
            }
        };
        let replies = match setup
            .fabric
            .register(MemBuf::zeroed(4096), Access::LOCAL_WRITE)
        {
            Ok(m) => m,
            Err(e) => {
                session.close();
                let _ = tx.send(Err(format!("registering the reply buffer: {e}")));
                return;
            }
        };
        let rest: Vec<SessionCore> = cores.drain(1..).collect();
        let rnbd_config = RnbdClientConfig {
            write_zeroes: setup.job.write_zeroes,
        };
        let mut client = match RnbdClient::with_config(cores.remove(0), replies, rnbd_config) {
            Ok(c) => c,
            Err(e) => {
                session.close();
                let _ = tx.send(Err(e.to_string()));
                return;
            }
        };
        client.listen(links);
        let shared = client.shared();
        if let Err(e) = client.open(cx, &setup.device, setup.mode) {
            session.close();
            let _ = tx.send(Err(e.to_string()));
            return;
        }
        for (i, sc) in rest.into_iter().enumerate() {
            let setup = Arc::clone(&setup);
            let shared = Arc::clone(&shared);
            let r = cx.defer(i + 1, move |cx: &mut dyn Ctx| {
                let mut o = Other {
                    setup,
                    core: RnbdCore::new(sc, shared),
                    worker: None,
                    dev: None,
                    started: false,
                    done: [PortCompletion::default(); BATCH],
                };
                cx.register(Box::new(move |cx: &mut dyn Ctx| o.poll(cx)));
            });
            if let Err(e) = r {
                session.close();
                let _ = tx.send(Err(format!("starting core {}: {e}", i + 1)));
                return;
            }
        }
        let mut home = Home {
            setup,
            client,
            dev: None,
            worker: None,
            started: false,
            closing: false,
            events: vec![ClientEvent::Io { tag: 0, errno: 0 }; BATCH],
        };
        cx.register(Box::new(move |cx: &mut dyn Ctx| home.poll(cx)));
        let _ = tx.send(Ok(session));
    })
}
