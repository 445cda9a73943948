//! The listener's half of establishing one tcp-fabric connection, before the application
//! sees it (`docs/tcp-fabric.md`, "Connection establishment" and "Authentication"):
//! reading the CM_REQ without blocking, refusing what this listener does not speak, and
//! with a key the version-2 challenge-response (CM_REQ with the initiator's nonce, our
//! CM_CHALLENGE, the initiator's CM_PROOF).
//!
//! The outcome of [`Handshake::step`] is a request for the application (with the frame
//! version of the connection), a wait for more bytes, or the end of the socket: garbage
//! is closed quietly, a request this listener must refuse is answered with a CM_REJ the
//! initiator understands (a version-1 frame "unsupported version" for an unknown version
//! or for version 1 when a key is required; a version-2 "authentication failed" for a
//! version-2 request without a key here, or for a wrong proof).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};

use super::auth::{self, Role, Transcript};
use super::frame::{cm_frame, peek_version, v2_frame, CmPayload, Header, Opcode, RejectReason};
use super::frame::{CM_FRAME_MAX, CM_PAYLOAD_LEN, HEADER_LEN, MAGIC, NONCE_LEN, PROOF_LEN};
use super::frame::{V1, V2};
use crate::fabric::{PrivateData, Psk};
use crate::ratelimit::{log_limited, RateLimit};

/// Largest payload of a refused request that is read away before the answer (so that
/// closing does not reset the connection under the answer).
const MAX_SKIP: u32 = 4096;

/// What one incoming socket's handshake needs to go on.
pub(crate) enum Step {
    /// Nothing more to read yet.
    Wait,
    /// The socket is done with (answered, garbage, or gone): close it.
    Drop,
    /// A complete, valid (and with a key, authenticated) request.
    Ready {
        version: u8,
        private_data: PrivateData,
    },
}

enum Stage {
    /// Reading the CM_REQ.
    Request,
    /// Reading a refused request's payload away, then answering with `answer`.
    Skip {
        left: u32,
        answer: (u8, RejectReason),
    },
    /// CM_CHALLENGE sent; reading the initiator's CM_PROOF.
    Proof {
        t: Transcript,
        private_data: PrivateData,
    },
}

/// The handshake state of one accepted socket.
pub(crate) struct Handshake {
    buf: [u8; CM_FRAME_MAX],
    have: usize,
    /// The header in `buf` was checked (its length can be trusted).
    checked: bool,
    stage: Stage,
}

impl Handshake {
    pub(crate) fn new() -> Handshake {
        Handshake {
            buf: [0; CM_FRAME_MAX],
            have: 0,
            checked: false,
            stage: Stage::Request,
        }
    }

    /// Reads what arrived and moves on; `psk` is the key the listener requires, if any.
    pub(crate) fn step(
        &mut self,
        stream: &mut TcpStream,
        peer: SocketAddr,
        psk: Option<&Psk>,
        log: &mut RefusalLog<'_>,
    ) -> Step {
        loop {
            if let Stage::Skip { left, answer } = self.stage {
                if left == 0 {
                    reject(stream, answer.0, answer.1);
                    return Step::Drop;
                }
                let n = (left as usize).min(CM_FRAME_MAX);
                match read_some(stream, &mut self.buf[..n]) {
                    Ok(Some(k)) => {
                        self.stage = Stage::Skip {
                            left: left - k as u32,
                            answer,
                        }
                    }
                    Ok(None) => return Step::Wait,
                    Err(()) => return Step::Drop,
                }
                continue;
            }
            // Read no further than the frame expected: what follows belongs to the
            // connection.
            let want = if self.have < HEADER_LEN {
                HEADER_LEN
            } else if !self.checked {
                self.checked = true;
                if let Some(step) = self.check_header(peer, psk, log) {
                    return step;
                }
                continue;
            } else {
                HEADER_LEN + peek_version(self.header_bytes()).2 as usize
            };
            if self.have < want {
                match read_some(stream, &mut self.buf[self.have..want]) {
                    Ok(Some(k)) => self.have += k,
                    Ok(None) => return Step::Wait,
                    Err(()) => {
                        if matches!(self.stage, Stage::Proof { .. }) {
                            // An initiator that finds our proof wrong just leaves.
                            log.refused(peer, "a connection that closed without proving the key (authentication failed)");
                        }
                        return Step::Drop;
                    }
                }
                continue;
            }
            return self.frame_complete(stream, peer, psk, log);
        }
    }

    fn header_bytes(&self) -> &[u8; HEADER_LEN] {
        self.buf[..HEADER_LEN].try_into().expect("header bytes")
    }

    /// A complete header: `None` to go on (reading its payload, or reading a refused
    /// request away), or the end of the socket. A header that passes has a payload
    /// length that fits `buf`.
    fn check_header(
        &mut self,
        peer: SocketAddr,
        psk: Option<&Psk>,
        log: &mut RefusalLog<'_>,
    ) -> Option<Step> {
        let (magic, version, len) = peek_version(self.header_bytes());
        if magic != MAGIC {
            tracing::debug!(%peer, "tcp fabric listener: not our protocol, closing");
            return Some(Step::Drop);
        }
        let expected = match self.stage {
            Stage::Proof { .. } => Opcode::CmProof,
            _ => Opcode::CmReq,
        };
        let refusal = match (&self.stage, version, psk) {
            (Stage::Proof { .. }, V2, _) => None,
            (Stage::Proof { .. }, _, _) => return Some(Step::Drop),
            (_, V1, Some(_)) => {
                log.refused(
                    peer,
                    "a version 1 (unauthenticated) connect request: this listener requires a key",
                );
                Some((V1, RejectReason::UnsupportedVersion))
            }
            (_, V2, None) => {
                log.refused(peer, "an authenticated connect request: this listener has no key (authentication failed)");
                Some((V2, RejectReason::AuthFailed))
            }
            (_, V1 | V2, _) => None,
            _ => {
                log.refused(peer, "a connect request in an unsupported frame version");
                Some((V1, RejectReason::UnsupportedVersion))
            }
        };
        if matches!(version, V1 | V2) {
            match Header::decode_as(self.header_bytes(), version) {
                Ok(h) if h.opcode == expected => {}
                _ => return Some(Step::Drop),
            }
        }
        if let Some(answer) = refusal {
            if len > MAX_SKIP {
                return Some(Step::Drop);
            }
            self.stage = Stage::Skip { left: len, answer };
        }
        None
    }

