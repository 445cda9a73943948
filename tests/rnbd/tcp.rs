//! RNBD over RTRS over the tcp fabric on 127.0.0.1, on two real reactor threads: the
//! server on both cores, one client session whose home core (0) maps a device and
//! writes and reads it back at queue depth 16 while core 1 reads and verifies the same
//! data through its own connection; then flush, discard, write-zeroes and close. The
//! same with a pre-shared key on both sides, and a wrong key refused for good.
//! Every wait is bounded (seconds); nothing is timed.

use crate::legacy_client;
use crate::rnbd_workload;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rtrs_spdk::client::{ClientConfig, ClientSession, PathAddr, PathState};
use rtrs_spdk::engine::{Adaptive, CpuMask, Ctx, Engine, EngineConfig, IdleStrategy, Msg};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{Fabric, Psk};
use rtrs_spdk::rnbd::client::LinkListener;
use rtrs_spdk::rnbd::server::{Exports, RnbdServer};
use rtrs_spdk::server::{Server, ServerConfig};

#[test]
fn write_read_verify_over_tcp_on_two_reactors() {
    let mut cfg = EngineConfig::new(CpuMask::parse("[0-1]").unwrap());
    cfg.idle = IdleStrategy::Adaptive(Adaptive::default());
    cfg.pin = false;
    let engine = Engine::start(cfg).expect("engine");
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let exports = Arc::new(Exports::ram(&[("vol", 4 << 20)]).unwrap());
    let scfg = ServerConfig {
        queue_depth: 64,
        chunk_size: 128 << 10,
        ..ServerConfig::default()
    };
    let server = Server::start_on_engine(
        &engine,
        0,
        Arc::clone(&fabric),
        &["127.0.0.1:0".parse().unwrap()],
        scfg,
        RnbdServer::factory(exports),
    )
    .expect("server");
    let addr = server.local_addrs()[0];

    let (got, failure) = rnbd_workload::run(&engine, &fabric, "rnbd-tcp", &[addr], None, "vol", 1);
    if let Some(e) = failure {
        panic!("{e}");
    }
    assert_eq!(got, ["core 1 verified", "core 0 done"]);
    // An old kernel client's WRITE_SAME (op 5 with one block of data).
    let summary = legacy_client::write_same(&engine, &fabric, "rnbd-tcp-legacy", &[addr], "vol")
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{summary}");
    server.stop();
    engine.shutdown().expect("engine shutdown");
}

/// A key file's worth of key for these tests.
fn key(byte: u8) -> Psk {
    Psk::from_bytes(format!("key {byte}"), &[byte; 32]).unwrap()
}

fn start(engine: &Engine, fabric: &Arc<dyn Fabric>, psk: Option<Psk>) -> Server {
    let exports = Arc::new(Exports::ram(&[("vol", 4 << 20)]).unwrap());
    let scfg = ServerConfig {
        queue_depth: 64,
        chunk_size: 128 << 10,
        psk,
        ..ServerConfig::default()
    };
    Server::start_on_engine(
        engine,
        0,
        Arc::clone(fabric),
        &["127.0.0.1:0".parse().unwrap()],
        scfg,
        RnbdServer::factory(exports),
    )
    .expect("server")
}

fn two_reactors() -> Engine {
    let mut cfg = EngineConfig::new(CpuMask::parse("[0-1]").unwrap());
    cfg.idle = IdleStrategy::Adaptive(Adaptive::default());
    cfg.pin = false;
    Engine::start(cfg).expect("engine")
}

#[test]
fn write_read_verify_over_authenticated_tcp() {
    let engine = two_reactors();
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let server = start(&engine, &fabric, Some(key(1)));
    let addr = PathAddr::new(server.local_addrs()[0]);
    let mut cfg = ClientConfig::new("rnbd-tcp-psk", vec![addr]);
    cfg.set_psk(&key(1));
    let (got, failure) = rnbd_workload::run_with(&engine, &fabric, cfg, "vol", 1);
    if let Some(e) = failure {
        panic!("{e}");
    }
    assert_eq!(got, ["core 1 verified", "core 0 done"]);
    server.stop();
    engine.shutdown().expect("engine shutdown");
}

/// A wrong key is not a transient failure: with reconnects allowed for ever and a
/// short delay, the path is closed after the first refusal, says why, and stays closed.
#[test]
fn a_wrong_key_closes_the_path_without_retrying() {
    let engine = two_reactors();
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let server = start(&engine, &fabric, Some(key(1)));
    let addr = PathAddr::new(server.local_addrs()[0]);
    let mut cfg = ClientConfig::new("rnbd-tcp-bad-psk", vec![addr]);
    cfg.set_psk(&key(2));
    cfg.max_reconnect_attempts = -1;
    cfg.reconnect_delay = Duration::from_millis(10);
    cfg.reconnect_jitter = Duration::from_millis(1);
    let (stx, srx) = mpsc::channel();
    let f = Arc::clone(&fabric);
    engine
        .send(
            0,
            Msg::new(move |cx: &mut dyn Ctx| {
                let links = LinkListener::new();
                let (s, _cores) = ClientSession::open(cx, f, cfg, Box::new(links)).expect("open");
                let _ = stx.send(s);
            }),
        )
        .expect("mailbox");
    let session = srx.recv_timeout(Duration::from_secs(30)).expect("session");
    let start = Instant::now();
    let failure = loop {
        if let Some(f) = session.path_failure(addr) {
            break f;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no refusal");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(failure.contains("authentication failed"), "{failure}");
    assert_eq!(session.path_state(addr), Some(PathState::Closed));
    // Many reconnect delays later: still one failed attempt, still closed.
    std::thread::sleep(Duration::from_millis(300));
    let stats = session.stats();
    assert_eq!(stats.paths[0].reconnects_fail, 1, "{stats:?}");
    assert_eq!(session.path_state(addr), Some(PathState::Closed));
    assert_eq!(
        server.stats().sessions.len(),
        0,
        "the server never saw a session"
    );
    session.close();
    server.stop();
    engine.shutdown().expect("engine shutdown");
}
