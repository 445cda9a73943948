//! Poll groups, as `bdev_nvme`'s `nvme_poll_group` (docs/ARCHITECTURE.md, "The SPDK bdev:
//! poll groups"): a group is the context of an IO channel of the module's io_device
//! ([`GROUPS`]), one per SPDK thread with rtrs bdev channels; its one poller polls every
//! session core queue ([`CoreQueue`]) the group owns and completes its channels' IO.
//!
//! What holds here: a queue has one owner at a time, a group or *home* ([`Home`]: the
//! first create's thread, which runs the sessions' control pollers on timed periods so
//! that it may sleep). Every hand-over is home's decision and moves the queue as a value
//! through the groups' mailboxes ([`GroupShared`]), so no queue is polled by two threads
//! or lost between them. Who wants which queue is home's alone to know: groups tell it by
//! message (a claim, a leave), and no lock is shared. IO from a thread that does not own
//! its core goes through the core's inbox ([`CoreInbox`](super::sess::CoreInbox)); a task
//! finished by another group goes back through its own group's `done` queue. A thread
//! SPDK moves to another CPU keeps its queues.

use std::cell::{Cell, OnceCell, RefCell};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex};

use rtrs_spdk::common::Inbox;
use rtrs_spdk::engine::{Ctx, PaceState, PollPace, PollResult, Poller};
use rtrs_spdk::spdk::{
    interrupt_mode, loop_now_ns, sys, ChannelCtx, Driver, IoChannel, IoDevice, SpdkPoll,
    SpdkPoller, SpdkThread,
};
use rtrs_spdk::sync::lock;
use rtrs_spdk::Errno;

use super::reset::{self, Ended, Reset, Resets};
use super::sess::core_queue::{CoreQueue, Finished};
use super::sess::{Sess, SessHome};
use super::task::{ReturnTo, TaskRef};

/// The module's io_device whose channels are the poll groups (registered from module
/// init to fini).
static GROUPS: Mutex<Option<IoDevice<Group>>> = Mutex::new(None);

/// Period (µs) of home's pollers while they find work: a control step of a session may
/// wait up to one period, and work handed to home wakes it ([`GroupShared::kick`]). Each
/// period wakes fio's initialisation thread, so shorter ones cost fio's jobs
/// (docs/BENCHMARKS.md, "The disk's own pollers under fio").
const HOME_POLL_US: u64 = 1000;
/// Runs in a row without work after which home moves to its idle period.
const HOME_SLOW_AFTER: u32 = 100;
/// Home's idle period (µs): a sixteenth of the default heartbeat interval (1 s), as the
/// sessions' control pollers send and answer the heartbeats; a session with a shorter
/// interval shortens it to a sixteenth of its own ([`Home::keep_heartbeat`]).
const HOME_IDLE_US: u64 = 62_500;

/// What other threads hand a group.
pub struct GroupShared {
    /// Session core queues given to this group.
    gifts: Inbox<Box<CoreQueue>>,
    /// Tasks of this group's channels finished by another group.
    done: Inbox<Finished>,
    /// Home only: groups claiming session cores and leaving them.
    asks: Inbox<Ask>,
    /// Home only: resets submitted on channels of home's thread.
    resets: Inbox<Reset>,
    /// Home only: its driver, to wake its paced poller for work handed to it.
    driver: Option<Arc<Driver>>,
}

impl GroupShared {
    fn new(driver: Option<Arc<Driver>>) -> GroupShared {
        GroupShared {
            gifts: Inbox::new(),
            done: Inbox::new(),
            asks: Inbox::new(),
            resets: Inbox::new(),
            driver,
        }
    }

    /// A task of one of this group's channels finished on another thread.
    pub fn finished(&self, task: TaskRef, result: Result<(), Errno>) {
        self.done.push((task, result));
        self.kick();
    }

    /// Wakes home's paced poller (other groups poll on every reactor iteration).
    pub fn kick(&self) {
        if let Some(d) = &self.driver {
            if let Err(e) = d.wake(0) {
                tracing::debug!(
                    "rtrs bdev: home not woken ({e}); it finds the work on its idle period"
                );
            }
        }
    }

    /// Tells home (this is home's) of a claim or a leave.
    fn ask(&self, ask: Ask) {
        self.asks.push(ask);
        self.kick();
    }

