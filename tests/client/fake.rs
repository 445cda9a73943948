//! End-to-end client tests against a scripted server (`util::fake_server`) over
//! the loopback fabric, on simulated reactors with a virtual clock: handshake, data
//! verification, always_invalidate responses, failover, reconnect, IO waiting through
//! an outage, heartbeat timeout, runtime path management and policies.

use crate::util;

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions, WcStatus};
use std::time::Duration;

use rtrs_spdk::client::{LinkEvent, MpPolicy, PathState};
use rtrs_spdk::Errno;
use util::{Harness, Setup, MS};

/// A plain request of 8 header bytes whose segments are copied at submit.
fn copy_io(
    tag: u64,
    dir: rtrs_spdk::client::Dir,
    sgl: &[rtrs_spdk::fabric::Sge],
    wait: rtrs_spdk::client::PathWait,
) -> rtrs_spdk::client::ClientIo<'_> {
    rtrs_spdk::client::ClientIo {
        tag,
        dir,
        usr: &[0; 8],
        sgl: rtrs_spdk::client::Sgl::Copy(sgl),
        admin: false,
        wait,
    }
}

fn clean(h: &Harness) {
    let t = h.total();
    assert!(t.errors.is_empty(), "errors: {:?}", t.errors);
    assert_eq!(t.mismatches, 0, "corrupted reads");
    assert_eq!(t.strays, 0, "double or stray completions");
    assert_eq!(
        t.submitted, t.completed,
        "every request completes exactly once"
    );
}

#[test]
fn connects_and_verifies_data_both_rkey_modes() {
    for new_rkey in [false, true] {
        let mut h = Harness::new(Setup {
            new_rkey,
            load_qd: 8,
            sizes: vec![512, 4096, 65536 - 4096, 12288],
            ..Setup::default()
        });
        h.connect();
        assert_eq!(h.events.borrow().as_slice(), &[LinkEvent::Connected]);
        assert_eq!(h.loads[0].borrow().core.queue_depth(), 64);
        assert_eq!(h.loads[1].borrow().core.permits(), 32);
        h.start_load(50);
        assert!(
            h.run_until(200_000, 1000, |h| h.total().verified >= 100),
            "{:?}",
            h.total()
        );
        h.drain(100_000, 1000);
        clean(&h);
        let st = h.sess.stats();
        assert_eq!(st.paths[0].reconnects_ok, 0);
        assert!(st.paths[0].rdma.write_cnt > 0 && st.paths[0].rdma.read_cnt > 0);
        assert!(st.to_json().contains("\"state\":\"connected\""));
    }
}

#[test]
fn data_verification_qd_1_to_128_all_sizes() {
    let sizes = vec![512, 1024, 4096, 8192, 32768, 65536, 126976];
    for (qd_per_core, new_rkey) in [(1usize, false), (8, true), (64, false), (64, true)] {
        let mut h = Harness::new(Setup {
            cores: 2,
            qd: 256,
            chunk: 128 * 1024,
            new_rkey,
            load_qd: qd_per_core,
            sizes: sizes.clone(),
            ..Setup::default()
        });
        h.connect();
        assert_eq!(h.loads[0].borrow().core.max_io_size(), 126976);
        let want = (qd_per_core as u64 * 2).max(16);
        h.start_load(want);
        assert!(
            h.run_until(500_000, 1000, |h| h.total().verified >= 2 * want),
            "qd {qd_per_core}: {:?}",
            h.total()
        );
        h.drain(100_000, 1000);
        clean(&h);
    }
}

#[test]
fn broken_path_under_load_fails_over_and_reconnects() {
    let mut h = Harness::new(Setup {
        paths: 2,
        load_qd: 16,
        sizes: vec![4096, 16384, 512],
        ..Setup::default()
    });
    h.connect();
    h.sess.set_policy(MpPolicy::RoundRobin);
    h.start_load(0);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 200));
    h.srv.borrow_mut().break_path(0);
    let before = h.total().verified;
    assert!(h.run_until(100_000, 1000, |h| h.sess.path_state(h.paths[0])
        != Some(PathState::Connected)));
    // IO continues on the other path meanwhile.
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= before + 200));
    // The broken path comes back by itself (delay 200 ms + jitter up to 300 ms).
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 2),
        "{:?}",
        h.sess.paths()
    );
    h.drain(100_000, 1000);
    clean(&h);
    let st = h.sess.stats();
    assert_eq!(st.paths[0].reconnects_ok, 1, "{}", st.to_json());
    let failover: u64 = st.paths.iter().map(|p| p.rdma.failover_cnt).sum();
    assert!(
        failover > 0,
        "in-flight requests were failed over: {}",
        st.to_json()
    );
    assert_eq!(
        h.events.borrow().as_slice(),
        &[LinkEvent::Connected],
        "one path stayed up"
    );
}

