//! Clocks: where a reactor's "now" comes from.
//!
//! SPDK pollers read `spdk_get_ticks()` (the TSC) and convert with `spdk_get_ticks_hz()`;
//! here every driver hands its pollers nanoseconds from a [`Clock`]. Production reactors
//! use [`MonotonicClock`]; deterministic tests use a [`VirtualClock`] that only moves when
//! the test advances it, so heartbeats and reconnect delays are testable without sleeping.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A monotonic source of nanoseconds. Never goes backwards; the origin is arbitrary but
/// shared by every reactor driven by the same clock.
pub trait Clock: Send + Sync + fmt::Debug {
    /// Nanoseconds since the clock's origin.
    fn now_ns(&self) -> u64;
}

/// The real monotonic clock (`CLOCK_MONOTONIC`, read with `clock_gettime`), counting from the
/// moment it was created. Clones share the origin.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    /// `CLOCK_MONOTONIC` at creation, in nanoseconds.
    origin: u64,
}

/// `CLOCK_MONOTONIC` (what `std::time::Instant` reads on Linux) in nanoseconds, read directly:
/// this is read several times per loop, and `Instant::elapsed` adds checked
/// `timespec` arithmetic and a `Duration` round trip to the vDSO call.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on
    // Linux, so the call cannot fail (it would leave zeros, read as time 0).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // u64 nanoseconds last 584 years; saturate rather than wrap.
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

impl MonotonicClock {
    /// A clock whose zero is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin: monotonic_ns(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        monotonic_ns().saturating_sub(self.origin)
    }
}

#[derive(Debug, Clone, Default)]
pub struct VirtualClock {
    now: Arc<AtomicU64>,
}

impl VirtualClock {
    /// A virtual clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `ns` nanoseconds (saturating).
    pub fn advance(&self, ns: u64) {
        let now = self.now.load(Ordering::Acquire);
        self.now.store(now.saturating_add(ns), Ordering::Release);
    }

    /// Moves time to `ns`. Moving backwards is refused: the clock stays where it is and
    /// `false` is returned, because pollers rely on monotonic time.
    pub fn set(&self, ns: u64) -> bool {
        let now = self.now.load(Ordering::Acquire);
        if ns < now {
            return false;
        }
        self.now.store(ns, Ordering::Release);
        true
    }
}

impl Clock for VirtualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_forward_and_is_shared() {
        let a = VirtualClock::new();
        let b = a.clone();
        assert_eq!(a.now_ns(), 0);
        a.advance(15);
        assert_eq!(b.now_ns(), 15);
        assert!(b.set(40));
        assert!(!a.set(39));
        assert_eq!(a.now_ns(), 40);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let c = MonotonicClock::new();
        let t0 = c.now_ns();
        let t1 = c.now_ns();
        assert!(t1 >= t0);
    }
}
