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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::fabric::mem::Backing;
use crate::fabric::{
    Access, Conn, ConnectOptions, Cq, CqRef, Fabric, FabricCaps, FabricError, FabricKind, FastMr,
    KeyScope, ListenOptions, Listener, MemBuf, Mr, PrivateData, QpCaps,
};
use crate::fabric::{CapsError, SetupCause};
use crate::sync::lock;

const NO_DEVICE_HINT: &str = "is an RDMA NIC or rxe/siw configured (see `rdma link show`)?";

/// Devices a fabric uses at most: a connection's number carries its device's index in
/// its top byte (`qp_tag`), and 0xff there is kept free for "no queue pair" markers.
const MAX_DEVICES: usize = 255;
/// Entries of a core's shared CQ where the device allows as many
/// ([`FabricCaps::core_cq_entries`]).
const CORE_CQ_ENTRIES: u32 = 1 << 16;
/// Room for devices added after the fabric is opened, beyond those present then.
const SPARE_SLOTS: usize = 8;
/// How often the fabric looks for devices that came or went (`Table::rescan`).
const RESCAN_EVERY: Duration = Duration::from_millis(250);

/// One RDMA device of a fabric, as its domains share it.
struct DevInfo {
    ctx: Arc<sys::Device>,
    attr: sys::DeviceAttr,
    caps: FabricCaps,
    /// `IBV_EVENT_CQ_ERR`s read by one shared CQ for another (by CQ address), until that
    /// one polls its events (`cq.rs`); the device's, shared by all its domains.
    cq_errors: Arc<Mutex<Vec<usize>>>,
    /// The device has gone: its connections break and its listeners let it go.
    gone: Arc<AtomicBool>,
}

/// What every connection, listener and registration of one domain on one device shares.
struct Shared {
    /// The device's index in its fabric ([`crate::fabric::Hca::index`]).
    index: u8,
    pd: Arc<sys::Pd>,
    attr: sys::DeviceAttr,
    caps: FabricCaps,
    cq_errors: Arc<Mutex<Vec<usize>>>,
    /// The domain's registrations on every device.
    keys: Arc<keys::KeyMap>,
    /// The device's: set when it has gone.
    gone: Arc<AtomicBool>,
}

impl Shared {
    /// The connection number `qp_num` of this device reports as (see `qp_tag`).
    fn tag(&self, qp_num: u32) -> u32 {
        qp_tag(self.index, qp_num)
    }

    fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }
}

/// A queue pair's number made unique across the fabric's devices: verbs numbers are
/// 24 bits per device, and the device's index goes above them (device 0's numbers are
/// the device's own).
fn qp_tag(index: u8, qp_num: u32) -> u32 {
    (qp_num & 0x00ff_ffff) | (u32::from(index) << 24)
}

/// The fabric's devices, which may come and go while it runs (`docs/ARCHITECTURE.md`,
/// "Devices that come and go"), with the domains and CQs that follow them.
struct Table {
    /// The smallest limits of the devices the fabric was opened on.
    caps: FabricCaps,
    /// Only the device of this name (a fabric opened on a named device).
    only: Option<String>,
    /// Device slots: the most devices the fabric has at once.
    slots: usize,
    state: Mutex<TableState>,
}

#[derive(Default)]
struct TableState {
    /// By device index.
    devs: Vec<Option<Arc<DevInfo>>>,
    /// The name each slot last had: a device added again takes its old slot.
    names: Vec<Option<String>>,
    domains: Vec<Weak<Domain>>,
    cqs: Vec<Weak<cq::CqShare>>,
    /// Devices that went while the host still lists them (name, kernel index): not
    /// taken up again until the host stops listing them.
    dying: Vec<(String, i32)>,
    /// The host's devices at the last rescan (name, kernel index).
    listed: Vec<(String, i32)>,
    /// Devices the fabric could not take up (name, kernel index): not tried again.
    unusable: Vec<(String, i32)>,
}