#[test]
fn io_waits_through_target_restart() {
    let mut h = Harness::new(Setup {
        paths: 1,
        load_qd: 8,
        ..Setup::default()
    });
    h.connect();
    h.start_load(0);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 50));
    h.srv.borrow_mut().stop();
    assert!(h.run_until(100_000, 1000, |h| h.sess.paths_up() == 0));
    // Outage of 2 s virtual time: requests wait (io_wait_timeout 10 s).
    h.run_until(2_000, MS, |_| false);
    assert!(h.outstanding() > 0, "requests are waiting");
    h.srv.borrow_mut().restart();
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 1),
        "{:?}",
        h.sess.paths()
    );
    h.verify_more(50, 100_000);
    h.drain(100_000, 1000);
    clean(&h);
    assert_eq!(
        h.events.borrow().as_slice(),
        &[
            LinkEvent::Connected,
            LinkEvent::Disconnected,
            LinkEvent::Connected
        ]
    );
    assert!(
        h.sess.stats().paths[0].reconnects_fail > 0 || h.sess.stats().paths[0].reconnects_ok == 1
    );
}

#[test]
fn io_fails_cleanly_after_the_wait_timeout() {
    let mut h = Harness::new(Setup {
        paths: 1,
        load_qd: 8,
        tweak: |c| c.io_wait_timeout = Duration::from_secs(1),
        ..Setup::default()
    });
    h.connect();
    h.start_load(0);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 20));
    h.srv.borrow_mut().stop();
    h.stop_load();
    // Every request ends (within wait timeout plus slack in virtual time) with -ENOTCONN.
    assert!(
        h.run_until(5_000, MS, |h| h.outstanding() == 0),
        "outstanding {}",
        h.outstanding()
    );
    let t = h.total();
    assert_eq!(t.submitted, t.completed);
    assert_eq!(t.strays, 0);
    assert_eq!(t.mismatches, 0);
    assert!(
        !t.errors.is_empty() && t.errors.iter().all(|&e| e == Errno::ENOTCONN),
        "{:?}",
        t.errors
    );
}

#[test]
fn blackholed_path_is_declared_dead_by_heartbeat() {
    let mut h = Harness::new(Setup {
        paths: 2,
        load_qd: 1,
        tweak: |c| {
            c.hb.interval = Duration::from_secs(1);
            c.hb.missed_max = 5;
            c.reconnect_delay = Duration::from_secs(1000);
        },
        ..Setup::default()
    });
    h.connect();
    // Heartbeats flow and measure latency.
    h.run_until(3_000, MS, |_| false);
    assert!(h.srv.borrow().stats.hb_acks > 0);
    h.srv.borrow_mut().blackhole_path(1);
    let t0 = h.sim.now();
    assert!(h.run_until(20_000, MS, |h| h.sess.path_state(h.paths[1])
        != Some(PathState::Connected)));
    let dead_after = h.sim.now() - t0;
    // Dead within interval x missed_max of going silent (common::Heartbeat).
    assert!(
        dead_after <= 5 * 1000 * MS,
        "declared dead after {dead_after} ns"
    );
    assert_eq!(h.sess.path_state(h.paths[0]), Some(PathState::Connected));
}

#[test]
fn runtime_path_management() {
    let mut h = Harness::new(Setup {
        paths: 2,
        load_qd: 4,
        ..Setup::default()
    });
    h.connect();
    h.start_load(0);
    h.sess.disconnect_path(h.paths[1]);
    assert!(h.run_until(100_000, 1000, |h| h.sess.path_state(h.paths[1])
        == Some(PathState::Closed)));
    h.verify_more(50, 100_000);
    h.sess.reconnect_path(h.paths[1]);
    assert!(h.run_until(100_000, 1000, |h| h.sess.paths_up() == 2));
    h.sess.remove_path(h.paths[0]);
    assert!(h.run_until(100_000, 1000, |h| h.sess.paths().len() == 1));
    h.verify_more(50, 100_000);
    h.sess.add_path(h.paths[0]);
    assert!(h.run_until(100_000, 1000, |h| h.sess.paths_up() == 2));
    h.sess.set_policy(MpPolicy::MinLatency);
    h.verify_more(50, 100_000);
    h.drain(100_000, 1000);
    clean(&h);
}

#[test]
fn no_reconnect_when_attempts_are_zero() {
    let mut h = Harness::new(Setup {
        paths: 1,
        load_qd: 2,
        tweak: |c| c.max_reconnect_attempts = 0,
        ..Setup::default()
    });
    h.connect();
    h.start_load(0);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 10));
    h.srv.borrow_mut().break_path(0);
    assert!(h.run_until(100_000, 1000, |h| h.sess.path_state(h.paths[0])
        == Some(PathState::Closed)));
    h.stop_load();
    // No path can come back: waiting IO fails at once instead of waiting 10 s.
    assert!(h.run_until(1_000, 1000, |h| h.outstanding() == 0));
    let t = h.total();
    assert_eq!(t.strays, 0);
    assert!(t.errors.iter().all(|&e| e == Errno::ENOTCONN));
}

