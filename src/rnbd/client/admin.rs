//! The admin side of an RNBD client session ([`RnbdAdmin`]): the kernel's
//! `rnbd_clt_session` with `send_msg_sess_info`, `send_msg_open`, `send_msg_close` and
//! the link-event handling (`rnbd_clt_link_ev`: DISCONNECTED marks devices
//! disconnected, RECONNECTED sends SESS_INFO then re-opens every device and adopts the
//! new device ids). It keeps the session's device table and publishes every change of
//! it as a new snapshot ([`DeviceTable`]) that every core's [`RnbdQueue`] picks up.
//!
//! The admin has no session handle of its own: it sends SESS_INFO, OPEN and CLOSE
//! through the queue of the core it runs on, which keeps their completions for it.
//! Everything is non-blocking: requests are queued, sent when a permit and a reply slot
//! are free, and reported as [`ClientEvent`]s by [`RnbdAdmin::poll`]. OPENs wait for an
//! outstanding SESS_INFO, as the kernel sends SESS_INFO first.
//!
//! Beyond the kernel's client: [`RnbdAdmin::remap`] sends OPEN again on request (the
//! kernel's `remap_device`; the answer carries the device's size and geometry as they
//! are now, so it is also its `resize`), a device whose mapping the server closed is
//! marked so (see [`table`](super::table)), and a loss timeout
//! ([`RnbdAdmin::set_loss_timeout`], SPDK bdev_nvme's `ctrlr_loss_timeout_sec`) gives the
//! devices up once the session has had no path for that long: their IO fails at once.

use std::collections::VecDeque;
use std::sync::Arc;

use super::config::WriteZeroesMode;
use super::device::{sess_info_done, DevState, DeviceError, RnbdDevice};
use super::handle::{RnbdSendError, SessionHandle};
use super::msg::{self, DeviceInfo};
use super::queue::{DevHandle, IoError, RnbdQueue, ADMIN_TAG};
use super::rtrs::{completion_result, LinkListener};
use super::table::DeviceTable;
use crate::client::{ClientIo, PathWait, Sgl};
use crate::common::LinkEvent;
use crate::fabric::{Mr, Sge};
use crate::proto::rnbd::{AccessMode, OpenRsp, SessInfo};
use crate::rnbd::Dir;
use crate::Errno;

mod steer;

/// Bytes of the reply buffer per admin request in flight (≥ OPEN_RSP's 56).
pub const REPLY_SLOT: usize = 64;

/// What [`RnbdAdmin::poll`] (and [`RnbdClient::poll`](super::RnbdClient::poll))
/// reports.
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
    /// A re-open asked for with [`RnbdAdmin::remap`] succeeded: the device is mapped
    /// with `info` (its id, size and geometry may have changed).
    Remapped { dev: DevHandle, info: DeviceInfo },
    /// The server closed the device's mapping while the session stayed up (its
    /// operator's forced close): its IO fails until a re-open.
    ServerClosed { dev: DevHandle },
    /// The session had no path for the loss timeout: the device's IO fails from now on.
    Lost { dev: DevHandle },
    /// A block request ended (only [`RnbdClient`](super::RnbdClient) reports these).
    Io { tag: u64, result: Result<(), Errno> },
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
    /// That OPEN is a [`RnbdAdmin::remap`].
    remapping: bool,
    /// Unmapped: the entry is kept (handles are never reused) but dead.
    gone: bool,
}

/// The devices of one client session and their SESS_INFO/OPEN/CLOSE (see the module
/// doc).
pub struct RnbdAdmin {
    /// Reply space of admin requests, `REPLY_SLOT` bytes per slot. Named to the
    /// queue's session as one of its regions before a reply is asked into it, so that
    /// the session resolves the reply's segment without asking the fabric (the verbs
    /// fabric keeps no table of registrations to ask).
    replies: Arc<Mr>,
    /// `replies` was named to the queue's session ([`SessionHandle::use_region`]).
    replies_named: bool,
    /// What each reply slot's request in flight is.
    in_flight: Vec<Option<Admin>>,
    queued: VecDeque<Admin>,
    devices: Vec<Dev>,
    ver: Option<u8>,
    sess_info_inflight: bool,
    events: VecDeque<ClientEvent>,
    links: Option<LinkListener>,
    table: Arc<DeviceTable>,
    /// Reconnected; devices are re-opened once no block request is in flight.
    reopen_pending: bool,
    /// How long the session may have no path before its devices are lost (ns).
    loss_timeout: Option<u64>,
    /// The session has no path ([`link_down`](Self::link_down) without a
    /// [`link_up`](Self::link_up) since), and since when (taken at the next poll).
    link_down: bool,
    down_since: Option<u64>,
}

