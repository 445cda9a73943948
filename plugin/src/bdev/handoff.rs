//! A queue that any thread adds to and one owner drains in its poll: a mutex for the
//! adders, and a flag in front of it so that the owner's poll takes no lock while the
//! queue is empty, which is every poll but the rare one with something handed over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

pub struct Handoff<T> {
    items: Mutex<Vec<T>>,
    /// Whether `items` may hold any: set under the lock by [`push`](Self::push), cleared
    /// under it by [`take_into`](Self::take_into), read without it.
    any: AtomicBool,
}

impl<T> Default for Handoff<T> {
    fn default() -> Self {
        Handoff {
            items: Mutex::new(Vec::new()),
            any: AtomicBool::new(false),
        }
    }
}

impl<T> Handoff<T> {
    /// Adds `item` (any thread).
    pub fn push(&self, item: T) {
        let mut q = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        q.push(item);
        self.any.store(true, Ordering::Release);
    }

    /// Moves every item, in the order added, to the end of `into` (the owner). One added
    /// while this runs is taken now or by the next call: its push sets the flag again
    /// after this call cleared it.
    pub fn take_into(&self, into: &mut impl Extend<T>) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let mut q = self.items.lock().unwrap_or_else(PoisonError::into_inner);
        into.extend(q.drain(..));
        self.any.store(false, Ordering::Release);
    }
}
