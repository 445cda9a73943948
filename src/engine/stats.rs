//! Per-reactor counters: loops, busy and idle loops, busy and idle time.
//!
//! Corresponds to SPDK's reactor `busy_tsc`/`idle_tsc` and per-poller run counts
//! (`framework_get_reactors`). Each counter has one writer (its reactor), which updates
//! it with a plain load and store, no read-modify-write; any thread may read a
//! [`StatsSnapshot`].

use std::sync::atomic::{AtomicU64, Ordering};

/// The live counters of one reactor (inside its mailbox block).
#[derive(Debug, Default)]
pub(crate) struct ReactorStats {
    loops: AtomicU64,
    busy_loops: AtomicU64,
    idle_loops: AtomicU64,
    busy_ns: AtomicU64,
    idle_ns: AtomicU64,
    messages: AtomicU64,
    timers_fired: AtomicU64,
}

/// Adds to a counter that only the calling thread writes.
fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl ReactorStats {
    /// Records one loop and how it went.
    pub(crate) fn record_loop(&self, busy: bool) {
        bump(&self.loops, 1);
        if busy {
            bump(&self.busy_loops, 1);
        } else {
            bump(&self.idle_loops, 1);
        }
    }

    /// Charges `ns` of clock time (a loop and any idle sleep after it) to busy or idle.
    pub(crate) fn record_time(&self, busy: bool, ns: u64) {
        if busy {
            bump(&self.busy_ns, ns);
        } else {
            bump(&self.idle_ns, ns);
        }
    }

    pub(crate) fn add_messages(&self, n: u64) {
        if n > 0 {
            bump(&self.messages, n);
        }
    }

    pub(crate) fn add_timers(&self, n: u64) {
        if n > 0 {
            bump(&self.timers_fired, n);
        }
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            loops: self.loops.load(Ordering::Relaxed),
            busy_loops: self.busy_loops.load(Ordering::Relaxed),
            idle_loops: self.idle_loops.load(Ordering::Relaxed),
            busy_ns: self.busy_ns.load(Ordering::Relaxed),
            idle_ns: self.idle_ns.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            timers_fired: self.timers_fired.load(Ordering::Relaxed),
        }
    }
}

/// A reading of one reactor's counters. Fields are read one by one, so a snapshot taken
/// while the reactor runs may be off by one loop between fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Calls of `run_once`.
    pub loops: u64,
    /// Loops that did some work.
    pub busy_loops: u64,
    /// Loops that found nothing to do.
    pub idle_loops: u64,
    /// Clock time spent in loops that were busy ("busy ticks", in ns).
    pub busy_ns: u64,
    /// Clock time spent in idle loops and idle sleeps ("idle ticks", in ns).
    pub idle_ns: u64,
    /// Messages run.
    pub messages: u64,
    /// Timer expirations run.
    pub timers_fired: u64,
}
