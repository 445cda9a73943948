//! The client side's fabrics, one per transport for the whole application: `tcp` uses
//! the tcp fabric, `rdma` the verbs fabric over the first RDMA device. Each disk's session
//! takes a protection domain of it (`Fabric::domain`), with SPDK's memory registered there
//! (`super::memmap::MemMap`), so bdev IO buffers go out as they are.

use std::sync::{Arc, Mutex};

use rtrs_spdk::fabric::tcp::{TcpFabric, TcpReadiness};
use rtrs_spdk::fabric::verbs::VerbsFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::spdk::interrupt_mode;

use crate::rpc::Transport;

/// The client side's fabric of one transport (its device), shared by every rtrs bdev of
/// the application using that transport.
pub struct ClientFabric {
    pub fabric: Arc<dyn Fabric>,
}

/// The application's client fabrics: tcp, rdma (each created on first use).
static CLIENT_FABRICS: Mutex<[Option<Arc<ClientFabric>>; 2]> = Mutex::new([None, None]);

fn slot(t: Transport) -> usize {
    match t {
        Transport::Tcp => 0,
        Transport::Rdma => 1,
    }
}

/// The client fabric of `transport`, created on first use: the tcp fabric, or the verbs
/// fabric over the first RDMA device. A failed creation is not remembered (a device may
/// appear later).
///
/// # Errors
/// The fabric cannot be opened (for rdma on a machine without a device: the fabric's
/// "no RDMA device found ..." text). The message does not name the RPC field; the caller
/// prefixes it.
pub fn client_fabric(transport: Transport) -> Result<Arc<ClientFabric>, String> {
    let mut g = CLIENT_FABRICS
        .lock()
        .map_err(|_| "client fabric lock poisoned".to_string())?;
    let entry = &mut g[slot(transport)];
    if let Some(f) = entry.as_ref() {
        return Ok(Arc::clone(f));
    }
    let fabric: Arc<dyn Fabric> = match transport {
        Transport::Tcp => Arc::new(TcpFabric::new_or(if interrupt_mode() {
            TcpReadiness::Epoll
        } else {
            TcpReadiness::Uring
        })),
        Transport::Rdma => Arc::new(VerbsFabric::open(None).map_err(|e| e.to_string())?),
    };
    let f = Arc::new(ClientFabric { fabric });
    *entry = Some(Arc::clone(&f));
    Ok(f)
}

/// `module_fini`: every bdev is gone; the fabrics go.
pub fn release_all() {
    if let Ok(mut g) = CLIENT_FABRICS.lock() {
        for f in g.iter_mut() {
            f.take();
        }
    }
}
