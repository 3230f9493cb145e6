// SPDX-License-Identifier: Apache-2.0
//! Event-manager glue of the vsock device.
//!
//! The device is one `MutEventSubscriber`. Each descriptor it polls carries
//! a `u32` token:
//!
//! | token | descriptor | registered |
//! |---|---|---|
//! | `PROCESS_ACTIVATE` | internal `activate_evt` | always (from `init`) |
//! | `PROCESS_RXQ`, `PROCESS_TXQ`, `PROCESS_EVQ` | the queues' notify eventfds, edge-triggered, never read | while activated |
//! | `PROCESS_REQUEUE` | re-queue eventfd | while activated |
//! | `PROCESS_LISTENER` | the listener on `uds_path` | always |
//! | `PROCESS_TIMER` | the connection time-out timer | always |
//! | `FIRST_CONN_TOKEN + slot` | a connection's host socket | while it wants reading or writing |
//!
//! After every event `sync_registrations` brings the registrations in line
//! with the device state: the connections whose poll interest changed
//! (read while the device wants to read and has not been told it can,
//! write while bytes wait), the sockets taken out of service (removed, then
//! closed), and the timer (armed for the earliest deadline). A TX pass that
//! leaves packets for the guest runs an RX pass after it; a pass that
//! yields writes the re-queue eventfd, so every other ready event runs
//! before the next pass. The passes of one event publish their used entries
//! as they go and raise one interrupt at its end, if the driver wants one
//! for any of them.

use std::time::{Duration, Instant};

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};

use super::backend::VsockBackend;
use super::device::Vsock;
use super::pass::PassStatus;
use crate::virtio::events::PROCESS_ACTIVATE;
use crate::virtio::metrics::Counters;

/// The driver notified the RX queue (buffers posted).
pub const PROCESS_RXQ: u32 = 1;
/// The driver notified the TX queue (packets posted).
pub const PROCESS_TXQ: u32 = 2;
/// The driver notified the event queue.
pub const PROCESS_EVQ: u32 = 3;
/// A pass yielded and asked to run again.
pub const PROCESS_REQUEUE: u32 = 4;
/// A host process connected to `uds_path`.
pub const PROCESS_LISTENER: u32 = 5;
/// A connection's deadline passed.
pub const PROCESS_TIMER: u32 = 6;
/// The token of the connection in slot 0; slot N has this plus N.
pub const FIRST_CONN_TOKEN: u32 = 16;

/// The queue a pass served, for the re-queue event.
#[derive(Clone, Copy)]
enum Which {
    Tx,
    Rx,
    Event,
}

/// Shortest time the timer is armed for: 0 would disarm it.
const MIN_TIMER: Duration = Duration::from_millis(1);

