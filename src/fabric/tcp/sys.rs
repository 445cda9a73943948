//! The few socket calls the tcp fabric makes through libc: gathered writes and
//! scattered reads over raw memory (registered memory is never borrowed as a Rust slice,
//! see `fabric::mem`), a zero-timeout poll to learn that a non-blocking connect
//! finished, and the readiness set's epoll calls and io_uring submissions (`ready`). All
//! of the tcp fabric's `unsafe` lives here.

use std::io;
use std::os::fd::RawFd;

/// One contiguous piece of memory for [`send_gather`] / [`recv_scatter`].
pub(crate) type IoVec = libc::iovec;

/// Most pieces one call takes (Linux's `UIO_MAXIOV`).
pub(crate) const IOV_MAX: usize = 1024;

/// An iovec for `len` bytes at `base`.
pub(crate) fn iovec(base: *const u8, len: usize) -> IoVec {
    libc::iovec {
        iov_base: base as *mut libc::c_void,
        iov_len: len,
    }
}

/// `sendmsg(fd, iov, MSG_NOSIGNAL | MSG_DONTWAIT)`: writes as much of the gathered
/// pieces as the socket takes now. `MSG_NOSIGNAL` because a peer that went away must be
/// an error to handle, not a `SIGPIPE` (host applications such as SPDK do not ignore it).
///
/// # Safety
/// Every iovec must describe memory valid for reads for the duration of the call.
///
/// # Errors
/// The OS error (`WouldBlock` when the socket buffer is full).
pub(crate) unsafe fn send_gather(fd: RawFd, iov: &[IoVec]) -> io::Result<usize> {
    let n = iov.len().min(IOV_MAX);
    // SAFETY: an all-zero msghdr is a valid "no address, no control data" header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut IoVec;
    msg.msg_iovlen = n as _;
    // SAFETY: `msg` points at `n` iovecs that the caller guarantees readable; the kernel
    // only reads them.
    let r = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `readv(fd, iov)`: reads what is available into the pieces, in order.
///
/// # Safety
/// Every iovec must describe memory valid for writes for the duration of the call, that
/// nothing else reads or writes meanwhile through a Rust reference.
///
/// # Errors
/// The OS error (`WouldBlock` when nothing is available).
pub(crate) unsafe fn recv_scatter(fd: RawFd, iov: &[IoVec]) -> io::Result<usize> {
    let n = iov.len().min(IOV_MAX);
    // SAFETY: the caller guarantees the pieces are writable; the kernel writes at most
    // their lengths.
    let r = unsafe { libc::readv(fd, iov.as_ptr(), n as libc::c_int) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Whether a socket is writable or has an error pending, without waiting: a
/// non-blocking `connect` has finished (successfully or not) once this is true.
///
/// # Errors
/// The OS error of `poll`.
pub(crate) fn poll_writable(fd: RawFd) -> io::Result<bool> {
    poll_now(
        fd,
        libc::POLLOUT,
        libc::POLLOUT | libc::POLLERR | libc::POLLHUP,
    )
}

/// Whether `fd`, polled for `events` without waiting, reports any of `any`.
fn poll_now(fd: RawFd, events: libc::c_short, any: libc::c_short) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r > 0 && p.revents & any != 0)
}

/// A growable list of iovecs that may move between threads with the connection owning
/// it.
pub(crate) struct IoVecs(Vec<IoVec>);

// SAFETY: the raw pointers inside are plain addresses; the owner (the transmit side of
// one connection) keeps what they point to alive (its own header buffers, or registered
// memory held by `MemRef`s) and uses them from one thread at a time.
unsafe impl Send for IoVecs {}

impl IoVecs {
    pub(crate) fn with_capacity(n: usize) -> IoVecs {
        IoVecs(Vec::with_capacity(n))
    }

    pub(crate) fn push(&mut self, base: *const u8, len: usize) {
        self.0.push(iovec(base, len));
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn as_slice(&self) -> &[IoVec] {
        &self.0
    }

    /// Drops the first `n` written bytes from the pieces starting at `*pos`, advancing
    /// `*pos` past the pieces that are complete and trimming a partly written one.
    /// Returns whether the piece now at `*pos` is partly written.
    pub(crate) fn consume(&mut self, pos: &mut usize, mut n: usize) -> bool {
        let mut partial = false;
        while n > 0 && *pos < self.0.len() {
            let v = &mut self.0[*pos];
            if n >= v.iov_len {
                n -= v.iov_len;
                *pos += 1;
            } else {
                v.iov_base = (v.iov_base as *mut u8).wrapping_add(n) as *mut libc::c_void;
                v.iov_len -= n;
                n = 0;
                partial = true;
            }
        }
        partial
    }
}

/// Whether the peer has shut its side down (or the socket failed), without reading:
/// a stream stalled on receive-not-ready cannot read up to the peer's DISCONNECT or EOF,
/// so it asks the socket directly.
///
/// # Errors
/// The OS error of `poll`.
pub(crate) fn peer_hung_up(fd: RawFd) -> io::Result<bool> {
    poll_now(
        fd,
        libc::POLLRDHUP,
        libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR,
    )
}

impl IoVecs {
    /// Appends the bytes of pieces `from..to` to `out`.
    ///
    /// # Safety
    /// Those pieces must describe memory valid for reads.
    pub(crate) unsafe fn copy_out(&self, from: usize, to: usize, out: &mut Vec<u8>) {
        for v in &self.0[from..to] {
            out.reserve(v.iov_len);
            // SAFETY: the source is readable per the caller's contract (copied through raw
            // pointers, never borrowed: registered memory may change under us); the
            // destination is `out`'s reserved spare capacity, a distinct allocation, and
            // the new length covers exactly the bytes just written.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    v.iov_base as *const u8,
                    out.as_mut_ptr().add(out.len()),
                    v.iov_len,
                );
                out.set_len(out.len() + v.iov_len);
            }
        }
    }

    /// Total bytes of pieces `from..to`.
    pub(crate) fn bytes(&self, from: usize, to: usize) -> usize {
        self.0[from..to].iter().map(|v| v.iov_len).sum()
    }
}