    /// Hands `q` to this group.
    pub fn give(&self, q: Box<CoreQueue>) {
        self.gifts.push(q);
        self.kick();
    }
}

impl ReturnTo for GroupShared {
    fn finished(&self, task: TaskRef, result: Result<(), Errno>) {
        GroupShared::finished(self, task, result);
    }
}

/// What a group tells home of a session core: it has channels for it now (`claim`: it
/// wants the queue) or none any more.
struct Ask {
    sess: Arc<Sess>,
    core: usize,
    group: Arc<GroupShared>,
    claim: bool,
}

/// Home's record of the groups that want one session core's queue, first come first
/// served (home's thread only).
struct Claims {
    sess: Arc<Sess>,
    core: usize,
    groups: Vec<Arc<GroupShared>>,
}

/// A session core's channels on one group: the queue is wanted while `count` > 0.
struct Interest {
    sess: Arc<Sess>,
    core: usize,
    count: u32,
}

/// A group's thread-confined state.
pub struct GroupState {
    shared: Arc<GroupShared>,
    home: Arc<Home>,
    is_home: bool,
    owned: Vec<CoreQueue>,
    interest: Vec<Interest>,
    /// Home only: who wants which session core's queue.
    claims: Vec<Claims>,
    /// Requests refused at submission, completed at the next poll.
    failed: Vec<Finished>,
    /// Tasks of this thread's channels submitted and not yet finished (whichever group
    /// sends them): this group's poller does not sleep while any is out.
    outstanding: usize,
    /// Resets of this thread's channels waiting for their disk to drain, and those that
    /// ended, completed by the caller of `poll`.
    resets: Resets,
    ended: Vec<Ended>,
}

impl GroupState {
    fn new(shared: Arc<GroupShared>, home: Arc<Home>, is_home: bool) -> GroupState {
        GroupState {
            shared,
            home,
            is_home,
            owned: Vec::new(),
            interest: Vec::new(),
            claims: Vec::new(),
            failed: Vec::new(),
            outstanding: 0,
            resets: Resets::default(),
            ended: Vec::new(),
        }
    }

    /// Whether the group's poller may sleep: no task of its channels out, nothing held by
    /// a queue it owns (another thread's IO included).
    fn may_sleep(&self) -> bool {
        self.outstanding == 0 && self.resets.is_empty() && self.owned.iter().all(CoreQueue::is_idle)
    }

    pub fn shared(&self) -> &Arc<GroupShared> {
        &self.shared
    }

    /// Sends `task` on `sess`'s core `core`: directly when this group owns it, else
    /// through the session core's inbox.
    pub fn submit(&mut self, now: u64, sess: &Sess, core: usize, task: TaskRef) {
        self.outstanding += 1;
        match self.owned.iter_mut().find(|q| q.is(sess, core)) {
            Some(q) => q.submit(now, task, &*self.shared, &mut self.failed),
            None => sess.cores[core].push(task, &*self.home),
        }
    }

    /// A channel of `sess` on this group's thread, for session core `core`.
    pub fn join(&mut self, sess: &Arc<Sess>, core: usize) {
        if let Some(i) = self
            .interest
            .iter_mut()
            .find(|i| Arc::ptr_eq(&i.sess, sess) && i.core == core)
        {
            i.count += 1;
            return;
        }
        self.interest.push(Interest {
            sess: Arc::clone(sess),
            core,
            count: 1,
        });
        if !self.is_home {
            self.tell_home(sess, core, true);
        }
    }

    /// A channel of `sess` for core `core` on this thread is gone; the last one gives the
    /// queue back to home.
    pub fn leave(&mut self, sess: &Arc<Sess>, core: usize) {
        let Some(i) = self
            .interest
            .iter()
            .position(|i| Arc::ptr_eq(&i.sess, sess) && i.core == core)
        else {
            return;
        };
        self.interest[i].count -= 1;
        if self.interest[i].count > 0 {
            return;
        }
        self.interest.swap_remove(i);
        if self.is_home {
            return;
        }
        self.tell_home(sess, core, false);
        // A gift home made before it read the leave is here or on its way: taken here (and
        // given back) or, once home reads the leave, taken back by home from this
        // group's mailbox (see `GroupState::on_ask`).
        self.take_gifts();
        if let Some(k) = self.owned.iter().position(|q| q.is(sess, core)) {
            let q = self.owned.swap_remove(k);
            self.give_home(q);
        }
    }

