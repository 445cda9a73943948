//! The readiness set of a shared tcp completion queue: which of its sockets have
//! something to read, learnt for all of them at once instead of by a `recv` per socket
//! per poll (what an SPDK sock poll group is to its sockets). See `docs/ARCHITECTURE.md`,
//! "Completion queues".
//!
//! Two backends implement [`Readiness`]:
//! - `uring`: one io_uring per CQ with a multishot `POLL_ADD` per socket. Readiness
//!   events are read from the completion ring in user space; the only system call is an
//!   `io_uring_enter` when the kernel flagged pending work (`IORING_SQ_TASKRUN`: with
//!   cooperative task running the kernel never interrupts the polling thread, it raises
//!   the flag), when a poll must be re-armed, or when a socket joins or leaves. An idle
//!   poll makes none. When the flag is all the ring has, the socket of the last event is
//!   read first instead (its read's return to user space runs the task work), and the
//!   next poll takes the completions: at one request in flight the enter is then off the
//!   data's path.
//! - `epoll`: one epoll set per CQ, sockets edge-triggered, one `epoll_wait(0)` per poll.
//!
//! A poll's wake-ups are completed by task work of the thread that armed it: a ring
//! whose polls were armed on one thread and read on another would see events only when
//! the first enters the kernel or takes a timer tick (milliseconds). So `uring` notes the
//! thread that armed its polls, and when another thread collects, it removes them all and
//! arms them again from there (each removed poll's last completion reports its socket
//! ready, which is harmless, and is what re-arms it).
//!
//! A socket that hung up or failed (its event carried `POLLRDHUP`, `POLLHUP` or
//! `POLLERR`) is reported ready again on every collect (but an early read's) until it
//! leaves the set. Its receive side closes its gate after a short read, taking the
//! socket for drained; but
//! when the peer's FIN or reset came before that read, the EOF or the error waits behind
//! the data it returned, and no later event would announce it (both backends report
//! edges). Reported until unwatched, it is read on every poll until the connection sees
//! it and goes.
//!
//! A key (`u64`, the CQ's slot and its generation) names the socket in events; the CQ
//! ignores an event whose generation is no longer the slot's (a socket that left, its
//! descriptor perhaps reused since), and `uring` drops completions of removed polls
//! itself.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use io_uring::{cqueue, opcode, types, IoUring};

use super::sys;
use crate::fabric::soft::cq::Readiness;

/// How a shared tcp CQ learns which sockets are readable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpReadiness {
    /// io_uring multishot polls, falling back to `Epoll` where io_uring is missing or
    /// refused.
    Uring,
    /// An epoll set, falling back to `None`.
    Epoll,
    /// No readiness set: every poll reads every socket (as a private CQ does).
    None,
}

/// The environment variable that overrides the default mode: `uring`, `epoll`, `none`.
pub const READINESS_ENV: &str = "RTRS_TCP_READINESS";

impl TcpReadiness {
    /// The default: [`READINESS_ENV`] when set to a known mode, else `Uring` (see
    /// `docs/BENCHMARKS.md`, "tcp readiness on a shared CQ").
    pub fn from_env() -> TcpReadiness {
        TcpReadiness::from_env_or(TcpReadiness::Uring)
    }

    /// [`READINESS_ENV`] when set to a known mode, else `default`: `Epoll` for pollers
    /// that sleep when idle, whose thread waits on the set's descriptor
    /// ([`Cq::wait_fd`](crate::fabric::Cq::wait_fd); a ring's readiness events wait for
    /// task work of the polling thread, which a sleeping thread does not run).
    pub fn from_env_or(default: TcpReadiness) -> TcpReadiness {
        match std::env::var(READINESS_ENV) {
            Ok(v) => TcpReadiness::parse(&v).unwrap_or_else(|| {
                tracing::warn!(value = %v, "{READINESS_ENV}: unknown mode (uring, epoll, none); using {default:?}");
                default
            }),
            Err(_) => default,
        }
    }

    /// `uring`, `epoll` or `none`.
    pub fn parse(s: &str) -> Option<TcpReadiness> {
        match s {
            "uring" | "io_uring" => Some(TcpReadiness::Uring),
            "epoll" => Some(TcpReadiness::Epoll),
            "none" => Some(TcpReadiness::None),
            _ => None,
        }
    }
}

