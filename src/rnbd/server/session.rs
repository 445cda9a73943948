//! One RNBD server session: the devices a client session has mapped, by device id. The
//! kernel's `rnbd_srv_session` with its `index_idr` XArray of `rnbd_srv_sess_dev`
//! (`process_msg_open`, `process_msg_close`, `rnbd_srv_destroy_sess`): created when the
//! RTRS session's first path comes up, destroyed (closing every mapping) when the last
//! one goes. Shared by the cores serving the session's connections.
//!
//! A forced close by the target's operator ([`RnbdServerSession::force_close`], the kernel's
//! sysfs `force_close`) empties a mapping's slot but keeps its id reserved, since the
//! client still uses it: its IO gets −ENOTCONN, and the id is freed by the client's
//! CLOSE of it, a new OPEN of the same name, or the session's end.
//!
//! OPEN and CLOSE (rare) change the table under a mutex and publish it as a new immutable
//! [`Devices`] snapshot with a higher version. Each core serving the session keeps its own
//! copy in a [`SessionView`] and, per IO, compares its version with the published one
//! (one Acquire load); only a stale copy takes the mutex, to pick up the new one. So the
//! data path takes no lock and does no atomic read-modify-write (docs/ARCHITECTURE.md,
//! "The server's core poller"). A CLOSE (or the session's end) is published before it
//! is answered, so a request handled after it on any core finds the device gone, as it
//! did behind a lock; an IO that looked its device up before keeps its export, which
//! is never freed (a removed export only turns closed, see [`Exports`]).

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use std::net::IpAddr;

use super::exports::{AccessError, ExportId, Exports};
use super::hosts::Host;
use crate::proto::rnbd::{AccessMode, Open, OpenRsp, RNBD_PROTO_VER_MAJOR};
use crate::server::SessionUse;
use crate::sync::{lock, Published};

/// One mapped device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub export: ExportId,
    pub mode: AccessMode,
    /// `dev_name` as opened: a re-open must match it exactly.
    pub name: Box<[u8]>,
    /// What the OPEN answered (refreshed by an idempotent re-open, which reports the
    /// export's size and geometry as they are then).
    pub rsp: OpenRsp,
    /// When the mapping was made (its first OPEN).
    pub opened: SystemTime,
}

/// What an IO needs of the session's devices at one version (immutable once published):
/// slot `i` is device id `i`, `None` a free id.
#[derive(Debug, Default)]
pub struct Devices {
    version: u64,
    slots: Vec<Option<(ExportId, AccessMode)>>,
}

impl Devices {
    /// The table's version this snapshot shows.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Export and mode of `device_id`, unless it is closed or unknown.
    #[inline]
    pub fn get(&self, device_id: u32) -> Option<(ExportId, AccessMode)> {
        self.slots.get(device_id as usize).copied().flatten()
    }
}

/// The mappings: slot `i` is device id `i`; `None` is a free id unless `reserved`
/// holds it (a forced close: the client still uses the id), with the name it had.
#[derive(Default)]
struct Table {
    slots: Vec<Option<Mapping>>,
    reserved: Vec<(u32, Box<[u8]>)>,
}

impl Table {
    fn is_reserved(&self, id: usize) -> bool {
        self.reserved.iter().any(|(r, _)| *r as usize == id)
    }

    /// Frees reserved id `id`; whether it was reserved.
    fn unreserve(&mut self, id: u32) -> bool {
        let before = self.reserved.len();
        self.reserved.retain(|(r, _)| *r != id);
        before != self.reserved.len()
    }

    /// Drops free slots at the end (reserved ones stay).
    fn trim(&mut self) {
        while self.slots.last().is_some_and(Option::is_none)
            && !self.is_reserved(self.slots.len() - 1)
        {
            self.slots.pop();
        }
    }
}

/// A session's device table and negotiated version.
pub struct RnbdServerSession {
    name: String,
    exports: Arc<Exports>,
    /// `min(client ver, 2)`; 0 until SESS_INFO.
    ver: AtomicU8,
    /// Written by OPEN, CLOSE and the end, each change published under this lock; IO
    /// reads the snapshot (see the module doc).
    table: Mutex<Table>,
    published: Published<Devices>,
    /// Devices mapped, as last published: the RTRS server's account of the session's
    /// use ([`SessionUse::in_use`]).
    mapped: AtomicUsize,
    ended: AtomicBool,
}

