// SPDX-License-Identifier: Apache-2.0
//! `--scenario ratelimit`: the rate limiter holds a card to its configured
//! rate in each direction.
//!
//! Four cases, each against a flood far above its limit: a bandwidth limit of
//! 200 Mbit/s with MTU (1514-byte) frames and an ops limit of 20,000 frames/s
//! with 64-byte frames, for TX (the driver keeps the TX ring full) and for RX
//! (a host sender floods the TAP). Both limits are written as a Firecracker
//! user would, a bucket refilled every 100 ms. The warm-up drains the
//! bucket's initial fill, so the window sees the steady rate. The JSON
//! carries `{tx,rx}_{bw,ops}_ratio` = achieved / configured (median over
//! rounds), which must lie within 0.95 to 1.05.

use anyhow::Result;
use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use devices::virtio::net::NetConfig;
use serde_json::{json, Map, Value};

use crate::host::{Measured, Sender, Traffic};
use crate::rig::{Rig, RigConfig};
use crate::scenarios::{tx_msg, Dir, Timing};
use crate::stats::median;

/// 200 Mbit/s: 2.5 MB per 100 ms.
const BW_BYTES_PER_100MS: u64 = 2_500_000;
/// 20,000 frames/s: 2,000 frames per 100 ms.
const OPS_PER_100MS: u64 = 2_000;
const REFILL_MS: u64 = 100;

/// One limit under test.
struct Case {
    name: &'static str,
    dir: Dir,
    frame: usize,
    limiter: RateLimiterConfig,
    /// The configured rate, in the unit `achieved` returns.
    configured: f64,
    achieved: fn(&Measured) -> f64,
}

fn bucket(size: u64) -> Option<TokenBucketConfig> {
    Some(TokenBucketConfig {
        size,
        one_time_burst: 0,
        refill_time: REFILL_MS,
    })
}

fn cases() -> Vec<Case> {
    let bw = RateLimiterConfig {
        bandwidth: bucket(BW_BYTES_PER_100MS),
        ops: None,
    };
    let ops = RateLimiterConfig {
        bandwidth: None,
        ops: bucket(OPS_PER_100MS),
    };
    let per_s = 1000.0 / REFILL_MS as f64;
    let bits = |m: &Measured| m.gbps() * 1e9;
    let frames = |m: &Measured| m.fps();
    let mut out = Vec::new();
    for dir in [Dir::Tx, Dir::Rx] {
        out.push(Case {
            name: if dir == Dir::Tx { "tx_bw" } else { "rx_bw" },
            dir,
            frame: 1514,
            limiter: bw,
            configured: BW_BYTES_PER_100MS as f64 * 8.0 * per_s,
            achieved: bits,
        });
        out.push(Case {
            name: if dir == Dir::Tx { "tx_ops" } else { "rx_ops" },
            dir,
            frame: 64,
            limiter: ops,
            configured: OPS_PER_100MS as f64 * per_s,
            achieved: frames,
        });
    }
    out
}

fn one_run(case: &Case, t: &Timing) -> Result<Measured> {
    let mut net = NetConfig::default();
    match case.dir {
        Dir::Tx => net.tx_rate_limiter = case.limiter,
        Dir::Rx => net.rx_rate_limiter = case.limiter,
    }
    let cfg = RigConfig {
        net,
        rx_buf_len: 2048,
        tx_msg: tx_msg(case.frame),
        post_rx: case.dir == Dir::Rx,
    };
    let mut rig = Rig::new(&cfg)?;
    match case.dir {
        Dir::Tx => rig.run_tx(t.warmup, t.window),
        Dir::Rx => rig.run_rx(t.warmup, t.window),
    }
}

/// Runs the four cases and reports achieved / configured for each.
pub fn ratelimit(t: &Timing) -> Result<Value> {
    let mut out = Map::new();
    let mut rows = Vec::new();
    let _sink = crate::host::sink()?;
    for case in cases() {
        let _sender = match case.dir {
            Dir::Rx => Some(Sender::start(Traffic::Udp(case.frame))?),
            Dir::Tx => None,
        };
        let mut achieved = Vec::new();
        for _ in 0..t.rounds.max(1) {
            let m = one_run(&case, t)?;
            achieved.push((case.achieved)(&m));
        }
        let mid = median(&achieved);
        let ratio = mid / case.configured;
        out.insert(format!("{}_ratio", case.name), json!(ratio));
        rows.push(json!({
            "case": case.name,
            "frame_bytes": case.frame,
            "configured": case.configured,
            "unit": if case.name.ends_with("bw") { "bit/s" } else { "frames/s" },
            "achieved_median": mid,
            "achieved_rounds": achieved,
            "ratio": ratio,
        }));
    }
    out.insert("rows".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_cases_are_the_issues_limits() {
        let c = cases();
        let names: Vec<_> = c.iter().map(|c| c.name).collect();
        assert_eq!(names, ["tx_bw", "tx_ops", "rx_bw", "rx_ops"]);
        assert_eq!(c[0].configured, 200e6);
        assert_eq!(c[1].configured, 20_000.0);
        assert_eq!((c[0].frame, c[1].frame), (1514, 64));
        for case in &c {
            assert!(case.limiter.validate().is_ok());
        }
    }
}
