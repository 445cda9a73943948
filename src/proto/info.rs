//! The INFO exchange on the service connection: `rtrs_msg_info_req` (272 bytes, client
//! → server) and `rtrs_msg_info_rsp` with its `rtrs_sg_desc` list (server → client).
//!
//! The kernel sends them from `rtrs_send_path_info` / `post_recv_path` +
//! `process_info_req`, and checks the response in `rtrs_clt_info_rsp_done` and
//! `process_info_rsp`. See docs/PROTOCOL.md §2.4, §2.5, §3.5, §3.6, §9.3 and §9.4.

use super::constants::{ceil_log2, chunk_bits, MsgType, IMM_PAYLOAD_BITS};
use super::error::{BadString, DecodeError, EncodeError, Expected};
use super::wire::{
    c_name, check_c_name, get_u16, get_u32, get_u64, head, head_mut, put_u16, put_u32, put_u64,
};

/// `rtrs_sg_desc`: a remote memory range (`addr` = iova, `key` = rkey, `len` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SgDesc {
    /// Remote address (MR iova).
    pub addr: u64,
    /// Remote key.
    pub key: u32,
    /// Length in bytes.
    pub len: u32,
}

impl SgDesc {
    /// Size on the wire.
    pub const LEN: usize = 16;

    /// The 16 bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        put_u64(&mut b, 0, self.addr);
        put_u32(&mut b, 8, self.key);
        put_u32(&mut b, 12, self.len);
        b
    }

    /// Reads a descriptor from 16 bytes (any content is a valid descriptor).
    pub fn from_bytes(b: &[u8; Self::LEN]) -> SgDesc {
        SgDesc {
            addr: get_u64(b, 0),
            key: get_u32(b, 8),
            len: get_u32(b, 12),
        }
    }
}

const INFO_REQ_LEN: usize = 272;
const INFO_RSP_HDR_LEN: usize = 8;

const _: () = assert!(InfoReq::LEN == 2 + InfoReq::PATHNAME_LEN + 15);
const _: () = assert!(InfoReq::LEN == 272);
const _: () = assert!(SgDesc::LEN == 8 + 4 + 4);
const _: () = assert!(InfoRsp::HDR_LEN == 8);

/// `rtrs_msg_info_req`: the client names its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InfoReq<'a> {
    /// Session name, without the NUL (1..=254 bytes, no `/`, `.` or NUL).
    pub pathname: &'a [u8],
}

impl<'a> InfoReq<'a> {
    /// Size on the wire (and of the server's receive buffer).
    pub const LEN: usize = INFO_REQ_LEN;
    /// Size of the `pathname` field.
    pub const PATHNAME_LEN: usize = 255;

    /// An INFO_REQ for session `name`.
    pub fn new(name: &'a str) -> InfoReq<'a> {
        InfoReq {
            pathname: name.as_bytes(),
        }
    }

    /// The session name as text, if it is UTF-8.
    pub fn pathname_str(&self) -> Option<&'a str> {
        core::str::from_utf8(self.pathname).ok()
    }