#[test]
fn protocol_violations_are_path_errors_and_io_survives() {
    use util::fake_server::Evil;
    for (evil, new_rkey) in [
        (Evil::WInvOnWrite, false),
        (Evil::UnknownImm, false),
        (Evil::RkeyBufIdMismatch, true),
    ] {
        let mut h = Harness::new(Setup {
            paths: 2,
            new_rkey,
            load_qd: 8,
            ..Setup::default()
        });
        h.connect();
        h.start_load(0);
        assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 50));
        h.srv.borrow_mut().evil = Some(evil);
        // The violating response takes its path down; the request is failed over and
        // completes on the other path; the path comes back.
        assert!(
            h.run_until(100_000, 1000, |h| h
                .sess
                .paths()
                .iter()
                .any(|(_, s)| *s != PathState::Connected)),
            "{evil:?} did not take the path down"
        );
        assert!(
            h.run_until(20_000, MS, |h| h.sess.paths_up() == 2),
            "{:?}",
            h.sess.paths()
        );
        h.verify_more(50, 100_000);
        h.drain(100_000, 1000);
        clean(&h);
    }
}

#[test]
fn queue_depth_change_is_renegotiated() {
    let mut h = Harness::new(Setup {
        paths: 1,
        qd: 64,
        load_qd: 4,
        ..Setup::default()
    });
    h.connect();
    h.start_load(0);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 20));
    h.srv.borrow_mut().stop();
    h.stop_load();
    assert!(h.run_until(100_000, 1000, |h| h.sess.paths_up() == 0));
    {
        let mut s = h.srv.borrow_mut();
        s.qd = 32;
        s.restart();
    }
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 1),
        "{:?}",
        h.sess.paths()
    );
    h.run_until(100, 1000, |_| false);
    assert_eq!(h.loads[0].borrow().core.queue_depth(), 32);
    assert_eq!(h.loads[0].borrow().core.permits(), 16);
    // Requests waiting across the change ended (−ECONNRESET) or completed; none twice.
    assert!(h.run_until(10_000, 1000, |h| h.outstanding() == 0));
    let t = h.total();
    assert_eq!(t.strays, 0);
    assert_eq!(t.mismatches, 0);
    assert!(
        t.errors.iter().all(|&e| e == Errno::ECONNRESET),
        "{:?}",
        t.errors
    );
    let errs = t.errors.len();
    h.start_load(0);
    h.verify_more(50, 100_000);
    h.drain(100_000, 1000);
    assert_eq!(h.total().errors.len(), errs);
    assert_eq!(h.total().mismatches, 0);
}

#[test]
fn data_over_tcp_on_127_0_0_1() {
    for new_rkey in [false, true] {
        let mut h = Harness::new(Setup {
            tcp: true,
            paths: 2,
            new_rkey,
            load_qd: 8,
            sizes: vec![512, 4096, 61440],
            ..Setup::default()
        });
        h.connect();
        h.sess.set_policy(MpPolicy::RoundRobin);
        h.start_load(0);
        assert!(
            h.run_until(2_000_000, 1000, |h| h.total().verified >= 200),
            "{:?}",
            h.total()
        );
        h.drain(2_000_000, 1000);
        clean(&h);
        let st = h.sess.stats();
        assert!(
            st.paths.iter().all(|p| p.rdma.write_cnt > 0),
            "round-robin used both paths: {}",
            st.to_json()
        );
    }
}

#[test]
fn reads_answered_without_remote_invalidation_are_invalidated_locally() {
    for new_rkey in [false, true] {
        let mut h = Harness::new(Setup {
            paths: 1,
            new_rkey,
            load_qd: 4,
            sizes: vec![4096, 512],
            ..Setup::default()
        });
        h.connect();
        h.srv.borrow_mut().no_inv = true;
        h.start_load(0);
        // Every permit is reused many times: each READ re-binds a slot whose previous
        // binding was never retired remotely, so LOCAL_INV must come first or the
        // binding would fail and take the path down.
        assert!(
            h.run_until(200_000, 1000, |h| h.total().verified >= 400),
            "{:?}",
            h.total()
        );
        h.drain(100_000, 1000);
        clean(&h);
        assert_eq!(
            h.sess.stats().paths[0].reconnects_ok,
            0,
            "the path never went down"
        );
        assert_eq!(h.events.borrow().as_slice(), &[LinkEvent::Connected]);
    }
}

/// On a fabric that does local operations at once a READ asks no remote invalidation,
/// and its key is retired when the response is handled, before the request completes:
/// a server writing through it afterwards is refused, for a bounce area and for a
/// caller's own registered memory alike.
#[test]
fn a_read_key_is_retired_before_its_request_completes() {
    for (new_rkey, direct) in [(false, false), (true, false), (false, true)] {
        let mut h = Harness::new(Setup {
            paths: 1,
            new_rkey,
            direct,
            load_qd: 1,
            sizes: vec![4096],
            ..Setup::default()
        });
        h.connect();
        h.start_load(0);
        assert!(
            h.run_until(100_000, 1000, |h| h.total().verified >= 20),
            "{:?}",
            h.total()
        );
        let st = h.srv.borrow().stats.clone();
        assert!(st.reads > 0, "{st:?}");
        assert_eq!(
            st.reads_need_inval, 0,
            "no remote invalidation asked: {st:?}"
        );
        h.srv.borrow_mut().late_write = true;
        let srv = h.srv.clone();
        assert!(
            h.run_until(100_000, 1000, |_| srv.borrow().late_status.is_some()),
            "no late write was made"
        );
        assert_eq!(
            h.srv.borrow().late_status,
            Some(WcStatus::RemoteAccess),
            "a write through the key of a completed READ (new_rkey {new_rkey}, direct {direct})"
        );
        // The refusal broke the path; it comes back and the load goes on, verified.
        h.verify_more(20, 2_000_000);
        h.drain(100_000, 1000);
        clean(&h);
    }
}

