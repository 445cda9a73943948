//! The io_uring engine of the file backend: one ring per backend, one slot per IO in
//! flight (the slot index is the entry's `user_data`), one entry per IO in the kernel at
//! a time (steps of a [`IoPlan`] are chained from the completions). Submission happens in
//! [`BackendUring::poll`], batching whatever was queued since the last poll — the shape of
//! SPDK's `bdev_uring` poller.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, IoUring, Probe};

use super::error::OpenError;
use super::plan::IoPlan;
use super::step::{Step, SAME_IOVS};
use super::sys::{self, PushFailed};
use super::BlockCompletion;
use crate::Errno;

pub(crate) struct BackendUring {
    ring: IoUring,
    fd: RawFd,
    slots: Vec<Option<IoPlan>>,
    /// Per slot, the iovecs of a write-same step, allocated at the slot's first
    /// write-same and kept (so steady state allocates nothing).
    iovs: Vec<Option<Box<[libc::iovec]>>>,
    free: Vec<u32>,
    in_flight: usize,
}

impl BackendUring {
    /// A ring for `depth` IOs on `fd`, after checking the kernel has every opcode used.
    pub(crate) fn new(fd: RawFd, depth: usize) -> Result<BackendUring, OpenError> {
        let entries = (depth as u32).next_power_of_two();
        let ring = IoUring::new(entries).map_err(|source| OpenError::IoUring { source })?;
        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|source| OpenError::IoUring { source })?;
        for (code, opcode) in [
            (opcode::Read::CODE, "READ"),
            (opcode::Write::CODE, "WRITE"),
            (opcode::Writev::CODE, "WRITEV"),
            (opcode::Fsync::CODE, "FSYNC"),
            (opcode::Fallocate::CODE, "FALLOCATE"),
        ] {
            if !probe.is_supported(code) {
                return Err(OpenError::IoUringOpcode { opcode });
            }
        }
        Ok(BackendUring {
            ring,
            fd,
            slots: vec![None; depth],
            iovs: (0..depth).map(|_| None).collect(),
            free: (0..depth as u32).rev().collect(),
            in_flight: 0,
        })
    }

    /// Queues the first step of `plan`. The caller keeps the in-flight count below the
    /// depth, so a slot is free. An IO that cannot be queued comes back as its failed
    /// completion, for the caller to report on the next poll.
    pub(crate) fn start(&mut self, plan: IoPlan) -> Result<(), BlockCompletion> {
        let Some(slot) = self.free.pop() else {
            return Err(BlockCompletion::new(plan.tag, Err(Errno::EBUSY)));
        };
        self.slots[slot as usize] = Some(plan);
        self.in_flight += 1;
        match self.push(slot) {
            None => Ok(()),
            Some(errno) => {
                self.slots[slot as usize] = None;
                self.free.push(slot);
                self.in_flight -= 1;
                Err(BlockCompletion::from_neg(plan.tag, errno))
            }
        }
    }

    /// Pushes the next step of the plan in `slot`; `Some(errno)` when it cannot be queued.
    fn push(&mut self, slot: u32) -> Option<i32> {
        let step = self.slots[slot as usize].as_ref()?.step();
        let iovs: &mut [libc::iovec] = if matches!(step, Step::WriteSame { .. }) {
            self.iovs[slot as usize].get_or_insert_with(|| {
                vec![
                    libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    };
                    SAME_IOVS
                ]
                .into_boxed_slice()
            })
        } else {
            &mut []
        };
        for _ in 0..2 {
            let mut sq = self.ring.submission();
            match sys::push(&mut sq, self.fd, step, u64::from(slot), iovs) {
                Ok(()) => return None,
                Err(PushFailed::NotRingable) => return Some(-libc::EOPNOTSUPP),
                Err(PushFailed::Full) => {
                    drop(sq);
                    // Cannot happen with one entry per IO and depth ≤ entries; be safe.
                    let _ = self.ring.submit();
                }
            }
        }
        Some(-libc::EBUSY)
    }

    /// Submits queued entries and reaps finished IOs into `out`.
    pub(crate) fn poll(&mut self, out: &mut [BlockCompletion]) -> usize {
        let mut n = 0;
        loop {
            self.submit_queued();
            let mut progressed = false;
            while n < out.len() {
                let Some(cqe) = self.ring.completion().next() else {
                    break;
                };
                progressed = true;
                let slot = cqe.user_data() as u32;
                if let Some(c) = self.advance(slot, cqe.result()) {
                    out[n] = c;
                    n += 1;
                }
            }
            // Steps chained from completions were queued above; submit them now and
            // look again only if that may have produced more (bounded by `out`).
            if !progressed || n == out.len() {
                self.submit_queued();
                return n;
            }
        }
    }

    /// Feeds one result to the plan in `slot`; the completion when the IO is over.
    fn advance(&mut self, slot: u32, res: i32) -> Option<BlockCompletion> {
        let plan = self.slots.get_mut(slot as usize)?.as_mut()?;
        let mut finished = plan.complete(res);
        if finished.is_none() {
            finished = self.push(slot);
        }
        let errno = finished?;
        let plan = self.slots[slot as usize].take()?;
        self.free.push(slot);
        self.in_flight -= 1;
        Some(BlockCompletion::from_neg(plan.tag, errno))
    }

    fn submit_queued(&mut self) {
        if self.ring.submission().is_empty() {
            return;
        }
        match self.ring.submit() {
            Ok(_) => {}
            // Transient (interrupted, or the kernel wants completions reaped first):
            // the entries stay queued and go with the next poll.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                ) => {}
            Err(e) => tracing::warn!("io_uring submit failed: {e}; retrying on next poll"),
        }
    }

    /// Blocks until every IO in flight has finished, dropping the completions: for
    /// teardown only, so no buffer is touched after the backend is gone.
    fn drain(&mut self) {
        let mut sink = [BlockCompletion::default(); 32];
        while self.in_flight > 0 {
            if self.poll(&mut sink) == 0 {
                match self.ring.submit_and_wait(1) {
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::error!(
                            "io_uring wait failed during teardown: {e}; {} IOs abandoned",
                            self.in_flight
                        );
                        return;
                    }
                }
            }
        }
    }
}

impl Drop for BackendUring {
    fn drop(&mut self) {
        self.drain();
    }
}
