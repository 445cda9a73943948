//! [`RnbdServer`]: the RNBD server as the RTRS server's per-core [`ServerHandler`] (the
//! kernel's `rnbd_srv_rdma_ev` / `rnbd_srv_link_ev` registered through
//! `rtrs_srv_open`). Each core gets its own instance with its [`Dispatcher`] (this
//! core's backend instances) and a cache of the session table; the sessions and the
//! exports are shared by all cores.
//!
//! Requests answered at once (SESS_INFO, OPEN, CLOSE, refused IO) are answered inside
//! [`ServerHandler::request`]; block IO is answered from [`ServerHandler::poll`], which
//! the RTRS server's core poller calls every loop: the backends' completions go to the
//! server's [`Responses`] as they are, with the request's id as their tag.

use std::sync::Arc;

use super::dispatch::{Dispatcher, Outcome, Request};
use super::exports::{Exports, ExportsError};
use super::registry::{RnbdSessions, SessionCache};
use crate::common::LinkEvent;
use crate::engine::Ctx;
use crate::proto::rnbd::RnbdMsgType;
use crate::rnbd::backend::{BlockCompletion, IoBuf};
use crate::server::{IoId, Responses, ServerHandler, SessionId, SessionUse, SrvIo};
use crate::Errno;

/// Completions taken from the dispatcher per call of its `poll`.
const BATCH: usize = 64;

/// One core's RNBD state: its backends and its view of the sessions.
struct Core {
    disp: Dispatcher,
    sessions: SessionCache<SessionId>,
    done: [BlockCompletion; BATCH],
}

/// One core's RNBD server.
pub struct RnbdServer {
    /// `None` when this core's backends could not be opened: every request then
    /// fails with −EIO (the reason was logged once).
    core: Option<Core>,
    table: Arc<RnbdSessions<SessionId>>,
}

impl RnbdServer {
    /// The handler of `core`, opening that core's backends.
    ///
    /// # Errors
    /// A backend that cannot be opened on this core.
    pub fn new(
        table: Arc<RnbdSessions<SessionId>>,
        core: usize,
    ) -> Result<RnbdServer, ExportsError> {
        let disp = Dispatcher::new(Arc::clone(table.exports()), core)?;
        Ok(RnbdServer {
            core: Some(Core {
                disp,
                sessions: SessionCache::new(Arc::clone(&table)),
                done: [BlockCompletion::default(); BATCH],
            }),
            table,
        })
    }

    /// A handler factory for the RTRS server (`Server::start`): one [`RnbdServer`] per
    /// core over `exports`, sharing one session table. A core whose backends cannot be
    /// opened answers every request with −EIO and logs why.
    pub fn factory(
        exports: Arc<Exports>,
    ) -> impl Fn(usize) -> Box<dyn ServerHandler> + Send + Sync + 'static {
        RnbdServer::factory_with(Arc::new(RnbdSessions::new(exports)))
    }

    /// As [`factory`](Self::factory), over a session table the caller keeps (to list
    /// and steer the sessions: [`TargetControl`](super::TargetControl)). One table per
    /// RTRS server: session ids are the server's own.
    pub fn factory_with(
        table: Arc<RnbdSessions<SessionId>>,
    ) -> impl Fn(usize) -> Box<dyn ServerHandler> + Send + Sync + 'static {
        move |core| -> Box<dyn ServerHandler> {
            match RnbdServer::new(Arc::clone(&table), core) {
                Ok(s) => Box::new(s),
                Err(e) => {
                    tracing::error!(
                        core,
                        "rnbd server: {e}; this core fails every request with EIO"
                    );
                    Box::new(RnbdServer {
                        core: None,
                        table: Arc::clone(&table),
                    })
                }
            }
        }
    }
}

impl ServerHandler for RnbdServer {
    fn link_event(&mut self, _cx: &mut dyn Ctx, sess: SessionId, sessname: &str, ev: LinkEvent) {
        match ev {
            LinkEvent::Connected => {
                self.table.get_or_create(sess, sessname);
                tracing::info!(%sess, sessname, "rnbd server: session up");
            }
            LinkEvent::Disconnected => {
                if let Some(s) = self.table.remove(sess) {
                    tracing::info!(
                        %sess,
                        sessname,
                        closed = s.mappings().len(),
                        "rnbd server: session down, its devices closed"
                    );
                }
                if let Some(core) = &mut self.core {
                    core.sessions.forget(sess);
                }
            }
        }
    }

    fn request(&mut self, _cx: &mut dyn Ctx, io: SrvIo<'_>, out: &mut Responses) {
        let Some(Core { disp, sessions, .. }) = &mut self.core else {
            return out.respond(io.id, Err(Errno::EIO));
        };
        let sess = match sessions.session(io.sess) {
            Some(s) => s,
            None => match RnbdMsgType::peek(io.usr) {
                // No session: its devices are gone (IO) or were never there (CLOSE).
                Ok(RnbdMsgType::Io) => return out.respond(io.id, Err(Errno::ENOTCONN)),
                Ok(RnbdMsgType::Close) => return out.respond(io.id, Ok(())),
                // SESS_INFO or OPEN may beat the Connected event to this core: create
                // the session (its name is known: the path's INFO_REQ carried it).
                _ => sessions.session_or_create(io.sess, &io.path.sessname()),
            },
        };
        // SAFETY: the RTRS server gives the request's chunk data area to this handler
        // until it responds (DataArea's contract), and nobody else touches it meanwhile;
        // the dispatcher and the backend use it only until the answer.
        let data = unsafe { IoBuf::new(io.data.as_ptr(), io.data.len()) };
        let req = Request {
            tag: io.id.0,
            dir: io.dir,
            usr: io.usr,
            data,
            peer: Some(io.path.peer().ip()),
            paths: &[],
        };
        let outcome = if matches!(RnbdMsgType::peek(io.usr), Ok(RnbdMsgType::Open)) {
            // An OPEN is checked against every path of the session, none joining
            // meanwhile (docs/ARCHITECTURE.md, "Session slots").
            io.path
                .with_session_peers(|paths| disp.process_view(sess, Request { paths, ..req }))
        } else {
            disp.process_view(sess, req)
        };
        match outcome {
            Outcome::Done(result) => out.respond(io.id, result),
            Outcome::Submitted => {}
        }
    }

    fn session_use(&mut self, sess: SessionId) -> Option<Arc<dyn SessionUse>> {
        let s: Arc<dyn SessionUse> = self.table.get(sess)?;
        Some(s)
    }

    fn backends_opened(&self) -> u64 {
        self.core.as_ref().map_or(0, |c| c.disp.opened())
    }

    fn poll(&mut self, _cx: &mut dyn Ctx, out: &mut Responses) -> bool {
        let Some(Core { disp, done, .. }) = &mut self.core else {
            return false;
        };
        let mut any = false;
        loop {
            let n = disp.poll(done);
            for c in &done[..n] {
                out.respond(IoId(c.tag), c.result);
            }
            any |= n > 0;
            if n < BATCH {
                return any;
            }
        }
    }
}

impl std::fmt::Debug for RnbdServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdServer")
            .field("sessions", &self.table.len())
            .field("ok", &self.core.is_some())
            .finish()
    }
}
