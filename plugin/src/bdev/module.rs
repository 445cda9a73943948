//! The `rtrs` bdev module as SPDK sees it (SPDK's `module/bdev/null` and `passthru`
//! shape): the module's callbacks (`module_init`, `module_fini`, `config_json`,
//! `get_ctx_size`), the bdevs' function table (`destruct`, `submit_request`,
//! `io_type_supported`, `get_io_channel`, `dump_info_json`, `write_config_json`), and
//! [`register`], which turns an opened disk into a registered `spdk_bdev` whose
//! io_device is the disk (its channels are [`super::channel`]'s).

use std::ffi::{c_int, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

use rtrs_spdk::spdk::json::write_value;
use rtrs_spdk::spdk::{sys, BdevIoType, IoChannel, IoDevice};
use serde_json::json;

use super::channel::{self, ChanCtx};
use super::fabric;
use super::group::{self, Home};
use super::info;
use super::sess::disk::{self, errno_str, BdevPtr, Disk};
use super::task;

extern "C" {
    /// The module structure, defined by the shim's `SPDK_BDEV_MODULE_REGISTER`.
    fn rtrs_bdev_module() -> *mut sys::spdk_bdev_module;
}

pub fn module_ptr() -> *mut sys::spdk_bdev_module {
    // SAFETY: a plain accessor of a static in the shim.
    unsafe { rtrs_bdev_module() }
}

/// `module_init`: the poll groups' io_device (home comes with the first
/// `bdev_rtrs_create`).
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_init() -> c_int {
    group::register_groups();
    0
}

/// `module_fini` (the module finishes asynchronously: `async_fini` in the shim): every
/// bdev is gone (the bdev layer unregistered them, and each one's destruct completed once
/// its disk was down), but a disk still opening or closing after a failed
/// `bdev_rtrs_create`, and the sessions closing behind the last devices, have work left
/// on home and the poll groups. Once the last disk and session are down, home's pollers
/// go, the groups' io_device is unregistered, SPDK's memory is released from the fabrics
/// and the bdev layer is told the module is done (`spdk_bdev_module_fini_done`).
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_fini() {
    disk::stop_all(Box::new(|| {
        Home::stop();
        group::unregister_groups();
        fabric::release_all();
        // SAFETY: the completion of this module's asynchronous fini, called once.
        unsafe { sys::spdk_bdev_module_fini_done() };
    }));
}

/// `config_json`: no module-wide options; each bdev writes its own create call.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_config_json(_w: *mut sys::spdk_json_write_ctx) -> c_int {
    0
}

/// `get_ctx_size`: per-IO driver context in `spdk_bdev_io` (the task).
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_ctx_size() -> c_int {
    task::task_size()
}

/// # Safety
/// `ctx` must be a bdev's `ctxt` (or its io_device): a disk address from
/// `Arc::into_raw`, still held.
unsafe fn disk_of(ctx: *mut c_void) -> Arc<Disk> {
    // SAFETY: per the contract the pointer came from Arc::into_raw and is alive; the
    // count is raised first, so the returned Arc owns a reference of its own.
    unsafe {
        Arc::increment_strong_count(ctx.cast_const().cast::<Disk>());
        Arc::from_raw(ctx.cast_const().cast::<Disk>())
    }
}

/// A registered bdev, released once its disk is down.
struct Registered(*mut sys::spdk_bdev);

// SAFETY: the bdev is only touched on the application thread, where the disk finishes
// (Disk::finished runs there); the handle merely travels inside the disk.
unsafe impl Send for Registered {}

impl Registered {
    /// Tells the bdev layer the destruct is done and frees the bdev with the disk
    /// reference its `ctxt` held.
    fn release(self) {
        let bdev = self.0;
        // SAFETY: the bdev was registered by `register` and is being destructed; SPDK is
        // done with it once destruct_done returns. Its ctxt holds a disk reference from
        // Arc::into_raw, given back once, here.
        unsafe {
            sys::spdk_bdev_destruct_done(bdev, 0);
            let ctxt = (*bdev).ctxt;
            free_bdev(bdev);
            drop(Arc::from_raw(ctxt.cast::<Disk>().cast_const()));
        }
    }
}

