//! The registration table of a software fabric: what a NIC's memory protection table
//! (MPT) does, in software. One table is one protection domain.
//!
//! A key is `index << 8 | key byte`, as on real hardware: the index names an entry, the
//! low byte is that entry's current key. Indices are handed out in no predictable order
//! and every key byte is random (a region's at registration, a slot's at each binding,
//! chosen by the caller with [`crate::fabric::next_rkey`]), so a key cannot be guessed
//! from another one. Index 0 is never used, so rkey 0 is never valid.
//!
//! # No lock and no shared count on the IO path
//! Entries live in segments that are allocated once and never move or go before the
//! table, so a key's entry is found without a lock. Each entry is a seqlock: its writer
//! (the thread registering or retiring it under the table's control lock, or, for a
//! fast-registration slot, the connection binding or invalidating it) makes the sequence
//! odd, writes, and makes it even again; a reader copies the fields and keeps the copy
//! only if the sequence was even and unchanged around it. A remote access is such a
//! read by the thread that received the operation, and a binding or invalidation is one
//! uncontended update of the slot's own entry, made with plain stores by the connection
//! that owns the slot ([`Entry::write`]).
//!
//! Memory is kept alive by leases ([`Leases`]): each queue pair holds, per registration
//! it has used recently, one handle ([`Keep`]) on that registration's memory, taken under
//! the control lock the first time (a miss) and reused after (a hit compares the
//! registration's index and generation). A [`MemRef`] clones its queue pair's own handle,
//! never a count another core writes. A registration dropped while a lease holds it
//! stops matching at once (its generation moves on); its memory goes when the last lease
//! lets go. See `docs/ARCHITECTURE.md`, "The registration table".

use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::fabric::mem::{Backing, Owner};
use crate::fabric::{Access, FastMr, KeyScope, MemBuf, Mr, Sge, WcStatus};
use crate::sync::{lock, membarrier};

/// A checked range of registered memory, valid while the `MemRef` lives.
#[derive(Clone)]
pub struct MemRef {
    ptr: *mut u8,
    len: usize,
    keep: Arc<Keep>,
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

/// One queue pair's handle on a registration's memory (see the module doc): cloned per
/// operation by that queue pair alone.
#[derive(Debug)]
pub struct Keep {
    /// Held, never read: the memory stays while a handle does.
    _memory: Arc<Backing>,
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

    /// Whether `other` keeps the same memory alive through the same handle as this one
    /// (so that holding either keeps both ranges valid).
    pub fn shares_backing(&self, other: &MemRef) -> bool {
        Arc::ptr_eq(&self.keep, &other.keep)
    }

