//! No path lost for good at bring-up, under faults made by the operating system: the
//! built `rtrs-target` listening on 127.0.0.1 and 127.0.0.2, and `rtrs-bench --verify
//! --require-all-paths` over both paths. One path (127.0.0.2) is held at a step of the
//! session's bring-up by an `nft` rule that drops what the client sends there at that
//! step, matched on the tcp fabric's frames (`docs/tcp-fabric.md`: a 40-byte header,
//! the opcode at byte 5; a CM payload's private data from byte 48, the RTRS conn_req's
//! cid at byte 54 of it; an RTRS READ request's data starts with the RNBD header, its
//! type first). Once the rule has dropped something, every socket of the path is killed
//! with `ss -K` (both sides) and the rules removed. Meanwhile the other path is held at
//! its first CM request, so the session is still being opened when the path breaks (as
//! when the kernel's rnbd-server cut a path 0.35 s before the device was open); the
//! client holds path 1 behind that first request for 2 s before it goes ahead on its
//! own (`Ctl::start_connect`). The steps:
//! - the control connection (cid 0) being established: its CM request held;
//! - an IO connection (cid 1) being established, cid 0 up: its CM request held;
//! - the INFO exchange, every connection up: INFO_REQ (the one SEND) held;
//! - the RNBD OPEN over the path (the only one up), after SESS_INFO: the OPEN held.
//!
//! Checked: the bench succeeds (so both paths are connected at the end), no IO error, no
//! verify mismatch, and the broken path reconnected by itself (`reconnects.successful`
//! ≥ 1; at the first three steps `failed` ≥ 1 too), says nothing failed for good, and
//! carried IO. The runs are one at a time, every wait is bounded, nothing is timed.
//!
//! Only this test's own ports are touched (the target picks free ones); each nft table
//! is deleted when its hold ends, also on a panic (tables of a test process that died are
//! removed at the next start). Without root, `ss -K` or nft payload matching the test
//! prints one SKIPPED line and passes.

// Only the CLI tests' child handle and binary paths are used here.
#[allow(dead_code)]
#[path = "util/cli.rs"]
mod cli_util;
// Not every OS fault is used here.
#[allow(dead_code)]
#[path = "util/fault.rs"]
mod fault_util;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use cli_util::{Kid, BENCH, TARGET};
use fault_util::{break_path, remove_orphan_tables, tools_usable, Hold};
use serde_json::Value;

const ADDRS: [&str; 2] = ["127.0.0.1", "127.0.0.2"];
/// Bound of every wait for a hold or a process.
const WAIT: Duration = Duration::from_secs(30);
/// One run at a time: each has a target and a bench of its own, on a small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Match expressions on a segment's data (`@ih,BIT,BITS VALUE`, bytes in wire order).
const CM_REQ: &str = "@ih,40,8 0x20";
const CM_REQ_CID0: &str = "@ih,40,8 0x20 @ih,432,16 0x0000";
const CM_REQ_CID1: &str = "@ih,40,8 0x20 @ih,432,16 0x0100";
const SEND: &str = "@ih,40,8 0x01";
/// RDMA_WRITE_WITH_IMM whose data starts with RNBD type 2 (OPEN), first in the segment
/// or behind the cumulative ACK it may share a `sendmsg` with.
const OPEN: &str = "@ih,40,8 0x05 @ih,320,16 0x0200";
const ACK_OPEN: &str = "@ih,40,8 0x10 @ih,360,8 0x05 @ih,640,16 0x0200";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Cid0,
    Cid1,
    Info,
    Open,
}

/// Reads a child's pipe to its end on a thread.
fn drain(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        let _ = tx.send(s);
    });
    rx
}

/// `rtrs-target` on core 0 listening on both addresses (free ports): the child, its two
/// ports and its log.
fn start_target() -> (Kid, [u16; 2], mpsc::Receiver<String>) {
    let mut c = Command::new(TARGET);
    c.args(["-m", "0x1", "--idle", "adaptive", "--export", "vol=ram:16M"]);
    for a in ADDRS {
        c.args(["--listen", &format!("tcp://{a}:0")]);
    }
    let mut child = c
        .arg("-v")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rtrs-target");
    let out = child.stdout.take().expect("stdout");
    let log = drain(child.stderr.take().expect("stderr"));
    let kid = Kid(Some(child));
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut r = BufReader::new(out);
        let mut line = String::new();
        let _ = r.read_line(&mut line);
        let _ = tx.send(line);
        let _ = std::io::copy(&mut r, &mut std::io::sink());
    });
    let ready = rx
        .recv_timeout(WAIT)
        .expect("rtrs-target printed no ready line");
    let port = |a: &str| -> u16 {
        ready
            .split(&format!("tcp://{a}:"))
            .nth(1)
            .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port of {a} in the ready line {ready:?}"))
    };
    (kid, [port(ADDRS[0]), port(ADDRS[1])], log)
}

/// The rules holding path 1 at `step` and path 0 at its first CM request (so the
/// session has no path up, and nothing is opened, until path 1 was broken), and which
/// of them say path 1 got there.
fn rules(step: Step, ports: [u16; 2]) -> (Vec<(&'static str, u16, &'static str)>, Vec<usize>) {
    let p0 = (ADDRS[0], ports[0], CM_REQ);
    let p1 = |m| (ADDRS[1], ports[1], m);
    match step {
        Step::Cid0 => (vec![p0, p1(CM_REQ_CID0)], vec![1]),
        Step::Cid1 => (vec![p0, p1(CM_REQ_CID1)], vec![1]),
        Step::Info => (vec![p0, p1(SEND)], vec![1]),
        Step::Open => (vec![p0, p1(OPEN), p1(ACK_OPEN)], vec![1, 2]),
    }
}

