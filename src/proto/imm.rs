//! Immediate data of RTRS work requests (the kernel's `rtrs_to_imm`, `rtrs_from_imm`,
//! `rtrs_to_io_req_imm`, `rtrs_to_io_rsp_imm`, `rtrs_from_io_rsp_imm`).
//!
//! An imm is 32 bits in host order (the fabric converts to and from the wire's big
//! endian): type in bits 31..28, payload in bits 27..0. IO_REQ payloads carry a chunk
//! id and an offset whose split depends on the session queue depth ([`ImmLayout`]);
//! IO_RSP payloads carry a 9-bit errno magnitude and a 19-bit message id ([`IoRsp`]).
//! See docs/PROTOCOL.md §1, §2.1, §4.5, §4.6 and §5.

use super::constants::{
    chunk_bits, fits_imm_budget, IMM_PAYLOAD_BITS, IMM_PAYLOAD_MASK, IMM_TYPE_BITS,
};
use super::error::{DecodeError, EncodeError, Expected};
use crate::Errno;

/// Imm type codes (`enum rtrs_imm_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ImmType {
    /// Client → server request; payload = buf_id/offset.
    IoReq = 0,
    /// Server → client response; payload = errno/msg_id.
    IoRsp = 1,
    /// Response after a SEND_WITH_INV that already invalidated the client's MR.
    IoRspWInv = 2,
    /// Heartbeat.
    HbMsg = 8,
    /// Heartbeat acknowledgement.
    HbAck = 9,
}

impl ImmType {
    /// Codes that are defined, for error messages.
    pub const CODES: &'static [u64] = &[0, 1, 2, 8, 9];

    /// Maps a 4-bit code to a type.
    pub const fn from_code(code: u32) -> Option<ImmType> {
        match code {
            0 => Some(ImmType::IoReq),
            1 => Some(ImmType::IoRsp),
            2 => Some(ImmType::IoRspWInv),
            8 => Some(ImmType::HbMsg),
            9 => Some(ImmType::HbAck),
            _ => None,
        }
    }
}

/// Builds an imm from a type and a payload (payload bits above 27 are dropped).
pub const fn to_imm(ty: ImmType, payload: u32) -> u32 {
    ((ty as u32) << IMM_PAYLOAD_BITS) | (payload & IMM_PAYLOAD_MASK)
}

/// The 4-bit type code of an imm.
pub const fn imm_type_code(imm: u32) -> u32 {
    imm >> IMM_PAYLOAD_BITS
}

/// The 28-bit payload of an imm.
pub const fn imm_payload(imm: u32) -> u32 {
    imm & IMM_PAYLOAD_MASK
}

/// Heartbeat imm (`0x80000000`).
pub const HB_MSG_IMM: u32 = to_imm(ImmType::HbMsg, 0);
/// Heartbeat acknowledgement imm (`0x90000000`).
pub const HB_ACK_IMM: u32 = to_imm(ImmType::HbAck, 0);

/// Bits of the IO_RSP payload that carry the errno magnitude.
pub const RSP_ERRNO_BITS: u32 = 9;
/// Bits of the IO_RSP payload that carry the message id.
pub const RSP_MSG_ID_BITS: u32 = 19;
/// Largest errno magnitude an IO_RSP can carry.
pub const RSP_MAX_ERRNO: u32 = (1 << RSP_ERRNO_BITS) - 1;
/// Largest message id an IO_RSP can carry.
pub const RSP_MAX_MSG_ID: u32 = (1 << RSP_MSG_ID_BITS) - 1;

const _: () = assert!(IMM_TYPE_BITS + IMM_PAYLOAD_BITS == 32);
const _: () = assert!(RSP_ERRNO_BITS + RSP_MSG_ID_BITS == IMM_PAYLOAD_BITS);
const _: () = assert!(HB_MSG_IMM == 0x8000_0000 && HB_ACK_IMM == 0x9000_0000);

/// A decoded imm. IO_REQ payloads stay raw: splitting them needs the queue depth
/// ([`ImmLayout::decode_io_req`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imm {
    /// IO_REQ with its raw 28-bit payload.
    IoReq {
        /// buf_id/offset, split by [`ImmLayout`].
        payload: u32,
    },
    /// IO_RSP or IO_RSP_W_INV.
    IoRsp(IoRsp),
    /// HB_MSG.
    HbMsg,
    /// HB_ACK.
    HbAck,
}

