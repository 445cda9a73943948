//! The passive side (the kernel's `rtrs_srv_rdma_init`/`rtrs_rdma_connect`): a listening
//! cm_id on its own event channel, and connect requests answered by `rdma_accept` or
//! `rdma_reject`.
//!
//! Each request's new cm_id is moved at once to an event channel of its own
//! (`rdma_migrate_id`), so every connection polls only its own events.
//!
//! The listening id's event channel sits in an epoll set, the listener's
//! [`Listener::wait_fd`] for an acceptor that sleeps when idle: the same descriptor for
//! the listener's life, whichever id listens (a new one after its device came back).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::conn::{Slots, VerbsConn};
use super::cq::CqShare;
use super::sys::{CmEventKind, CmId, Endpoint, EventChannel, RawEvent, WakeSet};
use super::{Domain, Shared};
use crate::fabric::SetupCause;
use crate::fabric::{
    Conn, ConnRequest, CqRef, Fabric, FabricError, Hca, Listener, PendingConn, PrivateData, QpCaps,
};

/// Listen backlog, as the kernel's RTRS server uses.
const BACKLOG: i32 = 64;
/// Receiver-not-ready retries on accept; 7 means for ever.
const RNR_RETRY_COUNT: u8 = 7;
/// How often a listener whose device has gone tries to listen again.
const RELISTEN_EVERY: Duration = Duration::from_secs(1);

pub(super) struct VerbsListener {
    /// The fabric's devices: a request is accepted on the device it arrived through.
    dom: Arc<Domain>,
    /// The listening id; `None` while the device of its address has gone.
    id: Option<CmId>,
    /// The device an address of one device listens on (`None` for a wildcard address,
    /// which listens on every device, those that come later included).
    shared: Option<Arc<Shared>>,
    local: SocketAddr,
    /// When to try listening again, while `id` is `None`.
    relisten_at: Instant,
    error_logged: bool,
    /// The listening id's event channel, when there is one (`None`: no epoll set could be
    /// made; the listener is polled on the acceptor's timer).
    wake: Option<WakeSet>,
}

/// A listening id on `addr`, with the device it is bound to.
fn listen_on(
    dom: &Domain,
    addr: SocketAddr,
) -> Result<(CmId, Option<Arc<Shared>>), Box<SetupCause>> {
    let channel = EventChannel::create()?;
    let id = CmId::create(&channel)?;
    id.bind_addr(addr)?;
    let shared = if id.is_bound() {
        let Some(sh) = dom.on(&id) else {
            let names: Vec<String> = dom
                .present()
                .iter()
                .map(|s| s.pd.device().name().to_owned())
                .collect();
            return Err(SetupCause::refused(format!(
                "the address belongs to an RDMA device this fabric does not use (it has {})",
                names.join(", ")
            )));
        };
        Some(sh)
    } else {
        None
    };
    id.listen(BACKLOG)?;
    Ok((id, shared))
}

impl VerbsListener {
    /// Listens on `addr`: an address of one device listens on that device; a wildcard
    /// address on every device.
    pub fn bind(dom: Arc<Domain>, addr: SocketAddr) -> Result<VerbsListener, FabricError> {
        let (id, shared) =
            listen_on(&dom, addr).map_err(|cause| FabricError::Listen { addr, cause })?;
        let local = id.local_addr().unwrap_or(addr);
        let wake = WakeSet::new()
            .map_err(|e| tracing::warn!(%addr, "listener: no wake-up descriptor: {e}"))
            .ok();
        let mut l = VerbsListener {
            dom,
            id: None,
            shared,
            local,
            relisten_at: Instant::now(),
            error_logged: false,
            wake,
        };
        l.set_id(Some(id));
        Ok(l)
    }

    /// Listens through `id` (none: not listening), its channel in the wake-up set.
    fn set_id(&mut self, id: Option<CmId>) {
        if let Some(w) = &self.wake {
            if let Some(old) = &self.id {
                w.remove(old.channel().fd());
            }
            if let Some(new) = &id {
                if let Err(e) = w.add(new.channel().fd()) {
                    tracing::warn!(addr = %self.local, "listener: {e}");
                }
            }
        }
        self.id = id;
    }

