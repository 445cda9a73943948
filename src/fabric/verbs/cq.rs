//! A completion queue shared by verbs connections: one `ibv_cq` that the queue pairs
//! made on it report to, as a polled-mode engine shares one CQ per core.
//!
//! The hardware keeps the completions; what the CQ adds is the software shadow of each
//! queue pair's queues (`slots.rs`: queue sizes counted as the contract counts them,
//! opcodes of failed completions), which a completion must update and a post must read.
//! Each connection's shadow is a cell [`OwnedByThread`], held by the thread using the
//! connection; the CQ finds it by `qp_num` and updates it when the polling thread holds
//! it. Completions of a connection another thread holds (one still being set up on a
//! control thread) wait in the CQ, in order, until the polling thread has taken it, as
//! on the software fabrics. A failed completion marks its connection, which breaks it at
//! its next poll (as a private CQ's connection does at once). `IBV_EVENT_CQ_ERR`, read
//! from the device's asynchronous events, is the overrun: [`CqEvent::Overrun`], and
//! every connection of the CQ breaks.
//!
//! Each device's queue reports to a completion channel of its own, and the channels sit
//! in one epoll set, the CQ's [`Cq::wait_fd`](crate::fabric::Cq::wait_fd), for a poller
//! that sleeps when idle (docs/ARCHITECTURE.md, "Interrupt mode"). A channel raises an
//! event only for the first completion after `ibv_req_notify_cq`: the poller arms the CQ
//! before it sleeps ([`CqBackend::arm`]), and the events are read back once completions
//! come, so the set is quiet again while the poller spins.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::slots::QueueSlots;
use super::sys::{self, AsyncEvent, PollBuf, RawWc, WakeSet};
use super::{wc, Domain, Shared, Table};
use crate::fabric::cq::{thread_token, OwnedByThread};
use crate::fabric::{CqBackend, CqEvent, QpCaps, Wc};
use crate::sync::lock;

/// One connection's shadow queues.
pub(super) struct Shadow {
    pub slots: QueueSlots,
    /// A completion of the connection failed: break it.
    pub failed: bool,
    /// The connection broke for the CQ's overrun already.
    pub overrun_seen: bool,
}

pub(super) type ShadowCell = OwnedByThread<Shadow>;

/// A new shadow, held by the calling thread.
pub(super) fn shadow(caps: QpCaps) -> Arc<ShadowCell> {
    let cell = Arc::new(OwnedByThread::new(Shadow {
        slots: QueueSlots::new(caps),
        failed: false,
        overrun_seen: false,
    }));
    cell.with(|_| ());
    cell
}

/// One device's queue of a shared CQ, with the queue pairs bound to it since the last
/// poll.
pub(super) struct DeviceCq {
    pub shared: Arc<Shared>,
    pub cq: Arc<sys::Cq>,
    /// Queue pairs created since the last poll, with their shadows.
    incoming: Mutex<Vec<(u32, Arc<ShadowCell>)>>,
    has_incoming: AtomicBool,
}

impl DeviceCq {
    fn take_incoming(&self, by_qp: &mut HashMap<u32, Arc<ShadowCell>>) {
        if !self.has_incoming.load(Ordering::Acquire) {
            return;
        }
        let mut inc = lock(&self.incoming);
        self.has_incoming.store(false, Ordering::Release);
        // A number the device reuses names the newest queue pair.
        by_qp.extend(inc.drain(..));
    }
}

/// What the CQ and whoever makes connections on it share (the `CqRef`): one `ibv_cq`
/// per present device of the fabric (a queue pair reports to a CQ of its own device),
/// all polled as one. A device that goes takes its queue with it; one that comes gets
/// one (`Table`), and the poller follows (`generation`).
pub(super) struct CqShare {
    /// The fabric's devices (identity: which fabric the CQ belongs to).
    table: Arc<Table>,
    /// The domain whose protection domains made the queues.
    domain: Weak<Domain>,
    /// By device index.
    per: Box<[Mutex<Option<Arc<DeviceCq>>>]>,
    /// Entries asked for on each device.
    entries: u32,
    /// Bumped when a device's queue comes or goes.
    generation: AtomicU64,
    /// `IBV_EVENT_CQ_ERR` was seen: the CQ is in error.
    pub overrun: AtomicBool,
}

