//! The only unsafe code of the verbs fabric (this file, `sys/cm.rs` for the connection
//! manager and `sys/qp.rs` for queue pairs): thin owner handles around libibverbs and
//! librdmacm objects (the userspace counterparts of the kernel's `ib_device`, `ib_pd`,
//! `ib_mr`, `ib_mw`, `ib_cq`, `ib_qp` and `rdma_cm_id` that `rtrs.c` uses).
//!
//! Every handle owns one object and keeps its parent alive through an `Arc`, so the
//! destruction order is fixed by ownership:
//! queue pair → completion queue → cm_id → event channel → protection domain → device.
//! Memory regions and windows hold their protection domain; a memory region also holds
//! the memory it registers, so the memory is freed only after deregistration.
//!
//! Devices come from `rdma_get_devices`, not `ibv_open_device`: librdmacm binds every
//! cm_id to its own device context, and a queue pair made through `rdma_create_qp` must
//! use a protection domain of that very context. Sharing librdmacm's contexts lets us
//! compare `cm_id->verbs` with the fabric's device by pointer.
//!
//! Nothing above this file sees a raw pointer; it sees `Result`s carrying the failing
//! call's name and errno ([`SysError`]).

use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use rdma_sys as ffi;

use crate::fabric::mem::Backing;
use crate::fabric::SetupCause;

mod cm;
mod qp;

pub(super) use cm::{CmEventKind, CmId, EventChannel, RawEvent};
pub(super) use qp::{Cq, Endpoint, PollBuf, RawWc, SendReq, SendReqOp, MAX_CHAIN};

// The structs rdma-sys writes by hand (unions bindgen cannot express) must match the C
// layout of the installed rdma-core headers (sizes and offsets taken from them with a C
// compiler on x86_64). A mismatch would corrupt every post and poll, so it fails the
// build.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ffi::ibv_send_wr>() == 128);
    assert!(offset_of!(ffi::ibv_send_wr, imm_data_invalidated_rkey_union) == 36);
    assert!(offset_of!(ffi::ibv_send_wr, wr) == 40);
    assert!(offset_of!(ffi::ibv_send_wr, bind_mw_tso_union) == 80);
    assert!(size_of::<ffi::ibv_mw_bind_info>() == 32);
    assert!(size_of::<ffi::ibv_recv_wr>() == 32);
    assert!(size_of::<ffi::ibv_wc>() == 48);
    assert!(offset_of!(ffi::ibv_wc, imm_data_invalidated_rkey_union) == 24);
    assert!(offset_of!(ffi::ibv_wc, wc_flags) == 36);
    assert!(size_of::<ffi::rdma_cm_event>() == 80);
    assert!(offset_of!(ffi::rdma_cm_event, param) == 24);
    assert!(size_of::<ffi::rdma_conn_param>() == 24);
    assert!(size_of::<ffi::rdma_cm_id>() == 416);
    assert!(offset_of!(ffi::rdma_cm_id, qp) == 24);
    let addr = offset_of!(ffi::rdma_cm_id, route) + offset_of!(ffi::rdma_route, addr);
    assert!(addr + offset_of!(ffi::rdma_addr, src_addr_union) == 32);
    assert!(addr + offset_of!(ffi::rdma_addr, dst_addr_union) == 160);
};

/// A failed verbs or rdma_cm call: its name and the errno it reported.
#[derive(Debug)]
pub(super) struct SysError {
    pub call: &'static str,
    pub source: io::Error,
}

impl std::fmt::Display for SysError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed: {}", self.call, self.source)
    }
}

impl From<SysError> for Box<SetupCause> {
    fn from(e: SysError) -> Self {
        SetupCause::os(e.call, e.source)
    }
}

impl SysError {
    /// The cause of a set-up failure on the RDMA device `device`.
    pub fn on(self, device: &str) -> Box<SetupCause> {
        Box::new(SetupCause::OnDevice {
            call: self.call,
            device: device.to_owned(),
            source: self.source,
        })
    }

    /// From `errno` after a call that returned -1 or NULL.
    fn last(call: &'static str) -> SysError {
        let mut source = io::Error::last_os_error();
        if source.raw_os_error() == Some(0) {
            // The call failed without saying why; ENODEV is the usual reason.
            source = io::Error::from_raw_os_error(libc::ENODEV);
        }
        SysError { call, source }
    }

