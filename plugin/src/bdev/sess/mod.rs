//! A client session of the rtrs bdev module, shared by every device mapped over it (the
//! kernel's `rnbd_clt_session`: `map_device` with a `sessname` that is already connected
//! opens the device over that session). One RTRS session, one protection domain with
//! SPDK's memory registered in it ([`MemMap`]), one RNBD admin, and one queue per core
//! ([`CoreQueue`]) carrying the IO of all its devices; the session's control poller runs
//! on home ([`SessHome`]), its cores' queues on the poll groups (the module's `group`).
//!
//! Life: the first device of a `sessname` opens the session (on home's driver:
//! [`rtrs_spdk::rnbd::client::open_rnbd_session`]); every device sends its OPEN and its
//! CLOSE through the admin on core 0's queue ([`Sess::admin_step`], on whichever
//! thread owns that queue); when the last device is closed, the session closes, waits
//! for its paths to go, and every owner drops its core's queue; the last one forgets the
//! session.
//!
//! Settings that change at run time (`bdev_rtrs_set_session_options`: reconnect
//! attempts and delay go to the RTRS session, the loss timeout to the admin) are kept in
//! [`LiveSettings`], which `save_config` writes and a joining device must match.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use rtrs_spdk::client::{ClientSession, PathAddr, SessionCore};
use rtrs_spdk::common::Inbox;
use rtrs_spdk::engine::Ctx;
use rtrs_spdk::fabric::{Fabric, Psk};
use rtrs_spdk::rnbd::client::{
    open_rnbd_session, ClientEvent, DevHandle, DevState, DeviceTable, RnbdAdmin, RnbdQueue,
};
use rtrs_spdk::spdk::{app_cores, Driver, SpdkThread};
use rtrs_spdk::sync::lock;

use self::core_queue::CoreQueue;
use self::disk::Disk;
use super::memmap::MemMap;
use super::params::{CreateParams, LiveSettings, PathParam};
use super::task::TaskRef;

pub mod core_queue;
pub mod disk;

/// How long a closing session waits for its paths to go (ns).
const CLOSE_WAIT_NS: u64 = 3_000_000_000;

/// One core of the session as the groups see it.
pub struct CoreInbox {
    /// Tasks submitted on threads that do not own the core's queue.
    pub inbox: Inbox<TaskRef>,
    /// Whether home owns the queue (home must then be woken for the inbox).
    at_home: AtomicBool,
}

impl CoreInbox {
    /// Leaves `task` for the queue's owner.
    pub fn push(&self, task: TaskRef, home: &dyn SessHome) {
        self.inbox.push(task);
        if self.at_home.load(Ordering::Acquire) {
            home.kick();
        }
    }

    pub fn set_at_home(&self, yes: bool) {
        self.at_home.store(yes, Ordering::Release);
    }
}

/// Home as a session sees it (the module's `group::Home`): the thread and driver its
/// control pollers run on, and the owner of the queues no poll group claims.
pub trait SessHome: Send + Sync {
    /// Home's SPDK thread.
    fn thread(&self) -> SpdkThread;
    /// Whether the caller runs on home's thread.
    fn is_current(&self) -> bool;
    /// The engine driver on home's thread (the RTRS sessions' control pollers).
    fn driver(&self) -> &Arc<Driver>;
    /// Takes `q`; home owns it until a group claims it.
    fn give(&self, q: Box<CoreQueue>);
    /// Wakes home's poller for work handed to it.
    fn kick(&self);
    /// A session's heartbeat interval (ms): home polls often enough for it.
    fn keep_heartbeat(&self, hb_interval_ms: u64);
}

/// Runs `f` on home's thread: now when the caller is on it, else by message. False when
/// the message could not be posted (`f` is dropped unrun).
pub fn on_home(home: &dyn SessHome, f: impl FnOnce() + Send + 'static) -> bool {
    if home.is_current() {
        f();
        true
    } else {
        home.thread().send(f).is_ok()
    }
}

/// Work for the admin, from any thread.
enum AdminCmd {
    Open(Arc<Disk>),
    Close(Arc<Disk>),
    /// `bdev_rtrs_remap`: OPEN again (its waiter is with the disk).
    Remap(Arc<Disk>),
    SetLossTimeout(Option<std::time::Duration>),
    /// The last device went: close the session.
    CloseSession,
}

/// Where the session is in its life (for devices that would join it).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Life {
    /// Devices come and go.
    Up,
    /// The last device went: the session is closing.
    Closing,
}

