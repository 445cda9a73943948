//! When a dead path tries again: the kernel's `rtrs_clt_reconnect_work`,
//! `max_reconnect_attempts` and the reconnect delay (docs/PROTOCOL.md §6.4), as pure logic.
//!
//! Two things are done better than the kernel:
//! - the jitter is real: a uniformly random 0..`jitter` (hundreds of milliseconds by
//!   default) is added to every delay, so many clients that lost the same target do
//!   not come back in step (the kernel adds 0–7 ms);
//! - a queue depth changed by the server across a reconnect is re-negotiated (the
//!   connect sequence takes it once no other path uses the old one, and each core
//!   re-sizes its permits and buffers) instead of disabling reconnects for good.
//!
//! `max_attempts` keeps the kernel's meaning: −1 retries for ever, 0 never reconnects
//! automatically, N allows N attempts in a row (a success starts the count again).

use std::time::Duration;

/// Reconnect settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Base wait before an attempt (RNBD passes 30 s to the kernel).
    pub delay: Duration,
    /// Upper bound of the random extra wait added to every delay.
    pub jitter: Duration,
    /// −1 for ever, 0 never, N attempts.
    pub max_attempts: i32,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            delay: Duration::from_secs(30),
            jitter: Duration::from_millis(500),
            max_attempts: -1,
        }
    }
}

/// What to do after a path went down or an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReconnectStep {
    /// Try again after this long.
    After(Duration),
    /// No attempts left: close the path.
    GiveUp,
}

/// Attempt bookkeeping of one path.
#[derive(Debug, Clone)]
pub struct Reconnect {
    policy: ReconnectPolicy,
    attempts: u32,
}

impl Reconnect {
    pub fn new(policy: ReconnectPolicy) -> Reconnect {
        Reconnect {
            policy,
            attempts: 0,
        }
    }

    /// Changes the limit at runtime (the kernel's sysfs `max_reconnect_attempts`).
    pub fn set_max_attempts(&mut self, max: i32) {
        self.policy.max_attempts = max;
    }

    /// The path went down (or an attempt failed): schedule the next attempt, counting
    /// it, or give up. `random` is a uniformly random 64-bit value for the jitter.
    pub fn next(&mut self, random: u64) -> ReconnectStep {
        let max = self.policy.max_attempts;
        if max == 0 || (max > 0 && self.attempts >= max as u32) {
            return ReconnectStep::GiveUp;
        }
        self.attempts = self.attempts.saturating_add(1);
        ReconnectStep::After(self.policy.delay + jitter(self.policy.jitter, random))
    }

    /// Changes the base wait at runtime; an attempt already scheduled keeps its time.
    pub fn set_delay(&mut self, delay: Duration) {
        self.policy.delay = delay;
    }

    /// A connect succeeded: the count starts again.
    pub fn on_success(&mut self) {
        self.attempts = 0;
    }

    /// A manual reconnect: the count starts again (the kernel's sysfs `reconnect`).
    pub fn reset(&mut self) {
        self.attempts = 0;
    }
}

/// Uniform `0..max` from a random value (nanosecond resolution).
pub fn jitter(max: Duration, random: u64) -> Duration {
    let ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    if ns == 0 {
        Duration::ZERO
    } else {
        Duration::from_nanos(random % ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_attempts_and_jitter() {
        let pol = ReconnectPolicy {
            delay: Duration::from_millis(100),
            jitter: Duration::from_millis(300),
            max_attempts: 2,
        };
        let mut r = Reconnect::new(pol);
        for rnd in [0u64, 299_999_999] {
            match r.next(rnd) {
                ReconnectStep::After(d) => {
                    assert!(
                        d >= Duration::from_millis(100) && d < Duration::from_millis(400),
                        "{d:?}"
                    );
                }
                ReconnectStep::GiveUp => panic!("attempts left"),
            }
        }
        assert_eq!(r.next(5), ReconnectStep::GiveUp);
        r.on_success();
        assert!(matches!(r.next(5), ReconnectStep::After(_)));

        let mut never = Reconnect::new(ReconnectPolicy {
            max_attempts: 0,
            ..pol
        });
        assert_eq!(never.next(1), ReconnectStep::GiveUp);
        let mut forever = Reconnect::new(ReconnectPolicy {
            max_attempts: -1,
            ..pol
        });
        for i in 0..10_000u64 {
            assert!(matches!(forever.next(i), ReconnectStep::After(_)));
        }
        assert_eq!(jitter(Duration::ZERO, 12345), Duration::ZERO);
        assert_eq!(
            jitter(Duration::from_nanos(10), 12345),
            Duration::from_nanos(5)
        );
        assert_eq!(
            ReconnectPolicy::default().jitter,
            Duration::from_millis(500)
        );
    }

    #[test]
    fn jitter_is_really_random() {
        // Real randomness: 64 draws over 500 ms land on many distinct values and spread far
        // beyond the kernel's 0..7 ms.
        let draws: Vec<Duration> = (0..64)
            .map(|_| jitter(Duration::from_millis(500), crate::common::random_u64()))
            .collect();
        let mut uniq = draws.clone();
        uniq.sort();
        uniq.dedup();
        assert!(uniq.len() > 32, "{draws:?}");
        assert!(
            draws.iter().any(|d| *d > Duration::from_millis(50)),
            "{draws:?}"
        );
    }
}
