// SPDX-License-Identifier: Apache-2.0
//! Event-manager glue of the entropy device.
//!
//! The device is one `MutEventSubscriber` (the start-up and dispatch every
//! device shares, in `events`). Each descriptor it polls carries a `u32`
//! token:
//!
//! | token | descriptor | registered |
//! |---|---|---|
//! | `PROCESS_ACTIVATE` | internal `activate_evt` | always (from `init`) |
//! | `PROCESS_QUEUE` | the request queue's notify eventfd | while activated |
//! | `PROCESS_REQUEUE` | re-queue eventfd | while activated |
//! | `PROCESS_RATE_LIMITER` | the limiter's timerfd | while the limiter is blocked |
//!
//! A pass that yields writes the re-queue eventfd (once: it stays readable
//! while passes keep yielding) so every other ready event runs before the
//! next pass; a throttled one waits for the limiter's timer (kicks start no
//! pass meanwhile).

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::device::Rng;
use super::pass::PassStatus;
use super::source::EntropySource;
use crate::virtio::events::{self, throttled, Activation, EventHandler, HostErrors, QueueTokens};
use crate::virtio::metrics::Counters;

/// The driver notified the request queue.
pub const PROCESS_QUEUE: u32 = 1;
/// A pass yielded and asked to run again.
pub const PROCESS_REQUEUE: u32 = 2;
/// The rate limiter's timer fired: the request it held back fits now.
pub const PROCESS_RATE_LIMITER: u32 = 3;

const TOKENS: QueueTokens = QueueTokens {
    queue: PROCESS_QUEUE,
    requeue: PROCESS_REQUEUE,
    timer: PROCESS_RATE_LIMITER,
};

impl<S: EntropySource> Rng<S> {
    /// Runs one pass if one may run now; returns how it ended.
    fn run_pass(&mut self) -> Option<PassStatus> {
        let a = self.active.as_mut().filter(|a| a.activation.started)?;
        if throttled(&self.limiter) {
            return None;
        }
        let status = a.virtio.process(
            &mut self.source,
            self.limiter.as_mut(),
            &self.metrics,
            &*a.activation.interrupt,
        );
        match status {
            PassStatus::Yield => self
                .registered
                .requeue(self.metrics.host_errors(), &self.requeue_evt),
            PassStatus::Broken => a.activation.device_error(),
            PassStatus::Done | PassStatus::Throttled => {}
        }
        Some(status)
    }

    fn process_queue_event(&mut self) {
        self.metrics
            .host_errors()
            .drain(&self.common.queue_evts[0], "queue");
        self.run_pass();
    }

    fn process_requeue_event(&mut self) {
        if self.run_pass() != Some(PassStatus::Yield) {
            self.registered
                .requeue_done(self.metrics.host_errors(), &self.requeue_evt);
        }
    }

    fn process_rate_limiter_event(&mut self) {
        events::timer_fired(&mut self.limiter, &self.metrics.throttled_ns);
        self.run_pass();
    }
}

impl<S: EntropySource> EventHandler for Rng<S> {
    fn activation_parts(&mut self) -> (HostErrors<'_>, &EventFd, Option<&mut Activation>) {
        let activation = self.active.as_mut().map(|a| &mut a.activation);
        (self.metrics.host_errors(), &self.activate_evt, activation)
    }

    fn first_passes(&mut self) {
        self.run_pass();
    }

    fn handle(&mut self, token: u32, _: EventSet) -> bool {
        match token {
            PROCESS_QUEUE => self.process_queue_event(),
            PROCESS_REQUEUE => self.process_requeue_event(),
            PROCESS_RATE_LIMITER => self.process_rate_limiter_event(),
            _ => return false,
        }
        true
    }

    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let started = self.active.as_ref().is_some_and(|a| a.activation.started);
        self.registered.sync(
            self.metrics.host_errors(),
            ops,
            (&self.common.queue_evts[0], &self.requeue_evt),
            started,
            &mut self.limiter,
            &self.metrics.throttled_ns,
            TOKENS,
        );
    }
}

impl<S: EntropySource + 'static> MutEventSubscriber for Rng<S> {
    fn init(&mut self, ops: &mut EventOps) {
        events::init(self, ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        events::process(self, events, ops);
    }
}
