//! The failover hazards. A request re-sent on a second path with the buf id of a copy
//! still running on the first (dying) path waits until the first completes, so two
//! requests never use one chunk at once; the copy is then answered with the first one's
//! result instead of executing again. A copy's trailer is read when it arrives, so the
//! dying path's last write into the shared chunk cannot replace it (its READ descriptor
//! carries the client's new key).

use crate::server_util;

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::sync::atomic::Ordering;

use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::common::random_uuid;
use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::{
    Access, Conn, Fabric, FabricCaps, FabricError, FabricKind, FastMr, KeyScope, Listener, MemBuf,
    Mr,
};
use server_util::client::Ids;
use server_util::{Event, Harness, TestPath};

/// A harness with two paths `a` (connected first) and `b` of one session.
fn two_paths(always_invalidate: bool) -> (Harness, TestPath, TestPath) {
    two_paths_on(Harness::new(2, Harness::config(always_invalidate)))
}

/// [`two_paths`] on a harness made by the caller.
fn two_paths_on(mut h: Harness) -> (Harness, TestPath, TestPath) {
    let a = h.connect("fo", 3);
    let ids = Ids {
        sess_uuid: random_uuid(),
        ..a.ids
    };
    let addr2 = h.addr2;
    let b = TestPath::connect_to(&mut h, addr2, "fo", 3, ids, false).expect("second path");
    assert_eq!(h.server.session_count(), 1);
    (h, a, b)
}

fn path_sum(h: &Harness, f: impl Fn(&rtrs_spdk::server::ServerPathStats) -> u64) -> u64 {
    h.server.stats().sessions[0].paths.iter().map(f).sum()
}

