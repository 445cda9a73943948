//! One rtrs bdev: an RNBD device mapped over a client session ([`Sess`]) that it may
//! share with other devices of the same `sessname` (docs/ARCHITECTURE.md, "The SPDK
//! bdev: poll groups"). The kernel's `rnbd_clt_dev` with its gendisk; here the "disk"
//! is an `spdk_bdev`.
//!
//! Life, all of it in [`Life`] (touched on control events only, never per IO):
//! [`create`] joins the session of its `sessname` or opens one, and leaves its OPEN with
//! the session's admin (*opening*); OPEN's answer hands the disk to the creator's
//! callback on home's thread, which registers the bdev ([`crate::bdev::module::register`])
//! and makes it *open*; a failure reaches the same callback as an error. Deleting goes
//! through `spdk_bdev_unregister` → `destruct` → the io_device is unregistered →
//! [`Disk::close`] (*closing*): the admin sends CLOSE; its answer (or a deadline) makes
//! the disk *closed*, which leaves the session and releases the bdev. The module's fini
//! ([`stop_all`]) fails the disks still opening and ends once every disk and session
//! is gone.
//!
//! While open, the device's info may change: a re-open after a reconnect or a
//! `bdev_rtrs_remap` brings the target's size now, which [`Disk::apply_info`] hands to
//! the bdev layer (`spdk_bdev_notify_blockcnt_change`, on home's thread). A device lost
//! after the session's loss timeout unregisters its bdev ([`Disk::lost`]).

use std::ffi::CString;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use rtrs_spdk::client::MpPolicy;
use rtrs_spdk::engine::Ctx;
use rtrs_spdk::rnbd::client::{DevHandle, DeviceInfo};
use rtrs_spdk::spdk::sys;
use rtrs_spdk::sync::lock;

use crate::bdev::fabric::client_fabric;
use crate::bdev::params::{path_keys, CreateParams};
use crate::bdev::sess::{self, on_home, Sess, SessHome};
use crate::bdev::task::ChanShared;

mod follow;

/// How long a closing disk waits for CLOSE's answer.
const CLOSE_WAIT: Duration = Duration::from_secs(3);
/// How often home looks at a disk that is opening or closing.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// `bdev_rtrs_create` waits at least this long (seconds) for the session and OPEN.
const OPEN_WAIT_MIN_S: u64 = 5;

/// Run once the disk is down: releases what registration made (the bdev).
pub type OnClosed = Box<dyn FnOnce() + Send>;

/// Told how a `bdev_rtrs_remap` ended (on home's thread): the device's info now, or why
/// not.
pub type OnRemap = Box<dyn FnOnce(Result<DeviceInfo, String>) + Send>;

/// The registered bdev, for its size changes and its removal (used on home's thread).
#[derive(Clone, Copy)]
pub struct BdevPtr(pub *mut sys::spdk_bdev);

// SAFETY: only dereferenced by SPDK calls on home's thread, while the bdev is registered
// (the disk forgets it before the bdev is freed).
unsafe impl Send for BdevPtr {}

/// Why a disk was not created; the text names what was wrong.
#[derive(Debug)]
pub enum CreateError {
    /// A parameter cannot be used (a name taken, a key or fabric that cannot be had).
    Invalid(String),
    /// The session's resources could not be had.
    NoMemory(String),
    /// The session or OPEN failed (or the bdev could not be registered).
    OpenFailed(String),
}

/// Told once how [`create`] ended, on home's thread: with the opened disk (the callback
/// registers its bdev), or with the error.
pub type OnOpen = Box<dyn FnOnce(Result<&Arc<Disk>, CreateError>) + Send>;

/// The disk's life.
enum Life {
    /// OPEN is sent (or waits for the session).
    Opening,
    /// OPEN answered: the creator registers the bdev on home's thread.
    Registering,
    /// The bdev is registered and IO flows.
    Open { on_closed: OnClosed },
    /// Going down: the create failed, or the bdev was unregistered.
    Closing { on_closed: Option<OnClosed> },
    /// Down: out of the session, the bdev released.
    Closed,
}