impl<B: VsockBackend + 'static> Vsock<B> {
    fn runnable(&self) -> bool {
        self.active
            .as_ref()
            .is_some_and(|a| a.activation.started && !a.broken)
    }

    /// Notes how a pass of queue `q` ended: a yield re-queues it, a broken
    /// queue stops the device until a reset.
    fn after_pass(&mut self, status: PassStatus, q: Which) {
        let Some(a) = self.active.as_mut() else {
            return;
        };
        match status {
            PassStatus::Yield => {
                *match q {
                    Which::Tx => &mut a.tx_yielded,
                    Which::Rx => &mut a.rx_yielded,
                    Which::Event => &mut a.ev_yielded,
                } = true;
                self.metrics.host_errors().signal_once(
                    &self.requeue_evt,
                    &mut self.registered.requeued,
                    "re-queue",
                );
            }
            PassStatus::Broken => {
                a.broken = true;
                a.activation.device_error();
            }
            PassStatus::Done => {}
        }
    }

    fn run_rx(&mut self) {
        if !self.runnable() || !self.muxer.has_rx_work() {
            return;
        }
        let a = self.active.as_mut().expect("runnable");
        a.rx_yielded = false;
        let status = a.virtio.rx_pass(&mut self.muxer, &self.metrics);
        self.after_pass(status, Which::Rx);
    }

    fn run_tx(&mut self) {
        if !self.runnable() {
            return;
        }
        let a = self.active.as_mut().expect("runnable");
        a.tx_yielded = false;
        let status = a.virtio.tx_pass(&mut self.muxer, &self.metrics);
        self.after_pass(status, Which::Tx);
        self.run_rx();
    }

    fn run_events(&mut self) {
        if !self.runnable() {
            return;
        }
        let a = self.active.as_mut().expect("runnable");
        a.ev_yielded = false;
        let status = a.virtio.event_pass(&self.metrics);
        self.after_pass(status, Which::Event);
    }

    fn process_activate_event(&mut self) {
        let activation = self.active.as_mut().map(|a| &mut a.activation);
        let first = self
            .metrics
            .host_errors()
            .activation_event(&self.activate_evt, activation);
        // Work posted before DRIVER_OK has no kick of its own; a
        // TRANSPORT_RESET comes this way too.
        if first {
            self.run_tx();
        }
        self.run_events();
    }

    /// A kick. The queue eventfds are edge-triggered and never read: every
    /// write the driver makes after epoll reported one brings the loop back
    /// (the count only grows, and 2^64 kicks are out of reach), so a kick
    /// costs the loop no `read`.
    fn process_queue_event(&mut self, index: usize) {
        match index {
            0 => self.run_rx(),
            1 => self.run_tx(),
            _ => self.run_events(),
        }
    }

    fn process_requeue_event(&mut self) {
        self.metrics.host_errors().drain_signalled(
            &self.requeue_evt,
            &mut self.registered.requeued,
            "re-queue",
        );
        let Some(a) = self.active.as_ref() else {
            return;
        };
        let (tx, rx, ev) = (a.tx_yielded, a.rx_yielded, a.ev_yielded);
        if tx {
            self.run_tx();
        }
        if rx {
            self.run_rx();
        }
        if ev {
            self.run_events();
        }
    }

    fn process_timer_event(&mut self) {
        // Non-blocking: a timer re-armed since it fired reads EAGAIN.
        let _ = self.timer.wait();
        self.registered.timer = None;
        self.muxer.expire(Instant::now());
        self.run_rx();
    }

    fn process_socket_event(&mut self, slot: usize, set: EventSet) {
        let hangup = set.intersects(EventSet::HANG_UP | EventSet::ERROR | EventSet::READ_HANG_UP);
        let readable = set.contains(EventSet::IN) || hangup;
        let writable = set.contains(EventSet::OUT) || hangup;
        let active = self.runnable();
        self.muxer.on_socket_event(slot, readable, writable, active);
        self.run_rx();
    }

    fn sync_connections(&mut self, ops: &mut EventOps) {
        let errors = self.metrics.host_errors();
        for grave in self.muxer.graveyard.drain(..) {
            if grave.registered {
                errors.ctl_result(ops.remove(Events::empty(&grave.stream)), "a closed socket");
            }
        }
        let mut dirty = std::mem::take(&mut self.muxer.dirty);
        dirty.sort_unstable();
        dirty.dedup();
        for &slot in &dirty {
            let Some(c) = self.muxer.conn(slot) else {
                continue;
            };
            let want = Some(c.interest()).filter(|&(r, w)| r || w);
            let have = self.muxer.registered[slot];
            if want == have {
                continue;
            }
            let set = |(r, w): (bool, bool)| {
                let mut s = EventSet::empty();
                if r {
                    s |= EventSet::IN;
                }
                if w {
                    s |= EventSet::OUT;
                }
                s
            };
            let token = FIRST_CONN_TOKEN + slot as u32;
            let res = match (have, want) {
                (None, Some(i)) => ops.add(Events::with_data(&c.stream, token, set(i))),
                (Some(_), Some(i)) => ops.modify(Events::with_data(&c.stream, token, set(i))),
                (Some(_), None) => ops.remove(Events::empty(&c.stream)),
                (None, None) => Ok(()),
            };
            match res {
                Ok(()) => self.muxer.registered[slot] = want,
                Err(e) => errors.ctl_result(Err(e), "a connection's socket"),
            }
        }
        // Handed back empty with its room: a vector dropped here was
        // allocated again by the next pass (twice a transaction of rr_1).
        dirty.clear();
        dirty.append(&mut self.muxer.dirty);
        self.muxer.dirty = dirty;
    }

    fn sync_timer(&mut self) {
        if !std::mem::take(&mut self.muxer.deadlines_changed) {
            return;
        }
        let next = self.muxer.next_deadline();
        if next == self.registered.timer {
            return;
        }
        let res = match next {
            Some(at) => {
                let dur = at.saturating_duration_since(Instant::now()).max(MIN_TIMER);
                self.timer.reset(dur, None)
            }
            None => self.timer.clear(),
        };
        match res {
            Ok(()) => self.registered.timer = next,
            Err(e) => {
                // Retried at the next change; a deadline may run late.
                self.muxer.deadlines_changed = true;
                crate::virtio::events::inc(&self.metrics.host_errors);
                log::error!("virtio-vsock: cannot arm the time-out timer: {e}");
            }
        }
    }

    /// Raises the one interrupt the passes of this event owe the driver.
    fn raise_owed(&mut self) {
        if let Some(a) = self.active.as_mut() {
            let irq = &*a.activation.interrupt;
            a.virtio.raise_owed(&self.metrics, irq);
        }
    }

    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let want_queues = self.runnable();
        let evts = &self.common.queue_evts;
        let errors = self.metrics.host_errors();
        errors.sync_eventfds(
            ops,
            &[
                (&evts[0], PROCESS_RXQ),
                (&evts[1], PROCESS_TXQ),
                (&evts[2], PROCESS_EVQ),
            ],
            EventSet::IN | EventSet::EDGE_TRIGGERED,
            want_queues,
            &mut self.registered.queues,
        );
        errors.sync_queue_eventfds(
            ops,
            &[(&self.requeue_evt, PROCESS_REQUEUE)],
            want_queues,
            &mut self.registered.requeue,
        );
        self.sync_connections(ops);
        self.sync_timer();
    }
}

