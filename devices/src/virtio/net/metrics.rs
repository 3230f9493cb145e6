// SPDX-License-Identifier: Apache-2.0
//! Counters of the network device.
//!
//! Every counter is an `AtomicU64` updated with `Relaxed` ordering on the
//! event-loop thread and read from anywhere (the VMM's metrics writer, a
//! SIGUSR1 handler thread, tests) through the `Arc<NetMetrics>` that
//! [`Net::metrics`](super::Net::metrics) hands out. Counters never go
//! backwards, not even across a device reset, so a reader can take deltas.
//! Times spent in a state (starved, throttled) are [`TimeCounter`]s, which
//! include a period still in progress when read.
//!
//! The serialized form (serde, field name = JSON key) is a contract: the VMM
//! writes it as `{"net0": <object>}` and the end-to-end tests and the
//! benchmark read these keys: `rx_frames`, `rx_bytes`, `rx_buffers`,
//! `tx_frames`, `tx_bytes`, `tx_weight_hits`, `rx_weight_hits`,
//! `rx_starved_ns`, `malformed_chains`, `tap_eagain`, `features_negotiated`,
//! `{rx,tx}_rate_limiter_throttled`, `{rx,tx}_throttled_ns`. More fields may
//! be added; none of these may be renamed. `max_descs_per_pass` (with
//! `desc_budget_hits` and `descs_walked`) is what a fuzzer checks the pass
//! bound against.

use std::sync::atomic::AtomicU64;

use serde::Serialize;

use crate::mmds::MmdsMetrics;
use crate::virtio::metrics::Counters;

pub use crate::virtio::time_counter::TimeCounter;

/// Counters of one network device.
#[derive(Debug, Default, Serialize)]
pub struct NetMetrics {
    /// Frames delivered to the guest.
    pub rx_frames: AtomicU64,
    /// Frame bytes delivered to the guest, vnet header excluded.
    pub rx_bytes: AtomicU64,
    /// RX descriptor chains returned to the guest holding frame data (with
    /// MRG_RXBUF one frame may use several; `rx_buffers == rx_frames` means
    /// every frame fit one buffer).
    pub rx_buffers: AtomicU64,
    /// Frames sent by the guest and accepted by the backend.
    pub tx_frames: AtomicU64,
    /// Frame bytes sent by the guest, vnet header excluded.
    pub tx_bytes: AtomicU64,
    /// TX passes cut short by the byte or packet weight.
    pub tx_weight_hits: AtomicU64,
    /// RX passes cut short by the byte or packet weight.
    pub rx_weight_hits: AtomicU64,
    /// Nanoseconds the device stopped reading the backend because the guest
    /// had not posted enough RX buffers.
    pub rx_starved_ns: TimeCounter,
    /// Descriptor chains the guest got back with length 0 because they were
    /// malformed (outside guest memory, looping, wrong direction, too short
    /// or too long).
    pub malformed_chains: AtomicU64,
    /// Backend writes that returned EAGAIN (TX then waits for EPOLLOUT).
    pub tap_eagain: AtomicU64,
    /// The 64-bit feature word the driver acknowledged at activation.
    pub features_negotiated: AtomicU64,
    /// Times the device ran out of RX buffers and stopped reading.
    pub rx_no_avail_buffer: AtomicU64,
    /// Frames read from the backend but dropped: longer than the posted
    /// buffers could hold, or shorter than the vnet header.
    pub rx_dropped: AtomicU64,
    /// Frames the backend refused (EAGAIN excluded), returned to the guest
    /// as sent.
    pub tx_dropped: AtomicU64,
    /// Pending TX frames retried after the backend became writable.
    pub tx_eagain_retries: AtomicU64,
    /// Used-buffer interrupts raised.
    pub interrupts: AtomicU64,
    /// Used-buffer interrupts the driver asked us not to raise (EVENT_IDX or
    /// VRING_AVAIL_F_NO_INTERRUPT).
    pub interrupts_suppressed: AtomicU64,
    /// RX passes run.
    pub rx_passes: AtomicU64,
    /// TX passes run.
    pub tx_passes: AtomicU64,
    /// Queue-level failures (avail index out of range, used ring not
    /// writable); the queue stops until the driver resets the device.
    pub queue_errors: AtomicU64,
    /// Host-side faults (eventfd errors, unexpected backend errors).
    pub host_errors: AtomicU64,
    /// Times the backend hung up or failed for good (a socket peer gone, a
    /// TAP deleted): the device stops polling it until the driver resets
    /// the device. Each is also a host error.
    pub backend_hangups: AtomicU64,
    /// Guest writes to the read-only configuration space, ignored.
    pub config_writes_ignored: AtomicU64,
    /// Passes (either direction) cut short by the descriptor budget
    /// (`queue::PASS_DESC_BUDGET`) rather than by a weight.
    pub desc_budget_hits: AtomicU64,
    /// Passes (either direction) cut short by the time budget
    /// (`NetConfig::pass_time_budget_us`) rather than by a weight or the
    /// descriptor budget.
    pub time_budget_hits: AtomicU64,
    /// Ring entries and descriptors read by the datapath, good and refused
    /// chains alike.
    pub descs_walked: AtomicU64,
    /// The most ring entries and descriptors one pass has read (a gauge;
    /// never above `queue::MAX_PASS_READS`).
    pub max_descs_per_pass: AtomicU64,
    /// Runs of TX frames the backend refused the same way (not exported:
    /// what rate-limits their log lines across activations).
    #[serde(skip)]
    pub(crate) tx_refusal_runs: AtomicU64,
    /// Times the RX rate limiter stopped reading the backend until its
    /// timer fired.
    pub rx_rate_limiter_throttled: AtomicU64,
    /// Times the TX rate limiter held a frame back until its timer fired.
    pub tx_rate_limiter_throttled: AtomicU64,
    /// Nanoseconds RX was held back by its rate limiter.
    pub rx_throttled_ns: TimeCounter,
    /// Nanoseconds TX was held back by its rate limiter.
    pub tx_throttled_ns: TimeCounter,
    /// Passes (either direction) that were cut short and re-queued with used
    /// entries whose interrupt waits for the next pass (at most 64 entries
    /// wait; see `pass`).
    pub interrupts_coalesced: AtomicU64,
    /// TX batches handed to the backend with one `io_uring_enter` (0 with
    /// `io_engine` Sync); `tx_frames / tx_batches` is frames per system call.
    pub tx_batches: AtomicU64,
    /// What MMDS did on this card (keys `mmds_*`, all 0 on a card MMDS
    /// does not serve).
    #[serde(flatten)]
    pub mmds: MmdsMetrics,
}

