// SPDX-License-Identifier: Apache-2.0
//! The [`Balloon`] device: features, the configuration space, activation
//! and reset, and what the API changes while it runs (the target, the
//! statistics interval, free page hinting runs).
//!
//! **Configuration space** (virtio 1.1 §5.5.4), 12 bytes, little-endian:
//! `num_pages` (the target, the host's), `actual` (what the driver holds,
//! the only field the driver writes), `free_page_hint_cmd_id` (the host's
//! hinting command). Every change the host makes bumps the configuration
//! generation and raises a configuration interrupt.
//!
//! As for the other devices, activation and reset arrive from a vCPU thread
//! through the MMIO transport and only change state here and write
//! `activate_evt`; the event handler brings the registrations and the
//! statistics timer in line on the event loop's thread.

use std::sync::Arc;
use std::time::Duration;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BALLOON;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use super::discard::{Madvise, PageDiscard};
use super::metrics::BalloonMetrics;
use super::pass::{BalloonVirtio, HintState};
use super::stats::BalloonStats;
use super::{
    BalloonConfig, Vq, FREE_PAGE_HINT_DONE, FREE_PAGE_HINT_STOP, PAGES_PER_MIB,
    VIRTIO_BALLOON_F_DEFLATE_ON_OOM, VIRTIO_BALLOON_F_FREE_PAGE_HINT,
    VIRTIO_BALLOON_F_PAGE_REPORTING, VIRTIO_BALLOON_F_STATS_VQ,
};
use crate::rate_limiter::nonblocking_timer;
use crate::virtio::events::{self, Activation};
use crate::virtio::metrics::Counters;
use crate::virtio::queue::{SplitQueue, MAX_QUEUE_SIZE};
use crate::virtio::{
    check_queues, read_config_space, ActivateError, DeviceMetrics, GuestMemory, Interrupt,
    VirtioCommon, VirtioDevice,
};

/// Bytes of the configuration space: `num_pages`, `actual`,
/// `free_page_hint_cmd_id` (no `poison_val`: PAGE_POISON is not offered).
pub const CONFIG_LEN: u64 = 12;
/// Where `actual`, the one field the driver writes, sits.
const ACTUAL: std::ops::Range<u64> = 4..8;

/// Why a balloon could not be made, or a change the API asked for not made
/// (the API's fault messages).
#[derive(Debug, thiserror::Error)]
pub enum BalloonError {
    /// `queue_size` is not a power of two in 1..=32768.
    #[error("queue size {0} is not a power of two between 1 and {max}", max = MAX_QUEUE_SIZE)]
    QueueSize(u16),
    /// The target is more memory than the guest has.
    #[error(
        "the balloon's target of {amount_mib} MiB is more than the guest's {mem_mib} MiB of memory"
    )]
    TooLarge {
        /// The target asked for.
        amount_mib: u32,
        /// Guest memory.
        mem_mib: u64,
    },
    /// The driver has not started the device (Firecracker's answer to a
    /// change before that).
    #[error("the balloon device is not activated yet: the guest's driver has not started it")]
    NotActivated,
    /// Statistics were not enabled when the device was configured.
    #[error(
        "balloon statistics are not enabled (stats_polling_interval_s was 0 at configuration)"
    )]
    StatisticsDisabled,
    /// Statistics are turned on or off only at configuration.
    #[error("balloon statistics cannot be turned on or off after the device is configured")]
    StatisticsStateChange,
    /// Free page hinting was not enabled when the device was configured.
    #[error("free page hinting is not enabled on the balloon device")]
    HintingNotEnabled,
    /// An eventfd could not be created.
    #[error("cannot create an eventfd")]
    EventFd(#[source] std::io::Error),
    /// The statistics timer could not be created or armed.
    #[error("cannot set the balloon statistics timer")]
    Timer(#[source] std::io::Error),
}

/// What `GET /balloon/hinting/status` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct HintingStatus {
    /// The last command the host issued.
    pub host_cmd: u32,
    /// The last command the guest sent, once it has sent one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_cmd: Option<u32>,
}

/// What the event handler keeps besides the device's own state.
#[derive(Debug, Default)]
pub(crate) struct Glue {
    /// The queue eventfds registered: (queue index, token).
    pub(crate) registered: Vec<(usize, u32)>,
    /// The re-queue eventfd is registered.
    pub(crate) requeue_registered: bool,
    /// The re-queue eventfd holds a count.
    pub(crate) requeued: bool,
    /// Queues whose last pass yielded (a bit per queue, in `Vq::ALL`
    /// order).
    pub(crate) pending: u8,
    /// The statistics timer is armed.
    pub(crate) timer_armed: bool,
}

