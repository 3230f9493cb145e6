// SPDX-License-Identifier: Apache-2.0
//! The [`Rng`] device: features, the empty configuration space,
//! activation and reset, and the limits changed while it runs.
//!
//! As for the other devices, activation and reset arrive from a vCPU thread
//! through the MMIO transport and only change state here and write
//! `activate_evt`; the event handler brings the epoll registrations in line.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vmm_sys_util::eventfd::EventFd;

use super::metrics::RngMetrics;
use super::pass::RngVirtio;
use super::source::{EntropySource, Getrandom};
use super::RngConfig;
use crate::rate_limiter::{RateLimiter, RateLimiterConfig, RateLimiterError};
use crate::virtio::events::{self, Activation, QueueRegistrations};
use crate::virtio::metrics::Counters;
use crate::virtio::queue::{SplitQueue, MAX_QUEUE_SIZE};
use crate::virtio::{
    check_queues, ActivateError, DeviceMetrics, GuestMemory, Interrupt, VirtioCommon, VirtioDevice,
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
    /// ID, features, queue size and notification eventfd.
    pub(crate) common: VirtioCommon,
    pub(crate) activate_evt: EventFd,
    pub(crate) requeue_evt: EventFd,
    pub(crate) metrics: Arc<RngMetrics>,
    /// Limits on requests; `None` without any bucket. Outlives activations.
    pub(crate) limiter: Option<RateLimiter>,
    pub(crate) active: Option<Active>,
    pub(crate) registered: QueueRegistrations,
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
        cfg.rate_limiter.validate().map_err(RngError::RateLimiter)?;
        let limiter = (!cfg.rate_limiter.is_unlimited())
            .then(|| RateLimiter::new(&cfg.rate_limiter))
            .transpose()
            .map_err(RngError::RateLimiter)?;
        let features = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC;
        let evt = || EventFd::new(libc::EFD_NONBLOCK).map_err(RngError::EventFd);
        Ok(Rng {
            common: VirtioCommon::new(VIRTIO_ID_RNG, features, vec![qs])
                .map_err(RngError::EventFd)?,
            activate_evt: evt()?,
            requeue_evt: evt()?,
            cfg,
            mem,
            source,
            metrics: Arc::default(),
            limiter,
            active: None,
            registered: QueueRegistrations::default(),
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
        cfg.validate().map_err(RngError::RateLimiter)?;
        match self.limiter.as_mut() {
            Some(l) => l.update(cfg).map_err(RngError::RateLimiter)?,
            None if cfg.is_unlimited() => {}
            None => self.limiter = Some(RateLimiter::new(cfg).map_err(RngError::RateLimiter)?),
        }
        self.cfg.rate_limiter = *cfg;
        Ok(())
    }

    pub(crate) fn kick_event_handler(&self) {
        self.metrics
            .host_errors()
            .kick_event_loop(&self.activate_evt);
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
        &self.common
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
        mut queues: Vec<SplitQueue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        check_queues(&queues, 1, &self.mem)?;
        // An activation without a reset in between starts over too.
        self.deactivate();
        let acked = self.common.ack_features(acked_features);
        self.active = Some(Active {
            virtio: RngVirtio::new(queues.remove(0)),
            activation: Activation::new(interrupt),
        });
        self.metrics
            .features_negotiated
            .store(acked, Ordering::Relaxed);
        self.kick_event_handler();
        Ok(())
    }

    fn reset(&mut self) {
        self.deactivate();
        self.common.acked_features = 0;
        self.registered.requeued = false;
        events::discard_pending([&self.common.queue_evts[0], &self.requeue_evt]);
        self.kick_event_handler();
    }

    fn device_metrics(&self) -> Arc<dyn DeviceMetrics> {
        self.metrics.clone()
    }
}