    /// Tells home this group claims (`claim`) or leaves `sess`'s core `core`.
    fn tell_home(&self, sess: &Arc<Sess>, core: usize, claim: bool) {
        self.home.shared.ask(Ask {
            sess: Arc::clone(sess),
            core,
            group: Arc::clone(&self.shared),
            claim,
        });
    }

    fn give_home(&self, q: CoreQueue) {
        q.sess.cores[q.core].set_at_home(true);
        self.home.shared.give(Box::new(q));
    }

    fn wants(&self, q: &CoreQueue) -> bool {
        self.interest.iter().any(|i| q.is(&i.sess, i.core))
    }

    fn take_gifts(&mut self) {
        while let Some(q) = self.shared.gifts.pop() {
            let q = *q;
            if self.is_home {
                let (sess, core) = (Arc::clone(&q.sess), q.core);
                self.owned.push(q);
                self.rebalance(&sess, core);
            } else if self.wants(&q) {
                self.owned.push(q);
            } else {
                self.give_home(q);
            }
        }
    }

    /// Home: the groups that claim `sess`'s core `core`.
    fn claims_of(&mut self, sess: &Arc<Sess>, core: usize) -> Option<&mut Vec<Arc<GroupShared>>> {
        self.claims
            .iter_mut()
            .find(|c| Arc::ptr_eq(&c.sess, sess) && c.core == core)
            .map(|c| &mut c.groups)
    }

    /// Home: records a claim or a leave. After a leave, takes back what home gave the
    /// group and it did not take (a gift sent before home read the leave, which a group
    /// already gone would never take); what it still claims goes back to it.
    fn on_ask(&mut self, ask: Ask) {
        let Ask {
            sess,
            core,
            group,
            claim,
        } = ask;
        if claim {
            match self.claims_of(&sess, core) {
                Some(groups) => groups.push(group),
                None => self.claims.push(Claims {
                    sess: Arc::clone(&sess),
                    core,
                    groups: vec![group],
                }),
            }
            self.rebalance(&sess, core);
            return;
        }
        if let Some(groups) = self.claims_of(&sess, core) {
            if let Some(k) = groups.iter().position(|g| Arc::ptr_eq(g, &group)) {
                groups.remove(k);
            }
        }
        self.claims.retain(|c| !c.groups.is_empty());
        for _ in 0..group.gifts.len() {
            let Some(q) = group.gifts.pop() else {
                break;
            };
            let (qs, qc) = (Arc::clone(&q.sess), q.core);
            let still = self
                .claims_of(&qs, qc)
                .is_some_and(|gs| gs.iter().any(|g| Arc::ptr_eq(g, &group)));
            if still {
                group.gifts.push(q);
            } else {
                qs.cores[qc].set_at_home(true);
                self.owned.push(*q);
                self.rebalance(&qs, qc);
            }
        }
    }

    /// Home: hands `sess`'s core `core` to its first claimer, if home has it.
    fn rebalance(&mut self, sess: &Arc<Sess>, core: usize) {
        let Some(i) = self.owned.iter().position(|q| q.is(sess, core)) else {
            return;
        };
        let Some(g) = self
            .claims_of(sess, core)
            .and_then(|gs| gs.first().cloned())
        else {
            return;
        };
        let q = self.owned.swap_remove(i);
        sess.cores[core].set_at_home(false);
        g.give(Box::new(q));
    }

    /// One poll: queues handed over, every owned queue, tasks handed back, resets.
    /// Finished tasks of this thread's channels go to `out`, ended resets to `ended`,
    /// completed by the caller once this state is no longer borrowed (a completion may
    /// submit again). Busy while a reset waits.
    fn poll(&mut self, now: u64, out: &mut Vec<Finished>) -> bool {
        self.take_gifts();
        if self.is_home {
            while let Some(ask) = self.shared.asks.pop() {
                self.on_ask(ask);
            }
            while let Some(r) = self.shared.resets.pop() {
                self.resets.add(r);
            }
        }
        let mut busy = false;
        for q in &mut self.owned {
            busy |= q.poll(now, &*self.shared, out);
        }
        let mut i = 0;
        while i < self.owned.len() {
            if self.owned[i].finished() {
                let q = self.owned.swap_remove(i);
                q.fail_waiting(&*self.shared, out);
                let (sess, core) = (Arc::clone(&q.sess), q.core);
                drop(q);
                sess.core_done(core);
                busy = true;
            } else {
                i += 1;
            }
        }
        while let Some(f) = self.shared.done.pop() {
            out.push(f);
        }
        out.append(&mut self.failed);
        // Everything in `out` is a task of this thread's channels, finished once.
        self.outstanding = self.outstanding.saturating_sub(out.len());
        if !self.resets.is_empty() {
            self.resets.poll(now, &mut self.ended);
            busy = true;
        }
        busy | !out.is_empty()
    }

