//! Reactors, pollers, timers and cross-core mailboxes: *when* code runs, never *what*.
//!
//! RTRS work is a set of pollers — a connection's CQ poller, a path's heartbeat timer, a
//! reconnect timer, the CM event poller — plus messages between cores. In the kernel
//! these are interrupt-driven CQ handlers, `delayed_work` and per-CPU queues; in SPDK
//! they are `spdk_poller`s, timed pollers and `spdk_thread_send_msg`. This module gives
//! them one shape that two drivers can run.
//!
//! # Pollers do not know their driver
//! A [`Poller`] gets a `&mut dyn` [`Ctx`] and nothing else from the driver:
//! [`now`](Ctx::now) (monotonic ns from the driver's [`Clock`]), [`core`](Ctx::core),
//! [`send`](Ctx::send) a [`Msg`] to another core, [`register`](Ctx::register) /
//! [`register_timer`](Ctx::register_timer) / [`unregister`](Ctx::unregister) pollers and
//! timers. It returns [`PollResult::Busy`] or [`PollResult::Idle`]. Timed pollers
//! (heartbeats, reconnect delays) are first-class: a [`Timer`] (one-shot or periodic) plus
//! a poller; cancelling is unregistering. Closures are pollers too, and
//! `ctx.defer`, `ctx.after`, `ctx.every` (on `dyn Ctx`) wrap closures.
//!
//! [`Ctx`] *is* the driver-side interface: each driver implements it once.
//! - **Our reactors** ([`Reactor`], in [`reactor`]): a [`Reactor`] owns a slab of pollers, a
//!   deadline heap of timers and a bounded mailbox; [`Reactor::run_once`] runs waiting
//!   messages, polls every poller once and fires due timers. [`Engine`] runs one reactor
//!   per core of a [`CpuMask`] on a pinned thread ([`threads`]); [`Simulation`] steps
//!   several reactors by hand on one thread with a [`VirtualClock`] ([`sim`]).
//! - **SPDK** (`crate::spdk::driver`, which the plugin runs on): an adapter implements
//!   [`Ctx`] over the current `spdk_thread`, with no threads of ours:
//!
//! | here | SPDK |
//! |---|---|
//! | [`Ctx::register`] | `spdk_poller_register(trampoline, boxed poller, 0)` |
//! | [`Ctx::register_timer`] | `spdk_poller_register(trampoline, boxed poller, period_us)`; a one-shot timer's trampoline unregisters it after its first run |
//! | [`Ctx::unregister`] | `spdk_poller_unregister` (deferred if it is the running poller) |
//! | [`Ctx::send`] | `spdk_thread_send_msg(thread_of(core), trampoline, msg)`; `-ENOMEM` becomes [`SendError::Full`] |
//! | [`Ctx::now`] | `spdk_get_ticks()` scaled by `spdk_get_ticks_hz()` |
//! | [`Ctx::core`] | index of the current SPDK thread among the app's reactors |
//! | [`PollResult`] | `SPDK_POLLER_BUSY` / `SPDK_POLLER_IDLE` |
//! | [`Poller::shutdown`] | called from the IO channel's destroy / module fini |
//!
//! # Invariants
//! - A poller lives on one reactor for its whole life and is only called by it; a
//!   connection's CQ is polled by exactly one reactor. Other cores reach it by message.
//!   Pollers may therefore use `Rc`/`RefCell` and need not be `Send`.
//! - Nothing blocks a reactor; pollers never sleep or wait.
//! - The hot path takes no lock and allocates nothing when there is nothing to do. The
//!   mailbox (a crossbeam [`ArrayQueue`](crossbeam_queue::ArrayQueue) per reactor, with
//!   the reactor's stop flag and counters) is the only structure shared across threads.
//! - A full mailbox is backpressure, not loss: [`Ctx::send`] returns the message in
//!   [`SendError::Full`]; the sender keeps it and retries later.
//! - [`Msg::call`] (function + `u64`) never allocates; [`Msg::new`] boxes a closure (one
//!   allocation unless it captures nothing).
//!
//! # Idle and shutdown
//! Reactor threads busy-poll by default; [`IdleStrategy::Adaptive`] sleeps with backoff
//! after a run of idle loops, woken early by messages and bounded by the next timer.
//! Shutdown calls every poller's [`Poller::shutdown`] hook, drains until idle (bounded),
//! then drops what is left: see [`threads`] for the exact sequence.

mod clock;
mod cpumask;
mod error;
mod idle;
mod mailbox;
mod poller;
pub mod reactor;
pub mod sim;
mod stats;
mod table;
pub mod threads;

pub use clock::{Clock, MonotonicClock, VirtualClock};
pub use cpumask::{CpuMask, MAX_CPUS};
pub use error::{CpuMaskError, EngineError};
pub use idle::{Adaptive, IdleStrategy, PaceState, PollPace};
pub use mailbox::Mailboxes;
pub use poller::{Ctx, Msg, PollResult, Poller, PollerId, SendError, Timer};
pub use reactor::{Dropped, Reactor};
pub use sim::{SimShutdown, Simulation};
pub use stats::StatsSnapshot;
pub use threads::{Engine, EngineConfig, ReactorReport};
