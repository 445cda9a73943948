//! A completion queue shared by software connections (the `loopback` and `tcp` fabrics'
//! `ibv_cq`).
//!
//! Each connection's progress state (`T`, the backend's connection: soft queue pair,
//! link or socket, CM state) lives in a cell the CQ lists and the caller's [`Conn`], a
//! [`CqConn`], points to. A [`Cq::poll`] drives the connections of the queue that its
//! thread holds (delivery, socket reads and writes), one at a time, and the readiness of
//! all of them is watched at once (below). The queue and each
//! connection are [`OwnedByThread`]: one thread at a time, checked per call with a plain
//! load, no lock and no read-modify-write on the data path.
//!
//! A connection belongs to the thread that made it; [`Conn::release_thread`] lets it go,
//! and the next thread to use it takes it. The CQ drives and gathers only connections
//! its own thread holds, so a connection being set up on a control thread is left alone
//! until it is handed to the CQ's thread and used there; its completions wait in its own
//! queue meanwhile. A new connection reaches the CQ's list at its next poll, through a
//! small locked list (connection set-up, not the data path).
//!
//! **A poll is one connection's turn.** Connections are driven one at a time, in turn
//! from the one after the last turn's; the first that has completions gets them handed
//! out and the poll returns, so the next poll goes on with the next connection. The
//! polls up to one that returns nothing are a round: every connection is driven once in
//! it (one more poll ends a round whose last connection had completions), so a caller
//! that polls until nothing comes gives each connection one turn. No connection is driven
//! (no data of it placed in memory) between another connection's placement and the
//! moment the caller has that connection's completions: the order of a private CQ per
//! connection, read and handled one after the other, which RTRS's server relies on when
//! two paths carry copies of one request into the same chunk (docs/ARCHITECTURE.md,
//! "Completion queues" and "Failover without double execution hazards"). Completions of
//! a turn that do not fit the caller's slice are handed out by the next polls before any
//! other connection is driven, and without driving that one again, so its turn ends and
//! a connection with a stream of completions holds back no other. (Progress a caller
//! makes outside the CQ, a CM poll, reports at that connection's next turn.)
//!
//! Completions stay in each connection's own queue until handed out, so per-connection
//! order is the queue pair's. The CQ counts the completions each connection holds
//! whenever it drives or drains it; more in all than the CQ's entries is an overrun
//! ([`CqEvent::Overrun`]): every connection breaks, as a verbs QP whose CQ is in error
//! does.
//!
//! A backend may give the queue a [`Readiness`] set (tcp: io_uring or epoll over its
//! sockets), read once per poll. A member that offers a descriptor ([`Member::ready_fd`])
//! joins the set once it has one and is told so ([`Member::set_watched`]); from then on it
//! reads only after the set reported it ready ([`Member::set_readable`]), so an idle poll
//! reads no socket. Events are kept per slot until the member's thread holds it, so none is
//! lost while a member is held elsewhere; a slot's generation, part of the key, makes
//! events of a member that left harmless. Where no thread sleeps on the set (it has no
//! wait descriptor), a member whose progress left completions leaves it and is read on
//! every poll until it has found none for [`DIRECT_IDLE_POLLS`] polls (`docs/ARCHITECTURE.md`,
//! "A busy socket is read on every poll").

use std::any::Any;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::MrTable;
use crate::fabric::cq::{thread_token, OwnedByThread, ThreadToken};
use crate::fabric::SetupCause;
use crate::fabric::{
    CmEvent, Conn, ConnState, Cq, CqBackend, CqEvent, CqRef, FabricError, FabricKind, PostError,
    PostErrorKind, QpCaps, RecvWr, SendOp, SendWr, Wc, WcStatus,
};
use crate::sync::lock;

/// Largest software CQ (entries).
pub const MAX_CQ_ENTRIES: u32 = 1 << 22;