/// A session and its devices.
pub struct Sess {
    me: Weak<Sess>,
    pub sessname: String,
    /// The settings of the session's first device; later devices must match them.
    pub settings: CreateParams,
    /// Paths as they are now (add/remove_path), for config_json and get_sessions.
    pub paths: Mutex<Vec<PathParam>>,
    /// The settings that change at run time, as they are now.
    live: Mutex<LiveSettings>,
    /// The admin's published devices (their states), once the session started.
    table: OnceLock<Arc<DeviceTable>>,
    psks: Vec<(PathAddr, Psk)>,
    /// The session's own protection domain of the transport's fabric.
    pub domain: Arc<dyn Fabric>,
    pub mem: MemMap,
    /// The CPU of each core.
    pub cpus: Vec<u32>,
    pub cores: Box<[CoreInbox]>,
    session: OnceLock<ClientSession>,
    pub home: Arc<dyn SessHome>,
    cmds: Inbox<AdminCmd>,
    /// Devices opening, open or closing over the session.
    devices: Mutex<Vec<Arc<Disk>>>,
    life: Mutex<Life>,
    /// The session is closed and drained: every owner drops its queue.
    down: AtomicBool,
    /// Cores whose queue was not dropped yet.
    cores_left: AtomicUsize,
    /// Rate limit of IO error logs (ns of the last one).
    last_err_log: AtomicU64,
}

/// Every session, and the module's fini once it waits for them.
static SESSIONS: Mutex<Vec<Arc<Sess>>> = Mutex::new(Vec::new());

/// Every session (open or closing).
pub fn all() -> Vec<Arc<Sess>> {
    lock(&SESSIONS).clone()
}

impl Sess {
    pub fn session(&self) -> Option<&ClientSession> {
        self.session.get()
    }

    /// The devices over the session now.
    pub fn devices(&self) -> Vec<Arc<Disk>> {
        lock(&self.devices).clone()
    }

    /// The run-time settings as they are now.
    pub fn live(&self) -> LiveSettings {
        *lock(&self.live)
    }

    /// Applies new run-time settings (`bdev_rtrs_set_session_options`, checked by the
    /// caller): the RTRS session's reconnect attempts and delay, the admin's loss timeout.
    ///
    /// # Errors
    /// The session is not open yet.
    pub fn set_live(&self, new: LiveSettings) -> Result<(), String> {
        let s = self.session.get().ok_or("the session is not open yet")?;
        let mut live = lock(&self.live);
        if new.max_reconnect_attempts != live.max_reconnect_attempts {
            s.set_max_reconnect_attempts(new.max_reconnect_attempts);
        }
        if new.reconnect_delay_sec != live.reconnect_delay_sec {
            s.set_reconnect_delay(std::time::Duration::from_secs(new.reconnect_delay_sec));
        }
        if new.loss_timeout_sec != live.loss_timeout_sec {
            self.command(AdminCmd::SetLossTimeout(new.loss_timeout()));
        }
        *live = new;
        Ok(())
    }

    /// The RNBD state of `disk`'s device as the admin last published it.
    pub fn device_state(&self, disk: &Disk) -> Option<DevState> {
        self.table.get()?.state(disk.dev()?)
    }

    /// Asks the admin to OPEN `disk`'s device again (`bdev_rtrs_remap`); the answer goes
    /// to the waiter the caller left with the disk.
    pub fn remap(&self, disk: &Arc<Disk>) {
        self.command(AdminCmd::Remap(Arc::clone(disk)));
    }

    /// The session's core on CPU core `cpu` (core 0 for a thread off the cpumask, as
    /// fio's); a group on that thread may claim its queue.
    pub fn core_of_cpu(&self, cpu: u32) -> usize {
        self.cpus.iter().position(|&c| c == cpu).unwrap_or(0)
    }