    /// The first `len` bytes, consuming this reference (`len` ≤ this range).
    ///
    /// # Panics
    /// When `len` exceeds the range.
    #[inline(always)]
    pub fn truncate(self, len: usize) -> MemRef {
        assert!(len <= self.len, "prefix {len} of a {}-byte range", self.len);
        // Rebuilt field by field: a length stored into the old value and the value then
        // copied whole stalled the copy (docs/BENCHMARKS.md, "Small values returned
        // through memory").
        let MemRef { ptr, keep, .. } = self;
        MemRef { ptr, len, keep }
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
    #[cfg(test)]
    pub fn read_into(&self, out: &mut [u8]) {
        assert_eq!(out.len(), self.len);
        // SAFETY: as in write_at.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr, out.as_mut_ptr(), self.len) }
    }

    /// Fills the first `len` bytes of this range with the concatenation of `sources`
    /// (their total length must be `len`).
    ///
    /// # Panics
    /// When `len` exceeds the range, or the sources' total length is not `len`.
    pub fn gather_prefix(&self, len: usize, sources: &[MemRef]) {
        assert!(len <= self.len, "prefix {len} of a {}-byte range", self.len);
        // SAFETY: `[ptr, ptr + len)` lies in the checked registered memory kept alive by
        // `keep` (asserted above).
        unsafe { gather(self.ptr, len, sources) }
    }
}

/// Writes the concatenation of `sources` (their total length must be `len`) to
/// `[dst, dst + len)`.
///
/// # Panics
/// When the lengths differ.
///
/// # Safety
/// `[dst, dst + len)` is registered memory, valid for writes and kept allocated for the
/// call (by a [`MemRef`] or a lease of the caller's).
unsafe fn gather(dst: *mut u8, len: usize, sources: &[MemRef]) {
    if let [s] = sources {
        // The common case, one source: no sum, one copy.
        assert_eq!(s.len, len, "gather of {} bytes into {len}", s.len);
        // SAFETY: as below, with `s.len == len`.
        unsafe { std::ptr::copy(s.ptr, dst, len) }
        return;
    }
    let total: usize = sources.iter().map(|s| s.len).sum();
    assert_eq!(total, len, "gather of {total} bytes into {len}");
    let mut at = 0;
    for s in sources {
        // SAFETY: the sources are checked registered memory kept alive by their handles,
        // the destination is the caller's; `at + s.len <= len` by the sum above. Source
        // and destination may be the same memory only if the user aims an operation at
        // its own source, which `copy` (memmove) tolerates.
        unsafe { std::ptr::copy(s.ptr, dst.add(at), s.len) }
        at += s.len;
    }
}

/// Entries per segment, and segments per table: at most 2^20 - 1 entries (a NIC's
/// `max_mr`), allocated a segment at a time as they are needed.
const SEG_BITS: u32 = 10;
const SEG_LEN: usize = 1 << SEG_BITS;
const MAX_SEGS: usize = 1 << 10;
/// The most entries a table holds.
pub const MAX_ENTRIES: usize = SEG_LEN * MAX_SEGS - 1;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Free,
    Region,
    Slot,
}

/// `Entry::meta`: key byte, kind, valid flag, scope and access bits.
const META_VALID: u32 = 1 << 10;
const META_CONNECTION: u32 = 1 << 11;
const META_ACCESS_SHIFT: u32 = 12;

fn meta(key: u8, kind: Kind, valid: bool, scope: KeyScope, access: Access) -> u32 {
    let kind = match kind {
        Kind::Free => 0,
        Kind::Region => 1,
        Kind::Slot => 2,
    };
    u32::from(key)
        | kind << 8
        | if valid { META_VALID } else { 0 }
        | if scope == KeyScope::Connection {
            META_CONNECTION
        } else {
            0
        }
        | (access.bits() & 0xf) << META_ACCESS_SHIFT
}

/// One entry: read as a whole ([`Entry::read`]) or not at all. Alone on its cache line:
/// entries of slots bound by different cores sit side by side.
#[derive(Default)]
#[repr(align(64))]
struct Entry {
    /// Even when stable, odd while its writer changes it.
    seq: AtomicU32,
    /// Who writes the entry, and how ([`Entry::write`]): [`UNCLAIMED`], a queue pair's
    /// number (the entry is biased to it), [`LOCKED`] or [`SHARED`].
    writer: AtomicU32,
    /// Set by the queue pair the entry is biased to around each of its writes.
    busy: AtomicBool,
    /// Owners the entry had since its allocation after the first ([`MAX_MOVES`]);
    /// written under [`LOCKED`].
    moves: AtomicU8,
    meta: AtomicU32,
    /// A region's registration generation (moves on at every registration and
    /// retirement of the index); for a bound slot, the generation of the region it is
    /// bound over.
    gen: AtomicU32,
    /// A bound slot: the index of the region it is bound over.
    region: AtomicU32,
    /// A bound `Connection` slot: the queue pair that bound it.
    qp: AtomicU32,
    base: AtomicU64,
    len: AtomicU64,
}

/// An entry's fields, as one consistent copy.
#[derive(Clone, Copy, Debug)]
struct View {
    key: u8,
    kind: Kind,
    valid: bool,
    scope: KeyScope,
    access: Access,
    gen: u32,
    region: u32,
    qp: u32,
    base: u64,
    len: u64,
}

impl View {
    fn from_meta(m: u32) -> (u8, Kind, bool, KeyScope, Access) {
        let kind = match (m >> 8) & 3 {
            1 => Kind::Region,
            2 => Kind::Slot,
            _ => Kind::Free,
        };
        let scope = if m & META_CONNECTION != 0 {
            KeyScope::Connection
        } else {
            KeyScope::Domain
        };
        (
            m as u8,
            kind,
            m & META_VALID != 0,
            scope,
            Access::from_bits((m >> META_ACCESS_SHIFT) & 0xf),
        )
    }

    /// Whether `[addr, addr+len)` lies inside the entry's range.
    fn holds(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len)
            .is_some_and(|end| addr >= self.base && end <= self.base + self.len)
    }
}

/// How many times a reader retries an entry its writer is changing before giving up
/// (a writer never waits for anything while the sequence is odd).
const READ_TRIES: usize = 64;

