//! A reactor's pollers and timers: a generation-checked slab plus a deadline heap.
//!
//! The reactor-side counterpart of SPDK's per-thread `active_pollers` list and
//! `timed_pollers` tree. Slots are reused through a free list; a [`PollerId`] carries the
//! slot's generation so a stale id never reaches a newer poller. Timers are ordered by
//! deadline (then arming order) in a binary heap; cancelled timers leave their heap entry
//! behind and it is skipped when popped, or swept when such entries pile up.
//!
//! While a poller runs, its box is taken out of its slot, so the poller may register and
//! unregister others (or itself) through its context. Registrations made during a loop
//! stay pending until the loop ends.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::poller::{Poller, PollerId, Timer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Due {
    at: u64,
    seq: u64,
    index: u32,
    gen: u32,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Active,
    Timer {
        at: u64,
        period: Option<u64>,
        in_heap: bool,
    },
}

struct Entry {
    /// `None` while the poller is running.
    poller: Option<Box<dyn Poller>>,
    kind: Kind,
    pending: bool,
}

/// One place of the slab: its generation (so stale ids miss) and the poller, if any.
struct PollerSlot {
    gen: u32,
    entry: Option<Entry>,
}

/// What [`Table::take`] hands out: the poller and what is needed to give it back.
pub(crate) struct Taken {
    pub(crate) id: PollerId,
    pub(crate) poller: Box<dyn Poller>,
}

pub(crate) struct Table {
    core: u32,
    slots: Vec<PollerSlot>,
    free: Vec<u32>,
    pending: Vec<(u32, u32)>,
    heap: BinaryHeap<Reverse<Due>>,
    seq: u64,
    /// Heap entries whose timer was cancelled.
    stale: usize,
    live: usize,
    /// Freed slots are not reused: slot order is registration order
    /// ([`Table::keep_registration_order`]).
    no_reuse: bool,
}

/// Below this many stale heap entries the heap is never swept.
const SWEEP_MIN: usize = 64;

impl Table {
    pub(crate) fn new(core: usize) -> Table {
        Table {
            core: u32::try_from(core).unwrap_or(u32::MAX),
            slots: Vec::new(),
            free: Vec::new(),
            pending: Vec::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            stale: 0,
            live: 0,
            no_reuse: false,
        }
    }

    /// From now on a poller gets a slot of its own, never a freed one, so that the slots'
    /// order is the order of registration (a reactor that runs its pollers newest first).
    pub(crate) fn keep_registration_order(&mut self) {
        self.no_reuse = true;
        self.free.clear();
    }

