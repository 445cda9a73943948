//! Unit tests of the client's pure pieces: permits, multipath policies, the path state
//! machine, the reconnect policy, statistics and configuration parsing.

use std::time::Duration;

use rtrs_spdk::client::permit::{partition, Permits};
use rtrs_spdk::client::policy::{Candidate, PathSet, Selector};
use rtrs_spdk::client::reconnect::{check_queue_depth, jitter, QdCheck, Reconnect};
use rtrs_spdk::client::state::PathStateCell;
use rtrs_spdk::client::stats::{
    lat_bucket, ClientStats, CoreStats, HomeStats, PathStats, LAT_BUCKETS,
};
use rtrs_spdk::client::{
    check_sessname, ClientConfig, MpPolicy, PathAddr, PathState, ReconnectPolicy, ReconnectStep,
};

#[test]
fn partition_covers_every_buf_id_once() {
    for qd in [1u16, 2, 7, 64, 512, 65535] {
        for cores in [1usize, 2, 3, 8] {
            let mut next = 0u16;
            for c in 0..cores {
                let r = partition(qd, cores, c);
                assert_eq!(r.start, next, "qd {qd} cores {cores} core {c}");
                next = r.end;
            }
            assert_eq!(next, qd);
        }
    }
    assert!(partition(1, 2, 0).is_empty() || partition(1, 2, 1).is_empty());
}

#[test]
fn permits_lowest_first_and_exhaustion() {
    let mut p = Permits::new(100..170);
    assert_eq!(p.capacity(), 70);
    let got: Vec<u16> = (0..70).map(|_| p.get().unwrap()).collect();
    assert_eq!(got, (100..170).collect::<Vec<_>>());
    assert_eq!(p.get(), None);
    assert!(p.put(135));
    assert!(!p.put(135), "double put refused");
    assert!(!p.put(99), "foreign id refused");
    assert_eq!(p.get(), Some(135));
    assert_eq!(p.in_use(), 70);
    let mut empty = Permits::new(5..5);
    assert_eq!(empty.get(), None);
}

fn cands(v: &[(bool, u32, u64)]) -> Vec<Candidate> {
    v.iter()
        .map(|&(usable, inflight, latency_ns)| Candidate {
            usable,
            inflight,
            latency_ns,
        })
        .collect()
}

#[test]
fn round_robin_skips_unusable_and_wraps() {
    let c = cands(&[(true, 0, 0), (false, 0, 0), (true, 0, 0), (true, 0, 0)]);
    let mut s = Selector::new();
    let picks: Vec<_> = (0..6)
        .map(|_| s.select(MpPolicy::RoundRobin, &c, PathSet::EMPTY).unwrap())
        .collect();
    assert_eq!(picks, vec![0, 2, 3, 0, 2, 3]);
    let mut tried = PathSet::EMPTY;
    tried.insert(0);
    tried.insert(2);
    tried.insert(3);
    assert_eq!(s.select(MpPolicy::RoundRobin, &c, tried), None);
}

#[test]
fn select_only_matches_select_over_one_slot() {
    for policy in [
        MpPolicy::RoundRobin,
        MpPolicy::MinInflight,
        MpPolicy::MinLatency,
    ] {
        for (usable, tried0) in [(true, false), (true, true), (false, false), (false, true)] {
            let c = cands(&[(usable, 7, 300)]);
            let mut tried = PathSet::EMPTY;
            if tried0 {
                tried.insert(0);
            }
            let (mut a, mut b) = (Selector::new(), Selector::new());
            for _ in 0..3 {
                let want = a.select(policy, &c, tried);
                let got = b.select_only(policy, usable && !tried.contains(0));
                assert_eq!(got, want, "{policy:?} usable={usable} tried={tried0}");
            }
            // The round-robin cursor moved the same way: the next pick over two slots
            // agrees too.
            let two = cands(&[(true, 0, 0), (true, 0, 0)]);
            assert_eq!(
                b.select(policy, &two, PathSet::EMPTY),
                a.select(policy, &two, PathSet::EMPTY)
            );
        }
    }
}

#[test]
fn min_inflight_and_min_latency() {
    let c = cands(&[
        (true, 5, 900),
        (true, 2, 300),
        (false, 0, 1),
        (true, 2, 100),
    ]);
    let mut s = Selector::new();
    assert_eq!(
        s.select(MpPolicy::MinInflight, &c, PathSet::EMPTY),
        Some(1),
        "tie goes to the earlier path"
    );
    assert_eq!(s.select(MpPolicy::MinLatency, &c, PathSet::EMPTY), Some(3));
    let mut tried = PathSet::EMPTY;
    tried.insert(3);
    assert_eq!(s.select(MpPolicy::MinLatency, &c, tried), Some(1));
    assert_eq!(
        s.select(
            MpPolicy::MinInflight,
            &cands(&[(false, 0, 0)]),
            PathSet::EMPTY
        ),
        None
    );
}

