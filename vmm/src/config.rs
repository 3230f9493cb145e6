// SPDX-License-Identifier: Apache-2.0
//! Typed configuration of one VM.
//!
//! Two sources describe a VM: the command line (`cli.rs`) and a
//! Firecracker-style config file (`config_file.rs`). Each turns its text into
//! [`Settings`], which holds only what the user wrote; [`Settings::overlay`]
//! layers the command line over the file and [`Settings::finish`] applies the
//! defaults and validates everything into one [`VmmConfig`]. The builder
//! consumes that. Plain data only: a `fd=N` is a number here, claimed by the
//! builder, so a config can be compared, cloned and tested without the host.

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use devices::rate_limiter::{RateLimiterConfig, RateLimiterError};
use devices::virtio::net::device::MTU_RANGE;
use devices::virtio::net::{
    IoEngine, Offloads, DEFAULT_PASS_TIME_BUDGET_US, DEFAULT_QUEUE_SIZE, DEFAULT_WEIGHT_BYTES,
    DEFAULT_WEIGHT_PACKETS,
};
use log::LevelFilter;

/// Smallest guest memory we accept. Below this even the tiny guest kernel
/// cannot unpack itself and its initramfs, so fail before boot with a clear line.
pub const MIN_MEM_MIB: u64 = 32;
/// The default guest memory size in MiB.
pub const DEFAULT_MEM_MIB: u64 = 256;

/// Errors in user-supplied configuration values. Each is one line that
/// names the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The MAC address did not parse.
    #[error("invalid MAC address '{0}': expected six hex octets like 06:00:ac:10:00:02")]
    Mac(String),
    /// A multicast MAC cannot be a unicast NIC address.
    #[error("invalid MAC address '{0}': the multicast bit is set")]
    MulticastMac(String),
    /// Memory size is out of range.
    #[error("memory size {0} MiB is too small: at least {MIN_MEM_MIB} MiB is needed")]
    MemTooSmall(u64),
    /// Memory size would not fit the address space we lay out.
    #[error("memory size {0} MiB is too large: at most {max} MiB", max = MAX_MEM_MIB)]
    MemTooLarge(u64),
    /// vCPU count is zero.
    #[error("the vCPU count must be at least 1")]
    NoVcpus,
    /// vCPU count exceeds what the MP table and APIC ids support.
    #[error("{0} vCPUs is too many: at most {MAX_VCPUS} are supported")]
    TooManyVcpus(u64),
    /// A queue size that is not a power of two.
    #[error("queue size {0} must be a power of two between 2 and 32768")]
    QueueSize(u64),
    /// Bad value for the host quirks switch.
    #[error("invalid host quirks setting '{0}': expected auto, on or off")]
    Quirks(String),
    /// A number that does not parse.
    #[error("invalid number '{0}': expected decimal or 0x-prefixed hexadecimal")]
    Number(String),
    /// Neither the command line nor the config file names a kernel.
    #[error("no kernel: give --kernel or boot-source.kernel_image_path in --config-file")]
    NoKernel,
    /// A `--net` specification that does not parse.
    #[error("--net '{spec}': {reason}")]
    NetSpec {
        /// The specification as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A TAP name the kernel would refuse.
    #[error(
        "network interface '{id}': invalid TAP name '{name}': 1 to 15 bytes, no '/', NUL or space"
    )]
    TapName {
        /// The NIC.
        id: String,
        /// The name given.
        name: String,
    },
    /// A NIC without a TAP.
    #[error("network interface '{0}' has no TAP: give tap=NAME (host_dev_name) or fd=N")]
    NoTap(String),
    /// Two NICs on one TAP.
    #[error("TAP '{0}' is given to two network interfaces; each needs its own TAP")]
    DuplicateTap(String),
    /// Two NICs on one file descriptor.
    #[error("fd {0} is given to two network interfaces; each needs its own TAP")]
    DuplicateFd(i32),
    /// A descriptor minivmm itself uses.
    #[error("fd={0}: descriptors 0, 1 and 2 are minivmm's own; pass a TAP fd of 3 or more")]
    StdioFd(i64),
    /// Two NICs with one id.
    #[error("network interface id '{0}' is used twice")]
    DuplicateId(String),
    /// Two NICs with one MAC.
    #[error("MAC address {0} is given to two network interfaces")]
    DuplicateMac(MacAddr),
    /// An id that cannot be a metrics key.
    #[error(
        "invalid network interface id '{0}': 1 to 64 letters, digits, '_', '-' or '.', \
         and not 'vmm' or 'utc_timestamp_ms' (metrics keys)"
    )]
    BadId(String),
    /// More NICs than IRQ lines for them.
    #[error("{0} network interfaces is too many: at most {MAX_NICS}")]
    TooManyNics(usize),
    /// An MTU outside VIRTIO_NET_F_MTU's range.
    #[error("network interface '{id}': MTU {mtu} is outside 68..=65535")]
    Mtu {
        /// The NIC.
        id: String,
        /// The MTU given.
        mtu: u64,
    },
    /// An offload selection no driver may negotiate.
    #[error("network interface '{id}': {reason}")]
    Offloads {
        /// The NIC.
        id: String,
        /// Why.
        reason: &'static str,
    },
    /// A bad rate limiter bucket.
    #[error("network interface '{id}': {dir}_rate_limiter")]
    RateLimiter {
        /// The NIC.
        id: String,
        /// "rx" or "tx".
        dir: &'static str,
        /// What is wrong.
        #[source]
        source: RateLimiterError,
    },
    /// A log level that does not parse.
    #[error("invalid log level '{0}': expected off, error, warn(ing), info, debug or trace")]
    LogLevel(String),
    /// A metrics interval without a metrics path.
    #[error("a metrics interval needs a metrics path (--metrics or metrics.metrics_path)")]
    IntervalWithoutMetrics,
    /// The config file is bad.
    #[error(transparent)]
    File(#[from] crate::config_file::FileError),
}

