// SPDX-License-Identifier: Apache-2.0
//! Counters of the entropy device, serialized under the device's id in the
//! VMM's metrics lines (`{"rng0": <object>}`).
//!
//! The serialized form (serde, field name = JSON key) is a contract, as the
//! other devices': `entropy_bytes` and `host_rng_fails` carry Firecracker's
//! names for the same counts; `requests`, `rate_limiter_throttled`,
//! `throttled_ns`, `malformed_chains`, `host_errors`, `passes`,
//! `pass_yields`, `descs_walked`, `max_descs_per_pass`, `queue_errors`,
//! `interrupts`, `interrupts_suppressed`, `config_writes_ignored` and
//! `features_negotiated` the names the network and block devices use. More
//! fields may be added; none of these may be renamed.
//!
//! Every chain the device takes is answered once: served (`requests`, its
//! bytes in `entropy_bytes`, fewer than asked where the host failed, each
//! such failure in `host_rng_fails`) or refused (`malformed_chains`).
//! `entropy_bytes` is the sum of the used lengths the guest got back.

use std::sync::atomic::AtomicU64;

use serde::Serialize;

use crate::virtio::metrics::{Counters, QueueCounters};
use crate::virtio::time_counter::TimeCounter;

/// Lock-free counters of one entropy device.
#[derive(Debug, Default, Serialize)]
pub struct RngMetrics {
    /// Random bytes written into guest buffers.
    pub entropy_bytes: AtomicU64,
    /// Requests served (chains returned with random bytes, or with fewer
    /// where the host failed).
    pub requests: AtomicU64,
    /// Times the rate limiter held a request back until its timer fired.
    pub rate_limiter_throttled: AtomicU64,
    /// Nanoseconds requests waited for the rate limiter.
    pub throttled_ns: TimeCounter,
    /// Chains refused and returned with used length 0: a device-readable
    /// buffer, a buffer outside guest memory, a loop, no byte to fill.
    pub malformed_chains: AtomicU64,
    /// `getrandom` calls that failed (or returned nothing): the request
    /// went back with the bytes filled before. Each is also a host error.
    pub host_rng_fails: AtomicU64,
    /// Host-side faults (`getrandom`, eventfd, epoll, the limiter's timer).
    pub host_errors: AtomicU64,
    /// The counters of its passes (`passes`, `pass_yields`, `descs_walked`,
    /// `max_descs_per_pass`, `queue_errors`, `interrupts`,
    /// `interrupts_suppressed`).
    #[serde(flatten)]
    pub queue: QueueCounters,
    /// Guest writes to the (empty) configuration space, ignored.
    pub config_writes_ignored: AtomicU64,
    /// The 64-bit feature word the driver acknowledged at activation.
    pub features_negotiated: AtomicU64,
}

impl Counters for RngMetrics {
    const DEVICE: &'static str = "virtio-rng";
    fn host_error_counter(&self) -> &AtomicU64 {
        &self.host_errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::events;
    use crate::virtio::metrics::{assert_counter_keys, DeviceMetrics};

    /// The contract's keys: a renamed field fails here.
    const KEYS: [&str; 16] = [
        "entropy_bytes",
        "requests",
        "rate_limiter_throttled",
        "throttled_ns",
        "malformed_chains",
        "host_rng_fails",
        "host_errors",
        "passes",
        "pass_yields",
        "descs_walked",
        "max_descs_per_pass",
        "queue_errors",
        "interrupts",
        "interrupts_suppressed",
        "config_writes_ignored",
        "features_negotiated",
    ];

    #[test]
    fn test_json_has_every_contract_field() {
        let m = RngMetrics::default();
        events::add(&m.entropy_bytes, 4096);
        let json = m.to_json();
        assert_counter_keys(&json, &KEYS);
        assert_eq!(json["entropy_bytes"], 4096);
        assert_eq!(m.device_name(), "virtio-rng");
    }
}
