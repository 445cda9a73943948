//! A bdev IO as a bdev module sees it: the `spdk_bdev_io` SPDK hands to a module's
//! `submit_request` (the initiator side; [`export`](super::export) wraps the other side, a
//! bdev used as an export's backend). [`BdevIo`] reads the request's fields — type,
//! offset and length in blocks, the data buffer's iovecs — asks the bdev layer for a
//! buffer when a READ came without one (`spdk_bdev_io_get_buf`), gives the module's
//! per-IO context (`driver_ctx`, `get_ctx_size` bytes), and completes the IO with an
//! errno, once. Every `unsafe` access to `spdk_bdev_io` of the plugin's bdev module lives
//! here.

use std::ptr::NonNull;

use super::sys;
use crate::Errno;

/// What a bdev IO asks for (`spdk_bdev_io_type`, the kinds the rtrs bdev knows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BdevIoType {
    Read,
    Write,
    Flush,
    Unmap,
    WriteZeroes,
    Reset,
    /// Any other type (its `spdk_bdev_io_type` value).
    Other(u32),
}

impl BdevIoType {
    /// The type of an `spdk_bdev_io_type` value.
    pub fn from_raw(ty: sys::spdk_bdev_io_type) -> BdevIoType {
        match ty {
            sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_READ => BdevIoType::Read,
            sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE => BdevIoType::Write,
            sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_FLUSH => BdevIoType::Flush,
            sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_UNMAP => BdevIoType::Unmap,
            sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_WRITE_ZEROES => BdevIoType::WriteZeroes,
            sys::spdk_bdev_io_type_SPDK_BDEV_IO_TYPE_RESET => BdevIoType::Reset,
            other => BdevIoType::Other(other),
        }
    }
}

/// A live bdev IO submitted to a bdev module, owned by the module until it completes it.
///
/// Not `Clone`: [`complete`](Self::complete) takes it, so an IO is completed once. It is
/// `Send` so that it can travel with the module's task to the thread that carries it;
/// SPDK requires that it be completed on the thread it was submitted on, which the
/// module ensures (see [`complete`](Self::complete)).
#[derive(Debug)]
pub struct BdevIo(NonNull<sys::spdk_bdev_io>);

// SAFETY: a bdev IO is plain memory owned by the bdev layer until completion; the module
// hands it between threads with synchronisation (locks) and completes it on its
// submitting thread, as `complete` requires.
unsafe impl Send for BdevIo {}

/// Called with an IO whose buffer was asked for with [`BdevIo::get_buf`] (`ok` false:
/// no buffer could be had); `ch` is the IO channel it was submitted on.
pub trait GotBuf {
    fn got_buf(ch: *mut sys::spdk_io_channel, io: BdevIo, ok: bool);
}

impl BdevIo {
    /// Takes ownership of `io`.
    ///
    /// # Safety
    /// `io` must be a live bdev IO submitted to the calling module (`submit_request`),
    /// not completed yet, and wrapped once: the module completes it through the returned
    /// value only.
    pub unsafe fn from_raw(io: *mut sys::spdk_bdev_io) -> Option<BdevIo> {
        NonNull::new(io).map(BdevIo)
    }

    fn raw(&self) -> &sys::spdk_bdev_io {
        // SAFETY: live until completed (from_raw's contract), and completion takes self.
        unsafe { self.0.as_ref() }
    }

    pub fn io_type(&self) -> BdevIoType {
        BdevIoType::from_raw(sys::spdk_bdev_io_type::from(self.raw().type_))
    }

    /// First block of the request (READ, WRITE, UNMAP, WRITE_ZEROES).
    pub fn offset_blocks(&self) -> u64 {
        // SAFETY: `u.bdev` is the member of the union that block IO types use; reading
        // plain integers from it is defined for every type (SPDK zeroes unused fields).
        unsafe { self.raw().u.bdev.offset_blocks }
    }

