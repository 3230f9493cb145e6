// SPDX-License-Identifier: Apache-2.0
//! What one input says, before defaults, and how inputs combine.
//!
//! The command line ([`super::cli`]) and the config file ([`super::file`])
//! each turn their text into [`Settings`], which holds only what the user
//! wrote; [`Settings::overlay`] layers the command line over the file and
//! [`Settings::finish`] applies the defaults and validates everything into
//! one [`VmmConfig`]. The value parsers both inputs share are in
//! [`super::parse`].

use std::collections::BTreeMap;
use std::path::PathBuf;

use log::LevelFilter;

use super::balloon::{finish_balloon, BalloonSpec};
use super::drive::{finish_drives, DriveSpec};
use super::entropy::{finish_entropy, EntropySpec};
use super::error::ConfigError;
use super::ids::check_unique_ids;
use super::mmds::{finish_mmds, MmdsSpec};
use super::net::{check_unique, finish_net, NetSpec};
use super::vsock::{finish_vsock, VsockSpec};
use super::{
    HostQuirks, HugePages, LoggerConfig, MetricsConfig, SerialConfig, VmmConfig, DEFAULT_MEM_MIB,
    DEFAULT_METRICS_INTERVAL_S, MAX_MEM_MIB, MAX_NICS, MAX_VCPUS, MIN_MEM_MIB,
};
use crate::process::seccomp::SeccompMode;

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
    /// Two threads per core.
    pub smt: Option<bool>,
    /// Pages backing guest memory.
    pub huge_pages: Option<HugePages>,
    /// Log the pages written to guest memory, for Diff snapshots.
    pub track_dirty_pages: Option<bool>,
    /// The console's output.
    pub serial: Option<SerialConfig>,
    /// NICs in order.
    pub nets: Vec<NetSpec>,
    /// NIC settings for every NIC that does not set them itself.
    pub net_defaults: NetSpec,
    /// Drives in order.
    pub drives: Vec<DriveSpec>,
    /// The entropy device, if asked for.
    pub entropy: Option<EntropySpec>,
    /// The vsock device, if asked for.
    pub vsock: Option<VsockSpec>,
    /// The balloon, if asked for (the config file and `PUT /balloon`
    /// only: no flag has one, as in Firecracker).
    pub balloon: Option<BalloonSpec>,
    /// MMDS, if configured (`mmds-config`).
    pub mmds: Option<MmdsSpec>,
    /// Metrics path.
    pub metrics_path: Option<PathBuf>,
    /// Metrics interval in seconds.
    pub metrics_interval_s: Option<u64>,
    /// Firecracker's metrics `emit_id`.
    pub metrics_emit_id: Option<bool>,
    /// Firecracker's metrics `properties`.
    pub metrics_properties: Option<BTreeMap<String, String>>,
    /// Log path.
    pub log_path: Option<PathBuf>,
    /// Log level.
    pub log_level: Option<LevelFilter>,
    /// Log module filter.
    pub log_module: Option<String>,
    /// Log origins.
    pub log_show_origin: Option<bool>,
    /// Log levels (shown unless said otherwise).
    pub log_show_level: Option<bool>,
    /// PVM host recoveries.
    pub host_quirks: Option<HostQuirks>,
    /// The system-call filter.
    pub seccomp: Option<SeccompMode>,
}

