//! A target that refuses the session says why, at once: over the tcp fabric on
//! 127.0.0.1, a server whose chunk allocator fails (`ServerConfig::chunk_alloc`) rejects
//! every connection with −ENOMEM; the client's OPEN then fails with the reason long
//! before any timeout (the session's are 30 s, the waits here 10 s). A transient failure
//! (nothing listening) is not reported that way, and a refused session that a later retry
//! gets through is connected and no longer refused. Every wait is bounded; nothing is
//! timed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rtrs_spdk::client::{ClientCompletion, ClientConfig, ClientSession, PathAddr, SessionCore};
use rtrs_spdk::engine::{
    Adaptive, CpuMask, Ctx, Engine, EngineConfig, IdleStrategy, Msg, PollResult,
};
use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{Access, Fabric};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    open_rnbd_session, ClientEvent, LinkListener, RnbdClient, RnbdClientSession,
};
use rtrs_spdk::rnbd::server::{Exports, RnbdServer};
use rtrs_spdk::server::{
    ChunkAlloc, ChunkAllocator, ChunkError, ChunkPool, HeapChunks, Server, ServerConfig,
};

/// Far below the session's own 30 s timeouts: an answer within it came from the refusal.
const WAIT: Duration = Duration::from_secs(10);

/// Fails while `fail` is set (as `spdk_zmalloc` does when SPDK's memory is short), else
/// allocates from the heap.
#[derive(Default)]
struct Failing {
    fail: AtomicBool,
}

impl ChunkAlloc for Failing {
    fn kind(&self) -> &'static str {
        "test"
    }

    fn alloc(
        &self,
        fabric: &dyn Fabric,
        len: usize,
        access: Access,
    ) -> Result<ChunkPool, ChunkError> {
        if self.fail.load(Ordering::Acquire) {
            return Err(ChunkError::NoMemory {
                what: format!("{len} bytes: out of memory (test allocator)"),
            });
        }
        HeapChunks.alloc(fabric, len, access)
    }
}

fn engine() -> Engine {
    let mut cfg = EngineConfig::new(CpuMask::parse("[0]").unwrap());
    cfg.idle = IdleStrategy::Adaptive(Adaptive::default());
    cfg.pin = false;
    Engine::start(cfg).expect("engine")
}

fn server(engine: &Engine, fabric: &Arc<dyn Fabric>, alloc: Arc<Failing>) -> Server {
    let cfg = ServerConfig {
        queue_depth: 16,
        chunk_size: 64 << 10,
        chunk_alloc: ChunkAllocator::new(alloc),
        ..ServerConfig::default()
    };
    let exports = Arc::new(Exports::ram(&[("vol", 1 << 20)]).unwrap());
    Server::start_on_engine(
        engine,
        0,
        Arc::clone(fabric),
        &["127.0.0.1:0".parse().unwrap()],
        cfg,
        RnbdServer::factory(exports),
    )
    .expect("server")
}

/// The kernel's defaults (30 s reconnect delay and connect timeout) with a short
/// reconnect delay when `retry` is given.
fn client_config(name: &str, to: SocketAddr, retry: Option<Duration>) -> ClientConfig {
    let mut c = ClientConfig::new(name, vec![PathAddr::new(to)]);
    if let Some(d) = retry {
        c.reconnect_delay = d;
        c.reconnect_jitter = Duration::from_millis(10);
    }
    c
}

/// Opens a session on core 0 and maps `vol` through RNBD; the OPEN's outcome (the
/// device's size, or the error text) comes back on the returned channel.
fn open_vol(
    engine: &Engine,
    fabric: &Arc<dyn Fabric>,
    cfg: ClientConfig,
) -> (ClientSession, mpsc::Receiver<Result<u64, String>>) {
    let (stx, srx) = mpsc::channel();
    let (otx, orx) = mpsc::channel();
    let fabric = Arc::clone(fabric);
    engine
        .send(
            0,
            Msg::new(move |cx: &mut dyn Ctx| {
                let RnbdClientSession {
                    session,
                    admin,
                    mut queues,
                } = open_rnbd_session(cx, 1, fabric, cfg).expect("session");
                let mut rnbd = RnbdClient::from_parts(admin, queues.remove(0));
                rnbd.open(cx.now(), "vol", AccessMode::ReadWrite)
                    .expect("open");
                let _ = stx.send(session);
                let mut ev = vec![
                    ClientEvent::Io {
                        tag: 0,
                        result: Ok(())
                    };
                    8
                ];
                cx.register(Box::new(move |cx: &mut dyn Ctx| {
                    let n = rnbd.poll(cx.now(), &mut ev);
                    for e in &ev[..n] {
                        match e {
                            ClientEvent::Opened { info, .. } => {
                                let _ = otx.send(Ok(info.size));
                            }
                            ClientEvent::OpenFailed { error, .. } => {
                                let _ = otx.send(Err(error.to_string()));
                            }
                            _ => {}
                        }
                    }
                    if n > 0 {
                        PollResult::Busy
                    } else {
                        PollResult::Idle
                    }
                }));
            }),
        )
        .expect("send to core 0");
    (srx.recv_timeout(WAIT).expect("session opened"), orx)
}

