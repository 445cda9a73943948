//! No client can exhaust or crash the target: `rtrs-target` under an address-space limit
//! of about 1.2 GB (`ulimit -v`) takes 40 sessions from 40 source addresses
//! (127.0.0.2 .. 127.0.0.41), each opening a device, that together want far more chunk
//! memory than it may have. It must stay up, refuse what it cannot hold with ENOMEM (or its session caps' EUSERS),
//! and serve a verified `rtrs-bench` from a legitimate source with no error throughout;
//! with caps set, the caps refuse first. Every wait is bounded; nothing is timed.

use crate::cli_util;
use crate::rnbd_raw;
use crate::server_util;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use cli_util::{start_target_limited, TargetProc, BENCH, LIMIT};
use rnbd_raw::{open, Remote};
use rtrs_spdk::proto::rnbd::AccessMode;
use server_util::client::{info_req, Ids, TestPath};

/// About 1.2 GB: the target's own needs (some 150 MB) and room for about 16 chunk pools
/// of 64 MiB, where 40 sessions want 2.5 GiB.
const AS_LIMIT: u64 = 1_200_000_000;

/// Opens 40 sessions, one from each of 127.0.0.2 .. 127.0.0.41, each opening `vol`
/// read-only (so they are in use and never give way to each other: docs/ARCHITECTURE.md,
/// "Session slots"); keeps the admitted ones open and returns them with the refusals'
/// errnos.
fn flood(r: &mut Remote) -> (Vec<TestPath>, Vec<i32>) {
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    for n in 2..42u8 {
        let src = Some(SocketAddr::from(([127, 0, 0, n], 0)));
        let addr = r.addr;
        match TestPath::connect_info_from(
            r,
            src,
            addr,
            &info_req(&format!("flood-{n}")),
            2,
            Ids::random(),
            true,
        ) {
            Ok(mut p) => {
                open(&mut p, r, "vol", AccessMode::ReadOnly).expect("the flood opens vol");
                kept.push(p)
            }
            Err(e) => refused.push(e),
        }
    }
    (kept, refused)
}

/// A verified randrw run of `secs` seconds from 127.0.0.1 in the background.
fn bench(t: &TargetProc, secs: u32) -> std::thread::JoinHandle<std::process::Output> {
    let url = format!("tcp://127.0.0.1:{}?src=127.0.0.1", t.port);
    let time = format!("{secs}s");
    std::thread::spawn(move || {
        Command::new(BENCH)
            .args([
                "--path", &url, "--device", "vol", "--rw", "randrw", "--bs", "4K", "--qd", "8",
                "--size", "8M", "--verify", "--time", &time, "--json", "--idle", "adaptive", "-m",
                "0x2",
            ])
            .output()
            .expect("run rtrs-bench")
    })
}

/// The bench's result: it ran, verified, with no error.
fn bench_ok(out: std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the legitimate bench failed during the flood: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
}

fn flood_against(extra: &[&str]) -> (usize, Vec<i32>) {
    let mut t = start_target_limited(&["vol=ram:64M"], extra, AS_LIMIT);
    let running = bench(&t, 6);
    // Let the bench's session in first (it is the legitimate one).
    std::thread::sleep(Duration::from_millis(1500));
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let (kept, refused) = flood(&mut r);
    bench_ok(running.join().unwrap());
    // The target is still there and answers a new session.
    assert!(
        t.kid.0.as_mut().unwrap().try_wait().unwrap().is_none(),
        "the target died: {}",
        t.log.lock().unwrap()
    );
    drop(kept);
    bench_ok(bench(&t, 1).join().unwrap());
    let st = Command::new("kill")
        .args(["-TERM", &t.kid.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(t.kid.wait(LIMIT).code(), Some(0), "the target's exit");
    (40 - refused.len(), refused)
}

#[test]
fn a_flood_of_sessions_under_an_address_space_limit_is_refused_and_served_around() {
    let (admitted, refused) = flood_against(&[]);
    eprintln!("admitted {admitted} of 40; refused: {refused:?}");
    assert!(admitted > 0, "no flood session was admitted at all");
    assert!(
        !refused.is_empty(),
        "40 sessions fit in the limit: the test does not test it"
    );
    assert!(
        refused
            .iter()
            .all(|&e| e == -libc::ENOMEM || e == -libc::EUSERS),
        "refusals other than ENOMEM/EUSERS: {refused:?}"
    );
}

#[test]
fn with_caps_the_caps_refuse_the_flood_first() {
    let (admitted, refused) = flood_against(&["--max-sessions", "8"]);
    // The bench holds one place.
    assert_eq!(admitted, 7, "refused: {refused:?}");
    assert!(
        refused.iter().all(|&e| e == -libc::EUSERS),
        "refusals other than EUSERS: {refused:?}"
    );
}