impl Entry {
    fn read(&self) -> Option<View> {
        for _ in 0..READ_TRIES {
            let s1 = self.seq.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let m = self.meta.load(Ordering::Relaxed);
                let gen = self.gen.load(Ordering::Relaxed);
                let region = self.region.load(Ordering::Relaxed);
                let qp = self.qp.load(Ordering::Relaxed);
                let base = self.base.load(Ordering::Relaxed);
                let len = self.len.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == s1 {
                    let (key, kind, valid, scope, access) = View::from_meta(m);
                    return Some(View {
                        key,
                        kind,
                        valid,
                        scope,
                        access,
                        gen,
                        region,
                        qp,
                        base,
                        len,
                    });
                }
            }
            std::hint::spin_loop();
        }
        None
    }

    /// Writes `v` as the entry's new state on behalf of `by`; false when another writer
    /// holds the entry (two threads binding one slot at once, which the contract
    /// forbids; a [`By::Control`] writer waits instead).
    ///
    /// The first queue pair to write a fresh entry claims it, and from then on writes it
    /// with no locked instruction: it raises `busy`, issues the light side of
    /// [`membarrier`], checks that the entry is still its own, and writes. Any other
    /// writer takes the entry away ([`Entry::lock`]: the heavy side, then a wait for the
    /// owner's write in flight) and writes it under [`LOCKED`]. A queue pair that takes
    /// it becomes its owner once ([`MAX_MOVES`]: a slot bound first on the service
    /// connection, then by the connection its IO runs on); after that the entry is
    /// [`SHARED`], each writer taking [`LOCKED`] in turn, until a new allocation. A
    /// slot's binder is nearly always one connection, so a binding or an invalidation
    /// costs no atomic read-modify-write; a slot used from several connections pays at
    /// most two system calls per allocation (`docs/ARCHITECTURE.md`, "The registration
    /// table").
    // Always inlined, as are the two below: a view built by the caller and read back
    // here from memory stalled the read (docs/BENCHMARKS.md, "Small values returned
    // through memory").
    #[inline(always)]
    fn write(&self, v: &View, by: By) -> bool {
        // A number that is one of the states (never a queue pair's) can own nothing.
        let owner = by.filter_owner();
        if let By::Qp(qp) = owner {
            let w = self.writer.load(Ordering::Relaxed);
            let mine = w == qp
                || (w == UNCLAIMED
                    && self
                        .writer
                        .compare_exchange(UNCLAIMED, qp, Ordering::Acquire, Ordering::Relaxed)
                        .is_ok());
            if mine && self.write_biased(v, qp) {
                return true;
            }
        }
        let Some(was) = self.lock(matches!(by, By::Control)) else {
            return false;
        };
        self.store(v);
        let moves = self.moves.load(Ordering::Relaxed);
        let next = match owner {
            By::Qp(qp) if is_owner(was) && moves < MAX_MOVES => {
                self.moves.store(moves + 1, Ordering::Relaxed);
                qp
            }
            _ => SHARED,
        };
        self.writer.store(next, Ordering::Release);
        true
    }

    /// The owner's write (see [`Entry::write`]); false when the entry was taken away.
    #[inline(always)]
    fn write_biased(&self, v: &View, qp: u32) -> bool {
        self.busy.store(true, Ordering::Relaxed);
        membarrier::light();
        if self.writer.load(Ordering::Relaxed) != qp {
            self.busy.store(false, Ordering::Release);
            return false;
        }
        self.store(v);
        self.busy.store(false, Ordering::Release);
        true
    }

    /// Takes the entry for a writer other than its owner: [`LOCKED`], from any other
    /// state; from a queue pair's, once that queue pair can no longer start a write and
    /// has finished the one it was making. The state it was in; `None` when another
    /// writer holds it and `wait` is not set.
    #[cold]
    fn lock(&self, wait: bool) -> Option<u32> {
        loop {
            let w = self.writer.load(Ordering::Relaxed);
            if w == LOCKED {
                if !wait {
                    return None;
                }
                std::hint::spin_loop();
                continue;
            }
            if self
                .writer
                .compare_exchange_weak(w, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                continue;
            }
            if is_owner(w) {
                // The owner either sees LOCKED at its check, or raised `busy` where the
                // barrier makes it visible here; it never waits while `busy` is up.
                membarrier::heavy();
                while self.busy.load(Ordering::Acquire) {
                    std::hint::spin_loop();
                }
            }
            return Some(w);
        }
    }

    /// Writes the fields as a seqlock's writer (the caller is the entry's one writer).
    #[inline(always)]
    fn store(&self, v: &View) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.meta.store(
            meta(v.key, v.kind, v.valid, v.scope, v.access),
            Ordering::Relaxed,
        );
        self.gen.store(v.gen, Ordering::Relaxed);
        self.region.store(v.region, Ordering::Relaxed);
        self.qp.store(v.qp, Ordering::Relaxed);
        self.base.store(v.base, Ordering::Relaxed);
        self.len.store(v.len, Ordering::Relaxed);
        self.seq.store(s.wrapping_add(2), Ordering::Release);
    }

    /// A new allocation's first write (under the control lock): the entry becomes
    /// claimable by the first queue pair that writes it.
    fn write_fresh(&self, v: &View) {
        self.lock(true);
        self.store(v);
        self.moves.store(0, Ordering::Relaxed);
        self.writer.store(UNCLAIMED, Ordering::Release);
    }
}

/// [`Entry::writer`]: no writer yet (a queue pair's first write claims the entry).
const UNCLAIMED: u32 = 0;
/// [`Entry::writer`]: a writer other than the owner holds the entry.
const LOCKED: u32 = u32::MAX;
/// [`Entry::writer`]: no owner; writers take [`LOCKED`] in turn. Queue-pair numbers are
/// 24 bits and never 0, so no queue pair has these values.
const SHARED: u32 = u32::MAX - 1;
/// How many times a queue pair may take an entry from another and own it in turn.
const MAX_MOVES: u8 = 1;

/// Whether `writer` names a queue pair that owns the entry.
fn is_owner(writer: u32) -> bool {
    !matches!(writer, UNCLAIMED | LOCKED | SHARED)
}

/// Who writes an entry.
#[derive(Clone, Copy, Debug)]
enum By {
    /// The queue pair of this number, executing a binding or an invalidation.
    Qp(u32),
    /// The table's control path (registration, retirement), under the control lock.
    Control,
}

impl By {
    /// `self`, or [`By::Control`] for a queue-pair number that could not own an entry
    /// (one of the states' values).
    #[inline(always)]
    fn filter_owner(self) -> By {
        match self {
            By::Qp(qp) if !is_owner(qp) => By::Control,
            by => by,
        }
    }
}

struct Segment {
    entries: Box<[Entry]>,
}

/// What the control lock guards: allocation and the memory of live registrations.
struct Ctl {
    /// Free indices; a new one is taken at random among them.
    free: Vec<u32>,
    /// Segments allocated so far.
    segs: usize,
    /// Each live region's memory, by index, for the lease a queue pair takes on a miss.
    memory: Vec<Option<Arc<Backing>>>,
    rng: u64,
}

