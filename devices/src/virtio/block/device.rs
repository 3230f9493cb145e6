// SPDX-License-Identifier: Apache-2.0
//! The [`Block`] device: opening the image, features, configuration space,
//! activation and reset.
//!
//! As for the network device, activation and reset arrive from a vCPU
//! thread through the MMIO transport and only change state here and write
//! `activate_evt`; the event handler brings the epoll registrations in line.
//! One exception: a reset with requests in flight on the io_uring waits for
//! them here, on the vCPU thread (`io_uring_enter`), before the queue goes,
//! so that no completion lands in the buffers of a driver that has started
//! over (see `io`).

use std::sync::Arc;

use super::backend::{BlockBackend, DiskInfo, FileBackend};
use super::error::BlockError;
use super::io::AsyncEngine;
use super::metrics::BlockMetrics;
use super::pass::BlockVirtio;
use super::request::{Rules, MAX_DWZ_SECTORS, MAX_DWZ_SEGS};
use super::uring::BlockRing;
use super::{BlockConfig, CacheType, IoEngine, SECTOR_SIZE, SEG_MAX};
use crate::rate_limiter::RateLimiterConfig;
use crate::virtio::events::{self, Activation};
use crate::virtio::metrics::Counters;
use crate::virtio::queue::SplitQueue;
use crate::virtio::request_queue::{limiter_for, update_limiter, RequestQueue};
use crate::virtio::{
    read_config_space, ActivateError, DeviceMetrics, GuestMemory, Interrupt, VirtioCommon,
    VirtioDevice,
};

/// virtio device ID of a block device (virtio 1.1 §5.2.1).
pub const BLOCK_DEVICE_ID: u32 = virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;

/// Feature bits (virtio 1.1 §5.2.3, §6), from `virtio-bindings`.
pub mod features {
    pub use virtio_bindings::virtio_blk::{
        VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO,
        VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES,
    };
    pub use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
    pub use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
}
use features::*;

const fn bit(b: u32) -> u64 {
    1u64 << b
}

/// Offsets in `struct virtio_blk_config` (virtio 1.1 §5.2.4).
pub mod config_offsets {
    /// `le64 capacity`, in 512-byte sectors.
    pub const CAPACITY: usize = 0;
    /// `le32 seg_max`.
    pub const SEG_MAX: usize = 12;
    /// `le32 blk_size`.
    pub const BLK_SIZE: usize = 20;
    /// `le32 max_discard_sectors`.
    pub const MAX_DISCARD_SECTORS: usize = 36;
    /// `le32 max_discard_seg`.
    pub const MAX_DISCARD_SEG: usize = 40;
    /// `le32 discard_sector_alignment`.
    pub const DISCARD_SECTOR_ALIGNMENT: usize = 44;
    /// `le32 max_write_zeroes_sectors`.
    pub const MAX_WRITE_ZEROES_SECTORS: usize = 48;
    /// `le32 max_write_zeroes_seg`.
    pub const MAX_WRITE_ZEROES_SEG: usize = 52;
    /// `u8 write_zeroes_may_unmap`.
    pub const WRITE_ZEROES_MAY_UNMAP: usize = 56;
    /// Bytes exposed: up to `write_zeroes_may_unmap` and its padding.
    pub const LEN: usize = 60;
}
use config_offsets as off;

/// State that exists only between activation and reset.
pub(crate) struct Active {
    pub(crate) virtio: BlockVirtio,
    pub(crate) activation: Activation,
    /// The last pass stopped on a full io_uring: completions start the next.
    pub(crate) saturated: bool,
}

