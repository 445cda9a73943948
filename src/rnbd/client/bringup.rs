//! Bringing an RNBD client session up, written once for every user (the benchmark, the
//! SPDK bdev, tests): the RTRS session with its link events going to the admin, the
//! admin's reply buffer, the [`RnbdAdmin`] and one [`RnbdQueue`] per core — what the
//! kernel's `rnbd_clt_map_device` does before its first `send_msg_open`
//! (`find_and_get_or_create_sess`: `rtrs_clt_open` and the session's queues).
//!
//! Nothing here waits: the session connects in the background, and the first
//! [`RnbdAdmin::open`] queues SESS_INFO and OPEN until it has.

use std::sync::Arc;

use super::admin::{RnbdAdmin, REPLY_SLOT};
use super::device::DeviceError;
use super::queue::RnbdQueue;
use super::rtrs::LinkListener;
use crate::client::{ClientConfig, ClientError, ClientSession, SessionCore};
use crate::engine::Ctx;
use crate::fabric::{Access, Fabric, FabricError, MemBuf};

/// Bytes of the admin's reply buffer: [`REPLY_SLOT`] bytes per admin request in flight.
const REPLY_BUFFER: usize = 4096;
const _: () = assert!(REPLY_BUFFER >= REPLY_SLOT);

/// A connected-in-the-background RNBD client session: the RTRS session, its admin
/// (listening to the session's link events) and one RNBD queue per core over the
/// admin's device table; `queues[0]` is the one the admin sends through.
#[derive(Debug)]
pub struct RnbdClientSession {
    pub session: ClientSession,
    pub admin: RnbdAdmin,
    pub queues: Vec<RnbdQueue<SessionCore>>,
}

/// The step of [`open_rnbd_session`] that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BringUpError {
    #[error("opening the RTRS session: {0}")]
    ClientSession(#[source] ClientError),
    #[error("session {sess}: registering the RNBD admin's {len}-byte reply buffer: {source}")]
    ReplyBuffer {
        sess: String,
        len: usize,
        #[source]
        source: FabricError,
    },
    #[error("session {sess}: setting up the RNBD admin: {source}")]
    Admin {
        sess: String,
        #[source]
        source: DeviceError,
    },
}

/// Opens an RNBD client session on `cx`'s core with `cores` IO cores
/// ([`ClientSession::open_on_cores`]), its link events going to the admin
/// ([`RnbdAdmin::listen`]), the admin's 4 KiB reply buffer registered with `fabric`
/// (local write), and one [`RnbdQueue`] per core over the admin's device table, in core
/// order. The caller drives the admin through `queues[0]` and polls every queue, each
/// by one owner at a time (see [`ClientSession::open_on_cores`]). On a failure after the
/// session opened, the session is closed.
///
/// # Errors
/// The step that failed: [`BringUpError::ClientSession`] (a bad configuration or core count),
/// [`BringUpError::ReplyBuffer`], [`BringUpError::Admin`].
pub fn open_rnbd_session(
    cx: &mut dyn Ctx,
    cores: usize,
    fabric: Arc<dyn Fabric>,
    config: ClientConfig,
) -> Result<RnbdClientSession, BringUpError> {
    let links = LinkListener::new();
    let (session, cores) = ClientSession::open_on_cores(
        cx,
        cores,
        Arc::clone(&fabric),
        config,
        Box::new(links.clone()),
    )
    .map_err(BringUpError::ClientSession)?;
    let fail = |e: BringUpError| {
        session.close();
        e
    };
    let replies = fabric
        .register(MemBuf::zeroed(REPLY_BUFFER), Access::LOCAL_WRITE)
        .map_err(|source| {
            fail(BringUpError::ReplyBuffer {
                sess: session.sessname().to_string(),
                len: REPLY_BUFFER,
                source,
            })
        })?;
    let mut admin = RnbdAdmin::new(replies).map_err(|source| {
        fail(BringUpError::Admin {
            sess: session.sessname().to_string(),
            source,
        })
    })?;
    admin.listen(links);
    let table = admin.table();
    let queues = cores
        .into_iter()
        .map(|sc| RnbdQueue::new(sc, Arc::clone(table)))
        .collect();
    Ok(RnbdClientSession {
        session,
        admin,
        queues,
    })
}
