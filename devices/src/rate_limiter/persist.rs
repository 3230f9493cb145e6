// SPDX-License-Identifier: Apache-2.0
//! Rate limiter buckets in a snapshot: what each bucket has left, saved and
//! taken back, so that a restored device spends as the saved one would have.
//!
//! A bucket's state ([`TokenBucketState`]) is its configuration (`size` and
//! `refill_time`, checked against the restored device's own), what is left
//! of its one-time burst, its budget (tokens; negative is the debt an
//! over-size frame left) and the progress of its refill towards its next
//! tokens, in nanoseconds. Time does not pass in a snapshot: the restored
//! bucket resumes where it was saved, its refill counting on from the
//! restore. Firecracker's `TokenBucketState` keeps the same (the progress
//! there as the time since the bucket's last update).
//!
//! The progress is saved modulo the refill time: a whole `refill_time`
//! earns exactly `size` tokens, so from the shorter progress every later
//! token is due at the same time, and a saved progress is always below
//! `refill_time`.
//!
//! The state comes from a file. Refused, each with one line: a bucket that
//! holds more tokens than its size, owes more than a `u64` of them, has
//! more one-time burst left than configured or any left below a full
//! budget (the burst is spent first), or a progress of a whole refill time
//! or more; a bucket of another size or refill time than the
//! configuration's; a saved bucket the configuration does not have, or the
//! reverse.

use serde::{Deserialize, Serialize};

use super::{
    Limiter, RateLimiter, RateLimiterConfig, RateLimiterError, TokenBucket, TokenBucketConfig,
    NS_PER_MS,
};

/// One bucket in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBucketState {
    /// Tokens the bucket holds when full (the configuration's).
    pub size: u64,
    /// Milliseconds to refill it from empty (the configuration's).
    pub refill_time: u64,
    /// What is left of the one-time burst.
    pub one_time_burst_left: u64,
    /// Tokens available besides the burst; negative: a debt.
    pub budget: i128,
    /// Nanoseconds of refill towards the next tokens, below `refill_time`.
    pub refill_progress_ns: u64,
}

/// One direction's buckets in a snapshot (none: no limit).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimiterState {
    /// The bucket of bytes.
    pub bandwidth: Option<TokenBucketState>,
    /// The bucket of frames or requests.
    pub ops: Option<TokenBucketState>,
}

/// Why a saved bucket cannot be restored; each is one line.
#[derive(Debug, thiserror::Error)]
pub enum BucketStateError {
    /// The state has a bucket the configuration does not.
    #[error("the saved state has a {0} bucket, the configuration has none")]
    Unconfigured(&'static str),
    /// The configuration has a bucket the state does not.
    #[error("the configuration has a {0} bucket, the saved state has none")]
    Missing(&'static str),
    /// The saved bucket is not the configured one.
    #[error(
        "the saved {name} bucket has size {saved_size} and refill_time {saved_refill} ms, \
         the configured one {size} and {refill} ms"
    )]
    OtherBucket {
        /// Which bucket.
        name: &'static str,
        /// The saved size.
        saved_size: u64,
        /// The saved refill time.
        saved_refill: u64,
        /// The configured size.
        size: u64,
        /// The configured refill time.
        refill: u64,
    },
    /// More tokens than the bucket holds.
    #[error("the saved {name} bucket holds {budget} tokens, more than its size {size}")]
    TooManyTokens {
        /// Which bucket.
        name: &'static str,
        /// The saved budget.
        budget: i128,
        /// Its size.
        size: u64,
    },
    /// A debt no frame or request could have left.
    #[error("the saved {name} bucket owes {debt} tokens, more than a u64 of them")]
    TooDeep {
        /// Which bucket.
        name: &'static str,
        /// The debt.
        debt: i128,
    },
    /// More one-time burst than configured.
    #[error(
        "the saved {name} bucket has {left} tokens of one-time burst left, more than the \
         configured {configured}"
    )]
    Burst {
        /// Which bucket.
        name: &'static str,
        /// The saved burst.
        left: u64,
        /// The configured burst.
        configured: u64,
    },
    /// Burst left in a bucket below its size: the burst is spent first.
    #[error(
        "the saved {name} bucket has {left} tokens of one-time burst left below a full \
         budget (the burst is spent first)"
    )]
    BurstBeforeBudget {
        /// Which bucket.
        name: &'static str,
        /// The saved burst.
        left: u64,
    },
    /// A refill progress of a whole refill time or more.
    #[error(
        "the saved {name} bucket's refill progress {progress_ns} ns is not below its \
         refill_time of {refill} ms"
    )]
    Progress {
        /// Which bucket.
        name: &'static str,
        /// The saved progress.
        progress_ns: u64,
        /// The refill time.
        refill: u64,
    },
    /// The configured bucket itself is invalid.
    #[error("the configured bucket is invalid")]
    Config(#[source] RateLimiterError),
}

