//! How one block IO becomes file syscalls, as a small state machine shared by the
//! io_uring engine and the thread pool: optional pre-flush, the main operation (resumed
//! after short transfers, with a fallback for filesystems without `FALLOC_FL_ZERO_RANGE`),
//! optional post-sync for FUA. This is the part of the kernel's block layer that turns
//! `REQ_PREFLUSH`/`REQ_FUA` into cache flushes around a request (`blk-flush.c`).

use super::step::Step;
use super::sys::IoBuf;
use super::{BlockFlags, BlockIo, BlockOp};

/// What the backing file is; it decides how discard and write-zeroes are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FileKind {
    Regular,
    Block,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    PreFlush,
    Main,
    /// Re-allocate a punched range (write-zeroes with NOUNMAP after the punch fallback).
    Allocate,
    PostSync,
}

const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
/// Retries of a step that failed with EINTR/EAGAIN before its error is reported.
const MAX_RETRIES: u8 = 16;

/// One IO in progress.
#[derive(Clone, Copy, Debug)]
pub(crate) struct IoPlan {
    pub(crate) tag: u64,
    op: BlockOp,
    flags: BlockFlags,
    offset: u64,
    len: u32,
    buf: Option<IoBuf>,
    kind: FileKind,
    stage: Stage,
    /// Bytes of the main transfer done so far.
    done: u32,
    /// Write-zeroes fell back from ZERO_RANGE to a punch.
    punched: bool,
    retries: u8,
}

impl IoPlan {
    /// A plan for an IO that has passed validation.
    pub(crate) fn new(io: BlockIo, kind: FileKind) -> IoPlan {
        let preflush = io.flags.contains(BlockFlags::PREFLUSH)
            && !matches!(io.op, BlockOp::Read | BlockOp::Flush);
        IoPlan {
            tag: io.tag,
            op: io.op,
            flags: io.flags,
            offset: io.offset,
            len: io.len,
            buf: io.buf,
            kind,
            stage: if preflush {
                Stage::PreFlush
            } else {
                Stage::Main
            },
            done: 0,
            punched: false,
            retries: 0,
        }
    }

    /// Whether some step of this plan needs a thread (io_uring cannot run it).
    pub(crate) fn needs_thread(&self) -> bool {
        self.kind == FileKind::Block && matches!(self.op, BlockOp::Discard)
    }

    /// The syscall to run next.
    pub(crate) fn step(&self) -> Step {
        let (offset, len) = (self.offset + u64::from(self.done), self.len - self.done);
        match self.stage {
            Stage::PreFlush | Stage::PostSync => Step::Sync,
            Stage::Allocate => Step::Fallocate {
                offset: self.offset,
                len: u64::from(self.len),
                mode: libc::FALLOC_FL_KEEP_SIZE,
            },
            Stage::Main => {
                // A write-same's buffer is its pattern, used from the start every time.
                let at = if self.op == BlockOp::WriteSame {
                    0
                } else {
                    self.done as usize
                };
                let ptr = self.buf.map_or(std::ptr::null_mut(), |b| b.ptr_at(at));
                match self.op {
                    BlockOp::Read => Step::Read { offset, ptr, len },
                    BlockOp::Write => Step::Write {
                        offset,
                        ptr,
                        len,
                        dsync: self.flags.contains(BlockFlags::FUA),
                    },
                    BlockOp::WriteSame => Step::WriteSame {
                        offset,
                        ptr,
                        block: self.buf.map_or(0, |b| b.len() as u32),
                        skew: self.done % self.buf.map_or(1, |b| (b.len() as u32).max(1)),
                        len,
                        dsync: self.flags.contains(BlockFlags::FUA),
                    },
                    BlockOp::Flush => Step::Sync,
                    BlockOp::Discard | BlockOp::SecureErase => match self.kind {
                        FileKind::Regular => Step::Fallocate {
                            offset,
                            len: u64::from(len),
                            mode: PUNCH,
                        },
                        FileKind::Block => Step::BlkDiscard {
                            offset,
                            len: u64::from(len),
                        },
                    },
                    BlockOp::WriteZeroes => Step::Fallocate {
                        offset,
                        len: u64::from(len),
                        mode: if self.punched { PUNCH } else { ZERO },
                    },
                }
            }
        }
    }

