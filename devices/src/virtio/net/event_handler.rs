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
//! | `PROCESS_BACKEND` | TAP / socket fd | EPOLLIN unless RX is starved, deferred by its weight or throttled; EPOLLOUT only while a TX frame waits after EAGAIN |
//! | `PROCESS_RX_REQUEUE` | RX re-queue eventfd | while activated |
//! | `PROCESS_TX_REQUEUE` | TX re-queue eventfd | while activated |
//! | `PROCESS_RX_RATE_LIMITER` | RX limiter's timerfd | while RX is throttled |
//! | `PROCESS_TX_RATE_LIMITER` | TX limiter's timerfd | while TX is throttled |
//!
//! After every event, `sync_registrations` compares what the device state
//! asks for with what is registered and issues only the differences. That one
//! function is how activation and reset (which happen on a vCPU thread and
//! only write `activate_evt`) take effect, how starvation and throttling stop
//! the reads of the level-triggered backend fd without spinning, and how
//! EPOLLOUT is armed only while TX is blocked.
//!
//! A pass that hits its weight writes its re-queue eventfd and returns; the
//! loop then serves every other ready descriptor (the other direction above
//! all) before the re-queue event starts the next pass.
//!
//! A throttled direction sleeps until its limiter's timer fires: queue kicks
//! and backend events do not start a pass meanwhile (RX is not even polled
//! for reading), and the other direction runs as usual. A limiter's timer
//! stays registered across a reset while it is armed, so a limiter blocked
//! when the driver reset the device is unblocked on time and cannot hold up
//! the next activation.

use event_manager::{EventOps, EventSet, Events, MutEventSubscriber};
use vmm_sys_util::eventfd::EventFd;

use super::device::Net;
use super::rx::RxStatus;
use super::tap::NetBackend;
use super::tx::TxStatus;
use super::{RX_INDEX, TX_INDEX};
use crate::virtio::events::{self, throttled, Activation, EventHandler, HostErrors};
use crate::virtio::metrics::Counters;
use crate::warn::warn_rate_limited;

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
/// The RX rate limiter's timer fired: the frame it held back fits now.
pub const PROCESS_RX_RATE_LIMITER: u32 = 6;
/// The TX rate limiter's timer fired: the frame it held back fits now.
pub const PROCESS_TX_RATE_LIMITER: u32 = 7;

impl<B: NetBackend> Net<B> {
    /// Queue `q`'s re-queue eventfd, whether it is readable
    /// (`Registered::rx_requeued`, `Registered::tx_requeued`), the metrics
    /// and the eventfd's name in log lines: the pieces `requeue` and
    /// `requeue_done` work on, borrowed apart.
    fn requeue_parts(&mut self, q: usize) -> (&EventFd, &mut bool, HostErrors<'_>, &'static str) {
        if q == RX_INDEX {
            (
                &self.rx_requeue_evt,
                &mut self.registered.rx_requeued,
                self.metrics.host_errors(),
                "RX re-queue",
            )
        } else {
            (
                &self.tx_requeue_evt,
                &mut self.registered.tx_requeued,
                self.metrics.host_errors(),
                "TX re-queue",
            )
        }
    }

    /// A pass of queue `q` yielded: makes its re-queue eventfd readable,
    /// unless it still is from the pass before (see
    /// `Registered::tx_requeued`).
    fn requeue(&mut self, q: usize) {
        let (evt, queued, errors, what) = self.requeue_parts(q);
        errors.signal_once(evt, queued, what);
    }

    /// A pass of queue `q` run from its re-queue eventfd ended otherwise
    /// than by yielding (or none could run): reads the eventfd, so the loop
    /// sleeps.
    fn requeue_done(&mut self, q: usize) {
        let (evt, queued, errors, what) = self.requeue_parts(q);
        errors.drain_signalled(evt, queued, what);
    }

