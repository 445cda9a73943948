//! What the RTRS client and server share: one fabric connection of a path ([`RtrsCon`]),
//! registered message buffers ([`IuPool`]), the heartbeat state machine ([`Heartbeat`]),
//! and small shared types (direction, link events, identifiers).
//!
//! This is the userspace counterpart of the kernel's `rtrs.c` (`rtrs_iu_alloc`,
//! `rtrs_post_recv_empty`, `rtrs_post_rdma_write_imm_empty`, `rtrs_send_hb_ack`,
//! `rtrs_start_hb`/`hb_work`, `rtrs_init_hb`) and of the shared parts of `rtrs-pri.h`
//! (`struct rtrs_con`, signal interval and send-queue budget bookkeeping).
//!
//! Nothing here parses wire bytes (that is [`crate::proto`]) and nothing here decides
//! when code runs (that is [`crate::engine`]): [`Heartbeat`] is pure logic driven by the
//! caller's timer, [`RtrsCon`] is driven by the caller's poller.

mod heartbeat;
mod ids;
mod inbox;
mod iu;
mod rtrs_con;

pub use heartbeat::{HbAction, HbConfig, Heartbeat};
pub use ids::{random_u64, random_uuid, Uuid};
pub use inbox::Inbox;
pub use iu::IuPool;
pub use rtrs_con::{ConPostError, RtrsCon, RECV_BATCH};

/// Direction of an RTRS request, from the client's point of view (the kernel's
/// `READ`/`WRITE` of `rtrs_clt_request`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dir {
    /// The server produces data into the client's buffer.
    Read,
    /// The client's data goes to the server.
    Write,
}

/// A session-wide link event delivered to the layer above (the kernel's
/// `RTRS_CLT_LINK_EV_RECONNECTED`/`DISCONNECTED` and the server's `link_ev`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkEvent {
    /// The first path of the session is up (again).
    Connected,
    /// The last path of the session went down.
    Disconnected,
}
