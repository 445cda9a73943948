//! A domain's registrations on every device of its fabric, and the keys a connection
//! uses in their place (`docs/ARCHITECTURE.md`, "Several RDMA devices" and "Devices that
//! come and go").
//!
//! A [`crate::fabric::Mr`] carries one lkey, its id here, and the layers above put it in
//! their SGEs whatever the connection. Until the fabric's devices change, the id is the
//! registration's lkey on device 0, so connections on device 0 translate nothing. A
//! connection on another device swaps each SGE's id for the registration's key on its
//! device as it posts, from a cache of its own ([`LkeyCache`]) filled from the domain's
//! [`KeyMap`]. Once a device has been removed or added, ids are the map's own and every
//! connection translates. Each change bumps the map's generation, so no cache keeps a
//! key or a region that has gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::sys::{MemRegion, Pd};
use crate::fabric::mem::Backing;
use crate::fabric::SetupCause;
use crate::sync::lock;

/// One registration: its memory and rights, and its region on each device.
struct Entry {
    backing: Arc<Backing>,
    access: u32,
    /// By device index; `None` where the device is absent.
    per: Box<[Option<Arc<MemRegion>>]>,
    /// The rkey on each device (0 where absent), shared with the `Mr`.
    rkeys: Arc<[AtomicU32]>,
}

/// A domain's registrations, by id.
pub(super) struct KeyMap {
    by_id: Mutex<HashMap<u32, Entry>>,
    /// Device slots of the fabric (the length of each registration's tables).
    slots: usize,
    /// Bumped whenever a registration goes or a device's keys change.
    generation: AtomicU64,
    /// The fabric's devices have changed: ids are the map's own, every connection
    /// translates.
    translate_all: AtomicBool,
    next_id: AtomicU32,
}

/// A registration made: the id, the rkey on the first device it is on, the rkeys of
/// every device, and the handle that removes it when dropped.
pub(super) struct Made {
    pub id: u32,
    pub rkey: u32,
    pub rkeys: Arc<[AtomicU32]>,
    pub handle: Regions,
}

impl KeyMap {
    pub fn new(slots: usize) -> KeyMap {
        KeyMap {
            by_id: Mutex::new(HashMap::new()),
            slots,
            generation: AtomicU64::new(0),
            translate_all: AtomicBool::new(false),
            next_id: AtomicU32::new(1),
        }
    }

