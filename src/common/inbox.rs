//! A queue any thread adds to and one poller drains on every loop.
//!
//! crossbeam's `SegQueue::pop` on an empty queue issues a full memory fence before it
//! reads the tail, and a poller that finds its queue empty on nearly every loop pays that
//! fence each time. [`Inbox::pop`] first compares head and tail with two plain loads and
//! touches the queue only when they differ. An item pushed concurrently may be missed by
//! one call and is taken by the next, which for a poller is the next loop.

use crossbeam_queue::SegQueue;

/// A multi-producer queue with one draining poller.
pub struct Inbox<T>(SegQueue<T>);

impl<T> Default for Inbox<T> {
    fn default() -> Self {
        Inbox(SegQueue::new())
    }
}

impl<T> Inbox<T> {
    pub fn new() -> Inbox<T> {
        Inbox::default()
    }

    /// Adds `item` (any thread).
    pub fn push(&self, item: T) {
        self.0.push(item);
    }

    /// The oldest item, if any was visibly added.
    #[inline]
    pub fn pop(&self) -> Option<T> {
        if self.0.is_empty() {
            return None;
        }
        self.0.pop()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<T> std::fmt::Debug for Inbox<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Inbox({} queued)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn items_come_out_in_order_and_then_none() {
        let q = Inbox::new();
        assert!(q.pop().is_none());
        q.push(1);
        q.push(2);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), None);
        assert!(q.is_empty());
    }

    #[test]
    fn every_item_of_every_producer_is_taken_once() {
        const PER: u64 = 20_000;
        let q = Arc::new(Inbox::new());
        let producers: Vec<_> = (0..3u64)
            .map(|p| {
                let q = q.clone();
                std::thread::spawn(move || (0..PER).for_each(|i| q.push(p * PER + i)))
            })
            .collect();
        let mut seen = vec![false; 3 * PER as usize];
        let mut last = [None::<u64>; 3];
        let mut taken = 0;
        while taken < seen.len() {
            match q.pop() {
                Some(v) => {
                    assert!(!seen[v as usize], "{v} taken twice");
                    seen[v as usize] = true;
                    // One producer's items keep their order.
                    let p = (v / PER) as usize;
                    assert!(last[p].is_none_or(|l| l < v), "{v} after {:?}", last[p]);
                    last[p] = Some(v);
                    taken += 1;
                }
                None => std::hint::spin_loop(),
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert!(q.pop().is_none());
    }
}
