//! A bounded single-producer single-consumer ring: one direction of a loopback link.
//!
//! Each direction of a connection has exactly one writer (the sending end) and one
//! reader (the receiving end), so a general multi-producer queue (a compare-and-swap per
//! push and pop, and a move of the whole element in and out) pays for sharing that never
//! happens. Here the two roles are separate handles, [`Producer`] and [`Consumer`],
//! neither of which can be cloned, so the single-writer and single-reader rule is the
//! type system's, not the caller's promise. The slots are always initialised: the
//! producer fills a slot in place and publishes it with one release store, the consumer
//! works on it in place (an operation waiting for a receive just stays at the front) and
//! hands it back with one release store. No read-modify-write, no allocation after
//! construction.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// An index on its own cache line, so the two ends do not write the same line.
#[repr(align(64))]
struct Padded(AtomicUsize);

struct Shared<T> {
    slots: Box<[UnsafeCell<T>]>,
    mask: usize,
    /// Slots `[head, tail)` (counted without wrapping at the length; the mask maps them
    /// to slots) are filled and belong to the consumer; the others to the producer.
    head: Padded,
    tail: Padded,
}

// SAFETY: a slot is reached only through the one `Producer` (outside `[head, tail)`) or
// the one `Consumer` (inside), and ownership moves between them with release stores and
// acquire loads of `tail` and `head`; so a `T` is used by one thread at a time, which
// `T: Send` allows.
unsafe impl<T: Send> Sync for Shared<T> {}
// SAFETY: as above; the slots are plain owned `T`s.
unsafe impl<T: Send> Send for Shared<T> {}

/// The writing end of a ring (see the module doc).
pub struct Producer<T> {
    ring: Arc<Shared<T>>,
    /// Our own `tail`, and the consumer's `head` as last read (a lower bound).
    tail: usize,
    head: usize,
}

/// The reading end of a ring (see the module doc).
pub struct Consumer<T> {
    ring: Arc<Shared<T>>,
    /// Our own `head`, and the producer's `tail` as last read (a lower bound).
    head: usize,
    tail: usize,
}

/// A ring of at least `cap` slots (rounded up to a power of two; at least one), each
/// starting as `T::default()`.
pub fn ring<T: Default>(cap: usize) -> (Producer<T>, Consumer<T>) {
    let len = cap.max(1).next_power_of_two();
    let shared = Arc::new(Shared {
        slots: (0..len).map(|_| UnsafeCell::new(T::default())).collect(),
        mask: len - 1,
        head: Padded(AtomicUsize::new(0)),
        tail: Padded(AtomicUsize::new(0)),
    });
    (
        Producer {
            ring: shared.clone(),
            tail: 0,
            head: 0,
        },
        Consumer {
            ring: shared,
            head: 0,
            tail: 0,
        },
    )
}

impl<T> Producer<T> {
    /// Fills the next free slot in place with `fill` and publishes it if `fill` returns
    /// true. Returns whether a slot was published (false: the ring is full, or `fill`
    /// declined).
    pub fn push_with(&mut self, fill: impl FnOnce(&mut T) -> bool) -> bool {
        let r = &*self.ring;
        if self.tail.wrapping_sub(self.head) > r.mask {
            self.head = r.head.0.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head) > r.mask {
                return false;
            }
        }
        // SAFETY: the slot at `tail` is outside `[head, tail)` (checked above against a
        // `head` read with acquire, so the consumer is done with it), hence ours alone
        // until the release store below hands it over; `&mut self` keeps this borrow
        // the only one on the producer side.
        let slot = unsafe { &mut *r.slots[self.tail & r.mask].get() };
        if !fill(slot) {
            return false;
        }
        self.tail = self.tail.wrapping_add(1);
        r.tail.0.store(self.tail, Ordering::Release);
        true
    }
}