    /// Runs one RX pass if reading is allowed now; returns how it ended.
    /// `hup`: the backend reported EPOLLHUP or EPOLLERR with this event.
    fn run_rx(&mut self, hup: bool) -> Option<RxStatus> {
        let a = self.active.as_mut().filter(|a| a.activation.started)?;
        if a.rx_deferred || a.rx.starved_since().is_some() || throttled(&self.rx_limiter) {
            return None;
        }
        let status = a.rx.process(
            &self.backend,
            self.rx_limiter.as_mut(),
            self.mmds.as_mut(),
            &self.metrics,
            &*a.activation.interrupt,
        );
        match status {
            RxStatus::WeightHit => {
                a.rx_deferred = true;
                self.requeue(RX_INDEX);
            }
            RxStatus::Broken => a.activation.device_error(),
            // End of file only with a hangup reported; otherwise a 0-byte
            // message, a runt frame (a hangup that arrives in a pass started
            // by another event is taken at the next backend event).
            RxStatus::ZeroRead if hup => self.backend_hung_up(),
            RxStatus::ZeroRead => {
                let n = events::inc(&self.metrics.rx_dropped);
                warn_rate_limited!(count = n, "virtio-net: dropped a 0-byte RX frame");
            }
            RxStatus::Drained | RxStatus::Starved | RxStatus::Throttled => {}
        }
        Some(status)
    }

    /// Runs one TX pass unless a frame waits for the backend; returns how
    /// it ended.
    fn run_tx(&mut self, retry: bool) -> Option<TxStatus> {
        let a = self.active.as_mut().filter(|a| a.activation.started)?;
        // While blocked, only writability (EPOLLOUT) may resume TX: a kick
        // would just hit EAGAIN again. While throttled, only the limiter's
        // timer may.
        if (a.tx.is_blocked() && !retry) || throttled(&self.tx_limiter) {
            return None;
        }
        let status = a.tx.process(
            &self.backend,
            &mut self.tx_ring,
            self.tx_limiter.as_mut(),
            self.mmds.as_mut(),
            &self.metrics,
            &*a.activation.interrupt,
        );
        match status {
            TxStatus::WeightHit => self.requeue(TX_INDEX),
            TxStatus::Broken => a.activation.device_error(),
            TxStatus::Done | TxStatus::Blocked | TxStatus::Throttled => {}
        }
        // Frames MMDS took may have answers: they go to the guest now, not
        // at the next backend or RX queue event.
        if self.mmds.as_ref().is_some_and(|m| m.has_output()) {
            self.run_rx(false);
        }
        Some(status)
    }

    fn process_rx_queue_event(&mut self) {
        self.metrics
            .host_errors()
            .drain(&self.common.queue_evts[RX_INDEX], "RX queue");
        // New buffers only matter if we stopped reading for lack of them.
        if let Some(a) = self.active.as_mut() {
            if a.rx.end_starvation(&self.metrics) {
                self.run_rx(false);
            }
        }
    }

    fn process_tx_queue_event(&mut self) {
        self.metrics
            .host_errors()
            .drain(&self.common.queue_evts[TX_INDEX], "TX queue");
        self.run_tx(false);
    }

    fn process_backend_event(&mut self, set: EventSet) {
        // A waiting TX chain is retried on writability, and also when the
        // backend failed (EPOLLERR/EPOLLHUP come without EPOLLOUT from some:
        // a pipe, a deleted TAP): a backend that is gone refuses the chain,
        // which returns it to the guest instead of leaving it, and every
        // chain behind it, waiting for a writability that never comes.
        if set.intersects(EventSet::OUT | EventSet::HANG_UP | EventSet::ERROR) {
            let blocked = self.active.as_ref().is_some_and(|a| a.tx.is_blocked());
            if blocked {
                self.run_tx(true);
            }
        }
        // Frames sent before a hangup are still delivered: the hangup is
        // taken once a read comes back empty with EPOLLHUP or EPOLLERR set,
        // or at once when RX cannot read now (it would otherwise fire again
        // at every iteration). A 0-byte read without them is a 0-byte
        // message, not end of file.
        let hup = set.intersects(EventSet::HANG_UP | EventSet::ERROR);
        let ran = set.contains(EventSet::IN) && self.run_rx(hup).is_some();
        if hup && !ran {
            self.backend_hung_up();
        }
    }