fn failover(always_invalidate: bool, kill_first: bool) {
    let (mut h, mut a, mut b) = two_paths(always_invalidate);
    h.shared.hold.on.store(true, Ordering::SeqCst);
    a.post_write(1, 5, &0u64.to_le_bytes(), b"the data");
    for _ in 0..100 {
        h.step();
    }
    assert_eq!(h.shared.hold.held.load(Ordering::SeqCst), 1);
    if kill_first {
        for c in a.cons.iter_mut() {
            c.disconnect();
        }
    }
    // The failed-over copy: same request, same buf id, other path.
    b.post_write(1, 5, &0u64.to_le_bytes(), b"the data");
    for _ in 0..300 {
        h.step();
        a.poll();
        b.poll();
    }
    assert_eq!(
        h.shared.requests.load(Ordering::SeqCst),
        1,
        "the copy ran while the first still held the chunk"
    );
    assert_eq!(path_sum(&h, |p| p.failover_waits), 1);
    assert!(b.events.is_empty(), "{:?}", b.events);

    h.shared.hold.on.store(false, Ordering::SeqCst);
    let ev = b.wait_rsp(&mut h, 5);
    assert!(matches!(ev, Event::Rsp { errno: 0, .. }), "{ev:?}");
    assert_eq!(
        h.shared.requests.load(Ordering::SeqCst),
        1,
        "the copy was executed a second time"
    );
    assert_eq!(path_sum(&h, |p| p.failover_dups), 1);
    assert_eq!(&h.shared.ram.lock().unwrap()[..8], b"the data");
    if !kill_first {
        // The first path is alive: it got its answer too.
        let ev = a.wait_rsp(&mut h, 5);
        assert!(matches!(ev, Event::Rsp { errno: 0, .. }), "{ev:?}");
    }
    // The buf id's next request is a new one and runs.
    let (e, d) = b.read(&mut h, 1, 5, 0, 8, true);
    assert_eq!((e, &d[..]), (0, &b"the data"[..]));
    assert_eq!(h.shared.requests.load(Ordering::SeqCst), 2);
    assert_eq!(path_sum(&h, |p| p.failover_dups), 1);
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
fn same_buf_id_on_two_live_paths_runs_once() {
    failover(true, false);
}

/// How the server learns that a request's LOCAL_INV is done.
#[derive(Clone, Copy, PartialEq)]
enum Inv {
    /// No LOCAL_INV (always_invalidate off).
    None,
    /// From its completion, a poll later (verbs: the fabric's caps say local operations
    /// are done only when they complete).
    Completion,
    /// At post (the software fabrics' `local_ops_at_post`).
    AtPost,
}

/// The failed-over READ arrives first (on `b`); the dying path's copy (on `a`, with the
/// old key of the client's reply slot) is placed into the same chunk right after. The
/// first must still answer through its own descriptor. When the server waits for the
/// LOCAL_INV's completion the copy arrives while the first is pending and is answered
/// without executing; otherwise the first has already been answered, so the copy (a
/// new request as far as the server can tell) runs again.
fn copy_placed_behind(inv: Inv) {
    let cfg = Harness::config(inv != Inv::None);
    let h = if inv == Inv::Completion {
        let lo = LoopbackFabric::new();
        let f: Arc<dyn Fabric> = Arc::new(WithCaps(lo.clone(), |c| FabricCaps {
            local_ops_at_post: false,
            ..c
        }));
        Harness::with_fabric(2, cfg, lo, f)
    } else {
        Harness::new(2, cfg)
    };
    let (mut h, mut a, mut b) = two_paths_on(h);
    assert_eq!(b.write(&mut h, 1, 9, 64, b"readable"), 0);
    let before = h.shared.requests.load(Ordering::SeqCst);
    b.post_read(1, 5, &64u64.to_le_bytes(), 8, true);
    h.step();
    a.post_read(1, 5, &64u64.to_le_bytes(), 8, true);
    let ev = b.wait_rsp(&mut h, 5);
    assert!(
        matches!(
            ev,
            Event::Rsp {
                errno: 0,
                w_inv: true,
                ..
            }
        ),
        "{ev:?}"
    );
    let mut d = [0u8; 8];
    b.reply.read_at(5 * b.cs(), &mut d);
    assert_eq!(&d, b"readable", "the reply went elsewhere");
    let ev = a.wait_rsp(&mut h, 5);
    assert!(matches!(ev, Event::Rsp { errno: 0, .. }), "{ev:?}");
    a.reply.read_at(5 * a.cs(), &mut d);
    assert_eq!(&d, b"readable");
    let ran = h.shared.requests.load(Ordering::SeqCst) - before;
    let dups = path_sum(&h, |p| p.failover_dups);
    assert_eq!(
        (ran, dups),
        if inv == Inv::Completion {
            (1, 1)
        } else {
            (2, 0)
        }
    );
    assert!(!a.down && !b.down, "{:?} {:?}", a.events, b.events);
    h.stop();
}

#[test]
fn failed_over_read_keeps_its_own_trailer() {
    copy_placed_behind(Inv::Completion);
}

#[test]
fn failed_over_read_keeps_its_own_trailer_with_inv_at_post() {
    copy_placed_behind(Inv::AtPost);
}

#[test]
fn failed_over_read_keeps_its_own_trailer_without_always_invalidate() {
    copy_placed_behind(Inv::None);
}

/// The loopback fabric with its capabilities reshaped by the function (tiny send queues,
/// local operations done only at completion as on verbs).
struct WithCaps(LoopbackFabric, fn(FabricCaps) -> FabricCaps);

impl Fabric for WithCaps {
    fn kind(&self) -> FabricKind {
        self.0.kind()
    }
    fn caps(&self) -> FabricCaps {
        (self.1)(self.0.caps())
    }
    fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
        Ok(Arc::new(WithCaps(self.0.new_domain(), self.1)))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.0.as_any()
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
    fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError> {
        self.0.alloc_fast_mr(scope)
    }
    fn alloc_fast_mr_on(&self, scope: KeyScope, device: u8) -> Result<FastMr, FabricError> {
        self.0.alloc_fast_mr_on(scope, device)
    }
    fn local_memory(
        &self,
        sge: &rtrs_spdk::fabric::Sge,
        need: Access,
    ) -> Option<Arc<rtrs_spdk::fabric::mem::Backing>> {
        self.0.local_memory(sge, need)
    }
    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError> {
        self.0.listen(addr, opts)
    }
    fn connect(
        &self,
        dst: SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        self.0.connect(dst, opts)
    }
}

#[test]
fn responses_queue_when_send_budget_is_exhausted() {
    for ai in [true, false] {
        let lo = LoopbackFabric::new();
        // Tiny send queues, so responses run out of send slots.
        let f: Arc<dyn Fabric> = Arc::new(WithCaps(lo.clone(), |c| FabricCaps {
            max_send_wr: 8,
            ..c
        }));
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
            assert!(matches!(ev, Event::Rsp { errno: 0, .. }), "{ev:?}");
            let mut d = [0u8; 16];
            p.reply.read_at(usize::from(buf) * 16384, &mut d);
            assert_eq!(d, [buf as u8; 16]);
        }
        let st = h.server.stats();
        assert!(st.sessions[0].paths[0].rsp_queued > 0, "{st:?}");
        h.stop();
    }
}
