//! The fabric conformance suite against the tcp fabric: two fabric instances (two
//! protection domains, as two hosts) connected over 127.0.0.1.

use crate::conformance;

use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::Fabric;

struct Tcp {
    server: Arc<TcpFabric>,
    client: Arc<TcpFabric>,
}

impl Tcp {
    fn new() -> Tcp {
        Tcp {
            server: Arc::new(TcpFabric::new()),
            client: Arc::new(TcpFabric::new()),
        }
    }
}

impl conformance::Backend for Tcp {
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

conformance_tests!(Tcp::new());