    /// The resets that ended in the last poll, to complete.
    fn take_ended(&mut self) -> Vec<Ended> {
        std::mem::take(&mut self.ended)
    }

    /// Transmits what the poll and the completions after it posted (docs/ARCHITECTURE.md,
    /// "Posting and pushing").
    fn push(&mut self) {
        for q in &mut self.owned {
            q.push();
        }
    }
}

/// Completes finished tasks on their channels' thread (the caller's).
fn complete_all(out: &mut Vec<Finished>) {
    for (task, result) in out.drain(..) {
        task.complete(result);
    }
}

/// The home group and the module's engine driver on its thread.
pub struct Home {
    pub driver: Arc<Driver>,
    pub shared: Arc<GroupShared>,
    pub thread: SpdkThread,
    /// Home's thread's accel channel, held while home lives (see [`AccelHold`]).
    accel: AccelHold,
}

/// A thread's accel channel, held by the module. Every bdev channel SPDK opens takes its
/// thread's accel channel; when none is held, SPDK makes one (about 1.7 MiB of
/// `calloc`) and frees it again when the bdev channel goes. On home's thread — where
/// SPDK examines every new rtrs bdev, each examine opening channels and closing them —
/// that was a make-and-free per create, and the freed blocks, split by the allocations
/// that each create keeps, left the client's heap a few hundred KiB larger per device
/// (docs/BENCHMARKS.md, "SPDK: many devices over one session"). Held here, the
/// examines find the channel. `bdev_nvme`'s poll groups hold theirs the same way.
struct AccelHold(AtomicPtr<sys::spdk_io_channel>);

impl AccelHold {
    /// The calling SPDK thread's accel channel (null where accel has none to give:
    /// nothing is held then).
    fn get() -> AccelHold {
        // SAFETY: called on an SPDK thread; the channel is put in `put`.
        AccelHold(AtomicPtr::new(unsafe { sys::spdk_accel_get_io_channel() }))
    }

    /// Gives the channel back; on the thread it was got on.
    fn put(&self) {
        let ch = self.0.swap(ptr::null_mut(), Ordering::AcqRel);
        if !ch.is_null() {
            // SAFETY: got in `get` on this thread (the caller's), put once (swapped out).
            unsafe { sys::spdk_put_io_channel(ch) };
        }
    }
}

static HOME: Mutex<Option<Arc<Home>>> = Mutex::new(None);

impl Home {
    /// Home, made on the calling SPDK thread at the first call.
    ///
    /// # Errors
    /// Not on an SPDK thread, or the driver could not be made.
    pub fn get() -> Result<Arc<Home>, String> {
        let mut h = lock(&HOME);
        if let Some(h) = h.as_ref() {
            return Ok(Arc::clone(h));
        }
        let thread = SpdkThread::current().ok_or("not called on an SPDK thread")?;
        let pace = PollPace::keeping(
            HOME_IDLE_US * 16,
            HOME_POLL_US,
            HOME_IDLE_US,
            HOME_SLOW_AFTER,
        );
        let driver = Driver::adopt_paced(&[thread], pace).map_err(|e| e.to_string())?;
        let home = Arc::new(Home {
            shared: Arc::new(GroupShared::new(Some(Arc::clone(&driver)))),
            driver,
            thread,
            accel: AccelHold::get(),
        });
        let state = GroupState::new(Arc::clone(&home.shared), Arc::clone(&home), true);
        home.driver
            .run_on(0, move |cx: &mut dyn Ctx| {
                cx.register(Box::new(HomePoller {
                    state,
                    out: Vec::with_capacity(256),
                }));
            })
            .map_err(|e| format!("starting the module's home poller: {e}"))?;
        *h = Some(Arc::clone(&home));
        Ok(home)
    }

