// SPDX-License-Identifier: Apache-2.0
//! virtio-blk (virtio 1.1 §5.2) over a raw image file.
//!
//! This module's public items are the interface the VMM builds against:
//! [`BlockConfig`] (plain data chosen by the VMM), [`Block`] (the device, a
//! [`VirtioDevice`](super::VirtioDevice) and an event-manager subscriber,
//! shared as `Arc<Mutex<Block>>` as the network device is) and
//! [`BlockMetrics`] (counters with a JSON view under the drive's id).

use std::path::PathBuf;

use crate::rate_limiter::RateLimiterConfig;
pub use crate::virtio::io_engine::IoEngine;

pub mod device;
pub mod metrics;

pub use device::{Block, BlockError};
pub use metrics::BlockMetrics;

/// Sector size of the virtio-blk protocol (virtio 1.1 §5.2.6: `sector` is
/// always in 512-byte units, whatever `blk_size` says).
pub const SECTOR_SIZE: u64 = 512;
/// Bytes of the drive id GET_ID returns (virtio 1.1 §5.2.6,
/// `VIRTIO_BLK_ID_BYTES`).
pub const ID_BYTES: usize = 20;
/// Default QueueNumMax of the request queue (Firecracker's).
pub const DEFAULT_QUEUE_SIZE: u16 = 256;

/// What FLUSH does (Firecracker's `cache_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheType {
    /// FLUSH completes at once and VIRTIO_BLK_F_FLUSH is not offered:
    /// Firecracker's default, data reaches the disk when the host decides.
    #[default]
    Unsafe,
    /// VIRTIO_BLK_F_FLUSH is offered (the guest sees a write cache) and a
    /// FLUSH is an `fdatasync` of the image.
    Writeback,
}

/// Configuration of one block device, plain data chosen by the VMM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockConfig {
    /// The drive id: returned by GET_ID (at most [`ID_BYTES`] bytes, the rest
    /// zero) and the metrics key.
    pub id: String,
    /// The raw image file.
    pub path: PathBuf,
    /// Open the image read-only and offer VIRTIO_BLK_F_RO.
    pub read_only: bool,
    /// What FLUSH does.
    pub cache_type: CacheType,
    /// How requests reach the image.
    pub io_engine: IoEngine,
    /// Limits on requests (bandwidth in bytes, ops in requests).
    pub rate_limiter: RateLimiterConfig,
    /// QueueNumMax of the one request queue: a power of two up to 32768.
    pub queue_size: u16,
}

impl BlockConfig {
    /// A drive on `path` with the defaults: read-write, `Unsafe`, `Async`,
    /// no limits.
    pub fn new(id: impl Into<String>, path: impl Into<PathBuf>) -> Self {
        BlockConfig {
            id: id.into(),
            path: path.into(),
            read_only: false,
            cache_type: CacheType::default(),
            io_engine: IoEngine::default(),
            rate_limiter: RateLimiterConfig::default(),
            queue_size: DEFAULT_QUEUE_SIZE,
        }
    }
}
