//! One tcp-fabric connection ([`TcpConn`]): a non-blocking socket, the soft RC queue
//! pair, and the connection-manager state machine around them (what `rdma_cm` plus an
//! RC QP are on verbs: `rdma_connect`/`rdma_accept`, the established, rejected and
//! disconnected events, and the QP moving to the error state on a break).
//!
//! There is no thread: everything happens inside [`Conn::poll_cq`] and [`Conn::poll_cm`],
//! which read what arrived, execute it, and write what is pending.
//!
//! An initiator with a key speaks frame version 2 and proves the key (the initiator's
//! half of `docs/tcp-fabric.md`, "Authentication"): its CM_REQ carries a nonce, it
//! checks the listener's CM_CHALLENGE before answering with CM_PROOF, and it takes no
//! CM_REP from a listener that has not proven the key. Without a key it speaks version 1.
//!
//! A connection its user disconnects or drops is closed with a reset (`SO_LINGER` 0):
//! bytes of it still in our socket buffers are discarded, never delivered later. RTRS
//! re-sends the requests of a dead path on another path right after disconnecting it,
//! so the old copy must not be able to arrive after the new one (a segment waiting for
//! the peer's receive window, or retransmitted once a silent link comes back). What the
//! peer already received is still read by it, then the reset.

use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use super::auth::{self, Nonce, Role, Transcript};
use super::frame::{cm_frame, v2_frame, CmPayload, Header, Opcode, RejectReason};
use super::frame::{CM_PAYLOAD_LEN, NONCE_LEN, V1, V2, VERSION};
use super::ready::{Own, TcpReadiness};
use super::rx::{CmIn, CmReadError, ReadGate, Rx, RxStop};
use super::sys;
use super::tx::Tx;
use crate::fabric::soft::cq::Member;
use crate::fabric::soft::cq::DIRECT_IDLE_POLLS;
use crate::fabric::soft::{MrTable, SoftQp, WireKind, WireOp};
use crate::fabric::{
    CmEvent, Conn, ConnState, PostError, PrivateData, Psk, QpCaps, RecvWr, SendOp, SendWr, Wc,
    WcStatus,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TcpConnPhase {
    /// Initiator: the non-blocking TCP connect is in progress.
    TcpConnecting,
    /// Initiator: CM_REQ queued or sent, waiting for CM_REP / CM_REJ.
    AwaitAnswer,
    Connected,
    /// The queue pair broke: finish the frame in flight and the NAK or DISCONNECT, shut
    /// our side down, and discard input until the peer closes.
    Closing,
    /// The socket is gone.
    Closed,
}

/// The initiator's side of the authentication exchange.
struct InitiatorAuth {
    psk: Psk,
    nonce_i: Nonce,
    /// The listener proved the key (its CM_CHALLENGE verified); CM_PROOF is sent.
    listener_proven: bool,
}

/// A tcp-fabric connection.
pub struct TcpConn {
    stream: Option<TcpStream>,
    /// The frame version of the connection: 2 when authenticated, else 1.
    version: u8,
    /// Initiator with a key: the authentication exchange.
    auth: Option<InitiatorAuth>,
    phase: TcpConnPhase,
    write_shut: bool,
    /// The batch in flight was detached from user memory (once, entering Closing).
    cut_done: bool,
    qp: SoftQp,
    tx: Tx,
    rx: Rx,
    /// Whether `rx` may read the socket (the shared CQ's readiness set or `own` says).
    gate: ReadGate,
    /// With a private CQ: the connection's own readiness source, if its mode has one.
    own: Option<Own>,
    /// Polls without work since the socket left its own ring to be read on every poll
    /// (see [`TcpConn::pace_own`]); `None` while it is in the ring.
    own_direct: Option<u32>,
    events: VecDeque<CmEvent>,
    peer: Option<SocketAddr>,
    local: Option<SocketAddr>,
    /// The address given to `connect` (for error messages before `peer` is known).
    dst: Option<SocketAddr>,
    /// Why we broke the connection, when the peer was refused ([`Conn::failure`]).
    failure: Option<String>,
}

impl TcpConn {
    fn with(
        stream: Option<TcpStream>,
        phase: TcpConnPhase,
        table: Arc<MrTable>,
        caps: QpCaps,
        version: u8,
    ) -> TcpConn {
        TcpConn {
            stream,
            version,
            auth: None,
            phase,
            write_shut: false,
            cut_done: false,
            qp: SoftQp::new(table, caps),
            tx: Tx::new(caps.max_send_wr, version),
            rx: Rx::new(version),
            gate: ReadGate::default(),
            own: None,
            own_direct: None,
            events: VecDeque::with_capacity(4),
            peer: None,
            local: None,
            dst: None,
            failure: None,
        }
    }

    /// Initiator: a connection whose TCP connect is under way (or already failed with
    /// `connect_error`, reported as the first CM event), with CM_REQ queued: version 2
    /// with a nonce when there is a key, version 1 otherwise.
    pub(crate) fn connecting(
        stream: TcpStream,
        dst: SocketAddr,
        table: Arc<MrTable>,
        caps: QpCaps,
        private_data: PrivateData,
        connect_error: Option<std::io::Error>,
        psk: Option<Psk>,
    ) -> TcpConn {
        let version = if psk.is_some() { V2 } else { V1 };
        let mut c = TcpConn::with(
            Some(stream),
            TcpConnPhase::TcpConnecting,
            table,
            caps,
            version,
        );
        c.dst = Some(dst);
        let payload = CmPayload::new(RejectReason::None, private_data);
        if let Some(psk) = psk {
            let nonce_i = match auth::fresh_nonce() {
                Ok(n) => n,
                Err(e) => {
                    c.fail_connect(format!("tcp fabric: connect to {dst}: {e}"));
                    return c;
                }
            };
            let mut p = [0u8; CM_PAYLOAD_LEN];
            payload.encode(&mut p);
            let (frame, n) = v2_frame(Opcode::CmReq, &[&p, &nonce_i]);
            c.tx.queue_cm(&frame[..n]);
            c.auth = Some(InitiatorAuth {
                psk,
                nonce_i,
                listener_proven: false,
            });
        } else {
            c.tx.queue_cm(&cm_frame(V1, Opcode::CmReq, &payload));
        }
        if let Some(e) = connect_error {
            c.fail_connect(format!("tcp fabric: connect to {dst} failed: {e}"));
        }
        c
    }

    /// Acceptor: an accepted connection of frame version `version`; CM_REP with
    /// `private_data` goes out first.
    pub(crate) fn accepted(
        stream: TcpStream,
        table: Arc<MrTable>,
        caps: QpCaps,
        private_data: PrivateData,
        version: u8,
    ) -> TcpConn {
        let peer = stream.peer_addr().ok();
        let local = stream.local_addr().ok();
        let mut c = TcpConn::with(Some(stream), TcpConnPhase::Connected, table, caps, version);
        c.peer = peer;
        c.local = local;
        c.tx.queue_cm(&cm_frame(
            version,
            Opcode::CmRep,
            &CmPayload::new(RejectReason::None, private_data),
        ));
        c.qp.set_connected();
        c.events.push_back(CmEvent::Established {
            private_data: PrivateData::empty(),
        });
        c.progress();
        c
    }

    /// A connection with a private CQ: once established, it reads its socket only after
    /// a readiness event of its own ring when `mode` is `Uring` (see
    /// `docs/ARCHITECTURE.md`, "The tcp fabric"). `Epoll` gains nothing here (an
    /// `epoll_wait` per poll costs what the read it saves does), so it and `None` read on
    /// every poll.
    pub(crate) fn with_own_readiness(mut self, mode: TcpReadiness) -> TcpConn {
        if mode == TcpReadiness::Uring {
            self.own = Some(Own::new());
            self.reconcile_own();
        }
        self
    }

    /// Takes in the own ring's events (before the connection reads).
    fn collect_own(&mut self) {
        let Some(own) = self.own.as_mut() else { return };
        // Read on every poll (`pace_own`): the gate opens once per poll and a short read
        // closes it, so a poll that drained the socket makes no empty read after it.
        if own.collect() || self.own_direct.is_some() {
            self.gate.set_readable();
        }
        if !own.watching() && self.gate.watched() && self.own_direct.is_none() {
            // The ring gave up the socket (a move to this thread failed): ungated.
            self.gate.set_watched(false);
        }
    }

    /// Brings the own ring's watch up to date: an established connection with a socket
    /// is watched; any other is not (and leaves the ring before its socket closes).
    fn reconcile_own(&mut self) {
        let Some(own) = self.own.as_mut() else { return };
        let want = match (&self.stream, self.phase) {
            (Some(s), TcpConnPhase::Connected) => Some(s.as_raw_fd()),
            _ => None,
        };
        if want.is_none() {
            self.own_direct = None;
        }
        match (own.watching(), want) {
            (false, Some(_)) if self.own_direct.is_some() => {}
            (false, Some(fd)) => {
                // Refused: read on every poll, ungated, for good.
                let joined = own.join(fd);
                self.gate.set_watched(joined);
            }
            (true, None) => self.leave_own(),
            _ => {}
        }
    }

    /// The socket leaves the own ring (its poll holds the socket's file): called before
    /// the socket is closed.
    fn leave_own(&mut self) {
        if let Some(own) = self.own.as_mut() {
            // A ring kept while the socket was read on every poll goes too (a removal
            // it could not finish would hold the socket), and the gate, watched then
            // too, opens for good.
            own.leave();
            self.own_direct = None;
            if self.gate.watched() {
                self.gate.set_watched(false);
            }
        }
    }

    /// Test hook: shuts the socket down as a peer process might (half-close, EOF).
    #[cfg(test)]
    pub(crate) fn shutdown_socket(&self, how: Shutdown) {
        if let Some(s) = &self.stream {
            let _ = s.shutdown(how);
        }
    }

    fn who(&self) -> String {
        who(self.peer.or(self.dst))
    }

    /// Establishment failed: report `reason`, flush what was posted, drop the socket.
    fn fail_connect(&mut self, reason: String) {
        tracing::debug!(%reason, "tcp fabric connect failed");
        self.events.push_back(CmEvent::Error { reason });
        self.end_before_established();
    }

    /// The peers did not authenticate each other: a refusal for good, which says
    /// nothing of what was wrong.
    fn fail_auth(&mut self, detail: Option<&str>) {
        let who = self.who();
        let reason = match detail {
            Some(d) => format!("tcp fabric: {who}: authentication failed ({d})"),
            None => format!("tcp fabric: {who}: authentication failed"),
        };
        tracing::debug!(%reason, "tcp fabric connect failed");
        self.events.push_back(CmEvent::AuthFailed { reason });
        self.end_before_established();
    }

    fn end_before_established(&mut self) {
        self.qp.fail();
        self.leave_own();
        // A connection that never came up reports Error or Rejected, not Disconnected.
        let _ = self.qp.take_disconnect();
        self.stream = None;
        self.phase = TcpConnPhase::Closed;
    }

    /// The socket failed or the peer broke the protocol: break at once, no goodbye.
    fn lost(&mut self, why: &str) {
        tracing::debug!(peer = %self.who(), why, "tcp fabric connection lost");
        self.qp.fail();
        self.leave_own();
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.phase = TcpConnPhase::Closed;
    }

    /// The peer broke the protocol: the connection is lost, and says why ([`Conn::failure`]).
    fn refused_peer(&mut self, why: String) {
        self.lost(&why);
        self.failure = Some(why);
    }

    /// Closes the socket with a reset, discarding what our socket buffers still hold
    /// (see the module doc), and flushes the queue pair.
    fn abort(&mut self) {
        self.qp.fail();
        self.leave_own();
        if let Some(s) = self.stream.take() {
            // Best effort: without it the close is a graceful one.
            let _ = socket2::SockRef::from(&s).set_linger(Some(std::time::Duration::ZERO));
        }
        self.phase = TcpConnPhase::Closed;
    }

    /// Drives the connection: connect, CM answer, frames in and out, closing.
    fn progress(&mut self) {
        self.collect_own();
        if self.phase == TcpConnPhase::TcpConnecting {
            self.check_connected();
        }
        if self.phase == TcpConnPhase::AwaitAnswer {
            self.await_answer();
        }
        if self.phase == TcpConnPhase::Connected {
            self.run_connected();
        }
        if self.phase == TcpConnPhase::Closing {
            self.run_closing();
        }
        if self.qp.take_disconnect() {
            self.events.push_back(CmEvent::Disconnected);
        }
        self.pace_own();
        self.reconcile_own();
    }

    /// A connection that found work leaves its own ring and reads on every poll, until
    /// it has found none for [`DIRECT_IDLE_POLLS`] polls: its ring's poll would cost the
    /// peer's send a wake-up and this thread a task work per arrival (`docs/BENCHMARKS.md`,
    /// "A QD1 IO in phases").
    fn pace_own(&mut self) {
        if self.own.is_none() {
            return;
        }
        let busy = self.qp.queued() > 0;
        match self.own_direct {
            None if busy && self.gate.watched() => {
                if let Some(own) = self.own.as_mut() {
                    if own.watching() {
                        // The gate stays watched, opened by each poll (`collect_own`).
                        own.pause();
                        self.own_direct = Some(0);
                    }
                }
            }
            Some(_) if busy => self.own_direct = Some(0),
            Some(n) if n >= DIRECT_IDLE_POLLS => {
                // Back in the ring (`reconcile_own`), read once for what came meanwhile.
                self.own_direct = None;
                self.gate.set_readable();
            }
            Some(n) => self.own_direct = Some(n + 1),
            None => {}
        }
    }

    fn check_connected(&mut self) {
        let Some(stream) = &self.stream else { return };
        match sys::poll_writable(stream.as_raw_fd()) {
            Ok(false) => {}
            Ok(true) => match stream.take_error() {
                Ok(None) => {
                    self.peer = stream.peer_addr().ok();
                    self.local = stream.local_addr().ok();
                    self.phase = TcpConnPhase::AwaitAnswer;
                }
                Ok(Some(e)) | Err(e) => {
                    let who = self.who();
                    self.fail_connect(format!("tcp fabric: connect to {who} failed: {e}"));
                }
            },
            Err(e) => {
                let who = self.who();
                self.fail_connect(format!("tcp fabric: connect to {who}: poll failed: {e}"));
            }
        }
    }

    fn await_answer(&mut self) {
        let addr = self.peer.or(self.dst);
        loop {
            let Some(stream) = self.stream.as_mut() else {
                return;
            };
            if let Err(e) = self.tx.flush(stream.as_raw_fd(), None) {
                let who = who(addr);
                self.fail_connect(format!(
                    "tcp fabric: sending the connect request to {who} failed: {e}"
                ));
                return;
            }
            let answer = match self.rx.read_cm(stream) {
                Ok(None) => return,
                Ok(Some(a)) => a,
                Err(e) => {
                    let who = who(addr);
                    let reason = match e {
                        CmReadError::Eof => format!(
                            "tcp fabric: {who} closed the connection before answering the connect request"
                        ),
                        CmReadError::Io(e) => format!("tcp fabric: connect to {who} failed: {e}"),
                        CmReadError::BadMagic(m) => format!(
                            "tcp fabric: {who} does not speak the tcp fabric protocol (frame magic {m:#010x})"
                        ),
                        CmReadError::Version(v) => format!(
                            "tcp fabric: {who} answered with frame version {v}; this build speaks versions 1 to {VERSION}"
                        ),
                        CmReadError::Garbage(e) => format!("tcp fabric: invalid answer from {who}: {e}"),
                        CmReadError::Unexpected(op) => format!(
                            "tcp fabric: {who} answered the connect request with a {op:?} frame"
                        ),
                    };
                    self.fail_connect(reason);
                    return;
                }
            };
            if !self.on_answer(answer) {
                return;
            }
        }
    }

    /// Acts on the listener's answer; true when the exchange goes on (a challenge was
    /// answered), false when it ended (established, rejected, failed).
    fn on_answer(&mut self, a: CmIn) -> bool {
        let who = self.who();
        if a.opcode == Opcode::CmChallenge {
            self.on_challenge(&a);
            return self.phase == TcpConnPhase::AwaitAnswer;
        }
        let p = match CmPayload::decode(&a.payload) {
            Ok(p) => p,
            Err(e) => {
                self.fail_connect(format!("tcp fabric: invalid answer from {who}: {e}"));
                return false;
            }
        };
        if a.opcode == Opcode::CmRej && p.reason == RejectReason::UnsupportedVersion {
            // A listener of another version may answer in its own version.
            let max = p.max_version;
            match self.version {
                V1 if max >= u16::from(V2) => self.fail_auth(None),
                V2 if max < u16::from(V2) => self.fail_auth(Some(
                    "the listener speaks only frame version 1, which has no authentication",
                )),
                v => self.fail_connect(format!(
                    "tcp fabric: {who} rejected frame version {v}: it speaks versions up to {max}"
                )),
            }
            return false;
        }
        if a.version != self.version {
            self.fail_connect(format!(
                "tcp fabric: {who} answered with frame version {}; this connection speaks version {}",
                a.version, self.version
            ));
            return false;
        }
        let proven = match &self.auth {
            Some(au) => au.listener_proven,
            None => true,
        };
        match (a.opcode, p.reason) {
            (_, RejectReason::AuthFailed) => self.fail_auth(None),
            // A listener that has not proven the key is not taken at its word.
            _ if !proven => self.fail_auth(None),
            (Opcode::CmRep, _) => {
                self.qp.set_connected();
                self.events.push_back(CmEvent::Established {
                    private_data: p.private_data,
                });
                self.phase = TcpConnPhase::Connected;
            }
            _ => {
                self.events.push_back(CmEvent::Rejected {
                    private_data: p.private_data,
                });
                self.end_before_established();
            }
        }
        false
    }

    /// CM_CHALLENGE: check the listener's proof, then send ours.
    fn on_challenge(&mut self, a: &CmIn) {
        let (Some(peer), Some(local)) = (self.peer, self.local) else {
            return self.fail_auth(None);
        };
        let Some(au) = self.auth.as_mut() else {
            // We sent version 1: a challenge cannot come (rx decoded it as version 2).
            return self.fail_auth(None);
        };
        // One challenge, in our version, after our whole request was written (the
        // listener cannot have read it otherwise).
        if au.listener_proven || a.version != V2 || !self.tx.drained() {
            return self.fail_auth(None);
        }
        let mut nonce_l = [0u8; NONCE_LEN];
        nonce_l.copy_from_slice(&a.payload[..NONCE_LEN]);
        let t = Transcript {
            nonce_i: au.nonce_i,
            nonce_l,
            initiator: local,
            listener: peer,
        };
        if !auth::verify(&au.psk, Role::Listener, &t, &a.payload[NONCE_LEN..]) {
            return self.fail_auth(None);
        }
        au.listener_proven = true;
        let proof = auth::prove(&au.psk, Role::Initiator, &t);
        let (frame, n) = v2_frame(Opcode::CmProof, &[&proof]);
        self.tx.queue_cm(&frame[..n]);
    }

    /// Writes what was posted since the last write (and the ack owed), as far as the
    /// socket takes it. False when there is no socket or the write failed (the
    /// connection is lost then).
    fn send_posted(&mut self) -> bool {
        let Some(stream) = self.stream.as_mut() else {
            return false;
        };
        if let Err(e) = self.tx.flush(stream.as_raw_fd(), Some(&mut self.qp)) {
            self.lost(&format!("socket write failed: {e}"));
            return false;
        }
        true
    }

    fn run_connected(&mut self) {
        if self.qp.state() == ConnState::Disconnected {
            // Broken locally (a post-time error): say goodbye.
            self.tx.queue_last(Header::new(Opcode::Disconnect));
            self.phase = TcpConnPhase::Closing;
            return;
        }
        // Send first: what the user posted since the last poll (and the ack owed for
        // what we executed then) goes out before we spend a read on the socket. The
        // frames executed below are acknowledged by the next poll's batch.
        if !self.send_posted() {
            return;
        }
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        match self.rx.progress(stream, &mut self.qp, &mut self.gate) {
            RxStop::Idle => {}
            RxStop::Eof => self.lost("the peer closed the connection"),
            RxStop::Io(e) => self.lost(&format!("socket read failed: {e}")),
            RxStop::Garbage(e) => self.refused_peer(format!("invalid frame: {e}")),
            RxStop::Unexpected(op) => self.refused_peer(format!("unexpected {op:?} frame")),
            RxStop::BadAck(e) => self.refused_peer(format!("forged ack: {e}")),
            RxStop::Refused { op, status } => {
                self.failure = Some(refusal(&op, status));
                tracing::debug!(peer = %self.who(), seq = op.seq, ?status, "tcp fabric: refusing operation");
                self.tx.queue_last(Header::nak(op.seq, status));
                self.phase = TcpConnPhase::Closing;
            }
            RxStop::PeerNak => self.phase = TcpConnPhase::Closing,
            RxStop::PeerDisconnect => {
                self.qp.fail();
                self.phase = TcpConnPhase::Closing;
            }
        }
    }

    fn run_closing(&mut self) {
        // Closing reads on every poll (it must see the peer's EOF).
        self.leave_own();
        if !self.cut_done {
            self.cut_done = true;
            if !self.tx.detach() {
                return self.lost("the frame in flight is too large to finish after a break");
            }
        }
        let Some(stream) = self.stream.as_mut() else {
            self.phase = TcpConnPhase::Closed;
            return;
        };
        if !self.write_shut {
            if let Err(e) = self.tx.flush(stream.as_raw_fd(), None) {
                return self.lost(&format!("socket write failed while closing: {e}"));
            }
            if self.tx.drained() {
                let _ = stream.shutdown(Shutdown::Write);
                self.write_shut = true;
            }
        }
        match self.rx.discard(stream) {
            RxStop::Idle => {}
            _ => {
                self.stream = None;
                self.phase = TcpConnPhase::Closed;
            }
        }
    }
}

impl Drop for TcpConn {
    /// A connection dropped unclosed is reset, as `disconnect` does.
    fn drop(&mut self) {
        if self.stream.is_some() && self.phase != TcpConnPhase::Closed {
            self.abort();
        }
    }
}

impl Member for TcpConn {
    fn table(&self) -> &Arc<MrTable> {
        self.qp.table()
    }

    fn progress(&mut self) {
        TcpConn::progress(self);
    }

    fn queued(&self) -> usize {
        self.qp.queued()
    }

    fn drain(&mut self, wcs: &mut [Wc]) -> usize {
        self.qp.poll(wcs)
    }

    /// Only an established connection is watched: connecting and closing read on every
    /// poll, as on a private CQ (they are short, and closing must see the peer's EOF).
    fn ready_fd(&self) -> Option<RawFd> {
        match (&self.stream, self.phase) {
            (Some(s), TcpConnPhase::Connected) => Some(s.as_raw_fd()),
            _ => None,
        }
    }

    fn set_watched(&mut self, on: bool) {
        self.gate.set_watched(on);
    }

    fn set_readable(&mut self) {
        self.gate.set_readable();
    }
}

/// What a refused operation was, for [`Conn::failure`]: the kind, and for a remote
/// access the key and the range it named.
fn refusal(op: &WireOp, status: WcStatus) -> String {
    let what = match op.kind {
        WireKind::RdmaWrite | WireKind::RdmaWriteWithImm => format!(
            "RDMA WRITE of {} bytes at {:#x} under rkey {:#x}",
            op.len, op.remote_addr, op.rkey
        ),
        WireKind::SendWithInv => format!(
            "SEND of {} bytes invalidating rkey {:#x}",
            op.len, op.inv_rkey
        ),
        WireKind::Send | WireKind::SendWithImm => format!("SEND of {} bytes", op.len),
    };
    let why = match status {
        WcStatus::RemoteAccess => "remote access error",
        WcStatus::RemoteInvalidRequest => "invalid request",
        _ => "refused",
    };
    format!("{why}: {what} (operation {}, {status:?})", op.seq)
}

fn who(addr: Option<SocketAddr>) -> String {
    match addr {
        Some(a) => a.to_string(),
        None => "unknown peer".to_string(),
    }
}

impl Conn for TcpConn {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.qp.post_send(wrs)
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.qp.post_recv(wrs)
    }

    fn local_now(&mut self, op: &SendOp<'_>) -> Option<Result<(), WcStatus>> {
        self.qp.local_now(op)
    }

    fn poll_cq(&mut self, wcs: &mut [Wc]) -> usize {
        self.progress();
        self.qp.poll(wcs)
    }

    /// Writes what was posted (and the ack owed) now; the rest of a poll (reading,
    /// connecting, closing) waits for the next one.
    fn push(&mut self) {
        if self.phase == TcpConnPhase::Connected && self.qp.state() == ConnState::Connected {
            self.send_posted();
        }
    }

    fn poll_cm(&mut self) -> Option<CmEvent> {
        if self.events.is_empty() {
            self.progress();
        }
        self.events.pop_front()
    }

    fn disconnect(&mut self) {
        match self.phase {
            TcpConnPhase::TcpConnecting | TcpConnPhase::AwaitAnswer => {
                self.qp.fail();
                self.leave_own();
                self.stream = None;
                self.phase = TcpConnPhase::Closed;
            }
            TcpConnPhase::Connected | TcpConnPhase::Closing => self.abort(),
            TcpConnPhase::Closed => {}
        }
        self.progress();
    }

    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    fn state(&self) -> ConnState {
        self.qp.state()
    }

    fn caps(&self) -> QpCaps {
        self.qp.caps()
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }

    fn failure(&self) -> Option<String> {
        self.failure.clone()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }
}
