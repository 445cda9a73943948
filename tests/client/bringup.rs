//! A path that fails while it is being brought up is retried under the session's
//! reconnect policy like a path lost later, against the scripted server on loopback with
//! a virtual clock: broken right after each of its connections is accepted, and at the
//! INFO exchange, one path of two comes back by itself, carries verified IO, and counts
//! one successful and one failed reconnect; a path that keeps failing gives up after
//! `max_reconnect_attempts`, says so at warning level, and shows why in its statistics
//! (no counter below zero); a manual reconnect brings it back.

use crate::util;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rtrs_spdk::client::{LinkEvent, PathState};
use util::fake_server::{BringUpFault, BringUpStep};
use util::{Harness, Setup, MS};

fn clean(h: &Harness) {
    let t = h.total();
    assert!(t.errors.is_empty(), "errors: {:?}", t.errors);
    assert_eq!(t.mismatches, 0, "corrupted reads");
    assert_eq!(t.strays, 0, "double or stray completions");
    assert_eq!(t.submitted, t.completed);
}

/// Log lines of the test's thread (where the simulated reactors run), for the checks of
/// what the client says.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl Log {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Log {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;
    fn make_writer(&'a self) -> Log {
        self.clone()
    }
}

#[test]
fn a_path_broken_at_any_step_of_bringup_comes_back() {
    // Two cores: connections 0 (control), 1 and 2 (IO), then the INFO exchange on 0.
    for step in [
        BringUpStep::Accepted(0),
        BringUpStep::Accepted(1),
        BringUpStep::Accepted(2),
        BringUpStep::InfoReq,
    ] {
        let mut h = Harness::new(Setup {
            paths: 2,
            load_qd: 8,
            ..Setup::default()
        });
        h.srv.borrow_mut().bringup_fault = Some(BringUpFault {
            path: 1,
            step,
            times: 1,
        });
        // Path 0 comes up; path 1 fails once, then reconnects by itself (delay 200 ms +
        // jitter up to 300 ms).
        assert!(
            h.run_until(20_000, MS, |h| h.sess.paths_up() == 2),
            "{step:?}: {:?}",
            h.sess.paths()
        );
        assert_eq!(h.srv.borrow().faults_hit, 1, "{step:?}");
        h.run_until(100, 1000, |_| false);
        h.start_load(0);
        assert!(
            h.run_until(200_000, 1000, |h| h.total().verified >= 200),
            "{step:?}: {:?}",
            h.total()
        );
        h.drain(100_000, 1000);
        clean(&h);
        let st = h.sess.stats();
        let p1 = &st.paths[1];
        assert_eq!(p1.state, "connected", "{step:?}: {}", st.to_json());
        assert_eq!(p1.reconnects_ok, 1, "{step:?}: {}", st.to_json());
        assert_eq!(p1.reconnects_fail, 1, "{step:?}: {}", st.to_json());
        assert_eq!((&p1.failure, &p1.last_error), (&None, &None), "{step:?}");
        assert!(
            p1.rdma.write_cnt + p1.rdma.read_cnt > 0,
            "{step:?}: the path carried IO: {}",
            st.to_json()
        );
        assert_eq!(
            (st.paths[0].reconnects_ok, st.paths[0].reconnects_fail),
            (0, 0),
            "{step:?}: {}",
            st.to_json()
        );
        assert_eq!(h.events.borrow().as_slice(), &[LinkEvent::Connected]);
    }
}

