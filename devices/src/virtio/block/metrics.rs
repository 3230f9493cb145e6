// SPDX-License-Identifier: Apache-2.0
//! Counters of the block device, serialized under the drive's id in the
//! VMM's metrics lines (`{"rootfs": <object>}`).
//!
//! The serialized form (serde, field name = JSON key) is a contract, as the
//! network device's: `read_count`, `write_count`, `flush_count`,
//! `read_bytes`, `write_bytes`, `discard_count`, `write_zeroes_count`,
//! `get_id_count`, `unsupported`, `io_errors`, `malformed_requests`,
//! `read_only_refusals`, `rate_limiter_throttled`, `throttled_ns`,
//! `descs_walked`, `max_descs_per_pass`, `pass_yields`, `passes`,
//! `queue_errors`, `host_errors`, `interrupts`, `interrupts_suppressed`,
//! `ring_submissions`, `max_in_flight`, `config_writes_ignored`,
//! `features_negotiated`. More fields may be added; none of these may be
//! renamed.
//!
//! Request counters count requests answered VIRTIO_BLK_S_OK; a request the
//! image refused (EIO, ENOSPC, a transfer that cannot complete) counts in
//! `io_errors` instead, one the guest got wrong in `malformed_requests`,
//! and each is answered exactly once. `max_descs_per_pass` (with
//! `descs_walked`) is what a fuzzer checks the pass bound against
//! (`queue::MAX_PASS_READS`).

use std::sync::atomic::AtomicU64;

use serde::Serialize;

use crate::virtio::events;
use crate::virtio::metrics::{Counters, QueueCounters};

use crate::virtio::time_counter::TimeCounter;

/// Lock-free counters of one drive.
#[derive(Debug, Default, Serialize)]
pub struct BlockMetrics {
    /// IN requests completed.
    pub read_count: AtomicU64,
    /// OUT requests completed.
    pub write_count: AtomicU64,
    /// FLUSH requests completed.
    pub flush_count: AtomicU64,
    /// Bytes read from the image into the guest.
    pub read_bytes: AtomicU64,
    /// Bytes written from the guest to the image.
    pub write_bytes: AtomicU64,
    /// DISCARD requests completed.
    pub discard_count: AtomicU64,
    /// WRITE_ZEROES requests completed.
    pub write_zeroes_count: AtomicU64,
    /// GET_ID requests completed.
    pub get_id_count: AtomicU64,
    /// Requests answered VIRTIO_BLK_S_UNSUPP (unknown type, a feature not
    /// negotiated, undefined flags).
    pub unsupported: AtomicU64,
    /// Requests answered VIRTIO_BLK_S_IOERR because the image refused them
    /// (the host's errno, or a transfer that could not complete).
    pub io_errors: AtomicU64,
    /// Chains the guest got wrong: answered IOERR, or returned with used
    /// length 0 when no status byte could be written.
    pub malformed_requests: AtomicU64,
    /// OUT, DISCARD and WRITE_ZEROES to a read-only drive, answered IOERR.
    pub read_only_refusals: AtomicU64,
    /// Times the rate limiter held a request back until its timer fired.
    pub rate_limiter_throttled: AtomicU64,
    /// Nanoseconds requests waited for the rate limiter.
    pub throttled_ns: TimeCounter,
    /// The counters of its passes (`passes`, `pass_yields`, `descs_walked`,
    /// `max_descs_per_pass`, `queue_errors`, `interrupts`,
    /// `interrupts_suppressed`).
    #[serde(flatten)]
    pub queue: QueueCounters,
    /// Host-side faults (eventfd, epoll, io_uring submission).
    pub host_errors: AtomicU64,
    /// `io_uring_enter` calls that submitted requests (0 with `Sync`).
    pub ring_submissions: AtomicU64,
    /// The most requests in flight on the io_uring at once (a gauge).
    pub max_in_flight: AtomicU64,
    /// Guest writes to the read-only configuration space, ignored.
    pub config_writes_ignored: AtomicU64,
    /// The 64-bit feature word the driver acknowledged at activation.
    pub features_negotiated: AtomicU64,
}

