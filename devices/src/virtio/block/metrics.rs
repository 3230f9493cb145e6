// SPDX-License-Identifier: Apache-2.0
//! Counters of the block device, serialized under the drive's id in the
//! VMM's metrics lines. Field names are a contract, as the network device's.

use std::sync::atomic::AtomicU64;

use serde::Serialize;

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
}
