//! One mapped RNBD device on the client, as a state machine free of any transport: it
//! builds OPEN / IO / CLOSE user headers and digests OPEN_RSP. The kernel's
//! `rnbd_clt_dev` with `rnbd_clt_map_device`, `process_msg_open_rsp`,
//! `rnbd_clt_unmap_device` and the remap after `RTRS_CLT_LINK_EV_RECONNECTED`
//! (`rnbd_clt_remap_device`).
//!
//! States (docs/PROTOCOL.md §7.2): INIT → (OPEN_RSP) → MAPPED ⇄ MAPPED_DISCONNECTED (link
//! down / re-open adopting the new device id) → UNMAPPED. Two more of our own: CLOSED BY
//! THE SERVER (the target's operator closed the mapping, the kernel server's
//! `force_close`: IO fails until a re-open), and LOST (no path came back within the
//! session's loss timeout: IO fails until the device is unmapped).

use std::fmt;

use super::config::WriteZeroesMode;
use super::msg::{BlockRequest, DeviceInfo};
use crate::proto::rnbd::{AccessMode, Io, Open, OpenRsp, RnbdOp, SessInfoRsp};
use crate::proto::DecodeError;
use crate::rnbd::backend::{MAX_NAME_LEN, SECTOR_SIZE};
use crate::rnbd::Dir;
use crate::Errno;

/// `rnbd_clt_dev_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DevState {
    /// Created, OPEN not answered yet.
    Init,
    /// Open: IO may be sent.
    Mapped,
    /// The session lost every path; the device waits for a re-open.
    MappedDisconnected,
    /// The server closed the mapping while the session stayed up (an operator's forced
    /// close): IO fails; a re-open (on request, or after a reconnect) may map it again.
    ServerClosed,
    /// No path came back within the loss timeout: IO fails at once, nothing re-opens it.
    Lost,
    /// Closed for good.
    Unmapped,
}

impl fmt::Display for DevState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DevState::Init => "init",
            DevState::Mapped => "open",
            DevState::MappedDisconnected => "closed (disconnected)",
            DevState::ServerClosed => "closed by the server",
            DevState::Lost => "lost (no path within the loss timeout)",
            DevState::Unmapped => "unmapped",
        })
    }
}

