//! The engine's [`Ctx`] over SPDK threads: the second driver of the engine's pollers (see
//! [`crate::engine`]'s table). A [`Driver`] is a set of "cores", each an SPDK thread; a
//! poller registered on a core becomes an `spdk_poller` of that thread, a timer a timed
//! `spdk_poller` (a one-shot timer unregisters itself after its first run), a message to
//! a core an `spdk_thread_send_msg`, and "now" is `spdk_get_ticks` in nanoseconds. No
//! threads of ours exist: the SPDK reactors run everything.
//!
//! Cores come either from [`Driver::spawn`], which creates one SPDK thread per core of the
//! application's cpumask (as the nvmf target creates its poll groups; the RTRS target
//! serves accepted connection `c` on core `(c-1) mod n`), or from [`Driver::adopt`], which
//! takes existing threads (the bdev module's home thread). A driver may pace the
//! pollers registered without a period ([`Driver::adopt_paced`]): an active period while
//! they find work, a longer one after an idle spell, and [`Driver::wake`] for work handed
//! to them from elsewhere (docs/ARCHITECTURE.md, "The SPDK bdev: poll groups").
//!
//! In SPDK's interrupt mode ([`interrupt_mode`]) a spawned driver paces its untimed
//! pollers ([`INTR_PACE`]): they run on every wake-up of their thread while they find
//! work, and after an idle spell sleep on a timer until a descriptor they watch
//! ([`Ctx::wake_on_readable`]), a message or the timer wakes them; a poller with work
//! outstanding elsewhere ([`Poller::may_sleep`]) does not sleep (docs/ARCHITECTURE.md,
//! "Interrupt mode").
//!
//! Each core's poller table is touched only by that core's thread: pollers need not be
//! `Send`, as under our reactors. That is a property of the types, not of a debug check:
//! the table is reached only through an `OnCore`, which exists only on the core's own
//! thread (made by comparing the calling SPDK thread with the core's, or inside a poller
//! or message of that core, which SPDK runs on that thread) and cannot leave it. Code
//! working for a core from another SPDK thread gets the clock ([`Driver::now`]) and
//! nothing else: registering pollers or timers, or sending as the core, is the core's own.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void};
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::sys;
use super::thread::{app_cores, interrupt_mode, loop_now_ns, SpdkThread};
use crate::engine::{
    Ctx, Msg, PaceState, PollPace, PollResult, Poller, PollerId, SendError, Timer,
};
use crate::sync::lock;
use crate::Errno;

/// Depth of SPDK's per-thread message ring, reported in [`SendError::Full`].
const MSG_RING: usize = 65_536;

/// The pace of a spawned driver's untimed pollers in SPDK's interrupt mode: on every
/// wake-up of the thread while they find work; after 2000 runs in a row without (a few
/// milliseconds of spinning, far longer than the gap between the requests of a busy
/// QD1 stream) every millisecond, which is how late the first request after an idle spell
/// is seen on a queue without a descriptor to wake on (loopback); the tcp fabric's
/// readiness set and verbs' completion channels wake their poller at once.
pub const INTR_PACE: PollPace = PollPace {
    active_us: 0,
    idle_us: 1000,
    slow_after: 2000,
};

/// The idle period (µs) of a paced poller that a descriptor wakes
/// ([`Ctx::wake_on_readable`]): what remains for its timer is work that arrives neither
/// on the descriptor nor by a message (the SPDK driver wakes a core's pollers after each
/// message it runs), such as a disconnect asked for over RPC.
pub const WOKEN_IDLE_US: u64 = 20_000;

/// A set of SPDK threads the engine's pollers run on, indexed 0..n ("cores").
pub struct Driver {
    cores: Box<[Core]>,
    /// Periods (µs) of pollers registered without one: `active_us` 0 = run on every
    /// iteration; an `idle_us` above it stretches an idle poller's period (see
    /// [`PollPace`]).
    pace: PollPace,
    /// Cap on `pace.idle_us` ([`Driver::cap_idle`]); `u64::MAX`: none.
    idle_cap_us: AtomicU64,
    /// Interrupt mode with paced pollers: each message run on a core wakes its pollers.
    wake_on_msg: bool,
}

