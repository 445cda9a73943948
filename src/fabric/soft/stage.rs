//! A queue pair's staging area: copies of source bytes taken when a REG_MR is posted
//! behind operations that still read memory it exposes (`SoftQp::post_send`). With the
//! copy the binding takes effect at once and the operations go out with the connection's
//! other frames; without room for it, the binding waits for the bytes instead.
//!
//! One mapping per queue pair, allocated at the first copy, used as a ring: copies are
//! taken in send-queue order and released in that order (when their operation
//! completes), so the oldest one is always first to go.

use std::sync::Arc;

use super::table::{Keep, MemRef};
use crate::fabric::MemBuf;

/// Bytes of one queue pair's area.
const STAGE_BYTES: usize = 512 << 10;
/// The largest source a REG_MR copies; beyond, the binding waits for the bytes (an
/// operation that large amortizes a write of its own).
pub(super) const STAGE_MAX: usize = 64 << 10;

#[derive(Default)]
pub(super) struct Stage {
    mem: Option<Arc<Keep>>,
    /// Positions grow for ever; the byte of position `p` is at `p % STAGE_BYTES`.
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
        if self.mem.is_none() {
            match MemBuf::try_zeroed(STAGE_BYTES) {
                Ok(b) => self.mem = Some(Keep::own(b)),
                Err(_) => {
                    self.unavailable = true;
                    return None;
                }
            }
        }
        let cap = STAGE_BYTES as u64;
        let mut at = self.tail;
        if at % cap + len as u64 > cap {
            // Not contiguous before the end: the copy starts at the beginning.
            at += cap - at % cap;
        }
        if at + len as u64 - self.head > cap {
            return None;
        }
        let keep = self.mem.as_ref()?;
        // SAFETY: `at % cap + len <= cap`: the range is inside the area's mapping, which
        // `keep` holds; it is free (between tail and head + cap), so no live copy is in it.
        let dst = unsafe { MemRef::within(keep, keep.addr().add((at % cap) as usize), len) };
        dst.gather_from(std::slice::from_ref(src));
        self.tail = at + len as u64;
        Some(dst)
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
