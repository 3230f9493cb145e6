// SPDX-License-Identifier: Apache-2.0
//! Event-manager glue of the network device.
//!
//! The device is one `MutEventSubscriber`. Each descriptor it polls carries a
//! `u32` token:
//!
//! | token | descriptor | registered |
//! |---|---|---|
//! | `PROCESS_ACTIVATE` | internal `activate_evt` | always (from `init`) |
//! | `PROCESS_RX_QUEUE` | RX queue notify eventfd | while activated |
//! | `PROCESS_TX_QUEUE` | TX queue notify eventfd | while activated |
//! | `PROCESS_BACKEND` | TAP / socket fd | EPOLLIN unless RX is starved or deferred by its weight; EPOLLOUT only while a TX frame waits after EAGAIN |
//! | `PROCESS_RX_REQUEUE` | RX re-queue eventfd | while activated |
//! | `PROCESS_TX_REQUEUE` | TX re-queue eventfd | while activated |
//!
//! After every event, `sync_registrations` compares what the device state
//! asks for with what is registered and issues only the differences. That one
//! function is how activation and reset (which happen on a vCPU thread and
//! only write `activate_evt`) take effect, how starvation stops the reads of
//! the level-triggered backend fd without spinning, and how EPOLLOUT is armed
//! only while TX is blocked.
//!
//! A pass that hits its weight writes its re-queue eventfd and returns; the
//! loop then serves every other ready descriptor (the other direction above
//! all) before the re-queue event starts the next pass.

use std::io;

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::device::Net;
use super::metrics::NetMetrics;
use super::rxtx::{RxStatus, TxStatus};
use super::tap::NetBackend;
use super::{RX_INDEX, TX_INDEX};

/// `activate_evt`: activation or reset happened.
pub const PROCESS_ACTIVATE: u32 = 0;
/// The driver notified the RX queue (new receive buffers).
pub const PROCESS_RX_QUEUE: u32 = 1;
/// The driver notified the TX queue (new frames to send).
pub const PROCESS_TX_QUEUE: u32 = 2;
/// The backend fd is readable and/or writable.
pub const PROCESS_BACKEND: u32 = 3;
/// An RX pass stopped at its weight and asked to run again.
pub const PROCESS_RX_REQUEUE: u32 = 4;
/// A TX pass stopped at its weight and asked to run again.
pub const PROCESS_TX_REQUEUE: u32 = 5;

/// What the handler currently has in the epoll set.
#[derive(Debug, Default)]
pub(crate) struct Registered {
    /// Queue and re-queue eventfds.
    queues: bool,
    /// Interest registered for the backend fd, if any.
    backend: Option<EventSet>,
    /// The backend hung up (a socket peer closed); it is never polled again.
    backend_hup: bool,
}

