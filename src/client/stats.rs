//! Client statistics: the kernel's `rtrs-clt-stats.c` and sysfs `stats/` files
//! (docs/PROTOCOL.md §8.1) — rdma read/write counts and bytes, in-flight, failover count,
//! reconnects (successful, failed), cpu migration from/to — plus what the kernel dropped
//! and a polled engine gets nearly for free: sg entries per request, completions per poll
//! (`wc_completion`), a per-IO latency histogram, the heartbeat latency, and why a path
//! is down (its latest failure, and whether it stopped trying).
//!
//! Successful reconnects are counted when one happens: a connection established by any
//! attempt but the path's first. The kernel instead starts `successful_cnt` at −1 and
//! counts every establishment, which reads the same once a path connected at its first
//! try, but −1 for a path that never connected; here no counter can go below zero.
//!
//! Counters of the data path live per (path, core) in `CoreStats`: only that core writes
//! them (a relaxed load and store, no locked instruction); anyone may read them. A reset
//! (the kernel's `reset_all`) writes none of them: it keeps the snapshot taken at the reset
//! as the path's baseline, and later snapshots count from there ([`ClientPathStats::since`]), so
//! every counter keeps its one writer. Snapshots serialise with serde
//! ([`ClientStats::to_json`]); the JSON names follow the kernel's sysfs files (`rdma`,
//! `reconnects`, `wc_completion`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Serialize, Serializer};

/// A counter with a single writer, the core of its (path, core) pair.
pub(crate) use crate::sync::SoloCounter as Ctr;

/// Latency histogram buckets: bucket `i` counts IOs of `[2^i, 2^(i+1))` ns (bucket 0
/// also 0 ns); the last bucket takes everything longer (2^39 ns ≈ 9 min).
pub const LAT_BUCKETS: usize = 40;
/// Scatter-gather histogram buckets: bucket `n` counts requests with `n` entries, the
/// last bucket everything above.
pub const SG_BUCKETS: usize = 18;

/// The bucket of a latency in ns.
pub(crate) fn lat_bucket(ns: u64) -> usize {
    (63 - (ns | 1).leading_zeros() as usize).min(LAT_BUCKETS - 1)
}

/// Data-path counters of one path on one core. Each core's counters start a cache line
/// pair of their own, so neighbouring cores never write one line.
#[derive(Debug)]
#[repr(align(128))]
pub(crate) struct CoreStats {
    pub read_cnt: Ctr,
    pub read_bytes: Ctr,
    pub write_cnt: Ctr,
    pub write_bytes: Ctr,
    /// Requests in flight on the path posted under min-inflight (the kernel's gauge).
    pub inflight: Ctr,
    /// Requests failed over onto this path.
    pub failover_cnt: Ctr,
    /// Completions expected on this core but processed elsewhere (stays 0: each
    /// connection is polled by its own core), and the reverse.
    pub cpu_migration_from: Ctr,
    pub cpu_migration_to: Ctr,
    pub sg_entries: [Ctr; SG_BUCKETS],
    /// Polls that returned at least one completion, the completions they returned, and
    /// the most one poll returned.
    pub wc_polls: Ctr,
    pub wc_total: Ctr,
    pub wc_max: Ctr,
    pub latency: [Ctr; LAT_BUCKETS],
    /// READs whose reply went straight into the caller's registered region.
    pub direct_reads: Ctr,
}

impl Default for CoreStats {
    fn default() -> Self {
        CoreStats {
            read_cnt: Ctr::default(),
            read_bytes: Ctr::default(),
            write_cnt: Ctr::default(),
            write_bytes: Ctr::default(),
            inflight: Ctr::default(),
            failover_cnt: Ctr::default(),
            cpu_migration_from: Ctr::default(),
            cpu_migration_to: Ctr::default(),
            sg_entries: std::array::from_fn(|_| Ctr::default()),
            wc_polls: Ctr::default(),
            wc_total: Ctr::default(),
            wc_max: Ctr::default(),
            latency: std::array::from_fn(|_| Ctr::default()),
            direct_reads: Ctr::default(),
        }
    }
}

impl CoreStats {
    /// A request posted (bytes = user header + data, as the kernel counts them).
    #[inline]
    pub fn on_post(&self, write: bool, bytes: u64, sg: usize) {
        if write {
            self.write_cnt.add(1);
            self.write_bytes.add(bytes);
        } else {
            self.read_cnt.add(1);
            self.read_bytes.add(bytes);
        }
        self.sg_entries[sg.min(SG_BUCKETS - 1)].add(1);
    }