/// A virtio-blk device over a raw image file (or, in tests, any
/// [`BlockBackend`]).
pub struct Block<B: BlockBackend = FileBackend> {
    /// The io_uring (`IoEngine::Async`); `None` runs requests with one
    /// system call each. Built with the device, before any seccomp filter.
    /// First, so that dropping the device waits for what is in flight
    /// before anything else goes.
    pub(crate) engine: Option<AsyncEngine>,
    pub(crate) cfg: BlockConfig,
    pub(crate) mem: GuestMemory,
    pub(crate) backend: B,
    info: DiskInfo,
    /// The transport's view, the eventfds, the limiter and the
    /// registrations of its one queue.
    pub(crate) rq: RequestQueue,
    config_space: [u8; off::LEN],
    /// ConfigGeneration: changed with the configuration space (a new
    /// image's capacity).
    config_generation: u32,
    pub(crate) metrics: Arc<BlockMetrics>,
    pub(crate) active: Option<Active>,
}

impl<B: BlockBackend> std::fmt::Debug for Block<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("id", &self.cfg.id)
            .field("path", &self.cfg.path)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

/// The settings with bounds: the queue size, and an id GET_ID can return.
fn check_config(cfg: &BlockConfig) -> Result<(), String> {
    let qs = cfg.queue_size;
    if qs == 0 || !qs.is_power_of_two() || qs > crate::virtio::queue::MAX_QUEUE_SIZE {
        return Err(format!(
            "queue size {qs} is not a power of two between 1 and 32768"
        ));
    }
    if cfg.id.len() > super::ID_BYTES {
        return Err(format!(
            "id is {} bytes, GET_ID returns at most {}",
            cfg.id.len(),
            super::ID_BYTES
        ));
    }
    Ok(())
}

/// An image of `size` bytes whose last sector is partial: said once, at
/// open (see the module docs of `block`).
fn warn_partial_sector(cfg: &BlockConfig, size: u64) {
    let tail = size % SECTOR_SIZE;
    if tail != 0 {
        log::warn!(
            "virtio-blk: drive {}: {} is {size} bytes, not a whole number of 512-byte \
             sectors; the last {tail} bytes are not visible to the guest",
            cfg.id,
            cfg.path.display(),
        );
    }
}

/// The features offered and the configuration space of a drive `cfg` over
/// an image `info` says.
fn offer(cfg: &BlockConfig, info: &DiskInfo) -> (u64, [u8; off::LEN]) {
    let mut f = bit(VIRTIO_F_VERSION_1)
        | bit(VIRTIO_BLK_F_BLK_SIZE)
        | bit(VIRTIO_BLK_F_SEG_MAX)
        | bit(VIRTIO_RING_F_EVENT_IDX)
        | bit(VIRTIO_RING_F_INDIRECT_DESC);
    if cfg.read_only {
        f |= bit(VIRTIO_BLK_F_RO);
    }
    if cfg.cache_type == CacheType::Writeback {
        f |= bit(VIRTIO_BLK_F_FLUSH);
    }
    let discard = !cfg.read_only && info.punch_hole;
    let write_zeroes = discard && info.zero_range;
    if discard {
        f |= bit(VIRTIO_BLK_F_DISCARD);
    }
    if write_zeroes {
        f |= bit(VIRTIO_BLK_F_WRITE_ZEROES);
    }
    let mut cs = [0u8; off::LEN];
    let mut put32 = |at: usize, v: u32| cs[at..at + 4].copy_from_slice(&v.to_le_bytes());
    put32(off::SEG_MAX, SEG_MAX);
    put32(off::BLK_SIZE, SECTOR_SIZE as u32);
    if discard {
        put32(off::MAX_DISCARD_SECTORS, MAX_DWZ_SECTORS);
        put32(off::MAX_DISCARD_SEG, MAX_DWZ_SEGS);
        put32(off::DISCARD_SECTOR_ALIGNMENT, 1);
    }
    if write_zeroes {
        put32(off::MAX_WRITE_ZEROES_SECTORS, MAX_DWZ_SECTORS);
        put32(off::MAX_WRITE_ZEROES_SEG, MAX_DWZ_SEGS);
    }
    let capacity = info.size / SECTOR_SIZE;
    cs[off::CAPACITY..off::CAPACITY + 8].copy_from_slice(&capacity.to_le_bytes());
    if write_zeroes {
        cs[off::WRITE_ZEROES_MAY_UNMAP] = 1;
    }
    (f, cs)
}