#[test]
fn policy_names_parse_like_sysfs() {
    for (s, p) in [
        ("0", MpPolicy::RoundRobin),
        ("rr", MpPolicy::RoundRobin),
        ("Round-Robin", MpPolicy::RoundRobin),
        ("1", MpPolicy::MinInflight),
        ("MI", MpPolicy::MinInflight),
        ("min-inf", MpPolicy::MinInflight),
        ("2", MpPolicy::MinLatency),
        ("min-latency", MpPolicy::MinLatency),
    ] {
        assert_eq!(s.parse::<MpPolicy>().unwrap(), p, "{s}");
    }
    assert!("min".parse::<MpPolicy>().is_err(), "ambiguous prefix");
    assert!("fastest"
        .parse::<MpPolicy>()
        .unwrap_err()
        .to_string()
        .contains("fastest"));
    assert_eq!(MpPolicy::default(), MpPolicy::MinInflight);
    assert_eq!(MpPolicy::MinLatency.to_string(), "min-latency (ML: 2)");
}

#[test]
fn state_machine_follows_the_kernel_table() {
    use PathState::*;
    let all = [
        Connecting,
        ConnectingErr,
        Reconnecting,
        Connected,
        Closing,
        Closed,
        Dead,
    ];
    let allowed = [
        (Reconnecting, Connecting),
        (Connected, Reconnecting),
        (ConnectingErr, Reconnecting),
        (Closed, Reconnecting),
        (Connecting, Connected),
        (Connecting, ConnectingErr),
        (Connecting, Closing),
        (ConnectingErr, Closing),
        (Reconnecting, Closing),
        (Connected, Closing),
        (Closing, Closed),
        (Closed, Dead),
    ];
    for from in all {
        for to in all {
            assert_eq!(
                from.can_become(to),
                allowed.contains(&(from, to)),
                "{from} -> {to}"
            );
        }
    }
    let cell = PathStateCell::new(Connecting);
    assert_eq!(cell.change(Connected), Ok(Connecting));
    let err = cell.change(Connecting).unwrap_err();
    assert_eq!((err.from, err.to), (Connected, Connecting));
    assert!(err.to_string().contains("connected -> connecting"));
    assert!(!cell.change_from(Connecting, Closing));
    assert!(cell.change_from(Connected, Reconnecting));
    assert_eq!(cell.get(), Reconnecting);
    assert_eq!(Connected.sysfs(), "connected");
    assert_eq!(Reconnecting.sysfs(), "disconnected");
}

#[test]
fn reconnect_attempts_and_jitter() {
    let pol = ReconnectPolicy {
        delay: Duration::from_millis(100),
        jitter: Duration::from_millis(300),
        max_attempts: 2,
    };
    let mut r = Reconnect::new(pol);
    for rnd in [0u64, 299_999_999] {
        match r.next(rnd) {
            ReconnectStep::After(d) => {
                assert!(
                    d >= Duration::from_millis(100) && d < Duration::from_millis(400),
                    "{d:?}"
                );
            }
            ReconnectStep::GiveUp => panic!("attempts left"),
        }
    }
    assert_eq!(r.next(5), ReconnectStep::GiveUp);
    r.on_success();
    assert!(matches!(r.next(5), ReconnectStep::After(_)));

    let mut never = Reconnect::new(ReconnectPolicy {
        max_attempts: 0,
        ..pol
    });
    assert_eq!(never.next(1), ReconnectStep::GiveUp);
    let mut forever = Reconnect::new(ReconnectPolicy {
        max_attempts: -1,
        ..pol
    });
    for i in 0..10_000u64 {
        assert!(matches!(forever.next(i), ReconnectStep::After(_)));
    }
    assert_eq!(jitter(Duration::ZERO, 12345), Duration::ZERO);
    assert_eq!(
        jitter(Duration::from_nanos(10), 12345),
        Duration::from_nanos(5)
    );
    assert_eq!(
        ReconnectPolicy::default().jitter,
        Duration::from_millis(500)
    );
}

