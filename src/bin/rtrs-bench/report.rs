//! The result: every core's report summed, printed as text or as one JSON object.

use std::fmt::Write;

use serde::Serialize;

use rtrs_spdk::client::{ClientStats, PathState};

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
    pub client_stats: serde_json::Value,
    /// The paths not connected at the end of the run, one description each
    /// ([`paths_down`]).
    pub paths_down: Vec<String>,
}

/// The paths of `given` (each as the statistics name it, and as the user gave it) not
/// connected in `stats`, in the order given: `path K (URL) STATE (WHY)`, where WHY is
/// why the path stopped trying (`failure`) or else its latest error.
pub fn paths_down(stats: &ClientStats, given: &[(String, String)]) -> Vec<String> {
    let connected = PathState::Connected.name();
    given
        .iter()
        .enumerate()
        .filter_map(|(k, (name, url))| {
            let Some(p) = stats.paths.iter().find(|p| p.path == *name) else {
                return Some(format!("path {} ({url}) gone", k + 1));
            };
            if p.state == connected {
                return None;
            }
            let why = match (&p.failure, &p.last_error) {
                (Some(f), _) => format!(" ({f})"),
                (None, Some(e)) => format!(" (last error: {e})"),
                (None, None) => String::new(),
            };
            Some(format!("path {} ({url}) {}{why}", k + 1, p.state))
        })
        .collect()
}

/// The warning about paths not connected at the end, if any.
pub fn paths_warning(info: &RunInfo) -> Option<String> {
    if info.paths_down.is_empty() {
        return None;
    }
    Some(format!(
        "warning: {} of {} paths not connected at the end: {}",
        info.paths_down.len(),
        info.paths.len(),
        info.paths_down.join("; ")
    ))
}

/// The sum of the cores' reports.
#[derive(Debug)]
pub struct Totals {
    pub reads: u64,
    pub writes: u64,
    pub bytes: u64,
    pub errors: u64,
    pub first_errno: i32,
    /// The first failure as the client explained it (else the errno's text).
    pub first_error: String,
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
            first_error: String::new(),
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
            if t.first_errno == 0 && r.first_errno != 0 {
                t.first_errno = r.first_errno;
                t.first_error = r
                    .first_error
                    .clone()
                    .unwrap_or_else(|| errno_text(r.first_errno));
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
        crate::cli::human_size(u64::from(info.bs)),
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
        let _ = write!(o, " (first: {})", t.first_error);
    }
    if info.verify {
        let _ = write!(o, "   verify mismatches {}", t.mismatches);
        if let Some(b) = t.first_bad {
            let _ = write!(o, " (first bad offset {b})");
        }
    }
    o.push('\n');
    if let Some(w) = paths_warning(info) {
        let _ = writeln!(o, "  {w}");
    }
    o
}

/// The JSON object, one field per key in output order. Rates and latencies are rounded
/// (IOPS to 0.1, the rest to 0.001) so the line stays short.
#[derive(Debug, Serialize)]
struct JsonReport<'a> {
    rw: &'a str,
    rwmixread: Option<u8>,
    bs: u32,
    qd: usize,
    cores: usize,
    active_cores: usize,
    cpumask: &'a str,
    target: &'a str,
    paths: &'a [String],
    device: &'a str,
    device_size: u64,
    region: u64,
    policy: &'a str,
    time_s: f64,
    requested_time_s: f64,
    ios: u64,
    reads: u64,
    writes: u64,
    bytes: u64,
    iops: f64,
    mib_s: f64,
    lat_avg_us: f64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    lat_p999_us: f64,
    lat_max_us: f64,
    errors: u64,
    first_errno: i32,
    /// `null` unless an IO failed.
    first_error: Option<&'a str>,
    verify: bool,
    verify_mismatches: u64,
    first_bad_offset: Option<u64>,
    interrupted: bool,
    /// The session's statistics at the end of the run (`ClientSession::stats`).
    client_stats: &'a serde_json::Value,
}

/// `x` rounded to `digits` decimals.
fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

