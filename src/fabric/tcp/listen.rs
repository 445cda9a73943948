//! The tcp fabric's listening side: [`TcpListener`] accepts sockets and reads their
//! CM_REQ without blocking (the passive side of `rdma_cm`: `rdma_listen` and the
//! `CONNECT_REQUEST` event), and [`TcpPending`] answers a request with CM_REP
//! (`rdma_accept`) or CM_REJ (`rdma_reject`).
//!
//! A socket becomes a [`ConnRequest`] only once its whole, valid CM_REQ is in (and, on a
//! listener with a key, once the initiator has proven the key): the per-socket
//! handshake is [`super::handshake`]'s. Anything else (garbage, another protocol, a peer
//! that goes away) is closed quietly and the listener keeps serving; a request this
//! listener refuses (a frame version it does not accept, failed authentication) is
//! answered with CM_REJ and never reaches the application.
//!
//! Sockets still waiting for their CM_REQ are bounded by the listener's [`Admission`]:
//! one not complete within the handshake timeout is closed, and at the per-source or total
//! cap a newcomer evicts the oldest socket of its own or of the busiest source
//! ([`admission::victim`]), so a flood of idle sockets cannot lock a client out. Messages
//! about such sockets are rate-limited.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use super::check_caps;
use super::conn::TcpConn;
use super::frame::{cm_frame, CmPayload, Opcode, RejectReason};
use super::handshake::{answer_and_close, Handshake, RefusalLog, Step};
use super::ready::TcpReadiness;
use super::sys;
use super::TcpFabric;
use crate::fabric::admission::{self, Admission};
use crate::fabric::soft::{self, MrTable};
use crate::fabric::SetupCause;
use crate::fabric::{
    Conn, ConnRequest, CqRef, Fabric, FabricError, Listener, PendingConn, PrivateData, Psk, QpCaps,
};
use crate::ratelimit::{log_limited, RateLimit};

/// The accept queue's length (the kernel caps it at `net.core.somaxconn`): room for a
/// burst of connections between two polls, since an overflow drops SYNs.
const BACKLOG: i32 = 1024;
/// Sockets accepted per `poll` call.
const ACCEPT_BUDGET: usize = 64;

struct Incoming {
    stream: TcpStream,
    peer: SocketAddr,
    /// When it was accepted, and its admission order (for eviction: smaller is older).
    since: Instant,
    order: u64,
    hs: Handshake,
}

/// A listening socket of the tcp fabric.
pub struct TcpListener {
    inner: std::net::TcpListener,
    local: SocketAddr,
    table: Arc<MrTable>,
    incoming: Vec<Incoming>,
    ready: VecDeque<ConnRequest>,
    admission: Admission,
    next_order: u64,
    /// The key every initiator must prove (frame version 2), if any.
    psk: Option<Psk>,
    /// How its private-CQ connections learn that their socket is readable.
    readiness: TcpReadiness,
    /// Messages about refused, timed-out or malformed sockets; its clock is `epoch`.
    log: RateLimit,
    epoch: Instant,
    /// An epoll set over the listening socket and the sockets whose handshake is in
    /// progress: [`Listener::wait_fd`] (none if the kernel refused one).
    wake: Option<OwnedFd>,
}

