//! The server's exports: every name a client may OPEN, its backend (one instance per
//! reactor core) and its writer count. In the kernel, `rnbd-srv` opens the block device
//! named by `dev_search_path` + `dev_name` and keeps one `rnbd_srv_dev` per device, shared
//! by all sessions, whose `open_write_cnt` enforces the access modes
//! (`rnbd_srv_check_update_open_perm`); here the names are declared up front
//! ([`Exports::new`]) or, for a target configured at run time (the SPDK plugin's
//! `rtrs_target_export` / `rtrs_target_unexport`), added and removed while it serves
//! ([`Exports::dynamic`], [`Exports::add`], [`Exports::remove`]).
//!
//! Ids are never reused: a removed export keeps its slot, marked closed, so a mapping
//! that still names it fails its IO with −EIO instead of reaching another device. Each
//! core drops its backend instance of a closed export once that instance has no IO in
//! flight (see [`Dispatcher`](super::Dispatcher)), which lets the backend's owner (an
//! SPDK bdev descriptor) close.
//!
//! Each export has a host list ([`HostList`], see [`hosts`](super::hosts)) that OPEN
//! checks; a new export is open to every host.
//!
//! Every OPEN reads the export's size again ([`Exports::open_rsp`]: a file's or block
//! device's size, a run-time backend's geometry, e.g. an SPDK bdev after its resize
//! event), as the kernel's server reports the block device's size at each OPEN. A
//! changed size moves [`Exports::generation`], and each core gives its instance the new
//! size at its next request ([`BlockBackend::set_size`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::hosts::HostList;
use crate::proto::rnbd::{AccessMode, CachePolicy, OpenRsp};
use crate::rnbd::backend::{
    current_size, BackendSpec, BlockBackend, ExportSpec, FileBackend, FileOptions, Geometry,
    OpenError, RamBackend, MAX_NAME_LEN, RAM_BLOCK_SIZE,
};
use crate::sync::{lock, read, write};
use crate::Errno;

/// A backend supplied from outside at run time (an SPDK bdev): its geometry, and one
/// instance per core, opened on that core's thread the first time the core needs it.
/// Dropping the last instance and the `Arc` releases it.
pub trait ExportBackend: Send + Sync {
    /// Size and limits as they are now, as the OPEN response reports them (asked at
    /// every OPEN: a resized backend reports its new size).
    fn geometry(&self) -> Geometry;

    /// This core's instance; called on the core's own thread.
    ///
    /// # Errors
    /// A message naming what failed (it is logged and the IO fails with −EIO).
    fn open_core(&self, core: usize) -> Result<Box<dyn BlockBackend>, String>;
}

/// Index of an export in its [`Exports`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExportId(pub(crate) usize);

impl ExportId {
    /// Position in [`Exports::iter`] order (also the index of the per-core backend).
    pub fn index(self) -> usize {
        self.0
    }
}

/// Why a set of exports could not be built, or a core's backends not opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportsError {
    #[error("export '{name}' is declared twice")]
    Duplicate { name: String },
    #[error("export '{name}': {source}")]
    Open { name: String, source: OpenError },
    #[error("export '{name}' on core {core}: {source}")]
    OpenOnCore {
        name: String,
        core: usize,
        source: OpenError,
    },
    #[error(
        "export '{name}' on core {core} reports a different geometry than when it was declared \
         (another device at the path?)"
    )]
    GeometryChanged { name: String, core: usize },
    #[error("export '{name}' on core {core}: {reason}")]
    BackendOnCore {
        name: String,
        core: usize,
        reason: String,
    },
    #[error("export name '{name}': {reason}")]
    BadName { name: String, reason: &'static str },
    #[error("export '{name}': no room for more exports ({capacity} were made)")]
    Full { name: String, capacity: usize },
}

