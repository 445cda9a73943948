//! The tcp fabric's frame format, versions 1 and 2 (specified in `docs/tcp-fabric.md`).
//!
//! Every frame is a fixed 40-byte little-endian header followed by `len` payload bytes.
//! Work-request frames carry what an RC packet header carries on InfiniBand (the BTH,
//! RETH, ImmDt and IETH of a verbs wire operation: opcode, rkey, remote address,
//! immediate, rkey to invalidate, packet sequence); control frames carry the RC ACK and
//! NAK and the RDMA CM's REQ/REP/REJ/DREQ. Version 2 adds the authentication exchange
//! (a nonce on CM_REQ, CM_CHALLENGE and CM_PROOF); every frame of a connection carries
//! the version the connection was opened with. This module is pure: bytes in, a
//! validated [`Header`] or a [`FrameError`] out. It never panics on what a peer sends.

use crate::fabric::{PrivateData, WcStatus, PRIVATE_DATA_LEN};

/// `"RTCP"` in wire order: the first four bytes of every frame.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RTCP");
/// Frame format version 1: connections without authentication.
pub const V1: u8 = 1;
/// Frame format version 2: connections authenticated with a pre-shared key.
pub const V2: u8 = 2;
/// The highest frame format version this build speaks (it speaks every version from
/// [`V1`] up).
pub const VERSION: u8 = V2;
/// Size of every frame header.
pub const HEADER_LEN: usize = 40;
/// Size of the payload of CM_REP, CM_REJ and a version-1 CM_REQ.
pub const CM_PAYLOAD_LEN: usize = 64;
/// Size of an authentication nonce.
pub const NONCE_LEN: usize = 32;
/// Size of an authentication proof (an HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// Payload of a version-2 CM_REQ: the CM payload, then the initiator's nonce.
pub const CM_REQ_V2_LEN: usize = CM_PAYLOAD_LEN + NONCE_LEN;
/// Payload of CM_CHALLENGE: the listener's nonce, then its proof.
pub const CHALLENGE_LEN: usize = NONCE_LEN + PROOF_LEN;

/// Offsets of the header fields (the first three are frozen across versions so that a
/// peer can always read a frame's version and length and answer with a clear rejection).
mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const OPCODE: usize = 5;
    pub const FLAGS: usize = 6;
    pub const LEN: usize = 8;
    pub const RKEY: usize = 12;
    pub const REMOTE_ADDR: usize = 16;
    pub const IMM: usize = 24;
    pub const INV_RKEY: usize = 28;
    pub const SEQ: usize = 32;
    pub const END: usize = 40;
}
const _: () = assert!(off::END == HEADER_LEN);
const _: () = assert!(8 + PRIVATE_DATA_LEN == CM_PAYLOAD_LEN);

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Send = 0x01,
    SendWithImm = 0x02,
    SendWithInv = 0x03,
    RdmaWrite = 0x04,
    RdmaWriteWithImm = 0x05,
    /// Cumulative acknowledgement: every work-request frame with `seq <= header.seq`
    /// was executed.
    Ack = 0x10,
    /// The work-request frame `header.seq` was refused with the status in `header.imm`;
    /// the connection closes after it.
    Nak = 0x11,
    CmReq = 0x20,
    CmRep = 0x21,
    CmRej = 0x22,
    /// Version 2, listener to initiator: the listener's nonce and proof of the key.
    CmChallenge = 0x23,
    /// Version 2, initiator to listener: the initiator's proof of the key.
    CmProof = 0x24,
    /// Graceful disconnect; the sender closes after it.
    Disconnect = 0x30,
}