/// A backend connection that can live on a shared CQ.
pub trait Member: Conn + 'static {
    /// The protection domain (fabric instance) the connection belongs to: a CQ takes
    /// connections of its own fabric only, whose `qp_num`s are distinct.
    fn table(&self) -> &Arc<MrTable>;
    /// Makes progress (delivery, socket I/O, CM) without taking completions.
    fn progress(&mut self);
    /// Completions generated and not yet taken.
    fn queued(&self) -> usize;
    /// Moves up to `wcs.len()` completions into `wcs`, in order, without progress.
    fn drain(&mut self, wcs: &mut [Wc]) -> usize;
    /// The descriptor a [`Readiness`] set may watch for this connection now (a tcp
    /// socket once connected), `None` when it has none or must be polled as before.
    fn ready_fd(&self) -> Option<RawFd> {
        None
    }
    /// The connection joined (`true`) or left the CQ's readiness set. While in it, it
    /// reads only after [`Member::set_readable`]; joining makes it readable once.
    fn set_watched(&mut self, _on: bool) {}
    /// The readiness set reported the descriptor readable (or hung up, or in error).
    fn set_readable(&mut self) {}
}

/// Which of a CQ's descriptors are ready, for all of them at once (see the module doc).
/// `key`s are the CQ's own, never zero and below 2^63; an implementation reports a watched
/// key as often as it likes, never one it no longer watches after [`Readiness::unwatch`]
/// returned, except that events already collected may name it.
pub trait Readiness: Send {
    /// The backend's name, for logs.
    fn name(&self) -> &'static str;
    /// Starts watching `fd` under `key`.
    ///
    /// # Errors
    /// The OS error; the member is then polled as if there were no set.
    fn watch(&mut self, fd: RawFd, key: u64) -> io::Result<()>;
    /// Stops watching `fd` (watched under `key`); `fd` may be closed already.
    fn unwatch(&mut self, fd: RawFd, key: u64);
    /// Calls `ready` with the key of every descriptor that became ready since the last
    /// call, without waiting.
    fn collect(&mut self, ready: &mut dyn FnMut(u64));
    /// A descriptor readable while an event waits to be collected ([`Cq::wait_fd`]),
    /// if the set has one that a sleeping thread can wait on. Default: none.
    fn wait_fd(&self) -> Option<RawFd> {
        None
    }
}

/// A member's place in the readiness set.
#[derive(Clone, Copy)]
struct Watch {
    slot: u32,
    fd: RawFd,
}

/// One slot of the readiness set: its current generation, and whether an event for it
/// waits to be handed to its member.
#[derive(Clone, Copy, Default)]
struct Slot {
    gen: u32,
    used: bool,
    ready: bool,
    /// Out of the set and read on every poll while it finds work (see [`Ready::active`]),
    /// with its descriptor; polls since it last found some.
    direct: Option<RawFd>,
    idle: u32,
}

impl Slot {
    fn key(&self, slot: u32) -> u64 {
        (u64::from(self.gen) << 32) | u64::from(slot)
    }
}

/// A member of the CQ: its cell, and its slot in the readiness set if it is in it.
struct Entry<T> {
    cell: Arc<Cell<T>>,
    watch: Option<Watch>,
    /// The set refused its descriptor: it is polled as without a set, for good (no
    /// failing call per poll).
    refused: bool,
    /// Its completions as last counted (after its progress or drain), part of
    /// [`Core::held`].
    held: usize,
}

/// The readiness set with its slots.
struct Ready {
    set: Box<dyn Readiness>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// No thread sleeps on the set (it has no wait descriptor): an active member may
    /// leave it and be read on every poll.
    direct_ok: bool,
    /// The slots out of the set and read on every poll (`Slot::direct` set), so that a
    /// poll looks at those only.
    direct: Vec<u32>,
}

/// Polls without work after which a connection read on every poll goes back to its
/// readiness set (a shared CQ's members here, a private tcp connection its own ring).
pub(crate) const DIRECT_IDLE_POLLS: u32 = 4096;