    /// Length of the request in blocks.
    pub fn num_blocks(&self) -> u64 {
        // SAFETY: as in offset_blocks.
        unsafe { self.raw().u.bdev.num_blocks }
    }

    /// The bdev's block size in bytes.
    pub fn block_len(&self) -> u32 {
        // SAFETY: an IO's bdev lives at least as long as the IO.
        unsafe { (*self.raw().bdev).blocklen }
    }

    /// The data buffer's iovecs (empty when there are none).
    pub fn iovs(&self) -> &[sys::iovec] {
        // SAFETY: as in offset_blocks; the iovec array belongs to the IO and stays valid
        // and unchanged until it completes (the returned slice borrows self).
        unsafe {
            let b = &self.raw().u.bdev;
            if b.iovs.is_null() || b.iovcnt <= 0 {
                return &[];
            }
            std::slice::from_raw_parts(b.iovs, b.iovcnt as usize)
        }
    }

    /// Whether the IO has a data buffer (a READ may come without one).
    pub fn has_buf(&self) -> bool {
        self.iovs().first().is_some_and(|v| !v.iov_base.is_null())
    }

    /// Asks the bdev layer for a data buffer of `len` bytes; `G::got_buf` gets the IO
    /// back on this thread once it has one (or could not get one).
    pub fn get_buf<G: GotBuf>(self, len: u64) {
        unsafe extern "C" fn cb<G: GotBuf>(
            ch: *mut sys::spdk_io_channel,
            io: *mut sys::spdk_bdev_io,
            ok: bool,
        ) {
            // SAFETY: the bdev layer gives back the IO that get_buf let go of, still
            // live and not completed: it is wrapped again, once.
            match unsafe { BdevIo::from_raw(io) } {
                Some(io) => G::got_buf(ch, io, ok),
                None => tracing::error!("spdk_bdev_io_get_buf called back without an IO"),
            }
        }
        // SAFETY: a live IO; the callback takes it back.
        unsafe { sys::spdk_bdev_io_get_buf(self.0.as_ptr(), Some(cb::<G>), len) };
    }

    /// The module's per-IO context: `get_ctx_size` bytes at the end of the IO, so
    /// aligned as `spdk_bdev_io` itself; the module's until the IO completes.
    pub fn driver_ctx(&self) -> NonNull<u8> {
        // SAFETY: a field address inside the live IO, no read.
        let p = unsafe { (*self.0.as_ptr()).driver_ctx.as_mut_ptr() };
        NonNull::new(p).unwrap_or(NonNull::dangling())
    }

    /// Completes the IO with `result`: an error of ENOMEM or EAGAIN asks the bdev layer to
    /// submit it again later; any other fails it. As [`complete`](Self::complete), on the
    /// thread the IO was submitted on.
    pub fn complete_with(self, result: Result<(), Errno>) {
        self.complete(Errno::neg_of(result));
    }

    /// Completes the IO: 0 is success; −ENOMEM and −EAGAIN ask the bdev layer to submit
    /// it again later (`SPDK_BDEV_IO_STATUS_NOMEM`); any other negative errno fails it.
    /// Must be called on the thread the IO was submitted on.
    pub fn complete(self, errno: i32) {
        let io = self.0.as_ptr();
        // SAFETY: a live IO, completed once (self is consumed), on its submitting thread
        // (the module's rule, stated above).
        unsafe {
            if errno == 0 {
                sys::spdk_bdev_io_complete(
                    io,
                    sys::spdk_bdev_io_status_SPDK_BDEV_IO_STATUS_SUCCESS,
                );
            } else if errno == -libc::ENOMEM || errno == -libc::EAGAIN {
                sys::spdk_bdev_io_complete(io, sys::spdk_bdev_io_status_SPDK_BDEV_IO_STATUS_NOMEM);
            } else {
                sys::spdk_bdev_io_complete_aio_status(io, errno);
            }
        }
    }
}
