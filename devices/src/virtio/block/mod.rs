// SPDX-License-Identifier: Apache-2.0
//! virtio-blk (virtio 1.1 §5.2) over a raw image file.
//!
//! This module's public items are the interface the VMM builds against:
//! [`BlockConfig`] (plain data chosen by the VMM), [`Block`] (the device, a
//! [`VirtioDevice`](super::VirtioDevice) and an event-manager subscriber,
//! shared as `Arc<Mutex<Block>>` as the network device is) and
//! [`BlockMetrics`] (counters with a JSON view under the drive's id).
//!
//! The device, as the network device is split:
//!
//! | module | role |
//! |---|---|
//! | `device` | opening the image, features, configuration space, activation and reset |
//! | `error` | [`BlockError`], what opening an image or a setting can fail with |
//! | `request` | one chain read as a request, with every check (what is malformed, what is UNSUPP) |
//! | `pass` | one bounded pass over the request queue, the rate limiter |
//! | `io` | running requests (`Sync`: one `preadv`/`pwritev` each; `Async`: the io_uring) and answering each once |
//! | `backend` | the image file: every system call on it, the seam for fault injection |
//! | `uring` | the restricted io_uring |
//! | `event_handler` | the event-manager glue |
//! | `metrics` | the counters (field names are a contract) |
//!
//! **Features offered**: VERSION_1, BLK_SIZE (512), SEG_MAX ([`SEG_MAX`]),
//! EVENT_IDX, INDIRECT_DESC; RO for a read-only drive; FLUSH with
//! [`CacheType::Writeback`]; DISCARD where the image's file system punches
//! holes, WRITE_ZEROES where it also zeroes ranges (both probed at open,
//! neither on a read-only drive; one segment per request, at most 1 GiB).
//!
//! **Capacity.** The image's size in 512-byte sectors, rounded down: a file
//! whose size is not a multiple of 512 bytes has a partial last sector the
//! guest cannot reach (no request may touch it: a read of it would be
//! short, a write would grow the file). The device logs that once at open.
//! The size is read once, at open; an image that shrinks later answers the
//! reads past its new end IOERR, until the VMM says so
//! ([`Block::resize`]).
//!
//! **A new image while the VM runs** ([`Block::swap_backend`], Firecracker's
//! `PATCH /drives` with a new `path_on_host`): the requests in flight
//! complete on the old image first, then the capacity in the
//! configuration space becomes the new one's, ConfigGeneration changes
//! ([`VirtioDevice::config_generation`](super::VirtioDevice::config_generation))
//! and the guest gets a configuration-change interrupt. The features stay
//! as negotiated. The limits change with [`Block::set_rate_limiter`].
//!
//! **System calls.** In [`Block::new`], before seccomp: `open`, `fstat`,
//! `fcntl`, `flock`, `fallocate` (the probes, writable images only),
//! `eventfd2`, `timerfd_create` (with a rate limiter) and, for `Async`,
//! `io_uring_setup` and `io_uring_register`. On the event loop: `preadv`,
//! `pwritev` (`pread64`, `pwrite64` for one data buffer), `fdatasync`,
//! `fallocate` (`Sync`, or where the ring refuses an entry),
//! `io_uring_enter` (`Async`), `read`/`write` on the eventfds,
//! `timerfd_settime` and `read` on the limiter's timer, `epoll_ctl`, and
//! for a new image the `fallocate` probes and `close` of the old one, for
//! a limiter set while the VM runs `timerfd_create`. On a
//! vCPU thread: `write` on an eventfd at activation and reset, and
//! `io_uring_enter` when a reset waits for requests in flight.

use std::path::PathBuf;

use crate::rate_limiter::RateLimiterConfig;
pub use crate::virtio::io_engine::IoEngine;

pub mod backend;
pub mod device;
pub mod error;
pub mod event_handler;
mod io;
pub mod metrics;
pub mod pass;
pub mod request;
mod uring;

#[cfg(test)]
mod tests;

pub use backend::{BlockBackend, DiskInfo, FallocMode, FileBackend, FileId, OpKind, UnlockedImage};
pub use device::Block;
pub use error::BlockError;
pub use metrics::BlockMetrics;

/// Data segments one request may have (`seg_max`): with the header and
/// the status byte, a request is at most `SEG_MAX + 2` buffers; more is
/// answered IOERR. 126 data segments are 504 KiB of 4 KiB pages.
pub const SEG_MAX: u32 = 126;

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