struct Core {
    /// Set at construction, never changed.
    thread: *mut sys::spdk_thread,
    /// Only ever borrowed on `thread`: through an [`OnCore`] (see [`Driver::table`]).
    table: RefCell<Table>,
}

// SAFETY: `thread` is written once, before the driver is shared, and only read after.
// `table` is borrowed only through an `OnCore` for its core, which exists only on that
// core's SPDK thread (it is made by `OnCore::assume` only where that holds: in
// `Driver::on_current`, which compares the calling SPDK thread with the core's in every
// build, and in a poller or message of the core, which SPDK runs on the core's thread)
// and is neither `Send` nor `Sync`, so it cannot be carried to another thread. SPDK runs one thread's pollers and messages one at a time,
// so the RefCell is never shared between OS threads at once.
unsafe impl Sync for Driver {}
// SAFETY: as above; the boxed pollers are dropped on their own core (`drop_core`) or,
// once every thread is gone, by whoever drops the last handle.
unsafe impl Send for Driver {}

/// Proof that the calling code runs on `core`'s own SPDK thread: the only way to the
/// core's poller table, and so to registering, unregistering and running its pollers.
/// Neither `Send` nor `Sync` (the raw-pointer marker): it stays on the thread it was made
/// on.
#[derive(Clone, Copy)]
struct OnCore {
    core: usize,
    _this_thread: PhantomData<*const ()>,
}

impl OnCore {
    /// # Safety
    /// The caller runs on `core`'s SPDK thread: it compared the calling thread with the
    /// core's, or it is a poller registered on that core (SPDK runs a poller on the thread
    /// that registered it) or a message sent to it.
    unsafe fn assume(core: usize) -> OnCore {
        OnCore {
            core,
            _this_thread: PhantomData,
        }
    }
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    free: Vec<u32>,
    current: Option<PollerId>,
}

struct Entry {
    gen: u32,
    slot: Option<NonNull<Registration>>,
}

/// A poller registered on a core: the box SPDK's `spdk_poller` points at.
struct Registration {
    driver: Arc<Driver>,
    id: PollerId,
    once: bool,
    dead: Cell<bool>,
    spdk: Cell<*mut sys::spdk_poller>,
    /// Where a poller on the driver's [`PollPace`] is in it (None: a timer, or a fixed
    /// pace).
    pace: Cell<Option<PaceState>>,
    /// SPDK interrupts on descriptors that wake this poller ([`Ctx::wake_on_readable`]),
    /// unregistered before the registration is freed. With any, the poller sleeps
    /// [`WOKEN_IDLE_US`].
    wakes: RefCell<Vec<*mut sys::spdk_interrupt>>,
    poller: RefCell<Box<dyn Poller>>,
}

impl Registration {
    /// The driver's pace as it applies to this poller.
    fn pace(&self) -> PollPace {
        let mut p = self.driver.pace();
        if !self.wakes.borrow().is_empty() {
            p.idle_us = WOKEN_IDLE_US.max(p.active_us);
        }
        p
    }
}

/// Why a [`Driver`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    #[error("spdk_thread_create failed for core {core} (is it in the application's cpumask?)")]
    ThreadCreate { core: u32 },
    #[error("no SPDK thread given for the driver")]
    NoThreads,
}

