//! Session slots go to clients that use them (docs/ARCHITECTURE.md, "Session slots"),
//! against the built `rtrs-target` on 127.0.0.x:
//! - a host the export's `--allow` refuses holds every slot it can, from six addresses,
//!   re-making each session the target closes, its OPENs refused; an allowed
//!   `rtrs-bench` asking meanwhile is served (verified IO, its default 5 s connect
//!   timeout), the refused host's sessions give way, and the log says so;
//! - a session that opens no device is closed after `--open-grace`; one that keeps a
//!   device open, or closes its device and opens another within the grace (the SPDK
//!   bdev's devices coming and going over one session), stays and is served.
//!
//! Waits are bounded; nothing is timed (the time to serve is printed for the record).

use crate::cli_util;
use crate::rnbd_raw;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use cli_util::{run, start_target_logged, TargetProc, BENCH, LIMIT};
use rnbd_raw::{close, open, read, refused_host, write, Attack, Remote};
use rtrs_spdk::proto::rnbd::AccessMode;

use crate::server_util::client::{info_req, Ids, TestPath};

/// Lines of the target's log that contain every one of `words`.
fn lines_with(t: &TargetProc, words: &[&str]) -> usize {
    let log = t.log.lock().unwrap_or_else(|e| e.into_inner());
    log.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count()
}

#[test]
fn a_refused_host_holding_every_slot_gives_way_to_an_allowed_client() {
    const CAP: usize = 12;
    let (t, _) = start_target_logged(
        &["vol=ram:16M"],
        &[
            "--allow",
            "vol=127.0.0.1",
            "--max-sessions",
            &CAP.to_string(),
            "--queue-depth",
            "64",
        ],
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], t.port));
    let a = Arc::new(Attack::default());
    let attack = refused_host(addr, "vol", Arc::clone(&a));
    // The refused host fills the cap and goes on making sessions.
    let start = Instant::now();
    while a.made.load(Ordering::Relaxed) < 2 * CAP {
        assert!(start.elapsed() < LIMIT, "the attacker made no sessions");
        assert!(!attack.is_finished(), "the attacker failed");
        thread::sleep(Duration::from_millis(20));
    }
    // The allowed client asks, with its default connect timeout.
    let url = format!("tcp://127.0.0.1:{}?src=127.0.0.1", t.port);
    let asked = Instant::now();
    let out = run(
        BENCH,
        &[
            "--path", &url, "--device", "vol", "--rw", "randrw", "--bs", "4K", "--qd", "8",
            "--verify", "--time", "1s", "-m", "0x2", "--idle", "adaptive", "--json",
        ],
    );
    let took = asked.elapsed();
    a.stop.store(true, Ordering::Release);
    attack.join().expect("the attacker's thread");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the allowed client was not served: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["errors"].as_u64(), Some(0), "{v}");
    assert_eq!(v["verify_mismatches"].as_u64(), Some(0), "{v}");
    assert!(v["ios"].as_u64().unwrap_or(0) > 0, "{v}");
    let opens = a.opens.lock().unwrap().clone();
    let refused = a.refused.lock().unwrap().clone();
    let io_s = v["time_s"].as_f64().unwrap_or(0.0);
    eprintln!(
        "allowed client served: its verified run ({io_s:.2} s of IO) ended {:.2} s after it \
         asked, start, mapping, verify and teardown included; the refused host made {} \
         sessions, {} closed by the target, {} refused ({:?}...)",
        took.as_secs_f64(),
        a.made.load(Ordering::Relaxed),
        a.closed.load(Ordering::Relaxed),
        refused.len(),
        &refused[..refused.len().min(4)]
    );
    // Every OPEN of the refused host was refused by the host list (or its session
    // closed under it, having given way).
    assert!(
        opens
            .iter()
            .all(|&e| e == -libc::EACCES || e == -libc::ENOTCONN),
        "{opens:?}"
    );
    assert!(opens.contains(&-libc::EACCES), "{opens:?}");
    assert!(
        a.closed.load(Ordering::Relaxed) > 0,
        "no session of it gave way"
    );
    // The log says why: OPENs refused by the host list, sessions giving way.
    t.wait_log(&["open refused", "access denied", "refused-"]);
    t.wait_log(&["not in use", "gave way"]);
    assert!(lines_with(&t, &["closing", "gave way"]) > 0);
}

/// A session of the raw client on `addr` that may open `vol`.
fn session(r: &mut Remote, name: &str) -> TestPath {
    let addr = r.addr;
    TestPath::connect_info_from(r, None, addr, &info_req(name), 2, Ids::random(), true)
        .expect("a session")
}

/// Whether the target closes `p` within `wait` (polling it meanwhile).
fn closed_within(p: &mut TestPath, r: &mut Remote, wait: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < wait {
        std::thread::sleep(Duration::from_millis(10));
        p.poll();
        if p.down {
            return true;
        }
    }
    let _ = r;
    false
}

#[test]
fn sessions_without_a_device_are_closed_after_the_grace_and_the_others_stay() {
    let (t, _) = start_target_logged(
        &["vol=ram:16M", "vol2=ram:16M"],
        &["--open-grace", "1s", "--queue-depth", "64"],
    );
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    // Three sessions: one never opens a device; one keeps one open; one closes its
    // device and opens another within the grace, as the SPDK bdev's devices come and
    // go over one session.
    let mut idle = session(&mut r, "idle");
    let mut holder = session(&mut r, "holder");
    let dev = open(&mut holder, &mut r, "vol", AccessMode::ReadWrite).expect("open vol");
    assert_eq!(write(&mut holder, &mut r, dev, 8, &[0x5a; 4096]), 0);
    let mut mover = session(&mut r, "mover");
    let first = open(&mut mover, &mut r, "vol2", AccessMode::ReadOnly).expect("open vol2");
    assert_eq!(close(&mut mover, &mut r, first), 0);
    thread::sleep(Duration::from_millis(300));
    let second = open(&mut mover, &mut r, "vol2", AccessMode::ReadOnly).expect("re-open");
    // The idle one goes, within a generous bound past its 1 s grace.
    assert!(
        closed_within(&mut idle, &mut r, Duration::from_secs(30)),
        "a session without a device stayed past its grace"
    );
    t.wait_log(&["\"idle\"", "closing", "not in use", "open_grace"]);
    // Twice the grace later, the others still have their devices and are served.
    thread::sleep(Duration::from_secs(2));
    holder.poll();
    mover.poll();
    assert!(
        !holder.down && !mover.down,
        "{:?} {:?}",
        holder.events,
        mover.events
    );
    let (e, data) = read(&mut holder, &mut r, dev, 8, 4096);
    assert_eq!((e, data), (0, vec![0x5a; 4096]));
    let (e, _) = read(&mut mover, &mut r, second, 0, 4096);
    assert_eq!(e, 0);
    // A session whose last device closed gets the grace again, then goes.
    assert_eq!(close(&mut mover, &mut r, second), 0);
    assert!(
        closed_within(&mut mover, &mut r, Duration::from_secs(30)),
        "a session whose last device closed stayed past its grace"
    );
    holder.poll();
    assert!(!holder.down);
}
