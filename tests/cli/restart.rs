//! The target restarting under load, with the built binaries on 127.0.0.1: `rtrs-bench
//! --verify` runs against a file export of `rtrs-target`, which is killed with SIGKILL
//! and started again on the same address. Back within the wait (`--io-wait-timeout`,
//! 30 s by default) the run ends with no IO error and no verify mismatch, the device
//! re-opened; back only after it, the waiting IO fails, counted as errors with the
//! reason, and the bench exits with code 1. Waits are bounded; nothing is timed.

use crate::cli_util;

use std::path::PathBuf;
use std::process::Output;
use std::thread;
use std::time::{Duration, Instant};

use cli_util::{closed_port, run, start_target_at, BENCH, LIMIT};
use serde_json::Value;

/// A backing file of the export, removed when dropped.
struct Backing(PathBuf);

impl Backing {
    fn new(port: u16) -> Backing {
        let p =
            std::env::temp_dir().join(format!("rtrs-restart-{}-{port}.img", std::process::id()));
        std::fs::File::create(&p)
            .and_then(|f| f.set_len(8 << 20))
            .expect("create the backing file");
        Backing(p)
    }

    fn export(&self) -> String {
        format!("f0=file:{}", self.0.display())
    }
}

impl Drop for Backing {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether a TCP connection to local port `port` is established (the target's side).
fn established(port: u16) -> bool {
    let local = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&local) && cols[3] == "01"
            })
        })
    })
}

/// Runs the bench against the target on `ip`:`port` (a verified random read/write of
/// 4 MiB at queue depth 8 for `time`, plus `extra`) in the background; kills the target
/// once the bench is connected and doing IO, starts it again `down` later, and returns
/// the bench's output. Each test has an address of its own: while the target is down,
/// its port is free, and a listener another test opens on 127.0.0.1 may be given it.
fn bench_through_restart(
    ip: &str,
    port: u16,
    time: &str,
    extra: &[&str],
    down: Duration,
) -> Output {
    let backing = Backing::new(port);
    let listen = format!("tcp://{ip}:{port}");
    let export = backing.export();
    let mut target = start_target_at(&listen, &[&export], &[]);
    let mut args: Vec<String> = [
        "--path", &listen, "--device", "f0", "--rw", "randrw", "--bs", "4K", "--qd", "8",
        "--verify", "--size", "4M", "--time", time, "--json", "-v", "-m", "0x2", "--idle",
        "adaptive",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let bench = thread::spawn(move || {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        run(BENCH, &a)
    });
    let start = Instant::now();
    while !established(port) {
        assert!(start.elapsed() < LIMIT, "the bench never connected");
        assert!(!bench.is_finished(), "the bench ended before connecting");
        thread::sleep(Duration::from_millis(20));
    }
    // Mapped and under load by now.
    thread::sleep(Duration::from_secs(1));
    target.kid.kill();
    thread::sleep(down);
    let _again = start_target_at(&listen, &[&export], &[]);
    bench.join().expect("bench thread")
}

fn json(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn target_back_within_the_wait_loses_no_io() {
    let out = bench_through_restart(
        "127.0.0.61",
        closed_port(),
        "8s",
        &[],
        Duration::from_secs(2),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let v = json(&out);
    assert!(out.status.success(), "{err}\n{v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(
        err.contains("device 'f0' re-opened after a reconnect"),
        "the outage did not happen: {err}"
    );
}

#[test]
fn target_back_after_the_wait_fails_the_waiting_io() {
    let out = bench_through_restart(
        "127.0.0.62",
        closed_port(),
        "6s",
        &["--io-wait-timeout", "2s"],
        Duration::from_secs(4),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    let v = json(&out);
    assert_eq!(out.status.code(), Some(1), "{err}\n{v}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(v["errors"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(
        v["first_errno"].as_i64(),
        Some(-i64::from(libc::ENOTCONN)),
        "{v}"
    );
    let why = "device 'f0' unreachable for 2 s: no connection to the server";
    assert!(
        v["first_error"]
            .as_str()
            .is_some_and(|e| e.starts_with(why)),
        "{v}"
    );
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.starts_with("rtrs-bench: ")
            && last.contains("IO error(s) (first: ")
            && last.contains(why),
        "{err}"
    );
}
