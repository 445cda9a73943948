//! The `rtrs` bdev module (client side): bdevs that map a remote RNBD device over an RTRS
//! session — the kernel's `rnbd-clt` block driver, as an SPDK bdev module (shaped like
//! SPDK's `module/bdev/null` and `passthru`: one module with init/fini/ctx_size/
//! config_json, one poller per IO channel, RPC handlers in their own file).
//!
//! - [`params`]: `bdev_rtrs_*` parameters, decoded with errors naming the field.
//! - [`disk`]: one bdev — session, OPEN, registration, delete; [`core`]: the per-core
//!   ports carrying its IO (connection `k+1` of every path on core `k`).
//! - [`channel`]: IO channels, `submit_request`, completions on the submitting thread; the
//!   channel on a core's CPU owns and polls that core's port (the disk's thread there
//!   polls it while no channel does).
//! - [`memmap`]: SPDK memory registered with the fabric, so IO buffers go out as-is.
//! - Transports: `tcp` uses the tcp fabric, `rdma` the verbs fabric (first RDMA device),
//!   one fabric per transport for the whole application ([`client_fabric`]); all paths
//!   of one bdev use one transport.
//! - [`rpc`]: the JSON-RPC methods.
//!
//! Every bdev writes its own `bdev_rtrs_create` in `write_config_json`, so `save_config`
//! followed by `--json` rebuilds it.

mod channel;
mod core;
mod disk;
mod memmap;
mod params;
mod rpc;
mod task;

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rtrs_spdk::fabric::tcp::TcpFabric;
use rtrs_spdk::fabric::verbs::VerbsFabric;
use rtrs_spdk::fabric::Fabric;
use rtrs_spdk::spdk::json::write_value;
use rtrs_spdk::spdk::sys;
use serde_json::json;

use disk::Disk;
use memmap::MemMap;
use params::Transport;

pub use rpc::register_rpcs;

extern "C" {
    /// The module structure, defined by the shim's `SPDK_BDEV_MODULE_REGISTER`.
    fn rtrs_bdev_module() -> *mut sys::spdk_bdev_module;
}

fn module_ptr() -> *mut sys::spdk_bdev_module {
    // SAFETY: a plain accessor of a static in the shim.
    unsafe { rtrs_bdev_module() }
}

/// The client side's fabric of one transport and the SPDK memory registered with it,
/// shared by every rtrs bdev of the application using that transport.
pub struct ClientFabric {
    pub fabric: Arc<dyn Fabric>,
    pub mem: MemMap,
}

/// The application's client fabrics: tcp, rdma (each created on first use).
static CLIENT_FABRICS: Mutex<[Option<Arc<ClientFabric>>; 2]> = Mutex::new([None, None]);
static DISKS: Mutex<Vec<Arc<Disk>>> = Mutex::new(Vec::new());

fn slot(t: Transport) -> usize {
    match t {
        Transport::Tcp => 0,
        Transport::Rdma => 1,
    }
}

/// The client fabric of `transport`, created on first use: the tcp fabric, or the verbs
/// fabric over the first RDMA device. SPDK's memory is registered with it (memmap), so
/// bdev IO buffers go out as they are. A failed creation is not remembered (a device
/// may appear later).
///
/// # Errors
/// The fabric cannot be opened (for rdma on a machine without a device: the fabric's
/// "no RDMA device found ..." text), or SPDK's memory cannot be registered with it. The
/// message does not name the RPC field; the caller prefixes it.
fn client_fabric(transport: Transport) -> Result<Arc<ClientFabric>, String> {
    let mut g = CLIENT_FABRICS
        .lock()
        .map_err(|_| "client fabric lock poisoned".to_string())?;
    let entry = &mut g[slot(transport)];
    if let Some(f) = entry.as_ref() {
        return Ok(Arc::clone(f));
    }
    let fabric: Arc<dyn Fabric> = match transport {
        Transport::Tcp => Arc::new(TcpFabric::new()),
        Transport::Rdma => Arc::new(VerbsFabric::open(None).map_err(|e| e.to_string())?),
    };
    let mem = MemMap::new(Arc::clone(&fabric))?;
    let f = Arc::new(ClientFabric { fabric, mem });
    *entry = Some(Arc::clone(&f));
    Ok(f)
}

