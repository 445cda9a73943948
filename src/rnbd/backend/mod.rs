//! Block backends of RNBD exports: what the server reads and writes when a client's IO
//! arrives. In the kernel, `rnbd-srv` opens a `struct block_device` per export and
//! submits bios to it (`process_rdma` → `submit_bio`); here an export is a name bound to a
//! [`BlockBackend`] driven from a polled reactor.
//!
//! # Contract
//! - [`BlockBackend::submit`] never blocks and never panics on bad input: an IO that is
//!   out of range, misaligned, too large, unsupported or a write to a read-only export is
//!   refused synchronously with a typed [`BlockSubmitError`] whose
//!   [`errno`](BlockSubmitError::errno) is what RNBD puts on the wire. A full queue is
//!   [`BlockSubmitError::Busy`]: keep the IO (it is `Copy`) and submit it again after a poll,
//!   as SPDK's `spdk_bdev_queue_io_wait` does.
//! - Accepted IOs complete later, exactly once each, through
//!   [`BlockBackend::poll`] on the thread that polls (the reactor), into a caller-owned
//!   slice: no allocation on the data path. Backends may batch the start of IO until the
//!   next poll (the io_uring engine submits there), so a submitter must keep polling.
//! - Buffers are raw memory ([`IoBuf`]), normally a request's RTRS chunk, which the
//!   request owns exclusively until its response; a backend touches it only between
//!   submission and completion. Dropping a backend waits for IO still in flight.
//! - [`Geometry`] holds what `rnbd_msg_open_rsp` reports (docs/PROTOCOL.md §2.10, §7.2).
//! - [`BlockOp::WriteSame`] (RNBD op 5 from a client older than Linux 5.18, which
//!   carries one logical block of data) writes that block over the whole range; every
//!   backend emulates it with writes of the repeated block (docs/ARCHITECTURE.md, "RNBD
//!   op 5").
//!
//! # Backends
//! - [`RamBackend`]: memory, completes on the next poll.
//! - [`FileBackend`]: a regular file or block device through io_uring, or a small
//!   thread pool when io_uring is unavailable (or forced, see [`IoMode`]).
//! - [`ExportSpec`]: the CLI's `NAME=ram:SIZE` / `NAME=file:PATH[:ro]`.

mod error;
mod file;
mod plan;
mod pool;
mod ram;
mod spec;
mod step;
mod sys;
mod uring;

pub use error::{BlockSubmitError, OpenError, SpecError, SpecProblem};
pub use file::{current_size, FileBackend, FileOptions, IoMode};
pub use ram::RamBackend;
pub use spec::{parse_size, BackendSpec, ExportSpec, MAX_NAME_LEN, RAM_BLOCK_SIZE};
pub use sys::IoBuf;

use std::collections::VecDeque;
use std::fmt;
use std::ops::BitOr;

use crate::Errno;

/// Bytes in the 512-byte sectors RNBD counts in.
pub const SECTOR_SIZE: u64 = 512;
/// Default queue depth of a backend: IOs accepted and not yet completed.
pub const DEFAULT_QUEUE_DEPTH: usize = 128;
/// Largest read or write the backends accept (the server's chunk is smaller anyway).
pub const DEFAULT_MAX_TRANSFER: u32 = 1 << 20;
/// Largest discard / write-zeroes (and write-same) the backends accept.
pub const DEFAULT_MAX_DISCARD: u32 = 1 << 30;

/// `cache_policy` bits of `rnbd_msg_open_rsp`.
pub const RNBD_FUA: u8 = 1;
/// See [`RNBD_FUA`].
pub const RNBD_WRITEBACK: u8 = 2;

/// Block operations (RNBD's `rnbd_io_flags` op codes, docs/PROTOCOL.md §2.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockOp {
    Read,
    Write,
    /// Write back the volatile cache.
    Flush,
    Discard,
    SecureErase,
    WriteZeroes,
    /// Writes the buffer, exactly one logical block, over every block of the range (the
    /// kernel's `REQ_OP_WRITE_SAME`, removed in Linux 5.18).
    WriteSame,
}

