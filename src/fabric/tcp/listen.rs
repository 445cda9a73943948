//! The tcp fabric's listening side: [`TcpListener`] accepts sockets and reads their
//! CM_REQ without blocking (the passive side of `rdma_cm`: `rdma_listen` and the
//! `CONNECT_REQUEST` event), and [`TcpPending`] answers a request with CM_REP
//! (`rdma_accept`) or CM_REJ (`rdma_reject`).
//!
//! A socket becomes a [`ConnRequest`] only once its whole, valid CM_REQ is in. Anything
//! else (garbage, another protocol, a peer that goes away) is closed quietly and the
//! listener keeps serving; a request in a frame version this build does not speak is
//! answered here with CM_REJ "unsupported version" and never reaches the application.
//!
//! Sockets still waiting for their CM_REQ are bounded by the listener's [`Admission`]:
//! one not complete within the handshake timeout is closed, and at the per-source or total
//! cap a newcomer evicts the oldest socket of its own or of the busiest source
//! ([`admission::victim`]), so a flood of idle sockets cannot lock a client out. Messages
//! about such sockets are rate-limited.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use super::check_caps;
use super::conn::TcpConn;
use super::frame::{cm_frame, peek_version, CmPayload, Header, Opcode, RejectReason};
use super::frame::{CM_FRAME_LEN, CM_PAYLOAD_LEN, HEADER_LEN, MAGIC, VERSION};
use crate::fabric::admission::{self, Admission};
use crate::fabric::soft::MrTable;
use crate::fabric::{Conn, ConnRequest, FabricError, Listener, PendingConn, PrivateData, QpCaps};
use crate::ratelimit::RateLimit;

/// The accept queue's length (the kernel caps it at `net.core.somaxconn`): room for a
/// burst of connections between two polls, since an overflow drops SYNs.
const BACKLOG: i32 = 1024;
/// Sockets accepted per `poll` call.
const ACCEPT_BUDGET: usize = 64;
/// Largest payload of a foreign-version frame we read away before rejecting it.
const MAX_SKIP: u32 = 4096;

struct Incoming {
    stream: TcpStream,
    peer: SocketAddr,
    /// When it was accepted, and its admission order (for eviction: smaller is older).
    since: Instant,
    order: u64,
    buf: [u8; CM_FRAME_LEN],
    have: usize,
    /// A foreign-version request: its payload bytes still to read before rejecting.
    skip: Option<u32>,
}

enum Step {
    Wait,
    Drop,
    Ready(PrivateData),
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
    /// Messages about refused, timed-out or malformed sockets; its clock is `epoch`.
    log: RateLimit,
    epoch: Instant,
}

impl TcpListener {
    /// Binds `addr` and listens without blocking, holding sockets whose CM_REQ is not
    /// in yet under `admission`.
    ///
    /// # Errors
    /// [`FabricError::Listen`] naming the failing call or the limit out of range.
    pub(crate) fn bind(
        addr: SocketAddr,
        table: Arc<MrTable>,
        admission: &Admission,
    ) -> Result<TcpListener, FabricError> {
        let fail = |call: &str, e: io::Error| FabricError::Listen {
            addr,
            reason: format!("{call}: {e}"),
        };
        admission.validate().map_err(|e| FabricError::Listen {
            addr,
            reason: format!("admission limits: {e}"),
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
        Ok(TcpListener {
            inner,
            local,
            table,
            incoming: Vec::new(),
            ready: VecDeque::new(),
            admission: *admission,
            next_order: 0,
            log: RateLimit::per_second(format!("tcp fabric listener {local}")),
            epoch: Instant::now(),
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
                        if self.log.allow(self.ns(now)) {
                            let same = admission::source_of(old.peer.ip())
                                == admission::source_of(peer.ip());
                            let cap = if same {
                                format!("{} per source", lim.max_pending_per_source)
                            } else {
                                format!("{} in total", lim.max_pending)
                            };
                            tracing::warn!(
                                "tcp fabric listener {}: closing {} to admit {peer}: at most {cap} \
                                 connections without a complete connect request",
                                self.local,
                                old.peer,
                            );
                        }
                    }
                    if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
                        continue;
                    }
                    self.incoming.push(Incoming {
                        stream,
                        peer,
                        since: now,
                        order: self.next_order,
                        buf: [0; CM_FRAME_LEN],
                        have: 0,
                        skip: None,
                    });
                    self.next_order += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ECONNABORTED, EMFILE and the like: this socket is lost (EMFILE: it
                    // waits in the backlog), keep serving.
                    if self.log.allow(self.ns(now)) {
                        tracing::warn!("tcp fabric listener {}: accept failed: {e}", self.local);
                    }
                    return;
                }
            }
        }
    }