impl Imm {
    /// Decodes an imm in host order. Unknown types and heartbeats with a non-zero payload
    /// are errors (the kernel only warns; docs/PROTOCOL.md §9.6, §9.7).
    ///
    /// # Errors
    /// [`DecodeError::BadField`] naming `imm.type` or `imm.payload`.
    pub fn decode(imm: u32) -> Result<Imm, DecodeError> {
        let code = imm_type_code(imm);
        let payload = imm_payload(imm);
        let Some(ty) = ImmType::from_code(code) else {
            return Err(DecodeError::field(
                "imm",
                "type",
                code,
                Expected::OneOf(ImmType::CODES),
            ));
        };
        Ok(match ty {
            ImmType::IoReq => Imm::IoReq { payload },
            ImmType::IoRsp | ImmType::IoRspWInv => Imm::IoRsp(IoRsp {
                msg_id: payload & RSP_MAX_MSG_ID,
                errno: ((payload >> RSP_MSG_ID_BITS) & RSP_MAX_ERRNO) as u16,
                w_inv: ty == ImmType::IoRspWInv,
            }),
            ImmType::HbMsg | ImmType::HbAck => {
                if payload != 0 {
                    return Err(DecodeError::field(
                        "imm",
                        "payload",
                        payload,
                        Expected::Eq(0),
                    ));
                }
                if ty == ImmType::HbMsg {
                    Imm::HbMsg
                } else {
                    Imm::HbAck
                }
            }
        })
    }

    /// The imm in host order.
    pub const fn to_imm(self) -> u32 {
        match self {
            Imm::IoReq { payload } => to_imm(ImmType::IoReq, payload),
            Imm::IoRsp(r) => r.to_imm(),
            Imm::HbMsg => HB_MSG_IMM,
            Imm::HbAck => HB_ACK_IMM,
        }
    }
}

/// An IO response imm: message id, errno and whether a SEND_WITH_INV preceded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoRsp {
    msg_id: u32,
    errno: u16,
    w_inv: bool,
}

impl IoRsp {
    /// A response for `msg_id` with status `errno` (0, or an errno of either sign; the
    /// magnitude is sent, as the kernel's `abs(errno)`), `w_inv` for IO_RSP_W_INV.
    ///
    /// # Errors
    /// [`EncodeError::BadValue`] if `msg_id` needs more than 19 bits or the errno
    /// magnitude more than 9 (the kernel would silently truncate it).
    pub fn new(msg_id: u32, errno: i32, w_inv: bool) -> Result<IoRsp, EncodeError> {
        if msg_id > RSP_MAX_MSG_ID {
            return Err(EncodeError::value(
                "imm",
                "msg_id",
                msg_id,
                Expected::AtMost(RSP_MAX_MSG_ID as u64),
            ));
        }
        let mag = errno.unsigned_abs();
        if mag > RSP_MAX_ERRNO {
            return Err(EncodeError::value(
                "imm",
                "errno",
                errno,
                Expected::AtMost(RSP_MAX_ERRNO as u64),
            ));
        }
        Ok(IoRsp {
            msg_id,
            errno: mag as u16,
            w_inv,
        })
    }

    /// The request's chunk id (the permit's mem_id).
    pub const fn msg_id(self) -> u32 {
        self.msg_id
    }

    /// 0 on success, otherwise a negative errno: the status as the kernel passes it on.
    pub const fn errno(self) -> i32 {
        -(self.errno as i32)
    }

    /// The status as a result: the error is the errno the server reported.
    pub const fn status(self) -> Result<(), Errno> {
        match Errno::from_raw(self.errno as i32) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// True for IO_RSP_W_INV: the client's MR was invalidated by the peer.
    pub const fn w_inv(self) -> bool {
        self.w_inv
    }

    /// The imm in host order.
    pub const fn to_imm(self) -> u32 {
        let ty = if self.w_inv {
            ImmType::IoRspWInv
        } else {
            ImmType::IoRsp
        };
        to_imm(
            ty,
            ((self.errno as u32) << RSP_MSG_ID_BITS) | (self.msg_id & RSP_MAX_MSG_ID),
        )
    }

    /// Checks the message id against the session queue depth (the client warns and
    /// ignores such a response, docs/PROTOCOL.md §4.6).
    ///
    /// # Errors
    /// [`DecodeError::BadField`] naming `imm.msg_id`.
    pub fn check_msg_id(self, queue_depth: u16) -> Result<IoRsp, DecodeError> {
        if self.msg_id < u32::from(queue_depth) {
            Ok(self)
        } else {
            Err(DecodeError::field(
                "imm",
                "msg_id",
                self.msg_id,
                Expected::Below(u64::from(queue_depth)),
            ))
        }
    }
}

/// A decoded IO_REQ: which chunk, and where inside it the RTRS trailer sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IoReq {
    /// Chunk index (= permit mem_id = msg_id of the response).
    pub buf_id: u16,
    /// Byte offset of the trailer inside the chunk (= data_len + usr_len).
    pub offset: u32,
}