/// The largest guest memory size: 64 GiB keeps our identity-mapped boot page
/// tables and the e820 map simple, and is far above what a network test VM needs.
pub const MAX_MEM_MIB: u64 = 64 * 1024;
/// The largest vCPU count: APIC ids are one byte in the MP table and the
/// IOAPIC id follows the last CPU.
pub const MAX_VCPUS: u8 = 254;
/// The most NICs: one IRQ line each between the layout's IRQ_BASE and IRQ_MAX.
pub const MAX_NICS: usize =
    (arch::x86_64::layout::IRQ_MAX - arch::x86_64::layout::IRQ_BASE + 1) as usize;
/// The default metrics flush interval (Firecracker's).
pub const DEFAULT_METRICS_INTERVAL_S: u64 = 60;

/// A guest NIC MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// A stable, locally administered default (06: is the locally
    /// administered, unicast prefix) so that guests get the same address on
    /// every boot and host-side neighbour entries stay valid.
    pub const DEFAULT: MacAddr = MacAddr([0x06, 0x00, 0xac, 0x10, 0x00, 0x02]);

    /// The default MAC of the NIC at `index`: [`MacAddr::DEFAULT`] with the
    /// index added to the last octet, so NICs never share one by default.
    pub fn default_for(index: usize) -> MacAddr {
        let mut m = Self::DEFAULT.0;
        m[5] = m[5].wrapping_add(index as u8);
        MacAddr(m)
    }
}

impl FromStr for MacAddr {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() != 6 {
            return Err(ConfigError::Mac(s.to_string()));
        }
        let mut mac = [0u8; 6];
        for (byte, part) in mac.iter_mut().zip(parts) {
            if part.len() != 2 {
                return Err(ConfigError::Mac(s.to_string()));
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| ConfigError::Mac(s.to_string()))?;
        }
        if mac[0] & 1 != 0 {
            return Err(ConfigError::MulticastMac(s.to_string()));
        }
        Ok(MacAddr(mac))
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

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

impl FromStr for HostQuirks {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(HostQuirks::Auto),
            "on" => Ok(HostQuirks::On),
            "off" => Ok(HostQuirks::Off),
            _ => Err(ConfigError::Quirks(s.to_string())),
        }
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

/// One guest network card: its id, its host TAP and the device's settings
/// (MAC, queue size, weights, offered features, rate limiters).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Metrics key and log name (`net0`, `net1`, ... by default).
    pub id: String,
    /// The host side.
    pub tap: TapBackend,
    /// What the virtio-net device is built with.
    pub device: devices::virtio::net::NetConfig,
}