    /// Feeds the result of the last step (bytes or 0 on success, negative errno on
    /// failure): `None` means run [`step`](Self::step) again, `Some(r)` is the IO's result
    /// (0 or a negative errno).
    pub(crate) fn complete(&mut self, res: i32) -> Option<i32> {
        if (res == -libc::EINTR || res == -libc::EAGAIN) && self.retries < MAX_RETRIES {
            self.retries += 1;
            return None;
        }
        self.retries = 0;
        match self.stage {
            Stage::PreFlush => {
                if res < 0 {
                    return Some(res);
                }
                self.stage = Stage::Main;
                None
            }
            Stage::Main => self.main_done(res),
            Stage::Allocate => {
                if res < 0 {
                    return Some(res);
                }
                self.after_main()
            }
            Stage::PostSync => Some(res.min(0)),
        }
    }

    fn main_done(&mut self, res: i32) -> Option<i32> {
        match self.op {
            BlockOp::Read | BlockOp::Write | BlockOp::WriteSame => {
                if res < 0 {
                    return Some(res);
                }
                if res == 0 {
                    // End of file inside the device (the file shrank) or no progress.
                    return Some(-libc::EIO);
                }
                self.done = self.done.saturating_add(res as u32).min(self.len);
                if self.done < self.len {
                    return None;
                }
                Some(0)
            }
            BlockOp::Flush => Some(res.min(0)),
            BlockOp::WriteZeroes => {
                if res == -libc::EOPNOTSUPP && !self.punched && self.kind == FileKind::Regular {
                    // tmpfs and some others lack ZERO_RANGE; a punched hole reads as zeros.
                    self.punched = true;
                    return None;
                }
                if res < 0 {
                    return Some(res);
                }
                if self.punched && self.flags.contains(BlockFlags::NOUNMAP) {
                    self.stage = Stage::Allocate;
                    return None;
                }
                self.after_main()
            }
            BlockOp::Discard | BlockOp::SecureErase => {
                if res < 0 {
                    return Some(res);
                }
                self.after_main()
            }
        }
    }

