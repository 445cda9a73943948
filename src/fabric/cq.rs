//! Completion queues shared by connections (verbs' `ibv_cq`, the kernel's `ib_cq` that
//! `rtrs.c` creates per connection and a polled-mode engine shares per core).
//!
//! [`Cq`] is the handle a caller polls; each backend puts its own queue behind it
//! ([`CqBackend`]). A connection made on a CQ ([`ConnectOptions::on`](super::ConnectOptions::on),
//! [`ConnRequest::accept_into`]) reports its completions there, each carrying the
//! connection's [`Conn::qp_num`] in [`Wc::qp_num`].
//!
//! Software backends keep the progress state of every connection of a CQ where the CQ
//! reaches it (so that one poll drives them all, and a later readiness set per CQ fits),
//! and a connection handle reaches its own state there. Each connection is used by one
//! thread at a time; [`OwnedByThread`] is what makes that sound without a lock: the
//! first thread to touch a state claims it with one compare-and-swap, and from then on
//! every access is a plain load of the owner and a comparison with the caller's
//! [`ThreadToken`]. Another thread is refused (posts fail with
//! [`PostErrorKind::WrongThread`]) until the holder lets go
//! ([`Conn::release_thread`]); the CQ drives and reports only the connections held by
//! the thread polling it.
//!
//! [`Conn::release_thread`]: crate::fabric::Conn::release_thread
//! [`Fabric::connect`]: crate::fabric::Fabric::connect
//! [`ConnRequest::accept_into`]: crate::fabric::ConnRequest::accept_into
//! [`Conn::qp_num`]: crate::fabric::Conn::qp_num
//! [`PostErrorKind::WrongThread`]: crate::fabric::PostErrorKind::WrongThread

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{FabricKind, Wc};

/// An event of a completion queue, as verbs' asynchronous events of a CQ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CqEvent {
    /// More completions were outstanding (generated and not yet polled) than the CQ has
    /// entries: verbs' `IBV_EVENT_CQ_ERR`. The CQ is in error: every connection on it
    /// breaks (its peer sees `Disconnected`), no connection can be added to it, and it
    /// should be destroyed. Completions it still holds may be lost on verbs; software
    /// backends keep them pollable.
    Overrun,
}

/// A backend's completion queue (see [`Cq`]).
pub trait CqBackend: Send {
    /// Drives progress of the CQ's connections (software backends) and moves up to
    /// `wcs.len()` completions into `wcs`. An empty `wcs` only makes progress.
    fn poll(&mut self, wcs: &mut [Wc]) -> usize;
    /// The next event of the CQ, if any.
    fn poll_event(&mut self) -> Option<CqEvent>;
    /// The number of completions the CQ holds before it overruns.
    fn entries(&self) -> u32;
    /// What connections are made on (see [`CqRef`]): the backend's own type, found
    /// again by downcasting when a connection is made.
    fn share(&self) -> Arc<dyn Any + Send + Sync>;
    /// See [`Cq::wait_fd`]. Default: none.
    fn wait_fd(&self) -> Option<RawFd> {
        None
    }
    /// See [`Cq::arm`]. Default: the descriptor needs no arming (`true`).
    fn arm(&mut self) -> bool {
        true
    }
}

/// A completion queue made by [`Fabric::create_cq`](crate::fabric::Fabric::create_cq).
///
/// Polled by whoever holds it (`&mut`; it is `Send`, not `Sync`). Connections are made
/// on it through a [`CqRef`] ([`Cq::share`]), from any thread. Dropping it while
/// connections remain on it leaves them without a poller (software backends make no
/// progress for them, verbs keeps the queue until the last one is gone).
pub struct Cq {
    kind: FabricKind,
    inner: Box<dyn CqBackend>,
}

impl std::fmt::Debug for Cq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cq")
            .field("kind", &self.kind)
            .field("entries", &self.inner.entries())
            .finish()
    }
}

impl Cq {
    /// Wraps a backend's queue.
    pub fn new(kind: FabricKind, inner: Box<dyn CqBackend>) -> Cq {
        Cq { kind, inner }
    }

    /// The backend that made the CQ.
    pub fn kind(&self) -> FabricKind {
        self.kind
    }