/// Where and how often metrics are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// A file (appended to) or a FIFO (kept open).
    pub path: PathBuf,
    /// Seconds between lines; 0 writes only at exit and on SIGUSR1.
    pub interval_s: u64,
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
}

impl Default for LoggerConfig {
    fn default() -> Self {
        LoggerConfig {
            path: None,
            level: LevelFilter::Warn,
            module: None,
            show_origin: false,
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
    /// The network cards, in MMIO slot order.
    pub nets: Vec<NetConfig>,
    /// Periodic metrics, if wanted.
    pub metrics: Option<MetricsConfig>,
    /// Logging.
    pub logger: LoggerConfig,
    /// PVM host recoveries.
    pub host_quirks: HostQuirks,
}

/// One NIC as the user wrote it (a `--net`, a `--tap` or a config-file
/// interface): every field optional until [`Settings::finish`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetSpec {
    /// `id=` / `iface_id`.
    pub id: Option<String>,
    /// `tap=` / `host_dev_name`.
    pub tap: Option<String>,
    /// `fd=` / `host_dev_fd`.
    pub fd: Option<i64>,
    /// `mac=` / `guest_mac`.
    pub mac: Option<MacAddr>,
    /// `queue_size=`.
    pub queue_size: Option<u64>,
    /// `mtu=`.
    pub mtu: Option<u64>,
    /// `offloads=` and the `offload_*` switches.
    pub offloads: Option<Offloads>,
    /// `mrg_rxbuf=`.
    pub mrg_rxbuf: Option<bool>,
    /// `tx_weight_bytes=`.
    pub tx_weight_bytes: Option<u64>,
    /// `tx_weight_packets=`.
    pub tx_weight_packets: Option<u64>,
    /// `rx_weight_bytes=`.
    pub rx_weight_bytes: Option<u64>,
    /// `rx_weight_packets=`.
    pub rx_weight_packets: Option<u64>,
    /// `pass_time_budget_us=`.
    pub pass_time_budget_us: Option<u64>,
    /// The receive limiter.
    pub rx_rate_limiter: Option<RateLimiterConfig>,
    /// The transmit limiter.
    pub tx_rate_limiter: Option<RateLimiterConfig>,
    /// `io_engine=` / `io_engine`.
    pub io_engine: Option<IoEngine>,
}

/// Parses an `io_engine` value: `Async` (io_uring batches) or `Sync`, in
/// any case, as Firecracker spells them.
pub fn parse_io_engine(v: &str) -> Result<IoEngine, String> {
    match v.to_ascii_lowercase().as_str() {
        "async" => Ok(IoEngine::Async),
        "sync" => Ok(IoEngine::Sync),
        _ => Err(format!("io_engine '{v}' is neither Async nor Sync")),
    }
}

impl NetSpec {
    /// `self` with every field it leaves open taken from `defaults`.
    fn or(self, d: &NetSpec) -> NetSpec {
        NetSpec {
            id: self.id.or_else(|| d.id.clone()),
            tap: self.tap.or_else(|| d.tap.clone()),
            fd: self.fd.or(d.fd),
            mac: self.mac.or(d.mac),
            queue_size: self.queue_size.or(d.queue_size),
            mtu: self.mtu.or(d.mtu),
            offloads: self.offloads.or(d.offloads),
            mrg_rxbuf: self.mrg_rxbuf.or(d.mrg_rxbuf),
            tx_weight_bytes: self.tx_weight_bytes.or(d.tx_weight_bytes),
            tx_weight_packets: self.tx_weight_packets.or(d.tx_weight_packets),
            rx_weight_bytes: self.rx_weight_bytes.or(d.rx_weight_bytes),
            rx_weight_packets: self.rx_weight_packets.or(d.rx_weight_packets),
            pass_time_budget_us: self.pass_time_budget_us.or(d.pass_time_budget_us),
            rx_rate_limiter: self.rx_rate_limiter.or(d.rx_rate_limiter),
            io_engine: self.io_engine.or(d.io_engine),
            tx_rate_limiter: self.tx_rate_limiter.or(d.tx_rate_limiter),
        }
    }
}

/// What one source (the config file or the command line) says, before
/// defaults. `None` means "not said here".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// Kernel image.
    pub kernel: Option<PathBuf>,
    /// Initramfs.
    pub initramfs: Option<PathBuf>,
    /// The whole kernel command line.
    pub boot_args: Option<String>,
    /// Words appended to the command line.
    pub cmdline_extra: Option<String>,
    /// Guest memory in MiB.
    pub mem_mib: Option<u64>,
    /// vCPU count.
    pub vcpus: Option<u64>,
    /// NICs in order.
    pub nets: Vec<NetSpec>,
    /// NIC settings for every NIC that does not set them itself.
    pub net_defaults: NetSpec,
    /// Metrics path.
    pub metrics_path: Option<PathBuf>,
    /// Metrics interval in seconds.
    pub metrics_interval_s: Option<u64>,
    /// Log path.
    pub log_path: Option<PathBuf>,
    /// Log level.
    pub log_level: Option<LevelFilter>,
    /// Log module filter.
    pub log_module: Option<String>,
    /// Log origins.
    pub log_show_origin: Option<bool>,
    /// PVM host recoveries.
    pub host_quirks: Option<HostQuirks>,
}

