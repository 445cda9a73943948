//! `rtrs-bench` with a path that never connects (a port nobody listens on) beside a good
//! one: the run goes on over the good path and its summary names the missing path with
//! why; after `--max-reconnect-attempts` failed attempts in a row the path is closed,
//! which the JSON's `client_stats.paths[]` shows (`state`, `failure`, counters never
//! below zero); `--require-all-paths` makes that exit code 1, the result still printed.
//! Waits are bounded; nothing is timed.

use crate::cli_util;

use cli_util::{closed_port, run, start_target, BENCH};
use serde_json::Value;

/// The bench against `good` and `bad` (in that order) for 2 s of verified IO, plus
/// `extra`.
fn bench(good: &str, bad: &str, extra: &[&str]) -> std::process::Output {
    let mut a = vec![
        "--path",
        good,
        "--path",
        bad,
        "--device",
        "vol",
        "--rw",
        "randrw",
        "--bs",
        "4K",
        "--qd",
        "4",
        "--size",
        "1M",
        "--time",
        "2s",
        "--verify",
        "--reconnect-delay",
        "100ms",
        "--idle",
        "adaptive",
        "-m",
        "0x2",
    ];
    a.extend_from_slice(extra);
    run(BENCH, &a)
}

#[test]
fn a_path_that_gave_up_fails_the_run_with_require_all_paths() {
    let t = start_target(&["vol=ram:4M"], &[]);
    let good = format!("tcp://127.0.0.1:{}", t.port);
    let bad = format!("tcp://127.0.0.1:{}", closed_port());
    let out = bench(
        &good,
        &bad,
        &[
            "--json",
            "--max-reconnect-attempts",
            "2",
            "--require-all-paths",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}\n{stdout}");
    // The result is printed all the same, and the IO over the good path checked out.
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}\n{stderr}"));
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
    let paths = v["client_stats"]["paths"].as_array().unwrap();
    assert_eq!(paths.len(), 2, "{v}");
    let p = &paths[1];
    assert_eq!(p["state"], "closed", "{v}");
    let failure = p["failure"].as_str().unwrap_or_default();
    assert!(
        failure.starts_with("gave up after 3 failed attempts (max_reconnect_attempts 2): ")
            && failure.contains("Connection refused"),
        "{v}"
    );
    assert_eq!(p["reconnects"]["failed"].as_u64(), Some(3), "{v}");
    assert_eq!(p["reconnects"]["successful"].as_u64(), Some(0), "{v}");
    assert_eq!(paths[0]["state"], "connected", "{v}");
    assert_eq!(
        paths[0]["reconnects"]["successful"].as_u64(),
        Some(0),
        "{v}"
    );
    // stderr: the warning, then why the run failed.
    let warning = format!(
        "warning: 1 of 2 paths not connected at the end: path 2 ({bad}) closed (gave up after 3 \
         failed attempts"
    );
    assert!(stderr.contains(&warning), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("1 of 2 paths not connected at the end (--require-all-paths)"),
        "{stderr}"
    );
    drop(t);
}

#[test]
fn a_path_still_reconnecting_is_named_in_the_summary() {
    let t = start_target(&["vol=ram:4M"], &[]);
    let good = format!("tcp://127.0.0.1:{}", t.port);
    let bad = format!("tcp://127.0.0.1:{}", closed_port());
    // Retried for ever (the default): the run succeeds over the good path and says which
    // path it went without.
    let out = bench(&good, &bad, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{stdout}");
    assert!(
        stdout.contains("errors 0   verify mismatches 0"),
        "{stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("warning:"))
        .unwrap_or_else(|| panic!("no warning in the summary: {stdout}"));
    for w in [
        "warning: 1 of 2 paths not connected at the end: path 2 (",
        &bad,
        "(last error: ",
        "Connection refused",
    ] {
        assert!(line.contains(w), "{line:?} lacks {w:?}");
    }
    assert!(!line.contains(&good), "{line}");
    drop(t);
}

#[test]
fn max_reconnect_attempts_is_checked() {
    for bad in ["-2", "10000", "many"] {
        let out = run(
            BENCH,
            &[
                "--inline-target",
                "ram:1M",
                "--rw",
                "read",
                "--max-reconnect-attempts",
                bad,
            ],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--max-reconnect-attempts"), "{bad}: {err}");
    }
}
