// SPDX-License-Identifier: Apache-2.0
//! The command line: `minivmm --kernel bzImage --tap tap0 [...]`, or
//! `minivmm --config-file vm.json [flags]`.
//!
//! clap parses strings; [`Cli::into_config`] turns them into [`Settings`],
//! layers them over the config file's ([`super::file`]) (a flag given on the command line wins;
//! `--net`/`--tap` NICs come after the file's; `--cmdline` words are appended
//! to the file's `boot_args`) and validates the result into a [`VmmConfig`],
//! so a bad value is one clear line before anything is opened.

use std::path::PathBuf;

use clap::Parser;
use devices::virtio::net::Offloads;
use log::LevelFilter;

use super::drive::parse_disk;
use super::entropy::parse_rng;
use super::error::ConfigError;
use super::fc_flags::{FirecrackerFlags, DEFAULT_API_SOCK};
use super::file::{self, FileError};
use super::ids::DEFAULT_ID;
use super::net::{parse_offloads, MacAddr, NetSpec};
use super::parse::{
    key_values, limiter_from_keys, limiter_key, on_off, parse_host_quirks, parse_io_engine,
    parse_level, parse_number, parse_option,
};
use super::settings::Settings;
use super::vsock::parse_vsock;
use super::VmmConfig;
use crate::process::jail::JailConfig;
use crate::process::seccomp::SeccompMode;

/// Errors turning the command line, and the config file it names, into a
/// [`VmmConfig`].
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The config file cannot be read or says something minivmm refuses.
    #[error(transparent)]
    File(#[from] FileError),
    /// A value, or the configuration as a whole, is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A launcher flag asks for what minivmm does not have, or is invalid.
    #[error("{0}")]
    Launch(String),
}

/// How minivmm was launched, beside the VM's configuration: the API
/// socket, the instance id and the jailer's timing flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// Serve Firecracker's API here.
    pub api_sock: Option<PathBuf>,
    /// The instance id (`GET /`, log lines).
    pub id: String,
    /// When the launcher (Firecracker's jailer) started, in microseconds
    /// of CLOCK_MONOTONIC, if it said.
    pub start_time_us: Option<u64>,
    /// The launcher's CPU time at that point, in microseconds.
    pub start_time_cpu_us: Option<u64>,
    /// The launcher's parent's CPU time, in microseconds.
    pub parent_cpu_time_us: Option<u64>,
    /// Log the time from start to the guest's boot-complete write.
    pub boot_timer: bool,
    /// Where and as whom to run jailed.
    pub jail: Option<JailConfig>,
    /// The MMDS store's first content (`--metadata`).
    pub metadata: Option<PathBuf>,
    /// Firecracker's seccompiler JSON to take the threads' filters from.
    pub seccomp_filter: Option<PathBuf>,
    /// Most bytes of an API request body.
    pub api_payload_limit: usize,
    /// Most bytes of the MMDS data store (`--mmds-size-limit`, by default
    /// the payload limit, as Firecracker has it): for the MMDS code.
    pub mmds_size_limit: usize,
    /// `--enable-pci` was given (devices stay on virtio-MMIO; one warning).
    pub enable_pci: bool,
}

/// The command line taken apart: the file's settings (empty without
/// `--config-file`), the flags' own, and the launch options.
#[derive(Debug)]
pub struct CliParts {
    /// Whether `--config-file` was given.
    pub has_file: bool,
    /// What the config file says.
    pub file: Settings,
    /// What the flags say (they win over the file, and over the API).
    pub flags: Settings,
    /// The launch options.
    pub launch: Launch,
}

/// Firecracker's rule for an instance id: 1 to 64 characters, ASCII
/// letters, digits and `-`.
pub fn check_id(id: &str) -> Result<(), CliError> {
    if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    {
        return Err(CliError::Launch(format!(
            "--id '{id}': an id is 1 to 64 characters, letters, digits and '-'"
        )));
    }
    Ok(())
}

/// What `--help` says about exit statuses (the README's table).
const EXIT_STATUS_HELP: &str = "\
Exit status:
  0  the guest rebooted or powered off, or SIGTERM/SIGINT stopped minivmm
  1  bad usage or configuration, or a failure before boot (one line on stderr)
  2  the VM failed at run time (KVM error, triple fault, emulation failure)
  3  the guest reset after its kernel reported a panic (pvpanic; console text never counts)
  101  minivmm panicked, on any thread: a bug (one line on stderr says where)
  148  a thread made a system call its seccomp filter forbids (--seccomp on)

--net keys: tap=NAME id=ID mac=MAC fd=N queue_size=N mtu=N offloads=csum+tso4+tso6+ufo|all|none
  offload_csum|offload_tso|offload_ufo=on|off mrg_rxbuf=on|off
  {tx,rx}_weight_{bytes,packets}=N pass_time_budget_us=N io_engine=async|sync
  [rx_|tx_]{bw,ops}_{size,one_time_burst,refill_time}=N (no prefix: both directions),
  e.g. tx_bw_size=2500000,tx_bw_refill_time=100 for 200 Mbit/s out of the guest
Numbers may be decimal or 0x-prefixed hexadecimal.";

fn number(s: &str) -> Result<u64, String> {
    parse_number(s).map_err(|e| e.to_string())
}

fn level(s: &str) -> Result<LevelFilter, String> {
    parse_level(s).map_err(|e| e.to_string())
}

