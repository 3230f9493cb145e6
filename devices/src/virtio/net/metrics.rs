// SPDX-License-Identifier: Apache-2.0
//! Counters of the network device.
//!
//! Every counter is an `AtomicU64` updated with `Relaxed` ordering on the
//! event-loop thread and read from anywhere (the VMM's metrics writer, a
//! SIGUSR1 handler thread, tests) through the `Arc<NetMetrics>` that
//! [`Net::metrics`](super::Net::metrics) hands out. Counters never go
//! backwards, not even across a device reset, so a reader can take deltas.
//!
//! [`NetMetrics::to_json`] is a contract: the VMM writes it as
//! `{"net0": <object>}` and the end-to-end tests read these field names:
//! `rx_frames`, `rx_bytes`, `rx_buffers`, `tx_frames`, `tx_bytes`,
//! `tx_weight_hits`, `rx_weight_hits`, `rx_starved_ns`, `malformed_chains`,
//! `tap_eagain`, `features_negotiated`. More fields may be added; none of these
//! may be renamed. `max_descs_per_pass` (with `desc_budget_hits` and
//! `descs_walked`) is what a fuzzer checks the pass bound against.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// Counters of one network device.
#[derive(Debug, Default)]
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
    /// had not posted enough RX buffers (updated when a starvation ends;
    /// [`NetMetrics::to_json`] adds one still in progress).
    pub rx_starved_ns: AtomicU64,
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
    /// Guest writes to the read-only configuration space, ignored.
    pub config_writes_ignored: AtomicU64,
    /// Passes (either direction) cut short by the descriptor budget
    /// (`rxtx::PASS_DESC_BUDGET`) rather than by a weight.
    pub desc_budget_hits: AtomicU64,
    /// Passes (either direction) cut short by the time budget
    /// (`NetConfig::pass_time_budget_us`) rather than by a weight or the
    /// descriptor budget.
    pub time_budget_hits: AtomicU64,
    /// Ring entries and descriptors read by the datapath, good and refused
    /// chains alike.
    pub descs_walked: AtomicU64,
    /// The most ring entries and descriptors one pass has read (a gauge;
    /// never above `rxtx::MAX_PASS_READS`).
    pub max_descs_per_pass: AtomicU64,
    /// When the current starvation began ([`mono_ns`]), 0 when not starved;
    /// lets `to_json` include a starvation still in progress.
    pub(crate) starved_since_ns: AtomicU64,
}

/// Nanoseconds on a monotonic clock private to this process, never 0.
pub(crate) fn mono_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos())
        .unwrap_or(u64::MAX)
        .saturating_add(1)
}

impl NetMetrics {
    /// Adds `n` to a counter.
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// Increments a counter and returns its new value.
    pub(crate) fn inc(counter: &AtomicU64) -> u64 {
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// `rx_starved_ns` including a starvation still in progress.
    pub fn rx_starved_ns_now(&self) -> u64 {
        let done = self.rx_starved_ns.load(Ordering::Relaxed);
        match self.starved_since_ns.load(Ordering::Relaxed) {
            0 => done,
            since => done.saturating_add(mono_ns().saturating_sub(since)),
        }
    }

    /// The counters as one JSON object (see the module docs for the contract).
    pub fn to_json(&self) -> serde_json::Value {
        let get = |c: &AtomicU64| serde_json::Value::from(c.load(Ordering::Relaxed));
        serde_json::json!({
            "rx_frames": get(&self.rx_frames),
            "rx_bytes": get(&self.rx_bytes),
            "rx_buffers": get(&self.rx_buffers),
            "tx_frames": get(&self.tx_frames),
            "tx_bytes": get(&self.tx_bytes),
            "tx_weight_hits": get(&self.tx_weight_hits),
            "rx_weight_hits": get(&self.rx_weight_hits),
            "rx_starved_ns": self.rx_starved_ns_now(),
            "malformed_chains": get(&self.malformed_chains),
            "tap_eagain": get(&self.tap_eagain),
            "features_negotiated": get(&self.features_negotiated),
            "rx_no_avail_buffer": get(&self.rx_no_avail_buffer),
            "rx_dropped": get(&self.rx_dropped),
            "tx_dropped": get(&self.tx_dropped),
            "tx_eagain_retries": get(&self.tx_eagain_retries),
            "interrupts": get(&self.interrupts),
            "interrupts_suppressed": get(&self.interrupts_suppressed),
            "rx_passes": get(&self.rx_passes),
            "tx_passes": get(&self.tx_passes),
            "queue_errors": get(&self.queue_errors),
            "host_errors": get(&self.host_errors),
            "config_writes_ignored": get(&self.config_writes_ignored),
            "desc_budget_hits": get(&self.desc_budget_hits),
            "time_budget_hits": get(&self.time_budget_hits),
            "descs_walked": get(&self.descs_walked),
            "max_descs_per_pass": get(&self.max_descs_per_pass),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_json_has_every_contract_field() {
        let m = NetMetrics::default();
        NetMetrics::add(&m.rx_bytes, 1514);
        m.features_negotiated.store(1 << 63 | 1, Ordering::Relaxed);
        let json = m.to_json();
        for field in [
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
        ] {
            assert!(json[field].is_u64(), "{field} missing or not an integer");
        }
        assert_eq!(json["rx_bytes"], 1514);
        // A starvation in progress counts.
        m.starved_since_ns.store(mono_ns(), Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(5));
        assert!(m.to_json()["rx_starved_ns"].as_u64().unwrap() >= 5_000_000);
        // The full 64-bit feature word survives the round trip through JSON.
        let text = serde_json::to_string(&serde_json::json!({ "net0": json })).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            back["net0"]["features_negotiated"].as_u64(),
            Some(1 << 63 | 1)
        );
    }
}