/// What the protection domains of one software device share: its identity (shared
/// completion queues take the connections of any of its domains) and its queue-pair
/// numbers (unique per device, as a CQ routes completions by them).
#[derive(Debug)]
struct Device {
    id: u64,
    qp_nums: AtomicU32,
}

/// A protection domain's registrations.
pub struct MrTable {
    /// `MAX_SEGS` segment pointers, null until allocated (under `ctl`); a segment is
    /// freed only with the table.
    segs: Box<[AtomicPtr<Segment>]>,
    ctl: Mutex<Ctl>,
    /// Identifies the table in queue pairs' leases (never reused in a process).
    id: u64,
    device: Arc<Device>,
}

impl std::fmt::Debug for MrTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MrTable#{} (device {})", self.id, self.device.id)
    }
}

impl Drop for MrTable {
    fn drop(&mut self) {
        for p in self.segs.iter() {
            let seg = p.load(Ordering::Acquire);
            if !seg.is_null() {
                // SAFETY: a non-null pointer came from Box::into_raw in `grow` and is
                // released once, here, when no reader can exist any more (`&mut self`).
                drop(unsafe { Box::from_raw(seg) });
            }
        }
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
        self.table.retire(self.index);
    }
}

/// A domain's table holds [`MAX_ENTRIES`] registrations and slots already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableFull;

impl std::fmt::Display for TableFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the protection domain's registration table is full ({MAX_ENTRIES} registrations \
             and fast-registration slots)"
        )
    }
}

/// The largest registration a software fabric accepts (a NIC's `max_mr_size`).
pub const MAX_MR_SIZE: u64 = 1 << 40;

/// A random 64-bit value from the operating system (a seed).
pub(crate) fn seed() -> u64 {
    let mut b = [0u8; 8];
    // Without entropy the keys are only less surprising, never wrong.
    if getrandom::fill(&mut b).is_err() {
        return 0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64;
    }
    u64::from_le_bytes(b) | 1
}

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// A key byte other than `not`, at random (thread-local generator, seeded from the
/// operating system).
pub(crate) fn random_key_byte(not: u8) -> u8 {
    thread_local! {
        static RNG: std::cell::Cell<u64> = std::cell::Cell::new(seed());
    }
    RNG.with(|r| {
        let mut x = r.get();
        let b = loop {
            let b = (xorshift(&mut x) >> 24) as u8;
            if b != not {
                break b;
            }
        };
        r.set(x);
        b
    })
}

impl MrTable {
    /// The first protection domain of a new device.
    pub fn new() -> Arc<MrTable> {
        static DEVICES: AtomicU64 = AtomicU64::new(1);
        let device = Device {
            id: DEVICES.fetch_add(1, Ordering::Relaxed),
            qp_nums: AtomicU32::new(0),
        };
        MrTable::on(Arc::new(device))
    }

    fn on(device: Arc<Device>) -> Arc<MrTable> {
        static IDS: AtomicU64 = AtomicU64::new(1);
        Arc::new(MrTable {
            segs: (0..MAX_SEGS)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
            ctl: Mutex::new(Ctl {
                free: Vec::new(),
                segs: 0,
                memory: Vec::new(),
                rng: seed(),
            }),
            id: IDS.fetch_add(1, Ordering::Relaxed),
            device,
        })
    }

    /// Another protection domain of the same device: no key of one is valid in the
    /// other, and their connections may share the device's completion queues.
    pub fn domain(&self) -> Arc<MrTable> {
        MrTable::on(self.device.clone())
    }

    /// Whether `other` is a domain of the same device.
    pub fn same_device(&self, other: &MrTable) -> bool {
        Arc::ptr_eq(&self.device, &other.device)
    }

    /// A fresh queue-pair number of this device: 24 bits as on verbs, never 0, reused
    /// only after 2^24 - 1 newer ones. Numbered per device, a run on a fresh fabric
    /// numbers its connections the same way every time.
    pub fn next_qp_num(&self) -> u32 {
        loop {
            let n = self
                .device
                .qp_nums
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_add(1)
                & 0x00ff_ffff;
            if n != 0 {
                return n;
            }
        }
    }

