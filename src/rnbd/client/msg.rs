//! What the RNBD client sends and what it learns from the replies: SESS_INFO, OPEN,
//! CLOSE and IO user headers (`send_msg_sess_info`, `send_msg_open`, `send_msg_close`,
//! `rnbd_client_xfer_request` with `rq_to_rnbd_flags` in the kernel's `rnbd-clt.c`), and
//! the device's limits from OPEN_RSP (`rnbd_clt_setup_gen_disk` and friends).

use super::config::WriteZeroesMode;
use crate::proto::rnbd::{Close, OpenRsp, RnbdFlags, RnbdOp, SessInfo, RNBD_PROTO_VER_MAJOR};
use crate::rnbd::backend::SECTOR_SIZE;
use crate::rnbd::Dir;

/// SESS_INFO's user header (36 bytes, version 2), sent as an RTRS READ with a 36-byte
/// reply buffer on the admin connection.
pub fn sess_info() -> [u8; SessInfo::LEN] {
    SessInfo {
        ver: RNBD_PROTO_VER_MAJOR,
    }
    .to_bytes()
}

/// CLOSE's user header (8 bytes), sent as an RTRS WRITE without data.
pub fn close(device_id: u32) -> [u8; Close::LEN] {
    Close { device_id }.to_bytes()
}

/// Flags of a block request, as a block layer states them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ReqFlags {
    /// Durable on completion.
    pub fua: bool,
    /// Flush the cache first.
    pub preflush: bool,
    /// Synchronous (a hint).
    pub sync: bool,
    /// Write-zeroes must not deallocate.
    pub nounmap: bool,
}

impl ReqFlags {
    /// The `RNBD_F_*` bits: FUA for FUA *or* PREFLUSH (old servers know only FUA),
    /// PREFLUSH (2.1), SYNC, NOUNMAP (2.2, write-zeroes only).
    pub fn wire(self, op: RnbdOp) -> RnbdFlags {
        let mut f = RnbdFlags::NONE;
        if self.fua || self.preflush {
            f |= RnbdFlags::FUA;
        }
        if self.preflush {
            f |= RnbdFlags::PREFLUSH;
        }
        if self.sync {
            f |= RnbdFlags::SYNC;
        }
        if self.nounmap && op == RnbdOp::WriteZeroes {
            f |= RnbdFlags::NOUNMAP;
        }
        f
    }
}

/// One block request on a device: byte offset and length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockRequest {
    pub op: RnbdOp,
    pub offset: u64,
    /// Bytes: the data length of a read or write, the range of a discard/write-zeroes,
    /// 0 for a flush.
    pub len: u32,
    pub flags: ReqFlags,
    /// I/O priority (`ioprio`), 0 for none.
    pub prio: u16,
}

impl BlockRequest {
    fn new(op: RnbdOp, offset: u64, len: u32) -> BlockRequest {
        BlockRequest {
            op,
            offset,
            len,
            flags: ReqFlags::default(),
            prio: 0,
        }
    }

    pub fn read(offset: u64, len: u32) -> BlockRequest {
        BlockRequest::new(RnbdOp::Read, offset, len)
    }

    pub fn write(offset: u64, len: u32) -> BlockRequest {
        BlockRequest::new(RnbdOp::Write, offset, len)
    }

    /// A cache flush: sent as the kernel's block layer sends one (FLUSH with
    /// PREFLUSH, hence FUA on the wire too).
    pub fn flush() -> BlockRequest {
        BlockRequest::new(RnbdOp::Flush, 0, 0).preflush()
    }

    pub fn discard(offset: u64, len: u32) -> BlockRequest {
        BlockRequest::new(RnbdOp::Discard, offset, len)
    }

    pub fn secure_erase(offset: u64, len: u32) -> BlockRequest {
        BlockRequest::new(RnbdOp::SecureErase, offset, len)
    }

    pub fn write_zeroes(offset: u64, len: u32) -> BlockRequest {
        BlockRequest::new(RnbdOp::WriteZeroes, offset, len)
    }

    pub fn fua(mut self) -> BlockRequest {
        self.flags.fua = true;
        self
    }

    pub fn preflush(mut self) -> BlockRequest {
        self.flags.preflush = true;
        self
    }