impl Glue {
    /// A reset: no pass is pending. The registrations and the timer
    /// follow on the event loop.
    pub(crate) fn reset(&mut self) {
        self.pending = 0;
        self.requeued = false;
    }
}

/// State that exists only between activation and reset.
pub(crate) struct Active {
    pub(crate) virtio: BalloonVirtio,
    pub(crate) activation: Activation,
}

/// The configuration space and the runs it drives.
#[derive(Debug, Default)]
pub(crate) struct Space {
    /// The target, in 4 KiB pages.
    pub(crate) num_pages: u32,
    /// What the driver says it holds.
    pub(crate) actual_pages: u32,
    /// The ConfigGeneration register.
    pub(crate) generation: u32,
    /// Free page hinting (its command is the third field).
    pub(crate) hint: HintState,
}

impl Space {
    fn bytes(&self) -> [u8; CONFIG_LEN as usize] {
        let mut b = [0u8; CONFIG_LEN as usize];
        b[0..4].copy_from_slice(&self.num_pages.to_le_bytes());
        b[4..8].copy_from_slice(&self.actual_pages.to_le_bytes());
        b[8..12].copy_from_slice(&self.hint.host_cmd.to_le_bytes());
        b
    }
}

/// The virtio balloon over guest memory, giving pages back through
/// `madvise` (or, in tests, any [`PageDiscard`]).
pub struct Balloon<D: PageDiscard = Madvise> {
    pub(crate) cfg: BalloonConfig,
    pub(crate) mem: GuestMemory,
    mem_mib: u64,
    pub(crate) discard: D,
    pub(crate) common: VirtioCommon,
    /// Written at activation and reset, registered for the device's life.
    pub(crate) activate_evt: EventFd,
    /// Readable while a pass that yielded waits to run again.
    pub(crate) requeue_evt: EventFd,
    /// The statistics timer (with statistics only); registered for the
    /// device's life, armed while the statistics queue runs.
    pub(crate) stats_timer: Option<TimerFd>,
    pub(crate) space: Space,
    pub(crate) stats: BalloonStats,
    pub(crate) metrics: Arc<BalloonMetrics>,
    pub(crate) active: Option<Active>,
    /// The event handler's bookkeeping (`event_handler`).
    pub(crate) glue: Glue,
}

impl<D: PageDiscard> std::fmt::Debug for Balloon<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balloon")
            .field("cfg", &self.cfg)
            .field("space", &self.space)
            .field("active", &self.active.is_some())
            .finish_non_exhaustive()
    }
}

impl Balloon<Madvise> {
    /// Builds the device (its eventfds and, with statistics, its timer):
    /// everything that must happen before the VMM's seccomp filters.
    pub fn new(cfg: BalloonConfig, mem: GuestMemory) -> Result<Self, BalloonError> {
        Self::with_discard(cfg, mem, Madvise)
    }
}

/// Guest memory in MiB.
fn mem_mib(mem: &GuestMemory) -> u64 {
    mem.iter().map(|r| r.len()).sum::<u64>() >> 20
}

impl<D: PageDiscard> Balloon<D> {
    /// Builds the device over `discard`.
    pub fn with_discard(
        cfg: BalloonConfig,
        mem: GuestMemory,
        discard: D,
    ) -> Result<Self, BalloonError> {
        let qs = cfg.queue_size;
        if qs == 0 || !qs.is_power_of_two() || qs > MAX_QUEUE_SIZE {
            return Err(BalloonError::QueueSize(qs));
        }
        let mem_mib = mem_mib(&mem);
        let num_pages = target_pages(cfg.amount_mib, mem_mib)?;
        // The ring features every device here offers; Linux's driver takes
        // both.
        let mut features = 1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC;
        for (on, bit) in [
            (cfg.deflate_on_oom, VIRTIO_BALLOON_F_DEFLATE_ON_OOM),
            (cfg.stats_polling_interval_s > 0, VIRTIO_BALLOON_F_STATS_VQ),
            (cfg.free_page_hinting, VIRTIO_BALLOON_F_FREE_PAGE_HINT),
            (cfg.free_page_reporting, VIRTIO_BALLOON_F_PAGE_REPORTING),
        ] {
            if on {
                features |= 1u64 << bit;
            }
        }
        let queues = Vq::present(features).len();
        let evt = || EventFd::new(libc::EFD_NONBLOCK).map_err(BalloonError::EventFd);
        let stats_timer = (cfg.stats_polling_interval_s > 0)
            .then(nonblocking_timer)
            .transpose()
            .map_err(BalloonError::Timer)?;
        Ok(Balloon {
            common: VirtioCommon::new(VIRTIO_ID_BALLOON, features, vec![qs; queues])
                .map_err(BalloonError::EventFd)?,
            activate_evt: evt()?,
            requeue_evt: evt()?,
            stats_timer,
            cfg,
            mem,
            mem_mib,
            discard,
            space: Space {
                num_pages,
                ..Space::default()
            },
            stats: BalloonStats::default(),
            metrics: Arc::default(),
            active: None,
            glue: Default::default(),
        })
    }

