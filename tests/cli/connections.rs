//! Connections are bounded and paid for (docs/ARCHITECTURE.md, "Session slots", "Caps
//! and what they cost"), against the built `rtrs-target` on 127.0.0.x with the server
//! tests' raw client, which asks for as many connections as it likes:
//! - a path asking for 1,000 connections is refused at its first request (−EINVAL,
//!   `max_path_connections`), and the target's memory does not move;
//! - one client asking for 1,000 connections in sessions of 100 that open a device gets
//!   them up to the cap per source and no further (−EUSERS); the target's resident
//!   memory grows within the caps' arithmetic and comes back once the client leaves;
//! - with the caps raised, one session of 1,000 idle connections costs a few tens of KiB
//!   a connection, given back when it leaves;
//! - under a limit of 1,024 file descriptors (hard and soft) a client asking for
//!   thousands of connections gets what the derived caps allow, the target never runs
//!   out of descriptors, and a verified `rtrs-bench` from another address is served.
//!
//! Every refusal is in the target's log. Waits are bounded; nothing is timed. The
//! figures (resident memory, descriptors) are printed for the record.

use crate::cli_util;
use crate::rnbd_raw;

use std::net::SocketAddr;
use std::time::Duration;

use cli_util::{run, start_target_logged, start_target_rlimit, TargetProc, BENCH};
use rnbd_raw::{open, vm_rss, Remote};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::server::ServerConfig;

use crate::server_util::client::{info_req, Ids, TestPath};

const MIB: u64 = 1 << 20;

/// A session of `cid_num` connections from `src` that opens `vol` (so it is in use and
/// never gives way); the path, or the refusal's errno.
fn session(r: &mut Remote, src: [u8; 4], n: usize, cid_num: u16) -> Result<TestPath, i32> {
    let addr = r.addr;
    let mut p = TestPath::connect_info_from(
        r,
        Some(SocketAddr::from((src, 0))),
        addr,
        &info_req(&format!("conns-{n}")),
        cid_num,
        Ids::random(),
        true,
    )?;
    open(&mut p, r, "vol", AccessMode::ReadOnly).expect("an open export opens");
    Ok(p)
}

/// Lines of `log` that contain every one of `words`.
fn lines_with(t: &TargetProc, words: &[&str]) -> usize {
    let log = t.log.lock().unwrap_or_else(|e| e.into_inner());
    log.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}

/// Open file descriptors of process `pid`.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Waits (bounded) until the target's resident memory stops falling, and returns it.
fn settled_rss(pid: u32) -> u64 {
    let mut last = vm_rss(pid);
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(250));
        let now = vm_rss(pid);
        if now >= last {
            return now;
        }
        last = now;
    }
    last
}

#[test]
fn a_path_asking_for_more_connections_than_a_path_may_have_is_refused_at_once() {
    let (t, _) = start_target_logged(&["vol=ram:16M"], &[]);
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let before = vm_rss(t.kid.pid());
    let e = session(&mut r, [127, 0, 0, 2], 0, 1000).err();
    assert_eq!(e, Some(-libc::EINVAL), "a 1000-connection path");
    let after = vm_rss(t.kid.pid());
    eprintln!(
        "1000-connection path refused: target RSS {} -> {} MiB",
        before / MIB,
        after / MIB
    );
    assert!(after < before + 4 * MIB, "{before} -> {after}");
    t.wait_log(&[
        "refusing connection from 127.0.0.2",
        "asks for 1000 connections",
        "max_path_connections",
        "EINVAL",
    ]);
}

#[test]
fn one_client_asking_for_a_thousand_connections_stops_at_the_cap_and_leaves_no_memory() {
    const CAP: usize = 600;
    let (t, _) = start_target_logged(&["vol=ram:16M"], &["--max-connections", &CAP.to_string()]);
    let pid = t.kid.pid();
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let before = settled_rss(pid);
    // Ten sessions of 100 connections: 1,000 connection requests from one address.
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    for n in 0..10 {
        match session(&mut r, [127, 0, 0, 2], n, 100) {
            Ok(p) => kept.push(p),
            Err(e) => refused.push(e),
        }
    }
    let peak = vm_rss(pid);
    // Half the cap per source: three sessions of 100.
    assert_eq!(kept.len(), CAP / 2 / 100, "refused: {refused:?}");
    assert!(refused.iter().all(|&e| e == -libc::EUSERS), "{refused:?}");
    let cfg = ServerConfig::default();
    let conns = (kept.len() * 100) as u64;
    let bound = kept.len() as u64 * cfg.pool_bytes() + conns * cfg.connection_bytes();
    eprintln!(
        "{} connections held, {} sessions refused: target RSS {} -> {} MiB \
         ({} KiB per connection and pool share; the caps' arithmetic allows {} MiB)",
        conns,
        refused.len(),
        before / MIB,
        peak / MIB,
        (peak.saturating_sub(before)) / conns / 1024,
        bound / MIB
    );
    assert!(
        peak.saturating_sub(before) <= bound,
        "RSS grew {} MiB, more than the caps allow ({} MiB)",
        (peak - before) / MIB,
        bound / MIB
    );
    // Every refusal is in the log, with its reason.
    t.wait_log(&[
        "refusing connection from 127.0.0.2",
        "max_connections_per_source",
    ]);
    drop(kept);
    // The client left: its sessions close and the memory goes back to the system.
    let start = std::time::Instant::now();
    let mut after = settled_rss(pid);
    while after > before + (peak.saturating_sub(before)) / 4 + 4 * MIB {
        assert!(
            start.elapsed() < cli_util::LIMIT,
            "target RSS {} MiB after the client left (before {} MiB, peak {} MiB)",
            after / MIB,
            before / MIB,
            peak / MIB
        );
        std::thread::sleep(Duration::from_millis(200));
        after = settled_rss(pid);
    }
    eprintln!(
        "after the client left: target RSS {} MiB (before {}, peak {})",
        after / MIB,
        before / MIB,
        peak / MIB
    );
}

