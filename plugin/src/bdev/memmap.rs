//! SPDK's memory, registered with the client's fabric so bdev IO buffers can be named in
//! RTRS scatter-gather lists without a copy (docs/ARCHITECTURE.md, "The SPDK plugin as a
//! shared library"). An `spdk_mem_map` hears of every region SPDK registers (now and
//! later) and we register each with the fabric, keeping its lkey as the map's
//! translation; a bdev IO's iovecs are then turned into SGEs by looking their addresses
//! up. This is what SPDK's own RDMA transports do with `ibv_reg_mr`; for the tcp fabric
//! any memory would do, but the fabric contract wants every SGE to name a registration,
//! and the same code then serves verbs.
//!
//! The session's cores use the registrations themselves (a READ's reply lands in the
//! caller's buffer through a key bound inside one): every change of the set bumps
//! [`MemMap::version`], and each core's owner, seeing a new version at its next poll,
//! adds the new regions to its session core and removes those SPDK unregistered
//! (docs/ARCHITECTURE.md, "The SPDK bdev: poll groups").

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rtrs_spdk::fabric::{Access, Fabric, Mr, Sge};
use rtrs_spdk::spdk::sys;

/// A fabric registration covers at most this much (the tcp fabric's `max_mr_size` is
/// 1 GiB); larger regions are registered piecewise, a multiple of 2 MiB each.
const PIECE: usize = 512 << 20;
/// The map's "not registered" translation.
const NONE: u64 = u64::MAX;

/// The client's memory map over one fabric.
pub struct MemMap {
    map: NonNull<sys::spdk_mem_map>,
    ctx: *mut MapCtx,
}

struct MapCtx {
    /// Whose memory map (the session's name), for the log.
    name: String,
    fabric: Arc<dyn Fabric>,
    /// Registrations by start address; dropped when SPDK unregisters the region.
    regs: Mutex<BTreeMap<usize, Vec<Arc<Mr>>>>,
    /// Bumped after every change of `regs`.
    version: AtomicU64,
}

// SAFETY: the map is only translated (read-only, which SPDK allows from any thread) and
// freed once; MapCtx is Sync (a Mutex and an Arc of a Sync fabric).
unsafe impl Send for MemMap {}
// SAFETY: as above.
unsafe impl Sync for MemMap {}

/// Why an iovec could not become SGEs.
#[derive(Debug)]
pub enum SglError {
    NotRegistered { addr: u64, len: u64 },
    TooMany { max: usize },
}

impl std::fmt::Display for SglError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SglError::NotRegistered { addr, len } => {
                write!(f, "buffer {addr:#x}+{len} is not in SPDK-registered memory")
            }
            SglError::TooMany { max } => {
                write!(f, "request needs more than {max} scatter-gather entries")
            }
        }
    }
}

unsafe extern "C" fn notify(
    cb_ctx: *mut c_void,
    map: *mut sys::spdk_mem_map,
    action: sys::spdk_mem_map_notify_action,
    vaddr: *mut c_void,
    size: usize,
) -> c_int {
    // SAFETY: `cb_ctx` is the MapCtx given to spdk_mem_map_alloc, alive until the map is
    // freed (after which SPDK calls no more).
    let ctx = unsafe { &*cb_ctx.cast::<MapCtx>() };
    let start = vaddr as usize;
    if action == sys::spdk_mem_map_notify_action_SPDK_MEM_MAP_NOTIFY_REGISTER {
        let mut mrs = Vec::new();
        let mut off = 0;
        while off < size {
            let len = PIECE.min(size - off);
            // SAFETY: SPDK registered [vaddr, vaddr+size) and keeps it allocated until it
            // tells us to unregister it, when the Mr is dropped (no IO uses it then: SPDK
            // frees memory only once nothing refers to it).
            let mr = unsafe {
                ctx.fabric.register_raw(
                    vaddr.cast::<u8>().add(off),
                    len,
                    Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
                )
            };
            let mr = match mr {
                Ok(mr) => mr,
                Err(e) => {
                    tracing::error!("rtrs bdev: registering SPDK memory {start:#x}+{len}: {e}");
                    return -libc::ENOMEM;
                }
            };
            // SAFETY: the live map this callback belongs to; the range is 2 MiB aligned
            // as SPDK registers it.
            let rc = unsafe {
                sys::spdk_mem_map_set_translation(
                    map,
                    (start + off) as u64,
                    len as u64,
                    u64::from(mr.lkey()),
                )
            };
            if rc != 0 {
                return rc;
            }
            mrs.push(Arc::new(mr));
            off += len;
        }
        if let Ok(mut regs) = ctx.regs.lock() {
            regs.insert(start, mrs);
        }
        tracing::info!(
            "rtrs session {}: SPDK memory {start:#x}+{size:#x} registered",
            ctx.name
        );
    } else {
        tracing::info!(
            "rtrs session {}: SPDK memory {start:#x}+{size:#x} unregistered",
            ctx.name
        );
        // SAFETY: as above.
        unsafe { sys::spdk_mem_map_clear_translation(map, start as u64, size as u64) };
        if let Ok(mut regs) = ctx.regs.lock() {
            regs.remove(&start);
        }
    }
    ctx.version.fetch_add(1, Ordering::Release);
    0
}