/// A small KVM virtual machine monitor with built-in virtio network, block and
/// entropy devices.
#[derive(Debug, Parser, PartialEq)]
#[command(
    name = "minivmm",
    version = concat!("v", env!("CARGO_PKG_VERSION")),
    about,
    long_about = None,
    after_help = EXIT_STATUS_HELP
)]
pub struct Cli {
    /// Firecracker-style JSON configuration; flags given here win over it.
    #[arg(long, value_name = "PATH")]
    pub config_file: Option<PathBuf>,
    /// Guest kernel: a bzImage or an ELF vmlinux (detected from the file).
    /// Without it, --config-file or --api-sock, the API is served on
    /// /run/firecracker.socket (Firecracker's default).
    #[arg(long, value_name = "PATH")]
    pub kernel: Option<PathBuf>,
    /// Initramfs (cpio archive, optionally compressed) loaded below the top of low memory.
    #[arg(long, value_name = "PATH")]
    pub initramfs: Option<PathBuf>,
    /// Words appended to the kernel command line (the default
    /// `console=ttyS0 reboot=k panic=-1 pci=off i8042.noaux i8042.nomux i8042.nopnp`, or the
    /// file's boot_args).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
    /// Guest memory in MiB [default: 128, as Firecracker's].
    #[arg(long, value_name = "MIB", value_parser = number)]
    pub mem: Option<u64>,
    /// Number of vCPUs; more than one boots SMP through an MP table [default: 1].
    #[arg(long, value_name = "N", value_parser = number)]
    pub vcpus: Option<u64>,
    /// A network card: `tap=NAME[,mac=MAC][,id=ID][,fd=N][,queue_size=N][,mtu=N][,offloads=...]
    /// [,rate limiter keys]`; repeatable (keys listed below).
    #[arg(long = "net", value_name = "KEY=VALUE,...")]
    pub net: Vec<String>,
    /// A drive (virtio-blk): `path=FILE[,id=ID][,readonly=on][,root=on][,partuuid=UUID]
    /// [,io_engine=sync|async][,cache=unsafe|writeback][,queue_size=N][,bw_*/ops_* limiter
    /// keys]`; repeatable. A root drive adds `root=/dev/vdX ro|rw` to the command line.
    #[arg(long = "disk", value_name = "KEY=VALUE,...")]
    pub disk: Vec<String>,
    /// The entropy device (virtio-rng, filled from getrandom): `--rng` alone, or
    /// `src=/dev/urandom` (Cloud Hypervisor's form; the only source) and the
    /// `bw_*`/`ops_*` limiter keys.
    #[arg(long, value_name = "KEY=VALUE,...", num_args = 0..=1, default_missing_value = "")]
    pub rng: Option<String>,
    /// The vsock device (virtio-vsock with Firecracker's host side):
    /// `cid=N,socket=PATH` (Cloud Hypervisor's form). Host processes connect
    /// to PATH and write `CONNECT <port>\n`; the guest's connections to the
    /// host's port P reach a listener at PATH_P. PATH must not exist.
    #[arg(long, value_name = "cid=N,socket=PATH")]
    pub vsock: Option<String>,
    /// Shorthand for `--net tap=NAME` (opened, or created with a warning if missing).
    #[arg(long, value_name = "NAME")]
    pub tap: Option<String>,
    /// Guest MAC address of the `--tap` card [default: 06:00:ac:10:00:02, +1 per card].
    #[arg(long, value_name = "MAC", requires = "tap")]
    pub mac: Option<String>,
    /// Largest virtqueue size offered, for every card without its own [default: 256].
    #[arg(long, value_name = "N", value_parser = number)]
    pub queue_size: Option<u64>,
    /// MTU offered to the guest (VIRTIO_NET_F_MTU), for every card without its own.
    #[arg(long, value_name = "N", value_parser = number)]
    pub mtu: Option<u64>,
    /// Bytes after which a TX pass yields to other work (0: no byte weight) [default: 0x80000].
    #[arg(long, value_name = "BYTES", value_parser = number)]
    pub tx_weight_bytes: Option<u64>,
    /// Frames after which a TX pass yields to other work (0: no packet weight) [default: 256].
    #[arg(long, value_name = "N", value_parser = number)]
    pub tx_weight_packets: Option<u64>,
    /// Bytes after which an RX pass yields to other work (0: no byte weight) [default: 0x80000].
    #[arg(long, value_name = "BYTES", value_parser = number)]
    pub rx_weight_bytes: Option<u64>,
    /// Frames after which an RX pass yields to other work (0: no packet weight) [default: 256].
    #[arg(long, value_name = "N", value_parser = number)]
    pub rx_weight_packets: Option<u64>,
    /// Microseconds after which a TX or RX pass yields to other work, whatever
    /// the weights (0: no time budget) [default: 100].
    #[arg(long, value_name = "US", value_parser = number)]
    pub pass_time_budget_us: Option<u64>,
    /// Do not offer checksum/TSO/UFO offloads (every card without its own `offloads=`).
    #[arg(long)]
    pub no_offloads: bool,
    /// Do not offer mergeable RX buffers (every frame must fit one guest buffer).
    #[arg(long)]
    pub no_mrg_rxbuf: bool,
    /// Append one JSON line of metrics to this file or FIFO per interval, on
    /// SIGUSR1 and at exit.
    #[arg(long, value_name = "PATH", visible_alias = "metrics-path")]
    pub metrics: Option<PathBuf>,
    /// Seconds between metrics lines; 0 writes only on SIGUSR1 and at exit [default: 60].
    #[arg(long, value_name = "SECS", value_parser = number)]
    pub metrics_interval: Option<u64>,
    /// Write log lines to this file or FIFO instead of stderr.
    #[arg(long, value_name = "PATH")]
    pub log_path: Option<PathBuf>,
    /// Log level: off, error, warn (Warning), info, debug or trace, in any case
    /// (Firecracker's names too); RUST_LOG-style module filters in RUST_LOG
    /// apply on top [default: warn].
    #[arg(long, value_name = "LEVEL", value_parser = level, visible_alias = "level")]
    pub log_level: Option<LevelFilter>,
    /// Recoveries for a PVM-backed KVM host (guest command-line words, INT3
    /// emulation recovery): auto detects the host, on/off force them [default: auto].
    #[arg(long, value_name = "auto|on|off")]
    pub host_quirks: Option<String>,
    /// System-call filter on every thread: on (a forbidden call ends minivmm
    /// with exit status 148), log (the kernel logs it and lets it through) or off.
    #[arg(long, value_name = "on|log|off", default_value = "on", value_enum)]
    pub seccomp: SeccompMode,
    /// Serve Firecracker's HTTP API on this Unix socket (which must not
    /// exist). Without --kernel or --config-file the VM is configured
    /// through it and starts on `PUT /actions` `InstanceStart`.
    #[arg(long, value_name = "PATH", conflicts_with = "no_api")]
    pub api_sock: Option<PathBuf>,
    /// No API socket (Firecracker's flag): the VM comes from --config-file
    /// or --kernel alone.
    #[arg(long)]
    pub no_api: bool,
    /// The instance id, in `GET /` and every log line.
    #[arg(long, value_name = "ID", default_value = DEFAULT_ID)]
    pub id: String,
    /// Firecracker's jailer: when it started (CLOCK_MONOTONIC, microseconds);
    /// the boot-time log line then counts from there.
    #[arg(long, value_name = "US", value_parser = number)]
    pub start_time_us: Option<u64>,
    /// Firecracker's jailer: its CPU time at start, in microseconds.
    #[arg(long, value_name = "US", value_parser = number)]
    pub start_time_cpu_us: Option<u64>,
    /// Firecracker's jailer: its parent's CPU time, in microseconds.
    #[arg(long, value_name = "US", value_parser = number)]
    pub parent_cpu_time_us: Option<u64>,
    /// Log the time from start until the guest writes the boot-complete
    /// value to the boot-timer device (Firecracker's --boot-timer).
    #[arg(long)]
    pub boot_timer: bool,
    /// Print the snapshot state layout version this minivmm writes and
    /// reads, and exit (Firecracker's --snapshot-version).
    #[arg(long)]
    pub snapshot_version: bool,
    /// Print the layout version of the snapshot state file PATH, and exit
    /// (Firecracker's --describe-snapshot).
    #[arg(long, value_name = "PATH")]
    pub describe_snapshot: Option<PathBuf>,
    /// Copy the pages of the Diff memory file --diff-file onto its base,
    /// --base-file, which then loads as a Full memory file, and exit
    /// (Firecracker's rebase-snap tool).
    #[arg(long, requires_all = ["base_file", "diff_file"])]
    pub rebase_snap: bool,
    /// --rebase-snap: the base memory file (a Full snapshot's, or an
    /// earlier rebase's), written in place.
    #[arg(long, value_name = "PATH", requires = "rebase_snap")]
    pub base_file: Option<PathBuf>,
    /// --rebase-snap: the Diff snapshot's memory file.
    #[arg(long, value_name = "PATH", requires = "rebase_snap")]
    pub diff_file: Option<PathBuf>,
    /// The MMDS store's first content: a JSON file (Firecracker's
    /// --metadata). It is served on the cards `mmds-config` names.
    #[arg(long, value_name = "PATH")]
    pub metadata: Option<PathBuf>,
    /// Run jailed before opening any file: DIR as the root of a new mount
    /// namespace, new PID namespace and session, a cgroup of its own, as
    /// --uid and --gid with no capability and no_new_privs (see the README's
    /// Jail section); every path given resolves inside DIR.
    #[arg(long, value_name = "DIR", requires_all = ["uid", "gid"])]
    pub jail: Option<PathBuf>,
    /// The uid a jailed minivmm runs as.
    #[arg(long, value_name = "UID", requires = "jail", value_parser = number)]
    pub uid: Option<u64>,
    /// The gid a jailed minivmm runs as.
    #[arg(long, value_name = "GID", requires = "jail", value_parser = number)]
    pub gid: Option<u64>,
    /// Jailed: join this network namespace (e.g. /var/run/netns/NAME) first.
    #[arg(long, value_name = "PATH", requires = "jail")]
    pub netns: Option<PathBuf>,
    /// Jailed: write VALUE into FILE of the VM's cgroup leaf (pids.max=64);
    /// repeatable.
    #[arg(long = "cgroup", value_name = "FILE=VALUE", requires = "jail")]
    pub cgroup: Vec<String>,
    /// Jailed: the cgroup hierarchy of the leaf, 1 or 2 [default: 2].
    #[arg(long, value_name = "1|2", requires = "jail")]
    pub cgroup_version: Option<String>,
    /// Jailed: where the cgroup leaf goes, relative to the hierarchy's root
    /// [default: minivmm]; the leaf is PARENT/ID.
    #[arg(long, value_name = "PARENT", requires = "jail")]
    pub parent_cgroup: Option<String>,
    /// Jailed: fsize=BYTES (the largest offset a write reaches) or
    /// no-file=N (open files, default 2048); repeatable.
    #[arg(long = "resource-limit", value_name = "RESOURCE=N", requires = "jail")]
    pub resource_limit: Vec<String>,
    /// Firecracker's launcher flags without a minivmm spelling.
    #[command(flatten)]
    pub firecracker: FirecrackerFlags,
}