    fn frame_complete(
        &mut self,
        stream: &mut TcpStream,
        peer: SocketAddr,
        psk: Option<&Psk>,
        log: &mut RefusalLog<'_>,
    ) -> Step {
        let version = peek_version(self.header_bytes()).1;
        match (&self.stage, psk) {
            (Stage::Request, _) if version == V1 => match self.cm_payload() {
                Some(private_data) => Step::Ready {
                    version: V1,
                    private_data,
                },
                None => Step::Drop,
            },
            (Stage::Request, Some(psk)) => {
                let Some(private_data) = self.cm_payload() else {
                    return Step::Drop;
                };
                let at = HEADER_LEN + CM_PAYLOAD_LEN;
                let nonce_i: [u8; NONCE_LEN] =
                    self.buf[at..at + NONCE_LEN].try_into().expect("nonce");
                let (nonce_l, listener) = match (auth::fresh_nonce(), stream.local_addr()) {
                    (Ok(n), Ok(a)) => (n, a),
                    (Err(e), _) => {
                        tracing::error!(%peer, "tcp fabric listener: {e}");
                        return Step::Drop;
                    }
                    (_, Err(e)) => {
                        tracing::debug!(%peer, error = %e, "tcp fabric listener: getsockname failed");
                        return Step::Drop;
                    }
                };
                let t = Transcript {
                    nonce_i,
                    nonce_l,
                    initiator: peer,
                    listener,
                };
                let proof = auth::prove(psk, Role::Listener, &t);
                let (frame, n) = v2_frame(Opcode::CmChallenge, &[&nonce_l, &proof]);
                // A fresh socket's send buffer is empty: the challenge goes in one write.
                if stream.write_all(&frame[..n]).is_err() {
                    return Step::Drop;
                }
                self.stage = Stage::Proof { t, private_data };
                self.have = 0;
                self.checked = false;
                Step::Wait
            }
            (Stage::Proof { t, private_data }, Some(psk)) => {
                let proof = &self.buf[HEADER_LEN..HEADER_LEN + PROOF_LEN];
                if auth::verify(psk, Role::Initiator, t, proof) {
                    return Step::Ready {
                        version: V2,
                        private_data: *private_data,
                    };
                }
                log.refused(
                    peer,
                    "a connection whose proof of the key is wrong (authentication failed)",
                );
                reject(stream, V2, RejectReason::AuthFailed);
                Step::Drop
            }
            _ => Step::Drop,
        }
    }

    /// The request's CM payload, if valid.
    fn cm_payload(&self) -> Option<PrivateData> {
        let pb: &[u8; CM_PAYLOAD_LEN] = self.buf[HEADER_LEN..HEADER_LEN + CM_PAYLOAD_LEN]
            .try_into()
            .expect("payload bytes");
        match CmPayload::decode(pb) {
            Ok(p) if p.reason == RejectReason::None => Some(p.private_data),
            _ => None,
        }
    }
}

/// One read: `Ok(Some(n))` bytes, `Ok(None)` nothing yet, `Err` EOF or a socket error.
fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> Result<Option<usize>, ()> {
    loop {
        match stream.read(buf) {
            Ok(0) => return Err(()),
            Ok(k) => return Ok(Some(k)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Err(()),
        }
    }
}

/// Answers a request with CM_REJ `reason` (no private data) in frame `version`, and
/// closes our side.
fn reject(stream: &mut TcpStream, version: u8, reason: RejectReason) {
    let rej = cm_frame(
        version,
        Opcode::CmRej,
        &CmPayload::new(reason, PrivateData::empty()),
    );
    answer_and_close(stream, &rej);
}

/// Writes a CM answer (it fits an empty socket buffer: one small write) and closes our
/// side, so the peer reads the answer and then EOF.
pub(crate) fn answer_and_close(stream: &mut TcpStream, frame: &[u8]) {
    if let Err(e) = stream.write_all(frame) {
        tracing::debug!(error = %e, "tcp fabric: could not send a CM answer");
    }
    let _ = stream.shutdown(Shutdown::Write);
}

/// Refused connect requests (failed authentication, a version this listener does not
/// accept) go through the listener's [`RateLimit`], since anyone who can reach the port
/// can cause them: a few lines per second, the rest counted in one summary line.
pub(crate) struct RefusalLog<'a> {
    pub(crate) listener: SocketAddr,
    pub(crate) limit: &'a RateLimit,
    /// Now, on the limiter's clock.
    pub(crate) now: u64,
}

impl RefusalLog<'_> {
    fn refused(&mut self, peer: SocketAddr, what: &str) {
        log_limited!(
            self.limit,
            self.now,
            WARN,
            %peer,
            listener = %self.listener,
            "tcp fabric listener: refused {what}"
        );
    }
}
