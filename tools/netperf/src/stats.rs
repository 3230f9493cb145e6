// SPDX-License-Identifier: Apache-2.0
//! Latency statistics for the request/response tests.
//!
//! A test can run for minutes at tens of thousands of transactions per second, so samples are not
//! kept: they go into a log-linear histogram (HDR-style). Values below 128 ns are exact; above,
//! each power of two is split into 64 buckets, so a reported percentile is within 1/64 (1.6 %)
//! of a real sample. The mean, min and max are exact.

use std::time::Duration;

/// Values below this are stored exactly, one bucket each.
const LINEAR_LIMIT: u64 = 128;
/// log2 of the number of sub-buckets per power of two above `LINEAR_LIMIT`.
const SUB_BITS: u32 = 6;
const SUB_COUNT: u64 = 1 << SUB_BITS;
/// Exponent of `LINEAR_LIMIT` (2^7).
const FIRST_EXP: u32 = 7;
/// Enough buckets for every `u64`: exponents 7..=63.
const BUCKETS: usize = LINEAR_LIMIT as usize + (64 - FIRST_EXP as usize) * SUB_COUNT as usize;

/// Histogram of durations in nanoseconds.
#[derive(Debug, Clone)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum_ns: u128,
    min_ns: u64,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn bucket_index(v: u64) -> usize {
    if v < LINEAR_LIMIT {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros();
    let shift = exp - SUB_BITS;
    // The top SUB_BITS+1 bits, leading one included: SUB_COUNT..2*SUB_COUNT.
    let sub = (v >> shift) - SUB_COUNT;
    LINEAR_LIMIT as usize + (exp - FIRST_EXP) as usize * SUB_COUNT as usize + sub as usize
}

/// The midpoint of a bucket, the value reported for samples that fell in it.
fn bucket_value(idx: usize) -> u64 {
    if (idx as u64) < LINEAR_LIMIT {
        return idx as u64;
    }
    let i = idx as u64 - LINEAR_LIMIT;
    let exp = (i / SUB_COUNT) as u32 + FIRST_EXP;
    let sub = i % SUB_COUNT + SUB_COUNT;
    let shift = exp - SUB_BITS;
    (sub << shift) + ((1u64 << shift) / 2)
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self {
            buckets: vec![0; BUCKETS],
            count: 0,
            sum_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
        }
    }

    /// Adds one sample.
    pub fn record(&mut self, d: Duration) {
        let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.buckets[bucket_index(ns)] += 1;
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.min_ns = self.min_ns.min(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    /// Exact mean in microseconds, `None` without samples.
    pub fn mean_us(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_ns as f64 / self.count as f64 / 1000.0)
    }

    /// Exact minimum in microseconds.
    pub fn min_us(&self) -> Option<f64> {
        (self.count > 0).then(|| self.min_ns as f64 / 1000.0)
    }

    /// Exact maximum in microseconds.
    pub fn max_us(&self) -> Option<f64> {
        (self.count > 0).then(|| self.max_ns as f64 / 1000.0)
    }

    /// The `q`-quantile (0 < q ≤ 1) in microseconds: the smallest bucket holding at least
    /// `ceil(q * count)` samples, clamped to the exact min/max so it never leaves their range.
    pub fn percentile_us(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0u64;
        for (idx, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let v = bucket_value(idx).clamp(self.min_ns, self.max_ns);
                return Some(v as f64 / 1000.0);
            }
        }
        // Unreachable while bucket counts sum to `count`; the max is the honest fallback.
        Some(self.max_ns as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in (0..1_000_000u64).step_by(7).chain([u64::MAX / 3, u64::MAX]) {
            let idx = bucket_index(v);
            assert!(idx < BUCKETS);
            assert!(idx >= last, "index went down at {v}");
            last = idx;
            let rep = bucket_value(idx) as f64;
            let err = (rep - v as f64).abs() / (v.max(1) as f64);
            assert!(err <= 1.0 / 64.0, "value {v} reported as {rep}");
        }
    }

    #[test]
    fn exact_below_linear_limit() {
        for v in 0..LINEAR_LIMIT {
            assert_eq!(bucket_value(bucket_index(v)), v);
        }
    }

    #[test]
    fn percentiles_of_known_distribution() {
        let mut h = Histogram::new();
        assert_eq!(h.percentile_us(0.5), None);
        assert_eq!(h.mean_us(), None);
        // 1..=1000 microseconds.
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        assert_eq!(h.count, 1000);
        let p50 = h.percentile_us(0.5).expect("samples");
        let p99 = h.percentile_us(0.99).expect("samples");
        assert!((p50 - 500.0).abs() / 500.0 < 0.02, "p50 {p50}");
        assert!((p99 - 990.0).abs() / 990.0 < 0.02, "p99 {p99}");
        assert!(p50 <= p99);
        assert!((h.mean_us().expect("samples") - 500.5).abs() < 1e-9);
        assert_eq!(h.min_us(), Some(1.0));
        assert_eq!(h.max_us(), Some(1000.0));
    }

    #[test]
    fn single_sample_percentiles_equal_it() {
        let mut h = Histogram::new();
        h.record(Duration::from_nanos(12_345));
        assert_eq!(h.percentile_us(0.5), Some(12.345));
        assert_eq!(h.percentile_us(0.99), Some(12.345));
    }
}
