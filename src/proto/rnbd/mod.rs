//! RNBD 2.x messages (the kernel's `rnbd-proto.h`), carried as the RTRS user header
//! (and, for the two replies, in the READ data area). Little-endian throughout.
//!
//! | type | message | size | here |
//! |---|---|---|---|
//! | 0 | SESS_INFO | 36 | [`SessInfo`] |
//! | 1 | SESS_INFO_RSP | 36 | [`SessInfoRsp`] |
//! | 2 | OPEN | 264 | [`Open`] |
//! | 3 | OPEN_RSP | 56 | [`OpenRsp`] |
//! | 4 | IO | 32 sent, ≥ 24 accepted | [`Io`] |
//! | 5 | CLOSE | 8 | [`Close`] |
//!
//! The server dispatches a user header with [`RnbdMsg::decode`] (the kernel's
//! `rnbd_srv_rdma_ev`, which never checks `usrlen`; we require the full message).
//! See docs/PROTOCOL.md §2.10, §7 and §9.8.

mod io;
mod open;

pub use io::{Io, RnbdFlags, RnbdOp};
pub use open::{AccessMode, CachePolicy, Open, OpenRsp};

use super::error::{DecodeError, EncodeError, Expected};
use super::wire::{get_u16, get_u32, head, head_mut, put_u16, put_u32};

/// RNBD protocol major version (the only part exchanged).
pub const RNBD_PROTO_VER_MAJOR: u8 = 2;
/// Size of `rnbd_msg_hdr`.
pub const RNBD_HDR_LEN: usize = 4;

const _: () = assert!(SessInfo::LEN == RNBD_HDR_LEN + 1 + 31);
const _: () = assert!(Close::LEN == RNBD_HDR_LEN + 4);

/// `enum rnbd_msg_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum RnbdMsgType {
    /// SESS_INFO (client → server).
    SessInfo = 0,
    /// SESS_INFO_RSP (server → client, in the READ data area).
    SessInfoRsp = 1,
    /// OPEN (client → server).
    Open = 2,
    /// OPEN_RSP (server → client, in the READ data area).
    OpenRsp = 3,
    /// IO (client → server).
    Io = 4,
    /// CLOSE (client → server).
    Close = 5,
}

impl RnbdMsgType {
    /// Maps a wire code to a type.
    pub fn from_u16(v: u16) -> Option<RnbdMsgType> {
        Some(match v {
            0 => RnbdMsgType::SessInfo,
            1 => RnbdMsgType::SessInfoRsp,
            2 => RnbdMsgType::Open,
            3 => RnbdMsgType::OpenRsp,
            4 => RnbdMsgType::Io,
            5 => RnbdMsgType::Close,
            _ => return None,
        })
    }

    /// Reads the type from the header of `buf` (padding ignored).
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] below 4 bytes, `rnbd_hdr.type` for an unknown code.
    pub fn peek(buf: &[u8]) -> Result<RnbdMsgType, DecodeError> {
        let v = get_u16(head::<RNBD_HDR_LEN>(buf, "rnbd_hdr")?, 0);
        RnbdMsgType::from_u16(v).ok_or(DecodeError::field(
            "rnbd_hdr",
            "type",
            v,
            Expected::Range(0, 5),
        ))
    }
}

/// Checks the header type of a fixed-size message and returns its first `N` bytes.
pub(crate) fn fixed<'a, const N: usize>(
    buf: &'a [u8],
    ty: RnbdMsgType,
    msg: &'static str,
) -> Result<&'a [u8; N], DecodeError> {
    let b = head::<N>(buf, msg)?;
    let v = get_u16(b, 0);
    if v != ty as u16 {
        return Err(DecodeError::field(msg, "type", v, Expected::Eq(ty as u64)));
    }
    Ok(b)
}

/// Starts a fixed-size message in `out`: zeroes it and writes the header.
pub(crate) fn start<'a, const N: usize>(
    out: &'a mut [u8],
    ty: RnbdMsgType,
    msg: &'static str,
) -> Result<&'a mut [u8; N], EncodeError> {
    let b = head_mut::<N>(out, msg)?;
    *b = [0; N];
    put_u16(b, 0, ty as u16);
    Ok(b)
}

macro_rules! ver_msg {
    ($name:ident, $ty:expr, $msg:literal, $doc:literal) => {
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name {
            /// RNBD major version of the sender.
            pub ver: u8,
        }

        impl $name {
            /// Size on the wire.
            pub const LEN: usize = 36;

            /// The 36 bytes.
            pub fn to_bytes(&self) -> [u8; Self::LEN] {
                let mut b = [0; Self::LEN];
                put_u16(&mut b, 0, $ty as u16);
                b[4] = self.ver;
                b
            }

            /// Writes the 36 bytes into `out`.
            ///
            /// # Errors
            /// [`EncodeError::BufferTooSmall`] (for a reply: the READ data area is
            /// too small).
            pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
                *head_mut::<{ Self::LEN }>(out, $msg)? = self.to_bytes();
                Ok(Self::LEN)
            }

            /// Decodes the message (at least 36 bytes, the right type).
            ///
            /// # Errors
            /// [`DecodeError`] naming the field.
            pub fn decode(buf: &[u8]) -> Result<$name, DecodeError> {
                let b = fixed::<{ Self::LEN }>(buf, $ty, $msg)?;
                Ok($name { ver: b[4] })
            }

            /// The version both sides use: `min(ver, 2)`.
            pub fn negotiated(&self) -> u8 {
                self.ver.min(RNBD_PROTO_VER_MAJOR)
            }
        }
    };
}