/// The split of IO_REQ payloads for one session: `buf_id << mem_bits | offset`, with
/// `mem_bits = 28 - ceil_log2(queue_depth)`. Both sides build it from the negotiated
/// queue depth and chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImmLayout {
    queue_depth: u16,
    chunk_size: u32,
    mem_bits: u32,
}

impl ImmLayout {
    /// The layout for `queue_depth` chunks of `chunk_size` bytes.
    ///
    /// # Errors
    /// [`EncodeError::BadValue`] if the depth or the size is 0, or if
    /// `ceil_log2(queue_depth) + ceil_log2(chunk_size) > 28`.
    pub fn new(queue_depth: u16, chunk_size: u32) -> Result<ImmLayout, EncodeError> {
        if queue_depth == 0 {
            return Err(EncodeError::value(
                "imm_layout",
                "queue_depth",
                0,
                Expected::NonZero,
            ));
        }
        if chunk_size == 0 || !fits_imm_budget(queue_depth, u64::from(chunk_size)) {
            return Err(EncodeError::value(
                "imm_layout",
                "chunk_size",
                chunk_size,
                Expected::Rule(
                    "non-zero, and ceil_log2(queue_depth) + ceil_log2(chunk_size) <= 28",
                ),
            ));
        }
        Ok(ImmLayout {
            queue_depth,
            chunk_size,
            mem_bits: IMM_PAYLOAD_BITS - chunk_bits(queue_depth),
        })
    }

    /// The layout given only the queue depth: offsets may use all `mem_bits`.
    ///
    /// # Errors
    /// [`EncodeError::BadValue`] if the depth is 0.
    pub fn for_queue_depth(queue_depth: u16) -> Result<ImmLayout, EncodeError> {
        let mem_bits = IMM_PAYLOAD_BITS - chunk_bits(queue_depth);
        ImmLayout::new(queue_depth, 1 << mem_bits)
    }

    /// Session queue depth (number of chunks).
    pub const fn queue_depth(&self) -> u16 {
        self.queue_depth
    }

    /// Chunk size offsets are checked against.
    pub const fn chunk_size(&self) -> u32 {
        self.chunk_size
    }

    /// Payload bits of the buffer id.
    pub const fn chunk_bits(&self) -> u32 {
        IMM_PAYLOAD_BITS - self.mem_bits
    }

    /// Payload bits of the offset.
    pub const fn mem_bits(&self) -> u32 {
        self.mem_bits
    }

    /// `buf_id << mem_bits`, the per-permit constant the client adds offsets to.
    ///
    /// # Errors
    /// [`EncodeError::BadValue`] if `buf_id >= queue_depth`.
    pub fn mem_off(&self, buf_id: u16) -> Result<u32, EncodeError> {
        if buf_id >= self.queue_depth {
            return Err(EncodeError::value(
                "imm",
                "buf_id",
                buf_id,
                Expected::Below(u64::from(self.queue_depth)),
            ));
        }
        // mem_bits >= 12 because queue_depth <= 65535, so the shift stays within 28 bits.
        Ok(u32::from(buf_id) << self.mem_bits)
    }

    /// The full IO_REQ imm for a trailer at `offset` in chunk `buf_id`.
    ///
    /// # Errors
    /// [`EncodeError::BadValue`] if `buf_id >= queue_depth` or `offset >= chunk_size`.
    pub fn io_req(&self, buf_id: u16, offset: u32) -> Result<u32, EncodeError> {
        let mem_off = self.mem_off(buf_id)?;
        if offset >= self.chunk_size {
            return Err(EncodeError::value(
                "imm",
                "offset",
                offset,
                Expected::Below(u64::from(self.chunk_size)),
            ));
        }
        Ok(to_imm(ImmType::IoReq, mem_off | offset))
    }

    /// Splits an IO_REQ payload and checks it (docs/PROTOCOL.md §4.5/§9.5: the server closes
    /// the path on `buf_id >= queue_depth` or `offset >= chunk_size`).
    ///
    /// # Errors
    /// [`DecodeError::BadField`] naming `imm.buf_id` or `imm.offset`.
    pub fn decode_io_req(&self, payload: u32) -> Result<IoReq, DecodeError> {
        let payload = payload & IMM_PAYLOAD_MASK;
        let buf_id = payload >> self.mem_bits;
        let offset = payload & ((1u32 << self.mem_bits) - 1);
        if buf_id >= u32::from(self.queue_depth) {
            return Err(DecodeError::field(
                "imm",
                "buf_id",
                buf_id,
                Expected::Below(u64::from(self.queue_depth)),
            ));
        }
        if offset >= self.chunk_size {
            return Err(DecodeError::field(
                "imm",
                "offset",
                offset,
                Expected::Below(u64::from(self.chunk_size)),
            ));
        }
        Ok(IoReq {
            buf_id: buf_id as u16,
            offset,
        })
    }

