//! A completion queue shared by software connections (the `loopback` and `tcp` fabrics'
//! `ibv_cq`).
//!
//! The CQ owns its connections' progress state (`T`, the backend's connection: soft
//! queue pair, link or socket, CM state) in a slab; the [`Conn`] a caller holds is a
//! [`CqConn`], a handle naming its slot. So one [`Cq::poll`] drives every connection of
//! the queue (delivery, socket reads and writes) and gathers their completions, and a
//! backend can later watch the readiness of all of them at once. The handles and the
//! queue reach the slab through [`OwnedByThread`]: one thread at a time, checked per
//! call with a plain load, no lock and no read-modify-write on the data path.
//!
//! Completions stay in each connection's own queue until gathered, so per-connection
//! order is the queue pair's. Gathering takes connections in turn from where the last
//! full poll stopped, so a connection with a stream of completions cannot hold back the
//! others. After each poll's progress, more completions held than the CQ's entries is an
//! overrun ([`CqEvent::Overrun`]): every connection breaks, as a verbs QP whose CQ is in
//! error does.

use std::any::Any;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::MrTable;
use crate::fabric::cq::OwnedByThread;
use crate::fabric::{
    CmEvent, Conn, ConnState, Cq, CqBackend, CqEvent, FabricError, FabricKind, PostError,
    PostErrorKind, QpCaps, RecvWr, SendWr, Wc,
};

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
}

struct Core<T> {
    entries: usize,
    members: Vec<Option<T>>,
    free: Vec<usize>,
    /// Where the next gathering starts (the connection after the one that filled the
    /// caller's slice last time).
    next: usize,
    /// Overrun: the CQ is in error.
    broken: bool,
    event: Option<CqEvent>,
}

impl<T: Member> Core<T> {
    fn insert(&mut self, conn: T) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.members[i] = Some(conn);
                i
            }
            None => {
                self.members.push(Some(conn));
                self.members.len() - 1
            }
        }
    }

    fn remove(&mut self, slot: usize) {
        if let Some(m) = self.members.get_mut(slot) {
            if m.take().is_some() {
                self.free.push(slot);
            }
        }
    }

    fn member(&mut self, slot: usize) -> Option<&mut T> {
        self.members.get_mut(slot).and_then(Option::as_mut)
    }

    fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        for m in self.members.iter_mut().flatten() {
            m.progress();
        }
        if !self.broken {
            let held: usize = self.members.iter().flatten().map(Member::queued).sum();
            if held > self.entries {
                self.overrun(held);
            }
        }
        let n = self.members.len();
        let mut filled = 0;
        if wcs.is_empty() || n == 0 {
            return 0;
        }
        for k in 0..n {
            let i = (self.next + k) % n;
            if let Some(m) = &mut self.members[i] {
                filled += m.drain(&mut wcs[filled..]);
                if filled == wcs.len() {
                    self.next = (i + 1) % n;
                    break;
                }
            }
        }
        filled
    }

    fn overrun(&mut self, held: usize) {
        tracing::warn!(
            held,
            entries = self.entries,
            "software completion queue overrun; its connections break"
        );
        self.broken = true;
        self.event = Some(CqEvent::Overrun);
        for m in self.members.iter_mut().flatten() {
            m.disconnect();
        }
    }
}

/// What the queue handle and the connection handles share.
struct Shared<T> {
    core: OwnedByThread<Core<T>>,
    /// Slots of handles dropped on a thread that did not hold the CQ, freed by the next
    /// poll of the holder (rare: a misuse, or a connection dropped after its CQ moved).
    orphans: Mutex<Vec<usize>>,
    has_orphans: AtomicBool,
}

impl<T: Member> Shared<T> {
    fn reap_orphans(&self, core: &mut Core<T>) {
        if !self.has_orphans.load(Ordering::Acquire) {
            return;
        }
        let mut o = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        self.has_orphans.store(false, Ordering::Release);
        for slot in o.drain(..) {
            core.remove(slot);
        }
    }
}

