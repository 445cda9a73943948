//! The RNBD client (the kernel's `rnbd-clt`), independent of the RTRS transport: message
//! builders ([`msg`]) and the per-device state machine ([`RnbdDevice`]).

pub mod msg;

mod device;

pub use device::{check_dev_name, sess_info_done, DevState, DeviceError, RnbdDevice};
pub use msg::{BlockRequest, DeviceInfo, ReqFlags};
