//! One rtrs bdev: an RNBD device mapped over an RTRS client session whose pollers run
//! on SPDK threads of ours, one per core of the application's cpumask
//! (docs/ARCHITECTURE.md, "Sessions on cores"). The kernel's `rnbd_clt_dev` with its
//! gendisk; here the "disk" is an `spdk_bdev`.
//!
//! IO: each core of the disk has a queue ([`CoreQueue`]: that core's RNBD queue over its
//! session handle) that the IO channel on its CPU core owns and polls, or the disk's own
//! thread on the core while no channel does (see [`super::channel`] and
//! [`super::core_queue`]); every core's is the same, core 0's also carries the admin.
//!
//! Life, all of it in [`Life`]: [`create`] opens the session on core 0 and sends OPEN
//! (*opening*); OPEN's answer hands the disk to the creator's callback on the
//! application thread, which registers the bdev ([`super::module::register`]) and makes
//! it *open*; a failure reaches the same callback as an error, and the disk tears down.
//! Deleting goes through `spdk_bdev_unregister` → `destruct` → the io_device is
//! unregistered → [`Disk::close`] (*closing*): the admin on core 0's queue sends CLOSE,
//! the session closes, its paths go → the threads stop → the bdev is released
//! (*closed*). Core 0's queue drives these steps through [`CoreDisk`], which the disk
//! implements. The module's fini ([`stop_all`]) fails the disks still opening and ends
//! once the last disk is closed.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use rtrs_spdk::client::{MpPolicy, PathAddr, Session, SessionCore};
use rtrs_spdk::engine::Ctx;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Psk};
use rtrs_spdk::rnbd::client::{
    ClientEvent, DevHandle, DeviceInfo, LinkListener, RnbdAdmin, RnbdClientConfig, RnbdQueue,
};
use rtrs_spdk::spdk::{Driver, SpdkThread};

use super::core_queue::{CoreDisk, CoreQueue, CoreSlot, SlotPoller};
use super::fabric::client_fabric;
use super::memmap::MemMap;
use super::params::{path_keys, CreateParams, PathParam};
use super::task::ChanShared;
use super::threads::{make_driver, stop_driver};

/// How long a closing disk waits for CLOSE's answer, then for its paths to go.
const CLOSE_WAIT_NS: u64 = 3_000_000_000;
/// `bdev_rtrs_create` waits at least this long (seconds) for the session and OPEN.
const OPEN_WAIT_MIN_S: u64 = 5;

/// Run once the disk is down: releases what registration made (the bdev).
pub type OnClosed = Box<dyn FnOnce() + Send>;

/// Why a disk was not created; the text names what was wrong.
#[derive(Debug)]
pub enum CreateError {
    /// A parameter cannot be used (a name taken, a key or fabric that cannot be had).
    Invalid(String),
    /// The disk's threads could not be made.
    NoMemory(String),
    /// The session or OPEN failed (or the bdev could not be registered).
    OpenFailed(String),
}

/// Told once how [`create`] ended: with the opened disk on the application thread (the
/// callback registers its bdev), or with the error.
pub type OnOpen = Box<dyn FnOnce(Result<&Arc<Disk>, CreateError>) + Send>;

/// The disk's life.
enum Life {
    /// The session is starting and OPEN is sent; it must be answered by `deadline` (ns
    /// of the home core's clock; `u64::MAX` until the home core set it): before the
    /// first path connects the session has no permits, so OPEN would wait for ever.
    Opening { deadline: u64 },
    /// OPEN answered: the creator registers the bdev on the application thread.
    Registering,
    /// The bdev is registered and IO flows.
    Open { on_closed: OnClosed },
    /// Going down: the create failed, or the bdev was unregistered.
    Closing {
        step: CloseStep,
        on_closed: Option<OnClosed>,
    },
    /// Down: threads stopped, the bdev released.
    Closed,
}

/// The disk's life behind its lock, with a lock-free answer to "has the home core
/// anything to do?" (opening's deadline, closing's steps): [`CoreDisk::home_step`] runs
/// after every poll of core 0's queue and takes no lock while the disk is open.
struct LifeCell {
    life: Mutex<Life>,
    /// Whether the life is `Opening` or `Closing`; written by every guard as it drops,
    /// still under the lock, so it always follows the last change.
    active: AtomicBool,
}