impl Ready {
    /// Takes the set's events into the slots.
    fn collect(&mut self) {
        let slots = &mut self.slots;
        let set = &mut self.set;
        self.direct.retain(|&i| {
            let s = &mut slots[i as usize];
            let Some(fd) = s.direct else { return false };
            s.ready = true;
            s.idle += 1;
            if s.idle <= DIRECT_IDLE_POLLS {
                return true;
            }
            // Idle: back in the set, read once more for what came before it was armed.
            s.idle = 0;
            if set.watch(fd, s.key(i)).is_err() {
                return true;
            }
            s.direct = None;
            false
        });
        self.set.collect(&mut |key| {
            let (gen, slot) = ((key >> 32) as u32, key as u32);
            if let Some(s) = slots.get_mut(slot as usize) {
                if s.used && s.gen == gen {
                    s.ready = true;
                }
            }
        });
    }

    /// Puts `fd` in the set; `None` if the set refused it.
    fn join(&mut self, fd: RawFd) -> Option<Watch> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::default());
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[slot as usize];
        // Generations run 1..2^31, so that no key is zero or has its top bit set
        // (`Readiness` implementations may tag their own requests with it).
        s.gen = if s.gen >= (1 << 31) - 1 { 1 } else { s.gen + 1 };
        s.used = true;
        s.ready = false;
        let key = s.key(slot);
        match self.set.watch(fd, key) {
            Ok(()) => Some(Watch { slot, fd }),
            Err(e) => {
                tracing::debug!(error = %e, backend = self.set.name(), "readiness set refused a socket; polling it");
                self.slots[slot as usize].used = false;
                self.free.push(slot);
                None
            }
        }
    }

    fn leave(&mut self, w: Watch) {
        let s = &mut self.slots[w.slot as usize];
        let key = s.key(w.slot);
        s.used = false;
        s.ready = false;
        s.idle = 0;
        if s.direct.take().is_some() {
            self.direct.retain(|&i| i != w.slot);
        } else {
            self.set.unwatch(w.fd, key);
        }
        self.free.push(w.slot);
    }

    /// `w`'s member found work: where no thread sleeps on the set, it leaves the set
    /// and is read on every poll until it has found none for [`DIRECT_IDLE_POLLS`] polls.
    fn active(&mut self, w: Watch) {
        let s = &mut self.slots[w.slot as usize];
        s.idle = 0;
        if self.direct_ok && s.direct.is_none() && s.used {
            let key = s.key(w.slot);
            s.direct = Some(w.fd);
            self.direct.push(w.slot);
            self.set.unwatch(w.fd, key);
        }
    }

    /// Whether an event waits for `w`'s member (and forgets it).
    fn take(&mut self, w: Watch) -> bool {
        std::mem::take(&mut self.slots[w.slot as usize].ready)
    }
}

/// Brings `t`'s membership of the readiness set up to date after its progress.
fn reconcile<T: Member>(
    ready: &mut Option<Ready>,
    watch: &mut Option<Watch>,
    refused: &mut bool,
    t: &mut T,
) {
    let Some(r) = ready.as_mut() else { return };
    if *refused {
        return;
    }
    let fd = t.ready_fd();
    match (*watch, fd) {
        (Some(w), Some(fd)) if w.fd == fd => {}
        (None, None) => {}
        (w, fd) => {
            if let Some(w) = w {
                r.leave(w);
                *watch = None;
                t.set_watched(false);
            }
            if let Some(fd) = fd {
                *watch = r.join(fd);
                if watch.is_some() {
                    t.set_watched(true);
                } else {
                    *refused = true;
                }
            }
        }
    }
}

/// What driving a member found.
enum Drive {
    /// It holds this many completions.
    Queued(usize),
    /// Another thread holds it.
    Elsewhere,
    /// It is gone, and removed from the list.
    Gone,
}

/// One connection's state: `None` once its handle dropped it.
struct Cell<T> {
    conn: OwnedByThread<Option<T>>,
    /// The handle was dropped: the CQ's next poll forgets the cell (and drops the state
    /// if the handle's thread could not, not holding it).
    abandoned: AtomicBool,
}