impl Settings {
    /// Layers `over` (the command line) on top of `self` (the file): a value
    /// `over` gives wins, NICs of `over` come after those of `self`, words
    /// for the command line are appended, and NIC defaults merge key by key.
    pub fn overlay(self, over: Settings) -> Settings {
        let mut nets = self.nets;
        nets.extend(over.nets);
        Settings {
            kernel: over.kernel.or(self.kernel),
            initramfs: over.initramfs.or(self.initramfs),
            boot_args: over.boot_args.or(self.boot_args),
            cmdline_extra: match (self.cmdline_extra, over.cmdline_extra) {
                (Some(a), Some(b)) => Some(format!("{a} {b}")),
                (a, b) => b.or(a),
            },
            mem_mib: over.mem_mib.or(self.mem_mib),
            vcpus: over.vcpus.or(self.vcpus),
            nets,
            net_defaults: over.net_defaults.or(&self.net_defaults),
            metrics_path: over.metrics_path.or(self.metrics_path),
            metrics_interval_s: over.metrics_interval_s.or(self.metrics_interval_s),
            log_path: over.log_path.or(self.log_path),
            log_level: over.log_level.or(self.log_level),
            log_module: over.log_module.or(self.log_module),
            log_show_origin: over.log_show_origin.or(self.log_show_origin),
            host_quirks: over.host_quirks.or(self.host_quirks),
        }
    }

    /// Applies the defaults and validates everything.
    pub fn finish(self) -> Result<VmmConfig, ConfigError> {
        let kernel = self.kernel.ok_or(ConfigError::NoKernel)?;
        if self.nets.len() > MAX_NICS {
            return Err(ConfigError::TooManyNics(self.nets.len()));
        }
        let mut nets = Vec::with_capacity(self.nets.len());
        for (index, spec) in self.nets.into_iter().enumerate() {
            nets.push(finish_net(index, spec.or(&self.net_defaults))?);
        }
        check_unique(&nets)?;
        let metrics = match (self.metrics_path, self.metrics_interval_s) {
            (Some(path), interval) => Some(MetricsConfig {
                path,
                interval_s: interval.unwrap_or(DEFAULT_METRICS_INTERVAL_S),
            }),
            (None, Some(_)) => return Err(ConfigError::IntervalWithoutMetrics),
            (None, None) => None,
        };
        let defaults = LoggerConfig::default();
        Ok(VmmConfig {
            kernel,
            initramfs: self.initramfs,
            boot_args: self.boot_args,
            cmdline_extra: self.cmdline_extra,
            mem_mib: validate_mem(self.mem_mib.unwrap_or(DEFAULT_MEM_MIB))?,
            vcpus: validate_vcpus(self.vcpus.unwrap_or(1))?,
            nets,
            metrics,
            logger: LoggerConfig {
                path: self.log_path,
                level: self.log_level.unwrap_or(defaults.level),
                module: self.log_module,
                show_origin: self.log_show_origin.unwrap_or(defaults.show_origin),
            },
            host_quirks: self.host_quirks.unwrap_or_default(),
        })
    }
}