    /// A socket peer went away (a TAP never hangs up): stop polling the fd,
    /// whose level-triggered HUP would otherwise fire forever. A device reset
    /// polls it again.
    fn backend_hung_up(&mut self) {
        if !self.registered.backend_hup {
            self.registered.backend_hup = true;
            events::inc(&self.metrics.host_errors);
            // Rate-limited on its own count: keyed on host_errors, the
            // line would be skipped whenever other host errors came first.
            let n = events::inc(&self.metrics.backend_hangups);
            warn_rate_limited!(
                count = n,
                "virtio-net: backend hung up; the device stops polling it until a reset"
            );
        }
    }

    fn process_rx_requeue_event(&mut self) {
        if let Some(a) = self.active.as_mut() {
            a.rx_deferred = false;
        }
        if self.run_rx(false) != Some(RxStatus::WeightHit) {
            self.requeue_done(RX_INDEX);
        }
    }

    fn process_tx_requeue_event(&mut self) {
        if self.run_tx(false) != Some(TxStatus::WeightHit) {
            self.requeue_done(TX_INDEX);
        }
    }

    /// The RX limiter's timer: the frame it waited for fits; read again.
    fn process_rx_rate_limiter_event(&mut self) {
        events::timer_fired(&mut self.rx_limiter, &self.metrics.rx_throttled_ns);
        self.run_rx(false);
    }

    /// The TX limiter's timer: send the chain it held back, and what follows.
    fn process_tx_rate_limiter_event(&mut self) {
        events::timer_fired(&mut self.tx_limiter, &self.metrics.tx_throttled_ns);
        self.run_tx(false);
    }

    /// The backend interest the current state asks for.
    fn wanted_backend_interest(&self) -> EventSet {
        let mut set = EventSet::empty();
        if self.registered.backend_hup {
            return set;
        }
        if let Some(a) = self.active.as_ref().filter(|a| a.activation.started) {
            if !a.rx_deferred
                && a.rx.starved_since().is_none()
                && !a.rx.is_broken()
                && !throttled(&self.rx_limiter)
            {
                set |= EventSet::IN;
            }
            // Chains the backend pushed back wait for writability, unless
            // the TX limiter holds a chain back too: no pass runs until its
            // timer fires (`run_tx`), so a writable backend would wake the
            // loop for nothing, over and over. The timer's pass leaves TX
            // blocked, and writability is asked for again.
            if a.tx.is_blocked() && !throttled(&self.tx_limiter) {
                set |= EventSet::OUT;
            }
        }
        set
    }

    /// Registers queue `q`'s limiter timer while the limiter waits for it
    /// ([`HostErrors::sync_timer`]), and re-queues the pass if the wait had
    /// to be given up.
    fn sync_timer(&mut self, ops: &mut EventOps, q: usize) {
        let errors = self.metrics.host_errors();
        let (limiter, registered, token, throttled_ns) = if q == RX_INDEX {
            (
                &mut self.rx_limiter,
                &mut self.registered.rx_timer,
                PROCESS_RX_RATE_LIMITER,
                &self.metrics.rx_throttled_ns,
            )
        } else {
            (
                &mut self.tx_limiter,
                &mut self.registered.tx_timer,
                PROCESS_TX_RATE_LIMITER,
                &self.metrics.tx_throttled_ns,
            )
        };
        if errors.sync_timer(ops, limiter, registered, token, throttled_ns) {
            self.requeue(q);
        }
    }
}

impl<B: NetBackend> EventHandler for Net<B> {
    fn activation_parts(&mut self) -> (HostErrors<'_>, &EventFd, Option<&mut Activation>) {
        let activation = self.active.as_mut().map(|a| &mut a.activation);
        (self.metrics.host_errors(), &self.activate_evt, activation)
    }

    /// Frames queued before DRIVER_OK have no kick of their own.
    fn first_passes(&mut self) {
        self.run_tx(false);
    }

