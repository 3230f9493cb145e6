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
//! After every event `sync_registrations` brings the registrations in line
//! with the device state, as the network device does. A pass that yields
//! writes the re-queue eventfd (once: it stays readable while passes keep
//! yielding) so every other ready event runs before the next pass; a pass
//! that stopped on a full io_uring waits for completions; a throttled one
//! for the limiter's timer (kicks start no pass meanwhile).

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::backend::BlockBackend;
use super::device::{Block, Registered};
use super::metrics::BlockMetrics;
use super::pass::PassStatus;
use crate::virtio::events::{self, throttled, PROCESS_ACTIVATE};
use crate::virtio::metrics::Counters;

/// The driver notified the request queue.
pub const PROCESS_QUEUE: u32 = 1;
/// A pass yielded and asked to run again.
pub const PROCESS_REQUEUE: u32 = 2;
/// The io_uring posted completions.
pub const PROCESS_COMPLETIONS: u32 = 3;
/// The rate limiter's timer fired: the request it held back fits now.
pub const PROCESS_RATE_LIMITER: u32 = 4;

impl<B: BlockBackend> Block<B> {
    /// A pass yielded: makes the re-queue eventfd readable, unless it still
    /// is from the pass before. (Borrowed apart: a pass holds `active`.)
    fn requeue(registered: &mut Registered, evt: &EventFd, metrics: &BlockMetrics) {
        metrics
            .host_errors()
            .signal_once(evt, &mut registered.requeued, "re-queue");
    }

    /// Runs one pass if one may run now; returns how it ended.
    fn run_pass(&mut self) -> Option<PassStatus> {
        let a = self.active.as_mut().filter(|a| a.activation.started)?;
        if throttled(&self.limiter) {
            return None;
        }
        a.saturated = false;
        let status = a.virtio.process(
            &mut self.backend,
            &mut self.engine,
            self.limiter.as_mut(),
            &self.metrics,
            &*a.activation.interrupt,
        );
        match status {
            PassStatus::Yield => {
                Self::requeue(&mut self.registered, &self.requeue_evt, &self.metrics)
            }
            PassStatus::Saturated => a.saturated = true,
            PassStatus::Broken => a.activation.device_error(),
            PassStatus::Done | PassStatus::Throttled => {}
        }
        Some(status)
    }

    fn process_activate_event(&mut self) {
        let activation = self.active.as_mut().map(|a| &mut a.activation);
        let errors = self.metrics.host_errors();
        // Requests posted before DRIVER_OK have no kick of their own.
        if errors.activation_event(&self.activate_evt, activation) {
            self.run_pass();
        }
    }

    fn process_queue_event(&mut self) {
        self.metrics
            .host_errors()
            .drain(&self.common.queue_evts[0], "queue");
        self.run_pass();
    }

    fn process_requeue_event(&mut self) {
        if self.run_pass() != Some(PassStatus::Yield) {
            self.metrics.host_errors().drain_signalled(
                &self.requeue_evt,
                &mut self.registered.requeued,
                "re-queue",
            );
        }
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

    fn process_rate_limiter_event(&mut self) {
        events::timer_fired(&mut self.limiter, &self.metrics.throttled_ns);
        self.run_pass();
    }

    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let want_queues = self.active.as_ref().is_some_and(|a| a.activation.started);
        self.metrics.host_errors().sync_queue_eventfds(
            ops,
            &[
                (&self.common.queue_evts[0], PROCESS_QUEUE),
                (&self.requeue_evt, PROCESS_REQUEUE),
            ],
            want_queues,
            &mut self.registered.queues,
        );
        // The timer follows the limiter whatever the activation state: one
        // armed before a reset still has to unblock it.
        let retry = self.metrics.host_errors().sync_timer(
            ops,
            &mut self.limiter,
            &mut self.registered.timer,
            PROCESS_RATE_LIMITER,
            &self.metrics.throttled_ns,
        );
        if retry {
            Self::requeue(&mut self.registered, &self.requeue_evt, &self.metrics);
        }
    }
}

impl<B: BlockBackend + 'static> MutEventSubscriber for Block<B> {
    fn init(&mut self, ops: &mut EventOps) {
        let errors = self.metrics.host_errors();
        errors.add_activate_evt(ops, &self.activate_evt);
        if let Some(e) = self.engine.as_ref() {
            errors.add_readable(ops, e.ring(), PROCESS_COMPLETIONS, "the io_uring");
        }
        // An activation that happened before the device joined the loop.
        if self.active.is_some() {
            self.process_activate_event();
            self.sync_registrations(ops);
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            PROCESS_ACTIVATE => self.process_activate_event(),
            PROCESS_QUEUE => self.process_queue_event(),
            PROCESS_REQUEUE => self.process_requeue_event(),
            PROCESS_COMPLETIONS => self.process_completions_event(),
            PROCESS_RATE_LIMITER => self.process_rate_limiter_event(),
            other => self.metrics.host_errors().unknown_token(other),
        }
        self.sync_registrations(ops);
    }
}