    /// One CQ poll returned `n` completions.
    #[inline]
    pub fn on_poll(&self, n: usize) {
        if n > 0 {
            self.wc_polls.add(1);
            self.wc_total.add(n as u64);
            self.wc_max.max(n as u64);
        }
    }

    /// A request completed after `ns` nanoseconds.
    #[inline]
    pub fn on_latency(&self, ns: u64) {
        self.latency[lat_bucket(ns)].add(1);
    }
}

/// Counters of a path kept by its home core.
#[derive(Debug, Default)]
pub(crate) struct HomeStats {
    /// Connections established by an attempt other than the path's first (after a
    /// failed attempt or a lost connection), counted as each happens.
    pub reconnect_ok: AtomicU64,
    /// Attempts that failed.
    pub reconnect_fail: AtomicU64,
    /// Last heartbeat round trip in ns (0 until the first ack).
    pub hb_latency_ns: AtomicU64,
}

/// The kernel's `stats/rdma` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct RdmaStats {
    pub read_cnt: u64,
    pub read_bytes: u64,
    pub write_cnt: u64,
    pub write_bytes: u64,
    pub inflight: u64,
    pub failover_cnt: u64,
}

/// Completions per poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct WcStats {
    pub polls: u64,
    pub completions: u64,
    pub max_per_poll: u64,
}

/// A snapshot of one path's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClientPathStats {
    /// `src@dst` or `dst`.
    pub path: String,
    pub state: String,
    /// The RDMA device and port of the path's connection (the kernel's `hca_name` and
    /// `hca_port`); `None` on the software fabrics and before a connection.
    pub hca_name: Option<String>,
    pub hca_port: Option<u8>,
    /// Why the path stopped trying until a manual reconnect: no reconnect attempts left
    /// (`max_reconnect_attempts`), or a failed authentication. `None` otherwise.
    pub failure: Option<String>,
    /// Why its latest connection attempt failed, or why its connection was lost (`None`
    /// while connected, and before anything failed).
    pub last_error: Option<String>,
    pub cur_latency_ns: u64,
    pub rdma: RdmaStats,
    /// Reconnects that succeeded (see the module doc: never below zero).
    pub reconnects_ok: u64,
    pub reconnects_fail: u64,
    /// Per core.
    pub cpu_migration_from: Vec<u64>,
    pub cpu_migration_to: Vec<u64>,
    /// Requests by scatter-gather entries (see [`SG_BUCKETS`]).
    pub sg_entries: Vec<u64>,
    pub wc_completion: WcStats,
    /// IO latency histogram (see [`LAT_BUCKETS`]).
    pub latency_hist: Vec<u64>,
    /// READs answered straight into the caller's memory (no bounce copy).
    pub direct_reads: u64,
}

impl ClientPathStats {
    /// Sums the per-core counters of a path; `why` is its `failure` and `last_error`.
    pub(crate) fn collect(
        path: String,
        state: String,
        why: (Option<String>, Option<String>),
        home: &HomeStats,
        cores: &[&CoreStats],
    ) -> ClientPathStats {
        let (failure, last_error) = why;
        let mut s = ClientPathStats {
            path,
            state,
            failure,
            last_error,
            cur_latency_ns: home.hb_latency_ns.load(Ordering::Relaxed),
            reconnects_ok: home.reconnect_ok.load(Ordering::Relaxed),
            reconnects_fail: home.reconnect_fail.load(Ordering::Relaxed),
            sg_entries: vec![0; SG_BUCKETS],
            latency_hist: vec![0; LAT_BUCKETS],
            ..ClientPathStats::default()
        };
        for c in cores {
            s.rdma.read_cnt += c.read_cnt.get();
            s.rdma.read_bytes += c.read_bytes.get();
            s.rdma.write_cnt += c.write_cnt.get();
            s.rdma.write_bytes += c.write_bytes.get();
            s.rdma.inflight += c.inflight.get();
            s.rdma.failover_cnt += c.failover_cnt.get();
            s.cpu_migration_from.push(c.cpu_migration_from.get());
            s.cpu_migration_to.push(c.cpu_migration_to.get());
            for (d, x) in s.sg_entries.iter_mut().zip(&c.sg_entries) {
                *d += x.get();
            }
            for (d, x) in s.latency_hist.iter_mut().zip(&c.latency) {
                *d += x.get();
            }
            s.direct_reads += c.direct_reads.get();
            s.wc_completion.polls += c.wc_polls.get();
            s.wc_completion.completions += c.wc_total.get();
            s.wc_completion.max_per_poll = s.wc_completion.max_per_poll.max(c.wc_max.get());
        }
        s
    }