/// A readiness set for `mode`, falling back as [`TcpReadiness`] says; `None` for no set.
/// The backend in use is logged once per process (debug).
pub(crate) fn open(mode: TcpReadiness) -> Option<Box<dyn Readiness>> {
    static LOGGED: Once = Once::new();
    let set: Option<Box<dyn Readiness>> = match mode {
        TcpReadiness::None => None,
        TcpReadiness::Uring => match ReadyUring::new() {
            Ok(u) => Some(Box::new(u)),
            Err(e) => {
                tracing::debug!(error = %e, "tcp fabric: io_uring unavailable; readiness by epoll");
                Epoll::new().ok().map(|e| Box::new(e) as Box<dyn Readiness>)
            }
        },
        TcpReadiness::Epoll => Epoll::new().ok().map(|e| Box::new(e) as Box<dyn Readiness>),
    };
    LOGGED.call_once(|| {
        tracing::debug!(
            requested = ?mode,
            using = set.as_ref().map_or("none", |s| s.name()),
            "tcp fabric: shared completion queue readiness"
        );
    });
    set
}

/// Set in the user data of a `POLL_REMOVE` request, with the key of the poll it removes
/// (keys are below 2^63).
const REMOVE_BIT: u64 = 1 << 63;

/// A `POLL_REMOVE` of `key`'s poll.
fn removal(key: u64) -> io_uring::squeue::Entry {
    opcode::PollRemove::new(key)
        .build()
        .user_data(key | REMOVE_BIT)
}

/// Submission queue entries (the completion queue gets twice as many; more completions
/// than that wait in the kernel's overflow list, flushed by the next enter).
const RING_ENTRIES: u32 = 256;

/// The io_uring backend (see the module doc).
pub(crate) struct ReadyUring {
    ring: IoUring,
    /// The key and descriptor watched in each slot (the key's low half).
    slots: Vec<Option<(u64, RawFd)>>,
    /// Submissions queued and not yet entered.
    queued: bool,
    /// Keys whose multishot poll ended, to arm again.
    rearm: Vec<u64>,
    /// Keys whose poll removal found the poll mid-wake-up (`EALREADY`): sent again.
    unremoved: Vec<u64>,
    /// The thread that armed the polls ([`thread_id`]; 0: none yet).
    armer: u64,
    /// Keys of sockets that hung up or failed, reported on every collect that takes the
    /// ring's events (see the module doc).
    hung_up: Vec<u64>,
    /// The socket of the last event taken (or the first watched, before any): where the
    /// next one most likely is.
    hot: Option<u64>,
    /// The last collect reported `hot` on pending task work alone (see
    /// [`ReadyUring::early_guess`]); the next one takes the ring's events in any case.
    early: bool,
}

/// A number for the calling thread, unique in the process and never 0 (a thread-local
/// read after the thread's first call).
fn thread_id() -> u64 {
    thread_local!(static ID: Cell<u64> = const { Cell::new(0) });
    static NEXT: AtomicU64 = AtomicU64::new(1);
    ID.with(|id| match id.get() {
        0 => {
            let v = NEXT.fetch_add(1, Ordering::Relaxed);
            id.set(v);
            v
        }
        v => v,
    })
}

impl ReadyUring {
    pub(crate) fn new() -> io::Result<ReadyUring> {
        ReadyUring::with_entries(RING_ENTRIES)
    }

    /// A ring of `entries` submission entries.
    fn with_entries(entries: u32) -> io::Result<ReadyUring> {
        let ring = IoUring::builder()
            .setup_coop_taskrun()
            .setup_taskrun_flag()
            .build(entries)?;
        Ok(ReadyUring {
            ring,
            slots: Vec::new(),
            queued: false,
            rearm: Vec::new(),
            unremoved: Vec::new(),
            armer: 0,
            hung_up: Vec::new(),
            hot: None,
            early: false,
        })
    }

    /// Moves the polls to the calling thread if another armed them (see the module doc).
    fn follow_thread(&mut self) {
        let me = thread_id();
        if self.armer == me {
            return;
        }
        if self.armer != 0 {
            for i in 0..self.slots.len() {
                if let Some((key, _)) = self.slots[i] {
                    if let Err(e) = self.push(&removal(key)) {
                        tracing::debug!(error = %e, "tcp fabric: io_uring poll move failed");
                    }
                }
            }
        }
        self.armer = me;
    }

