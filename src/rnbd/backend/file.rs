//! A regular file or a block device as an export, the way `rnbd-srv` exports whatever
//! `bdev_file_open_by_path` gives it. IO runs through io_uring when the kernel allows it,
//! else through a small thread pool ([`IoMode`]); either way the reactor only queues and
//! reaps. Buffered IO: flush is `fdatasync`, FUA is `RWF_DSYNC`, discard punches holes
//! (`BLKDISCARD` on block devices), write-zeroes is `FALLOC_FL_ZERO_RANGE`.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::error::{BlockSubmitError, OpenError};
use super::plan::{FileKind, IoPlan};
use super::pool::Pool;
use super::ram::{check_block_size, check_queue_depth, MAX_BLOCK_SIZE};
use super::uring::BackendUring;
use super::{
    drain_completions, sys, BlockBackend, BlockCompletion, BlockIo, Geometry, DEFAULT_MAX_DISCARD,
    DEFAULT_MAX_TRANSFER, DEFAULT_QUEUE_DEPTH,
};

/// How a [`FileBackend`] runs its IO.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// io_uring if it can be set up (and has the opcodes needed), else the thread pool.
    #[default]
    Auto,
    /// io_uring only; opening fails without it.
    IoUring,
    /// Worker threads doing blocking syscalls.
    ThreadPool,
}

/// How to open a [`FileBackend`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileOptions {
    pub read_only: bool,
    pub mode: IoMode,
    /// IOs in flight at once (default [`DEFAULT_QUEUE_DEPTH`]).
    pub queue_depth: usize,
    /// Worker threads of the thread-pool mode (default 4).
    pub threads: usize,
    /// Logical block size of a regular file (default 512); a block device reports its own.
    pub block_size: u32,
}

impl Default for FileOptions {
    fn default() -> FileOptions {
        FileOptions {
            read_only: false,
            mode: IoMode::Auto,
            queue_depth: DEFAULT_QUEUE_DEPTH,
            threads: 4,
            block_size: 512,
        }
    }
}

enum Engine {
    BackendUring(Box<BackendUring>),
    Pool(Pool),
}

/// A file or block device export.
pub struct FileBackend {
    // Field order is drop order: the engines finish their IO before the file closes.
    engine: Engine,
    /// Block-device discard (an ioctl) when the main engine is io_uring.
    aux: Option<Pool>,
    /// IOs that failed while being started, reported by the next poll.
    early: VecDeque<BlockCompletion>,
    geometry: Geometry,
    kind: FileKind,
    depth: usize,
    in_flight: usize,
    path: PathBuf,
    file: File,
}

