//! The fabric conformance suite against the tcp fabric with PSK authentication: every
//! listener requires a key and every connect proves it (frame version 2), so each
//! scenario runs over authenticated connections, unchanged.

use crate::conformance;

use rtrs_spdk::fabric::{ConnectOptions, ListenOptions};
use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::{
    Access, Conn, Cq, Fabric, FabricCaps, FabricError, FabricKind, FastMr, KeyScope, Listener,
    MemBuf, Mr, Psk, QpCaps,
};

/// A tcp fabric whose `listen` and `connect` always use one key.
struct Keyed {
    inner: TcpFabric,
    psk: Psk,
}

impl Fabric for Keyed {
    fn kind(&self) -> FabricKind {
        self.inner.kind()
    }
    fn caps(&self) -> FabricCaps {
        self.inner.caps()
    }
    fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
        Ok(Arc::new(Keyed {
            inner: self.inner.new_domain(),
            psk: self.psk.clone(),
        }))
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }
    fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError> {
        self.inner.register(buf, access)
    }
    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, FabricError> {
        // SAFETY: the caller's guarantees are passed on unchanged.
        unsafe { self.inner.register_raw(addr, len, access) }
    }
    fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError> {
        self.inner.alloc_fast_mr(scope)
    }
    fn alloc_fast_mr_on(&self, scope: KeyScope, device: u8) -> Result<FastMr, FabricError> {
        self.inner.alloc_fast_mr_on(scope, device)
    }
    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError> {
        let keyed = ListenOptions {
            psk: Some(self.psk.clone()),
            ..opts.clone()
        };
        self.inner.listen(addr, &keyed)
    }
    fn connect(
        &self,
        dst: SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        self.inner.connect(dst, &opts.psk(Some(&self.psk)))
    }
    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        self.inner.create_cq(entries)
    }
}

struct TcpPsk {
    server: Arc<Keyed>,
    client: Arc<Keyed>,
}

impl TcpPsk {
    fn new() -> TcpPsk {
        let key = || Psk::from_bytes("conformance", &[0x5c; 32]).unwrap();
        TcpPsk {
            server: Arc::new(Keyed {
                inner: TcpFabric::new(),
                psk: key(),
            }),
            client: Arc::new(Keyed {
                inner: TcpFabric::new(),
                psk: key(),
            }),
        }
    }
}

impl conformance::Backend for TcpPsk {
    fn server_fabric(&self) -> Arc<dyn Fabric> {
        self.server.clone()
    }
    fn client_fabric(&self) -> Arc<dyn Fabric> {
        self.client.clone()
    }
    fn listen_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }
}

conformance_tests!(TcpPsk::new());

/// The suite's listeners do require the key: a connect without it is refused.
#[test]
fn the_suite_runs_over_authenticated_connections() {
    use rtrs_spdk::fabric::CmEvent;
    let b = TcpPsk::new();
    let mut l = b
        .server
        .listen(
            conformance::Backend::listen_addr(&b),
            &ListenOptions::default(),
        )
        .unwrap();
    let mut c = b
        .client
        .inner
        .connect(l.local_addr(), &ConnectOptions::new(QpCaps::default(), b""))
        .unwrap();
    let start = std::time::Instant::now();
    let ev = loop {
        assert!(
            l.poll().is_none(),
            "a connect without the key was let through"
        );
        if let Some(ev) = c.poll_cm() {
            break ev;
        }
        assert!(start.elapsed() < conformance::DEADLINE, "no answer");
        std::thread::yield_now();
    };
    assert!(matches!(ev, CmEvent::AuthFailed { .. }), "{ev:?}");
}
