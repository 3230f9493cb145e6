// SPDX-License-Identifier: Apache-2.0
//! Event-manager glue of the balloon.
//!
//! The device is one `MutEventSubscriber` (the start-up and dispatch every
//! device shares, in `events`). Each descriptor it polls carries a `u32`
//! token:
//!
//! | token | descriptor | registered |
//! |---|---|---|
//! | `PROCESS_ACTIVATE` | internal `activate_evt` | always (from `init`) |
//! | `PROCESS_INFLATE` .. `PROCESS_REPORT` | each queue's notify eventfd | while activated, for the queues the driver set up |
//! | `PROCESS_REQUEUE` | re-queue eventfd | while activated |
//! | `PROCESS_STATS_TIMER` | the statistics timerfd | always, with statistics (armed only while the statistics queue runs) |
//!
//! A pass that yields marks its queue pending and writes the re-queue
//! eventfd (once: it stays readable while passes keep yielding), so every
//! other ready event runs before the next pass. The timer is armed when
//! the handler takes an activation with a statistics queue up, and
//! disarmed after a reset, both on the event loop's thread (a vCPU thread
//! makes no timer call).

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::device::Balloon;
use super::discard::PageDiscard;
use super::pass::{PassEnv, PassStatus};
use super::{Vq, FREE_PAGE_HINT_DONE};
use crate::virtio::events::{self, Activation, EventHandler, HostErrors};
use crate::virtio::metrics::Counters;

/// The driver notified the inflate queue; the other queues follow in
/// [`Vq::ALL`] order (`PROCESS_INFLATE + position`).
pub const PROCESS_INFLATE: u32 = 1;
/// The driver notified the free page reporting queue (the last queue).
pub const PROCESS_REPORT: u32 = PROCESS_INFLATE + Vq::ALL.len() as u32 - 1;
/// A pass yielded and asked to run again.
pub const PROCESS_REQUEUE: u32 = PROCESS_REPORT + 1;
/// The statistics timer fired: time to ask the driver for a report.
pub const PROCESS_STATS_TIMER: u32 = PROCESS_REQUEUE + 1;

/// The token of queue `vq`.
fn token(vq: Vq) -> u32 {
    let pos = Vq::ALL.iter().position(|&q| q == vq).unwrap_or(0);
    PROCESS_INFLATE + pos as u32
}

/// The bit of queue `vq` in the pending passes (`Glue::pending`).
fn bit(vq: Vq) -> u8 {
    1 << (token(vq) - PROCESS_INFLATE)
}

impl<D: PageDiscard> Balloon<D> {
    /// Runs one pass over `vq` if one may run now; returns how it ended.
    fn run_pass(&mut self, vq: Vq) -> Option<PassStatus> {
        let a = self.active.as_mut().filter(|a| a.activation.started)?;
        if !a.virtio.has(vq) {
            return None;
        }
        let mut env = PassEnv {
            discard: &mut self.discard,
            metrics: &self.metrics,
            irq: &*a.activation.interrupt,
            stats: &mut self.stats,
            hint: &mut self.space.hint,
        };
        let status = a.virtio.process(vq, &mut env);
        self.glue.pending &= !bit(vq);
        match status {
            PassStatus::Yield => {
                self.glue.pending |= bit(vq);
                let errors = self.metrics.host_errors();
                errors.signal_once(&self.requeue_evt, &mut self.glue.requeued, "re-queue");
            }
            PassStatus::Broken => a.activation.device_error(),
            PassStatus::Done => {}
        }
        if vq == Vq::Hint {
            self.hint_acknowledge();
        }
        Some(status)
    }

    /// The guest said it has hinted everything: DONE at once when the run
    /// was started with `acknowledge_on_stop`.
    fn hint_acknowledge(&mut self) {
        let h = &mut self.space.hint;
        if std::mem::take(&mut h.guest_stopped) && h.ack_on_stop && h.running() {
            self.set_hint_cmd(FREE_PAGE_HINT_DONE);
        }
    }