impl Opcode {
    pub fn from_u8(v: u8) -> Option<Opcode> {
        Some(match v {
            0x01 => Opcode::Send,
            0x02 => Opcode::SendWithImm,
            0x03 => Opcode::SendWithInv,
            0x04 => Opcode::RdmaWrite,
            0x05 => Opcode::RdmaWriteWithImm,
            0x10 => Opcode::Ack,
            0x11 => Opcode::Nak,
            0x20 => Opcode::CmReq,
            0x21 => Opcode::CmRep,
            0x22 => Opcode::CmRej,
            0x23 => Opcode::CmChallenge,
            0x24 => Opcode::CmProof,
            0x30 => Opcode::Disconnect,
            _ => return None,
        })
    }

    /// The lowest frame version that has this opcode.
    pub fn since_version(self) -> u8 {
        match self {
            Opcode::CmChallenge | Opcode::CmProof => V2,
            _ => V1,
        }
    }
}

/// A frame that breaks the format: the connection carrying it is torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic {found:#010x} (expected {MAGIC:#010x}): the peer does not speak the tcp fabric protocol")]
    BadMagic { found: u32 },
    #[error(
        "frame version {version} is not supported (this build speaks versions {V1} to {VERSION})"
    )]
    UnsupportedVersion { version: u8 },
    #[error("frame version {found} on a connection of version {expected}")]
    WrongVersion { found: u8, expected: u8 },
    #[error("unknown frame opcode {opcode:#04x}")]
    UnknownOpcode { opcode: u8 },
    #[error("{opcode:?} frames do not exist in frame version {version}")]
    OpcodeVersion { opcode: Opcode, version: u8 },
    #[error("{opcode:?} frame has unknown flags {flags:#06x}")]
    Flags { opcode: Opcode, flags: u16 },
    #[error("{opcode:?} frame has a non-zero {field} field, which it does not use")]
    Reserved { opcode: Opcode, field: &'static str },
    #[error("{opcode:?} frame has payload length {len}, expected {expected}")]
    Length {
        opcode: Opcode,
        len: u32,
        expected: u32,
    },
    #[error("NAK frame carries status code {code}, which is not a refusal")]
    NakStatus { code: u32 },
    #[error("CM payload private data length {len} exceeds {PRIVATE_DATA_LEN}")]
    PrivateDataLen { len: u8 },
    #[error("CM payload has unknown reject reason {reason}")]
    RejectReason { reason: u8 },
    #[error("CM payload reserved bytes are not zero")]
    CmReserved,
}

/// A decoded frame header (the version is the connection's, checked by
/// [`Header::decode_as`]; flags are 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: Opcode,
    /// Payload bytes following the header.
    pub len: u32,
    pub rkey: u32,
    pub remote_addr: u64,
    /// Immediate data (host value); on NAK the status code.
    pub imm: u32,
    /// SEND_WITH_INV: the receiver's rkey to invalidate.
    pub inv_rkey: u32,
    /// Work requests: the sender's sequence number; ACK/NAK: the one acknowledged.
    pub seq: u64,
}

impl Header {
    /// A header with every field but the opcode zero.
    pub const fn new(opcode: Opcode) -> Header {
        Header {
            opcode,
            len: 0,
            rkey: 0,
            remote_addr: 0,
            imm: 0,
            inv_rkey: 0,
            seq: 0,
        }
    }

    pub const fn ack(upto_seq: u64) -> Header {
        let mut h = Header::new(Opcode::Ack);
        h.seq = upto_seq;
        h
    }

    pub fn nak(seq: u64, status: WcStatus) -> Header {
        let mut h = Header::new(Opcode::Nak);
        h.seq = seq;
        h.imm = status_code(status);
        h
    }

    /// The header of a CM frame whose payload is a [`CmPayload`] (64 bytes).
    pub const fn cm(opcode: Opcode) -> Header {
        let mut h = Header::new(opcode);
        h.len = CM_PAYLOAD_LEN as u32;
        h
    }

    /// The status of a NAK frame.
    pub fn nak_status(&self) -> WcStatus {
        status_from_code(self.imm).unwrap_or(WcStatus::RemoteInvalidRequest)
    }

