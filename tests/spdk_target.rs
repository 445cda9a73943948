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
//! data repeated over 300 blocks, read back. Every wait is bounded (seconds); nothing is
//! timed.

use std::sync::Arc;

use rtrs_spdk::engine::{Adaptive, CpuMask, Engine, EngineConfig, IdleStrategy};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;

#[path = "util/rnbd_workload.rs"]
mod rnbd_workload;

#[path = "util/legacy_client.rs"]
mod legacy_client;

// Only the server tests' client (to attack the target's isolation) is used here; its
// harness and RAM handler are the server crate's.
#[allow(dead_code)]
#[path = "util/server/mod.rs"]
mod server_util;

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

/// The RTRS level of the target in another process, driven from the test thread.
struct Remote {
    fabric: Arc<dyn Fabric>,
    addr: std::net::SocketAddr,
}

impl server_util::Driver for Remote {
    fn step(&mut self) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    fn client_fabric(&self) -> Arc<dyn Fabric> {
        Arc::clone(&self.fabric)
    }
    fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }
    fn max_steps(&self) -> usize {
        50_000
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
    let mut d = Remote {
        fabric: Arc::new(TcpFabric::new()),
        addr,
    };
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