    fn handle(&mut self, token: u32, set: EventSet) -> bool {
        match token {
            PROCESS_RX_QUEUE => self.process_rx_queue_event(),
            PROCESS_TX_QUEUE => self.process_tx_queue_event(),
            PROCESS_BACKEND => self.process_backend_event(set),
            PROCESS_RX_REQUEUE => self.process_rx_requeue_event(),
            PROCESS_TX_REQUEUE => self.process_tx_requeue_event(),
            PROCESS_RX_RATE_LIMITER => self.process_rx_rate_limiter_event(),
            PROCESS_TX_RATE_LIMITER => self.process_tx_rate_limiter_event(),
            _ => return false,
        }
        true
    }

    /// Brings the epoll registrations in line with the device state.
    fn sync_registrations(&mut self, ops: &mut EventOps) {
        let want_queues = self.active.as_ref().is_some_and(|a| a.activation.started);
        self.metrics.host_errors().sync_queue_eventfds(
            ops,
            &[
                (&self.common.queue_evts[RX_INDEX], PROCESS_RX_QUEUE),
                (&self.common.queue_evts[TX_INDEX], PROCESS_TX_QUEUE),
                (&self.rx_requeue_evt, PROCESS_RX_REQUEUE),
                (&self.tx_requeue_evt, PROCESS_TX_REQUEUE),
            ],
            want_queues,
            &mut self.registered.queues,
        );

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
        self.metrics.host_errors().ctl_result(res, "the backend");
        self.registered.backend = (!want.is_empty()).then_some(want);

        // The timers follow the limiters whatever the activation state: one
        // armed before a reset still has to unblock its limiter.
        for q in [RX_INDEX, TX_INDEX] {
            self.sync_timer(ops, q);
        }
    }
}