/// The io_uring of an `Async` drive, or none: `Sync`, or a host that
/// refuses the ring (the requests then run one system call each).
fn async_engine<B: BlockBackend>(
    cfg: &BlockConfig,
    backend: &B,
    mem: &GuestMemory,
) -> Option<AsyncEngine> {
    if cfg.io_engine != IoEngine::Async {
        return None;
    }
    match BlockRing::new(backend.as_raw_fd()) {
        Ok(ring) => Some(AsyncEngine::new(ring, mem.clone())),
        Err(e) => {
            log::info!(
                "virtio-blk: drive {}: io_uring unavailable ({e}); requests run one system \
                 call each",
                cfg.id
            );
            None
        }
    }
}

impl Block<FileBackend> {
    /// Opens and locks the image and builds the device (and, for
    /// `IoEngine::Async`, its io_uring): everything that must happen before
    /// the VMM's seccomp filters.
    pub fn new(cfg: BlockConfig, mem: GuestMemory) -> Result<Self, BlockError> {
        let backend = FileBackend::open(&cfg.path, cfg.read_only)?;
        Self::with_backend(cfg, mem, backend)
    }
}

impl<B: BlockBackend> Block<B> {
    /// Builds the device over an opened backend.
    pub fn with_backend(
        cfg: BlockConfig,
        mem: GuestMemory,
        backend: B,
    ) -> Result<Self, BlockError> {
        let config_err = |msg: String| BlockError::Config {
            id: cfg.id.clone(),
            msg,
        };
        check_config(&cfg).map_err(config_err)?;
        let limiter =
            limiter_for(&cfg.rate_limiter).map_err(|e| config_err(format!("rate limiter: {e}")))?;
        let info = backend.info();
        warn_partial_sector(&cfg, info.size);
        let (features, config_space) = offer(&cfg, &info);
        let engine = async_engine(&cfg, &backend, &mem);
        let rq = RequestQueue::new(BLOCK_DEVICE_ID, features, cfg.queue_size, limiter).map_err(
            |source| BlockError::Open {
                path: cfg.path.clone(),
                source,
            },
        )?;
        Ok(Block {
            rq,
            cfg,
            mem,
            backend,
            info,
            config_space,
            config_generation: 0,
            metrics: Arc::default(),
            engine,
            active: None,
        })
    }

    /// The counters, shared with the VMM's metrics writer.
    pub fn metrics(&self) -> Arc<BlockMetrics> {
        self.metrics.clone()
    }

    /// Capacity in 512-byte sectors: the image size rounded down (see the
    /// module docs of `block`).
    pub fn capacity(&self) -> u64 {
        self.info.size / SECTOR_SIZE
    }

    /// Whether requests go through the io_uring (`Async` and the host
    /// allowed it).
    pub fn uses_io_uring(&self) -> bool {
        self.engine.is_some()
    }

