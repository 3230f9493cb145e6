// SPDX-License-Identifier: Apache-2.0
//! Counters of the balloon, serialized under the device's id in the VMM's
//! metrics lines (`{"balloon": <object>}`).
//!
//! The serialized form (serde, field name = JSON key) is a contract, as the
//! other devices': `inflate_count`, `deflate_count`, `stats_updates_count`,
//! `stats_update_fails`, `free_page_hint_count`, `free_page_hint_freed`,
//! `free_page_hint_fails`, `free_page_report_count`,
//! `free_page_report_freed` and `free_page_report_fails` carry
//! Firecracker's names (counted per chain or range, see each field);
//! `malformed_chains`, `host_errors`, `passes`, `pass_yields`,
//! `descs_walked`, `max_descs_per_pass`, `queue_errors`, `interrupts`,
//! `interrupts_suppressed`, `config_writes_ignored` and
//! `features_negotiated` the names every device here uses. More fields may
//! be added; none of these may be renamed.
//!
//! Every page frame number of an inflate chain is either given back
//! (`pages_inflated`) or refused (`pfns_refused`); every `madvise` call is
//! counted in `discard_calls`, a failed one also in `discard_fails` (and
//! `host_errors`).

use std::sync::atomic::AtomicU64;

use serde::Serialize;

use crate::virtio::metrics::{Counters, QueueCounters};

/// Lock-free counters of one balloon.
#[derive(Debug, Default, Serialize)]
pub struct BalloonMetrics {
    /// Inflate chains served.
    pub inflate_count: AtomicU64,
    /// Deflate chains served.
    pub deflate_count: AtomicU64,
    /// Page frame numbers inflated: inside guest memory, given back.
    pub pages_inflated: AtomicU64,
    /// Page frame numbers deflated (inside guest memory).
    pub pages_deflated: AtomicU64,
    /// Page frame numbers outside guest memory, refused (inflate and
    /// deflate alike).
    pub pfns_refused: AtomicU64,
    /// Bytes of inflated pages given back to the host.
    pub inflate_freed: AtomicU64,
    /// `madvise` calls made (inflated runs, hinted and reported ranges).
    pub discard_calls: AtomicU64,
    /// `madvise` calls that failed (each also a host error).
    pub discard_fails: AtomicU64,
    /// Statistics reports taken from the driver.
    pub stats_updates_count: AtomicU64,
    /// Statistics entries with a tag the device does not know.
    pub stats_update_fails: AtomicU64,
    /// Statistics buffers given back to ask the driver for a new report.
    pub stats_requests: AtomicU64,
    /// Hinted ranges given back.
    pub free_page_hint_count: AtomicU64,
    /// Bytes of hinted ranges given back.
    pub free_page_hint_freed: AtomicU64,
    /// Hinted ranges that could not be given back.
    pub free_page_hint_fails: AtomicU64,
    /// Reported ranges given back.
    pub free_page_report_count: AtomicU64,
    /// Bytes of reported ranges given back.
    pub free_page_report_freed: AtomicU64,
    /// Reported ranges that could not be given back.
    pub free_page_report_fails: AtomicU64,
    /// Configuration interrupts raised (a new target, a hinting command).
    pub config_interrupts: AtomicU64,
    /// Chains refused and returned with used length 0: a buffer of the
    /// wrong direction or outside guest memory, a loop, a length that is
    /// no whole number of page numbers or statistics, too many of them.
    pub malformed_chains: AtomicU64,
    /// Host-side faults (`madvise`, eventfd, epoll, the statistics timer).
    pub host_errors: AtomicU64,
    /// The counters of its passes (`passes`, `pass_yields`, `descs_walked`,
    /// `max_descs_per_pass`, `queue_errors`, `interrupts`,
    /// `interrupts_suppressed`).
    #[serde(flatten)]
    pub queue: QueueCounters,
    /// Guest writes to the configuration space outside `actual`, ignored.
    pub config_writes_ignored: AtomicU64,
    /// The 64-bit feature word the driver acknowledged at activation.
    pub features_negotiated: AtomicU64,
}

impl Counters for BalloonMetrics {
    const DEVICE: &'static str = "virtio-balloon";
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
    const KEYS: [&str; 29] = [
        "inflate_count",
        "deflate_count",
        "pages_inflated",
        "pages_deflated",
        "pfns_refused",
        "inflate_freed",
        "discard_calls",
        "discard_fails",
        "stats_updates_count",
        "stats_update_fails",
        "stats_requests",
        "free_page_hint_count",
        "free_page_hint_freed",
        "free_page_hint_fails",
        "free_page_report_count",
        "free_page_report_freed",
        "free_page_report_fails",
        "config_interrupts",
        "malformed_chains",
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
        let m = BalloonMetrics::default();
        events::add(&m.pages_inflated, 256);
        let json = m.to_json();
        assert_counter_keys(&json, &KEYS);
        assert_eq!(json["pages_inflated"], 256);
        assert_eq!(m.device_name(), "virtio-balloon");
    }
}