    /// Registers `backing` on each device with a protection domain in `pds` (by device
    /// index). The caller holds the fabric's device lock, so no device comes or goes
    /// meanwhile.
    pub fn register(
        self: &Arc<Self>,
        pds: &[Option<Arc<Pd>>],
        backing: Arc<Backing>,
        access: u32,
    ) -> Result<Made, Box<SetupCause>> {
        let mut per: Box<[Option<Arc<MemRegion>>]> = (0..self.slots).map(|_| None).collect();
        for (i, pd) in pds.iter().enumerate().take(self.slots) {
            let Some(pd) = pd else { continue };
            let region = MemRegion::register(pd, backing.clone(), access)
                .map_err(|e| e.on(pd.device().name()))?;
            per[i] = Some(Arc::new(region));
        }
        let Some(first) = per.iter().flatten().next().cloned() else {
            return Err(SetupCause::refused("no RDMA device is present"));
        };
        let rkeys: Arc<[AtomicU32]> = per
            .iter()
            .map(|r| AtomicU32::new(r.as_ref().map_or(0, |r| r.rkey())))
            .collect();
        let mut map = lock(&self.by_id);
        let id = match &per[0] {
            Some(r) if !self.translate_all.load(Ordering::Acquire) => r.lkey(),
            _ => loop {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed).max(1);
                if !map.contains_key(&id) {
                    break id;
                }
            },
        };
        map.insert(
            id,
            Entry {
                backing,
                access,
                per,
                rkeys: rkeys.clone(),
            },
        );
        Ok(Made {
            id,
            rkey: first.rkey(),
            rkeys,
            handle: Regions {
                id,
                map: self.clone(),
            },
        })
    }

    /// Device `index` has gone: every registration lets its region there go.
    pub fn drop_device(&self, index: u8) {
        let gone: Vec<Arc<MemRegion>> = {
            let mut map = lock(&self.by_id);
            self.translate_all.store(true, Ordering::Release);
            map.values_mut()
                .filter_map(|e| {
                    e.rkeys[usize::from(index)].store(0, Ordering::Relaxed);
                    e.per[usize::from(index)].take()
                })
                .collect()
        };
        self.generation.fetch_add(1, Ordering::AcqRel);
        // Deregistered outside the lock (a region a window still holds goes later).
        drop(gone);
    }

    /// Device `index` has come (with `pd`): every registration is made there too. The
    /// registrations that fail are named in the result; their connections on the
    /// device fail their posts as with a key the device does not know.
    pub fn add_device(&self, index: u8, pd: &Arc<Pd>) -> Vec<String> {
        let mut failed = Vec::new();
        {
            let mut map = lock(&self.by_id);
            self.translate_all.store(true, Ordering::Release);
            for (id, e) in map.iter_mut() {
                match MemRegion::register(pd, e.backing.clone(), e.access) {
                    Ok(r) => {
                        e.rkeys[usize::from(index)].store(r.rkey(), Ordering::Relaxed);
                        e.per[usize::from(index)] = Some(Arc::new(r));
                    }
                    Err(err) => failed.push(format!("registration {id:#x}: {err}")),
                }
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        failed
    }

    fn remove(&self, id: u32) {
        let gone = lock(&self.by_id).remove(&id);
        self.generation.fetch_add(1, Ordering::AcqRel);
        drop(gone);
    }

    /// The key and region on device `index` of registration `id`.
    fn find(&self, id: u32, index: u8) -> Option<(u32, Arc<MemRegion>)> {
        let map = lock(&self.by_id);
        let r = map.get(&id)?.per.get(usize::from(index))?.as_ref()?;
        Some((r.lkey(), r.clone()))
    }
}

/// The backend state of a verbs [`crate::fabric::Mr`]: its entry in its domain's map,
/// removed (every device's region deregistered) when the `Mr` goes.
pub(super) struct Regions {
    id: u32,
    map: Arc<KeyMap>,
}

impl Regions {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn is_of(&self, map: &Arc<KeyMap>) -> bool {
        Arc::ptr_eq(&self.map, map)
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        self.map.remove(self.id);
    }
}

/// One connection's keys and regions on its device, learnt from its domain's
/// [`KeyMap`]. Learning (`learn`) takes `&mut`; looking up (`lkey`, `region`) does not,
/// so a post learns what its requests name first and then reads while it builds them.
pub(super) struct LkeyCache {
    index: u8,
    map: Arc<KeyMap>,
    /// Whether the post being built translates ([`LkeyCache::prepare`]): one answer for
    /// all its requests, even if the devices change meanwhile.
    translating: bool,
    known: Learnt<(u32, Arc<MemRegion>)>,
}

impl LkeyCache {
    /// For a connection on device `index` of the domain whose registrations `map` holds.
    pub fn new(index: u8, map: Arc<KeyMap>) -> LkeyCache {
        LkeyCache {
            index,
            known: Learnt::new(map.generation.load(Ordering::Acquire)),
            translating: true,
            map,
        }
    }

    /// Starts a post: whether its SGE keys are translated (a connection on device 0 of a
    /// fabric whose devices never changed uses the ids as they are), which the post's
    /// lookups then keep to; and forgets what was learnt if the map has changed since.
    /// The map's generation is looked at here only, once per post: a change while the
    /// post learns its ids must not make it forget the ones it learnt first.
    pub fn prepare(&mut self) -> bool {
        self.known
            .begin(self.map.generation.load(Ordering::Acquire));
        self.translating = self.index != 0 || self.map.translate_all.load(Ordering::Acquire);
        self.translating
    }

    /// Whether registrations of `map` are the ones this cache knows.
    pub fn is_of(&self, map: &Arc<KeyMap>) -> bool {
        Arc::ptr_eq(&self.map, map)
    }

    /// Learns registration `id` on this device, if the domain has it there (after
    /// [`LkeyCache::prepare`]). A region learnt stays registered while the cache holds
    /// it, so a post may still use one its registration let go of meanwhile.
    pub fn learn(&mut self, id: u32) {
        let (map, index) = (&self.map, self.index);
        self.known.learn(id, || map.find(id, index));
    }

    /// The key on this device of the registration `id` names; `None` when it is not
    /// one learnt (the post is refused, as a device refuses a key it does not know).
    pub fn lkey(&self, id: u32) -> Option<u32> {
        if !self.translating {
            return Some(id);
        }
        self.known.get(id).map(|k| k.0)
    }

    /// The region on this device of registration `id`, once learnt.
    pub fn region(&self, id: u32) -> Option<&Arc<MemRegion>> {
        self.known.get(id).map(|k| &k.1)
    }
}

/// What a connection learnt of its domain's registrations, by id, as of one generation
/// of the map: forgotten when a post begins after the map changed, never while one is
/// being built.
struct Learnt<V> {
    generation: u64,
    by_id: HashMap<u32, V>,
}

impl<V> Learnt<V> {
    fn new(generation: u64) -> Learnt<V> {
        Learnt {
            generation,
            by_id: HashMap::new(),
        }
    }

    /// A post begins with the map at `generation`.
    fn begin(&mut self, generation: u64) {
        if generation != self.generation {
            self.by_id.clear();
            self.generation = generation;
        }
    }

    /// Learns `id` from `find` unless it is known.
    fn learn(&mut self, id: u32, find: impl FnOnce() -> Option<V>) {
        if self.by_id.contains_key(&id) {
            return;
        }
        if let Some(v) = find() {
            self.by_id.insert(id, v);
        }
    }

    fn get(&self, id: u32) -> Option<&V> {
        self.by_id.get(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::Learnt;
    use std::cell::Cell;

    /// The race a device removal exposed: the map changes (another thread lets a device
    /// or a registration go) while a post learns its ids, here inside the first lookup.
    /// The post must still find every id it learnt, and the next post learns afresh.
    #[test]
    fn a_change_while_a_post_learns_forgets_nothing_of_that_post() {
        let map_gen = Cell::new(7);
        let mut known = Learnt::new(map_gen.get());
        known.begin(map_gen.get());
        known.learn(1, || {
            map_gen.set(map_gen.get() + 1);
            Some("a@7")
        });
        known.learn(2, || Some("b@8"));
        assert_eq!((known.get(1), known.get(2)), (Some(&"a@7"), Some(&"b@8")));

        // The next post begins at the new generation: everything is learnt again.
        known.begin(map_gen.get());
        assert_eq!(known.get(1), None);
        known.learn(1, || Some("a@8"));
        assert_eq!(known.get(1), Some(&"a@8"));
        // An unchanged map keeps what was learnt, and an id the map lacks stays unknown.
        known.begin(map_gen.get());
        known.learn(1, || panic!("a known id is not looked up again"));
        known.learn(3, || None);
        assert_eq!((known.get(1), known.get(3)), (Some(&"a@8"), None));
    }
}
