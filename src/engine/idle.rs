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

/// Two periods for a timed poller off the IO fast path (an SPDK disk's own control work,
/// which the SPDK driver runs as timed pollers): `active_us` while it finds work, and
/// `idle_us` once it has found none on `slow_after` runs in a row. The first run that
/// finds work, or a [`PaceState::wake`] from whoever hands it some, puts it back on
/// `active_us`. A thread whose only pollers are timed may sleep between their runs (fio's
/// `spdk_bdev` plugin sleeps its initialisation thread so), and every run is a wake-up
/// that takes a CPU from whatever runs there (docs/BENCHMARKS.md, "The disk's own pollers
/// under fio").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollPace {
    pub active_us: u64,
    pub idle_us: u64,
    pub slow_after: u32,
}

impl PollPace {
    /// One period, whatever the poller finds.
    pub fn fixed(period_us: u64) -> PollPace {
        PollPace {
            active_us: period_us,
            idle_us: period_us,
            slow_after: u32::MAX,
        }
    }

    /// `active_us`, and an idle period of a sixteenth of `interval_us`, the interval of
    /// something the poller must keep doing (sending heartbeats), so that an idle period
    /// stays well inside it: at least `active_us`, at most `max_idle_us`.
    pub fn keeping(
        interval_us: u64,
        active_us: u64,
        max_idle_us: u64,
        slow_after: u32,
    ) -> PollPace {
        PollPace {
            active_us,
            idle_us: (interval_us / 16).min(max_idle_us).max(active_us),
            slow_after,
        }
    }

    pub fn is_fixed(&self) -> bool {
        self.idle_us == self.active_us
    }
}

/// One poller's place in its [`PollPace`]: on the active period until it has been idle
/// `slow_after` runs in a row.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PaceState {
    idle_runs: u32,
    slow: bool,
}

impl PaceState {
    /// After a run that found work (`busy`) or none: the period the poller moves to, when
    /// it changes.
    pub fn after(&mut self, pace: &PollPace, busy: bool) -> Option<u64> {
        if pace.is_fixed() {
            return None;
        }
        if busy {
            return self.wake(pace);
        }
        if self.slow {
            return None;
        }
        self.idle_runs = self.idle_runs.saturating_add(1);
        if self.idle_runs < pace.slow_after {
            return None;
        }
        self.slow = true;
        Some(pace.idle_us)
    }

    /// Whether one more idle run would put the poller on its idle period.
    pub fn slows_next(&self, pace: &PollPace) -> bool {
        !pace.is_fixed() && !self.slow && self.idle_runs.saturating_add(1) >= pace.slow_after
    }

    /// Work is on its way: the period the poller moves to, when it changes.
    pub fn wake(&mut self, pace: &PollPace) -> Option<u64> {
        self.idle_runs = 0;
        if !self.slow {
            return None;
        }
        self.slow = false;
        Some(pace.active_us)
    }

    /// Whether the poller is on its idle period.
    pub fn is_slow(&self) -> bool {
        self.slow
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

    const PACE: PollPace = PollPace {
        active_us: 1_000,
        idle_us: 100_000,
        slow_after: 3,
    };

    #[test]
    fn an_idle_poller_slows_after_its_count_and_a_busy_run_speeds_it_up() {
        let mut st = PaceState::default();
        assert_eq!(st.after(&PACE, false), None);
        assert_eq!(st.after(&PACE, false), None);
        // A busy run starts the count again.
        assert_eq!(st.after(&PACE, true), None);
        assert!(!st.slows_next(&PACE));
        assert_eq!(st.after(&PACE, false), None);
        assert_eq!(st.after(&PACE, false), None);
        assert!(!st.is_slow());
        assert!(st.slows_next(&PACE));
        assert_eq!(st.after(&PACE, false), Some(100_000));
        assert!(st.is_slow());
        assert!(!st.slows_next(&PACE));
        // Once slow, more idle runs change nothing.
        assert_eq!(st.after(&PACE, false), None);
        assert_eq!(st.after(&PACE, true), Some(1_000));
        assert!(!st.is_slow());
        assert_eq!(st.after(&PACE, true), None);
    }

    #[test]
    fn a_wake_speeds_up_only_a_slow_poller_and_restarts_its_count() {
        let mut st = PaceState::default();
        assert_eq!(st.after(&PACE, false), None);
        assert_eq!(st.after(&PACE, false), None);
        assert_eq!(st.wake(&PACE), None);
        // The count started again: two more idle runs do not slow it.
        assert_eq!(st.after(&PACE, false), None);
        assert_eq!(st.after(&PACE, false), None);
        assert_eq!(st.after(&PACE, false), Some(100_000));
        assert_eq!(st.wake(&PACE), Some(1_000));
        assert_eq!(st.wake(&PACE), None);
    }

    #[test]
    fn an_idle_period_is_a_sixteenth_of_the_interval_kept_within_its_bounds() {
        let idle = |interval_us| PollPace::keeping(interval_us, 1_000, 100_000, 100).idle_us;
        assert_eq!(idle(5_000_000), 100_000);
        assert_eq!(idle(800_000), 50_000);
        assert_eq!(idle(16_000), 1_000);
        assert_eq!(idle(1_000), 1_000);
        assert_eq!(idle(u64::MAX), 100_000);
        // A heartbeat no longer than the active period: the pace stays fixed.
        assert!(PollPace::keeping(1_000, 1_000, 100_000, 100).is_fixed());
    }

    #[test]
    fn a_fixed_pace_never_changes_the_period() {
        let fixed = PollPace::fixed(1_000);
        assert!(fixed.is_fixed());
        let mut st = PaceState::default();
        for _ in 0..1_000 {
            assert_eq!(st.after(&fixed, false), None);
        }
        assert!(!st.is_slow());
        assert_eq!(st.wake(&fixed), None);
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