    fn push(&mut self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        if !sys::uring_push(&mut self.ring, sqe) {
            self.ring.submit()?;
            if !sys::uring_push(&mut self.ring, sqe) {
                return Err(io::Error::other("io_uring submission queue full"));
            }
        }
        self.queued = true;
        Ok(())
    }

    fn arm(&mut self, fd: RawFd, key: u64) -> io::Result<()> {
        let sqe = opcode::PollAdd::new(types::Fd(fd), sys::WATCH_EVENTS)
            .multi(true)
            .build()
            .user_data(key);
        self.push(&sqe)
    }

    fn submit(&mut self) {
        if let Err(e) = self.ring.submit() {
            // The queued entries stay queued; the next poll tries again.
            tracing::debug!(error = %e, "tcp fabric: io_uring submit failed");
            return;
        }
        self.queued = false;
    }

    fn watched(&self, key: u64) -> Option<RawFd> {
        watched(&self.slots, key)
    }

    /// Whether another thread than the calling one armed the polls.
    fn armed_elsewhere(&self) -> bool {
        self.armer != 0 && self.armer != thread_id()
    }

    /// Whether the only thing the ring has for us is task work, which any system call of
    /// this thread runs on its way out: no overflow, nothing queued to submit, and the
    /// polls armed here.
    fn only_task_work(&mut self) -> bool {
        if self.queued || self.armed_elsewhere() {
            return false;
        }
        let sq = self.ring.submission();
        sq.taskrun() && !sq.cq_overflow()
    }

    /// The socket to read now without entering the kernel, if the ring has nothing but
    /// task work for us and a socket had the last event: most likely its poll woke, and
    /// the read's own return to user space runs the task work, whose completions the
    /// next collect takes (always: no two guesses in a row). A right guess keeps the
    /// enter off the data's path; a wrong one costs one empty read, and the socket that
    /// did wake is reported by the next collect, one poll later. With one request in
    /// flight this is every arrival (`docs/BENCHMARKS.md`, "tcp readiness on a shared
    /// CQ").
    fn early_guess(&mut self) -> Option<u64> {
        if std::mem::take(&mut self.early) {
            return None;
        }
        let hot = self.hot?;
        if self.watched(hot).is_none() || !self.only_task_work() {
            return None;
        }
        self.early = true;
        Some(hot)
    }

    /// Takes the ring's events (entering the kernel first if it has work for us) and
    /// reports each watched socket they name, then those that hung up.
    fn take_events(&mut self, ready: &mut dyn FnMut(u64)) {
        self.follow_thread();
        let pending = {
            let sq = self.ring.submission();
            sq.taskrun() || sq.cq_overflow()
        };
        if pending || self.queued {
            self.submit();
        }
        let slots = &self.slots;
        let hung_up = &mut self.hung_up;
        for cqe in self.ring.completion() {
            let key = cqe.user_data();
            if key & REMOVE_BIT != 0 {
                // A poll whose wake-up is under way (its task work not run yet) cannot
                // be removed: it would stay armed, holding its socket, or stay with the
                // thread that armed it. Try again.
                if cqe.result() == -libc::EALREADY {
                    self.unremoved.push(key & !REMOVE_BIT);
                }
                continue;
            }
            if watched(slots, key).is_none() {
                continue;
            }
            ready(key);
            self.hot = Some(key);
            if sys::hung_up(cqe.result()) && !hung_up.contains(&key) {
                hung_up.push(key);
            }
            if !cqueue::more(cqe.flags()) {
                self.rearm.push(key);
            }
        }
        self.hung_up.retain(|&k| watched(slots, k).is_some());
        for &k in &self.hung_up {
            ready(k);
        }
        while let Some(key) = self.unremoved.pop() {
            if let Err(e) = self.push(&removal(key)) {
                tracing::debug!(error = %e, "tcp fabric: io_uring poll removal failed");
                self.unremoved.push(key);
                break;
            }
        }
        while let Some(key) = self.rearm.pop() {
            if let Some(fd) = self.watched(key) {
                if let Err(e) = self.arm(fd, key) {
                    tracing::debug!(error = %e, "tcp fabric: io_uring re-arm failed");
                    self.rearm.push(key);
                    break;
                }
            }
        }
        if self.queued {
            self.submit();
        }
    }