/// Whether `id` can be a NIC id and a metrics key.
fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        && id != "vmm"
        && id != "utc_timestamp_ms"
}

/// Checks a TAP name as the kernel would (IFNAMSIZ, no '/', no NUL), so a
/// typo is a configuration error before anything is opened.
fn valid_tap_name(name: &str) -> bool {
    (1..16).contains(&name.len())
        && !name.contains(['/', '\0'])
        && !name.contains(char::is_whitespace)
}

fn finish_net(index: usize, s: NetSpec) -> Result<NetConfig, ConfigError> {
    let id = s.id.unwrap_or_else(|| format!("net{index}"));
    if !valid_id(&id) {
        return Err(ConfigError::BadId(id));
    }
    if let Some(name) = &s.tap {
        if !valid_tap_name(name) {
            return Err(ConfigError::TapName {
                id,
                name: name.clone(),
            });
        }
    }
    let tap = match (s.fd, s.tap) {
        (Some(fd), name) => {
            if !(3..=i64::from(i32::MAX)).contains(&fd) {
                return Err(ConfigError::StdioFd(fd));
            }
            TapBackend::Fd {
                fd: fd as i32,
                name,
            }
        }
        (None, Some(name)) => TapBackend::Named(name),
        (None, None) => return Err(ConfigError::NoTap(id)),
    };
    let mtu = match s.mtu {
        Some(m) if m > u64::from(u16::MAX) || !MTU_RANGE.contains(&(m as u16)) => {
            return Err(ConfigError::Mtu { id, mtu: m })
        }
        m => m.map(|m| m as u16),
    };
    let offloads = s.offloads.unwrap_or(Offloads::ALL);
    offloads
        .validate()
        .map_err(|reason| ConfigError::Offloads {
            id: id.clone(),
            reason,
        })?;
    let rx_rate_limiter = s.rx_rate_limiter.unwrap_or_default();
    let tx_rate_limiter = s.tx_rate_limiter.unwrap_or_default();
    for (dir, rl) in [("rx", &rx_rate_limiter), ("tx", &tx_rate_limiter)] {
        rl.validate().map_err(|source| ConfigError::RateLimiter {
            id: id.clone(),
            dir,
            source,
        })?;
    }
    let device = devices::virtio::net::NetConfig {
        mac: s.mac.unwrap_or_else(|| MacAddr::default_for(index)).0,
        queue_size: validate_queue_size(s.queue_size.unwrap_or(DEFAULT_QUEUE_SIZE.into()))?,
        tx_weight_bytes: s.tx_weight_bytes.unwrap_or(DEFAULT_WEIGHT_BYTES),
        tx_weight_packets: s.tx_weight_packets.unwrap_or(DEFAULT_WEIGHT_PACKETS),
        rx_weight_bytes: s.rx_weight_bytes.unwrap_or(DEFAULT_WEIGHT_BYTES),
        rx_weight_packets: s.rx_weight_packets.unwrap_or(DEFAULT_WEIGHT_PACKETS),
        pass_time_budget_us: s.pass_time_budget_us.unwrap_or(DEFAULT_PASS_TIME_BUDGET_US),
        offloads,
        mrg_rxbuf: s.mrg_rxbuf.unwrap_or(true),
        mtu,
        rx_rate_limiter,
        tx_rate_limiter,
        bounce_buffer: false,
        io_engine: s.io_engine.unwrap_or_default(),
    };
    Ok(NetConfig { id, tap, device })
}

/// Two NICs may share neither an id, a TAP, a descriptor nor a MAC.
fn check_unique(nets: &[NetConfig]) -> Result<(), ConfigError> {
    let (mut ids, mut taps, mut fds, mut macs) = (
        HashSet::new(),
        HashSet::new(),
        HashSet::new(),
        HashSet::new(),
    );
    for n in nets {
        if !ids.insert(n.id.as_str()) {
            return Err(ConfigError::DuplicateId(n.id.clone()));
        }
        let name = match &n.tap {
            TapBackend::Named(name) => Some(name),
            TapBackend::Fd { fd, name } => {
                if !fds.insert(*fd) {
                    return Err(ConfigError::DuplicateFd(*fd));
                }
                name.as_ref()
            }
        };
        if let Some(name) = name {
            if !taps.insert(name.as_str()) {
                return Err(ConfigError::DuplicateTap(name.clone()));
            }
        }
        if !macs.insert(n.device.mac) {
            return Err(ConfigError::DuplicateMac(MacAddr(n.device.mac)));
        }
    }
    Ok(())
}