/// Readiness events a socket is watched for: data or EOF (`POLLIN`), the peer's shutdown
/// (`POLLRDHUP`), errors and hang-ups (always reported).
pub(crate) const WATCH_EVENTS: u32 =
    (libc::POLLIN | libc::POLLRDHUP | libc::POLLERR | libc::POLLHUP) as u32;

/// Whether a readiness event's mask (an io_uring poll result, or epoll's events) says
/// the socket hung up or failed; negative results (errors of the poll itself) say no.
pub(crate) fn hung_up(mask: i32) -> bool {
    mask > 0 && mask & i32::from(libc::POLLRDHUP | libc::POLLERR | libc::POLLHUP) != 0
}

/// `epoll_create1(EPOLL_CLOEXEC)`.
///
/// # Errors
/// The OS error.
pub(crate) fn epoll_create() -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: no pointer arguments.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Adds `fd` to the epoll set `ep`, edge-triggered for [`WATCH_EVENTS`], reporting `key`.
///
/// # Errors
/// The OS error.
pub(crate) fn epoll_add(ep: RawFd, fd: RawFd, key: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
        u64: key,
    };
    // SAFETY: `ev` is a valid event the kernel only reads.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds `fd` to the epoll set `ep`, level-triggered for input (and hang-up): for a set
/// whose owner may leave data unread, as a listener's handshake that waits for more.
///
/// # Errors
/// The OS error.
pub(crate) fn epoll_add_level(ep: RawFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        u64: 0,
    };
    // SAFETY: `ev` is a valid event the kernel only reads.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Removes `fd` from the epoll set `ep` (closing `fd` removes it too: errors are the
/// caller's to ignore).
///
/// # Errors
/// The OS error.
pub(crate) fn epoll_del(ep: RawFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: `ev` is a valid event (ignored by EPOLL_CTL_DEL since Linux 2.6.9).
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `epoll_wait(ep, events, 0)`: the events ready now, without waiting.
///
/// # Errors
/// The OS error.
pub(crate) fn epoll_poll(ep: RawFd, events: &mut [libc::epoll_event]) -> io::Result<usize> {
    let max = events.len().min(i32::MAX as usize) as libc::c_int;
    // SAFETY: the kernel writes at most `max` events into `events`.
    let r = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), max, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Queues `sqe` in `ring`'s submission queue; false when the queue is full.
///
/// Only poll requests go through here (`IORING_OP_POLL_ADD`, `IORING_OP_POLL_REMOVE`),
/// which name a file descriptor or a request, never a buffer.
pub(crate) fn uring_push(ring: &mut io_uring::IoUring, sqe: &io_uring::squeue::Entry) -> bool {
    let op = sqe.get_opcode();
    debug_assert!(
        op == u32::from(io_uring::opcode::PollAdd::CODE)
            || op == u32::from(io_uring::opcode::PollRemove::CODE)
    );
    // SAFETY: the entry points at no memory (a poll on a descriptor, or the removal of
    // one by its user data), so nothing must outlive the submission.
    unsafe { ring.submission().push(sqe).is_ok() }
}
