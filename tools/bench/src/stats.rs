// SPDX-License-Identifier: Apache-2.0
//! Small statistics: percentiles of latency samples and medians of rounds.

/// min/avg/p50/p99/max of a set of samples, in the samples' unit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest sample.
    pub min: f64,
    /// Mean.
    pub avg: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// Nearest-rank percentile `p` (0..=100) of sorted `v`; 0 for no samples.
pub fn percentile_sorted(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// Summarises `samples` (any order).
pub fn summarize(samples: &[f64]) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    Summary {
        n: v.len(),
        min: v[0],
        avg: v.iter().sum::<f64>() / v.len() as f64,
        p50: percentile_sorted(&v, 50.0),
        p99: percentile_sorted(&v, 99.0),
        max: v[v.len() - 1],
    }
}

/// Median of `v` (mean of the middle two for even counts); 0 if empty.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// `a / b`, or 0 when `b` is 0 (a missing measurement is never infinite).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// One window of a device-against-raw cell: units per second, CPU ns per unit of the
/// measured thread, and the driver harness's wall ns per unit (0 on the raw side).
#[derive(Debug, Clone, Copy, Default)]
pub struct Window {
    pub per_s: f64,
    pub cpu_ns: f64,
    pub harness_ns: f64,
}

/// What interleaved rounds of a cell give: the medians of both sides' rates and CPU, and the
/// harness's share, least over the device's rounds (a preemption inside a turn only inflates
/// it; only the turn's own work is the harness's cost).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Medians {
    pub dev_per_s: f64,
    pub raw_per_s: f64,
    pub dev_cpu_ns: f64,
    pub raw_cpu_ns: f64,
    pub harness_ns: f64,
}

/// The [`Medians`] of `dev`'s and `raw`'s windows.
pub fn medians(dev: &[Window], raw: &[Window]) -> Medians {
    let med = |v: &[Window], f: fn(&Window) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
    let h = dev
        .iter()
        .map(|s| s.harness_ns)
        .fold(f64::INFINITY, f64::min);
    Medians {
        dev_per_s: med(dev, |s| s.per_s),
        raw_per_s: med(raw, |s| s.per_s),
        dev_cpu_ns: med(dev, |s| s.cpu_ns),
        raw_cpu_ns: med(raw, |s| s.cpu_ns),
        harness_ns: if h.is_finite() { h } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile_sorted(&v, 99.0), 99.0);
        assert_eq!(percentile_sorted(&v, 50.0), 50.0);
        assert_eq!(percentile_sorted(&v, 100.0), 100.0);
        assert_eq!(percentile_sorted(&v, 0.0), 1.0);
        assert_eq!(percentile_sorted(&[7.0], 99.0), 7.0);
        assert_eq!(percentile_sorted(&[], 99.0), 0.0);
    }

    #[test]
    fn summary_of_unsorted_samples() {
        let s = summarize(&[5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!((s.n, s.min, s.max, s.p50), (5, 1.0, 5.0, 3.0));
        assert!((s.avg - 3.0).abs() < 1e-12);
        assert_eq!(s.p99, 5.0);
    }

    #[test]
    fn median_and_ratio() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(ratio(9.0, 10.0), 0.9);
        assert_eq!(ratio(1.0, 0.0), 0.0);
    }

    #[test]
    fn medians_of_rounds_and_the_least_harness() {
        let w = |per_s, cpu_ns, harness_ns| Window {
            per_s,
            cpu_ns,
            harness_ns,
        };
        let m = medians(
            &[w(10.0, 5.0, 3.0), w(30.0, 7.0, 1.0), w(20.0, 6.0, 2.0)],
            &[w(40.0, 1.0, 0.0), w(50.0, 2.0, 0.0)],
        );
        assert_eq!(
            m,
            Medians {
                dev_per_s: 20.0,
                raw_per_s: 45.0,
                dev_cpu_ns: 6.0,
                raw_cpu_ns: 1.5,
                harness_ns: 1.0,
            }
        );
        assert_eq!(medians(&[], &[]).harness_ns, 0.0);
    }
}
