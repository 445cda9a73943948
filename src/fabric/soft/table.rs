//! The registration table of a software fabric: what a NIC's memory translation and
//! protection tables do, in software. One table is one protection domain.
//!
//! A key is `index << 8 | key byte`, as on real hardware: the index names a table entry,
//! the low byte is that entry's current generation. Regions ([`Mr`]) use the same value
//! as lkey and rkey. Fast-registration slots ([`FastMr`]) get a new key byte on every
//! binding (`inc_rkey`), so a key that was retired or superseded never matches again
//! until the byte wraps (256 bindings later, as on hardware). Index 0 is never used, so
//! rkey 0 is never valid.
//!
//! Every check returns a [`MemRef`] that keeps the memory alive while the caller copies,
//! so a registration dropped concurrently can never free memory under a copy in progress.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::fabric::mem::Backing;
use crate::fabric::{Access, FastMr, KeyScope, MemBuf, Mr, Sge, WcStatus};

/// A checked range of registered memory, valid while the `MemRef` lives.
#[derive(Clone)]
pub struct MemRef {
    ptr: *mut u8,
    len: usize,
    keep: Arc<Backing>,
}

// SAFETY: the pointer targets memory kept alive by `keep`, which is Send + Sync; a
// MemRef is only a checked address range, the copies it offers are explicit.
unsafe impl Send for MemRef {}
// SAFETY: as above; &MemRef offers no interior mutation of the MemRef itself.
unsafe impl Sync for MemRef {}

impl std::fmt::Debug for MemRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemRef({:p}, {} bytes)", self.ptr, self.len)
    }
}

impl MemRef {
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `other` keeps the same registered memory alive as this one (so that holding
    /// either keeps both ranges valid).
    pub fn shares_backing(&self, other: &MemRef) -> bool {
        Arc::ptr_eq(&self.keep, &other.keep)
    }

    /// The handle that keeps the memory allocated.
    pub fn into_backing(self) -> Arc<Backing> {
        self.keep
    }

    /// The first `len` bytes (`len` ≤ this range).
    ///
    /// # Panics
    /// When `len` exceeds the range.
    pub fn prefix(&self, len: usize) -> MemRef {
        assert!(len <= self.len, "prefix {len} of a {}-byte range", self.len);
        MemRef {
            ptr: self.ptr,
            len,
            keep: self.keep.clone(),
        }
    }

    /// The first `len` bytes, consuming this reference (`len` ≤ this range).
    ///
    /// # Panics
    /// When `len` exceeds the range.
    pub fn truncate(mut self, len: usize) -> MemRef {
        assert!(len <= self.len, "prefix {len} of a {}-byte range", self.len);
        self.len = len;
        self
    }

    /// Copies `data` into the range at `offset`.
    ///
    /// # Panics
    /// When `offset + data.len()` exceeds the range.
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        assert!(offset
            .checked_add(data.len())
            .is_some_and(|end| end <= self.len));
        // SAFETY: in bounds of checked registered memory kept alive by `keep`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(offset), data.len()) }
    }