impl Cli {
    /// The system-call filter asked for: `--no-seccomp` is `--seccomp off`.
    pub fn seccomp_mode(&self) -> SeccompMode {
        if self.firecracker.no_seccomp {
            SeccompMode::Off
        } else {
            self.seccomp
        }
    }

    /// Where the API is served: `--api-sock`, or Firecracker's default socket
    /// when nothing else says how the VM is configured.
    fn api_socket(&self) -> Result<Option<PathBuf>, CliError> {
        if self.api_sock.is_some() {
            return Ok(self.api_sock.clone());
        }
        let described = self.kernel.is_some() || self.config_file.is_some();
        match (described, self.no_api) {
            (true, _) => Ok(None),
            (false, false) => Ok(Some(PathBuf::from(DEFAULT_API_SOCK))),
            (false, true) => Err(CliError::Launch(
                "--no-api needs --config-file (or --kernel): without the API nothing else \
                 configures the VM"
                    .into(),
            )),
        }
    }

    /// Validates the command line (over the config file, if any) into a VM
    /// configuration.
    pub fn into_config(self) -> Result<VmmConfig, CliError> {
        let parts = self.into_parts()?;
        Ok(parts.file.overlay(parts.flags).finish()?)
    }

    /// The launch options alone, checked, without reading any file: what a
    /// jailed minivmm needs before it enters its jail.
    pub fn launch(&self) -> Result<Launch, CliError> {
        check_id(&self.id)?;
        let jail = match &self.jail {
            Some(root) => Some(self.jail_config(root)?),
            None => None,
        };
        let limits = self.firecracker.limits().map_err(CliError::Launch)?;
        Ok(Launch {
            jail,
            api_sock: self.api_socket()?,
            seccomp_filter: self.firecracker.seccomp_filter.clone(),
            api_payload_limit: limits.api_payload_limit,
            mmds_size_limit: limits.mmds_size_limit,
            enable_pci: self.firecracker.enable_pci,
            id: self.id.clone(),
            start_time_us: self.start_time_us,
            start_time_cpu_us: self.start_time_cpu_us,
            parent_cpu_time_us: self.parent_cpu_time_us,
            boot_timer: self.boot_timer,
            metadata: self.metadata.clone(),
        })
    }

    fn jail_config(&self, root: &std::path::Path) -> Result<JailConfig, CliError> {
        use crate::process::jail::cgroup::{parse_file, parse_parent, CgroupVersion};
        let id32 = |what: &str, v: Option<u64>| {
            u32::try_from(v.unwrap_or(0)).map_err(|_| {
                CliError::Launch(format!("--{what}: {} is out of range", v.unwrap_or(0)))
            })
        };
        let launch = |e: &dyn std::error::Error| CliError::Launch(e.to_string());
        let mut jail = JailConfig::new(
            root.to_path_buf(),
            id32("uid", self.uid)?,
            id32("gid", self.gid)?,
            &self.id,
        );
        jail.netns = self.netns.clone();
        jail.seccomp = self.seccomp_mode();
        if let Some(v) = &self.cgroup_version {
            jail.cgroup.version = CgroupVersion::parse(v).map_err(|e| launch(&e))?;
        }
        if let Some(p) = &self.parent_cgroup {
            jail.cgroup.parent = parse_parent(p).map_err(|e| launch(&e))?;
        }
        for c in &self.cgroup {
            jail.cgroup
                .files
                .push(parse_file(c).map_err(|e| launch(&e))?);
        }
        for r in &self.resource_limit {
            jail.limits.set(r).map_err(|e| launch(&e))?;
        }
        Ok(jail)
    }

    /// Takes the command line apart (see [`CliParts`]), reading the
    /// config file and checking the launch flags.
    pub fn into_parts(self) -> Result<CliParts, CliError> {
        let launch = self.launch()?;
        let file = match &self.config_file {
            Some(path) => file::load(path)?,
            None => Settings::default(),
        };
        let has_file = self.config_file.is_some();
        Ok(CliParts {
            has_file,
            file,
            flags: self.into_settings()?,
            launch,
        })
    }

