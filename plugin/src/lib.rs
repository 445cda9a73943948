//! `librtrs_spdk.so`: the rtrs SPDK plugin. Loaded into an SPDK application built with
//! shared libraries (`LD_PRELOAD=librtrs_spdk.so spdk_tgt ...`, likewise `nvmf_tgt`,
//! `bdevperf`, fio's `spdk_bdev` plugin), it registers
//! - the `rtrs` bdev module (client side, [`bdev`]): an RNBD device over RTRS as a bdev;
//! - the `rtrs_target` subsystem (server side, [`target`]): SPDK bdevs exported over
//!   RTRS, with `config_json` so `save_config` / `--json` rebuild it;
//! - their JSON-RPC methods.
//!
//! `shim.c` holds SPDK's registration macros and calls the `extern "C"` functions here;
//! SPDK symbols are left undefined and resolved by the host application.
// A shared library loaded by SPDK: its documentation is of its private modules
// (`cargo doc -p rtrs-spdk-plugin --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

mod bdev;
mod rpc;
mod target;

/// Registers every RPC method of the plugin; called by the shim's constructor, before
/// the application starts its RPC server.
#[no_mangle]
pub extern "C" fn rtrs_register_rpcs() {
    rtrs_spdk::spdk::log::install();
    target::register_rpcs();
    bdev::register_rpcs();
}