    /// Number of live pollers and timers.
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Slot count, the bound for iterating with [`Table::take_active`].
    pub(crate) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// Inserts a poller; pending ones start after [`Table::activate_pending`].
    pub(crate) fn insert(
        &mut self,
        poller: Box<dyn Poller>,
        timer: Option<(Timer, u64)>,
        pending: bool,
    ) -> PollerId {
        let kind = match timer {
            None => Kind::Active,
            Some((t, now)) => Kind::Timer {
                at: now.saturating_add(t.first_ns),
                period: t.period_ns,
                in_heap: false,
            },
        };
        let entry = Entry {
            poller: Some(poller),
            kind,
            pending,
        };
        let index = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize].entry = Some(entry);
                i
            }
            None => {
                self.slots.push(PollerSlot {
                    gen: 0,
                    entry: Some(entry),
                });
                u32::try_from(self.slots.len() - 1).expect("more than 2^32 pollers on one reactor")
            }
        };
        self.live += 1;
        let gen = self.slots[index as usize].gen;
        if pending {
            self.pending.push((index, gen));
        } else {
            self.schedule(index);
        }
        PollerId {
            core: self.core,
            index,
            gen,
        }
    }

    /// Pushes a timer's deadline into the heap.
    fn schedule(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        let gen = slot.gen;
        if let Some(Entry {
            kind: Kind::Timer { at, in_heap, .. },
            ..
        }) = &mut slot.entry
        {
            *in_heap = true;
            self.seq += 1;
            self.heap.push(Reverse(Due {
                at: *at,
                seq: self.seq,
                index,
                gen,
            }));
        }
    }

    /// Starts everything registered during the loop.
    pub(crate) fn activate_pending(&mut self) {
        while let Some((index, gen)) = self.pending.pop() {
            let slot = &mut self.slots[index as usize];
            if slot.gen != gen {
                continue;
            }
            if let Some(e) = &mut slot.entry {
                e.pending = false;
                self.schedule(index);
            }
        }
    }

    fn slot_of(&self, id: PollerId) -> Option<usize> {
        let i = id.index as usize;
        (id.core == self.core && i < self.slots.len() && self.slots[i].gen == id.gen).then_some(i)
    }

    /// Removes and drops a poller (its box too, unless it is running: then the box is
    /// dropped by [`Table::put_back`]).
    pub(crate) fn remove(&mut self, id: PollerId) -> bool {
        let Some(i) = self.slot_of(id) else {
            return false;
        };
        let slot = &mut self.slots[i];
        let Some(entry) = slot.entry.take() else {
            return false;
        };
        if let Kind::Timer { in_heap: true, .. } = entry.kind {
            self.stale += 1;
        }
        slot.gen = slot.gen.wrapping_add(1);
        if !self.no_reuse {
            self.free.push(id.index);
        }
        self.live -= 1;
        drop(entry);
        self.maybe_sweep();
        true
    }

    fn maybe_sweep(&mut self) {
        if self.stale < SWEEP_MIN || self.stale * 2 < self.heap.len() {
            return;
        }
        let slots = &self.slots;
        self.heap.retain(|Reverse(d)| {
            let s = &slots[d.index as usize];
            s.gen == d.gen && s.entry.is_some()
        });
        self.stale = 0;
    }

    /// Takes out slot `index`'s poller if it is a started, every-loop poller.
    pub(crate) fn take_active(&mut self, index: usize) -> Option<Taken> {
        self.take(index, true)
    }

    /// Takes out the poller of a started poller or timer, whatever its kind (shutdown).
    pub(crate) fn take_any(&mut self, index: usize) -> Option<Taken> {
        self.take(index, false)
    }

    /// Takes out slot `index`'s poller if it is started (and, with `active_only`, an
    /// every-loop poller).
    fn take(&mut self, index: usize, active_only: bool) -> Option<Taken> {
        let slot = self.slots.get_mut(index)?;
        let gen = slot.gen;
        let entry = slot.entry.as_mut()?;
        if entry.pending || (active_only && !matches!(entry.kind, Kind::Active)) {
            return None;
        }
        let poller = entry.poller.take()?;
        Some(Taken {
            id: PollerId {
                core: self.core,
                index: index as u32,
                gen,
            },
            poller,
        })
    }

    /// Returns a taken poller to its slot; if the poller was unregistered meanwhile it is
    /// dropped instead. Returns whether it went back.
    pub(crate) fn put_back(&mut self, taken: Taken) -> bool {
        let Some(i) = self.slot_of(taken.id) else {
            return false;
        };
        match &mut self.slots[i].entry {
            Some(e) => {
                e.poller = Some(taken.poller);
                true
            }
            None => false,
        }
    }

    /// Pops the next timer due at or before `now` and takes its poller out.
    pub(crate) fn pop_due(&mut self, now: u64) -> Option<Taken> {
        loop {
            let Reverse(due) = *self.heap.peek()?;
            if due.at > now {
                return None;
            }
            self.heap.pop();
            let slot = &mut self.slots[due.index as usize];
            let valid = slot.gen == due.gen;
            let Some(entry) = slot.entry.as_mut().filter(|_| valid) else {
                self.stale = self.stale.saturating_sub(1);
                continue;
            };
            if let Kind::Timer { in_heap, .. } = &mut entry.kind {
                *in_heap = false;
            }
            let Some(poller) = entry.poller.take() else {
                continue;
            };
            return Some(Taken {
                id: PollerId {
                    core: self.core,
                    index: due.index,
                    gen: due.gen,
                },
                poller,
            });
        }
    }

    /// After a timer ran: puts it back and re-arms it if periodic, drops it if one-shot
    /// (or if it was unregistered while running). The next deadline keeps the period's
    /// phase (`previous + period`) but never lies in the past: a reactor that fell behind
    /// runs a late timer once, not once per missed period.
    pub(crate) fn finish_timer(&mut self, taken: Taken, now: u64) {
        let id = taken.id;
        let Some(i) = self.slot_of(id) else {
            return;
        };
        let Some(Entry {
            kind: Kind::Timer { at, period, .. },
            ..
        }) = &mut self.slots[i].entry
        else {
            return;
        };
        match *period {
            Some(p) => {
                let mut next = at.saturating_add(p);
                if next <= now {
                    next = now.saturating_add(p);
                }
                *at = next;
                self.put_back(taken);
                self.schedule(id.index);
            }
            None => {
                drop(taken);
                self.remove(id);
            }
        }
    }

    /// Earliest armed deadline (maybe of a cancelled timer: waking early is harmless).
    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(d)| d.at)
    }

    /// Drops every poller and timer; returns how many pollers and timers there were.
    pub(crate) fn clear(&mut self) -> (usize, usize) {
        let mut pollers = 0;
        let mut timers = 0;
        for slot in &mut self.slots {
            if let Some(e) = slot.entry.take() {
                match e.kind {
                    Kind::Active => pollers += 1,
                    Kind::Timer { .. } => timers += 1,
                }
                slot.gen = slot.gen.wrapping_add(1);
            }
        }
        self.heap.clear();
        self.pending.clear();
        self.free.clear();
        self.slots.clear();
        self.stale = 0;
        self.live = 0;
        (pollers, timers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::poller::{Ctx, PollResult};

    fn nop() -> Box<dyn Poller> {
        Box::new(|_: &mut dyn Ctx| PollResult::Idle)
    }

    #[test]
    fn stale_ids_never_reach_a_newer_poller() {
        let mut t = Table::new(0);
        let a = t.insert(nop(), None, false);
        assert!(t.remove(a));
        let b = t.insert(nop(), None, false);
        assert_eq!(a.index, b.index);
        assert!(!t.remove(a));
        assert_eq!(t.len(), 1);
        assert!(t.remove(b));
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn cancelled_timers_are_swept() {
        let mut t = Table::new(0);
        let ids: Vec<_> = (0..200)
            .map(|_| t.insert(nop(), Some((Timer::once_ns(1000), 0)), false))
            .collect();
        for id in ids {
            t.remove(id);
        }
        assert!(t.heap.len() < 200, "heap not swept: {}", t.heap.len());
        assert!(t.pop_due(u64::MAX).is_none());
    }

    #[test]
    fn periodic_timer_skips_missed_periods() {
        let mut t = Table::new(0);
        t.insert(nop(), Some((Timer::periodic_ns(10), 0)), false);
        let taken = t.pop_due(35).unwrap();
        t.finish_timer(taken, 35);
        assert_eq!(t.next_deadline(), Some(45));
    }
}