    /// Makes progress and moves up to `wcs.len()` completions into `wcs`, never blocking
    /// and never allocating. Completions of one connection come out in the order they
    /// completed; a connection with many completions does not hold back another's (the
    /// software backends take connections in turn).
    pub fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        self.inner.poll(wcs)
    }

    /// The next event of the CQ ([`CqEvent::Overrun`]). Cheap on the software backends;
    /// on verbs it reads the device's asynchronous events (a system call), so poll it on
    /// a slow timer there.
    pub fn poll_event(&mut self) -> Option<CqEvent> {
        self.inner.poll_event()
    }

    /// How many completions the CQ holds before it overruns.
    pub fn entries(&self) -> u32 {
        self.inner.entries()
    }

    /// A descriptor that becomes readable when a connection of the CQ may have progress
    /// to make (data arrived, a peer hung up), for a poller that sleeps when idle
    /// (docs/ARCHITECTURE.md, "Interrupt mode"): the tcp fabric's epoll readiness set.
    /// On verbs, the devices' completion channels, raised only once [`Cq::arm`]ed.
    /// `None` where the backend has none (loopback, tcp without a set or with io_uring
    /// readiness): such a CQ must be polled, on an idle period at least.
    /// Connections the set does not watch yet (one just handed to the CQ's thread) are
    /// found by that polling too.
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.inner.wait_fd()
    }

    /// Readies [`Cq::wait_fd`] for a poller about to sleep: on verbs a completion channel
    /// raises one event for the first completion after it is armed, so the CQ arms what
    /// is not armed yet. `true` when sleeping now misses nothing (it was armed already,
    /// and nothing came since, or the backend needs no arming); `false` when it armed
    /// just now: a completion may have come before the arming without raising the
    /// descriptor, so poll once more first. Cheap to call only before sleeping (on verbs
    /// a system call per device).
    pub fn arm(&mut self) -> bool {
        self.inner.arm()
    }

    /// A reference to make connections on this CQ with
    /// ([`Fabric::connect`](crate::fabric::Fabric::connect) with a CQ,
    /// [`ConnRequest::accept_into`](crate::fabric::ConnRequest::accept_into)), from this
    /// thread or another (a control thread making the connections a core will serve).
    pub fn share(&self) -> CqRef {
        CqRef {
            kind: self.kind,
            inner: self.inner.share(),
        }
    }
}

/// What connections are made on: a shared reference to a [`Cq`] (`Clone`, `Send`,
/// `Sync`), good for nothing else.
#[derive(Clone)]
pub struct CqRef {
    kind: FabricKind,
    inner: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for CqRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CqRef").field("kind", &self.kind).finish()
    }
}

impl CqRef {
    /// The backend that made the CQ.
    pub fn kind(&self) -> FabricKind {
        self.kind
    }

    /// The backend's part, for the backend (to check a CQ it is given is its own).
    pub fn backend(&self) -> &(dyn Any + Send + Sync) {
        &*self.inner
    }

    /// The backend's part, shared (for a backend whose connections keep it).
    pub fn backend_arc(&self) -> Arc<dyn Any + Send + Sync> {
        self.inner.clone()
    }
}

/// The calling thread's token: a number unique to it, never 0 and never reused. It is
/// neither `Send` nor `Sync`, so it cannot leave its thread: holding one proves which
/// thread is calling.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadToken {
    v: u64,
    _here: PhantomData<*const ()>,
}

/// See [`ThreadToken`].
#[inline]
pub fn thread_token() -> ThreadToken {
    thread_local!(static TOKEN: Cell<u64> = const { Cell::new(0) });
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let v = TOKEN.with(|t| match t.get() {
        0 => {
            let v = NEXT.fetch_add(1, Ordering::Relaxed);
            t.set(v);
            v
        }
        v => v,
    });
    ThreadToken {
        v,
        _here: PhantomData,
    }
}

/// Marks a state whose owner is inside [`OwnedByThread::with_as`]; tokens count up from
/// 1 and never reach it.
const BUSY: u64 = 1 << 63;

/// Puts the owner's token back when its access ends (also on unwinding).
struct Busy<'a> {
    owner: &'a AtomicU64,
    me: u64,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.owner.store(self.me, Ordering::Relaxed);
    }
}

/// State used by one thread at a time, reached through shared handles (`Arc`) from
/// objects that are each `Send`: a connection's state, reached by its handle and by the
/// CQ it is on.
///
/// The owner is a thread token (0: nobody). A thread claims an unowned state with one
/// compare-and-swap; after that, each access is a relaxed load that finds the caller's
/// own token, which only the caller itself can have stored (no other thread ever writes
/// it, and the owner's own later store of 0 would be seen by its own later loads), so
/// no other thread can be inside. Releasing stores 0 with release ordering, and the next
/// claim acquires it, so the next owner sees everything the last one did.
pub struct OwnedByThread<T> {
    owner: AtomicU64,
    value: UnsafeCell<T>,
}

// SAFETY: the value is only reached through `with`, which admits only the owning thread
// (see the type's documentation), so no two threads ever access it at once; moving that
// access from one thread to another needs `T: Send`.
unsafe impl<T: Send> Sync for OwnedByThread<T> {}