impl LifeCell {
    fn new(life: Life) -> LifeCell {
        let active = AtomicBool::new(LifeGuard::is_active(&life));
        LifeCell {
            life: Mutex::new(life),
            active,
        }
    }

    fn lock(&self) -> LifeGuard<'_> {
        LifeGuard {
            guard: lock(&self.life),
            active: &self.active,
        }
    }

    /// Opening or closing (as of the last change any thread made).
    fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }
}

/// The locked life; its drop refreshes [`LifeCell::active`].
struct LifeGuard<'a> {
    guard: MutexGuard<'a, Life>,
    active: &'a AtomicBool,
}

impl LifeGuard<'_> {
    fn is_active(life: &Life) -> bool {
        matches!(life, Life::Opening { .. } | Life::Closing { .. })
    }
}

impl std::ops::Deref for LifeGuard<'_> {
    type Target = Life;
    fn deref(&self) -> &Life {
        &self.guard
    }
}

impl std::ops::DerefMut for LifeGuard<'_> {
    fn deref_mut(&mut self) -> &mut Life {
        &mut self.guard
    }
}

impl Drop for LifeGuard<'_> {
    fn drop(&mut self) {
        self.active
            .store(Self::is_active(&self.guard), Ordering::Release);
    }
}

/// The home core's part of closing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CloseStep {
    /// CLOSE is to be sent.
    Start,
    /// CLOSE sent; its answer is awaited until the deadline (ns).
    CloseSent(u64),
    /// Session closed, waiting for its paths to go until the deadline (ns).
    Draining(u64),
    /// The threads are being stopped.
    Stopping,
}

/// An rtrs bdev and everything behind it.
pub struct Disk {
    /// The disk itself, for the work it posts to other threads.
    me: Weak<Disk>,
    pub params: CreateParams,
    /// Paths as they are now (add/remove_path), for config_json and get_sessions.
    pub paths: Mutex<Vec<PathParam>>,
    /// The keys of the paths created with one (read from the keyring at create).
    psks: Vec<(PathAddr, Psk)>,
    /// The session's own protection domain of the transport's fabric, and SPDK's
    /// memory registered there (a key of another session's never reaches it).
    domain: Arc<dyn Fabric>,
    mem: MemMap,
    driver: Arc<Driver>,
    cpus: Vec<u32>,
    slots: Box<[CoreSlot]>,
    /// Every IO channel of the bdev (resets count their outstanding requests).
    chans: Mutex<Vec<Arc<ChanShared>>>,
    session: OnceLock<Session>,
    info: OnceLock<DeviceInfo>,
    life: LifeCell,
    /// The creator's callback, until called.
    on_open: Mutex<Option<OnOpen>>,
    /// Rate limit of IO error logs (ns of the last one).
    last_err_log: AtomicU64,
}

/// Every rtrs bdev, including those still opening or closing, and the module's fini
/// once it started.
struct Registry {
    disks: Vec<Arc<Disk>>,
    /// The module's fini ran: no new disk.
    stopping: bool,
    /// The module's fini, waiting for the last disk to go.
    on_empty: Option<OnClosed>,
}

static DISKS: Mutex<Registry> = Mutex::new(Registry {
    disks: Vec::new(),
    stopping: false,
    on_empty: None,
});

fn registry() -> MutexGuard<'static, Registry> {
    lock(&DISKS)
}

/// Removes `disk` from the registry; returns the module's fini when that was the last.
fn forget(disk: &Arc<Disk>) -> Option<OnClosed> {
    let mut r = registry();
    r.disks.retain(|d| !Arc::ptr_eq(d, disk));
    if r.disks.is_empty() {
        r.on_empty.take()
    } else {
        None
    }
}

/// The disk named `name` (opening, open or closing).
pub fn find(name: &str) -> Option<Arc<Disk>> {
    registry().disks.iter().find(|d| d.name() == name).cloned()
}

/// Every disk (opening, open or closing).
pub fn all() -> Vec<Arc<Disk>> {
    registry().disks.clone()
}

