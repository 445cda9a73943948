//! Every refusal is in the target's log, at its default level, with the reason
//! (docs/ARCHITECTURE.md, "Session slots"), against the built `rtrs-target`:
//! - with `--max-sessions 5`, fifteen sessions that open a device: ten are refused
//!   (−EUSERS), and the log accounts for each — printed lines saying why, and the rest
//!   counted in a "suppressed" line (the rate limiter counts the lines it prints, so
//!   lines of a level that is off, like a connected path's, take nothing from it);
//! - a session that writes under a key it was never given is closed, and the log line
//!   names the remote access error, the key and the range.
//!
//! Waits are bounded; nothing is timed.

use crate::cli_util;
use crate::rnbd_raw;

use std::net::SocketAddr;

use cli_util::{start_target_logged, TargetProc, LIMIT};
use rnbd_raw::{open, Remote};
use rtrs_spdk::fabric::{SendOp, SendWr, WcStatus};
use rtrs_spdk::proto::rnbd::AccessMode;

use crate::server_util::client::{info_req, Ids, TestPath};
use crate::server_util::Event;

fn session(r: &mut Remote, name: &str) -> Result<TestPath, i32> {
    let addr = r.addr;
    TestPath::connect_info_from(r, None, addr, &info_req(name), 2, Ids::random(), true)
}

/// Printed lines of the target's log with every one of `words`, and the count the
/// summaries of limiter `what` give.
fn accounted(t: &TargetProc, words: &[&str], what: &str) -> (usize, u64) {
    let log = t.log.lock().unwrap_or_else(|e| e.into_inner());
    let printed = log
        .lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .count();
    let suppressed = log
        .lines()
        .filter_map(|l| l.split_once(&format!("{what}: "))?.1.split(' ').next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum();
    (printed, suppressed)
}

#[test]
fn every_refused_session_is_in_the_log() {
    let (t, _) = start_target_logged(
        &["vol=ram:16M"],
        &["--max-sessions", "5", "--queue-depth", "64"],
    );
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    for n in 0..15 {
        match session(&mut r, &format!("s{n}")) {
            Ok(mut p) => {
                open(&mut p, &mut r, "vol", AccessMode::ReadOnly).expect("open");
                kept.push(p);
            }
            Err(e) => refused.push(e),
        }
    }
    assert_eq!(kept.len(), 5);
    assert_eq!(refused, vec![-libc::EUSERS; 10]);
    // Printed, or counted once the limiter's window closed (its summary comes at the
    // latest with the acceptor's next check, within a second or two).
    let words = ["refusing connection", "max_sessions 5", "EUSERS"];
    let start = std::time::Instant::now();
    let (printed, suppressed) = loop {
        let (p, s) = accounted(&t, &words, "rtrs-srv");
        if p as u64 + s >= 10 {
            break (p, s);
        }
        assert!(
            start.elapsed() < LIMIT,
            "{p} refusals printed and {s} counted of 10; log:\n{}",
            t.log.lock().unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    eprintln!("10 sessions refused: {printed} lines printed, {suppressed} counted as suppressed");
    assert!(
        printed >= 5,
        "the burst went to lines nobody saw: {printed} printed"
    );
}

#[test]
fn a_write_under_a_key_never_given_is_logged_with_the_key_and_range() {
    let (t, _) = start_target_logged(&["vol=ram:16M"], &["--queue-depth", "64"]);
    let mut r = Remote::new(SocketAddr::from(([127, 0, 0, 1], t.port)));
    let mut p = session(&mut r, "forger").expect("a session");
    let (chunk, _) = p.rbuf[3];
    p.stage.write_at(0, &[0xEE; 4096]);
    let sge = [p.stage.sge(0, 4096)];
    p.cons[1]
        .post_send(&[SendWr {
            wr_id: 77,
            op: SendOp::RdmaWrite {
                remote_addr: chunk,
                rkey: 0x00c0_ffee,
            },
            sges: &sge,
            signaled: true,
        }])
        .expect("post");
    assert!(p.wait_down(&mut r), "a write under a bogus key was taken");
    assert!(
        p.events.iter().any(|e| matches!(
            e,
            Event::Error {
                status: WcStatus::RemoteAccess,
                ..
            }
        )),
        "{:?}",
        p.events
    );
    let line = t.wait_log(&["\"forger\"", "closing", "remote access error"]);
    assert!(
        line.contains("WARN")
            && line.contains("rkey 0xc0ffee")
            && line.contains("4096 bytes")
            && line.contains(&format!("{chunk:#x}")),
        "{line}"
    );
}
