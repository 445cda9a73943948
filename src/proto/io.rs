//! The IO path inside a server chunk: the trailers `rtrs_msg_rdma_write` (4 bytes) and
//! `rtrs_msg_rdma_read` (8 + 16·sg_cnt bytes) after the user header, the chunk layout
//! both sides derive from the IO_REQ offset, and `rtrs_msg_rkey_rsp` (8 bytes).
//!
//! Client side: the kernel's `rtrs_clt_write_req` / `rtrs_clt_read_req` build the
//! header buffer `[user header][trailer]` and check it against `max_hdr_size` and the
//! chunk size ([`write_placement`], [`read_placement`]). Server side:
//! `rtrs_srv_rdma_done` → `process_io_req` → `process_read` / `process_write` read the
//! trailer at the imm offset ([`ChunkReq::decode`]); `rtrs_clt_rkey_rsp_done` checks
//! the rkey response ([`RkeyRsp::decode`]). See docs/PROTOCOL.md §2.6–§2.9, §4, §9.5, §9.6.

use core::ops::Range;

use super::constants::{MsgType, MSG_NEED_INVAL_F};
use super::error::{DecodeError, EncodeError, Expected};
use super::info::SgDesc;
use super::wire::{get_u16, get_u32, head, head_mut, put_u16, put_u32};

/// Size of `rtrs_msg_rdma_write`.
pub const RDMA_WRITE_LEN: usize = 4;
/// Size of `rtrs_msg_rdma_read` without descriptors.
pub const RDMA_READ_HDR_LEN: usize = 8;
/// Size of the largest trailer this implementation sends or accepts (READ, one desc).
pub const RDMA_READ_MAX_TRAILER_LEN: usize = RDMA_READ_HDR_LEN + SgDesc::LEN;

const _: () = assert!(RDMA_READ_MAX_TRAILER_LEN == 24);
const _: () = assert!(RkeyRsp::LEN == 2 + 2 + 4);

/// `rtrs_msg_rdma_write`: trailer of a WRITE request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaWrite {
    /// Bytes of user header just before the trailer.
    pub usr_len: u16,
}

impl RdmaWrite {
    /// Size on the wire.
    pub const LEN: usize = RDMA_WRITE_LEN;

    /// The 4 bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        put_u16(&mut b, 0, MsgType::Write as u16);
        put_u16(&mut b, 2, self.usr_len);
        b
    }

    /// Writes the 4 bytes into `out`.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        *head_mut::<{ Self::LEN }>(out, "rdma_write")? = self.to_bytes();
        Ok(Self::LEN)
    }

    /// Decodes the trailer (type 2).
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] or a bad `type`.
    pub fn decode(buf: &[u8]) -> Result<RdmaWrite, DecodeError> {
        let b = head::<{ Self::LEN }>(buf, "rdma_write")?;
        MsgType::expect(get_u16(b, 0), MsgType::Write, "rdma_write")?;
        Ok(RdmaWrite {
            usr_len: get_u16(b, 2),
        })
    }
}

/// `rtrs_msg_rdma_read`: trailer of a READ request, with at most one descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmaRead {
    /// Bytes of user header just before the trailer.
    pub usr_len: u16,
    /// Where the server writes the reply (`sg_cnt` 1), or `None` (`sg_cnt` 0).
    pub desc: Option<SgDesc>,
    /// `NEED_INVAL_F`: invalidate `desc.key` with SEND_WITH_INV (only with a desc).
    pub need_inval: bool,
}

impl RdmaRead {
    /// Bytes on the wire: `8 + 16·sg_cnt`.
    pub const fn wire_len(&self) -> usize {
        if self.desc.is_some() {
            RDMA_READ_MAX_TRAILER_LEN
        } else {
            RDMA_READ_HDR_LEN
        }
    }

