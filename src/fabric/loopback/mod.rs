//! The loopback fabric: RDMA semantics between endpoints of one process, with fault
//! injection. It stands in for an RDMA NIC and its connection manager (the kernel's
//! `ib_device` + `rdma_cm`) in deterministic protocol tests and for an in-process target.
//!
//! - A [`LoopbackFabric`] is one protection domain with its own name table: addresses are
//!   plain `SocketAddr` names registered in it (no sockets); connecting and listening
//!   sides must use the same instance (clone it freely).
//! - Every connection end is a soft RC queue pair (`src/fabric/soft`); the two are
//!   joined by a link of bounded lock-free queues, so the ends may be polled from
//!   different threads. The receiving end copies each payload straight from the
//!   sender's registered memory into its place: one copy, no allocation per operation.
//! - [`Faults`] breaks, silences, delays or refuses posts on a connection.
//! - With both ends on one thread the same calls give the same completions, every run.

mod conn;
mod faults;
mod link;
mod ring;
mod rq;

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

pub use conn::LoopbackConn;
pub use faults::Faults;
pub use link::MAX_SGE;

use link::{Handshake, Link, CLIENT, SERVER};

use super::mem::Backing;
use super::soft::{self, MrTable, MAX_MR_SIZE};
use super::{
    Access, Conn, ConnRequest, ConnectOptions, Cq, CqRef, Fabric, FabricCaps, FabricError,
    FabricKind, FastMr, KeyScope, ListenOptions, Listener, MemBuf, Mr, PendingConn, PrivateData,
    QpCaps,
};
use super::{CapsError, SetupCause};

use crate::sync::lock;

/// Largest send and receive queues a loopback connection accepts.
pub const MAX_QUEUE_WR: u32 = 1 << 16;

/// Where the search for a free port starts for `listen` on port 0 ...
const FIRST_LISTEN_PORT: u16 = 1024;
/// ... and for the address of a connecting end.
const FIRST_EPHEMERAL_PORT: u16 = 49152;

/// The in-process fabric. Clones share the same registrations and name table; its
/// domains ([`Fabric::domain`]) share the name table only.
#[derive(Clone)]
pub struct LoopbackFabric {
    inner: Arc<Inner>,
    table: Arc<MrTable>,
}

struct Inner {
    names: Mutex<Names>,
}

#[derive(Default)]
struct Names {
    listeners: HashMap<SocketAddr, Arc<Backlog>>,
    /// Addresses of live connecting ends.
    ephemeral: HashSet<SocketAddr>,
    next_listen_port: u16,
    next_ephemeral_port: u16,
    /// Every connection, for [`LoopbackFabric::faults`].
    links: Vec<Weak<Link>>,
}

/// A connecting end's address, released from the name table when that end drops.
struct EphemeralName {
    inner: Weak<Inner>,
    addr: SocketAddr,
}

impl Drop for EphemeralName {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.upgrade() {
            inner.names().ephemeral.remove(&self.addr);
        }
    }
}

/// Requests waiting for a listener's `poll`, and the protection domain of the fabric
/// that listens (where an accepted connection goes unless accepted into another).
struct Backlog {
    requests: Mutex<VecDeque<Pending>>,
    table: Arc<MrTable>,
}

impl Backlog {
    fn requests(&self) -> MutexGuard<'_, VecDeque<Pending>> {
        lock(&self.requests)
    }
}

impl Default for LoopbackFabric {
    fn default() -> Self {
        LoopbackFabric::new()
    }
}

impl LoopbackFabric {
    /// [`Fabric::domain`], as the concrete type (for wrappers).
    pub fn new_domain(&self) -> LoopbackFabric {
        LoopbackFabric {
            inner: self.inner.clone(),
            table: self.table.domain(),
        }
    }

    /// The protection domain's registrations.
    fn table(&self) -> &Arc<MrTable> {
        &self.table
    }

    fn registrations(&self) -> soft::Registrations<'_> {
        soft::Registrations {
            table: &self.table,
            kind: FabricKind::Loopback,
            max_len: MAX_MR_SIZE,
        }
    }
}

impl std::fmt::Debug for LoopbackFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoopbackFabric")
    }
}

impl LoopbackFabric {
    pub fn new() -> LoopbackFabric {
        // The ends' busy handshake registers its barrier once, here rather than on a
        // first post (`link::EndState::busy_guard`).
        crate::sync::membarrier::prepare();
        let names = Names {
            next_listen_port: FIRST_LISTEN_PORT,
            next_ephemeral_port: FIRST_EPHEMERAL_PORT,
            ..Names::default()
        };
        LoopbackFabric {
            inner: Arc::new(Inner {
                names: Mutex::new(names),
            }),
            table: MrTable::new(),
        }
    }

    /// The fault controls of `conn`'s end of its connection, if `conn` is a connection of
    /// this fabric (found by its local and peer addresses).
    pub fn faults(&self, conn: &dyn Conn) -> Option<Faults> {
        self.faults_between(conn.local_addr()?, conn.peer_addr()?)
    }

