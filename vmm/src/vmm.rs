// SPDX-License-Identifier: Apache-2.0
//! A built VM and how it runs: vCPU threads plus one event loop on the main
//! thread.
//!
//! The builder hands `Vmm::new` everything it made; [`Vmm::run`] blocks
//! the stop signals, starts the vCPU threads, each under its seccomp filter,
//! and runs the event manager (device backends and the [`Control`] events)
//! until an [`ExitLatch`] holds a reason. It then restores the terminal,
//! writes the last metrics line and returns the reason, from which `main`
//! picks the process exit status.

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use devices::legacy::i8042::I8042;
use devices::legacy::serial::SerialDevice;
use devices::mmds::SharedMmds;
use event_manager::SubscriberOps;
use kvm_ioctls::{Kvm, VmFd};
use log::info;
use vmm_sys_util::timerfd::TimerFd;

use crate::api::runtime::Runtime;
use crate::api::ApiChannel;
use crate::config::VmmConfig;
use crate::device_manager::DeviceManager;
use crate::event_loop::{Control, ControlSources, LOG_TARGET};
use crate::host_socket::VsockSocket;
use crate::kvm::pause::{install_kick_handler, PauseGate};
use crate::kvm::state::{saveable_msrs, VcpuStateSlots};
use crate::kvm::vcpu::Vcpu;
use crate::kvm::vm_exit::{ExitLatch, VmExit};
use crate::metrics::{lock_metrics, Metrics};
use crate::process::seccomp::{Filters, Gate, Thread};
use crate::process::signals::SignalFd;
use crate::process::terminal::RawTerminal;
use crate::registry::{lock, Events};
use crate::serial_out::SerialLimiter;
use crate::snapshot::create::SnapshotSources;
use devices::virtio::queue::dirty::DirtyPages;

/// The metrics writer, shared by the event loop's timer, its signal and the
/// API.
type SharedMetrics = Option<Arc<Mutex<Metrics>>>;

/// The KVM objects of a VM. Owned for as long as the process lives: the VM
/// fd and guest memory must outlive the vCPU threads, which run until the
/// process exits; read only by a snapshot.
pub(crate) struct KvmVm {
    kvm: Kvm,
    fd: Arc<VmFd>,
    mem: vm_memory::GuestMemoryMmap<()>,
}

impl KvmVm {
    /// Keeps `kvm`, the VM `fd` and its guest memory `mem` alive.
    pub(crate) fn new(kvm: Kvm, fd: VmFd, mem: vm_memory::GuestMemoryMmap<()>) -> Self {
        KvmVm {
            kvm,
            fd: Arc::new(fd),
            mem,
        }
    }
}

/// The devices of a built VM, as the event loop and the vCPUs reach them.
pub(crate) struct Devices {
    /// The buses the vCPUs' exits go to.
    pub(crate) manager: Arc<DeviceManager>,
    /// The event manager every device backend is registered with.
    pub(crate) events: Events,
    /// The console UART (its input comes from stdin).
    pub(crate) serial: Arc<Mutex<SerialDevice>>,
    /// The console output's bucket (for snapshots).
    pub(crate) serial_limiter: SerialLimiter,
    /// The keyboard controller (its reset line ends the VM).
    pub(crate) i8042: Arc<Mutex<I8042>>,
    /// Set once the guest kernel reported a panic (the pvpanic register).
    pub(crate) panicked: Arc<AtomicBool>,
    /// The vsock device's socket, removed when the last holder drops it.
    pub(crate) vsock_socket: Option<Arc<VsockSocket>>,
    /// The MMDS store the cards it serves read (the API's `/mmds`).
    pub(crate) mmds: SharedMmds,
}

/// A built VM, ready to run.
pub struct Vmm {
    vm: KvmVm,
    devices: Arc<DeviceManager>,
    events: Events,
    serial: Arc<Mutex<SerialDevice>>,
    serial_limiter: SerialLimiter,
    i8042: Arc<Mutex<I8042>>,
    panicked: Arc<AtomicBool>,
    exit: ExitLatch,
    vcpus: Vec<Vcpu>,
    metrics: Option<Metrics>,
    metrics_interval_s: u64,
    api: Option<ApiSetup>,
    /// Whether the vCPUs start parked (a snapshot loaded without
    /// `resume_vm`).
    start_paused: bool,
    /// The devices' dirty-page log, when the VM tracks dirty pages.
    dirty: Option<Arc<DirtyPages>>,
    mmds: SharedMmds,
    /// Held until the VM has ended: its drop removes the socket (the last
    /// field, so the device's own listener is closed first).
    _vsock_socket: Option<Arc<VsockSocket>>,
}

