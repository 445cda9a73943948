//! Server statistics: the kernel's `rtrs-srv-stats.c` per-path `rdma` counters (read and
//! write counts and bytes, bytes being the imm offset = data + user header) plus what a
//! polled engine sees for free: requests in flight, requests that waited for a chunk
//! still busy on another path (failover), failed-over copies answered from the execution
//! of the request they copy, responses queued for lack of send slots, and
//! requests dropped because their path was closing, and a log2 histogram of the time
//! requests spent with the handler. Snapshots serialise with serde
//! ([`ServerStats::to_json`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::SoloCounter;

use serde::Serialize;

/// Buckets of the handler-latency histogram: bucket `k` counts requests answered in
/// `[2^k, 2^(k+1))` µs (bucket 0 also takes everything under 2 µs, the last everything
/// above).
pub const LAT_BUCKETS: usize = 24;

/// One core's counters of a path: written only by that core ([`SoloCounter`]), read by
/// anyone; aligned so two cores never share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CoreCounters {
    pub lat: [SoloCounter; LAT_BUCKETS],
    pub lat_sum_ns: SoloCounter,
    pub read_cnt: SoloCounter,
    pub read_bytes: SoloCounter,
    pub write_cnt: SoloCounter,
    pub write_bytes: SoloCounter,
    pub failover_waits: SoloCounter,
    pub failover_dups: SoloCounter,
    pub rsp_queued: SoloCounter,
    pub dropped: SoloCounter,
    /// Requests of the path this core holds now, in any state (see
    /// [`PathCounters::hold`]).
    held: SoloCounter,
}

impl CoreCounters {
    /// Records one request's time with the handler.
    pub fn record_latency(&self, ns: u64) {
        let us = (ns / 1000).max(1);
        let k = (63 - us.leading_zeros() as usize).min(LAT_BUCKETS - 1);
        self.lat[k].add(1);
        self.lat_sum_ns.add(ns);
    }
}

/// Live counters of one path, one [`CoreCounters`] per core serving its connections
/// (the per-IO counters cost no atomic read-modify-write and no cache-line transfer
/// between cores); readers sum them.
#[derive(Debug)]
pub(crate) struct PathCounters {
    cores: Box<[CoreCounters]>,
    /// Held requests of cores beyond `cores` (which a server never has): shared, so
    /// counted with read-modify-writes.
    held_beyond: AtomicU64,
}

impl PathCounters {
    /// Counters for a server of `cores` cores.
    pub fn new(cores: usize) -> PathCounters {
        PathCounters {
            cores: (0..cores.max(1)).map(|_| CoreCounters::default()).collect(),
            held_beyond: AtomicU64::new(0),
        }
    }

    /// The counters core `core` writes (a core beyond the server's count, which the
    /// server never has, would share the first core's: counts could be lost, nothing
    /// worse).
    pub fn core(&self, core: usize) -> &CoreCounters {
        self.cores.get(core).unwrap_or(&self.cores[0])
    }

    /// Core `core` took one of the path's requests. Each core counts its own with a
    /// plain load and store (it is the count's only writer); the release store orders
    /// the core's work on the request before a reader that sees the count.
    pub fn hold(&self, core: usize) {
        self.move_held(core, 1);
    }

    /// Core `core` is done with one of the requests it [held](Self::hold).
    pub fn unhold(&self, core: usize) {
        self.move_held(core, 1u64.wrapping_neg());
    }

    /// Adds `delta` (wrapping) to `core`'s held count.
    fn move_held(&self, core: usize, delta: u64) {
        match self.cores.get(core) {
            Some(c) => c.held.add(delta),
            None => {
                self.held_beyond.fetch_add(delta, Ordering::AcqRel);
            }
        }
    }

    /// The path's requests held by all cores: exact once no core can take a new one
    /// (the counts then only fall, so reading them one after the other is enough).
    pub fn held(&self) -> u64 {
        self.cores
            .iter()
            .map(|c| c.held.get())
            .fold(self.held_beyond.load(Ordering::Acquire), u64::wrapping_add)
    }

    fn sum(&self, f: impl Fn(&CoreCounters) -> &SoloCounter) -> u64 {
        self.cores
            .iter()
            .map(|c| f(c).get())
            .fold(0, u64::wrapping_add)
    }

    /// The histogram and the latency sum.
    pub fn latency(&self) -> (Vec<u64>, u64) {
        (
            (0..LAT_BUCKETS).map(|k| self.sum(|c| &c.lat[k])).collect(),
            self.sum(|c| &c.lat_sum_ns),
        )
    }

    pub fn snapshot(&self) -> [u64; 8] {
        [
            self.sum(|c| &c.read_cnt),
            self.sum(|c| &c.read_bytes),
            self.sum(|c| &c.write_cnt),
            self.sum(|c| &c.write_bytes),
            self.sum(|c| &c.failover_waits),
            self.sum(|c| &c.failover_dups),
            self.sum(|c| &c.rsp_queued),
            self.sum(|c| &c.dropped),
        ]
    }
}

