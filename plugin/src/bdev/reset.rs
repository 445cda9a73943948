//! Resets of rtrs bdevs. SPDK freezes every channel of a bdev before it submits a reset,
//! so nothing new arrives while it waits; the reset completes once every request of the
//! disk came back (its channels' counters, [`Disk::outstanding`]), or fails with
//! −ETIMEDOUT after `io_timeout_sec`. A reset waits in the poll group of the thread it was
//! submitted on, looked at by the group's own poller (docs/ARCHITECTURE.md, "The SPDK
//! bdev: poll groups"): no timer of its own.

use std::sync::Arc;

use rtrs_spdk::spdk::BdevIo;
use rtrs_spdk::Errno;

use super::sess::disk::Disk;

/// A reset submitted on one of `disk`'s channels.
pub struct Reset {
    io: BdevIo,
    disk: Arc<Disk>,
    /// When it fails if requests are still out (ns of the thread's loop clock).
    deadline: u64,
}

impl Reset {
    /// A reset of `disk` submitted at `now` (ns).
    pub fn new(io: BdevIo, disk: Arc<Disk>, now: u64) -> Reset {
        let wait = disk.params.io_timeout_sec.saturating_mul(1_000_000_000);
        Reset {
            io,
            disk,
            deadline: now.saturating_add(wait),
        }
    }
}

/// A reset that ended, and how: completed by [`finish`] on its thread.
pub type Ended = (BdevIo, Result<(), Errno>);

/// One poll group's waiting resets (its thread's).
#[derive(Default)]
pub struct Resets {
    waiting: Vec<Reset>,
}

impl Resets {
    pub fn add(&mut self, r: Reset) {
        self.waiting.push(r);
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Moves the resets whose disk drained, or whose deadline passed, to `ended`.
    pub fn poll(&mut self, now: u64, ended: &mut Vec<Ended>) {
        let mut i = 0;
        while i < self.waiting.len() {
            let r = &self.waiting[i];
            let result = if r.disk.outstanding() == 0 {
                Ok(())
            } else if now >= r.deadline {
                tracing::error!(
                    "rtrs bdev {}: reset: requests still outstanding after io_timeout_sec = {} s",
                    r.disk.params.name,
                    r.disk.params.io_timeout_sec
                );
                Err(Errno::ETIMEDOUT)
            } else {
                i += 1;
                continue;
            };
            let r = self.waiting.swap_remove(i);
            ended.push((r.io, result));
        }
    }
}

/// Completes ended resets, once each, on the caller's thread (theirs); the caller holds
/// no borrow of its group, as a completion may submit again.
pub fn finish(ended: &mut Vec<Ended>) {
    for (io, result) in ended.drain(..) {
        io.complete_with(result);
    }
}