impl Settings {
    /// Layers `over` (the command line) on top of `self` (the file): a value
    /// `over` gives wins, NICs of `over` come after those of `self`, words
    /// for the command line are appended, and NIC defaults merge key by key.
    pub fn overlay(self, over: Settings) -> Settings {
        let mut nets = self.nets;
        nets.extend(over.nets);
        let mut drives = self.drives;
        drives.extend(over.drives);
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
            smt: over.smt.or(self.smt),
            huge_pages: over.huge_pages.or(self.huge_pages),
            track_dirty_pages: over.track_dirty_pages.or(self.track_dirty_pages),
            serial: over.serial.or(self.serial),
            nets,
            net_defaults: over.net_defaults.or(&self.net_defaults),
            drives,
            entropy: match (over.entropy, self.entropy) {
                (Some(o), Some(s)) => Some(o.or(s)),
                (o, s) => o.or(s),
            },
            // One device, given whole by either input: the command line's
            // replaces the file's.
            vsock: over.vsock.or(self.vsock),
            balloon: over.balloon.or(self.balloon),
            mmds: over.mmds.or(self.mmds),
            metrics_path: over.metrics_path.or(self.metrics_path),
            metrics_interval_s: over.metrics_interval_s.or(self.metrics_interval_s),
            metrics_emit_id: over.metrics_emit_id.or(self.metrics_emit_id),
            metrics_properties: over.metrics_properties.or(self.metrics_properties),
            log_path: over.log_path.or(self.log_path),
            log_level: over.log_level.or(self.log_level),
            log_module: over.log_module.or(self.log_module),
            log_show_origin: over.log_show_origin.or(self.log_show_origin),
            log_show_level: over.log_show_level.or(self.log_show_level),
            host_quirks: over.host_quirks.or(self.host_quirks),
            seccomp: over.seccomp.or(self.seccomp),
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
        let devices = nets.len()
            + self.drives.len()
            + usize::from(self.entropy.is_some())
            + usize::from(self.vsock.is_some())
            + usize::from(self.balloon.is_some());
        if devices > MAX_NICS {
            return Err(ConfigError::TooManyDevices(devices));
        }
        let drives = finish_drives(self.drives)?;
        let entropy = self.entropy.map(finish_entropy).transpose()?;
        let vsock = self.vsock.map(finish_vsock).transpose()?;
        let smt = self.smt.unwrap_or(false);
        let huge_pages = self.huge_pages.unwrap_or_default();
        let mem_mib = validate_mem(self.mem_mib.unwrap_or(DEFAULT_MEM_MIB), huge_pages)?;
        let balloon = self
            .balloon
            .map(|b| finish_balloon(b, mem_mib, huge_pages))
            .transpose()?;
        let mmds = self.mmds.map(|m| finish_mmds(m, &nets)).transpose()?;
        let metrics = match (self.metrics_path, self.metrics_interval_s) {
            (Some(path), interval) => Some(MetricsConfig {
                path,
                interval_s: interval.unwrap_or(DEFAULT_METRICS_INTERVAL_S),
                emit_id: self.metrics_emit_id.unwrap_or(false),
                properties: self.metrics_properties.unwrap_or_default(),
            }),
            (None, Some(_)) => return Err(ConfigError::IntervalWithoutMetrics),
            (None, None) => None,
        };
        let defaults = LoggerConfig::default();
        let cfg = VmmConfig {
            kernel,
            initramfs: self.initramfs,
            boot_args: self.boot_args,
            cmdline_extra: self.cmdline_extra,
            mem_mib,
            vcpus: validate_vcpus(self.vcpus.unwrap_or(1), smt)?,
            smt,
            huge_pages,
            track_dirty_pages: self.track_dirty_pages.unwrap_or(false),
            serial: validate_serial(self.serial.unwrap_or_default())?,
            nets,
            drives,
            entropy,
            vsock,
            balloon,
            mmds,
            metrics,
            logger: LoggerConfig {
                path: self.log_path,
                level: self.log_level.unwrap_or(defaults.level),
                module: self.log_module,
                show_origin: self.log_show_origin.unwrap_or(defaults.show_origin),
                show_level: self.log_show_level.unwrap_or(defaults.show_level),
            },
            host_quirks: self.host_quirks.unwrap_or_default(),
            seccomp: self.seccomp.unwrap_or_default(),
        };
        check_unique_ids(cfg.device_ids())?;
        Ok(cfg)
    }
}

/// Checks the memory size; 2 MiB pages need a whole number of them (as
/// Firecracker checks).
pub fn validate_mem(mib: u64, pages: HugePages) -> Result<u64, ConfigError> {
    if mib < MIN_MEM_MIB {
        return Err(ConfigError::MemTooSmall(mib));
    }
    if mib > MAX_MEM_MIB {
        return Err(ConfigError::MemTooLarge(mib));
    }
    if pages == HugePages::Hugetlbfs2M && !mib.is_multiple_of(2) {
        return Err(ConfigError::MemNotHugePages(mib));
    }
    Ok(mib)
}

/// Checks the console's rate limiter (a bucket of bytes).
fn validate_serial(serial: SerialConfig) -> Result<SerialConfig, ConfigError> {
    if let Some(bucket) = &serial.rate_limiter {
        devices::rate_limiter::TokenBucket::new("serial", bucket, 0)
            .map_err(|e| ConfigError::Serial(e.to_string()))?;
    }
    Ok(serial)
}

