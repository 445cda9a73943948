//! The RNBD client over one core's RTRS session handle ([`RtrsPort`]): the kernel's
//! `rnbd_clt_session` with `send_msg_sess_info`, `send_msg_open`, `send_msg_close`,
//! `rnbd_queue_rq` and the link-event handling (`rnbd_clt_link_ev`: DISCONNECTED marks
//! devices disconnected, RECONNECTED sends SESS_INFO then re-opens every device and
//! adopts the new device ids).
//!
//! Everything is non-blocking: SESS_INFO, OPEN and CLOSE are queued, sent as admin
//! requests when a permit and a reply slot are free, and reported as [`ClientEvent`]s by
//! [`RnbdClient::poll`], which also reports block IO completions. OPENs wait for an
//! outstanding SESS_INFO, as the kernel sends SESS_INFO first. Block IO goes through the
//! core's [`CoreIo`](super::io), which keeps requests while their device is unreachable
//! (up to `io_wait_timeout`) and sends them again once it is re-opened.
//!
//! Write-zeroes follow [`RnbdClientConfig::write_zeroes`]: by default they go out as
//! zero-filled WRITEs ([`zeroes`](super::zeroes)), safe with servers of every kernel
//! version.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::config::RnbdClientConfig;
use super::device::{sess_info_done, DevState, DeviceError, RnbdDevice};
use super::io::{CoreIo, DevLookup};
use super::msg::{self, BlockRequest, DeviceInfo};
use super::port::{PortCompletion, PortError, PortIo, RtrsPort};
use super::rtrs::LinkListener;
use super::shared::SharedDevices;
use crate::common::LinkEvent;
use crate::engine::Ctx;
use crate::fabric::{Mr, Sge};
use crate::proto::rnbd::{AccessMode, OpenRsp, SessInfo};
use crate::rnbd::Dir;

/// Tags with this bit are the client's own admin requests; block IO tags must not use it.
pub const ADMIN_TAG: u64 = 1 << 63;
/// Bytes of the reply buffer per admin request in flight (≥ OPEN_RSP's 56).
pub const REPLY_SLOT: usize = 64;

const BATCH: usize = 64;

/// A device of an [`RnbdClient`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DevHandle(usize);

impl DevHandle {
    /// Position among the session's devices (handles are never reused).
    pub fn index(self) -> usize {
        self.0
    }
}

/// What [`RnbdClient::poll`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientEvent {
    /// SESS_INFO answered: the negotiated version, or why not.
    SessInfo(Result<u8, DeviceError>),
    /// A device is mapped; `remap` after a reconnect (the id may have changed).
    Opened {
        dev: DevHandle,
        info: DeviceInfo,
        remap: bool,
    },
    /// OPEN failed: a first open leaves no device (the handle is dead); a failed
    /// re-open after a reconnect leaves the device disconnected.
    OpenFailed { dev: DevHandle, error: DeviceError },
    /// A device is unmapped and its handle no longer valid.
    Closed { dev: DevHandle },
    /// A block request ended: 0 or a negative errno.
    Io { tag: u64, errno: i32 },
}

/// Why [`RnbdClient::submit`] refused a block request (nothing was sent).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    #[error("no such device handle")]
    NoDevice,
    #[error("tag {tag:#x} has the admin bit (1 << 63) set")]
    BadTag { tag: u64 },
    #[error("scatter-gather list of {have} bytes for a request carrying {want}")]
    SglLength { have: u64, want: u32 },
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("rtrs: {0}")]
    Port(#[from] PortError),
    /// A request waited `io_wait_timeout` for its device to be reachable (a path up and
    /// the device re-opened after a reconnect) and failed with −ENOTCONN.
    #[error("device '{name}' unreachable for {} s: {reason}", waited.as_secs_f64())]
    Unreachable {
        name: String,
        waited: Duration,
        reason: String,
    },
}

impl IoError {
    /// Whether to submit again later (the session has no free permit now).
    pub fn is_busy(&self) -> bool {
        matches!(self, IoError::Port(PortError::Busy))
    }