    /// Decodes a whole imm that must be an IO_REQ.
    ///
    /// # Errors
    /// As [`Imm::decode`] and [`ImmLayout::decode_io_req`]; another valid type is
    /// reported as `imm.type`.
    pub fn decode_io_req_imm(&self, imm: u32) -> Result<IoReq, DecodeError> {
        match Imm::decode(imm)? {
            Imm::IoReq { payload } => self.decode_io_req(payload),
            _ => Err(DecodeError::field(
                "imm",
                "type",
                imm_type_code(imm),
                Expected::Eq(ImmType::IoReq as u64),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_examples() {
        let l = ImmLayout::new(512, 131072).unwrap();
        assert_eq!((l.chunk_bits(), l.mem_bits()), (9, 19));
        assert_eq!(l.io_req(3, 0x1F004), Ok(0x0019_F004));
        assert_eq!(
            l.decode_io_req_imm(0x0019_F004),
            Ok(IoReq {
                buf_id: 3,
                offset: 0x1F004
            })
        );
        let rsp = IoRsp::new(5, -5, false).unwrap();
        assert_eq!(rsp.to_imm(), 0x1028_0005);
        assert_eq!(IoRsp::new(5, 0, false).unwrap().to_imm(), 0x1000_0005);
        assert_eq!(IoRsp::new(5, 5, true).unwrap().to_imm(), 0x2028_0005);
        assert_eq!(Imm::decode(0x1028_0005), Ok(Imm::IoRsp(rsp)));
        assert_eq!(rsp.errno(), -5);
        assert_eq!(rsp.status(), Err(Errno::EIO));
        assert_eq!(IoRsp::new(5, 0, false).unwrap().status(), Ok(()));
        assert_eq!(Imm::decode(0x8000_0000), Ok(Imm::HbMsg));
        assert_eq!(Imm::decode(0x9000_0000), Ok(Imm::HbAck));
    }

    #[test]
    fn queue_depth_one_uses_all_bits_for_the_offset() {
        let l = ImmLayout::for_queue_depth(1).unwrap();
        assert_eq!((l.chunk_bits(), l.mem_bits()), (0, 28));
        assert_eq!(l.io_req(0, 0x0FFF_FFFF), Ok(0x0FFF_FFFF));
        assert!(l.io_req(1, 0).is_err());
        let l = ImmLayout::for_queue_depth(65535).unwrap();
        assert_eq!(l.mem_bits(), 12);
        assert_eq!(l.io_req(65534, 4095), Ok((65534 << 12) | 4095));
    }

    #[test]
    fn decode_rejects_out_of_range_ids_and_offsets() {
        let l = ImmLayout::new(3, 8192).unwrap(); // chunk_bits 2, mem_bits 26
        let e = l.decode_io_req(3 << 26).unwrap_err();
        assert_eq!(e.field_name(), Some("buf_id"));
        let e = l.decode_io_req((2 << 26) | 8192).unwrap_err();
        assert_eq!(e.field_name(), Some("offset"));
        assert_eq!(
            l.decode_io_req((2 << 26) | 8191),
            Ok(IoReq {
                buf_id: 2,
                offset: 8191
            })
        );
        assert!(l.decode_io_req_imm(HB_MSG_IMM).is_err());
    }

    #[test]
    fn layout_and_rsp_construction_limits() {
        assert!(ImmLayout::new(0, 8192).is_err());
        assert!(ImmLayout::new(512, 0).is_err());
        assert!(ImmLayout::new(2048, 131072).is_ok());
        assert!(ImmLayout::new(2049, 131072).is_err());
        assert!(IoRsp::new(RSP_MAX_MSG_ID, -511, false).is_ok());
        assert!(IoRsp::new(RSP_MAX_MSG_ID + 1, 0, false).is_err());
        assert!(IoRsp::new(0, -512, false).is_err());
        assert!(IoRsp::new(0, i32::MIN, false).is_err());
        let r = IoRsp::new(7, -12, false).unwrap();
        assert!(r.check_msg_id(8).is_ok());
        assert!(r.check_msg_id(7).is_err());
    }

    #[test]
    fn unknown_types_and_hb_payloads_are_refused() {
        for code in [3u32, 4, 5, 6, 7, 10, 15] {
            let e = Imm::decode(code << 28).unwrap_err();
            assert_eq!(e.field_name(), Some("type"));
        }
        assert!(Imm::decode(HB_MSG_IMM | 1).is_err());
        assert!(Imm::decode(HB_ACK_IMM | 0x0800_0000).is_err());
    }

    #[test]
    fn every_decoded_imm_reencodes_identically() {
        let mut x = 0x1234_5678u32;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if let Ok(imm) = Imm::decode(x) {
                assert_eq!(imm.to_imm(), x);
            }
        }
    }
}
