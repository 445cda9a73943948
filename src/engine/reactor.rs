//! The reactor: one loop that owns pollers, timers and a mailbox, run by one thread.
//!
//! Corresponds to an SPDK reactor running one `spdk_thread` (`spdk_thread_poll`: drain
//! messages, run active pollers, run expired timed pollers) and, on the kernel side, to
//! the per-CPU CQ polling and delayed work RTRS relies on. A reactor does not decide when
//! it runs: [`Reactor::run_once`] is called by a driver — a pinned OS thread
//! ([`Engine`](super::Engine)) or a test stepping by hand
//! ([`Simulation`](super::Simulation)).
//!
//! **Invariant: a poller lives on one reactor.** Every poller (for example the CQ poller
//! of a connection) is registered on exactly one reactor and is only ever called by it;
//! other reactors reach it only through messages. That is why pollers may hold `Rc` and
//! `RefCell` and why nothing here takes a lock.
//!
//! **One loop** ([`Reactor::run_once`]): read the clock once (every poller, message and
//! timer of the loop sees that time as [`Ctx::now`]); run the messages that were
//! waiting in the mailbox when the loop began (so a flood cannot starve pollers); call every
//! started poller once; run every timer due at the loop's time; then start what was
//! registered during the loop. No allocation happens when there is nothing to do.

use std::sync::Arc;

use super::clock::Clock;
use super::mailbox::Mailboxes;
use super::poller::{Ctx, PollResult, Poller, PollerId, Timer};
use super::poller::{Msg, SendError};
use super::stats::StatsSnapshot;
use super::table::{Table, Taken};

/// What closing a reactor threw away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Every-loop pollers dropped.
    pub pollers: usize,
    /// Timers dropped (never fired again).
    pub timers: usize,
    /// Messages left in the mailbox, dropped without running.
    pub messages: usize,
}

/// One reactor. Single-threaded: it is created, run and dropped on one thread.
pub struct Reactor {
    core: usize,
    table: Table,
    mailboxes: Arc<Mailboxes>,
    clock: Arc<dyn Clock>,
    last_start: Option<u64>,
    last_busy: bool,
    /// Every-loop pollers run newest first ([`Reactor::run_newest_first`]).
    newest_first: bool,
}

/// The [`Ctx`] our reactor gives its pollers and messages.
struct ReactorCtx<'a> {
    core: usize,
    table: &'a mut Table,
    mailboxes: &'a Mailboxes,
    /// The loop's time, read once at its start (`None` outside a loop: then the clock is
    /// read at each call). Pollers and timers of one loop all see it, as SPDK's pollers
    /// see their thread's last TSC.
    loop_now: Option<u64>,
    clock: &'a dyn Clock,
    current: Option<PollerId>,
    /// Inside a loop, registrations wait for the loop's end.
    in_loop: bool,
    newest_first: bool,
}

impl Ctx for ReactorCtx<'_> {
    fn now(&self) -> u64 {
        self.loop_now.unwrap_or_else(|| self.clock.now_ns())
    }

    fn core(&self) -> usize {
        self.core
    }

    fn cores(&self) -> usize {
        self.mailboxes.cores()
    }

    fn current(&self) -> Option<PollerId> {
        self.current
    }

    fn send(&mut self, core: usize, msg: Msg) -> Result<(), SendError> {
        self.mailboxes.send(core, msg)
    }

    fn register(&mut self, poller: Box<dyn Poller>) -> PollerId {
        self.table.insert(poller, None, self.in_loop)
    }

    fn register_timer(&mut self, timer: Timer, poller: Box<dyn Poller>) -> PollerId {
        let now = self.now();
        self.table.insert(poller, Some((timer, now)), self.in_loop)
    }

    fn unregister(&mut self, id: PollerId) -> bool {
        self.table.remove(id)
    }

    fn runs_newest_first(&self) -> bool {
        self.newest_first
    }
}

impl Reactor {
    /// Reactor number `core` of the set served by `mailboxes`, reading time from `clock`.
    ///
    /// # Panics
    /// If `core >= mailboxes.cores()` (a driver bug, not a runtime condition).
    pub fn new(core: usize, mailboxes: Arc<Mailboxes>, clock: Arc<dyn Clock>) -> Reactor {
        assert!(
            core < mailboxes.cores(),
            "reactor {core} has no mailbox: only {} were made",
            mailboxes.cores()
        );
        Reactor {
            core,
            table: Table::new(core),
            mailboxes,
            clock,
            last_start: None,
            last_busy: false,
            newest_first: false,
        }
    }

    /// From now on each loop runs the every-loop pollers in the reverse order of their
    /// registration, as SPDK runs a thread's active pollers (and
    /// [`Ctx::runs_newest_first`] says so): for simulations of code that depends on that
    /// order. Freed slots are no longer reused (a reactor in this mode grows by one slot
    /// per registration: for tests, not for long-running engines).
    pub fn run_newest_first(&mut self) {
        self.newest_first = true;
        self.table.keep_registration_order();
    }

    /// This reactor's index.
    pub fn core(&self) -> usize {
        self.core
    }

    /// The mailboxes of the reactor set.
    pub fn mailboxes(&self) -> &Arc<Mailboxes> {
        &self.mailboxes
    }

