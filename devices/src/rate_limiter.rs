// SPDX-License-Identifier: Apache-2.0
//! Token-bucket rate limiting with Firecracker's semantics.
//!
//! A [`RateLimiter`] limits one direction of one device. It holds up to two
//! [`TokenBucket`]s: a bandwidth bucket whose tokens are bytes and an ops
//! bucket whose tokens are frames. Each bucket is configured as Firecracker's
//! `TokenBucket` object, `{size, one_time_burst, refill_time}`:
//!
//! - it starts full (`size` tokens) plus a `one_time_burst` credit that is
//!   spent first and never refills;
//! - it refills continuously at `size` tokens per `refill_time` milliseconds,
//!   never beyond `size`;
//! - a frame passes only if every configured bucket can pay for it at once;
//!   otherwise nothing is taken and the caller learns how long until it fits.
//!
//! A frame larger than the whole bandwidth bucket (a 64 KiB TSO frame through
//! a 10 KB bucket) could never fit. As Firecracker's "over-consumption" it
//! passes once the bucket is full and leaves the bucket in debt, which later
//! frames wait out, so the long-run rate is still `size / refill_time`.
//!
//! Differences from Firecracker, both deliberate: a bucket with `size` or
//! `refill_time` 0 is a configuration error here (Firecracker silently turns
//! that bucket off; omit the bucket instead), and a throttled limiter arms its
//! timer for exactly the time the blocked frame needs instead of a fixed
//! 100 ms, so a limited flow is smooth and its rate exact.
//!
//! The arithmetic lives in [`TokenBucket`] and [`Limiter`], which take the time
//! as an argument and own no file descriptor, so they are tested with synthetic
//! clocks. [`RateLimiter`] adds the monotonic clock and the timerfd that tells
//! the device's event loop when tokens are due: a throttled direction sleeps in
//! epoll, it never polls.
//!
//! A snapshot saves each bucket's tokens and the progress of its refill,
//! and a restore takes them back (see [`persist`]).

pub mod persist;

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

use vmm_sys_util::timerfd::TimerFd;

const NS_PER_MS: u64 = 1_000_000;

/// Errors in a rate limiter configuration or its timer.
#[derive(Debug, thiserror::Error)]
pub enum RateLimiterError {
    /// A bucket of size 0 would never pass anything.
    #[error("{0} bucket: size must be at least 1 (omit the bucket for no limit)")]
    ZeroSize(&'static str),
    /// A bucket with refill time 0 would refill infinitely fast.
    #[error("{0} bucket: refill_time must be at least 1 ms (omit the bucket for no limit)")]
    ZeroRefillTime(&'static str),
    /// The refill time does not fit the nanosecond arithmetic.
    #[error("{0} bucket: refill_time {1} ms is too long")]
    RefillTimeTooLong(&'static str, u64),
    /// The timerfd could not be created or armed.
    #[error("rate limiter timer")]
    Timer(#[source] io::Error),
}

/// One bucket as configured (Firecracker's `TokenBucket`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenBucketConfig {
    /// Tokens the bucket holds when full (bytes or frames).
    pub size: u64,
    /// Extra tokens available once, at start, before the refill rate applies.
    pub one_time_burst: u64,
    /// Milliseconds to refill the bucket from empty to `size`.
    pub refill_time: u64,
}

/// One direction's limits: either bucket may be absent (no limit of that kind).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimiterConfig {
    /// Bucket of bytes (frame bytes, vnet header excluded).
    pub bandwidth: Option<TokenBucketConfig>,
    /// Bucket of frames.
    pub ops: Option<TokenBucketConfig>,
}

impl RateLimiterConfig {
    /// Checks both buckets; `Ok` means [`RateLimiter::new`] accepts it.
    pub fn validate(&self) -> Result<(), RateLimiterError> {
        for (name, bucket) in [("bandwidth", self.bandwidth), ("ops", self.ops)] {
            if let Some(b) = bucket {
                TokenBucket::new(name, &b, 0)?;
            }
        }
        Ok(())
    }

    /// Whether no bucket is configured.
    pub fn is_unlimited(&self) -> bool {
        self.bandwidth.is_none() && self.ops.is_none()
    }
}

/// A token bucket driven by an explicit clock (nanoseconds, any origin).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBucket {
    size: u64,
    refill_ns: u64,
    /// What is left of the one-time burst; spent before the budget.
    burst: u64,
    /// Tokens available; negative after an over-size frame (a debt).
    budget: i128,
    /// Refills count from here: the last time the bucket was full (or
    /// created). Counting every token from one origin, rather than adding
    /// rounded increments, keeps the long-run rate exact.
    origin_ns: u64,
    /// Tokens credited since `origin_ns`.
    earned: u128,
}

impl TokenBucket {
    /// A full bucket at time `now_ns`; `name` labels configuration errors.
    pub fn new(
        name: &'static str,
        cfg: &TokenBucketConfig,
        now_ns: u64,
    ) -> Result<Self, RateLimiterError> {
        if cfg.size == 0 {
            return Err(RateLimiterError::ZeroSize(name));
        }
        if cfg.refill_time == 0 {
            return Err(RateLimiterError::ZeroRefillTime(name));
        }
        let refill_ns = cfg
            .refill_time
            .checked_mul(NS_PER_MS)
            .ok_or(RateLimiterError::RefillTimeTooLong(name, cfg.refill_time))?;
        Ok(TokenBucket {
            size: cfg.size,
            refill_ns,
            burst: cfg.one_time_burst,
            budget: i128::from(cfg.size),
            origin_ns: now_ns,
            earned: 0,
        })
    }