/// Holds path 1 at `step` while the bench brings the session up, kills the path's
/// sockets there, lets go, and checks the run.
fn run(step: Step, table: usize) {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !usable() {
        return;
    }
    let (target, ports, tlog) = start_target();
    let (rules, signals) = rules(step, ports);
    let hold = Hold::start(&rules, table).unwrap_or_else(|e| panic!("{step:?}: nft: {e}"));
    let urls: Vec<String> = (0..2)
        .map(|k| format!("tcp://{}:{}", ADDRS[k], ports[k]))
        .collect();
    let mut child = Command::new(BENCH)
        .args([
            "-m",
            "0x2",
            "--idle",
            "adaptive",
            "--device",
            "vol",
            "--path",
            &urls[0],
            "--path",
            &urls[1],
            "--rw",
            "randrw",
            "--bs",
            "4K",
            "--qd",
            "8",
            "--size",
            "4M",
            "--time",
            "4s",
            "--verify",
            "--json",
            "--require-all-paths",
            "--reconnect-delay",
            "200ms",
            "--connect-timeout",
            "10s",
            "-vv",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rtrs-bench");
    let out = drain(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let mut bench = Kid(Some(child));

    // Until the rule has dropped what path 1 sends at the step.
    let start = Instant::now();
    let held = loop {
        let d = hold.dropped();
        if signals.iter().any(|&i| d.get(i).is_some_and(|&n| n > 0)) {
            break Ok(d);
        }
        if bench
            .0
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
        {
            break Err(format!("the bench ended before the hold (dropped {d:?})"));
        }
        if start.elapsed() > WAIT {
            break Err(format!("no hold within {WAIT:?} (dropped {d:?})"));
        }
        thread::sleep(Duration::from_millis(10));
    };
    let killed = held.as_ref().ok().map(|_| {
        let a = break_path(ADDRS[1], ports[1], 0, 0, Duration::ZERO);
        let b = break_path(ADDRS[1], ports[1], 1, 0, Duration::ZERO);
        (a, b)
    });
    drop(hold);
    let status = bench.wait(WAIT * 2);
    let stdout = out.recv_timeout(WAIT).unwrap_or_default();
    let stderr = err.recv_timeout(WAIT).unwrap_or_default();
    drop(target);
    let tlog = tlog.recv_timeout(WAIT).unwrap_or_default();
    let ctx = format!(
        "{step:?}: hold {held:?}, ss -K {killed:?}, bench {status:?}\n{stderr}{stdout}\n\
         target log:\n{tlog}"
    );
    assert!(held.is_ok(), "{ctx}");
    assert!(
        killed.as_ref().is_some_and(|(a, b)| a.is_ok() && b.is_ok()),
        "{ctx}"
    );
    assert!(status.success(), "the bench failed: {ctx}");
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {ctx}"));
    assert_eq!(v["errors"].as_u64(), Some(0), "{ctx}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{ctx}");
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{ctx}");
    let paths = v["client_stats"]["paths"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(paths.len(), 2, "{ctx}");
    let stats = |k: usize| {
        let want = format!("{}:{}", ADDRS[k], ports[k]);
        paths
            .iter()
            .find(|s| s["path"].as_str().is_some_and(|s| s.contains(&want)))
            .cloned()
            .unwrap_or_else(|| panic!("no statistics of path {want}: {ctx}"))
    };
    let (p0, p1) = (stats(0), stats(1));
    assert_eq!(p0["state"], "connected", "{ctx}");
    assert_eq!(p1["state"], "connected", "{ctx}");
    assert!(
        p1["reconnects"]["successful"].as_u64().unwrap_or(0) >= 1,
        "path 1 reconnected by itself: {ctx}"
    );
    if step != Step::Open {
        assert!(
            p1["reconnects"]["failed"].as_u64().unwrap_or(0) >= 1,
            "the attempt held at {step:?} failed: {ctx}"
        );
    }
    assert!(p1["failure"].is_null(), "{ctx}");
    let carried = p1["rdma"]["read_cnt"].as_u64().unwrap_or(0)
        + p1["rdma"]["write_cnt"].as_u64().unwrap_or(0);
    assert!(carried > 0, "path 1 carried IO once back: {ctx}");
    assert!(!stderr.contains("not connected at the end"), "{ctx}");
    eprintln!(
        "bringup_os: {step:?}: path 1 held (dropped {:?}), killed, back after {} failed \
         attempt(s); ios {}, 0 errors",
        held.unwrap_or_default(),
        p1["reconnects"]["failed"],
        v["ios"]
    );
}

/// Whether the tools work here; prints why not otherwise.
fn usable() -> bool {
    let why =
        tools_usable().and_then(|()| Hold::start(&[("127.0.0.3", 9, CM_REQ_CID1)], 0).map(drop));
    match why {
        Ok(()) => {
            remove_orphan_tables();
            true
        }
        Err(why) => {
            eprintln!("\n*** bringup_os: SKIPPED: ss -K / nft unusable here: {why} ***\n");
            false
        }
    }
}

#[test]
fn path_killed_while_its_control_connection_is_established() {
    run(Step::Cid0, 1);
}

#[test]
fn path_killed_while_an_io_connection_is_established() {
    run(Step::Cid1, 2);
}

#[test]
fn path_killed_during_the_info_exchange() {
    run(Step::Info, 3);
}

#[test]
fn path_killed_under_the_rnbd_open() {
    run(Step::Open, 4);
}
