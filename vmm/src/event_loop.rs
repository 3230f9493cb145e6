// SPDX-License-Identifier: Apache-2.0
//! The VM's control events, served on the main thread's event loop.
//!
//! Beside every device backend (virtio-net RX/TX), the event manager of the
//! main thread serves [`Control`]: console input, the i8042 reset line, the
//! vCPUs' exit notifications, the stop signals and the metrics timer.
//! Whatever ends the VM is recorded once in an [`ExitLatch`], which
//! [`crate::vmm::Vmm::run`] waits for. Metrics lines are written on the
//! timerfd (every `--metrics-interval` seconds) and on SIGUSR1.

use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use devices::legacy::serial::SerialDevice;
use event_manager::{EventOps, Events as EpollEvents, MutEventSubscriber};
use log::{error, warn};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::api::runtime::Runtime;
use crate::api::ApiChannel;
use crate::kvm::vm_exit::{ExitLatch, VmExit};
use crate::metrics::{lock_metrics, Metrics};
use crate::process::signals::SignalFd;

/// The log target of this module's lines and of [`crate::vmm::Vmm::run`]'s
/// ("boot: N ms from start to first vCPU entry", "run time: N ms"), so that
/// a `module` filter or a log reader finds the running VM's lines under one
/// name.
pub const LOG_TARGET: &str = module_path!();

const EXIT_EVENT: u32 = 0;
const RESET_EVENT: u32 = 1;
const SIGNAL_EVENT: u32 = 2;
const STDIN_EVENT: u32 = 3;
const METRICS_EVENT: u32 = 4;
const API_EVENT: u32 = 5;

/// What [`Control`] serves, as the VM hands it over: named fields, so that
/// the two `EventFd`s and the two options cannot be swapped by position.
pub struct ControlSources {
    /// Records what ends the VM; its wake-up `EventFd` is served.
    pub exit: ExitLatch,
    /// The i8042's reset line.
    pub reset_evt: EventFd,
    /// The stop signals and SIGUSR1.
    pub signals: SignalFd,
    /// Where console input goes.
    pub serial: Arc<Mutex<SerialDevice>>,
    /// Tells a reset after a guest kernel panic from a plain one: set by
    /// the guest kernel's report through the pvpanic register only.
    pub panicked: Arc<AtomicBool>,
    /// Flushed on `metrics_timer` and SIGUSR1.
    pub metrics: Option<Arc<Mutex<Metrics>>>,
    /// The `--metrics-interval` timer.
    pub metrics_timer: Option<TimerFd>,
}

/// Serves the VM's control events on the main loop.
pub struct Control {
    src: ControlSources,
    exit_evt: EventFd,
    stdin_open: bool,
    api: Option<(ApiChannel, Runtime)>,
}

impl Control {
    /// Serves every one of `src`; console input only where stdin can be
    /// polled.
    pub fn new(src: ControlSources) -> io::Result<Control> {
        Ok(Control {
            exit_evt: src.exit.evt().try_clone()?,
            src,
            stdin_open: false,
            api: None,
        })
    }

    /// Also serves the API's requests from `channel` with `runtime`.
    pub fn with_api(mut self, channel: ApiChannel, runtime: Runtime) -> Self {
        self.api = Some((channel, runtime));
        self
    }

    /// Answers every request the API thread has sent. One the API thread
    /// gave up on (and told its client so) is dropped unapplied.
    fn on_api(&mut self) {
        let Some((channel, runtime)) = &mut self.api else {
            return;
        };
        let _ = channel.wake.read();
        while let Ok(cmd) = channel.commands.try_recv() {
            if let Some(c) = cmd.claim() {
                c.reply.send(runtime.serve(c.request, c.image));
            }
        }
    }

    fn flush_metrics(&self) {
        if let Some(m) = &self.src.metrics {
            lock_metrics(m).flush();
        }
    }