    /// What the command line itself says.
    pub fn into_settings(self) -> Result<Settings, ConfigError> {
        let seccomp = self.seccomp_mode();
        let mut nets = self
            .net
            .iter()
            .map(|s| parse_net(s))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(tap) = self.tap {
            nets.push(NetSpec {
                tap: Some(tap),
                mac: self.mac.map(|m| m.parse::<MacAddr>()).transpose()?,
                ..NetSpec::default()
            });
        }
        let net_defaults = NetSpec {
            queue_size: self.queue_size,
            mtu: self.mtu,
            offloads: self.no_offloads.then_some(Offloads::NONE),
            mrg_rxbuf: self.no_mrg_rxbuf.then_some(false),
            tx_weight_bytes: self.tx_weight_bytes,
            tx_weight_packets: self.tx_weight_packets,
            rx_weight_bytes: self.rx_weight_bytes,
            rx_weight_packets: self.rx_weight_packets,
            pass_time_budget_us: self.pass_time_budget_us,
            ..NetSpec::default()
        };
        Ok(Settings {
            kernel: self.kernel,
            initramfs: self.initramfs,
            boot_args: None,
            cmdline_extra: self.cmdline,
            mem_mib: self.mem,
            vcpus: self.vcpus,
            nets,
            net_defaults,
            drives: self
                .disk
                .iter()
                .map(|s| parse_disk(s))
                .collect::<Result<Vec<_>, _>>()?,
            entropy: self.rng.as_deref().map(parse_rng).transpose()?,
            balloon: None,
            vsock: self.vsock.as_deref().map(parse_vsock).transpose()?,
            mmds: None,
            metrics_path: self.metrics,
            metrics_interval_s: self.metrics_interval,
            log_path: self.log_path,
            log_level: self.log_level,
            log_module: self.firecracker.module.clone(),
            log_show_origin: self.firecracker.show_log_origin.then_some(true),
            log_show_level: self.firecracker.show_level.then_some(true),
            host_quirks: self
                .host_quirks
                .as_deref()
                .map(parse_host_quirks)
                .transpose()?,
            seccomp: Some(seccomp),
            ..Settings::default()
        })
    }
}

/// clap's own message as one line: its first paragraph (which may list the
/// missing arguments on the lines below the first), without the usage block
/// and tips that follow.
pub fn clap_line(e: &clap::Error) -> String {
    let rendered = e.to_string();
    let first: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let text = first.join(" ");
    let text = text.trim_start_matches("error:").trim_start();
    if text.is_empty() {
        "invalid arguments (see --help)".to_string()
    } else {
        format!("{text} (see --help)")
    }
}

/// Splits `a=1,fd=[3],b=2` at the commas outside brackets (Cloud
/// Hypervisor writes lists as `[...]`).
fn split_items(spec: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in spec.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&spec[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&spec[start..]);
    items
}

/// The rate limiter keys of one `--net`: [direction][bw, ops] ->
/// (size, one_time_burst, refill_time).
type BucketKeys = [[[Option<u64>; 3]; 2]; 2];

/// Parses one `--net` value (see the keys in `--help`).
pub fn parse_net(spec: &str) -> Result<NetSpec, ConfigError> {
    parse_option("--net", spec, parse_net_keys)
}

