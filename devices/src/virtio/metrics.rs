// SPDX-License-Identifier: Apache-2.0
//! [`DeviceMetrics`]: what every virtio device's counters offer the VMM,
//! written once.
//!
//! Each device keeps its own counter struct (`NetMetrics`, `BlockMetrics`,
//! `RngMetrics`): lock-free `AtomicU64`s and [`TimeCounter`]s updated on the
//! event-loop thread, shared as an `Arc` and read from anywhere. Their
//! serialized form (serde, field name = JSON key) is each device's contract
//! with the `--metrics` file. What is common to all of them is said here
//! once:
//!
//! - the VMM sees every device's counters as one `Arc<dyn DeviceMetrics>`
//!   ([`VirtioDevice::device_metrics`](super::VirtioDevice::device_metrics)),
//!   so it writes a metrics line by iterating over its devices, whatever
//!   their kind;
//! - inside the crate a counter struct implements `Counters` (its device
//!   name and its host-error counter), and gets [`DeviceMetrics`] and the
//!   `HostErrors` sink of the event glue from it.
//! - the devices that serve request queues through `virtio::pass` (block,
//!   entropy, balloon) keep the counters of their passes in one
//!   [`QueueCounters`], flattened into their own (the same keys).
//!
//! [`TimeCounter`]: super::time_counter::TimeCounter

use std::sync::atomic::AtomicU64;

use serde::Serialize;

use crate::virtio::events::HostErrors;

/// The counters of the passes over a device's queues, alike in every
/// device that serves its queues through `virtio::pass`, serialized among
/// the device's own counters (`#[serde(flatten)]`: the keys are these
/// names).
#[derive(Debug, Default, Serialize)]
pub struct QueueCounters {
    /// Passes over a queue.
    pub passes: AtomicU64,
    /// Passes cut short by a weight or the descriptor budget and re-queued
    /// behind the other ready events.
    pub pass_yields: AtomicU64,
    /// Ring entries and descriptors read by the datapath.
    pub descs_walked: AtomicU64,
    /// The most ring entries and descriptors one pass has read (a gauge;
    /// never above `queue::MAX_PASS_READS`).
    pub max_descs_per_pass: AtomicU64,
    /// Queue-level failures (avail index out of range); the queue stops
    /// until the driver resets the device.
    pub queue_errors: AtomicU64,
    /// Used-buffer interrupts raised.
    pub interrupts: AtomicU64,
    /// Used-buffer interrupts the driver asked us not to raise.
    pub interrupts_suppressed: AtomicU64,
}

/// A device's counters, as the VMM collects them.
pub trait DeviceMetrics: Send + Sync + std::fmt::Debug {
    /// The counters as one JSON object: the device's contract, its field
    /// names as keys (see each device's `metrics` module).
    fn to_json(&self) -> serde_json::Value;
    /// The device's name in log lines (`virtio-net`, `virtio-blk`,
    /// `virtio-rng`).
    fn device_name(&self) -> &'static str;
}

/// What a device's counter struct says of itself; [`DeviceMetrics`] and the
/// event glue's [`HostErrors`] follow from it.
pub(crate) trait Counters: Serialize {
    /// The device's name in log lines.
    const DEVICE: &'static str;
    /// The counter of host-side faults (eventfd and epoll failures, backend
    /// errors the guest did not cause).
    fn host_error_counter(&self) -> &AtomicU64;

    /// Where this device's host errors are counted and logged.
    fn host_errors(&self) -> HostErrors<'_> {
        HostErrors::new(self.host_error_counter(), Self::DEVICE)
    }
}

impl<T: Counters + Send + Sync + std::fmt::Debug> DeviceMetrics for T {
    fn to_json(&self) -> serde_json::Value {
        // Atomics and time counters serialize to integers; nothing can fail.
        serde_json::to_value(self).expect("counters serialize")
    }

    fn device_name(&self) -> &'static str {
        T::DEVICE
    }
}

/// Checks a device's counters JSON against its contract: every key of
/// `keys` is there as an integer, and no other key is.
#[cfg(test)]
pub(crate) fn assert_counter_keys(json: &serde_json::Value, keys: &[&str]) {
    let obj = json.as_object().expect("counters are a JSON object");
    for key in keys {
        assert!(obj[*key].is_u64(), "{key} missing or not an integer");
    }
    assert_eq!(obj.len(), keys.len(), "unexpected keys in {json}");
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    use super::*;

    #[derive(Debug, Default, Serialize)]
    struct Probe {
        host_errors: AtomicU64,
        served: AtomicU64,
    }

    impl Counters for Probe {
        const DEVICE: &'static str = "virtio-probe";
        fn host_error_counter(&self) -> &AtomicU64 {
            &self.host_errors
        }
    }

    /// What the event glue reports through a device's sink lands in that
    /// device's own `host_errors`, the one its metrics line shows.
    #[test]
    fn every_device_s_host_errors_land_in_its_own_counter() {
        fn check<M: Counters + DeviceMetrics + Default>() {
            let m = M::default();
            m.host_errors().unknown_token(9);
            m.host_errors().unknown_token(10);
            assert_eq!(m.to_json()["host_errors"], 2, "{}", m.device_name());
        }
        check::<crate::virtio::net::NetMetrics>();
        check::<crate::virtio::block::BlockMetrics>();
        check::<crate::virtio::rng::RngMetrics>();
        check::<crate::virtio::balloon::BalloonMetrics>();
    }

    #[test]
    fn any_device_s_counters_are_collected_through_the_trait() {
        let p = Arc::new(Probe::default());
        p.served.store(7, Ordering::Relaxed);
        p.host_errors().unknown_token(3);
        let m: Arc<dyn DeviceMetrics> = p.clone();
        assert_eq!(m.device_name(), "virtio-probe");
        let json = m.to_json();
        assert_counter_keys(&json, &["host_errors", "served"]);
        assert_eq!(json["served"], 7);
        assert_eq!(
            json["host_errors"], 1,
            "host errors go to the device's counter"
        );
    }
}