impl<B: VsockBackend + 'static> MutEventSubscriber for Vsock<B> {
    fn init(&mut self, ops: &mut EventOps) {
        let errors = self.metrics.host_errors();
        errors.add_activate_evt(ops, &self.activate_evt);
        errors.add_readable(ops, &self.muxer.listener, PROCESS_LISTENER, "the listener");
        errors.add_readable(ops, &self.timer, PROCESS_TIMER, "the time-out timer");
        // An activation that happened before the device joined the loop.
        if self.active.is_some() {
            self.process_activate_event();
        }
        self.raise_owed();
        self.sync_registrations(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            PROCESS_ACTIVATE => self.process_activate_event(),
            PROCESS_RXQ => self.process_queue_event(0),
            PROCESS_TXQ => self.process_queue_event(1),
            PROCESS_EVQ => self.process_queue_event(2),
            PROCESS_REQUEUE => self.process_requeue_event(),
            PROCESS_LISTENER => self.muxer.accept_host(),
            PROCESS_TIMER => self.process_timer_event(),
            t if t >= FIRST_CONN_TOKEN => {
                self.process_socket_event((t - FIRST_CONN_TOKEN) as usize, events.event_set())
            }
            other => self.metrics.host_errors().unknown_token(other),
        }
        // Held chains a socket event, a time-out or a reset let go of.
        self.return_held();
        self.raise_owed();
        self.sync_registrations(ops);
    }
}
