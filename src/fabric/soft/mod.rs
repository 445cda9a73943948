//! Software RDMA shared by the `loopback` and `tcp` fabrics.
//!
//! Both are a *transport* that moves wire operations between two endpoints, plus this
//! core, which gives every endpoint the semantics of an RC queue pair in a NIC:
//! - [`table`]: the protection domain: registrations, fast-registration slots, and the
//!   checks a NIC makes on every local SGE and every incoming remote access;
//! - [`qp`]: one endpoint: send queue with slots held until the peer acknowledges,
//!   receive queue, completion queue, receive-not-ready stalls, refusals (naks) and flush
//!   on break;
//! - [`cq`]: a completion queue shared by connections, which owns their progress state
//!   and drives them all in one poll.
//!
//! So the fabrics differ only in how bytes move; every rule of the contract in
//! [`crate::fabric`] is implemented once, here.

pub mod cq;
pub mod qp;
pub mod table;

pub use qp::{
    recv_completion, recv_error, respond, BadAck, Handed, InboundError, Payload, PostedRecv,
    Respond, SoftQp, WireKind, WireOp,
};
pub(crate) use table::random_key_byte;
pub use table::{Leases, MemRef, MrTable, TableFull, MAX_MR_SIZE};

use std::sync::Arc;

use crate::fabric::mem::Backing;
use crate::fabric::SetupCause;
use crate::fabric::{Access, Fabric, FabricError, FabricKind, FastMr, KeyScope, MemBuf, Mr, Sge};

/// The `Fabric` methods both software fabrics answer alike, inside their `impl Fabric`:
/// `domain` (the backend's `new_domain`), `as_any`, and `register`, `register_raw` and
/// `alloc_fast_mr` through the backend's [`Registrations`] (`registrations()`).
/// `local_memory` stays the backend's own (the tcp fabric can refuse local keys). The
/// names it uses (`Arc`, `Fabric`, `FabricError`, `MemBuf`, `Access`, `Mr`, `KeyScope`,
/// `FastMr`) are the calling module's imports.
macro_rules! soft_fabric_methods {
    () => {
        fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
            Ok(Arc::new(self.new_domain()))
        }

        fn as_any(&self) -> &dyn std::any::Any {
            self
        }

        fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError> {
            self.registrations().register(buf, access)
        }

        unsafe fn register_raw(
            &self,
            addr: *mut u8,
            len: usize,
            access: Access,
        ) -> Result<Mr, FabricError> {
            // SAFETY: the caller's promise (this method's contract), passed on.
            unsafe { self.registrations().register_raw(addr, len, access) }
        }

        fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError> {
            self.registrations().alloc_fast_mr(scope)
        }
    };
}
pub(crate) use soft_fabric_methods;

/// The table of the protection domain a connection request that arrived at a listener
/// over `table` is accepted into: `domain`'s (read by `table_of`) where it is a fabric
/// `F` over the same device; `name` names that fabric in a refusal.
pub(crate) fn accept_domain<F: 'static>(
    domain: &dyn Fabric,
    table: &Arc<MrTable>,
    table_of: fn(&F) -> &Arc<MrTable>,
    name: &str,
) -> Result<Arc<MrTable>, FabricError> {
    match domain.as_any().downcast_ref::<F>().map(table_of) {
        Some(t) if t.same_device(table) => Ok(t.clone()),
        _ => Err(FabricError::Accept {
            cause: SetupCause::refused(format!(
                "the protection domain is not one of the listener's {name} fabric"
            )),
        }),
    }
}

/// The registration entry points of a software fabric over its table: the
/// `Fabric::register`, `register_raw`, `alloc_fast_mr` and `local_memory` of both the
/// tcp and the loopback fabric.
pub(crate) struct Registrations<'a> {
    pub table: &'a Arc<MrTable>,
    pub kind: FabricKind,
    /// The fabric's `max_mr_size`.
    pub max_len: u64,
}

impl Registrations<'_> {
    fn check_len(&self, len: usize) -> Result<(), FabricError> {
        if len == 0 || len as u64 > self.max_len {
            return Err(FabricError::Register {
                len,
                cause: SetupCause::refused(format!(
                    "{} fabric registrations must be 1..={} bytes (max_mr_size)",
                    self.kind, self.max_len
                )),
            });
        }
        Ok(())
    }

    fn full(len: usize, e: TableFull) -> FabricError {
        FabricError::Register {
            len,
            cause: SetupCause::refused(e.to_string()),
        }
    }

    pub fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError> {
        self.check_len(buf.len())?;
        let len = buf.len();
        self.table
            .register_buf(buf, access)
            .map_err(|e| Self::full(len, e))
    }

    /// # Safety
    /// `Fabric::register_raw`'s.
    pub unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, FabricError> {
        self.check_len(len)?;
        if addr.is_null() {
            return Err(FabricError::Register {
                len,
                cause: SetupCause::refused("null address"),
            });
        }
        self.table
            .register(Arc::new(Backing::External { addr, len }), access)
            .map_err(|e| Self::full(len, e))
    }

    pub fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError> {
        self.table
            .alloc_fast_mr(scope)
            .map_err(|e| Self::full(0, e))
    }

    pub fn local_memory(&self, sge: &Sge, need: Access) -> Option<Arc<Backing>> {
        self.table.local_backing(sge, need)
    }
}
