//! SPDK threads, cores and messages as safe values: the application's cpumask
//! (`spdk_env_get_first_core` / `_next_core`), creating an SPDK thread pinned to one core
//! (`spdk_thread_create` with a one-core `spdk_cpuset`, as nvmf creates its poll-group
//! threads), posting a closure to a thread (`spdk_thread_send_msg`), ticks as nanoseconds.

use std::ffi::{c_void, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::sys;
use crate::Errno;

/// A handle on an SPDK thread. SPDK threads are addressed by pointer from any thread
/// (`spdk_thread_send_msg` is thread-safe); the thread itself is owned by SPDK, which
/// frees it after it exited, so a handle must not be used once its thread was told to
/// exit and the exit message ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpdkThread(NonNull<sys::spdk_thread>);

// SAFETY: the handle is only an address; every operation through it is one SPDK allows
// from any thread (sending a message, comparing, reading its id).
unsafe impl Send for SpdkThread {}
// SAFETY: as above: no operation mutates through a shared handle.
unsafe impl Sync for SpdkThread {}

/// Why a message could not be posted to an SPDK thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MsgError {
    /// `spdk_thread_send_msg` returned −ENOMEM: the thread's message ring or the message
    /// pool is full. Retry later.
    #[error("spdk_thread_send_msg: message ring full (-ENOMEM); retry later")]
    Full,
    /// Any other error (−EIO: the thread is exiting).
    #[error("spdk_thread_send_msg failed with {0} (the thread is exiting?)")]
    Failed(Errno),
}

impl SpdkThread {
    /// The SPDK thread the caller runs on, if any.
    pub fn current() -> Option<SpdkThread> {
        // SAFETY: spdk_get_thread only reads a thread-local pointer.
        NonNull::new(unsafe { sys::spdk_get_thread() }).map(SpdkThread)
    }

    /// The application thread (the first thread SPDK created; RPCs run there).
    pub fn app() -> Option<SpdkThread> {
        // SAFETY: reads a global set once at start-up.
        NonNull::new(unsafe { sys::spdk_thread_get_app_thread() }).map(SpdkThread)
    }

    /// Creates an SPDK thread named `name`, scheduled on CPU `core` only. The reactor of
    /// that core runs it once the call returns.
    ///
    /// # Errors
    /// `None` when SPDK refused (`spdk_thread_create` returned NULL: no such core in the
    /// application's mask, or out of memory).
    pub fn create_on(name: &str, core: u32) -> Option<SpdkThread> {
        let name = CString::new(name.replace('\0', "")).ok()?;
        let mut mask = sys::spdk_cpuset::default();
        // SAFETY: `mask` is a valid, exclusively borrowed cpuset for both calls.
        unsafe {
            sys::spdk_cpuset_zero(&mut mask);
            sys::spdk_cpuset_set_cpu(&mut mask, core, true);
        }
        // SAFETY: both pointers are valid for the call; SPDK copies the name and the mask.
        NonNull::new(unsafe { sys::spdk_thread_create(name.as_ptr(), &mask) }).map(SpdkThread)
    }

    /// The raw pointer, for the bindings.
    pub fn as_ptr(self) -> *mut sys::spdk_thread {
        self.0.as_ptr()
    }

    /// Wraps a raw pointer (`None` for NULL).
    ///
    /// # Safety
    /// `p` must be NULL or point to a live SPDK thread.
    pub unsafe fn from_ptr(p: *mut sys::spdk_thread) -> Option<SpdkThread> {
        NonNull::new(p).map(SpdkThread)
    }

    /// Whether the caller runs on this thread.
    pub fn is_current(self) -> bool {
        SpdkThread::current() == Some(self)
    }

    /// Posts `f` to run on this thread (one allocation for the closure).
    ///
    /// # Errors
    /// [`MsgError`]; the closure is dropped then.
    pub fn send<F: FnOnce() + Send + 'static>(self, f: F) -> Result<(), MsgError> {
        let boxed: Box<Box<dyn FnOnce() + Send>> = Box::new(Box::new(f));
        let arg = Box::into_raw(boxed).cast::<c_void>();
        // SAFETY: `run_boxed` takes back the box exactly once; on failure SPDK did not
        // keep `arg` and we free it here.
        let rc = unsafe { sys::spdk_thread_send_msg(self.as_ptr(), Some(run_boxed), arg) };
        let Err(e) = Errno::result_from_neg(rc) else {
            return Ok(());
        };
        // SAFETY: the message was not queued, so `arg` is still ours.
        drop(unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) });
        Err(if e == Errno::ENOMEM {
            MsgError::Full
        } else {
            MsgError::Failed(e)
        })
    }

    /// Asks this thread to exit, from the thread itself: its pollers must be unregistered
    /// and its IO channels put first; SPDK frees it once it is idle.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn exit(self) -> Result<(), MsgError> {
        self.send(|| {
            // SAFETY: runs on the thread itself, as spdk_thread_exit requires.
            unsafe {
                sys::spdk_thread_exit(sys::spdk_get_thread());
            }
        })
    }
}