impl Driver {
    /// Creates one SPDK thread per core of the application's cpumask, named
    /// `{prefix}_{core}`; core index `k` is the `k`-th core of the mask. Untimed pollers
    /// run on every loop, or on [`INTR_PACE`] in interrupt mode.
    ///
    /// # Errors
    /// [`DriverError::ThreadCreate`] (threads created before the failure are told to exit).
    pub fn spawn(prefix: &str) -> Result<Arc<Driver>, DriverError> {
        let mut threads = Vec::new();
        for core in app_cores() {
            match SpdkThread::create_on(&format!("{prefix}_{core}"), core) {
                Some(t) => threads.push(t),
                None => {
                    for t in threads {
                        let _ = t.exit();
                    }
                    return Err(DriverError::ThreadCreate { core });
                }
            }
        }
        let pace = if interrupt_mode() {
            INTR_PACE
        } else {
            PollPace::fixed(0)
        };
        Driver::adopt_paced(&threads, pace)
    }

    /// A driver over existing SPDK threads (core `k` is `threads[k]`).
    ///
    /// # Errors
    /// [`DriverError::NoThreads`] for an empty list.
    pub fn adopt(threads: &[SpdkThread]) -> Result<Arc<Driver>, DriverError> {
        Driver::adopt_paced(threads, PollPace::fixed(0))
    }

    /// As [`Driver::adopt`], but the pollers registered without a period run every
    /// `pace.active_us` µs, and one that finds nothing to do on `pace.slow_after` runs in
    /// a row moves to `pace.idle_us` until a run finds work or [`Driver::wake`] is called
    /// for its core: for work off the IO fast path on threads that must be able to sleep.
    /// fio's `spdk_bdev` plugin busy-loops a thread that has any untimed poller, and its
    /// initialisation thread floats over every CPU — a busy one there competes with the
    /// job threads for their cores.
    ///
    /// # Errors
    /// [`DriverError::NoThreads`] for an empty list.
    pub fn adopt_paced(threads: &[SpdkThread], pace: PollPace) -> Result<Arc<Driver>, DriverError> {
        if threads.is_empty() {
            return Err(DriverError::NoThreads);
        }
        let cores = threads
            .iter()
            .map(|t| Core {
                thread: t.as_ptr(),
                table: RefCell::new(Table::default()),
            })
            .collect();
        Ok(Arc::new(Driver {
            cores,
            pace,
            idle_cap_us: AtomicU64::new(u64::MAX),
            wake_on_msg: !pace.is_fixed() && interrupt_mode(),
        }))
    }

    /// Shortens the idle period of this driver's paced pollers to at most `us` µs (never
    /// below their active period), from their next run on: for a driver whose pollers
    /// take on work with a tighter deadline (a session with a shorter heartbeat interval).
    pub fn cap_idle(&self, us: u64) {
        self.idle_cap_us.fetch_min(us, Ordering::AcqRel);
    }

    /// The pace as it is now (the idle cap applied).
    fn pace(&self) -> PollPace {
        let mut p = self.pace;
        let cap = self.idle_cap_us.load(Ordering::Acquire);
        p.idle_us = p.idle_us.min(cap).max(p.active_us);
        p
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.cores.len()
    }

    /// The SPDK thread of `core`.
    pub fn thread(&self, core: usize) -> Option<SpdkThread> {
        let p = self.cores.get(core)?.thread;
        // SAFETY: the pointer was a live thread when stored; threads leave only through
        // `stop`, after which the driver is not used to reach them.
        unsafe { SpdkThread::from_ptr(p) }
    }

    /// The calling thread's [`OnCore`], if it is one of this driver's cores: the checked
    /// way onto a core, in every build.
    fn on_current(&self) -> Option<OnCore> {
        let me = SpdkThread::current()?.as_ptr();
        let core = self.cores.iter().position(|c| c.thread == me)?;
        // SAFETY: the calling SPDK thread is `core`'s, just compared.
        Some(unsafe { OnCore::assume(core) })
    }

    /// The time in nanoseconds as every core's [`Ctx::now`] reads it (the calling thread's
    /// poll start, [`loop_now_ns`]): for code that works on a core's behalf from another
    /// SPDK thread (the bdev's IO channels drive their core's session handle, whose data
    /// path only reads the clock). Nothing else of a core can be had from another thread:
    /// pollers, timers and messages are registered and sent on the core's own thread (send
    /// it a message).
    pub fn now(&self) -> u64 {
        loop_now_ns()
    }

