//! The RNBD client (the kernel's `rnbd-clt`): message builders ([`msg`]), the per-device
//! state machine ([`RnbdDevice`]), both free of any transport, and [`RnbdClient`], which
//! drives devices over one core's RTRS session handle ([`RtrsPort`]) on the session's
//! home core; [`RnbdCore`] sends block IO of the same devices from the other cores.
//! Both send block IO through one core's `CoreIo` (`io.rs`), which keeps requests
//! while their device is unreachable and sends them again once it is re-opened.

pub mod msg;

mod config;
mod device;
mod io;
mod port;
mod rtrs;
mod session;
mod shared;
mod zeroes;

pub use config::{RnbdClientConfig, WriteZeroesMode, WriteZeroesParseError};
pub use device::{check_dev_name, sess_info_done, DevState, DeviceError, RnbdDevice};
pub use msg::{BlockRequest, DeviceInfo, ReqFlags};
pub use port::{PortCompletion, PortError, PortIo, RtrsPort};
pub use rtrs::LinkListener;
pub use session::{ClientEvent, DevHandle, IoError, RnbdClient, ADMIN_TAG, REPLY_SLOT};
pub use shared::{RnbdCore, SharedDevices};
