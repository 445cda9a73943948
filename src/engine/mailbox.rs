//! Cross-reactor messages: [`Msg`], the per-reactor mailbox and its backpressure.
//!
//! Corresponds to SPDK's `spdk_thread_send_msg` (a function pointer plus an argument,
//! queued on the target thread's lock-free ring) and to the kernel's habit of handing work
//! to another CPU through a queue. Each reactor has one bounded [`ArrayQueue`]; any thread
//! may push, only the owning reactor pops. The mailbox block also carries the reactor's
//! stop flag, its "sleeping" flag for the adaptive idle strategy, and its counters:
//! it is the only structure reactors share.
//!
//! **Backpressure.** A full mailbox refuses the message and hands it back in
//! [`SendError::Full`]; nothing is dropped silently and nobody blocks. The sender keeps
//! the message and retries on a later poll (as SPDK callers retry on `-ENOMEM`).
//!
//! **Cost.** [`Msg::call`] (a plain function and a `u64`) never allocates. [`Msg::new`]
//! boxes its closure: one allocation per message unless the closure captures nothing
//! (a zero-sized box does not allocate). Use `call` on data paths, closures for control.

use std::fmt;
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::poller::{Msg, SendError};
use super::stats::ReactorStats;

/// One reactor's shared block: its queue, control flags and counters.
pub(crate) struct Mailbox {
    queue: ArrayQueue<Msg>,
    stop: AtomicBool,
    sleeping: AtomicBool,
    thread: OnceLock<Thread>,
    pub(crate) stats: ReactorStats,
}

/// The mailboxes of a set of reactors, indexed by reactor. Shared (`Arc`) by the
/// reactors and by outside senders such as the thread that started the engine.
pub struct Mailboxes {
    boxes: Box<[Mailbox]>,
    capacity: usize,
    /// Reactors that finished their own drain during shutdown.
    finished: AtomicUsize,
}

impl Mailboxes {
    /// Mailboxes for `cores` reactors, each holding up to `capacity` messages
    /// (`capacity` is raised to at least 1).
    pub fn new(cores: usize, capacity: usize) -> Arc<Mailboxes> {
        let capacity = capacity.max(1);
        let boxes = (0..cores)
            .map(|_| Mailbox {
                queue: ArrayQueue::new(capacity),
                stop: AtomicBool::new(false),
                sleeping: AtomicBool::new(false),
                thread: OnceLock::new(),
                stats: ReactorStats::default(),
            })
            .collect();
        Arc::new(Mailboxes {
            boxes,
            capacity,
            finished: AtomicUsize::new(0),
        })
    }

    /// Number of reactors.
    pub fn cores(&self) -> usize {
        self.boxes.len()
    }

    /// Capacity of each mailbox.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Posts `msg` to reactor `core` from any thread; wakes it if it sleeps.
    ///
    /// # Errors
    /// [`SendError::Full`] when the mailbox is full (the message comes back: retry later),
    /// [`SendError::NoSuchCore`] for an index out of range.
    pub fn send(&self, core: usize, msg: Msg) -> Result<(), SendError> {
        let Some(mb) = self.boxes.get(core) else {
            return Err(SendError::NoSuchCore {
                core,
                cores: self.cores(),
                msg,
            });
        };
        if let Err(msg) = mb.queue.push(msg) {
            return Err(SendError::Full {
                core,
                capacity: self.capacity,
                msg,
            });
        }
        // Pairs with the fence in `park`: either the sleeper sees our message, or we see
        // its flag and wake it.
        fence(Ordering::SeqCst);
        if mb.sleeping.load(Ordering::Relaxed) {
            if let Some(t) = mb.thread.get() {
                t.unpark();
            }
        }
        Ok(())
    }

    /// Messages waiting for reactor `core` (a racy snapshot; 0 for a bad index).
    pub fn pending(&self, core: usize) -> usize {
        self.boxes.get(core).map_or(0, |mb| mb.queue.len())
    }

    pub(crate) fn mailbox(&self, core: usize) -> &Mailbox {
        &self.boxes[core]
    }

    pub(crate) fn pop(&self, core: usize) -> Option<Msg> {
        self.boxes[core].queue.pop()
    }

    /// Asks every reactor to stop, waking sleepers.
    pub(crate) fn stop_all(&self) {
        for mb in self.boxes.iter() {
            mb.stop.store(true, Ordering::SeqCst);
            if let Some(t) = mb.thread.get() {
                t.unpark();
            }
        }
    }

    pub(crate) fn stop_requested(&self, core: usize) -> bool {
        self.boxes[core].stop.load(Ordering::Relaxed)
    }

    pub(crate) fn mark_finished(&self) {
        self.finished.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn all_finished(&self) -> bool {
        self.finished.load(Ordering::SeqCst) >= self.cores()
    }

    /// Records the calling thread as reactor `core`'s, so senders can wake it.
    pub(crate) fn bind_thread(&self, core: usize) {
        let _ = self.boxes[core].thread.set(std::thread::current());
    }

    /// Sleeps the calling reactor thread up to `timeout`, unless a message is already
    /// there; a sender's or [`stop_all`](Self::stop_all)'s `unpark` ends the sleep early
    /// (an `unpark` that came first makes the park return at once).
    pub(crate) fn park(&self, core: usize, timeout: Duration) {
        let mb = &self.boxes[core];
        mb.sleeping.store(true, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        if mb.queue.is_empty() {
            std::thread::park_timeout(timeout);
        }
        mb.sleeping.store(false, Ordering::Relaxed);
    }
}

impl fmt::Debug for Mailboxes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mailboxes")
            .field("cores", &self.cores())
            .field("capacity", &self.capacity)
            .finish()
    }
}
