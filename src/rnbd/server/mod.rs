//! The RNBD server (the kernel's `rnbd-srv`): exports, sessions and the per-core
//! processing of requests, independent of the RTRS transport that carries them.
//!
//! - [`Exports`]: every exported name with its backend, writer count and host list
//!   ([`HostList`]), shared by all cores and sessions (`rnbd_srv_dev`).
//! - [`RnbdServerSession`]: one client session's device table (`rnbd_srv_session`), shared by
//!   the cores serving that session, published as versioned snapshots that each core
//!   copies into its [`SessionView`].
//! - [`Dispatcher`]: one core's request processor (`rnbd_srv_rdma_ev`): SESS_INFO, OPEN,
//!   CLOSE and IO onto that core's backend instances.
//! - [`RnbdSessions`] / [`SessionCache`]: RNBD sessions by RTRS session, shared, with a
//!   per-core cache for the data path.
//! - [`RnbdServer`]: all of it as the RTRS server's per-core handler
//!   ([`RnbdServer::factory`] for `Server::start`).
//! - [`TargetControl`]: the operator's view of a target: openers, forced close,
//!   disconnects.

mod control;
mod dispatch;
mod exports;
mod handler;
mod hosts;
mod registry;
mod session;

pub use super::Dir;
pub use control::{ControlError, Opener, OpenerPath, Served, TargetControl};
pub use dispatch::{Dispatcher, Outcome, Request};
pub use exports::{AccessError, ExportBackend, ExportId, Exports, ExportsError};
pub use handler::RnbdServer;
pub use hosts::{Host, HostList, HostPattern, HostPatternError};
pub use registry::{RnbdSessions, SessionCache};
pub use session::{Devices, Mapping, RnbdServerSession, SessionView};
