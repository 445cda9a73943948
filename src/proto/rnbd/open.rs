//! RNBD OPEN (`rnbd_msg_open`, 264 bytes) and its reply OPEN_RSP (`rnbd_msg_open_rsp`,
//! 56 bytes), as built by `send_msg_open` / `rnbd_srv_fill_msg_open_rsp` and checked by
//! `process_msg_open` / `process_msg_open_rsp` in the kernel. See docs/PROTOCOL.md §2.10,
//! §7.2 and §9.8.

use super::{fixed, start, RnbdMsgType};
use crate::proto::error::{DecodeError, EncodeError, Expected};
use crate::proto::wire::{
    c_name, check_c_name, get_u16, get_u32, get_u64, put_u16, put_u32, put_u64,
};

const OPEN_LEN: usize = 264;

const _: () = assert!(Open::LEN == 4 + 1 + 1 + Open::DEV_NAME_LEN + 3);
const _: () = assert!(OpenRsp::LEN == 46 + 10);

/// `enum rnbd_access_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AccessMode {
    /// Read-only (`ro`).
    ReadOnly = 0,
    /// Read-write, one writer per device (`rw`).
    ReadWrite = 1,
    /// Up to two writers, for live migration (`migration`).
    Migration = 2,
}

impl AccessMode {
    /// Maps a wire code to a mode.
    pub fn from_u8(v: u8) -> Option<AccessMode> {
        Some(match v {
            0 => AccessMode::ReadOnly,
            1 => AccessMode::ReadWrite,
            2 => AccessMode::Migration,
            _ => return None,
        })
    }

    /// The name used by the management plane: `ro`, `rw` or `migration`.
    pub fn as_str(self) -> &'static str {
        match self {
            AccessMode::ReadOnly => "ro",
            AccessMode::ReadWrite => "rw",
            AccessMode::Migration => "migration",
        }
    }
}

/// `rnbd_msg_open`: map a device by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Open<'a> {
    /// Requested access.
    pub access_mode: AccessMode,
    /// Device path relative to the server's search path, without the NUL
    /// (1..=254 bytes).
    pub dev_name: &'a [u8],
}

impl<'a> Open<'a> {
    /// Size on the wire.
    pub const LEN: usize = OPEN_LEN;
    /// Size of the `dev_name` field.
    pub const DEV_NAME_LEN: usize = 255;

    /// Writes the 264 bytes into `out`.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`]; [`EncodeError::BadString`] for a name that is
    /// empty, contains NUL or does not fit with its NUL.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        check_c_name(self.dev_name, Self::DEV_NAME_LEN, "rnbd_open", "dev_name")?;
        let b = start::<OPEN_LEN>(out, RnbdMsgType::Open, "rnbd_open")?;
        b[4] = self.access_mode as u8;
        b[6..6 + self.dev_name.len()].copy_from_slice(self.dev_name);
        Ok(Self::LEN)
    }

    /// Decodes an OPEN (at least 264 bytes): type 2, access mode 0..=2, a non-empty
    /// `dev_name` NUL-terminated within its 255 bytes. Path policy (`..`, the search
    /// path) is the server's business.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field.
    pub fn decode(buf: &'a [u8]) -> Result<Open<'a>, DecodeError> {
        let b = fixed::<OPEN_LEN>(buf, RnbdMsgType::Open, "rnbd_open")?;
        let access_mode = AccessMode::from_u8(b[4]).ok_or(DecodeError::field(
            "rnbd_open",
            "access_mode",
            b[4],
            Expected::Range(0, 2),
        ))?;
        let dev_name = c_name(&b[6..6 + Self::DEV_NAME_LEN], "rnbd_open", "dev_name")?;
        Ok(Open {
            access_mode,
            dev_name,
        })
    }

    /// The device name as text, if it is UTF-8.
    pub fn dev_name_str(&self) -> Option<&'a str> {
        core::str::from_utf8(self.dev_name).ok()
    }
}

/// `cache_policy` bits of OPEN_RSP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct CachePolicy {
    /// `RNBD_FUA` (bit 0): the device honours FUA.
    pub fua: bool,
    /// `RNBD_WRITEBACK` (bit 1): the device has a volatile write cache.
    pub writeback: bool,
}