    fn entry(&self, index: u32) -> Option<&Entry> {
        let (seg, at) = (index as usize >> SEG_BITS, index as usize & (SEG_LEN - 1));
        let p = self.segs.get(seg)?.load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-null segment pointer stays valid for the table's life (freed only
        // in Drop), and `at < SEG_LEN` entries.
        Some(unsafe { &(*p).entries[at] })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ctl> {
        lock(&self.ctl)
    }

    /// Takes a free index at random, allocating a segment when none is left.
    fn take_index(&self, ctl: &mut Ctl) -> Option<u32> {
        if ctl.free.is_empty() {
            if ctl.segs == MAX_SEGS {
                return None;
            }
            let seg = Box::new(Segment {
                entries: (0..SEG_LEN).map(|_| Entry::default()).collect(),
            });
            self.segs[ctl.segs].store(Box::into_raw(seg), Ordering::Release);
            let first = (ctl.segs * SEG_LEN) as u32;
            // Index 0 is a permanent hole: key 0 never names anything.
            ctl.free
                .extend((first..first + SEG_LEN as u32).filter(|&i| i != 0));
            ctl.memory.resize_with((ctl.segs + 1) * SEG_LEN, || None);
            ctl.segs += 1;
        }
        let at = (xorshift(&mut ctl.rng) % ctl.free.len() as u64) as usize;
        Some(ctl.free.swap_remove(at))
    }

    /// Fills a fresh entry with `v` (its generation moved on); `memory` for a region.
    /// `None` when the table is full.
    fn alloc(&self, mut v: View, memory: Option<Arc<Backing>>) -> Option<(u32, u32)> {
        let mut ctl = self.lock();
        let index = self.take_index(&mut ctl)?;
        let e = self.entry(index)?;
        let old = e.read().map_or(0, |o| o.gen);
        v.gen = old.wrapping_add(1);
        v.key = random_key_byte(0);
        e.write_fresh(&v);
        ctl.memory[index as usize] = memory;
        Some((index, index << 8 | u32::from(v.key)))
    }

    /// Retires entry `index` (its registration is dropped): no key of it matches from
    /// now on; leases still holding its memory keep it until they go.
    fn retire(&self, index: u32) {
        let mut ctl = self.lock();
        let Some(e) = self.entry(index) else {
            return;
        };
        let gen = e.read().map_or(0, |o| o.gen).wrapping_add(1);
        let free = View {
            key: 0,
            kind: Kind::Free,
            valid: false,
            scope: KeyScope::Domain,
            access: Access::NONE,
            gen,
            region: 0,
            qp: 0,
            base: 0,
            len: 0,
        };
        // A slot being bound right now by a connection (against the contract, as the
        // slot is being dropped) only delays this.
        e.write(&free, By::Control);
        ctl.memory[index as usize] = None;
        ctl.free.push(index);
    }

    /// Registers `backing` with `access`.
    ///
    /// # Errors
    /// [`TableFull`] when the domain holds [`MAX_ENTRIES`] registrations already.
    pub fn register(
        self: &Arc<Self>,
        backing: Arc<Backing>,
        access: Access,
    ) -> Result<Mr, TableFull> {
        let v = View {
            key: 0,
            kind: Kind::Region,
            valid: true,
            scope: KeyScope::Domain,
            access,
            gen: 0,
            region: 0,
            qp: 0,
            base: backing.addr() as u64,
            len: backing.len() as u64,
        };
        let (index, key) = self.alloc(v, Some(backing.clone())).ok_or(TableFull)?;
        let reg = Registration {
            table: self.clone(),
            index,
        };
        let mut mr = Mr::from_parts(key, key, access, Box::new(reg), backing);
        mr.owner = Some(self.owner(index));
        Ok(mr)
    }

    /// Registers an owned buffer.
    ///
    /// # Errors
    /// As [`MrTable::register`].
    pub fn register_buf(self: &Arc<Self>, buf: MemBuf, access: Access) -> Result<Mr, TableFull> {
        self.register(Arc::new(Backing::Owned(buf)), access)
    }

    /// A fast-registration slot of `scope`, unbound.
    ///
    /// # Errors
    /// As [`MrTable::register`].
    pub fn alloc_fast_mr(self: &Arc<Self>, scope: KeyScope) -> Result<FastMr, TableFull> {
        let v = View {
            key: 0,
            kind: Kind::Slot,
            valid: false,
            scope,
            access: Access::NONE,
            gen: 0,
            region: 0,
            qp: 0,
            base: 0,
            len: 0,
        };
        let (index, key) = self.alloc(v, None).ok_or(TableFull)?;
        let mut slot = FastMr::from_parts(
            key,
            Box::new(Registration {
                table: self.clone(),
                index,
            }),
        );
        slot.owner = Some(self.owner(index));
        Ok(slot)
    }

    /// The name entry `index` of this table gives its registration or slot.
    fn owner(&self, index: u32) -> Owner {
        Owner {
            table: std::num::NonZeroU64::new(self.id).expect("table ids start at 1"),
            index,
        }
    }

    /// The index of a registration or slot named `owner`, if this table made it.
    fn own_index(&self, owner: Option<Owner>) -> Option<u32> {
        owner.filter(|o| o.table.get() == self.id).map(|o| o.index)
    }

    /// The live region `index` of generation `gen`, if it still is one.
    fn region(&self, index: u32, gen: u32) -> Option<View> {
        let v = self.entry(index)?.read()?;
        (v.kind == Kind::Region && v.valid && v.gen == gen).then_some(v)
    }

    /// The memory of region `index` at generation `gen`, for a new lease (the miss
    /// path, under the control lock).
    fn lease_memory(&self, index: u32, gen: u32) -> Option<Arc<Backing>> {
        let ctl = self.lock();
        self.region(index, gen)?;
        ctl.memory.get(index as usize)?.clone()
    }

    /// The handle `leases` holds on region (`index`, `gen`), taking one on a miss.
    fn keep(&self, leases: &mut Leases, index: u32, gen: u32) -> Option<Arc<Keep>> {
        if let Some(k) = leases.find(self.id, index, gen) {
            return Some(k);
        }
        let memory = self.lease_memory(index, gen)?;
        Some(leases.insert(self.id, index, gen, memory))
    }

    /// Checks a local SGE as a NIC's post does: its lkey names a live region of this
    /// table granting `need`, and the range lies inside; the memory through `leases`.
    ///
    /// # Errors
    /// [`WcStatus::LocalProtection`].
    // Always inlined into its two callers (a post's sources, a receive's buffer): a
    // handle returned through memory stalled both (docs/BENCHMARKS.md, "Small values
    // returned through memory").
    #[inline(always)]
    pub fn local(&self, leases: &mut Leases, sge: &Sge, need: Access) -> Result<MemRef, WcStatus> {
        let bad = WcStatus::LocalProtection;
        let index = sge.lkey >> 8;
        let v = self.entry(index).and_then(Entry::read).ok_or(bad)?;
        if v.kind != Kind::Region
            || !v.valid
            || v.key != sge.lkey as u8
            || !v.access.contains(need)
            || !v.holds(sge.addr, u64::from(sge.len))
        {
            return Err(bad);
        }
        let keep = self.keep(leases, index, v.gen).ok_or(bad)?;
        Ok(MemRef {
            ptr: sge.addr as *mut u8,
            len: sge.len as usize,
            keep,
        })
    }

    /// [`MrTable::local`] for code outside a queue pair (`Fabric::local_memory`): the
    /// memory itself, looked up under the control lock.
    pub fn local_backing(&self, sge: &Sge, need: Access) -> Option<Arc<Backing>> {
        let index = sge.lkey >> 8;
        let v = self.entry(index)?.read()?;
        let ok = v.kind == Kind::Region
            && v.valid
            && v.key == sge.lkey as u8
            && v.access.contains(need)
            && v.holds(sge.addr, u64::from(sge.len));
        if !ok {
            return None;
        }
        self.lease_memory(index, v.gen)
    }

    /// Checks an incoming remote access as a NIC would, for an operation that arrived on
    /// queue pair `qp`: the rkey names a live region, or a slot bound over one with the
    /// same key byte (a `Connection` slot by `qp` itself), the access is granted and the
    /// range is inside. The region's identity and the start of the range.
    fn remote_check(
        &self,
        qp: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
    ) -> Result<(u32, u32), WcStatus> {
        let bad = WcStatus::RemoteAccess;
        let index = rkey >> 8;
        let v = self.entry(index).and_then(Entry::read).ok_or(bad)?;
        if !v.valid || v.key != rkey as u8 || !v.access.contains(need) || !v.holds(addr, len) {
            return Err(bad);
        }
        match v.kind {
            Kind::Region => Ok((index, v.gen)),
            Kind::Slot => {
                if v.scope == KeyScope::Connection && v.qp != qp {
                    return Err(bad);
                }
                // The region under the binding must still be the one bound over.
                self.region(v.region, v.gen).ok_or(bad)?;
                Ok((v.region, v.gen))
            }
            Kind::Free => Err(bad),
        }
    }

    /// `MrTable::remote_check`, and the range as a [`MemRef`] held through `leases`.
    ///
    /// # Errors
    /// [`WcStatus::RemoteAccess`].
    #[allow(clippy::too_many_arguments)]
    pub fn remote(
        &self,
        leases: &mut Leases,
        qp: u32,
        rkey: u32,
        addr: u64,
        len: u32,
        need: Access,
    ) -> Result<MemRef, WcStatus> {
        let (index, gen) = self.remote_check(qp, rkey, addr, len.into(), need)?;
        let keep = self
            .keep(leases, index, gen)
            .ok_or(WcStatus::RemoteAccess)?;
        Ok(MemRef {
            ptr: addr as *mut u8,
            len: len as usize,
            keep,
        })
    }

    /// [`MrTable::remote`] with `need` = remote write, and `data` copied to `addr` at
    /// once: for a payload the caller already holds whole, no [`MemRef`] is made.
    ///
    /// # Errors
    /// [`WcStatus::RemoteAccess`], nothing written.
    pub fn remote_write(
        &self,
        leases: &mut Leases,
        qp: u32,
        rkey: u32,
        addr: u64,
        data: &[u8],
    ) -> Result<(), WcStatus> {
        self.lease_for_write(leases, qp, rkey, addr, data.len() as u64)?;
        // SAFETY: `[addr, addr + data.len())` is inside the region's registered range
        // (checked by `lease_for_write`), whose memory the lease keeps allocated. `copy`
        // (memmove) tolerates a source inside the same memory, as `gather` does.
        unsafe { std::ptr::copy(data.as_ptr(), addr as *mut u8, data.len()) };
        Ok(())
    }

    /// [`MrTable::remote_write`] of the concatenation of `sources` (registered memory of
    /// the sender's, `len` bytes in all), copied straight from them: the loopback's
    /// one copy per operation, with no [`MemRef`] made for the destination.
    ///
    /// # Errors
    /// [`WcStatus::RemoteAccess`], nothing written.
    ///
    /// # Panics
    /// When the sources' total length is not `len`.
    pub fn remote_gather(
        &self,
        leases: &mut Leases,
        qp: u32,
        rkey: u32,
        addr: u64,
        len: u32,
        sources: &[MemRef],
    ) -> Result<(), WcStatus> {
        self.lease_for_write(leases, qp, rkey, addr, len.into())?;
        // SAFETY: as in `remote_write`: checked, and kept by the lease.
        unsafe { gather(addr as *mut u8, len as usize, sources) };
        Ok(())
    }

    /// The checks of a remote write of `len` bytes at `addr` under `rkey`, and a lease on
    /// the memory in `leases`: the lease alone keeps the memory while the caller copies
    /// (`leases` is the caller's for the call), no handle cloned and dropped per write.
    fn lease_for_write(
        &self,
        leases: &mut Leases,
        qp: u32,
        rkey: u32,
        addr: u64,
        len: u64,
    ) -> Result<(), WcStatus> {
        let (index, gen) = self.remote_check(qp, rkey, addr, len, Access::REMOTE_WRITE)?;
        if leases.holding(self.id, index, gen).is_none() {
            self.keep(leases, index, gen)
                .ok_or(WcStatus::RemoteAccess)?;
        }
        Ok(())
    }

    /// Binds `slot` to `[addr, addr+len)` of `region` under `rkey` (a REG_MR posted on
    /// queue pair `qp`): [`MrTable::check_bind`] then [`MrTable::apply_bind`], and the
    /// slot's key recorded.
    ///
    /// # Errors
    /// As those two.
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub fn bind(
        self: &Arc<Self>,
        slot: &FastMr,
        region: &Mr,
        addr: u64,
        len: u32,
        access: Access,
        rkey: u32,
        qp: u32,
    ) -> Result<(), WcStatus> {
        let b = self.check_bind(slot, region, addr, len, access, rkey)?;
        self.apply_bind(&b, qp)?;
        slot.set_rkey(rkey);
        Ok(())
    }

    /// The checks of a REG_MR that the post makes: slot and region are this table's,
    /// `rkey` is of the slot's index. What [`MrTable::apply_bind`] then does, in
    /// send-queue order.
    ///
    /// # Errors
    /// [`WcStatus::LocalQpOperation`].
    #[inline]
    pub fn check_bind(
        self: &Arc<Self>,
        slot: &FastMr,
        region: &Mr,
        addr: u64,
        len: u32,
        access: Access,
        rkey: u32,
    ) -> Result<PendingBind, WcStatus> {
        let bad = WcStatus::LocalQpOperation;
        let slot_index = self.own_index(slot.owner).ok_or(bad)?;
        let region_index = self.own_index(region.owner).ok_or(bad)?;
        if rkey >> 8 != slot_index {
            return Err(bad);
        }
        Ok(PendingBind {
            slot: slot_index,
            region: region_index,
            region_key: region.lkey() as u8,
            addr,
            len,
            access,
            rkey,
        })
    }

    /// Makes a checked binding: the slot's key becomes `b.rkey` over the range.
    ///
    /// # Errors
    /// [`WcStatus::LocalQpOperation`] when the region is gone or the range is outside it,
    /// the slot is gone or still bound (as with fast-registration MRs and type-2 memory
    /// windows on a NIC, a binding must be invalidated first), the key byte would not
    /// change, or another thread is binding the slot at the same moment.
    pub fn apply_bind(&self, b: &PendingBind, qp: u32) -> Result<(), WcStatus> {
        let bad = WcStatus::LocalQpOperation;
        let r = self.entry(b.region).and_then(Entry::read).ok_or(bad)?;
        if r.kind != Kind::Region
            || !r.valid
            || r.key != b.region_key
            || !r.holds(b.addr, u64::from(b.len))
        {
            return Err(bad);
        }
        let e = self.entry(b.slot).ok_or(bad)?;
        let cur = e.read().ok_or(bad)?;
        if cur.kind != Kind::Slot || cur.valid || cur.key == b.rkey as u8 {
            return Err(bad);
        }
        let bound = View {
            key: b.rkey as u8,
            valid: true,
            access: b.access,
            gen: r.gen,
            region: b.region,
            qp: if cur.scope == KeyScope::Connection {
                qp
            } else {
                0
            },
            base: b.addr,
            len: u64::from(b.len),
            ..cur
        };
        if e.write(&bound, By::Qp(qp)) {
            Ok(())
        } else {
            Err(bad)
        }
    }

    /// Retires `slot`'s current rkey (a LOCAL_INV executed by queue pair `qp`).
    ///
    /// # Errors
    /// `Err(())` when the slot is another table's or not bound; the caller turns it into
    /// the status its operation reports.
    #[allow(clippy::result_unit_err)]
    pub fn invalidate_slot(self: &Arc<Self>, slot: &FastMr, qp: u32) -> Result<(), ()> {
        let index = self.own_index(slot.owner).ok_or(())?;
        let rkey = slot.rkey();
        if rkey >> 8 != index {
            return Err(());
        }
        self.invalidate(rkey, qp, false)
    }

    /// Retires the rkey a peer's SEND_WITH_INV names, arriving on queue pair `qp`: only
    /// a `Connection` slot's, bound by `qp`.
    ///
    /// # Errors
    /// As [`MrTable::invalidate_slot`].
    #[allow(clippy::result_unit_err)]
    pub fn invalidate_remote(&self, rkey: u32, qp: u32) -> Result<(), ()> {
        self.invalidate(rkey, qp, true)
    }

    /// Retires a slot's current rkey, executed by queue pair `qp`: on behalf of the
    /// slot's owner (any slot) or, `remote`, of the peer on `qp` (only a `Connection`
    /// slot that `qp` bound).
    fn invalidate(&self, rkey: u32, qp: u32, remote: bool) -> Result<(), ()> {
        let e = self.entry(rkey >> 8).ok_or(())?;
        let cur = e.read().ok_or(())?;
        let allowed = !remote || (cur.scope == KeyScope::Connection && cur.qp == qp);
        if cur.kind != Kind::Slot || !cur.valid || cur.key != rkey as u8 || !allowed {
            return Err(());
        }
        // The key is dead from here on (every check wants `valid`).
        let dead = View {
            valid: false,
            ..cur
        };
        if e.write(&dead, By::Qp(qp)) {
            Ok(())
        } else {
            Err(())
        }
    }
}

/// A REG_MR checked at post and made later ([`MrTable::check_bind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingBind {
    slot: u32,
    region: u32,
    region_key: u8,
    addr: u64,
    len: u32,
    access: Access,
    /// The slot's new key.
    pub rkey: u32,
}