    /// Credits the tokens earned up to `now_ns` (a time before the last one
    /// seen credits nothing).
    fn refill(&mut self, now_ns: u64) {
        let size = i128::from(self.size);
        if self.budget >= size {
            // Full: time spent full earns nothing.
            self.origin_ns = self.origin_ns.max(now_ns);
            self.earned = 0;
            return;
        }
        let elapsed = u128::from(now_ns.saturating_sub(self.origin_ns));
        let total = elapsed * u128::from(self.size) / u128::from(self.refill_ns);
        // total < 2^128 / refill_ns, and what is new since the last call is
        // bounded by the elapsed time: it fits i128.
        let new = total.saturating_sub(self.earned) as i128;
        if self.budget + new >= size {
            self.budget = size;
            self.origin_ns = now_ns;
            self.earned = 0;
        } else {
            self.budget += new;
            self.earned = self.earned.max(total);
        }
    }

    /// Whether `tokens` can be taken now (after [`Self::refill`]).
    fn fits(&self, tokens: u64) -> bool {
        let available = i128::from(self.burst) + self.budget;
        if tokens > self.size {
            // Over-size: passes when the budget is full (and pays the rest as debt).
            return self.budget >= i128::from(self.size) || available >= i128::from(tokens);
        }
        available >= i128::from(tokens)
    }

    fn take(&mut self, tokens: u64) {
        let from_burst = tokens.min(self.burst);
        self.burst -= from_burst;
        self.budget -= i128::from(tokens - from_burst);
    }

    /// Nanoseconds from `now_ns` until `tokens` fit (after [`Self::refill`]
    /// at `now_ns`), at least 1 when they do not fit now.
    ///
    /// Only the budget counts: [`Self::take`] spends the one-time burst
    /// first, so a budget below `size` means the burst is gone, and a frame
    /// that does not fit always finds the budget below `size`.
    fn wait_ns(&self, tokens: u64, now_ns: u64) -> u64 {
        debug_assert_eq!(self.burst, 0, "a frame waits only once the burst is spent");
        let want = i128::from(tokens.min(self.size));
        self.until(want - self.budget, now_ns)
    }

