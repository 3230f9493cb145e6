// SPDX-License-Identifier: Apache-2.0
//! Rate-limited warnings for conditions a guest can cause.
//!
//! A guest can repeat a bad register access or a malformed chain as fast as
//! it runs, and no such repetition may flood the host log. Every device
//! follows one rule: the 1st, 2nd, 4th, 8th… occurrence of a condition is
//! logged, with its running count, so a flood of `n` costs about `log2(n)`
//! lines and its size stays visible in the last one.
//!
//! [`warn_rate_limited!`] counts occurrences in a counter of its own, one per
//! call site, or takes the count from the caller (`count = n`) where a metric
//! already counts the condition: then the log and the metric agree.

/// Whether the `count`th occurrence of a condition is logged (see the
/// module doc).
#[inline]
pub(crate) fn should_log(count: u64) -> bool {
    count.is_power_of_two()
}

/// Logs `warn!` for a guest-caused condition under the rule of this module:
/// `warn_rate_limited!(count = n, "...")` with the caller's count (a metric
/// the caller just incremented), or `warn_rate_limited!("...")` with a
/// counter kept for this call site.
macro_rules! warn_rate_limited {
    (count = $count:expr, $($arg:tt)+) => {{
        let n: u64 = $count;
        if $crate::warn::should_log(n) {
            ::log::warn!("{} (occurrence {})", format_args!($($arg)+), n);
        }
    }};
    ($($arg:tt)+) => {{
        static HITS: ::std::sync::atomic::AtomicU64 = ::std::sync::atomic::AtomicU64::new(0);
        let n = HITS.fetch_add(1, ::std::sync::atomic::Ordering::Relaxed) + 1;
        $crate::warn::warn_rate_limited!(count = n, $($arg)+);
    }};
}
pub(crate) use warn_rate_limited;

#[cfg(test)]
mod tests {
    use super::should_log;

    #[test]
    fn occurrences_logged_are_the_powers_of_two() {
        let logged: Vec<u64> = (1..=100).filter(|&n| should_log(n)).collect();
        assert_eq!(logged, [1, 2, 4, 8, 16, 32, 64]);
        assert!(!should_log(0));
    }
}
