// SPDX-License-Identifier: Apache-2.0
//! Event-manager glue of the block device.
//!
//! The device is one `MutEventSubscriber`. Each descriptor it polls carries
//! a `u32` token:
//!
//! | token | descriptor | registered |
//! |---|---|---|
//! | `PROCESS_ACTIVATE` | internal `activate_evt` | always (from `init`) |
//! | `PROCESS_QUEUE` | the request queue's notify eventfd | while activated |
//! | `PROCESS_REQUEUE` | re-queue eventfd | while activated |
//! | `PROCESS_COMPLETIONS` | the io_uring's fd (readable with completions waiting) | always, with `Async` |
//! | `PROCESS_RATE_LIMITER` | the limiter's timerfd | while the limiter is blocked |
//!
//! The start-up, the dispatch and the registrations of a one-queue device
//! are the shared ones (`events`): after every event `sync_registrations`
//! brings the registrations in line with the device state, as every device
//! does. A pass that yields
//! writes the re-queue eventfd (once: it stays readable while passes keep
//! yielding) so every other ready event runs before the next pass; a pass
//! that stopped on a full io_uring waits for completions; a throttled one
//! for the limiter's timer (kicks start no pass meanwhile).

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::backend::BlockBackend;
use super::device::Block;
use super::pass::PassStatus;
use crate::virtio::events::{self, Activation, EventHandler, HostErrors};
use crate::virtio::metrics::Counters;
pub use crate::virtio::request_queue::{PROCESS_QUEUE, PROCESS_RATE_LIMITER, PROCESS_REQUEUE};

/// The io_uring posted completions.
pub const PROCESS_COMPLETIONS: u32 = crate::virtio::request_queue::FIRST_OWN_TOKEN;

impl<B: BlockBackend> Block<B> {
    /// Runs one pass if one may run now; returns how it ended.
    fn run_pass(&mut self) -> Option<PassStatus> {
        let a = self.active.as_mut().filter(|a| a.activation.started)?;
        if self.rq.throttled() {
            return None;
        }
        a.saturated = false;
        let status = a.virtio.process(
            &mut self.backend,
            &mut self.engine,
            self.rq.limiter.as_mut(),
            &self.metrics,
            &*a.activation.interrupt,
        );
        match status {
            PassStatus::Yield => self.rq.requeue(self.metrics.host_errors()),
            PassStatus::Saturated => a.saturated = true,
            PassStatus::Broken => a.activation.device_error(),
            PassStatus::Done | PassStatus::Throttled => {}
        }
        Some(status)
    }

    fn process_completions_event(&mut self) {
        let Some(engine) = self.engine.as_mut() else {
            return;
        };
        let Some(a) = self.active.as_mut() else {
            // Nothing is in flight without an activation (a reset waits for
            // it all); whatever is found is reaped and dropped all the same,
            // or the ring would poll readable for good.
            engine.quiesce();
            return;
        };
        a.virtio.complete(
            &mut self.backend,
            engine,
            &self.metrics,
            &*a.activation.interrupt,
        );
        if a.saturated {
            self.run_pass();
        }
    }
}

impl<B: BlockBackend> EventHandler for Block<B> {
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

    fn add_fixed(&mut self, ops: &mut EventOps) {
        if let Some(e) = self.engine.as_ref() {
            self.metrics.host_errors().add_readable(
                ops,
                e.ring(),
                PROCESS_COMPLETIONS,
                "the io_uring",
            );
        }
    }

    fn handle(&mut self, token: u32, _: EventSet) -> bool {
        let errors = self.metrics.host_errors();
        match token {
            PROCESS_QUEUE => {
                self.rq.drain_queue(errors);
                self.run_pass();
            }
            PROCESS_REQUEUE => {
                if self.run_pass() != Some(PassStatus::Yield) {
                    self.rq.requeue_done(self.metrics.host_errors());
                }
            }
            PROCESS_RATE_LIMITER => {
                self.rq.timer_fired(&self.metrics.throttled_ns);
                self.run_pass();
            }
            PROCESS_COMPLETIONS => self.process_completions_event(),
            _ => return false,
        }
        true
    }

    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let started = self.active.as_ref().is_some_and(|a| a.activation.started);
        let m = &self.metrics;
        self.rq.sync(ops, started, m.host_errors(), &m.throttled_ns);
    }
}

impl<B: BlockBackend + 'static> MutEventSubscriber for Block<B> {
    fn init(&mut self, ops: &mut EventOps) {
        events::init(self, ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        events::process(self, events, ops);
    }
}