    /// The passes a re-queue asked for.
    fn run_pending(&mut self) {
        let errors = self.metrics.host_errors();
        errors.drain_signalled(&self.requeue_evt, &mut self.glue.requeued, "re-queue");
        let pending = self.glue.pending;
        for vq in Vq::ALL {
            if pending & bit(vq) != 0 {
                self.run_pass(vq);
            }
        }
    }

    /// The statistics timer fired: reads it and asks for a report.
    fn stats_timer_fired(&mut self) {
        if let Some(t) = self.stats_timer.as_mut() {
            // Non-blocking: nothing pending is EAGAIN, which is fine.
            let _ = t.wait();
        }
        self.request_stats();
    }

    /// The queue eventfds the current state wants registered.
    fn wanted_queues(&self) -> Vec<(usize, u32)> {
        let Some(a) = self.active.as_ref().filter(|a| a.activation.started) else {
            return Vec::new();
        };
        (0..self.common.queue_evts.len())
            .map_while(|i| a.virtio.vq_at(i).map(|vq| (i, token(vq))))
            .collect()
    }

    /// Arms or disarms the statistics timer; a failure is a host error
    /// (the statistics then stop being refreshed, nothing else).
    fn set_timer(&mut self, on: bool) {
        if let Err(e) = self.arm_stats_timer(on) {
            let n = events::inc(&self.metrics.host_errors);
            crate::warn::warn_rate_limited!(count = n, "virtio-balloon: {e}");
        }
    }
}

impl<D: PageDiscard> EventHandler for Balloon<D> {
    fn activation_parts(&mut self) -> (HostErrors<'_>, &EventFd, Option<&mut Activation>) {
        let activation = self.active.as_mut().map(|a| &mut a.activation);
        (self.metrics.host_errors(), &self.activate_evt, activation)
    }

    /// Chains posted before DRIVER_OK have no kick of their own; the
    /// statistics timer starts with the statistics queue.
    fn first_passes(&mut self) {
        let stats = self
            .active
            .as_ref()
            .is_some_and(|a| a.virtio.has(Vq::Stats));
        if stats {
            self.set_timer(true);
        }
        for vq in Vq::ALL {
            self.run_pass(vq);
        }
    }

    fn add_fixed(&mut self, ops: &mut EventOps) {
        if let Some(t) = &self.stats_timer {
            let errors = self.metrics.host_errors();
            errors.add_readable(ops, t, PROCESS_STATS_TIMER, "the statistics timer");
        }
    }

    fn handle(&mut self, token: u32, _: EventSet) -> bool {
        match token {
            PROCESS_INFLATE..=PROCESS_REPORT => {
                let vq = Vq::ALL[(token - PROCESS_INFLATE) as usize];
                let index = self.glue.registered.iter().find(|r| r.1 == token);
                if let Some(evt) = index.and_then(|&(i, _)| self.common.queue_evts.get(i)) {
                    self.metrics.host_errors().drain(evt, "queue");
                }
                self.run_pass(vq);
            }
            PROCESS_REQUEUE => self.run_pending(),
            PROCESS_STATS_TIMER => self.stats_timer_fired(),
            _ => return false,
        }
        true
    }

    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let errors = self.metrics.host_errors();
        let want = self.wanted_queues();
        if want != self.glue.registered {
            for &(i, _) in &self.glue.registered {
                let res = ops.remove(Events::empty(&self.common.queue_evts[i]));
                errors.ctl_result(res, "a queue eventfd");
            }
            for &(i, t) in &want {
                errors.add_readable(ops, &self.common.queue_evts[i], t, "a queue eventfd");
            }
            self.glue.registered = want;
        }
        let started = !self.glue.registered.is_empty();
        errors.sync_queue_eventfds(
            ops,
            &[(&self.requeue_evt, PROCESS_REQUEUE)],
            started,
            &mut self.glue.requeue_registered,
        );
        if self.active.is_none() && self.glue.timer_armed {
            self.set_timer(false);
        }
    }
}

impl<D: PageDiscard + 'static> MutEventSubscriber for Balloon<D> {
    fn init(&mut self, ops: &mut EventOps) {
        events::init(self, ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        events::process(self, events, ops);
    }
}