/// Parses an unsigned number in decimal or, with a `0x` prefix, hexadecimal
/// (`0x80000`, as vhost-net's weights are usually written).
pub fn parse_number(s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| ConfigError::Number(s.to_string()))
}

/// Parses a list of offload names: `csum`, `tso4`, `tso6`, `tso` (both),
/// `ufo`, or one of `all` and `none`. The result is not yet validated
/// (TSO without csum is caught by [`Settings::finish`]).
pub fn parse_offloads<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Offloads, String> {
    let mut o = Offloads::NONE;
    for name in names {
        match name.trim() {
            "csum" => o.csum = true,
            "tso4" => o.tso4 = true,
            "tso6" => o.tso6 = true,
            "tso" => (o.tso4, o.tso6) = (true, true),
            "ufo" => o.ufo = true,
            "all" => o = Offloads::ALL,
            "none" | "" => {}
            other => {
                return Err(format!(
                    "unknown offload '{other}': expected csum, tso4, tso6, tso, ufo, all or none"
                ))
            }
        }
    }
    Ok(o)
}

/// Parses a log level, Firecracker's spellings (`Warning`, any case) included.
pub fn parse_level(s: &str) -> Result<LevelFilter, ConfigError> {
    match s.to_ascii_lowercase().as_str() {
        "warning" => Ok(LevelFilter::Warn),
        l => l.parse().map_err(|_| ConfigError::LogLevel(s.to_string())),
    }
}

/// Checks the memory size.
pub fn validate_mem(mib: u64) -> Result<u64, ConfigError> {
    if mib < MIN_MEM_MIB {
        return Err(ConfigError::MemTooSmall(mib));
    }
    if mib > MAX_MEM_MIB {
        return Err(ConfigError::MemTooLarge(mib));
    }
    Ok(mib)
}

/// Checks the vCPU count against what the boot tables support; the KVM limit
/// is checked again by the builder once `/dev/kvm` is open.
pub fn validate_vcpus(n: u64) -> Result<u8, ConfigError> {
    match n {
        0 => Err(ConfigError::NoVcpus),
        n if n > u64::from(MAX_VCPUS) => Err(ConfigError::TooManyVcpus(n)),
        // The match arm above bounds n to u8.
        n => Ok(n as u8),
    }
}

