//! Verified IO against an RTRS target running elsewhere — the SPDK plugin's target
//! (`spdk_tgt` + `librtrs_spdk.so`, `rtrs_target_listen` + `rtrs_target_export` of a
//! bdev), driven by `ci/spdk-target-test.sh`; ignored unless asked for with `--ignored`.
//!
//! Environment: `RTRS_TARGET_ADDR` (ip:port, or several comma-separated: one path
//! each, one session), `RTRS_TARGET_DEV` (export name, default
//! `vol`), `RTRS_TARGET_EXPECT` (`ok`, default, or `fail`: the device must refuse IO —
//! used after the export was removed, or while its bdev is hot-removed),
//! `RTRS_TARGET_ROUNDS` (write+read passes of the home core, default 1: a longer run
//! to act on the target meanwhile), `RTRS_TARGET_SRC` (the source address the paths
//! leave from, default any) and `RTRS_TARGET_SESSNAME` (default `spdk-target-test`),
//! which the target's host lists match.
//!
//! Two client reactors: the home core (0) maps the device, writes 256 blocks of 4 KiB
//! and reads them back at queue depth 16 while core 1 reads and verifies the same data
//! through its own connection; then flush, discard, write-zeroes, a read checking the
//! zeroes, and close. Then (unless a failure is expected, or a source address or session
//! name was given) an old kernel client's WRITE_SAME over its own session: one block of
//! data repeated over 300 blocks, read back. The other tests attack the target as a
//! client without a key would: another session's chunks (isolation), its session slots,
//! its connections, a session it joins uninvited. Every wait is bounded (seconds);
//! nothing is timed.

use std::sync::Arc;

use rtrs_spdk::engine::{Adaptive, CpuMask, Engine, EngineConfig, IdleStrategy};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;

#[path = "util/rnbd_workload.rs"]
mod rnbd_workload;

#[path = "util/legacy_client.rs"]
mod legacy_client;

// Only the server tests' client (to attack the target's isolation, slots, connections
// and sessions) is used here; its harness and RAM handler are the server crate's.
#[allow(dead_code)]
#[path = "util/server/mod.rs"]
mod server_util;

// RNBD spoken raw over that client.
#[allow(dead_code)]
#[path = "util/rnbd_raw.rs"]
mod rnbd_raw;

use rnbd_workload::{BLOCKS, BS};

#[test]
#[ignore = "needs an RTRS target: run by ci/spdk-target-test.sh (RTRS_TARGET_ADDR=ip:port)"]
fn verified_io_against_external_target() {
    let addr = std::env::var("RTRS_TARGET_ADDR")
        .expect("RTRS_TARGET_ADDR=ip:port of the target (ci/spdk-target-test.sh sets it)");
    let addrs: Vec<std::net::SocketAddr> = addr
        .split(',')
        .map(|a| {
            a.trim()
                .parse()
                .expect("RTRS_TARGET_ADDR is ip:port[,ip:port...]")
        })
        .collect();
    let dev_name = std::env::var("RTRS_TARGET_DEV").unwrap_or_else(|_| "vol".into());
    let expect_fail = std::env::var("RTRS_TARGET_EXPECT").is_ok_and(|v| v == "fail");
    let rounds: u32 = std::env::var("RTRS_TARGET_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let src: Option<std::net::IpAddr> = std::env::var("RTRS_TARGET_SRC")
        .ok()
        .map(|s| s.parse().expect("RTRS_TARGET_SRC is an IP address"));
    let sessname =
        std::env::var("RTRS_TARGET_SESSNAME").unwrap_or_else(|_| "spdk-target-test".into());
    let mut cfg = EngineConfig::new(CpuMask::parse("[0-1]").unwrap());
    cfg.idle = IdleStrategy::Adaptive(Adaptive::default());
    cfg.pin = false;
    let engine = Engine::start(cfg).expect("engine");
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());

    let (got, failure) =
        rnbd_workload::run(&engine, &fabric, &sessname, &addrs, src, &dev_name, rounds);
    println!("session to {addr}, device {dev_name}: {got:?}");
    // Only for the default identity: a host list made for the workload's source address
    // or session name would refuse the legacy client's own session.
    let default_host = src.is_none() && std::env::var_os("RTRS_TARGET_SESSNAME").is_none();
    let legacy = (!expect_fail && failure.is_none() && default_host).then(|| {
        legacy_client::write_same(&engine, &fabric, "spdk-target-legacy", &addrs, &dev_name)
    });
    engine.shutdown().expect("engine shutdown");
    if expect_fail {
        let e = failure.expect("IO to a removed export must fail");
        println!("refused as expected: {e}");
    } else {
        if let Some(e) = failure {
            panic!("{e}");
        }
        assert_eq!(got, ["core 1 verified", "core 0 done"]);
        println!(
            "verified {BLOCKS} blocks of {BS} bytes from two cores, flush/discard/write-zeroes ok"
        );
        if let Some(r) = legacy {
            println!("{}", r.unwrap_or_else(|e| panic!("legacy WRITE_SAME: {e}")));
        }
    }
}

