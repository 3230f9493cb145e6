// SPDX-License-Identifier: Apache-2.0
//! The [`Rng`] device: features, the empty configuration space,
//! activation and reset, and the limits changed while it runs.
//!
//! As for the other devices, activation and reset arrive from a vCPU thread
//! through the MMIO transport and only change state here and write
//! `activate_evt`; the event handler brings the epoll registrations in line.

use std::sync::Arc;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

use super::metrics::RngMetrics;
use super::pass::RngVirtio;
use super::source::{EntropySource, Getrandom};
use super::RngConfig;
use crate::rate_limiter::{RateLimiterConfig, RateLimiterError};
use crate::virtio::events::{self, Activation};
use crate::virtio::metrics::Counters;
use crate::virtio::queue::{SplitQueue, MAX_QUEUE_SIZE};
use crate::virtio::request_queue::{limiter_for, update_limiter, RequestQueue};
use crate::virtio::{
    ActivateError, DeviceMetrics, GuestMemory, Interrupt, VirtioCommon, VirtioDevice,
};

/// Why an entropy device could not be made, or its limits not changed.
#[derive(Debug, thiserror::Error)]
pub enum RngError {
    /// `queue_size` is not a power of two in 1..=32768.
    #[error("queue size {0} is not a power of two between 1 and {max}", max = MAX_QUEUE_SIZE)]
    QueueSize(u16),
    /// The rate limiter is misconfigured or its timer could not be made.
    #[error("invalid entropy rate limiter")]
    RateLimiter(#[source] RateLimiterError),
    /// An eventfd could not be created.
    #[error("cannot create an eventfd")]
    EventFd(#[source] std::io::Error),
}

/// State that exists only between activation and reset.
pub(crate) struct Active {
    pub(crate) virtio: RngVirtio,
    pub(crate) activation: Activation,
}

/// A virtio-rng device over the host's `getrandom(2)` (or, in tests, any
/// [`EntropySource`]).
pub struct Rng<S: EntropySource = Getrandom> {
    pub(crate) cfg: RngConfig,
    pub(crate) mem: GuestMemory,
    pub(crate) source: S,
    /// The transport's view, the eventfds, the limiter and the
    /// registrations of its one queue.
    pub(crate) rq: RequestQueue,
    pub(crate) metrics: Arc<RngMetrics>,
    pub(crate) active: Option<Active>,
}

impl<S: EntropySource> std::fmt::Debug for Rng<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rng")
            .field("cfg", &self.cfg)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl Rng<Getrandom> {
    /// Builds the device (its eventfds and, with limits, the limiter's
    /// timer): everything that must happen before the VMM's seccomp
    /// filters.
    pub fn new(cfg: RngConfig, mem: GuestMemory) -> Result<Self, RngError> {
        Self::with_source(cfg, mem, Getrandom)
    }
}

impl<S: EntropySource> Rng<S> {
    /// Builds the device over `source`.
    pub fn with_source(cfg: RngConfig, mem: GuestMemory, source: S) -> Result<Self, RngError> {
        let qs = cfg.queue_size;
        if qs == 0 || !qs.is_power_of_two() || qs > MAX_QUEUE_SIZE {
            return Err(RngError::QueueSize(qs));
        }
        let limiter = limiter_for(&cfg.rate_limiter).map_err(RngError::RateLimiter)?;
        let features = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC;
        Ok(Rng {
            rq: RequestQueue::new(VIRTIO_ID_RNG, features, qs, limiter)
                .map_err(RngError::EventFd)?,
            cfg,
            mem,
            source,
            metrics: Arc::default(),
            active: None,
        })
    }

    /// The counters, shared with the VMM's metrics writer.
    pub fn metrics(&self) -> Arc<RngMetrics> {
        self.metrics.clone()
    }

    /// Whether the device is activated (between DRIVER_OK and reset).
    pub fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    /// The configuration in force (the limits follow the changes made
    /// while the device runs).
    pub fn config(&self) -> &RngConfig {
        &self.cfg
    }

    /// The entropy source (tests reach a failing one through this).
    pub fn source_mut(&mut self) -> &mut S {
        &mut self.source
    }

    /// Replaces the rate limits while the device runs, as the other
    /// devices' `set_rate_limiter` does: a limiter keeps its timer and the
    /// request it holds back, which is tried first against the new buckets;
    /// a device without one gets one (its timer made here, on the event
    /// loop's thread). The stored configuration follows. On `Err` nothing
    /// changed.
    pub fn set_rate_limiter(&mut self, cfg: &RateLimiterConfig) -> Result<(), RngError> {
        update_limiter(&mut self.rq.limiter, cfg).map_err(RngError::RateLimiter)?;
        self.cfg.rate_limiter = *cfg;
        Ok(())
    }

    /// Ends the current activation: drops the queue and any request the
    /// limiter held back, unanswered (the driver starts over).
    fn deactivate(&mut self) {
        if self.active.take().is_some_and(|a| a.virtio.is_throttled()) {
            self.metrics.throttled_ns.stop();
        }
    }
}

impl<S: EntropySource + 'static> VirtioDevice for Rng<S> {
    fn common(&self) -> &VirtioCommon {
        &self.rq.common
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // virtio-rng has no configuration space (virtio 1.1 §5.4.4).
        data.fill(0);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        events::ignored_config_write(
            &self.metrics.config_writes_ignored,
            "virtio-rng",
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
        self.active = Some(Active {
            virtio: RngVirtio::new(queue),
            activation: Activation::new(interrupt),
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