    /// The negative errno for a block layer.
    pub fn errno(&self) -> i32 {
        match self {
            IoError::NoDevice => -libc::ENODEV,
            IoError::BadTag { .. } | IoError::SglLength { .. } => -libc::EINVAL,
            IoError::Device(e) => e.errno(),
            IoError::Port(PortError::Busy) => -libc::EAGAIN,
            IoError::Port(PortError::Refused { errno, .. }) => *errno,
            IoError::Unreachable { .. } => -libc::ENOTCONN,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Admin {
    SessInfo,
    Open(usize),
    /// `dev` is `None` for closing an id whose OPEN_RSP was unusable.
    Close {
        dev: Option<usize>,
        device_id: u32,
    },
}

struct Dev {
    dev: RnbdDevice,
    /// An OPEN is queued or in flight.
    opening: bool,
    /// Unmapped: the slot is kept (handles are never reused) but dead.
    gone: bool,
}

/// The home core's own device table, for its [`CoreIo`].
struct Local<'a>(&'a [Dev]);

impl DevLookup for Local<'_> {
    fn with_dev<R>(&self, dev: DevHandle, f: impl FnOnce(&RnbdDevice) -> R) -> Option<R> {
        self.0.get(dev.0).filter(|d| !d.gone).map(|d| f(&d.dev))
    }
}

/// RNBD devices over one core's RTRS session.
pub struct RnbdClient<P> {
    /// This core's block IO and the port it shares with the admin requests.
    io: CoreIo<P>,
    /// Reply space of admin requests, `REPLY_SLOT` bytes per slot.
    replies: Mr,
    slots: Vec<Option<Admin>>,
    queued: VecDeque<Admin>,
    devices: Vec<Dev>,
    ver: Option<u8>,
    sess_info_inflight: bool,
    events: VecDeque<ClientEvent>,
    scratch: Vec<PortCompletion>,
    links: Option<LinkListener>,
    shared: Arc<SharedDevices>,
    /// Reconnected; devices are re-opened once no block request is in flight.
    reopen_pending: bool,
    config: RnbdClientConfig,
}

impl<P: RtrsPort> RnbdClient<P> {
    /// A client over `port`, whose admin replies land in `replies` (registered with the
    /// session's fabric, local write access; one admin request in flight per 64 bytes).
    /// Block requests wait up to the port's
    /// [`io_wait_timeout`](RtrsPort::io_wait_timeout) for an unreachable device.
    ///
    /// # Errors
    /// [`DeviceError::ReplyBuffer`] when `replies` is smaller than 64 bytes.
    pub fn new(port: P, replies: Mr) -> Result<RnbdClient<P>, DeviceError> {
        RnbdClient::with_config(port, replies, RnbdClientConfig::default())
    }

    /// As [`new`](Self::new), with `config` for this client and the
    /// [`RnbdCore`](super::RnbdCore)s sharing its devices.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_config(
        port: P,
        replies: Mr,
        config: RnbdClientConfig,
    ) -> Result<RnbdClient<P>, DeviceError> {
        let n = replies.len() / REPLY_SLOT;
        if n == 0 {
            return Err(DeviceError::ReplyBuffer { len: replies.len() });
        }
        let shared = Arc::new(SharedDevices::new(config));
        Ok(RnbdClient {
            io: CoreIo::new(port, Arc::clone(&shared)),
            replies,
            slots: vec![None; n.min(1024)],
            queued: VecDeque::with_capacity(16),
            devices: Vec::new(),
            ver: None,
            sess_info_inflight: false,
            events: VecDeque::with_capacity(4 * BATCH),
            scratch: vec![PortCompletion::default(); BATCH],
            links: None,
            shared,
            reopen_pending: false,
            config,
        })
    }

    pub fn config(&self) -> RnbdClientConfig {
        self.config
    }

    pub fn port(&self) -> &P {
        &self.io.port
    }

    /// The port itself. A request sent on it directly completes through it: poll the
    /// port for it ([`poll`](Self::poll) hands back only the client's own requests and
    /// drops, with a log line, block completions it did not send).
    pub fn port_mut(&mut self) -> &mut P {
        &mut self.io.port
    }

    /// Why the last block request whose wait for its device ran out failed
    /// ([`IoError::Unreachable`]).
    pub fn last_wait_error(&self) -> Option<&IoError> {
        self.io.last_wait_error()
    }

    /// The devices as other cores see them (for [`RnbdCore`](super::RnbdCore)s).
    pub fn shared(&self) -> Arc<SharedDevices> {
        Arc::clone(&self.shared)
    }