impl TokenBucket {
    /// The bucket's state at `now_ns`, refilled up to then (see the module
    /// doc).
    pub fn save(&self, now_ns: u64) -> TokenBucketState {
        let mut b = self.clone();
        b.refill(now_ns);
        let progress = if b.budget >= i128::from(b.size) {
            0
        } else {
            now_ns.saturating_sub(b.origin_ns) % b.refill_ns
        };
        TokenBucketState {
            size: b.size,
            refill_time: b.refill_ns / NS_PER_MS,
            one_time_burst_left: b.burst,
            budget: b.budget,
            refill_progress_ns: progress,
        }
    }

    /// A bucket configured as `cfg` holding what `state` says, at `now_ns`,
    /// which must be at least `state.refill_progress_ns` (its refill began
    /// that long before `now_ns`); `name` labels the errors.
    pub fn restore(
        name: &'static str,
        cfg: &TokenBucketConfig,
        state: &TokenBucketState,
        now_ns: u64,
    ) -> Result<Self, BucketStateError> {
        let mut b = TokenBucket::new(name, cfg, now_ns).map_err(BucketStateError::Config)?;
        check(name, cfg, state)?;
        b.burst = state.one_time_burst_left;
        b.budget = state.budget;
        // The refill began `progress` ago and has earned what that time is
        // worth. (A full bucket's first refill moves its origin to then
        // and forgets what it earned: full, it earns nothing.)
        let progress = state.refill_progress_ns;
        b.origin_ns = now_ns.saturating_sub(progress);
        b.earned = u128::from(progress) * u128::from(b.size) / u128::from(b.refill_ns);
        Ok(b)
    }
}

/// The checks of the module doc of one bucket against its configuration.
fn check(
    name: &'static str,
    cfg: &TokenBucketConfig,
    s: &TokenBucketState,
) -> Result<(), BucketStateError> {
    if (s.size, s.refill_time) != (cfg.size, cfg.refill_time) {
        return Err(BucketStateError::OtherBucket {
            name,
            saved_size: s.size,
            saved_refill: s.refill_time,
            size: cfg.size,
            refill: cfg.refill_time,
        });
    }
    if s.budget > i128::from(s.size) {
        return Err(BucketStateError::TooManyTokens {
            name,
            budget: s.budget,
            size: s.size,
        });
    }
    if s.budget < -i128::from(u64::MAX) {
        return Err(BucketStateError::TooDeep {
            name,
            debt: -s.budget,
        });
    }
    // The burst is spent before the budget and never refills: a bucket
    // below its size has none left.
    if s.one_time_burst_left > 0 && s.budget < i128::from(s.size) {
        return Err(BucketStateError::BurstBeforeBudget {
            name,
            left: s.one_time_burst_left,
        });
    }
    if s.one_time_burst_left > cfg.one_time_burst {
        return Err(BucketStateError::Burst {
            name,
            left: s.one_time_burst_left,
            configured: cfg.one_time_burst,
        });
    }
    // `refill_time` was checked against the configuration, whose bucket
    // was built, so the product fits.
    if u128::from(s.refill_progress_ns) >= u128::from(s.refill_time) * u128::from(NS_PER_MS) {
        return Err(BucketStateError::Progress {
            name,
            progress_ns: s.refill_progress_ns,
            refill: s.refill_time,
        });
    }
    Ok(())
}

/// A bucket of `cfg` restored from `state` if both have it; `name`
/// labels the errors.
pub fn restore_bucket(
    name: &'static str,
    cfg: Option<TokenBucketConfig>,
    state: Option<&TokenBucketState>,
    now_ns: u64,
) -> Result<Option<TokenBucket>, BucketStateError> {
    match (cfg, state) {
        (None, None) => Ok(None),
        (Some(c), Some(s)) => TokenBucket::restore(name, &c, s, now_ns).map(Some),
        (Some(_), None) => Err(BucketStateError::Missing(name)),
        (None, Some(_)) => Err(BucketStateError::Unconfigured(name)),
    }
}

impl Limiter {
    /// Both buckets' state at `now_ns`.
    pub fn save(&self, now_ns: u64) -> RateLimiterState {
        RateLimiterState {
            bandwidth: self.bandwidth.as_ref().map(|b| b.save(now_ns)),
            ops: self.ops.as_ref().map(|b| b.save(now_ns)),
        }
    }