    /// What was counted since `base`, a snapshot of the same path taken at a reset (the
    /// kernel's `reset_all`). Gauges are not counts and stay as they are: in-flight, the
    /// heartbeat latency and the most completions one poll returned; so do the path's
    /// state and failures.
    pub fn since(mut self, base: &ClientPathStats) -> ClientPathStats {
        fn sub(a: &mut u64, b: u64) {
            *a = a.saturating_sub(b);
        }
        fn sub_all(a: &mut [u64], b: &[u64]) {
            a.iter_mut().zip(b).for_each(|(a, &b)| sub(a, b));
        }
        let (r, b) = (&mut self.rdma, &base.rdma);
        sub(&mut r.read_cnt, b.read_cnt);
        sub(&mut r.read_bytes, b.read_bytes);
        sub(&mut r.write_cnt, b.write_cnt);
        sub(&mut r.write_bytes, b.write_bytes);
        sub(&mut r.failover_cnt, b.failover_cnt);
        sub(&mut self.reconnects_ok, base.reconnects_ok);
        sub(&mut self.reconnects_fail, base.reconnects_fail);
        sub_all(&mut self.cpu_migration_from, &base.cpu_migration_from);
        sub_all(&mut self.cpu_migration_to, &base.cpu_migration_to);
        sub_all(&mut self.sg_entries, &base.sg_entries);
        sub_all(&mut self.latency_hist, &base.latency_hist);
        sub(&mut self.wc_completion.polls, base.wc_completion.polls);
        sub(
            &mut self.wc_completion.completions,
            base.wc_completion.completions,
        );
        sub(&mut self.direct_reads, base.direct_reads);
        self
    }

    /// The kernel's `stats/rdma` line: read_cnt, read_bytes, write_cnt, write_bytes,
    /// inflight and failover_cnt, space-separated.
    pub fn rdma_line(&self) -> String {
        let r = &self.rdma;
        format!(
            "{} {} {} {} {} {}",
            r.read_cnt, r.read_bytes, r.write_cnt, r.write_bytes, r.inflight, r.failover_cnt
        )
    }

    /// The kernel's `stats/reconnects` line: `successful failed`.
    pub fn reconnects_line(&self) -> String {
        format!("{} {}", self.reconnects_ok, self.reconnects_fail)
    }
}

/// The JSON form of [`ClientPathStats`]: the reconnect counters nest as the kernel's
/// `stats/reconnects` file names them, and the histogram's name gives its unit.
#[derive(Serialize)]
struct PathJson<'a> {
    path: &'a str,
    state: &'a str,
    hca_name: Option<&'a str>,
    hca_port: Option<u8>,
    failure: Option<&'a str>,
    last_error: Option<&'a str>,
    cur_latency_ns: u64,
    rdma: &'a RdmaStats,
    reconnects: ReconnectsJson,
    cpu_migration_from: &'a [u64],
    cpu_migration_to: &'a [u64],
    sg_entries: &'a [u64],
    wc_completion: &'a WcStats,
    latency_hist_log2_ns: &'a [u64],
    direct_reads: u64,
}

#[derive(Serialize)]
struct ReconnectsJson {
    successful: u64,
    failed: u64,
}

impl Serialize for ClientPathStats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Destructured so a field added to PathStats cannot be left out of the JSON.
        let ClientPathStats {
            path,
            state,
            hca_name,
            hca_port,
            failure,
            last_error,
            cur_latency_ns,
            rdma,
            reconnects_ok,
            reconnects_fail,
            cpu_migration_from,
            cpu_migration_to,
            sg_entries,
            wc_completion,
            latency_hist,
            direct_reads,
        } = self;
        PathJson {
            path,
            state,
            hca_name: hca_name.as_deref(),
            hca_port: *hca_port,
            failure: failure.as_deref(),
            last_error: last_error.as_deref(),
            cur_latency_ns: *cur_latency_ns,
            rdma,
            reconnects: ReconnectsJson {
                successful: *reconnects_ok,
                failed: *reconnects_fail,
            },
            cpu_migration_from,
            cpu_migration_to,
            sg_entries,
            wc_completion,
            latency_hist_log2_ns: latency_hist,
            direct_reads: *direct_reads,
        }
        .serialize(s)
    }
}

/// A snapshot of a client session's statistics.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ClientStats {
    pub sessname: String,
    pub mp_policy: String,
    pub paths: Vec<ClientPathStats>,
}