    /// Writes the trailer into `out`; returns the bytes written.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`]; [`EncodeError::BadValue`] for `need_inval`
    /// without a descriptor or a descriptor of length 0 (the server would refuse both).
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        if self.need_inval && self.desc.is_none() {
            return Err(EncodeError::value(
                "rdma_read",
                "flags",
                MSG_NEED_INVAL_F,
                Expected::Rule("NEED_INVAL_F only with one descriptor"),
            ));
        }
        if let Some(d) = self.desc.filter(|d| d.len == 0) {
            return Err(EncodeError::value(
                "rdma_read",
                "desc.len",
                d.len,
                Expected::NonZero,
            ));
        }
        let n = self.wire_len();
        let have = out.len();
        let b = out.get_mut(..n).ok_or(EncodeError::BufferTooSmall {
            msg: "rdma_read",
            need: n,
            have,
        })?;
        b.fill(0);
        put_u16(b, 0, MsgType::Read as u16);
        put_u16(b, 2, self.usr_len);
        put_u16(b, 4, if self.need_inval { MSG_NEED_INVAL_F } else { 0 });
        if let Some(d) = self.desc {
            put_u16(b, 6, 1);
            b[RDMA_READ_HDR_LEN..].copy_from_slice(&d.to_bytes());
        }
        Ok(n)
    }

    /// Decodes the trailer: type 3, `sg_cnt` in {0, 1} (read as le16), the descriptor
    /// present, its `len` non-zero. Unknown flag bits are ignored; `NEED_INVAL_F` counts
    /// only with a descriptor.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field.
    pub fn decode(buf: &[u8]) -> Result<RdmaRead, DecodeError> {
        const M: &str = "rdma_read";
        let b = head::<RDMA_READ_HDR_LEN>(buf, M)?;
        MsgType::expect(get_u16(b, 0), MsgType::Read, M)?;
        let usr_len = get_u16(b, 2);
        let flags = get_u16(b, 4);
        let desc = match get_u16(b, 6) {
            0 => None,
            1 => {
                let d = head::<RDMA_READ_MAX_TRAILER_LEN>(buf, M)?;
                let mut a = [0u8; SgDesc::LEN];
                a.copy_from_slice(&d[RDMA_READ_HDR_LEN..]);
                let desc = SgDesc::from_bytes(&a);
                if desc.len == 0 {
                    return Err(DecodeError::BadDesc {
                        msg: M,
                        index: 0,
                        field: "len",
                        value: 0,
                        expected: Expected::NonZero,
                    });
                }
                Some(desc)
            }
            n => return Err(DecodeError::field(M, "sg_cnt", n, Expected::OneOf(&[0, 1]))),
        };
        Ok(RdmaRead {
            usr_len,
            desc,
            need_inval: desc.is_some() && flags & MSG_NEED_INVAL_F != 0,
        })
    }
}

/// Where a client request goes in the server chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqPlacement {
    /// Chunk offset the client's RDMA write starts at (0 for WRITE, `data_len` for READ).
    pub remote_offset: u32,
    /// Bytes of the header buffer: user header plus trailer.
    pub hdr_len: u32,
    /// The IO_REQ imm offset: `data_len + usr_len`, where the trailer starts.
    pub imm_offset: u32,
}

fn place(
    msg: &'static str,
    data_len: u32,
    usr_len: u16,
    trailer: u32,
    chunk_size: u32,
    max_hdr_size: u32,
) -> Result<(u32, u32), EncodeError> {
    let hdr_len = u32::from(usr_len) + trailer;
    if hdr_len > max_hdr_size {
        return Err(EncodeError::value(
            msg,
            "usr_len",
            usr_len,
            Expected::AtMost(u64::from(max_hdr_size.saturating_sub(trailer))),
        ));
    }
    let end = u64::from(data_len) + u64::from(hdr_len);
    if end > u64::from(chunk_size) {
        return Err(EncodeError::value(
            msg,
            "data_len",
            data_len,
            Expected::AtMost(u64::from(chunk_size - hdr_len.min(chunk_size))),
        ));
    }
    Ok((hdr_len, data_len + u32::from(usr_len)))
}

/// Placement of a WRITE: `[data][usr][rdma_write]` written from chunk offset 0.
///
/// # Errors
/// [`EncodeError::BadValue`] if `usr_len + 4 > max_hdr_size` (the kernel's −EMSGSIZE)
/// or `data_len + usr_len + 4 > chunk_size`.
pub fn write_placement(
    data_len: u32,
    usr_len: u16,
    chunk_size: u32,
    max_hdr_size: u32,
) -> Result<ReqPlacement, EncodeError> {
    let (hdr_len, imm_offset) = place(
        "rdma_write",
        data_len,
        usr_len,
        RDMA_WRITE_LEN as u32,
        chunk_size,
        max_hdr_size,
    )?;
    Ok(ReqPlacement {
        remote_offset: 0,
        hdr_len,
        imm_offset,
    })
}

