//! Errors of the block backends: refused submissions (with the errno RNBD sends back, as
//! `rnbd-srv` forwards the bio's status), failures to open a backend, and bad export
//! specs on the command line.

use std::io;
use std::path::PathBuf;

use super::BlockOp;
use crate::Errno;

/// Why [`submit`](super::BlockBackend::submit) refused an IO. Nothing was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockSubmitError {
    /// The backend's queue is full: not a failure, submit the same IO again after a poll.
    #[error("backend queue full ({depth} IOs in flight): retry after completions are polled")]
    Busy { depth: usize },
    #[error("{op} refused: the export is read-only")]
    ReadOnly { op: BlockOp },
    #[error("{op} is not supported by this backend")]
    Unsupported { op: BlockOp },
    #[error("{op} at offset {offset} of {len} bytes is not aligned to the {block_size}-byte logical block")]
    Misaligned {
        op: BlockOp,
        offset: u64,
        len: u32,
        block_size: u32,
    },
    #[error("{op} at offset {offset} of {len} bytes ends beyond the device's {size} bytes")]
    OutOfRange {
        op: BlockOp,
        offset: u64,
        len: u32,
        size: u64,
    },
    #[error("{op} of {len} bytes exceeds the backend's limit of {max} bytes")]
    TooLarge { op: BlockOp, len: u32, max: u32 },
    #[error("{op} of zero bytes")]
    ZeroLength { op: BlockOp },
    #[error("{op} without a data buffer")]
    MissingBuffer { op: BlockOp },
    #[error("write same with {len} bytes of data: the data must be exactly one {block_size}-byte logical block")]
    NotOneBlock { len: usize, block_size: u32 },
    #[error("{op} of {len} bytes with a buffer of only {buf_len} bytes")]
    ShortBuffer {
        op: BlockOp,
        len: u32,
        buf_len: usize,
    },
}

impl BlockSubmitError {
    /// The errno for the IO response. Choices follow what a Linux `rnbd-srv`
    /// client would see: the block layer fails IO beyond the end of the device with
    /// `-EIO` (`bio_check_eod`), writes to a read-only device with `-EROFS`, unknown ops
    /// with `-EOPNOTSUPP`, malformed IO with `-EINVAL`. [`Busy`](Self::Busy) maps to
    /// `-EAGAIN` but should be retried rather than sent.
    pub fn errno(&self) -> Errno {
        match self {
            BlockSubmitError::Busy { .. } => Errno::EAGAIN,
            BlockSubmitError::ReadOnly { .. } => Errno::EROFS,
            BlockSubmitError::Unsupported { .. } => Errno::EOPNOTSUPP,
            BlockSubmitError::OutOfRange { .. } => Errno::EIO,
            BlockSubmitError::Misaligned { .. }
            | BlockSubmitError::TooLarge { .. }
            | BlockSubmitError::ZeroLength { .. }
            | BlockSubmitError::MissingBuffer { .. }
            | BlockSubmitError::NotOneBlock { .. }
            | BlockSubmitError::ShortBuffer { .. } => Errno::EINVAL,
        }
    }

    /// Whether the IO should be queued and submitted again rather than failed.
    pub fn is_busy(&self) -> bool {
        matches!(self, BlockSubmitError::Busy { .. })
    }
}

/// Why a backend could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    #[error("open {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("stat {}: {source}", path.display())]
    Stat { path: PathBuf, source: io::Error },
    #[error("{call} on {}: {source}", path.display())]
    Ioctl {
        path: PathBuf,
        call: &'static str,
        source: io::Error,
    },
    #[error("{} is neither a regular file nor a block device", path.display())]
    NotFileOrDevice { path: PathBuf },
    #[error("{} is smaller than one {block_size}-byte block ({size} bytes)", path.display())]
    TooSmall {
        path: PathBuf,
        size: u64,
        block_size: u32,
    },
    #[error("block size {block_size} is not a power of two between 512 and 32768 (RNBD sends it in 16 bits)")]
    BadBlockSize { block_size: u32 },
    #[error("size {size} is not a positive multiple of the {block_size}-byte block size")]
    BadSize { size: u64, block_size: u32 },
    #[error("queue depth {depth} must be between 1 and 32768")]
    BadQueueDepth { depth: usize },
    #[error("io_uring setup failed ({source}); use the thread-pool mode instead")]
    IoUring { source: io::Error },
    #[error("io_uring lacks the {opcode} opcode on this kernel; use the thread-pool mode instead")]
    IoUringOpcode { opcode: &'static str },
    #[error("starting IO worker thread: {source}")]
    Spawn { source: io::Error },
    #[error("cannot allocate the {len} bytes of a RAM disk")]
    NoMemory { len: usize },
}

/// A bad `NAME=ram:SIZE` / `NAME=file:PATH[:ro]` export spec.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("export '{spec}': {problem}")]
pub struct SpecError {
    pub spec: String,
    pub problem: SpecProblem,
}

/// What is wrong in an export spec.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecProblem {
    #[error("expected NAME=ram:SIZE or NAME=file:PATH[:ro]")]
    Shape,
    #[error("bad name '{name}': {why}")]
    BadName { name: String, why: &'static str },
    #[error("unknown backend '{kind}' (use ram or file)")]
    UnknownKind { kind: String },
    #[error("bad size '{size}' (use e.g. 512M, 1G)")]
    BadSize { size: String },
    #[error("size {size} is not a positive multiple of the {block_size}-byte block size")]
    SizeNotMultiple { size: u64, block_size: u32 },
    #[error("missing file path after 'file:'")]
    MissingPath,
}
