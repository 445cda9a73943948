//! One connection a core serves: the fabric connection, the path it belongs to, and the
//! per-connection queues of the request path (responses and LOCAL_INVs waiting for send
//! slots) and of the control path (heartbeat, INFO_RSP progress on cid 0).

use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use super::session::Path;
use super::state::ServerState;
use crate::common::{Heartbeat, RtrsCon};
use crate::engine::Ctx;

/// INFO_RSP progress on a cid 0 connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InfoState {
    /// Not asked yet (or not cid 0).
    Idle,
    /// Posting the REG_MR chain: next chunk to bind, then the SEND of `len` bytes.
    Posting {
        next: usize,
        len: usize,
    },
    Done,
}

/// A core's own handle on a path: the connection slot holds one, and each request the
/// connection brings clones it, a count only this core writes (the path's `Arc` is
/// cloned once per connection, not per IO: docs/ARCHITECTURE.md, "Who writes what per
/// IO"). Made on the core that serves the connection, and never leaves it.
pub(crate) type PathRef = Rc<Arc<Path>>;

/// One connection served here.
pub(crate) struct ConSlot {
    pub path: PathRef,
    pub con: RtrsCon,
    /// Disconnect issued; dropped once drained.
    pub closing: bool,
    /// Requests (op table slots) whose response waits for send slots.
    pub rsp_wait: VecDeque<u32>,
    /// Requests whose LOCAL_INV waits for send slots.
    pub inv_wait: VecDeque<u32>,
    /// cid 0 once connected: heartbeat and its next tick.
    pub hb: Option<(Heartbeat, u64)>,
    pub info: InfoState,
    /// Ask the connection manager at the next poll.
    pub cm_due: bool,
    /// On a shared CQ: a loop found the connection closed with nothing delivered; its
    /// flushes, made after that loop's CQ poll, come with the next one.
    pub quiet_once: bool,
    /// On a shared CQ, this loop: completions handled, receives to repost, and whether
    /// reposting failed (its completions are then left unhandled, as `poll_con` does).
    pub got: u32,
    pub reposts: u32,
    pub repost_failed: bool,
}

impl ConSlot {
    pub fn new(path: Arc<Path>, con: RtrsCon) -> ConSlot {
        ConSlot {
            path: Rc::new(path),
            con,
            closing: false,
            rsp_wait: VecDeque::new(),
            inv_wait: VecDeque::new(),
            hb: None,
            info: InfoState::Idle,
            cm_due: true,
            quiet_once: false,
            got: 0,
            reposts: 0,
            repost_failed: false,
        }
    }

    /// Closes this connection's path, logging `why` (see [`ServerState::close_path`]).
    pub fn close_path(&self, sh: &ServerState, cx: &mut dyn Ctx, why: fmt::Arguments<'_>) {
        sh.close_path(cx, &self.path, why);
    }
}

/// Closes the path of connection `i` of `cons` (if it is still there).
pub(crate) fn close_path_of(
    sh: &ServerState,
    cx: &mut dyn Ctx,
    cons: &[Option<ConSlot>],
    i: usize,
    why: fmt::Arguments<'_>,
) {
    if let Some(Some(s)) = cons.get(i) {
        s.close_path(sh, cx, why);
    }
}