    fn on_signal(&mut self) {
        loop {
            match self.src.signals.read() {
                Ok(Some(libc::SIGUSR1)) => self.flush_metrics(),
                Ok(Some(sig)) => self.src.exit.report(VmExit::Signal(sig)),
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
                let mut serial = self.src.serial.lock().unwrap_or_else(|p| p.into_inner());
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
                let _ = self.src.reset_evt.read();
                let reason = if self.src.panicked.load(Ordering::SeqCst) {
                    VmExit::PanicReset
                } else {
                    VmExit::Reset
                };
                self.src.exit.report(reason);
            }
            SIGNAL_EVENT => self.on_signal(),
            API_EVENT => self.on_api(),
            METRICS_EVENT => {
                if let Some(t) = &mut self.src.metrics_timer {
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
            (self.src.reset_evt.as_raw_fd(), RESET_EVENT),
            (self.src.signals.as_raw_fd(), SIGNAL_EVENT),
        ];
        let timer = self
            .src
            .metrics_timer
            .as_ref()
            .map(|t| (t.as_raw_fd(), METRICS_EVENT));
        let api = self
            .api
            .as_ref()
            .map(|(c, _)| (c.wake.as_raw_fd(), API_EVENT));
        for (fd, data) in regs.into_iter().chain(timer).chain(api) {
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

// The tests signal their own thread and stand a pipe in for stdin: raw
// libc calls, each with its SAFETY argument.
#[cfg(test)]
#[allow(unsafe_code)]
mod tests {
    use std::path::PathBuf;
    use std::sync::mpsc;

    use event_manager::{EventManager, SubscriberOps};

    use super::*;
    use crate::api::command::{open_image, Answer, ApiCommand, OpenedImage, Ticket};
    use crate::api::routes::ApiRequest;
    use crate::api::runtime::drive_tests::{runtime, Scratch};

    /// A [`Control`] over fresh sources on an event manager of its own,
    /// with the handles the tests poke and read.
    struct Served {
        em: EventManager<Control>,
        exit: ExitLatch,
        reset: EventFd,
        panicked: Arc<AtomicBool>,
        serial: Arc<Mutex<SerialDevice>>,
    }

    impl Served {
        /// Serves the signals `signals` (blocked in this test's thread) and,
        /// with `metrics`, its timer.
        fn new(signals: &[libc::c_int], metrics: Option<(Metrics, TimerFd)>) -> Served {
            let exit = ExitLatch::new().unwrap();
            let reset = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            let panicked = Arc::new(AtomicBool::new(false));
            let serial = SerialDevice::new(Box::new(std::io::sink())).unwrap();
            let serial = Arc::new(Mutex::new(serial));
            let (metrics, metrics_timer) = match metrics {
                Some((m, t)) => (Some(Arc::new(Mutex::new(m))), Some(t)),
                None => (None, None),
            };
            let control = Control::new(ControlSources {
                exit: exit.clone(),
                reset_evt: reset.try_clone().unwrap(),
                signals: SignalFd::new(signals).unwrap(),
                serial: serial.clone(),
                panicked: panicked.clone(),
                metrics,
                metrics_timer,
            })
            .unwrap();
            let mut em = EventManager::new().unwrap();
            em.add_subscriber(control);
            Served {
                em,
                exit,
                reset,
                panicked,
                serial,
            }
        }

        /// Runs the loop until `done` holds, for at most about two seconds.
        fn run_until(&mut self, done: impl Fn(&Served) -> bool) -> bool {
            for _ in 0..200 {
                if done(self) {
                    return true;
                }
                self.em.run_with_timeout(10).unwrap();
            }
            done(self)
        }
    }

    /// The lines the metrics file holds.
    fn lines_in(path: &std::path::Path) -> usize {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// A scratch metrics file, and the metrics writing to it.
    fn metrics_file(name: &str) -> (PathBuf, Metrics) {
        let path = std::env::temp_dir().join(format!(
            "minivmm-control-{name}-{}.json",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let metrics = Metrics::open(&path).unwrap();
        (path, metrics)
    }

    #[test]
    fn the_reset_line_ends_the_vm_as_a_reset_or_after_a_panic_as_a_panic_reset() {
        for (panicked, want) in [(false, VmExit::Reset), (true, VmExit::PanicReset)] {
            let mut s = Served::new(&[], None);
            s.panicked.store(panicked, Ordering::SeqCst);
            s.reset.write(1).unwrap();
            assert!(s.run_until(|s| s.exit.reason().is_some()));
            assert_eq!(s.exit.reason(), Some(want));
            // The line was read: the loop does not spin on it.
            assert!(s.reset.read().is_err());
        }
    }

    #[test]
    fn a_stop_signal_ends_the_vm_and_sigusr1_writes_a_metrics_line() {
        let (path, metrics) = metrics_file("signal");
        // A timer that never fires: only the signal may write the line.
        let timer = TimerFd::new().unwrap();
        let mut s = Served::new(&[libc::SIGUSR1, libc::SIGTERM], Some((metrics, timer)));
        // SAFETY: signals this thread, which blocked both (Served::new), so
        // they wait for the signalfd instead of being delivered.
        let kill = |sig| assert_eq!(unsafe { libc::pthread_kill(libc::pthread_self(), sig) }, 0);
        kill(libc::SIGUSR1);
        assert!(s.run_until(|_| lines_in(&path) == 1));
        assert_eq!(s.exit.reason(), None, "SIGUSR1 does not stop the VM");
        kill(libc::SIGTERM);
        assert!(s.run_until(|s| s.exit.reason().is_some()));
        assert_eq!(s.exit.reason(), Some(VmExit::Signal(libc::SIGTERM)));
        assert_eq!(lines_in(&path), 1);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn the_metrics_timer_writes_a_line_each_time_it_fires() {
        let (path, metrics) = metrics_file("timer");
        let mut timer = TimerFd::new().unwrap();
        let period = std::time::Duration::from_millis(20);
        timer.reset(period, Some(period)).unwrap();
        let mut s = Served::new(&[], Some((metrics, timer)));
        assert!(s.run_until(|_| lines_in(&path) >= 2));
        assert_eq!(s.exit.reason(), None);
        let _ = std::fs::remove_file(&path);
    }

    /// Runs `f` with `fd` standing in for stdin (fd 0), then gives fd 0 its
    /// old file back. No test of this binary reads stdin; the tests that
    /// swap it take turns.
    fn with_stdin<R>(fd: &impl AsRawFd, f: impl FnOnce() -> R) -> R {
        static STDIN: Mutex<()> = Mutex::new(());
        let _turn = STDIN.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: dup takes an fd this process owns and returns a new one.
        let saved = unsafe { libc::dup(0) };
        assert!(saved >= 0);
        // SAFETY: `fd` is open (borrowed for the call); fd 0 becomes a copy.
        assert_eq!(unsafe { libc::dup2(fd.as_raw_fd(), 0) }, 0);
        let r = f();
        // SAFETY: gives fd 0 its old file back and closes the saved copy.
        unsafe {
            libc::dup2(saved, 0);
            libc::close(saved);
        }
        r
    }

    /// After `s` served stdin's last event: whether the loop still polls it
    /// (a loop that kept a closed stdin would spin on it).
    fn stdin_still_polled(s: &mut Served) -> bool {
        for _ in 0..3 {
            s.em.run_with_timeout(10).unwrap();
        }
        s.em.run_with_timeout(0).unwrap() > 0
    }

    #[test]
    fn console_input_reaches_the_serial_port_until_stdin_closes() {
        use std::io::Write;
        let (reader, mut writer) = std::io::pipe().unwrap();
        let (got, polled_after_eof, exit) = with_stdin(&reader, || {
            let mut s = Served::new(&[], None);
            // The line status register's data-ready bit.
            let ready = |s: &Served| s.serial.lock().unwrap().read(5) & 1 != 0;
            writer.write_all(b"ls\n").unwrap();
            assert!(
                s.run_until(ready),
                "console input did not reach the serial port"
            );
            let got: Vec<u8> = (0..3).map(|_| s.serial.lock().unwrap().read(0)).collect();
            // The write end closed: stdin reads EOF.
            drop(writer);
            (got, stdin_still_polled(&mut s), s.exit.reason())
        });
        assert_eq!(got, b"ls\n");
        assert!(!polled_after_eof, "stdin still polled after EOF");
        assert_eq!(exit, None);
    }

    #[test]
    fn a_stdin_that_fails_to_read_leaves_the_loop() {
        // A listening socket with a connection waiting is readable, and
        // every read of it fails (ENOTCONN, not EINTR, which would be tried
        // again): a loop that kept it would spin.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _waiting = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (polled, exit) = with_stdin(&listener, || {
            let mut s = Served::new(&[], None);
            (stdin_still_polled(&mut s), s.exit.reason())
        });
        assert!(!polled, "a failed stdin still polled");
        assert_eq!(exit, None);
    }

    #[test]
    fn every_api_command_waiting_is_answered_on_the_loop() {
        let dir = Scratch::new("control");
        let (old, new) = (dir.image("old.img", 8), dir.image("new.img", 24));
        let (tx, commands) = mpsc::channel();
        let wake = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let channel = ApiChannel {
            commands,
            wake: wake.try_clone().unwrap(),
            path: PathBuf::new(),
        };
        let serial = SerialDevice::new(Box::new(std::io::sink())).unwrap();
        let mut control = Control::new(ControlSources {
            exit: ExitLatch::new().unwrap(),
            reset_evt: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            signals: SignalFd::new(&[]).unwrap(),
            serial: Arc::new(Mutex::new(serial)),
            panicked: Arc::new(AtomicBool::new(false)),
            metrics: None,
            metrics_timer: None,
        })
        .unwrap()
        .with_api(channel, runtime(&[("rootfs", &old, true)]));
        let ask = |request: ApiRequest, image: Option<OpenedImage>| -> Ticket {
            let (cmd, ticket) = ApiCommand::new(request, image, None);
            tx.send(cmd).unwrap();
            ticket
        };
        let body = serde_json::json!({"drive_id": "rootfs", "path_on_host": new});
        let info = ask(ApiRequest::GetInstanceInfo, None);
        let first = ask(ApiRequest::PatchDrive("rootfs".into(), body.clone()), None);
        wake.write(1).unwrap();
        control.on_api();
        match info.answer() {
            Some(Answer::Reply(r)) => assert_eq!(r.status, 200),
            other => panic!("{other:?}"),
        }
        let (path, read_only) = match first.answer() {
            Some(Answer::Open { path, read_only }) => (path, read_only),
            other => panic!("{other:?}"),
        };
        assert_eq!((path.as_path(), read_only), (new.as_path(), true));
        // The wake-up was taken with the commands.
        assert!(wake.read().is_err());
        // The second trip brings the image: the drive is on it.
        let second = ask(
            ApiRequest::PatchDrive("rootfs".into(), body),
            Some(open_image(&path, read_only)),
        );
        wake.write(1).unwrap();
        control.on_api();
        match second.answer() {
            Some(Answer::Reply(r)) => assert_eq!(r.status, 204, "{r:?}"),
            other => panic!("{other:?}"),
        }
        let Some((_, rt)) = &control.api else {
            panic!("no API");
        };
        assert_eq!(rt.config().drives[0].device.path, new);
        // A command the API thread gave up on is dropped, not applied.
        let third = dir.image("third.img", 32);
        let body = serde_json::json!({"drive_id": "rootfs", "path_on_host": third});
        let late = ask(
            ApiRequest::PatchDrive("rootfs".into(), body),
            Some(open_image(&third, true)),
        );
        assert!(late.abandon());
        wake.write(1).unwrap();
        control.on_api();
        assert!(late.answer().is_none(), "answered after it was abandoned");
        assert!(!late.held_by_vmm(), "the loop kept it");
        let Some((_, rt)) = &control.api else {
            panic!("no API");
        };
        assert_eq!(rt.config().drives[0].device.path, new, "applied after all");
    }
}
