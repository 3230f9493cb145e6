// SPDX-License-Identifier: Apache-2.0
//! The command line: `minivmm --kernel bzImage --tap tap0 [...]`.
//!
//! clap parses strings; [`Cli::into_config`] validates them into a
//! [`VmmConfig`], so a bad value is one clear line before anything is opened.

use std::path::PathBuf;

use clap::Parser;

use crate::config::{
    validate_mem, validate_queue_size, validate_vcpus, ConfigError, MacAddr, NetConfig, VmmConfig,
    DEFAULT_MEM_MIB,
};

/// vhost-net's VHOST_NET_WEIGHT: the byte budget of one TX or RX pass.
pub const DEFAULT_WEIGHT_BYTES: u64 = 0x80000;
/// vhost-net's VHOST_NET_PKT_WEIGHT: the packet budget of one pass. A byte
/// budget alone lets a flood of tiny frames starve the other direction.
pub const DEFAULT_WEIGHT_PACKETS: u64 = 256;

/// The exit statuses, as the README's table gives them.
const EXIT_STATUS_HELP: &str = "Exit status: 0 guest reboot/poweroff or SIGTERM/SIGINT; \
1 bad configuration or failure before boot; 2 VM failure at run time; \
3 guest reset after a kernel panic; 148 forbidden system call (seccomp).";

/// A small KVM virtual machine monitor with a built-in virtio-net device.
#[derive(Debug, Parser, PartialEq)]
#[command(name = "minivmm", version, about, long_about = None, after_help = EXIT_STATUS_HELP)]
pub struct Cli {
    /// Guest kernel: a bzImage or an ELF vmlinux (detected from the file).
    #[arg(long, value_name = "PATH")]
    pub kernel: PathBuf,
    /// Initramfs (cpio archive, optionally compressed) loaded below the top of low memory.
    #[arg(long, value_name = "PATH")]
    pub initramfs: Option<PathBuf>,
    /// Words appended to the default kernel command line
    /// (console=ttyS0 reboot=k panic=-1 pci=off).
    #[arg(long, value_name = "STR")]
    pub cmdline: Option<String>,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = DEFAULT_MEM_MIB)]
    pub mem: u64,
    /// Number of vCPUs; more than one boots SMP through an MP table.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub vcpus: u64,
    /// Host TAP interface for the guest's virtio-net card (opened, or created if missing).
    #[arg(long, value_name = "NAME")]
    pub tap: Option<String>,
    /// Guest MAC address.
    #[arg(long, value_name = "MAC", requires = "tap")]
    pub mac: Option<String>,
    /// Write device metrics as JSON to this file at exit and on SIGUSR1.
    #[arg(long, value_name = "PATH")]
    pub metrics: Option<PathBuf>,
    /// Largest virtqueue size offered to the guest.
    #[arg(long, value_name = "N", default_value_t = 256, requires = "tap")]
    pub queue_size: u64,
    /// Bytes after which a TX pass yields to other work (0: no byte weight).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_WEIGHT_BYTES)]
    pub tx_weight_bytes: u64,
    /// Frames after which a TX pass yields to other work (0: no packet weight).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WEIGHT_PACKETS)]
    pub tx_weight_packets: u64,
    /// Bytes after which an RX pass yields to other work (0: no byte weight).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_WEIGHT_BYTES)]
    pub rx_weight_bytes: u64,
    /// Frames after which an RX pass yields to other work (0: no packet weight).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WEIGHT_PACKETS)]
    pub rx_weight_packets: u64,
    /// Do not offer checksum/TSO/UFO offloads to the guest.
    #[arg(long)]
    pub no_offloads: bool,
    /// Do not offer mergeable RX buffers (every frame must fit one guest buffer).
    #[arg(long)]
    pub no_mrg_rxbuf: bool,
    /// Recoveries for a PVM-backed KVM host (guest command-line words, INT3
    /// emulation recovery): auto detects the host, on/off force them.
    #[arg(long, value_name = "auto|on|off", default_value = "auto")]
    pub host_quirks: String,
    /// System-call filter on every thread: on (a forbidden call ends minivmm
    /// with exit status 148), log (the kernel logs it and lets it through) or off.
    #[arg(long, value_name = "on|log|off", default_value = "on", value_enum)]
    pub seccomp: crate::seccomp::SeccompMode,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, value_name = "LEVEL", default_value = "warn", value_parser = parse_level)]
    pub log_level: log::LevelFilter,
}

fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    s.parse()
        .map_err(|_| format!("'{s}' is not one of off, error, warn, info, debug, trace"))
}

impl Cli {
    /// Validates the parsed command line into a VM configuration.
    pub fn into_config(self) -> Result<VmmConfig, ConfigError> {
        let net = match self.tap {
            Some(tap) => Some(NetConfig {
                tap,
                device: devices::virtio::net::NetConfig {
                    mac: match self.mac {
                        Some(m) => m.parse::<MacAddr>()?.0,
                        None => MacAddr::DEFAULT.0,
                    },
                    queue_size: validate_queue_size(self.queue_size)?,
                    tx_weight_bytes: self.tx_weight_bytes,
                    tx_weight_packets: self.tx_weight_packets,
                    rx_weight_bytes: self.rx_weight_bytes,
                    rx_weight_packets: self.rx_weight_packets,
                    offloads: !self.no_offloads,
                    mrg_rxbuf: !self.no_mrg_rxbuf,
                    bounce_buffer: false,
                },
            }),
            None => None,
        };
        Ok(VmmConfig {
            kernel: self.kernel,
            initramfs: self.initramfs,
            cmdline_extra: self.cmdline,
            mem_mib: validate_mem(self.mem)?,
            vcpus: validate_vcpus(self.vcpus)?,
            net,
            metrics: self.metrics,
            host_quirks: self.host_quirks.parse()?,
        })
    }
}

