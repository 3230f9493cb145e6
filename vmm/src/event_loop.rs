// SPDX-License-Identifier: Apache-2.0
//! Running a built VM: vCPU threads plus one event loop on the main thread.
//!
//! The main thread runs an event-manager loop that serves every device
//! backend (virtio-net RX/TX), console input, the i8042 reset line, the
//! vCPUs' exit notifications and the stop signals. Whatever ends the VM is
//! recorded once in an [`ExitSink`]; the loop then restores the terminal,
//! writes the last metrics line and returns the reason, from which `main`
//! picks the process exit status. Metrics lines are also written on a
//! timerfd (every `--metrics-interval` seconds) and on SIGUSR1.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devices::legacy::i8042::I8042;
use devices::legacy::serial::SerialDevice;
use event_manager::{EventOps, Events as EpollEvents, MutEventSubscriber, SubscriberOps};
use kvm_ioctls::{Kvm, VmFd};
use log::{error, info, warn};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::device_manager::Events;
use crate::metrics::Metrics;
use crate::seccomp::{Filters, Gate, Thread};
use crate::signals::SignalFd;
use crate::terminal::RawTerminal;
use crate::vcpu::Vcpu;
use crate::vm_exit::{ExitSink, VmExit};

const EXIT_EVENT: u32 = 0;
const RESET_EVENT: u32 = 1;
const SIGNAL_EVENT: u32 = 2;
const STDIN_EVENT: u32 = 3;
const METRICS_EVENT: u32 = 4;

/// A built VM, ready to run.
pub struct Vmm {
    // Never read, only owned: the VM fd and guest memory must outlive the
    // vCPU threads, which run until the process exits.
    pub(crate) _kvm: Kvm,
    pub(crate) _vm: VmFd,
    pub(crate) _mem: vm_memory::GuestMemoryMmap<()>,
    pub(crate) devices: Arc<crate::device_manager::DeviceManager>,
    pub(crate) events: Events,
    pub(crate) exit: ExitSink,
    pub(crate) vcpus: Vec<Vcpu>,
    pub(crate) serial: Arc<Mutex<SerialDevice>>,
    pub(crate) i8042: Arc<Mutex<I8042>>,
    pub(crate) panicked: Arc<AtomicBool>,
    pub(crate) metrics: Option<Metrics>,
    pub(crate) metrics_interval_s: u64,
}

/// Serves the VM's control events on the main loop.
struct Control {
    exit: ExitSink,
    exit_evt: EventFd,
    reset_evt: EventFd,
    signals: SignalFd,
    serial: Arc<Mutex<SerialDevice>>,
    panicked: Arc<AtomicBool>,
    metrics: Option<Arc<Mutex<Metrics>>>,
    metrics_timer: Option<TimerFd>,
    stdin_open: bool,
}