impl RnbdServerSession {
    /// A session named after its RTRS session, with no devices.
    pub fn new(name: &str, exports: Arc<Exports>) -> RnbdServerSession {
        RnbdServerSession {
            name: name.to_string(),
            exports,
            ver: AtomicU8::new(0),
            table: Mutex::new(Table::default()),
            published: Published::default(),
            mapped: AtomicUsize::new(0),
            ended: AtomicBool::new(false),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn exports(&self) -> &Arc<Exports> {
        &self.exports
    }

    /// Records the client's version from SESS_INFO; returns the negotiated one.
    pub fn set_client_ver(&self, client_ver: u8) -> u8 {
        let ver = client_ver.min(RNBD_PROTO_VER_MAJOR);
        self.ver.store(ver, Ordering::Relaxed);
        ver
    }

    /// The negotiated version (0 before SESS_INFO).
    pub fn ver(&self) -> u8 {
        self.ver.load(Ordering::Relaxed)
    }

    /// Maps a device (docs/PROTOCOL.md §7.2): an idempotent re-open of a name this session
    /// already has answers with that mapping without any access check, its size and
    /// geometry read again (unless that export was removed meanwhile: the dead mapping
    /// is dropped first); otherwise the
    /// name must be an export (and free of `..`) whose host list allows this session
    /// from `addr` (the source address of the path the OPEN came on, if known) and whose
    /// access rule grants `mode`; the device id is the lowest free one.
    ///
    /// # Errors
    /// The refusal, whose [`errno`](AccessError::errno) goes on the wire; also
    /// [`AccessError::UnknownName`] once the session has ended.
    pub fn open(&self, open: &Open<'_>, addr: Option<IpAddr>) -> Result<OpenRsp, AccessError> {
        self.open_from(open, addr, &[])
    }

    /// [`RnbdServerSession::open`] for a session whose paths come from `paths` (the OPEN's
    /// own among them, or not): a host list must allow each of them, since every path
    /// can carry the device's IO ([`AccessError::PathDenied`] names the first it does
    /// not).
    ///
    /// # Errors
    /// As [`RnbdServerSession::open`].
    pub fn open_from(
        &self,
        open: &Open<'_>,
        addr: Option<IpAddr>,
        paths: &[IpAddr],
    ) -> Result<OpenRsp, AccessError> {
        let mut table = self.lock();
        let result = self.open_locked(&mut table, open, addr, paths);
        self.publish(&mut table);
        result
    }

    fn open_locked(
        &self,
        table: &mut Table,
        open: &Open<'_>,
        addr: Option<IpAddr>,
        paths: &[IpAddr],
    ) -> Result<OpenRsp, AccessError> {
        let devices = &mut table.slots;
        if let Some(i) = devices
            .iter()
            .position(|m| m.as_ref().is_some_and(|m| *m.name == *open.dev_name))
        {
            let m = devices[i].as_mut().expect("position found a mapping");
            if !self.exports.is_closed(m.export) {
                // The same mapping, with the export's size and geometry as they are now
                // (a client re-opens to learn a new size).
                m.rsp = self.exports.open_rsp(m.export, i as u32);
                return Ok(m.rsp);
            }
            // The export was removed (and maybe added again): this mapping is dead, so
            // the name opens afresh instead of answering with the old device.
            self.exports.release(m.export, m.mode);
            devices[i] = None;
        }
        if open.dev_name.windows(2).any(|w| w == b"..") {
            return Err(AccessError::DotDot);
        }
        if self.ended.load(Ordering::Relaxed) {
            return Err(AccessError::UnknownName);
        }
        let export = self
            .exports
            .lookup(open.dev_name)
            .ok_or(AccessError::UnknownName)?;
        let host = Host {
            addr,
            sessname: &self.name,
        };
        let hosts = self.exports.hosts(export);
        if !hosts.allows(&host) {
            return Err(AccessError::HostDenied);
        }
        let other = paths.iter().find(|&&p| {
            !hosts.allows(&Host {
                addr: Some(p),
                sessname: &self.name,
            })
        });
        if let Some(&addr) = other {
            return Err(AccessError::PathDenied { addr });
        }
        self.exports.acquire(export, open.access_mode)?;
        // The client opens again what the target closed: the id it kept is free now.
        if let Some(k) = table
            .reserved
            .iter()
            .position(|(_, n)| **n == *open.dev_name)
        {
            table.reserved.swap_remove(k);
        }
        let free =
            (0..table.slots.len()).find(|&i| table.slots[i].is_none() && !table.is_reserved(i));
        let slot = match free {
            Some(free) => free,
            None => {
                table.slots.push(None);
                table.slots.len() - 1
            }
        };
        // Ids are bounded by the number of exports, so they fit in 32 bits.
        let rsp = self.exports.open_rsp(export, slot as u32);
        table.slots[slot] = Some(Mapping {
            export,
            mode: open.access_mode,
            name: open.dev_name.into(),
            rsp,
            opened: SystemTime::now(),
        });
        Ok(rsp)
    }

    /// Unmaps `device_id` and frees the id (also one a forced close reserved); an
    /// unknown id is ignored (CLOSE always answers 0). Returns whether a mapping was
    /// closed. IO already submitted for it completes normally.
    pub fn close(&self, device_id: u32) -> bool {
        let mut table = self.lock();
        let taken = table
            .slots
            .get_mut(device_id as usize)
            .and_then(Option::take);
        let unreserved = table.unreserve(device_id);
        let Some(m) = taken else {
            if unreserved {
                table.trim();
            }
            return false;
        };
        self.exports.release(m.export, m.mode);
        table.trim();
        self.publish(&mut table);
        true
    }

    /// Closes `device_id` for the client (the kernel's sysfs `force_close`): the mapping
    /// goes and its access mode's writer slot is released, but the id stays reserved,
    /// because the client still sends IO with it (answered −ENOTCONN). A later OPEN of
    /// the name goes through the host list and access rules again. Returns the closed
    /// mapping, `None` for an unknown id.
    pub fn force_close(&self, device_id: u32) -> Option<Mapping> {
        let mut table = self.lock();
        let m = table
            .slots
            .get_mut(device_id as usize)
            .and_then(Option::take)?;
        self.exports.release(m.export, m.mode);
        table.reserved.push((device_id, m.name.clone()));
        self.publish(&mut table);
        Some(m)
    }

    /// Closes every mapping (the session's last path went away). Later OPENs fail.
    pub fn end(&self) {
        self.ended.store(true, Ordering::Relaxed);
        let mut table = self.lock();
        for m in table.slots.drain(..).flatten() {
            self.exports.release(m.export, m.mode);
        }
        table.reserved.clear();
        self.publish(&mut table);
    }

    /// Whether [`end`](Self::end) ran: the RTRS session is gone.
    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    /// Export and mode of `device_id` as published (takes the table's lock: the data
    /// path asks its [`SessionView`] instead).
    pub fn lookup(&self, device_id: u32) -> Option<(ExportId, AccessMode)> {
        self.devices().get(device_id)
    }

    /// The published version (one Acquire load: the per-IO check).
    #[inline]
    pub fn version(&self) -> u64 {
        self.published.version()
    }

    /// The published snapshot of the devices.
    pub fn devices(&self) -> Arc<Devices> {
        self.published.load()
    }

    /// A copy of the device table: `(device_id, mapping)`.
    pub fn mappings(&self) -> Vec<(u32, Mapping)> {
        self.lock()
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, m)| m.clone().map(|m| (i as u32, m)))
            .collect()
    }