/// Why a device operation failed on the client.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    #[error("device name '{name}': {why}")]
    BadName { name: String, why: &'static str },
    #[error("server refused {what} of device '{name}': {}", errno_name(*errno))]
    Refused {
        what: &'static str,
        name: String,
        errno: Errno,
    },
    /// A malformed reply. For OPEN_RSP, `device_id` is the id the server assigned (if
    /// readable), which the client should CLOSE as the kernel does.
    #[error("bad {what} from the server: {source}")]
    BadReply {
        what: &'static str,
        device_id: Option<u32>,
        source: DecodeError,
    },
    #[error("device '{name}' is {state}, not open")]
    NotMapped { name: String, state: DevState },
    #[error("device '{name}' is read-only: {op} refused")]
    ReadOnly { name: String, op: &'static str },
    #[error("{op} at offset {offset} of {len} bytes is not aligned to the {block_size}-byte logical block")]
    Misaligned {
        op: &'static str,
        offset: u64,
        len: u32,
        block_size: u32,
    },
    #[error("{op} at offset {offset} of {len} bytes ends beyond the device's {size} bytes")]
    OutOfRange {
        op: &'static str,
        offset: u64,
        len: u32,
        size: u64,
    },
    #[error("{op} of {len} bytes exceeds the device's limit of {max} bytes")]
    TooLarge {
        op: &'static str,
        len: u32,
        max: u64,
    },
    #[error("{op} is not supported by the device")]
    Unsupported { op: &'static str },
    #[error("{op} of zero bytes")]
    ZeroLength { op: &'static str },
    #[error("admin reply buffer of {len} bytes is too small (at least 64 needed)")]
    ReplyBuffer { len: usize },
    #[error("device '{name}' is already open in this session")]
    AlreadyOpen { name: String },
    /// A re-open asked for while an OPEN of the device is still out.
    #[error("device '{name}': an OPEN of it is already in flight")]
    Opening { name: String },
    /// [`RnbdDevice::io_msg`] of a write-zeroes the device sends as WRITEs
    /// ([`WriteZeroesMode::Emulate`]); the client's `submit` does that.
    #[error("write zeroes on device '{name}' is sent as zero-filled writes (write_zeroes emulate), never as op 5")]
    Emulated { name: String },
    /// The session could not carry the request (never connected and refused by the
    /// target, or closed): nothing reached the server. `what` names the request and
    /// device, `reason` is the session's.
    #[error("{what}: {reason}")]
    NotSent {
        what: String,
        errno: Errno,
        reason: String,
    },
}

impl DeviceError {
    /// The errno for a block layer: the server's, or the local equivalent.
    pub fn errno(&self) -> Errno {
        match self {
            DeviceError::Refused { errno, .. } | DeviceError::NotSent { errno, .. } => *errno,
            DeviceError::NotMapped { .. } => Errno::ENOTCONN,
            DeviceError::ReadOnly { .. } => Errno::EROFS,
            DeviceError::OutOfRange { .. } => Errno::EIO,
            DeviceError::Unsupported { .. } => Errno::EOPNOTSUPP,
            DeviceError::AlreadyOpen { .. } => Errno::EEXIST,
            DeviceError::Opening { .. } => Errno::EBUSY,
            DeviceError::BadName { .. }
            | DeviceError::BadReply { .. }
            | DeviceError::Misaligned { .. }
            | DeviceError::TooLarge { .. }
            | DeviceError::ZeroLength { .. }
            | DeviceError::Emulated { .. }
            | DeviceError::ReplyBuffer { .. } => Errno::EINVAL,
        }
    }
}

fn errno_name(errno: Errno) -> String {
    let name = match errno {
        Errno::ENOENT => "ENOENT (no such export)",
        Errno::EPERM => "EPERM (access mode refused: the export has its writers)",
        Errno::EACCES => {
            "EACCES (access denied: this host is not allowed to open it, or it is exported read-only)"
        }
        Errno::EINVAL => "EINVAL (invalid request)",
        Errno::ENOTCONN => "ENOTCONN (device not open on the server)",
        Errno::EBUSY => "EBUSY (the export's device is held by someone else)",
        Errno::ENOMEM => "ENOMEM (out of memory on the server)",
        Errno::EIO => "EIO",
        Errno::EROFS => "EROFS (read-only mapping)",
        Errno::EOPNOTSUPP => "EOPNOTSUPP (not supported)",
        _ => return format!("errno {}", errno.neg()),
    };
    format!("-{name}")
}

/// Checks a `dev_name` for OPEN: 1..=254 bytes, no NUL.
///
/// # Errors
/// [`DeviceError::BadName`].
pub fn check_dev_name(name: &str) -> Result<(), DeviceError> {
    let why = if name.is_empty() {
        "empty"
    } else if name.len() > MAX_NAME_LEN {
        "longer than 254 bytes"
    } else if name.contains('\0') {
        "contains a NUL byte"
    } else {
        return Ok(());
    };
    Err(DeviceError::BadName {
        name: name.to_string(),
        why,
    })
}

/// Reads SESS_INFO_RSP: the version both sides use.
///
/// # Errors
/// [`DeviceError::Refused`] for a failed request, [`DeviceError::BadReply`] for a bad
/// reply.
pub fn sess_info_done(result: Result<(), Errno>, reply: &[u8]) -> Result<u8, DeviceError> {
    if let Err(errno) = result {
        return Err(DeviceError::Refused {
            what: "session info",
            name: String::new(),
            errno,
        });
    }
    SessInfoRsp::decode(reply)
        .map(|r| r.negotiated())
        .map_err(|source| DeviceError::BadReply {
            what: "SESS_INFO_RSP",
            device_id: None,
            source,
        })
}

/// One device of a client session.
#[derive(Clone, Debug)]
pub struct RnbdDevice {
    name: String,
    mode: AccessMode,
    state: DevState,
    info: Option<DeviceInfo>,
    /// The session's `max_io_size` (limits reads and writes).
    session_max_io: u32,
    write_zeroes: WriteZeroesMode,
}

impl RnbdDevice {
    /// A device to open by `name` in `mode`, over a session whose requests carry at most
    /// `session_max_io` bytes.
    ///
    /// # Errors
    /// A name OPEN cannot carry ([`check_dev_name`]).
    pub fn new(
        name: &str,
        mode: AccessMode,
        session_max_io: u32,
    ) -> Result<RnbdDevice, DeviceError> {
        check_dev_name(name)?;
        Ok(RnbdDevice {
            name: name.to_string(),
            mode,
            state: DevState::Init,
            info: None,
            session_max_io,
            write_zeroes: WriteZeroesMode::default(),
        })
    }

    /// Sets how write-zeroes go on the wire (default [`WriteZeroesMode::Emulate`]);
    /// the limits in [`info`](Self::info) follow it from the next
    /// [`open_done`](Self::open_done) on.
    pub fn with_write_zeroes(mut self, mode: WriteZeroesMode) -> RnbdDevice {
        self.write_zeroes = mode;
        self
    }

    /// How the device's write-zeroes go on the wire (its own: devices of one session
    /// may differ).
    pub fn write_zeroes(&self) -> WriteZeroesMode {
        self.write_zeroes
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn mode(&self) -> AccessMode {
        self.mode
    }

    pub fn state(&self) -> DevState {
        self.state
    }

    /// Limits from the last OPEN_RSP (kept while disconnected).
    pub fn info(&self) -> Option<&DeviceInfo> {
        self.info.as_ref()
    }

    /// The id to put in IO and CLOSE, while mapped.
    pub fn device_id(&self) -> Option<u32> {
        match self.state {
            DevState::Mapped => self.info.map(|i| i.device_id),
            _ => None,
        }
    }

    /// Updates the session's `max_io_size` (known once RTRS connected), used by the
    /// next [`open_done`](Self::open_done).
    pub fn set_session_max_io(&mut self, max_io: u32) {
        self.session_max_io = max_io;
    }

    /// OPEN's user header (264 bytes), sent as an RTRS READ with a 56-byte reply
    /// buffer: first in INIT, again after a reconnect.
    pub fn open_msg(&self) -> [u8; Open::LEN] {
        let mut b = [0u8; Open::LEN];
        let open = Open {
            access_mode: self.mode,
            dev_name: self.name.as_bytes(),
        };
        // The name was checked by `new` and the buffer is the message's size.
        let n = open.encode(&mut b).unwrap_or(0);
        debug_assert_eq!(n, Open::LEN);
        b
    }

    /// Digests OPEN's answer: on success adopts the (possibly new) device id and
    /// limits and becomes MAPPED; on failure the state stays as it was.
    ///
    /// # Errors
    /// [`DeviceError::Refused`] with the server's errno; [`DeviceError::BadReply`] for
    /// an OPEN_RSP the client cannot use (the kernel then CLOSEs the id it carries);
    /// [`DeviceError::NotMapped`] once unmapped.
    pub fn open_done(
        &mut self,
        result: Result<(), Errno>,
        reply: &[u8],
    ) -> Result<&DeviceInfo, DeviceError> {
        if matches!(self.state, DevState::Unmapped | DevState::Lost) {
            return Err(self.not_mapped());
        }
        if let Err(errno) = result {
            return Err(DeviceError::Refused {
                what: "open",
                name: self.name.clone(),
                errno,
            });
        }
        let rsp = OpenRsp::decode(reply).map_err(|source| DeviceError::BadReply {
            what: "OPEN_RSP",
            device_id: raw_device_id(reply),
            source,
        })?;
        self.state = DevState::Mapped;
        Ok(self.info.insert(DeviceInfo::from_open_rsp(
            &rsp,
            self.session_max_io,
            self.write_zeroes,
        )))
    }

    /// The session lost its last path (`RTRS_CLT_LINK_EV_DISCONNECTED`): IO stops
    /// until [`open_done`](Self::open_done) after a reconnect.
    pub fn link_down(&mut self) {
        if self.state == DevState::Mapped {
            self.state = DevState::MappedDisconnected;
        }
    }

    /// Whether the device waits for a re-open (send [`open_msg`](Self::open_msg) once
    /// the session is connected again): a disconnected one, and one the server closed
    /// (its re-open goes through the server's host list and access rules again).
    pub fn needs_reopen(&self) -> bool {
        matches!(
            self.state,
            DevState::MappedDisconnected | DevState::ServerClosed
        )
    }

    /// The server answered this device's IO with −ENOTCONN while the session stayed up:
    /// it closed the mapping (a forced close). IO fails from now on until a re-open.
    /// Only a mapped device changes.
    pub fn server_closed(&mut self) {
        if self.state == DevState::Mapped {
            self.state = DevState::ServerClosed;
        }
    }

    /// No path came back within the session's loss timeout: IO fails at once and
    /// nothing re-opens the device (it waits to be unmapped).
    pub fn lose(&mut self) {
        if !matches!(self.state, DevState::Unmapped | DevState::Init) {
            self.state = DevState::Lost;
        }
    }

    /// Unmaps the device: returns CLOSE's user header when the server still knows the
    /// id (MAPPED); a disconnected server session has forgotten it already.
    pub fn close(&mut self) -> Option<[u8; 8]> {
        let msg = self.device_id().map(super::msg::close);
        self.state = DevState::Unmapped;
        msg
    }

    /// The IO message (its 32 bytes: [`Io::to_bytes`]) and RTRS direction of `req`,
    /// after checking it against the device: open, writable if it writes, block-aligned,
    /// in range, within the limits. The message's bytes are made where they are sent:
    /// made here and copied out whole, they stalled the copy (docs/BENCHMARKS.md, "Small
    /// values returned through memory").
    ///
    /// # Errors
    /// Why the request cannot be sent; [`DeviceError::errno`] is the block status. A
    /// write-zeroes of a device in [`WriteZeroesMode::Emulate`] is
    /// [`DeviceError::Emulated`]: it has no message of its own.
    pub fn io_msg(&self, req: &BlockRequest) -> Result<(Io, Dir), DeviceError> {
        let info = self.check(req)?;
        if req.op == RnbdOp::WriteZeroes && self.write_zeroes == WriteZeroesMode::Emulate {
            return Err(DeviceError::Emulated {
                name: self.name.clone(),
            });
        }
        let io = Io {
            device_id: info.device_id,
            sector: req.offset / SECTOR_SIZE,
            op: req.op,
            flags: req.flags.wire(req.op),
            bi_size: req.len,
            prio: req.prio,
        };
        Ok((io, req.dir()))
    }

    /// Checks `req` against the device (open, writable if it writes, block-aligned, in
    /// range, within the limits) and returns the device's limits.
    ///
    /// # Errors
    /// As [`io_msg`](Self::io_msg), except that an emulated write-zeroes passes.
    pub fn check(&self, req: &BlockRequest) -> Result<&DeviceInfo, DeviceError> {
        let (Some(info), DevState::Mapped) = (&self.info, self.state) else {
            return Err(self.not_mapped());
        };
        let op = op_name(req.op);
        if self.mode == AccessMode::ReadOnly && req.op.is_rtrs_write() {
            return Err(DeviceError::ReadOnly {
                name: self.name.clone(),
                op,
            });
        }
        if req.op != RnbdOp::Flush {
            check_range(info, req, op)?;
        }
        Ok(info)
    }

    fn not_mapped(&self) -> DeviceError {
        DeviceError::NotMapped {
            name: self.name.clone(),
            state: self.state,
        }
    }
}

fn check_range(info: &DeviceInfo, req: &BlockRequest, op: &'static str) -> Result<(), DeviceError> {
    let max = match req.op {
        RnbdOp::Read | RnbdOp::Write => u64::from(info.max_io_size),
        RnbdOp::Discard => info.max_discard,
        RnbdOp::SecureErase => info.max_secure_erase,
        RnbdOp::WriteZeroes => info.max_write_zeroes,
        RnbdOp::Flush => u64::MAX,
    };
    if max == 0 {
        return Err(DeviceError::Unsupported { op });
    }
    if req.len == 0 {
        return Err(DeviceError::ZeroLength { op });
    }
    let bs = u64::from(info.logical_block_size);
    // A power of two (every block size a kernel exports) is checked with a mask: the
    // two divisions were a visible part of this check per IO.
    let misaligned = if bs.is_power_of_two() {
        (req.offset | u64::from(req.len)) & (bs - 1) != 0
    } else {
        req.offset % bs != 0 || u64::from(req.len) % bs != 0
    };
    if misaligned {
        return Err(DeviceError::Misaligned {
            op,
            offset: req.offset,
            len: req.len,
            block_size: info.logical_block_size,
        });
    }
    if req
        .offset
        .checked_add(u64::from(req.len))
        .map_or(true, |end| end > info.size)
    {
        return Err(DeviceError::OutOfRange {
            op,
            offset: req.offset,
            len: req.len,
            size: info.size,
        });
    }
    if u64::from(req.len) > max {
        return Err(DeviceError::TooLarge {
            op,
            len: req.len,
            max,
        });
    }
    Ok(())
}

fn op_name(op: RnbdOp) -> &'static str {
    match op {
        RnbdOp::Read => "read",
        RnbdOp::Write => "write",
        RnbdOp::Flush => "flush",
        RnbdOp::Discard => "discard",
        RnbdOp::SecureErase => "secure erase",
        RnbdOp::WriteZeroes => "write zeroes",
    }
}

/// The `device_id` of an OPEN_RSP that failed to decode, if its type and length are
/// right.
fn raw_device_id(reply: &[u8]) -> Option<u32> {
    if reply.len() >= OpenRsp::LEN && reply[0] == 3 && reply[1] == 0 {
        Some(u32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::rnbd::CachePolicy;

    fn info(block: u16) -> DeviceInfo {
        let rsp = OpenRsp {
            device_id: 1,
            nsectors: 1 << 12,
            max_hw_sectors: 1024,
            max_write_zeroes_sectors: 0,
            max_discard_sectors: 0,
            discard_granularity: 0,
            discard_alignment: 0,
            physical_block_size: block,
            logical_block_size: block,
            max_segments: 128,
            secure_discard: 0,
            cache_policy: CachePolicy {
                fua: false,
                writeback: false,
            },
        };
        DeviceInfo::from_open_rsp(&rsp, 1 << 19, WriteZeroesMode::Native)
    }

    /// Offsets and lengths off the block size are refused whatever the block size, a
    /// power of two (checked with a mask) or not; the size and the IO limit bound the
    /// rest.
    #[test]
    fn a_request_is_checked_against_the_blocks_and_the_size() {
        for block in [512u16, 4096, 1536] {
            let i = info(block);
            let bs = u32::from(block);
            let ok = |r: BlockRequest| check_range(&i, &r, "read");
            assert!(
                ok(BlockRequest::read(u64::from(bs), bs * 2)).is_ok(),
                "{block}"
            );
            for (offset, len) in [(1, bs), (u64::from(bs), bs + 1), (u64::from(bs) / 2, bs)] {
                assert!(
                    matches!(
                        ok(BlockRequest::write(offset, len)),
                        Err(DeviceError::Misaligned { .. })
                    ),
                    "{block}: {offset}+{len}"
                );
            }
            let end = i.size / u64::from(bs) * u64::from(bs);
            assert!(matches!(
                ok(BlockRequest::read(end, bs)),
                Err(DeviceError::OutOfRange { .. })
            ));
            assert!(matches!(
                ok(BlockRequest::read(0, 0)),
                Err(DeviceError::ZeroLength { .. })
            ));
            let over = (i.max_io_size / bs + 1) * bs;
            assert!(matches!(
                ok(BlockRequest::read(0, over)),
                Err(DeviceError::TooLarge { .. })
            ));
        }
    }
}
