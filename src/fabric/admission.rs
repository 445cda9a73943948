//! Admission of connections that have not finished their handshake: the limits a
//! listener and the RTRS server apply ([`Admission`]) and the eviction rule they share
//! ([`victim`]).
//!
//! The kernel relies on closed RDMA networks and has none of this. A listener reachable
//! over TCP must assume that anyone may open sockets and never write to them, so:
//! - a connection that has not completed its handshake within
//!   [`Admission::handshake_timeout`] is closed;
//! - such connections are capped per source address and in total; a newcomer over a cap
//!   evicts the oldest pending connection of its own source (per-source cap) or of the
//!   busiest source (total cap). A newcomer is therefore always admitted, and a flood from
//!   a few addresses only ever evicts itself: a legitimate client elsewhere gets through.
//!
//! Sources are IP addresses; IPv6 addresses count per /64 (what one host or subnet
//! usually holds), IPv4-mapped IPv6 addresses as their IPv4 address.

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

/// Default [`Admission::handshake_timeout`]: 5 s.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`Admission::max_pending`]: 256.
pub const DEFAULT_MAX_PENDING: usize = 256;
/// Default [`Admission::max_pending_per_source`]: 32.
pub const DEFAULT_MAX_PENDING_PER_SOURCE: usize = 32;
/// Longest handshake timeout accepted (an hour: beyond, it protects nothing).
pub const MAX_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Limits on connections still in their handshake (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// How long a connection may take to complete its handshake (default 5 s). On the
    /// tcp fabric: from `accept` to a complete connect request. In the RTRS server: from
    /// a path's first connection request to its INFO_REQ (every connection made).
    pub handshake_timeout: Duration,
    /// Most connections per listener still in their handshake (default 256).
    pub max_pending: usize,
    /// Most of them from one source address (default 32).
    pub max_pending_per_source: usize,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            max_pending: DEFAULT_MAX_PENDING,
            max_pending_per_source: DEFAULT_MAX_PENDING_PER_SOURCE,
        }
    }
}

/// A limit out of range: the field, its value, and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} = {value}: {reason}")]
pub struct AdmissionError {
    pub field: &'static str,
    pub value: String,
    pub reason: &'static str,
}

impl Admission {
    /// Checks the limits.
    ///
    /// # Errors
    /// [`AdmissionError`] naming the field.
    pub fn validate(&self) -> Result<(), AdmissionError> {
        let bad = |field, value: String, reason| {
            Err(AdmissionError {
                field,
                value,
                reason,
            })
        };
        let t = self.handshake_timeout;
        if t < Duration::from_millis(1) || t > MAX_HANDSHAKE_TIMEOUT {
            return bad(
                "handshake_timeout",
                format!("{t:?}"),
                "must be between 1 ms and 1 hour",
            );
        }
        if self.max_pending == 0 {
            return bad("max_pending", "0".into(), "must be at least 1");
        }
        if self.max_pending_per_source == 0 || self.max_pending_per_source > self.max_pending {
            return bad(
                "max_pending_per_source",
                self.max_pending_per_source.to_string(),
                "must be at least 1 and at most max_pending",
            );
        }
        Ok(())
    }

    /// The handshake timeout in nanoseconds.
    pub fn handshake_timeout_ns(&self) -> u64 {
        u64::try_from(self.handshake_timeout.as_nanos()).unwrap_or(u64::MAX)
    }
}

/// The address a source is counted under (see the module docs).
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let mut s = v6.segments();
                s[4..].fill(0);
                IpAddr::V6(s.into())
            }
        },
    }
}

/// Which pending entry a newcomer from `newcomer` must evict, if any: the oldest of its
/// own source once that source has `per_source` entries, else — once there are `total`
/// entries — the oldest of the source with the most entries (ties: the source holding
/// the oldest entry). `key` gives an entry's peer address (counted as [`source_of`]) and
/// its admission order (smaller is older). Returns an index into `pending`.
pub fn victim<T>(
    pending: &[T],
    newcomer: IpAddr,
    per_source: usize,
    total: usize,
    key: impl Fn(&T) -> (IpAddr, u64),
) -> Option<usize> {
    let newcomer = source_of(newcomer);
    let mut own = 0usize;
    let mut own_oldest: Option<(u64, usize)> = None;
    for (i, e) in pending.iter().enumerate() {
        let (src, order) = key(e);
        if source_of(src) == newcomer {
            own += 1;
            if !matches!(own_oldest, Some((o, _)) if o <= order) {
                own_oldest = Some((order, i));
            }
        }
    }
    if own >= per_source {
        return own_oldest.map(|(_, i)| i);
    }
    if pending.len() < total {
        return None;
    }
    // Per source: entry count and its oldest entry (order, index).
    let mut by_source: HashMap<IpAddr, (usize, u64, usize)> = HashMap::new();
    for (i, e) in pending.iter().enumerate() {
        let (src, order) = key(e);
        let s = by_source.entry(source_of(src)).or_insert((0, order, i));
        s.0 += 1;
        if order < s.1 {
            (s.1, s.2) = (order, i);
        }
    }
    by_source
        .values()
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)))
        .map(|s| s.2)
}