    pub fn sync(mut self) -> BlockRequest {
        self.flags.sync = true;
        self
    }

    pub fn nounmap(mut self) -> BlockRequest {
        self.flags.nounmap = true;
        self
    }

    /// The RTRS direction (`rq_data_dir`): WRITE for write, discard, secure erase and
    /// write-zeroes; READ for read and flush.
    pub fn dir(&self) -> Dir {
        if self.op.is_rtrs_write() {
            Dir::Write
        } else {
            Dir::Read
        }
    }

    /// Bytes of data the request carries (its scatter-gather list's total): `len` for
    /// reads and writes, 0 for the rest.
    pub fn data_len(&self) -> u32 {
        if self.op.has_data() {
            self.len
        } else {
            0
        }
    }
}

/// A mapped device as the client sees it: OPEN_RSP turned into queue limits, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceInfo {
    pub device_id: u32,
    /// Capacity in bytes (`nsectors` × 512).
    pub size: u64,
    pub logical_block_size: u32,
    pub physical_block_size: u32,
    /// Largest read or write: the RTRS session's `max_io_size`, further limited by the
    /// server's `max_hw_sectors` when it reports one (the kernel ignores the latter),
    /// rounded down to the logical block size.
    pub max_io_size: u32,
    /// Largest discard; 0 when the device has none.
    pub max_discard: u64,
    pub discard_granularity: u32,
    pub discard_alignment: u32,
    /// Largest write-zeroes the client takes, by the device's mode
    /// ([`RnbdDevice::write_zeroes`](super::RnbdDevice::write_zeroes)): with
    /// [`WriteZeroesMode::Native`] the server's op-5 limit (0: unsupported), with [`WriteZeroesMode::Emulate`] any
    /// request (the largest multiple of the block below 4 GiB), sent as WRITEs.
    pub max_write_zeroes: u64,
    /// The op-5 limit the server announced (byte 20 of OPEN_RSP), whatever the mode.
    pub server_max_write_zeroes: u64,
    /// Largest secure erase: the discard limit when the server reports secure discard.
    pub max_secure_erase: u64,
    /// The device has a volatile write cache (flushes matter).
    pub write_cache: bool,
    /// FUA is honoured (only with a write cache, as the kernel client decides).
    pub fua: bool,
    /// The server's largest transfer when it, not the session, limits reads and writes
    /// (`max_io_size`, the boundary at which the server's device splits requests: an
    /// SPDK export's optimal IO boundary); 0 otherwise.
    pub io_boundary: u32,
}

impl DeviceInfo {
    /// Limits from a decoded OPEN_RSP (block sizes already checked by its decoder), the
    /// session's `max_io_size` and how write-zeroes are sent.
    pub fn from_open_rsp(
        rsp: &OpenRsp,
        session_max_io: u32,
        write_zeroes: WriteZeroesMode,
    ) -> DeviceInfo {
        let lbs = u32::from(rsp.logical_block_size);
        let server_max = u64::from(rsp.max_hw_sectors) * SECTOR_SIZE;
        let mut max_io = u64::from(session_max_io);
        if server_max != 0 {
            max_io = max_io.min(server_max);
        }
        let limited = server_max != 0 && server_max < u64::from(session_max_io);
        let max_io = (max_io / u64::from(lbs) * u64::from(lbs)) as u32;
        let max_discard = u64::from(rsp.max_discard_sectors) * SECTOR_SIZE;
        let writeback = rsp.cache_policy.writeback;
        let server_wz = u64::from(rsp.max_write_zeroes_sectors) * SECTOR_SIZE;
        DeviceInfo {
            device_id: rsp.device_id,
            size: rsp.nsectors.saturating_mul(SECTOR_SIZE),
            logical_block_size: lbs,
            physical_block_size: u32::from(rsp.physical_block_size),
            max_io_size: max_io,
            max_discard,
            discard_granularity: rsp.discard_granularity,
            discard_alignment: rsp.discard_alignment,
            max_write_zeroes: match write_zeroes {
                WriteZeroesMode::Native => server_wz,
                WriteZeroesMode::Emulate => u64::from(u32::MAX / lbs * lbs),
            },
            server_max_write_zeroes: server_wz,
            max_secure_erase: if rsp.secure_discard != 0 {
                max_discard
            } else {
                0
            },
            write_cache: writeback,
            fua: writeback && rsp.cache_policy.fua,
            io_boundary: if limited { max_io } else { 0 },
        }
    }

