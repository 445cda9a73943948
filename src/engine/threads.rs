//! The standalone driver: one pinned OS thread per core of a cpumask, each running a
//! [`Reactor`] until shutdown.
//!
//! Corresponds to SPDK's `spdk_reactors_start`/`spdk_reactors_stop` (one reactor per core
//! of the `-m` mask). Used by our CLIs and tests; inside SPDK the application owns the
//! threads and this driver is not used.
//!
//! # Shutdown, exactly
//! [`Engine::shutdown`] (or dropping the [`Engine`]) sets every reactor's stop flag and
//! wakes it. Each reactor then:
//! 1. finishes the loop it is in, and calls [`Poller::shutdown`](super::Poller::shutdown)
//!    once on every poller and timer: the moment to fail or complete outstanding work;
//! 2. drains: keeps looping (messages run, pollers are polled, due timers fire) until
//!    [`EngineConfig::drain_idle_loops`] loops in a row are idle, or
//!    [`EngineConfig::drain_timeout`] has passed on the engine's clock;
//! 3. marks itself finished but keeps looping, so messages from reactors still draining
//!    are run, until every reactor has finished (again bounded by `drain_timeout`);
//! 4. closes: pollers and armed timers are dropped (timers not yet due never fire),
//!    messages still queued are dropped unrun, and the thread ends.
//!
//! So an operation outstanding at shutdown is completed or failed by its poller's
//! `shutdown` hook or during the drain; whatever is still pending after that is dropped
//! with its owner. Messages posted after a reactor closed stay in its mailbox and are
//! dropped with the [`Mailboxes`]. A panic in a poller or message ends that reactor's
//! thread; shutdown joins the others and reports [`EngineError::ReactorPanicked`].

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::clock::{Clock, MonotonicClock};
use super::cpumask::CpuMask;
use super::error::EngineError;
use super::idle::{IdleState, IdleStrategy};
use super::mailbox::Mailboxes;
use super::poller::duration_ns;
use super::poller::{Msg, SendError};
use super::reactor::{Dropped, Reactor};
use super::stats::StatsSnapshot;

/// How to start an [`Engine`].
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Cores that get a reactor, in reactor order.
    pub cpumask: CpuMask,
    /// What reactors do when idle. Default [`IdleStrategy::BusyPoll`].
    pub idle: IdleStrategy,
    /// Messages each mailbox holds before senders see backpressure. Default 4096.
    pub mailbox_capacity: usize,
    /// Bound of each shutdown drain phase. Default 5 s.
    pub drain_timeout: Duration,
    /// Idle loops in a row that end a reactor's drain. Default 16.
    pub drain_idle_loops: u32,
    /// Pin each reactor thread to its CPU. A failed pin is a logged warning. Default true.
    pub pin: bool,
}

impl EngineConfig {
    /// Defaults (see each field) for the given cpumask.
    pub fn new(cpumask: CpuMask) -> EngineConfig {
        EngineConfig {
            cpumask,
            idle: IdleStrategy::BusyPoll,
            mailbox_capacity: 4096,
            drain_timeout: Duration::from_secs(5),
            drain_idle_loops: 16,
            pin: true,
        }
    }
}

/// How one reactor ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReactorReport {
    /// Reactor index.
    pub core: usize,
    /// CPU it ran on.
    pub cpu: usize,
    /// Whether the thread was pinned to `cpu`.
    pub pinned: bool,
    /// Whether its drain ended idle (false: the drain timeout cut it short).
    pub drained: bool,
    /// What closing it dropped.
    pub dropped: Dropped,
    /// Its final counters.
    pub stats: StatsSnapshot,
}

/// A running set of reactor threads.
pub struct Engine {
    mailboxes: Arc<Mailboxes>,
    cpus: Vec<usize>,
    threads: Vec<Option<JoinHandle<ReactorReport>>>,
}

impl Engine {
    /// Starts one reactor thread per core of `config.cpumask`, on the real monotonic
    /// clock. Pollers are added by sending each reactor a message that registers them
    /// ([`Engine::send`] with `|ctx| { ctx.register(...); }`), since pollers are created
    /// on the thread that runs them.
    ///
    /// # Errors
    /// [`EngineError::ZeroMailboxCapacity`], or [`EngineError::Spawn`] if a thread cannot
    /// be created (the reactors already started are stopped and joined first).
    pub fn start(config: EngineConfig) -> Result<Engine, EngineError> {
        Engine::start_with_clock(config, Arc::new(MonotonicClock::new()))
    }

    /// As [`Engine::start`] with a given clock (drain timeouts are measured on it too).
    ///
    /// # Errors
    /// As [`Engine::start`].
    pub fn start_with_clock(
        config: EngineConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Engine, EngineError> {
        if config.mailbox_capacity == 0 {
            return Err(EngineError::ZeroMailboxCapacity);
        }
        let cpus = config.cpumask.cpus().to_vec();
        let mailboxes = Mailboxes::new(cpus.len(), config.mailbox_capacity);
        let mut engine = Engine {
            mailboxes: Arc::clone(&mailboxes),
            cpus: cpus.clone(),
            threads: Vec::with_capacity(cpus.len()),
        };
        for (core, &cpu) in cpus.iter().enumerate() {
            let mb = Arc::clone(&mailboxes);
            let clock = Arc::clone(&clock);
            let cfg = config.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("reactor_{core}"))
                .spawn(move || reactor_main(core, cpu, &cfg, mb, clock));
            match spawned {
                Ok(handle) => engine.threads.push(Some(handle)),
                Err(source) => {
                    // Reactors that never start count as finished, so the running ones do
                    // not wait for them; dropping the engine stops and joins those.
                    for _ in core..cpus.len() {
                        mailboxes.mark_finished();
                    }
                    drop(engine);
                    return Err(EngineError::Spawn { core, cpu, source });
                }
            }
        }
        tracing::info!(cpumask = %config.cpumask, reactors = cpus.len(), "engine started");
        Ok(engine)
    }