impl CachePolicy {
    /// The wire byte.
    pub fn bits(self) -> u8 {
        u8::from(self.fua) | (u8::from(self.writeback) << 1)
    }

    /// From the wire byte; unknown bits are ignored.
    pub fn from_bits(v: u8) -> CachePolicy {
        CachePolicy {
            fua: v & 1 != 0,
            writeback: v & 2 != 0,
        }
    }
}

/// `rnbd_msg_open_rsp`: the mapped device's id and queue limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct OpenRsp {
    /// Id to use in IO and CLOSE.
    pub device_id: u32,
    /// Capacity in 512-byte sectors.
    pub nsectors: u64,
    /// Backing queue max_hw_sectors (the Linux client ignores it).
    pub max_hw_sectors: u32,
    /// Op-5 limit in sectors: `max_write_zeroes_sectors` since Linux 6.8,
    /// `max_write_same_sectors` before 5.18 (sent as 0 from 5.18 to 6.7).
    pub max_write_zeroes_sectors: u32,
    /// Discard limit in sectors.
    pub max_discard_sectors: u32,
    /// Discard granularity in bytes.
    pub discard_granularity: u32,
    /// Discard alignment in bytes.
    pub discard_alignment: u32,
    /// Physical block size in bytes (>= logical).
    pub physical_block_size: u16,
    /// Logical block size in bytes (a power of two, >= 512).
    pub logical_block_size: u16,
    /// Backing max_segments (the Linux client ignores it).
    pub max_segments: u16,
    /// Max secure-erase sectors truncated to 16 bits; used as a boolean.
    pub secure_discard: u16,
    /// FUA / write-back flags.
    pub cache_policy: CachePolicy,
}

impl OpenRsp {
    /// Size on the wire.
    pub const LEN: usize = 56;

    fn check(&self) -> Result<(), (&'static str, i64, Expected)> {
        let lbs = self.logical_block_size;
        if lbs < 512 || !lbs.is_power_of_two() {
            return Err((
                "logical_block_size",
                lbs.into(),
                Expected::PowerOfTwo(512, 32768),
            ));
        }
        if self.physical_block_size < lbs {
            return Err((
                "physical_block_size",
                self.physical_block_size.into(),
                Expected::AtLeast(lbs.into()),
            ));
        }
        Ok(())
    }