/// An rtrs bdev.
pub struct Disk {
    me: Weak<Disk>,
    pub params: CreateParams,
    pub sess: Arc<Sess>,
    dev: OnceLock<DevHandle>,
    /// The device's info from its first OPEN: what the bdev was registered with and the
    /// IO types it supports (read without a lock: the bdev layer asks per IO).
    first: OnceLock<DeviceInfo>,
    /// The device's info from its last OPEN (or re-open).
    info: Mutex<Option<DeviceInfo>>,
    /// The bdev, while registered.
    bdev: Mutex<Option<BdevPtr>>,
    /// `bdev_rtrs_remap` calls waiting for the OPEN's answer.
    remaps: Mutex<Vec<OnRemap>>,
    life: Mutex<Life>,
    /// Every IO channel of the bdev (resets count their outstanding requests).
    chans: Mutex<Vec<Arc<ChanShared>>>,
    /// The creator's callback, until called.
    on_open: Mutex<Option<OnOpen>>,
    /// Unregisters the disk's bdev (set by the bdev module when it registers one).
    unregister: OnceLock<fn(&Arc<Disk>)>,
}

/// Every rtrs bdev, including those still opening or closing, and the module's fini
/// once it started.
struct Registry {
    disks: Vec<Arc<Disk>>,
    /// The module's fini ran: no new disk.
    stopping: bool,
    /// The module's fini, waiting for the last disk and session to go.
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

/// The disk named `name` (opening, open or closing).
pub fn find(name: &str) -> Option<Arc<Disk>> {
    registry().disks.iter().find(|d| d.name() == name).cloned()
}

/// Runs the module's fini once it waits and no disk or session is left (home's thread).
pub fn maybe_finish() {
    let done = {
        let mut r = registry();
        if r.disks.is_empty() && sess::all().is_empty() {
            r.on_empty.take()
        } else {
            None
        }
    };
    if let Some(f) = done {
        f();
    }
}

/// The module's fini (application thread), after the bdev layer unregistered every bdev,
/// so every disk that had one is closing: no disk is created from now on, one still
/// opening fails ("the application is stopping"), and `done` runs once the last disk and
/// session are gone — at once when there is none.
pub fn stop_all(done: OnClosed) {
    let disks = {
        let mut r = registry();
        r.stopping = true;
        r.on_empty = Some(done);
        r.disks.clone()
    };
    for d in &disks {
        if d.is_opening() || matches!(*lock(&d.life), Life::Registering) {
            d.open_failed("the application is stopping");
            d.sess.close_device(d);
        }
    }
    let left = (registry().disks.len(), sess::all().len());
    if left != (0, 0) {
        tracing::info!(
            "rtrs bdev: waiting for {} disk(s) and {} session(s) to close before the module finishes",
            left.0,
            left.1
        );
    }
    maybe_finish();
}

impl Disk {
    pub fn name(&self) -> &str {
        &self.params.name
    }

    /// The device's info as its last OPEN gave it (control path: takes a lock).
    pub fn info(&self) -> Option<DeviceInfo> {
        *lock(&self.info)
    }

    /// The device's info from its first OPEN, without a lock (`io_type_supported`).
    pub fn first_info(&self) -> Option<&DeviceInfo> {
        self.first.get()
    }

    /// The bdev was registered (`Some`) or is being released (`None`).
    /// How the disk's bdev is unregistered when the disk loses its target for good
    /// ([`Disk::lost`]); set once, by the module that registered the bdev.
    pub fn set_unregister(&self, unregister: fn(&Arc<Disk>)) {
        let _ = self.unregister.set(unregister);
    }

    pub fn set_bdev(&self, bdev: Option<BdevPtr>) {
        *lock(&self.bdev) = bdev;
    }

    pub fn dev(&self) -> Option<DevHandle> {
        self.dev.get().copied()
    }

    /// The admin sent OPEN: `dev` names the device on the session.
    pub fn set_dev(&self, dev: DevHandle) {
        let _ = self.dev.set(dev);
    }

    pub fn is_opening(&self) -> bool {
        matches!(*lock(&self.life), Life::Opening)
    }

    /// Whether the bdev is registered and not being deleted.
    pub fn is_open(&self) -> bool {
        matches!(*lock(&self.life), Life::Open { .. })
    }

    /// The life stage as `bdev_rtrs_get_sessions` names it.
    pub fn state_name(&self) -> &'static str {
        match *lock(&self.life) {
            Life::Opening | Life::Registering => "opening",
            Life::Open { .. } => "open",
            Life::Closing { .. } | Life::Closed => "closing",
        }
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
        self.sess
            .session()
            .map_or(self.sess.settings.mp_policy, |s| s.policy())
    }