    /// The fault controls of the connecting end of every live connection to `listen` (a
    /// listener's address), oldest first: a whole path of a session, for tests that
    /// break one (the acceptor's ends are their [`Faults::peer`]).
    pub fn faults_to(&self, listen: SocketAddr) -> Vec<Faults> {
        let names = self.inner.names();
        names
            .links
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|link| link.addrs[SERVER] == listen)
            .map(|link| Faults::new(link, CLIENT))
            .collect()
    }

    /// The fault controls of the end at `local` of the connection between `local` and
    /// `peer` (the newest such connection still alive).
    pub fn faults_between(&self, local: SocketAddr, peer: SocketAddr) -> Option<Faults> {
        let names = self.inner.names();
        names
            .links
            .iter()
            .rev()
            .filter_map(Weak::upgrade)
            .find_map(|link| {
                let end = if link.addrs == [local, peer] {
                    CLIENT
                } else if link.addrs == [peer, local] {
                    SERVER
                } else {
                    return None;
                };
                Some(Faults::new(link, end))
            })
    }
}

impl Inner {
    fn names(&self) -> MutexGuard<'_, Names> {
        lock(&self.names)
    }
}

impl Names {
    fn taken(&self, addr: &SocketAddr) -> bool {
        self.listeners.contains_key(addr) || self.ephemeral.contains(addr)
    }

    /// A free port on `ip`, searching from `*next` upwards within `[first, 65535]`.
    fn free_port(&self, ip: IpAddr, first: u16, next: u16) -> Option<u16> {
        let span = u32::from(u16::MAX - first) + 1;
        (0..span)
            .map(|i| first + ((u32::from(next - first) + i) % span) as u16)
            .find(|&p| !self.taken(&SocketAddr::new(ip, p)))
    }
}

/// The loopback's limits.
const LOOPBACK_CAPS: FabricCaps = FabricCaps {
    max_send_wr: MAX_QUEUE_WR,
    max_recv_wr: MAX_QUEUE_WR,
    max_send_sge: MAX_SGE as u32,
    max_mr_size: MAX_MR_SIZE,
    local_ops_at_post: true,
    core_cq_entries: crate::fabric::soft::cq::MAX_CQ_ENTRIES,
};

/// Checks queue sizes against [`LOOPBACK_CAPS`] ([`QpCaps::check_within`]).
fn check_caps(caps: &QpCaps) -> Result<(), CapsError> {
    caps.check_within(&LOOPBACK_CAPS, "the loopback's")
}

impl Fabric for LoopbackFabric {
    fn kind(&self) -> FabricKind {
        FabricKind::Loopback
    }

    fn caps(&self) -> FabricCaps {
        LOOPBACK_CAPS
    }

    crate::fabric::soft::soft_fabric_methods!();

    fn local_memory(&self, sge: &crate::fabric::Sge, need: Access) -> Option<Arc<Backing>> {
        self.registrations().local_memory(sge, need)
    }

    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError> {
        opts.check_plain(addr, self.kind())?;
        let mut names = self.inner.names();
        let addr = if addr.port() == 0 {
            let port = names
                .free_port(addr.ip(), FIRST_LISTEN_PORT, names.next_listen_port)
                .ok_or_else(|| FabricError::Listen {
                    addr,
                    cause: SetupCause::refused("no free port left"),
                })?;
            names.next_listen_port = port.checked_add(1).unwrap_or(FIRST_LISTEN_PORT);
            SocketAddr::new(addr.ip(), port)
        } else if names.taken(&addr) {
            return Err(FabricError::Listen {
                addr,
                cause: SetupCause::refused("address already in use in this loopback fabric"),
            });
        } else {
            addr
        };
        let backlog = Arc::new(Backlog {
            requests: Mutex::new(VecDeque::new()),
            table: self.table.clone(),
        });
        names.listeners.insert(addr, backlog.clone());
        Ok(Box::new(LoopbackListener {
            inner: self.inner.clone(),
            backlog,
            addr,
        }))
    }

    fn connect(
        &self,
        dst: SocketAddr,
        o: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        o.check_no_key(self.kind())?;
        let start = || self.start_connect(o.src, dst, o.caps, o.private_data);
        soft::cq::make_on(o.cq, &self.table, start, |c| Box::new(c))
    }

    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        soft::cq::create::<LoopbackConn>(FabricKind::Loopback, &self.table, entries)
    }
}