impl<B: NetBackend + 'static> MutEventSubscriber for Net<B> {
    fn init(&mut self, ops: &mut EventOps) {
        events::init(self, ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        events::process(self, events, ops);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::super::device::features::VIRTIO_RING_F_EVENT_IDX;
    use super::super::tests::fixture::*;
    use super::super::NetConfig;
    use super::*;
    use crate::virtio::VirtioDevice;
    use event_manager::{EventManager, SubscriberOps};
    use vm_memory::GuestAddress;

    const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;

    /// A device activated with MRG_RXBUF whose configuration is the default
    /// changed by `change`.
    fn fixture_with(change: impl FnOnce(&mut NetConfig)) -> NetFixture {
        let mut cfg = NetConfig::default();
        change(&mut cfg);
        NetFixture::new(cfg, MRG_FEATURES)
    }

    /// A device activated with MRG_RXBUF and the default configuration,
    /// given `n` 1526-byte RX buffers and a kick of the RX queue.
    fn with_rx_buffers(n: usize) -> NetFixture {
        let mut h = fixture_with(|_| {});
        h.post_rx(&vec![1526; n]);
        h.kick_rx();
        h
    }

    /// The queue whose re-queue (`Registered::*_requeued` and its eventfd)
    /// a test looks at: RX and TX yield and re-queue the same way.
    #[derive(Clone, Copy)]
    enum Requeue {
        Rx,
        Tx,
    }

    impl Requeue {
        /// Whether the handler holds a re-queue for the queue.
        fn queued(self, h: &NetFixture) -> bool {
            let dev = h.dev();
            match self {
                Requeue::Rx => dev.registered.rx_requeued,
                Requeue::Tx => dev.registered.tx_requeued,
            }
        }

        /// Runs `f` on the queue's re-queue eventfd.
        fn with_evt<T>(self, h: &NetFixture, f: impl FnOnce(&EventFd) -> T) -> T {
            let dev = h.dev();
            f(match self {
                Requeue::Rx => &dev.rx_requeue_evt,
                Requeue::Tx => &dev.tx_requeue_evt,
            })
        }

        /// The re-queue is held and its eventfd was written once and is
        /// still readable (the count is put back, so the loop comes back
        /// without another write).
        fn assert_pending_once(self, h: &NetFixture) {
            assert!(self.queued(h));
            let pending = self.with_evt(h, |e| e.read().unwrap());
            assert_eq!(pending, 1);
            self.with_evt(h, |e| e.write(pending).unwrap());
        }

        /// No re-queue is held and its eventfd has been read.
        fn assert_drained(self, h: &NetFixture) {
            assert!(!self.queued(h));
            assert!(self.with_evt(h, |e| e.read().is_err()));
        }

        /// A reset in the middle of yielding passes (a re-queue held)
        /// forgets the re-queue: after the reset's own event the loop
        /// goes idle with none held.
        fn assert_reset_forgets(self, h: &mut NetFixture) {
            assert!(self.queued(h));
            h.dev().reset();
            self.assert_drained(h);
            h.run_until_idle();
            assert!(!self.queued(h));
        }
    }

    #[test]
    fn test_tx_requeue_stays_readable_while_passes_yield() {
        let mut h = fixture_with(|c| c.tx_weight_packets = 4);
        let frames: Vec<Vec<u8>> = (0..20).map(|i| frame(12 + 64, i)).collect();
        for f in &frames {
            h.post_tx(f, &[]);
        }
        h.kick_tx();
        h.run_once(0);
        h.run_once(0);
        // Two passes yielded: the re-queue eventfd was written once and is
        // still readable, so the loop comes back without another write.
        assert_eq!(h.metric(|m| &m.tx_weight_hits), 2);
        Requeue::Tx.assert_pending_once(&h);
        // Once a pass ends otherwise, it is read: the loop goes idle.
        h.run_until_idle();
        assert_eq!(h.peer_frames(), frames);
        assert_eq!(h.metric(|m| &m.tx_weight_hits), 4);
        Requeue::Tx.assert_drained(&h);

        // A reset in the middle of yielding passes forgets the re-queue.
        for f in &frames {
            h.post_tx(f, &[]);
        }
        h.kick_tx();
        h.run_once(0);
        Requeue::Tx.assert_reset_forgets(&mut h);
    }

    #[test]
    fn test_rx_requeue_stays_readable_while_passes_yield() {
        let mut h = fixture_with(|c| c.rx_weight_packets = 4);
        let bufs = h.post_rx(&[1526; 40]);
        h.kick_rx();
        let frames: Vec<Vec<u8>> = (0..18).map(|i| frame(12 + 64, i)).collect();
        for f in &frames {
            h.peer.send(f).unwrap();
        }
        // The backend event's pass, then one from the re-queue eventfd:
        // both yielded, and the eventfd was written once and is still
        // readable, so the loop comes back without another write.
        h.run_once(0);
        h.run_once(0);
        assert_eq!(h.metric(|m| &m.rx_weight_hits), 2);
        assert_eq!(h.metric(|m| &m.rx_frames), 8);
        Requeue::Rx.assert_pending_once(&h);
        // Once a pass ends otherwise (drained), it is read: the loop goes
        // idle, every frame delivered in order.
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 18);
        assert_eq!(h.metric(|m| &m.rx_weight_hits), 4);
        Requeue::Rx.assert_drained(&h);
        let used = h.rxq.take_used(&h.mem);
        assert_eq!(used.len(), 18);
        for (k, &(head, len)) in used.iter().enumerate() {
            assert_eq!((head, len), (u32::from(bufs[k].0), 12 + 64));
            assert_eq!(h.read(bufs[k].1 + 12, 64), frames[k][12..]);
        }

        // A reset in the middle of yielding passes forgets the re-queue.
        for f in &frames {
            h.peer.send(f).unwrap();
        }
        h.run_once(0);
        Requeue::Rx.assert_reset_forgets(&mut h);
    }

    #[test]
    fn test_rx_starvation_and_resume() {
        let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES);
        let f = frame(12 + 1514, 1);
        h.peer.send(&f).unwrap();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_no_avail_buffer), 1);
        assert_eq!(h.metric(|m| &m.rx_frames), 0);
        // Reading stopped: the level-triggered backend fd is out of the
        // epoll set, so the loop sleeps instead of spinning.
        assert_eq!(h.dev().registered.backend, None);
        let passes = h.metric(|m| &m.rx_passes);
        assert_eq!(h.run_once(150), 0);
        assert_eq!(h.metric(|m| &m.rx_passes), passes);
        // The metrics file written now already shows the ongoing starvation.
        let ongoing = h.metrics.to_json()["rx_starved_ns"].as_u64().unwrap();
        assert!(ongoing >= 150_000_000, "ongoing starvation {ongoing} ns");

        let bufs = h.post_rx(&[1526]);
        h.kick_rx();
        h.run_until_idle();
        assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(bufs[0].0), 1526)]);
        assert_eq!(h.read(bufs[0].1 + 12, 1514), f[12..]);
        let starved = h.metrics.rx_starved_ns.ended_ns();
        assert!(starved >= 150_000_000, "starved only {starved} ns");
        assert_eq!(h.dev().registered.backend, Some(EventSet::IN));
    }

    #[test]
    fn test_rx_notify_without_starvation_reads_nothing_extra() {
        let mut h = with_rx_buffers(4);
        h.run_until_idle();
        // No frame was waiting: the notify alone does not start a pass.
        assert_eq!(h.metric(|m| &m.rx_passes), 0);
        assert_eq!(h.metric(|m| &m.rx_no_avail_buffer), 0);
    }

    #[test]
    fn test_rx_kicks_suppressed_while_buffers_cached() {
        let mut h = with_rx_buffers(2);
        h.peer.send(&frame(100, 1)).unwrap();
        h.run_until_idle();
        // One buffer left in the cache: no kicks wanted (VRING_USED_F_NO_NOTIFY).
        assert_eq!(h.rxq.used_flags(&h.mem).unwrap(), 1);
        h.peer.send(&frame(100, 2)).unwrap();
        h.peer.send(&frame(100, 3)).unwrap();
        h.run_until_idle();
        // Out of buffers: kicks wanted again.
        assert_eq!(h.rxq.used_flags(&h.mem).unwrap(), 0);
        assert_eq!(h.metric(|m| &m.rx_frames), 2);
    }

    #[test]
    fn test_event_idx_interrupt_suppression() {
        let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES | EVENT_IDX);
        // The driver wants an interrupt only once used idx moves past 2.
        h.txq.set_used_event(&h.mem, 2).unwrap();
        h.post_tx(&frame(100, 1), &[]);
        h.post_tx(&frame(100, 2), &[]);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.peer_frames().len(), 2);
        assert_eq!(h.irq.count(), 0);
        assert_eq!(h.metric(|m| &m.interrupts_suppressed), 1);
        h.post_tx(&frame(100, 3), &[]);
        h.post_tx(&frame(100, 4), &[]);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.irq.count(), 1);
        // Kick suppression: the device asks to be kicked at the next entry.
        assert_eq!(h.txq.avail_event(&h.mem).unwrap(), 4);
    }

    #[test]
    fn test_event_idx_rx_requests_kick_when_starved() {
        let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES | EVENT_IDX);
        h.rxq.set_used_event(&h.mem, 0).unwrap();
        h.post_rx(&[1526]);
        h.kick_rx();
        h.peer.send(&frame(100, 1)).unwrap();
        h.peer.send(&frame(100, 2)).unwrap();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
        assert_eq!(h.irq.count(), 1);
        // Starved after one buffer: kick me when avail reaches 1.
        assert_eq!(h.rxq.avail_event(&h.mem).unwrap(), 1);
        assert_eq!(h.metric(|m| &m.rx_no_avail_buffer), 1);
    }

    #[test]
    fn test_reset_and_reactivate() {
        let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES);
        h.post_tx(&frame(100, 1), &[]);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.peer_frames().len(), 1);

        h.dev().reset();
        h.run_until_idle();
        assert!(!h.dev().registered.queues);
        assert_eq!(h.dev().registered.backend, None);
        assert_eq!(
            h.metrics.features_negotiated.load(Ordering::Relaxed),
            MRG_FEATURES
        );
        // A frame from the peer is not read while the device is reset.
        h.peer.send(&frame(100, 2)).unwrap();
        assert_eq!(h.run_once(50), 0);

        // The driver sets the rings up again from scratch.
        h.rxq = DriverQueue::packed(&h.mem, GuestAddress(0x10000), 256);
        h.txq = DriverQueue::packed(&h.mem, GuestAddress(0x80000), 256);
        h.activate(BASE_FEATURES);
        assert_eq!(
            h.metrics.features_negotiated.load(Ordering::Relaxed),
            BASE_FEATURES
        );
        let bufs = h.post_rx(&[1526]);
        h.kick_rx();
        h.post_tx(&frame(200, 3), &[]);
        h.kick_tx();
        h.run_until_idle();
        // The frame that waited in the backend during the reset arrives now.
        assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(bufs[0].0), 100)]);
        assert_eq!(h.peer_frames(), vec![frame(200, 3)]);
    }

    #[test]
    fn test_activation_before_registration() {
        let NetFixture {
            rig:
                DirectRig {
                    mem,
                    dev: net,
                    evmgr,
                    irq,
                    ..
                },
            peer,
            ..
        } = NetFixture::new_inactive(NetConfig::default());
        // Forget the harness' event manager: a second one will pick the
        // device up already activated.
        drop(evmgr);
        let rxq = DriverQueue::packed(&mem, GuestAddress(0x10000), 256);
        let mut txq = DriverQueue::packed(&mem, GuestAddress(0x80000), 256);
        let a = 0x100000u64;
        vm_memory::Bytes::write_slice(&mem, &frame(100, 7), GuestAddress(a)).unwrap();
        txq.post_chain(&mem, &[(a, 100, 0)]).unwrap();
        net.lock()
            .unwrap()
            .activate(
                MRG_FEATURES,
                rx_tx_queues(&mem, &rxq, &txq, MRG_FEATURES),
                irq,
            )
            .unwrap();
        let mut em = EventManager::new().unwrap();
        em.add_subscriber(net);
        while em.run_with_timeout(0).unwrap() > 0 {}
        let mut buf = [0u8; 200];
        assert_eq!(peer.recv(&mut buf).unwrap(), 100);
        assert_eq!(buf[..100], frame(100, 7)[..]);
    }

    #[test]
    fn test_tx_blocked_arms_epollout_only_while_blocked() {
        let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES);
        assert_eq!(h.dev().registered.backend, Some(EventSet::IN));
        h.dev().backend().set_send_buffer(40000).unwrap();
        for i in 0..6 {
            h.post_tx(&frame(12 + 30000, i), &[]);
        }
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(
            h.dev().registered.backend,
            Some(EventSet::IN | EventSet::OUT)
        );
        // A kick while blocked does not retry (it would only hit EAGAIN).
        let eagain = h.metric(|m| &m.tap_eagain);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.tap_eagain), eagain);
        let mut n = 0;
        for _ in 0..100 {
            n += h.peer_frames().len();
            h.run_until_idle();
            if n == 6 {
                break;
            }
        }
        assert_eq!(n, 6);
        assert_eq!(h.dev().registered.backend, Some(EventSet::IN));
    }

    #[test]
    fn test_backend_hangup_stops_polling() {
        let mut h = with_rx_buffers(4);
        h.peer.send(&frame(100, 1)).unwrap();
        let NetFixture { peer, .. } = &mut h;
        // Replace the peer by closing it: swap in a fresh pair's end.
        let (fresh, _other) = super::super::tap::SeqPacket::pair().unwrap();
        drop(std::mem::replace(peer, fresh));
        // A test forking `ip` in parallel may hold a copy of the peer fd
        // until its child execs (CLOEXEC), delaying the hangup a little.
        for _ in 0..100 {
            h.run_until_idle();
            if h.dev().registered.backend_hup {
                break;
            }
            h.run_once(10);
        }
        // The frame sent before the close was delivered, then EOF stopped
        // the polling: no busy loop on the level-triggered HUP.
        assert_eq!(h.metric(|m| &m.rx_frames), 1);
        assert!(h.dev().registered.backend_hup, "{}", h.metrics.to_json());
        assert_eq!(h.dev().registered.backend, None);
        assert_eq!(h.run_once(50), 0);
    }
}

