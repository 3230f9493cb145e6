// SPDX-License-Identifier: Apache-2.0
//! Event-loop pieces every virtio device here uses, whatever its queues:
//! counters updated from the datapath, the interrupt a pass raises (or the
//! driver suppressed), the state of one activation ([`Activation`]),
//! eventfd reads and writes whose failures count as host errors, epoll
//! registration results, and the registration of a rate limiter's timer
//! while (and only while) the limiter waits for it.
//!
//! A host error is never fatal to a device: it is counted in the device's
//! `host_errors`, logged under the device's name (`virtio-net`,
//! `virtio-blk`), and the device goes on.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use event_manager::{EventOps, EventSet, Events};
use vmm_sys_util::eventfd::EventFd;

use crate::rate_limiter::RateLimiter;
use crate::virtio::queue::Notify;
use crate::virtio::time_counter::TimeCounter;
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

/// Every device's first event token: its internal `activate_evt`, written
/// on activation and reset ([`HostErrors::kick_event_loop`]) and registered
/// for the device's whole life ([`HostErrors::add_activate_evt`]).
pub(crate) const PROCESS_ACTIVATE: u32 = 0;

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Increments a counter and returns its new value.
pub(crate) fn inc(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed) + 1
}

/// Acts on what the driver asked for after a batch of used entries: raises
/// the used-queue interrupt it wants, counted in `interrupts`, or counts the
/// one it suppressed in `suppressed`.
#[inline]
pub(crate) fn notify_driver(
    notify: Notify,
    irq: &dyn Interrupt,
    interrupts: &AtomicU64,
    suppressed: &AtomicU64,
) {
    match notify {
        Notify::Nothing => {}
        Notify::Interrupt => {
            inc(interrupts);
            irq.signal_used_queue();
        }
        Notify::Suppressed => {
            inc(suppressed);
        }
    }
}

/// A driver wrote to a read-only configuration space: counted in
/// `counter` and logged (rate-limited), and otherwise ignored.
pub(crate) fn ignored_config_write(counter: &AtomicU64, device: &str, offset: u64, len: usize) {
    let n = inc(counter);
    warn_rate_limited!(
        count = n,
        "{device}: ignored {len}-byte config write at {offset:#x}"
    );
}

/// Whether a direction or queue waits for its rate limiter's timer.
pub(crate) fn throttled(limiter: &Option<RateLimiter>) -> bool {
    limiter.as_ref().is_some_and(RateLimiter::is_blocked)
}

/// A limiter's timer fired: the work it held back fits now. Unblocks the
/// limiter and ends the period counted in `throttled_ns`; the caller runs
/// the pass that was held back.
pub(crate) fn timer_fired(limiter: &mut Option<RateLimiter>, throttled_ns: &TimeCounter) {
    if let Some(l) = limiter.as_mut() {
        l.on_timer();
    }
    throttled_ns.stop();
}

/// Throws away the notifications an eventfd holds: at a reset, kicks that
/// were pending belong to the old queues.
pub(crate) fn discard_pending<'a>(evts: impl IntoIterator<Item = &'a EventFd>) {
    for evt in evts {
        let _ = evt.read();
    }
}

/// What a device holds for one activation besides its queues, the same for
/// every device: activation and reset happen on a vCPU thread, and the
/// event handler takes an activation up later, on its own thread.
pub(crate) struct Activation {
    /// The transport's interrupt for this activation.
    pub(crate) interrupt: Arc<dyn Interrupt>,
    /// The event handler has seen this activation (registered the fds and
    /// run the first passes).
    pub(crate) started: bool,
    /// The transport was told that a queue broke (once per activation).
    error_signalled: bool,
}

impl Activation {
    /// An activation the event handler has not seen yet.
    pub(crate) fn new(interrupt: Arc<dyn Interrupt>) -> Self {
        Activation {
            interrupt,
            started: false,
            error_signalled: false,
        }
    }

    /// The event handler takes the activation up: true the first time, when
    /// the caller runs the passes for work posted before DRIVER_OK, which
    /// has no kick of its own.
    pub(crate) fn start(&mut self) -> bool {
        !std::mem::replace(&mut self.started, true)
    }

    /// A queue became unusable: tells the driver once that the device needs
    /// a reset, instead of leaving it waiting on a ring that will never move.
    pub(crate) fn device_error(&mut self) {
        if !self.error_signalled {
            self.error_signalled = true;
            self.interrupt.signal_device_error();
        }
    }
}

