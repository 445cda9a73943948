//! The barrier pair of a handshake whose one side is hot and whose other side is rare (a
//! loopback end marking itself busy on every post against the peer's close,
//! `docs/ARCHITECTURE.md`, "The loopback fabric"). Each side stores its flag and
//! then loads the other's; one of them must see the other's store. A sequentially
//! consistent fence on both sides does it, at a locked instruction per post. Here the hot
//! side issues [`light`] and the rare side [`heavy`]: with the kernel's process-private
//! expedited `membarrier`, `light` is only a compiler fence and `heavy` makes every thread
//! of the process that is running execute a full barrier before it returns, so either the
//! hot side's store is visible to the rare side's load or the hot side's load comes after
//! the rare side's store. Where the kernel lacks it or a filter refuses it, both are a
//! sequentially consistent fence. The only system call of `crate::sync`.

use std::sync::atomic::{compiler_fence, fence, Ordering};
use std::sync::OnceLock;

/// `membarrier(2)` commands.
const CMD_QUERY: libc::c_int = 0;
const CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

fn membarrier(cmd: libc::c_int) -> libc::c_long {
    // SAFETY: membarrier takes a command and two integer arguments (flags 0, cpu id
    // unused) and touches no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    }
}

/// Whether the expedited barrier is registered for this process: decided once, before
/// any barrier of the pair relies on it.
fn expedited() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        let both = libc::c_long::from(CMD_PRIVATE_EXPEDITED | CMD_REGISTER_PRIVATE_EXPEDITED);
        let cmds = membarrier(CMD_QUERY);
        cmds >= 0 && cmds & both == both && membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) == 0
    })
}

/// Decides (and registers) the barrier now rather than at the first post: for code that
/// sets up a user of the pair.
pub fn prepare() {
    expedited();
}

/// The hot side's barrier, between its store and its load.
#[inline]
pub fn light() {
    if expedited() {
        compiler_fence(Ordering::SeqCst);
    } else {
        fence(Ordering::SeqCst);
    }
}

/// The rare side's barrier, between its store and its load.
///
/// # Panics
/// When the kernel refuses the registered barrier (it does not, once registered).
pub fn heavy() {
    if expedited() {
        let r = membarrier(CMD_PRIVATE_EXPEDITED);
        assert!(
            r == 0,
            "membarrier refused after registration: {}",
            std::io::Error::last_os_error()
        );
    } else {
        fence(Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64};
    use std::sync::Arc;

    /// The handshake itself: rounds of a hot thread (store `busy`, `light`, load `gone`)
    /// against a rare one (store `gone`, `heavy`, load `busy`); in no round may both
    /// miss the other's store.
    #[test]
    fn one_side_always_sees_the_other() {
        const ROUNDS: u64 = 200_000;
        let busy = Arc::new(AtomicBool::new(false));
        let gone = Arc::new(AtomicBool::new(false));
        let round = Arc::new(AtomicU64::new(0));
        let hot_saw = Arc::new(AtomicU64::new(u64::MAX));
        let (b, g, r, h) = (busy.clone(), gone.clone(), round.clone(), hot_saw.clone());
        let hot = std::thread::spawn(move || {
            for i in 0..ROUNDS {
                while r.load(Ordering::Acquire) != i * 2 + 1 {
                    std::hint::spin_loop();
                }
                b.store(true, Ordering::Relaxed);
                light();
                let saw_gone = g.load(Ordering::Relaxed);
                h.store(u64::from(saw_gone), Ordering::Relaxed);
                r.store(i * 2 + 2, Ordering::Release);
            }
        });
        let mut both_missed = 0;
        for i in 0..ROUNDS {
            busy.store(false, Ordering::Relaxed);
            gone.store(false, Ordering::Relaxed);
            round.store(i * 2 + 1, Ordering::Release);
            gone.store(true, Ordering::Relaxed);
            heavy();
            let saw_busy = busy.load(Ordering::Relaxed);
            while round.load(Ordering::Acquire) != i * 2 + 2 {
                std::hint::spin_loop();
            }
            if !saw_busy && hot_saw.load(Ordering::Relaxed) == 0 {
                both_missed += 1;
            }
        }
        hot.join().unwrap();
        assert_eq!(both_missed, 0, "rounds where neither side saw the other");
    }
}