struct Core<T> {
    entries: usize,
    members: Vec<Entry<T>>,
    /// The readiness set, if the backend gave one.
    ready: Option<Ready>,
    /// The member whose turn comes next: the one after the member whose completions the
    /// last poll handed out, or that member itself while it is `owed` some.
    next: usize,
    /// Completions of the member at `next`'s turn that did not fit the caller's slice
    /// (what progress outside the CQ adds meanwhile waits for its next turn).
    owed: usize,
    /// Members still to be driven in this round (each member has one turn per round).
    round_left: usize,
    /// The round's last member had its turn: the next call says so (returns nothing).
    round_end: bool,
    /// Completions held by the members, as last counted per member.
    held: usize,
    event: Option<CqEvent>,
}

impl<T> Core<T> {
    /// Member `i` holds `q` completions now.
    #[inline]
    fn count(&mut self, i: usize, q: usize) {
        let e = &mut self.members[i];
        self.held = self.held - e.held + q;
        e.held = q;
    }
}

/// What the queue and whoever makes connections on it share (the [`CqRef`]).
pub struct Shared<T> {
    /// The protection domain of the fabric that made the CQ.
    table: Arc<MrTable>,
    /// Connections made since the last poll.
    incoming: Mutex<Vec<Arc<Cell<T>>>>,
    has_incoming: AtomicBool,
    /// Overrun: the CQ is in error (readable by any thread making a connection).
    broken: AtomicBool,
}

impl<T: Member> Shared<T> {
    fn take_incoming(&self, core: &mut Core<T>) {
        if !self.has_incoming.load(Ordering::Acquire) {
            return;
        }
        let mut inc = lock(&self.incoming);
        self.has_incoming.store(false, Ordering::Release);
        if core.round_left > 0 {
            // Appended at the end of the list: they join the round under way (exactly
            // so unless it has wrapped past the end).
            core.round_left += inc.len();
        }
        core.members.extend(inc.drain(..).map(|cell| Entry {
            cell,
            watch: None,
            refused: false,
            held: 0,
        }));
    }

    /// Drives member `i` (see [`Shared::poll`]): progress if this thread holds it, then
    /// the overrun check; a member gone is removed (the next one takes index `i`).
    fn drive(&self, core: &mut Core<T>, i: usize, me: ThreadToken, broken: bool) -> Drive {
        let Core {
            members,
            ready,
            held,
            ..
        } = core;
        let Some(Entry {
            cell,
            watch,
            refused,
            held: counted,
        }) = members.get_mut(i)
        else {
            return Drive::Gone;
        };
        if cell.abandoned.load(Ordering::Acquire) {
            // The handle is gone (and let go of it): the state goes, here if it is still
            // there, and the cell with it (and its socket the readiness set).
            if cell.conn.with_as(me, true, |c| *c = None).is_none() {
                return Drive::Elsewhere;
            }
        } else {
            // Progress for a connection this thread holds (a member held by another
            // thread is left alone). On a CQ in error, a connection taken over since the
            // overrun breaks too.
            let queued = cell.conn.with_as(me, false, |c| {
                c.as_mut().map(|t| {
                    if broken {
                        t.disconnect();
                    }
                    if let (Some(r), Some(w)) = (ready.as_mut(), *watch) {
                        if r.take(w) {
                            t.set_readable();
                        }
                    }
                    t.progress();
                    let q = t.queued();
                    if q > 0 {
                        if let (Some(r), Some(w)) = (ready.as_mut(), *watch) {
                            r.active(w);
                        }
                    }
                    reconcile(ready, watch, refused, t);
                    q
                })
            });
            match queued {
                // Held elsewhere: what it holds is not this CQ's to count until it is back.
                None => {
                    *held -= std::mem::take(counted);
                    return Drive::Elsewhere;
                }
                Some(Some(q)) => {
                    core.count(i, q);
                    if q > 0 && !broken && core.held > core.entries {
                        let held = core.held;
                        self.overrun(core, held);
                    }
                    return Drive::Queued(q);
                }
                // Its state went with its handle on the handle's thread.
                Some(None) => {}
            }
        }
        if let (Some(r), Some(w)) = (ready.as_mut(), watch.take()) {
            r.leave(w);
        }
        *held -= *counted;
        members.remove(i);
        Drive::Gone
    }

