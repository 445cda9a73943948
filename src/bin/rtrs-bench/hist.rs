//! A log-linear latency histogram (HDR-style): exact below 32 ns, then 16 buckets per
//! power of two, so any recorded value is known within 1/16 (6.25 %). Fixed size,
//! allocated once per core; recording is an index computation and an increment.

/// Sub-buckets per power of two, as a bit count.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets covering every u64.
pub const BUCKETS: usize = ((64 - SUB_BITS as usize) * SUB as usize) + SUB as usize;

/// Latencies in nanoseconds.
#[derive(Clone, Debug)]
pub struct Hist {
    counts: Vec<u64>,
    n: u64,
    sum: u128,
    max: u64,
}

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    let b = e - SUB_BITS;
    // v >> b lies in [SUB, 2 * SUB).
    (u64::from(b) * SUB + (v >> b)) as usize
}

/// The lowest value of bucket `i` and its width.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < 2 * SUB {
        return (i, 1);
    }
    let b = i / SUB - 1;
    let m = i % SUB + SUB;
    (m << b, 1 << b)
}

impl Hist {
    pub fn new() -> Hist {
        Hist {
            counts: vec![0; BUCKETS],
            n: 0,
            sum: 0,
            max: 0,
        }
    }

    pub fn record(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.n += 1;
        self.sum += u128::from(ns);
        self.max = self.max.max(ns);
    }

    pub fn merge(&mut self, other: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// Mean in ns (0 when empty).
    pub fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The value below which a fraction `q` (0..=1) of the samples lie: the middle of
    /// the bucket holding the ⌈q·n⌉-th sample, capped at the maximum seen.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (low, width) = bounds(i);
                return (low + width / 2).min(self.max);
            }
        }
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_tight() {
        let mut prev_end = 0;
        for i in 0..BUCKETS {
            let (low, width) = bounds(i);
            assert_eq!(low, prev_end, "bucket {i}");
            assert_eq!(index(low), i);
            assert_eq!(index(low + (width - 1)), i);
            prev_end = low.wrapping_add(width);
            if low >= 32 {
                assert!(width * 16 <= low, "bucket {i} too wide");
            }
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles() {
        let mut h = Hist::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.07, "{p50}");
        let p99 = h.quantile(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.07, "{p99}");
        let top = h.quantile(1.0);
        assert!(
            (1_000_000 - 1_000_000 / 16..=1_000_000).contains(&top),
            "{top}"
        );
        assert_eq!(h.max(), 1_000_000);
        assert_eq!(h.n, 1000);
        assert!((h.mean() - 500_500.0).abs() < 1.0);
    }
}