/// Why an OPEN was refused; [`errno`](AccessError::errno) is the wire answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AccessError {
    #[error("no export of that name")]
    UnknownName,
    #[error("device name contains '..'")]
    DotDot,
    #[error("{mode} refused: the export already has {writers} writer(s)")]
    InUse { mode: &'static str, writers: u32 },
    #[error("{mode} refused: the export is read-only")]
    ReadOnlyExport { mode: &'static str },
    #[error("access denied: this host is not in the export's allowed hosts")]
    HostDenied,
    /// Another path of the session comes from an address the list does not allow: it
    /// could carry the device's IO.
    #[error(
        "access denied: the session has a path from {addr}, which the export's allowed \
         hosts do not include"
    )]
    PathDenied { addr: std::net::IpAddr },
}

impl AccessError {
    /// The errno for OPEN's response (docs/PROTOCOL.md §7.2): −ENOENT for a name
    /// the server does not have (what opening a missing path gives), −EINVAL for `..`,
    /// −EPERM for a writer conflict, −EACCES for write access to a read-only export
    /// (what the kernel's block-device open returns for a read-only device) and for a
    /// host (or another path of the session) the export's host list does not allow.
    pub fn errno(self) -> Errno {
        match self {
            AccessError::UnknownName => Errno::ENOENT,
            AccessError::DotDot => Errno::EINVAL,
            AccessError::InUse { .. } => Errno::EPERM,
            AccessError::ReadOnlyExport { .. }
            | AccessError::HostDenied
            | AccessError::PathDenied { .. } => Errno::EACCES,
        }
    }
}

/// How an export makes a backend for each core.
enum Source {
    /// One memory, one instance per core ([`RamBackend::share`]).
    Ram(Mutex<RamBackend>),
    /// The file opened once per core.
    File {
        path: std::path::PathBuf,
        opts: FileOptions,
    },
    /// Supplied at run time; `None` once removed.
    Dynamic(Mutex<Option<Arc<dyn ExportBackend>>>),
}

struct Export {
    name: String,
    /// As the last OPEN read it (control path only: cores keep their own copy).
    geometry: Mutex<Geometry>,
    source: Source,
    /// Mappings opened RW or MIGRATION, over all sessions.
    writers: Mutex<u32>,
    /// Removed: no new mapping, IO through old ones fails.
    closed: AtomicBool,
    hosts: HostList,
}

/// Every export of a server, shared by its cores and sessions (wrap it in an `Arc`).
pub struct Exports {
    /// Filled in order; `used` slots are set. Never emptied (ids are not reused).
    slots: Box<[OnceLock<Export>]>,
    used: AtomicUsize,
    /// Open exports by name; its write lock also orders additions.
    by_name: RwLock<HashMap<String, ExportId>>,
    /// Bumped by every addition and removal, so cores notice cheaply.
    generation: AtomicU64,
}

impl Exports {
    /// Declares `specs`. RAM disks are allocated here; files are opened once here to
    /// check them and learn their geometry, then once per core by
    /// [`open_core`](Self::open_core).
    ///
    /// # Errors
    /// A duplicate name, or the backend that could not be opened.
    pub fn new(specs: &[ExportSpec], file_opts: &FileOptions) -> Result<Exports, ExportsError> {
        let mut list: Vec<Export> = Vec::with_capacity(specs.len());
        let mut by_name = HashMap::with_capacity(specs.len());
        for spec in specs {
            if by_name.contains_key(&spec.name) {
                return Err(ExportsError::Duplicate {
                    name: spec.name.clone(),
                });
            }
            let open_err = |source| ExportsError::Open {
                name: spec.name.clone(),
                source,
            };
            let (geometry, source) = match &spec.backend {
                BackendSpec::Ram { size } => {
                    let ram = RamBackend::new(*size, RAM_BLOCK_SIZE).map_err(open_err)?;
                    (*ram.geometry(), Source::Ram(Mutex::new(ram)))
                }
                BackendSpec::File { path, read_only } => {
                    let opts = FileOptions {
                        read_only: file_opts.read_only || *read_only,
                        ..file_opts.clone()
                    };
                    let probe = FileBackend::open(path, &opts).map_err(open_err)?;
                    (
                        *probe.geometry(),
                        Source::File {
                            path: path.clone(),
                            opts,
                        },
                    )
                }
            };
            by_name.insert(spec.name.clone(), ExportId(list.len()));
            list.push(Export {
                name: spec.name.clone(),
                geometry: Mutex::new(geometry),
                source,
                writers: Mutex::new(0),
                closed: AtomicBool::new(false),
                hosts: HostList::any(),
            });
        }
        let used = list.len();
        let slots = list.into_iter().map(OnceLock::from).collect();
        Ok(Exports {
            slots,
            used: AtomicUsize::new(used),
            by_name: RwLock::new(by_name),
            generation: AtomicU64::new(0),
        })
    }

