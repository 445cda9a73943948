//! Multipath policies: which path a request goes out on (the kernel's
//! `rtrs_clt_mpath_policy`, `get_next_path_rr`/`_min_inflight`/`_min_latency` and the
//! `path_it` iterator, docs/PROTOCOL.md §4.2 and §6.6).
//!
//! The policy is a session setting switchable at runtime; each request records the
//! policy it was posted under, so in-flight accounting stays right when the setting
//! changes meanwhile (only requests posted under min-inflight count). Selection is
//! per core: each core keeps its own round-robin cursor and in-flight counts of its own
//! requests, so choosing a path needs no shared writes.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

/// Most paths a session may have (`MAX_PATHS_NUM`); path slots are `0..MAX_PATHS`.
pub const MAX_PATHS: usize = crate::proto::constants::MAX_PATHS_NUM;

/// How a request's path is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum MpPolicy {
    /// Next connected path after the last one used (per core).
    RoundRobin = 0,
    /// Connected path with the fewest requests in flight (ties: earlier path). Kernel default.
    #[default]
    MinInflight = 1,
    /// Connected path with the lowest last heartbeat round trip.
    MinLatency = 2,
}

impl MpPolicy {
    fn from_u8(v: u8) -> MpPolicy {
        match v {
            0 => MpPolicy::RoundRobin,
            2 => MpPolicy::MinLatency,
            _ => MpPolicy::MinInflight,
        }
    }

    /// Short name: `round-robin`, `min-inflight`, `min-latency`.
    pub const fn name(self) -> &'static str {
        match self {
            MpPolicy::RoundRobin => "round-robin",
            MpPolicy::MinInflight => "min-inflight",
            MpPolicy::MinLatency => "min-latency",
        }
    }
}

impl fmt::Display for MpPolicy {
    /// As the kernel's sysfs `mpath_policy` shows it, e.g. `min-inflight (MI: 1)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tag = match self {
            MpPolicy::RoundRobin => "RR",
            MpPolicy::MinInflight => "MI",
            MpPolicy::MinLatency => "ML",
        };
        write!(f, "{} ({}: {})", self.name(), tag, *self as u8)
    }
}

/// An unknown policy name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown multipath policy {0:?}: use round-robin, min-inflight or min-latency (or rr/mi/ml, 0/1/2)")]
pub struct PolicyParseError(pub String);

impl FromStr for MpPolicy {
    type Err = PolicyParseError;

    /// Accepts what the kernel's sysfs accepts: `0`/`1`/`2`, `rr`/`mi`/`ml`, or a
    /// case-insensitive prefix of a full name.
    fn from_str(s: &str) -> Result<MpPolicy, PolicyParseError> {
        let t = s.trim().to_ascii_lowercase();
        let p = match t.as_str() {
            "0" | "rr" => Some(MpPolicy::RoundRobin),
            "1" | "mi" => Some(MpPolicy::MinInflight),
            "2" | "ml" => Some(MpPolicy::MinLatency),
            _ if t.len() >= 5 => [
                MpPolicy::RoundRobin,
                MpPolicy::MinInflight,
                MpPolicy::MinLatency,
            ]
            .into_iter()
            .find(|p| p.name().starts_with(&t)),
            _ => None,
        };
        p.ok_or_else(|| PolicyParseError(s.to_string()))
    }
}

/// The session's current policy, switchable from any thread.
#[derive(Debug, Default)]
pub struct PolicyCell(AtomicU8);

impl PolicyCell {
    pub fn new(p: MpPolicy) -> PolicyCell {
        PolicyCell(AtomicU8::new(p as u8))
    }
    pub fn get(&self) -> MpPolicy {
        MpPolicy::from_u8(self.0.load(Ordering::Relaxed))
    }
    pub fn set(&self, p: MpPolicy) {
        self.0.store(p as u8, Ordering::Relaxed);
    }
}

/// A set of path slots (a request's "already tried" list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PathSet(u128);

impl PathSet {
    pub const EMPTY: PathSet = PathSet(0);
    pub fn contains(self, p: usize) -> bool {
        p < MAX_PATHS && self.0 & (1u128 << p) != 0
    }
    pub fn insert(&mut self, p: usize) {
        if p < MAX_PATHS {
            self.0 |= 1u128 << p;
        }
    }
}

/// What the selector needs to know of a path slot, as this core sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Candidate {
    /// Connected, and this core holds its IO connection.
    pub usable: bool,
    /// This core's requests in flight on it under min-inflight.
    pub inflight: u32,
    /// Last heartbeat round trip in ns (0 until the first ack).
    pub latency_ns: u64,
}

/// One core's path selector (its round-robin cursor).
#[derive(Debug, Clone, Default)]
pub struct Selector {
    last: Option<usize>,
}

impl Selector {
    pub fn new() -> Selector {
        Selector::default()
    }