/// Checks the vCPU count against what the boot tables support; the KVM limit
/// is checked again by the builder once `/dev/kvm` is open.
pub fn validate_vcpus(n: u64, smt: bool) -> Result<u8, ConfigError> {
    match n {
        0 => Err(ConfigError::NoVcpus),
        n if n > u64::from(MAX_VCPUS) => Err(ConfigError::TooManyVcpus(n)),
        // Firecracker's rule: two threads per core need whole cores.
        n if smt && n > 1 && !n.is_multiple_of(2) => Err(ConfigError::SmtOddVcpus(n)),
        // The match arm above bounds n to u8.
        n => Ok(n as u8),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::net::MacAddr;
    use crate::config::TapBackend;
    use devices::rate_limiter::RateLimiterConfig;
    use devices::virtio::net::Offloads;

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
    fn no_two_devices_share_an_id_whatever_their_kinds() {
        let drive = |id: &str| super::super::drive::DriveSpec {
            id: Some(id.into()),
            path: Some("/images/a.img".into()),
            ..Default::default()
        };
        let with = |drives| Settings {
            drives,
            ..with_nets(vec![nic("t0")])
        };
        // A drive may not take a card's id: both are metrics keys.
        let e = with(vec![drive("net0")]).finish().unwrap_err();
        assert_eq!(
            e.to_string(),
            "id 'net0' is used twice, by a network interface and by a drive: device ids are metrics keys"
        );
        let e = with(vec![drive("x"), drive("x")]).finish().unwrap_err();
        assert!(e.to_string().contains("by a drive and by a drive"), "{e}");
        // No image is opened to say so, nor to accept a good one.
        let cfg = with(vec![drive("x")]).finish().unwrap();
        assert_eq!(
            cfg.drives[0].device.path,
            std::path::Path::new("/images/a.img")
        );
    }

    #[test]
    fn nics_get_ids_macs_and_defaults_by_position() {
        let cfg = with_nets(vec![nic("t0"), nic("t1")]).finish().unwrap();
        assert_eq!(cfg.nets[0].id, "net0");
        assert_eq!(cfg.nets[1].id, "net1");
        assert_eq!(cfg.nets[0].device.mac, MacAddr::default().0);
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
                interval_s: 5,
                emit_id: false,
                properties: Default::default(),
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
            (
                vec![NetSpec {
                    id: Some("id".into()),
                    ..nic("t0")
                }],
                "invalid network interface id 'id'",
            ),
            (
                vec![NetSpec {
                    id: Some("utc_timestamp_ms".into()),
                    ..nic("t0")
                }],
                "invalid network interface id 'utc_timestamp_ms'",
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
    fn mem_bounds() {
        assert!(matches!(
            validate_mem(31, HugePages::None),
            Err(ConfigError::MemTooSmall(31))
        ));
        assert_eq!(validate_mem(32, HugePages::None).unwrap(), 32);
        assert_eq!(
            validate_mem(MAX_MEM_MIB, HugePages::None).unwrap(),
            MAX_MEM_MIB
        );
        assert!(matches!(
            validate_mem(MAX_MEM_MIB + 1, HugePages::None),
            Err(ConfigError::MemTooLarge(_))
        ));
        // What the README promises: up to 64 GiB.
        assert_eq!(validate_mem(65536, HugePages::None).unwrap(), 65536);
        assert!(validate_mem(65537, HugePages::None).is_err());
        // 2 MiB pages: a whole number of them.
        assert!(matches!(
            validate_mem(129, HugePages::Hugetlbfs2M),
            Err(ConfigError::MemNotHugePages(129))
        ));
        assert_eq!(validate_mem(128, HugePages::Hugetlbfs2M).unwrap(), 128);
        assert_eq!(validate_mem(129, HugePages::Transparent).unwrap(), 129);
    }

    #[test]
    fn nineteen_nics_fit_the_irq_lines_and_twenty_do_not() {
        // IRQs 5 to 23, one per card.
        let nets = |n: usize| (0..n).map(|i| nic(&format!("t{i}"))).collect::<Vec<_>>();
        assert_eq!(with_nets(nets(19)).finish().unwrap().nets.len(), 19);
        let err = with_nets(nets(20)).finish().unwrap_err();
        assert!(matches!(err, ConfigError::TooManyNics(20)), "{err}");
        assert!(err.to_string().contains("at most 19"), "{err}");
    }

    #[test]
    fn vcpu_bounds() {
        assert!(matches!(
            validate_vcpus(0, false),
            Err(ConfigError::NoVcpus)
        ));
        assert_eq!(validate_vcpus(1, false).unwrap(), 1);
        assert_eq!(validate_vcpus(254, false).unwrap(), 254);
        assert!(matches!(
            validate_vcpus(255, false),
            Err(ConfigError::TooManyVcpus(255))
        ));
        // SMT: 1 or an even count, as Firecracker takes them.
        assert_eq!(validate_vcpus(1, true).unwrap(), 1);
        assert_eq!(validate_vcpus(2, true).unwrap(), 2);
        assert!(matches!(
            validate_vcpus(3, true),
            Err(ConfigError::SmtOddVcpus(3))
        ));
        assert_eq!(validate_vcpus(3, false).unwrap(), 3);
    }

    #[test]
    fn a_serial_limiter_is_checked_and_defaults_are_firecrackers() {
        let with = |serial| Settings {
            kernel: Some("k".into()),
            serial,
            ..Settings::default()
        };
        let cfg = with(None).finish().unwrap();
        assert_eq!(cfg.mem_mib, 128);
        assert!(!cfg.smt);
        assert_eq!(cfg.huge_pages, HugePages::None);
        assert_eq!(cfg.serial, SerialConfig::default());
        let bucket = |size| devices::rate_limiter::TokenBucketConfig {
            size,
            one_time_burst: 0,
            refill_time: 100,
        };
        let bad = with(Some(SerialConfig {
            out_path: None,
            rate_limiter: Some(bucket(0)),
        }));
        assert!(bad
            .finish()
            .unwrap_err()
            .to_string()
            .starts_with("serial rate_limiter: "));
        let good = SerialConfig {
            out_path: Some("/tmp/serial.out".into()),
            rate_limiter: Some(bucket(1000)),
        };
        assert_eq!(with(Some(good.clone())).finish().unwrap().serial, good);
    }
}