impl PendingBind {
    /// The address range the binding exposes, `[start, end)`.
    pub fn range(&self) -> (u64, u64) {
        (self.addr, self.addr.saturating_add(u64::from(self.len)))
    }
}

/// A queue pair's leases on the memory of the registrations it used recently (see the
/// module doc): a few ways, the oldest replaced on a miss. Only its queue pair (one
/// thread at a time) touches them.
///
/// Each lease also keeps the handles its queue pair let go of ([`Leases::recycle`]) and
/// hands them out again ([`MrTable::local`] and the others): a handle's count then moves
/// once per lease, not twice per operation, and no locked instruction waits behind a
/// copy's stores (docs/ARCHITECTURE.md, "Who writes what per IO"). The spare handles keep
/// nothing alive that the lease itself does not: they go with it.
#[derive(Debug, Default)]
pub struct Leases {
    ways: Vec<Lease>,
    next: usize,
    /// Handles made (a new lease's, or a clone of a lease's; not those taken from its
    /// spares): for tests.
    #[cfg(test)]
    pub(crate) cloned: u64,
}

#[derive(Debug)]
struct Lease {
    table: u64,
    index: u32,
    gen: u32,
    keep: Arc<Keep>,
    /// Clones of `keep` let go of by the queue pair, to be handed out again.
    spare: Vec<Arc<Keep>>,
}

