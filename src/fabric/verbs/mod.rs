//! RDMA NICs through rdma-core (libibverbs + librdmacm): the fabric the kernel's RTRS
//! runs on (`rtrs.c` with `ib_*` verbs and `rdma_cm`), from userspace.
//!
//! # How the contract maps to verbs
//! - A [`VerbsFabric`] is the host's devices (or one named device), with a protection
//!   domain on each. Devices are enumerated with `ibv_get_device_list`; the contexts are
//!   librdmacm's (from `rdma_get_devices`), so that the cm_ids of our connections are
//!   bound to the very contexts our PDs, CQs and registrations belong to. A connection
//!   lives on the device its address resolves to; registrations are made on every
//!   device (`keys.rs`); a shared CQ has a queue on each (`cq.rs`). See
//!   `docs/ARCHITECTURE.md`, "Several RDMA devices".
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
mod keys;
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

/// Devices a fabric uses at most: a connection's number carries its device's index in
/// its top byte (`qp_tag`), and 0xff there is kept free for "no queue pair" markers.
const MAX_DEVICES: usize = 255;

/// One RDMA device of a fabric, as its domains share it.
struct DevInfo {
    ctx: Arc<sys::Device>,
    attr: sys::DeviceAttr,
    caps: FabricCaps,
    /// `IBV_EVENT_CQ_ERR`s read by one shared CQ for another (by CQ address), until that
    /// one polls its events (`cq.rs`); the device's, shared by all its domains.
    cq_errors: Arc<std::sync::Mutex<Vec<usize>>>,
}

/// What every connection, listener and registration of one domain on one device shares.
struct Shared {
    /// The device's index in its fabric ([`crate::fabric::Hca::index`]).
    index: u8,
    pd: Arc<sys::Pd>,
    attr: sys::DeviceAttr,
    caps: FabricCaps,
    cq_errors: Arc<std::sync::Mutex<Vec<usize>>>,
    /// The domain's registrations on every device, by their key on device 0.
    keys: Arc<keys::KeyMap>,
}

impl Shared {
    /// The connection number `qp_num` of this device reports as (see `qp_tag`).
    fn tag(&self, qp_num: u32) -> u32 {
        qp_tag(self.index, qp_num)
    }
}

/// A queue pair's number made unique across the fabric's devices: verbs numbers are
/// 24 bits per device, and the device's index goes above them (device 0's numbers are
/// the device's own).
fn qp_tag(index: u8, qp_num: u32) -> u32 {
    (qp_num & 0x00ff_ffff) | (u32::from(index) << 24)
}

/// A protection domain on each device of the fabric.
struct Domain {
    /// The fabric's devices, shared by all its domains (identity tells a fabric apart).
    devices: Arc<[DevInfo]>,
    /// This domain's per-device state, by device index.
    per: Box<[Arc<Shared>]>,
    keys: Arc<keys::KeyMap>,
}

impl Domain {
    fn new(devices: Arc<[DevInfo]>) -> Result<Domain, FabricError> {
        let keys = Arc::new(keys::KeyMap::default());
        let per = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let pd = sys::Pd::alloc(&d.ctx).map_err(|e| FabricError::Os {
                    call: e.call,
                    source: e.source,
                })?;
                Ok(Arc::new(Shared {
                    index: i as u8,
                    pd,
                    attr: d.attr,
                    caps: d.caps,
                    cq_errors: d.cq_errors.clone(),
                    keys: keys.clone(),
                }))
            })
            .collect::<Result<Box<[_]>, FabricError>>()?;
        Ok(Domain { devices, per, keys })
    }

    /// The per-device state of the device whose context librdmacm bound `id` to.
    fn on(&self, id: &sys::CmId) -> Option<&Arc<Shared>> {
        self.per
            .iter()
            .find(|s| id.is_on(s.pd.device()) == Some(true))
    }

    fn same_fabric(&self, other: &Domain) -> bool {
        Arc::ptr_eq(&self.devices, &other.devices)
    }
}

/// A fabric over the RDMA devices of the host: each connection lives on the device its
/// address belongs to (`rdma_cm` resolves it, as the kernel's RTRS does), and each
/// registration is made on every device, so that a session's paths may span devices
/// (`docs/ARCHITECTURE.md`, "Several RDMA devices").
pub struct VerbsFabric {
    dom: Arc<Domain>,
}

