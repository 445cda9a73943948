//! The fabric conformance suite against the loopback fabric (one instance as both hosts).

use crate::conformance;

use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::fabric::loopback::LoopbackFabric;
use rtrs_spdk::fabric::Fabric;

struct Loopback(Arc<LoopbackFabric>);

impl conformance::Backend for Loopback {
    fn server_fabric(&self) -> Arc<dyn Fabric> {
        self.0.clone()
    }
    fn client_fabric(&self) -> Arc<dyn Fabric> {
        self.0.clone()
    }
    fn listen_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 0))
    }
}

conformance_tests!(Loopback(Arc::new(LoopbackFabric::new())));
