//! `rtrs-target --control-socket` steered with `rtrs-target ctl` while a real `rtrs-bench`
//! runs against it on 127.0.0.1: the export's opener is listed (session, access mode,
//! paths, since when); one path disconnected and then the whole session disconnected
//! come back by themselves, the verified run ending without an error; bad input names
//! what is wrong and changes nothing; a forced close of the mapping makes the bench's IO
//! fail (it says the target closed the device) and frees the export's one writer slot
//! for another client at once. Every wait is bounded; nothing is timed.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::cli_util;

use cli_util::{one_error_line, run, start_target, Kid, TargetProc, BENCH, LIMIT, TARGET};
use serde_json::Value;

/// A socket path of this test's own.
fn socket(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rtrs-ctl-{}-{tag}.sock", std::process::id()))
}

/// `rtrs-target ctl --socket S ARGS...`: the JSON it printed, or its one error line.
fn ctl(sock: &Path, args: &[&str]) -> Result<Value, String> {
    let mut a = vec!["ctl", "--socket", sock.to_str().unwrap()];
    a.extend_from_slice(args);
    let out = run(TARGET, &a);
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).expect("ctl prints JSON"))
    } else {
        Err(one_error_line(&out))
    }
}

/// A running bench: its stderr collected, its stdout at its end.
struct Bench {
    kid: Kid,
    log: Arc<Mutex<String>>,
    out: mpsc::Receiver<String>,
}

fn spawn_bench(args: &[&str]) -> Bench {
    let mut child = Command::new(BENCH)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rtrs-bench");
    let mut so = child.stdout.take().expect("stdout");
    let se = child.stderr.take().expect("stderr");
    let log = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&log);
    thread::spawn(move || {
        let mut r = BufReader::new(se);
        let mut line = String::new();
        while r.read_line(&mut line).is_ok_and(|n| n > 0) {
            sink.lock().unwrap().push_str(&line);
            line.clear();
        }
    });
    let (tx, out) = mpsc::channel();
    thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    Bench {
        kid: Kid(Some(child)),
        log,
        out,
    }
}

impl Bench {
    fn running(&mut self) -> bool {
        let c = self.kid.0.as_mut().expect("bench");
        matches!(c.try_wait(), Ok(None))
    }
}

/// Polls `f` (every 50 ms, at most [`LIMIT`]) until it gives `Some`; `what` names the
/// wait in the failure.
fn wait_for<T>(what: &str, bench: &mut Bench, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            bench.running(),
            "the bench ended while waiting for {what}; its log:\n{}",
            bench.log.lock().unwrap()
        );
        assert!(start.elapsed() < LIMIT, "no {what} within {LIMIT:?}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// The openers of `vol` by session `sess`.
fn openers(sock: &Path, sess: &str) -> Vec<Value> {
    let v = ctl(sock, &["openers", "--export", "vol"]).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|o| o["sessname"] == sess)
        .cloned()
        .collect()
}