/// The same as one JSON object on one line.
pub fn json(info: &RunInfo, t: &Totals) -> String {
    let h = &t.hist;
    let r = JsonReport {
        rw: info.rw,
        rwmixread: info.rwmixread,
        bs: info.bs,
        qd: info.qd,
        cores: info.cores,
        active_cores: info.active_cores,
        cpumask: &info.cpumask,
        target: &info.target,
        paths: &info.paths,
        device: &info.device,
        device_size: info.device_size,
        region: info.region,
        policy: info.policy,
        time_s: round(t.elapsed_s, 3),
        requested_time_s: round(info.time_s, 3),
        ios: t.ios(),
        reads: t.reads,
        writes: t.writes,
        bytes: t.bytes,
        iops: round(t.iops(), 1),
        mib_s: round(t.mib_s(), 3),
        lat_avg_us: round(h.mean() / 1000.0, 3),
        lat_p50_us: round(us(h.quantile(0.50)), 3),
        lat_p99_us: round(us(h.quantile(0.99)), 3),
        lat_p999_us: round(us(h.quantile(0.999)), 3),
        lat_max_us: round(us(h.max()), 3),
        errors: t.errors,
        first_errno: t.first_errno,
        first_error: (t.errors > 0).then_some(t.first_error.as_str()),
        verify: info.verify,
        verify_mismatches: t.mismatches,
        first_bad_offset: t.first_bad,
        interrupted: info.interrupted,
        client_stats: &info.client_stats,
    };
    // Plain fields with string keys: serialising cannot fail.
    serde_json::to_string(&r).expect("the run's report serialises to JSON")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> RunInfo {
        RunInfo {
            rw: "randrw",
            rwmixread: None,
            bs: 4096,
            qd: 8,
            cores: 2,
            active_cores: 1,
            cpumask: "0x2".into(),
            time_s: 2.0,
            target: "tcp://127.0.0.1:1234".into(),
            paths: vec!["127.0.0.1:1234".into()],
            device: "ram0".into(),
            device_size: 1 << 20,
            region: 1 << 20,
            policy: "min-inflight",
            verify: false,
            interrupted: false,
            client_stats: serde_json::Value::Null,
            paths_down: Vec::new(),
        }
    }

    fn totals() -> Totals {
        Totals {
            reads: 3,
            writes: 1,
            bytes: 4 * 4096,
            errors: 0,
            first_errno: 0,
            first_error: String::new(),
            mismatches: 0,
            first_bad: None,
            elapsed_s: 2.000_4,
            hist: Hist::new(),
        }
    }

    /// Pins every key, its order and its JSON type.
    #[test]
    fn json_golden() {
        assert_eq!(
            json(&info(), &totals()),
            "{\"rw\":\"randrw\",\"rwmixread\":null,\"bs\":4096,\"qd\":8,\"cores\":2,\
             \"active_cores\":1,\"cpumask\":\"0x2\",\"target\":\"tcp://127.0.0.1:1234\",\
             \"paths\":[\"127.0.0.1:1234\"],\"device\":\"ram0\",\"device_size\":1048576,\
             \"region\":1048576,\"policy\":\"min-inflight\",\"time_s\":2.0,\
             \"requested_time_s\":2.0,\"ios\":4,\"reads\":3,\"writes\":1,\"bytes\":16384,\
             \"iops\":2.0,\"mib_s\":0.008,\"lat_avg_us\":0.0,\"lat_p50_us\":0.0,\
             \"lat_p99_us\":0.0,\"lat_p999_us\":0.0,\"lat_max_us\":0.0,\"errors\":0,\
             \"first_errno\":0,\"first_error\":null,\"verify\":false,\"verify_mismatches\":0,\
             \"first_bad_offset\":null,\"interrupted\":false,\"client_stats\":null}"
        );
    }

    /// Optional values are numbers or strings when set; every string survives escaping.
    #[test]
    fn json_set_options_and_escapes() {
        let mut i = info();
        i.rwmixread = Some(70);
        i.verify = true;
        i.device = "dev\"\\\n\u{1}é".into();
        i.paths.push("a\\b\"c".into());
        let mut t = totals();
        t.hist.record(1_000);
        t.errors = 2;
        t.first_errno = -5;
        t.first_error = "path \"x\\y\": broken\tpipe".into();
        t.mismatches = 1;
        t.first_bad = Some(8192);
        let s = json(&i, &t);
        let v: serde_json::Value = serde_json::from_str(&s).expect(&s);
        assert_eq!(v["rwmixread"], 70);
        assert_eq!(v["device"], i.device.as_str());
        assert_eq!(v["paths"][1], "a\\b\"c");
        assert_eq!(v["first_error"], t.first_error.as_str());
        assert_eq!(v["first_errno"], -5);
        assert_eq!(v["verify"], true);
        assert_eq!(v["verify_mismatches"], 1);
        assert_eq!(v["first_bad_offset"], 8192);
        assert!(v["lat_max_us"].as_f64().is_some_and(|x| x > 0.0), "{s}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(34), "{s}");
    }

    /// A path not connected at the end is named in the text summary with why; a
    /// connected one is not; the JSON keeps its keys.
    #[test]
    fn paths_not_connected_are_named_with_why() {
        use rtrs_spdk::client::stats::ClientPathStats;
        let path =
            |name: &str, state: &str, failure: Option<&str>, last: Option<&str>| ClientPathStats {
                path: name.into(),
                state: state.into(),
                failure: failure.map(Into::into),
                last_error: last.map(Into::into),
                ..ClientPathStats::default()
            };
        let stats = ClientStats {
            sessname: "s".into(),
            mp_policy: "min-inflight".into(),
            paths: vec![
                path("127.0.0.1:1", "connected", None, None),
                path(
                    "127.0.0.2:2",
                    "closed",
                    Some("gave up after 3 failed attempts (max_reconnect_attempts 2): refused"),
                    Some("refused"),
                ),
                path("127.0.0.3:3", "reconnecting", None, Some("cid 0: reset")),
            ],
        };
        let given: Vec<(String, String)> = ["127.0.0.1:1", "127.0.0.2:2", "127.0.0.3:3"]
            .iter()
            .map(|a| (a.to_string(), format!("tcp://{a}")))
            .collect();
        let down = paths_down(&stats, &given);
        assert_eq!(
            down,
            [
                "path 2 (tcp://127.0.0.2:2) closed (gave up after 3 failed attempts \
                 (max_reconnect_attempts 2): refused)",
                "path 3 (tcp://127.0.0.3:3) reconnecting (last error: cid 0: reset)",
            ]
        );
        let mut i = info();
        i.paths = given.iter().map(|g| g.1.clone()).collect();
        i.paths_down = down;
        let t = text(&i, &totals());
        assert!(
            t.contains("warning: 2 of 3 paths not connected at the end: path 2 (tcp://127.0.0.2:2) closed (gave up after 3"),
            "{t}"
        );
        assert!(!text(&info(), &totals()).contains("warning"));
        let v: serde_json::Value = serde_json::from_str(&json(&i, &totals())).unwrap();
        assert_eq!(v.as_object().map(|o| o.len()), Some(34));
    }
}