/// On the application thread, once OPEN answered: registers the disk's io_device and
/// its bdev, whose geometry comes from the device's info (the target's: block sizes,
/// write cache, unmap granularity and alignment, and, where the target's device limits
/// transfers below the session, that limit as an optimal IO boundary the bdev layer
/// splits at). The disk is open afterwards.
///
/// # Errors
/// No device info yet, or `spdk_bdev_register` failed (named, with its errno).
pub fn register(disk: &Arc<Disk>) -> Result<(), String> {
    let info = disk.info().ok_or("registered before OPEN answered")?;
    let bs = info.logical_block_size;
    let blocks = |bytes: u64| u32::try_from(bytes / u64::from(bs)).unwrap_or(u32::MAX);
    let name = CString::new(disk.params.name.clone())
        .map_err(|_| "the bdev's name contains a NUL byte".to_string())?;
    let mut b = Box::<sys::spdk_bdev>::default();
    b.name = name.into_raw();
    b.product_name = c"RTRS disk".as_ptr().cast_mut();
    b.blocklen = bs;
    b.phys_blocklen = info.physical_block_size.max(bs);
    b.blockcnt = info.size / u64::from(bs);
    b.write_cache = c_int::from(info.write_cache);
    b.max_rw_size = blocks(u64::from(info.max_io_size)).max(1);
    b.optimal_io_boundary = b.max_rw_size;
    // The target's device splits there: so does the bdev layer, before sending.
    b.split_on_optimal_io_boundary = info.io_boundary != 0;
    b.preferred_unmap_granularity = blocks(u64::from(info.discard_granularity));
    b.preferred_unmap_alignment = blocks(u64::from(info.discard_alignment));
    b.max_num_segments = task::MAX_IOVS;
    b.max_unmap = blocks(info.max_discard.min(u64::from(u32::MAX)));
    b.max_unmap_segments = 1;
    b.max_write_zeroes = blocks(info.max_write_zeroes.min(u64::from(u32::MAX)));
    b.module = module_ptr();
    b.fn_table = fn_table();
    let me = Arc::into_raw(Arc::clone(disk)).cast_mut().cast::<c_void>();
    b.ctxt = me;
    let bdev = Box::into_raw(b);
    // The disk's channels; its key is the disk's address, as `ctxt` is (`destruct` and
    // `get_io_channel` find it by that).
    // SAFETY: the name was just set from a CString, alive until the bdev is freed.
    let io_device = IoDevice::<ChanCtx>::register(disk, unsafe { CStr::from_ptr((*bdev).name) });
    // SAFETY: a fully set up bdev, registered once on the application thread.
    let rc = unsafe { sys::spdk_bdev_register(bdev) };
    if rc != 0 {
        // Dropped: unregistered with no device_gone (nothing was opened on it).
        drop(io_device);
        // SAFETY: registration failed, so SPDK keeps nothing of the bdev; the reference
        // `ctxt` held is given back.
        unsafe {
            free_bdev(bdev);
            drop(Arc::from_raw(me.cast_const().cast::<Disk>()));
        }
        return Err(format!("spdk_bdev_register failed: {}", errno_str(rc)));
    }
    // Taken back by `destruct` (the same address as `ctxt`).
    let _key = io_device.into_key();
    let registered = Registered(bdev);
    disk.set_bdev(Some(BdevPtr(bdev)));
    disk.set_unregister(unregister);
    disk.set_open(Box::new(move || registered.release()));
    tracing::info!(
        "rtrs bdev {}: {} blocks of {} B, max IO {} B",
        disk.params.name,
        info.size / u64::from(bs),
        bs,
        info.max_io_size
    );
    Ok(())
}