impl Counters for NetMetrics {
    const DEVICE: &'static str = "virtio-net";
    fn host_error_counter(&self) -> &AtomicU64 {
        &self.host_errors
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::virtio::events;
    use crate::virtio::metrics::{assert_counter_keys, DeviceMetrics};

    /// Every key the JSON had when it was listed by hand, then the
    /// limiter's: a renamed field fails here.
    const KEYS: [&str; 44] = [
        "rx_frames",
        "rx_bytes",
        "rx_buffers",
        "tx_frames",
        "tx_bytes",
        "tx_weight_hits",
        "rx_weight_hits",
        "rx_starved_ns",
        "malformed_chains",
        "tap_eagain",
        "features_negotiated",
        "rx_no_avail_buffer",
        "rx_dropped",
        "tx_dropped",
        "tx_eagain_retries",
        "interrupts",
        "interrupts_suppressed",
        "rx_passes",
        "tx_passes",
        "queue_errors",
        "host_errors",
        "backend_hangups",
        "config_writes_ignored",
        "desc_budget_hits",
        "descs_walked",
        "max_descs_per_pass",
        "time_budget_hits",
        "rx_rate_limiter_throttled",
        "tx_rate_limiter_throttled",
        "rx_throttled_ns",
        "tx_throttled_ns",
        "tx_batches",
        "interrupts_coalesced",
        "mmds_rx_frames",
        "mmds_rx_dropped",
        "mmds_tx_frames",
        "mmds_tx_dropped",
        "mmds_connections_opened",
        "mmds_connections_reset",
        "mmds_requests_accepted",
        "mmds_requests_refused",
        "mmds_tokens_issued",
        "mmds_rx_invalid_token",
        "mmds_rx_no_token",
    ];

    #[test]
    fn test_json_has_every_contract_field() {
        let m = NetMetrics::default();
        events::add(&m.rx_bytes, 1514);
        m.features_negotiated.store(1 << 63 | 1, Ordering::Relaxed);
        let json = m.to_json();
        assert_counter_keys(&json, &KEYS);
        assert_eq!(json["rx_bytes"], 1514);
        // The full 64-bit feature word survives the round trip through JSON.
        let text = serde_json::to_string(&serde_json::json!({ "net0": json })).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back["net0"]["features_negotiated"].as_u64(),
            Some(1 << 63 | 1)
        );
    }

    #[test]
    fn test_time_counters_include_a_period_in_progress() {
        let m = NetMetrics::default();
        m.rx_starved_ns.start();
        m.tx_throttled_ns.start();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let json = m.to_json();
        assert!(json["rx_starved_ns"].as_u64().unwrap() >= 5_000_000);
        assert!(json["tx_throttled_ns"].as_u64().unwrap() >= 5_000_000);
        assert_eq!(json["rx_throttled_ns"], 0);
        assert_eq!(m.tx_throttled_ns.ended_ns(), 0);
        // A second start while running keeps the first start.
        m.tx_throttled_ns.start();
        m.tx_throttled_ns.stop();
        assert!(!m.tx_throttled_ns.is_running());
        let ended = m.tx_throttled_ns.ended_ns();
        assert!(ended >= 5_000_000, "{ended}");
        // Stopping again adds nothing; the total no longer moves.
        m.tx_throttled_ns.stop();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(m.tx_throttled_ns.total_ns(), ended);
    }
}