    /// Number of reactors.
    pub fn cores(&self) -> usize {
        self.cpus.len()
    }

    /// CPU of each reactor, by reactor index.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
    }

    /// The reactors' mailboxes, for senders on other threads (clone the `Arc`).
    pub fn mailboxes(&self) -> &Arc<Mailboxes> {
        &self.mailboxes
    }

    /// Posts a message to reactor `core` from any thread.
    ///
    /// # Errors
    /// As [`Mailboxes::send`]: a full mailbox gives the message back.
    pub fn send(&self, core: usize, msg: Msg) -> Result<(), SendError> {
        self.mailboxes.send(core, msg)
    }

    /// Counters of reactor `core`, read from outside; `None` for a bad index.
    pub fn stats(&self, core: usize) -> Option<StatsSnapshot> {
        (core < self.cores()).then(|| self.mailboxes.mailbox(core).stats.snapshot())
    }

    /// Stops every reactor as the [module doc](self) describes and joins the threads.
    ///
    /// # Errors
    /// [`EngineError::ReactorPanicked`] for the first reactor whose thread panicked (all
    /// threads are joined regardless).
    pub fn shutdown(mut self) -> Result<Vec<ReactorReport>, EngineError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<Vec<ReactorReport>, EngineError> {
        self.mailboxes.stop_all();
        let mut reports = Vec::with_capacity(self.threads.len());
        let mut first_err = None;
        for (core, slot) in self.threads.iter_mut().enumerate() {
            let Some(handle) = slot.take() else {
                continue;
            };
            match handle.join() {
                Ok(r) => reports.push(r),
                Err(_) => {
                    tracing::error!(core, cpu = self.cpus[core], "reactor thread panicked");
                    first_err.get_or_insert(EngineError::ReactorPanicked {
                        core,
                        cpu: self.cpus[core],
                    });
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(reports),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if self.threads.iter().any(Option::is_some) {
            let _ = self.stop_and_join();
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("cpus", &self.cpus).finish()
    }
}

/// Marks the reactor finished even if its thread unwinds, so peers waiting in the last
/// shutdown phase are not held until their timeout.
struct FinishGuard {
    mailboxes: Arc<Mailboxes>,
    done: bool,
}

impl FinishGuard {
    fn finish(&mut self) {
        if !self.done {
            self.done = true;
            self.mailboxes.mark_finished();
        }
    }
}

impl Drop for FinishGuard {
    fn drop(&mut self) {
        self.finish();
    }
}

fn reactor_main(
    core: usize,
    cpu: usize,
    cfg: &EngineConfig,
    mailboxes: Arc<Mailboxes>,
    clock: Arc<dyn Clock>,
) -> ReactorReport {
    mailboxes.bind_thread(core);
    let mut guard = FinishGuard {
        mailboxes: Arc::clone(&mailboxes),
        done: false,
    };
    let pinned = cfg.pin && core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
    if cfg.pin && !pinned {
        tracing::warn!(
            core,
            cpu,
            "could not pin reactor thread to its CPU; running unpinned"
        );
    }
    let mut reactor = Reactor::new(core, Arc::clone(&mailboxes), Arc::clone(&clock));
    let mut idle = IdleState::new(cfg.idle);

    while !mailboxes.stop_requested(core) {
        let r = reactor.run_once();
        idle.after_loop(r, &reactor, &mailboxes);
    }

    tracing::debug!(core, "reactor stopping: draining");
    reactor.begin_shutdown();
    let timeout = duration_ns(cfg.drain_timeout);
    let limit = clock.now_ns().saturating_add(timeout);
    let mut quiet = 0u32;
    let drained = loop {
        let r = reactor.run_once();
        quiet = if r.is_busy() { 0 } else { quiet + 1 };
        if quiet >= cfg.drain_idle_loops.max(1) {
            break true;
        }
        if clock.now_ns() >= limit {
            tracing::warn!(core, "reactor drain timed out; dropping outstanding work");
            break false;
        }
        idle.after_loop(r, &reactor, &mailboxes);
    };
    guard.finish();

    let limit = clock.now_ns().saturating_add(timeout);
    while !mailboxes.all_finished() && clock.now_ns() < limit {
        let r = reactor.run_once();
        idle.after_loop(r, &reactor, &mailboxes);
    }

    let stats = reactor.stats();
    let dropped = reactor.close();
    tracing::debug!(core, ?dropped, "reactor closed");
    ReactorReport {
        core,
        cpu,
        pinned,
        drained,
        dropped,
        stats,
    }
}
