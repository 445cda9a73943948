//! A queue pair's staging area: copies of source bytes taken when a REG_MR is posted
//! behind operations that still read memory it exposes (`SoftQp::post_send`). With the
//! copy the binding takes effect at once and the operations go out with the connection's
//! other frames; without room for it, the binding waits for the bytes instead.
//!
//! One mapping per queue pair, allocated at the first copy, used as a ring: copies are
//! taken in send-queue order and released in that order (when their operation
//! completes), so the oldest one is always first to go. The ring starts small and
//! doubles, up to [`STAGE_MAX_BYTES`], when a copy finds no room (a queue pair that
//! answers many large READs at once); copies still in flight keep the old mapping
//! alive through their handles.

use std::sync::Arc;

use super::table::{Keep, MemRef};
use crate::fabric::MemBuf;

/// Bytes of one queue pair's area at first.
const STAGE_BYTES: usize = 512 << 10;
/// The most an area grows to.
const STAGE_MAX_BYTES: usize = 2 << 20;
/// The largest source a REG_MR copies; beyond, the binding waits for the bytes (the
/// frames behind it still go out in the same write, and the binding takes effect once
/// the transport says the bytes before it have left: `SoftQp::left_through`), which for
/// a large source costs less than the copy.
pub(super) const STAGE_MAX: usize = 64 << 10;

#[derive(Default)]
pub(super) struct Stage {
    mem: Option<Arc<Keep>>,
    /// Bytes of `mem` (0 before the first copy).
    size: usize,
    /// Positions grow for ever; the byte of position `p` is at `p % size`.
    head: u64,
    tail: u64,
    /// Set once the mapping could not be had: no more tries.
    unavailable: bool,
}

impl Stage {
    /// A copy of `src`'s bytes in the area, or `None` when it does not fit now.
    pub fn capture(&mut self, src: &MemRef) -> Option<MemRef> {
        let len = src.len();
        if len > STAGE_MAX || self.unavailable {
            return None;
        }
        if self.mem.is_none() && !self.remap(STAGE_BYTES) {
            self.unavailable = true;
            return None;
        }
        loop {
            let cap = self.size as u64;
            let mut at = self.tail;
            if at % cap + len as u64 > cap {
                // Not contiguous before the end: the copy starts at the beginning.
                at += cap - at % cap;
            }
            if at + len as u64 - self.head > cap {
                // No room: a larger ring, if allowed and to be had, else wait.
                if self.size < STAGE_MAX_BYTES && self.remap(self.size * 2) {
                    continue;
                }
                return None;
            }
            let keep = self.mem.as_ref()?;
            // SAFETY: `at % cap + len <= cap`: the range is inside the area's mapping,
            // which `keep` holds; positions at or past `tail` hold no live copy in it.
            let dst = unsafe { MemRef::within(keep, keep.addr().add((at % cap) as usize), len) };
            dst.gather_from(std::slice::from_ref(src));
            self.tail = at + len as u64;
            return Some(dst);
        }
    }

    /// Copies from now on go to a new mapping of `size` bytes; false if it cannot be
    /// had. Positions go on: those before `tail` belong to the old mapping, which the
    /// copies still in flight keep alive through their handles, and count as used until
    /// released, so the new ring is never written where a position still in use maps.
    fn remap(&mut self, size: usize) -> bool {
        match MemBuf::try_zeroed(size) {
            Ok(b) => {
                self.mem = Some(Keep::own(b));
                self.size = size;
                true
            }
            Err(_) => false,
        }
    }

    /// Where the next copy would end after those taken so far: the mark a slot keeps
    /// to release its copies.
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// The slot whose copies ended at `end` is done with them (and so are all before).
    pub fn release(&mut self, end: u64) {
        self.head = self.head.max(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of `len` bytes, all `b`.
    fn src(len: usize, b: u8) -> MemRef {
        let mem = MemBuf::zeroed(len);
        let keep = Keep::own(mem);
        // SAFETY: the whole of the mapping `keep` holds.
        let r = unsafe { MemRef::within(&keep, keep.addr(), len) };
        r.write_at(0, &vec![b; len]);
        r
    }

    fn bytes(r: &MemRef) -> Vec<u8> {
        let mut v = vec![0u8; r.len()];
        r.read_into(&mut v);
        v
    }

    #[test]
    fn copies_fill_the_ring_which_doubles_when_full_up_to_its_cap() {
        let mut st = Stage::default();
        let big = src(STAGE_MAX, 7);
        assert!(
            st.capture(&src(STAGE_MAX + 1, 1)).is_none(),
            "larger than a copy may be"
        );
        let fit = |bytes: usize| bytes / STAGE_MAX;
        // The first ring holds `fit(STAGE_BYTES)` copies; one more takes a ring twice
        // the size.
        let mut copies = Vec::new();
        for _ in 0..fit(STAGE_BYTES) {
            copies.push(st.capture(&big).expect("room"));
        }
        assert_eq!(st.size, STAGE_BYTES);
        copies.push(st.capture(&big).expect("a larger ring"));
        assert_eq!(st.size, 2 * STAGE_BYTES);
        // The copies in the old ring still read their bytes: their handles keep it.
        for c in &copies {
            assert_eq!(bytes(c), vec![7; STAGE_MAX]);
        }
        // The positions in use count in the new ring too, and it grows to its cap and
        // no further: then exactly `fit(STAGE_MAX_BYTES)` copies are in use.
        while st.capture(&big).is_some() {}
        assert_eq!(st.size, STAGE_MAX_BYTES);
        assert_eq!(
            st.tail() - st.head,
            fit(STAGE_MAX_BYTES) as u64 * STAGE_MAX as u64
        );
        // Released in order, room comes back.
        st.release(st.tail());
        let c = st.capture(&src(4096, 9)).expect("room after release");
        assert_eq!(bytes(&c), vec![9; 4096]);
        assert_eq!(st.size, STAGE_MAX_BYTES);
    }
}