    /// Opens a new session for `params`' first device (on home's thread): its domain,
    /// memory map and, on home's driver, the RTRS session and its queues.
    ///
    /// # Errors
    /// The domain or the memory map could not be made.
    pub fn open(
        params: &CreateParams,
        psks: Vec<(PathAddr, Psk)>,
        fabric: &Arc<dyn Fabric>,
        home: Arc<dyn SessHome>,
    ) -> Result<Arc<Sess>, String> {
        let domain = fabric
            .domain()
            .map_err(|e| format!("a protection domain for the session: {e}"))?;
        let mem = MemMap::new(&params.sessname, Arc::clone(&domain))?;
        let cpus = app_cores();
        let n = cpus.len().max(1);
        home.keep_heartbeat(params.hb_interval_ms);
        let sess = Arc::new_cyclic(|me| Sess {
            me: me.clone(),
            sessname: params.sessname.clone(),
            settings: params.clone(),
            paths: Mutex::new(params.paths.clone()),
            live: Mutex::new(params.live()),
            table: OnceLock::new(),
            psks,
            domain,
            mem,
            cpus,
            cores: (0..n)
                .map(|_| CoreInbox {
                    inbox: Inbox::new(),
                    at_home: AtomicBool::new(true),
                })
                .collect(),
            session: OnceLock::new(),
            home,
            cmds: Inbox::new(),
            devices: Mutex::new(Vec::new()),
            life: Mutex::new(Life::Up),
            down: AtomicBool::new(false),
            cores_left: AtomicUsize::new(n),
            last_err_log: AtomicU64::new(0),
        });
        lock(&SESSIONS).push(Arc::clone(&sess));
        let s = Arc::clone(&sess);
        if let Err(e) = sess.home.driver().run_on(0, move |cx| s.start(cx)) {
            sess.forget();
            return Err(format!("could not reach the module's home thread: {e}"));
        }
        Ok(sess)
    }

    /// On home: the RTRS session, the admin and every core's queue, handed to home's group.
    fn start(self: Arc<Self>, cx: &mut dyn Ctx) {
        let config = self.settings.client_config(self.psks.clone());
        let opened = open_rnbd_session(cx, self.cores.len(), Arc::clone(&self.domain), config);
        let rs = match opened {
            Ok(rs) => rs,
            Err(e) => {
                let why = e.to_string();
                for d in self.devices() {
                    d.open_failed(&why);
                    d.closed();
                }
                self.set_down();
                // No queue was made: nothing is left to drop.
                self.cores_left.store(0, Ordering::Release);
                self.forget();
                return;
            }
        };
        let _ = self.session.set(rs.session);
        let _ = self.table.set(Arc::clone(rs.admin.table()));
        let mut admin = rs.admin;
        admin.set_loss_timeout(self.live().loss_timeout());
        let mut admin = Some(admin);
        for (k, q) in rs.queues.into_iter().enumerate() {
            let admin = if k == 0 { admin.take() } else { None };
            self.give_to_home(CoreQueue::new(Arc::clone(&self), k, q, admin));
        }
    }

    fn give_to_home(&self, q: CoreQueue) {
        self.cores[q.core].set_at_home(true);
        self.home.give(Box::new(q));
    }

    /// Adds `disk` to the session and sends its OPEN; false when the session is closing
    /// (the caller opens a new one).
    pub fn add(&self, disk: &Arc<Disk>) -> bool {
        {
            let mut devs = lock(&self.devices);
            if *lock(&self.life) != Life::Up || self.down.load(Ordering::Acquire) {
                return false;
            }
            devs.push(Arc::clone(disk));
        }
        self.command(AdminCmd::Open(Arc::clone(disk)));
        true
    }

    /// Sends `disk`'s CLOSE (its bdev was unregistered, or its create failed).
    pub fn close_device(&self, disk: &Arc<Disk>) {
        self.command(AdminCmd::Close(Arc::clone(disk)));
    }

    fn command(&self, c: AdminCmd) {
        self.cmds.push(c);
        if self.cores[0].at_home.load(Ordering::Acquire) {
            self.home.kick();
        }
    }

    /// A device is closed: it leaves the session; the last one closes the session.
    pub fn remove(&self, disk: &Arc<Disk>) {
        let mut devs = lock(&self.devices);
        devs.retain(|d| !Arc::ptr_eq(d, disk));
        if devs.is_empty() {
            let mut life = lock(&self.life);
            let first = *life == Life::Up;
            *life = Life::Closing;
            drop(life);
            drop(devs);
            if first {
                self.command(AdminCmd::CloseSession);
            }
        }
    }