    /// Publishes the mappings as the next version, if they changed (under the table's
    /// lock, so versions follow the changes in order).
    fn publish(&self, table: &mut Table) {
        let slots: Vec<Option<(ExportId, AccessMode)>> = table
            .slots
            .iter()
            .map(|m| m.as_ref().map(|m| (m.export, m.mode)))
            .collect();
        self.mapped
            .store(slots.iter().flatten().count(), Ordering::Release);
        if slots == self.published.load().slots {
            return;
        }
        self.published.publish(|version| Devices { version, slots });
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // The table is consistent after any panic: each change is published before the
        // guard drops, and a change cut short only leaves the snapshot one change behind
        // until the next.
        lock(&self.table)
    }
}

/// The RTRS server's account of the session (docs/ARCHITECTURE.md, "Session slots"): in
/// use while a device is mapped; a new path may join while every mapped export's host
/// list admits it ([`super::HostList::admits_path`]).
impl SessionUse for RnbdServerSession {
    fn in_use(&self) -> bool {
        self.mapped.load(Ordering::Acquire) > 0
    }

    fn may_join(&self, peer: IpAddr, authenticated: bool) -> Result<(), String> {
        let table = self.lock();
        for m in table.slots.iter().flatten() {
            if self.exports.is_closed(m.export) {
                continue;
            }
            let hosts = self.exports.hosts(m.export);
            if !hosts.admits_path(peer, &self.name, authenticated) {
                let by_name = hosts.allows(&Host {
                    addr: None,
                    sessname: &self.name,
                });
                return Err(format!(
                    "device '{}' is open in the session and its allowed hosts do not \
                     include {peer}{}",
                    String::from_utf8_lossy(&m.name),
                    if by_name {
                        " (its sess: pattern admits a path only on a connection with a key)"
                    } else {
                        ""
                    }
                ));
            }
        }
        Ok(())
    }
}

