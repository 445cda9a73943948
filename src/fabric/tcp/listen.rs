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

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use super::check_caps;
use super::conn::TcpConn;
use super::frame::{cm_frame, CmPayload, Opcode, RejectReason};
use super::handshake::{answer_and_close, Handshake, RefusalLog, Step};
use crate::fabric::soft::MrTable;
use crate::fabric::{
    Conn, ConnRequest, FabricError, Listener, PendingConn, PrivateData, Psk, QpCaps,
};

/// Sockets whose CM_REQ is still incomplete, at most; beyond, new sockets are closed.
const MAX_INCOMING: usize = 256;
/// Sockets accepted per `poll` call.
const ACCEPT_BUDGET: usize = 64;

struct Incoming {
    stream: TcpStream,
    peer: SocketAddr,
    hs: Handshake,
}

/// A listening socket of the tcp fabric.
pub struct TcpListener {
    inner: std::net::TcpListener,
    local: SocketAddr,
    table: Arc<MrTable>,
    incoming: Vec<Incoming>,
    ready: VecDeque<ConnRequest>,
    /// The key every initiator must prove (frame version 2), if any.
    psk: Option<Psk>,
    refusals: RefusalLog,
}

impl TcpListener {
    /// Binds `addr` and listens without blocking; with `psk`, only initiators that
    /// prove that key are let through.
    ///
    /// # Errors
    /// [`FabricError::Listen`] naming the failing call.
    pub(crate) fn bind(
        addr: SocketAddr,
        table: Arc<MrTable>,
        psk: Option<Psk>,
    ) -> Result<TcpListener, FabricError> {
        let fail = |call: &str, e: io::Error| FabricError::Listen {
            addr,
            reason: format!("{call}: {e}"),
        };
        let inner = std::net::TcpListener::bind(addr).map_err(|e| fail("bind", e))?;
        inner
            .set_nonblocking(true)
            .map_err(|e| fail("set_nonblocking", e))?;
        let local = inner.local_addr().map_err(|e| fail("getsockname", e))?;
        Ok(TcpListener {
            inner,
            local,
            table,
            incoming: Vec::new(),
            ready: VecDeque::new(),
            psk,
            refusals: RefusalLog::new(local),
        })
    }

    fn accept_new(&mut self) {
        for _ in 0..ACCEPT_BUDGET {
            match self.inner.accept() {
                Ok((stream, peer)) => {
                    if self.incoming.len() >= MAX_INCOMING {
                        tracing::warn!(%peer, "tcp fabric listener: too many pending connects, closing");
                        continue;
                    }
                    if stream.set_nonblocking(true).is_err() || stream.set_nodelay(true).is_err() {
                        continue;
                    }
                    self.incoming.push(Incoming {
                        stream,
                        peer,
                        hs: Handshake::new(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ECONNABORTED, EMFILE and the like: this socket is lost, keep serving.
                    tracing::debug!(error = %e, "tcp fabric listener: accept failed");
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
        self.accept_new();
        let mut i = 0;
        let mut incoming = std::mem::take(&mut self.incoming);
        while i < incoming.len() {
            let inc = &mut incoming[i];
            match inc.hs.step(
                &mut inc.stream,
                inc.peer,
                self.psk.as_ref(),
                &mut self.refusals,
            ) {
                Step::Wait => i += 1,
                Step::Drop => {
                    incoming.swap_remove(i);
                }
                Step::Ready {
                    version,
                    private_data,
                } => {
                    let inc = incoming.swap_remove(i);
                    let pending = TcpPending {
                        stream: Some(inc.stream),
                        table: self.table.clone(),
                        version,
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

/// The acceptor's half of a [`ConnRequest`].
pub struct TcpPending {
    stream: Option<TcpStream>,
    table: Arc<MrTable>,
    /// The frame version of the connection (the request's).
    version: u8,
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
            self.version,
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