    /// Encodes the header as a frame of `version`.
    pub fn encode_as(&self, out: &mut [u8; HEADER_LEN], version: u8) {
        put_u32(out, off::MAGIC, MAGIC);
        out[off::VERSION] = version;
        out[off::OPCODE] = self.opcode as u8;
        out[off::FLAGS..off::LEN].copy_from_slice(&0u16.to_le_bytes());
        put_u32(out, off::LEN, self.len);
        put_u32(out, off::RKEY, self.rkey);
        out[off::REMOTE_ADDR..off::IMM].copy_from_slice(&self.remote_addr.to_le_bytes());
        put_u32(out, off::IMM, self.imm);
        put_u32(out, off::INV_RKEY, self.inv_rkey);
        out[off::SEQ..off::END].copy_from_slice(&self.seq.to_le_bytes());
    }

    /// The header as a frame of `version`.
    pub fn to_bytes_as(&self, version: u8) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.encode_as(&mut b, version);
        b
    }

    /// The header as a frame of the highest version, [`VERSION`].
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        self.to_bytes_as(VERSION)
    }

    /// Decodes and validates a header of a connection of frame version `version`:
    /// magic, version, opcode (and that it exists in that version), flags, the fields
    /// the opcode does not use (must be zero) and the payload length of control frames.
    ///
    /// # Errors
    /// The first [`FrameError`] found, in the order above.
    // Always inlined into the receive path: a header returned through memory, and the
    // version passed as a wide load beside bytes just stored, stalled it
    // (docs/BENCHMARKS.md, "Small values returned through memory").
    #[inline(always)]
    pub fn decode_as(buf: &[u8; HEADER_LEN], version: u8) -> Result<Header, FrameError> {
        let magic = get_u32(buf, off::MAGIC);
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        let found = buf[off::VERSION];
        if !(V1..=VERSION).contains(&found) {
            return Err(FrameError::UnsupportedVersion { version: found });
        }
        if found != version {
            return Err(FrameError::WrongVersion {
                found,
                expected: version,
            });
        }
        let raw_op = buf[off::OPCODE];
        let opcode = Opcode::from_u8(raw_op).ok_or(FrameError::UnknownOpcode { opcode: raw_op })?;
        if opcode.since_version() > version {
            return Err(FrameError::OpcodeVersion { opcode, version });
        }
        let flags = u16::from_le_bytes([buf[off::FLAGS], buf[off::FLAGS + 1]]);
        if flags != 0 {
            return Err(FrameError::Flags { opcode, flags });
        }
        let mut ra = [0u8; 8];
        ra.copy_from_slice(&buf[off::REMOTE_ADDR..off::IMM]);
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&buf[off::SEQ..off::END]);
        let h = Header {
            opcode,
            len: get_u32(buf, off::LEN),
            rkey: get_u32(buf, off::RKEY),
            remote_addr: u64::from_le_bytes(ra),
            imm: get_u32(buf, off::IMM),
            inv_rkey: get_u32(buf, off::INV_RKEY),
            seq: u64::from_le_bytes(seq),
        };
        h.validate(version)?;
        Ok(h)
    }

    /// [`Header::decode_as`] for a frame of the highest version, [`VERSION`].
    ///
    /// # Errors
    /// As [`Header::decode_as`].
    pub fn decode(buf: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        Header::decode_as(buf, VERSION)
    }

    fn validate(&self, version: u8) -> Result<(), FrameError> {
        use Opcode::*;
        let op = self.opcode;
        let zero = |v: u64, field: &'static str| {
            if v == 0 {
                Ok(())
            } else {
                Err(FrameError::Reserved { opcode: op, field })
            }
        };
        let len_is = |expected: u32| {
            if self.len == expected {
                Ok(())
            } else {
                Err(FrameError::Length {
                    opcode: op,
                    len: self.len,
                    expected,
                })
            }
        };
        // Which of rkey/remote_addr, imm, inv_rkey each opcode uses.
        let (uses_remote, uses_imm, uses_inv) = match op {
            Send => (false, false, false),
            SendWithImm => (false, true, false),
            SendWithInv => (false, false, true),
            RdmaWrite => (true, false, false),
            RdmaWriteWithImm => (true, true, false),
            Nak => (false, true, false),
            Ack | CmReq | CmRep | CmRej | CmChallenge | CmProof | Disconnect => {
                (false, false, false)
            }
        };
        if !uses_remote {
            zero(self.rkey.into(), "rkey")?;
            zero(self.remote_addr, "remote address")?;
        }
        if !uses_imm {
            zero(self.imm.into(), "imm")?;
        }
        if !uses_inv {
            zero(self.inv_rkey.into(), "inv_rkey")?;
        }
        match op {
            Ack | Disconnect => len_is(0),
            Nak => {
                len_is(0)?;
                match status_from_code(self.imm) {
                    Some(s) if s != WcStatus::Success => Ok(()),
                    _ => Err(FrameError::NakStatus { code: self.imm }),
                }
            }
            CmReq | CmRep | CmRej | CmChallenge | CmProof => {
                len_is(cm_payload_len(op, version) as u32)?;
                zero(self.seq, "seq")
            }
            Send | SendWithImm | SendWithInv | RdmaWrite | RdmaWriteWithImm => Ok(()),
        }
    }
}