impl TcpListener {
    /// Binds `addr` and listens without blocking, holding sockets whose CM_REQ is not
    /// in yet under `admission`; with `psk`, only initiators that prove that key are let
    /// through.
    ///
    /// # Errors
    /// [`FabricError::Listen`] naming the failing call or the limit out of range.
    pub(crate) fn bind(
        addr: SocketAddr,
        table: Arc<MrTable>,
        admission: &Admission,
        psk: Option<Psk>,
        readiness: TcpReadiness,
    ) -> Result<TcpListener, FabricError> {
        let fail = |call: &'static str, e: io::Error| FabricError::Listen {
            addr,
            cause: SetupCause::os(call, e),
        };
        admission.validate().map_err(|e| FabricError::Listen {
            addr,
            cause: e.into(),
        })?;
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .map_err(|e| fail("socket", e))?;
        // As std's TcpListener::bind: a restarted target can bind its port at once.
        sock.set_reuse_address(true)
            .map_err(|e| fail("SO_REUSEADDR", e))?;
        sock.bind(&addr.into()).map_err(|e| fail("bind", e))?;
        sock.listen(BACKLOG).map_err(|e| fail("listen", e))?;
        sock.set_nonblocking(true)
            .map_err(|e| fail("set_nonblocking", e))?;
        let inner: std::net::TcpListener = sock.into();
        let local = inner.local_addr().map_err(|e| fail("getsockname", e))?;
        let wake = sys::epoll_create()
            .and_then(|ep| sys::epoll_add_level(ep.as_raw_fd(), inner.as_raw_fd()).map(|()| ep))
            .map_err(|e| tracing::debug!(error = %e, "tcp fabric listener {local}: no epoll set to wake on"))
            .ok();
        Ok(TcpListener {
            inner,
            local,
            table,
            incoming: Vec::new(),
            ready: VecDeque::new(),
            admission: *admission,
            next_order: 0,
            psk,
            readiness,
            log: RateLimit::per_second(format!("tcp fabric listener {local}")),
            epoch: Instant::now(),
            wake,
        })
    }

    /// `t` on the rate limiter's clock.
    fn ns(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    fn accept_new(&mut self, now: Instant) {
        let lim = self.admission;
        for _ in 0..ACCEPT_BUDGET {
            match self.inner.accept() {
                Ok((stream, peer)) => {
                    let key = |inc: &Incoming| (inc.peer.ip(), inc.order);
                    let full = admission::victim(
                        &self.incoming,
                        peer.ip(),
                        lim.max_pending_per_source,
                        lim.max_pending,
                        key,
                    );
                    if let Some(i) = full {
                        let old = self.incoming.swap_remove(i);
                        let same =
                            admission::source_of(old.peer.ip()) == admission::source_of(peer.ip());
                        let cap = if same {
                            format!("{} per source", lim.max_pending_per_source)
                        } else {
                            format!("{} in total", lim.max_pending)
                        };
                        log_limited!(
                            self.log,
                            self.ns(now),
                            WARN,
                            "tcp fabric listener {}: closing {} to admit {peer}: at most {cap} \
                             connections without a complete connect request",
                            self.local,
                            old.peer,
                        );
                    }
                    if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
                        continue;
                    }
                    if let Some(ep) = &self.wake {
                        // Refused: the handshake is still read on every poll.
                        let _ = sys::epoll_add_level(ep.as_raw_fd(), stream.as_raw_fd());
                    }
                    self.incoming.push(Incoming {
                        stream,
                        peer,
                        since: now,
                        order: self.next_order,
                        hs: Handshake::new(),
                    });
                    self.next_order += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ECONNABORTED, EMFILE and the like: this socket is lost (EMFILE: it
                    // waits in the backlog), keep serving.
                    log_limited!(
                        self.log,
                        self.ns(now),
                        WARN,
                        "tcp fabric listener {}: accept failed: {e}",
                        self.local
                    );
                    return;
                }
            }
        }
    }
}

