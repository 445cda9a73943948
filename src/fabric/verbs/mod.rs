//! RDMA NICs through rdma-core (libibverbs + librdmacm): the fabric the kernel's RTRS
//! runs on (`rtrs.c` with `ib_*` verbs and `rdma_cm`), from userspace.
//!
//! # How the contract maps to verbs
//! - A [`VerbsFabric`] is one device context with one protection domain. Devices are
//!   enumerated with `ibv_get_device_list`; the context itself is librdmacm's (from
//!   `rdma_get_devices`), so that the cm_ids of our connections are bound to the very
//!   context our PD, CQs and registrations belong to.
//! - [`Fabric::register`] is `ibv_reg_mr` with the requested rights plus
//!   `IBV_ACCESS_MW_BIND`. A fast-registration slot is a memory window (userspace verbs has
//!   no REG_MR work request): a type-1 window for a [`KeyScope::Domain`] slot, valid on every
//!   queue pair of the PD and unbound by a zero-length binding, a type-2 window for a
//!   [`KeyScope::Connection`] slot, valid on the queue pair that bound it and retired by
//!   `IBV_WR_LOCAL_INV` or a peer's `IBV_WR_SEND_WITH_INV`. Both are bound by
//!   `IBV_WR_BIND_MW` in the posted chain (`docs/ARCHITECTURE.md`, "Chunk keys on verbs").
//!   The peer only ever sees rkeys, so the wire is the kernel's.
//! - Each connection has its own rdma_cm event channel (non-blocking), one CQ shared by
//!   both queues (its own, or one from [`Fabric::create_cq`] shared with other
//!   connections, `cq.rs`), and an RC queue pair from `rdma_create_qp`. Connecting follows the
//!   kernel client: resolve address → create QP → resolve route → `rdma_connect`
//!   (retry 7, RNR retry 7); accepting follows the kernel server (`rdma_accept`, RNR
//!   retry 7). Nothing blocks: [`Conn::poll_cm`] reads the event channel,
//!   [`Conn::poll_cq`] reads the CQ.
//! - A failed completion breaks the connection on both sides (`rdma_disconnect`: the QP
//!   goes to the error state, outstanding work flushes, the peer sees DISCONNECTED).
//!   A peer's disconnect is noticed by [`Conn::poll_cm`] (the CQ alone does not see
//!   it), which then flushes the local queue pair; poll both, as RTRS does.
//! - Chains of any length are posted in pieces of 16 work requests from arrays
//!   allocated with the queue pair; posting and polling do not allocate. Queue slots
//!   are counted against the requested sizes (`slots.rs`), as the contract counts them.
//!
//! # How it is tested
//! `ci/kernel-vm.sh` boots Debian's kernel in QEMU with Soft-RoCE (`rdma_rxe`) and runs the
//! conformance suite and the hardware tests of `tests/fabric_verbs.rs` on it, then the
//! project's client and server against each other and against the kernel's RTRS/RNBD
//! (`docs/INTEROP.md`). The pure parts (CM state machine, completion and access mapping,
//! queue shadow) have unit tests that need no device. Known limits:
//! - the opcode of a failed completion is taken from the shadow of the queues
//!   (`slots.rs`) by wr_id, since verbs leaves it undefined; if a send and the oldest
//!   receive share a wr_id, a failed completion with that wr_id counts as the receive;
//! - memory windows need a device that has them (mlx5 and rxe do; some do not, and then
//!   [`Fabric::alloc_fast_mr`] fails with the provider's error).
//!
//! All unsafe code of this backend is in `sys` (`sys.rs`, `sys/cm.rs`, `sys/qp.rs`).
//! The module exists only with the `verbs` feature (on by default), which links
//! libibverbs and librdmacm.
#![cfg(feature = "verbs")]

mod cm;
mod conn;
mod cq;
mod listener;
mod slots;
mod sys;
mod wc;

use std::net::SocketAddr;
use std::sync::Arc;

use crate::fabric::mem::Backing;
use crate::fabric::{
    Access, Conn, ConnectOptions, Cq, CqRef, Fabric, FabricCaps, FabricError, FabricKind, FastMr,
    KeyScope, ListenOptions, Listener, MemBuf, Mr, PrivateData, QpCaps,
};

const NO_DEVICE_HINT: &str = "is an RDMA NIC or rxe/siw configured (see `rdma link show`)?";

