//! Errors of the engine: cpumask parsing, reactor start-up and shutdown.
//!
//! SPDK reports the same situations from `spdk_cpuset_parse` (a bad `-m` mask) and from
//! `spdk_reactors_start` (a reactor that cannot start); here each has its own variant
//! naming the failing value or call.

use std::io;

/// Why a cpumask string was refused by [`CpuMask::parse`](super::CpuMask::parse).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CpuMaskError {
    /// The string was empty (or only whitespace / brackets).
    #[error("cpumask is empty: give a hex mask such as \"0x3\" or a list such as \"[0-1]\"")]
    Empty,
    /// A hex mask contained something that is not a hex digit.
    #[error("cpumask {input:?}: {bad:?} is not a hex digit (hex masks look like \"0x3\")")]
    BadHexDigit {
        /// The whole mask as given.
        input: String,
        /// The offending character.
        bad: char,
    },
    /// A list element was not a CPU number or a `low-high` range.
    #[error("cpumask {input:?}: element {element:?} is not a CPU number or a low-high range")]
    BadElement {
        /// The whole mask as given.
        input: String,
        /// The offending element.
        element: String,
    },
    /// A range had its low end above its high end.
    #[error("cpumask {input:?}: range {low}-{high} is reversed (write {high}-{low})")]
    ReversedRange {
        /// The whole mask as given.
        input: String,
        /// Low end as written.
        low: usize,
        /// High end as written.
        high: usize,
    },
    /// A CPU number at or above [`MAX_CPUS`](super::cpumask::MAX_CPUS).
    #[error("cpumask {input:?}: CPU {cpu} is out of range (CPUs are numbered 0..{max})")]
    CpuOutOfRange {
        /// The whole mask as given.
        input: String,
        /// The CPU number.
        cpu: usize,
        /// The exclusive upper bound.
        max: usize,
    },
    /// The mask parsed but selects no CPU (for example "0x0").
    #[error("cpumask {input:?} selects no CPU: at least one reactor is needed")]
    NoCpu {
        /// The whole mask as given.
        input: String,
    },
}

/// Errors of [`Engine`](super::Engine) start-up and shutdown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The configured mailbox capacity was zero.
    #[error("engine config: mailbox_capacity must be at least 1 (got 0)")]
    ZeroMailboxCapacity,
    /// `std::thread::Builder::spawn` failed for a reactor thread.
    #[error("starting reactor {core} (cpu {cpu}): spawning its thread failed: {source}")]
    Spawn {
        /// Reactor index.
        core: usize,
        /// CPU it was meant for.
        cpu: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A reactor thread panicked (a poller or message panicked); the others were joined.
    #[error("reactor {core} (cpu {cpu}) panicked; see the panic message above")]
    ReactorPanicked {
        /// Reactor index.
        core: usize,
        /// CPU it ran on.
        cpu: usize,
    },
}
