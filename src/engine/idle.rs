//! What a reactor thread does when a loop found nothing to do.
//!
//! SPDK reactors busy-poll by default and can be put in interrupt mode; our
//! [`IdleStrategy::BusyPoll`] is the default, [`IdleStrategy::Adaptive`] the opt-in for
//! shared machines and tests (two busy-polling threads on a 2-core machine starve
//! everything else). The hand-stepped [`Simulation`](super::Simulation) has no idle
//! strategy: the test decides when to step.

use std::time::Duration;

use super::mailbox::Mailboxes;
use super::poller::PollResult;
use super::reactor::Reactor;

/// How a reactor thread waits between idle loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdleStrategy {
    /// Never sleep: lowest latency, one core at 100% per reactor. The default.
    #[default]
    BusyPoll,
    /// Spin for a while, then sleep with backoff; see [`Adaptive`].
    Adaptive(Adaptive),
}

impl IdleStrategy {
    /// [`IdleStrategy::Adaptive`] with [`Adaptive::default`] settings.
    pub fn adaptive() -> IdleStrategy {
        IdleStrategy::Adaptive(Adaptive::default())
    }
}

/// Adaptive idling: after `spin_loops` idle loops in a row the thread sleeps, first for
/// `min_sleep`, doubling on every further idle loop up to `max_sleep`; any busy loop
/// resets it. A sleep never outlasts the next timer deadline, and a message posted to
/// the reactor wakes it at once (`Thread::unpark`), so sleeping adds latency only to work
/// that arrives without a message (for example a completion on a connection's CQ): at
/// most `max_sleep`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adaptive {
    /// Idle loops before the first sleep. Default 1000.
    pub spin_loops: u32,
    /// First sleep. Default 5 µs.
    pub min_sleep: Duration,
    /// Longest sleep. Default 1 ms.
    pub max_sleep: Duration,
}

impl Default for Adaptive {
    fn default() -> Self {
        Adaptive {
            spin_loops: 1000,
            min_sleep: Duration::from_micros(5),
            max_sleep: Duration::from_millis(1),
        }
    }
}

/// A reactor thread's idle bookkeeping.
#[derive(Debug)]
pub(crate) struct IdleState {
    strategy: IdleStrategy,
    idle_run: u32,
    sleep: Duration,
}

impl IdleState {
    pub(crate) fn new(strategy: IdleStrategy) -> IdleState {
        let sleep = match strategy {
            IdleStrategy::Adaptive(a) => a.min_sleep,
            IdleStrategy::BusyPoll => Duration::ZERO,
        };
        IdleState {
            strategy,
            idle_run: 0,
            sleep,
        }
    }

    /// Called after each loop with its result; may sleep the calling thread.
    pub(crate) fn after_loop(&mut self, result: PollResult, reactor: &Reactor, mb: &Mailboxes) {
        let IdleStrategy::Adaptive(a) = self.strategy else {
            return;
        };
        if result.is_busy() {
            self.idle_run = 0;
            self.sleep = a.min_sleep;
            return;
        }
        self.idle_run = self.idle_run.saturating_add(1);
        if self.idle_run <= a.spin_loops {
            std::hint::spin_loop();
            return;
        }
        let mut nap = self.sleep;
        if let Some(deadline) = reactor.next_deadline() {
            let now = reactor.now();
            if deadline <= now {
                return;
            }
            nap = nap.min(Duration::from_nanos(deadline - now));
        }
        mb.park(reactor.core(), nap);
        self.sleep = (self.sleep * 2).min(a.max_sleep);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::engine::clock::VirtualClock;
    use crate::engine::poller::{Ctx, Timer};

    fn reactor() -> (Reactor, Arc<Mailboxes>) {
        let mb = Mailboxes::new(1, 4);
        let r = Reactor::new(0, Arc::clone(&mb), Arc::new(VirtualClock::new()));
        (r, mb)
    }

    #[test]
    fn adaptive_backs_off_to_the_cap_and_resets_on_busy() {
        let (r, mb) = reactor();
        let a = Adaptive {
            spin_loops: 2,
            min_sleep: Duration::from_nanos(100),
            max_sleep: Duration::from_nanos(400),
        };
        let mut s = IdleState::new(IdleStrategy::Adaptive(a));
        let mut sleeps = Vec::new();
        for _ in 0..6 {
            s.after_loop(PollResult::Idle, &r, &mb);
            sleeps.push(s.sleep.as_nanos());
        }
        // Two spins, then sleeps of 100, 200, 400, 400 ns (the value shown is the next).
        assert_eq!(sleeps, [100, 100, 200, 400, 400, 400]);
        s.after_loop(PollResult::Busy, &r, &mb);
        assert_eq!((s.idle_run, s.sleep.as_nanos()), (0, 100));
    }

    #[test]
    fn a_due_timer_prevents_sleeping_and_busy_poll_never_sleeps() {
        let (mut r, mb) = reactor();
        r.register_timer(
            Timer::once_ns(0),
            Box::new(|_: &mut dyn Ctx| PollResult::Idle),
        );
        let a = Adaptive {
            spin_loops: 0,
            min_sleep: Duration::from_secs(3600),
            max_sleep: Duration::from_secs(3600),
        };
        let mut s = IdleState::new(IdleStrategy::Adaptive(a));
        // Would park for an hour if the due timer were ignored.
        s.after_loop(PollResult::Idle, &r, &mb);
        assert_eq!(s.sleep, Duration::from_secs(3600));

        let mut busy = IdleState::new(IdleStrategy::default());
        busy.after_loop(PollResult::Idle, &r, &mb);
        assert_eq!(busy.idle_run, 0);
    }
}