    /// No exports yet; up to `capacity` can be [added](Self::add) over the life of the
    /// set (removed ones still count: ids are not reused).
    pub fn dynamic(capacity: usize) -> Exports {
        Exports {
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
            used: AtomicUsize::new(0),
            by_name: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(0),
        }
    }

    /// Adds export `name` served by `backend` (read-only if `read_only` or if the
    /// backend says so), open to every host.
    ///
    /// # Errors
    /// [`ExportsError::BadName`] (empty, longer than 254 bytes, or containing `..`),
    /// [`ExportsError::Duplicate`], [`ExportsError::Full`].
    pub fn add(
        &self,
        name: &str,
        backend: Arc<dyn ExportBackend>,
        read_only: bool,
    ) -> Result<ExportId, ExportsError> {
        self.add_with_hosts(name, backend, read_only, HostList::any())
    }

    /// As [`add`](Self::add), with the host list the export starts with (so no OPEN
    /// sees it open to every host first).
    ///
    /// # Errors
    /// As [`add`](Self::add).
    pub fn add_with_hosts(
        &self,
        name: &str,
        backend: Arc<dyn ExportBackend>,
        read_only: bool,
        hosts: HostList,
    ) -> Result<ExportId, ExportsError> {
        let bad = |reason| {
            Err(ExportsError::BadName {
                name: name.to_string(),
                reason,
            })
        };
        if name.is_empty() {
            return bad("empty");
        }
        if name.len() > MAX_NAME_LEN {
            return bad("longer than 254 bytes");
        }
        if name.contains("..") || name.contains('\0') {
            return bad("contains '..' or a NUL byte");
        }
        let mut by_name = write(&self.by_name);
        if by_name.contains_key(name) {
            return Err(ExportsError::Duplicate {
                name: name.to_string(),
            });
        }
        let index = self.used.load(Ordering::Acquire);
        let Some(slot) = self.slots.get(index) else {
            return Err(ExportsError::Full {
                name: name.to_string(),
                capacity: self.slots.len(),
            });
        };
        let mut geometry = backend.geometry();
        geometry.read_only |= read_only;
        let export = Export {
            name: name.to_string(),
            geometry: Mutex::new(geometry),
            source: Source::Dynamic(Mutex::new(Some(backend))),
            writers: Mutex::new(0),
            closed: AtomicBool::new(false),
            hosts,
        };
        if slot.set(export).is_err() {
            // Additions hold the write lock, so the slot past `used` is always empty.
            return Err(ExportsError::Full {
                name: name.to_string(),
                capacity: self.slots.len(),
            });
        }
        self.used.store(index + 1, Ordering::Release);
        by_name.insert(name.to_string(), ExportId(index));
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(ExportId(index))
    }