    /// Nanoseconds from `now_ns` until the budget is full again (after
    /// [`Self::refill`] at `now_ns`); 0 when it is full. From then on the
    /// bucket earns nothing: waiting longer loses tokens.
    fn full_in_ns(&self, now_ns: u64) -> u64 {
        let missing = i128::from(self.size) - self.budget;
        if missing <= 0 {
            return 0;
        }
        self.until(missing, now_ns)
    }

    /// Nanoseconds from `now_ns` until `missing` more tokens are earned, at
    /// least 1.
    fn until(&self, missing: i128, now_ns: u64) -> u64 {
        if missing <= 0 {
            return 1;
        }
        // The token that completes the frame is number `earned + missing`
        // since the origin; it is due at ceil(n * refill / size) from there.
        let n = self.earned + missing as u128;
        // Saturating: a debt restored from a file may be as large as a
        // u64, and a product past u128 is a wait no caller reaches anyway.
        let due = u128::from(self.origin_ns).saturating_add(
            n.saturating_mul(u128::from(self.refill_ns))
                .div_ceil(u128::from(self.size)),
        );
        u64::try_from(due.saturating_sub(u128::from(now_ns)))
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Takes `tokens` if they fit at `now_ns`; otherwise takes nothing and
    /// returns the nanoseconds until they would.
    pub fn reduce(&mut self, tokens: u64, now_ns: u64) -> Result<(), u64> {
        self.refill(now_ns);
        if self.fits(tokens) {
            self.take(tokens);
            Ok(())
        } else {
            Err(self.wait_ns(tokens, now_ns))
        }
    }

    /// Tokens available now, the one-time burst included (negative: debt).
    pub fn available(&mut self, now_ns: u64) -> i128 {
        self.refill(now_ns);
        i128::from(self.burst) + self.budget
    }
}

/// The limits of one direction: a bandwidth and an ops bucket, both optional.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limiter {
    bandwidth: Option<TokenBucket>,
    ops: Option<TokenBucket>,
}

impl Limiter {
    /// Builds the buckets of `cfg`, full at `now_ns`.
    pub fn new(cfg: &RateLimiterConfig, now_ns: u64) -> Result<Self, RateLimiterError> {
        let bucket = |name, b: Option<TokenBucketConfig>| {
            b.map(|b| TokenBucket::new(name, &b, now_ns)).transpose()
        };
        Ok(Limiter {
            bandwidth: bucket("bandwidth", cfg.bandwidth)?,
            ops: bucket("ops", cfg.ops)?,
        })
    }

    /// Passes one frame of `bytes` if both buckets can pay for it now, taking
    /// from both; otherwise takes from neither and returns the nanoseconds
    /// until the frame would fit.
    pub fn try_pass(&mut self, bytes: u64, now_ns: u64) -> Result<(), u64> {
        let mut wait = 0;
        for (bucket, tokens) in [(&mut self.bandwidth, bytes), (&mut self.ops, 1)] {
            if let Some(b) = bucket {
                b.refill(now_ns);
                if !b.fits(tokens) {
                    wait = wait.max(b.wait_ns(tokens, now_ns));
                }
            }
        }
        if wait > 0 {
            return Err(wait);
        }
        if let Some(b) = &mut self.bandwidth {
            b.take(bytes);
        }
        if let Some(b) = &mut self.ops {
            b.take(1);
        }
        Ok(())
    }

    /// For a frame whose size is known only once it has moved (RX: the TAP
    /// tells the length on read): admits it if every bucket holds at least
    /// one token, otherwise returns the nanoseconds until each does. The
    /// caller then moves the frame and pays with [`Limiter::charge`], which
    /// may leave a debt that later frames wait out, so the long-run rate is
    /// still exact.
    pub fn try_admit(&mut self, now_ns: u64) -> Result<(), u64> {
        let mut wait = 0;
        for b in [&mut self.bandwidth, &mut self.ops].into_iter().flatten() {
            b.refill(now_ns);
            if !b.fits(1) {
                wait = wait.max(b.wait_ns(1, now_ns));
            }
        }
        if wait > 0 {
            Err(wait)
        } else {
            Ok(())
        }
    }

