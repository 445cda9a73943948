//! [`SpdkPoller`]: a plain SPDK poller owned as a value, for the control work that runs
//! outside a [`Driver`](super::Driver) (a channel's reset, a poll group, an export's
//! drain, a wait on the application thread: [`poll_until`]). The driver keeps its own
//! table of pollers; every other poller of the project is one of these.
//!
//! What holds: a poller is registered and unregistered on one SPDK thread (the handle is
//! neither `Send` nor `Sync`); its function never runs after the handle is dropped or
//! after it returned [`SpdkPoll::Stop`]; its state is freed once, after the last call,
//! whether the handle is dropped outside the function or from inside it.

use std::cell::{Cell, RefCell};
use std::ffi::{c_int, c_void, CStr};
use std::ptr::{self, NonNull};

use super::sys;
use super::thread::SpdkThread;

/// What a poller's function says after a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpdkPoll {
    /// It found work (SPDK counts the run as busy).
    Busy,
    /// It found none.
    Idle,
    /// It is done: it is unregistered and never runs again.
    Stop,
}

impl SpdkPoll {
    /// `Busy` when `busy`, else `Idle`.
    pub fn from_busy(busy: bool) -> SpdkPoll {
        if busy {
            SpdkPoll::Busy
        } else {
            SpdkPoll::Idle
        }
    }
}

/// The state SPDK's callback argument points at: it outlives every call SPDK makes.
struct Inner {
    name: &'static CStr,
    f: RefCell<Box<dyn FnMut() -> SpdkPoll>>,
    /// The registered SPDK poller; null once unregistered.
    raw: Cell<*mut sys::spdk_poller>,
    /// The function is running now.
    running: Cell<bool>,
    /// The handle is gone: the callback frees the state when the running call returns.
    orphaned: Cell<bool>,
}

impl Inner {
    fn unregister(&self) {
        let mut p = self.raw.replace(ptr::null_mut());
        if !p.is_null() {
            // SAFETY: registered by this state on this thread (the handle cannot leave
            // it), unregistered once (swapped out); allowed from inside its own callback.
            unsafe { sys::spdk_poller_unregister(&mut p) };
        }
    }
}

/// A poller on the SPDK thread that made it, running its function every `period_us`
/// microseconds (0: on every loop of the thread, or every wake-up in interrupt mode)
/// until the function returns [`SpdkPoll::Stop`] or the handle is dropped.
pub struct SpdkPoller {
    inner: NonNull<Inner>,
}

impl SpdkPoller {
    /// Registers `f` on the calling SPDK thread.
    ///
    /// # Errors
    /// `None` when the caller is not an SPDK thread or SPDK refused the poller.
    pub fn start<F: FnMut() -> SpdkPoll + 'static>(
        name: &'static CStr,
        period_us: u64,
        f: F,
    ) -> Option<SpdkPoller> {
        SpdkThread::current()?;
        let inner = NonNull::from(Box::leak(Box::new(Inner {
            name,
            f: RefCell::new(Box::new(f)),
            raw: Cell::new(ptr::null_mut()),
            running: Cell::new(false),
            orphaned: Cell::new(false),
        })));
        let me = SpdkPoller { inner };
        if !me.register(period_us) {
            return None; // dropping `me` frees the state (nothing registered)
        }
        Some(me)
    }

    fn inner(&self) -> &Inner {
        // SAFETY: the state lives while the handle does (freed by Drop, or by the
        // callback only after Drop orphaned it).
        unsafe { self.inner.as_ref() }
    }

    /// Registers a new SPDK poller for the state with `period_us`; unregisters the old one
    /// once the new one is in. `false` (the old one kept) when SPDK refused.
    fn register(&self, period_us: u64) -> bool {
        let inner = self.inner();
        // SAFETY: the argument is the state, which outlives the SPDK poller (Drop and
        // Stop unregister it before the state is freed); the name is static.
        let new = unsafe {
            sys::spdk_poller_register_named(
                Some(trampoline),
                self.inner.as_ptr().cast::<c_void>(),
                period_us,
                inner.name.as_ptr(),
            )
        };
        if new.is_null() {
            return false;
        }
        let mut old = inner.raw.replace(new);
        if !old.is_null() {
            // SAFETY: the state's previous poller, on this thread, unregistered once.
            unsafe { sys::spdk_poller_unregister(&mut old) };
        }
        true
    }

    /// Runs the function every `period_us` from now on (callable from inside it). `false`
    /// when SPDK refused: the old period stays.
    pub fn set_period(&self, period_us: u64) -> bool {
        if self.inner().raw.get().is_null() {
            return false; // stopped
        }
        self.register(period_us)
    }

    /// Lets the poller run until its function returns [`SpdkPoll::Stop`], with no handle.
    pub fn detach(self) {
        let inner = self.inner();
        if inner.raw.get().is_null() {
            return; // already stopped: Drop frees it
        }
        inner.orphaned.set(true);
        std::mem::forget(self);
    }
}

impl Drop for SpdkPoller {
    fn drop(&mut self) {
        let inner = self.inner();
        inner.unregister();
        if inner.running.get() {
            // Dropped from inside its own function: the callback frees the state when
            // the function returns.
            inner.orphaned.set(true);
            return;
        }
        // SAFETY: made by Box::leak in `start`; not running and unregistered, so SPDK
        // holds no call to make with it; freed once (the handle is going).
        drop(unsafe { Box::from_raw(self.inner.as_ptr()) });
    }
}

unsafe extern "C" fn trampoline(arg: *mut c_void) -> c_int {
    let inner_ptr = arg.cast::<Inner>();
    // SAFETY: the state this poller was registered with: alive until the handle's Drop
    // (which unregisters this poller first) or this callback frees it below.
    let inner = unsafe { &*inner_ptr };
    inner.running.set(true);
    let r = match inner.f.try_borrow_mut() {
        Ok(mut f) => f(),
        // The function re-entered itself (it cannot: SPDK runs a thread's pollers one
        // at a time); count the run as idle.
        Err(_) => SpdkPoll::Idle,
    };
    inner.running.set(false);
    if r == SpdkPoll::Stop {
        inner.unregister();
    }
    // Unregistered (by Stop just now, or by a Drop during the run) with no handle left:
    // this was the last call.
    if inner.orphaned.get() && inner.raw.get().is_null() {
        // SAFETY: no handle is left and the poller is unregistered, so SPDK makes no
        // further call with it; the state was made by Box::leak and is freed once, here.
        drop(unsafe { Box::from_raw(inner_ptr) });
    }
    match r {
        SpdkPoll::Busy => sys::spdk_thread_poller_rc_SPDK_POLLER_BUSY as c_int,
        SpdkPoll::Idle | SpdkPoll::Stop => sys::spdk_thread_poller_rc_SPDK_POLLER_IDLE as c_int,
    }
}

/// Runs `f` every `period_us` microseconds on the calling SPDK thread until it returns
/// `true` (a detached [`SpdkPoller`], for control work outside a
/// [`Driver`](super::Driver) such as waiting for a stop on the application thread).
///
/// # Errors
/// `false` when the caller is not an SPDK thread or SPDK refused the poller.
pub fn poll_until<F: FnMut() -> bool + 'static>(period_us: u64, mut f: F) -> bool {
    let run = move || {
        if f() {
            SpdkPoll::Stop
        } else {
            SpdkPoll::Idle
        }
    };
    match SpdkPoller::start(c"rtrs_until", period_us, run) {
        Some(p) => {
            p.detach();
            true
        }
        None => false,
    }
}