    /// From a verbs return value: 0 is success, a positive value is the errno, -1 means
    /// "look at errno" (libibverbs uses both conventions).
    fn check(call: &'static str, ret: i32) -> Result<(), SysError> {
        match ret {
            0 => Ok(()),
            r if r > 0 => Err(SysError {
                call,
                source: io::Error::from_raw_os_error(r),
            }),
            _ => Err(SysError::last(call)),
        }
    }

    fn invalid(call: &'static str, what: &str) -> SysError {
        SysError {
            call,
            source: io::Error::new(io::ErrorKind::InvalidInput, what.to_owned()),
        }
    }
}

/// The RDMA devices libibverbs sees now, each with the kernel's index of it
/// (`ibv_get_device_index`: a device that is removed and added again gets a new one;
/// −1 where the kernel does not say).
pub(super) fn present_devices() -> Result<Vec<(String, i32)>, SysError> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(SysError::last("ibv_get_device_list"));
    }
    let mut found = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers; the name is a NUL-terminated
        // string owned by the device, copied before the list is freed.
        let (name, index) = unsafe {
            let dev = *list.add(i);
            (
                CStr::from_ptr(ffi::ibv_get_device_name(dev)),
                ffi::ibv_get_device_index(dev),
            )
        };
        found.push((name.to_string_lossy().into_owned(), index));
    }
    // SAFETY: `list` came from ibv_get_device_list and is not used afterwards.
    unsafe { ffi::ibv_free_device_list(list) };
    Ok(found)
}

/// Lets librdmacm see the devices as they are now: a device that is gone is marked dead
/// there, and librdmacm closes its context once nothing of ours refers to it (which the
/// kernel waits for before it finishes removing a device).
pub(super) fn sync_librdmacm() {
    // SAFETY: a NULL count pointer is allowed; the list is freed at once.
    let list = unsafe { ffi::rdma_get_devices(std::ptr::null_mut()) };
    if !list.is_null() {
        // SAFETY: `list` came from rdma_get_devices and is not used afterwards.
        unsafe { ffi::rdma_free_devices(list) };
    }
}

/// Device limits from `ibv_query_device`.
#[derive(Clone, Copy, Debug)]
pub(super) struct DeviceAttr {
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cqe: u32,
    pub max_mr_size: u64,
    pub max_mw: u32,
    pub vendor_id: u32,
}

/// A device context shared with librdmacm (from `rdma_get_devices`).
///
/// librdmacm keeps a device's context open while any list it handed out names the
/// device (and while a cm_id is bound to it), and closes a removed device's context
/// once nothing holds it: the kernel waits for that before it finishes removing the
/// device. So each `Device` keeps a list that names its own context alone
/// ([`own_list`]): a list naming every device would hold a removed device on behalf
/// of another (docs/ARCHITECTURE.md, "Devices that come and go").
pub(super) struct Device {
    /// A one-entry list from [`own_list`], freed in Drop.
    list: *mut *mut ffi::ibv_context,
    ctx: *mut ffi::ibv_context,
    name: String,
    /// The kernel's index of the device (−1 where unknown).
    kernel_index: i32,
}

// SAFETY: ibv_context is thread-safe for the calls made through it (verbs objects may
// be created and destroyed from any thread); the list is only read in Drop.
unsafe impl Send for Device {}
// SAFETY: as above; nothing is mutated through `&Device`.
unsafe impl Sync for Device {}

/// The index in `list` of the context of the device called `name`, if librdmacm
/// lists it.
///
/// # Safety
/// `list` is a live list from `rdma_get_devices` of `n` entries.
unsafe fn find_in(list: *mut *mut ffi::ibv_context, n: usize, name: &str) -> Option<usize> {
    (0..n).find(|&i| {
        // SAFETY: the caller's promise: the list holds `n` open contexts; each has a
        // valid device whose name is a NUL-terminated string.
        let found = unsafe { CStr::from_ptr(ffi::ibv_get_device_name((**list.add(i)).device)) };
        found.to_bytes() == name.as_bytes()
    })
}