    /// Pays for one admitted frame of `bytes`, into debt if need be.
    pub fn charge(&mut self, bytes: u64, now_ns: u64) {
        for (bucket, tokens) in [(&mut self.bandwidth, bytes), (&mut self.ops, 1)] {
            if let Some(b) = bucket {
                b.refill(now_ns);
                b.take(tokens);
            }
        }
    }

    /// When to wake a caller told to wait `wait_ns` at `now_ns`: not before
    /// the frame fits, and not before [`MIN_WAKE_NS`] either unless a
    /// bucket fills up sooner (a full bucket earns nothing, so sleeping past
    /// that would lower the rate). A flood far above the limit then wakes
    /// the device about once a millisecond for a batch of frames, rather
    /// than once per frame, and the long-run rate is unchanged.
    pub fn wake_after_ns(&mut self, wait_ns: u64, now_ns: u64) -> u64 {
        let mut full_in = u64::MAX;
        for b in [&mut self.bandwidth, &mut self.ops].into_iter().flatten() {
            b.refill(now_ns);
            match b.full_in_ns(now_ns) {
                0 => {}
                ns => full_in = full_in.min(ns),
            }
        }
        wait_ns.max(MIN_WAKE_NS.min(full_in))
    }
}

/// The shortest sleep of a throttled limiter, unless a bucket fills sooner:
/// 1 ms, a thousand wake-ups per second at most under a flood.
pub const MIN_WAKE_NS: u64 = NS_PER_MS;

/// A [`Limiter`] on the monotonic clock with the timerfd that wakes the
/// device's event loop once a blocked frame fits.
///
/// Protocol for the device: TX calls [`RateLimiter::consume`] with the frame
/// size before writing each chain; RX, which learns a frame's size only by
/// reading it, calls [`RateLimiter::admit`] before each read and
/// [`RateLimiter::charge`] after it. On `false` the frame must wait (TX keeps
/// the chain, RX stops reading the backend) until epoll reports
/// [`RateLimiter::as_raw_fd`] readable; then call [`RateLimiter::on_timer`]
/// and retry. While blocked, `consume` and `admit` refuse without looking at
/// the buckets or the timer, so a caller that retries early cannot spin.
///
/// System calls, for a seccomp filter: `timerfd_create` and `fcntl` in
/// [`RateLimiter::new`]; `timerfd_settime` when a frame is refused, `read`
/// in [`RateLimiter::on_timer`], both on the event-loop thread;
/// `clock_gettime(CLOCK_MONOTONIC)` on every call (normally answered by the
/// vDSO without a system call); `close` on drop.
#[derive(Debug)]
pub struct RateLimiter {
    limiter: Limiter,
    timer: TimerFd,
    epoch: Instant,
    /// The buckets' time at `epoch`: 0, or after a restore the longest
    /// refill progress a bucket brought (its origin lies that far back).
    base_ns: u64,
    blocked: bool,
}

impl RateLimiter {
    /// Creates the limiter and its (disarmed, non-blocking) timerfd.
    pub fn new(cfg: &RateLimiterConfig) -> Result<Self, RateLimiterError> {
        let limiter = Limiter::new(cfg, 0)?;
        let timer = nonblocking_timer().map_err(RateLimiterError::Timer)?;
        Ok(RateLimiter {
            limiter,
            timer,
            epoch: Instant::now(),
            base_ns: 0,
            blocked: false,
        })
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(self.base_ns)
    }

    /// Takes the tokens for one frame of `bytes`, or blocks the limiter and
    /// arms its timer for when the frame will fit. Returns whether the frame
    /// may go now. On `Err` (the timer could not be armed) the limiter is
    /// not blocked and nothing was taken.
    pub fn consume(&mut self, bytes: u64) -> Result<bool, RateLimiterError> {
        if self.blocked {
            return Ok(false);
        }
        let now = self.now_ns();
        match self.limiter.try_pass(bytes, now) {
            Ok(()) => Ok(true),
            Err(wait_ns) => self.block(now, wait_ns).map(|()| false),
        }
    }