    /// The buckets of `cfg` holding what `state` says, at `now_ns` (at
    /// least every saved refill progress).
    pub fn restore(
        cfg: &RateLimiterConfig,
        state: &RateLimiterState,
        now_ns: u64,
    ) -> Result<Self, BucketStateError> {
        Ok(Limiter {
            bandwidth: restore_bucket(
                "bandwidth",
                cfg.bandwidth,
                state.bandwidth.as_ref(),
                now_ns,
            )?,
            ops: restore_bucket("ops", cfg.ops, state.ops.as_ref(), now_ns)?,
        })
    }
}

impl RateLimiter {
    /// The buckets' state now.
    pub fn save(&self) -> RateLimiterState {
        self.limiter.save(self.now_ns())
    }

    /// Takes back the buckets of `state` (configured as `cfg`), their
    /// refill counting on from now; the limiter keeps its timer and is not
    /// blocked (a frame it held back is tried again and waits anew if need
    /// be). On `Err` nothing changed.
    pub fn restore(
        &mut self,
        cfg: &RateLimiterConfig,
        state: &RateLimiterState,
    ) -> Result<(), BucketStateError> {
        // The clock starts at the longest progress, so that every bucket's
        // refill began at or after its zero.
        let base_ns = [&state.bandwidth, &state.ops]
            .into_iter()
            .flatten()
            .map(|b| b.refill_progress_ns)
            .max()
            .unwrap_or(0);
        self.limiter = Limiter::restore(cfg, state, base_ns)?;
        self.epoch = std::time::Instant::now();
        self.base_ns = base_ns;
        self.blocked = false;
        Ok(())
    }
}

/// The state of a device's limiter for one direction: none, or one without
/// buckets, saves no bucket.
pub fn save_limiter(limiter: Option<&RateLimiter>) -> RateLimiterState {
    limiter.map(RateLimiter::save).unwrap_or_default()
}

