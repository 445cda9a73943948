//! Running the project inside SPDK applications (feature `spdk`): the generated bindings
//! ([`sys`]) and safe wrappers over the parts of SPDK the plugin uses.
//!
//! - [`thread`]: SPDK threads, the application's cores, messages, ticks.
//! - [`export`]: an SPDK bdev as an RNBD export backend (descriptor, per-thread channel,
//!   IO submission with `spdk_bdev_queue_io_wait` on −ENOMEM, hot remove).
//! - [`io_device`]: io_devices whose channel contexts are Rust values, made and dropped
//!   on the channel's thread ([`IoDevice`], [`IoChannel`]).
//! - [`bdev_io`]: the other side, a bdev IO handed to a bdev module (fields, buffer,
//!   per-IO context, completion).
//! - [`dma`]: session chunk pools from SPDK DMA memory (the server's chunk allocator
//!   inside SPDK), so exported bdevs doing DMA can use them.
//! - [`driver`]: the engine's [`Ctx`](crate::engine::Ctx) over SPDK threads, so RTRS
//!   pollers run as `spdk_poller`s (docs/ARCHITECTURE.md, "One set of pollers, two
//!   drivers") with no threads of ours.
//! - [`keyring`]: pre-shared keys by name from SPDK's keyring (`keyring_file_add_key`).
//! - [`json`]: RPC parameters to [`serde_json::Value`], answers and `config_json`
//!   entries written back, and the pending [`RpcRequest`].
//! - [`log`]: `tracing` events into SPDK's log.
//!
//! The plugin crate (`plugin/`) builds the shared library on top of these; SPDK's
//! symbols are resolved by the host application at load time.

pub mod bdev_io;
pub mod dma;
pub mod driver;
pub mod export;
pub mod io_device;
pub mod json;
pub mod keyring;
pub mod log;
pub mod poller;
pub mod sys;
pub mod thread;

pub use bdev_io::{BdevIo, BdevIoType, GotBuf};
pub use driver::{Driver, DriverError};
pub use io_device::{channel_ctx, ChannelCtx, IoChannel, IoDevice};
pub use json::RpcRequest;
pub use poller::{poll_until, SpdkPoll, SpdkPoller};
pub use thread::{app_cores, interrupt_mode, loop_now_ns, now_ns, MsgError, SpdkThread};