    /// RX side of the protocol: whether a frame of yet unknown size may be
    /// read now (see [`Limiter::try_admit`]); on `false` the limiter is
    /// blocked until its timer fires. Pay for what was read with
    /// [`RateLimiter::charge`].
    pub fn admit(&mut self) -> Result<bool, RateLimiterError> {
        if self.blocked {
            return Ok(false);
        }
        let now = self.now_ns();
        match self.limiter.try_admit(now) {
            Ok(()) => Ok(true),
            Err(wait_ns) => self.block(now, wait_ns).map(|()| false),
        }
    }

    /// Pays for a frame read after [`RateLimiter::admit`].
    pub fn charge(&mut self, bytes: u64) {
        let now = self.now_ns();
        self.limiter.charge(bytes, now);
    }

    fn block(&mut self, now: u64, wait_ns: u64) -> Result<(), RateLimiterError> {
        let wake = self.limiter.wake_after_ns(wait_ns, now);
        self.timer
            .reset(Duration::from_nanos(wake), None)
            .map_err(|e| RateLimiterError::Timer(e.into()))?;
        self.blocked = true;
        Ok(())
    }

    /// Handles the timer's expiry: the limiter is unblocked (the frame that
    /// blocked it now fits). Spurious wake-ups are harmless.
    pub fn on_timer(&mut self) {
        // Drain the expiration count; the fd is non-blocking, so nothing
        // pending is EAGAIN, which is fine.
        let _ = self.timer.wait();
        self.blocked = false;
    }

    /// Whether a frame is waiting for the timer.
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// Replaces the buckets with `cfg`'s, full, while traffic flows
    /// (`PATCH /network-interfaces`). The timer stays: a frame held back
    /// keeps its place at the head of its queue, and the timer is re-armed
    /// to fire at once so that frame is tried against the new buckets
    /// rather than the old wait. On `Err` nothing changed.
    pub fn update(&mut self, cfg: &RateLimiterConfig) -> Result<(), RateLimiterError> {
        let limiter = Limiter::new(cfg, self.now_ns())?;
        if self.blocked {
            self.timer
                .reset(Duration::from_nanos(1), None)
                .map_err(|e| RateLimiterError::Timer(e.into()))?;
        }
        self.limiter = limiter;
        Ok(())
    }
}

/// A disarmed timerfd that never blocks a read: a timer that fired and was
/// then re-armed or cleared would otherwise block, and the event loop must
/// never block. Non-blocking from its creation, so making one takes a
/// single `timerfd_create` (the only call a limiter made while the VM runs
/// needs the event loop's seccomp filter to allow).
#[allow(unsafe_code)]
pub(crate) fn nonblocking_timer() -> io::Result<TimerFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: timerfd_create takes no pointers; the result is checked.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_CLOEXEC | libc::TFD_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { TimerFd::from_raw_fd(fd) })
}