    /// After each poll of core 0's queue, on its owner's thread: the admin's commands
    /// (OPEN, CLOSE, closing the session) and, once closed, the wait for its paths to go
    /// (`drain`: until when, kept by core 0's queue).
    pub fn admin_step(
        &self,
        now: u64,
        admin: &mut RnbdAdmin,
        queue: &mut RnbdQueue<SessionCore>,
        drain: &mut Option<u64>,
    ) -> bool {
        let mut busy = false;
        while let Some(c) = self.cmds.pop() {
            busy = true;
            match c {
                AdminCmd::Open(d) => {
                    if !d.is_opening() {
                        // Its create gave up before OPEN went out.
                        d.closed();
                        continue;
                    }
                    let p = &d.params;
                    match admin.open(queue, now, &p.device, p.access_mode, p.write_zeroes) {
                        Ok(dev) => d.set_dev(dev),
                        Err(e) => {
                            d.open_failed(&e.to_string());
                            d.closed();
                        }
                    }
                }
                AdminCmd::Close(d) => match d.dev() {
                    Some(dev) if admin.close(queue, now, dev).is_ok() => {}
                    _ => d.closed(),
                },
                AdminCmd::Remap(d) => {
                    let r = match d.dev() {
                        Some(dev) => admin.remap(queue, now, dev).map_err(|e| e.to_string()),
                        None => Err("the device is not open".to_string()),
                    };
                    if let Err(e) = r {
                        d.remap_failed(e);
                    }
                }
                AdminCmd::SetLossTimeout(t) => admin.set_loss_timeout(t),
                AdminCmd::CloseSession => {
                    if let Some(s) = self.session.get() {
                        s.close();
                    }
                    *drain = Some(now + CLOSE_WAIT_NS);
                }
            }
        }
        if let Some(deadline) = *drain {
            let gone = self.session.get().map_or(true, |s| s.paths().is_empty());
            if gone || deadline <= now {
                self.set_down();
                *drain = None;
                busy = true;
            }
        }
        busy
    }

    /// An admin event: OPEN's answer, CLOSE's, a re-open after a reconnect.
    pub fn admin_event(
        &self,
        now: u64,
        admin: &mut RnbdAdmin,
        queue: &mut RnbdQueue<SessionCore>,
        ev: &ClientEvent,
    ) {
        match ev {
            ClientEvent::Io { .. } | ClientEvent::SessInfo(Ok(_)) => {}
            ClientEvent::Opened { dev, info, remap } => match self.device_of(*dev) {
                Some(d) if *remap => {
                    tracing::info!(
                        "rtrs bdev {}: device {} re-opened after a reconnect",
                        d.name(),
                        d.params.device
                    );
                    d.reopened(*info, false);
                }
                Some(d) if d.opened(*info) => {}
                // Answered after its create gave up (or for no device of ours): closed
                // again, so the server does not keep it open.
                _ => {
                    if admin.close(queue, now, *dev).is_err() {
                        tracing::warn!(
                            "rtrs session {}: a late-opened device could not be closed",
                            self.sessname
                        );
                    }
                }
            },
            ClientEvent::Remapped { dev, info } => {
                if let Some(d) = self.device_of(*dev) {
                    tracing::info!(
                        "rtrs bdev {}: device {} re-opened on request: {} bytes",
                        d.name(),
                        d.params.device,
                        info.size
                    );
                    d.reopened(*info, true);
                }
            }
            ClientEvent::ServerClosed { dev } => {
                if let Some(d) = self.device_of(*dev) {
                    tracing::warn!(
                        "rtrs bdev {}: the target closed device {} (its operator's forced \
                         close): IO fails until bdev_rtrs_remap (or a reconnect) maps it again",
                        d.name(),
                        d.params.device
                    );
                }
            }
            ClientEvent::Lost { dev } => {
                if let Some(d) = self.device_of(*dev) {
                    d.lost();
                }
            }
            ClientEvent::OpenFailed { dev, error } => {
                if let Some(d) = self.device_of(*dev) {
                    if d.is_opening() {
                        d.open_failed(&error.to_string());
                        d.closed();
                    } else if d.remapping() {
                        tracing::warn!(
                            "rtrs bdev {}: re-opening device {} on request failed: {error}",
                            d.name(),
                            d.params.device
                        );
                        d.remap_failed(error.to_string());
                    } else {
                        tracing::warn!(
                            "rtrs bdev {}: re-opening device {} failed: {error}",
                            d.name(),
                            d.params.device
                        );
                    }
                }
            }
            ClientEvent::Closed { dev } => {
                if let Some(d) = self.device_of(*dev) {
                    d.closed();
                }
            }
            ClientEvent::SessInfo(Err(e)) => {
                tracing::warn!("rtrs session {}: SESS_INFO failed: {e}", self.sessname);
            }
        }
    }

    fn device_of(&self, dev: DevHandle) -> Option<Arc<Disk>> {
        lock(&self.devices)
            .iter()
            .find(|d| d.dev() == Some(dev))
            .cloned()
    }

