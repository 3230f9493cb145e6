// SPDX-License-Identifier: Apache-2.0
//! Building a VM from a [`VmmConfig`].
//!
//! The order matters and follows what can fail cheapest first: the kernel and
//! initramfs files are opened and recognised, then KVM is checked, memory
//! created, devices attached (a bad TAP fails here, before boot), the kernel
//! and initramfs loaded, the boot tables written, and the vCPUs configured.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use arch::x86_64::boot_params::{
    configure_zero_page, initrd_load_addr, kernel_entry_point, write_cmdline, ZeroPageConfig,
};
use arch::x86_64::layout::{CMDLINE_MAX_SIZE, CMDLINE_START, HIMEM_START, ZERO_PAGE_START};
use arch::x86_64::{arch_memory_regions, setup_mptable};
use devices::virtio::net::{Tap, TapError};
use event_manager::EventManager;
use kvm_bindings::{kvm_pit_config, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY};
use linux_loader::cmdline::Cmdline;
use linux_loader::loader::{bzimage::BzImage, elf::Elf, KernelLoader, KernelLoaderResult};
use log::{debug, info, warn};
use vm_memory::{GuestAddress, GuestMemoryBackend, ReadVolatile};

use crate::config::{NicConfig, TapBackend, VmmConfig};
use crate::device_manager::{ConsoleOut, DeviceError, DeviceManager, Events};
use crate::host;
use crate::kvm::{self, KvmError};
use crate::memory::{self, MemoryError};
use crate::metrics::Metrics;
use crate::vcpu::{Vcpu, VcpuError};
use crate::vm_exit::ExitSink;
use crate::vmm::{Devices, KvmVm, Vmm};

/// The command line every guest starts from: the console on the UART we
/// emulate, reset through the keyboard controller (our i8042 ends the VMM),
/// reboot immediately on panic, and no PCI probing (there is no PCI bus).
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 pci=off";

/// Identity map and TSS addresses for Intel hosts: three pages just below
/// the 4 GiB boundary, inside the MMIO gap so they never shadow RAM.
const KVM_TSS_ADDRESS: usize = 0xfffb_d000;