    /// Registers a poller, started at once (it runs in the next [`run_once`](Self::run_once)).
    pub fn register(&mut self, poller: Box<dyn Poller>) -> PollerId {
        self.with_ctx(|ctx| ctx.register(poller))
    }

    /// Registers a timed poller, armed now.
    pub fn register_timer(&mut self, timer: Timer, poller: Box<dyn Poller>) -> PollerId {
        self.with_ctx(|ctx| ctx.register_timer(timer, poller))
    }

    /// Unregisters a poller or timer; `false` if the id is stale or of another reactor.
    pub fn unregister(&mut self, id: PollerId) -> bool {
        self.table.remove(id)
    }

    /// Runs `f` with this reactor's context, outside any loop (as the owning thread's
    /// set-up code would).
    pub fn with_ctx<R>(&mut self, f: impl FnOnce(&mut dyn Ctx) -> R) -> R {
        let mut ctx = self.ctx(None, None);
        f(&mut ctx)
    }

    /// Live pollers plus timers.
    pub fn pollers(&self) -> usize {
        self.table.len()
    }

    /// The earliest timer deadline, if any timer is armed (may be a cancelled one's).
    pub fn next_deadline(&self) -> Option<u64> {
        self.table.next_deadline()
    }

    /// This reactor's counters.
    pub fn stats(&self) -> StatsSnapshot {
        self.mailboxes.mailbox(self.core).stats.snapshot()
    }

    /// The driver's time, as pollers see it.
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// A context for code run by this reactor; `loop_now` is the loop's time when it runs
    /// inside one.
    fn ctx(&mut self, current: Option<PollerId>, loop_now: Option<u64>) -> ReactorCtx<'_> {
        ReactorCtx {
            core: self.core,
            table: &mut self.table,
            mailboxes: &self.mailboxes,
            loop_now,
            clock: &*self.clock,
            current,
            in_loop: loop_now.is_some(),
            newest_first: self.newest_first,
        }
    }

    /// One loop: messages, pollers, due timers; `Busy` if any of them did work.
    pub fn run_once(&mut self) -> PollResult {
        let now = self.clock.now_ns();
        let stats = &self.mailboxes.mailbox(self.core).stats;
        if let Some(prev) = self.last_start {
            stats.record_time(self.last_busy, now.saturating_sub(prev));
        }
        self.last_start = Some(now);

        let mut busy = PollResult::Idle;

        // Only the messages already waiting: one sent during this loop (even to this
        // reactor) runs on the next loop, so a message chain cannot starve the pollers.
        let waiting = self.mailboxes.pending(self.core);
        let mut messages = 0u64;
        for _ in 0..waiting {
            let Some(msg) = self.mailboxes.pop(self.core) else {
                break;
            };
            msg.run(&mut self.ctx(None, Some(now)));
            messages += 1;
        }
        if messages > 0 {
            busy = PollResult::Busy;
        }

        let slots = self.table.slot_count();
        for k in 0..slots {
            let index = if self.newest_first { slots - 1 - k } else { k };
            let Some(taken) = self.table.take_active(index) else {
                continue;
            };
            busy = busy.or(self.run_taken(taken, Some(now), |p, ctx| p.poll(ctx)));
        }

        let mut fired = 0u64;
        while let Some(mut taken) = self.table.pop_due(now) {
            let r = taken.poller.poll(&mut self.ctx(Some(taken.id), Some(now)));
            busy = busy.or(r);
            self.table.finish_timer(taken, now);
            fired += 1;
        }

        self.table.activate_pending();

        let stats = &self.mailboxes.mailbox(self.core).stats;
        stats.add_messages(messages);
        stats.add_timers(fired);
        stats.record_loop(busy.is_busy());
        self.last_busy = busy.is_busy();
        busy
    }

    fn run_taken(
        &mut self,
        mut taken: Taken,
        loop_now: Option<u64>,
        f: impl FnOnce(&mut dyn Poller, &mut dyn Ctx) -> PollResult,
    ) -> PollResult {
        let r = f(&mut *taken.poller, &mut self.ctx(Some(taken.id), loop_now));
        self.table.put_back(taken);
        r
    }

    /// Start of a clean shutdown: calls [`Poller::shutdown`] once on every started poller
    /// and timer, in slot order. The driver then keeps calling
    /// [`run_once`](Self::run_once) to drain, and finally [`close`](Self::close)s.
    pub fn begin_shutdown(&mut self) {
        let now = self.clock.now_ns();
        for index in 0..self.table.slot_count() {
            if let Some(taken) = self.table.take_any(index) {
                self.run_taken(taken, Some(now), |p, ctx| {
                    p.shutdown(ctx);
                    PollResult::Idle
                });
            }
        }
        self.table.activate_pending();
    }

    /// End of the reactor: drops every poller and timer (their `Drop` runs here) and the
    /// messages still in the mailbox, without running them.
    pub fn close(mut self) -> Dropped {
        let (pollers, timers) = self.table.clear();
        let mut messages = 0;
        while let Some(msg) = self.mailboxes.pop(self.core) {
            drop(msg);
            messages += 1;
        }
        Dropped {
            pollers,
            timers,
            messages,
        }
    }
}

impl std::fmt::Debug for Reactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reactor")
            .field("core", &self.core)
            .field("pollers", &self.table.len())
            .finish()
    }
}