impl LoopbackFabric {
    /// The connecting end of a new connection to `dst` (see [`Fabric::connect`]).
    fn start_connect(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        caps: QpCaps,
        private_data: &[u8],
    ) -> Result<LoopbackConn, FabricError> {
        let private_data = PrivateData::new(private_data)?;
        let fail = |cause: Box<SetupCause>| FabricError::Connect { addr: dst, cause };
        check_caps(&caps).map_err(|e| fail(e.into()))?;
        let mut names = self.inner.names();
        let ip = match src {
            Some(src) if src.is_ipv4() != dst.is_ipv4() => {
                return Err(fail(SetupCause::refused(format!(
                    "source {src} and destination differ in IP version"
                ))));
            }
            Some(src) => src.ip(),
            None if dst.is_ipv4() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            None => IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        let local = match src.filter(|s| s.port() != 0) {
            Some(src) if names.taken(&src) => {
                return Err(fail(SetupCause::refused(format!(
                    "source {src}: address in use"
                ))));
            }
            Some(src) => src,
            None => {
                let port = names
                    .free_port(ip, FIRST_EPHEMERAL_PORT, names.next_ephemeral_port)
                    .ok_or_else(|| fail(SetupCause::refused("no free local port left")))?;
                names.next_ephemeral_port = port.checked_add(1).unwrap_or(FIRST_EPHEMERAL_PORT);
                SocketAddr::new(ip, port)
            }
        };
        names.ephemeral.insert(local);
        let end = conn::End::new(self.table.clone(), caps, CLIENT);
        let link = Arc::new(Link::new(local, dst, caps, end.recv_queue()));
        match names.listeners.get(&dst) {
            Some(backlog) => backlog.requests().push_back(Pending {
                table: backlog.table.clone(),
                link: link.clone(),
                private_data,
            }),
            None => *link.handshake() = Handshake::Unreachable,
        }
        names.links.retain(|l| l.strong_count() > 0);
        names.links.push(Arc::downgrade(&link));
        let name = EphemeralName {
            inner: Arc::downgrade(&self.inner),
            addr: local,
        };
        Ok(LoopbackConn::client(end, link, name))
    }
}

/// A listening name.
struct LoopbackListener {
    inner: Arc<Inner>,
    backlog: Arc<Backlog>,
    addr: SocketAddr,
}

impl Listener for LoopbackListener {
    fn poll(&mut self) -> Option<ConnRequest> {
        loop {
            let pending = self.backlog.requests().pop_front()?;
            if matches!(*pending.link.handshake(), Handshake::Requested) {
                return Some(ConnRequest {
                    private_data: pending.private_data,
                    peer: pending.link.addrs[CLIENT],
                    pending: Box::new(pending),
                });
            }
        }
    }

    fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for LoopbackListener {
    fn drop(&mut self) {
        let mut names = self.inner.names();
        if names
            .listeners
            .get(&self.addr)
            .is_some_and(|b| Arc::ptr_eq(b, &self.backlog))
        {
            names.listeners.remove(&self.addr);
        }
        drop(names);
        // Unanswered requests are rejected as their `Pending`s drop.
        self.backlog.requests().clear();
    }
}

/// A connection request not yet answered; dropping it rejects with no data.
struct Pending {
    table: Arc<MrTable>,
    link: Arc<Link>,
    private_data: PrivateData,
}

impl PendingConn for Pending {
    fn accept(
        mut self: Box<Self>,
        domain: Option<&dyn Fabric>,
        cq: Option<&CqRef>,
        caps: QpCaps,
        private_data: PrivateData,
    ) -> Result<Box<dyn Conn>, FabricError> {
        if let Some(domain) = domain {
            self.table =
                soft::accept_domain(domain, &self.table, LoopbackFabric::table, "loopback")?;
        }
        let answer = || self.answer(caps, private_data);
        soft::cq::make_on(cq, &self.table, answer, |c| Box::new(c))
    }

    fn reject(self: Box<Self>, private_data: PrivateData) {
        let mut hs = self.link.handshake();
        if matches!(*hs, Handshake::Requested) {
            *hs = Handshake::Rejected { private_data };
        }
    }
}

impl Pending {
    /// Accepts: the accepting end, established at once.
    fn answer(&self, caps: QpCaps, private_data: PrivateData) -> Result<LoopbackConn, FabricError> {
        check_caps(&caps).map_err(|e| FabricError::Accept { cause: e.into() })?;
        let mut hs = self.link.handshake();
        if !matches!(*hs, Handshake::Requested) {
            return Err(FabricError::Accept {
                cause: SetupCause::refused(format!(
                    "the connecting end {} went away",
                    self.link.addrs[CLIENT]
                )),
            });
        }
        // Each direction holds at most its sender's max_send_wr frames. The request is
        // answered once (the handshake leaves `Requested` here, under its lock), so the
        // client's rings are set once.
        let end = conn::End::new(self.table.clone(), caps, SERVER);
        let (client, server) = link::rings(
            (self.link.client_caps, self.link.client_rq.clone()),
            (caps, end.recv_queue()),
        );
        *lock(&self.link.client_rings) = Some(client);
        *hs = Handshake::Accepted { private_data };
        drop(hs);
        Ok(LoopbackConn::server(end, self.link.clone(), server))
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut hs = self.link.handshake();
        if matches!(*hs, Handshake::Requested) {
            *hs = Handshake::Rejected {
                private_data: PrivateData::empty(),
            };
        }
    }
}

#[cfg(test)]
mod tests;