impl CqShare {
    pub fn is_of(&self, table: &Arc<Table>) -> bool {
        Arc::ptr_eq(&self.table, table)
    }

    pub fn domain(&self) -> &Weak<Domain> {
        &self.domain
    }

    fn slot(&self, index: u8) -> Option<Arc<DeviceCq>> {
        lock(self.per.get(usize::from(index))?).clone()
    }

    /// The queue of the device of `shared` (`None` once that device has gone).
    pub fn device_cq(&self, shared: &Shared) -> Option<Arc<sys::Cq>> {
        self.slot(shared.index).map(|d| d.cq.clone())
    }

    /// Queue pair `qp_num` of device `device` (with `shadow`) now reports to this CQ.
    pub fn bind(&self, device: u8, qp_num: u32, shadow: &Arc<ShadowCell>) {
        if let Some(d) = self.slot(device) {
            lock(&d.incoming).push((qp_num, shadow.clone()));
            d.has_incoming.store(true, Ordering::Release);
        }
    }

    /// Device `index` has gone: its queue goes once the poller and its queue pairs let
    /// it go.
    pub fn drop_device(&self, index: u8) {
        let gone = lock(&self.per[usize::from(index)]).take();
        self.generation.fetch_add(1, Ordering::AcqRel);
        drop(gone);
    }

    /// Device `index` has come: a queue there, on `shared`'s protection domain.
    pub fn add_device(&self, index: u8, shared: Arc<Shared>) -> Result<(), sys::SysError> {
        let d = DeviceCq::new(shared, self.entries)?;
        *lock(&self.per[usize::from(index)]) = Some(Arc::new(d));
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}

impl DeviceCq {
    fn new(shared: Arc<Shared>, entries: u32) -> Result<DeviceCq, sys::SysError> {
        let cq = sys::Cq::create_notified(&shared.pd, entries, shared.attr.max_cqe)?;
        Ok(DeviceCq {
            shared,
            cq,
            incoming: Mutex::new(Vec::new()),
            has_incoming: AtomicBool::new(false),
        })
    }
}

/// The polling state of one device's queue.
#[derive(Default)]
struct DevicePoll {
    by_qp: HashMap<u32, Arc<ShadowCell>>,
    /// Completions of connections another thread holds, oldest first.
    deferred: VecDeque<RawWc>,
    /// The queue was armed (`ibv_req_notify_cq`) and its event not read back yet.
    armed: bool,
}

/// A verbs CQ shared by connections.
pub(super) struct VerbsCq {
    share: Arc<CqShare>,
    /// The poller's own view of the share's queues, by device index, with their
    /// polling state; renewed when the share's generation moves.
    view: Vec<Option<(Arc<DeviceCq>, DevicePoll)>>,
    generation: u64,
    /// The device polled first next time (devices take turns at going first).
    first: usize,
    buf: PollBuf,
    entries: u32,
    event: Option<CqEvent>,
    poll_error_logged: bool,
    /// The devices' completion channels in one set ([`CqBackend::wait_fd`]); `None` if
    /// the set could not be made (the CQ is then polled on a timer when idle).
    wake: Option<WakeSet>,
    notify_error_logged: bool,
}

/// What becomes of one raw completion.
enum Route {
    /// Out, updated by its connection's shadow (or as it is, for a queue pair the CQ
    /// does not know any more).
    Out(Wc),
    /// Its connection is held by another thread: wait.
    Wait,
}

impl VerbsCq {
    /// A CQ of at least `entries` on each present device of `dom`'s fabric. Its entries
    /// are the fewest a device gave (providers round up).
    pub fn new(dom: &Arc<Domain>, entries: u32) -> Result<VerbsCq, sys::SysError> {
        // No device comes or goes meanwhile; one that comes later gets a queue too.
        let mut st = lock(&dom.table.state);
        let per: Box<[Mutex<Option<Arc<DeviceCq>>>]> =
            (0..dom.table.slots).map(|_| Mutex::new(None)).collect();
        let mut granted = None::<u32>;
        for sh in dom.present() {
            let d = DeviceCq::new(sh.clone(), entries)?;
            let e = d.cq.entries();
            granted = Some(granted.map_or(e, |g| g.min(e)));
            *lock(&per[usize::from(sh.index)]) = Some(Arc::new(d));
        }
        let share = Arc::new(CqShare {
            table: dom.table.clone(),
            domain: Arc::downgrade(dom),
            per,
            entries,
            generation: AtomicU64::new(0),
            overrun: AtomicBool::new(false),
        });
        st.cqs.retain(|c| c.strong_count() > 0);
        st.cqs.push(Arc::downgrade(&share));
        drop(st);
        let wake = WakeSet::new()
            .map_err(|e| tracing::warn!("verbs completion queue: no wake-up descriptor: {e}"))
            .ok();
        let mut cq = VerbsCq {
            view: Vec::new(),
            generation: 0,
            share,
            first: 0,
            buf: PollBuf::new(),
            entries: granted.unwrap_or(entries),
            event: None,
            poll_error_logged: false,
            wake,
            notify_error_logged: false,
        };
        cq.renew_view();
        Ok(cq)
    }

