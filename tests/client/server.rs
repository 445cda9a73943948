//! End-to-end tests of the client against the real RTRS server (`rtrs_spdk::server`)
//! over the loopback fabric, both on simulated reactors with a virtual clock: data
//! verification at QD 1..128 and sizes 512 B..max_io_size with always_invalidate on
//! and off, a path broken under load, a restarted target, a blackholed path.

use crate::util;

use std::time::Duration;

use rtrs_spdk::client::{LinkEvent, MpPolicy, PathState};
use rtrs_spdk::server::ServerConfig;
use rtrs_spdk::Errno;
use util::real::RealHarness;
use util::{Rig, Setup, MS};

fn clean(h: &Rig) {
    let t = h.total();
    assert!(t.errors.is_empty(), "errors: {:?}", t.errors);
    assert_eq!(t.mismatches, 0, "corrupted reads");
    assert_eq!(t.strays, 0, "double or stray completions");
    assert_eq!(
        t.submitted, t.completed,
        "every request completes exactly once"
    );
}

fn server_cfg(qd: u16, always_invalidate: bool) -> ServerConfig {
    ServerConfig {
        queue_depth: qd,
        chunk_size: 128 * 1024,
        always_invalidate,
        ..ServerConfig::default()
    }
}

#[test]
fn data_verification_qd_1_to_128_sizes_512_to_max_io() {
    let sizes = vec![512, 1024, 4096, 8192, 65536, 126976];
    for ai in [true, false] {
        for per_core in [1usize, 16, 64] {
            let mut h = RealHarness::new(
                Setup {
                    cores: 2,
                    load_qd: per_core,
                    sizes: sizes.clone(),
                    ..Setup::default()
                },
                server_cfg(128, ai),
            );
            h.connect();
            assert_eq!(h.loads[0].borrow().core.max_io_size(), 126976);
            assert_eq!(h.loads[0].borrow().core.queue_depth(), 128);
            let want = (per_core as u64 * 2).max(24);
            h.start_load(want);
            assert!(
                h.run_until(1_000_000, 1000, |h| h.total().verified >= 2 * want),
                "always_invalidate {ai} qd {per_core}: {:?}",
                h.total()
            );
            h.drain(200_000, 1000);
            clean(&h);
        }
    }
}

#[test]
fn two_paths_one_broken_under_load() {
    for ai in [true, false] {
        let mut h = RealHarness::new(
            Setup {
                paths: 2,
                load_qd: 16,
                sizes: vec![4096, 65536, 512],
                ..Setup::default()
            },
            server_cfg(64, ai),
        );
        h.connect();
        h.sess.set_policy(MpPolicy::RoundRobin);
        h.start_load(0);
        assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 200));
        h.break_path(0);
        assert!(h.run_until(100_000, 1000, |h| h.sess.path_state(h.paths[0])
            != Some(PathState::Connected)));
        h.verify_more(200, 200_000);
        assert!(
            h.run_until(40_000, MS, |h| h.sess.paths_up() == 2),
            "path comes back: {:?}",
            h.sess.paths()
        );
        h.verify_more(200, 200_000);
        h.drain(200_000, 1000);
        clean(&h);
        let st = h.sess.stats();
        assert_eq!(st.paths[0].reconnects_ok, 1, "{}", st.to_json());
        assert_eq!(h.events.borrow().as_slice(), &[LinkEvent::Connected]);
    }
}

#[test]
fn target_restart_io_completes_after_reconnect() {
    let mut h = RealHarness::new(
        Setup {
            paths: 1,
            load_qd: 8,
            ..Setup::default()
        },
        server_cfg(64, true),
    );
    h.connect();
    h.start_load(0);
    assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 50));
    h.stop_target();
    assert!(h.run_until(100_000, 1000, |h| h.sess.paths_up() == 0));
    h.run_until(2_000, MS, |_| false);
    assert!(h.outstanding() > 0, "IO issued during the outage waits");
    h.start_target();
    assert!(
        h.run_until(40_000, MS, |h| h.sess.paths_up() == 1),
        "{:?}",
        h.sess.paths()
    );
    h.verify_more(50, 200_000);
    h.drain(200_000, 1000);
    clean(&h);
    assert_eq!(
        h.events.borrow().as_slice(),
        &[
            LinkEvent::Connected,
            LinkEvent::Disconnected,
            LinkEvent::Connected
        ]
    );
}

