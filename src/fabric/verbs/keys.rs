//! A registration on every device of a fabric, and the lkeys a connection on another
//! device than the first uses in its place (`docs/ARCHITECTURE.md`, "Several RDMA
//! devices").
//!
//! A [`crate::fabric::Mr`] carries one lkey, device 0's, and the layers above put it in
//! their SGEs whatever the connection. A connection on device `d > 0` swaps each SGE's
//! key for the same registration's key on `d` as it posts: it asks the domain's
//! [`KeyMap`] once per registration and keeps the answer ([`LkeyCache`], the
//! connection's own). A registration that goes bumps the map's generation, so no cache
//! keeps a key the device may hand out again. Connections on device 0 translate
//! nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::sys::MemRegion;
use crate::sync::lock;

/// A domain's registrations: each one's lkey on every device, by its lkey on device 0.
#[derive(Default)]
pub(super) struct KeyMap {
    by_first: Mutex<HashMap<u32, Box<[u32]>>>,
    /// Bumped whenever a registration goes.
    generation: AtomicU64,
}

/// The backend state of a verbs [`crate::fabric::Mr`]: its registration on each device
/// of the fabric, by device index.
pub(super) struct Regions {
    per: Box<[Arc<MemRegion>]>,
    /// Where the lkeys are known while it lives (absent with one device).
    map: Option<Weak<KeyMap>>,
}

impl Regions {
    /// `per` holds one registration per device of the fabric, device 0 first.
    pub fn new(per: Vec<Arc<MemRegion>>, map: &Arc<KeyMap>) -> Regions {
        let map = (per.len() > 1).then(|| {
            let lkeys: Box<[u32]> = per.iter().map(|r| r.lkey()).collect();
            lock(&map.by_first).insert(lkeys[0], lkeys);
            Arc::downgrade(map)
        });
        Regions {
            per: per.into(),
            map,
        }
    }

    /// The registration on device `index` (device 0's when there is none of that index,
    /// which a post then refuses as of another protection domain).
    pub fn on(&self, index: u8) -> &Arc<MemRegion> {
        self.per.get(usize::from(index)).unwrap_or(&self.per[0])
    }

    /// The rkey on each device, by index.
    pub fn rkeys(&self) -> Box<[u32]> {
        self.per.iter().map(|r| r.rkey()).collect()
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        if let Some(map) = self.map.as_ref().and_then(Weak::upgrade) {
            lock(&map.by_first).remove(&self.per[0].lkey());
            map.generation.fetch_add(1, Ordering::Release);
        }
    }
}

/// One connection's lkeys on its device, learnt from its domain's [`KeyMap`].
pub(super) struct LkeyCache {
    index: u8,
    map: Arc<KeyMap>,
    generation: u64,
    known: HashMap<u32, u32>,
}

impl LkeyCache {
    /// For a connection on device `index` of the domain whose registrations `map` holds.
    pub fn new(index: u8, map: Arc<KeyMap>) -> LkeyCache {
        LkeyCache {
            index,
            generation: map.generation.load(Ordering::Acquire),
            map,
            known: HashMap::new(),
        }
    }

    /// The key on this device of the registration whose device-0 lkey is `first`;
    /// `None` when the domain has no such registration (the post is refused, as a
    /// device refuses a key it does not know).
    pub fn lkey(&mut self, first: u32) -> Option<u32> {
        if self.index == 0 {
            return Some(first);
        }
        let generation = self.map.generation.load(Ordering::Acquire);
        if generation != self.generation {
            self.known.clear();
            self.generation = generation;
        }
        if let Some(&k) = self.known.get(&first) {
            return Some(k);
        }
        let k = lock(&self.map.by_first)
            .get(&first)
            .and_then(|keys| keys.get(usize::from(self.index)).copied())?;
        self.known.insert(first, k);
        Some(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_with(first: u32, keys: &[u32]) -> Arc<KeyMap> {
        let map = Arc::new(KeyMap::default());
        lock(&map.by_first).insert(first, keys.into());
        map
    }

    #[test]
    fn device_0_keeps_its_keys() {
        let mut c = LkeyCache::new(0, Arc::new(KeyMap::default()));
        assert_eq!(c.lkey(0x1234), Some(0x1234));
    }

    #[test]
    fn another_device_takes_the_same_registrations_key_there() {
        let map = map_with(0x100, &[0x100, 0x9900]);
        let mut c = LkeyCache::new(1, map.clone());
        assert_eq!(c.lkey(0x100), Some(0x9900));
        // Learnt: answered again without the map.
        lock(&map.by_first).clear();
        assert_eq!(c.lkey(0x100), Some(0x9900));
        // A key no registration of the domain has is refused, not passed through.
        assert_eq!(c.lkey(0x200), None);
    }

    #[test]
    fn a_registration_that_goes_is_forgotten_by_every_cache() {
        let map = map_with(0x100, &[0x100, 0x9900]);
        let mut c = LkeyCache::new(1, map.clone());
        assert_eq!(c.lkey(0x100), Some(0x9900));
        lock(&map.by_first).remove(&0x100);
        map.generation.fetch_add(1, Ordering::Release);
        assert_eq!(c.lkey(0x100), None);
    }

    #[test]
    fn a_device_beyond_the_registrations_keys_is_refused() {
        let map = map_with(0x100, &[0x100, 0x9900]);
        let mut c = LkeyCache::new(2, map);
        assert_eq!(c.lkey(0x100), None);
    }
}