#[test]
fn a_path_that_keeps_failing_at_bringup_gives_up_and_says_why() {
    let log = Log::default();
    let sub = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(sub);

    let mut h = Harness::new(Setup {
        paths: 2,
        load_qd: 4,
        tweak: |c| {
            c.max_reconnect_attempts = 2;
            c.reconnect_delay = Duration::from_millis(100);
        },
        ..Setup::default()
    });
    h.srv.borrow_mut().bringup_fault = Some(BringUpFault {
        path: 1,
        step: BringUpStep::InfoReq,
        times: u32::MAX,
    });
    let p1 = h.paths[1];
    assert!(
        h.run_until(20_000, MS, |h| h.sess.path_state(p1)
            == Some(PathState::Closed)),
        "{:?}",
        h.sess.paths()
    );
    // The first attempt and two reconnects; none after giving up.
    assert_eq!(h.srv.borrow().faults_hit, 3);
    h.run_until(5_000, MS, |_| false);
    assert_eq!(h.srv.borrow().faults_hit, 3, "no attempt after giving up");
    assert_eq!(h.sess.paths_up(), 1);

    let st = h.sess.stats();
    let s1 = &st.paths[1];
    let want = "gave up after 3 failed attempts (max_reconnect_attempts 2): \
                cid 0 disconnected during the INFO exchange";
    assert_eq!(s1.state, "closed");
    assert_eq!(s1.failure.as_deref(), Some(want), "{}", st.to_json());
    assert_eq!((s1.reconnects_ok, s1.reconnects_fail), (0, 3));
    assert_eq!(h.sess.path_failure(p1).as_deref(), Some(want));
    let j = st.to_json();
    assert!(
        j.contains(&format!(
            "\"state\":\"closed\",\"hca_name\":null,\"hca_port\":null,\"failure\":\"{want}\",\"last_error\":"
        )),
        "{j}"
    );
    assert!(
        j.contains("\"reconnects\":{\"successful\":0,\"failed\":3}"),
        "{j}"
    );
    assert!(!j.contains(":-"), "no negative number: {j}");
    let said = log.text();
    let line = said
        .lines()
        .find(|l| l.contains("gave up after"))
        .unwrap_or_else(|| panic!("no give-up warning in:\n{said}"));
    for w in [
        "WARN",
        want,
        "sess=test-sess",
        &format!("path={p1}"),
        "manual reconnect",
    ] {
        assert!(line.contains(w), "{line:?} lacks {w:?}");
    }

    // IO goes on over path 0.
    h.start_load(0);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 50));
    // A manual reconnect starts over; the path comes back and forgets its failure.
    h.srv.borrow_mut().bringup_fault = None;
    h.sess.reconnect_path(p1);
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 2),
        "{:?}",
        h.sess.paths()
    );
    h.drain(100_000, 1000);
    clean(&h);
    let st = h.sess.stats();
    assert_eq!(st.paths[1].failure, None, "{}", st.to_json());
    assert_eq!(st.paths[1].reconnects_ok, 1, "{}", st.to_json());
}

#[test]
fn a_path_lost_with_no_attempts_allowed_says_why() {
    let mut h = Harness::new(Setup {
        paths: 2,
        load_qd: 2,
        tweak: |c| c.max_reconnect_attempts = 0,
        ..Setup::default()
    });
    h.srv.borrow_mut().bringup_fault = Some(BringUpFault {
        path: 1,
        step: BringUpStep::InfoReq,
        times: 1,
    });
    let p1 = h.paths[1];
    assert!(h.run_until(20_000, MS, |h| h.sess.path_state(p1)
        == Some(PathState::Closed)));
    let st = h.sess.stats();
    assert_eq!(
        st.paths[1].failure.as_deref(),
        Some(
            "gave up after 1 failed attempt (max_reconnect_attempts 0): \
             cid 0 disconnected during the INFO exchange"
        ),
        "{}",
        st.to_json()
    );
    // A connected path lost with no attempts allowed: closed, with the loss as reason.
    h.srv.borrow_mut().break_path(0);
    let p0 = h.paths[0];
    assert!(h.run_until(20_000, MS, |h| h.sess.path_state(p0)
        == Some(PathState::Closed)));
    let f = h.sess.path_failure(p0).unwrap_or_default();
    assert!(
        f.starts_with("not reconnected (max_reconnect_attempts 0): connection lost: "),
        "{f}"
    );
    let st = h.sess.stats();
    assert!(
        st.paths
            .iter()
            .all(|p| p.reconnects_ok == 0 && p.state == "closed"),
        "{}",
        st.to_json()
    );
}