    /// Copies the range's bytes into `out` (which must have the same length).
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn read_into(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len);
        // SAFETY: as in write_at.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), self.len) }
    }

    /// Fills this range with the concatenation of `sources` (their total length must
    /// equal this range's): the one copy a software fabric makes per operation.
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn gather_from(&self, sources: &[MemRef]) {
        if let [s] = sources {
            // The common case, one source: no sum, one copy.
            assert_eq!(
                s.len, self.len,
                "gather of {} bytes into {}",
                s.len, self.len
            );
            // SAFETY: as below, with `s.len == self.len`.
            unsafe { std::ptr::copy(s.ptr, self.ptr, s.len) }
            return;
        }
        let total: usize = sources.iter().map(|s| s.len).sum();
        assert_eq!(total, self.len, "gather of {total} bytes into {}", self.len);
        let mut at = 0;
        for s in sources {
            // SAFETY: both ranges are checked registered memory kept alive by their Arcs;
            // `at + s.len <= self.len` by the sum above. Source and destination may be
            // the same memory only if the user aims an operation at its own source,
            // which `copy` (memmove) tolerates.
            unsafe { std::ptr::copy(s.ptr, self.ptr.add(at), s.len) }
            at += s.len;
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Free,
    Region,
    Slot,
}

#[derive(Debug)]
struct Entry {
    kind: Kind,
    key: u8,
    valid: bool,
    base: u64,
    len: u64,
    access: Access,
    /// A slot's scope: a `Domain` key cannot be retired by a peer's SEND_WITH_INV.
    scope: KeyScope,
    /// The memory a region covers, or that a slot was last bound over (kept while the
    /// slot is invalid, see [`MrTable::invalidate`]; reached only through a valid entry).
    backing: Option<Arc<Backing>>,
}

impl Entry {
    const FREE: Entry = Entry {
        kind: Kind::Free,
        key: 0,
        valid: false,
        base: 0,
        len: 0,
        access: Access::NONE,
        scope: KeyScope::Domain,
        backing: None,
    };

    fn range(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.checked_add(len)?;
        (addr >= self.base && end <= self.base + self.len).then_some(addr as usize)
    }
}

#[derive(Debug, Default)]
struct Inner {
    entries: Vec<Entry>,
    free: Vec<u32>,
}

/// The checks of a remote access as a NIC makes them: `rkey` names a live region or a
/// bound slot with the same key byte, the access is granted and `[addr, addr+len)` is
/// inside. The start address and the entry.
fn remote_entry(
    inner: &Inner,
    rkey: u32,
    addr: u64,
    len: u64,
    need: Access,
) -> Result<(usize, &Entry), WcStatus> {
    let e = inner
        .entries
        .get((rkey >> 8) as usize)
        .ok_or(WcStatus::RemoteAccess)?;
    if e.kind == Kind::Free || !e.valid || e.key != rkey as u8 || !e.access.contains(need) {
        return Err(WcStatus::RemoteAccess);
    }
    let start = e.range(addr, len).ok_or(WcStatus::RemoteAccess)?;
    Ok((start, e))
}

/// A protection domain's registrations.
#[derive(Debug)]
pub struct MrTable {
    inner: RwLock<Inner>,
    /// Bumped (under the write lock) whenever an entry is allocated or retired, so a
    /// [`LkeyCache`] knows its regions are still what it saw. Bindings and
    /// invalidations of slots do not bump it: local checks never accept a slot.
    epoch: AtomicU64,
    /// The last queue-pair number given out ([`MrTable::next_qp_num`]).
    qp_nums: AtomicU32,
}

/// The regions a queue pair's local SGEs named last, remembered so that checking the
/// next SGE of the same region takes no lock: what a NIC's translation cache does.
/// A hit is valid while the table's epoch is unchanged (no registration came or went),
/// and every check on the SGE itself (key, rights, bounds) is still made each time.
/// It keeps the regions' memory alive until it is refreshed or dropped.
#[derive(Debug, Default)]
pub struct LkeyCache {
    ways: [Option<Cached>; 2],
    /// The way replaced on the next miss.
    next: usize,
}

#[derive(Debug)]
struct Cached {
    epoch: u64,
    lkey: u32,
    base: u64,
    len: u64,
    access: Access,
    keep: Arc<Backing>,
}

impl Cached {
    /// The checks of [`MrTable::local`] after the key: rights and bounds.
    fn check(&self, sge: &Sge, need: Access) -> Result<MemRef, WcStatus> {
        let end = sge.addr.checked_add(sge.len as u64);
        if !self.access.contains(need)
            || sge.addr < self.base
            || !end.is_some_and(|end| end <= self.base + self.len)
        {
            return Err(WcStatus::LocalProtection);
        }
        Ok(MemRef {
            ptr: sge.addr as *mut u8,
            len: sge.len as usize,
            keep: self.keep.clone(),
        })
    }
}

impl LkeyCache {
    /// Forgets every remembered region (their memory may go).
    pub fn clear(&mut self) {
        self.ways = [None, None];
    }
}

/// The backend state inside an [`Mr`] or [`FastMr`] made by a [`MrTable`]: which table
/// and which entry. Dropping it retires the entry.
#[derive(Debug)]
struct Registration {
    table: Arc<MrTable>,
    index: u32,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut inner = self.table.inner.write().unwrap_or_else(|e| e.into_inner());
        self.table.epoch.fetch_add(1, Ordering::Release);
        let e = &mut inner.entries[self.index as usize];
        // Bump the key so a stale key cannot match whatever reuses the index.
        *e = Entry {
            key: e.key.wrapping_add(1),
            ..Entry::FREE
        };
        inner.free.push(self.index);
    }
}

