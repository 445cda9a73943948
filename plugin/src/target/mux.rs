//! One RTRS server, many listeners added and removed at run time. The RTRS server takes
//! its listeners when it starts; the target adds and removes them with
//! `rtrs_target_listen` / `rtrs_target_stop_listener` while sessions stay up. So the
//! server is started over a [`MuxFabric`] whose single listener polls a shared,
//! changeable set of the real fabric's listeners; everything else goes to that fabric,
//! so every path of a session uses one fabric whatever address it came in on.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};

use rtrs_spdk::fabric::SetupCause;
use rtrs_spdk::fabric::{
    mem, Access, Conn, ConnRequest, ConnectOptions, Cq, Fabric, FabricCaps, FabricError,
    FabricKind, FastMr, KeyScope, ListenOptions, Listener, MemBuf, Mr, Sge,
};
use rtrs_spdk::sync::lock;

/// The listeners of one transport, shared by the target (adds, removes) and the server's
/// acceptor (polls).
pub struct Listeners {
    list: Mutex<Vec<Box<dyn Listener>>>,
    /// An epoll set over the listeners' own descriptors ([`Listener::wait_fd`]), the set
    /// the acceptor sleeps on in interrupt mode (docs/ARCHITECTURE.md, "Interrupt mode");
    /// `None` if the kernel refused one.
    wake: Option<OwnedFd>,
}

impl Default for Listeners {
    fn default() -> Self {
        // SAFETY: no pointer arguments.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        // SAFETY: a descriptor just returned by the kernel, owned by nobody else.
        let wake = (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) });
        Listeners {
            list: Mutex::new(Vec::new()),
            wake,
        }
    }
}

impl Listeners {
    fn lock(&self) -> MutexGuard<'_, Vec<Box<dyn Listener>>> {
        lock(&self.list)
    }

    /// `EPOLL_CTL_ADD` or `EPOLL_CTL_DEL` of a listener's descriptor in the wake set.
    fn watch(&self, l: &dyn Listener, op: libc::c_int) {
        let (Some(ep), Some(fd)) = (&self.wake, l.wait_fd()) else {
            return;
        };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: 0,
        };
        // SAFETY: `ev` is a valid event the kernel only reads; both descriptors are open
        // (the listener's lives as long as the listener, which is still in the list).
        if unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) } < 0 {
            tracing::debug!(
                "rtrs target: listener {}: epoll_ctl: {}",
                l.local_addr(),
                std::io::Error::last_os_error()
            );
        }
    }

    /// Adds a bound listener.
    pub fn add(&self, l: Box<dyn Listener>) {
        self.watch(&*l, libc::EPOLL_CTL_ADD);
        self.lock().push(l);
    }

    /// Closes the listener bound to `addr`; `false` if there is none.
    pub fn remove(&self, addr: SocketAddr) -> bool {
        let mut g = self.lock();
        let before = g.len();
        g.retain(|l| {
            let keep = l.local_addr() != addr;
            if !keep {
                self.watch(&**l, libc::EPOLL_CTL_DEL);
            }
            keep
        });
        g.len() != before
    }

    /// Closes every listener.
    pub fn clear(&self) {
        let mut g = self.lock();
        for l in g.iter() {
            self.watch(&**l, libc::EPOLL_CTL_DEL);
        }
        g.clear();
    }
}

/// A fabric whose `listen` hands out the shared [`Listeners`].
pub struct MuxFabric {
    inner: Arc<dyn Fabric>,
    listeners: Arc<Listeners>,
}

impl MuxFabric {
    pub fn new(inner: Arc<dyn Fabric>, listeners: Arc<Listeners>) -> MuxFabric {
        MuxFabric { inner, listeners }
    }
}

impl Fabric for MuxFabric {
    fn kind(&self) -> FabricKind {
        self.inner.kind()
    }

    fn caps(&self) -> FabricCaps {
        self.inner.caps()
    }

    // A session's own domain needs no listeners: the real fabric's.
    fn domain(&self) -> Result<Arc<dyn Fabric>, FabricError> {
        self.inner.domain()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self.inner.as_any()
    }

    fn register(&self, buf: MemBuf, access: Access) -> Result<Mr, FabricError> {
        self.inner.register(buf, access)
    }

    unsafe fn register_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, FabricError> {
        // SAFETY: the caller's guarantees are passed on unchanged.
        unsafe { self.inner.register_raw(addr, len, access) }
    }

    fn local_memory(&self, sge: &Sge, need: Access) -> Option<Arc<mem::Backing>> {
        self.inner.local_memory(sge, need)
    }

    fn alloc_fast_mr(&self, scope: KeyScope) -> Result<FastMr, FabricError> {
        self.inner.alloc_fast_mr(scope)
    }

    fn alloc_fast_mr_on(&self, scope: KeyScope, device: u8) -> Result<FastMr, FabricError> {
        self.inner.alloc_fast_mr_on(scope, device)
    }

    // The server's cores put their connections on shared completion queues of the real
    // fabric (docs/ARCHITECTURE.md, "Completion queues"); the requests its listeners hand
    // out are that fabric's, so they accept onto those queues.
    fn create_cq(&self, entries: u32) -> Result<Cq, FabricError> {
        self.inner.create_cq(entries)
    }

    fn connect(
        &self,
        dst: SocketAddr,
        opts: &ConnectOptions<'_>,
    ) -> Result<Box<dyn Conn>, FabricError> {
        self.inner.connect(dst, opts)
    }

    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ListenOptions,
    ) -> Result<Box<dyn Listener>, FabricError> {
        if opts.psk.is_some() {
            // Each real listener has its own key (rtrs_target_listen's 'psk').
            return Err(FabricError::Listen {
                addr,
                cause: SetupCause::refused(
                    "keys are set per listener, not on the server's listener set",
                ),
            });
        }
        Ok(Box::new(MuxListener {
            listeners: Arc::clone(&self.listeners),
            placeholder: addr,
            last: addr,
        }))
    }
}

/// The server's one listener: polls every listener of the set.
struct MuxListener {
    listeners: Arc<Listeners>,
    placeholder: SocketAddr,
    /// The listener that produced the last request (the acceptor asks right after).
    last: SocketAddr,
}

impl Listener for MuxListener {
    fn poll(&mut self) -> Option<ConnRequest> {
        let mut g = self.listeners.lock();
        for l in g.iter_mut() {
            if let Some(req) = l.poll() {
                self.last = l.local_addr();
                return Some(req);
            }
        }
        self.last = self.placeholder;
        None
    }

    fn local_addr(&self) -> SocketAddr {
        self.last
    }

    /// The set's epoll: readable when one of its listeners that has a descriptor may
    /// make progress (listeners without one are polled on the acceptor's idle period).
    fn wait_fd(&self) -> Option<RawFd> {
        self.listeners.wake.as_ref().map(AsRawFd::as_raw_fd)
    }
}