    /// Takes the share's queues as they are now: a queue that went (with the
    /// completions that waited on it) is let go, one that came is polled.
    fn renew_view(&mut self) {
        self.generation = self.share.generation.load(Ordering::Acquire);
        let n = self.share.per.len();
        self.view.resize_with(n, || None);
        for (i, v) in self.view.iter_mut().enumerate() {
            let now = lock(&self.share.per[i]).clone();
            let same = match (&now, &*v) {
                (Some(a), Some((b, _))) => Arc::ptr_eq(a, b),
                (None, None) => true,
                _ => false,
            };
            if !same {
                if let Some(w) = &self.wake {
                    if let Some(fd) = v.as_ref().and_then(|(d, _)| d.cq.event_fd()) {
                        w.remove(fd);
                    }
                    if let Some(fd) = now.as_ref().and_then(|d| d.cq.event_fd()) {
                        if let Err(e) = w.add(fd) {
                            tracing::warn!("verbs completion queue: {e}");
                        }
                    }
                }
                *v = now.map(|d| (d, DevicePoll::default()));
            }
        }
    }

    /// Routes `raw` through its connection's shadow (held by `me`) or holds it back.
    fn route(
        dev: &DeviceCq,
        by_qp: &mut HashMap<u32, Arc<ShadowCell>>,
        me: crate::fabric::cq::ThreadToken,
        raw: &RawWc,
    ) -> Route {
        if !by_qp.contains_key(&raw.qp_num) {
            // Created, and bound, after the last look at the list.
            dev.take_incoming(by_qp);
        }
        let mut w = wc::completion(raw);
        w.qp_num = dev.shared.tag(raw.qp_num);
        let Some(cell) = by_qp.get(&raw.qp_num) else {
            return Route::Out(w);
        };
        if Arc::strong_count(cell) == 1 {
            // The connection is gone; so is its shadow.
            by_qp.remove(&raw.qp_num);
            return Route::Out(w);
        }
        let done = cell.with_as(me, false, |s| {
            s.slots.completed(&mut w, raw.opcode.is_some());
            s.failed |= !w.status.is_ok();
        });
        match done {
            Some(()) => Route::Out(w),
            None => Route::Wait,
        }
    }

    /// Polls device `dev`'s queue into `wcs`; how many it filled.
    fn poll_device(
        dev: &DeviceCq,
        p: &mut DevicePoll,
        buf: &mut PollBuf,
        poll_error_logged: &mut bool,
        wcs: &mut [Wc],
    ) -> usize {
        let me = thread_token();
        let DevicePoll {
            by_qp,
            deferred,
            armed,
        } = p;
        dev.take_incoming(by_qp);
        let mut filled = 0;
        // First what waited, in order; what still cannot go keeps its place.
        let mut i = 0;
        while i < deferred.len() && filled < wcs.len() {
            match Self::route(dev, by_qp, me, &deferred[i]) {
                Route::Out(w) => {
                    wcs[filled] = w;
                    filled += 1;
                    deferred.remove(i);
                }
                Route::Wait => i += 1,
            }
        }
        while filled < wcs.len() {
            let room = wcs.len() - filled;
            let mut got_out = 0;
            let res = dev.cq.poll(buf, room, |raw| {
                // A connection with completions waiting keeps its order behind them.
                if deferred.iter().any(|d| d.qp_num == raw.qp_num) {
                    deferred.push_back(raw);
                    return;
                }
                match Self::route(dev, by_qp, me, &raw) {
                    Route::Out(w) => {
                        wcs[filled + got_out] = w;
                        got_out += 1;
                    }
                    Route::Wait => deferred.push_back(raw),
                }
            });
            match res {
                Ok(0) => break,
                Ok(_) => filled += got_out,
                Err(e) => {
                    if !*poll_error_logged {
                        *poll_error_logged = true;
                        tracing::error!(
                            device = dev.shared.pd.device().name(),
                            "shared completion queue: {e}"
                        );
                    }
                    break;
                }
            }
        }
        if *armed && filled > 0 && Self::take_events(dev, poll_error_logged) > 0 {
            // The completions that raised the event are here: the channel is quiet
            // again until the next arming.
            *armed = false;
        }
        filled
    }