impl<T> Producer<T> {
    /// Whether the consumer has handed back every slot published so far (reads its
    /// position with acquire if needed, so what it did before handing a slot back
    /// happens before what the caller does next).
    pub fn is_drained(&mut self) -> bool {
        if self.head != self.tail {
            self.head = self.ring.head.0.load(Ordering::Acquire);
        }
        self.head == self.tail
    }

    /// Whether a slot is free for [`Producer::push_with`].
    pub fn has_room(&mut self) -> bool {
        let r = &*self.ring;
        if self.tail.wrapping_sub(self.head) > r.mask {
            self.head = r.head.0.load(Ordering::Acquire);
        }
        self.tail.wrapping_sub(self.head) <= r.mask
    }
}

impl<T> Consumer<T> {
    /// Whether a filled slot waits (reads the producer's position if needed).
    pub fn is_empty(&mut self) -> bool {
        if self.head == self.tail {
            self.tail = self.ring.tail.0.load(Ordering::Acquire);
        }
        self.head == self.tail
    }

    /// The oldest filled slot, to work on in place; it stays filled until
    /// [`Consumer::pop`].
    pub fn front(&mut self) -> Option<&mut T> {
        if self.is_empty() {
            return None;
        }
        let r = &*self.ring;
        // SAFETY: `head` is inside `[head, tail)` with `tail` read with acquire, so the
        // producer published the slot and will not touch it until the release store of
        // a later `pop`; the returned borrow holds `&mut self`, so no `pop` (or second
        // `front`) happens while it lives.
        Some(unsafe { &mut *r.slots[self.head & r.mask].get() })
    }

    /// Hands the oldest filled slot back to the producer (the caller has emptied it as
    /// it needs; the producer overwrites it). Does nothing on an empty ring.
    pub fn pop(&mut self) {
        if self.is_empty() {
            return;
        }
        self.head = self.head.wrapping_add(1);
        self.ring.head.0.store(self.head, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_bounded_and_in_place() {
        let (mut tx, mut rx) = ring::<u32>(3);
        assert!(rx.front().is_none());
        for v in 1..=4 {
            assert!(tx.push_with(|s| {
                *s = v;
                true
            }));
        }
        assert!(!tx.push_with(|_| true), "four slots, all filled");
        assert!(!tx.push_with(|_| false));
        assert_eq!(rx.front().copied(), Some(1));
        assert_eq!(rx.front().copied(), Some(1), "front stays until popped");
        rx.pop();
        assert!(tx.push_with(|s| {
            *s = 5;
            true
        }));
        assert!(
            !tx.push_with(|_| false),
            "a declined fill publishes nothing"
        );
        let mut seen = Vec::new();
        while let Some(v) = rx.front() {
            seen.push(*v);
            rx.pop();
        }
        assert_eq!(seen, [2, 3, 4, 5]);
        rx.pop();
        assert!(rx.is_empty());
    }

    #[test]
    fn producer_sees_room_and_drain() {
        let (mut tx, mut rx) = ring::<u32>(2);
        assert!(tx.is_drained() && tx.has_room());
        assert!(tx.push_with(|_| true));
        assert!(!tx.is_drained(), "one slot out");
        assert!(tx.push_with(|_| true));
        assert!(!tx.has_room(), "both slots out");
        rx.pop();
        assert!(tx.has_room() && !tx.is_drained(), "one handed back");
        rx.pop();
        assert!(tx.is_drained());
    }

    #[test]
    fn across_threads_in_order() {
        const N: u64 = 100_000;
        let (mut tx, mut rx) = ring::<u64>(8);
        let t = std::thread::spawn(move || {
            let mut next = 1;
            while next <= N {
                if tx.push_with(|s| {
                    *s = next;
                    true
                }) {
                    next += 1;
                }
            }
        });
        let mut want = 1;
        while want <= N {
            if let Some(v) = rx.front() {
                assert_eq!(*v, want);
                *v = 0;
                rx.pop();
                want += 1;
            }
        }
        t.join().expect("producer thread");
    }
}