/// A device's event handler as the start-up and the dispatch every device
/// shares ([`init`], [`process`]) see it: each device's
/// `MutEventSubscriber` is those two calls, and the device says only what
/// is its own.
pub(crate) trait EventHandler {
    /// Where its host errors go, its `activate_evt` and its current
    /// activation, if any (borrowed together: they are apart in the device).
    fn activation_parts(&mut self) -> (HostErrors<'_>, &EventFd, Option<&mut Activation>);
    /// Runs the passes for work posted before DRIVER_OK, which has no kick
    /// of its own, when the handler first takes an activation up.
    fn first_passes(&mut self);
    /// Registers what the device polls for its whole life besides
    /// `activate_evt` (the block device's io_uring); nothing by default.
    fn add_fixed(&mut self, _ops: &mut EventOps) {}
    /// Handles an event with one of the device's own tokens; false for a
    /// token it never registered.
    fn handle(&mut self, token: u32, set: EventSet) -> bool;
    /// Brings the epoll registrations in line with the device state (after
    /// every event).
    fn sync_registrations(&mut self, ops: &mut EventOps);
}

/// `MutEventSubscriber::init` of every device: `activate_evt` and the
/// device's fixed descriptors registered, and an activation that happened
/// before the device joined the loop taken up.
pub(crate) fn init(dev: &mut impl EventHandler, ops: &mut EventOps) {
    let (errors, activate_evt, activation) = dev.activation_parts();
    errors.add_activate_evt(ops, activate_evt);
    let activated = activation.is_some();
    dev.add_fixed(ops);
    if activated {
        activation_event(dev);
        dev.sync_registrations(ops);
    }
}

/// `MutEventSubscriber::process` of every device: the activation event
/// here, the device's own tokens in [`EventHandler::handle`], an unknown
/// token counted as a host error, and the registrations brought in line.
pub(crate) fn process(dev: &mut impl EventHandler, events: Events, ops: &mut EventOps) {
    match events.data() {
        PROCESS_ACTIVATE => activation_event(dev),
        token => {
            if !dev.handle(token, events.event_set()) {
                dev.activation_parts().0.unknown_token(token);
            }
        }
    }
    dev.sync_registrations(ops);
}

/// `activate_evt` fired: an activation or a reset happened (see
/// [`HostErrors::activation_event`]).
fn activation_event(dev: &mut impl EventHandler) {
    let (errors, activate_evt, activation) = dev.activation_parts();
    if errors.activation_event(activate_evt, activation) {
        dev.first_passes();
    }
}

/// Where a device's host errors go: its counter and its name in log lines.
#[derive(Clone, Copy)]
pub(crate) struct HostErrors<'a> {
    pub(crate) counter: &'a AtomicU64,
    pub(crate) device: &'static str,
}

impl<'a> HostErrors<'a> {
    /// Host errors counted in `counter` and logged as `device`.
    pub(crate) fn new(counter: &'a AtomicU64, device: &'static str) -> Self {
        HostErrors { counter, device }
    }

