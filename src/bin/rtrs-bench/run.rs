//! The benchmark on the reactors: the client session opened on core 0 with one
//! [`RnbdQueue`] per core ([`open_rnbd_session`]) and one poller per core that drives
//! that core's queue and [`Worker`] once the main thread has handed out the plans.
//! Core 0's poller also runs the session's [`RnbdAdmin`] through its queue (it maps the
//! device, as `rnbd-clt` does on map). The main thread and the reactors meet only in
//! [`Setup`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use rtrs_spdk::client::{ClientCompletion, ClientConfig, ClientSession, CoreCq, SessionCore};
use rtrs_spdk::engine::{Ctx, Msg, PollResult};
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Sge};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    completion_result, open_rnbd_session, BlockRequest, ClientEvent, DevHandle, DeviceError,
    DeviceInfo, RnbdAdmin, RnbdClientSession, RnbdQueue,
};
use rtrs_spdk::sync::lock;
use rtrs_spdk::Errno;

use crate::worker::{CoreReport, JobPlan, JobSpec, Live, Worker};

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
    pub plans: Mutex<Vec<Option<JobPlan>>>,
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
        let mut o = lock(&self.opened);
        if o.is_none() {
            *o = Some(r);
        }
    }

    /// This core's worker, once the plans are out (`None` if it has no share).
    fn make_worker(&self, core: usize) -> Result<Option<Worker>, String> {
        let plan = lock(&self.plans)[core];
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
        let tx = lock(&self.reports).clone();
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

/// The admin side of the session on core 0: maps the device (as `rnbd-clt` does on
/// map), follows link events, unmaps when the main thread asks.
struct AdminRun {
    admin: RnbdAdmin,
    closing: bool,
    events: Vec<ClientEvent>,
}

impl AdminRun {
    /// Polls the admin through core 0's `queue`; returns whether anything happened.
    fn poll(&mut self, setup: &Setup, queue: &mut RnbdQueue<SessionCore>, now: u64) -> bool {
        let n = self.admin.poll(queue, now, &mut self.events);
        for ev in &self.events[..n] {
            match ev {
                ClientEvent::Opened { dev, info, remap } => {
                    if *remap {
                        tracing::warn!(
                            "device '{}' re-opened after a reconnect: waiting IO goes on",
                            setup.device
                        );
                    } else {
                        *lock(&setup.handle) = Some(*dev);
                        setup.set_opened(Ok(*info));
                    }
                }
                ClientEvent::OpenFailed { error, .. } => {
                    let mapped = lock(&setup.handle).is_some();
                    if mapped {
                        tracing::error!("re-opening the device after a reconnect failed: {error}");
                    } else {
                        setup.set_opened(Err(error.to_string()));
                        setup.unmapped.store(true, Ordering::Release);
                    }
                }
                ClientEvent::Closed { .. } => setup.unmapped.store(true, Ordering::Release),
                ClientEvent::ServerClosed { .. } => tracing::error!(
                    "the target closed device '{}' (its operator's forced close): IO fails",
                    setup.device
                ),
                // The bench sets no loss timeout and asks for no remap.
                ClientEvent::Lost { .. } | ClientEvent::Remapped { .. } => {}
                // Not sent (the session was refused or closed): the OPEN behind it
                // fails with the same reason and names the device.
                ClientEvent::SessInfo(Err(DeviceError::NotSent { .. })) => {}
                ClientEvent::SessInfo(Err(e)) => {
                    setup.set_opened(Err(format!("session info exchange failed: {e}")));
                    setup.unmapped.store(true, Ordering::Release);
                }
                ClientEvent::SessInfo(Ok(_)) | ClientEvent::Io { .. } => {}
            }
        }
        if !self.closing && setup.unmap.load(Ordering::Acquire) {
            self.closing = true;
            let dev = *lock(&setup.handle);
            match dev {
                Some(dev) if self.admin.close(queue, now, dev).is_ok() => {}
                _ => setup.unmapped.store(true, Ordering::Release),
            }
        }
        n > 0
    }
}

/// A core whose worker could not start reports an empty, failed share.
fn fail_core(setup: &Setup, why: String) {
    tracing::error!("{why}");
    let r = CoreReport {
        errors: 1,
        first_errno: Errno::ENOMEM.neg(),
        elapsed_ns: 1,
        ..CoreReport::empty()
    };
    let _ = lock(&setup.reports).send(r);
}

/// One core: block IO of the device through this core's connection, and on core 0
/// also the session's admin.
struct CoreRun {
    setup: Arc<Setup>,
    /// The core's shared completion queue (none where the fabric has none), polled
    /// once per loop before the queue (docs/ARCHITECTURE.md, "Completion queues").
    cq: Option<CoreCq>,
    queue: RnbdQueue<SessionCore>,
    admin: Option<Box<AdminRun>>,
    worker: Option<Worker>,
    dev: Option<DevHandle>,
    started: bool,
    done: [ClientCompletion; BATCH],
}

impl CoreRun {
    /// On the core's thread.
    fn new(setup: Arc<Setup>, mut queue: RnbdQueue<SessionCore>) -> CoreRun {
        let core = queue.session().core();
        let cq = match CoreCq::new(&*setup.fabric, core) {
            Ok(cq) => queue.session_mut().attach(&cq).then_some(cq),
            Err(e) => {
                tracing::debug!(core, "private completion queues: {e}");
                None
            }
        };
        CoreRun {
            setup,
            cq,
            queue,
            admin: None,
            worker: None,
            dev: None,
            started: false,
            done: [ClientCompletion::default(); BATCH],
        }
    }

    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let now = cx.now();
        if let Some(cq) = self.cq.as_mut() {
            cq.poll();
        }
        let n = self.queue.poll(now, &mut self.done);
        if let Some(w) = self.worker.as_mut() {
            for c in &self.done[..n] {
                let result = completion_result(c);
                w.complete(now, c.tag, result);
                if result.is_err() {
                    w.explain(self.queue.last_wait_error());
                }
            }
        }
        let mut busy = n > 0;
        if let Some(a) = self.admin.as_mut() {
            busy |= a.poll(&self.setup, &mut self.queue, now);
        }
        if !self.started && self.setup.go.load(Ordering::Acquire) {
            self.started = true;
            self.dev = *lock(&self.setup.handle);
            match self.setup.make_worker(cx.core()) {
                Ok(w) => {
                    // Reads land in the buffer directly (no bounce copy).
                    if let Some(w) = &w {
                        self.queue.session_mut().add_region(w.buffer());
                    }
                    self.worker = w;
                }
                Err(e) => fail_core(&self.setup, e),
            }
        }
        if let (Some(w), Some(dev)) = (self.worker.as_mut(), self.dev) {
            let queue = &mut self.queue;
            busy |= w.pump(now, &mut |now, tag, req: &BlockRequest, sgl: &[Sge]| {
                queue.submit(now, dev, tag, req, sgl)
            });
        }
        // This loop's requests go out now, not at the next poll.
        self.queue.push();
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
    tx: mpsc::Sender<Result<ClientSession, String>>,
) -> Msg {
    Msg::new(move |cx: &mut dyn Ctx| {
        let cores = cx.cores();
        let rnbd = match open_rnbd_session(cx, cores, Arc::clone(&setup.fabric), config) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(Err(e.to_string()));
                return;
            }
        };
        let RnbdClientSession {
            session,
            mut admin,
            queues,
        } = rnbd;
        let mut queues = queues.into_iter();
        let Some(mut home) = queues.next() else {
            session.close();
            let _ = tx.send(Err("the session has no core".to_string()));
            return;
        };
        let wz = setup.job.write_zeroes;
        if let Err(e) = admin.open(&mut home, cx.now(), &setup.device, setup.mode, wz) {
            session.close();
            let _ = tx.send(Err(e.to_string()));
            return;
        }
        for (i, queue) in queues.enumerate() {
            let setup = Arc::clone(&setup);
            let r = cx.defer(i + 1, move |cx: &mut dyn Ctx| {
                let mut run = CoreRun::new(setup, queue);
                cx.register(Box::new(move |cx: &mut dyn Ctx| run.poll(cx)));
            });
            if let Err(e) = r {
                session.close();
                let _ = tx.send(Err(format!("starting core {}: {e}", i + 1)));
                return;
            }
        }
        let mut run = CoreRun::new(setup, home);
        run.admin = Some(Box::new(AdminRun {
            admin,
            closing: false,
            events: vec![ClientEvent::SessInfo(Ok(0)); BATCH],
        }));
        cx.register(Box::new(move |cx: &mut dyn Ctx| run.poll(cx)));
        let _ = tx.send(Ok(session));
    })
}