    /// Whether the device is activated (between DRIVER_OK and reset).
    pub fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    /// The backend (tests reach the fault-injecting one through this).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably.
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Replaces the image while the device runs (`PATCH /drives` with a
    /// new `path_on_host`): `backend` is the new image, opened with the
    /// drive's read-only setting (and probed), `path` its name for the logs.
    ///
    /// Requests in flight on the io_uring were submitted on the old image:
    /// they are waited for and answered here, against it, before anything
    /// changes, so every request the driver posted before the swap is done
    /// on the old image and every one the device takes after it on the new
    /// one. The wait is bounded: each round takes at least one completion,
    /// and a request is submitted at most `MAX_ATTEMPTS` times (the
    /// `Sync` engine has nothing in flight between two passes). A request
    /// the rate limiter holds back runs on the new image if it still fits
    /// in it, and is answered IOERR if not.
    ///
    /// The features stay as negotiated: a new image whose file system
    /// cannot do what DISCARD or WRITE_ZEROES (offered to the guest) need
    /// is refused. Then the capacity in the configuration space becomes the
    /// new image's, ConfigGeneration changes, and an activated device
    /// raises a configuration-change interrupt, on which the guest's driver
    /// reads the new capacity. On `Err` the old image stays in use and
    /// nothing changed; the new one is closed.
    pub fn swap_backend(&mut self, backend: B, path: std::path::PathBuf) -> Result<(), BlockError> {
        let id = self.cfg.id.clone();
        let refuse = |msg: String| BlockError::Config { id, msg };
        let info = backend.info();
        if self.rq.common.avail_features & bit(VIRTIO_BLK_F_DISCARD) != 0 && !info.punch_hole {
            return Err(refuse(format!(
                "the file system of {} cannot punch holes, which DISCARD (offered to the \
                 guest) needs",
                path.display()
            )));
        }
        if self.rq.common.avail_features & bit(VIRTIO_BLK_F_WRITE_ZEROES) != 0 && !info.zero_range {
            return Err(refuse(format!(
                "the file system of {} cannot zero ranges, which WRITE_ZEROES (offered to \
                 the guest) needs",
                path.display()
            )));
        }
        if let Err(e) = self.complete_in_flight() {
            return Err(refuse(format!(
                "the requests in flight on the current image did not complete ({e}); it stays \
                 in use"
            )));
        }
        if let Some(engine) = self.engine.as_mut() {
            engine.set_fd(backend.as_raw_fd());
        }
        let old = std::mem::replace(&mut self.backend, backend);
        drop(old);
        log::info!(
            "virtio-blk: drive {}: image {} replaced by {}",
            self.cfg.id,
            self.cfg.path.display(),
            path.display()
        );
        self.cfg.path = path;
        self.info = info;
        self.disk_changed(info.size);
        Ok(())
    }

    /// The image in use changed size (the host grew or shrank the file,
    /// and `PATCH /drives` named it again): `size` is its size in bytes now.
    /// The capacity follows, as after [`swap_backend`](Self::swap_backend).
    pub fn resize(&mut self, size: u64) {
        log::info!(
            "virtio-blk: drive {}: {} is now {size} bytes",
            self.cfg.id,
            self.cfg.path.display()
        );
        self.disk_changed(size);
    }

    /// Waits for and answers every request in flight on the io_uring (see
    /// [`swap_backend`](Self::swap_backend)).
    fn complete_in_flight(&mut self) -> std::io::Result<()> {
        let (Some(engine), Some(a)) = (self.engine.as_mut(), self.active.as_mut()) else {
            // Without an activation nothing is in flight (a reset waits).
            return Ok(());
        };
        // Ends: every wait returns with a completion posted, `complete`
        // takes them all, and each either answers its request or submits
        // its remainder, at most MAX_ATTEMPTS times per request. The ring's
        // eventfd stays signalled, so the event handler looks again (and
        // restarts a pass that stopped on a full ring).
        while engine.in_flight() > 0 {
            engine.wait()?;
            a.virtio.complete(
                &mut self.backend,
                engine,
                &self.metrics,
                &*a.activation.interrupt,
            );
        }
        Ok(())
    }

    /// The configuration space says `size` bytes from now on, and the
    /// guest is told (see [`swap_backend`](Self::swap_backend)).
    fn disk_changed(&mut self, size: u64) {
        self.info.size = size;
        let capacity = self.capacity();
        self.config_space[off::CAPACITY..off::CAPACITY + 8]
            .copy_from_slice(&capacity.to_le_bytes());
        self.config_generation = self.config_generation.wrapping_add(1);
        if let Some(a) = self.active.as_mut() {
            let interrupt = &*a.activation.interrupt;
            a.virtio.set_capacity(capacity, &self.metrics, interrupt);
            interrupt.signal_config_change();
        }
    }

    /// Replaces the rate limits while the device runs (`PATCH /drives`
    /// with a `rate_limiter`), as the network device's
    /// [`set_rate_limits`](crate::virtio::net::Net::set_rate_limits) does:
    /// a limiter keeps its timer and the request it holds back, which is
    /// tried first against the new buckets; a device without one gets one
    /// (its timer made here, on the event loop's thread). The stored
    /// configuration follows. On `Err` nothing changed.
    pub fn set_rate_limiter(&mut self, cfg: &RateLimiterConfig) -> Result<(), BlockError> {
        let err = |e: crate::rate_limiter::RateLimiterError| BlockError::Config {
            id: self.cfg.id.clone(),
            msg: format!("rate limiter: {e}"),
        };
        update_limiter(&mut self.rq.limiter, cfg).map_err(err)?;
        self.cfg.rate_limiter = *cfg;
        Ok(())
    }

    /// The configuration in force (the image's path and the limits follow
    /// the changes made while the device runs).
    pub fn config(&self) -> &BlockConfig {
        &self.cfg
    }

    /// Ends the current activation: waits for what is in flight, drops the
    /// queue and any request the limiter held back, unanswered.
    fn deactivate(&mut self) {
        if let Some(e) = self.engine.as_mut() {
            e.quiesce();
        }
        if self.active.take().is_some_and(|a| a.virtio.is_throttled()) {
            self.metrics.throttled_ns.stop();
        }
    }
}

impl<B: BlockBackend + 'static> VirtioDevice for Block<B> {
    fn common(&self) -> &VirtioCommon {
        &self.rq.common
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_space(&self.config_space, offset, data);
    }