    fn step(inc: &mut Incoming, log: &RateLimit, now: u64) -> Step {
        loop {
            if let Some(left) = inc.skip {
                if left == 0 {
                    let rej = cm_frame(
                        Opcode::CmRej,
                        &CmPayload::new(RejectReason::UnsupportedVersion, PrivateData::empty()),
                    );
                    answer_and_close(&mut inc.stream, &rej);
                    return Step::Drop;
                }
                let n = (left as usize).min(CM_FRAME_LEN);
                match inc.stream.read(&mut inc.buf[..n]) {
                    Ok(0) => return Step::Drop,
                    Ok(k) => inc.skip = Some(left - k as u32),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Wait,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Step::Drop,
                }
                continue;
            }
            if inc.have >= HEADER_LEN {
                let hb: &[u8; HEADER_LEN] = inc.buf[..HEADER_LEN].try_into().expect("header bytes");
                let (magic, version, len) = peek_version(hb);
                if magic != MAGIC {
                    if log.allow(now) {
                        tracing::warn!(peer = %inc.peer, "tcp fabric listener: not our protocol, closing");
                    }
                    return Step::Drop;
                }
                if version != VERSION {
                    if log.allow(now) {
                        tracing::warn!(
                            peer = %inc.peer,
                            version,
                            "tcp fabric listener: rejecting a connect request in an unsupported frame version"
                        );
                    }
                    let extra = inc.have - HEADER_LEN;
                    match len.checked_sub(extra as u32) {
                        Some(left) if len <= MAX_SKIP => inc.skip = Some(left),
                        _ => return Step::Drop,
                    }
                    continue;
                }
                match Header::decode(hb) {
                    Ok(h) if h.opcode == Opcode::CmReq => {}
                    _ => return Step::Drop,
                }
                if inc.have == CM_FRAME_LEN {
                    let pb: &[u8; CM_PAYLOAD_LEN] =
                        inc.buf[HEADER_LEN..].try_into().expect("payload bytes");
                    let Ok(p) = CmPayload::decode(pb) else {
                        return Step::Drop;
                    };
                    if p.reason != RejectReason::None {
                        return Step::Drop;
                    }
                    return Step::Ready(p.private_data);
                }
            }
            // Read no further than the request: what follows belongs to the connection.
            let want = if inc.have < HEADER_LEN {
                HEADER_LEN
            } else {
                CM_FRAME_LEN
            };
            match inc.stream.read(&mut inc.buf[inc.have..want]) {
                Ok(0) => return Step::Drop,
                Ok(k) => inc.have += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Step::Wait,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Step::Drop,
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
            match Self::step(&mut incoming[i], &self.log, now_ns) {
                Step::Wait if now.saturating_duration_since(incoming[i].since) >= timeout => {
                    let inc = incoming.swap_remove(i);
                    if self.log.allow(now_ns) {
                        tracing::warn!(
                            "tcp fabric listener {}: closing {}: no complete connect request within {timeout:?}",
                            self.local,
                            inc.peer
                        );
                    }
                }
                Step::Wait => i += 1,
                Step::Drop => {
                    incoming.swap_remove(i);
                }
                Step::Ready(private_data) => {
                    let inc = incoming.swap_remove(i);
                    let pending = TcpPending {
                        stream: Some(inc.stream),
                        table: self.table.clone(),
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
}

/// Writes a CM answer (it fits an empty socket buffer: one small write) and closes our
/// side, so the peer reads the answer and then EOF.
fn answer_and_close(stream: &mut TcpStream, frame: &[u8]) {
    if let Err(e) = stream.write_all(frame) {
        tracing::debug!(error = %e, "tcp fabric: could not send a CM answer");
    }
    let _ = stream.shutdown(Shutdown::Write);
}

/// The acceptor's half of a [`ConnRequest`].
pub struct TcpPending {
    stream: Option<TcpStream>,
    table: Arc<MrTable>,
}

impl PendingConn for TcpPending {
    fn accept(
        mut self: Box<Self>,
        caps: QpCaps,
        private_data: PrivateData,
    ) -> Result<Box<dyn Conn>, FabricError> {
        check_caps(caps).map_err(|reason| FabricError::Accept { reason })?;
        let stream = self.stream.take().ok_or_else(|| FabricError::Accept {
            reason: "the connect request was already answered".into(),
        })?;
        Ok(Box::new(TcpConn::accepted(
            stream,
            self.table.clone(),
            caps,
            private_data,
        )))
    }

    fn reject(mut self: Box<Self>, private_data: PrivateData) {
        self.reject_now(private_data);
    }
}

impl TcpPending {
    fn reject_now(&mut self, private_data: PrivateData) {
        if let Some(mut stream) = self.stream.take() {
            let rej = cm_frame(
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
