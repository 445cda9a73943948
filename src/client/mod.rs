//! The RTRS client (the kernel's `rtrs-clt.c`, `rtrs-clt-stats.c` and the client sysfs),
//! as pollers on reactor cores.
//!
//! # Shape
//! - [`ClientSession::open`] on the session's *home core* registers one poller that runs,
//!   for every path, the connection sequence (cid 0 then one IO connection per core,
//!   CON_REQ/CON_RSP as CM private data, INFO_REQ/INFO_RSP on cid 0), the heartbeat
//!   on cid 0, error recovery, reconnects and the runtime commands ([`ClientSession`]).
//! - One [`SessionCore`] per core carries that core's IO: its permits (a fixed slice
//!   of the queue depth), its IO connection of every path (`cid = core + 1`), request
//!   submission, completions and failover. Submit on core `k`, poll on core `k`: no
//!   locks, no cross-core hops on the data path.
//! - One [`CoreCq`] per core, made by whoever runs the core's loop and polled once per
//!   loop, carries the completions of every session's IO connections on that core; each
//!   [`SessionCore`] attached to it ([`SessionCore::attach`]) takes its own from it.
//!   Without one, each IO connection has its own CQ, polled by its session.
//! - `state`, `policy`, `permit`, `reconnect` and [`stats`] are the pure pieces (path
//!   state machine, multipath policies, permits, reconnect policy, statistics), unit
//!   tested where they are.
//!
//! # Differences from the kernel, on purpose
//! - While no path is connected, requests wait up to `io_wait_timeout` for one to come
//!   back, then fail with −ENOTCONN (the kernel fails them at once); a caller that keeps
//!   its own waiting requests (the RNBD queue) has them refused instead
//!   ([`PathWait::Caller`]): a request waits in one place.
//! - Reconnect jitter is uniformly random up to `reconnect_jitter` (500 ms by default),
//!   not 0–7 ms; a changed queue depth on reconnect is re-negotiated once no other path
//!   uses the old one (requests waiting at that moment fail with −ECONNRESET).
//! - A request names memory by SGE only, and a fast registration needs the region: a
//!   single-segment READ into a region the caller announced with
//!   [`SessionCore::add_region`] is fast-registered in place (zero copy, as the kernel);
//!   any other READ lands in the permit's registered bounce area (fast-registered the
//!   same way) and is copied to the caller's segments.
//! - On the software fabrics a READ asks no remote invalidation of its key
//!   (`NEED_INVAL_F`, which the kernel's client always sets): the client retires the key
//!   itself at once when the response arrives, before the request completes, which
//!   saves a frame and a receive per READ. On verbs it asks, as the kernel's client does.
//! - Unknown imm types, malformed RKEY_RSPs and IO_RSP_W_INV for a request that asked
//!   no invalidation are path errors (docs/PROTOCOL.md §9.6 "Add"), and so is IO_RSP
//!   for a READ that asked for one (the kernel's client invalidates locally instead):
//!   every server sends it (§4.5), and without it the key would stay live after the
//!   request completed.
//! - Administrative requests (`ClientIo::admin`) travel on the submitting core's IO
//!   connection like other requests; the server treats all connections alike, and this
//!   keeps every completion on its submitting core.
//! - Opening never fails because a path cannot connect: the path retries under the
//!   reconnect policy (the kernel fails the whole open), and the layer above learns of
//!   the session's first connected path through [`ClientEvents`]. When instead every
//!   path of a session that never connected was refused for a reason a retry will not
//!   change (ENOMEM, EPERM, ... in the REJ, see [`Refusal`]), requests fail at once
//!   with [`SubmitError::Refused`] and [`ClientSession::refusal`] says why.
//! - A path may create the server session (`first_conn`) whenever the session has no
//!   connected path, so one unreachable first path does not keep the others out; paths
//!   create it one at a time, each held while another's first connection is under way,
//!   2 s at the most (the kernel's server mishandles two at once; docs/INTEROP.md, "A
//!   new session's paths create it one at a time").
//! - A path whose response came without remote invalidation gets a LOCAL_INV chained
//!   before its permit's next binding rather than waited for; a slot whose state is
//!   unknown after a failover is replaced by a fresh one.
//! - Every connection of a path leaves from the path's source address when it has one
//!   (`PathAddr::src`, bound through `Fabric::connect` with `ConnectOptions::from`, as the
//!   kernel passes it to `rdma_resolve_addr`).
//!
//! # Memory
//! Per core and permit: `max_hdr_size` bytes of header buffer and `max_io_size` bytes of
//! bounce area, registered once (for the kernel's defaults, 512 × 124 KiB ≈ 62 MiB per
//! session in total, split over the cores).

mod config;
mod connect;
mod core_cq;
mod cross_core;
mod ctl;
mod error;
mod io;
mod permit;
mod policy;
mod reconnect;
mod recovery;
mod refusal;
mod request;
mod session;
mod session_core;
mod state;
pub mod stats;

pub use crate::common::{Dir, HbConfig, LinkEvent};
pub use config::{ClientConfig, PathAddr, PathParseError};
pub use core_cq::CoreCq;
pub use ctl::ClientEvents;
pub use error::{ClientError, SubmitError};
pub use policy::{MpPolicy, PolicyParseError};
pub use reconnect::ReconnectPolicy;
pub use refusal::Refusal;
pub use request::{ClientCompletion, ClientIo, PathWait, Sgl, SglRef, MAX_SGL};
pub use session::{check_sessname, ClientSession};
pub use session_core::SessionCore;
pub use state::PathState;
pub use stats::ClientStats;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<ClientSession>();
        send::<SessionCore>();
        send_sync::<ClientStats>();
    }
}