impl RnbdAdmin {
    /// An admin whose replies land in `replies` (registered with the session's fabric,
    /// local write access; one admin request in flight per [`REPLY_SLOT`] bytes). Build
    /// each core's queue over its [`table`](Self::table).
    ///
    /// # Errors
    /// [`DeviceError::ReplyBuffer`] when `replies` is smaller than [`REPLY_SLOT`] bytes.
    pub fn new(replies: Mr) -> Result<RnbdAdmin, DeviceError> {
        let n = replies.len() / REPLY_SLOT;
        if n == 0 {
            return Err(DeviceError::ReplyBuffer { len: replies.len() });
        }
        Ok(RnbdAdmin {
            replies: Arc::new(replies),
            replies_named: false,
            in_flight: vec![None; n],
            queued: VecDeque::new(),
            devices: Vec::new(),
            ver: None,
            sess_info_inflight: false,
            events: VecDeque::with_capacity(64),
            links: None,
            table: Arc::new(DeviceTable::default()),
            reopen_pending: false,
            loss_timeout: None,
            link_down: false,
            down_since: None,
        })
    }

    /// The published devices, for every core's [`RnbdQueue::new`].
    pub fn table(&self) -> &Arc<DeviceTable> {
        &self.table
    }

    /// Publishes the device table as its next version.
    fn publish(&self) {
        let devices = self
            .devices
            .iter()
            .map(|d| (!d.gone).then(|| d.dev.clone()))
            .collect();
        self.table.publish(devices);
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
    pub fn sess_info<S: SessionHandle>(&mut self, q: &mut RnbdQueue<S>, now: u64) {
        self.queue_sess_info();
        self.pump(q, now);
    }

    /// Maps `name` in `mode`, its write-zeroes sent as `write_zeroes` says (the
    /// device's own: devices of one session may differ): SESS_INFO first if the version
    /// is not known yet, then OPEN; [`ClientEvent::Opened`] or
    /// [`ClientEvent::OpenFailed`] tells the outcome.
    ///
    /// # Errors
    /// A name OPEN cannot carry, or one already open in this session (the server would
    /// answer with the existing mapping, whatever the mode).
    pub fn open<S: SessionHandle>(
        &mut self,
        q: &mut RnbdQueue<S>,
        now: u64,
        name: &str,
        mode: AccessMode,
        write_zeroes: WriteZeroesMode,
    ) -> Result<DevHandle, DeviceError> {
        let dev = RnbdDevice::new(name, mode, q.max_io_size())?.with_write_zeroes(write_zeroes);
        if self.devices.iter().any(|d| !d.gone && d.dev.name() == name) {
            return Err(DeviceError::AlreadyOpen {
                name: name.to_string(),
            });
        }
        let h = self.devices.len();
        self.devices.push(Dev {
            dev,
            opening: true,
            remapping: false,
            gone: false,
        });
        self.publish();
        if self.ver.is_none() {
            self.queue_sess_info();
        }
        self.queued.push_back(Admin::Open(h));
        self.pump(q, now);
        Ok(DevHandle(h))
    }

    /// Unmaps `dev`: CLOSE when the server knows the id, then [`ClientEvent::Closed`].
    ///
    /// # Errors
    /// [`IoError::NoDevice`] for a closed or unknown handle.
    pub fn close<S: SessionHandle>(
        &mut self,
        q: &mut RnbdQueue<S>,
        now: u64,
        dev: DevHandle,
    ) -> Result<(), IoError> {
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
        self.publish();
        self.pump(q, now);
        Ok(())
    }

    /// The session lost its last path: devices wait for a re-open; the version is
    /// negotiated again on reconnect.
    pub fn link_down(&mut self) {
        self.link_down = true;
        for d in self.devices.iter_mut().filter(|d| !d.gone) {
            d.dev.link_down();
        }
        self.publish();
        self.ver = None;
        self.reopen_pending = false;
    }

    /// The session has a path again: SESS_INFO, then OPEN for every device that was
    /// mapped (adopting the ids the new server session gives) once no block request
    /// of any core is in flight any more (see [`DeviceTable`]).
    pub fn link_up<S: SessionHandle>(&mut self, q: &mut RnbdQueue<S>, now: u64) {
        self.link_down = false;
        self.down_since = None;
        self.queue_sess_info();
        self.reopen_pending = true;
        self.try_reopen();
        self.pump(q, now);
    }

    fn try_reopen(&mut self) {
        if !self.reopen_pending || self.table.in_flight() != 0 {
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

    /// Makes progress with the completions `q` (polled just before, by its owner) kept
    /// for the admin, and moves up to `out.len()` events into `out`; returns how many.
    pub fn poll<S: SessionHandle>(
        &mut self,
        q: &mut RnbdQueue<S>,
        now: u64,
        out: &mut [ClientEvent],
    ) -> usize {
        while let Some(ev) = self.links.as_ref().and_then(LinkListener::take) {
            match ev {
                LinkEvent::Disconnected => self.link_down(),
                LinkEvent::Connected => self.link_up(q, now),
            }
        }
        // After the link events: a report from before a reconnect names an older table.
        self.take_closed_reports();
        self.check_loss(now);
        while let Some(c) = q.take_admin() {
            let max_io = q.max_io_size();
            self.admin_done((c.tag & !ADMIN_TAG) as usize, completion_result(&c), max_io);
        }
        self.try_reopen();
        self.pump(q, now);
        self.take_events(out)
    }

    /// Moves up to `out.len()` events into `out`; returns how many.
    pub(super) fn take_events(&mut self, out: &mut [ClientEvent]) -> usize {
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
    fn pump<S: SessionHandle>(&mut self, q: &mut RnbdQueue<S>, now: u64) {
        while let Some(&op) = self.queued.front() {
            if self.sess_info_inflight && !matches!(op, Admin::Close { .. }) {
                break;
            }
            let Some(slot) = self.in_flight.iter().position(Option::is_none) else {
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
                if !self.replies_named {
                    self.replies_named = true;
                    q.session_mut().use_region(Arc::clone(&self.replies));
                }
                std::slice::from_ref(&sge)
            };
            let io = ClientIo {
                tag: ADMIN_TAG | slot as u64,
                dir,
                usr,
                sgl: Sgl::Copy(sgl),
                admin: true,
                wait: PathWait::Session,
            };
            match q.submit_admin(now, io) {
                Ok(()) => {
                    self.queued.pop_front();
                    self.in_flight[slot] = Some(op);
                    if matches!(op, Admin::SessInfo) {
                        self.sess_info_inflight = true;
                    }
                }
                Err(RnbdSendError::Busy | RnbdSendError::Unreachable) => break,
                Err(RnbdSendError::Refused { errno, reason }) => {
                    self.queued.pop_front();
                    self.not_sent(q, op, errno, reason);
                }
            }
        }
    }

    /// `max_io`: the session's now (an OPEN's answer is limited by it).
    fn admin_done(&mut self, slot: usize, result: Result<(), Errno>, max_io: u32) {
        let Some(op) = self.in_flight.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let mut reply = [0u8; REPLY_SLOT];
        let len = match op {
            Admin::SessInfo => SessInfo::LEN,
            Admin::Open(_) => OpenRsp::LEN,
            Admin::Close { .. } => 0,
        };
        if result.is_ok() && len > 0 {
            self.replies.read_at(slot * REPLY_SLOT, &mut reply[..len]);
        }
        self.finish(op, result, &reply[..len], max_io);
    }

    fn finish(&mut self, op: Admin, result: Result<(), Errno>, reply: &[u8], max_io: u32) {
        match op {
            Admin::SessInfo => {
                self.sess_info_inflight = false;
                let r = sess_info_done(result, reply);
                if let Ok(v) = r {
                    self.ver = Some(v);
                }
                self.events.push_back(ClientEvent::SessInfo(r));
            }
            Admin::Open(i) => self.open_finished(i, result, reply, max_io),
            Admin::Close { dev, .. } => {
                if let Some(i) = dev {
                    self.devices[i].gone = true;
                    self.publish();
                    self.events
                        .push_back(ClientEvent::Closed { dev: DevHandle(i) });
                }
            }
        }
    }

    /// The session could not carry `op` (nothing reached the server): it fails with the
    /// session's reason rather than as if the server had answered `errno`.
    fn not_sent<S: SessionHandle>(
        &mut self,
        q: &mut RnbdQueue<S>,
        op: Admin,
        errno: Errno,
        reason: String,
    ) {
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
                d.remapping = false;
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
            Admin::Close { .. } => self.finish(op, Err(errno), &[], q.max_io_size()),
        }
    }

    /// A failed OPEN: a first one leaves a dead handle, a re-open a disconnected device.
    fn open_failed(&mut self, i: usize, was: DevState, error: DeviceError) {
        if was == DevState::Init {
            self.devices[i].gone = true;
            self.publish();
        }
        self.events.push_back(ClientEvent::OpenFailed {
            dev: DevHandle(i),
            error,
        });
    }

    fn open_finished(&mut self, i: usize, result: Result<(), Errno>, reply: &[u8], max_io: u32) {
        let d = &mut self.devices[i];
        d.opening = false;
        let remapping = std::mem::take(&mut d.remapping);
        let was = d.dev.state();
        if was == DevState::Lost {
            // Given up while the OPEN was out: the owner unmaps it; the id goes back.
            if let (Ok(()), Ok(rsp)) = (result, OpenRsp::decode(reply)) {
                self.queued.push_back(Admin::Close {
                    dev: None,
                    device_id: rsp.device_id,
                });
            }
        }
        if was == DevState::Unmapped {
            // Closed while the OPEN was out: give the id back at once.
            if let Ok(rsp) = OpenRsp::decode(reply) {
                if result.is_ok() {
                    self.queued.push_back(Admin::Close {
                        dev: None,
                        device_id: rsp.device_id,
                    });
                }
            }
            return;
        }
        d.dev.set_session_max_io(max_io);
        match d.dev.open_done(result, reply) {
            Ok(info) => {
                let info = *info;
                self.publish();
                self.events.push_back(if remapping {
                    ClientEvent::Remapped {
                        dev: DevHandle(i),
                        info,
                    }
                } else {
                    ClientEvent::Opened {
                        dev: DevHandle(i),
                        info,
                        remap: was != DevState::Init,
                    }
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

impl std::fmt::Debug for RnbdAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdAdmin")
            .field("ver", &self.ver)
            .field("devices", &self.devices.iter().filter(|d| !d.gone).count())
            .field("queued_admin", &self.queued.len())
            .finish()
    }
}