/// Leases a queue pair keeps: the regions one IO touches (its header, its data, the
/// peer's chunk) with room to spare.
const LEASE_WAYS: usize = 8;

/// Spare handles a lease keeps, allocated with it and never grown (a handle given back
/// to a full lease is dropped): as many as a queue pair of the usual depths holds on one
/// registration at once (its send slots' sources and its receives).
const SPARE_MAX: usize = 128;

impl Leases {
    /// A handle on region (`index`, `gen`) of `table` if it is leased: a spare one when
    /// there is one, else a new clone of the lease's.
    #[inline]
    fn find(&mut self, table: u64, index: u32, gen: u32) -> Option<Arc<Keep>> {
        let l = self
            .ways
            .iter_mut()
            .find(|l| l.index == index && l.gen == gen && l.table == table)?;
        Some(match l.spare.pop() {
            Some(k) => k,
            None => {
                #[cfg(test)]
                {
                    self.cloned += 1;
                }
                Arc::clone(&l.keep)
            }
        })
    }

    /// The lease on region (`index`, `gen`) of `table`, if held: the memory stays
    /// allocated while it is, with no handle of its own taken.
    #[inline]
    fn holding(&self, table: u64, index: u32, gen: u32) -> Option<&Arc<Keep>> {
        self.ways
            .iter()
            .find(|l| l.index == index && l.gen == gen && l.table == table)
            .map(|l| &l.keep)
    }

