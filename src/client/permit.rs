//! Permits: the right to use server chunk `buf_id` for one request (the kernel's
//! `rtrs_permit`, `rtrs_clt_get_permit`/`rtrs_clt_put_permit`, docs/PROTOCOL.md §4.1).
//!
//! The kernel keeps one bitmap per session and takes it with atomic bit operations from
//! any CPU. Here the session's `queue_depth` buf ids are split once into one contiguous
//! slice per core ([`partition`]); a core allocates only from its own [`Permits`], with
//! plain loads and stores, so the hot path has no atomics and no cross-core traffic.
//! A buf id's remote key (`rbuf[buf_id]`, renewed by every RKEY_RSP under
//! always_invalidate) is then only ever touched by the core owning the permit.
//! Allocation takes the lowest free id, as the kernel's `find_first_zero_bit`.

use std::ops::Range;

/// The buf ids core `core` of `cores` owns in a session of `queue_depth` chunks:
/// `[core·qd/cores, (core+1)·qd/cores)`. Every id belongs to exactly one core; a core
/// gets none when `queue_depth < cores` leaves nothing for it.
pub fn partition(queue_depth: u16, cores: usize, core: usize) -> Range<u16> {
    let cores = cores.max(1) as u64;
    let qd = u64::from(queue_depth);
    let c = (core as u64).min(cores);
    let lo = qd * c / cores;
    let hi = qd * (c + 1).min(cores) / cores;
    lo as u16..hi as u16
}

/// One core's permits: a fixed bitmap over its slice of buf ids. Never allocates after
/// construction.
#[derive(Debug, Clone)]
pub struct Permits {
    range: Range<u16>,
    words: Box<[u64]>,
    used: u32,
}

impl Permits {
    /// Permits for the buf ids in `range`, all free.
    pub fn new(range: Range<u16>) -> Permits {
        let n = usize::from(range.end.saturating_sub(range.start));
        Permits {
            range,
            words: vec![0u64; n.div_ceil(64)].into_boxed_slice(),
            used: 0,
        }
    }

    /// The buf ids this core owns.
    pub fn range(&self) -> Range<u16> {
        self.range.clone()
    }

    /// Number of permits this core owns.
    pub fn capacity(&self) -> u32 {
        u32::from(self.range.end - self.range.start)
    }

    /// Permits taken and not yet returned.
    pub fn in_use(&self) -> u32 {
        self.used
    }

    /// Whether `buf_id` is this core's.
    pub fn owns(&self, buf_id: u16) -> bool {
        self.range.contains(&buf_id)
    }

    /// Whether `buf_id` is this core's and currently taken.
    pub fn is_taken(&self, buf_id: u16) -> bool {
        if !self.owns(buf_id) {
            return false;
        }
        let i = usize::from(buf_id - self.range.start);
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    /// Takes the lowest free permit; `None` when all are in use (the caller retries
    /// after completions, as the kernel's `RTRS_PERMIT_NOWAIT`).
    pub fn get(&mut self) -> Option<u16> {
        let n = self.capacity() as usize;
        for (w, word) in self.words.iter_mut().enumerate() {
            if *word == u64::MAX {
                continue;
            }
            let bit = (!*word).trailing_zeros() as usize;
            let i = w * 64 + bit;
            if i >= n {
                return None;
            }
            *word |= 1 << bit;
            self.used += 1;
            return Some(self.range.start + i as u16);
        }
        None
    }

    /// Returns a permit. Returning one that is not taken (or not this core's) is a bug
    /// of the caller and is refused with `false`, leaving the bitmap unchanged.
    pub fn put(&mut self, buf_id: u16) -> bool {
        if !self.is_taken(buf_id) {
            return false;
        }
        let i = usize::from(buf_id - self.range.start);
        self.words[i / 64] &= !(1 << (i % 64));
        self.used -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_covers_every_buf_id_once() {
        for qd in [1u16, 2, 7, 64, 512, 65535] {
            for cores in [1usize, 2, 3, 8] {
                let mut next = 0u16;
                for c in 0..cores {
                    let r = partition(qd, cores, c);
                    assert_eq!(r.start, next, "qd {qd} cores {cores} core {c}");
                    next = r.end;
                }
                assert_eq!(next, qd);
            }
        }
        assert!(partition(1, 2, 0).is_empty() || partition(1, 2, 1).is_empty());
    }

    #[test]
    fn permits_lowest_first_and_exhaustion() {
        let mut p = Permits::new(100..170);
        assert_eq!(p.capacity(), 70);
        let got: Vec<u16> = (0..70).map(|_| p.get().unwrap()).collect();
        assert_eq!(got, (100..170).collect::<Vec<_>>());
        assert_eq!(p.get(), None);
        assert!(p.put(135));
        assert!(!p.put(135), "double put refused");
        assert!(!p.put(99), "foreign id refused");
        assert_eq!(p.get(), Some(135));
        assert_eq!(p.in_use(), 70);
        let mut empty = Permits::new(5..5);
        assert_eq!(empty.get(), None);
    }

    /// What each core does when a reconnect brings another queue depth
    /// (`SessionCore::setup`): its permits are partitioned anew from the new depth, all
    /// free, and the ids beyond it are no longer anyone's.
    #[test]
    fn a_renegotiated_queue_depth_repartitions_the_permits() {
        let mut old: Vec<Permits> = (0..2).map(|c| Permits::new(partition(512, 2, c))).collect();
        assert_eq!(old[1].range(), 256..512);
        assert_eq!(old[1].get(), Some(256));
        let new: Vec<Permits> = (0..2).map(|c| Permits::new(partition(128, 2, c))).collect();
        assert_eq!((new[0].range(), new[1].range()), (0..64, 64..128));
        assert!(new.iter().all(|p| p.capacity() == 64 && p.in_use() == 0));
        assert!(new.iter().all(|p| !p.owns(256)), "an old id is refused");
    }
}