/// The payload length of CM frame `op` in frame version `version`.
pub fn cm_payload_len(op: Opcode, version: u8) -> usize {
    match op {
        Opcode::CmReq if version >= V2 => CM_REQ_V2_LEN,
        Opcode::CmChallenge => CHALLENGE_LEN,
        Opcode::CmProof => PROOF_LEN,
        _ => CM_PAYLOAD_LEN,
    }
}

/// Reads the frozen part of any version's header: `(magic, version, payload length)`.
/// Used to answer a peer speaking another version with a rejection it understands.
pub fn peek_version(buf: &[u8; HEADER_LEN]) -> (u32, u8, u32) {
    (
        get_u32(buf, off::MAGIC),
        buf[off::VERSION],
        get_u32(buf, off::LEN),
    )
}

/// Why a CM_REJ was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RejectReason {
    /// Not a rejection (REQ and REP carry this).
    None = 0,
    /// The application rejected; the private data is its.
    Consumer = 1,
    /// The acceptor does not speak the REQ's frame version; `max_version` says what it
    /// speaks. (A listener that requires a key speaks only version 2.)
    UnsupportedVersion = 2,
    /// Version 2: the peers did not authenticate each other (no private data; the
    /// reason says nothing of which side or what failed).
    AuthFailed = 3,
}

/// The payload of CM_REQ / CM_REP / CM_REJ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmPayload {
    /// The highest frame version the sender speaks.
    pub max_version: u16,
    pub reason: RejectReason,
    pub private_data: PrivateData,
}

impl CmPayload {
    pub fn new(reason: RejectReason, private_data: PrivateData) -> CmPayload {
        CmPayload {
            max_version: VERSION.into(),
            reason,
            private_data,
        }
    }

    pub fn encode(&self, out: &mut [u8; CM_PAYLOAD_LEN]) {
        out[0..2].copy_from_slice(&self.max_version.to_le_bytes());
        let pd = self.private_data.as_bytes();
        out[2] = pd.len() as u8;
        out[3] = self.reason as u8;
        out[4..8].fill(0);
        out[8..8 + pd.len()].copy_from_slice(pd);
        out[8 + pd.len()..].fill(0);
    }