impl<T> OwnedByThread<T> {
    pub fn new(value: T) -> OwnedByThread<T> {
        OwnedByThread {
            owner: AtomicU64::new(0),
            value: UnsafeCell::new(value),
        }
    }

    /// Whether the thread of token `me` holds the state, claiming it when nobody does
    /// and `claim` is set.
    #[inline]
    fn enter(&self, me: ThreadToken, claim: bool) -> bool {
        let me = me.v;
        let cur = self.owner.load(Ordering::Relaxed);
        cur == me
            || (claim
                && cur == 0
                && self
                    .owner
                    .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok())
    }

    /// Runs `f` on the value if the calling thread holds it (claiming it when nobody
    /// does); `None` when another thread holds it, or when `f` itself (or anything it
    /// calls) reaches the same state again: `f` has the only `&mut` while it runs.
    #[inline]
    pub fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.with_as(thread_token(), true, f)
    }

    /// [`OwnedByThread::with`] only if the calling thread already holds the state (never
    /// claims it).
    #[inline]
    pub fn with_held<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.with_as(thread_token(), false, f)
    }

    /// [`OwnedByThread::with`] (`claim`) or [`OwnedByThread::with_held`] for a caller
    /// that read its [`thread_token`] once for many states.
    #[inline]
    pub fn with_as<R>(
        &self,
        me: ThreadToken,
        claim: bool,
        f: impl FnOnce(&mut T) -> R,
    ) -> Option<R> {
        if !self.enter(me, claim) {
            return None;
        }
        // While `f` runs the owner reads `me | BUSY`, which no token equals: a nested
        // call on this thread is refused by `enter`, and other threads were already.
        // Only the owning thread stores here, so plain stores suffice (no read-modify-
        // write); the guard puts `me` back even if `f` unwinds.
        self.owner.store(me.v | BUSY, Ordering::Relaxed);
        let _busy = Busy {
            owner: &self.owner,
            me: me.v,
        };
        // SAFETY: `enter` admitted only the thread whose token is `me`, which is the
        // caller's own (a token cannot leave its thread), and the BUSY mark set above
        // refuses every other entry until `f` returns, so the `&mut` made here is the
        // only reference to the value while it lives.
        Some(f(unsafe { &mut *self.value.get() }))
    }

    /// Gives up the calling thread's hold, if it has one (not from inside
    /// [`OwnedByThread::with`] on the same state: that hold ends when `f` returns).
    pub fn release(&self) {
        let me = thread_token().v;
        if self.owner.load(Ordering::Relaxed) == me {
            self.owner.store(0, Ordering::Release);
        }
    }

    /// The value, with no thread check: `&mut self` proves exclusive access.
    pub fn get_mut(&mut self) -> &mut T {
        self.value.get_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn first_thread_claims_others_are_refused_until_released() {
        let s = Arc::new(OwnedByThread::new(0u32));
        assert_eq!(s.with(|v| *v += 1), Some(()));
        let s2 = s.clone();
        let refused = std::thread::spawn(move || s2.with(|v| *v += 1))
            .join()
            .unwrap();
        assert_eq!(refused, None, "another thread holds it");
        s.release();
        let s3 = s.clone();
        let taken = std::thread::spawn(move || {
            let r = s3.with(|v| {
                *v += 1;
                *v
            });
            s3.release();
            r
        })
        .join()
        .unwrap();
        assert_eq!(
            taken,
            Some(2),
            "released, so the other thread takes it over"
        );
        assert_eq!(s.with(|v| *v), Some(2));
    }

    #[test]
    fn thread_tokens_differ() {
        let here = thread_token().v;
        assert_ne!(here, 0);
        assert_eq!(here, thread_token().v);
        let there = std::thread::spawn(|| thread_token().v).join().unwrap();
        assert_ne!(here, there);
    }

    #[test]
    fn a_nested_access_to_the_same_state_is_refused() {
        let s = OwnedByThread::new(5u32);
        let inner = s.with(|outer| {
            *outer += 1;
            // A second `&mut` while the first lives would alias it.
            s.with(|v| *v += 100)
        });
        assert_eq!(inner, Some(None), "the nested call is refused");
        assert_eq!(s.with(|v| *v), Some(6), "and the hold is back after it");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            s.with(|_| panic!("inside"));
        }));
        assert!(r.is_err());
        assert_eq!(
            s.with(|v| *v),
            Some(6),
            "the hold survives an unwinding access"
        );
    }

    #[test]
    fn holding_is_not_claiming() {
        let s = OwnedByThread::new(1u8);
        assert_eq!(s.with_held(|v| *v), None, "nobody holds it yet");
        assert_eq!(s.with(|v| *v), Some(1), "claimed");
        assert_eq!(s.with_held(|v| *v), Some(1), "now held");
    }
}