/// Every rtrs bdev, including those still opening or closing.
fn registry() -> MutexGuard<'static, Vec<Arc<Disk>>> {
    DISKS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn find(name: &str) -> Option<Arc<Disk>> {
    registry().iter().find(|d| d.name() == name).cloned()
}

/// `module_init`: nothing to set up before the first `bdev_rtrs_create`.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_init() -> c_int {
    0
}

/// `module_fini`: every bdev is gone (the bdev layer unregistered them); release SPDK's
/// memory from the fabrics.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_fini() {
    if let Ok(mut g) = CLIENT_FABRICS.lock() {
        for f in g.iter_mut() {
            f.take();
        }
    }
}

/// `config_json`: no module-wide options; each bdev writes its own create call.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_config_json(_w: *mut sys::spdk_json_write_ctx) -> c_int {
    0
}

/// `get_ctx_size`: per-IO driver context in `spdk_bdev_io`.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_ctx_size() -> c_int {
    task::task_size()
}

/// # Safety
/// `ctx` must be a bdev's `ctxt`: a disk address from `Arc::into_raw`, still held.
unsafe fn disk_of(ctx: *mut c_void) -> Arc<Disk> {
    // SAFETY: per the contract the pointer came from Arc::into_raw and is alive; the
    // count is raised first, so the returned Arc owns a reference of its own.
    unsafe {
        Arc::increment_strong_count(ctx.cast_const().cast::<Disk>());
        Arc::from_raw(ctx.cast_const().cast::<Disk>())
    }
}

unsafe extern "C" fn destruct(ctx: *mut c_void) -> c_int {
    // SAFETY: the bdev's ctxt.
    unsafe { disk_of(ctx) }.destruct();
    1
}

unsafe extern "C" fn io_type_supported(ctx: *mut c_void, ty: sys::spdk_bdev_io_type) -> bool {
    // SAFETY: the bdev's ctxt.
    let disk = unsafe { disk_of(ctx) };
    let info = disk.info();
    match ty {
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_READ
        | sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE
        | sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_FLUSH
        | sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_RESET => true,
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_UNMAP => info.is_some_and(|i| i.max_discard > 0),
        sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE_ZEROES => {
            info.is_some_and(|i| i.max_write_zeroes > 0)
        }
        _ => false,
    }
}

unsafe extern "C" fn get_io_channel(ctx: *mut c_void) -> *mut sys::spdk_io_channel {
    // SAFETY: the disk is our io_device (registered before the bdev).
    unsafe { sys::spdk_get_io_channel(ctx) }
}

unsafe extern "C" fn dump_info_json(ctx: *mut c_void, w: *mut sys::spdk_json_write_ctx) -> c_int {
    // SAFETY: the bdev's ctxt.
    let disk = unsafe { disk_of(ctx) };
    // SAFETY: `w` is the live writer inside the bdev's driver_specific object.
    unsafe {
        sys::spdk_json_write_name(w, c"rtrs".as_ptr());
        write_value(w, &disk.describe());
    }
    0
}

unsafe extern "C" fn write_config_json(
    bdev: *mut sys::spdk_bdev,
    w: *mut sys::spdk_json_write_ctx,
) {
    // SAFETY: one of our bdevs.
    let disk = unsafe { disk_of((*bdev).ctxt) };
    let entry = json!({"method": "bdev_rtrs_create", "params": disk.config()});
    // SAFETY: `w` is the live writer of the bdev subsystem's config array.
    unsafe { write_value(w, &entry) };
}

/// The bdevs' function table (built once; SPDK keeps the pointer).
fn fn_table() -> *const sys::spdk_bdev_fn_table {
    static TABLE: OnceLock<usize> = OnceLock::new();
    *TABLE.get_or_init(|| {
        let t = sys::spdk_bdev_fn_table {
            destruct: Some(destruct),
            submit_request: Some(channel::submit_request),
            io_type_supported: Some(io_type_supported),
            get_io_channel: Some(get_io_channel),
            dump_info_json: Some(dump_info_json),
            write_config_json: Some(write_config_json),
            ..Default::default()
        };
        Box::into_raw(Box::new(t)) as usize
    }) as *const sys::spdk_bdev_fn_table
}
