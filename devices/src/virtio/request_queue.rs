// SPDX-License-Identifier: Apache-2.0
//! [`RequestQueue`]: what a device with one request queue keeps and does
//! around its datapath, written once (the block and entropy devices, and
//! whichever device comes next with one queue the driver fills with
//! requests).
//!
//! Such a device, besides what the transport reads of it
//! ([`VirtioCommon`]), has an `activate_evt` (activation and reset happen
//! on a vCPU thread; the event loop follows), a re-queue eventfd (a pass
//! that yields runs again behind every other ready event), an optional rate
//! limiter with its timer, and the record of what its event handler has
//! registered. The device's own code is then its datapath, its
//! configuration space and what its activation builds.
//!
//! Event tokens: `PROCESS_ACTIVATE` (0) is every device's; a device with a
//! request queue uses [`PROCESS_QUEUE`], [`PROCESS_REQUEUE`] and
//! [`PROCESS_RATE_LIMITER`], and numbers its own from [`FIRST_OWN_TOKEN`].

use std::sync::atomic::{AtomicU64, Ordering};

use event_manager::EventOps;
use vmm_sys_util::eventfd::EventFd;

use serde::{Deserialize, Serialize};

use crate::rate_limiter::persist::{restore_limiter, save_limiter, RateLimiterState};
use crate::rate_limiter::{RateLimiter, RateLimiterConfig, RateLimiterError};
use crate::virtio::events::{self, HostErrors};
use crate::virtio::persist::{self, PersistError};
use crate::virtio::queue::SplitQueue;
use crate::virtio::time_counter::TimeCounter;
use crate::virtio::{check_queues, ActivateError, GuestMemory, VirtioCommon};

/// The driver notified the request queue.
pub const PROCESS_QUEUE: u32 = 1;
/// A pass yielded and asked to run again.
pub const PROCESS_REQUEUE: u32 = 2;
/// The rate limiter's timer fired: the request it held back fits now.
pub const PROCESS_RATE_LIMITER: u32 = 3;
/// The first token a device numbers its own descriptors from.
pub const FIRST_OWN_TOKEN: u32 = 4;

/// A limiter for `cfg`, or none when it has no bucket.
pub(crate) fn limiter_for(
    cfg: &RateLimiterConfig,
) -> Result<Option<RateLimiter>, RateLimiterError> {
    cfg.validate()?;
    (!cfg.is_unlimited())
        .then(|| RateLimiter::new(cfg))
        .transpose()
}

/// Replaces the limits of `limiter` while the device runs: a limiter keeps
/// its timer and what it holds back, which is tried first against the new
/// buckets; a device without one gets one (its timer made on the calling
/// thread, the event loop's). On `Err` nothing changed.
pub(crate) fn update_limiter(
    limiter: &mut Option<RateLimiter>,
    cfg: &RateLimiterConfig,
) -> Result<(), RateLimiterError> {
    cfg.validate()?;
    match limiter {
        Some(l) => l.update(cfg),
        None if cfg.is_unlimited() => Ok(()),
        None => RateLimiter::new(cfg).map(|l| *limiter = Some(l)),
    }
}

/// What a device with one request queue keeps besides its datapath (see
/// the module doc).
#[derive(Debug)]
pub(crate) struct RequestQueue {
    /// ID, features, queue size and notification eventfd.
    pub(crate) common: VirtioCommon,
    /// Written at activation and reset, registered for the device's life.
    pub(crate) activate_evt: EventFd,
    /// Readable while a pass that yielded waits to run again.
    pub(crate) requeue_evt: EventFd,
    /// Limits on requests; `None` without any bucket. Outlives activations.
    pub(crate) limiter: Option<RateLimiter>,
    /// The queue and re-queue eventfds are registered.
    queues_registered: bool,
    /// The limiter's timerfd is registered.
    timer_registered: bool,
    /// The re-queue eventfd holds a count (a pass yielded).
    pub(crate) requeued: bool,
}

/// What a device with a request queue keeps in a snapshot besides its
/// transport: its limiter's buckets.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RequestQueueState {
    rate_limiter: RateLimiterState,
}

impl RequestQueue {
    /// The device's own state for a snapshot (see [`persist`]).
    pub(crate) fn save_state(&self) -> serde_json::Value {
        persist::to_value(&RequestQueueState {
            rate_limiter: save_limiter(self.limiter.as_ref()),
        })
    }

    /// Takes back what [`Self::save_state`] returned into the limiter,
    /// configured as `cfg`; anything malformed or forged is refused.
    pub(crate) fn restore_state(
        &mut self,
        cfg: &RateLimiterConfig,
        state: &serde_json::Value,
    ) -> Result<(), PersistError> {
        let s: RequestQueueState = persist::from_value(state)?;
        restore_limiter(&mut self.limiter, cfg, &s.rate_limiter)
            .map_err(|e| PersistError::Device(format!("rate_limiter: {e}")))
    }