    /// Runs `msg` on `core` with that core's [`Ctx`]; callable from any thread.
    ///
    /// # Errors
    /// [`SendError::Full`] (retry later) or [`SendError::NoSuchCore`] (bad index or the
    /// thread is exiting); the message comes back in either.
    pub fn send(self: &Arc<Self>, core: usize, msg: Msg) -> Result<(), SendError> {
        let Some(thread) = self.thread(core) else {
            return Err(SendError::NoSuchCore {
                core,
                cores: self.cores(),
                msg,
            });
        };
        let boxed = Box::new((Arc::clone(self), core, msg));
        let arg = Box::into_raw(boxed).cast::<c_void>();
        // SAFETY: `run_msg` takes the box back exactly once; on failure it stays ours.
        let rc = unsafe { sys::spdk_thread_send_msg(thread.as_ptr(), Some(run_msg), arg) };
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: not queued, so `arg` is still ours.
        let (_, _, msg) = *unsafe { Box::from_raw(arg.cast::<(Arc<Driver>, usize, Msg)>()) };
        Err(if Errno::from_neg(rc) == Some(Errno::ENOMEM) {
            SendError::Full {
                core,
                capacity: MSG_RING,
                msg,
            }
        } else {
            SendError::NoSuchCore {
                core,
                cores: self.cores(),
                msg,
            }
        })
    }

    /// Runs `f` on `core` with its [`Ctx`] (a boxed [`Msg`]).
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn run_on<F>(self: &Arc<Self>, core: usize, f: F) -> Result<(), SendError>
    where
        F: FnOnce(&mut dyn Ctx) + Send + 'static,
    {
        self.send(core, Msg::new(f))
    }

    /// Puts `core`'s pollers that an idle spell moved to the driver's idle period back on
    /// its active one, for work handed to them from elsewhere (a channel asking for a
    /// queue, a path added): from any thread, by a message to the core's thread, which
    /// an SPDK reactor runs at once. Nothing changes under a fixed pace.
    ///
    /// # Errors
    /// [`SendError::NoSuchCore`] or [`SendError::Full`] (the message could not be posted;
    /// the pollers find the work on their idle period).
    pub fn wake(self: &Arc<Self>, core: usize) -> Result<(), SendError> {
        if self.pace.is_fixed() {
            return Ok(());
        }
        let d = Arc::clone(self);
        self.run_on(core, move |_cx| {
            if let Some(on) = d.on_current() {
                d.wake_on(on);
            }
        })
    }

    /// Calls every poller's [`Poller::shutdown`] on the calling core (which must be one of
    /// the driver's; otherwise nothing happens).
    pub fn shutdown_core(self: &Arc<Self>) {
        let Some(on) = self.on_current() else {
            return;
        };
        for s in self.live_slots(on) {
            // A shutdown hook may unregister other pollers: only live ones are called.
            let alive = self.table(on).entries.iter().any(|e| e.slot == Some(s));
            if !alive {
                continue;
            }
            // SAFETY: live slot of this core, used on its own thread; while its hook
            // runs it is `current`, so unregistering itself only marks it dead.
            let slot = unsafe { s.as_ref() };
            let id = slot.id;
            self.table(on).current = Some(id);
            if let Ok(mut p) = slot.poller.try_borrow_mut() {
                let mut cx = SpdkCtx { driver: self, on };
                p.shutdown(&mut cx);
            }
            self.table(on).current = None;
            if slot.dead.get() {
                // SAFETY: live slot, no longer borrowed; `slot` is not used after.
                unsafe { self.free_slot(on, s) };
            }
        }
    }

