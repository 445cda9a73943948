//! What a poller sees: the [`Poller`] trait, its [`Ctx`], timers, poller ids, and the
//! messages ([`Msg`]) a poller sends to another reactor through its `Ctx`.
//!
//! This is the driver-independent half of the engine. A poller corresponds to an SPDK
//! `spdk_poller` (and to the kernel's CQ polling plus `delayed_work` for heartbeats and
//! reconnects); the [`Ctx`] is the only way it reaches the driver, so the same poller runs
//! under our [`Reactor`](super::Reactor), under the hand-stepped
//! [`Simulation`](super::Simulation), and under SPDK threads (`crate::spdk::driver`).

use std::fmt;
use std::time::Duration;

/// What one call of a poller did, as SPDK's `SPDK_POLLER_BUSY` / `SPDK_POLLER_IDLE`.
/// Drivers use it for busy/idle accounting and for the idle strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PollResult {
    /// Some work was done (a completion handled, a message run...).
    Busy,
    /// Nothing to do this time.
    Idle,
}

impl PollResult {
    /// `Busy` if either is busy.
    #[must_use]
    pub fn or(self, other: PollResult) -> PollResult {
        if self == PollResult::Busy || other == PollResult::Busy {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }

    /// Whether this is [`PollResult::Busy`].
    pub fn is_busy(self) -> bool {
        self == PollResult::Busy
    }
}

/// Names a registered poller or timer on one reactor; returned by
/// [`Ctx::register`] and [`Ctx::register_timer`], consumed by [`Ctx::unregister`].
/// Ids are generation-checked: an id whose poller is gone never names a newer one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PollerId {
    pub(crate) core: u32,
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

impl PollerId {
    /// The reactor the poller lives on.
    pub fn core(self) -> usize {
        self.core as usize
    }
}

/// When a timed poller runs: once after a delay, or every period.
/// Corresponds to `spdk_poller_register(fn, arg, period_us)` with a non-zero period
/// (one-shot: the poller is unregistered after its first run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer {
    pub(crate) first_ns: u64,
    pub(crate) period_ns: Option<u64>,
}

impl Timer {
    /// Runs once, `delay` after it was armed (a zero delay runs it on the next loop).
    pub fn once(delay: Duration) -> Timer {
        Timer {
            first_ns: duration_ns(delay),
            period_ns: None,
        }
    }

    /// Runs every `period`, the first time one period after it was armed. A zero period
    /// is raised to 1 ns (at most one run per loop in any case).
    pub fn periodic(period: Duration) -> Timer {
        let p = duration_ns(period).max(1);
        Timer {
            first_ns: p,
            period_ns: Some(p),
        }
    }

    /// Nanosecond form of [`Timer::once`].
    pub fn once_ns(delay_ns: u64) -> Timer {
        Timer {
            first_ns: delay_ns,
            period_ns: None,
        }
    }

    /// Nanosecond form of [`Timer::periodic`].
    pub fn periodic_ns(period_ns: u64) -> Timer {
        let p = period_ns.max(1);
        Timer {
            first_ns: p,
            period_ns: Some(p),
        }
    }

    /// The period, if periodic.
    pub fn period_ns(&self) -> Option<u64> {
        self.period_ns
    }
}

pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The driver as a poller sees it. Implemented by our reactors and, later, by the SPDK
/// adapter (see the [module doc](super) for the mapping).
///
/// All operations are non-blocking and act on the calling reactor, except
/// [`send`](Ctx::send) which posts to another reactor's mailbox.
pub trait Ctx {
    /// Monotonic nanoseconds from the driver's clock.
    fn now(&self) -> u64;

    /// Index of the reactor running this code (0-based rank in the cpumask; SPDK: the
    /// index of the SPDK thread among the application's reactors).
    fn core(&self) -> usize;

    /// How many reactors there are; valid targets of [`send`](Ctx::send) are `0..cores()`.
    fn cores(&self) -> usize;

    /// The poller or timer being run, `None` inside a message. Lets a poller unregister
    /// itself without having to learn its own id first.
    fn current(&self) -> Option<PollerId>;