/// Where local operations are posted work requests (verbs), a READ asks the server to
/// invalidate its key (`NEED_INVAL_F`), as the kernel's client does, and a response
/// without that invalidation is a path error: the key would stay live after the request
/// completed. The requests go on once the server answers as asked again.
#[test]
fn a_read_answered_without_the_invalidation_it_asked_for_is_a_path_error() {
    let mut h = Harness::new(Setup {
        paths: 1,
        load_qd: 1,
        sizes: vec![4096],
        client_fabric: Some(|inner| {
            std::sync::Arc::new(Restricted {
                inner,
                fast_mr: true,
                local_ops: false,
            })
        }),
        ..Setup::default()
    });
    h.connect();
    h.start_load(0);
    assert!(
        h.run_until(100_000, 1000, |h| h.total().verified >= 20),
        "{:?}",
        h.total()
    );
    let st = h.srv.borrow().stats.clone();
    assert!(st.reads > 0, "{st:?}");
    assert_eq!(st.reads_need_inval, st.reads, "every READ asked: {st:?}");
    h.srv.borrow_mut().no_inv = true;
    assert!(
        h.run_until(100_000, 1000, |h| h.events.borrow().len() > 1),
        "the path stayed up"
    );
    assert_eq!(h.events.borrow()[1], LinkEvent::Disconnected);
    h.srv.borrow_mut().no_inv = false;
    h.verify_more(20, 2_000_000);
    h.drain(100_000, 1000);
    clean(&h);
}

#[test]
fn rejected_connects_are_retried_then_succeed() {
    let mut h = Harness::new(Setup {
        paths: 1,
        load_qd: 2,
        ..Setup::default()
    });
    h.srv.borrow_mut().reject_next = 3;
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 1),
        "{:?}",
        h.sess.paths()
    );
    let st = h.sess.stats();
    assert_eq!(st.paths[0].reconnects_fail, 3, "{}", st.to_json());
    // The connect that finally succeeded was a reconnect (the 4th attempt).
    assert_eq!(st.paths[0].reconnects_ok, 1);
    assert_eq!(st.paths[0].last_error, None, "cleared once connected");
    // 3 rejected cid-0 requests, then cid 0 and one IO connection per core.
    assert_eq!(h.srv.borrow().requests, 3 + 3);
    h.start_load(20);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 40));
    h.drain(100_000, 1000);
    clean(&h);
}

#[test]
fn reconnect_attempts_are_bounded() {
    let mut h = Harness::new(Setup {
        paths: 1,
        load_qd: 1,
        tweak: |c| c.max_reconnect_attempts = 2,
        ..Setup::default()
    });
    h.srv.borrow_mut().reject_next = 100;
    assert!(
        h.run_until(20_000, MS, |h| h.sess.path_state(h.paths[0])
            == Some(PathState::Closed)),
        "{:?}",
        h.sess.paths()
    );
    // The first try plus two reconnect attempts.
    assert_eq!(h.srv.borrow().requests, 3);
    h.run_until(5_000, MS, |_| false);
    assert_eq!(h.srv.borrow().requests, 3, "no attempt after giving up");
    // A manual reconnect starts over.
    h.srv.borrow_mut().reject_next = 0;
    h.sess.reconnect_path(h.paths[0]);
    assert!(
        h.run_until(20_000, MS, |h| h.sess.paths_up() == 1),
        "{:?}",
        h.sess.paths()
    );
}

#[test]
fn duplicate_and_out_of_range_responses_are_ignored() {
    use util::fake_server::Evil;
    for (evil, new_rkey) in [
        (Evil::Duplicate, false),
        (Evil::Duplicate, true),
        (Evil::BadMsgId, false),
    ] {
        let mut h = Harness::new(Setup {
            paths: 1,
            new_rkey,
            load_qd: 8,
            ..Setup::default()
        });
        h.connect();
        h.start_load(0);
        for _ in 0..20 {
            let v = h.total().verified;
            h.srv.borrow_mut().evil = Some(evil);
            assert!(h.run_until(100_000, 1000, |h| h.total().verified >= v + 10));
        }
        h.drain(100_000, 1000);
        clean(&h);
        assert_eq!(
            h.sess.stats().paths[0].reconnects_ok,
            0,
            "{evil:?} did not take the path down"
        );
        assert_eq!(h.sess.paths_up(), 1);
    }
}