impl std::fmt::Debug for VerbsFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsFabric")
            .field("devices", &self.device_names())
            .field("caps", &self.caps())
            .finish()
    }
}

impl VerbsFabric {
    /// Opens `device` (an rdma-core device name such as `mlx5_0`) alone, or every device
    /// of the host when `None` (each connection then uses the device of its address),
    /// and allocates a protection domain on each.
    ///
    /// The devices are those present now; one added later is not used by this fabric.
    ///
    /// # Errors
    /// [`FabricError::NoDevice`] when there is no device, the named one does not exist,
    /// or librdmacm cannot use it; [`FabricError::Os`] when querying a device or
    /// allocating a protection domain fails.
    pub fn open(device: Option<&str>) -> Result<VerbsFabric, FabricError> {
        let named = device.map(|d| format!(" named {d:?}")).unwrap_or_default();
        let names = sys::device_names()
            .map_err(|e| FabricError::NoDevice(format!("{named}: {e}; {NO_DEVICE_HINT}")))?;
        let chosen: Vec<String> = match device {
            Some(want) if names.iter().any(|n| n == want) => vec![want.to_owned()],
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
            None if names.is_empty() => {
                return Err(FabricError::NoDevice(format!(
                    ": ibv_get_device_list returned no devices; {NO_DEVICE_HINT}"
                )))
            }
            None => names.into_iter().take(MAX_DEVICES).collect(),
        };
        let mut devices = Vec::with_capacity(chosen.len());
        for name in &chosen {
            match open_device(name) {
                Ok(d) => devices.push(d),
                // Of every device, those librdmacm can use; naming one, that one.
                Err(e) if device.is_none() && chosen.len() > 1 => {
                    tracing::warn!(device = %name, "RDMA device not used: {e}");
                }
                Err(e) => return Err(e),
            }
        }
        if devices.is_empty() {
            return Err(FabricError::NoDevice(format!(
                " usable for connections among {}; is the rdma_ucm kernel module loaded?",
                chosen.join(", ")
            )));
        }
        let dom = Domain::new(devices.into())?;
        Ok(VerbsFabric { dom: Arc::new(dom) })
    }

    /// Device 0's state: the device of a fabric opened on one device.
    fn first(&self) -> &Arc<Shared> {
        &self.dom.per[0]
    }

    /// The rdma-core name of the first device (the only one of a fabric opened on a
    /// named device).
    pub fn device_name(&self) -> &str {
        self.first().pd.device().name()
    }

    /// The rdma-core names of the fabric's devices, by index.
    pub fn device_names(&self) -> Vec<String> {
        self.dom
            .devices
            .iter()
            .map(|d| d.ctx.name().to_owned())
            .collect()
    }

    /// The first device's IEEE vendor id (`ibv_device_attr::vendor_id`); Soft-RoCE
    /// (`rxe`) reports [`VerbsFabric::RXE_VENDOR_ID`]. Tests use it to tell a software
    /// device's known deviations from what hardware must do.
    pub fn vendor_id(&self) -> u32 {
        self.first().attr.vendor_id
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
        let mut regions = Vec::with_capacity(self.dom.per.len());
        for sh in self.dom.per.iter() {
            if len as u64 > sh.caps.max_mr_size {
                return Err(fail(format!(
                    "longer than the max_mr_size of {} bytes of {}",
                    sh.caps.max_mr_size,
                    sh.pd.device().name()
                )));
            }
            let region = sys::MemRegion::register(&sh.pd, backing.clone(), wc::mr_access(access))
                .map_err(|e| fail(format!("{e} (on {})", sh.pd.device().name())))?;
            regions.push(Arc::new(region));
        }
        let regions = keys::Regions::new(regions, &self.dom.keys);
        let (lkey, rkey) = (regions.on(0).lkey(), regions.on(0).rkey());
        let rkeys = regions.rkeys();
        let mr = Mr::from_parts(lkey, rkey, access, Box::new(regions), backing);
        Ok(if rkeys.len() > 1 {
            mr.with_device_rkeys(rkeys)
        } else {
            mr
        })
    }
}