/// One session cannot touch another's memory in the SPDK target backend either: while
/// verified RNBD IO runs on a session of its own, a victim session holds its chunks
/// (their addresses and current keys known to the test), and attacker sessions write
/// into them with those keys, the kernel's next ones and a guess: every write is
/// refused and the attacker's path closed, and the verified IO sees no error.
#[test]
#[ignore = "needs an RTRS target: run by ci/spdk-target-test.sh (RTRS_TARGET_ADDR=ip:port)"]
fn isolation_against_external_target() {
    use rtrs_spdk::fabric::{inc_rkey, next_rkey, SendOp, SendWr, WcStatus};
    use server_util::client::{Ids, TestPath};
    use server_util::Event;

    let addr: std::net::SocketAddr = std::env::var("RTRS_TARGET_ADDR")
        .expect("RTRS_TARGET_ADDR=ip:port of the target")
        .split(',')
        .next()
        .unwrap()
        .trim()
        .parse()
        .expect("RTRS_TARGET_ADDR is ip:port");
    let dev_name = std::env::var("RTRS_TARGET_DEV").unwrap_or_else(|_| "vol".into());
    let workload = std::thread::spawn(move || {
        let mut cfg = EngineConfig::new(CpuMask::parse("[0-1]").unwrap());
        cfg.idle = IdleStrategy::Adaptive(Adaptive::default());
        cfg.pin = false;
        let engine = Engine::start(cfg).expect("engine");
        let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
        let r = rnbd_workload::run(
            &engine,
            &fabric,
            "spdk-target-bystander",
            &[addr],
            None,
            &dev_name,
            3,
        );
        engine.shutdown().expect("engine shutdown");
        r
    });
    let mut d = rnbd_raw::Remote::new(addr);
    let victim = TestPath::connect(&mut d, "spdk-target-victim", 2, Ids::random(), true)
        .expect("the victim's session");
    let mut refused = 0;
    for (n, b) in [0usize, 1, 7, 100].into_iter().enumerate() {
        let (chunk, key) = victim.rbuf[b % victim.rbuf.len()];
        for (k, rkey) in [key, inc_rkey(key), next_rkey(key)].into_iter().enumerate() {
            let mut a = TestPath::connect(
                &mut d,
                &format!("spdk-target-attacker-{n}-{k}"),
                2,
                Ids::random(),
                true,
            )
            .expect("the attacker's own session");
            a.stage.write_at(0, &[0xEE; 4096]);
            let sge = [a.stage.sge(0, 4096)];
            a.cons[1]
                .post_send(&[SendWr {
                    wr_id: 77,
                    op: SendOp::RdmaWrite {
                        remote_addr: chunk,
                        rkey,
                    },
                    sges: &sge,
                    signaled: true,
                }])
                .expect("post");
            assert!(
                a.wait_down(&mut d),
                "a write into another session's chunk went through"
            );
            assert!(
                a.events.iter().any(|e| matches!(
                    e,
                    Event::Error {
                        status: WcStatus::RemoteAccess,
                        ..
                    }
                )),
                "{:?}",
                a.events
            );
            refused += 1;
        }
    }
    drop(victim);
    let (got, failure) = workload.join().expect("the verified workload");
    assert!(
        failure.is_none(),
        "verified IO beside the attacks: {failure:?}"
    );
    println!("isolated: {refused} writes into another session's chunks refused; bystander {got:?}");
}