    /// Writes the 272 bytes into `out` (name NUL-padded, reserved zero).
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`], or [`EncodeError::BadString`] for a name that
    /// is empty, 255 bytes or longer, or contains NUL, `/` or `.` (the kernel client
    /// refuses such names locally).
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        check_c_name(self.pathname, Self::PATHNAME_LEN, "info_req", "pathname")?;
        no_slash_or_dot(self.pathname)?;
        let b = head_mut::<INFO_REQ_LEN>(out, "info_req")?;
        *b = [0; INFO_REQ_LEN];
        put_u16(b, 0, MsgType::InfoReq as u16);
        b[2..2 + self.pathname.len()].copy_from_slice(self.pathname);
        Ok(Self::LEN)
    }

    /// Decodes an INFO_REQ (at least 272 bytes): type 0, a non-empty name
    /// NUL-terminated inside the 255-byte field, without `/` or `.`. Bytes after the
    /// NUL and the reserved bytes are ignored.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field; the server closes the path.
    pub fn decode(buf: &'a [u8]) -> Result<InfoReq<'a>, DecodeError> {
        let b = head::<INFO_REQ_LEN>(buf, "info_req")?;
        MsgType::expect(get_u16(b, 0), MsgType::InfoReq, "info_req")?;
        let name = c_name(&b[2..2 + Self::PATHNAME_LEN], "info_req", "pathname")?;
        no_slash_or_dot(name)?;
        Ok(InfoReq { pathname: name })
    }
}

/// Refuses a session name with `/` or `.` (the kernel client refuses such names locally).
fn no_slash_or_dot(name: &[u8]) -> Result<(), BadString> {
    match name.iter().position(|&c| c == b'/' || c == b'.') {
        Some(pos) => Err(BadString::new(
            "info_req",
            "pathname",
            "contains '/' or '.'",
            pos,
        )),
        None => Ok(()),
    }
}

/// A checked `rtrs_msg_info_rsp`: a view over the descriptors in the received buffer.
///
/// Decoding checks, for the session's `queue_depth` and `chunk_size`: type 1,
/// `1 <= sg_cnt <= queue_depth`, the buffer holds `8 + 16·sg_cnt` bytes, every `len`
/// is a non-zero multiple of `chunk_size`, `addr + len` does not wrap, the lengths
/// sum (in 64 bits) to exactly `queue_depth·chunk_size`, and the imm bit budget holds
/// for `queue_depth`. The kernel's extra `queue_depth % sg_cnt == 0` is not required:
/// the mapping below works for uneven splits (docs/PROTOCOL.md §9.4, the note on uneven splits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InfoRsp<'a> {
    descs: &'a [u8],
    chunk_size: u32,
}

impl<'a> InfoRsp<'a> {
    /// Size of the header before the descriptors.
    pub const HDR_LEN: usize = INFO_RSP_HDR_LEN;

    /// Bytes an INFO_RSP with `sg_cnt` descriptors takes (`8 + 16·sg_cnt`); the client's
    /// receive buffer is `wire_len(queue_depth)`.
    pub const fn wire_len(sg_cnt: u16) -> usize {
        Self::HDR_LEN + SgDesc::LEN * sg_cnt as usize
    }

    /// Writes an INFO_RSP carrying `descs` into `out`; returns the bytes written.
    ///
    /// # Errors
    /// [`EncodeError::BadValue`] for zero or more than 65535 descriptors;
    /// [`EncodeError::BufferTooSmall`].
    pub fn encode<I>(descs: I, out: &mut [u8]) -> Result<usize, EncodeError>
    where
        I: IntoIterator<Item = SgDesc>,
    {
        let have = out.len();
        let mut n = 0usize;
        for d in descs {
            let off = Self::HDR_LEN + n * SgDesc::LEN;
            let slot = out
                .get_mut(off..off + SgDesc::LEN)
                .ok_or(EncodeError::BufferTooSmall {
                    msg: "info_rsp",
                    need: off + SgDesc::LEN,
                    have,
                })?;
            slot.copy_from_slice(&d.to_bytes());
            n += 1;
        }
        let sg_cnt = match u16::try_from(n) {
            Ok(c) if c > 0 => c,
            _ => {
                return Err(EncodeError::value(
                    "info_rsp",
                    "sg_cnt",
                    n as i64,
                    Expected::Range(1, u16::MAX.into()),
                ))
            }
        };
        let h = head_mut::<INFO_RSP_HDR_LEN>(out, "info_rsp")?;
        *h = [0; INFO_RSP_HDR_LEN];
        put_u16(h, 0, MsgType::InfoRsp as u16);
        put_u16(h, 2, sg_cnt);
        Ok(Self::wire_len(sg_cnt))
    }

    /// Decodes and checks an INFO_RSP for a session of `queue_depth` chunks of
    /// `chunk_size` bytes (see the type's documentation for the checks).
    ///
    /// # Errors
    /// [`DecodeError`] naming the field or descriptor; the client fails the path.
    pub fn decode(
        buf: &'a [u8],
        queue_depth: u16,
        chunk_size: u32,
    ) -> Result<InfoRsp<'a>, DecodeError> {
        const M: &str = "info_rsp";
        let h = head::<INFO_RSP_HDR_LEN>(buf, M)?;
        MsgType::expect(get_u16(h, 0), MsgType::InfoRsp, M)?;
        if queue_depth == 0
            || chunk_size == 0
            || chunk_bits(queue_depth) + ceil_log2(chunk_size.into()) > IMM_PAYLOAD_BITS
        {
            return Err(DecodeError::field(
                M,
                "queue_depth",
                queue_depth,
                Expected::Rule(
                    "session parameters with ceil_log2(queue_depth) + ceil_log2(chunk_size) <= 28",
                ),
            ));
        }
        let sg_cnt = get_u16(h, 2);
        if sg_cnt == 0 || sg_cnt > queue_depth {
            return Err(DecodeError::field(
                M,
                "sg_cnt",
                sg_cnt,
                Expected::Range(1, queue_depth.into()),
            ));
        }
        let total = Self::wire_len(sg_cnt);
        let descs = buf
            .get(Self::HDR_LEN..total)
            .ok_or(DecodeError::Truncated {
                msg: M,
                need: total,
                have: buf.len(),
            })?;
        let mut sum = 0u64;
        for (i, c) in descs.chunks_exact(SgDesc::LEN).enumerate() {
            let d = SgDesc {
                addr: get_u64(c, 0),
                key: get_u32(c, 8),
                len: get_u32(c, 12),
            };
            let bad = |field, value: u64, expected| DecodeError::BadDesc {
                msg: M,
                index: i as u16,
                field,
                value: value as i64,
                expected,
            };
            if d.len == 0 || d.len % chunk_size != 0 {
                return Err(bad(
                    "len",
                    d.len.into(),
                    Expected::Rule("a non-zero multiple of the chunk size"),
                ));
            }
            if d.addr.checked_add(d.len.into()).is_none() {
                return Err(bad(
                    "len",
                    d.len.into(),
                    Expected::Rule("addr + len inside the 64-bit address space"),
                ));
            }
            sum += u64::from(d.len);
        }
        let want = u64::from(queue_depth) * u64::from(chunk_size);
        if sum != want {
            return Err(DecodeError::field(
                M,
                "desc.len (sum)",
                sum as i64,
                Expected::Eq(want),
            ));
        }
        Ok(InfoRsp { descs, chunk_size })
    }

    /// Number of descriptors.
    pub fn sg_cnt(&self) -> u16 {
        (self.descs.len() / SgDesc::LEN) as u16
    }

    /// The descriptors in order.
    pub fn descs(&self) -> impl ExactSizeIterator<Item = SgDesc> + Clone + 'a {
        self.descs.chunks_exact(SgDesc::LEN).map(|c| SgDesc {
            addr: get_u64(c, 0),
            key: get_u32(c, 8),
            len: get_u32(c, 12),
        })
    }

    /// The chunks in buf_id order as `(addr, rkey)`: each descriptor split into
    /// `len / chunk_size` consecutive chunks (docs/PROTOCOL.md §3.6). Yields exactly
    /// `queue_depth` items.
    pub fn chunks(&self) -> impl Iterator<Item = (u64, u32)> + 'a {
        let cs = self.chunk_size;
        self.descs().flat_map(move |d| {
            (0..d.len / cs).map(move |k| (d.addr + u64::from(k) * u64::from(cs), d.key))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_req_checks() {
        let mut b = [0u8; 272];
        InfoReq::new("clt_sess-1").encode(&mut b).unwrap();
        assert_eq!(
            InfoReq::decode(&b).unwrap().pathname_str(),
            Some("clt_sess-1")
        );
        assert!(matches!(
            InfoReq::decode(&b[..271]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut t = b;
        t[0] = 1;
        assert_eq!(InfoReq::decode(&t).unwrap_err().field_name(), Some("type"));
        let mut t = b;
        t[2..257].fill(b'a'); // no NUL inside the field; reserved byte 257 is zero
        assert!(matches!(
            InfoReq::decode(&t),
            Err(DecodeError::BadString(BadString { pos: 255, .. }))
        ));
        t[256] = 0; // 254 characters then NUL
        assert_eq!(InfoReq::decode(&t).unwrap().pathname.len(), 254);
        let mut t = b;
        t[2] = 0;
        assert!(InfoReq::decode(&t).is_err());
        let mut t = b;
        t[5] = b'/';
        assert!(matches!(
            InfoReq::decode(&t),
            Err(DecodeError::BadString(BadString { pos: 3, .. }))
        ));
        let mut t = b;
        t[3] = b'.';
        assert!(InfoReq::decode(&t).is_err());
        let mut t = b;
        t[20] = b'/'; // after the NUL: ignored
        t[260] = 0xff;
        assert!(InfoReq::decode(&t).is_ok());
        for bad in ["", "a/b", "a.b", "a\0b"] {
            assert!(InfoReq::new(bad).encode(&mut [0; 272]).is_err(), "{bad:?}");
        }
        let long = "x".repeat(255);
        assert!(InfoReq::new(&long).encode(&mut [0; 272]).is_err());
        assert!(InfoReq::new(&long[..254]).encode(&mut [0; 272]).is_ok());
        assert!(InfoReq::new("a").encode(&mut [0; 271]).is_err());
    }

    fn rsp(descs: &[SgDesc]) -> Vec<u8> {
        let mut b = vec![0u8; InfoRsp::wire_len(descs.len() as u16)];
        InfoRsp::encode(descs.iter().copied(), &mut b).unwrap();
        b
    }

    #[test]
    fn info_rsp_maps_chunks_in_order() {
        let d = [
            SgDesc {
                addr: 0x10000,
                key: 7,
                len: 3 * 8192,
            },
            SgDesc {
                addr: 0x90000,
                key: 9,
                len: 8192,
            },
        ];
        let b = rsp(&d);
        let r = InfoRsp::decode(&b, 4, 8192).unwrap();
        assert_eq!(r.sg_cnt(), 2);
        assert!(r.descs().eq(d.iter().copied()));
        let chunks: Vec<_> = r.chunks().collect();
        assert_eq!(
            chunks,
            [(0x10000, 7), (0x12000, 7), (0x14000, 7), (0x90000, 9)]
        );
        // Trailing bytes beyond 8 + 16·sg_cnt are ignored.
        let mut longer = b.clone();
        longer.extend_from_slice(&[0xff; 16]);
        assert_eq!(InfoRsp::decode(&longer, 4, 8192).unwrap().sg_cnt(), 2);
    }

    #[test]
    fn info_rsp_checks() {
        let one = SgDesc {
            addr: 0,
            key: 1,
            len: 8192,
        };
        let b = rsp(&[one, one]);
        let field = |b: &[u8], qd, cs| InfoRsp::decode(b, qd, cs).unwrap_err().field_name();
        assert_eq!(field(&b, 1, 8192), Some("sg_cnt")); // sg_cnt > queue_depth
        assert_eq!(field(&b, 3, 8192), Some("desc.len (sum)"));
        assert_eq!(field(&b, 2, 4096 * 3), Some("len"));
        assert_eq!(field(&b[..23], 2, 8192), None); // truncated
        assert_eq!(field(&b, 0, 8192), Some("queue_depth"));
        assert_eq!(field(&b, 2, 1 << 28), Some("queue_depth")); // budget: 1 + 28
        let mut t = b.clone();
        t[0] = 0;
        assert_eq!(field(&t, 2, 8192), Some("type"));
        let mut t = b.clone();
        t[2] = 0;
        assert_eq!(field(&t, 2, 8192), Some("sg_cnt"));
        let z = rsp(&[one, SgDesc { len: 0, ..one }]);
        assert!(matches!(
            InfoRsp::decode(&z, 2, 8192),
            Err(DecodeError::BadDesc {
                index: 1,
                field: "len",
                ..
            })
        ));
        let wrap = rsp(&[
            SgDesc {
                addr: u64::MAX - 100,
                ..one
            },
            one,
        ]);
        assert!(InfoRsp::decode(&wrap, 2, 8192).is_err());
        // Lengths that would wrap a 32-bit sum: 2 × 0x8000_0000 with chunk 2^31, qd 2.
        let big = SgDesc {
            addr: 0,
            key: 1,
            len: 0x8000_0000,
        };
        let w = rsp(&[big, big]);
        assert!(InfoRsp::decode(&w, 2, 0x8000_0000).is_err()); // budget 1 + 31
        let w = rsp(&[big, big, big]);
        assert!(InfoRsp::decode(&w, 3, 0x0100_0000).is_err());
        assert!(InfoRsp::encode(core::iter::empty(), &mut [0; 8]).is_err());
        assert!(InfoRsp::encode([one], &mut [0; 23]).is_err());
    }
}