#[test]
fn all_paths_down_io_fails_cleanly_after_the_wait() {
    let mut h = RealHarness::new(
        Setup {
            paths: 2,
            load_qd: 8,
            tweak: |c| c.io_wait_timeout = Duration::from_secs(2),
            ..Setup::default()
        },
        server_cfg(64, true),
    );
    h.connect();
    h.start_load(0);
    assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 50));
    h.stop_target();
    h.stop_load();
    assert!(
        h.run_until(10_000, MS, |h| h.outstanding() == 0),
        "outstanding {}",
        h.outstanding()
    );
    let t = h.total();
    assert_eq!(t.submitted, t.completed);
    assert_eq!((t.strays, t.mismatches), (0, 0));
    assert!(
        !t.errors.is_empty() && t.errors.iter().all(|&e| e == Errno::ENOTCONN),
        "{:?}",
        t.errors
    );
}

#[test]
fn blackholed_path_dead_within_heartbeat_bound() {
    let mut h = RealHarness::new(
        Setup {
            paths: 2,
            load_qd: 4,
            tweak: |c| {
                c.hb.interval = Duration::from_secs(1);
                c.reconnect_delay = Duration::from_secs(1000);
            },
            ..Setup::default()
        },
        server_cfg(64, true),
    );
    h.connect();
    h.run_until(3_000, MS, |_| false);
    let st = h.sess.stats();
    assert!(
        st.paths.iter().all(|p| p.cur_latency_ns > 0),
        "heartbeat latency measured: {}",
        st.to_json()
    );
    h.start_load(0);
    assert!(h.run_until(100_000, 1000, |h| h.total().verified >= 50));
    h.blackhole_path(1);
    let t0 = h.sim.now();
    assert!(h.run_until(20_000, MS, |h| h.sess.path_state(h.paths[1])
        != Some(PathState::Connected)));
    let after = h.sim.now() - t0;
    assert!(
        after <= 5 * 1000 * MS,
        "dead after {after} ns (interval 1 s, missed_max 5: within 5 s)"
    );
    assert_eq!(h.sess.path_state(h.paths[0]), Some(PathState::Connected));
    // Requests stuck on the silent path were failed over; all complete, intact.
    h.verify_more(50, 100_000);
    h.drain(100_000, 1000);
    clean(&h);
    let st = h.sess.stats();
    assert!(st.paths[0].rdma.failover_cnt > 0, "{}", st.to_json());
}

#[test]
fn kernel_defaults_on_both_sides() {
    // Server: queue depth 512, 128 KiB chunks, always_invalidate; client: defaults.
    let mut h = RealHarness::new(
        Setup {
            load_qd: 32,
            sizes: vec![4096, 126976],
            ..Setup::default()
        },
        ServerConfig::default(),
    );
    h.connect();
    {
        let l = h.loads[0].borrow();
        let core = &l.core;
        assert_eq!(
            (core.queue_depth(), core.max_io_size(), core.permits()),
            (512, 126976, 256)
        );
        assert_eq!(core.max_usr_hdr(), 4096 - 24);
    }
    h.start_load(64);
    assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 128));
    h.drain(100_000, 1000);
    clean(&h);
}

#[test]
fn zero_copy_reads_into_registered_regions() {
    for ai in [true, false] {
        let mut h = RealHarness::new(
            Setup {
                paths: 2,
                load_qd: 16,
                direct: true,
                sizes: vec![512, 4096, 65536, 126976],
                ..Setup::default()
            },
            server_cfg(64, ai),
        );
        h.connect();
        h.start_load(0);
        assert!(h.run_until(200_000, 1000, |h| h.total().verified >= 300));
        // Failover of zero-copy reads too.
        h.break_path(1);
        h.verify_more(300, 200_000);
        h.drain(200_000, 1000);
        clean(&h);
        let st = h.sess.stats();
        let direct: u64 = st.paths.iter().map(|p| p.direct_reads).sum();
        let reads: u64 = st.paths.iter().map(|p| p.rdma.read_cnt).sum();
        // Every third request of the workload has three segments (bounce); the others
        // are single-segment reads into the registered buffer.
        assert!(
            direct > reads / 2 && direct < reads,
            "direct {direct} of {reads} reads"
        );
    }
}
