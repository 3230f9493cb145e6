// SPDX-License-Identifier: Apache-2.0
//! The rate limiter in the datapath, in real time: a throttled request
//! waits (not dropped, not overtaken) until the limiter's timer fires, and
//! the wait shows in the metrics.

use std::time::{Duration, Instant};

use super::fixture::*;
use crate::rate_limiter::RateLimiterConfig;
use crate::virtio::block::IoEngine;
use crate::virtio::VirtioDevice;

const SECTOR: usize = 512;

#[test]
fn test_ops_bucket_holds_requests_back_in_order_then_releases_them() {
    for engine in [IoEngine::Sync, IoEngine::Async] {
        let data = random_bytes(&mut Rng(21), 64 * SECTOR);
        // Two requests per 100 ms.
        let mut h =
            BlockFixture::with_engine(engine, &data, |c| c.rate_limiter = ops_limit(2, 100));
        let posted: Vec<Posted> = (0..6).map(|i| h.post_read(i, 512)).collect();
        let start = Instant::now();
        h.kick();
        h.run_once(0);
        // The bucket's two go at once (with Async their completions come
        // in the next iterations); the rest wait. A token comes back every
        // 50 ms: a loaded machine that took longer than that to get here
        // may have let one more through, never one early.
        let (first, _) = h.collect(2);
        let due = 2 + (start.elapsed().as_millis() / 50) as usize;
        assert!(
            (2..=due.min(5)).contains(&first.len()),
            "{engine:?}: {} answered, {due} due",
            first.len()
        );
        assert!(h.metric(|m| &m.rate_limiter_throttled) >= 1);
        // A kick while throttled starts no pass.
        let passes = h.metric(|m| &m.queue.passes);
        h.kick();
        h.run_once(0);
        assert_eq!(
            h.metric(|m| &m.queue.passes),
            passes,
            "a kick ran a throttled pass"
        );
        let left = 6 - first.len();
        let (rest, took) = h.collect(left);
        assert_eq!(rest.len(), left, "{engine:?}: all answered");
        // The rest at 20/s: the first of them may find a token almost due,
        // each other one waits about 50 ms.
        let least = Duration::from_millis(40 * (left as u64 - 1));
        assert!(took >= least, "{left} took {took:?}");
        let heads: Vec<u32> = first.iter().chain(&rest).map(|u| u.0).collect();
        if engine == IoEngine::Sync {
            let want: Vec<u32> = posted.iter().map(|p| u32::from(p.head)).collect();
            assert_eq!(heads, want, "a throttled request keeps its place");
        }
        for (i, p) in posted.iter().enumerate() {
            assert_eq!(h.status(p), VIRTIO_BLK_S_OK);
            assert_eq!(
                h.read(p.parts[1].0, 512),
                data[i * SECTOR..(i + 1) * SECTOR]
            );
        }
        let ns = h.metrics.throttled_ns.total_ns();
        assert!(ns >= 100_000_000, "throttled only {ns} ns");
        assert!(!h.metrics.throttled_ns.is_running());
    }
}

#[test]
fn test_bandwidth_bucket_charges_data_bytes_only() {
    let data = random_bytes(&mut Rng(22), 64 * SECTOR);
    // 4 KiB per 100 ms.
    let mut h = BlockFixture::with_engine(IoEngine::Sync, &data, |c| {
        c.rate_limiter = RateLimiterConfig {
            bandwidth: bucket(4096, 100),
            ops: None,
        }
    });
    // Requests without data pass whatever the bucket holds.
    let w = h.post_write(0, &[5; 4096]);
    for _ in 0..3 {
        h.post_bare(VIRTIO_BLK_T_FLUSH, 0);
    }
    let r = h.post_read(0, 4096);
    h.go();
    // The write empties the bucket, the flushes pass, the read waits.
    let used = h.used();
    assert_eq!(used.len(), 4);
    assert_eq!(used[0], (u32::from(w.head), 1));
    assert_eq!(h.metric(|m| &m.rate_limiter_throttled), 1);
    let (rest, took) = h.collect(1);
    assert_eq!(rest, vec![(u32::from(r.head), 4097)]);
    assert!(took >= Duration::from_millis(60), "{took:?}");
    assert_eq!(h.read(r.parts[1].0, 4096), vec![5; 4096]);
}

#[test]
fn test_a_reset_while_throttled_drops_the_held_request_and_the_next_activation_runs() {
    let data = random_bytes(&mut Rng(23), 64 * SECTOR);
    let mut h =
        BlockFixture::with_engine(IoEngine::Sync, &data, |c| c.rate_limiter = ops_limit(1, 50));
    h.post_read(0, 512);
    h.post_read(1, 512);
    h.go();
    assert_eq!(h.used().len(), 1);
    crate::virtio::VirtioDevice::reset(&mut *h.dev());
    assert!(!h.metrics.throttled_ns.is_running());
    h.run_until_idle();
    h.activate(BASE_FEATURES);
    let p = h.post_read(2, 512);
    h.kick();
    let (used, _) = h.collect(1);
    assert_eq!(used, vec![(u32::from(p.head), 513)]);
}

#[test]
fn test_a_restored_drive_resumes_its_bucket_and_refuses_a_forged_one() {
    let data = vec![0u8; 8 * SECTOR];
    let limited = |c: &mut crate::virtio::block::BlockConfig| c.rate_limiter = ops_limit(2, 60_000);
    let h = BlockFixture::new(&data, limited, BASE_FEATURES);
    // One of two tokens spent.
    let spent = {
        let mut d = h.dev();
        assert!(d.rq.limiter.as_mut().unwrap().consume(512).unwrap());
        d.save_state()
    };
    assert_eq!(spent["rate_limiter"]["ops"]["budget"], 1);
    let h2 = BlockFixture::new(&data, limited, BASE_FEATURES);
    let mut d = h2.dev();
    d.restore_state(&spent).unwrap();
    let l = d.rq.limiter.as_mut().unwrap();
    assert!(l.consume(512).unwrap());
    assert!(!l.consume(512).unwrap(), "a full bucket came back");
    // More tokens than the bucket holds, and a bucket the drive lacks.
    let mut forged = spent.clone();
    forged["rate_limiter"]["ops"]["budget"] = 3.into();
    let err = d.restore_state(&forged).unwrap_err().to_string();
    assert!(
        err.contains("rate_limiter: the saved ops bucket holds 3 tokens, more than its size 2"),
        "{err}"
    );
    let plain = BlockFixture::new(&data, |_| {}, BASE_FEATURES);
    let err = plain.dev().restore_state(&spent).unwrap_err().to_string();
    assert!(err.contains("the saved state has a ops bucket"), "{err}");
    assert_eq!(
        plain.dev().save_state()["rate_limiter"]["ops"],
        serde_json::Value::Null
    );
}