    /// Test hook: ends `key`'s multishot poll as the kernel may (the poll is removed,
    /// its last completion lacks `IORING_CQE_F_MORE`), without forgetting the socket.
    #[cfg(test)]
    pub(crate) fn end_multishot(&mut self, key: u64) -> io::Result<()> {
        self.push(&removal(key))?;
        self.submit();
        Ok(())
    }
}

impl Readiness for ReadyUring {
    fn name(&self) -> &'static str {
        "uring"
    }

    fn watch(&mut self, fd: RawFd, key: u64) -> io::Result<()> {
        self.follow_thread();
        let slot = key as u32 as usize;
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, None);
        }
        self.arm(fd, key)?;
        // Queued, it will be armed: from here on the slot is watched (and removed by
        // `unwatch`), even if this submission has to wait for the next poll.
        self.slots[slot] = Some((key, fd));
        // Until an event says otherwise, the socket to read first is one still here (a
        // private ring's only one from its first poll on).
        if !self.hot.is_some_and(|h| self.watched(h).is_some()) {
            self.hot = Some(key);
        }
        self.submit();
        Ok(())
    }

    fn unwatch(&mut self, _fd: RawFd, key: u64) {
        if self.watched(key).is_none() {
            return;
        }
        self.slots[key as u32 as usize] = None;
        // The poll holds the socket's file until removed: remove it now, so that a
        // connection that closed its socket is closed for the peer at once.
        match self.push(&removal(key)) {
            Ok(()) => self.submit(),
            Err(e) => {
                tracing::warn!(error = %e, "tcp fabric: io_uring poll removal failed; the socket stays open until the CQ goes")
            }
        }
    }

    fn collect(&mut self, ready: &mut dyn FnMut(u64)) {
        // No guess while the polls are another thread's (`only_task_work`): taking the
        // events moves them here first.
        if let Some(hot) = self.early_guess() {
            ready(hot);
            return;
        }
        self.take_events(ready);
    }
}

/// Submission entries of a private connection's ring: its one poll, its re-arm and a
/// removal when it moves to another thread.
const OWN_RING_ENTRIES: u32 = 8;

/// The readiness source of one connection with a private CQ (see `docs/ARCHITECTURE.md`,
/// "The tcp fabric"): a small io_uring of its own with one multishot poll on its socket,
/// made once the connection is established. The connection's read gate then lets it
/// read only after an event, so an idle `poll_cq` makes no system call.
///
/// A private connection may be polled by any thread, one at a time. When the polling
/// thread changes, the poll armed by the former thread (whose wake-ups run as that
/// thread's task work) is removed and a new one, under a new key, is armed from the new
/// thread at once, and the gate opens once for what arrived meanwhile: nothing waits
/// for the former thread to enter the kernel. The old poll's late completions carry a
/// key no longer watched and are dropped.
pub(crate) struct Own {
    ring: Option<ReadyUring>,
    /// The socket watched (in `ring`), and the generation of its key.
    fd: Option<RawFd>,
    gen: u32,
    /// The ring could not be made or refused the socket: the connection reads on every
    /// poll, for good (no failing call per poll).
    refused: bool,
}

impl Own {
    pub(crate) fn new() -> Own {
        Own {
            ring: None,
            fd: None,
            gen: 0,
            refused: false,
        }
    }

    /// The key of the current poll: generation `gen`, slot 0 (never zero, top bit clear).
    fn key(&self) -> u64 {
        u64::from(self.gen) << 32
    }

    /// Whether the socket is watched (its reads gated).
    pub(crate) fn watching(&self) -> bool {
        self.fd.is_some()
    }

    /// Watches `fd`; false if the ring cannot be had or refused it (then never again).
    pub(crate) fn join(&mut self, fd: RawFd) -> bool {
        if self.refused {
            return false;
        }
        if self.ring.is_none() {
            match ReadyUring::with_entries(OWN_RING_ENTRIES) {
                Ok(r) => self.ring = Some(r),
                Err(e) => {
                    tracing::debug!(error = %e, "tcp fabric: no io_uring for a private connection; it reads on every poll");
                    self.refused = true;
                    return false;
                }
            }
        }
        if self.arm(fd) {
            self.fd = Some(fd);
            true
        } else {
            self.refused = true;
            self.ring = None;
            false
        }
    }