/// Opens the librdmacm context of the device called `name` and queries it.
fn open_device(name: &str) -> Result<DevInfo, FabricError> {
    let dev = sys::Device::open(name)
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
    Ok(DevInfo {
        ctx: Arc::new(dev),
        attr,
        caps,
        cq_errors: Arc::new(std::sync::Mutex::new(Vec::new())),
    })
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

    /// The smallest limits of the fabric's devices.
    fn caps(&self) -> FabricCaps {
        let mut caps = self.first().caps;
        for sh in self.dom.per.iter().skip(1) {
            caps.max_send_wr = caps.max_send_wr.min(sh.caps.max_send_wr);
            caps.max_recv_wr = caps.max_recv_wr.min(sh.caps.max_recv_wr);
            caps.max_send_sge = caps.max_send_sge.min(sh.caps.max_send_sge);
            caps.max_mr_size = caps.max_mr_size.min(sh.caps.max_mr_size);
        }
        caps
    }

    fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
        let dom = Domain::new(self.dom.devices.clone())?;
        Ok(Arc::new(VerbsFabric { dom: Arc::new(dom) }))
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
        self.alloc_fast_mr_on(scope, 0)
    }

    fn alloc_fast_mr_on(&self, scope: KeyScope, device: u8) -> Result<FastMr, FabricError> {
        let Some(sh) = self.dom.per.get(usize::from(device)) else {
            return Err(FabricError::Register {
                len: 0,
                reason: format!(
                    "no RDMA device {device} in this fabric (it has {})",
                    self.dom.per.len()
                ),
            });
        };
        let kind = match scope {
            KeyScope::Domain => sys::WindowKind::Type1,
            KeyScope::Connection => sys::WindowKind::Type2,
        };
        let mw = sys::MemWindow::alloc(&sh.pd, kind).map_err(|e| FabricError::Register {
            len: 0,
            reason: format!(
                "{e} (a {scope:?}-scope fast-registration slot on {})",
                sh.pd.device().name()
            ),
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
            self.dom.clone(),
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
        // Checked against the device the address resolves to once it is known; here
        // against what no device of the fabric can give.
        check_caps_any(&self.dom, o.caps)
            .map_err(|reason| FabricError::Connect { addr: dst, reason })?;
        let share = match o.cq {
            Some(cq) => Some(own_cq(&self.dom, cq)?),
            None => None,
        };
        Ok(Box::new(conn::VerbsConn::connect(
            self.dom.clone(),
            o.src,
            dst,
            o.caps,
            data,
            share.as_ref(),
        )?))
    }

    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        let max = self
            .dom
            .per
            .iter()
            .map(|s| s.attr.max_cqe)
            .min()
            .unwrap_or(0);
        if entries == 0 || entries > max {
            return Err(FabricError::Cq {
                reason: format!("{entries} entries is outside 1..={max} (the device's max_cqe)"),
            });
        }
        let cq = cq::VerbsCq::new(&self.dom, entries).map_err(|e| FabricError::Os {
            call: e.call,
            source: e.source,
        })?;
        Ok(Cq::new(FabricKind::Verbs, Box::new(cq)))
    }
}

/// [`check_caps`] against the device of the fabric with the largest limits: a request
/// none of them can take fails at once, before any address is resolved.
fn check_caps_any(dom: &Domain, caps: QpCaps) -> Result<(), String> {
    let mut last = Ok(());
    for sh in dom.per.iter() {
        last = check_caps(sh, caps);
        if last.is_ok() {
            return last;
        }
    }
    last
}

/// `cq` as a verbs CQ of the fabric `dom` belongs to.
fn own_cq(dom: &Domain, cq: &CqRef) -> Result<Arc<cq::CqShare>, FabricError> {
    match cq.backend_arc().downcast::<cq::CqShare>() {
        // The fabric's CQs take connections of every protection domain of it.
        Ok(v) if v.is_of(&dom.devices) => Ok(v),
        Ok(_) => Err(FabricError::Cq {
            reason: "the completion queue belongs to another verbs fabric".into(),
        }),
        Err(_) => Err(FabricError::Cq {
            reason: format!(
                "a {} completion queue cannot take a verbs connection",
                cq.kind()
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::qp_tag;

    #[test]
    fn queue_pair_numbers_are_unique_across_devices() {
        // Device 0's numbers are the device's own.
        assert_eq!(qp_tag(0, 0x12), 0x12);
        assert_ne!(qp_tag(1, 0x12), qp_tag(0, 0x12));
        assert_eq!(qp_tag(1, 0x00ab_cdef), 0x01ab_cdef);
        // No device's number reaches the "no queue pair" marker u32::MAX.
        assert_ne!(qp_tag(254, 0x00ff_ffff), u32::MAX);
    }
}
