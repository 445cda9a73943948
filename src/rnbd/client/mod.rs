//! The RNBD client (the kernel's `rnbd-clt`): message builders ([`msg`]) and the
//! per-device state machine ([`RnbdDevice`]), both free of any transport; one
//! [`RnbdQueue`] per core, the same on every core, that sends block IO over that core's
//! RTRS session handle ([`SessionHandle`]) and keeps requests while their device is
//! unreachable (the kernel's per-hardware-queue `rnbd_queue_rq`); and one
//! [`RnbdAdmin`] per session that runs SESS_INFO/OPEN/CLOSE and the re-open after a
//! reconnect through the queue of the core it runs on, and publishes the device table
//! as versioned snapshots ([`DeviceTable`]) the queues pick up without a lock per
//! request. [`open_rnbd_session`] brings all of them up over a new RTRS session;
//! [`RnbdClient`] is an admin with its core's queue, for single-core users.

pub mod msg;

mod admin;
mod bringup;
mod config;
mod device;
mod handle;
mod queue;
mod request;
mod rnbd_client;
mod rtrs;
mod table;
mod zeroes;

/// The RTRS client's request and completion, which [`SessionHandle`] passes through.
pub use crate::client::{ClientCompletion, ClientIo, Sgl, SglRef};

pub use admin::{ClientEvent, RnbdAdmin, REPLY_SLOT};
pub use bringup::{open_rnbd_session, BringUpError, RnbdClientSession};
pub use config::{WriteZeroesMode, WriteZeroesParseError};
pub use device::{check_dev_name, sess_info_done, DevState, DeviceError, RnbdDevice};
pub use handle::{RnbdSendError, SessionHandle};
pub use msg::{BlockRequest, DeviceInfo, ReqFlags};
pub use queue::{DevHandle, IoError, RnbdQueue, ADMIN_TAG};
pub use rnbd_client::RnbdClient;
pub use rtrs::{completion, completion_result, LinkListener};
pub use table::{DeviceTable, Snapshot};