/// Placement of a READ: `[usr][rdma_read + desc]` written at chunk offset `data_len`,
/// leaving `[0, data_len)` for the reply. Unlike the kernel, the descriptor bytes are
/// counted against the chunk, so the server never reads a trailer past the chunk end.
///
/// # Errors
/// [`EncodeError::BadValue`] for `sg_cnt > 1`, a header that does not fit
/// `max_hdr_size`, or a request that does not fit the chunk.
pub fn read_placement(
    data_len: u32,
    usr_len: u16,
    sg_cnt: u16,
    chunk_size: u32,
    max_hdr_size: u32,
) -> Result<ReqPlacement, EncodeError> {
    if sg_cnt > 1 {
        return Err(EncodeError::value(
            "rdma_read",
            "sg_cnt",
            sg_cnt,
            Expected::OneOf(&[0, 1]),
        ));
    }
    let trailer = (RDMA_READ_HDR_LEN + SgDesc::LEN * usize::from(sg_cnt)) as u32;
    let (hdr_len, imm_offset) = place(
        "rdma_read",
        data_len,
        usr_len,
        trailer,
        chunk_size,
        max_hdr_size,
    )?;
    Ok(ReqPlacement {
        remote_offset: data_len,
        hdr_len,
        imm_offset,
    })
}

/// The request kind found in a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChunkOp {
    /// WRITE: the data is in the chunk.
    Write,
    /// READ: the server produces `data_len` bytes at chunk offset 0 and, with a
    /// descriptor, RDMA-writes `desc.len` of them to the client.
    Read {
        /// The client's reply buffer, if any.
        desc: Option<SgDesc>,
        /// Invalidate `desc.key` with SEND_WITH_INV before the response.
        need_inval: bool,
    },
}

/// A checked request read from a server chunk at the IO_REQ offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkReq {
    /// The imm offset (= trailer position = `data_len + usr_len`).
    pub offset: u32,
    /// Bytes of user header before the trailer.
    pub usr_len: u16,
    /// WRITE or READ, with the READ's descriptor.
    pub op: ChunkOp,
}