/// Checks a virtqueue size (virtio 1.1 §2.6: a power of two, at most 32768).
pub fn validate_queue_size(n: u64) -> Result<u16, ConfigError> {
    if !(2..=32768).contains(&n) || !n.is_power_of_two() {
        return Err(ConfigError::QueueSize(n));
    }
    Ok(n as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_decimal_and_hex() {
        assert_eq!(parse_number("524288").unwrap(), 0x80000);
        assert_eq!(parse_number("0x80000").unwrap(), 0x80000);
        assert_eq!(parse_number("0X1F").unwrap(), 31);
        for bad in ["", "0x", "-1", "12k", "0x1g", "1.5"] {
            assert!(
                matches!(parse_number(bad), Err(ConfigError::Number(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn log_levels_in_both_spellings() {
        assert_eq!(parse_level("Warning").unwrap(), LevelFilter::Warn);
        assert_eq!(parse_level("warn").unwrap(), LevelFilter::Warn);
        assert_eq!(parse_level("INFO").unwrap(), LevelFilter::Info);
        assert_eq!(parse_level("Off").unwrap(), LevelFilter::Off);
        assert!(parse_level("loud").is_err());
    }

    fn nic(tap: &str) -> NetSpec {
        NetSpec {
            tap: Some(tap.into()),
            ..NetSpec::default()
        }
    }

    fn with_nets(nets: Vec<NetSpec>) -> Settings {
        Settings {
            kernel: Some("k".into()),
            nets,
            ..Settings::default()
        }
    }

    #[test]
    fn nics_get_ids_macs_and_defaults_by_position() {
        let cfg = with_nets(vec![nic("t0"), nic("t1")]).finish().unwrap();
        assert_eq!(cfg.nets[0].id, "net0");
        assert_eq!(cfg.nets[1].id, "net1");
        assert_eq!(cfg.nets[0].device.mac, MacAddr::DEFAULT.0);
        assert_eq!(cfg.nets[1].device.mac, [6, 0, 0xac, 0x10, 0, 3]);
        assert_eq!(cfg.nets[1].tap, TapBackend::Named("t1".into()));
        assert_eq!(
            cfg.nets[1].device,
            devices::virtio::net::NetConfig {
                mac: [6, 0, 0xac, 0x10, 0, 3],
                ..Default::default()
            }
        );
        assert_eq!(cfg.metrics, None);
        assert_eq!(cfg.logger, LoggerConfig::default());
    }

    #[test]
    fn a_nic_setting_beats_the_default_for_all_nics() {
        let mut s = with_nets(vec![
            NetSpec {
                queue_size: Some(64),
                ..nic("t0")
            },
            nic("t1"),
        ]);
        s.net_defaults.queue_size = Some(1024);
        let cfg = s.finish().unwrap();
        assert_eq!(cfg.nets[0].device.queue_size, 64);
        assert_eq!(cfg.nets[1].device.queue_size, 1024);
    }

    #[test]
    fn the_command_line_overlays_the_file() {
        let file = Settings {
            kernel: Some("file-k".into()),
            boot_args: Some("console=ttyS0".into()),
            cmdline_extra: Some("a".into()),
            mem_mib: Some(512),
            vcpus: Some(2),
            nets: vec![nic("t0")],
            metrics_path: Some("m".into()),
            ..Settings::default()
        };
        let cli = Settings {
            mem_mib: Some(128),
            cmdline_extra: Some("b".into()),
            nets: vec![nic("t1")],
            metrics_interval_s: Some(5),
            ..Settings::default()
        };
        let cfg = file.overlay(cli).finish().unwrap();
        assert_eq!(cfg.kernel, PathBuf::from("file-k"));
        assert_eq!((cfg.mem_mib, cfg.vcpus), (128, 2));
        assert_eq!(cfg.boot_args.as_deref(), Some("console=ttyS0"));
        assert_eq!(cfg.cmdline_extra.as_deref(), Some("a b"));
        assert_eq!(cfg.nets.len(), 2);
        assert_eq!(cfg.nets[1].id, "net1");
        assert_eq!(
            cfg.metrics,
            Some(MetricsConfig {
                path: "m".into(),
                interval_s: 5
            })
        );
    }

    #[test]
    fn bad_nic_sets_are_refused_with_their_reason() {
        let cases: Vec<(Vec<NetSpec>, &str)> = vec![
            (vec![nic("t0"), nic("t0")], "TAP 't0' is given to two"),
            (
                vec![
                    NetSpec {
                        fd: Some(5),
                        ..NetSpec::default()
                    },
                    NetSpec {
                        fd: Some(5),
                        ..NetSpec::default()
                    },
                ],
                "fd 5 is given to two",
            ),
            (
                vec![NetSpec {
                    fd: Some(1),
                    ..NetSpec::default()
                }],
                "0, 1 and 2",
            ),
            (
                vec![
                    NetSpec {
                        id: Some("a".into()),
                        ..nic("t0")
                    },
                    NetSpec {
                        id: Some("a".into()),
                        ..nic("t1")
                    },
                ],
                "id 'a' is used twice",
            ),
            (
                vec![
                    NetSpec {
                        mac: Some(MacAddr([2, 0, 0, 0, 0, 1])),
                        ..nic("t0")
                    },
                    NetSpec {
                        mac: Some(MacAddr([2, 0, 0, 0, 0, 1])),
                        ..nic("t1")
                    },
                ],
                "02:00:00:00:00:01 is given to two",
            ),
            (
                vec![NetSpec {
                    id: Some("vmm".into()),
                    ..nic("t0")
                }],
                "invalid network interface id 'vmm'",
            ),
            (vec![NetSpec::default()], "has no TAP"),
            (vec![nic("a-name-that-is-far-too-long")], "invalid TAP name"),
            (
                vec![NetSpec {
                    mtu: Some(67),
                    ..nic("t0")
                }],
                "MTU 67",
            ),
            (
                vec![NetSpec {
                    offloads: Some(Offloads {
                        ufo: true,
                        ..Offloads::NONE
                    }),
                    ..nic("t0")
                }],
                "need checksum offload",
            ),
            (
                vec![NetSpec {
                    tx_rate_limiter: Some(RateLimiterConfig {
                        bandwidth: Some(devices::rate_limiter::TokenBucketConfig {
                            size: 1000,
                            one_time_burst: 0,
                            refill_time: 0,
                        }),
                        ops: None,
                    }),
                    ..nic("t0")
                }],
                "tx_rate_limiter: bandwidth bucket: refill_time",
            ),
            (
                (0..20).map(|i| nic(&format!("t{i}"))).collect(),
                "20 network interfaces is too many",
            ),
        ];
        for (nets, want) in cases {
            let err = crate::error_line(&with_nets(nets).finish().unwrap_err());
            assert!(err.contains(want), "got '{err}', want '{want}'");
            assert!(!err.contains('\n'), "{err}");
        }
        let err = Settings::default().finish().unwrap_err();
        assert!(matches!(err, ConfigError::NoKernel));
        let err = Settings {
            metrics_interval_s: Some(1),
            ..with_nets(vec![])
        }
        .finish()
        .unwrap_err();
        assert!(matches!(err, ConfigError::IntervalWithoutMetrics));
    }

    #[test]
    fn mac_parses_and_prints() {
        let good = [
            ("06:00:ac:10:00:02", [6, 0, 0xac, 0x10, 0, 2]),
            ("02:AB:cd:EF:01:23", [2, 0xab, 0xcd, 0xef, 1, 0x23]),
        ];
        for (s, bytes) in good {
            let mac: MacAddr = s.parse().unwrap();
            assert_eq!(mac.0, bytes);
            assert_eq!(mac.to_string(), s.to_lowercase());
        }
        let bad = [
            "",
            "06:00:ac:10:00",
            "06:00:ac:10:00:02:03",
            "6:0:ac:10:0:2",
            "zz:00:00:00:00:00",
            "06-00-ac-10-00-02",
            "06:00:ac:10:00:0g",
        ];
        for s in bad {
            assert!(
                matches!(s.parse::<MacAddr>(), Err(ConfigError::Mac(m)) if m == s),
                "{s}"
            );
        }
        assert!(matches!(
            "01:00:5e:00:00:01".parse::<MacAddr>(),
            Err(ConfigError::MulticastMac(_))
        ));
    }

    #[test]
    fn mem_bounds() {
        assert!(matches!(
            validate_mem(31),
            Err(ConfigError::MemTooSmall(31))
        ));
        assert_eq!(validate_mem(32).unwrap(), 32);
        assert_eq!(validate_mem(MAX_MEM_MIB).unwrap(), MAX_MEM_MIB);
        assert!(matches!(
            validate_mem(MAX_MEM_MIB + 1),
            Err(ConfigError::MemTooLarge(_))
        ));
    }

    #[test]
    fn vcpu_bounds() {
        assert!(matches!(validate_vcpus(0), Err(ConfigError::NoVcpus)));
        assert_eq!(validate_vcpus(1).unwrap(), 1);
        assert_eq!(validate_vcpus(254).unwrap(), 254);
        assert!(matches!(
            validate_vcpus(255),
            Err(ConfigError::TooManyVcpus(255))
        ));
    }

    #[test]
    fn queue_sizes() {
        for ok in [2, 64, 256, 1024, 32768] {
            assert_eq!(validate_queue_size(ok).unwrap(), ok as u16);
        }
        for bad in [0, 1, 3, 100, 65536] {
            assert!(matches!(validate_queue_size(bad), Err(ConfigError::QueueSize(b)) if b == bad));
        }
    }

    #[test]
    fn quirks_parse() {
        assert_eq!("auto".parse::<HostQuirks>().unwrap(), HostQuirks::Auto);
        assert_eq!("on".parse::<HostQuirks>().unwrap(), HostQuirks::On);
        assert_eq!("off".parse::<HostQuirks>().unwrap(), HostQuirks::Off);
        assert!("yes".parse::<HostQuirks>().is_err());
    }
}