    /// Removes export `name`: new OPENs fail with −ENOENT, IO through existing mappings
    /// with −EIO, and each core drops its instance once idle. Returns its id, or `None`
    /// if there is no open export of that name.
    pub fn remove(&self, name: &str) -> Option<ExportId> {
        let id = write(&self.by_name).remove(name)?;
        let export = self.export(id);
        export.closed.store(true, Ordering::Release);
        if let Source::Dynamic(b) = &export.source {
            lock(b).take();
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        Some(id)
    }

    /// Whether `id` was removed.
    ///
    /// # Panics
    /// On an id from another `Exports`.
    pub fn is_closed(&self, id: ExportId) -> bool {
        self.export(id).closed.load(Ordering::Acquire)
    }

    /// Changes with every [`add`](Self::add), [`remove`](Self::remove) and change of an
    /// export's size.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Slots in use (open and closed exports): ids are below this.
    pub fn slots_used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    fn export(&self, id: ExportId) -> &Export {
        self.slots[id.0]
            .get()
            .expect("an ExportId names a filled slot of its own Exports")
    }

    /// Exports made of RAM disks only (`(name, size)`): for tests and `--inline-target`.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn ram(disks: &[(&str, u64)]) -> Result<Exports, ExportsError> {
        let specs: Vec<ExportSpec> = disks
            .iter()
            .map(|&(name, size)| ExportSpec {
                name: name.to_string(),
                backend: BackendSpec::Ram { size },
            })
            .collect();
        Exports::new(&specs, &FileOptions::default())
    }

    /// Open exports.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The open export called `name` (exact bytes, as `dev_name` arrives).
    pub fn lookup(&self, name: &[u8]) -> Option<ExportId> {
        let name = std::str::from_utf8(name).ok()?;
        read(&self.by_name).get(name).copied()
    }

