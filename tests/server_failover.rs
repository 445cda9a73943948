//! The failover hazard: a request re-sent on a second path with the buf id of a
//! request still running on the first (dying) path waits until the first completes,
//! so two requests never use one chunk at once.

mod server_util;

use std::sync::atomic::Ordering;

use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::common::random_uuid;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{
    Access, Conn, Fabric, FabricCaps, FabricError, FabricKind, FastMr, Listener, MemBuf, Mr, QpCaps,
};
use server_util::client::Ids;
use server_util::{Harness, TestPath};

fn failover(always_invalidate: bool, kill_first: bool) {
    let mut h = Harness::new(2, Harness::config(always_invalidate));
    let mut a = h.connect("fo", 3);
    let ids = Ids {
        sess_uuid: random_uuid(),
        ..a.ids
    };
    let addr2 = h.addr2;
    let mut b = TestPath::connect_to(&mut h, addr2, "fo", 3, ids, false).expect("second path");
    assert_eq!(h.server.session_count(), 1);

    h.shared.hold.on.store(true, Ordering::SeqCst);
    a.post_write(1, 5, &0u64.to_le_bytes(), b"old data");
    for _ in 0..100 {
        h.step();
    }
    assert_eq!(h.shared.hold.held.load(Ordering::SeqCst), 1);
    if kill_first {
        for c in a.cons.iter_mut() {
            c.disconnect();
        }
    }
    // The failed-over request: same buf id, other path.
    b.post_write(1, 5, &0u64.to_le_bytes(), b"new data");
    for _ in 0..300 {
        h.step();
        a.poll();
        b.poll();
    }
    assert_eq!(
        h.shared.requests.load(Ordering::SeqCst),
        1,
        "the second request ran while the first still held the chunk"
    );
    let st = h.server.stats();
    let waits: u64 = st.sessions[0].paths.iter().map(|p| p.failover_waits).sum();
    assert_eq!(waits, 1, "{st:?}");
    assert!(b.events.is_empty(), "{:?}", b.events);

    h.shared.hold.on.store(false, Ordering::SeqCst);
    let ev = b.wait_rsp(&mut h, 5);
    assert!(
        matches!(ev, server_util::Event::Rsp { errno: 0, .. }),
        "{ev:?}"
    );
    assert_eq!(h.shared.requests.load(Ordering::SeqCst), 2);
    assert_eq!(&h.shared.ram.lock().unwrap()[..8], b"new data");
    if !kill_first {
        // The first path is alive: it got its answer too.
        let ev = a.wait_rsp(&mut h, 5);
        assert!(
            matches!(ev, server_util::Event::Rsp { errno: 0, .. }),
            "{ev:?}"
        );
    }
    let (e, d) = b.read(&mut h, 2, 6, 0, 8, true);
    assert_eq!((e, &d[..]), (0, &b"new data"[..]));
    h.stop();
}

#[test]
fn failed_over_request_waits_for_dying_path() {
    failover(true, true);
}

#[test]
fn failed_over_request_waits_without_always_invalidate() {
    failover(false, true);
}

#[test]
fn same_buf_id_on_two_live_paths_is_serialised() {
    failover(true, false);
}

/// The loopback fabric with tiny send queues, so responses run out of send slots.
struct SmallQueues(LoopbackFabric);

impl Fabric for SmallQueues {
    fn kind(&self) -> FabricKind {
        self.0.kind()
    }
    fn caps(&self) -> FabricCaps {
        FabricCaps {
            max_send_wr: 8,
            ..self.0.caps()
        }
    }
    fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError> {
        self.0.register(buf, access)
    }
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, FabricError> {
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { self.0.register_raw(addr, len, access) }
    }
    fn alloc_fast_mr(&self) -> Result<FastMr, FabricError> {
        self.0.alloc_fast_mr()
    }
    fn listen(&self, addr: SocketAddr) -> Result<Box<dyn Listener>, FabricError> {
        self.0.listen(addr)
    }
    fn connect_from(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        caps: QpCaps,
        private_data: &[u8],
    ) -> Result<Box<dyn Conn>, FabricError> {
        self.0.connect_from(src, dst, caps, private_data)
    }
}

#[test]
fn responses_queue_when_send_budget_is_exhausted() {
    for ai in [true, false] {
        let lo = LoopbackFabric::new();
        let f: Arc<dyn Fabric> = Arc::new(SmallQueues(lo.clone()));
        let mut h = Harness::with_fabric(1, Harness::config(ai), lo, f);
        // INFO_RSP's 16 REG_MRs + SEND also go out in pieces through 8 slots.
        let mut p = h.connect("burst", 2);
        for buf in 0..16u16 {
            assert_eq!(
                p.write(&mut h, 1, buf, u64::from(buf) * 16, &[buf as u8; 16]),
                0
            );
        }
        h.shared.hold.on.store(true, Ordering::SeqCst);
        for buf in 0..16u16 {
            p.post_read(1, buf, &(u64::from(buf) * 16).to_le_bytes(), 16, true);
        }
        for _ in 0..200 {
            h.step();
        }
        assert_eq!(h.shared.hold.held.load(Ordering::SeqCst), 16);
        h.shared.hold.on.store(false, Ordering::SeqCst);
        for buf in 0..16u16 {
            let ev = p.wait_rsp(&mut h, buf);
            assert!(
                matches!(ev, server_util::Event::Rsp { errno: 0, .. }),
                "{ev:?}"
            );
            let mut d = [0u8; 16];
            p.reply.read_at(usize::from(buf) * 16384, &mut d);
            assert_eq!(d, [buf as u8; 16]);
        }
        let st = h.server.stats();
        assert!(st.sessions[0].paths[0].rsp_queued > 0, "{st:?}");
        h.stop();
    }
}