    /// Lets the listening id go when its device has gone, and listens again (on the
    /// same address and port) once the address is on a device again. Whether it
    /// listens now.
    fn follow_device(&mut self) -> bool {
        if self.id.is_some() && self.shared.as_ref().is_some_and(|s| s.is_gone()) {
            let name = self
                .shared
                .as_ref()
                .map(|s| s.pd.device().name().to_owned());
            tracing::warn!(
                addr = %self.local,
                device = name.as_deref().unwrap_or(""),
                "listener: its RDMA device has gone; listening again once the address is on a device"
            );
            self.set_id(None);
            self.shared = None;
            self.relisten_at = Instant::now();
        }
        if self.id.is_some() {
            return true;
        }
        let now = Instant::now();
        if now < self.relisten_at {
            return false;
        }
        match listen_on(&self.dom, self.local) {
            Ok((id, shared)) => {
                tracing::info!(
                    addr = %self.local,
                    device = shared.as_ref().map_or("", |s| s.pd.device().name()),
                    "listening again"
                );
                self.set_id(Some(id));
                self.shared = shared;
                true
            }
            Err(e) => {
                tracing::debug!(addr = %self.local, "not listening yet: {e}");
                self.relisten_at = now + RELISTEN_EVERY;
                false
            }
        }
    }

    /// Turns a CONNECT_REQUEST into a [`ConnRequest`] on the device it arrived through,
    /// or refuses it when that is none of the fabric's.
    fn request(&self, ev: RawEvent) -> Option<ConnRequest> {
        let mut id = ev.new_id?;
        let Some(shared) = self.dom.on(&id) else {
            tracing::warn!(
                addr = %self.local,
                "refusing a connect request that arrived through an RDMA device this fabric did not open"
            );
            let _ = id.reject(&PrivateData::empty());
            return None;
        };
        let moved = EventChannel::create().and_then(|channel| id.migrate(channel));
        if let Err(e) = moved {
            tracing::warn!("refusing a connect request: {e}");
            let _ = id.reject(&PrivateData::empty());
            return None;
        }
        let peer = id.peer_addr().unwrap_or(self.local);
        Some(ConnRequest {
            private_data: ev.private_data,
            peer,
            pending: Box::new(VerbsPending {
                dom: self.dom.clone(),
                shared,
                ep: Some(Endpoint::new(id)),
            }),
        })
    }
}

impl Listener for VerbsListener {
    fn poll(&mut self) -> Option<ConnRequest> {
        if !self.follow_device() {
            return None;
        }
        loop {
            let next = self.id.as_ref()?.channel().next_event();
            match next {
                Ok(None) => return None,
                Ok(Some(ev)) if ev.new_id.is_some() => {
                    if let Some(req) = self.request(ev) {
                        return Some(req);
                    }
                }
                Ok(Some(ev)) if ev.kind == CmEventKind::DeviceRemoval => {
                    if let Some(sh) = &self.shared {
                        self.dom.table.device_removed(
                            sh.index,
                            &sh.gone,
                            "a listener saw RDMA_CM_EVENT_DEVICE_REMOVAL",
                        );
                    }
                    self.follow_device();
                    return None;
                }
                Ok(Some(ev)) => {
                    tracing::debug!(kind = ?ev.kind, status = ev.status, "listener event ignored");
                }
                Err(e) => {
                    if !self.error_logged {
                        self.error_logged = true;
                        tracing::error!(addr = %self.local, "{e}");
                    }
                    return None;
                }
            }
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.wake.as_ref().map(WakeSet::fd)
    }
}

/// A connect request not yet answered; dropping it rejects it.
struct VerbsPending {
    dom: Arc<Domain>,
    /// The device the request arrived through, in the domain it is accepted into.
    shared: Arc<Shared>,
    ep: Option<Endpoint>,
}

impl PendingConn for VerbsPending {
    fn accept(
        mut self: Box<Self>,
        domain: Option<&dyn Fabric>,
        cq: Option<&CqRef>,
        caps: QpCaps,
        private_data: PrivateData,
    ) -> Result<Box<dyn Conn>, FabricError> {
        if let Some(domain) = domain {
            self.move_into(domain)?;
        }
        match cq {
            Some(cq) => {
                let share = super::own_cq(&self.dom, cq)?;
                (*self).answer(caps, private_data, Some(&share))
            }
            None => (*self).answer(caps, private_data, None),
        }
    }

