//! A path lost while the RNBD device is being opened over it, on the loopback fabric
//! with the RTRS server and `RnbdServer` on two simulated reactors and a virtual clock:
//! the session of two paths has only path 1 up (path 0 is held at its INFO exchange),
//! SESS_INFO is answered and the OPEN is in flight on path 1 when every connection of
//! path 1 breaks. The OPEN completes over path 0 once it is let go, path 1 comes back
//! by itself under the reconnect policy, and data written and read over the session
//! checks out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rtrs_spdk::client::{ClientConfig, PathAddr, PathState, SessionCore};
use rtrs_spdk::engine::Simulation;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{Access, Fabric, MemBuf};
use rtrs_spdk::proto::rnbd::AccessMode;
use rtrs_spdk::rnbd::client::{
    open_rnbd_session, BlockRequest, ClientCompletion, ClientEvent, RnbdClient, RnbdClientSession,
    RnbdQueue,
};
use rtrs_spdk::rnbd::server::{Exports, RnbdServer};
use rtrs_spdk::server::{Server, ServerConfig};

const MS: u64 = 1_000_000;
/// Upper bound of simulation steps (1 ms of virtual time each) for one wait.
const MAX_STEPS: usize = 20_000;

struct Rig {
    sim: Simulation,
    rnbd: RnbdClient<SessionCore>,
    other: RnbdQueue<SessionCore>,
}

impl Rig {
    /// One step of both reactors 1 ms apart, then both client cores polled: what core 0
    /// reported.
    fn turn(&mut self) -> Vec<ClientEvent> {
        self.sim.advance(MS);
        self.sim.step();
        let mut out = vec![
            ClientEvent::Io {
                tag: 0,
                result: Ok(())
            };
            8
        ];
        let rnbd = &mut self.rnbd;
        let n = self
            .sim
            .reactor(0)
            .with_ctx(|cx| rnbd.poll(cx.now(), &mut out));
        out.truncate(n);
        let other = &mut self.other;
        let mut done = [ClientCompletion::default(); 8];
        self.sim
            .reactor(1)
            .with_ctx(|cx| other.poll(cx.now(), &mut done));
        out
    }

    /// Turns until an event `want` accepts arrived; every event seen until then.
    fn until(&mut self, what: &str, want: impl Fn(&ClientEvent) -> bool) -> Vec<ClientEvent> {
        let mut seen = Vec::new();
        for _ in 0..MAX_STEPS {
            let ev = self.turn();
            let hit = ev.iter().any(&want);
            seen.extend(ev);
            if hit {
                return seen;
            }
        }
        panic!("no {what} within {MAX_STEPS} ms; events: {seen:?}");
    }
}