/// Locks the metrics writer; a poisoned lock still holds usable counters.
fn lock_metrics(m: &Mutex<Metrics>) -> std::sync::MutexGuard<'_, Metrics> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Control {
    fn flush_metrics(&self) {
        if let Some(m) = &self.metrics {
            lock_metrics(m).flush();
        }
    }

    fn on_signal(&mut self) {
        loop {
            match self.signals.read() {
                Ok(Some(libc::SIGUSR1)) => self.flush_metrics(),
                Ok(Some(sig)) => self.exit.report(VmExit::Signal(sig)),
                Ok(None) => break,
                Err(e) => {
                    error!("cannot read signalfd: {e}");
                    break;
                }
            }
        }
    }

    fn on_stdin(&mut self, ops: &mut EventOps) {
        let mut buf = [0u8; 64];
        match io::stdin().lock().read(&mut buf) {
            Ok(0) => self.close_stdin(ops),
            Ok(n) => {
                let mut serial = self.serial.lock().unwrap_or_else(|p| p.into_inner());
                if let Err(e) = serial.enqueue_input(&buf[..n]) {
                    warn!("console input dropped: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                warn!("console input closed: {e}");
                self.close_stdin(ops);
            }
        }
    }

    fn close_stdin(&mut self, ops: &mut EventOps) {
        if self.stdin_open {
            self.stdin_open = false;
            let _ = ops.remove(EpollEvents::new_raw(io::stdin().as_raw_fd(), EventSet::IN));
        }
    }
}

impl MutEventSubscriber for Control {
    fn process(&mut self, events: EpollEvents, ops: &mut EventOps) {
        match events.data() {
            EXIT_EVENT => {
                let _ = self.exit_evt.read();
            }
            RESET_EVENT => {
                let _ = self.reset_evt.read();
                let reason = if self.panicked.load(Ordering::SeqCst) {
                    VmExit::PanicReset
                } else {
                    VmExit::Reset
                };
                self.exit.report(reason);
            }
            SIGNAL_EVENT => self.on_signal(),
            METRICS_EVENT => {
                if let Some(t) = &mut self.metrics_timer {
                    // Readable, so the read returns the expiry count at once.
                    let _ = t.wait();
                }
                self.flush_metrics();
            }
            STDIN_EVENT => {
                if events.event_set().contains(EventSet::IN) {
                    self.on_stdin(ops);
                } else {
                    // HUP/ERR without data: nothing more will come.
                    self.close_stdin(ops);
                }
            }
            other => warn!("unexpected control event {other}"),
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let regs = [
            (self.exit_evt.as_raw_fd(), EXIT_EVENT),
            (self.reset_evt.as_raw_fd(), RESET_EVENT),
            (self.signals.as_raw_fd(), SIGNAL_EVENT),
        ];
        let timer = self
            .metrics_timer
            .as_ref()
            .map(|t| (t.as_raw_fd(), METRICS_EVENT));
        for (fd, data) in regs.into_iter().chain(timer) {
            if let Err(e) = ops.add(EpollEvents::with_data_raw(fd, data, EventSet::IN)) {
                error!("cannot register control event {data}: {e}");
            }
        }
        // stdin may be /dev/null or a file, which epoll refuses: then the
        // guest simply gets no console input.
        let stdin = io::stdin().as_raw_fd();
        self.stdin_open = ops
            .add(EpollEvents::with_data_raw(stdin, STDIN_EVENT, EventSet::IN))
            .is_ok();
    }
}

impl Vmm {
    /// Runs the VM until it ends and returns why. `start` is when the
    /// process started, for the boot-time report. Every thread runs under
    /// its seccomp filter from `filters` before the guest starts.
    pub fn run(mut self, start: Instant, filters: Filters) -> io::Result<VmExit> {
        // Block the stop signals before any thread exists so every thread
        // inherits the mask and only the signalfd sees them.
        let signals = SignalFd::new(&[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1])?;
        let reset_evt = self
            .i8042
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .reset_evt()
            .try_clone()?;
        let metrics = self.metrics.take().map(|mut m| {
            m.attach(
                self.devices.vcpu_exits(),
                self.devices.net_metrics().to_vec(),
                start,
            );
            Arc::new(Mutex::new(m))
        });
        let metrics_timer = match (&metrics, self.metrics_interval_s) {
            (Some(_), secs) if secs > 0 => {
                let mut t = TimerFd::new().map_err(io::Error::from)?;
                let every = Duration::from_secs(secs);
                t.reset(every, Some(every)).map_err(io::Error::from)?;
                Some(t)
            }
            _ => None,
        };
        let control = Control {
            exit: self.exit.clone(),
            exit_evt: self.exit.evt().try_clone()?,
            reset_evt,
            signals,
            serial: self.serial.clone(),
            panicked: self.panicked.clone(),
            metrics: metrics.clone(),
            metrics_timer,
            stdin_open: false,
        };
        self.events.add_subscriber(Arc::new(Mutex::new(control)));
        let terminal = RawTerminal::new();

        // No vCPU enters the guest before every thread is filtered. A failed
        // spawn returns from here and ends the process, and with it the
        // threads waiting at the gate.
        let gate = Arc::new(Gate::new(self.vcpus.len() + 1));
        for vcpu in self.vcpus.drain(..) {
            let sink = self.exit.clone();
            let first = vcpu.id() == 0;
            let gate = gate.clone();
            let filter = filters.vcpu.clone();
            std::thread::Builder::new()
                .name(format!("vcpu{}", vcpu.id()))
                .spawn(move || {
                    // The thread's first act: nothing of the guest runs unfiltered.
                    if let Err(e) = gate.install_and_wait(Thread::Vcpu, filter.as_ref()) {
                        sink.report(VmExit::Fault(format!("vCPU {}: {e}", vcpu.id())));
                        return;
                    }
                    if first {
                        info!(
                            "boot: {} ms from start to first vCPU entry",
                            start.elapsed().as_millis()
                        );
                    }
                    vcpu.run(sink)
                })?;
        }
        // After the spawns, so the vCPU threads do not inherit this list.
        gate.install_and_wait(Thread::EventLoop, filters.event_loop.as_ref())
            .map_err(io::Error::other)?;

        while self.exit.reason().is_none() {
            if let Err(e) = self.events.run() {
                self.exit
                    .report(VmExit::Fault(format!("event loop failed: {e}")));
            }
        }
        drop(terminal);
        if let Some(m) = &metrics {
            lock_metrics(m).finish();
        }
        let reason = self
            .exit
            .reason()
            .expect("the loop ends only once a reason is recorded");
        info!("run time: {} ms", start.elapsed().as_millis());
        Ok(reason)
    }
}