    /// Unregisters and drops every poller of the calling core.
    pub fn drop_core(self: &Arc<Self>) {
        let Some(on) = self.on_current() else {
            return;
        };
        let ids: Vec<PollerId> = {
            let t = self.table(on);
            t.entries
                .iter()
                .filter_map(|e| e.slot)
                // SAFETY: live slots of this core, read on its thread.
                .map(|s| unsafe { s.as_ref() }.id)
                .collect()
        };
        for id in ids {
            self.unregister_on(on, id);
        }
    }

    /// Drops every core's pollers and tells every thread to exit, then runs `done` on the
    /// calling SPDK thread (or on the first core if the caller is not an SPDK thread).
    /// Only for drivers from [`spawn`](Self::spawn): adopted threads belong to others.
    pub fn stop<F: FnOnce() + Send + 'static>(self: &Arc<Self>, done: F) {
        let back = SpdkThread::current();
        let left = Arc::new(AtomicUsize::new(self.cores()));
        let done: Arc<Mutex<Option<F>>> = Arc::new(Mutex::new(Some(done)));
        for core in 0..self.cores() {
            let left = Arc::clone(&left);
            let done = Arc::clone(&done);
            let drv = Arc::clone(self);
            let msg = Msg::new(move |_cx: &mut dyn Ctx| {
                drv.shutdown_core();
                drv.drop_core();
                let me = drv.thread(core);
                if left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    // A poisoned lock still holds the completion: run it all the same.
                    let f = lock(&done).take();
                    if let Some(f) = f {
                        match back {
                            Some(t) if !t.is_current() => {
                                if t.send(f).is_err() {
                                    tracing::warn!(
                                        "spdk driver: could not post the stop completion"
                                    );
                                }
                            }
                            _ => f(),
                        }
                    }
                }
                if let Some(t) = me {
                    // SAFETY: we run on `t` itself, as spdk_thread_exit requires.
                    unsafe {
                        sys::spdk_thread_exit(t.as_ptr());
                    }
                }
            });
            if let Err(e) = self.send(core, msg) {
                tracing::warn!("spdk driver: stop message to core {core} refused: {e}");
            }
        }
    }

    /// The poller table of `on`'s core; `on` proves the caller runs on that core.
    fn table(&self, on: OnCore) -> std::cell::RefMut<'_, Table> {
        debug_assert_eq!(
            self.thread(on.core).map(SpdkThread::as_ptr),
            SpdkThread::current().map(SpdkThread::as_ptr),
            "an OnCore exists only on its core's SPDK thread"
        );
        self.cores[on.core].table.borrow_mut()
    }

    fn register_on(
        self: &Arc<Self>,
        on: OnCore,
        period_us: u64,
        once: bool,
        poller: Box<dyn Poller>,
    ) -> PollerId {
        let core = on.core;
        let id = {
            let mut t = self.table(on);
            let index = match t.free.pop() {
                Some(i) => i,
                None => {
                    t.entries.push(Entry { gen: 0, slot: None });
                    u32::try_from(t.entries.len() - 1).unwrap_or(u32::MAX)
                }
            };
            let e = &mut t.entries[index as usize];
            e.gen = e.gen.wrapping_add(1);
            PollerId {
                core: u32::try_from(core).unwrap_or(u32::MAX),
                index,
                gen: e.gen,
            }
        };
        let paced = period_us == 0 && !once && !self.pace.is_fixed();
        let slot = Box::new(Registration {
            driver: Arc::clone(self),
            id,
            once,
            dead: Cell::new(false),
            spdk: Cell::new(ptr::null_mut()),
            pace: Cell::new(paced.then(PaceState::default)),
            wakes: RefCell::new(Vec::new()),
            poller: RefCell::new(poller),
        });
        let raw = NonNull::from(Box::leak(slot));
        self.table(on).entries[id.index as usize].slot = Some(raw);
        // SAFETY: `raw` stays valid until `free_slot` unregisters the SPDK poller first
        // and then frees it; the name is a static C string. SPDK registers the poller on
        // the calling thread, which `on` proves is the core's: `poll_slot` runs there.
        let p = unsafe {
            sys::spdk_poller_register_named(
                Some(poll_slot),
                raw.as_ptr().cast::<c_void>(),
                if period_us == 0 {
                    self.pace.active_us
                } else {
                    period_us
                },
                c"rtrs".as_ptr(),
            )
        };
        // SAFETY: `raw` is live (just registered).
        unsafe { raw.as_ref() }.spdk.set(p);
        if p.is_null() {
            tracing::error!("spdk driver: spdk_poller_register failed on core {core}");
        }
        id
    }

    /// The core's registered pollers now (a copy: walking it may register or free some).
    fn live_slots(&self, on: OnCore) -> Vec<NonNull<Registration>> {
        self.table(on)
            .entries
            .iter()
            .filter_map(|e| e.slot)
            .collect()
    }

    /// [`Driver::wake`] on the core's own thread.
    fn wake_on(&self, on: OnCore) {
        for slot in self.live_slots(on) {
            // SAFETY: a live slot of this core (taken from its table just now, and nothing
            // in this loop frees one), used on its own thread.
            let s = unsafe { slot.as_ref() };
            let Some(mut st) = s.pace.get() else {
                continue;
            };
            if let Some(us) = st.wake(&s.pace()) {
                // SAFETY: as above.
                if !unsafe { repace(slot, us) } {
                    continue;
                }
            }
            s.pace.set(Some(st));
        }
    }

    /// The live registration `id` of `on`'s core.
    fn slot_of(&self, on: OnCore, id: PollerId) -> Option<NonNull<Registration>> {
        let t = self.table(on);
        match t.entries.get(id.index as usize) {
            Some(e) if e.gen == id.gen => e.slot,
            _ => None,
        }
    }

    /// [`Ctx::wake_on_readable`] for poller `id` of `on`'s core.
    fn watch_on(&self, on: OnCore, id: PollerId, fd: RawFd) -> bool {
        let Some(slot) = self.slot_of(on, id) else {
            return false;
        };
        // SAFETY: a live slot of this core, used on its own thread.
        let s = unsafe { slot.as_ref() };
        if s.pace.get().is_none() || !interrupt_mode() {
            // Never slowed, or a polling thread (which has no descriptor set to add to):
            // nothing to wake.
            return false;
        }
        // SAFETY: `slot` stays valid until `free_slot` unregisters this interrupt first;
        // registered on the calling thread, the core's, where SPDK runs `wake_slot`.
        let intr = unsafe {
            sys::spdk_interrupt_register(
                fd,
                Some(wake_slot),
                slot.as_ptr().cast::<c_void>(),
                c"rtrs_wake".as_ptr(),
            )
        };
        if intr.is_null() {
            tracing::warn!(
                fd,
                "spdk driver: spdk_interrupt_register refused a descriptor"
            );
            return false;
        }
        s.wakes.borrow_mut().push(intr);
        true
    }

    fn unregister_on(&self, on: OnCore, id: PollerId) -> bool {
        let Some(slot) = self.slot_of(on, id) else {
            return false;
        };
        if self.table(on).current == Some(id) {
            // SAFETY: live slot; freed by the trampoline when the poll returns.
            unsafe { slot.as_ref() }.dead.set(true);
        } else {
            // SAFETY: live slot of this core, not running: free it now.
            unsafe { self.free_slot(on, slot) };
        }
        true
    }

    /// # Safety
    /// `slot` must be a live registration of `on`'s core, not borrowed.
    unsafe fn free_slot(&self, on: OnCore, slot: NonNull<Registration>) {
        let id = {
            // SAFETY: live per the contract.
            let s = unsafe { slot.as_ref() };
            for mut intr in s.wakes.take() {
                // SAFETY: our own interrupt, registered on this thread, unregistered once.
                unsafe { sys::spdk_interrupt_unregister(&mut intr) };
            }
            let mut p = s.spdk.get();
            if !p.is_null() {
                // SAFETY: our own registered poller, unregistered once on its thread
                // (allowed from inside its own callback).
                unsafe { sys::spdk_poller_unregister(&mut p) };
            }
            s.id
        };
        {
            let mut t = self.table(on);
            t.entries[id.index as usize].slot = None;
            t.free.push(id.index);
        }
        // SAFETY: from Box::leak in register_on; SPDK no longer calls it.
        drop(unsafe { Box::from_raw(slot.as_ptr()) });
    }
}