/// Takes `state` back into a device's limiter for one direction, configured
/// as `cfg` (a device has a limiter exactly when `cfg` has a bucket).
pub fn restore_limiter(
    limiter: &mut Option<RateLimiter>,
    cfg: &RateLimiterConfig,
    state: &RateLimiterState,
) -> Result<(), BucketStateError> {
    match limiter {
        Some(l) => l.restore(cfg, state),
        // No limiter: the state must have no bucket either.
        None => Limiter::restore(cfg, state, 0).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = NS_PER_MS;

    fn cfg(size: u64, one_time_burst: u64, refill_time: u64) -> TokenBucketConfig {
        TokenBucketConfig {
            size,
            one_time_burst,
            refill_time,
        }
    }

    /// Through the state file's encoding.
    fn json_round_trip<T: Serialize + serde::de::DeserializeOwned>(v: &T) -> T {
        serde_json::from_str(&serde_json::to_string(v).unwrap()).unwrap()
    }

    /// What `a` at `ta + d` and `b` at `tb + d` answer, for the same
    /// frames at the same offsets `d`: equal for buckets in the same state.
    fn same_spending(a: &mut TokenBucket, ta: u64, b: &mut TokenBucket, tb: u64) -> usize {
        let mut passed = 0;
        // 2 s in steps of 0.1 ms, frames of 1 to 7 tokens.
        for step in 0..20_000u64 {
            let tokens = 1 + step % 7;
            let d = step * MS / 10;
            let left = a.reduce(tokens, ta + d);
            let right = b.reduce(tokens, tb + d);
            assert_eq!(left, right, "step {step}: {tokens} tokens");
            passed += usize::from(left.is_ok());
        }
        passed
    }

    #[test]
    fn a_half_spent_bucket_restored_spends_the_same() {
        // 3 tokens per 10 ms (one every 3.33 ms), a burst of 40.
        let c = cfg(300, 40, 1000);
        let mut saved = TokenBucket::new("ops", &c, 0).unwrap();
        assert_eq!(saved.reduce(25, 0), Ok(()));
        assert_eq!(saved.reduce(200, 7 * MS + 123), Ok(()));
        // Saved 1.7 ms after the last frame: mid-way to a token.
        let at = 8 * MS + 823_456;
        let state = json_round_trip(&saved.save(at));
        assert_eq!(state.one_time_burst_left, 0);
        assert!(state.budget < 300 && state.budget > 0, "{state:?}");
        assert!(state.refill_progress_ns > 0, "{state:?}");
        // Restored an hour later on another clock: time did not pass.
        let later = 3_600_000 * MS + 17;
        let mut restored = TokenBucket::restore("ops", &c, &state, later).unwrap();
        let left = saved.available(at);
        assert_eq!(restored.available(later), left);
        // A fresh bucket, full with its burst, is not what was saved.
        let mut fresh = TokenBucket::new("ops", &c, later).unwrap();
        assert_eq!(fresh.available(later), 340);
        assert!(left < 300, "{left}");
        let passed = same_spending(&mut saved, at, &mut restored, later);
        assert!(passed > 100, "{passed}");
    }

    #[test]
    fn the_burst_left_and_a_debt_come_back() {
        // Part of the burst spent.
        let c = cfg(100, 50, 100);
        let mut b = TokenBucket::new("bandwidth", &c, 0).unwrap();
        b.reduce(30, 0).unwrap();
        let s = b.save(MS);
        assert_eq!((s.one_time_burst_left, s.budget), (20, 100));
        assert_eq!(s.refill_progress_ns, 0, "a full bucket makes no progress");
        let mut r = TokenBucket::restore("bandwidth", &c, &s, 0).unwrap();
        assert_eq!(r.available(0), 120);
        same_spending(&mut b, MS, &mut r, 0);
        // An over-size frame's debt.
        let c = cfg(1000, 0, 10);
        let mut b = TokenBucket::new("bandwidth", &c, 0).unwrap();
        b.reduce(3000, 0).unwrap();
        // 25 ms later: 2500 tokens earned, 500 of them left after the debt.
        let s = b.save(25 * MS + 1);
        assert_eq!(s.budget, -2000 + 2500);
        assert_eq!(
            s.refill_progress_ns,
            5 * MS + 1,
            "saved modulo the refill time"
        );
        let now = 6 * MS;
        let mut r = TokenBucket::restore("bandwidth", &c, &s, now).unwrap();
        assert_eq!(r.reduce(600, now), Err(MS - 1));
        same_spending(&mut b, 25 * MS + 1, &mut r, now);
    }

    #[test]
    fn a_progress_past_a_whole_refill_time_is_saved_modulo_it() {
        // 10 tokens per 10 ms, kept below full by a frame every 3 ms.
        let c = cfg(10, 0, 10);
        let mut b = TokenBucket::new("ops", &c, 0).unwrap();
        b.reduce(10, 0).unwrap();
        for i in 1..20 {
            b.reduce(3, i * 3 * MS).unwrap();
        }
        let at = 57 * MS + 400_000;
        let s = b.save(at);
        assert!(s.refill_progress_ns < 10 * MS, "{s:?}");
        let mut r = TokenBucket::restore("ops", &c, &s, s.refill_progress_ns).unwrap();
        same_spending(&mut b, at, &mut r, s.refill_progress_ns);
    }

    #[test]
    fn a_forged_bucket_is_refused_with_one_line() {
        let c = cfg(1000, 100, 100);
        let good = TokenBucket::new("bandwidth", &c, 0).unwrap().save(0);
        type Forge = fn(&mut TokenBucketState);
        let cases: [(Forge, &str); 7] = [
            (
                |s| s.budget = 1001,
                "the saved bandwidth bucket holds 1001 tokens, more than its size 1000",
            ),
            (
                |s| s.budget = -i128::from(u64::MAX) - 1,
                "the saved bandwidth bucket owes 18446744073709551616 tokens, more than a u64 \
                 of them",
            ),
            (
                |s| s.budget = 999,
                "the saved bandwidth bucket has 100 tokens of one-time burst left below a \
                 full budget",
            ),
            (
                |s| s.one_time_burst_left = 101,
                "101 tokens of one-time burst left, more than the configured 100",
            ),
            (
                |s| s.refill_progress_ns = 100 * MS,
                "refill progress 100000000 ns is not below its refill_time of 100 ms",
            ),
            (
                |s| s.size = 2000,
                "has size 2000 and refill_time 100 ms, the configured one 1000 and 100 ms",
            ),
            (|s| s.refill_time = 99, "refill_time 99 ms"),
        ];
        for (edit, want) in cases {
            let mut s = good.clone();
            edit(&mut s);
            let err = TokenBucket::restore("bandwidth", &c, &s, 0).unwrap_err();
            let line = err.to_string();
            assert!(line.contains(want), "{line}");
            assert!(!line.contains('\n'));
        }
        // The extremes that are allowed.
        let mut s = good.clone();
        assert_eq!((s.budget, s.one_time_burst_left), (1000, 100));
        assert!(TokenBucket::restore("bandwidth", &c, &s, 0).is_ok());
        s.budget = -i128::from(u64::MAX);
        s.refill_progress_ns = 100 * MS - 1;
        s.one_time_burst_left = 0;
        let mut b = TokenBucket::restore("bandwidth", &c, &s, 100 * MS).unwrap();
        assert!(b.reduce(1, 100 * MS).is_err(), "a debt waits");
        assert!(b.reduce(u64::MAX, u64::MAX).is_err(), "and never overflows");
    }

    #[test]
    fn a_bucket_only_one_side_has_is_refused() {
        let both = RateLimiterConfig {
            bandwidth: Some(cfg(1000, 0, 100)),
            ops: Some(cfg(10, 0, 100)),
        };
        let saved = Limiter::new(&both, 0).unwrap().save(0);
        assert!(Limiter::restore(&both, &saved, 0).is_ok());
        let bw_only = RateLimiterConfig { ops: None, ..both };
        let err = Limiter::restore(&bw_only, &saved, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the saved state has a ops bucket, the configuration has none"
        );
        let saved_bw = Limiter::new(&bw_only, 0).unwrap().save(0);
        let err = Limiter::restore(&both, &saved_bw, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the configuration has a ops bucket, the saved state has none"
        );
        // A device without a limiter takes only a state without buckets.
        let mut none = None;
        let unlimited = RateLimiterConfig::default();
        assert_eq!(save_limiter(None), RateLimiterState::default());
        assert!(restore_limiter(&mut none, &unlimited, &RateLimiterState::default()).is_ok());
        assert!(matches!(
            restore_limiter(&mut none, &unlimited, &saved),
            Err(BucketStateError::Unconfigured("bandwidth"))
        ));
        assert!(none.is_none());
    }

    #[test]
    fn a_restored_limiter_does_not_start_full() {
        // One frame per minute: a restored limiter that started full would
        // pass a second frame at once.
        let c = RateLimiterConfig {
            bandwidth: None,
            ops: Some(cfg(1, 0, 60_000)),
        };
        let mut a = RateLimiter::new(&c).unwrap();
        assert!(a.consume(100).unwrap());
        let state = json_round_trip(&a.save());
        let mut b = RateLimiter::new(&c).unwrap();
        b.restore(&c, &state).unwrap();
        assert!(!b.consume(100).unwrap(), "the spent token came back");
        assert!(b.is_blocked());
        // A limiter restored from a fresh one's state passes at once.
        let mut c2 = RateLimiter::new(&c).unwrap();
        c2.restore(&c, &RateLimiter::new(&c).unwrap().save())
            .unwrap();
        assert!(c2.consume(100).unwrap());
        // A refused state changes nothing.
        let mut bad = state.clone();
        bad.ops.as_mut().unwrap().budget = 2;
        let mut d = RateLimiter::new(&c).unwrap();
        assert!(d.restore(&c, &bad).is_err());
        assert!(d.consume(100).unwrap(), "still the fresh, full bucket");
        // The device helper goes through the limiter.
        let mut l = Some(RateLimiter::new(&c).unwrap());
        restore_limiter(&mut l, &c, &state).unwrap();
        assert!(!l.as_mut().unwrap().consume(1).unwrap());
        assert_eq!(save_limiter(l.as_ref()).ops.unwrap().budget, 0);
    }

    #[test]
    fn the_restored_clock_starts_at_the_longest_progress() {
        // Two buckets mid-refill with different progress: each resumes at
        // its own, which needs the clock to start at the longer one.
        let c = RateLimiterConfig {
            bandwidth: Some(cfg(1000, 0, 20)),
            ops: Some(cfg(10, 0, 200)),
        };
        let mut l = Limiter::new(&c, 0).unwrap();
        for _ in 0..9 {
            l.try_pass(0, 0).unwrap();
        }
        // An over-size frame leaves the bandwidth bucket 2000 in debt.
        l.try_pass(3000, 0).unwrap();
        let at = 47 * MS + 5;
        let state = l.save(at);
        let bw = state.bandwidth.as_ref().unwrap().refill_progress_ns;
        let ops = state.ops.as_ref().unwrap().refill_progress_ns;
        assert_eq!((bw, ops), (7 * MS + 5, 47 * MS + 5));
        let mut rl = RateLimiter::new(&c).unwrap();
        rl.restore(&c, &state).unwrap();
        assert_eq!(rl.base_ns, ops);
        let mut back = Limiter::restore(&c, &state, ops).unwrap();
        let mut passed = 0;
        for step in 0..5000u64 {
            let d = step * MS / 10;
            let verdict = l.try_pass(20, at + d);
            assert_eq!(verdict, back.try_pass(20, ops + d), "step {step}");
            passed += u32::from(verdict.is_ok());
        }
        assert!(passed > 10, "{passed}");
    }
}