/// Errors building a VM; each is one line for the user.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The kernel file cannot be opened.
    #[error("cannot open kernel '{0}'")]
    OpenKernel(PathBuf, #[source] std::io::Error),
    /// The kernel file is neither ELF nor bzImage.
    #[error("kernel '{0}' is neither an ELF vmlinux nor a bzImage")]
    KernelFormat(PathBuf),
    /// The bzImage is shorter than its own header says.
    #[error("kernel '{0}' is truncated: its header promises {1} bytes, the file has {2}")]
    Truncated(PathBuf, u64, u64),
    /// The kernel could not be loaded (truncated, corrupt, too big for memory).
    #[error("cannot load kernel '{0}' (truncated image, or too big for guest memory?)")]
    LoadKernel(PathBuf, #[source] linux_loader::loader::Error),
    /// The initramfs file cannot be opened.
    #[error("cannot open initramfs '{0}'")]
    OpenInitramfs(PathBuf, #[source] std::io::Error),
    /// The initramfs does not fit in guest memory.
    #[error("initramfs '{0}' does not fit in guest memory (raise --mem)")]
    InitramfsFit(
        PathBuf,
        #[source] arch::x86_64::boot_params::BootParamsError,
    ),
    /// The initramfs could not be copied into guest memory.
    #[error("cannot read initramfs '{0}' into guest memory")]
    ReadInitramfs(PathBuf, #[source] vm_memory::GuestMemoryError),
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
/// a host MTU that differs from the guest's.
fn open_tap(net: &NicConfig, fds: &mut TapFds) -> Result<Tap, BuildError> {
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

/// What the kernel file turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// An ELF vmlinux, entered at its 64-bit entry point.
    Elf,
    /// A bzImage, entered through the 64-bit boot protocol.
    BzImage,
}

/// Recognises a kernel image from its first bytes: the ELF magic, or the
/// "HdrS" boot-protocol signature at offset 0x202 of a bzImage.
pub fn detect_kernel_format(head: &[u8]) -> Option<KernelFormat> {
    if head.starts_with(b"\x7fELF") {
        return Some(KernelFormat::Elf);
    }
    if head.get(0x202..0x206) == Some(b"HdrS") {
        return Some(KernelFormat::BzImage);
    }
    None
}

/// The size a bzImage must have according to its setup header (Linux boot
/// protocol: `setup_sects` at 0x1f1, 0 meaning 4, plus the boot sector, then
/// `syssize` 16-byte paragraphs of protected-mode code at 0x1f4).
/// linux-loader reads what is there, so a cut image would boot into garbage.
pub fn bzimage_expected_len(head: &[u8]) -> Option<u64> {
    let setup_sects = match *head.get(0x1f1)? {
        0 => 4,
        n => u64::from(n),
    };
    let syssize = u32::from_le_bytes(head.get(0x1f4..0x1f8)?.try_into().ok()?);
    Some((setup_sects + 1) * 512 + u64::from(syssize) * 16)
}

fn open_kernel(path: &Path) -> Result<(File, KernelFormat), BuildError> {
    let mut file = File::open(path).map_err(|e| BuildError::OpenKernel(path.into(), e))?;
    let mut head = [0u8; 0x206];
    let n = read_up_to(&mut file, &mut head).map_err(|e| BuildError::OpenKernel(path.into(), e))?;
    let format = detect_kernel_format(&head[..n]).ok_or(BuildError::KernelFormat(path.into()))?;
    if format == KernelFormat::BzImage {
        let len = file
            .metadata()
            .map_err(|e| BuildError::OpenKernel(path.into(), e))?
            .len();
        let want = bzimage_expected_len(&head[..n]).unwrap_or(u64::MAX);
        if len < want {
            return Err(BuildError::Truncated(path.into(), want, len));
        }
    }
    file.seek(SeekFrom::Start(0))
        .map_err(|e| BuildError::OpenKernel(path.into(), e))?;
    Ok((file, format))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
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
        added.push(host::PVM_CMDLINE.to_string());
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
struct Steps {
    last: Instant,
    took: Vec<(&'static str, f64)>,
}

impl Steps {
    fn new() -> Self {
        Steps {
            last: Instant::now(),
            took: Vec::with_capacity(10),
        }
    }

    /// Ends step `name`.
    fn done(&mut self, name: &'static str) {
        let now = Instant::now();
        self.took
            .push((name, (now - self.last).as_secs_f64() * 1e3));
        self.last = now;
    }

    fn log(&self) {
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
/// [`claim_tap_fds`] took.
pub fn build(cfg: &VmmConfig, mut tap_fds: TapFds) -> Result<Vmm, BuildError> {
    let mut steps = Steps::new();
    // 0. The files: a typo in a path is the commonest mistake; say so first.
    let (mut kernel_file, format) = open_kernel(&cfg.kernel)?;
    let metrics = match &cfg.metrics {
        Some(m) => {
            Some(Metrics::open(&m.path).map_err(|e| BuildError::Metrics(m.path.clone(), e))?)
        }
        None => None,
    };
    let initramfs = match &cfg.initramfs {
        Some(p) => {
            let f = File::open(p).map_err(|e| BuildError::OpenInitramfs(p.clone(), e))?;
            let len = f
                .metadata()
                .map_err(|e| BuildError::OpenInitramfs(p.clone(), e))?
                .len();
            Some((p.clone(), f, len))
        }
        None => None,
    };
    steps.done("files");

    // 1. KVM.
    let kvm = kvm::open_and_check()?;
    let max_vcpus = kvm.get_max_vcpus();
    if usize::from(cfg.vcpus) > max_vcpus {
        return Err(BuildError::TooManyVcpus(cfg.vcpus, max_vcpus));
    }
    let vm = kvm
        .create_vm()
        .map_err(|e| BuildError::Vm("create a VM", e))?;
    steps.done("kvm");
    // 2. Memory, before the irqchip (as Firecracker orders it): the first
    // memory slot set after KVM_CREATE_IRQCHIP or KVM_SET_TSS_ADDR sleeps
    // in the kernel for 2 to 14 ms on the development hosts (0.2 ms of CPU),
    // the same call before them takes 0.2 ms.
    let mem_bytes = cfg.mem_mib << 20;
    let mem = memory::create_guest_memory(&vm, &arch_memory_regions(mem_bytes), cfg.mem_mib)?;
    steps.done("memory");
    vm.set_tss_address(KVM_TSS_ADDRESS)
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
        .map_err(|e| BuildError::Vm("create the PIT", e))?;
    steps.done("irqchip");

    let pvm_host = host::is_pvm_host();
    let quirks = host::quirks_enabled(cfg.host_quirks, pvm_host);
    if quirks {
        info!(
            "PVM-backed KVM {}: adding '{}' to the guest command line and recovering INT3 \
             emulation failures (--host-quirks off disables this)",
            if pvm_host {
                "detected"
            } else {
                "assumed (--host-quirks on)"
            },
            host::PVM_CMDLINE
        );
    }

    // 3. Devices.
    let mut events: Events = EventManager::new()
        .map_err(|e| BuildError::EventLoop(std::io::Error::other(e.to_string())))?;
    let exit = ExitSink::new().map_err(BuildError::EventLoop)?;
    let panicked = Arc::new(AtomicBool::new(false));
    let mut devices = DeviceManager::new();
    let console = ConsoleOut::new(std::io::stdout(), panicked.clone());
    let serial = devices.attach_serial(&vm, Box::new(console))?;
    let i8042 = devices.attach_i8042()?;
    let mut tap_names = HashSet::new();
    for net in &cfg.nets {
        let tap = open_tap(net, &mut tap_fds)?;
        if !tap_names.insert(tap.if_name().to_string()) {
            return Err(BuildError::DuplicateTap(tap.if_name().to_string()));
        }
        devices.attach_net(&vm, &mem, net, tap, &mut events)?;
    }
    steps.done("devices");

    // 4. Kernel and initramfs.
    let kernel: KernelLoaderResult = match format {
        KernelFormat::Elf => Elf::load(
            &mem,
            None,
            &mut kernel_file,
            Some(GuestAddress(HIMEM_START)),
        ),
        KernelFormat::BzImage => BzImage::load(
            &mem,
            None,
            &mut kernel_file,
            Some(GuestAddress(HIMEM_START)),
        ),
    }
    .map_err(|e| BuildError::LoadKernel(cfg.kernel.clone(), e))?;
    let entry = kernel_entry_point(&kernel);
    steps.done("kernel");

    let initrd = match initramfs {
        Some((path, mut file, len)) => {
            // Keep the initramfs clear of the kernel, including the room a
            // bzImage needs to decompress itself into (init_size).
            let init_size = kernel.setup_header.map_or(0, |h| u64::from(h.init_size));
            // kernel_end is an absolute guest address; init_size counts from
            // the load address.
            let min = GuestAddress(kernel.kernel_end.max(kernel.kernel_load.0 + init_size));
            let size = usize::try_from(len).unwrap_or(usize::MAX);
            let addr = initrd_load_addr(&mem, size, kernel.setup_header.as_ref(), min)
                .map_err(|e| BuildError::InitramfsFit(path.clone(), e))?;
            let mut slice = mem
                .get_slice(addr, size)
                .map_err(|e| BuildError::ReadInitramfs(path.clone(), e))?;
            file.read_exact_volatile(&mut slice)
                .map_err(|e| BuildError::ReadInitramfs(path.clone(), e.into()))?;
            Some((addr, size))
        }
        None => None,
    };
    steps.done("initramfs");

    // 5. Boot tables.
    let (cmdline, added) = compose_cmdline(
        cfg.boot_args.as_deref(),
        quirks,
        devices.cmdline_words(),
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
    let cmdline_size = write_cmdline(&mem, &cmdline).map_err(BuildError::BootParams)?;
    configure_zero_page(
        &mem,
        &ZeroPageConfig {
            cmdline_addr: GuestAddress(CMDLINE_START),
            cmdline_size,
            initrd,
            setup_header: kernel.setup_header,
        },
    )
    .map_err(BuildError::BootParams)?;
    setup_mptable(&mem, cfg.vcpus, arch::x86_64::layout::IRQ_MAX as u8)
        .map_err(BuildError::Mptable)?;
    steps.done("boot tables");

    // 6. vCPUs.
    let base_cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(|e| BuildError::Vm("report supported CPUID", e))?;
    let devices = Arc::new(devices);
    let mut vcpus = Vec::with_capacity(cfg.vcpus.into());
    for id in 0..cfg.vcpus {
        let fd = vm
            .create_vcpu(u64::from(id))
            .map_err(|e| VcpuError::Create(id, e))?;
        let vcpu = Vcpu::new(fd, id, devices.clone(), quirks);
        let boot = (id == 0).then_some((entry.0, ZERO_PAGE_START));
        vcpu.configure(&base_cpuid, cfg.vcpus, &mem, boot)?;
        vcpus.push(vcpu);
    }
    steps.done("vcpus");
    steps.log();
    info!(
        "{} kernel at {:#x}, {} MiB, {} vCPU(s)",
        if format == KernelFormat::Elf {
            "ELF"
        } else {
            "bzImage"
        },
        entry.0,
        cfg.mem_mib,
        cfg.vcpus
    );

    Ok(Vmm::new(
        KvmVm::new(kvm, vm, mem),
        Devices {
            manager: devices,
            events,
            serial,
            i8042,
            panicked,
        },
        vcpus,
        exit,
        metrics,
        cfg.metrics.as_ref().map_or(0, |m| m.interval_s),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_formats_are_recognised_from_their_magic() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        assert_eq!(detect_kernel_format(&elf), Some(KernelFormat::Elf));
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(detect_kernel_format(&bz), Some(KernelFormat::BzImage));
        assert_eq!(
            detect_kernel_format(b"#!/bin/sh\necho not a kernel\n"),
            None
        );
        assert_eq!(detect_kernel_format(&[]), None);
        // A file cut before the signature is not a bzImage.
        assert_eq!(detect_kernel_format(&bz[..0x204]), None);
    }

    #[test]
    fn bzimage_length_comes_from_the_setup_header() {
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        bz[0x1f1] = 27;
        bz[0x1f4..0x1f8].copy_from_slice(&0x1_0000u32.to_le_bytes());
        assert_eq!(bzimage_expected_len(&bz), Some(28 * 512 + 0x10_0000));
        // setup_sects 0 means the historical 4.
        bz[0x1f1] = 0;
        assert_eq!(bzimage_expected_len(&bz), Some(5 * 512 + 0x10_0000));
        assert_eq!(bzimage_expected_len(&bz[..0x1f6]), None);
    }

    #[test]
    fn cmdline_has_defaults_quirks_devices_then_user_words() {
        let words = vec!["virtio_mmio.device=4K@0xd0000000:5".to_string()];
        let (c, added) = compose_cmdline(None, true, &words, Some(" minivmm.mode=serve ")).unwrap();
        assert_eq!(added, vec![host::PVM_CMDLINE.to_string(), words[0].clone()]);
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
            nets: Vec::new(),
            metrics: None,
            logger: Default::default(),
            host_quirks: crate::config::HostQuirks::Off,
            seccomp: crate::seccomp::SeccompMode::Off,
        };
        let err = build(&cfg("/nonexistent/bzImage"), TapFds::new())
            .err()
            .unwrap();
        assert!(matches!(err, BuildError::OpenKernel(..)), "{err}");
        let dir = std::env::temp_dir().join(format!("minivmm-garbage-{}", std::process::id()));
        std::fs::write(&dir, b"this is not a kernel").unwrap();
        let err = build(&cfg(dir.to_str().unwrap()), TapFds::new())
            .err()
            .unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(err, BuildError::KernelFormat(_)), "{err}");
        assert!(err
            .to_string()
            .contains("neither an ELF vmlinux nor a bzImage"));
    }
}