impl ClientStats {
    /// One JSON object: `{"sessname":..,"mp_policy":..,"paths":[{..},..]}`.
    pub fn to_json(&self) -> String {
        // Plain structs with string keys and integers: serialising cannot fail.
        serde_json::to_string(self).expect("client statistics serialise to JSON")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_sum_per_core_and_render_json() {
        let home = HomeStats::default();
        let a = CoreStats::default();
        let b = CoreStats::default();
        a.on_post(true, 4096 + 32, 1);
        b.on_post(false, 512 + 32, 3);
        b.on_post(false, 512 + 32, 200);
        a.failover_cnt.add(1);
        a.on_poll(3);
        b.on_poll(0);
        b.on_poll(5);
        a.on_latency(1500);
        home.reconnect_ok.fetch_add(1, Ordering::Relaxed);
        let s = ClientPathStats::collect(
            "127.0.0.1:1234".into(),
            "connected".into(),
            (None, None),
            &home,
            &[&a, &b],
        );
        assert_eq!(s.rdma_line(), "2 1088 1 4128 0 1");
        assert_eq!(s.reconnects_line(), "1 0");
        assert_eq!(s.cpu_migration_from, vec![0, 0]);
        assert_eq!(s.wc_completion.polls, 2);
        assert_eq!(s.wc_completion.completions, 8);
        assert_eq!(s.wc_completion.max_per_poll, 5);
        assert_eq!(s.sg_entries[1] + s.sg_entries[3] + s.sg_entries[17], 3);
        assert_eq!(s.latency_hist[lat_bucket(1500)], 1);
        assert_eq!(lat_bucket(0), 0);
        assert_eq!(lat_bucket(1024), 10);
        assert_eq!(lat_bucket(u64::MAX), LAT_BUCKETS - 1);
        let all = ClientStats {
            sessname: "s\"1".into(),
            mp_policy: "min-inflight".into(),
            paths: vec![s],
        };
        let j = all.to_json();
        assert!(
            j.starts_with("{\"sessname\":\"s\\\"1\",\"mp_policy\":\"min-inflight\",\"paths\":[{"),
            "{j}"
        );
        assert!(j.contains("\"rdma\":{\"read_cnt\":2,\"read_bytes\":1088,\"write_cnt\":1,\"write_bytes\":4128,\"inflight\":0,\"failover_cnt\":1}"), "{j}");
        assert!(
            j.contains("\"reconnects\":{\"successful\":1,\"failed\":0}"),
            "{j}"
        );
        assert!(
            j.contains(
                "\"state\":\"connected\",\"hca_name\":null,\"hca_port\":null,\"failure\":null,\"last_error\":null,"
            ),
            "{j}"
        );
        assert!(j.ends_with("]}"));
    }

    #[test]
    fn a_reset_counts_from_its_baseline_and_writes_no_counter() {
        let home = HomeStats::default();
        let c = CoreStats::default();
        let snap = |c: &CoreStats| {
            ClientPathStats::collect("p".into(), "connected".into(), (None, None), &home, &[c])
        };
        c.on_post(true, 4096, 1);
        c.inflight.add(2);
        c.on_poll(7);
        c.on_latency(1500);
        home.reconnect_fail.fetch_add(3, Ordering::Relaxed);
        home.reconnect_ok.fetch_add(2, Ordering::Relaxed);
        let base = snap(&c);
        // The reset: nothing counted since, gauges as they are.
        let s = snap(&c).since(&base);
        assert_eq!(s.rdma_line(), "0 0 0 0 2 0");
        assert_eq!(s.reconnects_line(), "0 0");
        assert_eq!(s.latency_hist.iter().sum::<u64>(), 0);
        assert_eq!(s.sg_entries.iter().sum::<u64>(), 0);
        assert_eq!(
            (s.wc_completion.polls, s.wc_completion.max_per_poll),
            (0, 7)
        );
        // What comes after is counted from there; the core's own counters kept counting.
        c.on_post(false, 512, 2);
        c.on_latency(1500);
        home.reconnect_ok.fetch_add(1, Ordering::Relaxed);
        let s = snap(&c).since(&base);
        assert_eq!(s.rdma_line(), "1 512 0 0 2 0");
        assert_eq!(s.reconnects_line(), "1 0");
        assert_eq!(s.latency_hist[lat_bucket(1500)], 1);
        assert_eq!(c.write_cnt.get(), 1, "the reset wrote no counter");
    }
}