impl FileBackend {
    /// Opens `path` (read-write unless `opts.read_only`).
    ///
    /// # Errors
    /// The failing call (open, stat, a `BLK*` ioctl, io_uring setup with
    /// [`IoMode::IoUring`], thread creation) with the path; a file smaller than one
    /// block; bad block size or queue depth.
    pub fn open(path: impl AsRef<Path>, opts: &FileOptions) -> Result<FileBackend, OpenError> {
        let path = path.as_ref().to_path_buf();
        check_queue_depth(opts.queue_depth)?;
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .open(&path)
            .map_err(|source| OpenError::Open {
                path: path.clone(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| OpenError::Stat {
            path: path.clone(),
            source,
        })?;
        let fd = file.as_raw_fd();
        let (kind, size, lbs, pbs, discard) = if meta.file_type().is_block_device() {
            let (size, lbs, pbs) =
                sys::blockdev_geometry(fd).map_err(|(call, source)| OpenError::Ioctl {
                    path: path.clone(),
                    call,
                    source,
                })?;
            (
                FileKind::Block,
                size,
                lbs,
                pbs,
                blockdev_discard(meta.rdev()),
            )
        } else if meta.file_type().is_file() {
            check_block_size(opts.block_size)?;
            let lbs = opts.block_size;
            let discard = (DEFAULT_MAX_DISCARD, lbs.max(4096));
            (FileKind::Regular, meta.len(), lbs, lbs.max(4096), discard)
        } else {
            return Err(OpenError::NotFileOrDevice { path });
        };
        check_block_size(lbs)?;
        let size = size - size % u64::from(lbs);
        if size == 0 {
            return Err(OpenError::TooSmall {
                path,
                size: meta.len(),
                block_size: lbs,
            });
        }
        let geometry = Geometry {
            size,
            logical_block_size: lbs,
            physical_block_size: pbs.clamp(lbs, MAX_BLOCK_SIZE),
            max_transfer: DEFAULT_MAX_TRANSFER,
            max_discard: discard.0 - discard.0 % lbs,
            discard_granularity: discard.1,
            discard_alignment: 0,
            max_write_zeroes: DEFAULT_MAX_DISCARD,
            max_secure_erase: 0,
            max_segments: u16::MAX,
            write_cache: true,
            fua: true,
            read_only: opts.read_only,
        };
        let depth = opts.queue_depth;
        let engine = match opts.mode {
            IoMode::ThreadPool => Engine::Pool(Pool::new(fd, depth, opts.threads)?),
            IoMode::IoUring => Engine::BackendUring(Box::new(BackendUring::new(fd, depth)?)),
            IoMode::Auto => match BackendUring::new(fd, depth) {
                Ok(ring) => Engine::BackendUring(Box::new(ring)),
                Err(e) => {
                    tracing::info!("{}: {e}; using worker threads", path.display());
                    Engine::Pool(Pool::new(fd, depth, opts.threads)?)
                }
            },
        };
        let aux = match (&engine, kind) {
            (Engine::BackendUring(_), FileKind::Block) if geometry.max_discard > 0 => {
                Some(Pool::new(fd, depth, 1)?)
            }
            _ => None,
        };
        Ok(FileBackend {
            engine,
            aux,
            early: VecDeque::with_capacity(depth),
            geometry,
            kind,
            depth,
            in_flight: 0,
            path,
            file,
        })
    }

    /// The engine actually in use: [`IoMode::IoUring`] or [`IoMode::ThreadPool`].
    pub fn mode(&self) -> IoMode {
        match self.engine {
            Engine::BackendUring(_) => IoMode::IoUring,
            Engine::Pool(_) => IoMode::ThreadPool,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the backend is a block device (else a regular file).
    pub fn is_block_device(&self) -> bool {
        self.kind == FileKind::Block
    }

    /// The open file (for diagnostics; IO must go through the backend).
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// The size of `path` now, in bytes, cut to whole blocks of `block_size` (a block
/// device's own logical block size wins): what an export re-reads at every OPEN, so a
/// file or block device that grew is seen grown.
///
/// # Errors
/// The failing open, stat or ioctl, with the path.
pub fn current_size(path: &Path, block_size: u32) -> Result<u64, OpenError> {
    let file = File::open(path).map_err(|source| OpenError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let meta = file.metadata().map_err(|source| OpenError::Stat {
        path: path.to_path_buf(),
        source,
    })?;
    let (size, lbs) = if meta.file_type().is_block_device() {
        let (size, lbs, _) =
            sys::blockdev_geometry(file.as_raw_fd()).map_err(|(call, source)| {
                OpenError::Ioctl {
                    path: path.to_path_buf(),
                    call,
                    source,
                }
            })?;
        (size, lbs)
    } else {
        (meta.len(), block_size)
    };
    let lbs = u64::from(lbs.max(1));
    Ok(size - size % lbs)
}

/// Discard limits of a block device from sysfs: (max bytes, granularity), or (0, 0)
/// when it cannot discard (or sysfs does not say).
fn blockdev_discard(rdev: u64) -> (u32, u32) {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let read = |attr: &str| -> Option<u64> {
        let p = format!("/sys/dev/block/{major}:{minor}/queue/{attr}");
        std::fs::read_to_string(p).ok()?.trim().parse().ok()
    };
    match (read("discard_max_bytes"), read("discard_granularity")) {
        (Some(max), Some(gran)) if max > 0 => (
            max.min(u64::from(DEFAULT_MAX_DISCARD)) as u32,
            gran.min(u64::from(u32::MAX)) as u32,
        ),
        _ => (0, 0),
    }
}

impl BlockBackend for FileBackend {
    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn set_size(&mut self, size: u64) {
        self.geometry.size = size;
    }

    fn queue_depth(&self) -> usize {
        self.depth
    }

    fn in_flight(&self) -> usize {
        self.in_flight
    }

    fn submit(&mut self, io: BlockIo) -> Result<(), BlockSubmitError> {
        self.geometry.validate(&io)?;
        if self.in_flight >= self.depth {
            return Err(BlockSubmitError::Busy { depth: self.depth });
        }
        let plan = IoPlan::new(io, self.kind);
        let started = match (&mut self.engine, &mut self.aux) {
            (_, Some(aux)) if plan.needs_thread() => aux.start(plan),
            (Engine::BackendUring(ring), _) => ring.start(plan),
            (Engine::Pool(pool), _) => pool.start(plan),
        };
        if let Err(failed) = started {
            self.early.push_back(failed);
        }
        self.in_flight += 1;
        Ok(())
    }

    fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        let mut n = drain_completions(&mut self.early, out);
        n += match &mut self.engine {
            Engine::BackendUring(ring) => ring.poll(&mut out[n..]),
            Engine::Pool(pool) => pool.poll(&mut out[n..]),
        };
        if let Some(aux) = &mut self.aux {
            n += aux.poll(&mut out[n..]);
        }
        self.in_flight -= n;
        n
    }

    fn describe(&self) -> String {
        let what = match self.kind {
            FileKind::Regular => "file",
            FileKind::Block => "block device",
        };
        let mode = match self.engine {
            Engine::BackendUring(_) => "io_uring",
            Engine::Pool(_) => "threads",
        };
        format!("{what} {} ({mode})", self.path.display())
    }
}

impl std::fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}