    /// Picks a usable slot of `paths` not in `tried` under `policy`; `None` when there is
    /// none left.
    pub fn select(
        &mut self,
        policy: MpPolicy,
        paths: &[Candidate],
        tried: PathSet,
    ) -> Option<usize> {
        let n = paths.len().min(MAX_PATHS);
        let ok = |i: usize| paths[i].usable && !tried.contains(i);
        match policy {
            MpPolicy::RoundRobin => {
                let start = self.last.map_or(0, |l| l + 1);
                let pick = (0..n).map(|k| (start + k) % n.max(1)).find(|&i| ok(i))?;
                self.last = Some(pick);
                Some(pick)
            }
            MpPolicy::MinInflight => (0..n).filter(|&i| ok(i)).min_by_key(|&i| paths[i].inflight),
            MpPolicy::MinLatency => (0..n)
                .filter(|&i| ok(i))
                .min_by_key(|&i| paths[i].latency_ns),
        }
    }

    /// [`select`](Self::select) over a single slot (slot 0), without its counters:
    /// every policy picks the slot when it is usable and not yet tried (`ok`).
    pub fn select_only(&mut self, policy: MpPolicy, ok: bool) -> Option<usize> {
        if !ok {
            return None;
        }
        if policy == MpPolicy::RoundRobin {
            self.last = Some(0);
        }
        Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(v: &[(bool, u32, u64)]) -> Vec<Candidate> {
        v.iter()
            .map(|&(usable, inflight, latency_ns)| Candidate {
                usable,
                inflight,
                latency_ns,
            })
            .collect()
    }

    #[test]
    fn round_robin_skips_unusable_and_wraps() {
        let c = cands(&[(true, 0, 0), (false, 0, 0), (true, 0, 0), (true, 0, 0)]);
        let mut s = Selector::new();
        let picks: Vec<_> = (0..6)
            .map(|_| s.select(MpPolicy::RoundRobin, &c, PathSet::EMPTY).unwrap())
            .collect();
        assert_eq!(picks, vec![0, 2, 3, 0, 2, 3]);
        let mut tried = PathSet::EMPTY;
        tried.insert(0);
        tried.insert(2);
        tried.insert(3);
        assert_eq!(s.select(MpPolicy::RoundRobin, &c, tried), None);
    }

    #[test]
    fn select_only_matches_select_over_one_slot() {
        for policy in [
            MpPolicy::RoundRobin,
            MpPolicy::MinInflight,
            MpPolicy::MinLatency,
        ] {
            for (usable, tried0) in [(true, false), (true, true), (false, false), (false, true)] {
                let c = cands(&[(usable, 7, 300)]);
                let mut tried = PathSet::EMPTY;
                if tried0 {
                    tried.insert(0);
                }
                let (mut a, mut b) = (Selector::new(), Selector::new());
                for _ in 0..3 {
                    let want = a.select(policy, &c, tried);
                    let got = b.select_only(policy, usable && !tried.contains(0));
                    assert_eq!(got, want, "{policy:?} usable={usable} tried={tried0}");
                }
                // The round-robin cursor moved the same way: the next pick over two slots
                // agrees too.
                let two = cands(&[(true, 0, 0), (true, 0, 0)]);
                assert_eq!(
                    b.select(policy, &two, PathSet::EMPTY),
                    a.select(policy, &two, PathSet::EMPTY)
                );
            }
        }
    }

    #[test]
    fn min_inflight_and_min_latency() {
        let c = cands(&[
            (true, 5, 900),
            (true, 2, 300),
            (false, 0, 1),
            (true, 2, 100),
        ]);
        let mut s = Selector::new();
        assert_eq!(
            s.select(MpPolicy::MinInflight, &c, PathSet::EMPTY),
            Some(1),
            "tie goes to the earlier path"
        );
        assert_eq!(s.select(MpPolicy::MinLatency, &c, PathSet::EMPTY), Some(3));
        let mut tried = PathSet::EMPTY;
        tried.insert(3);
        assert_eq!(s.select(MpPolicy::MinLatency, &c, tried), Some(1));
        assert_eq!(
            s.select(
                MpPolicy::MinInflight,
                &cands(&[(false, 0, 0)]),
                PathSet::EMPTY
            ),
            None
        );
    }

    #[test]
    fn policy_names_parse_like_sysfs() {
        for (s, p) in [
            ("0", MpPolicy::RoundRobin),
            ("rr", MpPolicy::RoundRobin),
            ("Round-Robin", MpPolicy::RoundRobin),
            ("1", MpPolicy::MinInflight),
            ("MI", MpPolicy::MinInflight),
            ("min-inf", MpPolicy::MinInflight),
            ("2", MpPolicy::MinLatency),
            ("min-latency", MpPolicy::MinLatency),
        ] {
            assert_eq!(s.parse::<MpPolicy>().unwrap(), p, "{s}");
        }
        assert!("min".parse::<MpPolicy>().is_err(), "ambiguous prefix");
        assert!("fastest"
            .parse::<MpPolicy>()
            .unwrap_err()
            .to_string()
            .contains("fastest"));
        assert_eq!(MpPolicy::default(), MpPolicy::MinInflight);
        assert_eq!(MpPolicy::MinLatency.to_string(), "min-latency (ML: 2)");
    }
}