    /// Publishes device `i` to the other cores.
    fn publish(&self, i: usize) {
        let d = &self.devices[i];
        self.shared.set(i, (!d.gone).then_some(&d.dev));
    }

    /// The negotiated RNBD version, once SESS_INFO was answered (reset on link down).
    pub fn ver(&self) -> Option<u8> {
        self.ver
    }

    /// The device behind `dev`, until it is closed.
    pub fn device(&self, dev: DevHandle) -> Option<&RnbdDevice> {
        self.devices.get(dev.0).filter(|d| !d.gone).map(|d| &d.dev)
    }

    /// Queues SESS_INFO (sent at most once at a time); the answer is an event.
    pub fn sess_info(&mut self, cx: &mut dyn Ctx) {
        self.queue_sess_info();
        self.pump(cx);
    }

    /// Maps `name` in `mode`: SESS_INFO first if the version is not known yet, then
    /// OPEN; [`ClientEvent::Opened`] or [`ClientEvent::OpenFailed`] tells the outcome.
    ///
    /// # Errors
    /// A name OPEN cannot carry, or one already open in this session (the server would
    /// answer with the existing mapping, whatever the mode).
    pub fn open(
        &mut self,
        cx: &mut dyn Ctx,
        name: &str,
        mode: AccessMode,
    ) -> Result<DevHandle, DeviceError> {
        let dev = RnbdDevice::new(name, mode, self.io.port.max_io_size())?
            .with_write_zeroes(self.config.write_zeroes);
        if self.devices.iter().any(|d| !d.gone && d.dev.name() == name) {
            return Err(DeviceError::AlreadyOpen {
                name: name.to_string(),
            });
        }
        let h = self.devices.len();
        self.devices.push(Dev {
            dev,
            opening: true,
            gone: false,
        });
        self.publish(h);
        if self.ver.is_none() {
            self.queue_sess_info();
        }
        self.queued.push_back(Admin::Open(h));
        self.pump(cx);
        Ok(DevHandle(h))
    }

    /// Unmaps `dev`: CLOSE when the server knows the id, then [`ClientEvent::Closed`].
    ///
    /// # Errors
    /// [`IoError::NoDevice`] for a closed or unknown handle.
    pub fn close(&mut self, cx: &mut dyn Ctx, dev: DevHandle) -> Result<(), IoError> {
        let d = self
            .devices
            .get_mut(dev.0)
            .filter(|d| !d.gone && d.dev.state() != DevState::Unmapped)
            .ok_or(IoError::NoDevice)?;
        let id = d.dev.device_id();
        d.dev.close();
        match id {
            Some(device_id) => self.queued.push_back(Admin::Close {
                dev: Some(dev.0),
                device_id,
            }),
            None => {
                d.gone = true;
                self.events.push_back(ClientEvent::Closed { dev });
            }
        }
        self.publish(dev.0);
        self.pump(cx);
        Ok(())
    }

    /// Sends a block request on a mapped device. `sgl` holds the data of a write or the
    /// space of a read (exactly [`BlockRequest::data_len`] bytes; empty otherwise), and
    /// stays untouched until the completion. While the device is unreachable (every
    /// path lost, or the re-open after a reconnect pending) the request is accepted and
    /// waits, up to `io_wait_timeout` after now, then fails with −ENOTCONN (see
    /// [`last_wait_error`](Self::last_wait_error)); a request that comes back because
    /// the session lost its paths waits the same way and is sent again. Its completion
    /// is an [`ClientEvent::Io`], exactly once. An emulated write-zeroes goes out as
    /// WRITEs of zeros; its one completion comes when all of them are done.
    ///
    /// # Errors
    /// [`IoError::is_busy`] to retry after polling; otherwise why it cannot be sent.
    pub fn submit(
        &mut self,
        cx: &mut dyn Ctx,
        dev: DevHandle,
        tag: u64,
        req: &BlockRequest,
        sgl: &[Sge],
    ) -> Result<(), IoError> {
        self.io
            .submit(cx, &Local(&self.devices), dev, tag, req, sgl)
    }