impl BlockOp {
    /// Whether the op changes the device's contents.
    pub fn is_write(self) -> bool {
        matches!(
            self,
            BlockOp::Write
                | BlockOp::Discard
                | BlockOp::SecureErase
                | BlockOp::WriteZeroes
                | BlockOp::WriteSame
        )
    }

    /// Whether the op carries `len` bytes of data in a buffer (a write-same carries one
    /// block, see [`BlockOp::WriteSame`]).
    pub fn has_data(self) -> bool {
        matches!(self, BlockOp::Read | BlockOp::Write)
    }
}

impl fmt::Display for BlockOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BlockOp::Read => "read",
            BlockOp::Write => "write",
            BlockOp::Flush => "flush",
            BlockOp::Discard => "discard",
            BlockOp::SecureErase => "secure erase",
            BlockOp::WriteZeroes => "write zeroes",
            BlockOp::WriteSame => "write same",
        })
    }
}

/// Flags of a block IO: what the block layer makes of RNBD's `RNBD_F_FUA`,
/// `RNBD_F_PREFLUSH` and `RNBD_F_NOUNMAP` (the wire's own bits are
/// [`crate::proto::rnbd::RnbdFlags`]; the dispatcher maps one to the other).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockFlags(u8);

impl BlockFlags {
    pub const NONE: BlockFlags = BlockFlags(0);
    /// The data is durable when the IO completes.
    pub const FUA: BlockFlags = BlockFlags(1);
    /// Flush the cache before the IO.
    pub const PREFLUSH: BlockFlags = BlockFlags(2);
    /// Write-zeroes must keep the range allocated.
    pub const NOUNMAP: BlockFlags = BlockFlags(4);

    pub fn contains(self, other: BlockFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// These flags but `other`'s.
    pub fn without(self, other: BlockFlags) -> BlockFlags {
        BlockFlags(self.0 & !other.0)
    }
}

impl BitOr for BlockFlags {
    type Output = BlockFlags;
    fn bitor(self, rhs: BlockFlags) -> BlockFlags {
        BlockFlags(self.0 | rhs.0)
    }
}

/// One block IO. `offset` and `len` are bytes; `tag` comes back in the completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIo {
    pub tag: u64,
    pub op: BlockOp,
    pub offset: u64,
    pub len: u32,
    /// Data for reads and writes (at least `len` bytes), the one logical block of a
    /// write-same; `None` for the others.
    pub buf: Option<IoBuf>,
    pub flags: BlockFlags,
}

impl BlockIo {
    /// Reads `buf.len()` bytes at `offset` into `buf` (lengths beyond `u32::MAX` are
    /// clamped, and then refused as too large).
    pub fn read(tag: u64, offset: u64, buf: IoBuf) -> BlockIo {
        BlockIo::data(tag, BlockOp::Read, offset, buf)
    }

    /// Writes `buf` at `offset`.
    pub fn write(tag: u64, offset: u64, buf: IoBuf) -> BlockIo {
        BlockIo::data(tag, BlockOp::Write, offset, buf)
    }

    pub fn flush(tag: u64) -> BlockIo {
        BlockIo::range(tag, BlockOp::Flush, 0, 0)
    }

    pub fn discard(tag: u64, offset: u64, len: u32) -> BlockIo {
        BlockIo::range(tag, BlockOp::Discard, offset, len)
    }

    pub fn write_zeroes(tag: u64, offset: u64, len: u32) -> BlockIo {
        BlockIo::range(tag, BlockOp::WriteZeroes, offset, len)
    }

    /// Writes `block` (exactly one logical block) over `[offset, offset + len)`.
    pub fn write_same(tag: u64, offset: u64, len: u32, block: IoBuf) -> BlockIo {
        BlockIo {
            tag,
            op: BlockOp::WriteSame,
            offset,
            len,
            buf: Some(block),
            flags: BlockFlags::NONE,
        }
    }

    /// A data-less op over `[offset, offset + len)`.
    pub fn range(tag: u64, op: BlockOp, offset: u64, len: u32) -> BlockIo {
        BlockIo {
            tag,
            op,
            offset,
            len,
            buf: None,
            flags: BlockFlags::NONE,
        }
    }