    /// Size in 512-byte sectors.
    pub fn nsectors(&self) -> u64 {
        self.size / SECTOR_SIZE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rnbd::{CachePolicy, SessInfoRsp};

    #[test]
    fn headers() {
        let s = sess_info();
        assert_eq!(&s[..5], &[0, 0, 0, 0, 2]);
        assert!(s[5..].iter().all(|&b| b == 0));
        assert_eq!(SessInfo::decode(&s).unwrap().ver, 2);
        assert!(SessInfoRsp::decode(&s).is_err());
        assert_eq!(close(0x0102_0304), [5, 0, 0, 0, 4, 3, 2, 1]);
    }

    #[test]
    fn flags_and_directions() {
        let f = BlockRequest::flush();
        assert_eq!(f.dir(), Dir::Read);
        assert_eq!(f.flags.wire(f.op), RnbdFlags::FUA | RnbdFlags::PREFLUSH);
        let w = BlockRequest::write(0, 4096).sync();
        assert_eq!(w.flags.wire(w.op), RnbdFlags::SYNC);
        assert_eq!((w.dir(), w.data_len()), (Dir::Write, 4096));
        let z = BlockRequest::write_zeroes(0, 4096).nounmap();
        assert_eq!(z.flags.wire(z.op), RnbdFlags::NOUNMAP);
        assert_eq!((z.dir(), z.data_len()), (Dir::Write, 0));
        let d = BlockRequest::discard(0, 4096).nounmap();
        assert_eq!(d.flags.wire(d.op), RnbdFlags::NONE);
        let r = BlockRequest::read(0, 512).fua();
        assert_eq!(r.dir(), Dir::Read);
        assert_eq!(r.flags.wire(r.op), RnbdFlags::FUA);
    }

    #[test]
    fn device_info_from_open_rsp() {
        let rsp = OpenRsp {
            device_id: 3,
            nsectors: 1 << 21,
            max_hw_sectors: 256,
            max_write_zeroes_sectors: 2048,
            max_discard_sectors: 4096,
            discard_granularity: 4096,
            discard_alignment: 0,
            physical_block_size: 4096,
            logical_block_size: 4096,
            max_segments: 128,
            secure_discard: 1,
            cache_policy: CachePolicy {
                fua: true,
                writeback: false,
            },
        };
        let i = DeviceInfo::from_open_rsp(&rsp, 1 << 20, WriteZeroesMode::Native);
        assert_eq!(i.size, 1 << 30);
        assert_eq!(i.nsectors(), 1 << 21);
        assert_eq!(i.max_io_size, 128 << 10);
        assert_eq!(i.io_boundary, 128 << 10, "the server's limit binds");
        assert_eq!((i.max_discard, i.max_secure_erase), (2 << 20, 2 << 20));
        assert_eq!(
            (i.max_write_zeroes, i.server_max_write_zeroes),
            (1 << 20, 1 << 20)
        );
        // Emulated write-zeroes take any request, whatever the server offers.
        let e = DeviceInfo::from_open_rsp(&rsp, 1 << 20, WriteZeroesMode::Emulate);
        assert_eq!(e.max_write_zeroes, u64::from(u32::MAX / 4096 * 4096));
        assert_eq!(e.server_max_write_zeroes, 1 << 20);
        // FUA only counts with write-back caching.
        assert!(!i.fua && !i.write_cache);
        let i = DeviceInfo::from_open_rsp(
            &OpenRsp {
                max_hw_sectors: 0,
                secure_discard: 0,
                cache_policy: CachePolicy {
                    fua: true,
                    writeback: true,
                },
                ..rsp
            },
            100_000,
            WriteZeroesMode::Native,
        );
        assert_eq!(i.max_io_size, 98_304);
        assert_eq!(i.io_boundary, 0, "the session's limit binds");
        assert_eq!(i.max_secure_erase, 0);
        assert!(i.fua && i.write_cache);
    }
}
