//! What `rtrs-target` and `rtrs-bench` share: fabric URLs, option value parsers (sizes,
//! durations, cpumasks), logging set-up, the one-line error exit and starting an RNBD
//! target on an engine (the standalone counterpart of loading `rnbd_server` with its
//! `rtrs_server` and configuring exports).

pub mod control;
pub mod target;
pub mod url;

use std::fmt::Display;
use std::process::ExitCode;
use std::time::Duration;

use crate::engine::{Adaptive, CpuMask, EngineConfig, IdleStrategy};
use crate::rnbd::backend::parse_size;

/// Exit code for bad arguments (as clap uses).
pub const EXIT_USAGE: u8 = 2;
/// Exit code for a failed run (unreachable target, IO errors, verify mismatches).
pub const EXIT_FAILED: u8 = 1;

/// Prints `prog: msg` as one line on stderr and gives `code`.
pub fn fail(prog: &str, msg: impl Display, code: u8) -> ExitCode {
    eprintln!("{prog}: {msg}");
    ExitCode::from(code)
}

/// Parses arguments with clap; a usage error becomes one line on stderr (the first of
/// clap's message) and exit code 2; `--help` / `--version` print as usual.
pub fn parse_args<T: clap::Parser>(prog: &str) -> Result<T, ExitCode> {
    parse_args_from(prog, std::env::args_os())
}

/// As [`parse_args`], from `args` (the first being the program's name).
pub fn parse_args_from<T, I>(prog: &str, args: I) -> Result<T, ExitCode>
where
    T: clap::Parser,
    I: IntoIterator,
    I::Item: Into<std::ffi::OsString> + Clone,
{
    match T::try_parse_from(args) {
        Ok(a) => Ok(a),
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return Err(ExitCode::SUCCESS);
            }
            let text = e.render().to_string();
            let mut lines = text.lines();
            let first = lines.next().unwrap_or("bad arguments");
            let mut line = first.strip_prefix("error: ").unwrap_or(first).to_string();
            // "...not provided:" is followed by the missing options, one per indented line.
            if line.ends_with(':') {
                let more: Vec<&str> = lines
                    .take_while(|l| l.starts_with(' '))
                    .map(str::trim)
                    .collect();
                line.push(' ');
                line.push_str(&more.join(", "));
            }
            Err(fail(prog, format!("{line} (see --help)"), EXIT_USAGE))
        }
    }
}

/// `--psk-file`: a key file (at least 32 random bytes as hex or base64, readable by its
/// owner only); the error names the file and what is wrong, never the key.
pub fn psk_file_arg(s: &str) -> Result<crate::fabric::Psk, String> {
    crate::fabric::Psk::from_file(std::path::Path::new(s)).map_err(|e| e.to_string())
}

/// `-m/--cpumask`: a hex mask (`0x3`) or a list (`[0-1]`, `0,1`), SPDK's convention.
pub fn cpumask_arg(s: &str) -> Result<CpuMask, String> {
    CpuMask::parse(s).map_err(|e| e.to_string())
}

/// A byte count with an optional binary unit (`4096`, `4K`, `128KiB`, `1G`).
pub fn size_arg(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Some(0) => Err(format!("size {s:?} must not be zero")),
        Some(n) => Ok(n),
        None => Err(format!(
            "bad size {s:?}: digits with an optional unit K, M, G or T (e.g. 4K, 128K, 1G)"
        )),
    }
}

/// A duration: digits with a unit `ms`, `s`, `m` or `h` (`500ms`, `10s`, `1m`); bare
/// digits are seconds.
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    let bad = || format!("bad duration {s:?}: digits with a unit ms, s, m or h (e.g. 500ms, 10s)");
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(end);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" | "min" => Duration::from_secs(n.checked_mul(60).ok_or_else(bad)?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(bad)?),
        _ => return Err(bad()),
    };
    if d.is_zero() {
        return Err(format!("duration {s:?} must not be zero"));
    }
    Ok(d)
}

/// `--heartbeat-missed`: at least 1.
pub fn missed_arg(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("bad count {s:?}: a whole number of at least 1")),
    }
}

/// The heartbeat configuration of `--heartbeat` and `--heartbeat-missed`.
pub fn hb_config(interval: Duration, missed: u32) -> crate::common::HbConfig {
    crate::common::HbConfig {
        interval,
        missed_max: missed,
    }
}

/// How reactors wait when idle (`--idle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Idle {
    /// Busy-poll (SPDK's way; one core at 100 % per reactor).
    Busy,
    /// Sleep with backoff after a run of idle loops (for shared machines and tests).
    Adaptive,
}

/// The engine configuration for a cpumask (default: every online CPU) and idle mode.
pub fn engine_config(mask: Option<CpuMask>, idle: Idle) -> Result<EngineConfig, String> {
    let mask = match mask {
        Some(m) => m,
        None => {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            let cpus: Vec<usize> = (0..n).collect();
            CpuMask::from_cpus(&cpus).map_err(|e| e.to_string())?
        }
    };
    let mut cfg = EngineConfig::new(mask);
    if idle == Idle::Adaptive {
        cfg.idle = IdleStrategy::Adaptive(Adaptive::default());
    }
    cfg.drain_timeout = Duration::from_secs(2);
    Ok(cfg)
}

/// Logs to stderr with tracing: `RUST_LOG` when set, else `default` raised by each `-v`
/// (warn → info → debug → trace); coloured only when stderr is a terminal.
pub fn init_logging(default: tracing::Level, verbose: u8) {
    use tracing::Level;
    let levels = [
        Level::ERROR,
        Level::WARN,
        Level::INFO,
        Level::DEBUG,
        Level::TRACE,
    ];
    let base = levels.iter().position(|l| *l == default).unwrap_or(1);
    let level = levels[(base + usize::from(verbose)).min(levels.len() - 1)];
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level.as_str()));
    // Colours only on a terminal: a log redirected to a file stays plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .try_init();
}

/// `1 GiB`, `512 MiB`, `4 KiB`, `1000 B`: the largest binary unit that divides `n`.
pub fn human_size(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n;
    let mut u = 0;
    while u + 1 < UNITS.len() && v >= 1024 && v % 1024 == 0 {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes() {
        assert_eq!(duration_arg("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration_arg("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(duration_arg("3"), Ok(Duration::from_secs(3)));
        assert_eq!(duration_arg("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(duration_arg("1h"), Ok(Duration::from_secs(3600)));
        for bad in ["", "s", "1.5s", "10 s", "10parsecs", "-1s"] {
            assert!(
                duration_arg(bad).unwrap_err().contains("bad duration"),
                "{bad}"
            );
        }
        assert!(duration_arg("0ms").unwrap_err().contains("zero"));
        assert_eq!(size_arg("128K"), Ok(128 << 10));
        assert!(size_arg("0").unwrap_err().contains("zero"));
        assert!(size_arg("4Q").unwrap_err().contains("bad size"));
        assert_eq!(human_size(1 << 30), "1 GiB");
        assert_eq!(human_size(1000), "1000 B");
        assert_eq!(human_size(3 << 19), "1536 KiB");
    }
}