/// Turns `list` (from `rdma_get_devices`, `n` entries) into a list that holds entry
/// `keep` alone: the other entries are given back to librdmacm at once, through a list
/// of their own, and `list` is cut to `[keep, NULL]`.
///
/// librdmacm counts one hold per list entry and `rdma_free_devices` gives back exactly
/// the entries of the NULL-terminated array it is passed (then frees the array), so a
/// list split in two is given back in two parts with the same effect as the whole.
///
/// # Safety
/// `list` is a live list from `rdma_get_devices` of `n` entries, `keep < n`; afterwards
/// it is a live list of one entry, to be freed with `rdma_free_devices`.
unsafe fn own_list(list: *mut *mut ffi::ibv_context, n: usize, keep: usize) {
    let bytes = std::mem::size_of::<*mut ffi::ibv_context>() * n;
    // SAFETY: plain allocation; librdmacm frees the array with free().
    let others = unsafe { libc::malloc(bytes.max(1)) }.cast::<*mut ffi::ibv_context>();
    if others.is_null() {
        // Keep every hold: the other devices stay open until this one goes (the
        // behaviour of a whole list), which is safe, only less prompt.
        return;
    }
    let mut k = 0;
    for i in (0..n).filter(|&i| i != keep) {
        // SAFETY: `i < n` entries of `list`; `others` has room for `n` entries and
        // `k < n - 1` here.
        unsafe { *others.add(k) = *list.add(i) };
        k += 1;
    }
    // SAFETY: `k <= n - 1`, in bounds; NULL ends the array.
    unsafe { *others.add(k) = std::ptr::null_mut() };
    // SAFETY: `others` is malloc'd, NULL-terminated, and names only contexts `list`
    // held, each once; it is not used afterwards.
    unsafe { ffi::rdma_free_devices(others) };
    // SAFETY: `list` has `n + 1 >= 2` slots.
    unsafe {
        *list = *list.add(keep);
        *list.add(1) = std::ptr::null_mut();
    }
}

impl Device {
    /// The context librdmacm uses for the device called `name`, or `None` when
    /// librdmacm does not list it.
    pub fn open(name: &str) -> Result<Option<Device>, SysError> {
        let mut n: libc::c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is kept until Drop (freeing it
        // drops librdmacm's reference on the context).
        let list = unsafe { ffi::rdma_get_devices(&mut n) };
        if list.is_null() {
            return Err(SysError::last("rdma_get_devices"));
        }
        let n = n.max(0) as usize;
        // SAFETY: `list` is live and holds `n` entries.
        let Some(at) = (unsafe { find_in(list, n, name) }) else {
            // SAFETY: `list` came from rdma_get_devices and is not used afterwards.
            unsafe { ffi::rdma_free_devices(list) };
            return Ok(None);
        };
        // SAFETY: `list` is live with `n` entries and `at < n`.
        unsafe { own_list(list, n, at) };
        // SAFETY: `list[0]` is now the device's context, held open by the list.
        let ctx = unsafe { *list };
        // SAFETY: `ctx` is open (the list holds it); its device pointer is valid.
        let kernel_index = unsafe { ffi::ibv_get_device_index((*ctx).device) };
        let dev = Device {
            list,
            ctx,
            name: name.to_owned(),
            kernel_index,
        };
        dev.async_events_nonblocking()?;
        tracing::debug!(device = name, kernel_index, "RDMA device context held");
        Ok(Some(dev))
    }

    /// The kernel's index of the device (−1 where the kernel does not say).
    pub fn kernel_index(&self) -> i32 {
        self.kernel_index
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn query(&self) -> Result<DeviceAttr, SysError> {
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: `ctx` is open for our lifetime; `attr` is writable and sized for it.
        let ret = unsafe { ffi::ibv_query_device(self.ctx, attr.as_mut_ptr()) };
        SysError::check("ibv_query_device", ret)?;
        // SAFETY: zero-initialised plain data, filled by a successful query.
        let attr = unsafe { attr.assume_init() };
        let pos = |v: libc::c_int| v.max(0) as u32;
        Ok(DeviceAttr {
            max_qp_wr: pos(attr.max_qp_wr),
            max_sge: pos(attr.max_sge),
            max_cqe: pos(attr.max_cqe),
            max_mr_size: attr.max_mr_size,
            max_mw: pos(attr.max_mw),
            vendor_id: attr.vendor_id,
        })
    }
}

/// An asynchronous event of a device (`ibv_get_async_event`), already acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AsyncEvent {
    /// `IBV_EVENT_CQ_ERR` (a CQ overran) of the CQ at this address (see [`Cq::is`]).
    CqError { cq: usize },
    /// Any other event, by its `ibv_event_type` value.
    Other(u32),
}

impl Device {
    /// Makes `ibv_get_async_event` return at once when no event is pending.
    fn async_events_nonblocking(&self) -> Result<(), SysError> {
        // SAFETY: `ctx` is open; `async_fd` is its event file descriptor.
        let fd = unsafe { (*self.ctx).async_fd };
        // SAFETY: fcntl on a descriptor the context owns; only the status flags change.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(SysError::last("fcntl(async_fd, F_GETFL)"));
        }
        // SAFETY: as above.
        let ret = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
        if ret < 0 {
            return Err(SysError::last("fcntl(async_fd, F_SETFL, O_NONBLOCK)"));
        }
        Ok(())
    }

