//! The result: every core's report summed, printed as text or as one JSON object.

use std::fmt::Write;

use crate::hist::Hist;
use crate::worker::CoreReport;

/// What the run was (for the header and the JSON object).
#[derive(Debug)]
pub struct RunInfo {
    pub rw: &'static str,
    pub rwmixread: Option<u8>,
    pub bs: u32,
    pub qd: usize,
    pub cores: usize,
    pub active_cores: usize,
    pub cpumask: String,
    pub time_s: f64,
    pub target: String,
    pub paths: Vec<String>,
    pub device: String,
    pub device_size: u64,
    pub region: u64,
    pub policy: &'static str,
    pub verify: bool,
    /// Ended early by SIGINT/SIGTERM.
    pub interrupted: bool,
    /// The session's statistics at the end of the run, as JSON (per path: state,
    /// counters, failovers onto it, reconnects).
    pub client_stats: String,
}

/// The sum of the cores' reports.
#[derive(Debug)]
pub struct Totals {
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub errors: u64,
    pub first_errno: i32,
    pub mismatches: u64,
    pub first_bad: Option<u64>,
    /// The longest core's measured time.
    pub elapsed_s: f64,
    pub hist: Hist,
}

impl Totals {
    pub fn sum(reports: &[CoreReport]) -> Totals {
        let mut t = Totals {
            reads: 0,
            writes: 0,
            bytes: 0,
            errors: 0,
            first_errno: 0,
            mismatches: 0,
            first_bad: None,
            elapsed_s: 0.0,
            hist: Hist::new(),
        };
        for r in reports {
            t.reads += r.reads;
            t.writes += r.writes;
            t.bytes += r.bytes;
            t.errors += r.errors;
            if t.first_errno == 0 {
                t.first_errno = r.first_errno;
            }
            t.mismatches += r.mismatches;
            t.first_bad = match (t.first_bad, r.first_bad) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            t.elapsed_s = t.elapsed_s.max(r.elapsed_ns as f64 / 1e9);
            t.hist.merge(&r.hist);
        }
        t
    }

    pub fn ios(&self) -> u64 {
        self.reads + self.writes
    }

    pub fn iops(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.ios() as f64 / self.elapsed_s
        } else {
            0.0
        }
    }

    pub fn mib_s(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.bytes as f64 / self.elapsed_s / (1024.0 * 1024.0)
        } else {
            0.0
        }
    }

    pub fn failed(&self) -> bool {
        self.errors > 0 || self.mismatches > 0
    }
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

fn errno_text(e: i32) -> String {
    if e == 0 {
        return "-".into();
    }
    std::io::Error::from_raw_os_error(-e).to_string()
}

/// The human-readable result.
pub fn text(info: &RunInfo, t: &Totals) -> String {
    let mut o = String::new();
    let mix = info
        .rwmixread
        .map(|p| format!(" ({p}% reads)"))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "{} {}{mix} qd {} on {} core(s) (cpumask {}), {:.1} s, device {} over {} ({}, {})",
        info.rw,
        crate::shared::human_size(u64::from(info.bs)),
        info.qd,
        info.active_cores,
        info.cpumask,
        t.elapsed_s,
        info.device,
        info.target,
        info.paths.join(" "),
        info.policy
    );
    let _ = writeln!(
        o,
        "  IOPS {:.0}   {:.2} MiB/s   ios {} (reads {}, writes {})",
        t.iops(),
        t.mib_s(),
        t.ios(),
        t.reads,
        t.writes
    );
    let h = &t.hist;
    let _ = writeln!(
        o,
        "  latency (us): avg {:.1}   p50 {:.1}   p99 {:.1}   p99.9 {:.1}   max {:.1}",
        h.mean() / 1000.0,
        us(h.quantile(0.50)),
        us(h.quantile(0.99)),
        us(h.quantile(0.999)),
        us(h.max())
    );
    let _ = write!(o, "  errors {}", t.errors);
    if t.errors > 0 {
        let _ = write!(o, " (first: {})", errno_text(t.first_errno));
    }
    if info.verify {
        let _ = write!(o, "   verify mismatches {}", t.mismatches);
        if let Some(b) = t.first_bad {
            let _ = write!(o, " (first bad offset {b})");
        }
    }
    o.push('\n');
    o
}

fn jstr(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The same as one JSON object on one line.
pub fn json(info: &RunInfo, t: &Totals) -> String {
    let h = &t.hist;
    let paths: Vec<String> = info.paths.iter().map(|p| jstr(p)).collect();
    let mix = info
        .rwmixread
        .map_or_else(|| "null".to_string(), |p| p.to_string());
    let first_bad = t
        .first_bad
        .map_or_else(|| "null".to_string(), |b| b.to_string());
    format!(
        "{{\"rw\":{},\"rwmixread\":{mix},\"bs\":{},\"qd\":{},\"cores\":{},\"active_cores\":{},\
         \"cpumask\":{},\"target\":{},\"paths\":[{}],\"device\":{},\"device_size\":{},\
         \"region\":{},\"policy\":{},\"time_s\":{:.3},\"requested_time_s\":{:.3},\"ios\":{},\
         \"reads\":{},\"writes\":{},\"bytes\":{},\"iops\":{:.1},\"mib_s\":{:.3},\
         \"lat_avg_us\":{:.3},\"lat_p50_us\":{:.3},\"lat_p99_us\":{:.3},\"lat_p999_us\":{:.3},\
         \"lat_max_us\":{:.3},\"errors\":{},\"first_errno\":{},\"verify\":{},\
         \"verify_mismatches\":{},\"first_bad_offset\":{first_bad},\"interrupted\":{},\
         \"client_stats\":{}}}",
        jstr(info.rw),
        info.bs,
        info.qd,
        info.cores,
        info.active_cores,
        jstr(&info.cpumask),
        jstr(&info.target),
        paths.join(","),
        jstr(&info.device),
        info.device_size,
        info.region,
        jstr(info.policy),
        t.elapsed_s,
        info.time_s,
        t.ios(),
        t.reads,
        t.writes,
        t.bytes,
        t.iops(),
        t.mib_s(),
        h.mean() / 1000.0,
        us(h.quantile(0.50)),
        us(h.quantile(0.99)),
        us(h.quantile(0.999)),
        us(h.max()),
        t.errors,
        t.first_errno,
        info.verify,
        t.mismatches,
        info.interrupted,
        info.client_stats,
    )
}
