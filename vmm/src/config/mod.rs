// SPDX-License-Identifier: Apache-2.0
//! Typed configuration of one VM: [`VmmConfig`], the whole of it.
//!
//! Two inputs describe a VM: the command line ([`cli`]) and a
//! Firecracker-style config file ([`mod@file`]). Each turns its text into
//! [`settings::Settings`], which holds only what the user wrote;
//! [`settings::Settings::overlay`] layers the command line over the file and
//! [`settings::Settings::finish`] applies the defaults and validates
//! everything, network interfaces through [`net`], into one [`VmmConfig`].
//! The builder consumes that; [`render`] writes one back in the file's
//! layout (`GET /vm/config`). Dependencies point one way: `cli` → `file` →
//! `settings` → the device sections (`net`, `drive`, `entropy`, `vsock`, `balloon`) → the shared pieces
//! ([`parse`], the value parsers; [`ids`], the rule for instance and device
//! ids) → `error` → this module, which depends on none of them (`render`
//! reads `net` and this module only); [`json`] (the parser that refuses a
//! key given twice, for files and API bodies) depends on none of them.
//!
//! Plain data only: nothing here opens a file or touches the host. A
//! `fd=N` is a number, claimed by the builder, and a drive's image is a
//! path, opened by the builder; so a config can be compared, cloned and
//! tested without the host. The bounds below are the ones every accepted
//! configuration is within.

use std::collections::BTreeMap;
use std::path::PathBuf;

use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use log::LevelFilter;

use crate::process::seccomp::SeccompMode;

pub mod balloon;
pub mod cli;
pub mod drive;
pub mod entropy;
pub mod error;
pub mod fc_flags;
pub mod file;
pub mod ids;
pub mod json;
pub mod mmds;
pub mod net;
pub mod parse;
pub mod render;
pub mod settings;
pub mod vsock;

/// Smallest guest memory we accept. Below this even the tiny guest kernel
/// cannot unpack itself and its initramfs, so fail before boot with a clear line.
pub const MIN_MEM_MIB: u64 = 32;
/// The default guest memory size in MiB.
pub const DEFAULT_MEM_MIB: u64 = 128;

/// The largest guest memory size: 64 GiB keeps our identity-mapped boot page
/// tables and the e820 map simple, and is far above what a network test VM needs.
pub const MAX_MEM_MIB: u64 = 64 * 1024;
/// The largest vCPU count: APIC ids are one byte in the MP table and the
/// IOAPIC id follows the last CPU.
pub const MAX_VCPUS: u8 = 254;
/// The most virtio devices (network cards, drives, the entropy and vsock
/// devices and the balloon together): one IRQ line each between the layout's IRQ_BASE and IRQ_MAX.
pub const MAX_NICS: usize =
    (arch::x86_64::layout::IRQ_MAX - arch::x86_64::layout::IRQ_BASE + 1) as usize;
/// The default metrics flush interval (Firecracker's).
pub const DEFAULT_METRICS_INTERVAL_S: u64 = 60;

/// Whether to apply the recoveries a PVM-backed KVM host needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HostQuirks {
    /// Detect the host and apply them only there.
    #[default]
    Auto,
    /// Apply them whatever the host.
    On,
    /// Never apply them.
    Off,
}

/// The kinds of virtio device a VM may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// A network interface (virtio-net).
    Net,
    /// A drive (virtio-blk).
    Block,
    /// The entropy device (virtio-rng).
    Rng,
    /// The vsock device (virtio-vsock).
    Vsock,
    /// The balloon (virtio-balloon).
    Balloon,
}

impl DeviceKind {
    /// One device of the kind in words, as messages name it (Firecracker's
    /// words): `network interface`, `drive`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Net => "network interface",
            DeviceKind::Block => "drive",
            DeviceKind::Rng => "entropy device",
            DeviceKind::Vsock => "vsock device",
            DeviceKind::Balloon => "balloon device",
        }
    }

    /// [`name`](Self::name) with its article, for a message about two.
    pub fn a_name(self) -> &'static str {
        match self {
            DeviceKind::Net => "a network interface",
            DeviceKind::Block => "a drive",
            DeviceKind::Rng => "the entropy device",
            DeviceKind::Vsock => "the vsock device",
            DeviceKind::Balloon => "the balloon device",
        }
    }

    /// The field of Firecracker's bodies that names a device of the kind
    /// (`iface_id`, `drive_id`); none for the one entropy device, nor for
    /// the one vsock device (whose `vsock_id` is deprecated and ignored),
    /// nor for the one balloon.
    pub fn id_key(self) -> Option<&'static str> {
        match self {
            DeviceKind::Net => Some("iface_id"),
            DeviceKind::Block => Some("drive_id"),
            DeviceKind::Rng | DeviceKind::Vsock | DeviceKind::Balloon => None,
        }
    }

    /// Whether a `PATCH` that changes nothing is refused (Firecracker's
    /// rule for drives) rather than answered as done (its rule for
    /// network interfaces).
    pub fn patch_needs_a_change(self) -> bool {
        self == DeviceKind::Block
    }
}