/// The largest registration a software fabric accepts (a NIC's `max_mr_size`).
pub const MAX_MR_SIZE: u64 = 1 << 40;

impl MrTable {
    pub fn new() -> Arc<MrTable> {
        // Entry 0 is a permanent hole: key 0 never names anything.
        let inner = Inner {
            entries: vec![Entry::FREE],
            free: Vec::new(),
        };
        Arc::new(MrTable {
            inner: RwLock::new(inner),
            epoch: AtomicU64::new(0),
            qp_nums: AtomicU32::new(0),
        })
    }

    /// A fresh queue-pair number of this protection domain (so of this fabric): 24 bits
    /// as on verbs, never 0, reused only after 2^24 - 1 newer ones. Numbered per fabric,
    /// a run on a fresh fabric numbers its connections the same way every time.
    pub fn next_qp_num(&self) -> u32 {
        loop {
            let n = self.qp_nums.fetch_add(1, Ordering::Relaxed).wrapping_add(1) & 0x00ff_ffff;
            if n != 0 {
                return n;
            }
        }
    }

    fn alloc(self: &Arc<Self>, entry: Entry) -> (u32, u32) {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        self.epoch.fetch_add(1, Ordering::Release);
        let index = match inner.free.pop() {
            Some(i) => i,
            None => {
                inner.entries.push(Entry::FREE);
                (inner.entries.len() - 1) as u32
            }
        };
        let slot = &mut inner.entries[index as usize];
        let key = slot.key;
        *slot = Entry { key, ..entry };
        (index, index << 8 | key as u32)
    }

    /// Registers `backing` with `access`.
    pub fn register(self: &Arc<Self>, backing: Arc<Backing>, access: Access) -> Mr {
        let entry = Entry {
            kind: Kind::Region,
            key: 0,
            valid: true,
            base: backing.addr() as u64,
            len: backing.len() as u64,
            access,
            scope: KeyScope::Domain,
            backing: Some(backing.clone()),
        };
        let (index, key) = self.alloc(entry);
        let reg = Registration {
            table: self.clone(),
            index,
        };
        Mr::from_parts(key, key, access, Box::new(reg), backing)
    }

    /// Registers an owned buffer.
    pub fn register_buf(self: &Arc<Self>, buf: MemBuf, access: Access) -> Mr {
        self.register(Arc::new(Backing::Owned(buf)), access)
    }

    /// A fast-registration slot of `scope`, unbound.
    pub fn alloc_fast_mr(self: &Arc<Self>, scope: KeyScope) -> FastMr {
        let entry = Entry {
            kind: Kind::Slot,
            scope,
            ..Entry::FREE
        };
        let (index, key) = self.alloc(entry);
        FastMr::from_parts(
            key,
            Box::new(Registration {
                table: self.clone(),
                index,
            }),
        )
    }

    fn own_index(self: &Arc<Self>, handle: &(dyn std::any::Any + Send + Sync)) -> Option<u32> {
        let reg = handle.downcast_ref::<Registration>()?;
        Arc::ptr_eq(&reg.table, self).then_some(reg.index)
    }