impl Table {
    /// The present devices, by index.
    fn present(&self) -> Vec<(u8, Arc<DevInfo>)> {
        lock(&self.state)
            .devs
            .iter()
            .enumerate()
            .filter_map(|(i, d)| Some((i as u8, d.clone()?)))
            .collect()
    }

    /// The device whose `gone` flag is `gone` has gone (a connection or listener saw
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`, or the host no longer lists it): every domain
    /// lets its resources there go, so that the kernel can finish removing it.
    fn device_removed(&self, index: u8, gone: &Arc<AtomicBool>, why: &str) {
        let mut st = lock(&self.state);
        let same =
            matches!(st.devs.get(usize::from(index)), Some(Some(d)) if Arc::ptr_eq(&d.gone, gone));
        if same {
            Self::remove_locked(&mut st, index, why, true);
        }
    }

    /// Lets device `index` go; `dying` when the host is removing it (it is not taken up
    /// again while still listed).
    fn remove_locked(st: &mut TableState, index: u8, why: &str, dying: bool) {
        let Some(dev) = st.devs[usize::from(index)].take() else {
            return;
        };
        dev.gone.store(true, Ordering::Release);
        if dying {
            st.dying
                .push((dev.ctx.name().to_owned(), dev.ctx.kernel_index()));
        }
        tracing::warn!(
            device = dev.ctx.name(),
            index,
            "RDMA device removed ({why}): its connections and listeners go; the fabric \
             takes it up again when the host has it back"
        );
        st.domains.retain(|d| d.strong_count() > 0);
        for d in st.domains.iter().filter_map(Weak::upgrade) {
            lock(&d.per[usize::from(index)]).take();
            d.keys.drop_device(index);
        }
        st.cqs.retain(|c| c.strong_count() > 0);
        for c in st.cqs.iter().filter_map(Weak::upgrade) {
            c.drop_device(index);
        }
    }

    /// Takes up the device called `name` (when the fabric uses it and it is not one
    /// that went): a slot, a protection domain in every domain, every registration made
    /// there, a queue in every shared CQ. Its index, or `None`.
    fn add_locked(&self, st: &mut TableState, name: &str) -> Option<u8> {
        if self.only.as_deref().is_some_and(|o| o != name) {
            return None;
        }
        if let Some(i) = st
            .devs
            .iter()
            .position(|d| d.as_ref().is_some_and(|d| d.ctx.name() == name))
        {
            return Some(i as u8);
        }
        let slot = st
            .names
            .iter()
            .position(|n| n.as_deref() == Some(name))
            .filter(|&i| st.devs[i].is_none())
            .or_else(|| (0..self.slots).find(|&i| st.names[i].is_none()))
            .or_else(|| (0..self.slots).find(|&i| st.devs[i].is_none()));
        let kidx = sys::present_devices()
            .ok()
            .and_then(|l| l.into_iter().find(|(n, _)| n == name))
            .map_or(-1, |(_, k)| k);
        let Some(slot) = slot else {
            tracing::warn!(
                device = name,
                "RDMA device not used: the fabric has no free device slot ({} in all)",
                self.slots
            );
            st.unusable.push((name.to_owned(), kidx));
            return None;
        };
        let dev = match open_device(name) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(device = name, "RDMA device not used: {e}");
                st.unusable.push((name.to_owned(), kidx));
                return None;
            }
        };
        if st
            .dying
            .iter()
            .any(|(n, k)| n == name && (*k < 0 || *k == dev.ctx.kernel_index()))
        {
            // The one that went, still listed: its context must not be used again.
            return None;
        }
        let dev = Arc::new(dev);
        let index = slot as u8;
        st.domains.retain(|d| d.strong_count() > 0);
        for d in st.domains.iter().filter_map(Weak::upgrade) {
            let sh = match Domain::shared_on(&d.keys, index, &dev) {
                Ok(sh) => sh,
                Err(e) => {
                    tracing::warn!(device = name, "RDMA device not used by a domain: {e}");
                    continue;
                }
            };
            for f in d.keys.add_device(index, &sh.pd) {
                tracing::warn!(device = name, "not registered there: {f}");
            }
            *lock(&d.per[slot]) = Some(sh);
        }
        st.cqs.retain(|c| c.strong_count() > 0);
        for c in st.cqs.iter().filter_map(Weak::upgrade) {
            if let Some(d) = c.domain().upgrade() {
                if let Some(sh) = d.shared(index) {
                    if let Err(e) = c.add_device(index, sh) {
                        tracing::warn!(device = name, "no completion queue there: {e}");
                    }
                }
            }
        }
        tracing::info!(device = name, index, "RDMA device taken up");
        st.devs[slot] = Some(dev);
        st.names[slot] = Some(name.to_owned());
        Some(index)
    }

    /// Takes up the device called `name` if it is new (a connection's address resolved
    /// to it); its index.
    ///
    /// librdmacm before rdma-core 52 may hand out a new context for a device it already
    /// had, after any change of the host's devices (its device list sort could overflow):
    /// a device of that name whose context `is_ctx` does not accept is then stale. It is
    /// let go (its connections break and reconnect on the new one) and the current
    /// context taken up in its place.
    fn add(&self, name: &str, is_ctx: impl Fn(&sys::Device) -> bool) -> Option<u8> {
        let mut st = lock(&self.state);
        let stale = st.devs.iter().position(|d| {
            d.as_ref()
                .is_some_and(|d| d.ctx.name() == name && !is_ctx(&d.ctx))
        });
        if let Some(i) = stale {
            Self::remove_locked(
                &mut st,
                i as u8,
                "librdmacm gave connections on it another context",
                false,
            );
        }
        self.add_locked(&mut st, name)
    }

    /// Compares the devices with those the host lists now: one no longer listed has
    /// gone; one that went and is no longer listed lets librdmacm close its context;
    /// one that is new is taken up.
    fn rescan(&self) {
        let Ok(listed) = sys::present_devices() else {
            return;
        };
        let is_listed = |name: &str, kidx: i32| {
            listed
                .iter()
                .any(|(n, k)| n == name && (kidx < 0 || *k < 0 || *k == kidx))
        };
        let mut st = lock(&self.state);
        for i in 0..st.devs.len() {
            let vanished = st.devs[i]
                .as_ref()
                .is_some_and(|d| !is_listed(d.ctx.name(), d.ctx.kernel_index()));
            if vanished {
                Self::remove_locked(&mut st, i as u8, "the host no longer lists it", true);
            }
        }
        let dying = st.dying.len();
        st.dying.retain(|(n, k)| is_listed(n, *k));
        let shrank = st.dying.len() < dying || st.listed.iter().any(|(n, k)| !is_listed(n, *k));
        if listed != st.listed {
            tracing::debug!(?listed, "the host's RDMA devices changed");
        }
        if shrank {
            // A device the host listed is gone: librdmacm marks it dead when it next
            // looks at the host's devices, and closes its context once our last hold
            // on it goes (a dead device's context is closed at once when nothing holds
            // it), which the kernel waits for before it finishes removing it.
            sys::sync_librdmacm();
        }
        for (name, kidx) in &listed {
            let ours = st.devs.iter().flatten().any(|d| d.ctx.name() == name);
            let known = |l: &[(String, i32)]| l.iter().any(|(n, k)| n == name && *k == *kidx);
            if !ours && !known(&st.dying) && !known(&st.unusable) {
                self.add_locked(&mut st, name);
            }
        }
        st.listed = listed;
    }

    /// Rescans every [`RESCAN_EVERY`] while the table lives.
    fn watch(table: &Arc<Table>) {
        let weak = Arc::downgrade(table);
        let spawned = std::thread::Builder::new()
            .name("rtrs-rdma-devices".into())
            .spawn(move || loop {
                std::thread::sleep(RESCAN_EVERY);
                let Some(t) = weak.upgrade() else { return };
                t.rescan();
            });
        if let Err(e) = spawned {
            tracing::warn!("RDMA devices that come and go are not followed: {e}");
        }
    }
}

/// A protection domain on each present device of the fabric.
struct Domain {
    table: Arc<Table>,
    /// This domain's per-device state, by device index.
    per: Box<[Mutex<Option<Arc<Shared>>>]>,
    keys: Arc<keys::KeyMap>,
}

impl Domain {
    fn new(table: Arc<Table>) -> Result<Arc<Domain>, FabricError> {
        let keys = Arc::new(keys::KeyMap::new(table.slots));
        let mut st = lock(&table.state);
        let per = (0..table.slots).map(|_| Mutex::new(None)).collect();
        let dom = Arc::new(Domain {
            table: table.clone(),
            per,
            keys,
        });
        for (i, d) in st.devs.iter().enumerate() {
            let Some(d) = d else { continue };
            let sh = Self::shared_on(&dom.keys, i as u8, d).map_err(|e| FabricError::Os {
                call: e.call,
                source: e.source,
            })?;
            *lock(&dom.per[i]) = Some(sh);
        }
        st.domains.retain(|d| d.strong_count() > 0);
        st.domains.push(Arc::downgrade(&dom));
        Ok(dom)
    }

    /// A protection domain on `dev`, as device `index` of a domain with `keys`.
    fn shared_on(
        keys: &Arc<keys::KeyMap>,
        index: u8,
        dev: &DevInfo,
    ) -> Result<Arc<Shared>, sys::SysError> {
        let pd = sys::Pd::alloc(&dev.ctx)?;
        Ok(Arc::new(Shared {
            index,
            pd,
            attr: dev.attr,
            caps: dev.caps,
            cq_errors: dev.cq_errors.clone(),
            keys: keys.clone(),
            gone: dev.gone.clone(),
        }))
    }

    /// The per-device state of device `index`, while present.
    fn shared(&self, index: u8) -> Option<Arc<Shared>> {
        lock(self.per.get(usize::from(index))?).clone()
    }

    /// The per-device state of every present device.
    fn present(&self) -> Vec<Arc<Shared>> {
        self.per.iter().filter_map(|p| lock(p).clone()).collect()
    }

    /// The per-device state of the device whose context librdmacm bound `id` to; a
    /// device the fabric has not seen yet, or whose context it holds is stale, is taken
    /// up first (`Table::add`).
    fn on(&self, id: &sys::CmId) -> Option<Arc<Shared>> {
        let find = || {
            self.present()
                .into_iter()
                .find(|s| id.is_on(s.pd.device()) == Some(true))
        };
        find().or_else(|| {
            let name = id.device_name()?;
            self.table.add(&name, |d| id.is_on(d) == Some(true))?;
            find()
        })
    }

    fn same_fabric(&self, other: &Domain) -> bool {
        Arc::ptr_eq(&self.table, &other.table)
    }
}

/// A fabric over the RDMA devices of the host: each connection lives on the device its
/// address belongs to (`rdma_cm` resolves it, as the kernel's RTRS does), and each
/// registration is made on every device, so that a session's paths may span devices
/// (`docs/ARCHITECTURE.md`, "Several RDMA devices"). Devices may come and go while it
/// runs ("Devices that come and go").
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
    /// Devices that go while it runs take only their connections with them; devices
    /// that come (or come back) are taken up (`docs/ARCHITECTURE.md`, "Devices that come
    /// and go").
    ///
    /// # Errors
    /// [`FabricError::NoDevice`] when there is no device, the named one does not exist,
    /// or librdmacm cannot use it; [`FabricError::Os`] when querying a device or
    /// allocating a protection domain fails.
    pub fn open(device: Option<&str>) -> Result<VerbsFabric, FabricError> {
        let named = device.map(|d| format!(" named {d:?}")).unwrap_or_default();
        // The host's devices now: the first listing `Table::rescan` compares with (a
        // device that goes before the first rescan is then noticed too).
        let listed = sys::present_devices()
            .map_err(|e| FabricError::NoDevice(format!("{named}: {e}; {NO_DEVICE_HINT}")))?;
        let names: Vec<String> = listed.iter().map(|(n, _)| n.clone()).collect();
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
                Ok(d) => devices.push(Some(Arc::new(d))),
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
        let slots = if device.is_some() {
            1
        } else {
            (devices.len() + SPARE_SLOTS).min(MAX_DEVICES)
        };
        let mut names: Vec<Option<String>> = devices
            .iter()
            .map(|d| d.as_ref().map(|d| d.ctx.name().to_owned()))
            .collect();
        devices.resize_with(slots, || None);
        names.resize(slots, None);
        let Some(mut caps) = devices.iter().flatten().next().map(|d| d.caps) else {
            return Err(FabricError::NoDevice(format!(
                " usable for connections among {}",
                chosen.join(", ")
            )));
        };
        for d in devices.iter().flatten() {
            caps.max_send_wr = caps.max_send_wr.min(d.caps.max_send_wr);
            caps.max_recv_wr = caps.max_recv_wr.min(d.caps.max_recv_wr);
            caps.max_send_sge = caps.max_send_sge.min(d.caps.max_send_sge);
            caps.max_mr_size = caps.max_mr_size.min(d.caps.max_mr_size);
            caps.core_cq_entries = caps.core_cq_entries.min(d.caps.core_cq_entries);
        }
        let table = Arc::new(Table {
            caps,
            only: device.map(str::to_owned),
            slots,
            state: Mutex::new(TableState {
                devs: devices,
                names,
                listed,
                ..TableState::default()
            }),
        });
        let dom = Domain::new(table.clone())?;
        Table::watch(&table);
        Ok(VerbsFabric { dom })
    }

    /// The state of the first present device.
    fn first(&self) -> Option<Arc<Shared>> {
        self.dom.present().into_iter().next()
    }

    /// The rdma-core name of the first present device (the only one of a fabric opened
    /// on a named device); empty while none is.
    pub fn device_name(&self) -> String {
        self.first()
            .map(|s| s.pd.device().name().to_owned())
            .unwrap_or_default()
    }

    /// The rdma-core names of the fabric's present devices, by index.
    pub fn device_names(&self) -> Vec<String> {
        self.dom
            .table
            .present()
            .iter()
            .map(|(_, d)| d.ctx.name().to_owned())
            .collect()
    }

    /// The first present device's IEEE vendor id (`ibv_device_attr::vendor_id`);
    /// Soft-RoCE (`rxe`) reports [`VerbsFabric::RXE_VENDOR_ID`]. Tests use it to tell a
    /// software device's known deviations from what hardware must do.
    pub fn vendor_id(&self) -> u32 {
        self.first().map_or(0, |s| s.attr.vendor_id)
    }

    /// The vendor id the kernel's Soft-RoCE driver (`rdma_rxe`) reports.
    pub const RXE_VENDOR_ID: u32 = 0x00ff_ffff;

    fn register_backing(&self, backing: Arc<Backing>, access: Access) -> Result<Mr, FabricError> {
        let len = backing.len();
        let fail = |cause: Box<SetupCause>| FabricError::Register { len, cause };
        if access.contains(Access::REMOTE_WRITE) && !access.contains(Access::LOCAL_WRITE) {
            return Err(fail(SetupCause::refused(
                "REMOTE_WRITE needs LOCAL_WRITE on verbs (ibv_reg_mr refuses it alone)",
            )));
        }
        // No device comes or goes while the registration is made on each.
        let _st = lock(&self.dom.table.state);
        let pds: Vec<Option<Arc<sys::Pd>>> = self
            .dom
            .per
            .iter()
            .map(|p| lock(p).as_ref().map(|s| s.pd.clone()))
            .collect();
        for sh in self.dom.present() {
            if len as u64 > sh.caps.max_mr_size {
                return Err(fail(SetupCause::refused(format!(
                    "longer than the max_mr_size of {} bytes of {}",
                    sh.caps.max_mr_size,
                    sh.pd.device().name()
                ))));
            }
        }
        let made = self
            .dom
            .keys
            .register(&pds, backing.clone(), wc::mr_access(access))
            .map_err(fail)?;
        let mr = Mr::from_parts(made.id, made.rkey, access, Box::new(made.handle), backing);
        Ok(if self.dom.table.slots > 1 {
            mr.with_device_rkeys(made.rkeys)
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
        core_cq_entries: attr.max_cqe.min(CORE_CQ_ENTRIES),
    };
    if attr.max_mw == 0 {
        tracing::warn!(device = %name, "device reports no memory windows; fast registration will fail");
    }
    Ok(DevInfo {
        ctx: Arc::new(dev),
        attr,
        caps,
        cq_errors: Arc::new(Mutex::new(Vec::new())),
        gone: Arc::new(AtomicBool::new(false)),
    })
}

/// Checks requested queue sizes against the device; the message names the field.
fn check_caps(shared: &Shared, caps: QpCaps) -> Result<(), CapsError> {
    caps.check_within(&shared.caps, "the device's")?;
    let cqe = u64::from(caps.max_send_wr) + u64::from(caps.max_recv_wr);
    if cqe > u64::from(shared.attr.max_cqe) {
        return Err(CapsError::Cqe {
            cqe,
            max_cqe: shared.attr.max_cqe,
        });
    }
    Ok(())
}

impl Fabric for VerbsFabric {
    fn kind(&self) -> FabricKind {
        FabricKind::Verbs
    }

    /// The smallest limits of the devices the fabric was opened on (a device taken up
    /// later is checked against each request as it is used).
    fn caps(&self) -> FabricCaps {
        self.dom.table.caps
    }

    fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
        let dom = Domain::new(self.dom.table.clone())?;
        Ok(Arc::new(VerbsFabric { dom }))
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
        let Some(sh) = self.dom.shared(device) else {
            return Err(FabricError::DeviceGone {
                device,
                present: self.device_names().join(", "),
            });
        };
        let kind = match scope {
            KeyScope::Domain => sys::WindowKind::Type1,
            KeyScope::Connection => sys::WindowKind::Type2,
        };
        // The call named is ibv_alloc_mw, for a `scope`-scope fast-registration slot.
        let mw = sys::MemWindow::alloc(&sh.pd, kind).map_err(|e| FabricError::Register {
            len: 0,
            cause: e.on(sh.pd.device().name()),
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
        check_caps_any(&self.dom, o.caps).map_err(|e| FabricError::Connect {
            addr: dst,
            cause: e.into(),
        })?;
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
            .present()
            .iter()
            .map(|s| s.attr.max_cqe)
            .min()
            .unwrap_or(0);
        if entries == 0 || entries > max {
            return Err(FabricError::Cq {
                cause: SetupCause::refused(format!(
                    "{entries} entries is outside 1..={max} (the device's max_cqe)"
                )),
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
fn check_caps_any(dom: &Domain, caps: QpCaps) -> Result<(), CapsError> {
    let mut last = Err(CapsError::NoDevice);
    for sh in dom.present() {
        last = check_caps(&sh, caps);
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
        Ok(v) if v.is_of(&dom.table) => Ok(v),
        Ok(_) => Err(FabricError::Cq {
            cause: SetupCause::refused("the completion queue belongs to another verbs fabric"),
        }),
        Err(_) => Err(FabricError::Cq {
            cause: SetupCause::refused(format!(
                "a {} completion queue cannot take a verbs connection",
                cq.kind()
            )),
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