/// A poller's or message's view of the SPDK driver: only ever made on the core's thread.
struct SpdkCtx<'a> {
    driver: &'a Arc<Driver>,
    on: OnCore,
}

impl Ctx for SpdkCtx<'_> {
    /// The poll's start ([`loop_now_ns`]): a poller's deadlines are measured as SPDK
    /// schedules its timed pollers.
    fn now(&self) -> u64 {
        loop_now_ns()
    }

    fn core(&self) -> usize {
        self.on.core
    }

    fn cores(&self) -> usize {
        self.driver.cores()
    }

    fn current(&self) -> Option<PollerId> {
        self.driver.table(self.on).current
    }

    fn send(&mut self, core: usize, msg: Msg) -> Result<(), SendError> {
        self.driver.send(core, msg)
    }

    fn register(&mut self, poller: Box<dyn Poller>) -> PollerId {
        self.driver.register_on(self.on, 0, false, poller)
    }

    fn register_timer(&mut self, timer: Timer, poller: Box<dyn Poller>) -> PollerId {
        let (ns, once) = match timer.period_ns() {
            Some(p) => (p, false),
            None => (timer.first_ns, true),
        };
        // A zero-delay one-shot runs on the next loop as an active poller.
        let us = ns.div_ceil(1000);
        self.driver.register_on(self.on, us, once, poller)
    }

    fn unregister(&mut self, id: PollerId) -> bool {
        if id.core() != self.on.core {
            return false;
        }
        self.driver.unregister_on(self.on, id)
    }

    fn wake_on_readable(&mut self, fd: RawFd) -> bool {
        match self.current() {
            Some(id) => self.driver.watch_on(self.on, id, fd),
            None => false,
        }
    }

    /// SPDK runs a thread's active pollers newest first (`spdk_thread_poll` walks its
    /// list from the tail, where registration puts them); ours are active on every loop
    /// unless the driver paces them (interrupt mode, or a paced bdev thread).
    fn runs_newest_first(&self) -> bool {
        self.driver.pace.is_fixed() && self.driver.pace.active_us == 0
    }
}