/// What the running VM's API needs that the builder does not make.
struct ApiSetup {
    channel: ApiChannel,
    id: String,
    config: VmmConfig,
}

impl Vmm {
    /// A VM made of `vm`, `devices` and configured `vcpus`; the first reason
    /// reported to `exit` ends it. `metrics`, if any, is written every
    /// `metrics_interval_s` seconds (0: only on SIGUSR1 and at exit).
    pub(crate) fn new(
        vm: KvmVm,
        devices: Devices,
        vcpus: Vec<Vcpu>,
        exit: ExitLatch,
        metrics: Option<Metrics>,
        metrics_interval_s: u64,
    ) -> Vmm {
        Vmm {
            vm,
            devices: devices.manager,
            events: devices.events,
            serial: devices.serial,
            serial_limiter: devices.serial_limiter,
            i8042: devices.i8042,
            panicked: devices.panicked,
            exit,
            vcpus,
            metrics,
            metrics_interval_s,
            api: None,
            start_paused: false,
            dirty: None,
            mmds: devices.mmds,
            _vsock_socket: devices.vsock_socket,
        }
    }

    /// The devices' dirty-page log of a VM that tracks dirty pages (its
    /// memory slots log the guest's writes), for Diff snapshots.
    pub(crate) fn track_dirty_pages(&mut self, log: Arc<DirtyPages>) {
        self.dirty = Some(log);
    }

    /// Has the vCPUs wait, paused, for `PATCH /vm` `Resumed` before the
    /// guest runs (a snapshot loaded with `resume_vm: false`).
    pub fn start_paused(&mut self) {
        self.start_paused = true;
    }

    /// Names the instance (`--id`) in its metrics lines.
    pub fn set_id(&mut self, id: &str) {
        if let Some(m) = &mut self.metrics {
            m.set_id(id);
        }
    }

    /// Serves the API's run-time requests from `channel` once the VM runs:
    /// `id` is the instance id, `config` what the VM was built from.
    pub fn serve_api(&mut self, channel: ApiChannel, id: String, config: VmmConfig) {
        self.api = Some(ApiSetup {
            channel,
            id,
            config,
        });
    }

    /// Runs the VM until it ends and returns why. `start` is when the
    /// process started, for the boot-time report. Every thread runs under
    /// its seccomp filter from `filters` before the guest starts.
    pub fn run(mut self, start: Instant, filters: Filters) -> io::Result<VmExit> {
        // Block the stop signals before any thread exists so every thread
        // inherits the mask and only the signalfd sees them.
        let signals = SignalFd::new(&[libc::SIGTERM, libc::SIGINT, libc::SIGUSR1])?;
        let reset_evt = lock(&self.i8042).reset_evt().try_clone()?;
        let (metrics, metrics_timer) = self.start_metrics(start)?;
        // The VM's filters for this process as it runs the VM (its pid,
        // after the jail) and for what its vCPUs do (the PVM recoveries).
        let pvm_recoveries = self.vcpus.iter().any(Vcpu::recovers_int3);
        let filters = filters.for_vm(pvm_recoveries).map_err(io::Error::other)?;
        // No vCPU enters the guest before every thread is filtered. A failed
        // spawn returns from here and ends the process, and with it the
        // threads waiting at the gate.
        let gate = Arc::new(Gate::new(self.vcpus.len() + 1));
        let pause = Arc::new(PauseGate::new());
        if self.start_paused {
            pause.hold();
        }
        if self.api.is_some() {
            install_kick_handler()?;
        }
        let msrs = saveable_msrs(&self.vm.kvm).map_err(io::Error::other)?;
        let states = Arc::new(VcpuStateSlots::new(self.vcpus.len(), msrs));
        let threads = self.spawn_vcpus(start, &gate, &pause, &filters, &states)?;
        let mut control = Control::new(ControlSources {
            exit: self.exit.clone(),
            reset_evt,
            signals,
            serial: self.serial.clone(),
            panicked: self.panicked.clone(),
            metrics: metrics.clone(),
            metrics_timer,
        })?;
        if let Some(api) = self.api.take() {
            let runtime = Runtime {
                id: api.id,
                config: api.config,
                pause,
                vcpus: threads,
                metrics: metrics.clone(),
                i8042: self.i8042.clone(),
                devices: self.devices.virtio().controls(),
                snapshot: Some(SnapshotSources {
                    vm: self.vm.fd.clone(),
                    mem: self.vm.mem.clone(),
                    devices: self.devices.clone(),
                    serial: self.serial.clone(),
                    serial_limiter: self.serial_limiter.clone(),
                    i8042: self.i8042.clone(),
                    vcpu_states: states,
                    dirty: self.dirty.clone(),
                }),
                mmds: self.mmds.clone(),
            };
            control = control.with_api(api.channel, runtime);
        }
        self.events.add_subscriber(Arc::new(Mutex::new(control)));
        let terminal = RawTerminal::new();

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
        info!(target: LOG_TARGET, "run time: {} ms", start.elapsed().as_millis());
        Ok(reason)
    }

