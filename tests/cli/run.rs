//! Real runs of the built binaries on 127.0.0.1: `rtrs-target` on core 0 and
//! `rtrs-bench --verify` on core 1 for about a second in every IO pattern, its JSON
//! parsed and checked; two paths to one target; paths bound to a source address
//! (`?src=`) and a `--sessname`, both seen by the target; file exports, read-write and
//! read-only;
//! `--inline-target`; the text output; the target stopping with exit code 0 on SIGTERM
//! and SIGINT; the bench ending early on SIGINT, with its report also when the signal
//! is delivered twice (as `timeout` does). Reactors sleep when idle
//! (`--idle adaptive`) to share the machine. Waits are bounded; nothing is timed.

use crate::cli_util;

use std::process::Command;

use cli_util::{run, start_target, TargetProc, BENCH, LIMIT};
use serde_json::Value;

/// Runs the bench with `args` plus the common test options; returns its JSON result.
fn bench_json(args: &[&str]) -> Value {
    let mut a = vec!["--idle", "adaptive", "--time", "1s", "--json"];
    a.extend_from_slice(args);
    let out = run(BENCH, &a);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{a:?} failed: {stderr}\n{stdout}");
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{a:?}: not one JSON object ({e}): {stdout}"));
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(v["iops"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    assert!(v["mib_s"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    let p50 = v["lat_p50_us"].as_f64().unwrap_or(0.0);
    let p99 = v["lat_p99_us"].as_f64().unwrap_or(0.0);
    let max = v["lat_max_us"].as_f64().unwrap_or(0.0);
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{v}");
    v
}

/// Sends `sig` (a `kill` signal name) and expects a clean exit with code 0.
fn stop_with(mut t: TargetProc, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &t.kid.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success(), "kill -{sig} failed");
    let st = t.kid.wait(LIMIT);
    assert_eq!(st.code(), Some(0), "rtrs-target after SIG{sig}: {st:?}");
}

#[test]
fn tcp_verify_every_pattern_then_sigterm() {
    let t = start_target(&["vol=ram:16M"], &[]);
    let url = format!("tcp://127.0.0.1:{}", t.port);
    for rw in ["read", "write", "randread", "randwrite", "randrw"] {
        let v = bench_json(&[
            "--path", &url, "--device", "vol", "--rw", rw, "--bs", "4K", "--qd", "8", "--verify",
            "-m", "0x2",
        ]);
        assert_eq!(v["rw"], rw);
        assert_eq!(v["verify"], true);
        assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
        assert_eq!(v["bs"].as_u64(), Some(4096));
        assert_eq!(v["qd"].as_u64(), Some(8));
        assert_eq!(v["device"], "vol");
        assert_eq!(v["paths"][0], url.as_str());
        let (reads, writes) = (v["reads"].as_u64().unwrap(), v["writes"].as_u64().unwrap());
        match rw {
            "read" | "randread" => assert_eq!(writes, 0, "{v}"),
            "write" | "randwrite" => assert_eq!(reads, 0, "{v}"),
            _ => assert!(reads > 0 && writes > 0, "{v}"),
        }
    }
    // Larger blocks, always_invalidate on (the default) and a 128 KiB-class IO.
    let v = bench_json(&[
        "--path",
        &url,
        "--device",
        "vol",
        "--rw",
        "randrw",
        "--bs",
        "64K",
        "--qd",
        "4",
        "--verify",
        "--rwmixread",
        "30",
        "-m",
        "0x2",
    ]);
    assert_eq!(v["rwmixread"].as_u64(), Some(30));
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    // Write-zeroes over stamped data, read back as zeros: sent as writes (the default)
    // and as op 5.
    for mode in ["emulate", "native"] {
        let v = bench_json(&[
            "--path",
            &url,
            "--device",
            "vol",
            "--rw",
            "zero",
            "--bs",
            "64K",
            "--qd",
            "4",
            "--size",
            "4M",
            "--warmup-write",
            "--verify",
            "--write-zeroes",
            mode,
            "-m",
            "0x2",
        ]);
        assert_eq!(v["rw"], "zero");
        assert_eq!(v["reads"].as_u64(), Some(0), "{v}");
        assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{mode}: {v}");
    }
    // Discards over stamped data (each sector reads back as its data or zeros), then
    // flushes.
    for rw in ["trim", "flush"] {
        let v = bench_json(&[
            "--path", &url, "--device", "vol", "--rw", rw, "--bs", "64K", "--qd", "4", "--size",
            "4M", "--verify", "-m", "0x2",
        ]);
        assert_eq!(v["rw"], rw);
        assert_eq!(v["reads"].as_u64(), Some(0), "{v}");
        assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{rw}: {v}");
    }
    stop_with(t, "TERM");
}

#[test]
fn two_paths_round_robin_without_always_invalidate_then_sigint() {
    let t = start_target(
        &["vol=ram:8M"],
        &["--listen", "tcp://127.0.0.1:0", "--no-always-invalidate"],
    );
    assert_eq!(t.ports.len(), 2, "{}", t.ready);
    let p0 = format!("tcp://127.0.0.1:{}", t.ports[0]);
    let p1 = format!("tcp://127.0.0.1:{}", t.ports[1]);
    let v = bench_json(&[
        "--path",
        &p0,
        "--path",
        &p1,
        "--device",
        "vol",
        "--rw",
        "randrw",
        "--bs",
        "8K",
        "--qd",
        "16",
        "--verify",
        "--policy",
        "round-robin",
        "-m",
        "0x2",
    ]);
    assert_eq!(v["policy"], "round-robin");
    assert_eq!(v["paths"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    stop_with(t, "INT");
}

#[test]
fn source_addresses_and_session_name_reach_the_target() {
    // `-v`: the target logs each path that connects, with its session name.
    let t = start_target(&["vol=ram:4M"], &["--listen", "tcp://127.0.0.1:0", "-v"]);
    assert_eq!(t.ports.len(), 2, "{}", t.ready);
    let p0 = format!("tcp://127.0.0.1:{}?src=127.0.0.2", t.ports[0]);
    let p1 = format!("tcp://127.0.0.1:{}?src=127.0.0.3", t.ports[1]);
    let v = bench_json(&[
        "--path",
        &p0,
        "--path",
        &p1,
        "--sessname",
        "cli-src-test",
        "--device",
        "vol",
        "--rw",
        "randrw",
        "--qd",
        "4",
        "--verify",
        "-m",
        "0x2",
    ]);
    assert_eq!(v["paths"][0], p0.as_str());
    assert_eq!(v["paths"][1], p1.as_str());
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    for (src, port) in [("127.0.0.2", t.ports[0]), ("127.0.0.3", t.ports[1])] {
        let line = t.wait_log(&[
            "\"cli-src-test\": path ",
            &format!(" {src}:"),
            &format!("@127.0.0.1:{port} connected"),
        ]);
        assert!(!line.contains("127.0.0.1:0"), "{line}");
    }
    t.wait_log(&["session up", "sessname=\"cli-src-test\""]);
    stop_with(t, "TERM");
}

#[test]
fn inline_target_json_and_text() {
    let v = bench_json(&[
        "--inline-target",
        "ram:16M",
        "--rw",
        "randrw",
        "--bs",
        "4K",
        "--qd",
        "8",
        "--verify",
        "-m",
        "0x3",
    ]);
    assert_eq!(v["device"], "bench");
    assert_eq!(v["device_size"].as_u64(), Some(16 << 20));
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    assert!(
        v["target"].as_str().unwrap_or("").starts_with("inline"),
        "{v}"
    );

    // 128 KiB reads fit the inline target's 256 KiB chunks; text output.
    let out = run(
        BENCH,
        &[
            "--idle",
            "adaptive",
            "--time",
            "500ms",
            "--inline-target",
            "ram:8M",
            "--rw",
            "read",
            "--bs",
            "128K",
            "--qd",
            "2",
            "-m",
            "0x1",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for w in ["IOPS", "MiB/s", "p50", "p99", "p99.9", "errors 0"] {
        assert!(text.contains(w), "{w:?} missing from {text}");
    }
}

#[test]
fn bench_sigint_ends_the_run_early_with_code_130() {
    use std::process::Stdio;
    let child = Command::new(BENCH)
        .args([
            "--idle",
            "adaptive",
            "--inline-target",
            "ram:8M",
            "--rw",
            "randread",
            "--time",
            "10m",
            "--json",
            "-m",
            "0x1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rtrs-bench");
    let mut kid = cli_util::Kid(Some(child));
    // Whether the run has begun or not when the signal lands, the answer is code 130.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let st = Command::new("kill")
        .args(["-INT", &kid.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(st.success());
    let child = kid.0.take().expect("child");
    let out = {
        let (tx, rx) = std::sync::mpsc::channel();
        let pid = child.id();
        let waiter = std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = rx.recv_timeout(LIMIT).unwrap_or_else(|_| {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("rtrs-bench did not stop within {LIMIT:?} after SIGINT")
        });
        waiter.join().expect("waiter");
        out.expect("wait")
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !stdout.trim().is_empty() {
        let v: Value = serde_json::from_str(stdout.trim()).expect("JSON");
        assert_eq!(v["interrupted"], true, "{v}");
        assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    }
}

/// `timeout(1)` sends its signal to the bench and then to the bench's process group: one
/// request to stop, seen twice. The run still ends with its report (JSON, `interrupted`),
/// not with the "second signal" exit that reports nothing. The target is stopped
/// (SIGSTOP) meanwhile, so the bench is still draining its IO when the second signal
/// lands, 50 ms after the first; it is continued after that.
#[test]
fn bench_a_signal_delivered_twice_still_reports() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let t = start_target(&["vol=ram:8M"], &[]);
    let url = format!("tcp://127.0.0.1:{}", t.port);
    let child = Command::new(BENCH)
        .args([
            "--idle", "adaptive", "--path", &url, "--device", "vol", "--rw", "randread", "--time",
            "10m", "--json", "-vv", "-m", "0x2",
        ])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rtrs-bench");
    let mut kid = cli_util::Kid(Some(child));
    let child = kid.0.as_mut().expect("child");
    let mut out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    // stderr: the log, read until the timed run has begun, then drained.
    let (tx, rx) = std::sync::mpsc::channel();
    let log = std::thread::spawn(move || {
        let mut r = BufReader::new(err);
        let mut all = String::new();
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            if line.contains("the timed run begins") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            line.clear();
        }
        all
    });
    let begun = rx.recv_timeout(LIMIT).is_ok();
    assert!(begun, "the timed run did not begin within {LIMIT:?}");
    let (pid, tpid) = (kid.pid().to_string(), t.kid.pid().to_string());
    let st = Command::new("sh")
        .args([
            "-c",
            "kill -STOP $2 && kill -INT $1 && sleep 0.05 && kill -INT $1 && sleep 0.2; kill -CONT $2",
            "sh",
            &pid,
            &tpid,
        ])
        .status()
        .expect("run sh");
    assert!(st.success(), "kill failed");
    let status = kid.wait(LIMIT);
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).expect("stdout");
    let stderr = log.join().expect("log reader");
    assert_eq!(status.code(), Some(130), "{stderr}");
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("no JSON report ({e}): {stdout:?}; log:\n{stderr}"));
    assert_eq!(v["interrupted"], true, "{v}");
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
}

#[test]
fn file_exports_read_write_and_read_only() {
    let path = std::env::temp_dir().join(format!("rtrs-cli-test-{}.img", std::process::id()));
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(4 << 20))
        .expect("create the backing file");
    let p = path.display().to_string();
    let (rw, ro) = (format!("f=file:{p}"), format!("r=file:{p}:ro"));
    let t = start_target(&[&rw, &ro], &[]);
    assert!(t.ready.contains("r (file"), "{}", t.ready);
    let url = format!("tcp://127.0.0.1:{}", t.port);
    let v = bench_json(&[
        "--path", &url, "--device", "f", "--rw", "randrw", "--qd", "8", "--verify", "-m", "0x2",
    ]);
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    // Read-only: reads are fine, mapping it for writing is refused with a clear line.
    bench_json(&[
        "--path", &url, "--device", "r", "--rw", "randread", "--qd", "4", "-m", "0x2",
    ]);
    let out = run(
        BENCH,
        &[
            "--idle",
            "adaptive",
            "--path",
            &url,
            "--device",
            "r",
            "--rw",
            "randwrite",
            "--time",
            "1s",
            "-m",
            "0x2",
        ],
    );
    let line = cli_util::one_error_line(&out);
    assert_eq!(out.status.code(), Some(1), "{line}");
    assert!(line.contains("read-only") && line.contains("'r'"), "{line}");
    stop_with(t, "TERM");
    let _ = std::fs::remove_file(&path);
}
