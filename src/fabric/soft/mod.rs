//! Software RDMA shared by the `loopback` and `tcp` fabrics.
//!
//! Both are a *transport* that moves wire operations between two endpoints, plus this
//! core, which gives every endpoint the semantics of an RC queue pair in a NIC:
//! - [`table`]: the protection domain: registrations, fast-registration slots, and the
//!   checks a NIC makes on every local SGE and every incoming remote access;
//! - [`qp`]: one endpoint: send queue with slots held until the peer acknowledges,
//!   receive queue, completion queue, receive-not-ready stalls, refusals (naks) and flush
//!   on break;
//! - [`cq`]: a completion queue shared by connections, which owns their progress state
//!   and drives them all in one poll.
//!
//! So the fabrics differ only in how bytes move; every rule of the contract in
//! [`crate::fabric`] is implemented once, here.

pub mod cq;
pub mod qp;
pub mod table;

pub use qp::{
    recv_completion, recv_error, respond, Handed, InboundError, Placed, PostedRecv, Respond,
    SoftQp, WireKind, WireOp,
};
pub use table::{LkeyCache, MemRef, MrTable, MAX_MR_SIZE};