    /// The counters, shared with the VMM's metrics writer.
    pub fn metrics(&self) -> Arc<BalloonMetrics> {
        self.metrics.clone()
    }

    /// Whether the device is activated (between DRIVER_OK and reset).
    pub fn is_activated(&self) -> bool {
        self.active.is_some()
    }

    /// The configuration in force: the target and the statistics interval
    /// follow the changes made while it runs (`GET /balloon`).
    pub fn config(&self) -> BalloonConfig {
        BalloonConfig {
            amount_mib: self.space.num_pages / PAGES_PER_MIB,
            ..self.cfg
        }
    }

    /// The page discarder (tests look at what it recorded).
    pub fn discard_mut(&mut self) -> &mut D {
        &mut self.discard
    }

    /// Sets the target (`PATCH /balloon`): the driver is told with a
    /// configuration interrupt. Only once the driver started the device, and
    /// never above guest memory (Firecracker's rules).
    pub fn set_target(&mut self, amount_mib: u32) -> Result<(), BalloonError> {
        if self.active.is_none() {
            return Err(BalloonError::NotActivated);
        }
        self.space.num_pages = target_pages(amount_mib, self.mem_mib)?;
        self.config_changed();
        Ok(())
    }

    /// The latest statistics with the target and actual sizes
    /// (`GET /balloon/statistics`).
    pub fn latest_stats(&self) -> Result<BalloonStats, BalloonError> {
        if self.cfg.stats_polling_interval_s == 0 {
            return Err(BalloonError::StatisticsDisabled);
        }
        let (target, actual) = (self.space.num_pages, self.space.actual_pages);
        Ok(BalloonStats {
            target_pages: target,
            actual_pages: actual,
            target_mib: target / PAGES_PER_MIB,
            actual_mib: actual / PAGES_PER_MIB,
            ..self.stats
        })
    }

    /// Changes the statistics interval (`PATCH /balloon/statistics`): asks
    /// the driver for a report at once and then every `interval_s`
    /// seconds. Statistics are not turned on or off this way.
    pub fn set_stats_interval(&mut self, interval_s: u16) -> Result<(), BalloonError> {
        let old = self.cfg.stats_polling_interval_s;
        if old == interval_s {
            return Ok(());
        }
        if old == 0 || interval_s == 0 {
            return Err(BalloonError::StatisticsStateChange);
        }
        self.cfg.stats_polling_interval_s = interval_s;
        self.request_stats();
        if self.glue.timer_armed {
            self.arm_stats_timer(true)?;
        }
        Ok(())
    }

    /// Starts a free page hinting run (`PATCH /balloon/hinting/start`):
    /// a fresh command id in the configuration space.
    pub fn start_hinting(&mut self, ack_on_stop: bool) -> Result<(), BalloonError> {
        self.hinting_ready()?;
        let h = &mut self.space.hint;
        // Run ids skip STOP and DONE.
        let id = h.last_cmd_id.wrapping_add(1).max(FREE_PAGE_HINT_DONE + 1);
        h.last_cmd_id = id;
        h.ack_on_stop = ack_on_stop;
        h.guest_stopped = false;
        self.set_hint_cmd(id);
        Ok(())
    }

    /// Where the hinting run stands (`GET /balloon/hinting/status`).
    pub fn hinting_status(&self) -> Result<HintingStatus, BalloonError> {
        if !self.cfg.free_page_hinting {
            return Err(BalloonError::HintingNotEnabled);
        }
        Ok(HintingStatus {
            host_cmd: self.space.hint.host_cmd,
            guest_cmd: self.space.hint.guest_cmd,
        })
    }

    /// Ends the hinting run (`PATCH /balloon/hinting/stop`): DONE, after
    /// which the guest may use the pages it hinted again.
    pub fn stop_hinting(&mut self) -> Result<(), BalloonError> {
        self.hinting_ready()?;
        self.set_hint_cmd(FREE_PAGE_HINT_DONE);
        Ok(())
    }