    /// Checks a local SGE: its lkey names a live region of this table, the range is
    /// inside, and the region grants `need`.
    ///
    /// # Errors
    /// [`WcStatus::LocalProtection`].
    pub fn local(&self, sge: &Sge, need: Access) -> Result<MemRef, WcStatus> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let e = inner
            .entries
            .get((sge.lkey >> 8) as usize)
            .ok_or(WcStatus::LocalProtection)?;
        if e.kind != Kind::Region || !e.valid || e.key != sge.lkey as u8 || !e.access.contains(need)
        {
            return Err(WcStatus::LocalProtection);
        }
        let start = e
            .range(sge.addr, sge.len as u64)
            .ok_or(WcStatus::LocalProtection)?;
        let keep = e.backing.clone().ok_or(WcStatus::LocalProtection)?;
        Ok(MemRef {
            ptr: start as *mut u8,
            len: sge.len as usize,
            keep,
        })
    }

    /// [`MrTable::local`] through a queue pair's cache: the same checks and result,
    /// without the table's lock when the SGE's region was looked up recently.
    ///
    /// # Errors
    /// [`WcStatus::LocalProtection`].
    #[inline]
    pub fn local_cached(
        &self,
        cache: &mut LkeyCache,
        sge: &Sge,
        need: Access,
    ) -> Result<MemRef, WcStatus> {
        // Read before the entry (under the lock on a miss): a registration change in
        // between leaves the remembered epoch stale, never a stale entry current.
        let epoch = self.epoch.load(Ordering::Acquire);
        let hit = cache
            .ways
            .iter()
            .flatten()
            .find(|c| c.lkey == sge.lkey && c.epoch == epoch);
        if let Some(c) = hit {
            return c.check(sge, need);
        }
        self.local_miss(cache, sge, need, epoch)
    }

    /// [`MrTable::local_cached`] on a miss: the lookup under the lock, remembered. Out
    /// of line, so a hit pays for none of its registers.
    #[cold]
    #[inline(never)]
    fn local_miss(
        &self,
        cache: &mut LkeyCache,
        sge: &Sge,
        need: Access,
        epoch: u64,
    ) -> Result<MemRef, WcStatus> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let e = inner
            .entries
            .get((sge.lkey >> 8) as usize)
            .filter(|e| e.kind == Kind::Region && e.valid && e.key == sge.lkey as u8)
            .ok_or(WcStatus::LocalProtection)?;
        let keep = e.backing.clone().ok_or(WcStatus::LocalProtection)?;
        let way = Cached {
            epoch,
            lkey: sge.lkey,
            base: e.base,
            len: e.len,
            access: e.access,
            keep,
        };
        drop(inner);
        let result = way.check(sge, need);
        let at = cache.next;
        cache.next ^= 1;
        cache.ways[at] = Some(way);
        result
    }

    /// Checks an incoming remote access as a NIC would: the rkey names a live region or a
    /// bound slot with the same key byte, the access is granted and the range is inside.
    ///
    /// # Errors
    /// [`WcStatus::RemoteAccess`].
    pub fn remote(&self, rkey: u32, addr: u64, len: u32, need: Access) -> Result<MemRef, WcStatus> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let (start, e) = remote_entry(&inner, rkey, addr, len.into(), need)?;
        let keep = e.backing.clone().ok_or(WcStatus::RemoteAccess)?;
        Ok(MemRef {
            ptr: start as *mut u8,
            len: len as usize,
            keep,
        })
    }

    /// [`MrTable::remote`] with `need` = remote write, and `data` copied to `addr` at once,
    /// under the table's lock: for a payload the caller already holds whole, no
    /// [`MemRef`] (and no reference count) is made. The lock keeps the memory: an entry's
    /// registration goes only under the write lock.
    ///
    /// # Errors
    /// [`WcStatus::RemoteAccess`], nothing written.
    pub fn remote_write(&self, rkey: u32, addr: u64, data: &[u8]) -> Result<(), WcStatus> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let (start, e) = remote_entry(&inner, rkey, addr, data.len() as u64, Access::REMOTE_WRITE)?;
        if e.backing.is_none() {
            return Err(WcStatus::RemoteAccess);
        }
        // SAFETY: `[start, start + data.len())` is inside the entry's registered range
        // (checked by `remote_entry`), whose memory the entry's backing keeps allocated
        // while we hold the read lock. `copy` (memmove) tolerates a source inside the
        // same memory, as `MemRef::gather_from` does.
        unsafe { std::ptr::copy(data.as_ptr(), start as *mut u8, data.len()) };
        Ok(())
    }

    /// Binds `slot` to `[addr, addr+len)` of `region` under `rkey` (a REG_MR).
    ///
    /// # Errors
    /// [`WcStatus::LocalQpOperation`] when the slot or region belongs to another table,
    /// `rkey` is not of the slot's index, the range is outside the region, or the slot is
    /// still bound: as with fast-registration MRs and type-2 memory windows on a NIC, a
    /// binding must be invalidated (LOCAL_INV or SEND_WITH_INV) before the next one.
    pub fn bind(
        self: &Arc<Self>,
        slot: &FastMr,
        region: &Mr,
        addr: u64,
        len: u32,
        access: Access,
        rkey: u32,
    ) -> Result<(), WcStatus> {
        let bad = WcStatus::LocalQpOperation;
        let slot_index = self.own_index(slot.handle()).ok_or(bad)?;
        let region_index = self.own_index(region.handle()).ok_or(bad)?;
        if rkey >> 8 != slot_index {
            return Err(bad);
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let r = &inner.entries[region_index as usize];
        if r.kind != Kind::Region || !r.valid || r.range(addr, len as u64).is_none() {
            return Err(bad);
        }
        let e = &inner.entries[slot_index as usize];
        if e.valid {
            return Err(bad);
        }
        // A slot keeps the memory of the region it was last bound over (see
        // `invalidate`): bound over the same one again, it takes no new reference.
        let backing = match (&e.backing, &r.backing) {
            (Some(kept), Some(new)) if Arc::ptr_eq(kept, new) => None,
            _ => Some(r.backing.clone()),
        };
        let e = &mut inner.entries[slot_index as usize];
        e.kind = Kind::Slot;
        e.key = rkey as u8;
        e.valid = true;
        e.base = addr;
        e.len = len as u64;
        e.access = access;
        if let Some(b) = backing {
            e.backing = b;
        }
        drop(inner);
        slot.set_rkey(rkey);
        Ok(())
    }

    /// Retires `slot`'s current rkey (a LOCAL_INV).
    ///
    /// # Errors
    /// `Err(())` when the slot is another table's or not bound; the caller turns it into
    /// the status its operation reports.
    #[allow(clippy::result_unit_err)]
    pub fn invalidate_slot(self: &Arc<Self>, slot: &FastMr) -> Result<(), ()> {
        let index = self.own_index(slot.handle()).ok_or(())?;
        let rkey = slot.rkey();
        if rkey >> 8 != index {
            return Err(());
        }
        self.invalidate(rkey, KeyScope::Domain)
    }

    /// Retires the rkey a peer's SEND_WITH_INV names: only a `Connection` slot's.
    ///
    /// # Errors
    /// As [`MrTable::invalidate`].
    #[allow(clippy::result_unit_err)]
    pub fn invalidate_remote(&self, rkey: u32) -> Result<(), ()> {
        self.invalidate(rkey, KeyScope::Connection)
    }

    /// Retires a slot's current rkey on behalf of `by`: the owner's LOCAL_INV
    /// (`Domain`, any slot) or a peer's SEND_WITH_INV (`Connection`, only slots of
    /// that scope).
    ///
    /// # Errors
    /// `Err(())` when `rkey` is not the current key of a bound slot that `by` may retire.
    #[allow(clippy::result_unit_err)]
    pub fn invalidate(&self, rkey: u32, by: KeyScope) -> Result<(), ()> {
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match inner.entries.get_mut((rkey >> 8) as usize) {
            Some(e)
                if e.kind == Kind::Slot
                    && e.valid
                    && e.key == rkey as u8
                    && (by == KeyScope::Domain || e.scope == KeyScope::Connection) =>
            {
                // The key is dead from here on (every check wants `valid`). The region's
                // memory stays referenced until the slot is bound over another region or
                // freed, so that rebinding over the same region, the common case, touches
                // no reference count.
                e.valid = false;
                Ok(())
            }
            _ => Err(()),
        }
    }

    /// Whether `mr` was registered through this table (a post naming another domain's
    /// registration is invalid).
    pub fn owns(self: &Arc<Self>, mr: &Mr) -> bool {
        self.own_index(mr.handle()).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fabric::inc_rkey;

    const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

    #[test]
    fn remote_checks_key_access_and_bounds() {
        let t = MrTable::new();
        let mr = t.register_buf(MemBuf::zeroed(4096), RW);
        let ro = t.register_buf(MemBuf::zeroed(4096), Access::LOCAL_WRITE);
        assert!(t
            .remote(mr.rkey(), mr.addr(), 4096, Access::REMOTE_WRITE)
            .is_ok());
        assert!(t
            .remote(mr.rkey(), mr.addr() + 4000, 96, Access::REMOTE_WRITE)
            .is_ok());
        let err = Err(WcStatus::RemoteAccess);
        assert_eq!(
            t.remote(mr.rkey(), mr.addr() + 4000, 97, Access::REMOTE_WRITE)
                .map(|_| ()),
            err
        );
        assert_eq!(
            t.remote(mr.rkey(), mr.addr() - 1, 1, Access::REMOTE_WRITE)
                .map(|_| ()),
            err
        );
        assert_eq!(
            t.remote(mr.rkey() ^ 1, mr.addr(), 1, Access::REMOTE_WRITE)
                .map(|_| ()),
            err
        );
        assert_eq!(
            t.remote(ro.rkey(), ro.addr(), 1, Access::REMOTE_WRITE)
                .map(|_| ()),
            err
        );
        assert_eq!(t.remote(0, 0, 0, Access::NONE).map(|_| ()), err);
        assert_eq!(
            t.remote(u32::MAX, u64::MAX, u32::MAX, Access::NONE)
                .map(|_| ()),
            err
        );
    }

    #[test]
    fn remote_write_makes_the_checks_of_remote_and_writes_only_when_they_pass() {
        let t = MrTable::new();
        let mr = t.register_buf(MemBuf::zeroed(4096), RW);
        let ro = t.register_buf(MemBuf::zeroed(4096), Access::LOCAL_WRITE);
        t.remote_write(mr.rkey(), mr.addr() + 4000, &[7u8; 96])
            .unwrap();
        let mut back = [0u8; 97];
        mr.read_at(3999, &mut back);
        assert_eq!(back[0], 0);
        assert!(back[1..].iter().all(|&b| b == 7));
        let err = Err(WcStatus::RemoteAccess);
        assert_eq!(t.remote_write(mr.rkey(), mr.addr() + 4000, &[9u8; 97]), err);
        assert_eq!(t.remote_write(mr.rkey(), mr.addr() - 1, &[9u8; 1]), err);
        assert_eq!(t.remote_write(mr.rkey() ^ 1, mr.addr(), &[9u8; 1]), err);
        assert_eq!(t.remote_write(ro.rkey(), ro.addr(), &[9u8; 1]), err);
        assert_eq!(t.remote_write(0, 0, &[]), err);
        mr.read_at(3999, &mut back);
        assert!(
            back[1..].iter().all(|&b| b == 7),
            "a refused write wrote nothing"
        );
        let mut first = [0u8; 1];
        mr.read_at(0, &mut first);
        assert_eq!(first, [0]);
        // Through a bound slot, and not once it is invalidated.
        let slot = t.alloc_fast_mr(KeyScope::Connection);
        let k = inc_rkey(slot.rkey());
        t.bind(&slot, &mr, mr.addr(), 64, RW, k).unwrap();
        t.remote_write(k, mr.addr() + 8, &[5u8; 8]).unwrap();
        mr.read_at(8, &mut first);
        assert_eq!(first, [5]);
        t.invalidate(k, KeyScope::Domain).unwrap();
        assert_eq!(t.remote_write(k, mr.addr(), &[1u8; 1]), err);
    }

    #[test]
    fn dropped_registration_never_matches_again() {
        let t = MrTable::new();
        let mr = t.register_buf(MemBuf::zeroed(64), RW);
        let (key, addr) = (mr.rkey(), mr.addr());
        drop(mr);
        let again = t.register_buf(MemBuf::zeroed(64), RW);
        assert_eq!(again.rkey() >> 8, key >> 8, "index is reused");
        assert_ne!(again.rkey(), key, "but under a new key");
        assert!(t.remote(key, addr, 1, Access::REMOTE_WRITE).is_err());
    }

    #[test]
    fn local_checks_lkey_and_rights() {
        let t = MrTable::new();
        let mr = t.register_buf(MemBuf::zeroed(64), Access::NONE);
        assert!(t.local(&mr.sge(0, 64), Access::NONE).is_ok());
        assert_eq!(
            t.local(&mr.sge(0, 64), Access::LOCAL_WRITE).map(|_| ()),
            Err(WcStatus::LocalProtection)
        );
        let mut sge = mr.sge(0, 64);
        sge.len = 65;
        assert_eq!(
            t.local(&sge, Access::NONE).map(|_| ()),
            Err(WcStatus::LocalProtection)
        );
    }

    #[test]
    fn slot_binding_and_invalidation() {
        let t = MrTable::new();
        let mr = t.register_buf(MemBuf::zeroed(8192), RW);
        let slot = t.alloc_fast_mr(KeyScope::Connection);
        let first = slot.rkey();
        assert!(
            t.remote(first, mr.addr(), 1, Access::REMOTE_WRITE).is_err(),
            "unbound"
        );
        let k1 = inc_rkey(first);
        t.bind(&slot, &mr, mr.addr() + 4096, 4096, RW, k1).unwrap();
        assert_eq!(slot.rkey(), k1);
        assert!(t
            .remote(k1, mr.addr() + 4096, 4096, Access::REMOTE_WRITE)
            .is_ok());
        assert!(
            t.remote(k1, mr.addr(), 1, Access::REMOTE_WRITE).is_err(),
            "outside binding"
        );
        let k2 = inc_rkey(k1);
        assert!(
            t.bind(&slot, &mr, mr.addr(), 4096, RW, k2).is_err(),
            "still bound"
        );
        t.invalidate(k1, KeyScope::Domain).unwrap();
        t.bind(&slot, &mr, mr.addr(), 4096, RW, k2).unwrap();
        assert!(
            t.remote(k1, mr.addr(), 1, Access::REMOTE_WRITE).is_err(),
            "superseded key"
        );
        t.invalidate(k2, KeyScope::Domain).unwrap();
        assert!(
            t.remote(k2, mr.addr(), 1, Access::REMOTE_WRITE).is_err(),
            "retired key"
        );
        assert!(t.invalidate(k2, KeyScope::Domain).is_err(), "twice");
        assert!(
            t.invalidate(mr.rkey(), KeyScope::Domain).is_err(),
            "regions are not invalidated remotely"
        );
        // Bindings must stay inside the region and use the slot's own index.
        assert!(t
            .bind(&slot, &mr, mr.addr() + 1, 8192, RW, inc_rkey(k2))
            .is_err());
        assert!(t.bind(&slot, &mr, mr.addr(), 1, RW, mr.rkey()).is_err());
    }

    #[test]
    fn rebinding_over_the_same_region_takes_no_new_reference() {
        let t = MrTable::new();
        let mr = t.register_buf(MemBuf::zeroed(8192), RW);
        let other = t.register_buf(MemBuf::zeroed(4096), RW);
        let slot = t.alloc_fast_mr(KeyScope::Connection);
        let refs = |m: &Mr| Arc::strong_count(m.backing());
        let (base, other_base) = (refs(&mr), refs(&other));
        let mut k = slot.rkey();
        for _ in 0..3 {
            k = inc_rkey(k);
            t.bind(&slot, &mr, mr.addr(), 4096, RW, k).unwrap();
            assert_eq!(refs(&mr), base + 1, "one reference, held by the slot");
            assert!(t.remote(k, mr.addr(), 1, Access::REMOTE_WRITE).is_ok());
            t.invalidate(k, KeyScope::Domain).unwrap();
            assert!(t.remote(k, mr.addr(), 1, Access::REMOTE_WRITE).is_err());
            assert_eq!(
                t.remote_write(k, mr.addr(), &[1]),
                Err(WcStatus::RemoteAccess)
            );
            // The key is dead; the slot keeps its reference for the next binding.
            assert_eq!(refs(&mr), base + 1, "kept across the invalidation");
        }
        // Over another region: the first one's reference goes, the other's comes.
        k = inc_rkey(k);
        t.bind(&slot, &other, other.addr(), 4096, RW, k).unwrap();
        assert_eq!((refs(&mr), refs(&other)), (base, other_base + 1));
        // A freed slot holds nothing.
        drop(slot);
        assert_eq!(refs(&other), other_base);
    }

    #[test]
    fn cached_local_checks_match_the_table() {
        let t = MrTable::new();
        let mut cache = LkeyCache::default();
        let mr = t.register_buf(MemBuf::zeroed(64), Access::NONE);
        let sge = mr.sge(0, 64);
        for _ in 0..2 {
            // A miss, then a hit: same answers.
            assert!(t.local_cached(&mut cache, &sge, Access::NONE).is_ok());
            assert_eq!(
                t.local_cached(&mut cache, &sge, Access::LOCAL_WRITE)
                    .map(|_| ()),
                Err(WcStatus::LocalProtection),
                "rights are checked on a hit"
            );
            let mut long = sge;
            long.len = 65;
            assert_eq!(
                t.local_cached(&mut cache, &long, Access::NONE).map(|_| ()),
                Err(WcStatus::LocalProtection),
                "bounds are checked on a hit"
            );
        }
        // A dropped region's key stops matching at once, even when its index is reused.
        let (key, addr) = (sge.lkey, sge.addr);
        drop(mr);
        let again = t.register_buf(MemBuf::zeroed(64), Access::NONE);
        assert_eq!(again.lkey() >> 8, key >> 8, "index is reused");
        let stale = Sge {
            addr,
            len: 1,
            lkey: key,
        };
        assert_eq!(
            t.local_cached(&mut cache, &stale, Access::NONE).map(|_| ()),
            Err(WcStatus::LocalProtection)
        );
        assert!(t
            .local_cached(&mut cache, &again.sge(0, 64), Access::NONE)
            .is_ok());
        // A fast-registration slot is never a local key.
        let slot = t.alloc_fast_mr(KeyScope::Connection);
        let k = inc_rkey(slot.rkey());
        t.bind(&slot, &again, again.addr(), 64, RW, k).unwrap();
        let via_slot = Sge {
            addr: again.addr(),
            len: 1,
            lkey: k,
        };
        assert!(t.local_cached(&mut cache, &via_slot, Access::NONE).is_err());
    }

    #[test]
    fn foreign_registrations_are_refused() {
        let (a, b) = (MrTable::new(), MrTable::new());
        let mr = b.register_buf(MemBuf::zeroed(64), RW);
        let slot = a.alloc_fast_mr(KeyScope::Connection);
        assert!(!a.owns(&mr));
        let k = inc_rkey(slot.rkey());
        assert_eq!(
            a.bind(&slot, &mr, mr.addr(), 64, RW, k),
            Err(WcStatus::LocalQpOperation)
        );
    }

    #[test]
    fn memref_gather_concatenates() {
        let t = MrTable::new();
        let src = t.register_buf(MemBuf::zeroed(64), RW);
        let dst = t.register_buf(MemBuf::zeroed(64), RW);
        src.write_at(0, b"hello world");
        let a = t.local(&src.sge(0, 5), Access::NONE).unwrap();
        let b = t.local(&src.sge(5, 6), Access::NONE).unwrap();
        let d = t
            .remote(dst.rkey(), dst.addr() + 10, 11, Access::REMOTE_WRITE)
            .unwrap();
        d.gather_from(&[a, b]);
        let mut out = [0u8; 11];
        dst.read_at(10, &mut out);
        assert_eq!(&out, b"hello world");
    }
}