unsafe extern "C" fn contiguous(a: u64, b: u64) -> c_int {
    c_int::from(a == b)
}

impl MemMap {
    /// Creates the map of session `name`: every region SPDK has registered is registered
    /// with `fabric` now, later ones as they come.
    ///
    /// # Errors
    /// When SPDK cannot allocate the map (or a registration failed).
    pub fn new(name: &str, fabric: Arc<dyn Fabric>) -> Result<MemMap, String> {
        let ctx = Box::into_raw(Box::new(MapCtx {
            name: name.to_string(),
            fabric,
            regs: Mutex::new(BTreeMap::new()),
            version: AtomicU64::new(1),
        }));
        let ops = sys::spdk_mem_map_ops {
            notify_cb: Some(notify),
            are_contiguous: Some(contiguous),
        };
        // SAFETY: `ops` is copied by SPDK; `ctx` stays valid until `Drop` frees the map.
        let map = unsafe { sys::spdk_mem_map_alloc(NONE, &ops, ctx.cast()) };
        match NonNull::new(map) {
            Some(map) => Ok(MemMap { map, ctx }),
            None => {
                // SAFETY: SPDK did not keep `ctx`.
                drop(unsafe { Box::from_raw(ctx) });
                Err("spdk_mem_map_alloc failed (registering SPDK memory with the fabric)".into())
            }
        }
    }

    /// Every live registration (sessions use them for zero-copy READs) and the version
    /// of the set they make.
    pub fn regions(&self) -> (u64, Vec<Arc<Mr>>) {
        let regs = self.ctx().regs.lock();
        // Read under the lock: the version matches the set returned.
        let v = self.version();
        let r = regs
            .map(|r| r.values().flatten().cloned().collect())
            .unwrap_or_default();
        (v, r)
    }

    /// Changes with every registration and unregistration (one load).
    pub fn version(&self) -> u64 {
        self.ctx().version.load(Ordering::Acquire)
    }

    fn ctx(&self) -> &MapCtx {
        // SAFETY: the context lives as long as the map (freed in Drop).
        unsafe { &*self.ctx }
    }

    /// Appends the SGEs covering `[addr, addr+len)` to `out[*n..]`.
    ///
    /// # Errors
    /// Memory SPDK did not register, or more than `out.len()` entries.
    pub fn sges(
        &self,
        addr: u64,
        len: u64,
        out: &mut [Sge],
        n: &mut usize,
    ) -> Result<(), SglError> {
        let (mut a, mut left) = (addr, len);
        while left > 0 {
            let mut size = left;
            // SAFETY: the map is alive; translation only reads it.
            let key = unsafe { sys::spdk_mem_map_translate(self.map.as_ptr(), a, &mut size) };
            if key == NONE || size == 0 {
                return Err(SglError::NotRegistered { addr, len });
            }
            let max = out.len();
            let slot = out.get_mut(*n).ok_or(SglError::TooMany { max })?;
            *slot = Sge {
                addr: a,
                len: size as u32,
                lkey: key as u32,
            };
            *n += 1;
            a += size;
            left -= size;
        }
        Ok(())
    }
}

impl Drop for MemMap {
    fn drop(&mut self) {
        let mut map = self.map.as_ptr();
        // SAFETY: the map is ours and freed once; its callbacks drop the registrations.
        unsafe { sys::spdk_mem_map_free(&mut map) };
        // SAFETY: no callback runs any more; the context is ours again.
        drop(unsafe { Box::from_raw(self.ctx) });
    }
}