    fn hca(&self) -> Option<Hca> {
        let ep = self.ep.as_ref()?;
        Some(Hca {
            index: self.shared.index,
            name: Arc::from(self.shared.pd.device().name()),
            port: ep.id().port(),
        })
    }

    fn reject(mut self: Box<Self>, private_data: PrivateData) {
        if let Some(ep) = self.ep.take() {
            if let Err(e) = ep.id().reject(&private_data) {
                tracing::warn!("{e}");
            }
        }
    }
}

impl VerbsPending {
    /// Moves the request into `domain`, a domain of the listener's fabric, on the device
    /// the request arrived through.
    fn move_into(&mut self, domain: &dyn Fabric) -> Result<(), FabricError> {
        match domain.as_any().downcast_ref::<super::VerbsFabric>() {
            Some(d) if d.dom.same_fabric(&self.dom) => {
                let Some(sh) = d
                    .dom
                    .shared(self.shared.index)
                    .filter(|s| Arc::ptr_eq(&s.gone, &self.shared.gone))
                else {
                    return Err(FabricError::Accept {
                        cause: SetupCause::refused(format!(
                            "the RDMA device {} has gone",
                            self.shared.pd.device().name()
                        )),
                    });
                };
                self.shared = sh;
                self.dom = d.dom.clone();
            }
            _ => {
                return Err(FabricError::Accept {
                    cause: SetupCause::refused(
                        "the protection domain is not one of the listener's fabric",
                    ),
                })
            }
        }
        Ok(())
    }

    /// Creates the QP (on `cq`, or on its own CQ) and accepts.
    fn answer(
        mut self,
        caps: QpCaps,
        private_data: PrivateData,
        cq: Option<&Arc<CqShare>>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        let err = |cause: Box<SetupCause>| FabricError::Accept { cause };
        // On this error `self` is dropped, which rejects the request.
        super::check_caps(&self.shared, caps).map_err(|e| err(e.into()))?;
        let mut ep = self
            .ep
            .take()
            .ok_or_else(|| err(SetupCause::refused("request already answered")))?;
        let slots = match Slots::new(cq, caps) {
            Ok(s) => s,
            Err(cause) => {
                let _ = ep.id().reject(&PrivateData::empty());
                return Err(FabricError::Cq { cause });
            }
        };
        let raw_cq = match cq.map(|c| c.device_cq(&self.shared)) {
            None => None,
            Some(Some(q)) => Some(q),
            Some(None) => {
                let _ = ep.id().reject(&PrivateData::empty());
                return Err(err(SetupCause::refused(format!(
                    "the RDMA device {} has gone",
                    self.shared.pd.device().name()
                ))));
            }
        };
        let granted = match ep.create_qp(
            &self.shared.pd,
            caps,
            self.shared.attr.max_cqe,
            raw_cq.as_ref(),
        ) {
            Ok(granted) => granted,
            Err(e) => {
                let _ = ep.id().reject(&PrivateData::empty());
                return Err(err(e.into()));
            }
        };
        ep.id()
            .accept(&private_data, RNR_RETRY_COUNT)
            .map_err(|e| err(e.into()))?;
        Ok(Box::new(VerbsConn::accepted(
            self.dom.clone(),
            self.shared.clone(),
            ep,
            granted,
            slots,
        )))
    }
}

impl Drop for VerbsPending {
    fn drop(&mut self) {
        if let Some(ep) = self.ep.take() {
            let _ = ep.id().reject(&PrivateData::empty());
        }
    }
}