    /// A device of type `device_type` offering `features`, its one queue
    /// of `queue_size` entries, limited by `limiter` (see [`limiter_for`]).
    pub(crate) fn new(
        device_type: u32,
        features: u64,
        queue_size: u16,
        limiter: Option<RateLimiter>,
    ) -> std::io::Result<Self> {
        let evt = || EventFd::new(libc::EFD_NONBLOCK);
        Ok(RequestQueue {
            common: VirtioCommon::new(device_type, features, vec![queue_size])?,
            activate_evt: evt()?,
            requeue_evt: evt()?,
            limiter,
            queues_registered: false,
            timer_registered: false,
            requeued: false,
        })
    }

    /// The one queue of an activation, checked as every device checks its
    /// queues ([`check_queues`]) against the device's guest memory `mem`,
    /// with the driver's `acked_features` taken (those offered); the
    /// caller then ends its current activation and builds the new one.
    pub(crate) fn take_queue(
        &mut self,
        acked_features: u64,
        mut queues: Vec<SplitQueue>,
        mem: &GuestMemory,
    ) -> Result<(SplitQueue, u64), ActivateError> {
        check_queues(&queues, 1, mem)?;
        let acked = self.common.ack_features(acked_features);
        Ok((queues.remove(0), acked))
    }

    /// Wakes the event handler (an activation or a reset happened).
    pub(crate) fn kick_event_handler(&self, errors: HostErrors<'_>) {
        errors.kick_event_loop(&self.activate_evt);
    }

    /// An activation with `acked` features begins: they are shown in
    /// `features_negotiated` and the event handler is told.
    pub(crate) fn activated(
        &self,
        acked: u64,
        features_negotiated: &AtomicU64,
        errors: HostErrors<'_>,
    ) {
        features_negotiated.store(acked, Ordering::Relaxed);
        self.kick_event_handler(errors);
    }

    /// The driver reset the device (the caller dropped its activation):
    /// no feature acked, kicks pending for the old queue and a re-queue
    /// pending for the old pass forgotten, the event handler told.
    pub(crate) fn reset(&mut self, errors: HostErrors<'_>) {
        self.common.acked_features = 0;
        self.requeued = false;
        events::discard_pending([&self.common.queue_evts[0], &self.requeue_evt]);
        self.kick_event_handler(errors);
    }

    /// Whether the limiter waits for its timer (no pass may run).
    pub(crate) fn throttled(&self) -> bool {
        events::throttled(&self.limiter)
    }

    /// The driver kicked the queue: reads the notification.
    pub(crate) fn drain_queue(&self, errors: HostErrors<'_>) {
        errors.drain(&self.common.queue_evts[0], "queue");
    }

    /// The limiter's timer fired: the limiter is unblocked; the caller
    /// runs the pass it held back.
    pub(crate) fn timer_fired(&mut self, throttled_ns: &TimeCounter) {
        events::timer_fired(&mut self.limiter, throttled_ns);
    }

    /// A pass yielded: makes the re-queue eventfd readable, unless it still
    /// is from the pass before.
    pub(crate) fn requeue(&mut self, errors: HostErrors<'_>) {
        errors.signal_once(&self.requeue_evt, &mut self.requeued, "re-queue");
    }

    /// A pass run from the re-queue eventfd ended otherwise than by
    /// yielding (or none could run): reads it, so the loop sleeps.
    pub(crate) fn requeue_done(&mut self, errors: HostErrors<'_>) {
        errors.drain_signalled(&self.requeue_evt, &mut self.requeued, "re-queue");
    }

    /// Brings the registrations in line: the queue and re-queue eventfds
    /// while `started` (an activation the handler took up), the limiter's
    /// timer while it is blocked, whatever the activation state (one armed
    /// before a reset still has to unblock it). A timer epoll refuses
    /// re-queues the pass instead ([`HostErrors::sync_timer`]).
    pub(crate) fn sync(
        &mut self,
        ops: &mut EventOps,
        started: bool,
        errors: HostErrors<'_>,
        throttled_ns: &TimeCounter,
    ) {
        errors.sync_queue_eventfds(
            ops,
            &[
                (&self.common.queue_evts[0], PROCESS_QUEUE),
                (&self.requeue_evt, PROCESS_REQUEUE),
            ],
            started,
            &mut self.queues_registered,
        );
        let retry = errors.sync_timer(
            ops,
            &mut self.limiter,
            &mut self.timer_registered,
            PROCESS_RATE_LIMITER,
            throttled_ns,
        );
        if retry {
            self.requeue(errors);
        }
    }
}