#[test]
fn a_dropped_core_handle_does_not_hold_up_teardown() {
    use rtrs_spdk::client::{ClientCompletion, ClientConfig, ClientSession, PathAddr};
    use rtrs_spdk::engine::{Ctx, PollResult, Simulation};
    use rtrs_spdk::fabric::loopback::LoopbackFabric;
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::Arc;
    use util::{Events, FakeServer};

    let lo = Arc::new(LoopbackFabric::new());
    let srv = Rc::new(RefCell::new(FakeServer::new(
        lo.clone(),
        1,
        64,
        64 * 1024,
        false,
        1 << 20,
    )));
    let mut sim = Simulation::new(2, 256);
    let s2 = srv.clone();
    sim.reactor(0).register(Box::new(move |_: &mut dyn Ctx| {
        if s2.borrow_mut().poll() {
            PollResult::Busy
        } else {
            PollResult::Idle
        }
    }));
    let addr = PathAddr::new(srv.borrow().addrs[0]);
    let mut cfg = ClientConfig::new("drop", vec![addr]);
    cfg.reconnect_delay = Duration::from_millis(100);
    let (sess, mut cores) = sim
        .reactor(0)
        .with_ctx(|cx| {
            ClientSession::open(cx, lo.clone(), cfg, Box::new(Events(Default::default())))
        })
        .unwrap();
    let mut core0 = cores.remove(0);
    drop(cores);
    sim.reactor(0).register(Box::new(move |cx: &mut dyn Ctx| {
        let mut out = [ClientCompletion::default(); 4];
        core0.poll(cx.now(), &mut out);
        PollResult::Idle
    }));
    let step_until = |sim: &mut Simulation, cond: &dyn Fn() -> bool| {
        for _ in 0..20_000 {
            if cond() {
                return true;
            }
            sim.advance(MS);
            sim.step();
        }
        cond()
    };
    assert!(step_until(&mut sim, &|| sess.paths_up() == 1));
    srv.borrow_mut().break_path(0);
    // The teardown does not wait for the missing core, and the path comes back.
    assert!(
        step_until(&mut sim, &|| sess.stats().paths[0].reconnects_ok >= 1
            && sess.paths_up() == 1),
        "{:?}",
        sess.paths()
    );
}

/// One client core of a session against a scripted server on the loopback fabric `lo`,
/// the client using `client_fabric` (`lo` itself, or a wrapper of it), both polled on one
/// simulated reactor. `connect` runs it until the session's limits reach the core, or
/// 20 s of virtual time pass (the caller asserts which).
struct OneCore {
    sim: rtrs_spdk::engine::Simulation,
    srv: std::rc::Rc<std::cell::RefCell<util::FakeServer>>,
    sess: rtrs_spdk::client::ClientSession,
    core: std::rc::Rc<std::cell::RefCell<rtrs_spdk::client::SessionCore>>,
    done: std::rc::Rc<std::cell::RefCell<Vec<rtrs_spdk::client::ClientCompletion>>>,
}

impl OneCore {
    fn connect(
        lo: std::sync::Arc<rtrs_spdk::fabric::loopback::LoopbackFabric>,
        client_fabric: std::sync::Arc<dyn rtrs_spdk::fabric::Fabric>,
        name: &str,
    ) -> OneCore {
        use rtrs_spdk::client::{ClientCompletion, ClientConfig, ClientSession, PathAddr};
        use rtrs_spdk::engine::{Ctx, PollResult, Simulation};
        use std::cell::RefCell;
        use std::rc::Rc;
        use util::{Events, FakeServer};

        let srv = Rc::new(RefCell::new(FakeServer::new(
            lo,
            1,
            64,
            64 * 1024,
            false,
            1 << 20,
        )));
        let mut sim = Simulation::new(1, 256);
        let s2 = srv.clone();
        sim.reactor(0).register(Box::new(move |_: &mut dyn Ctx| {
            if s2.borrow_mut().poll() {
                PollResult::Busy
            } else {
                PollResult::Idle
            }
        }));
        let addr = PathAddr::new(srv.borrow().addrs[0]);
        let cfg = ClientConfig::new(name, vec![addr]);
        let events = Box::new(Events(Default::default()));
        let (sess, mut cores) = sim
            .reactor(0)
            .with_ctx(|cx| ClientSession::open(cx, client_fabric, cfg, events))
            .expect("the session opens");
        let core = Rc::new(RefCell::new(cores.remove(0)));
        let done = Rc::new(RefCell::new(Vec::<ClientCompletion>::new()));
        let (c2, d2) = (core.clone(), done.clone());
        sim.reactor(0).register(Box::new(move |cx: &mut dyn Ctx| {
            let mut out = [ClientCompletion::default(); 8];
            let n = c2.borrow_mut().poll(cx.now(), &mut out);
            d2.borrow_mut().extend_from_slice(&out[..n]);
            PollResult::Idle
        }));
        for _ in 0..20_000 {
            if core.borrow().max_io_size() > 0 {
                break;
            }
            sim.advance(MS);
            sim.step();
        }
        OneCore {
            sim,
            srv,
            sess,
            core,
            done,
        }
    }
}