ver_msg!(
    SessInfo,
    RnbdMsgType::SessInfo,
    "rnbd_sess_info",
    "`rnbd_msg_sess_info`: the client's RNBD version (36 bytes)."
);
ver_msg!(
    SessInfoRsp,
    RnbdMsgType::SessInfoRsp,
    "rnbd_sess_info_rsp",
    "`rnbd_msg_sess_info_rsp`: the server's RNBD version (36 bytes, READ data area)."
);

/// `rnbd_msg_close`: release a device id (8 bytes, an RTRS WRITE without data).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Close {
    /// The id from OPEN_RSP.
    pub device_id: u32,
}

impl Close {
    /// Size on the wire.
    pub const LEN: usize = 8;

    /// The 8 bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        put_u16(&mut b, 0, RnbdMsgType::Close as u16);
        put_u32(&mut b, 4, self.device_id);
        b
    }

    /// Writes the 8 bytes into `out`.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        *head_mut::<{ Self::LEN }>(out, "rnbd_close")? = self.to_bytes();
        Ok(Self::LEN)
    }

    /// Decodes a CLOSE (at least 8 bytes, type 5).
    ///
    /// # Errors
    /// [`DecodeError`] naming the field.
    pub fn decode(buf: &[u8]) -> Result<Close, DecodeError> {
        let b = fixed::<{ Self::LEN }>(buf, RnbdMsgType::Close, "rnbd_close")?;
        Ok(Close {
            device_id: get_u32(b, 4),
        })
    }
}

/// A client → server RNBD message, as the server dispatches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RnbdMsg<'a> {
    /// SESS_INFO.
    SessInfo(SessInfo),
    /// OPEN.
    Open(Open<'a>),
    /// IO.
    Io(Io),
    /// CLOSE.
    Close(Close),
}

impl<'a> RnbdMsg<'a> {
    /// Decodes a user header received by the server. The header must be at least as
    /// long as its message (36 / 264 / ≥ 24 / 8 bytes, docs/PROTOCOL.md §9.8); the two reply
    /// types are refused.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field; the server answers −EINVAL.
    pub fn decode(usr: &'a [u8]) -> Result<RnbdMsg<'a>, DecodeError> {
        Ok(match RnbdMsgType::peek(usr)? {
            RnbdMsgType::SessInfo => RnbdMsg::SessInfo(SessInfo::decode(usr)?),
            RnbdMsgType::Open => RnbdMsg::Open(Open::decode(usr)?),
            RnbdMsgType::Io => RnbdMsg::Io(Io::decode(usr)?),
            RnbdMsgType::Close => RnbdMsg::Close(Close::decode(usr)?),
            t @ (RnbdMsgType::SessInfoRsp | RnbdMsgType::OpenRsp) => {
                return Err(DecodeError::field(
                    "rnbd_hdr",
                    "type",
                    t as u16,
                    Expected::OneOf(&[0, 2, 4, 5]),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sess_info_and_close() {
        let b = SessInfo { ver: 7 }.to_bytes();
        assert_eq!(SessInfo::decode(&b).unwrap().negotiated(), 2);
        assert!(SessInfoRsp::decode(&b).is_err());
        assert!(SessInfo::decode(&b[..35]).is_err());
        let r = SessInfoRsp { ver: 1 }.to_bytes();
        assert_eq!(SessInfoRsp::decode(&r).unwrap().negotiated(), 1);
        assert!(SessInfoRsp { ver: 2 }.encode(&mut [0; 35]).is_err());
        let c = Close { device_id: 9 }.to_bytes();
        assert_eq!(Close::decode(&c), Ok(Close { device_id: 9 }));
        assert!(Close::decode(&c[..7]).is_err());
        assert!(Close { device_id: 9 }.encode(&mut [0; 7]).is_err());
    }

    #[test]
    fn dispatch() {
        let c = Close { device_id: 3 }.to_bytes();
        assert_eq!(
            RnbdMsg::decode(&c),
            Ok(RnbdMsg::Close(Close { device_id: 3 }))
        );
        let s = SessInfo { ver: 2 }.to_bytes();
        assert_eq!(
            RnbdMsg::decode(&s),
            Ok(RnbdMsg::SessInfo(SessInfo { ver: 2 }))
        );
        let r = SessInfoRsp { ver: 2 }.to_bytes();
        assert_eq!(RnbdMsg::decode(&r).unwrap_err().field_name(), Some("type"));
        assert_eq!(
            RnbdMsg::decode(&[6, 0, 0, 0]).unwrap_err().field_name(),
            Some("type")
        );
        assert!(matches!(
            RnbdMsg::decode(&[5, 0]),
            Err(DecodeError::Truncated { .. })
        ));
        // A CLOSE header with too few bytes (the kernel would read past usrlen).
        assert!(RnbdMsg::decode(&c[..6]).is_err());
        // Header padding is ignored.
        let mut p = c;
        p[2] = 0xff;
        assert!(RnbdMsg::decode(&p).is_ok());
    }
}
