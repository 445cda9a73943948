//! The connection manager (the kernel's `rdma_cm` as `rtrs-clt.c`/`rtrs-srv.c` use it):
//! non-blocking event channels, cm_ids in the TCP port space, and socket addresses in
//! the C layout rdma_cm takes.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr;
use std::sync::Arc;

use rdma_sys as ffi;

use super::{Device, SysError};
use crate::fabric::{PrivateData, PRIVATE_DATA_LEN};

/// An rdma_cm event channel whose fd is non-blocking, so polling it never blocks.
pub(in crate::fabric::verbs) struct EventChannel {
    raw: *mut ffi::rdma_event_channel,
}

// SAFETY: the channel is an fd; rdma_get_cm_event may be called from any thread.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    pub fn create() -> Result<Arc<EventChannel>, SysError> {
        // SAFETY: no arguments; the result is checked.
        let raw = unsafe { ffi::rdma_create_event_channel() };
        if raw.is_null() {
            return Err(SysError::last("rdma_create_event_channel"));
        }
        let chan = EventChannel { raw };
        // SAFETY: `raw` is a live channel; its fd is open.
        let fd = unsafe { (*raw).fd };
        // SAFETY: plain fcntl calls on an fd we own.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(SysError::last(
                "fcntl(O_NONBLOCK) on the rdma_cm event channel",
            ));
        }
        Ok(Arc::new(chan))
    }

    /// The channel's descriptor: readable while an event waits to be read.
    pub fn fd(&self) -> libc::c_int {
        // SAFETY: the channel is live; its fd is set by rdma_create_event_channel.
        unsafe { (*self.raw).fd }
    }

    /// The next event, copied out and acknowledged; `None` when none is pending.
    pub fn next_event(self: &Arc<Self>) -> Result<Option<RawEvent>, SysError> {
        let mut ev: *mut ffi::rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; `ev` is a valid out-pointer.
        if unsafe { ffi::rdma_get_cm_event(self.raw, &mut ev) } != 0 {
            let err = SysError::last("rdma_get_cm_event");
            return match err.source.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: a successful rdma_get_cm_event returned a valid event, valid until
        // acked. `param.conn` is the variant of connected (RC) port spaces; its private
        // data pointer is valid for `private_data_len` bytes until the ack.
        let (kind, status, id, private_data) = unsafe {
            let e = &*ev;
            let conn = &e.param.conn;
            let len = (conn.private_data_len as usize).min(PRIVATE_DATA_LEN);
            let data = if conn.private_data.is_null() || len == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(conn.private_data.cast::<u8>(), len)
            };
            (
                e.event,
                e.status,
                e.id,
                PrivateData::new(data).unwrap_or_else(|_| PrivateData::empty()),
            )
        };
        // SAFETY: `ev` came from rdma_get_cm_event and is acked once; nothing of it is
        // used afterwards (everything needed was copied above).
        let ret = unsafe { ffi::rdma_ack_cm_event(ev) };
        if ret != 0 {
            tracing::warn!(ret, "rdma_ack_cm_event failed");
        }
        let kind = CmEventKind::from_raw(kind);
        let new_id = (kind == CmEventKind::ConnectRequest && !id.is_null()).then(|| CmId {
            raw: id,
            channel: self.clone(),
        });
        Ok(Some(RawEvent {
            kind,
            status,
            private_data,
            new_id,
        }))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // Last of a connection's CM objects: every cm_id on it holds an Arc.
        // SAFETY: created in `create`, destroyed once, with no cm_id left on it.
        unsafe { ffi::rdma_destroy_event_channel(self.raw) };
    }
}

/// The rdma_cm event types this fabric tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::fabric::verbs) enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    fn from_raw(v: ffi::rdma_cm_event_type::Type) -> CmEventKind {
        use ffi::rdma_cm_event_type::*;
        match v {
            RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }
}

/// An rdma_cm event, copied out of librdmacm and already acknowledged.
pub(in crate::fabric::verbs) struct RawEvent {
    pub kind: CmEventKind,
    pub status: i32,
    pub private_data: PrivateData,
    /// The new cm_id of a CONNECT_REQUEST (ours to accept, reject and destroy).
    pub new_id: Option<CmId>,
}