    /// Home, if it was made.
    pub fn existing() -> Option<Arc<Home>> {
        lock(&HOME).clone()
    }

    /// A session's heartbeat interval (ms): home's idle period stays within a sixteenth
    /// of the shortest.
    pub fn keep_heartbeat(&self, hb_interval_ms: u64) {
        self.driver
            .cap_idle((hb_interval_ms.saturating_mul(1000) / 16).max(HOME_POLL_US));
    }

    /// Whether the caller runs on home's thread.
    pub fn is_current(&self) -> bool {
        self.thread.is_current()
    }

    /// Module fini, on home's thread, once every session is gone: home's pollers go.
    pub fn stop() {
        let Some(home) = lock(&HOME).take() else {
            return;
        };
        home.accel.put();
        home.driver.shutdown_core();
        home.driver.drop_core();
    }
}

impl SessHome for Home {
    fn thread(&self) -> SpdkThread {
        self.thread
    }

    fn is_current(&self) -> bool {
        Home::is_current(self)
    }

    fn driver(&self) -> &Arc<Driver> {
        &self.driver
    }

    fn give(&self, q: Box<CoreQueue>) {
        self.shared.give(q);
    }

    fn kick(&self) {
        self.shared.kick();
    }

    fn keep_heartbeat(&self, hb_interval_ms: u64) {
        Home::keep_heartbeat(self, hb_interval_ms);
    }
}

/// Home's group as a poller of the module's driver.
struct HomePoller {
    state: GroupState,
    out: Vec<Finished>,
}

impl Poller for HomePoller {
    fn poll(&mut self, cx: &mut dyn Ctx) -> PollResult {
        let busy = self.state.poll(cx.now(), &mut self.out);
        complete_all(&mut self.out);
        reset::finish(&mut self.state.take_ended());
        self.state.push();
        if busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }
}

/// The pace of a group's poller in SPDK's interrupt mode (docs/ARCHITECTURE.md,
/// "Interrupt mode"): on every wake-up of its thread while it finds work or has IO
/// outstanding; after 2000 runs in a row without either, every 5 ms, until a submission
/// on its thread wakes it. What only its timer finds: IO that another thread left in the
/// inbox of a queue it owns, a gift, core 0's admin timers (each at most 5 ms late).
const GROUP_PACE: PollPace = PollPace {
    active_us: 0,
    idle_us: 5000,
    slow_after: 2000,
};

/// A poll group: the context of a channel of [`GROUPS`] on a thread other than home's.
pub struct Group {
    state: RefCell<GroupState>,
    out: RefCell<Vec<Finished>>,
    /// Set once the group is in place, dropped first at destruction.
    poller: OnceCell<SpdkPoller>,
    /// In interrupt mode: where the poller is in [`GROUP_PACE`].
    pace: Cell<Option<PaceState>>,
}

impl Group {
    /// Moves the poller to `period_us` (a failure leaves the old period).
    fn repace(&self, period_us: u64) -> bool {
        let moved = self.poller.get().is_some_and(|p| p.set_period(period_us));
        if !moved {
            tracing::warn!("rtrs bdev: a poll group's poller could not move to {period_us} µs");
        }
        moved
    }

    /// After a poll that found work (`busy`) or not: the pace's next period.
    fn paced(&self, busy: bool) {
        let Some(mut st) = self.pace.get() else {
            return;
        };
        let stay = !self.state.borrow().may_sleep();
        if let Some(us) = st.after(&GROUP_PACE, busy || stay) {
            if !self.repace(us) {
                return;
            }
        }
        self.pace.set(Some(st));
    }

    /// Work was submitted on the group's thread: a sleeping poller runs again at once.
    fn wake(&self) {
        let Some(mut st) = self.pace.get() else {
            return;
        };
        if let Some(us) = st.wake(&GROUP_PACE) {
            if !self.repace(us) {
                return;
            }
        }
        self.pace.set(Some(st));
    }
}

impl ChannelCtx for Group {
    type Device = ();