/// One core's view of a session: the session and this core's copy of its published
/// devices, refreshed only when the published version moved (see the module doc).
#[derive(Clone, Debug)]
pub struct SessionView {
    sess: Arc<RnbdServerSession>,
    devices: Arc<Devices>,
}

impl SessionView {
    /// A view of `sess` holding its current snapshot.
    pub fn new(sess: Arc<RnbdServerSession>) -> SessionView {
        let devices = sess.devices();
        SessionView { sess, devices }
    }

    pub fn session(&self) -> &Arc<RnbdServerSession> {
        &self.sess
    }

    /// Export and mode of `device_id`, for an IO: one Acquire load, and the session's
    /// lock only when this copy is stale.
    #[inline]
    pub fn lookup(&mut self, device_id: u32) -> Option<(ExportId, AccessMode)> {
        lookup_fresh(&self.sess, &mut self.devices, device_id)
    }

    /// The session and this core's copy, borrowed apart (the dispatcher reads the one and
    /// refreshes the other).
    pub(super) fn parts(&mut self) -> (&RnbdServerSession, &mut Arc<Devices>) {
        (&self.sess, &mut self.devices)
    }
}

/// `device_id` in `devices`, a copy of `sess`'s snapshot taken again first if stale.
#[inline]
pub(super) fn lookup_fresh(
    sess: &RnbdServerSession,
    devices: &mut Arc<Devices>,
    device_id: u32,
) -> Option<(ExportId, AccessMode)> {
    if devices.version != sess.version() {
        *devices = sess.devices();
    }
    devices.get(device_id)
}

impl Deref for SessionView {
    type Target = RnbdServerSession;

    fn deref(&self) -> &RnbdServerSession {
        &self.sess
    }
}

impl From<Arc<RnbdServerSession>> for SessionView {
    fn from(sess: Arc<RnbdServerSession>) -> SessionView {
        SessionView::new(sess)
    }
}

impl Drop for RnbdServerSession {
    /// A session dropped without [`end`](RnbdServerSession::end) still gives its writers back.
    fn drop(&mut self) {
        self.end();
    }
}