    fn hinting_ready(&self) -> Result<(), BalloonError> {
        if !self.cfg.free_page_hinting {
            return Err(BalloonError::HintingNotEnabled);
        }
        if self.active.is_none() {
            return Err(BalloonError::NotActivated);
        }
        Ok(())
    }

    /// Puts `cmd` in the configuration space and tells the driver.
    pub(crate) fn set_hint_cmd(&mut self, cmd: u32) {
        self.space.hint.host_cmd = cmd;
        self.config_changed();
    }

    /// The host changed the configuration space: a new generation and a
    /// configuration interrupt (when a driver listens).
    fn config_changed(&mut self) {
        self.space.generation = self.space.generation.wrapping_add(1);
        if let Some(a) = &self.active {
            events::inc(&self.metrics.config_interrupts);
            a.activation.interrupt.signal_config_change();
        }
    }

    /// Gives the held statistics buffer back so the driver reports again;
    /// false when there was none to give.
    pub(crate) fn request_stats(&mut self) -> bool {
        let m = &self.metrics;
        self.active
            .as_mut()
            .is_some_and(|a| a.virtio.request_stats(m, &*a.activation.interrupt))
    }

    /// Arms (`on`) or disarms the statistics timer: periodic at the
    /// interval. A device without statistics has no timer.
    pub(crate) fn arm_stats_timer(&mut self, on: bool) -> Result<(), BalloonError> {
        let Some(t) = self.stats_timer.as_mut() else {
            return Ok(());
        };
        let res = if on {
            let every = Duration::from_secs(u64::from(self.cfg.stats_polling_interval_s));
            t.reset(every, Some(every))
        } else {
            t.clear()
        };
        res.map_err(|e| BalloonError::Timer(e.into()))?;
        self.glue.timer_armed = on;
        Ok(())
    }

    /// Ends the current activation: the queues and whatever they held.
    fn deactivate(&mut self) {
        self.active = None;
    }
}

/// The target for `amount_mib`, in pages, if guest memory holds it.
fn target_pages(amount_mib: u32, mem_mib: u64) -> Result<u32, BalloonError> {
    let too_large = BalloonError::TooLarge {
        amount_mib,
        mem_mib,
    };
    if u64::from(amount_mib) > mem_mib {
        return Err(too_large);
    }
    amount_mib.checked_mul(PAGES_PER_MIB).ok_or(too_large)
}

impl<D: PageDiscard + 'static> VirtioDevice for Balloon<D> {
    fn common(&self) -> &VirtioCommon {
        &self.common
    }

    fn active_queues(&self, acked_features: u64) -> usize {
        Vq::present(acked_features & self.common.avail_features).len()
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_space(&self.space.bytes(), offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        let end = offset.saturating_add(data.len() as u64);
        if offset < ACTUAL.start || end > ACTUAL.end || data.is_empty() {
            events::ignored_config_write(
                &self.metrics.config_writes_ignored,
                "virtio-balloon",
                offset,
                data.len(),
            );
            return;
        }
        let mut bytes = self.space.actual_pages.to_le_bytes();
        let at = (offset - ACTUAL.start) as usize;
        bytes[at..at + data.len()].copy_from_slice(data);
        self.space.actual_pages = u32::from_le_bytes(bytes);
    }

    fn config_generation(&self) -> u32 {
        self.space.generation
    }

    fn activate(
        &mut self,
        acked_features: u64,
        queues: Vec<SplitQueue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        let vqs = Vq::present(acked_features & self.common.avail_features);
        check_queues(&queues, vqs.len(), &self.mem)?;
        let acked = self.common.ack_features(acked_features);
        // An activation without a reset in between starts over too.
        self.deactivate();
        self.active = Some(Active {
            virtio: BalloonVirtio::new(&vqs, queues),
            activation: Activation::new(interrupt),
        });
        let m = &self.metrics;
        m.features_negotiated
            .store(acked, std::sync::atomic::Ordering::Relaxed);
        m.host_errors().kick_event_loop(&self.activate_evt);
        Ok(())
    }

    fn reset(&mut self) {
        self.deactivate();
        self.common.acked_features = 0;
        self.space.actual_pages = 0;
        self.space.hint = HintState {
            host_cmd: FREE_PAGE_HINT_STOP,
            last_cmd_id: self.space.hint.last_cmd_id,
            ..HintState::default()
        };
        self.stats = BalloonStats::default();
        self.glue.reset();
        events::discard_pending(self.common.queue_evts.iter().chain([&self.requeue_evt]));
        self.metrics
            .host_errors()
            .kick_event_loop(&self.activate_evt);
    }

    fn device_metrics(&self) -> Arc<dyn DeviceMetrics> {
        self.metrics.clone()
    }
}
