//! Identifiers and randomness: the per-path `sess_uuid` and per-session `paths_uuid`
//! of the kernel's `uuid_gen()` calls, and random numbers for reconnect jitter.
//!
//! The randomness comes from the standard library's per-process random SipHash keys
//! (`RandomState`, seeded from the operating system), mixed with a counter and the
//! clock: unpredictable enough for identifiers and jitter, and no extra dependency.
//! UUIDs are only compared for equality by the peer.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// A 16-byte UUID as carried in conn_req.
pub type Uuid = [u8; 16];

static COUNTER: AtomicU64 = AtomicU64::new(0);
static SEED: OnceLock<RandomState> = OnceLock::new();

/// A random 64-bit number (not for cryptography).
pub fn random_u64() -> u64 {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut h = SEED.get_or_init(RandomState::new).build_hasher();
    h.write_u64(n);
    h.write_u64(t);
    h.write_u32(std::process::id());
    h.finish()
}

/// A random (version 4, RFC 4122 variant) UUID.
pub fn random_uuid() -> Uuid {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&random_u64().to_le_bytes());
    u[8..].copy_from_slice(&random_u64().to_le_bytes());
    u[6] = (u[6] & 0x0f) | 0x40;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_differ_and_carry_version_bits() {
        let a = random_uuid();
        let b = random_uuid();
        assert_ne!(a, b);
        assert_eq!(a[6] >> 4, 4);
        assert_eq!(a[8] >> 6, 0b10);
    }

    #[test]
    fn random_numbers_spread() {
        let v: Vec<u64> = (0..64).map(|_| random_u64()).collect();
        let mut s = v.clone();
        s.sort_unstable();
        s.dedup();
        assert_eq!(s.len(), 64);
        // Both halves of the range show up (a broken mixer would not).
        assert!(v.iter().any(|&x| x < u64::MAX / 2) && v.iter().any(|&x| x >= u64::MAX / 2));
    }
}