/// What every connection, listener and registration of one fabric shares.
struct Shared {
    pd: Arc<sys::Pd>,
    attr: sys::DeviceAttr,
    caps: FabricCaps,
    /// `IBV_EVENT_CQ_ERR`s read by one shared CQ for another (by CQ address), until that
    /// one polls its events (`cq.rs`); the device's, shared by all its domains.
    cq_errors: Arc<std::sync::Mutex<Vec<usize>>>,
}

/// A fabric over one RDMA device.
pub struct VerbsFabric {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for VerbsFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsFabric")
            .field("device", &self.device_name())
            .field("caps", &self.shared.caps)
            .finish()
    }
}

impl VerbsFabric {
    /// Opens `device` (an rdma-core device name such as `mlx5_0`), or the first device
    /// when `None`, and allocates its protection domain.
    ///
    /// # Errors
    /// [`FabricError::NoDevice`] when there is no device, the named one does not exist,
    /// or librdmacm cannot use it; [`FabricError::Os`] when querying the device or
    /// allocating the protection domain fails.
    pub fn open(device: Option<&str>) -> Result<VerbsFabric, FabricError> {
        let named = device.map(|d| format!(" named {d:?}")).unwrap_or_default();
        let names = sys::device_names()
            .map_err(|e| FabricError::NoDevice(format!("{named}: {e}; {NO_DEVICE_HINT}")))?;
        let name = match device {
            Some(want) if names.iter().any(|n| n == want) => want.to_owned(),
            Some(want) if names.is_empty() => {
                return Err(FabricError::NoDevice(format!(
                    " named {want:?}: ibv_get_device_list returned no devices; {NO_DEVICE_HINT}"
                )))
            }
            Some(want) => {
                return Err(FabricError::NoDevice(format!(
                    " named {want:?}; the devices present are: {}",
                    names.join(", ")
                )))
            }
            None => names.first().cloned().ok_or_else(|| {
                FabricError::NoDevice(format!(
                    ": ibv_get_device_list returned no devices; {NO_DEVICE_HINT}"
                ))
            })?,
        };
        let dev = sys::Device::open(&name)
            .map_err(|e| {
                FabricError::NoDevice(format!(
                    " usable for connections ({name}): {e}; is the rdma_ucm kernel module loaded?"
                ))
            })?
            .ok_or_else(|| {
                FabricError::NoDevice(format!(
                    " usable for connections: rdma_get_devices does not list {name:?}"
                ))
            })?;
        let attr = dev.query().map_err(|e| FabricError::Os {
            call: e.call,
            source: e.source,
        })?;
        let pd = sys::Pd::alloc(&Arc::new(dev)).map_err(|e| FabricError::Os {
            call: e.call,
            source: e.source,
        })?;
        let caps = FabricCaps {
            max_send_wr: attr.max_qp_wr,
            max_recv_wr: attr.max_qp_wr,
            max_send_sge: attr.max_sge,
            max_mr_size: attr.max_mr_size,
            local_ops_at_post: false,
        };
        if attr.max_mw == 0 {
            tracing::warn!(device = %name, "device reports no memory windows; fast registration will fail");
        }
        Ok(VerbsFabric {
            shared: Arc::new(Shared {
                pd,
                attr,
                caps,
                cq_errors: Arc::new(std::sync::Mutex::new(Vec::new())),
            }),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Whether `other` is of the same device context as this fabric.
    fn same_device(&self, other: &Shared) -> bool {
        Arc::ptr_eq(self.shared.pd.device(), other.pd.device())
    }

    /// The rdma-core name of the device.
    pub fn device_name(&self) -> &str {
        self.shared.pd.device().name()
    }

    /// The device's IEEE vendor id (`ibv_device_attr::vendor_id`); Soft-RoCE (`rxe`)
    /// reports [`VerbsFabric::RXE_VENDOR_ID`]. Tests use it to tell a software device's
    /// known deviations from what hardware must do.
    pub fn vendor_id(&self) -> u32 {
        self.shared.attr.vendor_id
    }

    /// The vendor id the kernel's Soft-RoCE driver (`rdma_rxe`) reports.
    pub const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

    fn register_backing(&self, backing: Arc<Backing>, access: Access) -> Result<Mr, FabricError> {
        let len = backing.len();
        let fail = |reason: String| FabricError::Register { len, reason };
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(fail(
                "REMOTE_WRITE needs LOCAL_WRITE on verbs (ibv_reg_mr refuses it alone)".into(),
            ));
        }
        if len as u64 > self.shared.caps.max_mr_size {
            return Err(fail(format!(
                "longer than the device's max_mr_size of {} bytes",
                self.shared.caps.max_mr_size
            )));
        }
        let region =
            sys::MemRegion::register(&self.shared.pd, backing.clone(), wc::mr_access(access))
                .map_err(|e| fail(e.to_string()))?;
        Ok(Mr::from_parts(
            region.lkey(),
            region.rkey(),
            access,
            Box::new(Arc::new(region)),
            backing,
        ))
    }
}

/// Checks requested queue sizes against the device; the message names the field.
fn check_caps(shared: &Shared, caps: QpCaps) -> Result<(), String> {
    let limits = QpCaps {
        max_send_wr: shared.caps.max_send_wr,
        max_recv_wr: shared.caps.max_recv_wr,
        max_send_sge: shared.caps.max_send_sge,
    };
    caps.check_within(&limits, "the device's")?;
    let cqe = u64::from(caps.max_send_wr) + u64::from(caps.max_recv_wr);
    if cqe > u64::from(shared.attr.max_cqe) {
        return Err(format!(
            "max_send_wr + max_recv_wr = {cqe} exceeds the device's max_cqe of {} (one CQ \
             serves both queues)",
            shared.attr.max_cqe
        ));
    }
    Ok(())
}

impl Fabric for VerbsFabric {
    fn kind(&self) -> FabricKind {
        FabricKind::Verbs
    }

    fn caps(&self) -> FabricCaps {
        self.shared.caps
    }

    fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
        let pd = sys::Pd::alloc(self.shared.pd.device()).map_err(|e| FabricError::Os {
            call: e.call,
            source: e.source,
        })?;
        Ok(Arc::new(VerbsFabric {
            shared: Arc::new(Shared {
                pd,
                attr: self.shared.attr,
                caps: self.shared.caps,
                cq_errors: self.shared.cq_errors.clone(),
            }),
        }))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError> {
        self.register_backing(Arc::new(Backing::Owned(buf)), access)
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, FabricError> {
        // The caller's promise (this method's contract) is what makes the External
        // backing valid; the registration holds the backing until it is deregistered.
        self.register_backing(Arc::new(Backing::External { addr, len }), access)
    }

    fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError> {
        let kind = match scope {
            KeyScope::Domain => sys::WindowKind::Type1,
            KeyScope::Connection => sys::WindowKind::Type2,
        };
        let mw =
            sys::MemWindow::alloc(&self.shared.pd, kind).map_err(|e| FabricError::Register {
                len: 0,
                reason: format!("{e} (a {scope:?}-scope fast-registration slot)"),
            })?;
        Ok(FastMr::from_parts(mw.rkey(), Box::new(mw)))
    }

    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError> {
        opts.check_plain(addr, self.kind())?;
        Ok(Box::new(listener::VerbsListener::bind(
            self.shared.clone(),
            addr,
        )?))
    }

    fn connect(
        &self,
        dst: SocketAddr,
        o: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        o.check_no_key(self.kind())?;
        let data = PrivateData::new(o.private_data)?;
        check_caps(&self.shared, o.caps)
            .map_err(|reason| FabricError::Connect { addr: dst, reason })?;
        let share = match o.cq {
            Some(cq) => Some(own_cq(&self.shared, cq)?),
            None => None,
        };
        Ok(Box::new(conn::VerbsConn::connect(
            self.shared.clone(),
            o.src,
            dst,
            o.caps,
            data,
            share.as_ref(),
        )?))
    }

    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        let max = self.shared.attr.max_cqe;
        if entries == 0 || entries > max {
            return Err(FabricError::Cq {
                reason: format!("{entries} entries is outside 1..={max} (the device's max_cqe)"),
            });
        }
        let cq = sys::Cq::create(&self.shared.pd, entries, max).map_err(|e| FabricError::Os {
            call: e.call,
            source: e.source,
        })?;
        Ok(Cq::new(
            FabricKind::Verbs,
            Box::new(cq::VerbsCq::new(self.shared.clone(), cq)),
        ))
    }
}

/// `cq` as a verbs CQ of the context `shared` belongs to.
fn own_cq(shared: &Arc<Shared>, cq: &CqRef) -> Result<Arc<cq::CqShare>, FabricError> {
    match cq.backend_arc().downcast::<cq::CqShare>() {
        // The device's CQs take connections of every protection domain of it.
        Ok(v) if Arc::ptr_eq(v.shared.pd.device(), shared.pd.device()) => Ok(v),
        Ok(_) => Err(FabricError::Cq {
            reason: "the completion queue belongs to another verbs fabric (device context)".into(),
        }),
        Err(_) => Err(FabricError::Cq {
            reason: format!(
                "a {} completion queue cannot take a verbs connection",
                cq.kind()
            ),
        }),
    }
}
