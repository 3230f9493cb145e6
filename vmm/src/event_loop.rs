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
use crate::metrics::{lock_metrics, Metrics};
use crate::signals::SignalFd;
use crate::vm_exit::{ExitLatch, VmExit};

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
    /// Tells a reset after a guest kernel panic from a plain one.
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

    /// Answers every request the API thread has sent. The answer goes into
    /// a channel of one that the API thread waits on; one it gave up on is
    /// dropped.
    fn on_api(&mut self) {
        let Some((channel, runtime)) = &mut self.api else {
            return;
        };
        let _ = channel.wake.read();
        while let Ok(cmd) = channel.commands.try_recv() {
            let answer = runtime.serve(cmd.request, cmd.image);
            let _ = cmd.reply.try_send(answer);
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::mpsc::{self, Receiver};

    use super::*;
    use crate::api::routes::ApiRequest;
    use crate::api::runtime::drive_tests::{runtime, Scratch};
    use crate::api::runtime::{open_image, OpenedImage};
    use crate::api::server::{Answer, ApiCommand};

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
        let ask = |request: ApiRequest, image: Option<OpenedImage>| -> Receiver<Answer> {
            let (reply, answer) = mpsc::sync_channel(1);
            tx.send(ApiCommand {
                request,
                image,
                reply,
            })
            .unwrap();
            answer
        };
        let body = serde_json::json!({"drive_id": "rootfs", "path_on_host": new});
        let info = ask(ApiRequest::GetInstanceInfo, None);
        let first = ask(ApiRequest::PatchDrive("rootfs".into(), body.clone()), None);
        wake.write(1).unwrap();
        control.on_api();
        match info.try_recv() {
            Ok(Answer::Reply(r)) => assert_eq!(r.status, 200),
            other => panic!("{other:?}"),
        }
        let (path, read_only) = match first.try_recv() {
            Ok(Answer::Open { path, read_only }) => (path, read_only),
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
        match second.try_recv() {
            Ok(Answer::Reply(r)) => assert_eq!(r.status, 204, "{r:?}"),
            other => panic!("{other:?}"),
        }
        let Some((_, rt)) = &control.api else {
            panic!("no API");
        };
        assert_eq!(rt.config().drives[0].device.path, new);
    }
}
