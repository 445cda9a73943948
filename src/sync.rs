//! The shared-memory habits every layer uses, written once: locks that ignore poisoning
//! ([`lock`], [`read`], [`write`](fn@write)), a counter with one writer ([`SoloCounter`]),
//! and a value published as immutable versions that IO cores read without a lock
//! ([`Published`]); and a barrier pair for a handshake with one hot side
//! ([`membarrier`]).
//!
//! How they fit the per-core rule (docs/ARCHITECTURE.md, "Who writes what per IO"): locks
//! are for control work only; a word the data path writes per IO has one writer, its
//! core, and is a `SoloCounter` or plain core-owned memory; what other cores read of it
//! is a snapshot.

pub mod membarrier;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, ignoring poisoning: a thread that panicked while holding it must not wedge
/// every other (the state it guards is kept consistent between statements, and a panic
/// is reported where it happened).
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads `l`, ignoring poisoning, as [`lock`] does.
pub fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// Writes `l`, ignoring poisoning, as [`lock`] does.
pub fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// A counter written by one thread only (its core) and read by any: a plain load and a
/// store, no read-modify-write and so no locked instruction. The store is a Release and
/// [`get`](Self::get) an Acquire, so a reader that sees a count also sees what the writer
/// did before it. Nothing else writes it: a statistics reset keeps a baseline to count
/// from instead (`client::stats`).
#[derive(Debug, Default)]
pub struct SoloCounter(AtomicU64);

impl SoloCounter {
    pub const fn new(v: u64) -> SoloCounter {
        SoloCounter(AtomicU64::new(v))
    }

    /// Adds `n` (wrapping); only the counter's writer calls it.
    #[inline]
    pub fn add(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.wrapping_add(n), Ordering::Release);
    }

    /// Subtracts `n`, stopping at 0; only the counter's writer calls it.
    #[inline]
    pub fn sub(&self, n: u64) {
        let v = self.0.load(Ordering::Relaxed);
        self.0.store(v.saturating_sub(n), Ordering::Release);
    }

    /// Raises the value to `n` if it is below; only the counter's writer calls it.
    #[inline]
    pub fn max(&self, n: u64) {
        if n > self.0.load(Ordering::Relaxed) {
            self.0.store(n, Ordering::Release);
        }
    }

    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

/// A value published as immutable versions (a device table): control work, one change
/// at a time, [`publish`](Self::publish)es the next version; a reader keeps the `Arc` it
/// last [`load`](Self::load)ed and, per IO, compares that value's version with
/// [`version`](Self::version) (one Acquire load), loading again (the lock) only when it
/// is stale. The value carries its own version number, given to it by `publish`.
#[derive(Debug)]
pub struct Published<T> {
    current: Mutex<Arc<T>>,
    version: AtomicU64,
}

impl<T: Default> Default for Published<T> {
    fn default() -> Published<T> {
        Published::new(T::default())
    }
}

impl<T> Published<T> {
    /// `first` as version 0.
    pub fn new(first: T) -> Published<T> {
        Published {
            current: Mutex::new(Arc::new(first)),
            version: AtomicU64::new(0),
        }
    }

    /// The version published last (one Acquire load: the per-IO check).
    #[inline]
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The value published last.
    pub fn load(&self) -> Arc<T> {
        Arc::clone(&lock(&self.current))
    }

    /// Publishes `make(next version)` as the next version.
    pub fn publish(&self, make: impl FnOnce(u64) -> T) {
        let mut cur = lock(&self.current);
        let version = self.version.load(Ordering::Relaxed) + 1;
        *cur = Arc::new(make(version));
        // Stored under the lock after the value: a reader that sees this version and
        // takes the lock finds this value or a newer one.
        self.version.store(version, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_solo_counter_counts_and_stops_at_zero() {
        let c = SoloCounter::default();
        c.add(3);
        c.sub(1);
        assert_eq!(c.get(), 2);
        c.sub(5);
        assert_eq!(c.get(), 0);
        c.max(7);
        c.max(4);
        assert_eq!(c.get(), 7);
    }

    #[test]
    fn a_reader_sees_a_new_version_and_its_value() {
        let p = Published::new((0u64, "first"));
        assert_eq!(p.version(), 0);
        let mine = p.load();
        p.publish(|v| (v, "second"));
        assert_ne!(mine.0, p.version(), "the reader's copy is stale");
        let now = p.load();
        assert_eq!(*now, (1, "second"));
        assert_eq!(now.0, p.version());
    }

    #[test]
    fn a_poisoned_lock_is_still_taken() {
        let m = Arc::new(Mutex::new(5));
        let m2 = Arc::clone(&m);
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("poison it");
        })
        .join();
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 5);
    }
}