impl fmt::Display for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "handshake timeout {:?}, at most {} pending ({} per source)",
            self.handshake_timeout, self.max_pending, self.max_pending_per_source
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Entries as (source, order).
    fn pick(p: &[(&str, u64)], newcomer: &str, per: usize, total: usize) -> Option<usize> {
        victim(p, ip(newcomer), per, total, |e| (ip(e.0), e.1))
    }

    #[test]
    fn room_means_no_eviction() {
        let p = [("10.0.0.1", 1), ("10.0.0.2", 2)];
        assert_eq!(pick(&p, "10.0.0.1", 2, 3), None);
        assert_eq!(pick(&[], "10.0.0.1", 1, 1), None);
    }

    #[test]
    fn a_full_source_evicts_its_own_oldest() {
        let p = [
            ("10.0.0.1", 5),
            ("10.0.0.2", 1),
            ("10.0.0.1", 3),
            ("10.0.0.1", 9),
        ];
        assert_eq!(pick(&p, "10.0.0.1", 3, 100), Some(2));
        // Another source is not affected by 10.0.0.1's cap.
        assert_eq!(pick(&p, "10.0.0.3", 3, 100), None);
    }

    #[test]
    fn a_full_table_evicts_the_oldest_of_the_busiest_source() {
        let p = [
            ("10.0.0.1", 1),
            ("10.0.0.2", 4),
            ("10.0.0.2", 2),
            ("10.0.0.2", 7),
            ("10.0.0.3", 3),
        ];
        // A newcomer from a quiet source evicts from the busy one, never starved.
        assert_eq!(pick(&p, "10.0.0.9", 10, 5), Some(2));
        assert_eq!(pick(&p, "10.0.0.1", 10, 5), Some(2));
        // Ties go to the source holding the oldest entry.
        let t = [
            ("10.0.0.1", 4),
            ("10.0.0.2", 1),
            ("10.0.0.1", 5),
            ("10.0.0.2", 6),
        ];
        assert_eq!(pick(&t, "10.0.0.9", 10, 4), Some(1));
    }

    #[test]
    fn ipv6_counts_per_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(source_of(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(source_of(ip("::ffff:10.0.0.1")), ip("10.0.0.1"));
        let p = [("2001:db8:1:2::1", 1), ("2001:db8:1:2::2", 2)];
        assert_eq!(pick(&p, "2001:db8:1:2::3", 2, 10), Some(0));
        assert_eq!(pick(&p, "2001:db8:1:3::3", 2, 10), None);
        let p = [("::ffff:10.0.0.1", 1)];
        assert_eq!(pick(&p, "10.0.0.1", 1, 10), Some(0));
    }

    #[test]
    fn limits_are_checked_naming_the_field() {
        assert!(Admission::default().validate().is_ok());
        let cases = [
            (
                Admission {
                    handshake_timeout: Duration::ZERO,
                    ..Admission::default()
                },
                "handshake_timeout",
            ),
            (
                Admission {
                    handshake_timeout: Duration::from_secs(3601),
                    ..Admission::default()
                },
                "handshake_timeout",
            ),
            (
                Admission {
                    max_pending: 0,
                    ..Admission::default()
                },
                "max_pending",
            ),
            (
                Admission {
                    max_pending_per_source: 0,
                    ..Admission::default()
                },
                "max_pending_per_source",
            ),
            (
                Admission {
                    max_pending: 8,
                    max_pending_per_source: 9,
                    ..Admission::default()
                },
                "max_pending_per_source",
            ),
        ];
        for (a, field) in cases {
            let e = a.validate().unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().starts_with(field), "{e}");
        }
    }
}