#[test]
fn a_path_lost_during_the_open_comes_back_and_the_open_completes() {
    let mut sim = Simulation::new(2, 4096);
    let lo = Arc::new(LoopbackFabric::new());
    let fabric: Arc<dyn Fabric> = lo.clone();
    let exports = Arc::new(Exports::ram(&[("vol", 4 << 20)]).unwrap());
    let cfg = ServerConfig {
        queue_depth: 32,
        chunk_size: 64 << 10,
        ..ServerConfig::default()
    };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let f = Arc::clone(&fabric);
    let server = sim
        .reactor(0)
        .with_ctx(|cx| Server::start(cx, f, &[any, any], cfg, RnbdServer::factory(exports)))
        .expect("server start");
    let addrs = server.local_addrs().to_vec();
    assert_eq!(addrs.len(), 2);

    let paths: Vec<PathAddr> = addrs.iter().map(|a| PathAddr::new(*a)).collect();
    let mut ccfg = ClientConfig::new("open-lost", paths.clone());
    ccfg.reconnect_delay = Duration::from_millis(10);
    ccfg.reconnect_jitter = Duration::from_millis(1);
    let f = Arc::clone(&fabric);
    let RnbdClientSession {
        session,
        admin,
        mut queues,
    } = sim
        .reactor(0)
        .with_ctx(|cx| open_rnbd_session(cx, 2, f, ccfg))
        .expect("session open");
    // Path 0's control connection is being made: the server's end of it holds what
    // arrives, so path 0 stays at its INFO exchange and only path 1 can come up.
    let held = lo.faults_to(addrs[0]);
    assert_eq!(held.len(), 1, "cid 0 of path 0");
    held[0].peer().hold();
    let other = queues.pop().unwrap();
    let rnbd = RnbdClient::from_parts(admin, queues.pop().unwrap());
    let mut rig = Rig { sim, rnbd, other };

    let vol = rig
        .sim
        .reactor(0)
        .with_ctx(|cx| rig.rnbd.open(cx.now(), "vol", AccessMode::ReadWrite))
        .unwrap();
    let seen = rig.until("SESS_INFO answer", |e| {
        matches!(e, ClientEvent::SessInfo(Ok(_)))
    });
    assert!(
        !seen.iter().any(|e| matches!(e, ClientEvent::Opened { .. })),
        "{seen:?}"
    );
    assert_eq!(session.paths_up(), 1);
    assert_eq!(session.path_state(paths[1]), Some(PathState::Connected));
    assert_eq!(
        rig.rnbd.session().outstanding(),
        1u32,
        "the OPEN is on its way over path 1"
    );

    // Path 1 breaks under the OPEN; path 0 is let go.
    let cut = lo.faults_to(addrs[1]);
    assert!(cut.len() >= 3, "cid 0 and two IO connections: {cut:?}");
    cut.iter().for_each(|f| f.break_now());
    lo.faults_to(addrs[0])
        .iter()
        .for_each(|f| f.peer().release());

    let seen = rig.until("the OPEN's answer", |e| {
        matches!(
            e,
            ClientEvent::Opened { .. } | ClientEvent::OpenFailed { .. }
        )
    });
    match seen.iter().find(|e| {
        matches!(
            e,
            ClientEvent::Opened { .. } | ClientEvent::OpenFailed { .. }
        )
    }) {
        Some(ClientEvent::Opened { dev, remap, .. }) => assert_eq!((*dev, *remap), (vol, false)),
        other => panic!("{other:?}; events: {seen:?}"),
    }
    // Path 1 comes back by itself.
    for _ in 0..MAX_STEPS {
        if session.paths_up() == 2 {
            break;
        }
        rig.turn();
    }
    assert_eq!(session.paths_up(), 2, "{:?}", session.paths());
    let st = session.stats();
    let p1 = st
        .paths
        .iter()
        .find(|p| p.path == paths[1].to_string())
        .unwrap();
    assert_eq!(p1.state, "connected", "{}", st.to_json());
    assert!(p1.reconnects_ok >= 1, "{}", st.to_json());
    assert!(
        st.paths.iter().all(|p| p.failure.is_none()),
        "{}",
        st.to_json()
    );

    // Data written and read back over the session checks out.
    let wbuf = fabric
        .register(MemBuf::zeroed(64 << 10), Access::LOCAL_WRITE)
        .unwrap();
    let rbuf = fabric
        .register(MemBuf::zeroed(64 << 10), Access::LOCAL_WRITE)
        .unwrap();
    for k in 0..16u64 {
        let pattern: Vec<u8> = (0..4096).map(|i| (i as u64 * 7 + k) as u8).collect();
        wbuf.write_at(0, &pattern);
        for (tag, req, buf) in [
            (2 * k + 1, BlockRequest::write(k * 4096, 4096), &wbuf),
            (2 * k + 2, BlockRequest::read(k * 4096, 4096), &rbuf),
        ] {
            let sgl = [buf.sge(0, 4096)];
            rig.sim
                .reactor(0)
                .with_ctx(|cx| rig.rnbd.submit(cx.now(), vol, tag, &req, &sgl))
                .unwrap();
            let seen = rig.until(
                "an IO completion",
                |e| matches!(e, ClientEvent::Io { tag: t, .. } if *t == tag),
            );
            let result = seen.iter().find_map(|e| match e {
                ClientEvent::Io { tag: t, result } if *t == tag => Some(*result),
                _ => None,
            });
            assert_eq!(result, Some(Ok(())), "IO {tag}");
        }
        let mut got = vec![0u8; 4096];
        rbuf.read_at(0, &mut got);
        assert_eq!(got, pattern, "block {k}");
    }
    session.close();
    server.stop();
}