    /// Reads back the events of `dev`'s channel; how many there were.
    fn take_events(dev: &DeviceCq, error_logged: &mut bool) -> u32 {
        dev.cq.take_events().unwrap_or_else(|e| {
            if !*error_logged {
                *error_logged = true;
                tracing::error!(device = dev.shared.pd.device().name(), "{e}");
            }
            0
        })
    }

    /// Reads the devices' asynchronous events: this CQ's errors are kept here, other
    /// CQs' are left with the fabric for their own poll.
    fn read_async_events(&mut self) {
        let mut overran = false;
        for (d, _) in self.view.iter().flatten() {
            let mut others = lock(&d.shared.cq_errors);
            loop {
                match d.shared.pd.device().next_async_event() {
                    Ok(None) => break,
                    Ok(Some(AsyncEvent::CqError { cq })) => others.push(cq),
                    Ok(Some(AsyncEvent::Other(kind))) => {
                        tracing::debug!(
                            kind,
                            device = d.shared.pd.device().name(),
                            "verbs asynchronous event"
                        );
                    }
                    Err(e) => {
                        tracing::warn!("{e}");
                        break;
                    }
                }
            }
            let before = others.len();
            others.retain(|&cq| !d.cq.is(cq));
            overran |= others.len() < before;
        }
        if overran && !self.share.overrun.swap(true, Ordering::Relaxed) {
            tracing::warn!("verbs completion queue overrun; its connections break");
            self.event = Some(CqEvent::Overrun);
        }
    }
}

impl CqBackend for VerbsCq {
    fn poll(&mut self, wcs: &mut [Wc]) -> usize {
        if self.share.generation.load(Ordering::Acquire) != self.generation {
            self.renew_view();
        }
        let n = self.view.len();
        if n == 0 {
            return 0;
        }
        let first = self.first;
        self.first = (first + 1) % n;
        let mut filled = 0;
        for k in 0..n {
            let i = (first + k) % n;
            if filled == wcs.len() {
                break;
            }
            let Some((dev, p)) = self.view[i].as_mut() else {
                continue;
            };
            filled += Self::poll_device(
                dev,
                p,
                &mut self.buf,
                &mut self.poll_error_logged,
                &mut wcs[filled..],
            );
        }
        filled
    }

    fn poll_event(&mut self) -> Option<CqEvent> {
        self.read_async_events();
        self.event.take()
    }

    fn entries(&self) -> u32 {
        self.entries
    }

    fn share(&self) -> Arc<dyn Any + Send + Sync> {
        self.share.clone()
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.wake.as_ref().map(WakeSet::fd)
    }

    /// Arms each device's queue that is not armed yet, first reading back the events
    /// that came since (a channel left readable would wake the sleeper at once, for
    /// ever). A queue that could not be armed is polled on the caller's timer.
    fn arm(&mut self) -> bool {
        if self.wake.is_none() {
            return true;
        }
        if self.share.generation.load(Ordering::Acquire) != self.generation {
            self.renew_view();
        }
        let mut anew = false;
        for (dev, p) in self.view.iter_mut().flatten() {
            if Self::take_events(dev, &mut self.poll_error_logged) > 0 {
                p.armed = false;
            }
            if p.armed {
                continue;
            }
            match dev.cq.arm() {
                Ok(()) => {
                    p.armed = true;
                    anew = true;
                }
                Err(e) => {
                    if !self.notify_error_logged {
                        self.notify_error_logged = true;
                        tracing::warn!(device = dev.shared.pd.device().name(), "{e}");
                    }
                }
            }
        }
        !anew
    }
}
