//! Fault injection on a loopback connection, for tests of what RTRS does when the
//! fabric misbehaves: a broken connection (the kernel sees `RDMA_CM_EVENT_DISCONNECTED`
//! or a WC error), a silent path (heartbeats go unanswered), late delivery, refused
//! posts (`ib_post_send` failing).
//!
//! A [`Faults`] handle names one end of one connection; get it from
//! [`super::LoopbackFabric::faults`]. Faults act at that end's next call, whatever
//! thread makes it, and never depend on time, so a test stepping both ends on one thread
//! sees the same completions every run.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::link::Link;

/// Fault controls for one end of a loopback connection (cheap to clone).
#[derive(Clone)]
pub struct Faults {
    link: Arc<Link>,
    end: usize,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Faults({} of {} <-> {})",
            self.link.addrs[self.end], self.link.addrs[0], self.link.addrs[1]
        )
    }
}

impl Faults {
    pub(super) fn new(link: Arc<Link>, end: usize) -> Faults {
        Faults { link, end }
    }

    /// The same connection's other end.
    pub fn peer(&self) -> Faults {
        Faults {
            link: self.link.clone(),
            end: 1 - self.end,
        }
    }

    /// Breaks the connection, as a transport failure would: at its next call each end
    /// flushes its outstanding work and raises `CmEvent::Disconnected`.
    pub fn break_now(&self) {
        self.link.broken.store(true, Ordering::Release);
    }

    /// From now on every operation, ack and close in either direction vanishes and
    /// nobody is told (a dead path: only a heartbeat timeout notices). Permanent: the
    /// operations lost cannot be replayed, so the connection is unusable afterwards.
    pub fn blackhole(&self) {
        self.link.blackhole.store(true, Ordering::Release);
    }

    /// Holds delivery to this end (operations queue up in order) until
    /// [`release`](Faults::release).
    pub fn hold(&self) {
        self.link.ends[self.end].hold.store(true, Ordering::Release);
    }

    /// Ends [`hold`](Faults::hold): the next poll of this end delivers what queued up.
    pub fn release(&self) {
        self.link.ends[self.end]
            .hold
            .store(false, Ordering::Release);
    }

    /// This end's next `polls` polls (`poll_cq` or `poll_cm`) deliver nothing.
    pub fn hold_for_polls(&self, polls: u64) {
        self.link.ends[self.end]
            .hold_polls
            .store(polls, Ordering::Release);
    }

    /// This end's next `posts` calls of `post_send` or `post_recv` fail with
    /// `PostErrorKind::Injected` at index 0 (nothing of them is posted).
    pub fn fail_posts(&self, posts: u64) {
        self.link.ends[self.end]
            .fail_posts
            .store(posts, Ordering::Release);
    }
}