/// A new session's paths create the server session one at a time, as the kernel's
/// client brings its paths up: the second path's first connection request reaches the
/// server only once the first path's has been accepted (the kernel's server, given two
/// at once, may make two sessions of one name; docs/INTEROP.md).
#[test]
fn paths_of_a_new_session_create_it_one_at_a_time() {
    let mut h = Harness::new(Setup {
        paths: 3,
        ..Setup::default()
    });
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 3),
        "{:?}",
        h.sess.paths()
    );
    let log = h.srv.borrow().first_requests.clone();
    assert_eq!(log.len(), 3, "one first connection per path: {log:?}");
    assert_eq!(log[0].2, 0, "the first path's request came first: {log:?}");
    for (i, &(_, first_conn, before)) in log.iter().enumerate() {
        assert!(first_conn, "request {i} may create the session: {log:?}");
        if i > 0 {
            assert!(
                before >= 1,
                "request {i} came while no connection was accepted yet: {log:?}"
            );
        }
    }
    let st = h.sess.stats();
    for p in &st.paths {
        assert_eq!(
            (p.reconnects_ok, p.reconnects_fail),
            (0, 0),
            "holding a path is no reconnect: {}",
            st.to_json()
        );
    }
    h.start_load(0);
    assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 100));
    h.drain(100_000, 1000);
    clean(&h);
}

/// A path held behind another that is creating the session goes ahead as soon as that
/// one fails: here the first request is refused, the second path creates the session,
/// and the first comes back by its reconnect.
#[test]
fn a_held_path_goes_ahead_when_the_creating_path_fails() {
    let mut h = Harness::new(Setup {
        paths: 2,
        ..Setup::default()
    });
    {
        let mut s = h.srv.borrow_mut();
        s.reject_next = 1;
        s.reject_errno = -104; // ECONNRESET: transient, the path retries
    }
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 2),
        "{:?}",
        h.sess.paths()
    );
    let log = h.srv.borrow().first_requests.clone();
    assert!(log.len() >= 3, "{log:?}");
    assert_eq!(log[0], (0, true, 0), "the first path asked first: {log:?}");
    assert_eq!(
        log[1],
        (1, true, 0),
        "the second path asked once the first was refused, before any accept: {log:?}"
    );
    let st = h.sess.stats();
    assert_eq!(
        (st.paths[0].reconnects_ok, st.paths[0].reconnects_fail),
        (1, 1),
        "{}",
        st.to_json()
    );
    assert_eq!(
        (st.paths[1].reconnects_ok, st.paths[1].reconnects_fail),
        (0, 0),
        "{}",
        st.to_json()
    );
}

/// A path is held behind a creating path for two seconds at most: when the first path's
/// connection requests go unanswered (lost on the way), the second creates the session
/// long before the first's connect timeout (30 s), and the first joins it once its
/// request is answered.
#[test]
fn a_path_whose_requests_go_unanswered_holds_the_others_two_seconds_at_most() {
    let mut h = Harness::new(Setup {
        paths: 2,
        ..Setup::default()
    });
    h.srv.borrow_mut().ignore_listener = Some(0);
    // Up to 5 s of virtual time: the hold (2 s) and path 1's bring-up fit, path 0's
    // connect timeout (30 s) does not.
    assert!(
        h.run_until(5_000, MS, |h| h.sess.paths_up() == 1),
        "{:?}",
        h.sess.paths()
    );
    let paths = h.sess.paths();
    assert_eq!(paths[1].1, PathState::Connected, "{paths:?}");
    assert_ne!(paths[0].1, PathState::Connected, "{paths:?}");
    h.srv.borrow_mut().ignore_listener = None;
    assert!(
        h.run_until(40_000, MS, |h| h.sess.paths_up() == 2),
        "{:?}",
        h.sess.paths()
    );
    h.start_load(0);
    assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 100));
    h.drain(100_000, 1000);
    clean(&h);
}