/// The module's fini (application thread), after the bdev layer unregistered every bdev,
/// so every disk that had one is gone: no disk is created from now on, one still opening
/// fails ("the application is stopping") and closes, and `done` runs once the last disk
/// is down — at once when there is none.
pub fn stop_all(done: OnClosed) {
    let disks = {
        let mut r = registry();
        r.stopping = true;
        r.disks.clone()
    };
    for d in &disks {
        if matches!(*d.life.lock(), Life::Opening { .. } | Life::Registering) {
            d.open_failed("the application is stopping");
            d.wake(0);
        }
    }
    let mut r = registry();
    if r.disks.is_empty() {
        drop(r);
        done();
    } else {
        tracing::info!(
            "rtrs bdev: waiting for {} disk(s) to close before the module finishes",
            r.disks.len()
        );
        r.on_empty = Some(done);
    }
}

impl Disk {
    pub fn name(&self) -> &str {
        &self.params.name
    }

    pub fn mem(&self) -> &MemMap {
        &self.mem
    }

    pub fn session(&self) -> Option<&Session> {
        self.session.get()
    }

    pub fn info(&self) -> Option<&DeviceInfo> {
        self.info.get()
    }

    /// Whether the bdev is registered and not being deleted.
    pub fn is_open(&self) -> bool {
        matches!(*self.life.lock(), Life::Open { .. })
    }

