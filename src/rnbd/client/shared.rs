//! Using the devices of an [`RnbdClient`](super::RnbdClient) from other cores. The
//! client on the session's home core runs SESS_INFO/OPEN/CLOSE and the link events and
//! publishes every device change in [`SharedDevices`]; each other core wraps its own
//! RTRS session handle in an [`RnbdCore`] and sends block IO through it, so a request
//! goes out on that core's connection and completes on that core (the kernel's
//! per-hardware-queue `rnbd_queue_rq` on a shared `rnbd_clt_dev`).
//!
//! A device re-opened after a reconnect may get a new id; a core picks it up at its
//! next submission. Requests already handed to RTRS keep the id they were built with,
//! and the RTRS client may re-send them once a path is back: had the device been
//! re-opened by then, an old id could name another device of the new server session.
//! So every core counts its block requests in flight, and the client re-opens devices
//! only once none is left (after a reconnect the new server session answers old ids
//! with −ENOTCONN until then, since it has no devices yet; those requests wait in their
//! core's `CoreIo` (`io.rs`) and go out again with the new id). Every change of the
//! table bumps its epoch, which tells the cores' waiting requests to look again.
//!
//! The client's [`RnbdClientConfig`] applies to every core, and the zero buffer of
//! emulated write-zeroes ([`zeroes`](super::zeroes)) is registered once for all of them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::config::RnbdClientConfig;
use super::device::{DevState, RnbdDevice};
use super::io::CoreIo;
use super::msg::BlockRequest;
use super::port::{PortCompletion, RtrsPort};
use super::session::{DevHandle, IoError};
use crate::engine::Ctx;
use crate::fabric::{Mr, Sge};

/// Smallest zero buffer (the first emulated write-zeroes registers
/// `max(max_io_size, this)` bytes, at most [`MAX_ZERO_BUFFER`]).
const MIN_ZERO_BUFFER: usize = 4096;
/// Largest zero buffer; longer pieces repeat it in their scatter-gather list.
const MAX_ZERO_BUFFER: usize = 1 << 20;

/// The devices of one client session as every core sees them.
#[derive(Debug, Default)]
pub struct SharedDevices {
    slots: RwLock<Vec<Option<RnbdDevice>>>,
    /// Block requests in flight, one counter per core handle.
    counters: Mutex<Vec<Arc<AtomicUsize>>>,
    /// Bumped by every [`set`](Self::set).
    epoch: AtomicU64,
    config: RnbdClientConfig,
    /// Zeros for emulated write-zeroes, registered at the first one.
    zeroes: Mutex<Option<Arc<Mr>>>,
}

impl SharedDevices {
    /// An empty table for a client configured with `config`.
    pub(super) fn new(config: RnbdClientConfig) -> SharedDevices {
        SharedDevices {
            config,
            ..SharedDevices::default()
        }
    }

    /// The configuration every core follows.
    pub fn config(&self) -> RnbdClientConfig {
        self.config
    }

    /// The session's zero buffer, registered through `port` on first use.
    pub(super) fn zeroes<P: RtrsPort + ?Sized>(&self, port: &P) -> Result<Arc<Mr>, IoError> {
        let mut z = self.zeroes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(mr) = z.as_ref() {
            return Ok(Arc::clone(mr));
        }
        let len = (port.max_io_size() as usize).clamp(MIN_ZERO_BUFFER, MAX_ZERO_BUFFER);
        let mr = Arc::new(port.zero_region(len)?);
        *z = Some(Arc::clone(&mr));
        Ok(mr)
    }

    /// A new in-flight counter for one core handle.
    pub(super) fn counter(&self) -> Arc<AtomicUsize> {
        let c = Arc::new(AtomicUsize::new(0));
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::clone(&c));
        c
    }

    /// Block requests in flight over all core handles.
    pub fn in_flight(&self) -> usize {
        self.counters
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|c| c.load(Ordering::SeqCst))
            .sum()
    }

    /// Publishes device `i` (`None`: closed).
    pub(super) fn set(&self, i: usize, dev: Option<&RnbdDevice>) {
        // A panic elsewhere cannot leave the table half-written (one assignment).
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        if slots.len() <= i {
            slots.resize(i + 1, None);
        }
        slots[i] = dev.cloned();
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// How many times the table changed.
    pub(super) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Runs `f` on the published device `dev`, if it is not closed.
    pub fn with<R>(&self, dev: DevHandle, f: impl FnOnce(&RnbdDevice) -> R) -> Option<R> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.get(dev.index()).and_then(Option::as_ref).map(f)
    }

    /// The published state of `dev` (`None` once closed).
    pub fn state(&self, dev: DevHandle) -> Option<DevState> {
        self.with(dev, RnbdDevice::state)
    }
}

/// Block IO of a client session's devices on one (non-home) core.
pub struct RnbdCore<P> {
    io: CoreIo<P>,
    devices: Arc<SharedDevices>,
}

impl<P: RtrsPort> RnbdCore<P> {
    /// This core's handle: `port` is this core's RTRS session handle, `devices` what
    /// [`RnbdClient::shared`](super::RnbdClient::shared) returns.
    pub fn new(port: P, devices: Arc<SharedDevices>) -> RnbdCore<P> {
        RnbdCore {
            io: CoreIo::new(port, Arc::clone(&devices)),
            devices,
        }
    }

    pub fn port(&self) -> &P {
        &self.io.port
    }

    pub fn port_mut(&mut self) -> &mut P {
        &mut self.io.port
    }

    pub fn devices(&self) -> &Arc<SharedDevices> {
        &self.devices
    }

    /// Sends a block request on `dev`, as [`RnbdClient::submit`](super::RnbdClient::submit):
    /// while the device is unreachable the request waits.
    ///
    /// # Errors
    /// As `RnbdClient::submit`.
    pub fn submit(
        &mut self,
        cx: &mut dyn Ctx,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError> {
        self.io.submit(cx, &*self.devices, dev, tag, req, sgl)
    }

    /// Moves finished block requests of this core into `out`; returns how many.
    pub fn poll(&mut self, cx: &mut dyn Ctx, out: &mut [PortCompletion]) -> usize {
        self.io.poll(cx, &*self.devices, out).0
    }

    /// Why the last request whose wait for its device ran out failed
    /// ([`IoError::Unreachable`]).
    pub fn last_wait_error(&self) -> Option<&IoError> {
        self.io.last_wait_error()
    }
}

impl<P> std::fmt::Debug for RnbdCore<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdCore").finish_non_exhaustive()
    }
}