impl Listener for TcpListener {
    fn poll(&mut self) -> Option<ConnRequest> {
        if let Some(r) = self.ready.pop_front() {
            return Some(r);
        }
        let now = Instant::now();
        let now_ns = self.ns(now);
        self.log.flush(now_ns);
        self.accept_new(now);
        let timeout = self.admission.handshake_timeout;
        let mut i = 0;
        let mut incoming = std::mem::take(&mut self.incoming);
        while i < incoming.len() {
            let inc = &mut incoming[i];
            let mut log = RefusalLog {
                listener: self.local,
                limit: &self.log,
                now: now_ns,
            };
            let step = inc
                .hs
                .step(&mut inc.stream, inc.peer, self.psk.as_ref(), &mut log);
            match step {
                Step::Wait if now.saturating_duration_since(incoming[i].since) >= timeout => {
                    let inc = incoming.swap_remove(i);
                    log_limited!(
                        self.log,
                        now_ns,
                        WARN,
                        "tcp fabric listener {}: closing {}: no complete connect request within {timeout:?}",
                        self.local,
                        inc.peer
                    );
                }
                Step::Wait => i += 1,
                Step::Drop => {
                    incoming.swap_remove(i);
                }
                Step::Ready {
                    version,
                    private_data,
                } => {
                    let inc = incoming.swap_remove(i);
                    if let Some(ep) = &self.wake {
                        // The socket lives on in the connection: out of the set now.
                        let _ = sys::epoll_del(ep.as_raw_fd(), inc.stream.as_raw_fd());
                    }
                    let pending = TcpPending {
                        stream: Some(inc.stream),
                        table: self.table.clone(),
                        version,
                        readiness: self.readiness,
                        authenticated: self.psk.is_some(),
                    };
                    self.ready.push_back(ConnRequest {
                        private_data,
                        peer: inc.peer,
                        pending: Box::new(pending),
                    });
                }
            }
        }
        self.incoming = incoming;
        self.ready.pop_front()
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn wait_fd(&self) -> Option<RawFd> {
        self.wake.as_ref().map(AsRawFd::as_raw_fd)
    }
}

/// The acceptor's half of a [`ConnRequest`].
pub struct TcpPending {
    stream: Option<TcpStream>,
    table: Arc<MrTable>,
    /// The frame version of the connection (the request's).
    version: u8,
    /// See [`TcpListener`]'s field.
    readiness: TcpReadiness,
    /// The initiator proved the listener's key (every request of a listener with one).
    authenticated: bool,
}

impl PendingConn for TcpPending {
    fn authenticated(&self) -> bool {
        self.authenticated
    }

    fn accept(
        mut self: Box<Self>,
        domain: Option<&dyn Fabric>,
        cq: Option<&CqRef>,
        caps: QpCaps,
        private_data: PrivateData,
    ) -> Result<Box<dyn Conn>, FabricError> {
        if let Some(domain) = domain {
            self.table = soft::accept_domain(domain, &self.table, TcpFabric::table, "tcp")?;
        }
        let (table, mode) = (self.table.clone(), self.readiness);
        let own = |c: TcpConn| -> Box<dyn Conn> { Box::new(c.with_own_readiness(mode)) };
        soft::cq::make_on(cq, &table, || self.answer(caps, private_data), own)
    }

    fn reject(mut self: Box<Self>, private_data: PrivateData) {
        self.reject_now(private_data);
    }
}

impl TcpPending {
    /// Accepts: CM_REP goes out and the connection is established.
    fn answer(&mut self, caps: QpCaps, private_data: PrivateData) -> Result<TcpConn, FabricError> {
        check_caps(caps).map_err(|e| FabricError::Accept { cause: e.into() })?;
        let stream = self.stream.take().ok_or_else(|| FabricError::Accept {
            cause: SetupCause::refused("the connect request was already answered"),
        })?;
        Ok(TcpConn::accepted(
            stream,
            self.table.clone(),
            caps,
            private_data,
            self.version,
        ))
    }

    fn reject_now(&mut self, private_data: PrivateData) {
        if let Some(mut stream) = self.stream.take() {
            let rej = cm_frame(
                self.version,
                Opcode::CmRej,
                &CmPayload::new(RejectReason::Consumer, private_data),
            );
            answer_and_close(&mut stream, &rej);
        }
    }
}

impl Drop for TcpPending {
    fn drop(&mut self) {
        self.reject_now(PrivateData::empty());
    }
}
