//! One rtrs bdev: an RNBD device mapped over an RTRS client session whose pollers run
//! on SPDK threads of ours, one per core of the application's cpumask (DESIGN.md §3).
//! The kernel's `rnbd_clt_dev` with its gendisk; here the "disk" is an `spdk_bdev`.
//!
//! IO: each core of the disk has a port ([`PortState`]: that core's session handle) that
//! the IO channel on its CPU core owns and polls, or the disk's own thread on the core
//! while no channel does (see [`super::channel`] and [`super::core`]).
//!
//! Life: [`create`] opens the session on core 0 and sends OPEN; the JSON-RPC request is
//! answered later, from the OPEN's answer ([`Disk::opened`] registers the bdev on the
//! application thread, then answers with its name; [`Disk::open_failed`] answers with the
//! error and tears down). Deleting goes through `spdk_bdev_unregister` →
//! `destruct` → the io_device is unregistered → the home poller sends CLOSE, closes the
//! session, waits for its paths → the threads stop → `spdk_bdev_destruct_done`.

use std::ffi::{c_int, c_void, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rtrs_spdk::client::{MpPolicy, PathAddr, Session};
use rtrs_spdk::engine::Ctx;
use rtrs_spdk::fabric::{Access, MemBuf, Psk};
use rtrs_spdk::rnbd::client::{DeviceInfo, LinkListener, RnbdClient, RnbdCore};
use rtrs_spdk::spdk::{app_cores, Driver, RpcRequest, SpdkThread};
use serde_json::{json, Value};

use super::channel;
use super::core::{CorePoller, CoreSlot, PortState};
use super::params::{access_name, path_keys, CreateParams, PathParam};
use super::task::{self, ChanShared};
use super::{client_fabric, fn_table, registry, ClientFabric};

/// Period (µs) of the disk's own pollers (see [`make_driver`]).
const DISK_POLL_US: u64 = 100;

/// An rtrs bdev and everything behind it.
pub struct Disk {
    pub params: CreateParams,
    /// Paths as they are now (add/remove_path), for config_json and get_sessions.
    pub paths: Mutex<Vec<PathParam>>,
    /// The keys of the paths created with one (read from the keyring at create).
    psks: Vec<(PathAddr, Psk)>,
    fabric: Arc<ClientFabric>,
    driver: Arc<Driver>,
    cpus: Vec<u32>,
    slots: Box<[CoreSlot]>,
    /// Every IO channel of the bdev (resets count their outstanding requests).
    chans: Mutex<Vec<Arc<ChanShared>>>,
    session: OnceLock<Session>,
    info: OnceLock<DeviceInfo>,
    /// The registered bdev (null before OPEN succeeded).
    bdev: AtomicPtr<rtrs_spdk::spdk::sys::spdk_bdev>,
    /// The create RPC, until answered.
    pending: Mutex<Option<RpcRequest>>,
    closing: AtomicBool,
    /// Rate limit of IO error logs (ns of the last one).
    last_err_log: AtomicU64,
}

impl Disk {
    pub fn name(&self) -> &str {
        &self.params.name
    }

    pub fn mem(&self) -> &super::memmap::MemMap {
        &self.fabric.mem
    }

    pub fn session(&self) -> Option<&Session> {
        self.session.get()
    }

    pub fn info(&self) -> Option<&DeviceInfo> {
        self.info.get()
    }

    pub fn is_open(&self) -> bool {
        !self.bdev.load(Ordering::Acquire).is_null()
    }

    /// The disk's core on CPU core `cpu` (core 0 for a thread off the cpumask, as fio's).
    pub fn core_of_cpu(&self, cpu: u32) -> usize {
        self.cpus.iter().position(|&c| c == cpu).unwrap_or(0)
    }

    /// Whether CPU core `cpu` is one of the application's (a core of the disk).
    pub fn on_mask(&self, cpu: u32) -> bool {
        self.cpus.contains(&cpu)
    }

    /// Core `core`'s port slot and queue.
    pub fn slot(&self, core: usize) -> &CoreSlot {
        &self.slots[core]
    }

    pub fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    pub fn add_channel(&self, chan: &Arc<ChanShared>) {
        lock(&self.chans).push(Arc::clone(chan));
    }

    pub fn remove_channel(&self, chan: &Arc<ChanShared>) {
        lock(&self.chans).retain(|c| !Arc::ptr_eq(c, chan));
    }

    /// Bdev IO taken by the channels and not completed yet (resets aside).
    pub fn outstanding(&self) -> u64 {
        lock(&self.chans).iter().map(|c| c.outstanding()).sum()
    }

    pub fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    pub fn close_session(&self) {
        if let Some(s) = self.session.get() {
            s.close();
        }
    }

    pub fn session_gone(&self) -> bool {
        self.session.get().map_or(true, |s| s.paths().is_empty())
    }

    pub fn log_io_error(&self, e: &dyn std::fmt::Display) {
        let now = rtrs_spdk::spdk::now_ns();
        let last = self.last_err_log.load(Ordering::Relaxed);
        if now.saturating_sub(last) > 1_000_000_000
            && self
                .last_err_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!("rtrs bdev {}: IO refused: {e}", self.params.name);
        }
    }

    /// OPEN succeeded (home core): register the bdev on the application thread.
    pub fn opened(self: &Arc<Self>, info: DeviceInfo) {
        let _ = self.info.set(info);
        let disk = Arc::clone(self);
        let post = SpdkThread::app().map(|t| t.send(move || disk.register()));
        if !matches!(post, Some(Ok(()))) {
            self.open_failed("could not reach the application thread to register the bdev");
        }
    }

    /// OPEN (or the session) failed: answer the RPC and tear down.
    pub fn open_failed(&self, why: &str) {
        let msg = format!(
            "bdev_rtrs_create: 'device' = {:?} over session {:?}: {why}",
            self.params.device, self.params.sessname
        );
        tracing::error!("{msg}");
        if let Some(req) = self.pending.lock().ok().and_then(|mut p| p.take()) {
            req.error(-libc::ENODEV, &msg);
        }
        self.closing.store(true, Ordering::Release);
    }

    /// On the application thread: io_device and bdev registration, then the answer.
    fn register(self: Arc<Self>) {
        let Some(info) = self.info.get().copied() else {
            return;
        };
        if self.closing() {
            return;
        }
        let bs = info.logical_block_size;
        let blocks = |bytes: u64| u32::try_from(bytes / u64::from(bs)).unwrap_or(u32::MAX);
        let name = CString::new(self.params.name.clone()).unwrap_or_default();
        let mut b = Box::<rtrs_spdk::spdk::sys::spdk_bdev>::default();
        b.name = name.into_raw();
        b.product_name = c"RTRS disk".as_ptr().cast_mut();
        b.blocklen = bs;
        b.phys_blocklen = info.physical_block_size.max(bs);
        b.blockcnt = info.size / u64::from(bs);
        b.write_cache = c_int::from(info.write_cache);
        b.max_rw_size = blocks(u64::from(info.max_io_size)).max(1);
        b.optimal_io_boundary = b.max_rw_size;
        b.max_num_segments = task::MAX_IOVS;
        b.max_unmap = blocks(info.max_discard.min(u64::from(u32::MAX)));
        b.max_unmap_segments = 1;
        b.max_write_zeroes = blocks(info.max_write_zeroes.min(u64::from(u32::MAX)));
        b.module = super::module_ptr();
        b.fn_table = fn_table();
        let me = Arc::into_raw(Arc::clone(&self)).cast_mut().cast::<c_void>();
        b.ctxt = me;
        let bdev = Box::into_raw(b);
        // SAFETY: `me` is the disk, kept alive by the reference held in `ctxt` until
        // destruct; the callbacks are ours; the name is copied.
        unsafe {
            rtrs_spdk::spdk::sys::spdk_io_device_register(
                me,
                Some(channel::chan_create),
                Some(channel::chan_destroy),
                channel::chan_ctx_size(),
                (*bdev).name,
            );
        }
        // SAFETY: a fully set up bdev, registered once on the application thread.
        let rc = unsafe { rtrs_spdk::spdk::sys::spdk_bdev_register(bdev) };
        if rc != 0 {
            // SAFETY: registration failed, so SPDK keeps nothing of the bdev.
            unsafe {
                rtrs_spdk::spdk::sys::spdk_io_device_unregister(me, None);
                free_bdev(bdev);
            }
            self.open_failed(&format!("spdk_bdev_register failed: {}", errno_str(rc)));
            return;
        }
        self.bdev.store(bdev, Ordering::Release);
        tracing::info!(
            "rtrs bdev {}: {} blocks of {} B, max IO {} B",
            self.params.name,
            info.size / u64::from(bs),
            bs,
            info.max_io_size
        );
        if let Some(req) = self.pending.lock().ok().and_then(|mut p| p.take()) {
            req.ok(json!(self.params.name));
        }
    }

    /// `destruct` (application thread): unregister the io_device, then close.
    pub fn destruct(self: &Arc<Self>) {
        let me = Arc::as_ptr(self).cast_mut().cast::<c_void>();
        // SAFETY: our io_device; the callback runs once every channel is gone.
        unsafe { rtrs_spdk::spdk::sys::spdk_io_device_unregister(me, Some(io_device_gone)) };
    }

    /// Stops the disk's threads (from the home core, at the end of closing) and finishes.
    pub fn stop(self: &Arc<Self>) {
        let disk = Arc::clone(self);
        let post = SpdkThread::app().map(|t| {
            t.send(move || {
                let d = Arc::clone(&disk);
                stop_driver(&disk.driver, move || d.finished());
            })
        });
        if !matches!(post, Some(Ok(()))) {
            tracing::error!(
                "rtrs bdev {}: could not post the final stop",
                self.params.name
            );
        }
    }

    /// Everything is down: tell the bdev layer and forget the disk.
    fn finished(self: Arc<Self>) {
        registry().retain(|d| !Arc::ptr_eq(d, &self));
        let bdev = self.bdev.swap(ptr::null_mut(), Ordering::AcqRel);
        if !bdev.is_null() {
            // SAFETY: the bdev was registered by us and is being destructed; SPDK is done
            // with it once destruct_done returns.
            unsafe {
                rtrs_spdk::spdk::sys::spdk_bdev_destruct_done(bdev, 0);
                let ctxt = (*bdev).ctxt;
                free_bdev(bdev);
                drop(Arc::from_raw(ctxt.cast::<Disk>().cast_const()));
            }
        }
    }

    /// Why no path can ever connect as configured, when every path of the session was
    /// refused for good (authentication failed).
    pub fn refused(&self) -> Option<String> {
        let s = self.session.get()?;
        let why: Option<Vec<String>> = s.paths().iter().map(|(a, _)| s.path_failure(*a)).collect();
        why.filter(|w| !w.is_empty()).map(|w| w.join("; "))
    }

    pub fn policy(&self) -> MpPolicy {
        self.session
            .get()
            .map_or(self.params.mp_policy, Session::policy)
    }

    /// `bdev_rtrs_create`'s params as they would rebuild this disk now.
    pub fn config(&self) -> Value {
        let paths = self.paths.lock().map(|p| p.clone()).unwrap_or_default();
        self.params.to_json(self.policy(), &paths)
    }

    /// `bdev_rtrs_get_sessions`' entry.
    pub fn describe(&self) -> Value {
        let stats: Value = self
            .session
            .get()
            .and_then(|s| serde_json::from_str(&s.stats().to_json()).ok())
            .unwrap_or(Value::Null);
        let paths: Vec<Value> = self.session.get().map_or_else(Vec::new, |s| {
            s.paths()
                .into_iter()
                .map(|(a, st)| {
                    let mut p = json!({"path": a.to_string(), "state": st.name()});
                    if let Some(f) = s.path_failure(a) {
                        p["failure"] = json!(f);
                    }
                    p
                })
                .collect()
        });
        let state = if self.closing() {
            "closing"
        } else if self.is_open() {
            "open"
        } else {
            "opening"
        };
        let mut v = json!({
            "name": self.params.name,
            "sessname": self.params.sessname,
            "device": self.params.device,
            "access_mode": access_name(self.params.access_mode),
            "mp_policy": self.policy().name(),
            "state": state,
            "paths_up": self.session.get().map_or(0, Session::paths_up),
            "paths": paths,
            "stats": stats,
        });
        if let Some(i) = self.info.get() {
            v["device_info"] = json!({
                "device_id": i.device_id,
                "size": i.size,
                "logical_block_size": i.logical_block_size,
                "physical_block_size": i.physical_block_size,
                "max_io_size": i.max_io_size,
                "max_discard": i.max_discard,
                "max_write_zeroes": i.max_write_zeroes,
                "write_cache": i.write_cache,
            });
        }
        v
    }
}