    /// The next asynchronous event of the device, if one is pending.
    pub fn next_async_event(&self) -> Result<Option<AsyncEvent>, SysError> {
        let mut ev = MaybeUninit::<ffi::ibv_async_event>::zeroed();
        // SAFETY: `ctx` is open and its descriptor non-blocking; `ev` is writable.
        let ret = unsafe { ffi::ibv_get_async_event(self.ctx, ev.as_mut_ptr()) };
        if ret != 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(SysError {
                call: "ibv_get_async_event",
                source: e,
            });
        }
        // The type is read as its raw value (the Rust enum may not know every value a
        // newer library reports), and the element as an address only.
        // SAFETY: the library filled `ev`; `event_type` is a 32-bit C enum.
        let kind = unsafe {
            std::ptr::addr_of!((*ev.as_ptr()).event_type)
                .cast::<u32>()
                .read()
        };
        // SAFETY: the element union is pointer-sized plain data; read as the cq member
        // only to compare addresses, never dereferenced.
        let element = unsafe { (*ev.as_ptr()).element.cq } as usize;
        // SAFETY: a successfully read event is acknowledged exactly once.
        unsafe { ffi::ibv_ack_async_event(ev.as_mut_ptr()) };
        Ok(Some(
            if kind == ffi::ibv_event_type::IBV_EVENT_CQ_ERR as u32 {
                AsyncEvent::CqError { cq: element }
            } else {
                AsyncEvent::Other(kind)
            },
        ))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Last of all: every PD, CQ and QP of this context is gone (they hold an Arc).
        // SAFETY: `list` is the one-entry list from `own_list`, freed exactly once.
        unsafe { ffi::rdma_free_devices(self.list) };
        tracing::debug!(device = self.name, "RDMA device context let go");
    }
}

/// A protection domain.
pub(super) struct Pd {
    raw: *mut ffi::ibv_pd,
    dev: Arc<Device>,
}

// SAFETY: a PD is used only as an argument of thread-safe verbs calls.
unsafe impl Send for Pd {}
// SAFETY: as above.
unsafe impl Sync for Pd {}

impl Pd {
    pub fn alloc(dev: &Arc<Device>) -> Result<Arc<Pd>, SysError> {
        // SAFETY: the context is open while `dev` lives, and the PD holds `dev`.
        let raw = unsafe { ffi::ibv_alloc_pd(dev.ctx) };
        if raw.is_null() {
            return Err(SysError::last("ibv_alloc_pd"));
        }
        Ok(Arc::new(Pd {
            raw,
            dev: dev.clone(),
        }))
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // After every MR, MW and QP (they hold an Arc), before the device (field drop).
        // SAFETY: allocated in `alloc`, deallocated once.
        let ret = unsafe { ffi::ibv_dealloc_pd(self.raw) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_dealloc_pd failed; a resource of the PD leaked");
        }
    }
}