/// Polls `f` every 10 ms until it holds; panics with `what` after `limit`.
fn wait_until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Closes the session, waits for its paths, stops the server and the engine.
fn finish(engine: Engine, server: Server, session: &ClientSession) {
    session.close();
    wait_until(WAIT, "session paths gone", || session.paths().is_empty());
    server.stop();
    wait_until(WAIT, "server stopped", || server.is_stopped());
    engine.shutdown().expect("engine shutdown");
}

#[test]
fn chunk_pool_failure_fails_open_at_once_with_the_reason() {
    let engine = engine();
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let alloc = Arc::new(Failing::default());
    alloc.fail.store(true, Ordering::Release);
    let server = server(&engine, &fabric, alloc);
    let to = server.local_addrs()[0];
    let (session, opened) = open_vol(&engine, &fabric, client_config("refused", to, None));

    let err = opened
        .recv_timeout(WAIT)
        .expect("OPEN answered well before the 30 s timeouts")
        .expect_err("OPEN must fail");
    for w in [
        "open of device 'vol'",
        "target refused the session",
        "out of memory",
        "ENOMEM",
    ] {
        assert!(err.contains(w), "{err:?} lacks {w:?}");
    }
    let r = session.refusal().expect("the session is refused");
    assert_eq!(r.errno, rtrs_spdk::Errno::ENOMEM);
    let errs = session.path_errors();
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(errs[0].1.contains("ENOMEM"), "{errs:?}");
    // The server kept nothing of the refused session.
    assert_eq!(server.session_count(), 0);
    // The library does not close the session: its path waits for the next attempt.
    assert_eq!(session.paths().len(), 1);
    assert!(!session.is_closed());
    finish(engine, server, &session);
}

#[test]
fn nothing_listening_is_not_a_refusal() {
    let engine = engine();
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    // A port of 127.0.0.1 nobody listens on: connection refused, a transient failure.
    let to = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port");
    let server = server(&engine, &fabric, Arc::new(Failing::default()));
    let cfg = client_config("unreachable", to, Some(Duration::from_millis(100)));
    let (session, opened) = open_vol(&engine, &fabric, cfg);
    // Several attempts fail; each says why, none makes the session refused.
    wait_until(WAIT, "a failed attempt recorded", || {
        !session.path_errors().is_empty()
    });
    let errs = session.path_errors();
    assert!(errs[0].1.contains("cid 0"), "{errs:?}");
    assert_eq!(session.refusal(), None);
    assert!(
        opened.try_recv().is_err(),
        "OPEN must keep waiting for a path"
    );
    finish(engine, server, &session);
}

#[test]
fn a_refused_session_connects_once_a_retry_gets_through() {
    let engine = engine();
    let fabric: Arc<dyn Fabric> = Arc::new(TcpFabric::new());
    let alloc = Arc::new(Failing::default());
    alloc.fail.store(true, Ordering::Release);
    let server = server(&engine, &fabric, Arc::clone(&alloc));
    let to = server.local_addrs()[0];
    let cfg = client_config("lifted", to, Some(Duration::from_millis(100)));
    // The session alone (no RNBD): core 0's handle is polled by a poller of its own.
    let (stx, srx) = mpsc::channel();
    let f = Arc::clone(&fabric);
    engine
        .send(
            0,
            Msg::new(move |cx: &mut dyn Ctx| {
                let (session, mut cores) =
                    ClientSession::open(cx, f, cfg, Box::new(LinkListener::new()))
                        .expect("session");
                let mut core: SessionCore = cores.remove(0);
                let mut comps = [ClientCompletion::default(); 4];
                cx.register(Box::new(move |cx: &mut dyn Ctx| {
                    if core.poll(cx.now(), &mut comps) > 0 {
                        PollResult::Busy
                    } else {
                        PollResult::Idle
                    }
                }));
                let _ = stx.send(session);
            }),
        )
        .expect("send to core 0");
    let session: ClientSession = srx.recv_timeout(WAIT).expect("session");
    wait_until(WAIT, "session refused", || session.refusal().is_some());
    assert_eq!(session.paths_up(), 0);
    alloc.fail.store(false, Ordering::Release);
    wait_until(WAIT, "session connected after the refusal", || {
        session.paths_up() == 1
    });
    assert_eq!(session.refusal(), None);
    assert!(
        session.path_errors().is_empty(),
        "{:?}",
        session.path_errors()
    );
    finish(engine, server, &session);
}