    /// Reads an eventfd down to zero; an empty one is not an error.
    pub(crate) fn drain(self, evt: &EventFd, what: &str) {
        match evt.read() {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                inc(self.counter);
                log::error!("{}: cannot read the {what} eventfd: {e}", self.device);
            }
        }
    }

    /// Makes an eventfd readable.
    pub(crate) fn signal(self, evt: &EventFd, what: &str) {
        if let Err(e) = evt.write(1) {
            inc(self.counter);
            log::error!("{}: cannot write the {what} eventfd: {e}", self.device);
        }
    }

    /// Makes an eventfd readable unless `signalled` says it still is: epoll
    /// is level-triggered, so an eventfd left readable brings the loop back
    /// without another write.
    pub(crate) fn signal_once(self, evt: &EventFd, signalled: &mut bool, what: &str) {
        if !*signalled {
            *signalled = true;
            self.signal(evt, what);
        }
    }

    /// Reads an eventfd [`signal_once`](Self::signal_once) wrote, so the
    /// loop sleeps until it is signalled again.
    pub(crate) fn drain_signalled(self, evt: &EventFd, signalled: &mut bool, what: &str) {
        self.drain(evt, what);
        *signalled = false;
    }

    /// Wakes the device's event handler through its activation eventfd:
    /// activation and reset happen on a vCPU thread, the registrations they
    /// call for on the event loop's.
    pub(crate) fn kick_event_loop(self, activate_evt: &EventFd) {
        if let Err(e) = activate_evt.write(1) {
            inc(self.counter);
            log::error!("{}: cannot signal the event loop: {e}", self.device);
        }
    }

    /// Registers the device's `activate_evt` with [`PROCESS_ACTIVATE`], from
    /// `init`: every other registration follows the state it announces.
    pub(crate) fn add_activate_evt(self, ops: &mut EventOps, activate_evt: &EventFd) {
        self.add_readable(
            ops,
            activate_evt,
            PROCESS_ACTIVATE,
            "the activation eventfd",
        );
    }

    /// `activate_evt` fired (an activation or a reset happened): reads it
    /// and takes `activation`, the device's current one if any, up. True the
    /// first time ([`Activation::start`]), when the caller runs the passes for
    /// work posted before DRIVER_OK, which has no kick of its own; a reset
    /// needs only the registration update that follows every event.
    pub(crate) fn activation_event(
        self,
        activate_evt: &EventFd,
        activation: Option<&mut Activation>,
    ) -> bool {
        self.drain(activate_evt, "activate");
        activation.is_some_and(Activation::start)
    }

    /// Registers `fd` for reading with `token` (what it is in log lines).
    pub(crate) fn add_readable(
        self,
        ops: &mut EventOps,
        fd: &impl AsRawFd,
        token: u32,
        what: &str,
    ) {
        self.ctl_result(ops.add(Events::with_data(fd, token, EventSet::IN)), what);
    }

    /// Registers the queue (and re-queue) eventfds of `fds`, each with its
    /// token, while `want`, and removes them otherwise; `registered` says
    /// whether they are, and only a change is made.
    pub(crate) fn sync_queue_eventfds(
        self,
        ops: &mut EventOps,
        fds: &[(&EventFd, u32)],
        want: bool,
        registered: &mut bool,
    ) {
        self.sync_eventfds(ops, fds, EventSet::IN, want, registered);
    }

    /// [`sync_queue_eventfds`](Self::sync_queue_eventfds) with the poll
    /// set `set` (`IN | EDGE_TRIGGERED` for kicks a device never reads).
    pub(crate) fn sync_eventfds(
        self,
        ops: &mut EventOps,
        fds: &[(&EventFd, u32)],
        set: EventSet,
        want: bool,
        registered: &mut bool,
    ) {
        if want == *registered {
            return;
        }
        for &(evt, token) in fds {
            let res = if want {
                ops.add(Events::with_data(evt, token, set))
            } else {
                ops.remove(Events::empty(evt))
            };
            self.ctl_result(res, "a queue eventfd");
        }
        *registered = want;
    }

    /// An event carried a token the device never registered.
    pub(crate) fn unknown_token(self, token: u32) {
        inc(self.counter);
        log::error!("{}: event with unknown token {token}", self.device);
    }

    /// Counts and logs a failed epoll registration change.
    pub(crate) fn ctl_result(self, res: event_manager::Result<()>, what: &str) {
        if let Err(e) = res {
            inc(self.counter);
            log::error!(
                "{}: cannot update epoll registration of {what}: {e}",
                self.device
            );
        }
    }

    /// Registers a limiter's timerfd while the limiter is blocked, and only
    /// then (`registered` says whether it is). A timer that cannot be
    /// registered would never end the wait, so the limiter gives the wait up
    /// (a host error) and this returns true: the caller re-queues its pass
    /// to retry the frame or request. An epoll failure may cost retries
    /// until the work fits, never a queue stopped for good.
    pub(crate) fn sync_timer(
        self,
        ops: &mut EventOps,
        limiter: &mut Option<RateLimiter>,
        registered: &mut bool,
        token: u32,
        throttled_ns: &TimeCounter,
    ) -> bool {
        let Some(l) = limiter.as_mut() else {
            return false;
        };
        let want = l.is_blocked();
        if want == *registered {
            return false;
        }
        let res = if want {
            ops.add(Events::with_data(l, token, EventSet::IN))
        } else {
            ops.remove(Events::empty(l))
        };
        match res {
            Ok(()) => {
                *registered = want;
                false
            }
            Err(_) if !want => {
                self.ctl_result(res, "a rate limiter timer");
                // Still registered; a stray expiry is harmless.
                *registered = true;
                false
            }
            Err(_) => {
                self.ctl_result(res, "a rate limiter timer");
                l.on_timer();
                throttled_ns.stop();
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};

    use super::*;
    use crate::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
    use crate::virtio::test_utils::TestIrq;

    fn errors(counter: &AtomicU64) -> HostErrors<'_> {
        HostErrors::new(counter, "test")
    }

    #[test]
    fn an_event_with_an_unknown_token_is_a_host_error() {
        let c = AtomicU64::new(0);
        errors(&c).unknown_token(99);
        errors(&c).unknown_token(7);
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn draining_an_empty_eventfd_is_no_host_error() {
        let c = AtomicU64::new(0);
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        errors(&c).drain(&evt, "empty");
        errors(&c).signal(&evt, "the");
        errors(&c).signal(&evt, "the");
        errors(&c).drain(&evt, "signalled");
        assert_eq!(
            evt.read().unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "drained to zero"
        );
        assert_eq!(c.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn an_activation_event_is_read_and_takes_a_new_activation_up_once() {
        let c = AtomicU64::new(0);
        let evt = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let mut activation = Activation::new(Arc::new(TestIrq::default()));
        errors(&c).kick_event_loop(&evt);
        assert!(errors(&c).activation_event(&evt, Some(&mut activation)));
        assert!(activation.started);
        assert_eq!(
            evt.read().unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "the event was read"
        );
        // The same activation again, or none (a reset): no first passes.
        assert!(!errors(&c).activation_event(&evt, Some(&mut activation)));
        assert!(!errors(&c).activation_event(&evt, None));
        assert_eq!(c.load(Ordering::Relaxed), 0);
    }

    /// An "eventfd" over /dev/null opened one way only: reading or writing
    /// it the other way fails with EBADF, as no real eventfd does (a real
    /// one only ever answers EAGAIN, so no safe way makes one).
    #[allow(unsafe_code)]
    fn broken_eventfd(write_only: bool) -> EventFd {
        use std::os::fd::{FromRawFd, IntoRawFd};
        let f = std::fs::OpenOptions::new()
            .read(!write_only)
            .write(write_only)
            .open("/dev/null")
            .unwrap();
        // SAFETY: `into_raw_fd` hands over the only owner of a freshly
        // opened descriptor, which the EventFd now owns and closes.
        unsafe { EventFd::from_raw_fd(f.into_raw_fd()) }
    }

    #[test]
    fn an_eventfd_that_fails_is_a_host_error() {
        let c = AtomicU64::new(0);
        errors(&c).drain(&broken_eventfd(true), "broken");
        assert_eq!(c.load(Ordering::Relaxed), 1);
        errors(&c).signal(&broken_eventfd(false), "broken");
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_failed_registration_is_a_host_error() {
        let c = AtomicU64::new(0);
        errors(&c).ctl_result(Ok(()), "a fine one");
        errors(&c).ctl_result(Err(event_manager::Error::FdAlreadyRegistered), "one twice");
        assert_eq!(c.load(Ordering::Relaxed), 1);
    }

    /// Runs `sync_timer` from inside an event manager (the only place an
    /// `EventOps` exists) on a limiter whose registration the test lies
    /// about, so that epoll refuses the change.
    #[derive(Default)]
    struct TimerRig {
        results: Vec<(bool, bool, bool)>,
        errors: AtomicU64,
    }

    impl MutEventSubscriber for TimerRig {
        fn init(&mut self, ops: &mut EventOps) {
            let waited = TimeCounter::default();
            let cfg = RateLimiterConfig {
                bandwidth: Some(TokenBucketConfig {
                    size: 100,
                    one_time_burst: 0,
                    refill_time: 1000,
                }),
                ops: None,
            };
            let mut limiter = Some(RateLimiter::new(&cfg).unwrap());
            let e = errors(&self.errors);
            let mut step = |limiter: &mut Option<RateLimiter>, registered: &mut bool| {
                let retry = e.sync_timer(ops, limiter, registered, 7, &waited);
                let blocked = throttled(limiter);
                self.results.push((retry, *registered, blocked));
            };
            // Not blocked, said to be registered: the removal fails. It
            // stays registered (a stray expiry is harmless); no retry.
            let mut registered = true;
            step(&mut limiter, &mut registered);
            // Blocked, not registered: registered.
            let l = limiter.as_mut().unwrap();
            assert!(l.consume(100).unwrap());
            assert!(!l.consume(100).unwrap());
            registered = false;
            step(&mut limiter, &mut registered);
            // Blocked, said not to be registered although it is: the add
            // fails, so the wait is given up and the caller retries.
            registered = false;
            step(&mut limiter, &mut registered);
        }

        fn process(&mut self, _: Events, _: &mut EventOps) {}
    }

    #[test]
    fn a_timer_epoll_refuses_never_leaves_a_wait_nothing_ends() {
        let rig = Arc::new(Mutex::new(TimerRig::default()));
        let mut em = EventManager::<Arc<Mutex<TimerRig>>>::new().unwrap();
        em.add_subscriber(rig.clone());
        let rig = rig.lock().unwrap();
        assert_eq!(
            rig.results,
            [
                (false, true, false),
                (false, true, true),
                (true, false, false)
            ]
        );
        assert_eq!(rig.errors.load(Ordering::Relaxed), 2);
    }
}