/// A memory registration (`ibv_reg_mr`), holding the memory it registers.
pub(super) struct MemRegion {
    raw: *mut ffi::ibv_mr,
    // Field order is drop order: deregistered in Drop, then the memory, then the PD.
    _backing: Arc<Backing>,
    pd: Arc<Pd>,
}

// SAFETY: the MR is only read (keys) or passed to thread-safe verbs calls.
unsafe impl Send for MemRegion {}
// SAFETY: as above.
unsafe impl Sync for MemRegion {}

impl MemRegion {
    /// Registers `backing` with the raw `IBV_ACCESS_*` bits `access`. The memory's
    /// validity is `Backing`'s invariant (owned, or promised by `register_raw`'s caller);
    /// holding the `Arc` keeps it allocated until after deregistration.
    pub fn register(pd: &Arc<Pd>, backing: Arc<Backing>, access: u32) -> Result<Self, SysError> {
        // SAFETY: the PD is valid; [addr, addr+len) is valid memory for as long as the
        // registration exists (held by `_backing`, dropped after ibv_dereg_mr).
        let raw = unsafe {
            ffi::ibv_reg_mr(
                pd.raw,
                backing.addr().cast(),
                backing.len(),
                access as libc::c_int,
            )
        };
        if raw.is_null() {
            return Err(SysError::last("ibv_reg_mr"));
        }
        Ok(MemRegion {
            raw,
            _backing: backing,
            pd: pd.clone(),
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: `raw` is a live registration.
        unsafe { (*self.raw).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: `raw` is a live registration.
        unsafe { (*self.raw).rkey }
    }

    pub fn is_in(&self, pd: &Arc<Pd>) -> bool {
        Arc::ptr_eq(&self.pd, pd)
    }
}

impl Drop for MemRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once, before the memory goes.
        let ret = unsafe { ffi::ibv_dereg_mr(self.raw) };
        if ret != 0 {
            // Still registered (typically a memory window is still bound to it): the NIC
            // may yet write there, so the memory must never be freed. Leak it.
            tracing::warn!(
                ret,
                "ibv_dereg_mr failed (is a memory window still bound to it?); \
                 leaking the memory to keep it safe from the device"
            );
            std::mem::forget(self._backing.clone());
        }
    }
}

/// Which kind of memory window a fast-registration slot is (see `super`'s module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WindowKind {
    /// Type 1: bound with `ibv_bind_mw`, valid on every queue pair of the PD, unbound
    /// by a zero-length bind; no peer can invalidate it.
    Type1,
    /// Type 2: bound by an `IBV_WR_BIND_MW` work request to the posting queue pair,
    /// retired by LOCAL_INV or the peer's SEND_WITH_INV.
    Type2,
}

/// A memory window: the verbs form of a fast-registration slot.
///
/// It keeps the region it was last bound over registered ([`MemWindow::hold`]): the
/// device refuses to deregister memory a window is bound to, so the region goes only
/// after the window is deallocated or bound elsewhere.
pub(super) struct MemWindow {
    raw: *mut ffi::ibv_mw,
    kind: WindowKind,
    /// `Arc::into_raw` of the region last bound over, or null. Replaced only when a
    /// binding names another region, so binding over the same one again (every IO)
    /// touches no reference count.
    bound: AtomicPtr<MemRegion>,
    pd: Arc<Pd>,
}

// SAFETY: the MW is passed to thread-safe verbs calls; its rkey field is written only by
// the thread posting a binding of it (one connection at a time, the fabric contract);
// `bound` is an atomic pointer owning one strong count.
unsafe impl Send for MemWindow {}
// SAFETY: as above.
unsafe impl Sync for MemWindow {}

impl MemWindow {
    pub fn alloc(pd: &Arc<Pd>, kind: WindowKind) -> Result<MemWindow, SysError> {
        let (ty, call) = match kind {
            WindowKind::Type1 => (
                ffi::ibv_mw_type::IBV_MW_TYPE_1,
                "ibv_alloc_mw(IBV_MW_TYPE_1)",
            ),
            WindowKind::Type2 => (
                ffi::ibv_mw_type::IBV_MW_TYPE_2,
                "ibv_alloc_mw(IBV_MW_TYPE_2)",
            ),
        };
        // SAFETY: the PD and its context are valid; the window holds the PD.
        let raw = unsafe { ffi::ibv_alloc_mw(pd.raw, ty) };
        match raw {
            Some(raw) if !raw.is_null() => Ok(MemWindow {
                raw,
                kind,
                bound: AtomicPtr::new(std::ptr::null_mut()),
                pd: pd.clone(),
            }),
            _ => Err(SysError::last(call)),
        }
    }