/// Throughput smoke figures over a socket pair (the backend costs a unix
/// socket copy, not a TAP). Not run by default:
/// `cargo test --release -p devices --lib perf_ -- --ignored --nocapture`.
#[cfg(test)]
mod perf {
    use std::time::Instant;

    use super::super::tests::fixture::*;
    use super::super::NetConfig;

    const N: usize = 200_000;

    /// A device on the zero-copy path, or on the bounce buffer it is
    /// measured against.
    fn fixture(bounce: bool) -> NetFixture {
        NetFixture::new(
            NetConfig {
                bounce_buffer: bounce,
                ..NetConfig::default()
            },
            MRG_FEATURES,
        )
    }

    fn rx(bounce: bool, len: usize) -> f64 {
        let mut h = fixture(bounce);
        let base = 0x100000u64;
        let post = |h: &mut NetFixture, n: usize| {
            for _ in 0..n {
                let a = base + u64::from(h.rxq.next_desc()) * 2048;
                h.rxq
                    .post_chain(&h.mem, &[(a, 1526, VIRTQ_DESC_F_WRITE)])
                    .unwrap();
            }
        };
        post(&mut h, 256);
        h.kick_rx();
        let peer = h.peer.try_clone().unwrap();
        let f = frame(len, 1);
        let sender = std::thread::spawn(move || {
            peer.set_nonblocking(false).unwrap();
            for _ in 0..N {
                peer.send(&f).unwrap();
            }
        });
        let t = Instant::now();
        let mut got = 0;
        while got < N {
            h.run_once(100);
            let used = h.rxq.take_used(&h.mem).len();
            got += used;
            post(&mut h, used);
            h.kick_rx();
        }
        let secs = t.elapsed().as_secs_f64();
        sender.join().unwrap();
        assert_eq!(h.metric(|m| &m.rx_frames), N as u64);
        N as f64 / secs
    }

