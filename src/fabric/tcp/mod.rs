//! The `tcp` fabric: software RDMA over TCP.
//!
//! Each connection is one non-blocking TCP socket carrying the frames specified in
//! `docs/tcp-fabric.md` ([`frame`]): the five wire operations of an RC queue pair,
//! cumulative ACKs, NAKs, and the connection manager's REQ/REP/REJ with 56 bytes of
//! private data. The queue-pair semantics (key and bounds checks as a NIC makes them,
//! receive matching, RNR, completions, flush) are the shared soft RC core's
//! (`src/fabric/soft`); this module only moves bytes and drives progress, inside
//! `poll_cq`/`poll_cm` (or the poll of the shared CQ a connection was made on,
//! `soft::cq`, which drives all its sockets and watches their readiness
//! at once, `ready`: an idle socket costs no system call), with no thread of its own.
//!
//! One [`TcpFabric`] is one protection domain (its own registration table), so two
//! instances in one process behave as two hosts.
//!
//! Connections may be authenticated with a pre-shared key ([`ListenOptions::psk`],
//! [`ConnectOptions::psk`]): a mutual challenge-response inside the connection
//! handshake (frame version 2). The data itself travels in clear.
//!
//! Files: `frame` (wire format), `tx`/`rx` (the send and receive engines of a
//! connection), `conn` (a connection and its CM state machine), `listen` (the passive
//! side) and `handshake` (the listener's half of establishing one connection), `auth`
//! (nonces and proofs), `ready` (a shared CQ's readiness set: io_uring or epoll), `sys`
//! (the libc calls, all of this module's `unsafe`).

pub mod frame;

mod auth;
mod conn;
mod handshake;
mod listen;
mod ready;
mod rx;
mod sys;
mod tx;

use std::net::SocketAddr;
use std::sync::Arc;

pub use conn::TcpConn;
pub use listen::{TcpListener, TcpPending};
pub use ready::{TcpReadiness, READINESS_ENV};

use crate::fabric::mem::Backing;
use crate::fabric::soft::{self, MrTable};
use crate::fabric::CapsError;
use crate::fabric::SetupCause;
use crate::fabric::{
    Access, Conn, ConnectOptions, Cq, Fabric, FabricCaps, FabricError, FabricKind, FastMr,
    KeyScope, ListenOptions, Listener, MemBuf, Mr, PrivateData, Psk, QpCaps,
};

/// The limits of the tcp fabric: generous, as nothing but memory bounds them.
pub const TCP_CAPS: FabricCaps = FabricCaps {
    max_send_wr: 16 * 1024,
    max_recv_wr: 16 * 1024,
    max_send_sge: 32,
    max_mr_size: 1 << 30,
    local_ops_at_post: true,
    core_cq_entries: soft::cq::MAX_CQ_ENTRIES,
};

/// The environment variable that makes [`TcpFabric::new`] answer local memory as verbs
/// does (`1`): see [`TcpFabric::lkeys_only`].
pub const LKEYS_ONLY_ENV: &str = "RTRS_TCP_LKEYS_ONLY";

/// Software RDMA over TCP (see the module docs).
#[derive(Debug)]
pub struct TcpFabric {
    table: Arc<MrTable>,
    /// How its shared CQs watch their sockets.
    readiness: TcpReadiness,
    /// [`Fabric::local_memory`] answers nothing, as on verbs.
    lkeys_only: bool,
}

impl TcpFabric {
    /// A new protection domain with no registrations; shared CQs watch their sockets as
    /// [`TcpReadiness::from_env`] says; [`LKEYS_ONLY_ENV`] set to `1` makes it
    /// [`lkeys_only`](Self::lkeys_only).
    pub fn new() -> TcpFabric {
        TcpFabric::new_or(TcpReadiness::Uring)
    }

    /// [`TcpFabric::new`] with `readiness` where [`READINESS_ENV`] says nothing.
    pub fn new_or(readiness: TcpReadiness) -> TcpFabric {
        let f = TcpFabric::with_readiness(TcpReadiness::from_env_or(readiness));
        if std::env::var(LKEYS_ONLY_ENV).is_ok_and(|v| v == "1") {
            f.lkeys_only()
        } else {
            f
        }
    }

