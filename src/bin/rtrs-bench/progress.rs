//! The main thread while the reactors run: a live progress line once a second on stderr
//! when it is a terminal (`\r`, overwritten in place, erased at the end), and a stall
//! watchdog (no IO completing for a minute, or for `--io-wait-timeout` plus 30 s if that
//! is longer, ends the run with an error).

use std::io::{IsTerminal, Write};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::worker::Live;

/// A run with no IO completing for this long is aborted (at least).
pub const STALL: Duration = Duration::from_secs(60);

pub struct Progress {
    tty: bool,
    stall: Duration,
    label: &'static str,
    begun: Instant,
    last_print: Instant,
    printed: (u64, u64),
    last_seen: u64,
    last_change: Instant,
}

fn sum(lives: &[std::sync::Arc<Live>], f: fn(&Live) -> u64) -> u64 {
    lives.iter().map(|l| f(l)).sum()
}

impl Progress {
    /// `stall`: how long without any IO completing aborts the run.
    pub fn new(label: &'static str, stall: Duration) -> Progress {
        let now = Instant::now();
        Progress {
            tty: std::io::stderr().is_terminal(),
            stall,
            label,
            begun: now,
            last_print: now,
            printed: (0, 0),
            last_seen: u64::MAX,
            last_change: now,
        }
    }

    /// Looks at the counters: prints the line when due.
    ///
    /// # Errors
    /// When nothing completed for the stall time.
    pub fn tick(&mut self, lives: &[std::sync::Arc<Live>]) -> Result<(), String> {
        let ios = sum(lives, |l| l.ios.load(Ordering::Relaxed));
        let bytes = sum(lives, |l| l.bytes.load(Ordering::Relaxed));
        let errors = sum(lives, |l| l.errors.load(Ordering::Relaxed));
        let seen = ios + errors + sum(lives, |l| l.untimed.load(Ordering::Relaxed));
        let now = Instant::now();
        if seen != self.last_seen {
            self.last_seen = seen;
            self.last_change = now;
        } else if now - self.last_change > self.stall {
            self.clear();
            return Err(format!("no IO completed for {} s", self.stall.as_secs()));
        }
        if self.tty && now - self.last_print >= Duration::from_secs(1) {
            let dt = (now - self.last_print).as_secs_f64();
            let (n0, b0) = self.printed;
            self.last_print = now;
            self.printed = (ios, bytes);
            eprint!(
                "\r\x1b[K[{:>4.0}s] {} {:>9.0} IOPS {:>9.2} MiB/s  errors {errors}",
                (now - self.begun).as_secs_f64(),
                self.label,
                (ios - n0) as f64 / dt,
                (bytes - b0) as f64 / dt / (1024.0 * 1024.0)
            );
            let _ = std::io::stderr().flush();
        }
        Ok(())
    }

    /// Erases the line (on a terminal).
    pub fn clear(&self) {
        if self.tty {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
        }
    }
}