    #[cold]
    fn insert(&mut self, table: u64, index: u32, gen: u32, memory: Arc<Backing>) -> Arc<Keep> {
        #[cfg(test)]
        {
            self.cloned += 1;
        }
        let keep = Arc::new(Keep { _memory: memory });
        let lease = Lease {
            table,
            index,
            gen,
            keep: keep.clone(),
            spare: Vec::with_capacity(SPARE_MAX),
        };
        if self.ways.len() < LEASE_WAYS {
            self.ways.push(lease);
        } else {
            self.ways[self.next] = lease;
            self.next = (self.next + 1) % LEASE_WAYS;
        }
        keep
    }

    /// Takes back a handle this queue pair made (through these leases) and needs no
    /// more: kept for reuse while its lease is held, dropped otherwise (a lease replaced
    /// or cleared since, or a handle of another queue pair's).
    #[inline]
    pub fn recycle(&mut self, m: MemRef) {
        if let Some(l) = self.ways.iter_mut().find(|l| Arc::ptr_eq(&l.keep, &m.keep)) {
            if l.spare.len() < SPARE_MAX {
                l.spare.push(m.keep);
            }
        }
    }

    /// [`Leases::recycle`] of every handle in `list`, which is left empty (its capacity
    /// kept).
    #[inline]
    pub fn recycle_all(&mut self, list: &mut Vec<MemRef>) {
        for m in list.drain(..) {
            self.recycle(m);
        }
    }

    /// Lets go of every lease (their memory may go once no MemRef holds it).
    pub fn clear(&mut self) {
        self.ways.clear();
        self.next = 0;
    }
}

#[cfg(test)]
mod tests;