    /// Ids and names of the open exports, in declaration order.
    pub fn iter(&self) -> impl Iterator<Item = (ExportId, &str)> {
        self.slots[..self.slots_used()]
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.get().map(|e| (i, e)))
            .filter(|(_, e)| !e.closed.load(Ordering::Acquire))
            .map(|(i, e)| (ExportId(i), e.name.as_str()))
    }

    /// # Panics
    /// On an id from another `Exports`.
    pub fn name(&self, id: ExportId) -> &str {
        &self.export(id).name
    }

    /// Size and limits of `id` as the last OPEN (or the declaration) read them.
    ///
    /// # Panics
    /// On an id from another `Exports`.
    pub fn geometry(&self, id: ExportId) -> Geometry {
        *lock(&self.export(id).geometry)
    }

    /// Reads `id`'s size again (a file's or block device's size, a run-time backend's
    /// geometry; RAM disks keep theirs) and returns the geometry. A changed size is
    /// logged and moves the [`generation`](Self::generation), so every core resizes its
    /// instance. A size that cannot be read leaves the last one (logged).
    ///
    /// # Panics
    /// On an id from another `Exports`.
    pub fn refresh(&self, id: ExportId) -> Geometry {
        let export = self.export(id);
        let mut g = lock(&export.geometry);
        let now = match &export.source {
            Source::Ram(_) => return *g,
            Source::File { path, .. } => match current_size(path, g.logical_block_size) {
                Ok(size) if size > 0 => Geometry { size, ..*g },
                Ok(_) => *g,
                Err(e) => {
                    tracing::warn!("export '{}': size not read again: {e}", export.name);
                    *g
                }
            },
            Source::Dynamic(b) => {
                let backend = lock(b).clone();
                match backend {
                    Some(b) => {
                        let mut fresh = b.geometry();
                        fresh.read_only |= g.read_only;
                        fresh
                    }
                    None => *g,
                }
            }
        };
        if now != *g {
            if now.size != g.size {
                tracing::info!(
                    "export '{}': size changed from {} to {} bytes",
                    export.name,
                    g.size,
                    now.size
                );
            }
            *g = now;
            drop(g);
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
        now
    }

    /// The host list of `id`, which OPEN checks (changes apply to later OPENs).
    ///
    /// # Panics
    /// On an id from another `Exports`.
    pub fn hosts(&self, id: ExportId) -> &HostList {
        &self.export(id).hosts
    }

    /// Current writer count of `id` (RW and MIGRATION mappings over all sessions).
    pub fn writers(&self, id: ExportId) -> u32 {
        *lock(&self.export(id).writers)
    }

    /// Applies the access rule for a new mapping of `id` in `mode` (docs/PROTOCOL.md §7.2
    /// step 6): RO always; RW only without writers; MIGRATION while fewer than two.
    /// A granted write mode counts one writer until [`release`](Self::release).
    ///
    /// # Errors
    /// [`AccessError::InUse`] or [`AccessError::ReadOnlyExport`].
    pub fn acquire(&self, id: ExportId, mode: AccessMode) -> Result<(), AccessError> {
        let export = self.export(id);
        if export.closed.load(Ordering::Acquire) {
            return Err(AccessError::UnknownName);
        }
        if mode == AccessMode::ReadOnly {
            return Ok(());
        }
        if lock(&export.geometry).read_only {
            return Err(AccessError::ReadOnlyExport {
                mode: mode.as_str(),
            });
        }
        let mut writers = lock(&export.writers);
        let limit = if mode == AccessMode::Migration { 2 } else { 1 };
        if *writers >= limit {
            return Err(AccessError::InUse {
                mode: mode.as_str(),
                writers: *writers,
            });
        }
        *writers += 1;
        Ok(())
    }

    /// Ends a mapping granted by [`acquire`](Self::acquire) in `mode`.
    pub fn release(&self, id: ExportId, mode: AccessMode) {
        if mode != AccessMode::ReadOnly {
            let mut writers = lock(&self.export(id).writers);
            *writers = writers.saturating_sub(1);
        }
    }

    /// The OPEN_RSP of a mapping of `id` (reserved bytes are zeroed by the encoder), with
    /// the size and geometry read again ([`refresh`](Self::refresh)).
    pub fn open_rsp(&self, id: ExportId, device_id: u32) -> OpenRsp {
        let g = &self.refresh(id);
        OpenRsp {
            device_id,
            nsectors: g.nsectors(),
            max_hw_sectors: g.max_hw_sectors(),
            max_write_zeroes_sectors: g.max_write_zeroes_sectors(),
            max_discard_sectors: g.max_discard_sectors(),
            discard_granularity: g.discard_granularity,
            discard_alignment: g.discard_alignment,
            // Block sizes are at most 32 KiB (checked when backends open).
            physical_block_size: g.physical_block_size.min(u32::from(u16::MAX)) as u16,
            logical_block_size: g.logical_block_size.min(u32::from(u16::MAX)) as u16,
            max_segments: g.max_segments,
            secure_discard: g.secure_discard(),
            cache_policy: CachePolicy {
                fua: g.fua,
                writeback: g.write_cache,
            },
        }
    }

    /// This core's backend instances, indexed like [`ExportId::index`] over the slots in
    /// use: RAM disks share their memory with every other core's instance; files are
    /// opened again; run-time backends are asked for this core's instance; a closed
    /// export gives `None`. Call it on the core's own thread.
    ///
    /// # Errors
    /// A file that can no longer be opened, or whose geometry changed; a run-time
    /// backend's refusal.
    pub fn open_core(
        &self,
        core: usize,
    ) -> Result<Vec<Option<Box<dyn BlockBackend>>>, ExportsError> {
        (0..self.slots_used())
            .map(|i| self.open_slot(ExportId(i), core))
            .collect()
    }

    /// This core's instance of export `id` (`None` if it was removed); see
    /// [`open_core`](Self::open_core).
    ///
    /// # Errors
    /// As [`open_core`](Self::open_core).
    pub fn open_slot(
        &self,
        id: ExportId,
        core: usize,
    ) -> Result<Option<Box<dyn BlockBackend>>, ExportsError> {
        let export = self.export(id);
        if export.closed.load(Ordering::Acquire) {
            return Ok(None);
        }
        let geometry = self.geometry(id);
        let mut backend: Box<dyn BlockBackend> = match &export.source {
            Source::Ram(ram) => Box::new(lock(ram).share()),
            Source::File { path, opts } => {
                let file =
                    FileBackend::open(path, opts).map_err(|source| ExportsError::OpenOnCore {
                        name: export.name.clone(),
                        core,
                        source,
                    })?;
                // The size may have moved since the last OPEN read it; the rest may not.
                let same_size = Geometry {
                    size: geometry.size,
                    ..*file.geometry()
                };
                if same_size != geometry {
                    return Err(ExportsError::GeometryChanged {
                        name: export.name.clone(),
                        core,
                    });
                }
                Box::new(file)
            }
            Source::Dynamic(b) => {
                let Some(b) = lock(b).clone() else {
                    return Ok(None);
                };
                b.open_core(core)
                    .map_err(|reason| ExportsError::BackendOnCore {
                        name: export.name.clone(),
                        core,
                        reason,
                    })?
            }
        };
        if backend.geometry().size != geometry.size {
            backend.set_size(geometry.size);
        }
        Ok(Some(backend))
    }
}