    /// Arms a poll on `fd` under a new key.
    fn arm(&mut self, fd: RawFd) -> bool {
        self.gen = if self.gen >= (1 << 31) - 1 {
            1
        } else {
            self.gen + 1
        };
        let key = self.key();
        let Some(r) = self.ring.as_mut() else {
            return false;
        };
        match r.watch(fd, key) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %e, "tcp fabric: io_uring refused a private connection's socket; it reads on every poll");
                false
            }
        }
    }

    /// Takes the socket out of the ring: its poll (which holds the socket's file) is
    /// removed now, before the socket closes, and the ring goes. A removal that meets
    /// the poll mid-wake-up (`EALREADY`) would have to be sent again from a later
    /// collect, which a connection no longer watching makes no more: closing the ring
    /// cancels whatever it still holds.
    pub(crate) fn leave(&mut self) {
        let key = self.key();
        if let (Some(fd), Some(r)) = (self.fd.take(), self.ring.as_mut()) {
            r.unwatch(fd, key);
        }
        self.ring = None;
    }

    /// Takes the socket out of the ring and keeps the ring, for a connection read on
    /// every poll for a while (`TcpConn::pace_own`): [`Own::join`] arms it again.
    pub(crate) fn pause(&mut self) {
        let key = self.key();
        if let (Some(fd), Some(r)) = (self.fd.take(), self.ring.as_mut()) {
            r.unwatch(fd, key);
        }
    }

    /// Reports whether the socket may be readable since the last call (an event, or a
    /// move to this thread).
    pub(crate) fn collect(&mut self) -> bool {
        let Some(fd) = self.fd else { return false };
        let key = self.key();
        let Some(r) = self.ring.as_mut() else {
            return false;
        };
        let mut ready = false;
        if r.armed_elsewhere() {
            // Moved to this thread: the old poll goes, a new one is armed from here.
            r.unwatch(fd, key);
            ready = true;
            if !self.arm(fd) {
                // Read on every poll from here on (the gate is told by the caller).
                self.fd = None;
                self.refused = true;
                return true;
            }
        }
        let key = self.key();
        if let Some(r) = self.ring.as_mut() {
            // Task work alone pending is, with our socket the ring's only one, its event
            // on the way: read now (`ReadyUring::early_guess`).
            r.collect(&mut |k| ready |= k == key);
        }
        ready
    }
}

/// The descriptor watched under `key`, if its slot still holds that key.
fn watched(slots: &[Option<(u64, RawFd)>], key: u64) -> Option<RawFd> {
    match slots.get(key as u32 as usize) {
        Some(Some((k, fd))) if *k == key => Some(*fd),
        _ => None,
    }
}

/// The epoll backend (see the module doc).
pub(crate) struct Epoll {
    ep: OwnedFd,
    events: Vec<libc::epoll_event>,
    /// Keys of sockets that hung up or failed (see the module doc).
    hung_up: Vec<u64>,
}

/// Events taken per `epoll_wait` call.
const EPOLL_BATCH: usize = 64;

impl Epoll {
    pub(crate) fn new() -> io::Result<Epoll> {
        Ok(Epoll {
            ep: sys::epoll_create()?,
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EPOLL_BATCH],
            hung_up: Vec::new(),
        })
    }
}

impl Readiness for Epoll {
    fn name(&self) -> &'static str {
        "epoll"
    }

    /// The epoll set itself: readable while one of its sockets has an event not yet
    /// collected (edge-triggered sockets raise one per arrival).
    fn wait_fd(&self) -> Option<RawFd> {
        Some(self.ep.as_raw_fd())
    }

    fn watch(&mut self, fd: RawFd, key: u64) -> io::Result<()> {
        sys::epoll_add(self.ep.as_raw_fd(), fd, key)
    }

    fn unwatch(&mut self, fd: RawFd, key: u64) {
        self.hung_up.retain(|&k| k != key);
        // A closed socket has left the set already (the error then says so).
        let _ = sys::epoll_del(self.ep.as_raw_fd(), fd);
    }

    fn collect(&mut self, ready: &mut dyn FnMut(u64)) {
        for &k in &self.hung_up {
            ready(k);
        }
        loop {
            let n = match sys::epoll_poll(self.ep.as_raw_fd(), &mut self.events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "tcp fabric: epoll_wait failed");
                    return;
                }
            };
            for ev in &self.events[..n] {
                let (key, mask) = (ev.u64, ev.events);
                ready(key);
                if sys::hung_up(mask as i32) && !self.hung_up.contains(&key) {
                    self.hung_up.push(key);
                }
            }
            if n < self.events.len() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