    fn data(tag: u64, op: BlockOp, offset: u64, buf: IoBuf) -> BlockIo {
        BlockIo {
            tag,
            op,
            offset,
            len: u32::try_from(buf.len()).unwrap_or(u32::MAX),
            buf: Some(buf),
            flags: BlockFlags::NONE,
        }
    }

    pub fn with_flags(mut self, flags: BlockFlags) -> BlockIo {
        self.flags = flags;
        self
    }
}

/// The end of one accepted IO: the one completion type from a backend to the wire (the
/// RNBD server hands `result` to the RTRS server's response unchanged, with `tag` as the
/// request's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCompletion {
    pub tag: u64,
    pub result: Result<(), Errno>,
}

impl Default for BlockCompletion {
    /// A placeholder (tag 0, success) for sizing the slice given to `poll`.
    fn default() -> BlockCompletion {
        BlockCompletion {
            tag: 0,
            result: Ok(()),
        }
    }
}

impl BlockCompletion {
    pub fn new(tag: u64, result: Result<(), Errno>) -> BlockCompletion {
        BlockCompletion { tag, result }
    }

    /// From the kernel's convention (0, or a negative errno), as system calls and SPDK
    /// report it: the one place a backend's negative number becomes an [`Errno`].
    pub fn from_neg(tag: u64, rc: i32) -> BlockCompletion {
        BlockCompletion {
            tag,
            result: Errno::result_from_neg(rc),
        }
    }
}

/// Moves queued completions into `out`, oldest first, as many as fit; returns how many.
pub(crate) fn drain_completions(
    queue: &mut VecDeque<BlockCompletion>,
    out: &mut [BlockCompletion],
) -> usize {
    let n = queue.len().min(out.len());
    for (slot, c) in out.iter_mut().zip(queue.drain(..n)) {
        *slot = c;
    }
    n
}

/// Size and limits of a backend: what `rnbd_msg_open_rsp` reports. All sizes in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub size: u64,
    pub logical_block_size: u32,
    pub physical_block_size: u32,
    /// Largest read/write.
    pub max_transfer: u32,
    /// Largest discard; 0 when discard is unsupported.
    pub max_discard: u32,
    pub discard_granularity: u32,
    pub discard_alignment: u32,
    /// Largest write-zeroes; 0 when unsupported. Also the largest write-same: both are
    /// op 5 under the same OPEN_RSP field (`max_write_same_sectors` before Linux 5.18).
    pub max_write_zeroes: u32,
    /// Largest secure erase; 0 when unsupported.
    pub max_secure_erase: u32,
    pub max_segments: u16,
    /// A volatile write cache exists (flush matters).
    pub write_cache: bool,
    /// FUA writes are honoured.
    pub fua: bool,
    pub read_only: bool,
}

impl Geometry {
    /// `nsectors`: the size in 512-byte sectors.
    pub fn nsectors(&self) -> u64 {
        self.size / SECTOR_SIZE
    }

    /// `max_hw_sectors`.
    pub fn max_hw_sectors(&self) -> u32 {
        self.max_transfer / SECTOR_SIZE as u32
    }

    /// `max_discard_sectors`.
    pub fn max_discard_sectors(&self) -> u32 {
        self.max_discard / SECTOR_SIZE as u32
    }

    /// `max_write_zeroes_sectors`.
    pub fn max_write_zeroes_sectors(&self) -> u32 {
        self.max_write_zeroes / SECTOR_SIZE as u32
    }

    /// `secure_discard`: max secure-erase sectors truncated to 16 bits, as the kernel does.
    pub fn secure_discard(&self) -> u16 {
        (self.max_secure_erase / SECTOR_SIZE as u32) as u16
    }

    /// `cache_policy`: [`RNBD_WRITEBACK`] with a write cache, plus [`RNBD_FUA`].
    pub fn cache_policy(&self) -> u8 {
        let mut policy = 0;
        if self.write_cache {
            policy |= RNBD_WRITEBACK;
        }
        if self.fua {
            policy |= RNBD_FUA;
        }
        policy
    }

