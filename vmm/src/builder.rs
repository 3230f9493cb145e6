// SPDX-License-Identifier: Apache-2.0
//! Building a VM from a [`VmmConfig`].
//!
//! [`build`] runs named steps in an order that fails cheapest first: the
//! kernel, initramfs and metrics files are opened, the kernel recognised
//! ([`crate::kernel`]), the drives' images checked ([`crate::images`]) and
//! the vsock device's socket bound ([`crate::host_socket`]) (`open_files`); KVM is checked and the VM created (`create_vm`); guest
//! memory is created (`guest_memory`), then the irqchip and PIT
//! (`create_irqchip`); the devices are attached (`attach_devices`: the
//! serial port, the i8042, then every virtio device through the registry's
//! one attach step, `attach_virtio`, where a bad TAP or a locked image
//! fails, before boot); the kernel and initramfs are loaded; the command
//! line is composed (`kernel_cmdline`) and the boot tables written
//! (`write_boot_tables`); and the vCPUs are created and configured
//! (`create_vcpus`). `--log-level debug` shows how long each step took.

use std::collections::{HashMap, HashSet};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::serial_out::SerialOut;
use arch::x86_64::boot_params::{
    configure_zero_page, kernel_entry_point, write_cmdline, ZeroPageConfig,
};
use arch::x86_64::layout::{
    CMDLINE_MAX_SIZE, CMDLINE_START, IRQ_MAX, KVM_TSS_ADDRESS, ZERO_PAGE_START,
};
use arch::x86_64::{arch_memory_regions, setup_mptable};
use devices::legacy::serial::SerialDevice;
use devices::mmds::{lock, MmdsStack, SharedMmds};
use devices::virtio::balloon::Balloon;
use devices::virtio::block::Block;
use devices::virtio::net::{Net, Tap, TapError};
use devices::virtio::queue::dirty::DirtyPages;
use devices::virtio::rng::Rng;
use devices::virtio::vsock::Vsock;
use event_manager::EventManager;
use kvm_bindings::{kvm_pit_config, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::{Kvm, VmFd};
use linux_loader::cmdline::Cmdline;
use linux_loader::loader::KernelLoaderResult;
use log::{debug, info, warn};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::config::balloon::BALLOON_ID;
use crate::config::drive::root_words;
use crate::config::entropy::ENTROPY_ID;
use crate::config::vsock::VSOCK_ID;
use crate::config::{DeviceKind, HostQuirks, NicConfig, TapBackend, VmmConfig};
use crate::device_manager::{DeviceError, DeviceManager};
use crate::guest_panic::ConsoleOut;
use crate::host_socket::{HostSocketError, VsockSocket};
use crate::images::{check_images, ImageError};
use crate::kernel::{Initramfs, KernelError, KernelFormat, KernelImage};
use crate::kvm::memory::{self, MemoryError};
use crate::kvm::pvm;
use crate::kvm::vcpu::{Vcpu, VcpuError};
use crate::kvm::vm_exit::ExitLatch;
use crate::kvm::{self, KvmError};
use crate::metrics::Metrics;
use crate::registry::{AttachEnv, AttachError, Events, Registry};
use crate::vmm::{Devices, KvmVm, Vmm};

/// The command line every guest starts from: the console on the UART we
/// emulate, reset through the keyboard controller (our i8042 ends the VMM),
/// reboot immediately on panic, no PCI probing (there is no PCI bus), and
/// Firecracker's i8042 words but `dumbkbd`: the controller has no mouse
/// port, which Linux would otherwise probe for until its AUX_LOOP command
/// times out (half a second of busy-waiting on real hardware timing), nor
/// an active multiplexer or PnP entry; the keyboard itself answers the
/// atkbd driver's probe, so it is probed.
pub const DEFAULT_CMDLINE: &str =
    "console=ttyS0 reboot=k panic=-1 pci=off i8042.noaux i8042.nomux i8042.nopnp";

/// Errors building a VM; each is one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The console's output (`PUT /serial`) cannot be opened.
    #[error(transparent)]
    SerialOut(#[from] crate::serial_out::SerialOutError),
    /// The kernel or initramfs cannot be opened or loaded.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// KVM is missing or lacks something.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// More vCPUs than KVM supports.
    #[error("--vcpus {0} exceeds this host's KVM limit of {1}")]
    TooManyVcpus(u8, usize),
    /// A VM-level KVM call failed.
    #[error("KVM refused to {0}")]
    Vm(&'static str, #[source] kvm_ioctls::Error),
    /// Guest memory could not be set up.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    /// A device could not be attached.
    #[error(transparent)]
    Device(#[from] DeviceError),
    /// A virtio device could not be created or attached.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// A drive's image cannot be used.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The kernel command line is invalid or too long.
    #[error("invalid kernel command line")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    /// Writing boot structures failed.
    #[error("cannot write the boot parameters")]
    BootParams(#[source] arch::x86_64::boot_params::BootParamsError),
    /// Writing the MP table failed.
    #[error("cannot write the MP table")]
    Mptable(#[source] arch::x86_64::MptableError),
    /// A vCPU could not be configured.
    #[error(transparent)]
    Vcpu(#[from] VcpuError),
    /// The event manager or an eventfd could not be created.
    #[error("cannot create the event loop")]
    EventLoop(#[source] std::io::Error),
    /// A NIC's TAP could not be opened or adopted.
    #[error("network interface '{0}'")]
    Tap(String, #[source] TapError),
    /// A `fd=N` that is not an open descriptor of this process.
    #[error(
        "network interface '{0}': fd={1} is not an open descriptor (inherit it from the parent)"
    )]
    TapFd(String, i32),
    /// A `fd=N` attached to another interface than the `tap=` given with it.
    #[error("network interface '{id}': fd={fd} is attached to TAP '{actual}', not '{expected}'")]
    TapFdName {
        /// The NIC.
        id: String,
        /// The descriptor.
        fd: i32,
        /// The `tap=` given.
        expected: String,
        /// The TAP the descriptor is attached to.
        actual: String,
    },
    /// Two NICs ended up on one TAP (a name and a descriptor of the same one).
    #[error("TAP '{0}' is given to two network interfaces; each needs its own TAP")]
    DuplicateTap(String),
    /// The metrics path cannot be opened.
    #[error("cannot open metrics path '{0}'")]
    Metrics(PathBuf, #[source] std::io::Error),
    /// A snapshot cannot be restored: what of it, and why.
    #[error("snapshot: {0}")]
    Restore(String),
    /// The vsock device's socket cannot be bound or handed over.
    #[error(transparent)]
    HostSocket(#[from] HostSocketError),
}

/// TAP descriptors inherited from the parent (`fd=N`), by number.
pub type TapFds = HashMap<i32, OwnedFd>;

/// Takes ownership of every `fd=N` the configuration names. `main` calls it
/// before the process opens any file, so each number is either a descriptor
/// inherited from the parent or closed (checked here), never one of ours.
#[allow(unsafe_code)]
pub fn claim_tap_fds(cfg: &VmmConfig) -> Result<TapFds, BuildError> {
    use std::os::fd::FromRawFd;
    let mut fds = TapFds::new();
    for net in &cfg.nets {
        if let TapBackend::Fd { fd, .. } = net.tap {
            // SAFETY: F_GETFD only reads the descriptor flags; a closed
            // number yields EBADF.
            if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
                return Err(BuildError::TapFd(net.id.clone(), fd));
            }
            // SAFETY: `fd` is open (checked above) and, as this runs before
            // minivmm opens anything, inherited; config validation made each
            // number unique, so exactly one OwnedFd owns it.
            fds.insert(fd, unsafe { OwnedFd::from_raw_fd(fd) });
        }
    }
    Ok(fds)
}

/// Opens (or adopts) the TAP of `net`, saying at warn level what an
/// operator should know: a TAP that had to be created, a TAP that is down,
/// a host MTU that differs from the guest's. `taps` are the TAPs opened so
/// far: two cards may not end up on one, which a name and a descriptor of
/// the same interface would do.
fn open_tap(
    net: &NicConfig,
    fds: &mut TapFds,
    taps: &mut HashSet<String>,
) -> Result<Tap, BuildError> {
    let tap_err = |e| BuildError::Tap(net.id.clone(), e);
    let tap = match &net.tap {
        TapBackend::Named(name) => {
            let existed = Tap::exists(name).map_err(tap_err)?;
            let tap = Tap::open_named(name).map_err(tap_err)?;
            if !existed {
                warn!(
                    "network interface '{}': TAP '{}' did not exist and was created; it is down, \
                     has no address and disappears when minivmm exits",
                    net.id,
                    tap.if_name()
                );
            }
            tap
        }
        TapBackend::Fd { fd, name } => {
            let owned = fds
                .remove(fd)
                .ok_or_else(|| BuildError::TapFd(net.id.clone(), *fd))?;
            let tap = Tap::from_fd(owned).map_err(tap_err)?;
            if let Some(expected) = name.as_ref().filter(|n| *n != tap.if_name()) {
                return Err(BuildError::TapFdName {
                    id: net.id.clone(),
                    fd: *fd,
                    expected: expected.clone(),
                    actual: tap.if_name().to_string(),
                });
            }
            tap
        }
    };
    match tap.is_up() {
        Ok(true) => {}
        Ok(false) => warn!(
            "network interface '{}': TAP '{}' is down; the guest's frames are dropped until \
             `ip link set {} up`",
            net.id,
            tap.if_name(),
            tap.if_name()
        ),
        Err(e) => warn!("network interface '{}': {}", net.id, crate::error_line(&e)),
    }
    claim_tap(taps, tap.if_name())?;
    if let (Some(mtu), Ok(host)) = (net.device.mtu, tap.mtu()) {
        if host != u32::from(mtu) {
            warn!(
                "network interface '{}': the guest MTU is {mtu} but TAP '{}' has MTU {host}; \
                 frames larger than the smaller one are dropped",
                net.id,
                tap.if_name()
            );
        }
    }
    Ok(tap)
}

/// Records that a card has the TAP `name`; `taps` are those of the cards
/// before it, which may not have it too.
fn claim_tap(taps: &mut HashSet<String>, name: &str) -> Result<(), BuildError> {
    if !taps.insert(name.to_string()) {
        return Err(BuildError::DuplicateTap(name.to_string()));
    }
    Ok(())
}

/// Assembles the guest command line: `base` (the user's whole command line,
/// Firecracker's `boot_args`, or [`DEFAULT_CMDLINE`]), the host recoveries,
/// the device announcements, then the user's extra words last so they can
/// override. Returns the command line and what minivmm added to it.
pub fn compose_cmdline(
    base: Option<&str>,
    quirks: bool,
    device_words: &[String],
    extra: Option<&str>,
) -> Result<(Cmdline, Vec<String>), linux_loader::cmdline::Error> {
    let mut cmdline = Cmdline::new(CMDLINE_MAX_SIZE)?;
    let base = base.map(str::trim).unwrap_or(DEFAULT_CMDLINE);
    if !base.is_empty() {
        cmdline.insert_str(base)?;
    }
    let mut added = Vec::new();
    if quirks {
        added.push(pvm::PVM_CMDLINE.to_string());
    }
    added.extend(device_words.iter().cloned());
    for word in &added {
        cmdline.insert_str(word)?;
    }
    if let Some(extra) = extra.map(str::trim).filter(|s| !s.is_empty()) {
        cmdline.insert_str(extra)?;
    }
    Ok((cmdline, added))
}

/// How long each build step took: start-up time is their sum plus the
/// vCPU thread's start, so `--log-level debug` shows where it goes.
pub(crate) struct Steps {
    last: Instant,
    took: Vec<(&'static str, f64)>,
}

impl Steps {
    pub(crate) fn new() -> Self {
        Steps {
            last: Instant::now(),
            took: Vec::with_capacity(10),
        }
    }

    /// Ends step `name`.
    pub(crate) fn done(&mut self, name: &'static str) {
        let now = Instant::now();
        self.took
            .push((name, (now - self.last).as_secs_f64() * 1e3));
        self.last = now;
    }

    pub(crate) fn log(&self) {
        let total: f64 = self.took.iter().map(|(_, ms)| ms).sum();
        let steps: Vec<String> = self
            .took
            .iter()
            .map(|(name, ms)| format!("{name} {ms:.3}"))
            .collect();
        debug!("build steps (ms): {}; build {total:.3}", steps.join(", "));
    }
}

/// Builds a ready-to-run VM; `tap_fds` are the descriptors
/// [`claim_tap_fds`] took. `boot_timer` (`--boot-timer`: when minivmm
/// started) adds the boot-timer register, announced on the command line.
/// `vsock` is the socket `PUT /vsock` bound, used if the configuration's
/// `uds_path` is still its path (otherwise the build binds its own).
pub fn build(
    cfg: &VmmConfig,
    mut tap_fds: TapFds,
    boot_timer: Option<Instant>,
    vsock: Option<Arc<VsockSocket>>,
    mmds: SharedMmds,
) -> Result<Vmm, BuildError> {
    let mut steps = Steps::new();
    // The files first: a typo in a path is the commonest mistake; say so
    // before anything else happens.
    let mut files = open_files(cfg, vsock)?;
    steps.done("files");

    let (kvm, vm) = create_vm(cfg.vcpus)?;
    steps.done("kvm");
    let thp = cfg.balloon.is_none();
    let mem = guest_memory(&vm, cfg.mem_mib, cfg.huge_pages, thp, cfg.track_dirty_pages)?;
    steps.done("memory");
    create_irqchip(&vm)?;
    steps.done("irqchip");
    let quirks = host_quirks(cfg.host_quirks);
    let exit = ExitLatch::new().map_err(BuildError::EventLoop)?;
    let console = (files.serial, files.vsock);
    let devices = attach_devices(cfg, &vm, &mem, &mut tap_fds, boot_timer, console, mmds)?;
    let dirty = cfg
        .track_dirty_pages
        .then(|| log_device_writes(&devices, &mem));
    steps.done("devices");

    let loaded = files.kernel.load(&mem)?;
    let entry = kernel_entry_point(&loaded);
    steps.done("kernel");
    let initrd = files.initramfs.map(|i| i.load(&mem, &loaded)).transpose()?;
    steps.done("initramfs");

    let mut device_words = devices.manager.cmdline_words();
    device_words.extend(root_words(&cfg.drives));
    let cmdline = kernel_cmdline(cfg, quirks, &device_words)?;
    write_boot_tables(&mem, &cmdline, initrd, &loaded, cfg.vcpus)?;
    steps.done("boot tables");

    let boot = (entry.0, ZERO_PAGE_START);
    let topology = (cfg.vcpus, cfg.smt);
    let vcpus = create_vcpus(&kvm, &vm, &mem, &devices.manager, topology, boot, quirks)?;
    steps.done("vcpus");
    steps.log();
    info!(
        "{} kernel at {:#x}, {} MiB, {} vCPU(s)",
        match files.kernel.format() {
            KernelFormat::Elf => "ELF",
            KernelFormat::BzImage => "bzImage",
        },
        entry.0,
        cfg.mem_mib,
        cfg.vcpus
    );

    let mut vmm = Vmm::new(
        KvmVm::new(kvm, vm, mem),
        devices,
        vcpus,
        exit,
        files.metrics,
        cfg.metrics.as_ref().map_or(0, |m| m.interval_s),
    );
    if let Some(log) = dirty {
        vmm.track_dirty_pages(log);
    }
    Ok(vmm)
}

/// Has every virtio device of `devices` log the guest pages it may write
/// (the device-writable buffers of the chains it takes) in one log of
/// `mem`, for Diff snapshots; KVM logs the vCPUs' writes (the memory slots
/// were registered with a dirty log). Before any device is activated:
/// their queues take the log then.
pub(crate) fn log_device_writes(devices: &Devices, mem: &GuestMemoryMmap) -> Arc<DirtyPages> {
    let log = Arc::new(DirtyPages::new(mem));
    for slot in devices.manager.virtio().slots() {
        crate::registry::lock(&slot.transport).set_dirty_log(log.clone());
    }
    log
}

/// Opens the metrics file or FIFO, if the configuration has one.
pub(crate) fn open_metrics(cfg: &VmmConfig) -> Result<Option<Metrics>, BuildError> {
    cfg.metrics
        .as_ref()
        .map(|m| {
            let mut out =
                Metrics::open(&m.path).map_err(|e| BuildError::Metrics(m.path.clone(), e))?;
            out.set_properties(m.properties.clone());
            Ok(out)
        })
        .transpose()
}

/// What the build opens before it touches KVM.
struct Files {
    kernel: KernelImage,
    initramfs: Option<Initramfs>,
    metrics: Option<Metrics>,
    vsock: Option<Arc<VsockSocket>>,
    /// The console's output (stdout, or `PUT /serial`'s file or FIFO).
    serial: SerialOut,
}

/// Opens the kernel (recognising its format), the metrics file or FIFO and
/// the initramfs, checks the drives' images and binds the vsock device's
/// socket (or takes the one `prebound` by the API, at the same path), so
/// that a bad path fails before anything else happens.
fn open_files(cfg: &VmmConfig, prebound: Option<Arc<VsockSocket>>) -> Result<Files, BuildError> {
    let kernel = KernelImage::open(&cfg.kernel)?;
    let metrics = open_metrics(cfg)?;
    let initramfs = cfg.initramfs.as_deref().map(Initramfs::open).transpose()?;
    check_images(&cfg.drives)?;
    let serial = SerialOut::open(
        cfg.serial.out_path.as_deref(),
        cfg.serial.rate_limiter.as_ref(),
    )?;
    let mut metrics = metrics;
    if let Some(m) = metrics.as_mut() {
        m.set_uart_dropped(serial.dropped_counter());
    }
    let vsock = match (&cfg.vsock, prebound) {
        (None, _) => None,
        (Some(v), Some(s)) if s.path() == v.uds_path => Some(s),
        (Some(v), _) => Some(Arc::new(VsockSocket::bind(&v.uds_path, cfg.seccomp)?)),
    };
    Ok(Files {
        kernel,
        initramfs,
        metrics,
        vsock,
        serial,
    })
}

/// Attaches every device: the console UART and the i8042, the virtio
/// devices (see [`attach_virtio`]), and the boot-timer register if asked.
pub(crate) fn attach_devices(
    cfg: &VmmConfig,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    tap_fds: &mut TapFds,
    boot_timer: Option<Instant>,
    (serial, vsock): (SerialOut, Option<Arc<VsockSocket>>),
    mmds: SharedMmds,
) -> Result<Devices, BuildError> {
    let mut events: Events = EventManager::new()
        .map_err(|e| BuildError::EventLoop(std::io::Error::other(e.to_string())))?;
    let panicked = Arc::new(AtomicBool::new(false));
    let mut manager = DeviceManager::new();
    let serial_limiter = serial.limiter();
    let serial = attach_serial(&mut manager, vm, serial)?;
    let i8042 = manager.attach_i8042(vm)?;
    manager.attach_pvpanic(panicked.clone());
    let mut env = AttachEnv {
        vm,
        mem,
        events: &mut events,
    };
    attach_virtio(
        manager.virtio_mut(),
        &mut env,
        cfg,
        tap_fds,
        vsock.as_deref(),
        &mmds,
    )?;
    if let Some(start) = boot_timer {
        manager.enable_boot_timer(start);
    }
    Ok(Devices {
        manager: Arc::new(manager),
        events,
        serial,
        serial_limiter,
        i8042,
        panicked,
        vsock_socket: vsock,
        mmds,
    })
}

/// Attaches every virtio device of `cfg` in MMIO window order, each kind
/// with one line: the network cards (a bad TAP fails here, before boot),
/// the drives (a locked image fails here), the entropy device, then the
/// vsock device over `vsock`, the socket `open_files` bound, then the
/// balloon.
fn attach_virtio(
    virtio: &mut Registry,
    env: &mut AttachEnv<'_>,
    cfg: &VmmConfig,
    tap_fds: &mut TapFds,
    vsock: Option<&VsockSocket>,
    mmds: &SharedMmds,
) -> Result<(), BuildError> {
    let mem = env.mem;
    let mut taps = HashSet::new();
    if let Some(m) = &cfg.mmds {
        lock(mmds).configure(m.version, m.imds_compat);
    }
    for nic in &cfg.nets {
        let tap = open_tap(nic, tap_fds, &mut taps)?;
        let stack = cfg
            .mmds
            .as_ref()
            .and_then(|m| m.address_on(&nic.id))
            .map(|ip| MmdsStack::new(ip, mmds.clone()));
        let net = Net::with_backend(tap, nic.device.clone(), mem.clone()).map(|mut n| {
            n.set_mmds(stack);
            n
        });
        virtio.attach_controlled(env, DeviceKind::Net, &nic.id, net)?;
    }
    for drive in &cfg.drives {
        let block = Block::new(drive.device.clone(), mem.clone());
        virtio.attach_controlled(env, DeviceKind::Block, &drive.device.id, block)?;
    }
    if let Some(rng) = cfg.entropy {
        virtio.attach(env, DeviceKind::Rng, ENTROPY_ID, Rng::new(rng, mem.clone()))?;
    }
    if let (Some(v), Some(socket)) = (&cfg.vsock, vsock) {
        let dev = Vsock::with_listener(v.clone(), mem.clone(), socket.listener()?);
        virtio.attach(env, DeviceKind::Vsock, VSOCK_ID, dev)?;
    }
    if let Some(b) = cfg.balloon {
        let balloon = Balloon::new(b, mem.clone());
        virtio.attach_controlled(env, DeviceKind::Balloon, BALLOON_ID, balloon)?;
    }
    Ok(())
}

/// Opens and checks KVM, checks the vCPU count against its limit, and
/// creates the VM.
pub(crate) fn create_vm(vcpus: u8) -> Result<(Kvm, VmFd), BuildError> {
    let kvm = kvm::open_and_check()?;
    let max_vcpus = kvm.get_max_vcpus();
    if usize::from(vcpus) > max_vcpus {
        return Err(BuildError::TooManyVcpus(vcpus, max_vcpus));
    }
    let vm = kvm
        .create_vm()
        .map_err(|e| BuildError::Vm("create a VM", e))?;
    Ok((kvm, vm))
}

/// Creates `mem_mib` MiB of guest memory laid out around the MMIO gap,
/// backed by transparent huge pages when `thp` (not with a balloon:
/// `memory::create_guest_memory` says why), its writes logged by KVM when
/// `dirty_log`.
///
/// Before the irqchip (as Firecracker orders it): the first memory slot set
/// after KVM_CREATE_IRQCHIP or KVM_SET_TSS_ADDR sleeps in the kernel for 2
/// to 14 ms on the development hosts (0.2 ms of CPU), the same call before
/// them takes 0.2 ms.
fn guest_memory(
    vm: &VmFd,
    mem_mib: u64,
    pages: crate::config::HugePages,
    thp: bool,
    dirty_log: bool,
) -> Result<GuestMemoryMmap, BuildError> {
    let regions = arch_memory_regions(mem_mib << 20);
    Ok(memory::create_guest_memory(
        vm, &regions, mem_mib, pages, thp, dirty_log,
    )?)
}

/// The in-kernel interrupt controllers and timer: the TSS pages Intel hosts
/// need, the irqchip (PIC, IOAPIC, LAPICs) and the PIT.
pub(crate) fn create_irqchip(vm: &VmFd) -> Result<(), BuildError> {
    // A u64 guest address below 4 GiB, so it fits usize on x86_64.
    vm.set_tss_address(KVM_TSS_ADDRESS as usize)
        .map_err(|e| BuildError::Vm("set the TSS address", e))?;
    vm.create_irq_chip()
        .map_err(|e| BuildError::Vm("create the in-kernel irqchip", e))?;
    // The PIT must exist before vCPUs; its speaker port is a dummy so that a
    // guest beep is not an exit.
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit)
        .map_err(|e| BuildError::Vm("create the PIT", e))
}

/// Resolves `--host-quirks` against this host and says so when the PVM
/// recoveries apply.
fn host_quirks(mode: HostQuirks) -> bool {
    let pvm_host = pvm::is_pvm_host();
    let quirks = pvm::quirks_enabled(mode, pvm_host);
    if quirks {
        info!(
            "PVM-backed KVM {}: adding '{}' to the guest command line and recovering INT3 \
             emulation failures (--host-quirks off disables this)",
            if pvm_host {
                "detected"
            } else {
                "assumed (--host-quirks on)"
            },
            pvm::PVM_CMDLINE
        );
    }
    quirks
}

/// Puts the console UART on `out`: stdout, or where `PUT /serial` said.
fn attach_serial(
    devices: &mut DeviceManager,
    vm: &VmFd,
    out: SerialOut,
) -> Result<Arc<Mutex<SerialDevice>>, BuildError> {
    let console = ConsoleOut::new(out);
    Ok(devices.attach_serial(vm, Box::new(console))?)
}

/// Composes the guest command line from the configuration, the host
/// recoveries and the devices' words, and logs it.
fn kernel_cmdline(
    cfg: &VmmConfig,
    quirks: bool,
    device_words: &[String],
) -> Result<Cmdline, BuildError> {
    let (cmdline, added) = compose_cmdline(
        cfg.boot_args.as_deref(),
        quirks,
        device_words,
        cfg.cmdline_extra.as_deref(),
    )
    .map_err(BuildError::Cmdline)?;
    if !added.is_empty() {
        info!(
            "minivmm adds to the kernel command line: {}",
            added.join(" ")
        );
    }
    info!(
        "kernel command line: {}",
        cmdline
            .as_cstring()
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    Ok(cmdline)
}

/// Writes what the guest reads at boot: the command line, the zero page
/// (with the initramfs location) and the MP table for `vcpus` CPUs.
fn write_boot_tables(
    mem: &GuestMemoryMmap,
    cmdline: &Cmdline,
    initrd: Option<(GuestAddress, usize)>,
    kernel: &KernelLoaderResult,
    vcpus: u8,
) -> Result<(), BuildError> {
    let cmdline_size = write_cmdline(mem, cmdline).map_err(BuildError::BootParams)?;
    configure_zero_page(
        mem,
        &ZeroPageConfig {
            cmdline_addr: GuestAddress(CMDLINE_START),
            cmdline_size,
            initrd,
            setup_header: kernel.setup_header,
        },
    )
    .map_err(BuildError::BootParams)?;
    setup_mptable(mem, vcpus, IRQ_MAX as u8).map_err(BuildError::Mptable)
}

/// Creates and configures `count` vCPUs; the first starts at `boot` (entry
/// point, zero page).
fn create_vcpus(
    kvm: &Kvm,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    devices: &Arc<DeviceManager>,
    (count, smt): (u8, bool),
    boot: (u64, u64),
    quirks: bool,
) -> Result<Vec<Vcpu>, BuildError> {
    let base_cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| BuildError::Vm("report supported CPUID", e))?;
    let mut vcpus = Vec::with_capacity(count.into());
    for id in 0..count {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(|e| VcpuError::Create(id, e))?;
        let vcpu = Vcpu::new(fd, id, devices.clone(), quirks);
        vcpu.configure(&base_cpuid, (count, smt), mem, (id == 0).then_some(boot))?;
        vcpus.push(vcpu);
    }
    Ok(vcpus)
}

/// A VM as [`build`] makes one up to its vCPUs (KVM checked, `mem_mib` MiB
/// of guest memory, irqchip and PIT), for tests that need real KVM; `None`,
/// after a SKIP line, where this host has no KVM.
#[cfg(test)]
pub(crate) fn test_vm(mem_mib: u64) -> Option<(Kvm, VmFd, GuestMemoryMmap)> {
    if !std::path::Path::new("/dev/kvm").exists() {
        minivmm_tests::print_skip("no /dev/kvm on this host");
        return None;
    }
    let vm = || -> Result<_, BuildError> {
        let (kvm, vm) = create_vm(1)?;
        let mem = guest_memory(&vm, mem_mib, crate::config::HugePages::None, true, false)?;
        create_irqchip(&vm)?;
        Ok((kvm, vm, mem))
    };
    Some(vm().unwrap_or_else(|e| panic!("{}", crate::error_line(&e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_has_defaults_quirks_devices_then_user_words() {
        let words = vec!["virtio_mmio.device=4K@0xd0000000:5".to_string()];
        let (c, added) = compose_cmdline(None, true, &words, Some(" minivmm.mode=serve ")).unwrap();
        assert_eq!(added, vec![pvm::PVM_CMDLINE.to_string(), words[0].clone()]);
        let s = c.as_cstring().unwrap().into_string().unwrap();
        assert!(s.starts_with(DEFAULT_CMDLINE), "{s}");
        let quirk = s.find("noxsave nopv").unwrap();
        let dev = s.find("virtio_mmio.device=4K@0xd0000000:5").unwrap();
        let user = s.find("minivmm.mode=serve").unwrap();
        assert!(quirk < dev && dev < user, "{s}");

        let (plain, added) = compose_cmdline(None, false, &[], None).unwrap();
        assert_eq!(
            plain.as_cstring().unwrap().into_string().unwrap(),
            DEFAULT_CMDLINE
        );
        assert!(added.is_empty());
    }

    #[test]
    fn boot_args_replace_the_default_as_in_firecracker() {
        let words = vec!["virtio_mmio.device=4K@0xd0000000:5".to_string()];
        let (c, _) =
            compose_cmdline(Some("console=hvc0 quiet"), false, &words, Some("ip=off")).unwrap();
        assert_eq!(
            c.as_cstring().unwrap().into_string().unwrap(),
            "console=hvc0 quiet virtio_mmio.device=4K@0xd0000000:5 ip=off"
        );
        // An empty boot_args is an empty command line plus what minivmm adds.
        let (c, _) = compose_cmdline(Some(""), false, &words, None).unwrap();
        assert_eq!(
            c.as_cstring().unwrap().into_string().unwrap(),
            "virtio_mmio.device=4K@0xd0000000:5"
        );
    }

    #[test]
    fn two_cards_may_not_end_up_on_one_tap() {
        let mut taps = HashSet::new();
        claim_tap(&mut taps, "tap0").unwrap();
        claim_tap(&mut taps, "tap1").unwrap();
        let err = claim_tap(&mut taps, "tap0").unwrap_err();
        assert!(
            matches!(&err, BuildError::DuplicateTap(t) if t == "tap0"),
            "{err}"
        );
    }

    /// The devices a configuration without cards gets: the legacy ones and,
    /// through the registry's attach step, its drive, entropy device and
    /// balloon in window order, announced on the command line.
    #[test]
    fn every_virtio_device_of_the_configuration_is_attached_in_window_order() {
        use crate::api::runtime::drive_tests::Scratch;
        use crate::config::entropy::ENTROPY_ID;
        use arch::x86_64::layout;
        let Some((_kvm, vm, mem)) = test_vm(32) else {
            return;
        };
        let dir = Scratch::new("build-devices");
        let image = dir.image("data.img", 8);
        let cfg = VmmConfig {
            drives: vec![crate::config::DriveConfig {
                is_root_device: false,
                partuuid: None,
                device: devices::virtio::block::BlockConfig::new("data", &image),
            }],
            entropy: Some(devices::virtio::rng::RngConfig::default()),
            balloon: Some(devices::virtio::balloon::BalloonConfig::default()),
            ..crate::config::settings::Settings {
                kernel: Some("k".into()),
                ..Default::default()
            }
            .finish()
            .unwrap()
        };
        let console = (SerialOut::open(None, None).unwrap(), None);
        let devices = attach_devices(
            &cfg,
            &vm,
            &mem,
            &mut TapFds::new(),
            None,
            console,
            Default::default(),
        )
        .unwrap();
        let slots: Vec<(DeviceKind, &str, u32)> = devices
            .manager
            .virtio()
            .slots()
            .iter()
            .map(|s| (s.kind, s.id.as_str(), s.gsi))
            .collect();
        assert_eq!(
            slots,
            [
                (DeviceKind::Block, "data", layout::IRQ_BASE),
                (DeviceKind::Rng, ENTROPY_ID, layout::IRQ_BASE + 1),
                (DeviceKind::Balloon, "balloon", layout::IRQ_BASE + 2),
            ]
        );
        // One word per virtio device, and the pvpanic register's.
        assert_eq!(devices.manager.cmdline_words().len(), 4);
        // The drive takes PATCH and the balloon its requests; the entropy
        // device has nothing to change.
        let controls = devices.manager.virtio().controls();
        assert!(controls.get(DeviceKind::Block, "data").is_some());
        assert!(controls.get(DeviceKind::Rng, ENTROPY_ID).is_none());
        let balloon = controls.get(DeviceKind::Balloon, "balloon").unwrap();
        assert!(crate::registry::lock(balloon).balloon().is_some());
    }

    /// The VmFlags of the mapping at `host` (`hg`: MADV_HUGEPAGE).
    fn vm_flags(host: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let prefix = format!("{host:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&prefix));
        assert!(lines.next().is_some(), "no mapping at {host:#x}");
        let flags = lines.find(|l| l.starts_with("VmFlags:")).unwrap();
        flags.to_string()
    }

    #[test]
    fn guest_memory_asks_for_huge_pages_except_under_a_balloon() {
        if test_vm(32).is_none() {
            return;
        }
        for thp in [true, false] {
            let (_kvm, vm) = create_vm(1).unwrap();
            let mem = guest_memory(&vm, 32, crate::config::HugePages::None, thp, false).unwrap();
            let host = vm_memory::GuestMemoryBackend::get_host_address(&mem, GuestAddress(0))
                .unwrap() as usize;
            let flags = vm_flags(host);
            assert_eq!(flags.split_whitespace().any(|f| f == "hg"), thp, "{flags}");
        }
    }

    /// `track_dirty_pages`: KVM keeps a dirty log of every slot (it has
    /// none to give for a slot registered without one).
    #[test]
    fn guest_memory_has_a_dirty_log_only_when_tracking() {
        if test_vm(32).is_none() {
            return;
        }
        for dirty_log in [true, false] {
            let (_kvm, vm) = create_vm(1).unwrap();
            let mem = guest_memory(&vm, 32, crate::config::HugePages::None, true, dirty_log);
            let len = vm_memory::GuestMemoryBackend::iter(&mem.unwrap())
                .map(|r| vm_memory::GuestMemoryRegion::len(r) as usize)
                .next()
                .unwrap();
            assert_eq!(vm.get_dirty_log(0, len).is_ok(), dirty_log);
        }
    }

    #[test]
    fn an_overlong_cmdline_is_an_error() {
        let long = "x".repeat(CMDLINE_MAX_SIZE + 1);
        assert!(compose_cmdline(None, false, &[], Some(&long)).is_err());
    }

    #[test]
    fn missing_and_garbage_kernels_fail_before_kvm() {
        let cfg = |kernel: &str| VmmConfig {
            kernel: kernel.into(),
            initramfs: None,
            boot_args: None,
            cmdline_extra: None,
            mem_mib: 64,
            vcpus: 1,
            smt: false,
            huge_pages: Default::default(),
            track_dirty_pages: false,
            serial: Default::default(),
            nets: Vec::new(),
            drives: Vec::new(),
            entropy: None,
            balloon: None,
            vsock: None,
            mmds: None,
            metrics: None,
            logger: Default::default(),
            host_quirks: crate::config::HostQuirks::Off,
            seccomp: crate::process::seccomp::SeccompMode::Off,
        };
        let err = build(
            &cfg("/nonexistent/bzImage"),
            TapFds::new(),
            None,
            None,
            Default::default(),
        )
        .err()
        .unwrap();
        assert!(
            matches!(err, BuildError::Kernel(KernelError::Open(..))),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("minivmm-garbage-{}", std::process::id()));
        std::fs::write(&dir, b"this is not a kernel").unwrap();
        let err = build(
            &cfg(dir.to_str().unwrap()),
            TapFds::new(),
            None,
            None,
            Default::default(),
        )
        .err()
        .unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert!(
            matches!(err, BuildError::Kernel(KernelError::Format(_))),
            "{err}"
        );
        assert!(err
            .to_string()
            .contains("neither an ELF vmlinux nor a bzImage"));
    }
}
