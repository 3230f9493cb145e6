// SPDX-License-Identifier: Apache-2.0
//! Part 3 of the `snapshot_state` target: rate limiter buckets as a state
//! file carries them (a network card's, a drive's, the entropy device's or
//! the console's).
//!
//! A limiter (a bandwidth and an ops bucket, either or both, small enough
//! that frames empty them) passes some traffic on an explicit clock, is
//! saved, its state goes through JSON as the state file carries it, a
//! hostile file's edits are applied (sizes, refill times, burst, budget,
//! debt, refill progress, a bucket dropped or added), and it is restored
//! later on a clock of its own that starts at the longest saved progress,
//! as a device's limiter is. Oracles: an unedited state is accepted, and
//! the restored limiter answers every later frame exactly as the saved one
//! does at the same offsets; any state is refused with one line, or
//! accepted, saves back exactly what it was given (a full bucket with no
//! refill progress), and whatever the traffic then holds no more than its
//! size and no more burst than configured, without a panic.

use arbitrary::Arbitrary;
use devices::rate_limiter::persist::{RateLimiterState, TokenBucketState};
use devices::rate_limiter::{Limiter, RateLimiterConfig, TokenBucketConfig};

/// Frames before the snapshot and after the restore, at most.
const MAX_FRAMES: usize = 64;
/// Edits of one input, at most.
const MAX_EDITS: usize = 8;

/// One bucket's configuration, kept small.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Bucket {
    size: u8,
    burst: u8,
    refill_ms: u8,
}

impl Bucket {
    fn config(self) -> TokenBucketConfig {
        TokenBucketConfig {
            size: u64::from(self.size) + 1,
            one_time_burst: u64::from(self.burst),
            refill_time: u64::from(self.refill_ms % 50) + 1,
        }
    }
}

/// One frame: its bytes and the microseconds since the previous one.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Frame {
    bytes: u16,
    after_us: u16,
}

/// One change a hostile file could make; `true` is the ops bucket.
#[derive(Debug, Clone, Arbitrary)]
#[allow(missing_docs)]
pub enum Edit {
    Size(bool, u64),
    RefillTime(bool, u64),
    BurstLeft(bool, u64),
    Budget(bool, i64),
    /// A debt beyond what an `i64` holds: `-(2^63 + n)`.
    DeepDebt(bool, u64),
    Progress(bool, u64),
    Drop(bool),
    Add(bool),
}

/// One structured input of part 3.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// The bandwidth bucket, if any.
    pub bandwidth: Option<Bucket>,
    /// The ops bucket, if any.
    pub ops: Option<Bucket>,
    /// Traffic before the snapshot.
    pub before: Vec<Frame>,
    /// Microseconds from the last frame to the snapshot.
    pub pause_us: u32,
    /// The hostile file's edits.
    pub edits: Vec<Edit>,
    /// Nanoseconds the restored clock starts past the longest progress.
    pub restore_ns: u32,
    /// Traffic after the restore.
    pub after: Vec<Frame>,
}

fn bucket_of(state: &mut RateLimiterState, ops: bool) -> &mut Option<TokenBucketState> {
    if ops {
        &mut state.ops
    } else {
        &mut state.bandwidth
    }
}

fn apply(state: &mut RateLimiterState, edit: &Edit) {
    let set = |state: &mut RateLimiterState, ops, f: &dyn Fn(&mut TokenBucketState)| {
        if let Some(b) = bucket_of(state, ops) {
            f(b);
        }
    };
    match *edit {
        Edit::Size(o, v) => set(state, o, &|b| b.size = v),
        Edit::RefillTime(o, v) => set(state, o, &|b| b.refill_time = v),
        Edit::BurstLeft(o, v) => set(state, o, &|b| b.one_time_burst_left = v),
        Edit::Budget(o, v) => set(state, o, &|b| b.budget = i128::from(v)),
        Edit::DeepDebt(o, n) => set(state, o, &|b| {
            b.budget = i128::from(i64::MIN) - i128::from(n);
        }),
        Edit::Progress(o, v) => set(state, o, &|b| b.refill_progress_ns = v),
        Edit::Drop(o) => *bucket_of(state, o) = None,
        Edit::Add(o) => {
            let b = bucket_of(state, o);
            if b.is_none() {
                *b = Some(TokenBucketState {
                    size: 1,
                    refill_time: 1,
                    one_time_burst_left: 0,
                    budget: 1,
                    refill_progress_ns: 0,
                });
            }
        }
    }
}

/// What a restored limiter saves back at once: the state it was given,
/// a full bucket having no refill progress.
fn normalized(state: &RateLimiterState) -> RateLimiterState {
    let norm = |b: &Option<TokenBucketState>| {
        b.clone().map(|mut b| {
            if b.budget >= i128::from(b.size) {
                b.refill_progress_ns = 0;
            }
            b
        })
    };
    RateLimiterState {
        bandwidth: norm(&state.bandwidth),
        ops: norm(&state.ops),
    }
}

fn step_ns(f: &Frame) -> u64 {
    u64::from(f.after_us) * 1000
}