    /// Writes (and write-same) carry FUA as RWF_DSYNC; other mutating ops sync afterwards.
    fn after_main(&mut self) -> Option<i32> {
        if self.flags.contains(BlockFlags::FUA) {
            self.stage = Stage::PostSync;
            return None;
        }
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rnbd::backend::step::{same_iovecs, SAME_IOVS};

    fn run(plan: &mut IoPlan, results: &[i32]) -> (Vec<Step>, Option<i32>) {
        let mut steps = Vec::new();
        for &r in results {
            steps.push(plan.step());
            if let Some(done) = plan.complete(r) {
                return (steps, Some(done));
            }
        }
        (steps, None)
    }

    #[test]
    fn short_reads_resume_where_they_stopped() {
        let mut mem = vec![0u8; 4096];
        // SAFETY: the plan is only stepped, never executed; no memory is touched.
        let buf = unsafe { IoBuf::new(mem.as_mut_ptr(), mem.len()) };
        let mut plan = IoPlan::new(BlockIo::read(7, 8192, buf), FileKind::Regular);
        let (steps, res) = run(&mut plan, &[1000, 3096]);
        assert_eq!(res, Some(0));
        assert_eq!(
            steps[1],
            Step::Read {
                offset: 8192 + 1000,
                ptr: mem.as_mut_ptr().wrapping_add(1000),
                len: 3096
            }
        );
    }

    #[test]
    fn preflush_then_fua_write_is_sync_then_dsync_write() {
        let mut mem = vec![0u8; 512];
        // SAFETY: as above.
        let buf = unsafe { IoBuf::new(mem.as_mut_ptr(), mem.len()) };
        let io = BlockIo::write(1, 0, buf).with_flags(BlockFlags::FUA | BlockFlags::PREFLUSH);
        let mut plan = IoPlan::new(io, FileKind::Regular);
        let (steps, res) = run(&mut plan, &[0, 512]);
        assert_eq!(res, Some(0));
        assert_eq!(steps[0], Step::Sync);
        assert!(matches!(steps[1], Step::Write { dsync: true, .. }));
    }

    #[test]
    fn write_zeroes_falls_back_to_punch_and_reallocates_for_nounmap() {
        let io =
            BlockIo::write_zeroes(2, 4096, 4096).with_flags(BlockFlags::NOUNMAP | BlockFlags::FUA);
        let mut plan = IoPlan::new(io, FileKind::Regular);
        let (steps, res) = run(&mut plan, &[-libc::EOPNOTSUPP, 0, 0, 0]);
        assert_eq!(res, Some(0));
        let modes: Vec<_> = steps
            .iter()
            .map(|s| match s {
                Step::Fallocate { mode, .. } => *mode,
                _ => -1,
            })
            .collect();
        assert_eq!(modes, vec![ZERO, PUNCH, libc::FALLOC_FL_KEEP_SIZE, -1]);
        assert_eq!(steps[3], Step::Sync);
    }

    #[test]
    fn short_write_same_resumes_inside_the_block() {
        let mut mem = vec![0u8; 512];
        // SAFETY: as above.
        let block = unsafe { IoBuf::new(mem.as_mut_ptr(), mem.len()) };
        let io = BlockIo::write_same(8, 4096, 512 * 300, block).with_flags(BlockFlags::FUA);
        let mut plan = IoPlan::new(io, FileKind::Regular);
        let mut iovs = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; SAME_IOVS];
        // The first syscall covers 256 blocks (the iovec limit), all over the pattern.
        let first = plan.step();
        assert_eq!(same_iovecs(&first, &mut iovs), SAME_IOVS);
        assert!(iovs
            .iter()
            .all(|v| v.iov_base == mem.as_mut_ptr().cast() && v.iov_len == 512));
        // It writes 1000 bytes: the next one starts 488 bytes into the pattern.
        assert_eq!(plan.complete(1000), None);
        let next = plan.step();
        assert!(matches!(
            next,
            Step::WriteSame { offset: 5096, skew: 488, len, dsync: true, .. } if len == 512 * 300 - 1000
        ));
        let n = same_iovecs(&next, &mut iovs);
        assert_eq!(n, SAME_IOVS);
        assert_eq!(iovs[0].iov_base, mem.as_mut_ptr().wrapping_add(488).cast());
        assert_eq!(iovs[0].iov_len, 24);
        assert_eq!(
            (iovs[1].iov_base, iovs[1].iov_len),
            (mem.as_mut_ptr().cast(), 512)
        );
        // The rest in one go ends the IO (FUA rode on RWF_DSYNC).
        assert_eq!(plan.complete(512 * 300 - 1000), Some(0));
    }

    #[test]
    fn errors_end_the_plan_and_eof_is_eio() {
        let mut plan = IoPlan::new(BlockIo::flush(3), FileKind::Regular);
        assert_eq!(run(&mut plan, &[-libc::EIO]).1, Some(-libc::EIO));
        let mut mem = vec![0u8; 512];
        // SAFETY: as above.
        let buf = unsafe { IoBuf::new(mem.as_mut_ptr(), mem.len()) };
        let mut plan = IoPlan::new(BlockIo::read(4, 0, buf), FileKind::Regular);
        assert_eq!(run(&mut plan, &[0]).1, Some(-libc::EIO));
        let plan = IoPlan::new(BlockIo::discard(5, 0, 512), FileKind::Block);
        assert!(plan.needs_thread());
        assert_eq!(
            plan.step(),
            Step::BlkDiscard {
                offset: 0,
                len: 512
            }
        );
    }

    #[test]
    fn eintr_is_retried_a_bounded_number_of_times() {
        let mut plan = IoPlan::new(BlockIo::flush(6), FileKind::Regular);
        let results = vec![-libc::EINTR; MAX_RETRIES as usize + 1];
        assert_eq!(run(&mut plan, &results).1, Some(-libc::EINTR));
    }
}