fn parse_net_keys(spec: &str) -> Result<NetSpec, String> {
    let mut n = NetSpec::default();
    let mut buckets: BucketKeys = Default::default();
    let mut any_bucket = [false; 2];
    let (mut csum, mut tso, mut ufo) = (None, None, None);
    let num = |v: &str| parse_number(v).map_err(|e| e.to_string());
    for (key, value) in key_values(split_items(spec))? {
        match key {
            "tap" => n.tap = Some(value.to_string()),
            "id" => n.id = Some(value.to_string()),
            "mac" => n.mac = Some(value.parse().map_err(|e: ConfigError| e.to_string())?),
            "fd" => {
                let inner = value.trim_start_matches('[').trim_end_matches(']');
                if inner.contains(',') {
                    return Err("one fd per card (one queue pair)".into());
                }
                n.fd = Some(num(inner)?.try_into().map_err(|_| "fd too large")?);
            }
            "queue_size" => n.queue_size = Some(num(value)?),
            "mtu" => n.mtu = Some(num(value)?),
            "offloads" => n.offloads = Some(parse_offloads(value.split('+'))?),
            "offload_csum" => csum = Some(on_off(key, value)?),
            "offload_tso" => tso = Some(on_off(key, value)?),
            "offload_ufo" => ufo = Some(on_off(key, value)?),
            "mrg_rxbuf" => n.mrg_rxbuf = Some(on_off(key, value)?),
            "tx_weight_bytes" => n.tx_weight_bytes = Some(num(value)?),
            "tx_weight_packets" => n.tx_weight_packets = Some(num(value)?),
            "rx_weight_bytes" => n.rx_weight_bytes = Some(num(value)?),
            "rx_weight_packets" => n.rx_weight_packets = Some(num(value)?),
            "pass_time_budget_us" => n.pass_time_budget_us = Some(num(value)?),
            "io_engine" => n.io_engine = Some(parse_io_engine(value)?),
            _ => {
                let (dirs, rest) = match key.split_once('_') {
                    Some(("rx", rest)) => (&[0usize][..], rest),
                    Some(("tx", rest)) => (&[1usize][..], rest),
                    _ => (&[0usize, 1][..], key),
                };
                let (kind, field) =
                    limiter_key(rest).ok_or_else(|| format!("unknown key '{key}' (see --help)"))?;
                let v = num(value)?;
                for &d in dirs {
                    // A per-direction key overrides the shared one.
                    if dirs.len() == 1 || buckets[d][kind][field].is_none() {
                        buckets[d][kind][field] = Some(v);
                    }
                    any_bucket[d] = true;
                }
            }
        }
    }
    if csum.is_some() || tso.is_some() || ufo.is_some() {
        let mut o = n.offloads.unwrap_or(Offloads::ALL);
        if let Some(t) = tso {
            (o.tso4, o.tso6) = (t, t);
        }
        if let Some(u) = ufo {
            o.ufo = u;
        }
        match csum {
            // Cloud Hypervisor's meaning: no checksum offload, so none at all.
            Some(false) => o = Offloads::NONE,
            Some(true) => o.csum = true,
            None => {}
        }
        n.offloads = Some(o);
    }
    if any_bucket[0] {
        n.rx_rate_limiter = Some(limiter_from_keys(&buckets[0], "rx_")?);
    }
    if any_bucket[1] {
        n.tx_rate_limiter = Some(limiter_from_keys(&buckets[1], "tx_")?);
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostQuirks, TapBackend};
    use crate::error_line;
    use devices::virtio::net::IoEngine;

    fn parse(args: &[&str]) -> Result<VmmConfig, String> {
        let cli = Cli::try_parse_from(std::iter::once("minivmm").chain(args.iter().copied()))
            .map_err(|e| e.kind().to_string())?;
        cli.into_config().map_err(|e| crate::error_line(&e))
    }

    #[test]
    fn a_clap_error_is_one_line_with_every_missing_argument() {
        let e = Cli::try_parse_from(["minivmm", "--tap"]).expect_err("no value");
        let line = clap_line(&e);
        assert!(!line.contains('\n'), "{line}");
        assert!(!line.starts_with("error:"), "{line}");
        assert!(line.contains("--tap"), "{line}");
        assert!(line.ends_with(" (see --help)"), "{line}");
        assert!(!line.contains("Usage"), "{line}");
        // Two lines of missing arguments in clap's message end up on one.
        let e = clap::Error::raw(
            clap::error::ErrorKind::MissingRequiredArgument,
            "the following required arguments were not provided:\n  --kernel <PATH>\n  --mem <MIB>\n\nUsage: minivmm\n",
        );
        let line = clap_line(&e);
        assert_eq!(
            line,
            "the following required arguments were not provided: --kernel <PATH> --mem <MIB> (see --help)"
        );
        let empty = clap::Error::raw(clap::error::ErrorKind::InvalidValue, "\n\n");
        assert_eq!(clap_line(&empty), "invalid arguments (see --help)");
    }

    #[test]
    fn rng_alone_or_in_cloud_hypervisors_form_adds_the_entropy_device() {
        assert!(parse(&["--kernel", "k"]).unwrap().entropy.is_none());
        // Alone, also before another flag: the flag is not taken as its value.
        for args in [
            &["--kernel", "k", "--rng"][..],
            &["--rng", "--kernel", "k"],
            &["--kernel", "k", "--rng", "src=/dev/urandom"],
            &["--kernel", "k", "--rng=src=/dev/urandom"],
        ] {
            let cfg = parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
            let rng = cfg.entropy.unwrap_or_else(|| panic!("{args:?}: no device"));
            assert!(rng.rate_limiter.is_unlimited(), "{args:?}");
        }
        let cfg = parse(&["--kernel", "k", "--rng", "ops_size=10,ops_refill_time=1000"]).unwrap();
        let ops = cfg.entropy.and_then(|e| e.rate_limiter.ops);
        assert_eq!(ops.map(|b| (b.size, b.refill_time)), Some((10, 1000)));
        let e = parse(&["--kernel", "k", "--rng", "src=/tmp/seed"]).unwrap_err();
        assert!(
            e.starts_with("--rng 'src=/tmp/seed': src=/tmp/seed: only /dev/urandom"),
            "{e}"
        );
        // One device: its id is taken, as a card's or a drive's is.
        let e = parse(&["--kernel", "k", "--rng", "--net", "tap=t0,id=entropy"]).unwrap_err();
        assert!(e.contains("id 'entropy' is used twice"), "{e}");
    }

    #[test]
    fn vsock_in_cloud_hypervisors_form_adds_the_vsock_device() {
        assert!(parse(&["--kernel", "k"]).unwrap().vsock.is_none());
        let cfg = parse(&["--kernel", "k", "--vsock", "cid=3,socket=/run/v.sock"]).unwrap();
        let v = cfg.vsock.expect("the device");
        assert_eq!((v.id.as_str(), v.guest_cid), ("vsock", 3));
        assert_eq!(v.uds_path, PathBuf::from("/run/v.sock"));
        let e = parse(&["--kernel", "k", "--vsock", "cid=2,socket=/v"]).unwrap_err();
        assert!(e.starts_with("vsock: guest_cid 2 is reserved"), "{e}");
        let e = parse(&["--kernel", "k", "--vsock", "cid=3"]).unwrap_err();
        assert!(e.starts_with("--vsock 'cid=3': socket is missing"), "{e}");
        // Its id is Firecracker's key for it, taken as a card's would be.
        let e = parse(&[
            "--kernel",
            "k",
            "--vsock",
            "cid=3,socket=/v",
            "--net",
            "tap=t0,id=vsock",
        ])
        .unwrap_err();
        assert!(e.contains("id 'vsock' is used twice"), "{e}");
    }

    #[test]
    fn minimal_command_line_has_defaults() {
        let cfg = parse(&["--kernel", "bzImage"]).unwrap();
        assert_eq!(cfg.kernel, PathBuf::from("bzImage"));
        assert_eq!(cfg.mem_mib, 128);
        assert_eq!(cfg.vcpus, 1);
        assert!(cfg.nets.is_empty());
        assert_eq!(cfg.host_quirks, HostQuirks::Auto);
        assert_eq!(cfg.logger.level, LevelFilter::Warn);
    }

    #[test]
    fn the_readme_command_line_works_as_written() {
        let cfg = parse(&["--kernel", "bzImage", "--tap", "tap0"]).unwrap();
        let net = &cfg.nets[0];
        assert_eq!(net.id, "net0");
        assert_eq!(net.tap, TapBackend::Named("tap0".into()));
        let net = &net.device;
        assert_eq!(net.mac, MacAddr::default().0);
        assert_eq!(net.queue_size, 256);
        assert_eq!(net.tx_weight_bytes, 0x80000);
        assert_eq!(net.tx_weight_packets, 256);
        assert_eq!(net.rx_weight_bytes, 0x80000);
        assert_eq!(net.rx_weight_packets, 256);
        assert!(net.offloads == Offloads::ALL && net.mrg_rxbuf);
        assert_eq!(net.mtu, None);
    }

    #[test]
    fn firecrackers_flags_land_where_minivmms_would() {
        let cli = |args: &[&str]| {
            Cli::try_parse_from(std::iter::once("minivmm").chain(args.iter().copied())).unwrap()
        };
        let c = cli(&[
            "--kernel",
            "k",
            "--level",
            "Warning",
            "--module",
            "vmm::api",
            "--show-level",
            "--show-log-origin",
            "--metrics-path",
            "m.json",
            "--no-seccomp",
            "--http-api-max-payload-size",
            "100000",
            "--mmds-size-limit",
            "4096",
            "--enable-pci",
        ]);
        assert_eq!(c.seccomp_mode(), SeccompMode::Off);
        let parts = c.into_parts().unwrap();
        let l = &parts.launch;
        assert_eq!(
            (
                l.api_payload_limit,
                l.mmds_size_limit,
                l.enable_pci,
                &l.api_sock
            ),
            (100_000, 4096, true, &None)
        );
        let cfg = parts.file.overlay(parts.flags).finish().unwrap();
        assert_eq!(cfg.logger.level, LevelFilter::Warn);
        assert_eq!(cfg.logger.module.as_deref(), Some("vmm::api"));
        assert!(cfg.logger.show_origin && cfg.logger.show_level);
        assert_eq!(cfg.metrics.map(|m| m.path), Some(PathBuf::from("m.json")));
        assert_eq!(cfg.seccomp, SeccompMode::Off);
        // Without a kernel, a file or a socket: Firecracker's default socket.
        let parts = cli(&["--id", "vm1"]).into_parts().unwrap();
        assert_eq!(
            parts.launch.api_sock,
            Some(PathBuf::from("/run/firecracker.socket"))
        );
        assert_eq!(parts.launch.api_payload_limit, 51_200);
        let parts = cli(&["--api-sock", "/tmp/a.sock"]).into_parts().unwrap();
        assert_eq!(parts.launch.api_sock, Some(PathBuf::from("/tmp/a.sock")));
        let parts = cli(&["--config-file", "/nonexistent.json"]).into_parts();
        assert!(parts.is_err(), "the file is read");
        let e = cli(&["--no-api"]).into_parts().unwrap_err();
        assert!(error_line(&e).starts_with("--no-api needs --config-file"));
        assert_eq!(
            cli(&["--no-api", "--kernel", "k"])
                .into_parts()
                .unwrap()
                .launch
                .api_sock,
            None
        );
        assert_eq!(cli(&["--kernel", "k"]).seccomp_mode(), SeccompMode::On);
        assert_eq!(
            cli(&["--kernel", "k", "--seccomp", "log"]).seccomp_mode(),
            SeccompMode::Log
        );
    }

    #[test]
    fn every_flag_lands_in_the_config() {
        let cfg = parse(&[
            "--kernel",
            "vmlinux",
            "--initramfs",
            "initrd.cpio",
            "--cmdline",
            "ip=dhcp quiet",
            "--mem",
            "0x200",
            "--vcpus",
            "2",
            "--tap",
            "t1",
            "--mac",
            "02:00:00:00:00:09",
            "--metrics",
            "m.json",
            "--metrics-interval",
            "5",
            "--log-path",
            "l.log",
            "--log-level",
            "Info",
            "--queue-size",
            "1024",
            "--mtu",
            "9000",
            "--tx-weight-bytes",
            "0",
            "--tx-weight-packets",
            "64",
            "--rx-weight-bytes",
            "0x1000",
            "--rx-weight-packets",
            "0",
            "--pass-time-budget-us",
            "0x32",
            "--no-offloads",
            "--no-mrg-rxbuf",
            "--host-quirks",
            "off",
        ])
        .unwrap();
        assert_eq!(cfg.initramfs, Some(PathBuf::from("initrd.cpio")));
        assert_eq!(cfg.cmdline_extra.as_deref(), Some("ip=dhcp quiet"));
        assert_eq!((cfg.mem_mib, cfg.vcpus), (512, 2));
        let m = cfg.metrics.unwrap();
        assert_eq!((m.path, m.interval_s), (PathBuf::from("m.json"), 5));
        assert_eq!(cfg.logger.path, Some(PathBuf::from("l.log")));
        assert_eq!(cfg.logger.level, LevelFilter::Info);
        assert_eq!(cfg.host_quirks, HostQuirks::Off);
        let net = &cfg.nets[0].device;
        assert_eq!(net.mac, [2, 0, 0, 0, 0, 9]);
        assert_eq!(net.queue_size, 1024);
        assert_eq!(net.mtu, Some(9000));
        assert_eq!((net.tx_weight_bytes, net.tx_weight_packets), (0, 64));
        assert_eq!((net.rx_weight_bytes, net.rx_weight_packets), (4096, 0));
        assert_eq!(net.pass_time_budget_us, 50);
        assert!(net.offloads == Offloads::NONE && !net.mrg_rxbuf);
    }

    #[test]
    fn every_net_key_lands_in_its_card() {
        let n = parse_net(
            "tap=t,tx_weight_bytes=5,tx_weight_packets=6,rx_weight_bytes=7,rx_weight_packets=8,\
             pass_time_budget_us=9,mrg_rxbuf=off,io_engine=Sync",
        )
        .unwrap();
        assert_eq!(
            (
                n.tx_weight_bytes,
                n.tx_weight_packets,
                n.rx_weight_bytes,
                n.rx_weight_packets,
                n.pass_time_budget_us
            ),
            (Some(5), Some(6), Some(7), Some(8), Some(9))
        );
        assert_eq!(n.mrg_rxbuf, Some(false));
        assert_eq!(n.io_engine, Some(IoEngine::Sync));
        // Each offload switch on its own.
        let o = |s: &str| parse_net(s).unwrap().offloads.unwrap();
        let ufo_off = o("tap=t,offload_ufo=off");
        assert!(ufo_off.csum && ufo_off.tso4 && ufo_off.tso6 && !ufo_off.ufo);
        let tso_off = o("tap=t,offload_tso=off");
        assert!(tso_off.csum && !tso_off.tso4 && !tso_off.tso6 && tso_off.ufo);
    }

    #[test]
    fn repeated_net_gives_several_cards_in_order() {
        let cfg = parse(&[
            "--kernel",
            "k",
            "--net",
            "tap=a,id=wan,mac=02:00:00:00:00:01,queue_size=0x400,mtu=1400,pass_time_budget_us=0",
            "--net",
            "fd=[7],offloads=csum+tso4,mrg_rxbuf=off,io_engine=sync",
            "--tap",
            "c",
            "--queue-size",
            "64",
        ])
        .unwrap();
        let ids: Vec<_> = cfg.nets.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["wan", "net1", "net2"]);
        assert_eq!(cfg.nets[0].device.queue_size, 1024);
        assert_eq!(cfg.nets[0].device.mtu, Some(1400));
        assert_eq!(cfg.nets[0].device.pass_time_budget_us, 0);
        assert_eq!(
            cfg.nets[1].device.pass_time_budget_us,
            devices::virtio::net::DEFAULT_PASS_TIME_BUDGET_US
        );
        assert_eq!(cfg.nets[1].tap, TapBackend::Fd { fd: 7, name: None });
        assert_eq!(
            cfg.nets[1].device.offloads,
            Offloads {
                csum: true,
                tso4: true,
                ..Offloads::NONE
            }
        );
        assert!(!cfg.nets[1].device.mrg_rxbuf);
        assert_eq!(cfg.nets[1].device.io_engine, IoEngine::Sync);
        assert_eq!(cfg.nets[0].device.io_engine, IoEngine::Async);
        assert_eq!(cfg.nets[1].device.queue_size, 64);
        assert_eq!(cfg.nets[2].tap, TapBackend::Named("c".into()));
        assert_eq!(cfg.nets[2].device.mac, [6, 0, 0xac, 0x10, 0, 4]);
    }

    #[test]
    fn rate_limiter_keys_per_direction_and_shared() {
        let n = parse_net(
            "tap=t,bw_size=1000,bw_refill_time=10,tx_bw_size=2000,rx_ops_size=5,\
             rx_ops_refill_time=100,rx_ops_one_time_burst=7",
        )
        .unwrap();
        let rx = n.rx_rate_limiter.unwrap();
        let tx = n.tx_rate_limiter.unwrap();
        assert_eq!(rx.bandwidth.unwrap().size, 1000);
        assert_eq!(tx.bandwidth.unwrap().size, 2000);
        assert_eq!(tx.bandwidth.unwrap().refill_time, 10);
        let ops = rx.ops.unwrap();
        assert_eq!((ops.size, ops.one_time_burst, ops.refill_time), (5, 7, 100));
        assert!(tx.ops.is_none());
        let plain = parse_net("tap=t").unwrap();
        assert!(plain.rx_rate_limiter.is_none() && plain.tx_rate_limiter.is_none());
    }

    /// `--config-file` with `text` in a temporary file, then `args`.
    fn parse_with_file(text: &str, args: &[&str]) -> Result<VmmConfig, String> {
        let dir = std::env::temp_dir().join(format!(
            "minivmm-cli-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.json");
        std::fs::write(&path, text).unwrap();
        let mut all = vec!["--config-file", path.to_str().unwrap()];
        all.extend_from_slice(args);
        let got = parse(&all);
        std::fs::remove_dir_all(&dir).unwrap();
        got
    }

    #[test]
    fn a_flag_beats_the_file_and_the_file_beats_the_default() {
        let file = r#"{"boot-source": {"kernel_image_path": "k"},
            "logger": {"level": "Info"},
            "network-interfaces": [{"iface_id": "a", "host_dev_name": "t0"}]}"#;
        let cfg = parse_with_file(file, &["--log-level", "debug"]).unwrap();
        assert_eq!(cfg.logger.level, LevelFilter::Debug);
        let cfg = parse_with_file(file, &[]).unwrap();
        assert_eq!(cfg.logger.level, LevelFilter::Info);
        assert_eq!(cfg.nets[0].device.mtu, None);
        // The all-card --mtu reaches the file's card too.
        let cfg = parse_with_file(file, &["--mtu", "9000"]).unwrap();
        assert_eq!(cfg.nets[0].device.mtu, Some(9000));
    }

    #[test]
    fn a_cards_own_setting_beats_the_one_for_all_cards() {
        let cfg = parse(&[
            "--kernel",
            "k",
            "--mtu",
            "9000",
            "--queue-size",
            "1024",
            "--net",
            "tap=a,mtu=1400,queue_size=64",
            "--net",
            "tap=b",
        ])
        .unwrap();
        let (a, b) = (&cfg.nets[0].device, &cfg.nets[1].device);
        assert_eq!((a.mtu, a.queue_size), (Some(1400), 64));
        assert_eq!((b.mtu, b.queue_size), (Some(9000), 1024));
        // The same in a file: the card's mtu beats the flag.
        let file = r#"{"boot-source": {"kernel_image_path": "k"},
            "network-interfaces": [{"iface_id": "a", "host_dev_name": "t0", "mtu": 1400}]}"#;
        let cfg = parse_with_file(file, &["--mtu", "9000"]).unwrap();
        assert_eq!(cfg.nets[0].device.mtu, Some(1400));
    }

    #[test]
    fn a_files_rate_limiter_arrives_whole() {
        let file = r#"{"boot-source": {"kernel_image_path": "k"},
            "network-interfaces": [{"iface_id": "a", "host_dev_name": "t0",
              "tx_rate_limiter": {"bandwidth": {"size": 2500000, "one_time_burst": 5000000, "refill_time": 100},
                                  "ops": {"size": 2000, "refill_time": 10}}}]}"#;
        let cfg = parse_with_file(file, &[]).unwrap();
        let tx = &cfg.nets[0].device.tx_rate_limiter;
        let bw = tx.bandwidth.unwrap();
        assert_eq!(
            (bw.size, bw.one_time_burst, bw.refill_time),
            (2_500_000, 5_000_000, 100)
        );
        let ops = tx.ops.unwrap();
        assert_eq!(
            (ops.size, ops.one_time_burst, ops.refill_time),
            (2000, 0, 10)
        );
        assert!(cfg.nets[0].device.rx_rate_limiter.is_unlimited());
        // A misspelt key, at either level of a limiter, is refused, not dropped.
        for bad in [
            r#""tx_rate_limiter": {"bandwith": {"size": 1, "refill_time": 1}}"#,
            r#""tx_rate_limiter": {"bandwidth": {"size": 1, "refil_time": 1}}"#,
            r#""rx_rate_limiter": {"ops": {"size": 1, "refill_time": 1, "one_time_bust": 1}}"#,
        ] {
            let file = format!(
                r#"{{"boot-source": {{"kernel_image_path": "k"}},
                "network-interfaces": [{{"iface_id": "a", "host_dev_name": "t0", {bad}}}]}}"#
            );
            let err = parse_with_file(&file, &[]).unwrap_err();
            assert!(err.contains("unknown field"), "{bad}: {err}");
        }
        // The same on the command line.
        let err = parse(&["--kernel", "k", "--net", "tap=a,tx_bw_sise=5"]).unwrap_err();
        assert!(err.contains("tx_bw_sise"), "{err}");
    }

    #[test]
    fn cloud_hypervisor_offload_switches() {
        let o = |s: &str| parse_net(s).unwrap().offloads.unwrap();
        assert_eq!(
            o("tap=t,offload_tso=off"),
            Offloads {
                tso4: false,
                tso6: false,
                ..Offloads::ALL
            }
        );
        assert_eq!(o("tap=t,offload_csum=off,offload_tso=on"), Offloads::NONE);
        assert_eq!(
            o("tap=t,offloads=none,offload_csum=on"),
            Offloads {
                csum: true,
                ..Offloads::NONE
            }
        );
    }

    #[test]
    fn an_error_is_one_line_whatever_the_user_typed() {
        let cli = Cli::try_parse_from(["minivmm", "--kernel", "k", "--tap", "t", "--mac", "0\n1"])
            .unwrap();
        let err = cli.into_config().unwrap_err();
        assert!(
            err.to_string().contains('\n'),
            "the raw message carries the newline"
        );
        let line = error_line(&err);
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("'0\\n1'"), "{line}");
    }

    #[test]
    fn seccomp_is_on_unless_asked_otherwise() {
        let mode = |extra: &[&str]| {
            let args = ["minivmm", "--kernel", "k"].iter().chain(extra).copied();
            Cli::try_parse_from(args).map(|c| c.seccomp)
        };
        assert_eq!(mode(&[]).unwrap(), SeccompMode::On);
        assert_eq!(mode(&["--seccomp", "log"]).unwrap(), SeccompMode::Log);
        assert_eq!(mode(&["--seccomp", "off"]).unwrap(), SeccompMode::Off);
        assert!(mode(&["--seccomp", "maybe"]).is_err());
    }

    fn launch_of(args: &[&str]) -> Result<Launch, String> {
        let cli = Cli::try_parse_from(std::iter::once("minivmm").chain(args.iter().copied()))
            .map_err(|e| clap_line(&e))?;
        cli.launch().map_err(|e| crate::error_line(&e))
    }

    #[test]
    fn the_jail_flags_land_in_the_jail_config_without_reading_a_file() {
        use crate::process::jail::cgroup::CgroupVersion;
        use crate::process::jail::ResourceLimits;
        let base = ["--kernel", "k", "--jail", "/j", "--uid", "7", "--gid", "8"];
        let jail = |extra: &[&str]| {
            let args: Vec<&str> = base.iter().chain(extra).copied().collect();
            launch_of(&args).map(|l| l.jail.expect("jailed"))
        };
        let j = jail(&["--id", "vm-1"]).unwrap();
        assert_eq!(
            (j.root.as_path(), j.uid, j.gid),
            (std::path::Path::new("/j"), 7, 8)
        );
        assert_eq!(j.id, "vm-1");
        assert_eq!(j.netns, None);
        assert_eq!(j.cgroup.version, CgroupVersion::V2);
        assert_eq!(j.cgroup.parent, std::path::Path::new("minivmm"));
        assert!(j.cgroup.files.is_empty());
        assert_eq!(j.limits, ResourceLimits::default());
        assert_eq!(j.seccomp, SeccompMode::On);
        let j = jail(&[
            "--netns",
            "/var/run/netns/a",
            "--cgroup",
            "pids.max=9",
            "--cgroup",
            "cpu.weight=50",
            "--cgroup-version",
            "1",
            "--parent-cgroup",
            "vms",
            "--resource-limit",
            "fsize=4096",
            "--resource-limit",
            "no-file=99",
            "--seccomp",
            "log",
        ])
        .unwrap();
        assert_eq!(
            j.netns.as_deref(),
            Some(std::path::Path::new("/var/run/netns/a"))
        );
        assert_eq!(j.cgroup.version, CgroupVersion::V1);
        assert_eq!(j.cgroup.parent, std::path::Path::new("vms"));
        assert_eq!(
            j.cgroup.files,
            [
                ("pids.max".into(), "9".into()),
                ("cpu.weight".into(), "50".into())
            ]
        );
        assert_eq!(
            j.limits,
            ResourceLimits {
                fsize: Some(4096),
                nofile: 99
            }
        );
        assert_eq!(j.seccomp, SeccompMode::Log);
        // The config file is not read by launch(): it may be the jail's.
        let l = launch_of(&["--config-file", "/nonexistent/vm.json"]).unwrap();
        assert_eq!(l.jail, None);
        for (extra, want) in [
            (
                &["--cgroup", "pids"][..],
                "--cgroup 'pids': expected FILE=VALUE",
            ),
            (
                &["--cgroup-version", "3"],
                "--cgroup-version '3': expected 1 or 2",
            ),
            (
                &["--parent-cgroup", "/abs"],
                "--parent-cgroup '/abs': expected a relative path",
            ),
            (
                &["--resource-limit", "nproc=1"],
                "--resource-limit 'nproc=1': expected",
            ),
        ] {
            let e = jail(extra).unwrap_err();
            assert!(e.starts_with(want), "{extra:?}: {e}");
        }
        // The jail's flags need --jail.
        let e = launch_of(&["--kernel", "k", "--netns", "/n"]).unwrap_err();
        assert!(e.contains("--jail"), "{e}");
        let e = launch_of(&[
            "--kernel",
            "k",
            "--jail",
            "/j",
            "--uid",
            "4294967296",
            "--gid",
            "1",
        ]);
        assert_eq!(e.unwrap_err(), "--uid: 4294967296 is out of range");
    }

    #[test]
    fn seccomp_is_part_of_the_config() {
        assert_eq!(parse(&["--kernel", "k"]).unwrap().seccomp, SeccompMode::On);
        let cfg = parse(&["--kernel", "k", "--seccomp", "log"]).unwrap();
        assert_eq!(cfg.seccomp, SeccompMode::Log);
    }

    #[test]
    fn bad_values_are_rejected_with_their_reason() {
        let cases: &[(&[&str], &str)] = &[
            (&["--kernel", "k", "--vcpus", "0"], "at least 1"),
            (&["--kernel", "k", "--vcpus", "300"], "too many"),
            (&["--kernel", "k", "--mem", "4"], "too small"),
            (
                &["--kernel", "k", "--tap", "t", "--mac", "nope"],
                "invalid MAC",
            ),
            (
                &["--kernel", "k", "--tap", "t", "--queue-size", "100"],
                "power of two",
            ),
            (&["--kernel", "k", "--host-quirks", "maybe"], "host quirks"),
            (&["--kernel", "k", "--mem", "lots"], "invalid value"),
            // The API on Firecracker's default socket configures the kernel.
            (&["--tap", "t"], "no kernel"),
            (
                &["--kernel", "k", "--mac", "02:00:00:00:00:01"],
                "required arguments were not provided",
            ),
            (&["--kernel", "k", "--bogus"], "unexpected argument"),
            (
                &["--kernel", "k", "--net", "tap=a", "--net", "tap=a"],
                "TAP 'a' is given to two",
            ),
            (
                &["--kernel", "k", "--metrics-interval", "5"],
                "needs a metrics path",
            ),
            (&["--kernel", "k", "--log-level", "loud"], "invalid value"),
            (
                &["--config-file", "/nonexistent/vm.json"],
                "cannot read config file",
            ),
        ];
        for (args, want) in cases {
            let err = parse(args).unwrap_err();
            assert!(err.contains(want), "{args:?}: got '{err}', want '{want}'");
        }
        let bad_nets = [
            ("tap=a,colour=red", "unknown key 'colour'"),
            ("tap=a,tap=b", "tap is given twice"),
            ("tap=a,mac=", "mac has no value"),
            ("tap=a,mac=06:00:00:00:00", "invalid MAC"),
            ("tap=a,fd=[3,4]", "one fd per card"),
            ("tap=a,mtu=big", "invalid number 'big'"),
            ("tap=a,offloads=gro", "unknown offload 'gro'"),
            ("tap=a,mrg_rxbuf=maybe", "not on or off"),
            ("tap=a,bw_size=100", "rx_bw_refill_time is missing"),
            ("tap=a,tx_ops_refill_time=100", "tx_ops_size is missing"),
            (
                "tap=a,bw_size=100,bw_refill_time=0",
                "refill_time must be at least 1 ms",
            ),
            ("fd=2", "0, 1 and 2"),
        ];
        for (spec, want) in bad_nets {
            let err = parse(&["--kernel", "k", "--net", spec]).unwrap_err();
            assert!(
                err.contains(want),
                "--net {spec}: got '{err}', want '{want}'"
            );
        }
    }

    #[test]
    fn help_lists_exit_statuses_and_net_keys() {
        let help = Cli::try_parse_from(["minivmm", "--help"])
            .unwrap_err()
            .to_string();
        for want in [
            "Exit status:",
            "1  bad usage",
            "--config-file",
            "--net",
            "bw_size",
            "--metrics-interval",
        ] {
            assert!(help.contains(want), "--help lacks '{want}'");
        }
    }
}
