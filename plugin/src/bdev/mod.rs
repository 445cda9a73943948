//! The `rtrs` bdev module (client side): bdevs that map a remote RNBD device over an RTRS
//! session — the kernel's `rnbd-clt` block driver, as an SPDK bdev module (shaped like
//! SPDK's `module/bdev/null` and `passthru`: one module with init/fini/ctx_size/
//! config_json, one poller per IO channel, RPC handlers in their own file).
//!
//! The modules, leaf first (each uses only those before it):
//! - [`params`]: `bdev_rtrs_*` parameters, decoded with errors naming the field;
//!   [`memmap`]: SPDK memory registered with the fabric, so IO buffers go out as-is;
//!   [`task`]: one bdev IO's request in its `driver_ctx` and the typed handle
//!   ([`task::TaskRef`]) that carries it to a core queue and back to its channel;
//!   [`threads`]: the SPDK threads a disk's cores run on.
//! - [`fabric`]: one client fabric per transport for the whole application (`tcp`: the
//!   tcp fabric, `rdma`: the verbs fabric over the first RDMA device); all paths of one
//!   bdev use one transport.
//! - [`core_queue`]: the per-core queues carrying a disk's IO (the library's `RnbdQueue` over
//!   connection `k+1` of every path on core `k`, the same on every core; core 0's also
//!   carries the session's `RnbdAdmin`); it sees its disk through the
//!   [`core_queue::CoreDisk`] trait.
//! - [`disk`]: one bdev — session, OPEN, its life ([`disk`]'s `Life`: opening, open,
//!   closing, closed), the registry of disks; implements `CoreDisk`.
//! - [`channel`]: IO channels, `submit_request`, completions on the submitting thread; the
//!   channel on a core's CPU owns and polls that core's queue (the disk's thread there
//!   polls it while no channel does).
//! - [`info`]: what a disk says of itself (`bdev_rtrs_get_sessions`, `config_json`).
//! - [`module`]: the SPDK module's callbacks, the bdevs' function table, and the
//!   registration of an opened disk's bdev.
//! - [`rpc`]: the JSON-RPC methods (decode, call the disk's API, answer).
//!
//! Every bdev writes its own `bdev_rtrs_create` in `write_config_json`, so `save_config`
//! followed by `--json` rebuilds it.

mod channel;
mod core_queue;
mod disk;
mod fabric;
mod handoff;
mod info;
mod memmap;
mod module;
mod params;
mod rpc;
mod task;
mod threads;

pub use rpc::register_rpcs;
