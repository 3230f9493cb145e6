// SPDX-License-Identifier: Apache-2.0
//! The [`Block`] device: opening the image, features, configuration space,
//! activation and reset.

use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::{BlockConfig, BlockMetrics};
use crate::virtio::queue::SplitQueue;
use crate::virtio::{ActivateError, GuestMemory, Interrupt, VirtioDevice};

/// virtio device ID of a block device (virtio 1.1 §5.2.1).
pub const BLOCK_DEVICE_ID: u32 = 2;

/// Why a block device could not be made; each names the image file.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The image cannot be opened (missing, unreadable, not writable).
    #[error("cannot open disk image {}: {source}", path.display())]
    Open {
        /// The image.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The path is a directory or another non-regular file.
    #[error("disk image {} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    /// Another process (another minivmm) holds the image's lock.
    #[error("disk image {} is in use by another process (locked)", .0.display())]
    Locked(PathBuf),
    /// A setting is outside its bounds.
    #[error("drive {id}: {msg}")]
    Config {
        /// The drive id.
        id: String,
        /// What is wrong.
        msg: String,
    },
}

/// A virtio-blk device over a raw image file.
pub struct Block {
    #[allow(dead_code)]
    pub(crate) cfg: BlockConfig,
    #[allow(dead_code)]
    pub(crate) mem: GuestMemory,
    #[allow(dead_code)]
    pub(crate) file: File,
    queue_sizes: [u16; 1],
    queue_evts: [EventFd; 1],
    pub(crate) metrics: Arc<BlockMetrics>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("id", &self.cfg.id)
            .field("path", &self.cfg.path)
            .finish_non_exhaustive()
    }
}

impl Block {
    /// Opens and locks the image and builds the device. Interface only: the
    /// datapath is not there yet and activation is refused.
    pub fn new(cfg: BlockConfig, mem: GuestMemory) -> Result<Self, BlockError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(!cfg.read_only)
            .open(&cfg.path)
            .map_err(|source| BlockError::Open {
                path: cfg.path.clone(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| BlockError::Open {
            path: cfg.path.clone(),
            source,
        })?;
        if !meta.is_file() {
            return Err(BlockError::NotAFile(cfg.path.clone()));
        }
        let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| BlockError::Open {
            path: cfg.path.clone(),
            source,
        })?;
        Ok(Block {
            queue_sizes: [cfg.queue_size],
            cfg,
            mem,
            file,
            queue_evts: [evt],
            metrics: Arc::default(),
        })
    }

    /// The counters, shared with the VMM's metrics writer.
    pub fn metrics(&self) -> Arc<BlockMetrics> {
        self.metrics.clone()
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        BLOCK_DEVICE_ID
    }

    fn avail_features(&self) -> u64 {
        1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.queue_sizes
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn activate(
        &mut self,
        _acked_features: u64,
        _queues: Vec<SplitQueue>,
        _interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        Err(ActivateError::Backend(
            "the block datapath is not built yet".into(),
        ))
    }

    fn reset(&mut self) {}
}

impl MutEventSubscriber for Block {
    fn process(&mut self, _events: Events, _ops: &mut EventOps) {}

    fn init(&mut self, _ops: &mut EventOps) {}
}