#[test]
fn a_thousand_idle_connections_cost_little_and_are_given_back() {
    // Caps raised so that one session may have 1,000 connections (the figure:
    // 0.73 MiB each, kept after the client left, before queues were sized by use).
    let (t, _) = start_target_logged(
        &["vol=ram:16M"],
        &[
            "--max-path-connections",
            "1000",
            "--max-connections",
            "2000",
            "--max-connections-per-source",
            "2000",
        ],
    );
    let pid = t.kid.pid();
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let before = settled_rss(pid);
    let p = session(&mut r, [127, 0, 0, 2], 0, 1000).expect("1000 connections");
    let peak = vm_rss(pid);
    let cfg = ServerConfig::default();
    let bound = cfg.pool_bytes() + 1000 * cfg.connection_bytes();
    eprintln!(
        "1000 connections of one session: target RSS {} -> {} MiB ({} KiB each with the \
         session's share; the caps' arithmetic allows {} MiB)",
        before / MIB,
        peak / MIB,
        peak.saturating_sub(before) / 1000 / 1024,
        bound / MIB
    );
    assert!(peak.saturating_sub(before) <= bound);
    drop(p);
    let start = std::time::Instant::now();
    let mut after = settled_rss(pid);
    while after > before + (peak.saturating_sub(before)) / 4 + 4 * MIB {
        assert!(
            start.elapsed() < cli_util::LIMIT,
            "target RSS {} MiB after the client left (before {} MiB, peak {} MiB)",
            after / MIB,
            before / MIB,
            peak / MIB
        );
        std::thread::sleep(Duration::from_millis(200));
        after = settled_rss(pid);
    }
    eprintln!("after the client left: target RSS {} MiB", after / MIB);
}

/// The open-file limit of the target in this test: systemd's default soft limit, here
/// the hard one too, so that the target cannot raise it.
const NOFILE: u64 = 1024;

#[test]
fn a_client_is_served_under_1024_descriptors_while_another_asks_for_thousands() {
    let t = start_target_rlimit(&["vol=ram:64M"], &["-v"], libc::RLIMIT_NOFILE, NOFILE, true);
    let pid = t.kid.pid();
    let ready = t.wait_log(&["target ready"]);
    eprintln!("{ready}");
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    // 30 sessions of 100 connections, and one path of 508, from one address.
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    match session(&mut r, [127, 0, 0, 2], 99, 508) {
        Ok(p) => kept.push(p),
        Err(e) => refused.push(e),
    }
    let mut most_fds = 0;
    for n in 0..30 {
        match session(&mut r, [127, 0, 0, 2], n, 100) {
            Ok(p) => kept.push(p),
            Err(e) => refused.push(e),
        }
        most_fds = most_fds.max(fds(pid));
    }
    let held: usize = kept.iter().map(|p| p.cons.len()).sum();
    eprintln!(
        "the other client holds {held} connections in {} sessions, {} sessions refused; \
         the target had at most {most_fds} descriptors open of {NOFILE}",
        kept.len(),
        refused.len()
    );
    assert!(!kept.is_empty(), "the caps let nothing in: {refused:?}");
    assert!(refused.iter().all(|&e| e == -libc::EUSERS), "{refused:?}");
    assert!(
        (most_fds as u64) < NOFILE * 3 / 4,
        "{most_fds} descriptors open: no headroom left"
    );
    // The legitimate client, from another address, with its default connect timeout.
    let url = format!("tcp://127.0.0.1:{}?src=127.0.0.1", t.port);
    let out = run(
        BENCH,
        &[
            "--path", &url, "--device", "vol", "--rw", "randrw", "--bs", "4K", "--qd", "8",
            "--verify", "--time", "1s", "-m", "0x2", "--idle", "adaptive", "--json",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the legitimate client was not served: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
    // Never at the limit: no accept failed for want of a descriptor.
    assert_eq!(lines_with(&t, &["accept failed"]), 0);
    assert!(lines_with(&t, &["refusing connection from 127.0.0.2"]) > 0);
    drop(kept);
}