    /// Writes the 56 bytes into `out` (reserved bytes and `obsolete_rotational` zero).
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`] (the READ data area is too small);
    /// [`EncodeError::BadValue`] for block sizes a client refuses.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        self.check()
            .map_err(|(f, v, e)| EncodeError::value("rnbd_open_rsp", f, v, e))?;
        let b = start::<{ Self::LEN }>(out, RnbdMsgType::OpenRsp, "rnbd_open_rsp")?;
        put_u32(b, 4, self.device_id);
        put_u64(b, 8, self.nsectors);
        put_u32(b, 16, self.max_hw_sectors);
        put_u32(b, 20, self.max_write_zeroes_sectors);
        put_u32(b, 24, self.max_discard_sectors);
        put_u32(b, 28, self.discard_granularity);
        put_u32(b, 32, self.discard_alignment);
        put_u16(b, 36, self.physical_block_size);
        put_u16(b, 38, self.logical_block_size);
        put_u16(b, 40, self.max_segments);
        put_u16(b, 42, self.secure_discard);
        b[45] = self.cache_policy.bits();
        Ok(Self::LEN)
    }

    /// Decodes an OPEN_RSP (at least 56 bytes): type 3, logical block size a power of
    /// two >= 512, physical >= logical. `obsolete_rotational`, unknown cache-policy bits
    /// and the reserved bytes are ignored (old servers left stale data there).
    ///
    /// # Errors
    /// [`DecodeError`] naming the field; the client fails the map (−EINVAL).
    pub fn decode(buf: &[u8]) -> Result<OpenRsp, DecodeError> {
        let b = fixed::<{ Self::LEN }>(buf, RnbdMsgType::OpenRsp, "rnbd_open_rsp")?;
        let rsp = OpenRsp {
            device_id: get_u32(b, 4),
            nsectors: get_u64(b, 8),
            max_hw_sectors: get_u32(b, 16),
            max_write_zeroes_sectors: get_u32(b, 20),
            max_discard_sectors: get_u32(b, 24),
            discard_granularity: get_u32(b, 28),
            discard_alignment: get_u32(b, 32),
            physical_block_size: get_u16(b, 36),
            logical_block_size: get_u16(b, 38),
            max_segments: get_u16(b, 40),
            secure_discard: get_u16(b, 42),
            cache_policy: CachePolicy::from_bits(b[45]),
        };
        rsp.check()
            .map_err(|(f, v, e)| DecodeError::field("rnbd_open_rsp", f, v, e))?;
        Ok(rsp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::error::BadString;

    fn rsp() -> OpenRsp {
        OpenRsp {
            device_id: 1,
            nsectors: 2048,
            logical_block_size: 512,
            physical_block_size: 4096,
            ..OpenRsp::default()
        }
    }

    #[test]
    fn open_checks() {
        let mut b = [0u8; 264];
        let o = Open {
            access_mode: AccessMode::Migration,
            dev_name: b"nvme0n1",
        };
        o.encode(&mut b).unwrap();
        assert_eq!(Open::decode(&b), Ok(o));
        assert_eq!(Open::decode(&b).unwrap().dev_name_str(), Some("nvme0n1"));
        assert!(Open::decode(&b[..263]).is_err());
        let mut t = b;
        t[4] = 3;
        assert_eq!(
            Open::decode(&t).unwrap_err().field_name(),
            Some("access_mode")
        );
        let mut t = b;
        t[6..261].fill(b'x');
        assert!(matches!(
            Open::decode(&t),
            Err(DecodeError::BadString(BadString { pos: 255, .. }))
        ));
        t[260] = 0;
        assert_eq!(Open::decode(&t).unwrap().dev_name.len(), 254);
        let mut t = b;
        t[6] = 0;
        assert!(Open::decode(&t).is_err());
        let mut t = b;
        t[5] = 0xff; // resv1 and reserved tail ignored
        t[263] = 0xff;
        assert!(Open::decode(&t).is_ok());
        let long = [b'a'; 255];
        let o = Open {
            access_mode: AccessMode::ReadOnly,
            dev_name: &long,
        };
        assert!(o.encode(&mut [0; 264]).is_err());
        let o = Open {
            dev_name: &long[..254],
            ..o
        };
        assert!(o.encode(&mut [0; 264]).is_ok());
        assert!(o.encode(&mut [0; 263]).is_err());
        assert_eq!(AccessMode::Migration.as_str(), "migration");
    }

    #[test]
    fn open_rsp_checks() {
        let mut b = [0u8; 56];
        rsp().encode(&mut b).unwrap();
        assert_eq!(OpenRsp::decode(&b), Ok(rsp()));
        let bad = |f: fn(&mut OpenRsp)| {
            let mut r = rsp();
            f(&mut r);
            let mut b = [0u8; 56];
            // Build the bytes by hand from a good message so encode's check is bypassed.
            rsp().encode(&mut b).unwrap();
            put_u16(&mut b, 36, r.physical_block_size);
            put_u16(&mut b, 38, r.logical_block_size);
            assert!(r.encode(&mut [0; 56]).is_err());
            OpenRsp::decode(&b).unwrap_err().field_name()
        };
        assert_eq!(
            bad(|r| r.logical_block_size = 0),
            Some("logical_block_size")
        );
        assert_eq!(
            bad(|r| r.logical_block_size = 256),
            Some("logical_block_size")
        );
        assert_eq!(
            bad(|r| r.logical_block_size = 1536),
            Some("logical_block_size")
        );
        assert_eq!(
            bad(|r| r.physical_block_size = 256),
            Some("physical_block_size")
        );
        let mut t = b;
        t[44] = 1;
        t[45] = 0xfc; // unknown cache bits ignored
        t[46..].fill(0xee);
        assert_eq!(OpenRsp::decode(&t), Ok(rsp()));
        t[0] = 2;
        assert_eq!(OpenRsp::decode(&t).unwrap_err().field_name(), Some("type"));
        assert!(OpenRsp::decode(&b[..55]).is_err());
        assert!(rsp().encode(&mut [0; 55]).is_err());
    }
}