    /// The session lost its last path: devices wait for a re-open; the version is
    /// negotiated again on reconnect.
    pub fn link_down(&mut self) {
        for d in self.devices.iter_mut().filter(|d| !d.gone) {
            d.dev.link_down();
        }
        for i in 0..self.devices.len() {
            self.publish(i);
        }
        self.ver = None;
        self.reopen_pending = false;
    }

    /// The session has a path again: SESS_INFO, then OPEN for every device that was
    /// mapped (adopting the ids the new server session gives) once no block request
    /// of any core is in flight any more (see [`SharedDevices`]).
    pub fn link_up(&mut self, cx: &mut dyn Ctx) {
        self.queue_sess_info();
        self.reopen_pending = true;
        self.try_reopen();
        self.pump(cx);
    }

    fn try_reopen(&mut self) {
        if !self.reopen_pending || self.shared.in_flight() != 0 {
            return;
        }
        self.reopen_pending = false;
        for (i, d) in self.devices.iter_mut().enumerate() {
            if !d.gone && !d.opening && d.dev.needs_reopen() {
                d.opening = true;
                self.queued.push_back(Admin::Open(i));
            }
        }
    }

    /// Takes the session's link events from `links` (the listener given to the RTRS
    /// session) on every [`poll`](Self::poll): `Disconnected` → [`link_down`](Self::link_down),
    /// `Connected` → [`link_up`](Self::link_up).
    pub fn listen(&mut self, links: LinkListener) {
        self.links = Some(links);
    }

    /// Makes progress and moves up to `out.len()` events into `out`; returns how many.
    pub fn poll(&mut self, cx: &mut dyn Ctx, out: &mut [ClientEvent]) -> usize {
        while let Some(ev) = self.links.as_ref().and_then(LinkListener::take) {
            match ev {
                LinkEvent::Disconnected => self.link_down(),
                LinkEvent::Connected => self.link_up(cx),
            }
        }
        loop {
            let (n, more) = self.io.poll(cx, &Local(&self.devices), &mut self.scratch);
            for i in 0..n {
                let c = self.scratch[i];
                if c.tag & ADMIN_TAG != 0 {
                    self.admin_done((c.tag & !ADMIN_TAG) as usize, c.errno);
                } else {
                    self.events.push_back(ClientEvent::Io {
                        tag: c.tag,
                        errno: c.errno,
                    });
                }
            }
            if !more {
                break;
            }
        }
        self.try_reopen();
        self.pump(cx);
        let mut n = 0;
        while n < out.len() {
            let Some(e) = self.events.pop_front() else {
                break;
            };
            out[n] = e;
            n += 1;
        }
        n
    }

    fn queue_sess_info(&mut self) {
        let queued = self.queued.iter().any(|a| matches!(a, Admin::SessInfo));
        if !queued && !self.sess_info_inflight {
            self.queued.push_front(Admin::SessInfo);
        }
    }

    /// Sends queued admin requests while permits and reply slots last.
    fn pump(&mut self, cx: &mut dyn Ctx) {
        while let Some(&op) = self.queued.front() {
            if self.sess_info_inflight && !matches!(op, Admin::Close { .. }) {
                break;
            }
            let Some(slot) = self.slots.iter().position(Option::is_none) else {
                break;
            };
            let close_msg;
            let open_msg;
            let info_msg;
            let (usr, reply_len, dir): (&[u8], usize, Dir) = match op {
                Admin::SessInfo => {
                    info_msg = msg::sess_info();
                    (&info_msg, SessInfo::LEN, Dir::Read)
                }
                Admin::Open(d) => {
                    open_msg = self.devices[d].dev.open_msg();
                    (&open_msg, OpenRsp::LEN, Dir::Read)
                }
                Admin::Close { device_id, .. } => {
                    close_msg = msg::close(device_id);
                    (&close_msg, 0, Dir::Write)
                }
            };
            let sge = self.replies.sge(slot * REPLY_SLOT, reply_len);
            let sgl: &[Sge] = if reply_len == 0 {
                &[]
            } else {
                std::slice::from_ref(&sge)
            };
            let io = PortIo {
                tag: ADMIN_TAG | slot as u64,
                dir,
                usr,
                sgl,
                admin: true,
            };
            match self.io.port.submit(cx, io) {
                Ok(()) => {
                    self.queued.pop_front();
                    self.slots[slot] = Some(op);
                    if matches!(op, Admin::SessInfo) {
                        self.sess_info_inflight = true;
                    }
                }
                Err(PortError::Busy) => break,
                Err(PortError::Refused { errno, reason }) => {
                    self.queued.pop_front();
                    self.not_sent(op, errno, reason);
                }
            }
        }
    }

