// SPDX-License-Identifier: Apache-2.0
//! Counters of MMDS on one card, flattened into the card's
//! [`NetMetrics`](crate::virtio::net::NetMetrics) (so they appear under the
//! card's id in the `--metrics` file, every key starting with `mmds_`).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// What MMDS did on one card.
#[derive(Debug, Default, Serialize)]
pub struct MmdsMetrics {
    /// Guest frames to the MMDS address taken off the TX path (they never
    /// reach the TAP).
    pub mmds_rx_frames: AtomicU64,
    /// Of those, frames dropped: malformed, bad checksum, fragments, not
    /// TCP or ARP, or not for port 80.
    pub mmds_rx_dropped: AtomicU64,
    /// Frames MMDS put on the card's RX path (counted in `rx_frames` too).
    pub mmds_tx_frames: AtomicU64,
    /// MMDS frames the guest's posted buffers could not hold (dropped).
    pub mmds_tx_dropped: AtomicU64,
    /// TCP connections opened by the guest.
    pub mmds_connections_opened: AtomicU64,
    /// Connections reset by MMDS: the least recently used when another
    /// opened with the table full, or a request larger than the buffer.
    pub mmds_connections_reset: AtomicU64,
    /// HTTP requests answered with 200.
    pub mmds_requests_accepted: AtomicU64,
    /// HTTP requests answered with an error status (400, 401, 404, 405,
    /// 501).
    pub mmds_requests_refused: AtomicU64,
    /// Session tokens issued.
    pub mmds_tokens_issued: AtomicU64,
    /// `GET`s carrying a token that is not valid (V2: refused; V1: counted
    /// and answered).
    pub mmds_rx_invalid_token: AtomicU64,
    /// `GET`s without a token (V2: refused; V1: counted and answered).
    pub mmds_rx_no_token: AtomicU64,
}

impl MmdsMetrics {
    /// Adds one to `c`.
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}