    fn tx(bounce: bool, len: usize) -> f64 {
        let mut h = fixture(bounce);
        let base = 0x100000u64;
        let f = frame(len, 2);
        for i in 0..256u64 {
            vm_memory::Bytes::write_slice(&h.mem, &f, vm_memory::GuestAddress(base + i * 2048))
                .unwrap();
        }
        let peer = h.peer.try_clone().unwrap();
        let receiver = std::thread::spawn(move || {
            peer.set_nonblocking(false).unwrap();
            let mut buf = vec![0u8; 2048];
            for _ in 0..N {
                peer.recv(&mut buf).unwrap();
            }
        });
        let t = Instant::now();
        let mut posted = 0;
        let mut done = 0;
        let mut outstanding = 0;
        while done < N {
            while outstanding < 256 && posted < N {
                let a = base + u64::from(h.txq.next_desc()) * 2048;
                h.txq.post_chain(&h.mem, &[(a, len as u32, 0)]).unwrap();
                posted += 1;
                outstanding += 1;
            }
            h.kick_tx();
            h.run_once(100);
            let used = h.txq.take_used(&h.mem).len();
            done += used;
            outstanding -= used;
        }
        let secs = t.elapsed().as_secs_f64();
        receiver.join().unwrap();
        assert_eq!(h.metric(|m| &m.tx_frames), N as u64);
        N as f64 / secs
    }

    #[test]
    #[ignore]
    fn perf_socketpair_datapath() {
        for len in [12 + 64, 12 + 1514] {
            println!(
                "{len:5} B  RX zero-copy {:8.0} fps  bounce {:8.0} fps | TX zero-copy {:8.0} fps  bounce {:8.0} fps",
                rx(false, len),
                rx(true, len),
                tx(false, len),
                tx(true, len)
            );
        }
    }
}