/// The request counters of one pass or one batch of completions, added to
/// the shared [`BlockMetrics`] once when it ends ([`Tally::flush`]): an
/// atomic add per answered request, two for reads and writes, was about a
/// tenth of the device thread's user-space time per 4 KiB request in the
/// page cache. The pass and the completion handler flush before they
/// return, so readers of the metrics never see a pass half counted for
/// longer than the pass runs.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) read_count: u64,
    pub(crate) read_bytes: u64,
    pub(crate) write_count: u64,
    pub(crate) write_bytes: u64,
    pub(crate) flush_count: u64,
    pub(crate) get_id_count: u64,
    pub(crate) discard_count: u64,
    pub(crate) write_zeroes_count: u64,
}

impl Tally {
    /// Adds the counts to `m` and starts over from zero.
    pub(crate) fn flush(&mut self, m: &BlockMetrics) {
        let t = std::mem::take(self);
        for (counter, n) in [
            (&m.read_count, t.read_count),
            (&m.read_bytes, t.read_bytes),
            (&m.write_count, t.write_count),
            (&m.write_bytes, t.write_bytes),
            (&m.flush_count, t.flush_count),
            (&m.get_id_count, t.get_id_count),
            (&m.discard_count, t.discard_count),
            (&m.write_zeroes_count, t.write_zeroes_count),
        ] {
            if n != 0 {
                events::add(counter, n);
            }
        }
    }
}

impl Counters for BlockMetrics {
    const DEVICE: &'static str = "virtio-blk";
    fn host_error_counter(&self) -> &AtomicU64 {
        &self.host_errors
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::virtio::metrics::{assert_counter_keys, DeviceMetrics};

    /// The contract's keys: a renamed field fails here.
    const KEYS: [&str; 26] = [
        "read_count",
        "write_count",
        "flush_count",
        "read_bytes",
        "write_bytes",
        "discard_count",
        "write_zeroes_count",
        "get_id_count",
        "unsupported",
        "io_errors",
        "malformed_requests",
        "read_only_refusals",
        "rate_limiter_throttled",
        "throttled_ns",
        "descs_walked",
        "max_descs_per_pass",
        "pass_yields",
        "passes",
        "queue_errors",
        "host_errors",
        "interrupts",
        "interrupts_suppressed",
        "ring_submissions",
        "max_in_flight",
        "config_writes_ignored",
        "features_negotiated",
    ];

    #[test]
    fn test_a_tally_adds_every_count_once() {
        let m = BlockMetrics::default();
        events::add(&m.read_count, 1);
        let mut t = Tally {
            read_count: 2,
            read_bytes: 3,
            write_count: 4,
            write_bytes: 5,
            flush_count: 6,
            get_id_count: 7,
            discard_count: 8,
            write_zeroes_count: 9,
        };
        t.flush(&m);
        t.flush(&m);
        let json = m.to_json();
        let want = [
            ("read_count", 3),
            ("read_bytes", 3),
            ("write_count", 4),
            ("write_bytes", 5),
            ("flush_count", 6),
            ("get_id_count", 7),
            ("discard_count", 8),
            ("write_zeroes_count", 9),
        ];
        for (key, n) in want {
            assert_eq!(json[key], n, "{key}");
        }
    }

    #[test]
    fn test_json_has_every_contract_field() {
        let m = BlockMetrics::default();
        events::add(&m.read_bytes, 4096);
        m.features_negotiated.store(1 << 63 | 1, Ordering::Relaxed);
        let json = m.to_json();
        assert_counter_keys(&json, &KEYS);
        assert_eq!(json["read_bytes"], 4096);
        assert_eq!(json["features_negotiated"].as_u64(), Some(1 << 63 | 1));
    }
}