/// Unregisters the disk's bdev (its session lost the target for good): the bdev layer
/// tells its users, then `destruct` closes the disk as a delete does. Application
/// thread.
pub fn unregister(disk: &Arc<Disk>) {
    let name = CString::new(disk.name()).unwrap_or_default();
    // SAFETY: unregister by name on the application thread; no completion is needed.
    let rc = unsafe {
        sys::spdk_bdev_unregister_by_name(
            name.as_ptr(),
            module_ptr(),
            Some(unregistered),
            std::ptr::null_mut(),
        )
    };
    if rc != 0 {
        tracing::error!(
            "rtrs bdev {}: spdk_bdev_unregister_by_name failed: {}",
            disk.name(),
            errno_str(rc)
        );
    }
}

unsafe extern "C" fn unregistered(_arg: *mut c_void, rc: i32) {
    if rc != 0 {
        tracing::error!(
            "rtrs bdev: unregistering after the loss timeout: {}",
            errno_str(rc)
        );
    }
}

/// # Safety
/// `bdev` must come from `Box::into_raw` in `register`, with its name from
/// `CString::into_raw`, and no longer be known to SPDK.
unsafe fn free_bdev(bdev: *mut sys::spdk_bdev) {
    // SAFETY: per the contract.
    unsafe {
        let b = Box::from_raw(bdev);
        if !b.name.is_null() {
            drop(CString::from_raw(b.name));
        }
    }
}

/// `destruct` (application thread): unregister the io_device; once its channels are
/// gone the disk closes ([`ChanCtx`]'s `device_gone`).
unsafe extern "C" fn destruct(ctx: *mut c_void) -> c_int {
    // SAFETY: the bdev's ctxt is the key `register` left with `into_key`, taken back
    // once: SPDK destructs a bdev once.
    unsafe { IoDevice::<ChanCtx>::from_key(ctx) }.unregister();
    1
}

unsafe extern "C" fn io_type_supported(ctx: *mut c_void, ty: sys::spdk_bdev_io_type) -> bool {
    // SAFETY: the bdev's ctxt.
    let disk = unsafe { disk_of(ctx) };
    let info = disk.first_info();
    match BdevIoType::from_raw(ty) {
        BdevIoType::Read | BdevIoType::Write | BdevIoType::Flush | BdevIoType::Reset => true,
        BdevIoType::Unmap => info.is_some_and(|i| i.max_discard > 0),
        BdevIoType::WriteZeroes => info.is_some_and(|i| i.max_write_zeroes > 0),
        BdevIoType::Other(_) => false,
    }
}

unsafe extern "C" fn get_io_channel(ctx: *mut c_void) -> *mut sys::spdk_io_channel {
    // SAFETY: the bdev's ctxt is the key `register` left, registered until `destruct`
    // (SPDK asks for no channel after it); the bdev layer puts the channel itself.
    unsafe {
        IoDevice::<ChanCtx>::with_key(ctx, |d| {
            d.channel()
                .map_or(std::ptr::null_mut(), IoChannel::into_raw)
        })
    }
}

unsafe extern "C" fn dump_info_json(ctx: *mut c_void, w: *mut sys::spdk_json_write_ctx) -> c_int {
    // SAFETY: the bdev's ctxt.
    let disk = unsafe { disk_of(ctx) };
    // SAFETY: `w` is the live writer inside the bdev's driver_specific object.
    unsafe {
        sys::spdk_json_write_name(w, c"rtrs".as_ptr());
        write_value(w, &info::describe(&disk));
    }
    0
}

unsafe extern "C" fn write_config_json(
    bdev: *mut sys::spdk_bdev,
    w: *mut sys::spdk_json_write_ctx,
) {
    // SAFETY: one of our bdevs.
    let disk = unsafe { disk_of((*bdev).ctxt) };
    let entry = json!({"method": "bdev_rtrs_create", "params": info::config(&disk)});
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