/// Where a NIC's frames go on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TapBackend {
    /// A TAP opened by name (created, with a warning, if missing).
    Named(String),
    /// An already-open TAP descriptor inherited from the parent process;
    /// `name`, if given, must be the interface it is attached to.
    Fd {
        /// The descriptor number.
        fd: i32,
        /// The interface name the user expects.
        name: Option<String>,
    },
}

/// One guest network interface (a network card): its id, its host TAP and
/// the virtio-net device's settings (MAC, queue size, weights, offered
/// features, rate limiters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NicConfig {
    /// Metrics key and log name (`net0`, `net1`, ... by default).
    pub id: String,
    /// The host side.
    pub tap: TapBackend,
    /// What the virtio-net device is built with.
    pub device: devices::virtio::net::NetConfig,
}

/// One drive: the virtio-blk device's settings and what the kernel command
/// line says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriveConfig {
    /// The guest boots from it: minivmm adds `root=` and `ro`/`rw`.
    pub is_root_device: bool,
    /// `root=PARTUUID=` instead of `root=/dev/vdX` (a partitioned image).
    pub partuuid: Option<String>,
    /// What the virtio-blk device is built with (its id, image, engine,
    /// cache type, limiter).
    pub device: devices::virtio::block::BlockConfig,
}

/// Where and how often metrics are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// A file (appended to) or a FIFO (kept open).
    pub path: PathBuf,
    /// Seconds between lines; 0 writes only at exit and on SIGUSR1.
    pub interval_s: u64,
    /// Firecracker's `emit_id`: accepted and kept; minivmm's lines carry
    /// the `id` whatever it says.
    pub emit_id: bool,
    /// Firecracker's `properties`: operator key-value pairs written under
    /// `properties` in every line.
    pub properties: BTreeMap<String, String>,
}

/// Which pages back guest memory (Firecracker's `machine-config.huge_pages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HugePages {
    /// Ordinary 4 KiB pages (`"None"`).
    #[default]
    None,
    /// Transparent huge pages: the mapping is advised `MADV_HUGEPAGE`.
    Transparent,
    /// Explicit 2 MiB pages from the host's hugetlbfs pool (`"2M"`).
    Hugetlbfs2M,
}

impl HugePages {
    /// Firecracker's spelling.
    pub fn name(self) -> &'static str {
        match self {
            HugePages::None => "None",
            HugePages::Transparent => "Transparent",
            HugePages::Hugetlbfs2M => "2M",
        }
    }

    /// Parses Firecracker's spelling (exactly as its API takes it).
    pub fn parse(s: &str) -> Option<HugePages> {
        [
            HugePages::None,
            HugePages::Transparent,
            HugePages::Hugetlbfs2M,
        ]
        .into_iter()
        .find(|h| h.name() == s)
    }
}

/// Where the console's output goes (Firecracker's `PUT /serial`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SerialConfig {
    /// A file (appended to) or FIFO; stdout when absent.
    pub out_path: Option<PathBuf>,
    /// Bytes of console output let through; what exceeds it is dropped.
    pub rate_limiter: Option<TokenBucketConfig>,
}

/// How log lines are filtered and where they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoggerConfig {
    /// A file (appended to) or a FIFO; stderr when absent.
    pub path: Option<PathBuf>,
    /// The level of every module (or of `module` only).
    pub level: LevelFilter,
    /// Log only this module path and its children (Firecracker's `module`).
    pub module: Option<String>,
    /// Add the source file and line to every line.
    pub show_origin: bool,
    /// Show the level in every line (Firecracker's `show_level`; minivmm's
    /// default is to show it, so only an explicit `false` hides it).
    pub show_level: bool,
}

impl Default for LoggerConfig {
    fn default() -> Self {
        LoggerConfig {
            path: None,
            level: LevelFilter::Warn,
            module: None,
            show_origin: false,
            show_level: true,
        }
    }
}