    fn create(_: &Arc<()>) -> Result<Group, Errno> {
        // Home exists: a group is made only for a bdev channel, after a bdev was created.
        let Some(home) = Home::existing() else {
            tracing::error!("rtrs bdev: a poll group before any rtrs bdev");
            return Err(Errno::ENODEV);
        };
        let shared = Arc::new(GroupShared::new(None));
        Ok(Group {
            state: RefCell::new(GroupState::new(shared, home, false)),
            out: RefCell::new(Vec::with_capacity(256)),
            poller: OnceCell::new(),
            pace: Cell::new(interrupt_mode().then(PaceState::default)),
        })
    }

    /// Starts the group's poller, which knows the group by its address (now final).
    fn placed(&self) -> Result<(), Errno> {
        let group = ptr::from_ref(self);
        let run = move || {
            // SAFETY: the group outlives its poller (its Drop drops the poller first),
            // which runs on the group's thread only.
            let g = unsafe { &*group };
            group_poll(g)
        };
        let poller = SpdkPoller::start(c"rtrs_group", 0, run).ok_or(Errno::ENOMEM)?;
        // Set once: SPDK places a context once.
        let _ = self.poller.set(poller);
        Ok(())
    }
}

impl Drop for Group {
    /// On the group's thread, once every bdev channel holding it is gone (so it has left
    /// every session core): the poller first, then the queues it still owns go home.
    fn drop(&mut self) {
        drop(self.poller.take());
        let mut st = self.state.borrow_mut();
        st.take_gifts();
        let owned = std::mem::take(&mut st.owned);
        for q in owned {
            st.give_home(q);
        }
    }
}

/// A run of a group's poller.
fn group_poll(g: &Group) -> SpdkPoll {
    let mut out = g.out.take();
    let busy = g.state.borrow_mut().poll(loop_now_ns(), &mut out);
    complete_all(&mut out);
    g.out.replace(out);
    let mut ended = g.state.borrow_mut().take_ended();
    reset::finish(&mut ended);
    g.state.borrow_mut().push();
    g.paced(busy);
    SpdkPoll::from_busy(busy)
}

/// Registers the groups' io_device (module init).
pub fn register_groups() {
    *lock(&GROUPS) = Some(IoDevice::register(&Arc::new(()), c"rtrs_poll_group"));
}

/// Unregisters the groups' io_device (module fini, once every bdev channel is gone).
pub fn unregister_groups() {
    if let Some(d) = lock(&GROUPS).take() {
        d.unregister();
    }
}

/// A bdev channel's hold on its thread's group: the channel of [`GROUPS`], or home.
pub enum GroupRef {
    /// The channel runs on home's thread: its IO goes through the session cores' inboxes
    /// and home's poller completes it.
    Home(Arc<Home>),
    Group(IoChannel<Group>),
}

impl GroupRef {
    /// The calling thread's group.
    ///
    /// # Errors
    /// No home, or SPDK could not make the channel.
    pub fn get() -> Result<GroupRef, Errno> {
        let home = Home::get().map_err(|_| Errno::ENODEV)?;
        if home.is_current() {
            return Ok(GroupRef::Home(home));
        }
        let ch = lock(&GROUPS).as_ref().ok_or(Errno::ENODEV)?.channel()?;
        Ok(GroupRef::Group(ch))
    }

    /// Runs `f` on the group's state (home's thread: `None`).
    pub fn with<R>(&self, f: impl FnOnce(Option<&mut GroupState>) -> R) -> R {
        match self {
            GroupRef::Home(_) => f(None),
            GroupRef::Group(g) => {
                let r = f(Some(&mut g.state.borrow_mut()));
                g.wake();
                r
            }
        }
    }

    /// A reset of one of this thread's channels waits in the thread's group (home's
    /// through its mailbox), whose poller ends it.
    pub fn reset(&self, r: Reset) {
        match self {
            GroupRef::Home(h) => {
                h.shared.resets.push(r);
                h.shared.kick();
            }
            GroupRef::Group(g) => {
                g.state.borrow_mut().resets.add(r);
                g.wake();
            }
        }
    }

    /// The group's mailboxes.
    pub fn shared(&self) -> Arc<GroupShared> {
        match self {
            GroupRef::Home(h) => Arc::clone(&h.shared),
            GroupRef::Group(_) => self.with(|g| Arc::clone(g.expect("a group").shared())),
        }
    }
}