    /// Posts `msg` to reactor `core`'s mailbox; it runs there, in order with the other
    /// messages from this reactor, during one of that reactor's next loops. Sending to
    /// the own core is allowed (the message runs on a later loop, never re-entrantly).
    ///
    /// # Errors
    /// Backpressure: a full mailbox gives the message back in [`SendError`]
    /// ([`SendError::into_msg`]); keep it and retry on a later poll. Also an index out of
    /// `0..cores()`.
    fn send(&mut self, core: usize, msg: Msg) -> Result<(), SendError>;

    /// Registers a poller on this reactor; it is called once per loop, starting with the
    /// next loop (a poller registered inside a loop does not run in that same loop).
    fn register(&mut self, poller: Box<dyn Poller>) -> PollerId;

    /// Registers a timed poller on this reactor, armed now; see [`Timer`].
    fn register_timer(&mut self, timer: Timer, poller: Box<dyn Poller>) -> PollerId;

    /// Unregisters (cancels) a poller or timer of this reactor and drops it — at once, or
    /// when it returns if it is the one running. Returns `false` if the id is stale or of
    /// another reactor. A poller may unregister itself ([`current`](Ctx::current)).
    fn unregister(&mut self, id: PollerId) -> bool;

    /// Asks the driver to run the current poller at once whenever `fd` becomes readable,
    /// until the poller is unregistered: for a driver that lets idle pollers sleep (SPDK
    /// in interrupt mode, docs/ARCHITECTURE.md, "Interrupt mode"), the descriptor that
    /// announces the poller's work ([`Cq::wait_fd`](crate::fabric::Cq::wait_fd)). The
    /// poller keeps `fd` open while it is registered. Returns whether the driver watches
    /// it; drivers that never let a poller sleep do not (the default), and a poller works
    /// the same either way.
    fn wake_on_readable(&mut self, fd: std::os::fd::RawFd) -> bool {
        let _ = fd;
        false
    }

    /// Whether every loop runs each of this reactor's pollers once, the most recently
    /// registered first: SPDK runs a thread's active pollers so, and outside interrupt
    /// mode runs every one on every loop. A poller registered before code that registers
    /// pollers of its own (an SPDK bdev channel, which completes IO in its poller) then
    /// runs after those in every loop, and sees what they finished in the same loop
    /// (docs/ARCHITECTURE.md, "Answers in the loop that completed them"). Default:
    /// `false` (our reactors run pollers in the order of their slots).
    fn runs_newest_first(&self) -> bool {
        false
    }
}

impl dyn Ctx + '_ {
    /// Sends a closure to run on reactor `core` (boxes it: see [`Msg::new`]).
    ///
    /// # Errors
    /// As [`Ctx::send`]: the message comes back when the mailbox is full.
    pub fn defer<F>(&mut self, core: usize, f: F) -> Result<(), SendError>
    where
        F: FnOnce(&mut dyn Ctx) + Send + 'static,
    {
        self.send(core, Msg::new(f))
    }

    /// Arms a one-shot closure timer: `f` runs once, `delay` from now. Cancel with
    /// [`Ctx::unregister`].
    pub fn after<F>(&mut self, delay: Duration, f: F) -> PollerId
    where
        F: FnOnce(&mut dyn Ctx) + 'static,
    {
        self.register_timer(Timer::once(delay), Box::new(OnceFn(Some(f))))
    }

    /// Arms a periodic closure timer: `f` runs every `period`. Cancel with
    /// [`Ctx::unregister`].
    pub fn every<F>(&mut self, period: Duration, f: F) -> PollerId
    where
        F: FnMut(&mut dyn Ctx) -> PollResult + 'static,
    {
        self.register_timer(Timer::periodic(period), Box::new(f))
    }
}

/// Code a driver calls repeatedly: a connection's CQ poller, a heartbeat, a CM event
/// poller. A poller lives on exactly one reactor for its whole life (it may hold `Rc`s
/// and need not be `Send`); it must never block, and must not assume which driver calls
/// it — everything it needs from the driver is in the [`Ctx`].
///
/// Closures `FnMut(&mut dyn Ctx) -> PollResult` are pollers too.
pub trait Poller {
    /// Does whatever work is ready, without blocking, and says whether there was any.
    fn poll(&mut self, ctx: &mut dyn Ctx) -> PollResult;

    /// The driver is stopping. Called once, before the drain loops: finish or fail
    /// outstanding work (complete pending requests with an error, post a disconnect...).
    /// The poller keeps being polled (timers keep firing) during the drain, then is
    /// dropped. Default: nothing.
    fn shutdown(&mut self, ctx: &mut dyn Ctx) {
        let _ = ctx;
    }