    /// # Errors
    /// [`FrameError::PrivateDataLen`], [`FrameError::RejectReason`] or
    /// [`FrameError::CmReserved`].
    pub fn decode(buf: &[u8; CM_PAYLOAD_LEN]) -> Result<CmPayload, FrameError> {
        let max_version = u16::from_le_bytes([buf[0], buf[1]]);
        let pd_len = buf[2];
        if usize::from(pd_len) > PRIVATE_DATA_LEN {
            return Err(FrameError::PrivateDataLen { len: pd_len });
        }
        let reason = match buf[3] {
            0 => RejectReason::None,
            1 => RejectReason::Consumer,
            2 => RejectReason::UnsupportedVersion,
            3 => RejectReason::AuthFailed,
            r => return Err(FrameError::RejectReason { reason: r }),
        };
        if buf[4..8] != [0; 4] {
            return Err(FrameError::CmReserved);
        }
        let private_data = PrivateData::new(&buf[8..8 + usize::from(pd_len)])
            .map_err(|_| FrameError::PrivateDataLen { len: pd_len })?;
        Ok(CmPayload {
            max_version,
            reason,
            private_data,
        })
    }
}

/// A whole CM frame with a [`CmPayload`] (header + payload), as written on the socket.
pub const CM_FRAME_LEN: usize = HEADER_LEN + CM_PAYLOAD_LEN;
/// The longest CM frame: a version-2 CM_REQ.
pub const CM_FRAME_MAX: usize = HEADER_LEN + CM_REQ_V2_LEN;

/// Encodes a CM frame with a [`CmPayload`] (CM_REP, CM_REJ, a version-1 CM_REQ) as a
/// frame of `version`.
pub fn cm_frame(version: u8, opcode: Opcode, payload: &CmPayload) -> [u8; CM_FRAME_LEN] {
    let mut out = [0u8; CM_FRAME_LEN];
    let (h, p) = out.split_at_mut(HEADER_LEN);
    Header::cm(opcode).encode_as(h.try_into().expect("header part"), version);
    payload.encode(p.try_into().expect("payload part"));
    out
}

/// A version-2 CM frame whose payload is `parts` one after the other (CM_REQ: payload
/// and nonce; CM_CHALLENGE: nonce and proof; CM_PROOF: proof). Returns the buffer and
/// the frame's length in it.
pub fn v2_frame(opcode: Opcode, parts: &[&[u8]]) -> ([u8; CM_FRAME_MAX], usize) {
    let mut out = [0u8; CM_FRAME_MAX];
    let len = cm_payload_len(opcode, V2);
    debug_assert_eq!(parts.iter().map(|p| p.len()).sum::<usize>(), len);
    let mut h = Header::new(opcode);
    h.len = len as u32;
    h.encode_as(
        (&mut out[..HEADER_LEN]).try_into().expect("header part"),
        V2,
    );
    let mut at = HEADER_LEN;
    for p in parts {
        out[at..at + p.len()].copy_from_slice(p);
        at += p.len();
    }
    (out, HEADER_LEN + len)
}

/// The wire code of a completion status carried by a NAK.
pub fn status_code(s: WcStatus) -> u32 {
    match s {
        WcStatus::Success => 0,
        WcStatus::LocalLength => 1,
        WcStatus::LocalProtection => 2,
        WcStatus::LocalQpOperation => 3,
        WcStatus::RemoteAccess => 4,
        WcStatus::RemoteInvalidRequest => 5,
        WcStatus::WrFlush => 6,
        WcStatus::Transport => 7,
    }
}

fn status_from_code(code: u32) -> Option<WcStatus> {
    Some(match code {
        0 => WcStatus::Success,
        1 => WcStatus::LocalLength,
        2 => WcStatus::LocalProtection,
        3 => WcStatus::LocalQpOperation,
        4 => WcStatus::RemoteAccess,
        5 => WcStatus::RemoteInvalidRequest,
        6 => WcStatus::WrFlush,
        7 => WcStatus::Transport,
        _ => return None,
    })
}

fn put_u32(out: &mut [u8; HEADER_LEN], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn get_u32(buf: &[u8; HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

#[cfg(test)]
mod tests;
