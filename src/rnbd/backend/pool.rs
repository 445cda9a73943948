//! The thread-pool engine of the file backend, for kernels without usable io_uring (and
//! for block-device discard, an ioctl io_uring cannot issue). The reactor pushes plans on
//! a bounded lock-free queue and wakes an idle worker; workers run the blocking syscalls
//! and push results on a second queue that the reactor drains in [`Pool::poll`]. The
//! reactor never waits: a push and an `unpark` are all it does.

use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

use crossbeam_queue::ArrayQueue;

use super::error::OpenError;
use super::plan::IoPlan;
use super::{sys, BlockCompletion};
use crate::Errno;

/// A parked worker rechecks the queue this often even without a wake-up (belt and
/// braces; wake-ups are not lost by construction).
const PARK_TIMEOUT: Duration = Duration::from_millis(100);

struct Shared {
    fd: RawFd,
    jobs: ArrayQueue<IoPlan>,
    done: ArrayQueue<BlockCompletion>,
    idle: Vec<AtomicBool>,
    stop: AtomicBool,
}

pub(crate) struct Pool {
    shared: Arc<Shared>,
    threads: Vec<Thread>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// `threads` workers running IO on `fd` (which must stay open until the pool is
    /// dropped), for at most `depth` IOs in flight.
    pub(crate) fn new(fd: RawFd, depth: usize, threads: usize) -> Result<Pool, OpenError> {
        let threads = threads.max(1);
        let shared = Arc::new(Shared {
            fd,
            jobs: ArrayQueue::new(depth),
            done: ArrayQueue::new(depth),
            idle: (0..threads).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
        });
        let mut pool = Pool {
            shared,
            threads: Vec::with_capacity(threads),
            workers: Vec::with_capacity(threads),
        };
        for index in 0..threads {
            let shared = Arc::clone(&pool.shared);
            let handle = thread::Builder::new()
                .name(format!("rnbd-file-io-{index}"))
                .spawn(move || worker(&shared, index))
                .map_err(|source| OpenError::Spawn { source })?;
            pool.threads.push(handle.thread().clone());
            pool.workers.push(handle);
        }
        Ok(pool)
    }

    /// Hands `plan` to a worker. The caller keeps the in-flight count within the depth,
    /// so the queue has room; otherwise the IO comes back as a failed completion.
    pub(crate) fn start(&mut self, plan: IoPlan) -> Result<(), BlockCompletion> {
        if let Err(plan) = self.shared.jobs.push(plan) {
            return Err(BlockCompletion::new(plan.tag, Err(Errno::EBUSY)));
        }
        // Pairs with the worker's fence between raising its idle flag and rechecking the
        // queue: either it sees the job, or we see it idle and wake it.
        fence(Ordering::SeqCst);
        if let Some(i) = self
            .shared
            .idle
            .iter()
            .position(|idle| idle.swap(false, Ordering::SeqCst))
        {
            self.threads[i].unpark();
        }
        Ok(())
    }

    pub(crate) fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        let mut n = 0;
        // `pop` on an empty queue fences; two plain loads say first whether it is empty
        // (a completion pushed meanwhile is taken by the next poll).
        while n < out.len() && !self.shared.done.is_empty() {
            let Some(c) = self.shared.done.pop() else {
                break;
            };
            out[n] = c;
            n += 1;
        }
        n
    }
}

impl Drop for Pool {
    /// Lets the workers finish every queued IO (buffers stay in use until then), then
    /// joins them.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in &self.threads {
            t.unpark();
        }
        for w in self.workers.drain(..) {
            if w.join().is_err() {
                tracing::error!("a file IO worker panicked");
            }
        }
    }
}

fn worker(shared: &Shared, index: usize) {
    loop {
        if let Some(mut plan) = shared.jobs.pop() {
            let errno = loop {
                if let Some(errno) = plan.complete(sys::exec(shared.fd, plan.step())) {
                    break errno;
                }
            };
            // Cannot be full: at most `depth` IOs are in flight.
            if shared
                .done
                .push(BlockCompletion::from_neg(plan.tag, errno))
                .is_err()
            {
                tracing::error!("file IO completion queue overflow; tag {} lost", plan.tag);
            }
            continue;
        }
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        shared.idle[index].store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if shared.jobs.is_empty() && !shared.stop.load(Ordering::SeqCst) {
            thread::park_timeout(PARK_TIMEOUT);
        }
        shared.idle[index].store(false, Ordering::SeqCst);
    }
}
