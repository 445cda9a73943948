//! [`RnbdServer`]: the RNBD server as the RTRS server's per-core [`ServerHandler`] (the
//! kernel's `rnbd_srv_rdma_ev` / `rnbd_srv_link_ev` registered through
//! `rtrs_srv_open`). Each core gets its own instance with its [`Dispatcher`] (this
//! core's backend instances) and a cache of the session table; the sessions and the
//! exports are shared by all cores.
//!
//! Requests answered at once (SESS_INFO, OPEN, CLOSE, refused IO) are answered inside
//! [`ServerHandler::request`]; block IO is answered by a poller this handler registers
//! on its core on the first request, which polls the backends and responds. The poller
//! unregisters itself once the handler is dropped.

use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use super::dispatch::{Completion, Dispatcher, Outcome, Request};
use super::exports::{Exports, ExportsError};
use super::registry::{SessionCache, SessionTable};
use crate::common::LinkEvent;
use crate::engine::{Ctx, PollResult};
use crate::proto::rnbd::RnbdMsgType;
use crate::rnbd::backend::IoBuf;
use crate::server::{IoId, Responder, ServerHandler, SessionId, SrvIo};

const BATCH: usize = 64;

struct Core {
    disp: Dispatcher,
    sessions: SessionCache<SessionId>,
    responder: Option<Responder>,
    out: [Completion; BATCH],
}

impl Core {
    /// Answers finished block IO; returns how many.
    fn reap(&mut self) -> usize {
        let Some(responder) = &self.responder else {
            return 0;
        };
        let mut total = 0;
        loop {
            let n = self.disp.poll(&mut self.out);
            for c in &self.out[..n] {
                responder.respond(IoId(c.tag), c.errno);
            }
            total += n;
            if n < BATCH {
                return total;
            }
        }
    }
}

/// One core's RNBD server.
pub struct RnbdServer {
    /// `None` when this core's backends could not be opened: every request then
    /// fails with −EIO (the reason was logged once).
    core: Option<Rc<RefCell<Core>>>,
    table: Arc<SessionTable<SessionId>>,
    poller: bool,
}

impl RnbdServer {
    /// The handler of `core`, opening that core's backends.
    ///
    /// # Errors
    /// A backend that cannot be opened on this core.
    pub fn new(
        table: Arc<SessionTable<SessionId>>,
        core: usize,
    ) -> Result<RnbdServer, ExportsError> {
        let disp = Dispatcher::new(Arc::clone(table.exports()), core)?;
        Ok(RnbdServer {
            core: Some(Rc::new(RefCell::new(Core {
                disp,
                sessions: SessionCache::new(Arc::clone(&table)),
                responder: None,
                out: [Completion::default(); BATCH],
            }))),
            table,
            poller: false,
        })
    }

    /// A handler factory for the RTRS server (`Server::start`): one [`RnbdServer`] per
    /// core over `exports`, sharing one session table. A core whose backends cannot be
    /// opened answers every request with −EIO and logs why.
    pub fn factory(
        exports: Arc<Exports>,
    ) -> impl Fn(usize) -> Box<dyn ServerHandler> + Send + Sync + 'static {
        let table = Arc::new(SessionTable::new(exports));
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
                        poller: false,
                    })
                }
            }
        }
    }

    /// Registers the poller answering this core's block IO (once).
    fn start_poller(&mut self, cx: &mut dyn Ctx, core: &Rc<RefCell<Core>>) {
        if self.poller {
            return;
        }
        self.poller = true;
        let weak: Weak<RefCell<Core>> = Rc::downgrade(core);
        cx.register(Box::new(move |cx: &mut dyn Ctx| -> PollResult {
            let Some(core) = weak.upgrade() else {
                if let Some(me) = cx.current() {
                    cx.unregister(me);
                }
                return PollResult::Idle;
            };
            let n = core.borrow_mut().reap();
            if n > 0 {
                PollResult::Busy
            } else {
                PollResult::Idle
            }
        }));
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
                if let Some(core) = &self.core {
                    core.borrow_mut().sessions.forget(sess);
                }
            }
        }
    }

    fn request(&mut self, cx: &mut dyn Ctx, io: SrvIo<'_>, responder: &Responder) {
        let Some(core) = self.core.clone() else {
            responder.respond(io.id, -libc::EIO);
            return;
        };
        self.start_poller(cx, &core);
        let mut c = core.borrow_mut();
        if c.responder.is_none() {
            c.responder = Some(responder.clone());
        }
        let Core { disp, sessions, .. } = &mut *c;
        let sess = match sessions.session(io.sess) {
            Some(s) => s,
            None => match RnbdMsgType::peek(io.usr) {
                // No session: its devices are gone (IO) or were never there (CLOSE).
                Ok(RnbdMsgType::Io) => return responder.respond(io.id, -libc::ENOTCONN),
                Ok(RnbdMsgType::Close) => return responder.respond(io.id, 0),
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
        };
        match disp.process(sess, req) {
            Outcome::Done(errno) => responder.respond(io.id, errno),
            Outcome::Submitted => {}
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
