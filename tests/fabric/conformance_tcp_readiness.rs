//! The shared-CQ scenarios of the fabric conformance suite against the tcp fabric with
//! each way a shared CQ watches its sockets (io_uring, epoll, none); the full suite runs
//! with the default in `conformance_tcp`.

use crate::conformance;

use std::net::SocketAddr;
use std::sync::Arc;

use rtrs_spdk::fabric::tcp::{TcpFabric, TcpReadiness};
use rtrs_spdk::fabric::Fabric;

struct Tcp {
    server: Arc<TcpFabric>,
    client: Arc<TcpFabric>,
}

impl Tcp {
    fn new(mode: TcpReadiness) -> Tcp {
        Tcp {
            server: Arc::new(TcpFabric::with_readiness(mode)),
            client: Arc::new(TcpFabric::with_readiness(mode)),
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

mod uring {
    use super::*;
    conformance_tests!(shared_cq, Tcp::new(TcpReadiness::Uring));
}

mod epoll {
    use super::*;
    conformance_tests!(shared_cq, Tcp::new(TcpReadiness::Epoll));
}

mod none {
    use super::*;
    conformance_tests!(shared_cq, Tcp::new(TcpReadiness::None));
}