    /// Hands out up to `room` completions of member `i` (`None`: not this thread's or
    /// gone); the completions it still holds.
    fn drain(
        &self,
        core: &mut Core<T>,
        i: usize,
        me: ThreadToken,
        wcs: &mut [Wc],
    ) -> Option<(usize, usize)> {
        let got = core.members.get(i).and_then(|e| {
            e.cell
                .conn
                .with_as(me, false, |c| {
                    c.as_mut().map(|t| (t.drain(wcs), t.queued()))
                })
                .flatten()
        });
        if let Some((_, q)) = got {
            core.count(i, q);
        }
        got
    }

    /// A turn is over (the next one is member `next`'s); the round's too if that was
    /// the round's last.
    fn turn_over(core: &mut Core<T>, next: usize) {
        core.owed = 0;
        core.next = next;
        core.round_end = core.round_left == 0;
    }

    /// One call (see the module doc): the rest of a turn that did not fit; else the end
    /// of a round (nothing); else members driven one at a time from `next` until one has
    /// completions, which are handed out before any other member is driven.
    fn poll(&self, core: &mut Core<T>, wcs: &mut [Wc]) -> usize {
        self.take_incoming(core);
        let me = thread_token();
        let broken = self.broken.load(Ordering::Relaxed);
        if core.owed > 0 {
            let i = core.next;
            if wcs.is_empty() {
                // Nothing can be handed out: progress for that member alone (what it
                // adds is owed too), so a caller that only makes progress makes it.
                if let Some(r) = core.ready.as_mut() {
                    r.collect();
                }
                match self.drive(core, i, me, broken) {
                    Drive::Queued(q) if q > 0 => core.owed = core.owed.max(q),
                    Drive::Gone => Self::turn_over(core, i),
                    _ => Self::turn_over(core, i + 1),
                }
                return 0;
            }
            // Its data is placed and part of its completions handed out: the rest goes
            // before any other member is driven (no progress for it either).
            let room = wcs.len().min(core.owed);
            match self.drain(core, i, me, &mut wcs[..room]) {
                Some((got, q)) => {
                    core.owed = (core.owed - got).min(q);
                    if core.owed == 0 {
                        Self::turn_over(core, i + 1);
                    }
                    return got;
                }
                // Gone, or taken by another thread (whose completions wait in it).
                None => Self::turn_over(core, i + 1),
            }
        }
        if core.round_end {
            // Every member had its turn since the round began.
            core.round_end = false;
            return 0;
        }
        if core.round_left == 0 {
            core.round_left = core.members.len();
        }
        if let Some(r) = core.ready.as_mut() {
            r.collect();
        }
        let mut i = core.next;
        while core.round_left > 0 {
            if i >= core.members.len() {
                i = 0;
            }
            core.round_left -= 1;
            match self.drive(core, i, me, broken) {
                Drive::Gone => continue,
                Drive::Elsewhere | Drive::Queued(0) => i += 1,
                Drive::Queued(_) => {
                    let (got, q) = self.drain(core, i, me, wcs).unwrap_or((0, 0));
                    core.next = i;
                    core.owed = q;
                    if q == 0 {
                        Self::turn_over(core, i + 1);
                    }
                    return got;
                }
            }
        }
        // The round is over, with nothing in its last calls.
        core.next = i;
        0
    }

    fn overrun(&self, core: &mut Core<T>, held: usize) {
        tracing::warn!(
            held,
            entries = core.entries,
            "software completion queue overrun; its connections break"
        );
        self.broken.store(true, Ordering::Relaxed);
        core.event = Some(CqEvent::Overrun);
        let me = thread_token();
        for Entry { cell, .. } in &core.members {
            // One held by another thread breaks once the CQ's thread has taken it.
            cell.conn
                .with_as(me, false, |c| c.as_mut().map(|t| t.disconnect()));
        }
    }
}

