//! RNBD over RTRS over the tcp fabric on 127.0.0.1, on two real reactor threads: the
//! server on both cores, one client session whose home core (0) maps a device and
//! writes and reads it back at queue depth 16 while core 1 reads and verifies the same
//! data through its own connection; then flush, discard, write-zeroes and close.
//! Every wait is bounded (seconds); nothing is timed.

use std::sync::Arc;

use rtrs_spdk::engine::{Adaptive, CpuMask, Engine, EngineConfig, IdleStrategy};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::rnbd::server::{Exports, RnbdServer};
use rtrs_spdk::server::{Server, ServerConfig};

#[path = "util/rnbd_workload.rs"]
mod rnbd_workload;

#[path = "util/legacy_client.rs"]
mod legacy_client;

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