unsafe extern "C" fn io_device_gone(io_device: *mut c_void) {
    // SAFETY: the disk's address; the bdev's reference keeps it alive until finished().
    let disk = unsafe {
        Arc::increment_strong_count(io_device as *const Disk);
        Arc::from_raw(io_device as *const Disk)
    };
    disk.closing.store(true, Ordering::Release);
}

/// # Safety
/// `bdev` must come from `Box::into_raw` in `register`, with its name from
/// `CString::into_raw`, and no longer be known to SPDK.
unsafe fn free_bdev(bdev: *mut rtrs_spdk::spdk::sys::spdk_bdev) {
    // SAFETY: per the contract.
    unsafe {
        let b = Box::from_raw(bdev);
        if !b.name.is_null() {
            drop(CString::from_raw(b.name));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn errno_str(rc: i32) -> String {
    std::io::Error::from_raw_os_error(rc.abs()).to_string()
}

/// The disk's cores: core 0 (home) is the calling thread — the application thread, which
/// every SPDK application polls, even one without reactors such as fio's `spdk_bdev`
/// plugin, which polls no other thread while its JSON config runs — and core `k` a thread
/// of ours on the `k`-th core of the cpumask. Returns the driver and the CPU of each core.
///
/// The disk's own pollers (a port nobody else owns, the session's control work) run at
/// most every [`DISK_POLL_US`]: the IO fast path is the channels' pollers, and a thread
/// that has only timed pollers may sleep (fio's initialisation thread does).
fn make_driver(name: &str) -> Result<(Arc<Driver>, Vec<u32>), String> {
    let me = SpdkThread::current().ok_or("not called on an SPDK thread")?;
    let cpus = app_cores();
    let mut threads = vec![me];
    for &c in cpus.iter().skip(1) {
        match SpdkThread::create_on(&format!("rtrs_{name}_{c}"), c) {
            Some(t) => threads.push(t),
            None => {
                for t in threads.drain(1..) {
                    let _ = t.exit();
                }
                return Err(format!("spdk_thread_create failed for core {c}"));
            }
        }
    }
    let driver = Driver::adopt_with_period(&threads, DISK_POLL_US).map_err(|e| e.to_string())?;
    Ok((driver, cpus))
}

/// Drops every core's pollers, lets the threads of ours exit, then runs `done` on the
/// calling thread (core 0's, the application thread).
fn stop_driver<F: FnOnce() + Send + 'static>(driver: &Arc<Driver>, done: F) {
    for k in 1..driver.cores() {
        let d = Arc::clone(driver);
        let sent = driver.run_on(k, move |_cx| {
            d.shutdown_core();
            d.drop_core();
            if let Some(t) = d.thread(k) {
                if t.exit().is_err() {
                    tracing::warn!("rtrs bdev: core {k}'s thread could not be told to exit");
                }
            }
        });
        if sent.is_err() {
            tracing::warn!("rtrs bdev: could not stop core {k}");
        }
    }
    driver.shutdown_core();
    driver.drop_core();
    // Core k's message runs before any later message to the same thread: post `done` behind
    // a round trip through the last core so the other cores' pollers are gone first.
    match driver.cores() {
        1 => done(),
        n => {
            let back = SpdkThread::current();
            let sent = driver.run_on(n - 1, move |_cx| match back {
                Some(t) => {
                    if t.send(done).is_err() {
                        tracing::error!("rtrs bdev: could not post the stop completion");
                    }
                }
                None => done(),
            });
            if sent.is_err() {
                tracing::error!(
                    "rtrs bdev: could not reach core {} to finish stopping",
                    n - 1
                );
            }
        }
    }
}

/// `bdev_rtrs_create`: starts the session; `req` is answered when OPEN completes.
pub fn create(req: RpcRequest, params: CreateParams) {
    const M: &str = "bdev_rtrs_create";
    let name = params.name.clone();
    let taken = registry().iter().any(|d| d.name() == name) || {
        let c = CString::new(name.clone()).unwrap_or_default();
        // SAFETY: lookup by a NUL-terminated name.
        !unsafe { rtrs_spdk::spdk::sys::spdk_bdev_get_by_name(c.as_ptr()) }.is_null()
    };
    if taken {
        req.invalid(&format!(
            "{M}: 'name' = {name:?}: a bdev with this name exists"
        ));
        return;
    }
    let psks = match path_keys(&params.paths, |i| format!("paths[{i}].")) {
        Ok(k) => k,
        Err(e) => return req.invalid(&format!("{M}: {e}")),
    };
    // All paths use paths[0]'s transport (params checked it); open its fabric.
    let transport = params.paths[0].transport;
    let fabric = match client_fabric(transport) {
        Ok(f) => f,
        Err(e) => {
            req.invalid(&format!(
                "{M}: 'paths[0].transport' = {:?}: {e}",
                transport.name()
            ));
            return;
        }
    };
    let (driver, cpus) = match make_driver(&name) {
        Ok(d) => d,
        Err(e) => {
            req.error(-libc::ENOMEM, &format!("{M}: {e}"));
            return;
        }
    };
    // A port may be owned by channels on its core's CPU: core k's thread runs on cpus[k];
    // core 0 is the calling thread, on whatever core it runs (none: no channel owns it).
    // SAFETY: plain query of the calling thread's core.
    let home_cpu = unsafe { rtrs_spdk::spdk::sys::spdk_env_get_current_core() };
    let slots = (0..driver.cores())
        .map(|k| CoreSlot::new(if k == 0 { home_cpu } else { cpus[k] }))
        .collect();
    let disk = Arc::new(Disk {
        paths: Mutex::new(params.paths.clone()),
        psks,
        params,
        fabric,
        driver: Arc::clone(&driver),
        cpus,
        slots,
        chans: Mutex::new(Vec::new()),
        session: OnceLock::new(),
        info: OnceLock::new(),
        bdev: AtomicPtr::new(ptr::null_mut()),
        pending: Mutex::new(Some(req)),
        closing: AtomicBool::new(false),
        last_err_log: AtomicU64::new(0),
    });
    registry().push(Arc::clone(&disk));
    let d = Arc::clone(&disk);
    if driver.run_on(0, move |cx| start(cx, d)).is_err() {
        disk.open_failed("could not reach the disk's home core");
        registry().retain(|x| !Arc::ptr_eq(x, &disk));
        stop_driver(&driver, || {});
    }
}

/// On the home core: the session, the RNBD client, OPEN, and the cores' pollers.
fn start(cx: &mut dyn Ctx, disk: Arc<Disk>) {
    let fail = |disk: &Arc<Disk>, why: String| {
        disk.open_failed(&why);
        disk.stop();
    };
    let links = LinkListener::new();
    let fabric = Arc::clone(&disk.fabric.fabric);
    let (session, cores) = match Session::open(
        cx,
        Arc::clone(&fabric),
        disk.params.client_config(disk.psks.clone()),
        Box::new(links.clone()),
    ) {
        Ok(x) => x,
        Err(e) => return fail(&disk, e.to_string()),
    };
    let _ = disk.session.set(session);
    // READs into SPDK memory land in place (the server writes into the bdev IO's buffer).
    let regions = disk.mem().regions();
    let mut cores = cores.into_iter().map(|mut sc| {
        for r in &regions {
            sc.add_region(Arc::clone(r));
        }
        sc
    });
    let Some(home) = cores.next() else {
        return fail(&disk, "the session has no core".into());
    };
    let replies = match fabric.register(MemBuf::zeroed(4096), Access::LOCAL_WRITE) {
        Ok(mr) => mr,
        Err(e) => return fail(&disk, e.to_string()),
    };
    let mut rnbd = match RnbdClient::new(home, replies) {
        Ok(r) => r,
        Err(e) => return fail(&disk, e.to_string()),
    };
    rnbd.listen(links);
    let shared = rnbd.shared();
    let dev = match rnbd.open(cx, &disk.params.device, disk.params.access_mode) {
        Ok(d) => d,
        Err(e) => return fail(&disk, e.to_string()),
    };
    for (i, sc) in cores.enumerate() {
        let k = i + 1;
        let (d, core) = (Arc::clone(&disk), RnbdCore::new(sc, Arc::clone(&shared)));
        let sent = cx.defer(k, move |cx: &mut dyn Ctx| {
            cx.register(Box::new(CorePoller::new(PortState::other(d, k, core, dev))));
        });
        if sent.is_err() {
            tracing::error!("rtrs bdev {}: could not start core {k}", disk.params.name);
        }
    }
    let wait = disk.params.io_timeout_sec.max(super::core::OPEN_WAIT_MIN_S);
    let deadline = cx.now() + wait * 1_000_000_000;
    cx.register(Box::new(CorePoller::new(PortState::home(
        disk, rnbd, dev, deadline,
    ))));
}
