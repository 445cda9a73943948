//! The threads a disk's cores run on (the kernel's per-CPU queues of `rnbd-clt`, here SPDK
//! threads): core 0 is the thread that creates the disk, core `k` a thread of ours on the
//! `k`-th core of the application's cpumask; the engine's [`Driver`] runs the disk's
//! pollers on them. [`make_driver`] starts them, [`stop_driver`] drops their pollers and
//! lets ours exit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use rtrs_spdk::engine::PollPace;
use rtrs_spdk::spdk::{app_cores, Driver, SpdkThread};

/// Period (µs) of the disk's own pollers while they find work (see [`make_driver`]).
/// Under fio's `spdk_bdev` plugin every period is a wake-up of its initialisation thread,
/// which takes a CPU from the job or from the target: at 100 µs that cost fio's QD1 reads
/// 3–5 µs of p99 and 8–24 % of IOPS against 1 ms (docs/BENCHMARKS.md, "The disk's own
/// pollers under fio"). Each control step of a session (a connect handshake step, OPEN,
/// CLOSE, a re-open) may wait up to a period.
const DISK_POLL_US: u64 = 1000;

/// Runs in a row without work after which a poller of the disk moves to its idle period.
const DISK_SLOW_AFTER: u32 = 100;

/// Longest idle period (µs) of the disk's own pollers.
const DISK_IDLE_MAX_US: u64 = 100_000;

/// The disk's cores: core 0 (home) is the calling thread — the application thread, which
/// every SPDK application polls, even one without reactors such as fio's `spdk_bdev`
/// plugin, which polls no other thread while its JSON config runs — and core `k` a thread
/// of ours on the `k`-th core of the cpumask. Returns the driver and the CPU of each core.
///
/// The disk's own pollers (a core queue nobody else owns, the session's control work) run
/// every [`DISK_POLL_US`] while they find work and, after [`DISK_SLOW_AFTER`] runs
/// without, every sixteenth of the heartbeat interval up to [`DISK_IDLE_MAX_US`] (see
/// [`PollPace::keeping`]); whoever hands them work calls [`Driver::wake`]. The IO fast
/// path is the channels' pollers, and a thread that has only timed pollers may sleep
/// (fio's initialisation thread does).
pub fn make_driver(name: &str, hb_interval_ms: u64) -> Result<(Arc<Driver>, Vec<u32>), String> {
    let me = SpdkThread::current().ok_or("not called on an SPDK thread")?;
    let cpus = app_cores();
    let mut threads = vec![me];
    for &c in cpus.iter().skip(1) {
        match SpdkThread::create_on(&format!("rtrs_{name}_{c}"), c) {
            Some(t) => threads.push(t),
            None => {
                for t in threads.drain(1..) {
                    let _ = t.exit();
                }
                return Err(format!("spdk_thread_create failed for core {c}"));
            }
        }
    }
    // The session's control poller sends the heartbeats and answers the server's: its
    // idle period stays well inside their interval.
    let pace = PollPace::keeping(
        hb_interval_ms.saturating_mul(1000),
        DISK_POLL_US,
        DISK_IDLE_MAX_US,
        DISK_SLOW_AFTER,
    );
    let driver = Driver::adopt_paced(&threads, pace).map_err(|e| e.to_string())?;
    Ok((driver, cpus))
}

/// Drops every core's pollers, lets the threads of ours exit, then runs `done` on the
/// calling thread (core 0's, the application thread), once every core's pollers are gone.
///
/// Each thread of ours gets one message from here, and it is the last anything sends it:
/// it drops that core's pollers, counts the core out and only then asks SPDK to end the
/// thread. SPDK marks an exiting thread exited as soon as its message ring is empty,
/// refuses messages to it from then on and frees it once its reactor sees it exited, so
/// the completion travels back from the cores rather than through them
/// (docs/ARCHITECTURE.md, "The SPDK bdev: who polls a core's connection").
pub fn stop_driver<F: FnOnce() + Send + 'static>(driver: &Arc<Driver>, done: F) {
    let out = Arc::new(CountOut {
        left: AtomicUsize::new(driver.cores()),
        done: Mutex::new(Some(done)),
        back: SpdkThread::current(),
    });
    for k in 1..driver.cores() {
        let (d, o) = (Arc::clone(driver), Arc::clone(&out));
        let sent = driver.run_on(k, move |_cx| {
            d.shutdown_core();
            d.drop_core();
            o.one_out();
            if let Some(t) = d.thread(k) {
                if t.exit().is_err() {
                    tracing::warn!("rtrs bdev: core {k}'s thread could not be told to exit");
                }
            }
        });
        if let Err(e) = sent {
            // Never taken by the core: its pollers stay, but the stop completes.
            tracing::error!("rtrs bdev: could not stop core {k}: {e}");
            out.one_out();
        }
    }
    driver.shutdown_core();
    driver.drop_core();
    out.one_out();
}

/// The cores of a stopping driver not yet done, and what runs once none is left.
struct CountOut<F> {
    left: AtomicUsize,
    done: Mutex<Option<F>>,
    /// Where `done` runs (the thread that stopped the driver).
    back: Option<SpdkThread>,
}

impl<F: FnOnce() + Send + 'static> CountOut<F> {
    /// One core is done; the last one runs `done` on `back` (in place when it is `back`).
    fn one_out(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // A poisoned lock still holds the completion: run it all the same.
        let mut slot = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(done) = slot.take() else {
            return;
        };
        drop(slot);
        match self.back {
            Some(t) if !t.is_current() => {
                if t.send(done).is_err() {
                    tracing::error!("rtrs bdev: could not post the stop completion");
                }
            }
            _ => done(),
        }
    }
}