impl std::fmt::Debug for RnbdServerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RnbdSession")
            .field("name", &self.name)
            .field("ver", &self.ver())
            .field("devices", &self.mappings().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(name: &[u8], mode: AccessMode) -> Open<'_> {
        Open {
            access_mode: mode,
            dev_name: name,
        }
    }

    #[test]
    fn ids_lowest_free_and_idempotent_reopen() {
        let ex = Arc::new(Exports::ram(&[("a", 4096), ("b", 4096), ("c", 8192)]).unwrap());
        let s = RnbdServerSession::new("s1", ex.clone());
        assert_eq!(s.set_client_ver(7), 2);
        assert_eq!(
            s.open(&open(b"a", AccessMode::ReadWrite), None)
                .unwrap()
                .device_id,
            0
        );
        assert_eq!(
            s.open(&open(b"b", AccessMode::ReadOnly), None)
                .unwrap()
                .device_id,
            1
        );
        let c = s.open(&open(b"c", AccessMode::Migration), None).unwrap();
        assert_eq!((c.device_id, c.nsectors), (2, 16));
        // Same name again, any mode: same answer, no new writer.
        assert_eq!(s.open(&open(b"c", AccessMode::ReadWrite), None), Ok(c));
        let c_id = ex.lookup(b"c").unwrap();
        assert_eq!(ex.writers(c_id), 1);
        assert!(s.close(1));
        assert!(!s.close(1));
        assert!(!s.close(99));
        assert_eq!(s.lookup(1), None);
        assert_eq!(
            s.open(&open(b"b", AccessMode::ReadOnly), None)
                .unwrap()
                .device_id,
            1
        );
        assert_eq!(s.lookup(2), Some((c_id, AccessMode::Migration)));
        assert_eq!(
            s.open(&open(b"x", AccessMode::ReadOnly), None),
            Err(AccessError::UnknownName)
        );
        assert_eq!(
            s.open(&open(b"../a", AccessMode::ReadOnly), None),
            Err(AccessError::DotDot)
        );
        s.end();
        assert_eq!(ex.writers(c_id), 0);
        assert_eq!(ex.writers(ex.lookup(b"a").unwrap()), 0);
        assert_eq!(
            s.open(&open(b"a", AccessMode::ReadOnly), None),
            Err(AccessError::UnknownName)
        );
    }

    #[test]
    fn drop_releases_writers() {
        let ex = Arc::new(Exports::ram(&[("a", 4096)]).unwrap());
        let a = ex.lookup(b"a").unwrap();
        let s1 = RnbdServerSession::new("s1", ex.clone());
        s1.open(&open(b"a", AccessMode::ReadWrite), None).unwrap();
        let s2 = RnbdServerSession::new("s2", ex.clone());
        assert_eq!(
            s2.open(&open(b"a", AccessMode::ReadWrite), None)
                .unwrap_err()
                .errno(),
            crate::Errno::EPERM
        );
        drop(s1);
        assert_eq!(ex.writers(a), 0);
        assert!(s2.open(&open(b"a", AccessMode::ReadWrite), None).is_ok());
    }

    #[test]
    fn views_refresh_only_when_the_version_moves() {
        let ex = Arc::new(Exports::ram(&[("a", 4096), ("b", 4096)]).unwrap());
        let a = ex.lookup(b"a").unwrap();
        let b = ex.lookup(b"b").unwrap();
        let s = Arc::new(RnbdServerSession::new("s", ex.clone()));
        let mut core0 = SessionView::new(Arc::clone(&s));
        let mut core1 = SessionView::from(Arc::clone(&s));
        assert_eq!(core1.lookup(0), None);
        let id = s
            .open(&open(b"a", AccessMode::ReadWrite), None)
            .unwrap()
            .device_id;
        let v = s.version();
        assert_eq!(v, 1);
        // Taken again once, then kept while nothing changes.
        assert_eq!(core1.lookup(id), Some((a, AccessMode::ReadWrite)));
        let copy = Arc::clone(&core1.devices);
        assert_eq!(core1.lookup(id), Some((a, AccessMode::ReadWrite)));
        assert!(Arc::ptr_eq(&copy, &core1.devices));
        // An idempotent re-open and refused OPENs publish nothing.
        s.open(&open(b"a", AccessMode::ReadOnly), None).unwrap();
        assert!(s.open(&open(b"x", AccessMode::ReadOnly), None).is_err());
        assert_eq!(s.version(), v);
        // A CLOSE through one core's view shows on the other's next lookup.
        assert!(core0.close(id));
        assert_eq!(s.version(), v + 1);
        assert_eq!(core1.lookup(id), None);
        // An unknown id changes nothing.
        assert!(!core0.close(id));
        assert_eq!(s.version(), v + 1);
        let id_b = s
            .open(&open(b"b", AccessMode::ReadOnly), None)
            .unwrap()
            .device_id;
        assert_eq!(id_b, id);
        assert_eq!(core1.lookup(id), Some((b, AccessMode::ReadOnly)));
        assert_eq!(core0.lookup(id), Some((b, AccessMode::ReadOnly)));
        s.end();
        assert_eq!(core0.lookup(id), None);
        assert_eq!(core1.lookup(id), None);
        assert_eq!(s.devices().version(), s.version());
        assert_eq!(ex.writers(a), 0);
    }

    #[test]
    fn force_close_keeps_the_id_until_the_client_lets_go() {
        let ex = Arc::new(Exports::ram(&[("a", 4096), ("b", 4096)]).unwrap());
        let a = ex.lookup(b"a").unwrap();
        let s1 = RnbdServerSession::new("s1", ex.clone());
        let s2 = RnbdServerSession::new("s2", ex.clone());
        let id = s1
            .open(&open(b"a", AccessMode::ReadWrite), None)
            .unwrap()
            .device_id;
        let before = s1.mappings()[0].1.opened;
        assert_eq!(ex.writers(a), 1);
        assert_eq!(s1.force_close(99), None);
        let closed = s1.force_close(id).unwrap();
        assert_eq!((closed.export, closed.opened), (a, before));
        // IO finds no device; the writer slot is free for another session at once.
        assert_eq!(s1.lookup(id), None);
        assert_eq!(ex.writers(a), 0);
        assert!(s2.open(&open(b"a", AccessMode::ReadWrite), None).is_ok());
        // The id stays reserved: another name does not get it.
        let b = s1
            .open(&open(b"b", AccessMode::ReadOnly), None)
            .unwrap()
            .device_id;
        assert_ne!(b, id);
        // A new OPEN of the name goes through the access rules again (s2 writes now)...
        let e = s1
            .open(&open(b"a", AccessMode::ReadWrite), None)
            .unwrap_err();
        assert_eq!(e.errno(), crate::Errno::EPERM);
        s2.end();
        // ... and once allowed, frees the reserved id and maps the name afresh.
        let again = s1
            .open(&open(b"a", AccessMode::ReadWrite), None)
            .unwrap()
            .device_id;
        assert_eq!(again, id, "the lowest free id, the one given back");
        assert_eq!(s1.lookup(again), Some((a, AccessMode::ReadWrite)));
        // The client's CLOSE of a reserved id frees it too.
        s1.force_close(b).unwrap();
        assert!(!s1.close(b));
        let c = s1
            .open(&open(b"b", AccessMode::ReadOnly), None)
            .unwrap()
            .device_id;
        assert_eq!(c, b);
    }

    use crate::rnbd::backend::BlockBackend as _;

    struct Ram(std::sync::Mutex<crate::rnbd::backend::RamBackend>);

    impl super::super::ExportBackend for Ram {
        fn geometry(&self) -> crate::rnbd::backend::Geometry {
            *self.0.lock().unwrap().geometry()
        }
        fn open_core(
            &self,
            _core: usize,
        ) -> Result<Box<dyn crate::rnbd::backend::BlockBackend>, String> {
            Ok(Box::new(self.0.lock().unwrap().share()))
        }
    }

    fn ram(size: u64) -> Arc<dyn super::super::ExportBackend> {
        Arc::new(Ram(std::sync::Mutex::new(
            crate::rnbd::backend::RamBackend::new(size, 512).unwrap(),
        )))
    }

    #[test]
    fn reopen_after_the_export_was_replaced() {
        let ex = Arc::new(Exports::dynamic(4));
        let old = ex.add("d", ram(4096), false).unwrap();
        let sess = RnbdServerSession::new("s", Arc::clone(&ex));
        let first = sess.open(&open(b"d", AccessMode::ReadWrite), None).unwrap();
        assert_eq!(
            sess.lookup(first.device_id),
            Some((old, AccessMode::ReadWrite))
        );
        ex.remove("d");
        // Removed: the stale mapping no longer answers a re-open.
        assert_eq!(
            sess.open(&open(b"d", AccessMode::ReadWrite), None),
            Err(AccessError::UnknownName)
        );
        assert_eq!(sess.lookup(first.device_id), None);
        assert_eq!(ex.writers(old), 0);
        let new = ex.add("d", ram(8192), false).unwrap();
        let again = sess.open(&open(b"d", AccessMode::ReadWrite), None).unwrap();
        assert_eq!(again.nsectors, 16);
        assert_eq!(
            sess.lookup(again.device_id),
            Some((new, AccessMode::ReadWrite))
        );
        assert_eq!(ex.writers(new), 1);
    }
}
