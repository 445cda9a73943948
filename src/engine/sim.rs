//! The deterministic driver: several reactors stepped by hand on one thread, sharing one
//! [`VirtualClock`].
//!
//! The counterpart of SPDK's unit-test thread library (`test/unit/lib/thread`:
//! `allocate_threads`, `poll_threads`, `spdk_delay_us`): nothing runs unless the test
//! calls [`Simulation::step`], and time moves only with [`Simulation::advance`]. The
//! reactors are the production [`Reactor`]s; only the driver differs, so heartbeats,
//! timeouts and reconnects are tested without sleeping and without threads.

use std::sync::Arc;

use super::clock::{Clock, VirtualClock};
use super::mailbox::Mailboxes;
use super::poller::PollResult;
use super::poller::{Msg, SendError};
use super::reactor::{Dropped, Reactor};

/// How a simulated shutdown went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimShutdown {
    /// Steps run after the shutdown hooks.
    pub steps: usize,
    /// Whether every reactor became idle with an empty mailbox within the bound.
    pub drained: bool,
    /// What closing each reactor dropped, by reactor index.
    pub dropped: Vec<Dropped>,
}

/// `N` reactors, one virtual clock, stepped by the test.
pub struct Simulation {
    clock: VirtualClock,
    mailboxes: Arc<Mailboxes>,
    reactors: Vec<Reactor>,
}

impl Simulation {
    /// `cores` reactors (at least one) with mailboxes of `mailbox_capacity` messages, at
    /// virtual time zero.
    pub fn new(cores: usize, mailbox_capacity: usize) -> Simulation {
        let cores = cores.max(1);
        let clock = VirtualClock::new();
        let mailboxes = Mailboxes::new(cores, mailbox_capacity);
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let reactors = (0..cores)
            .map(|c| Reactor::new(c, Arc::clone(&mailboxes), Arc::clone(&shared)))
            .collect();
        Simulation {
            clock,
            mailboxes,
            reactors,
        }
    }

    /// Every reactor runs its every-loop pollers newest first, as SPDK does
    /// ([`Reactor::run_newest_first`]).
    pub fn run_newest_first(&mut self) {
        for r in &mut self.reactors {
            r.run_newest_first();
        }
    }

    /// The shared clock (clone it to give pollers or fabrics the same timeline).
    pub fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// Current virtual time in ns.
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Number of reactors.
    pub fn cores(&self) -> usize {
        self.reactors.len()
    }

    /// Reactor `core`, to register pollers or step it alone.
    ///
    /// # Panics
    /// If `core >= self.cores()`.
    pub fn reactor(&mut self, core: usize) -> &mut Reactor {
        &mut self.reactors[core]
    }

    /// The mailboxes.
    pub fn mailboxes(&self) -> &Arc<Mailboxes> {
        &self.mailboxes
    }

    /// Posts a message from "outside" (the test) to reactor `core`.
    ///
    /// # Errors
    /// As [`Mailboxes::send`]: a full mailbox gives the message back.
    pub fn send(&self, core: usize, msg: Msg) -> Result<(), SendError> {
        self.mailboxes.send(core, msg)
    }

    /// One loop of every reactor, in index order; `Busy` if any was busy.
    pub fn step(&mut self) -> PollResult {
        self.reactors
            .iter_mut()
            .fold(PollResult::Idle, |acc, r| acc.or(r.run_once()))
    }

    /// Moves virtual time forward by `ns` (no reactor runs).
    pub fn advance(&mut self, ns: u64) {
        self.clock.advance(ns);
    }

    /// Advances by `tick` and steps, repeatedly, until `duration` ns have passed.
    pub fn run_for(&mut self, duration: u64, tick: u64) {
        let tick = tick.max(1);
        let end = self.now().saturating_add(duration);
        while self.now() < end {
            self.advance(tick.min(end - self.now()));
            self.step();
        }
    }

    /// Steps until a step in which every reactor was idle and every mailbox is empty.
    /// Returns the number of steps taken (including that last one), or `None` if
    /// `max_steps` steps were not enough.
    pub fn run_until_idle(&mut self, max_steps: usize) -> Option<usize> {
        (1..=max_steps).find(|_| !self.step().is_busy() && self.mailboxes_empty())
    }

    fn mailboxes_empty(&self) -> bool {
        (0..self.cores()).all(|c| self.mailboxes.pending(c) == 0)
    }

    /// Clean shutdown, as the threaded engine does it but without waiting for time:
    /// [`Reactor::begin_shutdown`] on every reactor, then steps until all are idle with
    /// empty mailboxes (at most `max_steps`), then closes every reactor. Virtual time
    /// does not move meanwhile, so timers not yet due are dropped without firing
    /// (advance the clock before calling this to let them fire).
    pub fn shutdown(mut self, max_steps: usize) -> SimShutdown {
        for r in &mut self.reactors {
            r.begin_shutdown();
        }
        let (steps, drained) = match self.run_until_idle(max_steps) {
            Some(n) => (n, true),
            None => (max_steps, false),
        };
        let dropped = self.reactors.into_iter().map(Reactor::close).collect();
        SimShutdown {
            steps,
            drained,
            dropped,
        }
    }
}

impl std::fmt::Debug for Simulation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulation")
            .field("cores", &self.cores())
            .field("now", &self.now())
            .finish()
    }
}