unsafe extern "C" fn run_boxed(arg: *mut c_void) {
    // SAFETY: `arg` came from Box::into_raw in `send` and SPDK hands it back exactly once.
    let f = unsafe { Box::from_raw(arg.cast::<Box<dyn FnOnce() + Send>>()) };
    f();
}

/// The CPU cores of the application's mask, in increasing order (the reactors).
pub fn app_cores() -> Vec<u32> {
    let mut v = Vec::new();
    // SAFETY: these read the environment's core table, fixed after start-up.
    let mut c = unsafe { sys::spdk_env_get_first_core() };
    while c != u32::MAX {
        v.push(c);
        // SAFETY: as above.
        c = unsafe { sys::spdk_env_get_next_core(c) };
    }
    v
}

/// Nanoseconds per tick as a 32.32 fixed-point factor, computed on first use (0: not
/// yet; `spdk_get_ticks_hz` does not change while the application runs).
static NS_PER_TICK_FP32: AtomicU64 = AtomicU64::new(0);

/// Monotonic nanoseconds from SPDK's tick counter (`spdk_get_ticks` scaled by
/// `spdk_get_ticks_hz`), read now.
pub fn now_ns() -> u64 {
    // SAFETY: reads the time-stamp counter; no state involved.
    ticks_to_ns(unsafe { sys::spdk_get_ticks() })
}

/// "Now" as the calling SPDK thread's pollers see it: the tick at which the thread's
/// current poll began (`spdk_thread_get_last_tsc`, the time SPDK's own timed pollers
/// are scheduled by), in nanoseconds; off an SPDK thread, [`now_ns`]. It reads no
/// counter: on this machine's kind of virtual CPU a counter read is 9 ns, and a poll
/// loop read it several times (docs/BENCHMARKS.md, "The clock in the poll loop").
/// It stands still within a poll, so a caller that waits for time to pass inside one
/// poll must use [`now_ns`]. Both clocks count the same ticks; comparisons between
/// them are only ever off by the length of one poll.
///
/// In interrupt mode ([`interrupt_mode`]) it is [`now_ns`]: SPDK then runs a thread's
/// pollers from its reactor's `epoll_wait` without passing through `spdk_thread_poll`,
/// and the thread's last tick stays where its last such pass left it (seconds behind, for
/// a thread that sleeps).
pub fn loop_now_ns() -> u64 {
    if interrupt_mode() {
        return now_ns();
    }
    match SpdkThread::current() {
        // SAFETY: the calling thread's own live SPDK thread; a plain field read.
        Some(t) => ticks_to_ns(unsafe { sys::spdk_thread_get_last_tsc(t.0.as_ptr()) }),
        None => now_ns(),
    }
}

/// Ticks of SPDK's counter in nanoseconds: one multiplication by a cached 32.32
/// fixed-point factor instead of a division, monotonic, and within one part in 2³² of
/// the exact quotient.
fn ticks_to_ns(t: u64) -> u64 {
    let mut f = NS_PER_TICK_FP32.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: reads the counter's frequency; no state involved.
        let hz = unsafe { sys::spdk_get_ticks_hz() }.max(1);
        f = u64::try_from((1_000_000_000u128 << 32) / u128::from(hz))
            .unwrap_or(u64::MAX)
            .max(1);
        NS_PER_TICK_FP32.store(f, Ordering::Relaxed);
    }
    u64::try_from((u128::from(t) * u128::from(f)) >> 32).unwrap_or(u64::MAX)
}

/// Whether the application runs in SPDK's interrupt mode (`--interrupt-mode`): its
/// threads sleep in `epoll_wait` when nothing is ready, and a poller registered without a
/// period is run on every wake-up of its thread (docs/ARCHITECTURE.md, "Interrupt mode").
pub fn interrupt_mode() -> bool {
    // SAFETY: reads a flag set once at application start; no arguments.
    unsafe { sys::spdk_interrupt_mode_is_enabled() }
}