    fn admin_done(&mut self, slot: usize, errno: i32) {
        let Some(op) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let mut reply = [0u8; REPLY_SLOT];
        let len = match op {
            Admin::SessInfo => SessInfo::LEN,
            Admin::Open(_) => OpenRsp::LEN,
            Admin::Close { .. } => 0,
        };
        if errno == 0 && len > 0 {
            self.replies.read_at(slot * REPLY_SLOT, &mut reply[..len]);
        }
        self.finish(op, errno, &reply[..len]);
    }

    fn finish(&mut self, op: Admin, errno: i32, reply: &[u8]) {
        match op {
            Admin::SessInfo => {
                self.sess_info_inflight = false;
                let r = sess_info_done(errno, reply);
                if let Ok(v) = r {
                    self.ver = Some(v);
                }
                self.events.push_back(ClientEvent::SessInfo(r));
            }
            Admin::Open(i) => self.open_finished(i, errno, reply),
            Admin::Close { dev, .. } => {
                if let Some(i) = dev {
                    self.devices[i].gone = true;
                    self.publish(i);
                    self.events
                        .push_back(ClientEvent::Closed { dev: DevHandle(i) });
                }
            }
        }
    }

    /// The session could not carry `op` (nothing reached the server): it fails with the
    /// session's reason rather than as if the server had answered `errno`.
    fn not_sent(&mut self, op: Admin, errno: i32, reason: String) {
        match op {
            Admin::SessInfo => {
                self.sess_info_inflight = false;
                self.events
                    .push_back(ClientEvent::SessInfo(Err(DeviceError::NotSent {
                        what: "session info".into(),
                        errno,
                        reason,
                    })));
            }
            Admin::Open(i) => {
                let d = &mut self.devices[i];
                d.opening = false;
                let was = d.dev.state();
                if was == DevState::Unmapped {
                    return;
                }
                let error = DeviceError::NotSent {
                    what: format!("open of device '{}'", d.dev.name()),
                    errno,
                    reason,
                };
                self.open_failed(i, was, error);
            }
            Admin::Close { .. } => self.finish(op, errno, &[]),
        }
    }

    /// A failed OPEN: a first one leaves a dead handle, a re-open a disconnected device.
    fn open_failed(&mut self, i: usize, was: DevState, error: DeviceError) {
        if was == DevState::Init {
            self.devices[i].gone = true;
            self.publish(i);
        }
        self.events.push_back(ClientEvent::OpenFailed {
            dev: DevHandle(i),
            error,
        });
    }

    fn open_finished(&mut self, i: usize, errno: i32, reply: &[u8]) {
        let max_io = self.io.port.max_io_size();
        let d = &mut self.devices[i];
        d.opening = false;
        let was = d.dev.state();
        if was == DevState::Unmapped {
            // Closed while the OPEN was out: give the id back at once.
            if let Ok(rsp) = OpenRsp::decode(reply) {
                if errno == 0 {
                    self.queued.push_back(Admin::Close {
                        dev: None,
                        device_id: rsp.device_id,
                    });
                }
            }
            return;
        }
        d.dev.set_session_max_io(max_io);
        match d.dev.open_done(errno, reply) {
            Ok(info) => {
                let info = *info;
                self.publish(i);
                self.events.push_back(ClientEvent::Opened {
                    dev: DevHandle(i),
                    info,
                    remap: was == DevState::MappedDisconnected,
                });
            }
            Err(error) => {
                if let DeviceError::BadReply {
                    device_id: Some(device_id),
                    ..
                } = error
                {
                    self.queued.push_back(Admin::Close {
                        dev: None,
                        device_id,
                    });
                }
                self.open_failed(i, was, error);
            }
        }
    }
}

impl<P> std::fmt::Debug for RnbdClient<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdClient")
            .field("ver", &self.ver)
            .field("devices", &self.devices.iter().filter(|d| !d.gone).count())
            .field("queued_admin", &self.queued.len())
            .finish()
    }
}
