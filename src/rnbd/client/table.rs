//! The devices of one client session as every core's [`RnbdQueue`](super::RnbdQueue)
//! sees them: the [`RnbdAdmin`](super::RnbdAdmin) publishes each change of its device
//! table as a new immutable [`Snapshot`] with a higher version; a queue keeps the
//! snapshot it last took and, per request, compares its version with the published one
//! (one Acquire load). Only a queue whose snapshot is stale takes the table's lock, to
//! pick up the new one. So the data path takes no lock and does no atomic
//! read-modify-write (the kernel's per-hardware-queue `rnbd_queue_rq` on a shared
//! `rnbd_clt_dev`).
//!
//! A device re-opened after a reconnect may get a new id; a queue picks it up at its
//! next submission. Requests already handed to RTRS keep the id they were built with,
//! and the RTRS client may re-send them once a path is back: had the device been
//! re-opened by then, an old id could name another device of the new server session.
//! So every queue counts its block requests in flight ([`InFlight`], written by that
//! queue's core alone), and the admin re-opens devices only once none is left (after a
//! reconnect the new server session answers old ids with −ENOTCONN until then, since it
//! has no devices yet; those requests wait in their queue and go out again with the new
//! id). The version also tells the queues' waiting requests to look again.
//!
//! A request the server answers with −ENOTCONN although it was sent with the table's
//! current version, to a mapped device, names an id the server no longer knows while the
//! session stayed up: the target's operator closed the mapping (a forced close). The
//! queue reports it ([`DeviceTable::report_closed`], on that error only) and the admin,
//! which saw every link event first, decides (a reconnect in between also moves the
//! version, so such a report is dropped).
//!
//! Each device carries its own write-zeroes mode ([`RnbdDevice::write_zeroes`]); the
//! zero buffer of emulated write-zeroes ([`zeroes`](super::zeroes)) is registered once
//! for every device and core of the session.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::device::{DevState, RnbdDevice};
use super::handle::SessionHandle;
use super::request::{DevHandle, IoError};
use crate::fabric::Mr;
use crate::sync::{lock, Published, SoloCounter};

/// Smallest zero buffer (the first emulated write-zeroes registers
/// `max(max_io_size, this)` bytes, at most [`MAX_ZERO_BUFFER`]).
const MIN_ZERO_BUFFER: usize = 4096;
/// Largest zero buffer; longer pieces repeat it in their scatter-gather list.
const MAX_ZERO_BUFFER: usize = 1 << 20;

/// The devices of a session at one version (immutable once published).
#[derive(Debug, Default)]
pub struct Snapshot {
    version: u64,
    devices: Vec<Option<RnbdDevice>>,
}

impl Snapshot {
    /// The table's version this snapshot shows.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Device `dev`, unless it is closed or unknown.
    pub fn device(&self, dev: DevHandle) -> Option<&RnbdDevice> {
        self.devices.get(dev.index()).and_then(Option::as_ref)
    }
}

/// Block requests of one queue in flight: written by the queue's own core only, read by
/// the admin ([`SoloCounter`]). Alone on its cache line pair: the counters of several
/// queues are made one after another.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(super) struct InFlight(SoloCounter);

impl InFlight {
    pub(super) fn add(&self, n: usize) {
        self.0.add(n as u64);
    }

    pub(super) fn sub(&self, n: usize) {
        self.0.sub(n as u64);
    }

    pub(super) fn get(&self) -> usize {
        self.0.get() as usize
    }
}

/// The published devices of one client session (see the module doc).
#[derive(Debug, Default)]
pub struct DeviceTable {
    published: Published<Snapshot>,
    /// One per queue.
    in_flight: Mutex<Vec<Arc<InFlight>>>,
    /// Zeros for emulated write-zeroes, registered at the first one.
    zeroes: Mutex<Option<Arc<Mr>>>,
    /// Devices the server answered −ENOTCONN for, with the table version the request
    /// was built at (see the module doc): written on that error only.
    closed: Mutex<Vec<(DevHandle, u64)>>,
    /// `closed` may hold reports: what the admin's every step reads, so that it takes
    /// the lock only when there is something to take.
    has_closed: AtomicBool,
}

impl DeviceTable {
    /// The published version (one Acquire load: the per-request check).
    #[inline]
    pub fn version(&self) -> u64 {
        self.published.version()
    }

    /// The published snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.published.load()
    }

    /// The published state of `dev` (`None` once closed).
    pub fn state(&self, dev: DevHandle) -> Option<DevState> {
        self.snapshot().device(dev).map(RnbdDevice::state)
    }

    /// Publishes `devices` as the next version (the admin alone calls this).
    pub(super) fn publish(&self, devices: Vec<Option<RnbdDevice>>) {
        self.published
            .publish(|version| Snapshot { version, devices });
    }

    /// The session's zero buffer, registered through `session` on first use.
    pub(super) fn zeroes<S: SessionHandle + ?Sized>(
        &self,
        session: &S,
    ) -> Result<Arc<Mr>, IoError> {
        let mut z = lock(&self.zeroes);
        if let Some(mr) = z.as_ref() {
            return Ok(Arc::clone(mr));
        }
        let len = (session.max_io_size() as usize).clamp(MIN_ZERO_BUFFER, MAX_ZERO_BUFFER);
        let mr = Arc::new(session.zero_region(len)?);
        *z = Some(Arc::clone(&mr));
        Ok(mr)
    }

    /// A request to `dev` built at table version `version` came back −ENOTCONN from
    /// the server (see the module doc).
    pub(super) fn report_closed(&self, dev: DevHandle, version: u64) {
        let mut c = lock(&self.closed);
        if !c.contains(&(dev, version)) {
            c.push((dev, version));
        }
        self.has_closed.store(true, Ordering::Release);
    }

    /// The reports since the last call.
    pub(super) fn take_closed(&self) -> Vec<(DevHandle, u64)> {
        if !self.has_closed.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut c = lock(&self.closed);
        self.has_closed.store(false, Ordering::Relaxed);
        std::mem::take(&mut *c)
    }

    /// A new in-flight counter for one queue.
    pub(super) fn in_flight_counter(&self) -> Arc<InFlight> {
        let c = Arc::new(InFlight::default());
        lock(&self.in_flight).push(Arc::clone(&c));
        c
    }

    /// Block requests in flight over all queues.
    pub fn in_flight(&self) -> usize {
        lock(&self.in_flight).iter().map(|c| c.get()).sum()
    }
}