/// A software fabric's shared completion queue for connections of type `T`.
pub struct SoftCq<T: Member> {
    shared: Arc<Shared<T>>,
    core: Core<T>,
    entries: u32,
}

/// Creates a CQ of `entries` entries for the connections of the fabric whose protection
/// domain is `table`.
///
/// # Errors
/// [`FabricError::Cq`] for 0 or more than [`MAX_CQ_ENTRIES`] entries.
pub fn create<T: Member>(
    kind: FabricKind,
    table: &Arc<MrTable>,
    entries: u32,
) -> Result<Cq, FabricError> {
    create_with::<T>(kind, table, entries, None)
}

/// [`create`], with a readiness set for the members' descriptors.
///
/// # Errors
/// As [`create`].
pub fn create_with<T: Member>(
    kind: FabricKind,
    table: &Arc<MrTable>,
    entries: u32,
    readiness: Option<Box<dyn Readiness>>,
) -> Result<Cq, FabricError> {
    if entries == 0 || entries > MAX_CQ_ENTRIES {
        return Err(FabricError::Cq {
            cause: SetupCause::refused(format!(
                "{entries} entries is outside 1..={MAX_CQ_ENTRIES}"
            )),
        });
    }
    let core = Core::<T> {
        entries: entries as usize,
        members: Vec::new(),
        ready: readiness.map(|set| Ready {
            direct_ok: set.wait_fd().is_none(),
            set,
            slots: Vec::new(),
            free: Vec::new(),
            direct: Vec::new(),
        }),
        next: 0,
        owed: 0,
        round_left: 0,
        round_end: false,
        held: 0,
        event: None,
    };
    let shared = Arc::new(Shared {
        table: table.clone(),
        incoming: Mutex::new(Vec::new()),
        has_incoming: AtomicBool::new(false),
        broken: AtomicBool::new(false),
    });
    Ok(Cq::new(
        kind,
        Box::new(SoftCq {
            shared,
            core,
            entries,
        }),
    ))
}

/// Whether `cq` can take connections of type `T` made by the fabric of `table`.
///
/// # Errors
/// [`FabricError::Cq`] naming why not.
pub fn check<T: Member>(cq: &CqRef, table: &Arc<MrTable>) -> Result<(), FabricError> {
    match cq.backend().downcast_ref::<Shared<T>>() {
        Some(shared) if !shared.table.same_device(table) => Err(FabricError::Cq {
            cause: SetupCause::refused(format!(
                "the {} completion queue belongs to another fabric instance",
                cq.kind()
            )),
        }),
        Some(shared) if shared.broken.load(Ordering::Relaxed) => Err(FabricError::Cq {
            cause: SetupCause::refused("the completion queue overran and is in error"),
        }),
        Some(_) => Ok(()),
        None => Err(FabricError::Cq {
            cause: SetupCause::refused(format!(
                "a {} completion queue cannot take a connection of this fabric",
                cq.kind()
            )),
        }),
    }
}

/// The connection `make` makes, on `cq` where one is given, else boxed by `own`. The CQ
/// is checked first, so a refusal makes no connection and leaves no request behind at
/// the peer.
pub fn make_on<T: Member>(
    cq: Option<&CqRef>,
    table: &Arc<MrTable>,
    make: impl FnOnce() -> Result<T, FabricError>,
    own: impl FnOnce(T) -> Box<dyn Conn>,
) -> Result<Box<dyn Conn>, FabricError> {
    match cq {
        Some(cq) => {
            check::<T>(cq, table)?;
            attach(cq, make()?)
        }
        None => Ok(own(make()?)),
    }
}