/// The connected paths' addresses of `sess`'s one opener of `vol` (empty if none).
fn connected(sock: &Path, sess: &str) -> Vec<String> {
    openers(sock, sess)
        .first()
        .map(|o| {
            o["paths"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["state"] == "connected")
                .map(|p| p["addr"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn target(sock: &Path) -> TargetProc {
    let _ = std::fs::remove_file(sock);
    start_target(
        &["vol=ram:16M"],
        &[
            "--listen",
            "tcp://127.0.0.1:0",
            "--control-socket",
            sock.to_str().unwrap(),
        ],
    )
}

fn bench_args<'a>(t: &TargetProc, sess: &'a str, time: &'a str, paths: usize) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    for p in t.ports.iter().take(paths) {
        a.extend(["--path".into(), format!("tcp://127.0.0.1:{p}")]);
    }
    for s in [
        "--device",
        "vol",
        "--sessname",
        sess,
        "--rw",
        "randrw",
        "--bs",
        "4K",
        "--qd",
        "8",
        "--size",
        "8M",
        "--time",
        time,
        "--verify",
        "--reconnect-delay",
        "200ms",
        "--idle",
        "adaptive",
        "-m",
        "0x2",
        "--json",
    ] {
        a.push(s.into());
    }
    a
}

#[test]
fn openers_and_disconnects_under_a_verified_run() {
    let sock = socket("disc");
    let t = target(&sock);
    assert_eq!(t.ports.len(), 2, "two listeners: {}", t.ready);
    let mode = std::fs::metadata(&sock).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let args = bench_args(&t, "ctl-host", "40s", 2);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut b = spawn_bench(&args);

    // The opener, with both paths.
    let paths = wait_for("both paths listed", &mut b, || {
        let c = connected(&sock, "ctl-host");
        (c.len() == 2).then_some(c)
    });
    let o = &openers(&sock, "ctl-host")[0];
    assert_eq!(
        (&o["export"], &o["access_mode"], &o["transport"]),
        (&Value::from("vol"), &Value::from("rw"), &Value::from("tcp"))
    );
    let opened = o["opened_at"].as_u64().unwrap();
    assert!(
        opened + 5 >= before,
        "opened_at {opened} before the run ({before})"
    );
    for p in &t.ports {
        assert!(
            paths
                .iter()
                .any(|a| a.ends_with(&format!("@127.0.0.1:{p}"))),
            "{paths:?}"
        );
    }

    // Bad input: named, and nothing changes.
    let e = ctl(&sock, &["disconnect", "ctl-host", "1.2.3.4:5"]).unwrap_err();
    assert!(
        e.contains("'path' = \"1.2.3.4:5\"") && e.contains("no such path"),
        "{e}"
    );
    let e = ctl(&sock, &["disconnect", "nobody"]).unwrap_err();
    assert!(
        e.contains("'sessname' = \"nobody\": no such session"),
        "{e}"
    );
    let e = ctl(&sock, &["force-close", "nope", "ctl-host"]).unwrap_err();
    assert!(
        e.contains("'export_name' = \"nope\": no such export"),
        "{e}"
    );
    let e = ctl(&sock, &["openers", "--export", "nope"]).unwrap_err();
    assert!(e.contains("no such export"), "{e}");
    assert_eq!(connected(&sock, "ctl-host"), paths);

    // One path disconnected: it comes back (a new connection, so a new client port).
    let gone = paths[1].clone();
    assert_eq!(ctl(&sock, &["disconnect", "ctl-host", &gone]).unwrap(), 1);
    wait_for("the disconnected path back", &mut b, || {
        let c = connected(&sock, "ctl-host");
        (c.len() == 2 && !c.contains(&gone)).then_some(())
    });

    // The whole session disconnected: the bench reconnects and opens the device again.
    assert_eq!(ctl(&sock, &["disconnect", "ctl-host"]).unwrap(), 2);
    let old: Vec<String> = connected(&sock, "ctl-host");
    wait_for("the session back", &mut b, || {
        let c = connected(&sock, "ctl-host");
        (c.len() == 2 && c.iter().all(|a| !old.contains(a))).then_some(())
    });
    let s = ctl(&sock, &["sessions"]).unwrap();
    assert!(s.to_string().contains("ctl-host"), "{s}");

    // The verified run ends without an error.
    let st = b.kid.wait(LIMIT);
    let out = b.out.recv_timeout(LIMIT).unwrap();
    let log = b.log.lock().unwrap().clone();
    assert!(st.success(), "bench failed: {out}\n{log}");
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["errors"], 0, "{out}");
    assert_eq!(j["verify_mismatches"], 0, "{out}");
    let _ = std::fs::remove_file(&sock);
}

#[test]
fn a_forced_close_fails_the_clients_io_and_frees_the_writer_slot() {
    let sock = socket("fc");
    let t = target(&sock);
    let args = bench_args(&t, "holder", "60s", 1);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut b = spawn_bench(&args);
    wait_for("the holder's opener", &mut b, || {
        (connected(&sock, "holder").len() == 1).then_some(())
    });

    // While it holds the export read-write, another writer is refused.
    let other = bench_args(&t, "other", "1s", 1);
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    let out = run(BENCH, &other);
    assert!(!out.status.success(), "a second writer was let in");

    let e = ctl(&sock, &["force-close", "vol", "nobody"]).unwrap_err();
    assert!(e.contains("no such session"), "{e}");
    let closed = ctl(&sock, &["force-close", "vol", "holder"]).unwrap();
    let closed = closed.as_array().unwrap();
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert_eq!(closed[0]["sessname"], "holder");
    assert!(openers(&sock, "holder").is_empty());

    // The holder's IO fails: the target closed its device.
    let log = Arc::clone(&b.log);
    wait_for("the bench to see the device closed", &mut b, || {
        log.lock()
            .unwrap()
            .contains("the target closed device 'vol'")
            .then_some(())
    });
    // The writer slot is free at once: another client writes.
    let out = run(BENCH, &other);
    assert!(
        out.status.success(),
        "the freed export refused a new writer: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    b.kid.kill();
    drop(t);
    let _ = std::fs::remove_file(&sock);
}