    pub fn kind(&self) -> WindowKind {
        self.kind
    }

    /// The rkey the provider names the window by: the latest binding's.
    pub fn rkey(&self) -> u32 {
        // SAFETY: `raw` is a live window; the field is written only by the posting
        // thread (see the Send/Sync note), which is the caller here.
        unsafe { (*self.raw).rkey }
    }

    /// Records the key of a type-2 binding just posted: the provider names the window
    /// by `ibv_mw.rkey` in the next work request that refers to it, and libibverbs
    /// leaves updating it to the application for `IBV_WR_BIND_MW`.
    pub fn set_rkey(&self, rkey: u32) {
        // SAFETY: `raw` is a live window; written only by the posting thread.
        unsafe { (*self.raw).rkey = rkey };
    }

    /// Keeps `region` registered while the window may be bound over it.
    pub fn hold(&self, region: &Arc<MemRegion>) {
        let want = Arc::as_ptr(region).cast_mut();
        if self.bound.load(Ordering::Acquire) == want {
            return;
        }
        let new = Arc::into_raw(region.clone()).cast_mut();
        let old = self.bound.swap(new, Ordering::AcqRel);
        if !old.is_null() {
            // SAFETY: every non-null value stored in `bound` came from Arc::into_raw
            // and is released exactly once, by whoever swapped it out.
            drop(unsafe { Arc::from_raw(old) });
        }
    }

    pub fn is_in(&self, pd: &Arc<Pd>) -> bool {
        Arc::ptr_eq(&self.pd, pd)
    }

    /// The `ibv_mr` of the region the window was last bound over, if it ever was: a
    /// zero-length binding (a type-1 window's unbinding) names it too, since providers
    /// read the lkey of the binding's region even when its length is zero.
    pub(super) fn bound_mr(&self) -> Option<*mut ffi::ibv_mr> {
        let held = self.bound.load(Ordering::Acquire);
        // SAFETY: a non-null `bound` owns a strong count of a live MemRegion, released
        // only by the posting thread (the caller) or by Drop.
        (!held.is_null()).then(|| unsafe { (*held).raw })
    }
}

impl Drop for MemWindow {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc`, deallocated once; before the region it was
        // bound over and before the PD (field drop).
        let ret = unsafe { ffi::ibv_dealloc_mw(self.raw) };
        if ret != 0 {
            tracing::warn!(ret, "ibv_dealloc_mw failed");
        }
        let held = *self.bound.get_mut();
        if !held.is_null() {
            // SAFETY: as in `hold`: the one strong count `bound` owned.
            drop(unsafe { Arc::from_raw(held) });
        }
    }
}

/// An epoll set, level-triggered for input, over descriptors the fabric owns elsewhere
/// (completion channels, rdma_cm event channels): one descriptor that a sleeping poller
/// waits on for all of them (`Cq::wait_fd`, `Listener::wait_fd`).
pub(super) struct WakeSet(OwnedFd);

impl WakeSet {
    pub fn new() -> Result<WakeSet, SysError> {
        // SAFETY: no pointer arguments.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(SysError::last("epoll_create1"));
        }
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        Ok(WakeSet(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches `fd` (open, and owned by the caller until [`WakeSet::remove`]).
    pub fn add(&self, fd: RawFd) -> Result<(), SysError> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, "epoll_ctl(EPOLL_CTL_ADD)")
    }

    /// Stops watching `fd`; errors are ignored (closing `fd` removes it too).
    pub fn remove(&self, fd: RawFd) {
        let _ = self.ctl(libc::EPOLL_CTL_DEL, fd, "epoll_ctl(EPOLL_CTL_DEL)");
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, call: &'static str) -> Result<(), SysError> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: `ev` is a valid event the kernel only reads; both descriptors are open.
        if unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(SysError::last(call));
        }
        Ok(())
    }

    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}
