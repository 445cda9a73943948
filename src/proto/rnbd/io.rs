//! RNBD IO (`rnbd_msg_io`): the user header of every block request, with the `rw` word
//! (op in bits 7..0, `RNBD_F_*` flags above), as built by `rnbd_client_xfer_request`
//! and read by `process_rdma` / `rnbd_to_bio_flags` in the kernel.
//! See docs/PROTOCOL.md §2.10, §7.3 and §9.8.

use core::ops::{BitOr, BitOrAssign};

use super::{fixed, start, RnbdMsgType};
use crate::proto::error::{DecodeError, EncodeError, Expected};
use crate::proto::wire::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};

const _: () = assert!(Io::LEN == 32 && Io::MIN_LEN == 24 && Io::NATURAL_LEN == 26);
const _: () = assert!(Io::MIN_LEN == 4 + 4 + 8 + 4 + 4);

/// `enum rnbd_io_flags` operation codes (bits 7..0 of `rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RnbdOp {
    /// Read.
    Read = 0,
    /// Write.
    Write = 1,
    /// Flush (the server runs an empty write with preflush).
    Flush = 2,
    /// Discard.
    Discard = 3,
    /// Secure erase.
    SecureErase = 4,
    /// Op 5: `RNBD_OP_WRITE_ZEROES` since Linux 6.8 (no data); before 5.18 the same
    /// code was `RNBD_OP_WRITE_SAME`, which carries one logical block of data to repeat
    /// over the range (5.18 to 6.7 do not use it). The wire version does not tell them
    /// apart; the presence of data does (see `rnbd::server`'s dispatcher).
    WriteZeroes = 5,
}

impl RnbdOp {
    /// Maps a wire code to an op.
    pub fn from_u8(v: u8) -> Option<RnbdOp> {
        Some(match v {
            0 => RnbdOp::Read,
            1 => RnbdOp::Write,
            2 => RnbdOp::Flush,
            3 => RnbdOp::Discard,
            4 => RnbdOp::SecureErase,
            5 => RnbdOp::WriteZeroes,
            _ => return None,
        })
    }

    /// The RTRS direction the Linux client uses (`rq_data_dir`, odd block-layer op
    /// codes): WRITE for write, discard, secure erase and write zeroes; READ for read
    /// and flush (a flush is an RTRS READ without descriptors).
    pub fn is_rtrs_write(self) -> bool {
        !matches!(self, RnbdOp::Read | RnbdOp::Flush)
    }

    /// Ops that carry data in the chunk (READ reply or WRITE payload).
    pub fn has_data(self) -> bool {
        matches!(self, RnbdOp::Read | RnbdOp::Write)
    }
}

/// `RNBD_F_*` flags (bits 8.. of `rw`). Unknown bits are dropped on decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RnbdFlags(u32);

impl RnbdFlags {
    /// No flags.
    pub const NONE: RnbdFlags = RnbdFlags(0);
    /// `RNBD_F_SYNC` (2.0): synchronous request.
    pub const SYNC: RnbdFlags = RnbdFlags(1 << 8);
    /// `RNBD_F_FUA` (2.0): set for FUA or PREFLUSH requests.
    pub const FUA: RnbdFlags = RnbdFlags(1 << 9);
    /// `RNBD_F_PREFLUSH` (2.1): flush the cache before the request.
    pub const PREFLUSH: RnbdFlags = RnbdFlags(1 << 10);
    /// `RNBD_F_NOUNMAP` (2.2): with WRITE_ZEROES, do not deallocate.
    pub const NOUNMAP: RnbdFlags = RnbdFlags(1 << 11);
    /// Every known flag.
    pub const ALL: RnbdFlags = RnbdFlags(0xF00);

    /// The bits as in `rw`.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Keeps only the known flag bits of `rw`.
    pub const fn from_rw_truncate(rw: u32) -> RnbdFlags {
        RnbdFlags(rw & Self::ALL.0)
    }

