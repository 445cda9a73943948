//! The tcp fabric's frame format, version 1 (specified in `docs/tcp-fabric.md`).
//!
//! Every frame is a fixed 40-byte little-endian header followed by `len` payload bytes.
//! Work-request frames carry what an RC packet header carries on InfiniBand (the BTH,
//! RETH, ImmDt and IETH of a verbs wire operation: opcode, rkey, remote address,
//! immediate, rkey to invalidate, packet sequence); control frames carry the RC ACK and
//! NAK and the RDMA CM's REQ/REP/REJ/DREQ. This module is pure: bytes in, a validated
//! [`Header`] or a [`FrameError`] out. It never panics on what a peer sends.

use crate::fabric::{PrivateData, WcStatus, PRIVATE_DATA_LEN};

/// `"RTCP"` in wire order: the first four bytes of every frame.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RTCP");
/// The frame format version this build speaks.
pub const VERSION: u8 = 1;
/// Size of every frame header.
pub const HEADER_LEN: usize = 40;
/// Size of the payload of CM_REQ, CM_REP and CM_REJ.
pub const CM_PAYLOAD_LEN: usize = 64;

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
            0x30 => Opcode::Disconnect,
            _ => return None,
        })
    }

    /// Whether this is one of the five operations a send work request puts on the wire.
    pub fn is_wire_op(self) -> bool {
        (self as u8) < 0x10
    }

    pub fn is_cm(self) -> bool {
        matches!(self, Opcode::CmReq | Opcode::CmRep | Opcode::CmRej)
    }
}

/// A frame that breaks the format: the connection carrying it is torn down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("bad frame magic {found:#010x} (expected {MAGIC:#010x}): the peer does not speak the tcp fabric protocol")]
    BadMagic { found: u32 },
    #[error("frame version {version} is not supported (this build speaks version {VERSION})")]
    UnsupportedVersion { version: u8 },
    #[error("unknown frame opcode {opcode:#04x}")]
    UnknownOpcode { opcode: u8 },
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

/// A decoded frame header (the version is implied: always [`VERSION`]; flags are 0).
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

    /// A CM frame header (its payload is a [`CmPayload`]).
    pub const fn cm(opcode: Opcode) -> Header {
        let mut h = Header::new(opcode);
        h.len = CM_PAYLOAD_LEN as u32;
        h
    }

    /// The status of a NAK frame.
    pub fn nak_status(&self) -> WcStatus {
        status_from_code(self.imm).unwrap_or(WcStatus::RemoteInvalidRequest)
    }

    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        put_u32(out, off::MAGIC, MAGIC);
        out[off::VERSION] = VERSION;
        out[off::OPCODE] = self.opcode as u8;
        out[off::FLAGS..off::LEN].copy_from_slice(&0u16.to_le_bytes());
        put_u32(out, off::LEN, self.len);
        put_u32(out, off::RKEY, self.rkey);
        out[off::REMOTE_ADDR..off::IMM].copy_from_slice(&self.remote_addr.to_le_bytes());
        put_u32(out, off::IMM, self.imm);
        put_u32(out, off::INV_RKEY, self.inv_rkey);
        out[off::SEQ..off::END].copy_from_slice(&self.seq.to_le_bytes());
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        self.encode(&mut b);
        b
    }

    /// Decodes and validates a header: magic, version, opcode, flags, the fields the
    /// opcode does not use (must be zero) and the payload length of control frames.
    ///
    /// # Errors
    /// The first [`FrameError`] found, in the order above.
    pub fn decode(buf: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let magic = get_u32(buf, off::MAGIC);
        if magic != MAGIC {
            return Err(FrameError::BadMagic { found: magic });
        }
        let version = buf[off::VERSION];
        if version != VERSION {
            return Err(FrameError::UnsupportedVersion { version });
        }
        let raw_op = buf[off::OPCODE];
        let opcode = Opcode::from_u8(raw_op).ok_or(FrameError::UnknownOpcode { opcode: raw_op })?;
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
        h.validate()?;
        Ok(h)
    }

    fn validate(&self) -> Result<(), FrameError> {
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
            Ack | CmReq | CmRep | CmRej | Disconnect => (false, false, false),
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
            CmReq | CmRep | CmRej => {
                len_is(CM_PAYLOAD_LEN as u32)?;
                zero(self.seq, "seq")
            }
            Send | SendWithImm | SendWithInv | RdmaWrite | RdmaWriteWithImm => Ok(()),
        }
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
    /// speaks.
    UnsupportedVersion = 2,
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

/// A whole CM frame (header + payload), as written on the socket.
pub const CM_FRAME_LEN: usize = HEADER_LEN + CM_PAYLOAD_LEN;

/// Encodes a CM frame.
pub fn cm_frame(opcode: Opcode, payload: &CmPayload) -> [u8; CM_FRAME_LEN] {
    let mut out = [0u8; CM_FRAME_LEN];
    let (h, p) = out.split_at_mut(HEADER_LEN);
    Header::cm(opcode).encode(h.try_into().expect("header part"));
    payload.encode(p.try_into().expect("payload part"));
    out
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
#[path = "frame_tests.rs"]
mod tests;