#[test]
fn jitter_is_really_random() {
    // Real randomness: 64 draws over 500 ms land on many distinct values and spread far
    // beyond the kernel's 0..7 ms.
    let draws: Vec<Duration> = (0..64)
        .map(|_| jitter(Duration::from_millis(500), rtrs_spdk::common::random_u64()))
        .collect();
    let mut uniq = draws.clone();
    uniq.sort();
    uniq.dedup();
    assert!(uniq.len() > 32, "{draws:?}");
    assert!(
        draws.iter().any(|d| *d > Duration::from_millis(50)),
        "{draws:?}"
    );
}

#[test]
fn queue_depth_change_renegotiates() {
    assert_eq!(check_queue_depth(None, 512), QdCheck::Same);
    assert_eq!(check_queue_depth(Some(512), 512), QdCheck::Same);
    assert_eq!(
        check_queue_depth(Some(512), 128),
        QdCheck::Renegotiate { old: 512, new: 128 }
    );
}

#[test]
fn stats_sum_per_core_and_render_json() {
    let home = HomeStats::default();
    let a = CoreStats::default();
    let b = CoreStats::default();
    a.on_post(true, 4096 + 32, 1);
    b.on_post(false, 512 + 32, 3);
    b.on_post(false, 512 + 32, 200);
    a.failover_cnt.add(1);
    a.on_poll(3);
    b.on_poll(0);
    b.on_poll(5);
    a.on_latency(1500);
    home.reconnect_ok
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let s = PathStats::collect(
        "127.0.0.1:1234".into(),
        "connected".into(),
        &home,
        &[&a, &b],
    );
    assert_eq!(s.rdma_line(), "2 1088 1 4128 0 1");
    assert_eq!(
        s.reconnects_line(),
        "0 0",
        "successful starts at -1 and reads 0 after the first connect"
    );
    assert_eq!(s.cpu_migration_from, vec![0, 0]);
    assert_eq!(s.wc_completion.polls, 2);
    assert_eq!(s.wc_completion.completions, 8);
    assert_eq!(s.wc_completion.max_per_poll, 5);
    assert_eq!(s.sg_entries[1] + s.sg_entries[3] + s.sg_entries[17], 3);
    assert_eq!(s.latency_hist[lat_bucket(1500)], 1);
    assert_eq!(lat_bucket(0), 0);
    assert_eq!(lat_bucket(1024), 10);
    assert_eq!(lat_bucket(u64::MAX), LAT_BUCKETS - 1);
    let all = ClientStats {
        sessname: "s\"1".into(),
        mp_policy: "min-inflight".into(),
        paths: vec![s],
    };
    let j = all.to_json();
    assert!(
        j.starts_with("{\"sessname\":\"s\\\"1\",\"mp_policy\":\"min-inflight\",\"paths\":[{"),
        "{j}"
    );
    assert!(j.contains("\"rdma\":{\"read_cnt\":2,\"read_bytes\":1088,\"write_cnt\":1,\"write_bytes\":4128,\"inflight\":0,\"failover_cnt\":1}"), "{j}");
    assert!(
        j.contains("\"reconnects\":{\"successful\":0,\"failed\":0}"),
        "{j}"
    );
    assert!(j.ends_with("]}"));
    a.reset();
    assert_eq!(a.write_cnt.get(), 0);
}

#[test]
fn config_defaults_and_paths() {
    let p: PathAddr = "127.0.0.1:1234".parse().unwrap();
    let c = ClientConfig::new("sess", vec![p]);
    assert_eq!(c.mp_policy, MpPolicy::MinInflight);
    assert_eq!(c.max_reconnect_attempts, -1);
    assert_eq!(c.reconnect_delay, Duration::from_secs(30));
    assert_eq!(c.hb.interval, Duration::from_secs(5));
    assert_eq!(c.hb.missed_max, 5);
    assert_eq!(c.connect_timeout, Duration::from_secs(30));
    let q: PathAddr = "127.0.0.2,127.0.0.1:1234".parse().unwrap();
    assert_eq!(q.src.unwrap().ip().to_string(), "127.0.0.2");
    assert_eq!(q.to_string(), "127.0.0.2:0@127.0.0.1:1234");
    let r: PathAddr = "[::1]:5@[::1]:1234".parse().unwrap();
    assert_eq!(r.dst.port(), 1234);
    let e = "nohost".parse::<PathAddr>().unwrap_err();
    assert!(e.to_string().contains("nohost"), "{e}");
    assert!(check_sessname("ok-name").is_ok());
    assert!(check_sessname("a/b").is_err());
    assert!(check_sessname("a.b").is_err());
    assert!(check_sessname("").is_err());
    assert!(check_sessname(&"x".repeat(255)).is_err());
}

#[test]
fn handles_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<rtrs_spdk::client::Session>();
    send::<rtrs_spdk::client::SessionCore>();
    send_sync::<ClientStats>();
}
