//! The `rtrs` bdev module (client side): SPDK's module hooks for the bdevs that map a
//! remote RNBD device over RTRS. This file holds the module's life-cycle hooks, which the
//! shim's `SPDK_BDEV_MODULE_REGISTER` calls; the bdevs and their RPCs are added here by
//! the client-side work (issue 4 §3).

use std::ffi::c_int;

use rtrs_spdk::spdk::sys;

/// `module_init`: nothing to set up before the first `bdev_rtrs_create`.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_init() -> c_int {
    0
}

/// `module_fini`: no bdevs of ours remain once the bdev layer finishes.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_fini() {}

/// `config_json`: module-wide options (none yet); each bdev writes its own create call.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_config_json(_w: *mut sys::spdk_json_write_ctx) -> c_int {
    0
}

/// `get_ctx_size`: per-IO driver context in `spdk_bdev_io`.
#[no_mangle]
pub extern "C" fn rtrs_bdev_module_ctx_size() -> c_int {
    0
}

/// Registers the client-side RPC methods (`bdev_rtrs_*`).
pub fn register_rpcs() {}