/// Every segment the client copies itself is checked at submit: a wrong address, a length
/// past the end of the registration, an unknown lkey and a deregistered region are each
/// refused with `SubmitError::BadSge` naming the entry, and nothing is dereferenced.
#[test]
fn segments_outside_registrations_are_refused_at_submit() {
    use rtrs_spdk::client::{ClientCompletion, ClientIo, Dir, Sgl, SubmitError};
    use rtrs_spdk::fabric::{Access, Fabric, MemBuf, Sge};

    let lo = std::sync::Arc::new(rtrs_spdk::fabric::loopback::LoopbackFabric::new());
    let OneCore {
        mut sim,
        sess: _sess,
        core,
        done,
        ..
    } = OneCore::connect(lo.clone(), lo.clone(), "sges");
    assert!(core.borrow().max_io_size() > 0, "the session connected");

    let mr = lo
        .register(
            MemBuf::zeroed(8192),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let gone = lo
        .register(
            MemBuf::zeroed(4096),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let gone_sge = gone.sge(0, 512);
    drop(gone);
    let good = mr.sge(0, 512);
    let bad_addr = Sge {
        addr: 0x10,
        len: 512,
        lkey: mr.lkey(),
    };
    let past_end = mr.sge(8192 - 512, 512);
    let past_end = Sge {
        len: 1024,
        ..past_end
    };
    let unknown_key = Sge {
        lkey: mr.lkey() ^ 0xffff_ff00,
        ..good
    };
    let now = 0;
    let cases: [(&str, Dir, [Sge; 2], usize); 8] = [
        ("bad address, WRITE", Dir::Write, [good, bad_addr], 1),
        ("bad address, READ", Dir::Read, [bad_addr, good], 0),
        ("len past the end, WRITE", Dir::Write, [past_end, good], 0),
        ("len past the end, READ", Dir::Read, [good, past_end], 1),
        ("unknown lkey, WRITE", Dir::Write, [good, unknown_key], 1),
        ("unknown lkey, READ", Dir::Read, [unknown_key, good], 0),
        ("deregistered, WRITE", Dir::Write, [gone_sge, good], 0),
        ("deregistered, READ", Dir::Read, [good, gone_sge], 1),
    ];
    for (what, dir, sgl, index) in cases {
        let bad = sgl[index];
        let io = copy_io(1, dir, &sgl, rtrs_spdk::client::PathWait::Session);
        assert_eq!(
            core.borrow_mut().submit(now, io),
            Err(SubmitError::BadSge {
                index,
                addr: bad.addr,
                len: bad.len,
                lkey: bad.lkey,
            }),
            "{what}"
        );
        // A single-segment READ is copied into as well, unless it lies in a region of
        // add_region.
        if dir == Dir::Read {
            let one = [bad];
            let io = ClientIo {
                sgl: Sgl::Copy(&one),
                ..io
            };
            assert!(
                matches!(
                    core.borrow_mut().submit(now, io),
                    Err(SubmitError::BadSge { index: 0, .. })
                ),
                "{what}, one segment"
            );
        }
    }
    assert_eq!(
        core.borrow().outstanding(),
        0,
        "no permit kept by a refusal"
    );

    // The same requests with good segments go through and complete.
    for (tag, dir) in [(2, Dir::Write), (3, Dir::Read)] {
        let sgl = [good, mr.sge(4096, 512)];
        let io = copy_io(tag, dir, &sgl, rtrs_spdk::client::PathWait::Session);
        core.borrow_mut().submit(now, io).unwrap();
    }
    for _ in 0..20_000 {
        if done.borrow().len() == 2 {
            break;
        }
        sim.advance(MS);
        sim.step();
    }
    let mut got = done.borrow().clone();
    got.sort_by_key(|c| c.tag);
    assert_eq!(
        got,
        [
            ClientCompletion {
                tag: 2,
                result: Ok(())
            },
            ClientCompletion {
                tag: 3,
                result: Ok(())
            }
        ]
    );
}

/// A loopback fabric as verbs resolves local memory (`local_memory`, left to the trait's
/// default, answers nothing), and, with `fast_mr` false, without a fast-registration slot
/// to give (a core cannot allocate its per-permit buffers); with `local_ops` false it
/// says, as verbs does, that its local operations are posted work requests, and only
/// that (local memory resolved as on the loopback).
struct Restricted {
    inner: std::sync::Arc<dyn rtrs_spdk::fabric::Fabric>,
    fast_mr: bool,
    local_ops: bool,
}

impl rtrs_spdk::fabric::Fabric for Restricted {
    fn kind(&self) -> rtrs_spdk::fabric::FabricKind {
        self.inner.kind()
    }
    fn local_memory(
        &self,
        sge: &rtrs_spdk::fabric::Sge,
        need: rtrs_spdk::fabric::Access,
    ) -> Option<std::sync::Arc<rtrs_spdk::fabric::mem::Backing>> {
        if self.local_ops {
            return None;
        }
        self.inner.local_memory(sge, need)
    }
    fn caps(&self) -> rtrs_spdk::fabric::FabricCaps {
        let mut caps = self.inner.caps();
        caps.local_ops_at_post &= self.local_ops;
        caps
    }
    fn domain(
        &self,
    ) -> Result<std::sync::Arc<dyn rtrs_spdk::fabric::Fabric>, rtrs_spdk::fabric::FabricError> {
        let inner = self.inner.domain()?;
        Ok(std::sync::Arc::new(Restricted {
            inner,
            fast_mr: self.fast_mr,
            local_ops: self.local_ops,
        }))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }
    fn register(
        &self,
        buf: rtrs_spdk::fabric::MemBuf,
        access: rtrs_spdk::fabric::Access,
    ) -> Result<rtrs_spdk::fabric::Mr, rtrs_spdk::fabric::FabricError> {
        self.inner.register(buf, access)
    }
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: rtrs_spdk::fabric::Access,
    ) -> Result<rtrs_spdk::fabric::Mr, rtrs_spdk::fabric::FabricError> {
        // SAFETY: the caller's promise is passed on unchanged.
        unsafe { self.inner.register_raw(addr, len, access) }
    }
    fn alloc_fast_mr(
        &self,
        scope: rtrs_spdk::fabric::KeyScope,
    ) -> Result<rtrs_spdk::fabric::FastMr, rtrs_spdk::fabric::FabricError> {
        if self.fast_mr {
            return self.inner.alloc_fast_mr(scope);
        }
        Err(rtrs_spdk::fabric::FabricError::Register {
            len: 0,
            cause: rtrs_spdk::fabric::SetupCause::refused("no fast-registration slot left (test)"),
        })
    }
    fn listen(
        &self,
        addr: std::net::SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn rtrs_spdk::fabric::Listener>, rtrs_spdk::fabric::FabricError> {
        self.inner.listen(addr, opts)
    }
    fn connect(
        &self,
        dst: std::net::SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<Box<dyn rtrs_spdk::fabric::Conn>, rtrs_spdk::fabric::FabricError> {
        self.inner.connect(dst, opts)
    }
}

/// A core whose per-permit buffers cannot be allocated knows the session's limits but has
/// no permits: submit answers `Busy` with capacity 0 (not `NoPath`: the session is up), and
/// nothing panics; the session itself stays connected.
#[test]
fn a_core_without_buffers_answers_busy_with_no_capacity() {
    use rtrs_spdk::client::{Dir, SubmitError};
    use rtrs_spdk::fabric::{Access, Fabric, MemBuf};

    let lo = std::sync::Arc::new(rtrs_spdk::fabric::loopback::LoopbackFabric::new());
    let starved = std::sync::Arc::new(Restricted {
        inner: lo.clone(),
        fast_mr: false,
        local_ops: true,
    });
    let mut one = OneCore::connect(lo.clone(), starved, "starved");
    let (core, done) = (one.core.clone(), one.done.clone());
    assert!(
        core.borrow().max_io_size() > 0,
        "the limits reached the core"
    );
    assert_eq!(core.borrow().queue_depth(), 64);
    assert_eq!(core.borrow().permits(), 0, "no buffers, no permits");

    let mr = lo
        .register(
            MemBuf::zeroed(4096),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let sgl = [mr.sge(0, 4096)];
    for dir in [Dir::Read, Dir::Write] {
        let io = copy_io(7, dir, &sgl, rtrs_spdk::client::PathWait::Session);
        assert_eq!(
            core.borrow_mut().submit(0, io),
            Err(SubmitError::Busy { capacity: 0 }),
            "{dir:?}"
        );
    }
    for _ in 0..100 {
        one.sim.advance(MS);
        one.sim.step();
    }
    assert_eq!(core.borrow().outstanding(), 0);
    assert!(
        done.borrow().is_empty(),
        "nothing was accepted, nothing completes"
    );
    assert_eq!(one.sess.paths_up(), 1, "the session stays connected");
}

/// On a fabric that keeps no table of local registrations (verbs), a READ into memory
/// the core was not given as a region cannot be resolved: it is refused with `BadSge`
/// (the SPDK bdev's memory registered after a core took its regions). Once the region is
/// added to the core, the same READ lands in it; once removed, it is refused again.
#[test]
fn reads_into_memory_the_core_was_not_given_fail_on_a_verbs_like_fabric() {
    use rtrs_spdk::client::{ClientCompletion, Dir, SubmitError};
    use rtrs_spdk::fabric::{Access, Fabric, MemBuf};

    let lo = std::sync::Arc::new(rtrs_spdk::fabric::loopback::LoopbackFabric::new());
    let client: std::sync::Arc<dyn Fabric> = std::sync::Arc::new(Restricted {
        inner: lo.clone(),
        fast_mr: true,
        local_ops: true,
    });
    let OneCore {
        mut sim,
        sess: _sess,
        core,
        done,
        ..
    } = OneCore::connect(lo, client.clone(), "lkeys");
    assert!(core.borrow().max_io_size() > 0, "the session connected");
    let mr = std::sync::Arc::new(
        client
            .register(
                MemBuf::zeroed(8192),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .unwrap(),
    );
    let one = [mr.sge(0, 4096)];
    let two = [mr.sge(0, 2048), mr.sge(4096, 2048)];
    let read = |tag, sgl| copy_io(tag, Dir::Read, sgl, rtrs_spdk::client::PathWait::Session);
    for sgl in [&one[..], &two[..]] {
        assert!(
            matches!(
                core.borrow_mut().submit(0, read(1, sgl)),
                Err(SubmitError::BadSge { index: 0, .. })
            ),
            "{} segment(s), no region",
            sgl.len()
        );
    }
    core.borrow_mut().add_region(mr.clone());
    core.borrow_mut().submit(0, read(2, &one)).unwrap();
    core.borrow_mut().submit(0, read(3, &two)).unwrap();
    for _ in 0..20_000 {
        if done.borrow().len() == 2 {
            break;
        }
        sim.advance(MS);
        sim.step();
    }
    let mut got = done.borrow().clone();
    got.sort_by_key(|c| c.tag);
    assert_eq!(
        got,
        [
            ClientCompletion {
                tag: 2,
                result: Ok(())
            },
            ClientCompletion {
                tag: 3,
                result: Ok(())
            }
        ]
    );
    core.borrow_mut().remove_region(mr.lkey());
    assert!(
        matches!(
            core.borrow_mut().submit(0, read(4, &one)),
            Err(SubmitError::BadSge { index: 0, .. })
        ),
        "refused again once the region was removed"
    );
}

/// Over a one-core loopback session: a 4 KiB READ (tag 9) submitted with `wait` (given
/// the submission time), then the server stopped before it answers; steps in virtual
/// time until the READ ends. The session, the buffer, the time from the submission to the
/// end and the completion.
fn read_as_the_server_stops(
    name: &str,
    wait: impl FnOnce(u64) -> rtrs_spdk::client::PathWait,
) -> (
    OneCore,
    rtrs_spdk::fabric::Mr,
    u64,
    rtrs_spdk::client::ClientCompletion,
) {
    use rtrs_spdk::client::Dir;
    use rtrs_spdk::fabric::{Access, Fabric, MemBuf};

    let lo = std::sync::Arc::new(rtrs_spdk::fabric::loopback::LoopbackFabric::new());
    let mut one = OneCore::connect(lo.clone(), lo.clone(), name);
    assert!(one.core.borrow().max_io_size() > 0, "the session connected");
    let mr = lo
        .register(
            MemBuf::zeroed(4096),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let t0 = one.sim.now();
    let sgl = [mr.sge(0, 4096)];
    let io = copy_io(9, Dir::Read, &sgl, wait(t0));
    one.core.borrow_mut().submit(t0, io).unwrap();
    one.srv.borrow_mut().stop();
    let mut ended = None;
    for _ in 0..40_000 {
        one.sim.advance(MS);
        one.sim.step();
        if let Some(c) = one.done.borrow().first() {
            ended = Some((one.sim.now() - t0, *c));
            break;
        }
    }
    let (after, c) = ended.expect("the request ended");
    (one, mr, after, c)
}

/// A request has one deadline, set when it is submitted (`PathWait::Until`): when its
/// path dies and no other comes back, it fails over, waits, and fails with −ENOTCONN at
/// that deadline, not `io_wait_timeout` (30 s here) after the failover. In virtual time.
#[test]
fn a_failed_over_request_keeps_its_deadline() {
    use rtrs_spdk::client::PathWait;
    let (_one, _mr, after, c) =
        read_as_the_server_stops("deadline", |t0| PathWait::Until(t0 + 3_000 * MS));
    assert_eq!(c.tag, 9);
    assert_eq!(c.result, Err(rtrs_spdk::Errno::ENOTCONN));
    assert!(
        (3_000 * MS..3_100 * MS).contains(&after),
        "ended {} ms after its submission",
        after / MS
    );
}

/// A request that waits with its caller (`PathWait::Caller`, the RNBD queue's) never
/// waits in the session: back with −ECONNRESET as soon as its path dies (no other path),
/// long before the session's `io_wait_timeout` (30 s); refused `Unreachable` while no
/// path is usable, its permit free again; `path_epoch` moves only when the core gets a
/// path. In virtual time.
#[test]
fn a_request_waiting_with_its_caller_never_waits_in_the_session() {
    use rtrs_spdk::client::{Dir, PathWait, SubmitError};
    let (mut one, mr, after, c) = read_as_the_server_stops("caller", |_| PathWait::Caller);
    assert_eq!((c.tag, c.result), (9, Err(rtrs_spdk::Errno::ECONNRESET)));
    assert!(
        after < 10_000 * MS,
        "back {} ms after its submission, as its path died (the session's wait is 30 s)",
        after / MS
    );
    let core = &one.core;
    assert_eq!(core.borrow().path_epoch(), 1, "one path given to the core");
    assert_eq!(
        core.borrow().outstanding(),
        0,
        "nothing kept in the session"
    );
    // No path now: refused, nothing held, nothing completes later.
    let sgl = [mr.sge(0, 4096)];
    let io = copy_io(2, Dir::Read, &sgl, PathWait::Caller);
    let now = one.sim.now();
    assert_eq!(
        core.borrow_mut().submit(now, io),
        Err(SubmitError::Unreachable)
    );
    assert_eq!(core.borrow().outstanding(), 0, "the permit is free again");
    for _ in 0..100 {
        one.sim.advance(MS);
        one.sim.step();
    }
    assert_eq!(
        one.done.borrow().len(),
        1,
        "the refused request never completes"
    );
    assert_eq!(core.borrow().path_epoch(), 1, "no path came");
}