    /// OPEN succeeded (on core 0's owner): the creator registers the bdev on home's
    /// thread. False when the disk is not opening any more (its create gave up).
    pub fn opened(&self, info: DeviceInfo) -> bool {
        {
            let mut life = lock(&self.life);
            if !matches!(*life, Life::Opening) {
                return false;
            }
            *life = Life::Registering;
        }
        let _ = self.first.set(info);
        *lock(&self.info) = Some(info);
        let Some(disk) = self.me.upgrade() else {
            return false;
        };
        if self
            .sess
            .home
            .thread()
            .send(move || disk.announce())
            .is_err()
        {
            self.open_failed("could not reach home's thread to register the bdev");
            if let Some(d) = self.me.upgrade() {
                self.sess.close_device(&d);
            }
        }
        true
    }

    /// On home's thread: hands the opened disk to the creator, unless it failed
    /// meanwhile.
    fn announce(self: Arc<Self>) {
        if !matches!(*lock(&self.life), Life::Registering) {
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
        let mut life = lock(&self.life);
        match &mut *life {
            Life::Registering => *life = Life::Open { on_closed },
            Life::Closing { on_closed: c } if c.is_none() => *c = Some(on_closed),
            _ => tracing::error!("rtrs bdev {}: registered twice", self.params.name),
        }
    }

    /// Opening failed (the session, OPEN, or the bdev's registration): the creator is
    /// told on home's thread (unless it is the one reporting it) and the disk goes to
    /// closing; the caller sends its CLOSE or ends it. Returns the message, which names
    /// the device and session.
    pub fn open_failed(&self, why: &str) -> String {
        let msg = format!(
            "bdev_rtrs_create: 'device' = {:?} over session {:?}: {why}",
            self.params.device, self.params.sessname
        );
        tracing::error!("{msg}");
        {
            let mut life = lock(&self.life);
            if matches!(*life, Life::Opening | Life::Registering) {
                *life = Life::Closing { on_closed: None };
            }
        }
        let cb = lock(&self.on_open).take();
        if let Some(cb) = cb {
            let m = msg.clone();
            let call = move || cb(Err(CreateError::OpenFailed(m)));
            if !on_home(&*self.sess.home, call) {
                tracing::error!(
                    "rtrs bdev {}: the create's answer could not be posted",
                    self.params.name
                );
            }
        }
        msg
    }

    /// The io_device is gone (every channel is): the disk closes.
    pub fn close(&self) {
        {
            let mut life = lock(&self.life);
            if !matches!(*life, Life::Open { .. }) {
                return;
            }
            if let Life::Open { on_closed } = std::mem::replace(&mut *life, Life::Closed) {
                *life = Life::Closing {
                    on_closed: Some(on_closed),
                };
            }
        }
        let Some(me) = self.me.upgrade() else {
            return;
        };
        self.sess.close_device(&me);
        // CLOSE unanswered by then: the disk is closed all the same.
        me.watch(CLOSE_WAIT);
    }

    /// Watches the disk from home every [`WATCH_EVERY`] while it is opening or closing,
    /// for at most `limit`: an opening one fails when its paths were refused for good or
    /// the limit passed; a closing one is closed at the limit. The timer goes as soon as
    /// the disk is neither (no timer is left behind an open or closed disk).
    fn watch(self: &Arc<Self>, limit: Duration) {
        let d = Arc::clone(self);
        let armed = self.sess.home.driver().run_on(0, move |cx: &mut dyn Ctx| {
            let until = cx.now().saturating_add(limit.as_nanos() as u64);
            cx.every(WATCH_EVERY, move |cx: &mut dyn Ctx| {
                let over = cx.now() >= until;
                let active = matches!(*lock(&d.life), Life::Opening | Life::Closing { .. });
                let go_on = active && d.watch_step(over);
                if !go_on {
                    if let Some(id) = cx.current() {
                        cx.unregister(id);
                    }
                }
                rtrs_spdk::engine::PollResult::Idle
            });
        });
        if armed.is_err() {
            tracing::warn!(
                "rtrs bdev {}: could not arm its watch on home",
                self.params.name
            );
        }
    }

    /// One look of [`watch`](Self::watch); false once there is nothing left to watch.
    fn watch_step(self: &Arc<Self>, over: bool) -> bool {
        if self.is_opening() {
            if let Some(why) = self.sess.refused() {
                // Every path refused for good: waiting cannot help.
                self.open_failed(&why);
                self.sess.close_device(self);
                return false;
            }
            if over {
                self.check_opening();
                return false;
            }
            return true;
        }
        if over {
            self.closed();
            return false;
        }
        true
    }

    /// Closed (CLOSE answered, or it could not be sent, or its deadline passed): the disk
    /// leaves the session and, on home's thread, releases the bdev and leaves the
    /// registry. Once only.
    pub fn closed(&self) {
        let on_closed = {
            let mut life = lock(&self.life);
            match std::mem::replace(&mut *life, Life::Closed) {
                Life::Closed => return,
                Life::Open { on_closed } => Some(on_closed),
                Life::Closing { on_closed } => on_closed,
                Life::Opening | Life::Registering => None,
            }
        };
        let Some(me) = self.me.upgrade() else {
            return;
        };
        self.sess.remove(&me);
        let finish = move || {
            registry().disks.retain(|d| !Arc::ptr_eq(d, &me));
            me.set_bdev(None);
            me.remap_done(&Err("the bdev is being deleted".to_string()));
            if let Some(f) = on_closed {
                f();
            }
            maybe_finish();
        };
        if !on_home(&*self.sess.home, finish) {
            tracing::error!(
                "rtrs bdev {}: could not post its end to home",
                self.params.name
            );
        }
    }

    /// At the opening deadline (home): fails the create, saying what the paths ran into.
    fn check_opening(self: &Arc<Self>) {
        let last = self.sess.path_errors();
        let why = format!(
            "no path connected and OPEN answered within {} s (io_timeout_sec, at least 5){}",
            self.params.io_timeout_sec.max(OPEN_WAIT_MIN_S),
            if last.is_empty() {
                String::new()
            } else {
                format!("; latest attempts: {}", last.join("; "))
            }
        );
        self.open_failed(&why);
        self.sess.close_device(self);
    }
}

pub fn errno_str(rc: i32) -> String {
    std::io::Error::from_raw_os_error(rc.abs()).to_string()
}

/// Creates the disk named in `params` (`bdev_rtrs_create`): checks the name and the
/// paths' keys, joins the open session of its `sessname` (same paths and settings) or
/// opens a new one, and sends OPEN. `on_open` is called once, on home's thread: at once
/// when the disk cannot be created, else with OPEN's outcome.
pub fn create(
    params: CreateParams,
    home: impl FnOnce() -> Result<Arc<dyn SessHome>, String>,
    on_open: OnOpen,
) {
    const M: &str = "bdev_rtrs_create";
    let name = params.name.clone();
    if registry().stopping {
        return on_open(Err(CreateError::Invalid(format!(
            "{M}: 'name' = {name:?}: the application is stopping"
        ))));
    }
    let Ok(cname) = CString::new(name.clone()) else {
        return on_open(Err(CreateError::Invalid(format!(
            "{M}: 'name' = {name:?} contains a NUL byte"
        ))));
    };
    let taken = registry().disks.iter().any(|d| d.name() == name)
        // SAFETY: lookup by a NUL-terminated name.
        || !unsafe { rtrs_spdk::spdk::sys::spdk_bdev_get_by_name(cname.as_ptr()) }.is_null();
    if taken {
        return on_open(Err(CreateError::Invalid(format!(
            "{M}: 'name' = {name:?}: a bdev with this name exists"
        ))));
    }
    let home = match home() {
        Ok(h) => h,
        Err(e) => return on_open(Err(CreateError::NoMemory(format!("{M}: {e}")))),
    };
    let sess = match Sess::find(&params.sessname) {
        Some(s) => match s.check_join(&params) {
            Ok(()) => s,
            Err(e) => return on_open(Err(CreateError::Invalid(format!("{M}: {e}")))),
        },
        None => {
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
                        transport.as_str()
                    ))));
                }
            };
            match Sess::open(&params, psks, &fabric.fabric, home) {
                Ok(s) => s,
                Err(e) => return on_open(Err(CreateError::NoMemory(format!("{M}: {e}")))),
            }
        }
    };
    let wait = Duration::from_secs(params.io_timeout_sec.max(OPEN_WAIT_MIN_S));
    let disk = Arc::new_cyclic(|me| Disk {
        me: me.clone(),
        params,
        sess: Arc::clone(&sess),
        dev: OnceLock::new(),
        first: OnceLock::new(),
        info: Mutex::new(None),
        bdev: Mutex::new(None),
        remaps: Mutex::new(Vec::new()),
        life: Mutex::new(Life::Opening),
        chans: Mutex::new(Vec::new()),
        on_open: Mutex::new(Some(on_open)),
        unregister: OnceLock::new(),
    });
    registry().disks.push(Arc::clone(&disk));
    if !sess.add(&disk) {
        // The session began closing between the lookup and now.
        disk.open_failed("the session is closing; try again");
        disk.closed();
        return;
    }
    // The deadline, and paths refused for good, watched from home.
    disk.watch(wait);
}