/// One path's statistics (serialised with these field names, in this order).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ServerPathStats {
    /// The client's pathname from INFO_REQ (empty before it).
    pub name: String,
    /// The path's addresses as the kernel names its sysfs directory:
    /// `<client addr>@<server addr>`.
    pub addr: String,
    /// `connecting`, `connected`, `closing` or `closed`.
    pub state: &'static str,
    /// The RDMA device and port the path lives on (the kernel's `hca_name`,
    /// `hca_port`); `None` on the software fabrics.
    pub hca_name: Option<String>,
    pub hca_port: Option<u8>,
    /// Connections in the path (cid_num).
    pub cid_num: u16,
    /// The client's reconnect counter from the latest connection request.
    pub recon_cnt: u16,
    pub read_cnt: u64,
    pub read_bytes: u64,
    pub write_cnt: u64,
    pub write_bytes: u64,
    /// Requests currently owned by the server (in the handler or queued).
    pub inflight: u64,
    /// Requests that waited for their chunk to be released by another path.
    pub failover_waits: u64,
    /// Failed-over copies of a request that arrived while the request itself was still
    /// pending on another path, answered with its result instead of executing again.
    pub failover_dups: u64,
    /// Responses that had to wait for send-queue slots.
    pub rsp_queued: u64,
    /// Requests dropped unanswered because the path was no longer connected.
    pub dropped: u64,
    /// Sum of handler latencies in ns (divide by the bucket total for the mean).
    pub handler_lat_sum_ns: u64,
    /// Handler latency histogram ([`LAT_BUCKETS`] log2 buckets of µs).
    pub handler_lat_us_log2: Vec<u64>,
}

/// One session's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct SessionStats {
    pub id: u64,
    /// The client's session name (empty until the first INFO_REQ).
    pub name: String,
    pub queue_depth: u16,
    pub chunk_size: u32,
    /// Where the chunk pool's memory comes from (`"heap"`, `"spdk_dma"`).
    pub chunk_memory: &'static str,
    pub paths: Vec<ServerPathStats>,
}

/// The whole server's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ServerStats {
    pub sessions: Vec<SessionStats>,
}

impl ServerPathStats {
    /// The kernel's `stats/rdma` line: `read_cnt read_bytes write_cnt write_bytes`.
    pub fn rdma_line(&self) -> String {
        format!(
            "{} {} {} {}",
            self.read_cnt, self.read_bytes, self.write_cnt, self.write_bytes
        )
    }
}

impl ServerStats {
    /// One JSON object: `{"sessions":[{"id":..,"name":..,"paths":[{..}]}]}`.
    pub fn to_json(&self) -> String {
        // Plain structs with string keys and integers: serialising cannot fail.
        serde_json::to_string(self).expect("server statistics serialise to JSON")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn latency_buckets() {
        let c = PathCounters::new(1);
        c.core(0).record_latency(500);
        c.core(0).record_latency(3_000);
        c.core(0).record_latency(1_000_000_000_000);
        let (h, sum) = c.latency();
        assert_eq!((h[0], h[1], h[LAT_BUCKETS - 1]), (1, 1, 1));
        assert_eq!(sum, 1_000_000_003_500);
    }

    #[test]
    fn cores_count_apart_and_sum() {
        let c = PathCounters::new(2);
        c.core(0).read_cnt.add(2);
        c.core(1).read_cnt.add(3);
        c.core(1).dropped.add(1);
        c.core(0).record_latency(5_000);
        c.core(1).record_latency(5_000);
        assert_eq!(c.snapshot(), [5, 0, 0, 0, 0, 0, 0, 1]);
        let (h, sum) = c.latency();
        assert_eq!((h[2], sum), (2, 10_000));
        // Each core's counters sit on cache lines of their own.
        let (a, b) = (
            c.core(0) as *const CoreCounters,
            c.core(1) as *const CoreCounters,
        );
        assert!(b as usize - a as usize >= 128);
    }

    #[test]
    fn held_requests_sum_over_cores_and_beyond() {
        let c = Arc::new(PathCounters::new(2));
        // Two cores, each the only writer of its count, take and end requests at once;
        // a core beyond the count shares the read-modify-write fallback.
        let workers: Vec<_> = [0usize, 1, 5]
            .into_iter()
            .map(|core| {
                let c = Arc::clone(&c);
                std::thread::spawn(move || {
                    for k in 0..10_000 {
                        c.hold(core);
                        if k % 3 != 0 {
                            c.unhold(core);
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        // 3,334 of each core's 10,000 are still held.
        assert_eq!(c.held(), 3 * 3_334);
        for core in [0, 1, 5] {
            for _ in 0..3_334 {
                c.unhold(core);
            }
        }
        assert_eq!(c.held(), 0);
    }

    #[test]
    fn rdma_line() {
        let p = ServerPathStats {
            read_cnt: 2,
            read_bytes: 100,
            write_cnt: 1,
            write_bytes: 7,
            ..ServerPathStats::default()
        };
        assert_eq!(p.rdma_line(), "2 100 1 7");
    }
}