/// An rdma_cm identifier on an event channel (TCP port space, RC queue pairs).
pub(in crate::fabric::verbs) struct CmId {
    pub(super) raw: *mut ffi::rdma_cm_id,
    // Dropped after the id (field drop after Drop::drop): the channel goes last.
    channel: Arc<EventChannel>,
}

// SAFETY: a cm_id is used by one thread at a time (its owner is not Sync) and librdmacm
// allows calls on it from any thread.
unsafe impl Send for CmId {}

impl CmId {
    pub fn create(channel: &Arc<EventChannel>) -> Result<CmId, SysError> {
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is live; `raw` is a valid out-pointer.
        let ret = unsafe {
            ffi::rdma_create_id(
                channel.raw,
                &mut raw,
                ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if ret != 0 || raw.is_null() {
            return Err(SysError::last("rdma_create_id(RDMA_PS_TCP)"));
        }
        Ok(CmId {
            raw,
            channel: channel.clone(),
        })
    }

    /// Moves the id (and its future events) to `channel`. The id must have no event
    /// left unacknowledged, which holds: [`EventChannel::next_event`] acks at once.
    pub fn migrate(&mut self, channel: Arc<EventChannel>) -> Result<(), SysError> {
        // SAFETY: id and channel are live; all events of the id were acked.
        let ret = unsafe { ffi::rdma_migrate_id(self.raw, channel.raw) };
        SysError::check("rdma_migrate_id", ret)?;
        self.channel = channel;
        Ok(())
    }

    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    pub fn bind_addr(&self, addr: SocketAddr) -> Result<(), SysError> {
        let mut sa = RawSockAddr::from(addr);
        // SAFETY: the id is live; `sa` is a valid sockaddr of the right family.
        let ret = unsafe { ffi::rdma_bind_addr(self.raw, sa.as_mut_ptr()) };
        SysError::check("rdma_bind_addr", ret)
    }

    pub fn listen(&self, backlog: i32) -> Result<(), SysError> {
        // SAFETY: the id is live and bound.
        let ret = unsafe { ffi::rdma_listen(self.raw, backlog) };
        SysError::check("rdma_listen", ret)
    }

    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> Result<(), SysError> {
        let mut sa = RawSockAddr::from(dst);
        let mut src_sa = src.map(RawSockAddr::from);
        let src_ptr = src_sa.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr());
        // SAFETY: the id is live; `sa` (and `src_sa` when given) are valid sockaddrs that
        // outlive the call; librdmacm copies them.
        let ret = unsafe { ffi::rdma_resolve_addr(self.raw, src_ptr, sa.as_mut_ptr(), timeout_ms) };
        SysError::check("rdma_resolve_addr", ret)
    }

    pub fn resolve_route(&self, timeout_ms: i32) -> Result<(), SysError> {
        // SAFETY: the id is live with a resolved address.
        let ret = unsafe { ffi::rdma_resolve_route(self.raw, timeout_ms) };
        SysError::check("rdma_resolve_route", ret)
    }

    /// Sends the connect request: `retry_count` transport retries and `rnr_retry_count`
    /// receiver-not-ready retries (7 means for ever), no RDMA READ resources.
    pub fn connect(&self, data: &PrivateData, retry: u8, rnr_retry: u8) -> Result<(), SysError> {
        let mut param = conn_param(data, retry, rnr_retry);
        // SAFETY: the id is live with a resolved route; `param` and the private data it
        // points to live across the call (librdmacm copies them).
        let ret = unsafe { ffi::rdma_connect(self.raw, &mut param) };
        SysError::check("rdma_connect", ret)
    }

    pub fn accept(&self, data: &PrivateData, rnr_retry: u8) -> Result<(), SysError> {
        let mut param = conn_param(data, 0, rnr_retry);
        // SAFETY: the id is a live connect-request id with a QP; `param` lives across
        // the call.
        let ret = unsafe { ffi::rdma_accept(self.raw, &mut param) };
        SysError::check("rdma_accept", ret)
    }

    pub fn reject(&self, data: &PrivateData) -> Result<(), SysError> {
        let bytes = data.as_bytes();
        // SAFETY: the id is a live connect-request id; the data pointer is valid for
        // `len` bytes during the call.
        let ret = unsafe { ffi::rdma_reject(self.raw, bytes.as_ptr().cast(), bytes.len() as u8) };
        SysError::check("rdma_reject", ret)
    }

    /// Moves the QP (if any) to the error state, flushing outstanding work, and sends a
    /// disconnect request.
    pub fn disconnect(&self) -> Result<(), SysError> {
        // SAFETY: the id is live.
        let ret = unsafe { ffi::rdma_disconnect(self.raw) };
        SysError::check("rdma_disconnect", ret)
    }

    /// Whether the id is bound to `dev` (`None` while bound to no device, as a
    /// wildcard listener is).
    pub fn is_on(&self, dev: &Device) -> Option<bool> {
        // SAFETY: the id is live; `verbs` is set by librdmacm once an address is bound.
        let verbs = unsafe { (*self.raw).verbs };
        (!verbs.is_null()).then_some(verbs == dev.ctx)
    }

    /// The name of the device librdmacm bound the id to (`None` while bound to none).
    pub fn device_name(&self) -> Option<String> {
        // SAFETY: the id is live; `verbs`, once set, is an open context whose device has
        // a NUL-terminated name.
        unsafe {
            let verbs = (*self.raw).verbs;
            (!verbs.is_null()).then(|| {
                std::ffi::CStr::from_ptr(ffi::ibv_get_device_name((*verbs).device))
                    .to_string_lossy()
                    .into_owned()
            })
        }
    }

    /// Whether librdmacm bound the id to a device (a wildcard listener is bound to none).
    pub fn is_bound(&self) -> bool {
        // SAFETY: the id is live; `verbs` is set by librdmacm once an address is bound.
        !unsafe { (*self.raw).verbs }.is_null()
    }

    /// The device port the id is bound to (0 before it is bound).
    pub fn port(&self) -> u8 {
        // SAFETY: the id is live; `port_num` is plain data librdmacm sets when it binds.
        unsafe { (*self.raw).port_num }
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is live; the source address storage is part of it and is at
        // least as large as any sockaddr its family names.
        unsafe {
            let p = ptr::addr_of!((*self.raw).route.addr.src_addr_union);
            read_sockaddr(p.cast())
        }
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as in local_addr, for the destination address.
        unsafe {
            let p = ptr::addr_of!((*self.raw).route.addr.dst_addr_union);
            read_sockaddr(p.cast())
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // After its QP (Endpoint destroys that first); before its channel (field drop).
        // SAFETY: created by rdma_create_id or handed over by a CONNECT_REQUEST; every
        // event of it was acked, so this does not wait.
        let ret = unsafe { ffi::rdma_destroy_id(self.raw) };
        if ret != 0 {
            tracing::warn!(ret, "rdma_destroy_id failed");
        }
    }
}

fn conn_param(data: &PrivateData, retry: u8, rnr_retry: u8) -> ffi::rdma_conn_param {
    let bytes = data.as_bytes();
    ffi::rdma_conn_param {
        private_data: if bytes.is_empty() {
            ptr::null()
        } else {
            bytes.as_ptr().cast()
        },
        private_data_len: bytes.len() as u8,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: retry,
        rnr_retry_count: rnr_retry,
        srq: 0,
        qp_num: 0,
    }
}

/// A socket address in the C layout rdma_cm takes.
enum RawSockAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl From<SocketAddr> for RawSockAddr {
    fn from(addr: SocketAddr) -> RawSockAddr {
        match addr {
            SocketAddr::V4(a) => RawSockAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => RawSockAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }
}

impl RawSockAddr {
    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        match self {
            RawSockAddr::V4(a) => (a as *mut libc::sockaddr_in).cast(),
            RawSockAddr::V6(a) => (a as *mut libc::sockaddr_in6).cast(),
        }
    }
}

/// # Safety
/// `p` must point to readable memory of `sockaddr_storage` size.
unsafe fn read_sockaddr(p: *const libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees `p` is readable; the family selects the layout.
    unsafe {
        match (*p).ss_family as libc::c_int {
            libc::AF_INET => {
                let a = &*p.cast::<libc::sockaddr_in>();
                let ip = Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let a = &*p.cast::<libc::sockaddr_in6>();
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(a.sin6_port),
                    u32::from_be(a.sin6_flowinfo),
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}