/// Puts `conn` on `cq` (a [`SoftCq`] of `conn`'s fabric, see [`check`]) and returns
/// its handle, held by the calling thread.
///
/// # Errors
/// [`FabricError::Cq`] when `cq` is not for `conn` or is in error.
pub fn attach<T: Member>(cq: &CqRef, conn: T) -> Result<Box<dyn Conn>, FabricError> {
    check::<T>(cq, conn.table())?;
    let Some(shared) = cq.backend().downcast_ref::<Shared<T>>() else {
        return Err(FabricError::Cq {
            cause: SetupCause::refused("not a software completion queue"),
        });
    };
    let (qp_num, caps) = (conn.qp_num(), conn.caps());
    let cell = Arc::new(Cell {
        conn: OwnedByThread::new(Some(conn)),
        abandoned: AtomicBool::new(false),
    });
    // The maker holds it until it lets go (Conn::release_thread).
    cell.conn.with(|_| ());
    lock(&shared.incoming).push(cell.clone());
    shared.has_incoming.store(true, Ordering::Release);
    Ok(Box::new(CqConn { cell, qp_num, caps }))
}

impl<T: Member> CqBackend for SoftCq<T> {
    fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        self.shared.poll(&mut self.core, wcs)
    }

    fn poll_event(&mut self) -> Option<CqEvent> {
        self.core.event.take()
    }

    fn entries(&self) -> u32 {
        self.entries
    }

    fn share(&self) -> Arc<dyn Any + Send + Sync> {
        self.shared.clone()
    }

    fn wait_fd(&self) -> Option<RawFd> {
        self.core.ready.as_ref().and_then(|r| r.set.wait_fd())
    }
}

/// A connection on a shared software CQ: the caller's handle to its state.
pub struct CqConn<T: Member> {
    cell: Arc<Cell<T>>,
    qp_num: u32,
    caps: QpCaps,
}

impl<T: Member> CqConn<T> {
    /// Runs `f` on the connection's state, if the calling thread holds it (taking it
    /// when nobody does).
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.cell.conn.with(|c| c.as_mut().map(f)).flatten()
    }
}

const WRONG_THREAD: PostError = PostError {
    index: 0,
    kind: PostErrorKind::WrongThread,
};

impl<T: Member> Conn for CqConn<T> {
    fn post_send(&mut self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.with(|c| c.post_send(wrs)).unwrap_or(Err(WRONG_THREAD))
    }

    fn post_recv(&mut self, wrs: &[RecvWr]) -> Result<(), PostError> {
        self.with(|c| c.post_recv(wrs)).unwrap_or(Err(WRONG_THREAD))
    }

    fn local_now(&mut self, op: &SendOp<'_>) -> Option<Result<(), WcStatus>> {
        self.with(|c| c.local_now(op)).flatten()
    }

    fn poll_cq(&mut self, _wcs: &mut [Wc]) -> usize {
        // Completions belong to the shared CQ; this only makes progress.
        self.with(Member::progress);
        0
    }

    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn release_thread(&self) {
        self.cell.conn.release();
    }

    fn push(&mut self) {
        self.with(Conn::push);
    }

    fn poll_cm(&mut self) -> Option<CmEvent> {
        self.with(|c| c.poll_cm()).flatten()
    }

    fn disconnect(&mut self) {
        self.with(|c| c.disconnect());
    }

    fn state(&self) -> ConnState {
        self.with(|c| c.state()).unwrap_or(ConnState::Disconnected)
    }

    fn caps(&self) -> QpCaps {
        self.caps
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.with(|c| c.peer_addr()).flatten()
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.with(|c| c.local_addr()).flatten()
    }

    fn failure(&self) -> Option<String> {
        self.with(|c| c.failure()).flatten()
    }
}

impl<T: Member> Drop for CqConn<T> {
    /// The connection's state goes as the backend's own connection goes when dropped
    /// (the peer sees it close); the CQ forgets it at its next poll.
    fn drop(&mut self) {
        self.cell.conn.with(|c| *c = None);
        self.cell.abandoned.store(true, Ordering::Release);
        self.cell.conn.release();
    }
}

#[cfg(test)]
mod tests;