    fn set_down(&self) {
        self.down.store(true, Ordering::Release);
    }

    /// Closed and drained: the owners drop their queues.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// Core `core`'s queue was dropped; the last one forgets the session.
    pub fn core_done(&self, _core: usize) {
        if self.cores_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.forget();
        }
    }

    /// Removes the session from the registry on home's thread (where its memory map is
    /// freed with it), then lets a waiting module fini go on.
    fn forget(&self) {
        let Some(me) = self.me.upgrade() else {
            return;
        };
        let post = self.home.thread().send(move || {
            lock(&SESSIONS).retain(|s| !Arc::ptr_eq(s, &me));
            drop(me);
            disk::maybe_finish();
        });
        if post.is_err() {
            tracing::error!(
                "rtrs session {}: could not post its end to home",
                self.sessname
            );
        }
    }

    /// A request was refused for good (logged, at most once a second).
    pub fn io_refused(&self, e: &dyn std::fmt::Display) {
        let now = rtrs_spdk::spdk::now_ns();
        let last = self.last_err_log.load(Ordering::Relaxed);
        if now.saturating_sub(last) > 1_000_000_000
            && self
                .last_err_log
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!("rtrs session {}: IO refused: {e}", self.sessname);
        }
    }

    /// Why no path can connect any more without a manual reconnect, when every path of
    /// the session stopped trying (authentication failed, or no reconnect attempts left).
    pub fn refused(&self) -> Option<String> {
        let s = self.session.get()?;
        let why: Option<Vec<String>> = s.paths().iter().map(|(a, _)| s.path_failure(*a)).collect();
        why.filter(|w| !w.is_empty()).map(|w| w.join("; "))
    }

    /// What the paths last ran into, for an OPEN that timed out.
    pub fn path_errors(&self) -> Vec<String> {
        self.session
            .get()
            .map(|s| s.path_errors())
            .unwrap_or_default()
            .iter()
            .map(|(p, e)| format!("{p}: {e}"))
            .collect()
    }

    /// The open session named `sessname` a new device can join, if any.
    pub fn find(sessname: &str) -> Option<Arc<Sess>> {
        lock(&SESSIONS)
            .iter()
            .find(|s| s.sessname == sessname && *lock(&s.life) == Life::Up && !s.is_down())
            .cloned()
    }

    /// Whether `p` (a new device's parameters) may join this session; else why not,
    /// naming the first setting that differs.
    pub fn check_join(&self, p: &CreateParams) -> Result<(), String> {
        let paths = lock(&self.paths).clone();
        let mut want: Vec<String> = p.paths.iter().map(|x| format!("{}", x.addr)).collect();
        let mut have: Vec<String> = paths.iter().map(|x| format!("{}", x.addr)).collect();
        want.sort();
        have.sort();
        if want != have || p.paths.iter().any(|x| !paths.contains(x)) {
            return Err(format!(
                "'paths': session {:?} is connected to [{}]; a device over it names the same paths (another session needs another 'sessname')",
                self.sessname,
                have.join(", ")
            ));
        }
        let s = &self.settings;
        let live = self.live();
        let policy = self
            .session
            .get()
            .map_or(s.mp_policy, ClientSession::policy);
        let differs: &[(&str, String, String)] = &[
            (
                "mp_policy",
                p.mp_policy.name().to_string(),
                policy.name().to_string(),
            ),
            (
                "max_reconnect_attempts",
                p.max_reconnect_attempts.to_string(),
                live.max_reconnect_attempts.to_string(),
            ),
            (
                "reconnect_delay_sec",
                p.reconnect_delay_sec.to_string(),
                live.reconnect_delay_sec.to_string(),
            ),
            (
                "loss_timeout_sec",
                p.loss_timeout_sec.to_string(),
                live.loss_timeout_sec.to_string(),
            ),
            (
                "hb_interval_ms",
                p.hb_interval_ms.to_string(),
                s.hb_interval_ms.to_string(),
            ),
            (
                "hb_missed_max",
                p.hb_missed_max.to_string(),
                s.hb_missed_max.to_string(),
            ),
            (
                "io_timeout_sec",
                p.io_timeout_sec.to_string(),
                s.io_timeout_sec.to_string(),
            ),
        ];
        for (field, new, old) in differs {
            if new != old {
                return Err(format!(
                    "'{field}' = {new}: session {:?} runs with {old} (the devices of a session share its settings)",
                    self.sessname
                ));
            }
        }
        Ok(())
    }
}