    /// Checks `io` against these limits: the synchronous refusals of
    /// [`BlockBackend::submit`].
    ///
    /// # Errors
    /// The first problem found, in this order: unsupported op, read-only, missing or short
    /// buffer (a write-same's not exactly one logical block), zero length, misalignment,
    /// range, size limit.
    pub fn validate(&self, io: &BlockIo) -> Result<(), BlockSubmitError> {
        let op = io.op;
        let limit = match op {
            BlockOp::Read | BlockOp::Write => self.max_transfer,
            BlockOp::Flush => u32::MAX,
            BlockOp::Discard => self.max_discard,
            BlockOp::WriteZeroes | BlockOp::WriteSame => self.max_write_zeroes,
            BlockOp::SecureErase => self.max_secure_erase,
        };
        if limit == 0 {
            return Err(BlockSubmitError::Unsupported { op });
        }
        if self.read_only && op.is_write() {
            return Err(BlockSubmitError::ReadOnly { op });
        }
        if op == BlockOp::Flush {
            return Ok(());
        }
        if op.has_data() {
            match io.buf {
                None => return Err(BlockSubmitError::MissingBuffer { op }),
                Some(buf) if buf.len() < io.len as usize => {
                    return Err(BlockSubmitError::ShortBuffer {
                        op,
                        len: io.len,
                        buf_len: buf.len(),
                    })
                }
                Some(_) => {}
            }
        }
        if op == BlockOp::WriteSame {
            match io.buf {
                None => return Err(BlockSubmitError::MissingBuffer { op }),
                Some(buf) if buf.len() != self.logical_block_size as usize => {
                    return Err(BlockSubmitError::NotOneBlock {
                        len: buf.len(),
                        block_size: self.logical_block_size,
                    })
                }
                Some(_) => {}
            }
        }
        if io.len == 0 {
            return Err(BlockSubmitError::ZeroLength { op });
        }
        let bs = u64::from(self.logical_block_size);
        if io.offset % bs != 0 || u64::from(io.len) % bs != 0 {
            return Err(BlockSubmitError::Misaligned {
                op,
                offset: io.offset,
                len: io.len,
                block_size: self.logical_block_size,
            });
        }
        if io
            .offset
            .checked_add(u64::from(io.len))
            .map_or(true, |end| end > self.size)
        {
            return Err(BlockSubmitError::OutOfRange {
                op,
                offset: io.offset,
                len: io.len,
                size: self.size,
            });
        }
        if io.len > limit {
            return Err(BlockSubmitError::TooLarge {
                op,
                len: io.len,
                max: limit,
            });
        }
        Ok(())
    }
}

/// A block device as an RNBD export sees it. Driven by one reactor: `submit` and `poll`
/// are called from the same thread, and neither blocks.
pub trait BlockBackend {
    /// Size and limits (the size changes only through [`set_size`](Self::set_size)).
    fn geometry(&self) -> &Geometry;

    /// The device under this instance was resized to `size` bytes (its export saw it at
    /// an OPEN): IO is checked against the new size from now on. Backends that cannot
    /// change size (RAM) keep theirs.
    fn set_size(&mut self, size: u64) {
        let _ = size;
    }

    fn read_only(&self) -> bool {
        self.geometry().read_only
    }

    /// IOs that may be in flight at once; one more is [`BlockSubmitError::Busy`].
    fn queue_depth(&self) -> usize;

    /// IOs accepted and not yet returned by [`poll`](Self::poll).
    fn in_flight(&self) -> usize;

    /// Starts `io`.
    ///
    /// # Errors
    /// [`BlockSubmitError::Busy`] when `queue_depth` IOs are in flight (retry after a poll);
    /// otherwise why `io` is invalid for this backend (see [`Geometry::validate`]). A
    /// refused IO produces no completion.
    fn submit(&mut self, io: BlockIo) -> Result<(), BlockSubmitError>;

    /// Moves finished IOs into `out`, returns how many. Never blocks.
    fn poll(&mut self, out: &mut [BlockCompletion]) -> usize;

    /// A short description for logs ("ram 1073741824 B", "file /dev/sdb (io_uring)").
    fn describe(&self) -> String;
}