/// A descriptor that a sleeping poller watches became readable: the poller goes back on
/// its active period (no change while it is on it already).
unsafe extern "C" fn wake_slot(arg: *mut c_void) -> c_int {
    let Some(slot) = NonNull::new(arg.cast::<Registration>()) else {
        return 0;
    };
    // SAFETY: `arg` is a live slot: `free_slot` unregisters this interrupt before freeing
    // it, and SPDK runs the interrupt on the thread that registered it, the core's.
    let s = unsafe { slot.as_ref() };
    let Some(mut st) = s.pace.get().filter(|st| st.is_slow() && !s.dead.get()) else {
        return 0;
    };
    if let Some(us) = st.wake(&s.pace()) {
        // SAFETY: as above; the slot is not freed before this returns.
        if !unsafe { repace(slot, us) } {
            return 0;
        }
    }
    s.pace.set(Some(st));
    1
}

unsafe extern "C" fn poll_slot(arg: *mut c_void) -> c_int {
    let Some(slot) = NonNull::new(arg.cast::<Registration>()) else {
        return 0;
    };
    // SAFETY: `arg` is a live slot: SPDK stops calling once free_slot unregistered it.
    let s = unsafe { slot.as_ref() };
    // Borrowed, not cloned (two atomic operations per poll): the slot, which holds the
    // driver, lives until `free_slot` below.
    let driver = &s.driver;
    // SAFETY: SPDK runs a poller on the thread that registered it, which was the core's
    // (`register_on` takes an `OnCore`).
    let on = unsafe { OnCore::assume(s.id.core()) };
    let id = s.id;
    driver.table(on).current = Some(id);
    let (r, stay, hold) = match s.poller.try_borrow_mut() {
        Ok(mut p) => {
            let mut cx = SpdkCtx { driver, on };
            let r = p.poll(&mut cx);
            let stay = s.pace.get().is_some() && !p.may_sleep();
            // About to sleep on its descriptors: they are readied first, and one more
            // run follows if that readying may have missed something.
            let hold = r == PollResult::Idle
                && !stay
                && !s.wakes.borrow().is_empty()
                && s.pace.get().is_some_and(|st| st.slows_next(&s.pace()))
                && !p.before_sleep();
            (r, stay, hold)
        }
        Err(_) => (PollResult::Idle, false, false),
    };
    driver.table(on).current = None;
    if let Some(mut st) = s.pace.get().filter(|_| !s.dead.get() && !hold) {
        match st.after(&s.pace(), r == PollResult::Busy || stay) {
            // SAFETY: live slot of this core, on its thread, no longer borrowed.
            Some(us) if !unsafe { repace(slot, us) } => {}
            _ => s.pace.set(Some(st)),
        }
    }
    if s.once || s.dead.get() {
        // Freeing the slot drops its reference to the driver: hold one meanwhile.
        let driver = Arc::clone(driver);
        // SAFETY: live slot of this core, no longer borrowed; `s` is not used after.
        unsafe { driver.free_slot(on, slot) };
    }
    match r {
        PollResult::Busy => sys::spdk_thread_poller_rc_SPDK_POLLER_BUSY as c_int,
        PollResult::Idle => sys::spdk_thread_poller_rc_SPDK_POLLER_IDLE as c_int,
    }
}