    /// The metrics writer, reporting the vCPU exits and every device's
    /// counters, and the timer of its interval (none for an interval of 0).
    fn start_metrics(&mut self, start: Instant) -> io::Result<(SharedMetrics, Option<TimerFd>)> {
        let metrics = self.metrics.take().map(|mut m| {
            m.attach(
                self.devices.vcpu_exits(),
                self.devices.virtio().counters(),
                start,
            );
            Arc::new(Mutex::new(m))
        });
        let timer = match (&metrics, self.metrics_interval_s) {
            (Some(_), secs) if secs > 0 => {
                let mut t = TimerFd::new().map_err(io::Error::from)?;
                let every = Duration::from_secs(secs);
                t.reset(every, Some(every)).map_err(io::Error::from)?;
                Some(t)
            }
            _ => None,
        };
        Ok((metrics, timer))
    }

    /// Starts one thread per vCPU (`fc_vcpu N`, Firecracker's name), each
    /// installing its filter and waiting at `gate` before it enters the
    /// guest, and honouring `pause`.
    fn spawn_vcpus(
        &mut self,
        start: Instant,
        gate: &Arc<Gate>,
        pause: &Arc<PauseGate>,
        filters: &Filters,
        states: &Arc<VcpuStateSlots>,
    ) -> io::Result<Vec<JoinHandle<()>>> {
        let mut threads = Vec::with_capacity(self.vcpus.len());
        for mut vcpu in self.vcpus.drain(..) {
            let exit = self.exit.clone();
            let first = vcpu.id() == 0;
            let gate = gate.clone();
            let filter = filters.vcpu.clone();
            vcpu.set_pause_gate(pause.clone());
            vcpu.set_state_slots(states.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fc_vcpu {}", vcpu.id()))
                    .spawn(move || {
                        // The thread's first act: nothing of the guest runs unfiltered.
                        if let Err(e) = gate.install_and_wait(Thread::Vcpu, filter.as_ref()) {
                            exit.report(VmExit::Fault(format!("vCPU {}: {e}", vcpu.id())));
                            return;
                        }
                        if first {
                            info!(
                                target: LOG_TARGET,
                                "boot: {} ms from start to first vCPU entry",
                                start.elapsed().as_millis()
                            );
                        }
                        vcpu.run(exit)
                    })?,
            );
        }
        Ok(threads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_reaches_the_metrics_lines() {
        let Some((kvm, fd, mem)) = crate::builder::test_vm(32) else {
            return;
        };
        let path = std::env::temp_dir().join(format!("minivmm-vmm-id-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let devices = Devices {
            manager: Arc::new(DeviceManager::new()),
            events: Events::new().unwrap(),
            serial: Arc::new(Mutex::new(
                SerialDevice::new(Box::new(std::io::sink())).unwrap(),
            )),
            serial_limiter: crate::serial_out::SerialOut::open(None, None)
                .unwrap()
                .limiter(),
            i8042: Arc::new(Mutex::new(I8042::new().unwrap())),
            panicked: Arc::default(),
            vsock_socket: None,
            mmds: Default::default(),
        };
        let mut vmm = Vmm::new(
            KvmVm::new(kvm, fd, mem),
            devices,
            Vec::new(),
            ExitLatch::new().unwrap(),
            Some(Metrics::open(&path).unwrap()),
            0,
        );
        vmm.set_id("vm-9");
        let line = vmm.metrics.as_ref().unwrap().line();
        assert!(line.contains(r#""id":"vm-9""#), "{line}");
        std::fs::remove_file(&path).unwrap();
    }
}
