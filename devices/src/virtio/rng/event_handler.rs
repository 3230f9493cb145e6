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
use crate::virtio::events::{self, Activation, EventHandler, HostErrors};
use crate::virtio::metrics::Counters;
pub use crate::virtio::request_queue::{PROCESS_QUEUE, PROCESS_RATE_LIMITER, PROCESS_REQUEUE};

impl<S: EntropySource> Rng<S> {
    /// Runs one pass if one may run now; returns how it ended.
    fn run_pass(&mut self) -> Option<PassStatus> {
        let a = self.active.as_mut().filter(|a| a.activation.started)?;
        if self.rq.throttled() {
            return None;
        }
        let status = a.virtio.process(
            &mut self.source,
            self.rq.limiter.as_mut(),
            &self.metrics,
            &*a.activation.interrupt,
        );
        match status {
            PassStatus::Yield => self.rq.requeue(self.metrics.host_errors()),
            PassStatus::Broken => a.activation.device_error(),
            PassStatus::Done | PassStatus::Throttled => {}
        }
        Some(status)
    }
}

impl<S: EntropySource> EventHandler for Rng<S> {
    fn activation_parts(&mut self) -> (HostErrors<'_>, &EventFd, Option<&mut Activation>) {
        let activation = self.active.as_mut().map(|a| &mut a.activation);
        (
            self.metrics.host_errors(),
            &self.rq.activate_evt,
            activation,
        )
    }

    /// Requests posted before DRIVER_OK have no kick of their own.
    fn first_passes(&mut self) {
        self.run_pass();
    }

    fn handle(&mut self, token: u32, _: EventSet) -> bool {
        match token {
            PROCESS_QUEUE => self.rq.drain_queue(self.metrics.host_errors()),
            PROCESS_REQUEUE => {
                if self.run_pass() != Some(PassStatus::Yield) {
                    self.rq.requeue_done(self.metrics.host_errors());
                }
                return true;
            }
            PROCESS_RATE_LIMITER => self.rq.timer_fired(&self.metrics.throttled_ns),
            _ => return false,
        }
        self.run_pass();
        true
    }

    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let started = self.active.as_ref().is_some_and(|a| a.activation.started);
        let m = &self.metrics;
        self.rq.sync(ops, started, m.host_errors(), &m.throttled_ns);
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