/// How `main` shows an error: the error and its causes on one line, with
/// control characters escaped so that a value the user typed (a MAC with a
/// newline in it) cannot split the line.
pub fn error_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    if !s.contains(char::is_control) {
        return s;
    }
    let mut line = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HostQuirks;

    fn parse(args: &[&str]) -> Result<VmmConfig, String> {
        let cli = Cli::try_parse_from(std::iter::once("minivmm").chain(args.iter().copied()))
            .map_err(|e| e.kind().to_string())?;
        cli.into_config().map_err(|e| e.to_string())
    }

    #[test]
    fn minimal_command_line_has_defaults() {
        let cfg = parse(&["--kernel", "bzImage"]).unwrap();
        assert_eq!(cfg.kernel, PathBuf::from("bzImage"));
        assert_eq!(cfg.mem_mib, 256);
        assert_eq!(cfg.vcpus, 1);
        assert_eq!(cfg.net, None);
        assert_eq!(cfg.host_quirks, HostQuirks::Auto);
    }

    #[test]
    fn the_readme_command_line_works_as_written() {
        let cfg = parse(&["--kernel", "bzImage", "--tap", "tap0"]).unwrap();
        let net = cfg.net.unwrap();
        assert_eq!(net.tap, "tap0");
        let net = net.device;
        assert_eq!(net.mac, MacAddr::DEFAULT.0);
        assert_eq!(net.queue_size, 256);
        assert_eq!(net.tx_weight_bytes, 0x80000);
        assert_eq!(net.tx_weight_packets, 256);
        assert_eq!(net.rx_weight_bytes, 0x80000);
        assert_eq!(net.rx_weight_packets, 256);
        assert!(net.offloads && net.mrg_rxbuf);
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
            "512",
            "--vcpus",
            "2",
            "--tap",
            "t1",
            "--mac",
            "02:00:00:00:00:09",
            "--metrics",
            "m.json",
            "--queue-size",
            "1024",
            "--tx-weight-bytes",
            "0",
            "--tx-weight-packets",
            "64",
            "--rx-weight-bytes",
            "4096",
            "--rx-weight-packets",
            "0",
            "--no-offloads",
            "--no-mrg-rxbuf",
            "--host-quirks",
            "off",
        ])
        .unwrap();
        assert_eq!(cfg.initramfs, Some(PathBuf::from("initrd.cpio")));
        assert_eq!(cfg.cmdline_extra.as_deref(), Some("ip=dhcp quiet"));
        assert_eq!((cfg.mem_mib, cfg.vcpus), (512, 2));
        assert_eq!(cfg.metrics, Some(PathBuf::from("m.json")));
        assert_eq!(cfg.host_quirks, HostQuirks::Off);
        let net = cfg.net.unwrap().device;
        assert_eq!(net.mac, [2, 0, 0, 0, 0, 9]);
        assert_eq!(net.queue_size, 1024);
        assert_eq!((net.tx_weight_bytes, net.tx_weight_packets), (0, 64));
        assert_eq!((net.rx_weight_bytes, net.rx_weight_packets), (4096, 0));
        assert!(!net.offloads && !net.mrg_rxbuf);
    }

    #[test]
    fn an_error_is_one_line_whatever_the_user_typed() {
        let err = parse(&["--kernel", "k", "--tap", "t", "--mac", "02:00\n:00"]).unwrap_err();
        assert!(err.contains('\n'), "the raw message carries the newline");
        let cli = Cli::try_parse_from(["minivmm", "--kernel", "k", "--tap", "t", "--mac", "0\n1"])
            .unwrap();
        let line = error_line(&cli.into_config().unwrap_err());
        assert!(!line.contains('\n'), "{line}");
        assert!(line.contains("'0\\n1'"), "{line}");
    }

    #[test]
    fn seccomp_is_on_unless_asked_otherwise() {
        use crate::seccomp::SeccompMode;
        let mode = |extra: &[&str]| {
            let args = ["minivmm", "--kernel", "k"].iter().chain(extra).copied();
            Cli::try_parse_from(args).map(|c| c.seccomp)
        };
        assert_eq!(mode(&[]).unwrap(), SeccompMode::On);
        assert_eq!(mode(&["--seccomp", "log"]).unwrap(), SeccompMode::Log);
        assert_eq!(mode(&["--seccomp", "off"]).unwrap(), SeccompMode::Off);
        assert!(mode(&["--seccomp", "maybe"]).is_err());
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
            (&["--kernel", "k", "--host-quirks", "maybe"], "host-quirks"),
            (&["--kernel", "k", "--mem", "lots"], "invalid value"),
            (&["--tap", "t"], "required arguments were not provided"),
            (
                &["--kernel", "k", "--mac", "02:00:00:00:00:01"],
                "required arguments were not provided",
            ),
            (&["--kernel", "k", "--bogus"], "unexpected argument"),
        ];
        for (args, want) in cases {
            let err = parse(args).unwrap_err();
            assert!(err.contains(want), "{args:?}: got '{err}', want '{want}'");
        }
    }
}