/// Everything needed to build and run one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmmConfig {
    /// Kernel image (bzImage or ELF vmlinux).
    pub kernel: PathBuf,
    /// Optional initramfs.
    pub initramfs: Option<PathBuf>,
    /// The whole kernel command line (Firecracker's `boot_args`); the
    /// builder's default when absent.
    pub boot_args: Option<String>,
    /// Words appended after everything else (`--cmdline`).
    pub cmdline_extra: Option<String>,
    /// Guest memory in MiB.
    pub mem_mib: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// Two threads per core in the topology the guest sees (Firecracker's
    /// `smt`); one otherwise.
    pub smt: bool,
    /// Which pages back guest memory.
    pub huge_pages: HugePages,
    /// Whether KVM and the devices log the pages written to guest memory
    /// (Firecracker's `track_dirty_pages`), so that a Diff snapshot can
    /// write only those.
    pub track_dirty_pages: bool,
    /// Where the console's output goes.
    pub serial: SerialConfig,
    /// The network cards, in MMIO slot order.
    pub nets: Vec<NicConfig>,
    /// The drives, in MMIO slot order after the network cards.
    pub drives: Vec<DriveConfig>,
    /// The entropy device, if there is one (after the drives), under
    /// [`entropy::ENTROPY_ID`].
    pub entropy: Option<devices::virtio::rng::RngConfig>,
    /// The vsock device, if there is one (after the entropy device), under
    /// [`vsock::VSOCK_ID`].
    pub vsock: Option<devices::virtio::vsock::VsockConfig>,
    /// The balloon, if there is one (after the vsock device), under
    /// [`balloon::BALLOON_ID`]; its target and statistics interval follow
    /// the API's changes while the VM runs.
    pub balloon: Option<devices::virtio::balloon::BalloonConfig>,
    /// MMDS, if it serves any card.
    pub mmds: Option<mmds::MmdsConfig>,
    /// Periodic metrics, if wanted.
    pub metrics: Option<MetricsConfig>,
    /// Logging.
    pub logger: LoggerConfig,
    /// PVM host recoveries.
    pub host_quirks: HostQuirks,
    /// The system-call filter of every thread (`--seccomp`; the config file
    /// has no place for it, as Firecracker's has none).
    pub seccomp: SeccompMode,
}

impl VmmConfig {
    /// Every virtio device's kind and id, in MMIO window order.
    pub fn device_ids(&self) -> impl Iterator<Item = (DeviceKind, &str)> {
        let nets = self.nets.iter().map(|n| (DeviceKind::Net, n.id.as_str()));
        let drives = self
            .drives
            .iter()
            .map(|d| (DeviceKind::Block, d.device.id.as_str()));
        let entropy = self
            .entropy
            .as_ref()
            .map(|_| (DeviceKind::Rng, entropy::ENTROPY_ID));
        let vsock = self
            .vsock
            .as_ref()
            .map(|v| (DeviceKind::Vsock, v.id.as_str()));
        let balloon = self
            .balloon
            .as_ref()
            .map(|_| (DeviceKind::Balloon, balloon::BALLOON_ID));
        nets.chain(drives)
            .chain(entropy)
            .chain(vsock)
            .chain(balloon)
    }

    /// The rate limiter `name` (its field in Firecracker's layout) of the
    /// device `kind` `id`, to change it in place (`PATCH` on a running VM).
    pub fn limiter_mut(
        &mut self,
        kind: DeviceKind,
        id: &str,
        name: &str,
    ) -> Option<&mut RateLimiterConfig> {
        match kind {
            DeviceKind::Net => {
                let nic = &mut self.nets.iter_mut().find(|n| n.id == id)?.device;
                match name {
                    "rx_rate_limiter" => Some(&mut nic.rx_rate_limiter),
                    "tx_rate_limiter" => Some(&mut nic.tx_rate_limiter),
                    _ => None,
                }
            }
            DeviceKind::Block => {
                let drive = &mut self.drives.iter_mut().find(|d| d.device.id == id)?.device;
                (name == "rate_limiter").then_some(&mut drive.rate_limiter)
            }
            // Nothing of the entropy device changes while it runs (it has
            // no control); the balloon has no limiter.
            DeviceKind::Rng | DeviceKind::Balloon => None,
            DeviceKind::Vsock => None,
        }
    }

    /// The image path of the device `kind` `id`, if it has one, to change
    /// it in place.
    pub fn image_mut(&mut self, kind: DeviceKind, id: &str) -> Option<&mut PathBuf> {
        match kind {
            DeviceKind::Block => {
                let drive = self.drives.iter_mut().find(|d| d.device.id == id)?;
                Some(&mut drive.device.path)
            }
            DeviceKind::Net | DeviceKind::Rng | DeviceKind::Vsock | DeviceKind::Balloon => None,
        }
    }
}