/// Moves a paced poller's SPDK poller to `period_us`: the new one is registered first, so
/// a failure leaves the old one running (and returns false).
///
/// # Safety
/// `slot` is a live registration of the calling thread's core, not freed before this
/// returns.
unsafe fn repace(slot: NonNull<Registration>, period_us: u64) -> bool {
    // SAFETY: live per the contract.
    let s = unsafe { slot.as_ref() };
    // SAFETY: as in `register_on`: `slot` stays valid until `free_slot` unregisters the
    // poller that `s.spdk` holds, which is this new one from here on.
    let new = unsafe {
        sys::spdk_poller_register_named(
            Some(poll_slot),
            slot.as_ptr().cast::<c_void>(),
            period_us,
            c"rtrs".as_ptr(),
        )
    };
    if new.is_null() {
        tracing::warn!("spdk driver: a poller could not move to a {period_us} µs period");
        return false;
    }
    let mut old = s.spdk.replace(new);
    if !old.is_null() {
        // SAFETY: our own poller on this thread, unregistered once (allowed from inside
        // its own callback: SPDK frees it when the callback returns).
        unsafe { sys::spdk_poller_unregister(&mut old) };
    }
    true
}

unsafe extern "C" fn run_msg(arg: *mut c_void) {
    // SAFETY: from Box::into_raw in Driver::send, handed back once by SPDK.
    let (driver, core, msg) = *unsafe { Box::from_raw(arg.cast::<(Arc<Driver>, usize, Msg)>()) };
    // SAFETY: `Driver::send` posted this message to `core`'s thread, and SPDK runs a
    // message on the thread it was sent to.
    let on = unsafe { OnCore::assume(core) };
    let mut cx = SpdkCtx {
        driver: &driver,
        on,
    };
    msg.run(&mut cx);
    // A message is work handed to the core (a connection to serve, a path to close):
    // its pollers that slept go back on their active period.
    if driver.wake_on_msg {
        driver.wake_on(on);
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("cores", &self.cores())
            .finish()
    }
}