impl AsRawFd for RateLimiter {
    fn as_raw_fd(&self) -> RawFd {
        self.timer.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = NS_PER_MS;

    fn bucket(size: u64, burst: u64, refill_ms: u64) -> TokenBucket {
        let cfg = TokenBucketConfig {
            size,
            one_time_burst: burst,
            refill_time: refill_ms,
        };
        TokenBucket::new("test", &cfg, 0).unwrap()
    }

    #[test]
    fn zero_size_and_zero_refill_time_are_errors() {
        let zero_size = TokenBucketConfig {
            size: 0,
            one_time_burst: 0,
            refill_time: 100,
        };
        let zero_refill = TokenBucketConfig {
            size: 10,
            one_time_burst: 0,
            refill_time: 0,
        };
        let cfg = |b| RateLimiterConfig {
            bandwidth: Some(b),
            ops: None,
        };
        assert!(matches!(
            cfg(zero_size).validate(),
            Err(RateLimiterError::ZeroSize("bandwidth"))
        ));
        let err = RateLimiterConfig {
            bandwidth: None,
            ops: Some(zero_refill),
        }
        .validate()
        .unwrap_err();
        assert!(matches!(err, RateLimiterError::ZeroRefillTime("ops")));
        assert!(err.to_string().contains("refill_time"), "{err}");
        let huge = TokenBucketConfig {
            size: 1,
            one_time_burst: 0,
            refill_time: u64::MAX,
        };
        assert!(matches!(
            cfg(huge).validate(),
            Err(RateLimiterError::RefillTimeTooLong(..))
        ));
        assert!(RateLimiterConfig::default().validate().is_ok());
        assert!(RateLimiterConfig::default().is_unlimited());
    }

    #[test]
    fn starts_full_then_refills_at_the_configured_rate() {
        // 1000 tokens per 100 ms = 10 tokens per ms.
        let mut b = bucket(1000, 0, 100);
        assert_eq!(b.reduce(1000, 0), Ok(()));
        // Empty: 10 tokens need 1 ms.
        assert_eq!(b.reduce(10, 0), Err(MS));
        // 9.99 tokens earned: the 10th is due 1 ns later.
        assert_eq!(b.reduce(10, MS - 1), Err(1));
        assert_eq!(b.reduce(10, MS), Ok(()));
        // Refill stops at size.
        assert_eq!(b.available(10_000 * MS), 1000);
        assert!(b.reduce(1001, 10_000 * MS).is_ok());
    }

    #[test]
    fn fractional_refills_are_not_lost() {
        // 3 tokens per 10 ms: one token every 3.33 ms.
        let mut b = bucket(3, 0, 10);
        assert_eq!(b.reduce(3, 0), Ok(()));
        let mut passed = 0;
        // Poll every 0.1 ms for one second.
        for step in 1..=10_000u64 {
            if b.reduce(1, step * MS / 10).is_ok() {
                passed += 1;
            }
        }
        assert_eq!(passed, 300, "exactly the configured rate over 1 s");
    }

    #[test]
    fn one_time_burst_is_spent_first_and_never_refills() {
        let mut b = bucket(100, 50, 100);
        assert_eq!(b.available(0), 150);
        assert_eq!(b.reduce(150, 0), Ok(()));
        assert_eq!(b.available(1000 * MS), 100);
        assert_eq!(b.reduce(100, 1000 * MS), Ok(()));
        assert!(b.reduce(1, 1000 * MS).is_err());
    }

    #[test]
    fn a_frame_paid_from_the_burst_costs_the_budget_nothing() {
        let mut b = bucket(100, 50, 100);
        assert_eq!(b.reduce(30, 0), Ok(()));
        // 20 left of the burst, the budget untouched.
        assert_eq!(b.available(0), 120);
        assert_eq!(b.reduce(120, 0), Ok(()));
        // A frame larger than what is left of the burst pays the rest from
        // the budget, and only the rest.
        let mut b = bucket(100, 50, 100);
        assert_eq!(b.reduce(80, 0), Ok(()));
        assert_eq!(b.available(0), 70);
    }

    #[test]
    fn a_partly_full_bucket_waits_only_for_the_missing_tokens() {
        // 10 tokens per ms; 400 left after a 600-token frame.
        let mut b = bucket(1000, 0, 100);
        assert_eq!(b.reduce(600, 0), Ok(()));
        // 500 wanted, 100 missing: 10 ms, not the time to earn all 500.
        assert_eq!(b.reduce(500, 0), Err(10 * MS));
        // A burst is spent first: 650 = 50 from it and 600 from the budget.
        let mut b = bucket(1000, 50, 100);
        assert_eq!(b.reduce(650, 0), Ok(()));
        assert_eq!(b.available(0), 400);
        let mut b = bucket(1000, 100, 100);
        assert_eq!(b.reduce(650, 0), Ok(()));
        assert_eq!(b.available(0), 450);
        assert_eq!(b.reduce(500, 0), Err(5 * MS));
    }

    #[test]
    fn an_oversize_frame_passes_when_full_and_leaves_a_debt() {
        // 1000 bytes per 10 ms; a 3000-byte frame.
        let mut b = bucket(1000, 0, 10);
        assert_eq!(b.reduce(3000, 0), Ok(()));
        assert_eq!(b.available(0), -2000);
        // The next frame waits until the debt is paid and it fits.
        assert_eq!(b.reduce(100, 0), Err(21 * MS));
        assert!(b.reduce(100, 21 * MS - 1).is_err());
        assert_eq!(b.reduce(100, 21 * MS), Ok(()));
        // An over-size frame waits for a full bucket.
        let mut b = bucket(1000, 0, 10);
        assert_eq!(b.reduce(1, 0), Ok(()));
        assert_eq!(b.reduce(5000, 0), Err(MS / 100));
    }

    #[test]
    fn a_frame_passes_only_if_both_buckets_can_pay() {
        let cfg = RateLimiterConfig {
            // 10 KB per 10 ms and 2 frames per 10 ms.
            bandwidth: Some(TokenBucketConfig {
                size: 10_000,
                one_time_burst: 0,
                refill_time: 10,
            }),
            ops: Some(TokenBucketConfig {
                size: 2,
                one_time_burst: 0,
                refill_time: 10,
            }),
        };
        let mut l = Limiter::new(&cfg, 0).unwrap();
        assert_eq!(l.try_pass(6000, 0), Ok(()));
        // Bandwidth refuses (4000 left); the ops token must not be spent.
        assert_eq!(l.try_pass(6000, 0), Err(2 * MS));
        assert_eq!(l.try_pass(100, 0), Ok(()));
        // Now ops is empty: one frame every 5 ms.
        assert_eq!(l.try_pass(1, 0), Err(5 * MS));
        assert_eq!(l.try_pass(1, 5 * MS), Ok(()));
        // No bucket: every frame passes, whatever its size.
        let mut unlimited = Limiter::new(&RateLimiterConfig::default(), 0).unwrap();
        for _ in 0..1000 {
            assert_eq!(unlimited.try_pass(u64::MAX, 0), Ok(()));
        }
    }

    #[test]
    fn rx_admits_on_any_token_and_charges_into_debt() {
        // 10,000 bytes per 10 ms (1 byte per us); no ops bucket.
        let mut l = Limiter::new(
            &RateLimiterConfig {
                bandwidth: Some(TokenBucketConfig {
                    size: 10_000,
                    one_time_burst: 0,
                    refill_time: 10,
                }),
                ops: None,
            },
            0,
        )
        .unwrap();
        assert_eq!(l.try_admit(0), Ok(()));
        l.charge(9_999, 0);
        // One byte left: a frame of any size is admitted, and its cost
        // beyond that is a debt the next frame waits out.
        assert_eq!(l.try_admit(0), Ok(()));
        l.charge(1_514, 0);
        assert_eq!(l.try_admit(0), Err(1_514_000));
        assert_eq!(l.try_admit(1_514_000), Ok(()));
        // Over 10 simulated seconds a reader that retries when told reads
        // exactly the configured rate (plus the initial full bucket).
        let (mut now, mut bytes) = (1_514_000u64, 0u64);
        while now < 10_000 * MS {
            match l.try_admit(now) {
                Ok(()) => {
                    l.charge(1_514, now);
                    bytes += 1_514;
                }
                Err(wait) => now += wait,
            }
        }
        let rate = bytes as f64 / 10.0;
        assert!((rate / 1e6 - 1.0).abs() < 0.001, "{rate} B/s");
    }

    #[test]
    fn long_run_rate_matches_configuration_for_mtu_frames() {
        // 200 Mbit/s as Firecracker users write it: 2.5 MB per 100 ms.
        let mut l = Limiter::new(
            &RateLimiterConfig {
                bandwidth: Some(TokenBucketConfig {
                    size: 2_500_000,
                    one_time_burst: 0,
                    refill_time: 100,
                }),
                ops: None,
            },
            0,
        )
        .unwrap();
        // A sender that retries exactly when told to, for 10 simulated
        // seconds: about 167,000 frames and as many waits at most, so a
        // limiter that keeps answering "retry at once" fails here instead
        // of looping for ever.
        let (mut now, mut bytes, mut calls) = (0u64, 0u64, 0u32);
        while now < 10_000 * MS {
            calls += 1;
            assert!(calls < 1_000_000, "no progress: {bytes} bytes by {now} ns");
            match l.try_pass(1514, now) {
                Ok(()) => bytes += 1514,
                Err(wait) => now += wait,
            }
        }
        let rate = bytes as f64 * 8.0 / 10.0;
        // The initial full bucket adds 2.5 MB over 10 s: 2 Mbit/s.
        assert!((rate / 202e6 - 1.0).abs() < 0.001, "{rate}");
    }

    #[test]
    fn the_timer_fires_when_the_blocked_frame_fits() {
        let mut rl = RateLimiter::new(&RateLimiterConfig {
            bandwidth: None,
            // 1 frame per 20 ms.
            ops: Some(TokenBucketConfig {
                size: 1,
                one_time_burst: 0,
                refill_time: 20,
            }),
        })
        .unwrap();
        assert!(rl.consume(100).unwrap());
        assert!(!rl.consume(100).unwrap());
        assert!(rl.is_blocked());
        // While blocked, retries refuse without arming again.
        assert!(!rl.consume(100).unwrap());
        assert!(!rl.admit().unwrap());
        let start = Instant::now();
        let mut pfd = libc::pollfd {
            fd: rl.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, count 1.
        #[allow(unsafe_code)]
        let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
        assert_eq!(n, 1, "the timer fired");
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(15), "{waited:?}");
        rl.on_timer();
        assert!(!rl.is_blocked());
        assert!(rl.consume(100).unwrap());
        // A spurious wake-up (nothing pending) neither blocks nor panics.
        rl.on_timer();
        // The RX half: admitted once, then blocked until the frame is due.
        std::thread::sleep(Duration::from_millis(25));
        assert!(rl.admit().unwrap());
        rl.charge(100);
        assert!(!rl.admit().unwrap());
        assert!(rl.is_blocked());
    }

    #[test]
    fn a_flood_wakes_once_a_millisecond_without_losing_tokens() {
        // 20,000 frames/s: a token every 50 us.
        let ops = |size, refill_time| RateLimiterConfig {
            bandwidth: None,
            ops: Some(TokenBucketConfig {
                size,
                one_time_burst: 0,
                refill_time,
            }),
        };
        let take = |l: &mut Limiter, n| (0..n).for_each(|_| l.try_pass(1, 0).unwrap());
        let mut l = Limiter::new(&ops(2000, 100), 0).unwrap();
        take(&mut l, 2000);
        let wait = l.try_pass(64, 0).unwrap_err();
        assert_eq!(wait, 50_000);
        // Woken after 1 ms, 20 frames pass at once.
        assert_eq!(l.wake_after_ns(wait, 0), MIN_WAKE_NS);
        let passed = (0..100).filter(|_| l.try_pass(64, MS).is_ok()).count();
        assert_eq!(passed, 20);
        // A wait longer than the minimum is kept as is.
        assert_eq!(l.wake_after_ns(5 * MS, MS), 5 * MS);
        // A bucket about to fill is not slept past: 10 tokens per 1 ms,
        // 3 short of full, full in 0.3 ms.
        let mut l = Limiter::new(&ops(10, 1), 0).unwrap();
        take(&mut l, 3);
        assert_eq!(l.wake_after_ns(1, 0), 300_000);
        // Emptied, it is full again after exactly the minimum.
        take(&mut l, 7);
        assert_eq!(l.wake_after_ns(100_000, 0), MS);
    }
}