    /// [`TcpFabric::new`] with shared CQs watching their sockets by `readiness` (or its
    /// fallback, where the kernel refuses it).
    pub fn with_readiness(readiness: TcpReadiness) -> TcpFabric {
        TcpFabric {
            table: MrTable::new(),
            readiness,
            lkeys_only: false,
        }
    }

    /// This fabric (and every domain made from it) resolves local memory as verbs does:
    /// [`Fabric::local_memory`] answers nothing, so software that copies a caller's SGE
    /// itself must hold the registration the SGE names (a region it was given); posts
    /// still check every lkey and bound against the table. For tests of code that must
    /// also run on verbs.
    pub fn lkeys_only(mut self) -> TcpFabric {
        self.lkeys_only = true;
        self
    }
}

impl TcpFabric {
    /// [`Fabric::domain`], as the concrete type (for wrappers).
    pub fn new_domain(&self) -> TcpFabric {
        TcpFabric {
            table: self.table.domain(),
            readiness: self.readiness,
            lkeys_only: self.lkeys_only,
        }
    }

    /// The protection domain's registrations.
    pub(crate) fn table(&self) -> &Arc<MrTable> {
        &self.table
    }

    fn registrations(&self) -> soft::Registrations<'_> {
        soft::Registrations {
            table: &self.table,
            kind: FabricKind::Tcp,
            max_len: TCP_CAPS.max_mr_size,
        }
    }
}

impl Default for TcpFabric {
    fn default() -> Self {
        TcpFabric::new()
    }
}

/// Checks queue sizes against [`TCP_CAPS`] ([`QpCaps::check_within`]).
fn check_caps(caps: QpCaps) -> Result<(), CapsError> {
    caps.check_within(&TCP_CAPS, "the tcp fabric's")
}

impl Fabric for TcpFabric {
    fn kind(&self) -> FabricKind {
        FabricKind::Tcp
    }

    fn caps(&self) -> FabricCaps {
        TCP_CAPS
    }

    crate::fabric::soft::soft_fabric_methods!();

    fn local_memory(&self, sge: &crate::fabric::Sge, need: Access) -> Option<Arc<Backing>> {
        if self.lkeys_only {
            return None;
        }
        self.registrations().local_memory(sge, need)
    }

    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError> {
        Ok(Box::new(TcpListener::bind(
            addr,
            self.table.clone(),
            &opts.admission,
            opts.psk.clone(),
            self.readiness,
        )?))
    }

    fn connect(
        &self,
        dst: SocketAddr,
        o: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        let start = || self.start_connect(o.src, dst, o.caps, o.private_data, o.psk);
        let own = |c: TcpConn| -> Box<dyn Conn> { Box::new(c.with_own_readiness(self.readiness)) };
        soft::cq::make_on(o.cq, &self.table, start, own)
    }

    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        soft::cq::create_with::<TcpConn>(
            FabricKind::Tcp,
            &self.table,
            entries,
            ready::open(self.readiness),
        )
    }
}

impl TcpFabric {
    /// The initiator of a new connection (see [`Fabric::connect`]).
    fn start_connect(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        caps: QpCaps,
        private_data: &[u8],
        psk: Option<&Psk>,
    ) -> Result<TcpConn, FabricError> {
        let pd = PrivateData::new(private_data)?;
        let fail = |cause: Box<SetupCause>| FabricError::Connect { addr: dst, cause };
        let os = |call| move |e| fail(SetupCause::os(call, e));
        check_caps(caps).map_err(|e| fail(e.into()))?;
        let sock = socket2::Socket::new(
            socket2::Domain::for_address(dst),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )
        .map_err(os("socket"))?;
        sock.set_nonblocking(true).map_err(os("set_nonblocking"))?;
        sock.set_tcp_nodelay(true).map_err(os("TCP_NODELAY"))?;
        if let Some(src) = src {
            if src.is_ipv4() != dst.is_ipv4() {
                return Err(fail(SetupCause::refused(format!(
                    "source {src} and destination differ in IP version"
                ))));
            }
            sock.bind(&src.into())
                .map_err(|source| fail(Box::new(SetupCause::Bind { addr: src, source })))?;
        }
        let connect_error = match sock.connect(&dst.into()) {
            Ok(()) => None,
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => None,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => Some(e),
        };
        let stream: std::net::TcpStream = sock.into();
        Ok(TcpConn::connecting(
            stream,
            dst,
            self.table.clone(),
            caps,
            pd,
            connect_error,
            psk.cloned(),
        ))
    }
}