    /// A short name for logs.
    fn name(&self) -> &str {
        "poller"
    }

    /// Whether a driver may let this poller sleep after an idle spell (until a descriptor
    /// it watches, a message or its idle period wakes it): `false` while work it started
    /// may finish without anything waking it (IO at a backend). Default: `true`.
    fn may_sleep(&self) -> bool {
        true
    }

    /// Called by a driver that is about to let this poller sleep after an idle run (one
    /// whose descriptors wake it, [`Ctx::wake_on_readable`]): ready them
    /// ([`Cq::arm`](crate::fabric::Cq::arm)). `false` keeps it awake for one more run
    /// (something may have come while arming); the driver asks again after that run if
    /// it is idle too. Default: `true`.
    fn before_sleep(&mut self) -> bool {
        true
    }
}

impl<F> Poller for F
where
    F: FnMut(&mut dyn Ctx) -> PollResult,
{
    fn poll(&mut self, ctx: &mut dyn Ctx) -> PollResult {
        self(ctx)
    }
}

/// A one-shot closure as a poller (used by [`Ctx::after`]).
struct OnceFn<F>(Option<F>);

impl<F: FnOnce(&mut dyn Ctx)> Poller for OnceFn<F> {
    fn poll(&mut self, ctx: &mut dyn Ctx) -> PollResult {
        match self.0.take() {
            Some(f) => {
                f(ctx);
                PollResult::Busy
            }
            None => PollResult::Idle,
        }
    }

    fn name(&self) -> &str {
        "once"
    }
}

impl fmt::Debug for dyn Poller + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Poller({})", self.name())
    }
}

/// A message for another reactor: code to run there with that reactor's [`Ctx`].
pub struct Msg(Inner);

/// A boxed closure message.
type BoxedFn = Box<dyn FnOnce(&mut dyn Ctx) + Send>;

enum Inner {
    Call { f: fn(&mut dyn Ctx, u64), arg: u64 },
    Boxed(BoxedFn),
}

impl Msg {
    /// A closure message. Boxed: allocates once unless `f` captures nothing.
    pub fn new<F>(f: F) -> Msg
    where
        F: FnOnce(&mut dyn Ctx) + Send + 'static,
    {
        Msg(Inner::Boxed(Box::new(f)))
    }

    /// A function-and-argument message, as `spdk_thread_send_msg(thread, fn, arg)`;
    /// never allocates. `arg` is typically an index into a per-reactor table.
    pub fn call(f: fn(&mut dyn Ctx, u64), arg: u64) -> Msg {
        Msg(Inner::Call { f, arg })
    }

    /// Runs the message with the receiving reactor's context.
    pub fn run(self, ctx: &mut dyn Ctx) {
        match self.0 {
            Inner::Call { f, arg } => f(ctx, arg),
            Inner::Boxed(f) => f(ctx),
        }
    }
}

impl fmt::Debug for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Inner::Call { arg, .. } => write!(f, "Msg::call(arg {arg})"),
            Inner::Boxed(_) => f.write_str("Msg::closure"),
        }
    }
}

/// A message that could not be posted; it comes back to the sender.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The target mailbox is full (backpressure): retry later with [`SendError::into_msg`].
    #[error("mailbox of reactor {core} is full ({capacity} messages); retry on a later poll")]
    Full {
        /// Target reactor.
        core: usize,
        /// Mailbox capacity.
        capacity: usize,
        /// The refused message.
        msg: Msg,
    },
    /// No such reactor.
    #[error("no reactor {core}: there are {cores} reactors (0..{cores})")]
    NoSuchCore {
        /// Requested reactor.
        core: usize,
        /// How many exist.
        cores: usize,
        /// The refused message.
        msg: Msg,
    },
}

impl SendError {
    /// The message, back to the sender.
    pub fn into_msg(self) -> Msg {
        match self {
            SendError::Full { msg, .. } | SendError::NoSuchCore { msg, .. } => msg,
        }
    }

    /// Whether this is backpressure (worth retrying) rather than a bad reactor index.
    pub fn is_full(&self) -> bool {
        matches!(self, SendError::Full { .. })
    }
}