impl std::fmt::Debug for Exports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(|(_, n)| n)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_rules() {
        let ex = Exports::ram(&[("a", 1 << 20), ("b", 4096)]).unwrap();
        let a = ex.lookup(b"a").unwrap();
        assert_eq!(ex.lookup(b"c"), None);
        assert_eq!(ex.lookup(&[0xff, 0xfe]), None);
        assert_eq!(ex.acquire(a, AccessMode::ReadOnly), Ok(()));
        assert_eq!(ex.writers(a), 0);
        assert_eq!(ex.acquire(a, AccessMode::ReadWrite), Ok(()));
        let e = ex.acquire(a, AccessMode::ReadWrite).unwrap_err();
        assert_eq!(e.errno(), Errno::EPERM);
        assert_eq!(
            e.to_string(),
            "rw refused: the export already has 1 writer(s)"
        );
        assert_eq!(ex.acquire(a, AccessMode::Migration), Ok(()));
        assert_eq!(ex.writers(a), 2);
        assert!(ex.acquire(a, AccessMode::Migration).is_err());
        assert_eq!(ex.acquire(a, AccessMode::ReadOnly), Ok(()));
        ex.release(a, AccessMode::ReadOnly);
        assert_eq!(ex.writers(a), 2);
        ex.release(a, AccessMode::ReadWrite);
        assert!(ex.acquire(a, AccessMode::ReadWrite).is_err());
        assert_eq!(ex.acquire(a, AccessMode::Migration), Ok(()));
        ex.release(a, AccessMode::Migration);
        ex.release(a, AccessMode::Migration);
        assert_eq!(ex.writers(a), 0);
        ex.release(a, AccessMode::Migration);
        assert_eq!(ex.writers(a), 0);
    }

    #[test]
    fn open_rsp_from_geometry() {
        let ex = Exports::ram(&[("a", 1 << 20)]).unwrap();
        let a = ex.lookup(b"a").unwrap();
        let rsp = ex.open_rsp(a, 7);
        assert_eq!(rsp.device_id, 7);
        assert_eq!(rsp.nsectors, 2048);
        assert_eq!(rsp.logical_block_size, 512);
        assert_eq!(rsp.max_hw_sectors, 2048);
        let mut b = [0u8; OpenRsp::LEN];
        rsp.encode(&mut b).unwrap();
        assert_eq!(OpenRsp::decode(&b), Ok(rsp));
    }

    #[test]
    fn duplicates_and_core_instances() {
        let err = Exports::ram(&[("a", 4096), ("a", 8192)]).unwrap_err();
        assert_eq!(err.to_string(), "export 'a' is declared twice");
        let ex = Exports::ram(&[("a", 4096), ("b", 8192)]).unwrap();
        let c0 = ex.open_core(0).unwrap();
        let c1 = ex.open_core(1).unwrap();
        assert_eq!(c0.len(), 2);
        assert_eq!(c1[1].as_ref().unwrap().geometry().size, 8192);
        assert_eq!(format!("{ex:?}"), "[\"a\", \"b\"]");
    }
}