    /// The life stage as `bdev_rtrs_get_sessions` names it.
    pub fn state_name(&self) -> &'static str {
        match *self.life.lock() {
            Life::Opening { .. } | Life::Registering => "opening",
            Life::Open { .. } => "open",
            Life::Closing { .. } | Life::Closed => "closing",
        }
    }

    /// The disk's core on CPU core `cpu` (core 0 for a thread off the cpumask, as fio's).
    pub fn core_of_cpu(&self, cpu: u32) -> usize {
        self.cpus.iter().position(|&c| c == cpu).unwrap_or(0)
    }

    /// Whether CPU core `cpu` is one of the application's (a core of the disk).
    pub fn on_mask(&self, cpu: u32) -> bool {
        self.cpus.contains(&cpu)
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

    pub fn policy(&self) -> MpPolicy {
        self.session
            .get()
            .map_or(self.params.mp_policy, Session::policy)
    }

    /// Why no path can ever connect as configured, when every path of the session was
    /// refused for good (authentication failed).
    fn refused(&self) -> Option<String> {
        let s = self.session.get()?;
        let why: Option<Vec<String>> = s.paths().iter().map(|(a, _)| s.path_failure(*a)).collect();
        why.filter(|w| !w.is_empty()).map(|w| w.join("; "))
    }

    fn session_gone(&self) -> bool {
        self.session.get().map_or(true, |s| s.paths().is_empty())
    }

    /// OPEN succeeded (home core): the creator registers the bdev on the application
    /// thread.
    fn opened(&self, info: DeviceInfo) {
        let _ = self.info.set(info);
        let Some(disk) = self.me.upgrade() else {
            return;
        };
        let post = SpdkThread::app().map(|t| t.send(move || disk.announce()));
        if !matches!(post, Some(Ok(()))) {
            self.open_failed("could not reach the application thread to register the bdev");
        }
    }

    /// On the application thread: hands the opened disk to the creator, unless it
    /// failed meanwhile.
    fn announce(self: Arc<Self>) {
        if !matches!(*self.life.lock(), Life::Registering) {
            return;
        }
        // Taken first: the callback may report a failure, which looks at `on_open`.
        let cb = lock(&self.on_open).take();
        if let Some(cb) = cb {
            cb(Ok(&self));
        }
    }

    /// The creator registered the bdev: the disk is open; `on_closed` releases the bdev
    /// once the disk is down.
    pub fn set_open(&self, on_closed: OnClosed) {
        let mut life = self.life.lock();
        match &mut *life {
            Life::Registering => *life = Life::Open { on_closed },
            Life::Closing { on_closed: c, .. } if c.is_none() => *c = Some(on_closed),
            _ => tracing::error!("rtrs bdev {}: registered twice", self.params.name),
        }
    }

    /// Opening failed (the session, OPEN, or the bdev's registration): the creator is
    /// told (unless it is the one reporting it) and the disk tears down. Returns the
    /// message, which names the device and session.
    pub fn open_failed(&self, why: &str) -> String {
        let msg = format!(
            "bdev_rtrs_create: 'device' = {:?} over session {:?}: {why}",
            self.params.device, self.params.sessname
        );
        tracing::error!("{msg}");
        {
            let mut life = self.life.lock();
            if matches!(*life, Life::Opening { .. } | Life::Registering) {
                *life = Life::Closing {
                    step: CloseStep::Start,
                    on_closed: None,
                };
            }
        }
        let cb = lock(&self.on_open).take();
        if let Some(cb) = cb {
            cb(Err(CreateError::OpenFailed(msg.clone())));
        }
        msg
    }

    /// The io_device is gone (every channel is): the disk closes.
    pub fn close(&self) {
        {
            let mut life = self.life.lock();
            if !matches!(*life, Life::Open { .. }) {
                return;
            }
            if let Life::Open { on_closed } = std::mem::replace(&mut *life, Life::Closed) {
                *life = Life::Closing {
                    step: CloseStep::Start,
                    on_closed: Some(on_closed),
                };
            }
        }
        self.wake(0);
    }

    /// Puts `core`'s pollers back on their active period for work handed to them from
    /// another thread (see `Driver::wake`); if that fails they find it on their idle
    /// period.
    pub fn wake(&self, core: usize) {
        if let Err(e) = self.driver.wake(core) {
            tracing::warn!("rtrs bdev {}: core {core} not woken: {e}", self.params.name);
        }
    }

    /// Stops the disk's threads (from the home core, at the end of closing) and finishes.
    fn stop(&self) {
        let Some(disk) = self.me.upgrade() else {
            return;
        };
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

    /// Everything is down (application thread): release the bdev and forget the disk.
    /// Runs the module's fini last when this was the last disk.
    fn finished(self: Arc<Self>) {
        let on_empty = forget(&self);
        let on_closed = match std::mem::replace(&mut *self.life.lock(), Life::Closed) {
            Life::Open { on_closed } => Some(on_closed),
            Life::Closing { on_closed, .. } => on_closed,
            _ => None,
        };
        if let Some(f) = on_closed {
            f();
        }
        if let Some(f) = on_empty {
            f();
        }
    }

    /// Opening: fails the create once every path was refused for good or the deadline
    /// passed (saying what the paths ran into, not just "timed out").
    fn check_opening(&self, now: u64) {
        let Life::Opening { deadline } = *self.life.lock() else {
            return;
        };
        if let Some(why) = self.refused() {
            // Every path refused for good: waiting cannot help.
            self.open_failed(&why);
        } else if deadline <= now {
            let last: Vec<String> = self
                .session()
                .map(|s| s.path_errors())
                .unwrap_or_default()
                .iter()
                .map(|(p, e)| format!("{p}: {e}"))
                .collect();
            self.open_failed(&format!(
                "no path connected and OPEN answered within {} s (io_timeout_sec, at least 5){}",
                self.params.io_timeout_sec.max(OPEN_WAIT_MIN_S),
                if last.is_empty() {
                    String::new()
                } else {
                    format!("; latest attempts: {}", last.join("; "))
                }
            ));
        }
    }

    fn set_close_step(&self, step: CloseStep) {
        if let Life::Closing { step: s, .. } = &mut *self.life.lock() {
            *s = step;
        }
    }
}

impl CoreDisk for Disk {
    fn slot(&self, core: usize) -> &CoreSlot {
        &self.slots[core]
    }

    fn io_refused(&self, e: &dyn std::fmt::Display) {
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

    /// OPEN's answer, CLOSE's, a re-open after a reconnect.
    fn admin_event(&self, ev: ClientEvent) {
        let opening = || matches!(*self.life.lock(), Life::Opening { .. });
        match ev {
            ClientEvent::Io { .. } | ClientEvent::SessInfo(Ok(_)) => {}
            ClientEvent::Opened { info, remap, .. } => {
                if remap {
                    tracing::info!(
                        "rtrs bdev {}: device {} re-opened after a reconnect",
                        self.params.name,
                        self.params.device
                    );
                } else if opening() {
                    *self.life.lock() = Life::Registering;
                    self.opened(info);
                }
            }
            ClientEvent::OpenFailed { error, .. } => {
                if opening() {
                    self.open_failed(&error.to_string());
                    // No device to close.
                    self.set_close_step(CloseStep::CloseSent(0));
                } else {
                    tracing::warn!(
                        "rtrs bdev {}: re-opening device {} failed: {error}",
                        self.params.name,
                        self.params.device
                    );
                }
            }
            ClientEvent::Closed { .. } => {
                let mut life = self.life.lock();
                if let Life::Closing { step, .. } = &mut *life {
                    if let CloseStep::CloseSent(_) = step {
                        *step = CloseStep::CloseSent(0);
                    }
                }
            }
            ClientEvent::SessInfo(Err(e)) => {
                tracing::warn!("rtrs bdev {}: SESS_INFO failed: {e}", self.params.name);
            }
        }
    }

    /// After each poll of core 0's queue: the opening deadline, then closing's steps
    /// (CLOSE, close the session, wait for its paths, stop the threads).
    fn home_step(
        &self,
        now: u64,
        admin: &mut RnbdAdmin,
        queue: &mut RnbdQueue<SessionCore>,
        dev: DevHandle,
    ) {
        if !self.life.active() {
            // Open (IO flows), registering or closed: nothing to do here.
            return;
        }
        self.check_opening(now);
        let step = match *self.life.lock() {
            Life::Closing { step, .. } => step,
            _ => return,
        };
        match step {
            CloseStep::Start => {
                let next = if admin.close(queue, now, dev).is_ok() {
                    CloseStep::CloseSent(now + CLOSE_WAIT_NS)
                } else {
                    CloseStep::CloseSent(0)
                };
                self.set_close_step(next);
            }
            CloseStep::CloseSent(deadline) if deadline <= now => {
                if let Some(s) = self.session.get() {
                    s.close();
                }
                self.set_close_step(CloseStep::Draining(now + CLOSE_WAIT_NS));
            }
            CloseStep::Draining(deadline) if deadline <= now || self.session_gone() => {
                self.set_close_step(CloseStep::Stopping);
                self.stop();
            }
            _ => {}
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn errno_str(rc: i32) -> String {
    std::io::Error::from_raw_os_error(rc.abs()).to_string()
}

/// Creates the disk named in `params` (`bdev_rtrs_create`): checks the name, the paths'
/// keys and fabric, starts the disk's threads and, on the home core, the session and
/// OPEN. `on_open` is called once: at once when the disk cannot be created, else with
/// OPEN's outcome.
pub fn create(params: CreateParams, on_open: OnOpen) {
    const M: &str = "bdev_rtrs_create";
    let name = params.name.clone();
    if registry().stopping {
        return on_open(Err(CreateError::Invalid(format!(
            "{M}: 'name' = {name:?}: the application is stopping"
        ))));
    }
    let taken = registry().disks.iter().any(|d| d.name() == name) || {
        let c = CString::new(name.clone()).unwrap_or_default();
        // SAFETY: lookup by a NUL-terminated name.
        !unsafe { rtrs_spdk::spdk::sys::spdk_bdev_get_by_name(c.as_ptr()) }.is_null()
    };
    if taken {
        return on_open(Err(CreateError::Invalid(format!(
            "{M}: 'name' = {name:?}: a bdev with this name exists"
        ))));
    }
    let psks = match path_keys(&params.paths, |i| format!("paths[{i}].")) {
        Ok(k) => k,
        Err(e) => return on_open(Err(CreateError::Invalid(format!("{M}: {e}")))),
    };
    // All paths use paths[0]'s transport (params checked it); open its fabric.
    let transport = params.paths[0].transport;
    let fabric = match client_fabric(transport) {
        Ok(f) => f,
        Err(e) => {
            return on_open(Err(CreateError::Invalid(format!(
                "{M}: 'paths[0].transport' = {:?}: {e}",
                transport.name()
            ))));
        }
    };
    let domain = match fabric.fabric.domain() {
        Ok(d) => d,
        Err(e) => {
            return on_open(Err(CreateError::NoMemory(format!(
                "{M}: a protection domain for the session: {e}"
            ))))
        }
    };
    let mem = match MemMap::new(Arc::clone(&domain)) {
        Ok(m) => m,
        Err(e) => return on_open(Err(CreateError::NoMemory(format!("{M}: {e}")))),
    };
    let (driver, cpus) = match make_driver(&name, params.hb_interval_ms) {
        Ok(d) => d,
        Err(e) => return on_open(Err(CreateError::NoMemory(format!("{M}: {e}")))),
    };
    // A core queue may be owned by channels on its core's CPU: core k's thread runs on cpus[k];
    // core 0 is the calling thread, on whatever core it runs (none: no channel owns it).
    // SAFETY: plain query of the calling thread's core.
    let home_cpu = unsafe { rtrs_spdk::spdk::sys::spdk_env_get_current_core() };
    let slots = (0..driver.cores())
        .map(|k| CoreSlot::new(if k == 0 { home_cpu } else { cpus[k] }))
        .collect();
    let disk = Arc::new_cyclic(|me| Disk {
        me: me.clone(),
        paths: Mutex::new(params.paths.clone()),
        psks,
        params,
        domain,
        mem,
        driver: Arc::clone(&driver),
        cpus,
        slots,
        chans: Mutex::new(Vec::new()),
        session: OnceLock::new(),
        info: OnceLock::new(),
        life: LifeCell::new(Life::Opening { deadline: u64::MAX }),
        on_open: Mutex::new(Some(on_open)),
        last_err_log: AtomicU64::new(0),
    });
    registry().disks.push(Arc::clone(&disk));
    let d = Arc::clone(&disk);
    if driver.run_on(0, move |cx| start(cx, d)).is_err() {
        disk.open_failed("could not reach the disk's home core");
        let on_empty = forget(&disk);
        stop_driver(&driver, move || {
            if let Some(f) = on_empty {
                f();
            }
        });
    }
}

/// On core 0: the session, the RNBD admin and every core's queue, OPEN, and the cores'
/// pollers.
fn start(cx: &mut dyn Ctx, disk: Arc<Disk>) {
    let fail = |disk: &Arc<Disk>, why: String| {
        disk.open_failed(&why);
        disk.stop();
    };
    let links = LinkListener::new();
    let fabric = Arc::clone(&disk.domain);
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
    let rnbd_config = RnbdClientConfig {
        write_zeroes: disk.params.write_zeroes,
    };
    let mut admin = match RnbdAdmin::new(replies, rnbd_config) {
        Ok(a) => a,
        Err(e) => return fail(&disk, e.to_string()),
    };
    admin.listen(links);
    let table = Arc::clone(admin.table());
    let mut home = RnbdQueue::new(home, Arc::clone(&table));
    let dev = match admin.open(
        &mut home,
        cx.now(),
        &disk.params.device,
        disk.params.access_mode,
    ) {
        Ok(d) => d,
        Err(e) => return fail(&disk, e.to_string()),
    };
    let core_disk = |d: &Arc<Disk>| -> Arc<dyn CoreDisk> { Arc::clone(d) as Arc<dyn CoreDisk> };
    for (i, sc) in cores.enumerate() {
        let k = i + 1;
        let (d, queue) = (core_disk(&disk), RnbdQueue::new(sc, Arc::clone(&table)));
        let sent = cx.defer(k, move |cx: &mut dyn Ctx| {
            cx.register(Box::new(SlotPoller::new(CoreQueue::new(
                d, k, queue, None, dev,
            ))));
        });
        if sent.is_err() {
            tracing::error!("rtrs bdev {}: could not start core {k}", disk.params.name);
        }
    }
    let wait = disk.params.io_timeout_sec.max(OPEN_WAIT_MIN_S);
    if let Life::Opening { deadline } = &mut *disk.life.lock() {
        *deadline = cx.now() + wait * 1_000_000_000;
    }
    cx.register(Box::new(SlotPoller::new(CoreQueue::new(
        core_disk(&disk),
        0,
        home,
        Some(admin),
        dev,
    ))));
}