impl<B: NetBackend> Net<B> {
    fn drain(evt: &EventFd, metrics: &NetMetrics, what: &str) {
        match evt.read() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                NetMetrics::inc(&metrics.host_errors);
                log::error!("virtio-net: cannot read the {what} eventfd: {e}");
            }
        }
    }

    fn signal(evt: &EventFd, metrics: &NetMetrics, what: &str) {
        if let Err(e) = evt.write(1) {
            NetMetrics::inc(&metrics.host_errors);
            log::error!("virtio-net: cannot write the {what} eventfd: {e}");
        }
    }

    /// Runs one RX pass if reading is allowed now.
    fn run_rx(&mut self) {
        let fd = self.backend.as_raw_fd();
        let Some(a) = self.active.as_mut().filter(|a| a.started) else {
            return;
        };
        if a.rx_deferred || a.rx.starved_since().is_some() {
            return;
        }
        let status = a.rx.process(&self.mem, fd, &self.metrics, &*a.interrupt);
        if status == RxStatus::WeightHit {
            a.rx_deferred = true;
            Self::signal(&self.rx_requeue_evt, &self.metrics, "RX re-queue");
        }
    }

    /// Runs one TX pass unless a frame waits for the backend.
    fn run_tx(&mut self, retry: bool) {
        let fd = self.backend.as_raw_fd();
        let Some(a) = self.active.as_mut().filter(|a| a.started) else {
            return;
        };
        // While blocked, only writability (EPOLLOUT) may resume TX: a kick
        // would just hit EAGAIN again.
        if a.tx.is_blocked() && !retry {
            return;
        }
        let status = a.tx.process(&self.mem, fd, &self.metrics, &*a.interrupt);
        if status == TxStatus::WeightHit {
            Self::signal(&self.tx_requeue_evt, &self.metrics, "TX re-queue");
        }
    }

    /// activate_evt: start a new activation (a reset needs only the
    /// registration update that follows every event).
    fn process_activate_event(&mut self) {
        Self::drain(&self.activate_evt, &self.metrics, "activate");
        if let Some(a) = self.active.as_mut() {
            if !a.started {
                a.started = true;
                // Frames queued before DRIVER_OK have no kick of their own.
                self.run_tx(false);
            }
        }
    }

    fn process_rx_queue_event(&mut self) {
        Self::drain(&self.queue_evts[RX_INDEX], &self.metrics, "RX queue");
        // New buffers only matter if we stopped reading for lack of them.
        if let Some(a) = self.active.as_mut() {
            if a.rx.end_starvation(&self.metrics) {
                self.run_rx();
            }
        }
    }

    fn process_tx_queue_event(&mut self) {
        Self::drain(&self.queue_evts[TX_INDEX], &self.metrics, "TX queue");
        self.run_tx(false);
    }

    fn process_backend_event(&mut self, set: EventSet) {
        if set.contains(EventSet::OUT) {
            let blocked = self.active.as_ref().is_some_and(|a| a.tx.is_blocked());
            if blocked {
                self.run_tx(true);
            }
        }
        if set.contains(EventSet::IN) {
            self.run_rx();
        } else if set.intersects(EventSet::HANG_UP | EventSet::ERROR) {
            // A socket peer went away; the level-triggered HUP would fire
            // forever. A TAP never hangs up.
            self.registered.backend_hup = true;
            NetMetrics::inc(&self.metrics.host_errors);
            log::error!("virtio-net: backend hung up; the device stops using it");
        }
    }

    fn process_rx_requeue_event(&mut self) {
        Self::drain(&self.rx_requeue_evt, &self.metrics, "RX re-queue");
        if let Some(a) = self.active.as_mut() {
            a.rx_deferred = false;
        }
        self.run_rx();
    }

    fn process_tx_requeue_event(&mut self) {
        Self::drain(&self.tx_requeue_evt, &self.metrics, "TX re-queue");
        self.run_tx(false);
    }

    /// The backend interest the current state asks for.
    fn wanted_backend_interest(&self) -> EventSet {
        let mut set = EventSet::empty();
        if self.registered.backend_hup {
            return set;
        }
        if let Some(a) = self.active.as_ref().filter(|a| a.started) {
            if !a.rx_deferred && a.rx.starved_since().is_none() && !a.rx.is_broken() {
                set |= EventSet::IN;
            }
            if a.tx.is_blocked() {
                set |= EventSet::OUT;
            }
        }
        set
    }

    fn ctl_result(&self, res: event_manager::Result<()>, what: &str) {
        if let Err(e) = res {
            NetMetrics::inc(&self.metrics.host_errors);
            log::error!("virtio-net: cannot update epoll registration of {what}: {e}");
        }
    }

    /// Brings the epoll registrations in line with the device state.
    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let want_queues = self.active.as_ref().is_some_and(|a| a.started);
        if want_queues != self.registered.queues {
            let fds = [
                (&self.queue_evts[RX_INDEX], PROCESS_RX_QUEUE),
                (&self.queue_evts[TX_INDEX], PROCESS_TX_QUEUE),
                (&self.rx_requeue_evt, PROCESS_RX_REQUEUE),
                (&self.tx_requeue_evt, PROCESS_TX_REQUEUE),
            ];
            for (evt, token) in fds {
                let res = if want_queues {
                    ops.add(Events::with_data(evt, token, EventSet::IN))
                } else {
                    ops.remove(Events::empty(evt))
                };
                self.ctl_result(res, "a queue eventfd");
            }
            self.registered.queues = want_queues;
        }

        let want = self.wanted_backend_interest();
        let fd = self.backend.as_raw_fd();
        let ev = |set| Events::with_data_raw(fd, PROCESS_BACKEND, set);
        let res = match self.registered.backend {
            None if want.is_empty() => Ok(()),
            None => ops.add(ev(want)),
            Some(_) if want.is_empty() => ops.remove(ev(want)),
            Some(cur) if cur != want => ops.modify(ev(want)),
            Some(_) => Ok(()),
        };
        self.ctl_result(res, "the backend");
        self.registered.backend = (!want.is_empty()).then_some(want);
    }
}

impl<B: NetBackend + 'static> MutEventSubscriber for Net<B> {
    fn init(&mut self, ops: &mut EventOps) {
        let res = ops.add(Events::with_data(
            &self.activate_evt,
            PROCESS_ACTIVATE,
            EventSet::IN,
        ));
        self.ctl_result(res, "the activation eventfd");
        // An activation that happened before we were added to the loop.
        if self.active.is_some() {
            self.process_activate_event();
            self.sync_registrations(ops);
        }
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            PROCESS_ACTIVATE => self.process_activate_event(),
            PROCESS_RX_QUEUE => self.process_rx_queue_event(),
            PROCESS_TX_QUEUE => self.process_tx_queue_event(),
            PROCESS_BACKEND => self.process_backend_event(events.event_set()),
            PROCESS_RX_REQUEUE => self.process_rx_requeue_event(),
            PROCESS_TX_REQUEUE => self.process_tx_requeue_event(),
            other => {
                NetMetrics::inc(&self.metrics.host_errors);
                log::error!("virtio-net: event with unknown token {other}");
            }
        }
        self.sync_registrations(ops);
    }
}