impl ChunkReq {
    /// Decodes the trailer of a request whose imm offset is `offset`, in a chunk of
    /// `chunk_size` bytes. `trailer` holds the chunk bytes from `offset` on (at least
    /// the trailer; [`RDMA_READ_MAX_TRAILER_LEN`] bytes, or up to the chunk end, always
    /// suffice). Checks: `offset < chunk_size`; type WRITE or READ; the trailer lies
    /// inside the chunk; `usr_len <= offset`; READ `sg_cnt` in {0, 1}; a descriptor's
    /// `len` is non-zero and at most `data_len`.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field. The kernel closes the path for a bad offset or
    /// type and silently drops a READ with a bad `sg_cnt`.
    // Always inlined into the server's one call per IO: the request returned through
    // memory stalled the caller's read of it (docs/BENCHMARKS.md, "Small values returned
    // through memory").
    #[inline(always)]
    pub fn decode(trailer: &[u8], offset: u32, chunk_size: u32) -> Result<ChunkReq, DecodeError> {
        if offset >= chunk_size {
            return Err(DecodeError::field(
                "imm",
                "offset",
                offset,
                Expected::Below(chunk_size.into()),
            ));
        }
        let room = u64::from(chunk_size - offset);
        let fits = |msg: &'static str, len: usize| {
            if len as u64 <= room {
                Ok(())
            } else {
                Err(DecodeError::field(
                    msg,
                    "offset",
                    offset,
                    Expected::AtMost(u64::from(chunk_size).saturating_sub(len as u64)),
                ))
            }
        };
        fits("rdma_hdr", 2)?;
        let ty = get_u16(head::<2>(trailer, "rdma_hdr")?, 0);
        let (usr_len, op, msg) = match MsgType::from_u16(ty) {
            Some(MsgType::Write) => {
                fits("rdma_write", RDMA_WRITE_LEN)?;
                (
                    RdmaWrite::decode(trailer)?.usr_len,
                    ChunkOp::Write,
                    "rdma_write",
                )
            }
            Some(MsgType::Read) => {
                fits("rdma_read", RDMA_READ_HDR_LEN)?;
                let h = head::<RDMA_READ_HDR_LEN>(trailer, "rdma_read")?;
                // Bound the descriptor array by the chunk before reading it.
                if get_u16(h, 6) == 1 {
                    fits("rdma_read", RDMA_READ_MAX_TRAILER_LEN)?;
                }
                let r = RdmaRead::decode(trailer)?;
                let op = ChunkOp::Read {
                    desc: r.desc,
                    need_inval: r.need_inval,
                };
                (r.usr_len, op, "rdma_read")
            }
            _ => {
                return Err(DecodeError::field(
                    "rdma_hdr",
                    "type",
                    ty,
                    Expected::OneOf(&[MsgType::Write as u64, MsgType::Read as u64]),
                ))
            }
        };
        if u32::from(usr_len) > offset {
            return Err(DecodeError::field(
                msg,
                "usr_len",
                usr_len,
                Expected::AtMost(offset.into()),
            ));
        }
        let data_len = offset - u32::from(usr_len);
        if let ChunkOp::Read { desc: Some(d), .. } = op {
            if d.len > data_len {
                return Err(DecodeError::BadDesc {
                    msg,
                    index: 0,
                    field: "len",
                    value: d.len.into(),
                    expected: Expected::AtMost(data_len.into()),
                });
            }
        }
        Ok(ChunkReq {
            offset,
            usr_len,
            op,
        })
    }

    /// [`ChunkReq::decode`] with the whole chunk in hand (`chunk_size = chunk.len()`).
    ///
    /// # Errors
    /// As [`ChunkReq::decode`]; a chunk larger than 4 GiB is reported as `imm.offset`.
    pub fn decode_in_chunk(chunk: &[u8], offset: u32) -> Result<ChunkReq, DecodeError> {
        let chunk_size = u32::try_from(chunk.len()).unwrap_or(u32::MAX);
        let tail = chunk.get(offset as usize..).unwrap_or(&[]);
        ChunkReq::decode(tail, offset, chunk_size)
    }

    /// Bytes of data (WRITE) or of the reply area (READ): `offset - usr_len`
    /// (decoding guarantees `usr_len <= offset`; a hand-built value saturates at 0).
    pub const fn data_len(&self) -> u32 {
        self.offset.saturating_sub(self.usr_len as u32)
    }

    /// Chunk range of the data / reply area.
    pub const fn data_range(&self) -> Range<usize> {
        0..self.data_len() as usize
    }

    /// Chunk range of the user header.
    pub const fn usr_range(&self) -> Range<usize> {
        self.data_len() as usize..self.offset as usize
    }

    /// True for a READ.
    pub const fn is_read(&self) -> bool {
        matches!(self.op, ChunkOp::Read { .. })
    }
}

/// `rtrs_msg_rkey_rsp`: the new rkey of a chunk, sent with the response imm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RkeyRsp {
    /// Chunk index; equals the imm's msg_id.
    pub buf_id: u16,
    /// The chunk's new rkey on this path.
    pub rkey: u32,
}

impl RkeyRsp {
    /// Size on the wire (and of the client's receive buffers with NEW_RKEY_F).
    pub const LEN: usize = 8;

    /// The 8 bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        put_u16(&mut b, 0, MsgType::RkeyRsp as u16);
        put_u16(&mut b, 2, self.buf_id);
        put_u32(&mut b, 4, self.rkey);
        b
    }

    /// Writes the 8 bytes into `out`.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        *head_mut::<{ Self::LEN }>(out, "rkey_rsp")? = self.to_bytes();
        Ok(Self::LEN)
    }

    /// Decodes an RKEY_RSP received with an IO_RSP imm for `msg_id`: type 4,
    /// `buf_id < queue_depth`, `buf_id == msg_id`.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field; the client starts path error recovery.
    pub fn decode(buf: &[u8], queue_depth: u16, msg_id: u32) -> Result<RkeyRsp, DecodeError> {
        let b = head::<{ Self::LEN }>(buf, "rkey_rsp")?;
        MsgType::expect(get_u16(b, 0), MsgType::RkeyRsp, "rkey_rsp")?;
        let buf_id = get_u16(b, 2);
        if buf_id >= queue_depth {
            return Err(DecodeError::field(
                "rkey_rsp",
                "buf_id",
                buf_id,
                Expected::Below(queue_depth.into()),
            ));
        }
        if u32::from(buf_id) != msg_id {
            return Err(DecodeError::field(
                "rkey_rsp",
                "buf_id",
                buf_id,
                Expected::Eq(msg_id.into()),
            ));
        }
        Ok(RkeyRsp {
            buf_id,
            rkey: get_u32(b, 4),
        })
    }
}

#[cfg(test)]
mod tests;
