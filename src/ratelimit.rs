//! A log rate limiter for messages a peer can provoke at will (refused, timed-out or
//! malformed connections, protocol violations): at most `burst` messages per window, then
//! one line saying how many were suppressed (the kernel's `printk_ratelimited`, with the
//! count it leaves out).
//!
//! The clock is the caller's: every call takes "now" in nanoseconds of any monotonic
//! clock (an engine context's `now`, or an `Instant` measured from a fixed start), so
//! tests step it by hand. A window opens with the first message after the previous one
//! closed. The count of a closed window is logged by the next call of [`RateLimit::allow`]
//! or [`RateLimit::flush`], so an owner that polls anyway calls `flush` there and the
//! summary appears even when the flood stops. Safe to share between threads: the state
//! sits behind a mutex, uncontended in practice (these are not per-IO paths).
//!
//! The budget counts lines printed: `log_limited!` asks the limiter only for a line the
//! subscriber will print, so lines of a level that is off (a peer's connected paths at
//! `info`, say) never use up the budget of the warnings about refusals.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::sync::lock;

/// Logs `$($arg)+` through `tracing` at `$level` (`ERROR` .. `TRACE`) if the subscriber
/// prints that level here and the [`RateLimit`] `$limit` lets a line through at `$now`;
/// a line that would not be printed is not counted (see the module docs).
macro_rules! log_limited {
    ($limit:expr, $now:expr, $level:ident, $($arg:tt)+) => {
        if tracing::enabled!(tracing::Level::$level) && $limit.allow($now) {
            tracing::event!(tracing::Level::$level, $($arg)+);
        }
    };
}
pub(crate) use log_limited;

/// Nanoseconds since this process first asked: a clock for a limiter whose callers have
/// no engine context at hand.
pub fn process_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(std::time::Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A rate limiter for one kind of log message (see the module docs).
#[derive(Debug)]
pub struct RateLimit {
    /// Names the source in the summary line ("tcp fabric listener 127.0.0.1:1234").
    what: String,
    burst: u32,
    window_ns: u64,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Whether a window is open, since when, and how many messages it let through.
    open: bool,
    start: u64,
    used: u32,
    /// Messages refused in the open window, reported once it has closed.
    suppressed: u64,
}

impl RateLimit {
    /// At most `burst` messages per `window` (at least one message, at least 1 ns).
    pub fn new(what: impl Into<String>, burst: u32, window: Duration) -> RateLimit {
        RateLimit {
            what: what.into(),
            burst: burst.max(1),
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX).max(1),
            state: Mutex::new(State::default()),
        }
    }

    /// The default for messages about peers: 5 per second.
    pub fn per_second(what: impl Into<String>) -> RateLimit {
        RateLimit::new(what, 5, Duration::from_secs(1))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Closes the open window if it has ended by `now`; returns its suppressed count.
    fn roll(&self, s: &mut State, now: u64) -> u64 {
        if s.open && now.saturating_sub(s.start) >= self.window_ns {
            s.open = false;
            return std::mem::take(&mut s.suppressed);
        }
        0
    }

    /// Whether a message may be logged at `now`, and how many messages of windows that
    /// have closed were suppressed (to be reported before it). The pure part of
    /// [`RateLimit::allow`], for tests and callers with their own output.
    pub fn check(&self, now: u64) -> (bool, u64) {
        let mut s = self.lock();
        let closed = self.roll(&mut s, now);
        if !s.open {
            s.open = true;
            s.start = now;
            s.used = 0;
        }
        if s.used < self.burst {
            s.used += 1;
            (true, closed)
        } else {
            s.suppressed += 1;
            (false, closed)
        }
    }

    /// How many messages were suppressed in a window that has closed by `now` (0 when
    /// none, or while the window is still open); the count is reported only once.
    pub fn take_suppressed(&self, now: u64) -> u64 {
        let mut s = self.lock();
        self.roll(&mut s, now)
    }

    /// Whether a message may be logged at `now`; first logs the summary of a closed
    /// window that suppressed messages.
    pub fn allow(&self, now: u64) -> bool {
        let (ok, closed) = self.check(now);
        self.summary(closed);
        ok
    }

    /// Logs the summary of a window that has closed by `now`, if it suppressed anything.
    pub fn flush(&self, now: u64) {
        let closed = self.take_suppressed(now);
        self.summary(closed);
    }

    fn summary(&self, n: u64) {
        if n > 0 {
            tracing::warn!("{}: {n} similar messages suppressed", self.what);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn burst_then_silence_then_one_count() {
        let r = RateLimit::new("t", 3, Duration::from_secs(1));
        let t0 = 7_000 * MS;
        for i in 0..3 {
            assert_eq!(r.check(t0 + i * MS), (true, 0), "message {i}");
        }
        for i in 3..10 {
            assert_eq!(r.check(t0 + i * MS), (false, 0), "message {i}");
        }
        // Nothing to report while the window is open.
        assert_eq!(r.take_suppressed(t0 + 999 * MS), 0);
        // Once it closed, the 7 suppressed messages are reported exactly once.
        assert_eq!(r.take_suppressed(t0 + 1000 * MS), 7);
        assert_eq!(r.take_suppressed(t0 + 5000 * MS), 0);
        // A new window lets a new burst through.
        assert_eq!(r.check(t0 + 5000 * MS), (true, 0));
    }

    #[test]
    fn the_next_message_carries_the_count_of_the_closed_window() {
        let r = RateLimit::new("t", 1, Duration::from_millis(100));
        assert_eq!(r.check(0), (true, 0));
        assert_eq!(r.check(10 * MS), (false, 0));
        assert_eq!(r.check(20 * MS), (false, 0));
        assert_eq!(r.check(150 * MS), (true, 2));
        assert_eq!(r.check(160 * MS), (false, 0));
        assert_eq!(r.check(250 * MS), (true, 1));
    }

    #[test]
    fn a_sustained_flood_logs_at_most_burst_plus_one_line_per_window() {
        let r = RateLimit::per_second("t");
        let mut lines = 0u64;
        let mut reported = 0u64;
        let total = 10_000u64;
        // 10 000 messages over 10 s of clock, 1 ms apart.
        for i in 0..total {
            let (ok, closed) = r.check(i * MS);
            lines += u64::from(ok) + u64::from(closed > 0);
            reported += closed;
        }
        let closed = r.take_suppressed(20_000 * MS);
        lines += u64::from(closed > 0);
        reported += closed;
        assert!(lines <= 10 * 6, "{lines} lines for 10 windows");
        // Every message is accounted for: logged or counted in a summary.
        assert_eq!(reported + 10 * 5, total);
    }

    #[test]
    fn a_clock_going_backwards_stays_in_the_window() {
        let r = RateLimit::new("t", 1, Duration::from_secs(1));
        assert_eq!(r.check(5_000 * MS), (true, 0));
        assert_eq!(r.check(4_000 * MS), (false, 0));
        assert_eq!(r.take_suppressed(4_500 * MS), 0);
        assert_eq!(r.take_suppressed(6_000 * MS), 1);
    }
}