/// The target's first address (`RTRS_TARGET_ADDR`).
fn target_addr() -> std::net::SocketAddr {
    std::env::var("RTRS_TARGET_ADDR")
        .expect("RTRS_TARGET_ADDR=ip:port of the target")
        .split(',')
        .next()
        .expect("one address at least")
        .trim()
        .parse()
        .expect("RTRS_TARGET_ADDR is ip:port")
}

/// A number from the environment.
fn env_num(name: &str) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name}=N (ci/spdk-target-test.sh sets it)"))
}

/// Session slots go to clients that use them in the SPDK target too: a host the
/// export's `allowed_hosts` refuses (127.0.0.2 .. 127.0.0.7) holds every session it can,
/// its OPENs refused, while verified IO from the allowed 127.0.0.1 runs. The target
/// caps sessions at `RTRS_TARGET_MAX_SESSIONS`.
#[test]
#[ignore = "needs an RTRS target: run by ci/spdk-target-test.sh (RTRS_TARGET_ADDR=ip:port)"]
fn slots_against_external_target() {
    use std::sync::atomic::Ordering;

    let addr = target_addr();
    let dev_name = std::env::var("RTRS_TARGET_DEV").unwrap_or_else(|_| "vol".into());
    let cap = env_num("RTRS_TARGET_MAX_SESSIONS");
    let a = Arc::new(rnbd_raw::Attack::default());
    let attack = rnbd_raw::refused_host(addr, &dev_name, Arc::clone(&a));
    let start = std::time::Instant::now();
    while a.made.load(Ordering::Relaxed) < 2 * cap {
        assert!(
            start.elapsed() < rnbd_workload::WAIT,
            "the refused host made no sessions"
        );
        assert!(!attack.is_finished(), "the refused host's thread failed");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut cfg = EngineConfig::new(CpuMask::parse("[0-1]").unwrap());
    cfg.idle = IdleStrategy::Adaptive(Adaptive::default());
    cfg.pin = false;
    let engine = Engine::start(cfg).expect("engine");
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let src = Some("127.0.0.1".parse().unwrap());
    let asked = std::time::Instant::now();
    let (got, failure) = rnbd_workload::run(
        &engine,
        &fabric,
        "spdk-target-allowed",
        &[addr],
        src,
        &dev_name,
        1,
    );
    let took = asked.elapsed();
    engine.shutdown().expect("engine shutdown");
    a.stop.store(true, Ordering::Release);
    attack.join().expect("the refused host's thread");
    if let Some(e) = failure {
        panic!("the allowed client was not served: {e}");
    }
    assert_eq!(got, ["core 1 verified", "core 0 done"]);
    let opens = a.opens.lock().unwrap().clone();
    assert!(
        opens
            .iter()
            .all(|&e| e == -libc::EACCES || e == -libc::ENOTCONN),
        "{opens:?}"
    );
    assert!(
        a.closed.load(Ordering::Relaxed) > 0,
        "no session of it gave way"
    );
    println!(
        "slots: allowed client verified in {:.2} s while a refused host made {} sessions ({} gave way, {} refused)",
        took.as_secs_f64(),
        a.made.load(Ordering::Relaxed),
        a.closed.load(Ordering::Relaxed),
        a.refused.lock().unwrap().len()
    );
}

/// Joining is authorised in the SPDK target too: a victim from 127.0.0.1 (which the
/// export's `allowed_hosts` admit) has the device open with data written; 127.0.0.3,
/// knowing its uuids, asks for a new path in its session and for a reconnect of its
/// path: both refused (−EACCES), the victim's data untouched.
#[test]
#[ignore = "needs an RTRS target: run by ci/spdk-target-test.sh (RTRS_TARGET_ADDR=ip:port)"]
fn join_against_external_target() {
    use rtrs_spdk::common::random_uuid;
    use rtrs_spdk::proto::rnbd::AccessMode;
    use server_util::client::{info_req, Ids, TestPath};

    let addr = target_addr();
    let dev_name = std::env::var("RTRS_TARGET_DEV").unwrap_or_else(|_| "vol".into());
    let mut d = rnbd_raw::Remote::new(addr);
    let from = |last: u8| Some(std::net::SocketAddr::from(([127, 0, 0, last], 0)));
    let ids = Ids::random();
    let mut victim = TestPath::connect_info_from(
        &mut d,
        from(1),
        addr,
        &info_req("spdk-target-join-victim"),
        2,
        ids,
        true,
    )
    .expect("the victim's session");
    let dev = rnbd_raw::open(&mut victim, &mut d, &dev_name, AccessMode::ReadWrite)
        .expect("the victim opens its device");
    let block: Vec<u8> = (0..4096).map(|i| (i % 251) as u8).collect();
    assert_eq!(rnbd_raw::write(&mut victim, &mut d, dev, 4096, &block), 0);
    let mut refused = 0;
    for ids in [
        Ids {
            sess_uuid: random_uuid(),
            ..ids
        },
        Ids {
            recon_cnt: ids.recon_cnt + 1,
            ..ids
        },
    ] {
        let got = TestPath::connect_info_from(
            &mut d,
            from(3),
            addr,
            &info_req("spdk-target-join-victim"),
            2,
            ids,
            false,
        )
        .err();
        assert_eq!(got, Some(-libc::EACCES), "a join from 127.0.0.3");
        refused += 1;
    }
    let (e, got) = rnbd_raw::read(&mut victim, &mut d, dev, 4096, 4096);
    assert_eq!(e, 0);
    assert!(got == block, "the victim's data changed");
    println!("join: {refused} joins from a refused address refused (EACCES), the victim's data untouched");
}

/// Connections are capped in the SPDK target too: a path asking for 1,000 connections is
/// refused at once (−EINVAL); one address asking for sessions of 16 connections gets
/// them up to `RTRS_TARGET_CONNS_PER_SOURCE`, then −EUSERS.
#[test]
#[ignore = "needs an RTRS target: run by ci/spdk-target-test.sh (RTRS_TARGET_ADDR=ip:port)"]
fn connections_against_external_target() {
    use rtrs_spdk::proto::rnbd::AccessMode;
    use server_util::client::{info_req, Ids, TestPath};

    let addr = target_addr();
    let dev_name = std::env::var("RTRS_TARGET_DEV").unwrap_or_else(|_| "vol".into());
    let per_source = env_num("RTRS_TARGET_CONNS_PER_SOURCE");
    let mut d = rnbd_raw::Remote::new(addr);
    let src = Some(std::net::SocketAddr::from(([127, 0, 0, 2], 0)));
    let mut session = |n: usize, cid_num: u16| {
        let mut p = TestPath::connect_info_from(
            &mut d,
            src,
            addr,
            &info_req(&format!("spdk-target-conns-{n}")),
            cid_num,
            Ids::random(),
            true,
        )?;
        rnbd_raw::open(&mut p, &mut d, &dev_name, AccessMode::ReadOnly).expect("open");
        Ok::<_, i32>(p)
    };
    assert_eq!(session(0, 1000).err(), Some(-libc::EINVAL));
    let (mut kept, mut refused) = (Vec::new(), Vec::new());
    for n in 1..=(per_source / 16 + 3) {
        match session(n, 16) {
            Ok(p) => kept.push(p),
            Err(e) => refused.push(e),
        }
    }
    assert_eq!(kept.len(), per_source / 16, "refused: {refused:?}");
    assert!(refused.iter().all(|&e| e == -libc::EUSERS), "{refused:?}");
    println!(
        "connections: a 1000-connection path refused (EINVAL); {} connections held, {} sessions refused (EUSERS)",
        kept.len() * 16,
        refused.len()
    );
}