/// A software fabric's shared completion queue for connections of type `T`.
pub struct SoftCq<T: Member> {
    shared: Arc<Shared<T>>,
    entries: u32,
    table: Arc<MrTable>,
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
    if entries == 0 || entries > MAX_CQ_ENTRIES {
        return Err(FabricError::Cq {
            reason: format!("{entries} entries is outside 1..={MAX_CQ_ENTRIES}"),
        });
    }
    let core = Core::<T> {
        entries: entries as usize,
        members: Vec::new(),
        free: Vec::new(),
        next: 0,
        broken: false,
        event: None,
    };
    let shared = Arc::new(Shared {
        core: OwnedByThread::new(core),
        orphans: Mutex::new(Vec::new()),
        has_orphans: AtomicBool::new(false),
    });
    Ok(Cq::new(
        kind,
        Box::new(SoftCq {
            shared,
            entries,
            table: table.clone(),
        }),
    ))
}

/// Whether `cq` can take connections of type `T` made by the fabric of `table`.
///
/// # Errors
/// [`FabricError::Cq`] naming why not.
pub fn check<T: Member>(cq: &Cq, table: &Arc<MrTable>) -> Result<(), FabricError> {
    match cq.backend().downcast_ref::<SoftCq<T>>() {
        Some(soft) if Arc::ptr_eq(&soft.table, table) => Ok(()),
        Some(_) => Err(FabricError::Cq {
            reason: format!(
                "the {} completion queue belongs to another fabric instance",
                cq.kind()
            ),
        }),
        None => Err(FabricError::Cq {
            reason: format!(
                "a {} completion queue cannot take a connection of this fabric",
                cq.kind()
            ),
        }),
    }
}

/// Puts `conn` on `cq` (a [`SoftCq`] of `conn`'s fabric, see [`check`]) and returns
/// its handle.
///
/// # Errors
/// [`FabricError::Cq`] when `cq` is not for `conn`, is in error, or is held by another
/// thread.
pub fn attach<T: Member>(cq: &Cq, conn: T) -> Result<Box<dyn Conn>, FabricError> {
    let fail = |reason: &str| FabricError::Cq {
        reason: reason.to_owned(),
    };
    check::<T>(cq, conn.table())?;
    let Some(soft) = cq.backend().downcast_ref::<SoftCq<T>>() else {
        return Err(fail("not a software completion queue"));
    };
    let shared = soft.shared.clone();
    let (qp_num, caps) = (conn.qp_num(), conn.caps());
    let slot = shared
        .core
        .with(|core| {
            shared.reap_orphans(core);
            if core.broken {
                return Err(fail("the completion queue overran and is in error"));
            }
            Ok(core.insert(conn))
        })
        .ok_or_else(|| fail("the completion queue is held by another thread"))??;
    Ok(Box::new(CqConn {
        shared,
        slot,
        qp_num,
        caps,
    }))
}

impl<T: Member> CqBackend for SoftCq<T> {
    fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        let shared = &*self.shared;
        shared
            .core
            .with(|core| {
                shared.reap_orphans(core);
                core.poll(wcs)
            })
            .unwrap_or(0)
    }

    fn poll_event(&mut self) -> Option<CqEvent> {
        self.shared.core.with(|c| c.event.take()).flatten()
    }

    fn entries(&self) -> u32 {
        self.entries
    }

    fn release_thread(&self) {
        self.shared.core.release();
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A connection on a shared software CQ: the caller's handle to its state in the CQ.
pub struct CqConn<T: Member> {
    shared: Arc<Shared<T>>,
    slot: usize,
    qp_num: u32,
    caps: QpCaps,
}

impl<T: Member> CqConn<T> {
    /// Runs `f` on the connection's state, if the calling thread holds the CQ.
    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.shared
            .core
            .with(|core| core.member(self.slot).map(f))
            .flatten()
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

    fn poll_cq(&mut self, _wcs: &mut [Wc]) -> usize {
        // Completions belong to the shared CQ; this only makes progress.
        self.with(Member::progress);
        0
    }

    fn qp_num(&self) -> u32 {
        self.qp_num
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
}

impl<T: Member> Drop for CqConn<T> {
    /// The connection's state goes as the backend's own connection goes when dropped
    /// (the peer sees it close).
    fn drop(&mut self) {
        let slot = self.slot;
        if self.shared.core.with(|core| core.remove(slot)).is_none() {
            self.shared
                .orphans
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(slot);
            self.shared.has_orphans.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
#[path = "cq_tests.rs"]
mod tests;