    fn config_generation(&self) -> u32 {
        self.config_generation
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // `wce` is writable only with VIRTIO_BLK_F_CONFIG_WCE, not offered.
        events::ignored_config_write(
            &self.metrics.config_writes_ignored,
            "virtio-blk",
            offset,
            data.len(),
        );
    }

    fn activate(
        &mut self,
        acked_features: u64,
        queues: Vec<SplitQueue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        let (queue, acked) = self.rq.take_queue(acked_features, queues, &self.mem)?;
        // An activation without a reset in between starts over too.
        self.deactivate();
        let rules = Rules {
            capacity: self.capacity(),
            read_only: self.cfg.read_only,
            discard: self.rq.common.has_feature(VIRTIO_BLK_F_DISCARD),
            write_zeroes: self.rq.common.has_feature(VIRTIO_BLK_F_WRITE_ZEROES),
        };
        self.active = Some(Active {
            virtio: BlockVirtio::new(queue, rules, self.cfg.cache_type, &self.cfg.id),
            activation: Activation::new(interrupt),
            saturated: false,
        });
        let m = &self.metrics;
        self.rq
            .activated(acked, &m.features_negotiated, m.host_errors());
        Ok(())
    }

    fn reset(&mut self) {
        self.deactivate();
        self.rq.reset(self.metrics.host_errors());
    }

    fn quiesce(&mut self) -> Result<(), crate::virtio::persist::PersistError> {
        // io_uring completes out of order: a snapshot waits for every
        // request in flight, so the ones left are only a held-back one.
        self.complete_in_flight().map_err(|e| {
            crate::virtio::persist::PersistError::Device(format!(
                "drive {}: the requests in flight did not complete: {e}",
                self.cfg.id
            ))
        })
    }

    fn device_metrics(&self) -> Arc<dyn DeviceMetrics> {
        self.metrics.clone()
    }

    fn save_state(&self) -> serde_json::Value {
        self.rq.save_state()
    }

    fn restore_state(
        &mut self,
        state: &serde_json::Value,
    ) -> Result<(), crate::virtio::persist::PersistError> {
        self.rq.restore_state(&self.cfg.rate_limiter, state)
    }
}