/// The bounds every restored bucket keeps at `now`.
fn check_bounds(l: &Limiter, cfg: &RateLimiterConfig, now: u64) {
    let s = l.save(now);
    for (b, c) in [(&s.bandwidth, &cfg.bandwidth), (&s.ops, &cfg.ops)] {
        if let (Some(b), Some(c)) = (b, c) {
            assert!(b.budget <= i128::from(c.size), "{b:?} over {c:?}");
            assert!(b.one_time_burst_left <= c.one_time_burst, "{b:?}");
            assert!(
                u128::from(b.refill_progress_ns) < u128::from(c.refill_time) * 1_000_000,
                "{b:?}"
            );
        }
    }
}

/// Runs one input (see the module doc).
pub fn run(input: &Input) {
    outcome(input);
}

/// [`run`], saying whether the edited state was accepted.
fn outcome(input: &Input) -> bool {
    let cfg = RateLimiterConfig {
        bandwidth: input.bandwidth.map(Bucket::config),
        ops: input.ops.map(Bucket::config),
    };
    let mut saved = Limiter::new(&cfg, 0).expect("a valid configuration");
    let mut now = 0u64;
    for f in input.before.iter().take(MAX_FRAMES) {
        now += step_ns(f);
        let _ = saved.try_pass(u64::from(f.bytes), now);
    }
    let at = now + u64::from(input.pause_us) * 1000;
    // Through JSON, as the state file carries it.
    let text = serde_json::to_string(&saved.save(at)).expect("a state serializes");
    let state: RateLimiterState = serde_json::from_str(&text).expect("and reads back");
    let mut edited = state.clone();
    for e in input.edits.iter().take(MAX_EDITS) {
        apply(&mut edited, e);
    }
    let base = [&edited.bandwidth, &edited.ops]
        .into_iter()
        .flatten()
        .map(|b| b.refill_progress_ns)
        .max()
        .unwrap_or(0)
        .saturating_add(u64::from(input.restore_ns));
    let mut back = match Limiter::restore(&cfg, &edited, base) {
        Err(e) => {
            let line = e.to_string();
            assert!(!line.is_empty() && !line.contains('\n'), "{line:?}");
            assert_ne!(edited, state, "an unedited state was refused: {line}");
            return false;
        }
        Ok(l) => l,
    };
    assert_eq!(back.save(base), normalized(&edited));
    let (mut t_saved, mut t_back) = (at, base);
    for f in input.after.iter().take(MAX_FRAMES) {
        t_back = t_back.saturating_add(step_ns(f));
        let verdict = back.try_pass(u64::from(f.bytes), t_back);
        check_bounds(&back, &cfg, t_back);
        if edited == state {
            t_saved += step_ns(f);
            let want = saved.try_pass(u64::from(f.bytes), t_saved);
            assert_eq!(verdict, want, "the restored limiter spends otherwise");
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(edits: Vec<Edit>) -> Input {
        let frame = |bytes, after_us| Frame { bytes, after_us };
        Input {
            bandwidth: Some(Bucket {
                size: 99,
                burst: 20,
                refill_ms: 10,
            }),
            ops: Some(Bucket {
                size: 3,
                burst: 0,
                refill_ms: 7,
            }),
            before: vec![frame(50, 0), frame(60, 300), frame(300, 1200)],
            pause_us: 333,
            edits,
            restore_ns: 17,
            after: (0..40).map(|i| frame(10 + i * 7, 250)).collect(),
        }
    }

    #[test]
    fn the_seeds_reach_both_an_accepted_and_a_refused_restore() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus/snapshot_state");
        let mut seen = [false; 2];
        for entry in std::fs::read_dir(dir).expect("the corpus") {
            let bytes = std::fs::read(entry.expect("an entry").path()).expect("a seed");
            if bytes.first().is_some_and(|m| m % 4 == 3) {
                crate::with_input(&bytes[1..], |i: &Input| {
                    seen[usize::from(outcome(i))] = true;
                });
            }
        }
        assert_eq!(seen, [true, true], "[refused, accepted]");
    }

    #[test]
    fn an_unedited_state_spends_the_same_and_a_forged_one_is_refused_or_bounded() {
        assert!(outcome(&input(Vec::new())));
        // The ops bucket holds 4 (its `size` + 1).
        assert!(outcome(&input(vec![Edit::Budget(true, 4)])));
        assert!(!outcome(&input(vec![Edit::Budget(true, 5)])));
        for edits in [
            vec![Edit::Budget(true, 4)],
            vec![Edit::Budget(false, -5), Edit::BurstLeft(false, 3)],
            vec![Edit::DeepDebt(false, u64::MAX)],
            vec![Edit::DeepDebt(true, 1)],
            vec![Edit::Progress(true, 7_000_000)],
            vec![Edit::Progress(true, 6_999_999)],
            vec![Edit::Size(false, 0), Edit::RefillTime(true, u64::MAX)],
            vec![Edit::Drop(true)],
            vec![Edit::Drop(false), Edit::Add(false)],
        ] {
            run(&input(edits));
        }
    }
}