    /// True if every flag of `other` is set.
    pub const fn contains(self, other: RnbdFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for RnbdFlags {
    type Output = RnbdFlags;
    fn bitor(self, rhs: RnbdFlags) -> RnbdFlags {
        RnbdFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for RnbdFlags {
    fn bitor_assign(&mut self, rhs: RnbdFlags) {
        self.0 |= rhs.0;
    }
}

/// `rnbd_msg_io`: one block request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Io {
    /// Id from OPEN_RSP.
    pub device_id: u32,
    /// Start in 512-byte sectors.
    pub sector: u64,
    /// Operation.
    pub op: RnbdOp,
    /// Flags.
    pub flags: RnbdFlags,
    /// Bytes affected (for data-less ops, the only size information).
    pub bi_size: u32,
    /// I/O priority (`ioprio`); 0 when the header is shorter than 32 bytes.
    pub prio: u16,
}

impl Io {
    /// Size we send: the C structure on 64-bit ABIs, padding zeroed.
    pub const LEN: usize = 32;
    /// Smallest header accepted (the layout before `prio` existed).
    pub const MIN_LEN: usize = 24;
    /// Size of the fields without tail padding.
    pub const NATURAL_LEN: usize = 26;

    /// The `rw` word.
    pub const fn rw(&self) -> u32 {
        self.op as u32 | self.flags.bits()
    }

    /// The 32 bytes.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0; Self::LEN];
        put_u16(&mut b, 0, RnbdMsgType::Io as u16);
        put_u32(&mut b, 4, self.device_id);
        put_u64(&mut b, 8, self.sector);
        put_u32(&mut b, 16, self.rw());
        put_u32(&mut b, 20, self.bi_size);
        put_u16(&mut b, 24, self.prio);
        b
    }

    /// Writes the 32 bytes into `out`.
    ///
    /// # Errors
    /// [`EncodeError::BufferTooSmall`].
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        let b = start::<{ Self::LEN }>(out, RnbdMsgType::Io, "rnbd_io")?;
        *b = self.to_bytes();
        Ok(Self::LEN)
    }

    /// Decodes an IO header of at least 24 bytes: type 4, op 0..=5. `prio` is read only
    /// from a header of 32 bytes or more (as the kernel server does); unknown flag bits
    /// and the padding are ignored.
    ///
    /// # Errors
    /// [`DecodeError`] naming the field; the server answers −EINVAL.
    pub fn decode(buf: &[u8]) -> Result<Io, DecodeError> {
        let b = fixed::<{ Self::MIN_LEN }>(buf, RnbdMsgType::Io, "rnbd_io")?;
        let rw = get_u32(b, 16);
        let code = (rw & 0xff) as u8;
        let op = RnbdOp::from_u8(code).ok_or(DecodeError::field(
            "rnbd_io",
            "op",
            code,
            Expected::Range(0, 5),
        ))?;
        let prio = if buf.len() >= Self::LEN {
            get_u16(buf, 24)
        } else {
            0
        };
        Ok(Io {
            device_id: get_u32(b, 4),
            sector: get_u64(b, 8),
            op,
            flags: RnbdFlags::from_rw_truncate(rw),
            bi_size: get_u32(b, 20),
            prio,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> Io {
        Io {
            device_id: 2,
            sector: 8,
            op: RnbdOp::Write,
            flags: RnbdFlags::SYNC | RnbdFlags::FUA,
            bi_size: 4096,
            prio: 0x4003,
        }
    }

    #[test]
    fn io_lengths_and_prio() {
        let b = io().to_bytes();
        assert_eq!(Io::decode(&b), Ok(io()));
        assert_eq!(Io::decode(&b[..31]).unwrap().prio, 0);
        assert_eq!(Io::decode(&b[..24]).unwrap().prio, 0);
        assert!(matches!(
            Io::decode(&b[..23]),
            Err(DecodeError::Truncated { .. })
        ));
        let mut longer = [0u8; 40];
        longer[..32].copy_from_slice(&b);
        assert_eq!(Io::decode(&longer), Ok(io()));
        assert!(io().encode(&mut [0; 31]).is_err());
    }

    #[test]
    fn io_op_and_flags() {
        let mut b = io().to_bytes();
        b[16] = 6;
        assert_eq!(Io::decode(&b).unwrap_err().field_name(), Some("op"));
        b[16] = 5;
        b[18] = 0xff; // unknown flag bits 16..23 ignored
        b[17] = 0xff;
        let d = Io::decode(&b).unwrap();
        assert_eq!(d.op, RnbdOp::WriteZeroes);
        assert_eq!(d.flags, RnbdFlags::ALL);
        assert!(d.flags.contains(RnbdFlags::NOUNMAP | RnbdFlags::PREFLUSH));
        let mut f = RnbdFlags::NONE;
        f |= RnbdFlags::PREFLUSH;
        assert!(!f.contains(RnbdFlags::SYNC));
        let dirs: Vec<bool> = (0..6)
            .map(|c| RnbdOp::from_u8(c).unwrap().is_rtrs_write())
            .collect();
        assert_eq!(dirs, [false, true, false, true, true, true]);
        assert!(RnbdOp::Read.has_data() && !RnbdOp::Flush.has_data());
    }
}
