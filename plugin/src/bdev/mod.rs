//! The `rtrs` bdev module (client side): bdevs that map a remote RNBD device over an RTRS
//! session — the kernel's `rnbd-clt` block driver, as an SPDK bdev module (shaped like
//! SPDK's `module/bdev/null` and `passthru`: one module with init/fini/ctx_size/
//! config_json, one poller per IO channel, RPC handlers in their own file).
//!
//! The modules, leaf first (each uses only those before it; `ci/modcycles.py` checks it):
//! - [`params`]: `bdev_rtrs_*` parameters, decoded with errors naming the field;
//!   [`memmap`]: SPDK memory registered with a session's fabric domain, as SPDK maps it;
//!   [`fabric`]: one client fabric per transport for the whole application.
//! - [`task`]: one bdev IO's request in its `driver_ctx` and the typed handle
//!   ([`task::TaskRef`]) that carries it to a session core's queue and back; where a task
//!   finished on another thread returns ([`task::ReturnTo`]).
//! - [`sess`]: a client session shared by the devices of one `sessname`, with its parts:
//!   [`sess::core_queue`], one core of the session (the library's `RnbdQueue` over
//!   connection `k+1` of every path, carrying the IO of all its devices; core 0's also
//!   the session's `RnbdAdmin`), and [`sess::disk`], one bdev, a device over the session,
//!   and its life. What it needs of home above it is a trait it defines
//!   ([`sess::SessHome`]).
//! - [`reset`]: a bdev reset waiting for its disk's requests to drain, in its thread's
//!   poll group.
//! - [`group`]: poll groups, one per SPDK thread with rtrs bdev channels (as
//!   `bdev_nvme`'s), and home, the module's control thread; who owns which session core.
//! - [`channel`]: IO channels, `submit_request`.
//! - [`info`]: what sessions and bdevs say of themselves (`bdev_rtrs_get_sessions`,
//!   `config_json`).
//! - [`module`]: the SPDK module's callbacks, the bdevs' function table, and the
//!   registration of an opened disk's bdev.
//! - [`rpc`]: the JSON-RPC methods (decode, call the disk's API, answer).
//!
//! Every bdev writes its own `bdev_rtrs_create` in `write_config_json`, so `save_config`
//! followed by `--json` rebuilds it.

mod channel;
mod fabric;
mod group;
mod info;
mod memmap;
mod module;
mod params;
mod reset;
mod rpc;
mod sess;
mod task;

pub use rpc::register_rpcs;
