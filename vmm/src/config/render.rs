// SPDX-License-Identifier: Apache-2.0
//! A [`VmmConfig`] back in the config-file layout, for `GET /vm/config`.
//!
//! Firecracker's `GET /vm/config` answers with its `FullVmConfiguration`: the
//! whole configuration in the layout of its `--config-file`, so that what it
//! returns boots the same VM. [`to_file_json`] does the same for minivmm, and
//! the contract is the round trip: for every configuration
//! [`Settings::finish`](super::settings::Settings::finish) can produce,
//! `file::parse(&to_file_json(&cfg).to_string())?.finish()?` is `cfg` again
//! (with the one exception below). Section by section:
//!
//! - Firecracker's keys are always there, `null` where nothing is set
//!   (`initrd_path`, `boot_args`, `partuuid`, `mtu`, a limiter without
//!   buckets, a missing bucket, a drive's `socket`), as Firecracker writes
//!   them. `boot_args: null` means minivmm's default command line, as it does
//!   when read back; the default is not spelled out, which would read back as
//!   a different configuration.
//! - A device shows every setting with its effective value, minivmm's own
//!   keys included (`queue_size`, `offloads`, `mrg_rxbuf`, the weights,
//!   `pass_time_budget_us`, `io_engine`): defaults are not left out, so the
//!   file boots the same VM even under a minivmm whose defaults differ.
//!   `one_time_burst` is a number, 0 included (Firecracker writes `null` for
//!   0; both read back the same). A card on an inherited descriptor has
//!   `host_dev_fd` and, if given, `host_dev_name`.
//! - A section nobody configured is `null`: `metrics` without a path, and
//!   `logger` at minivmm's defaults (warn, to stderr). Firecracker answers
//!   `null` for both whatever it was given (it keeps neither); minivmm keeps
//!   them, and a file that leaves them out would boot without them.
//!   `machine-config` carries `host_quirks` only when it is not `auto`, so
//!   the common case is Firecracker's section exactly (`smt`,
//!   `track_dirty_pages` and `huge_pages` as configured). `entropy` is `null` without the device,
//!   and `{"rate_limiter": ...}` with it, as Firecracker writes it; `vsock`
//!   is `null` without the device and `{"guest_cid": N, "uds_path": PATH}`
//!   with it, without the deprecated `vsock_id`, as Firecracker writes it;
//!   `balloon` likewise, with Firecracker's five fields when there is one,
//!   its target and statistics interval as the API last set them.
//!   `mmds-config` is `null` without MMDS and Firecracker's `MmdsConfig`
//!   with it (`version`, `network_interfaces`, `ipv4_address`,
//!   `imds_compat`, the defaults written out).
//!   `boot-source` carries `cmdline_extra` (`--cmdline`, words after
//!   everything minivmm adds) only when set; it is a minivmm key of the
//!   file like `host_quirks`, since folding the words into `boot_args` would
//!   move them before the device and root words and change the command line.
//! - Firecracker's sections minivmm does not have are written as
//!   Firecracker's own answer has them (its `VmmConfig`):
//!   `cpu-config` and `memory-hotplug` `null`, `pmem` `[]` (a list there, and Firecracker refuses `null` for
//!   it); `serial`, which Firecracker never answers with, is left out.
//! - `logger.level` uses the spellings of Firecracker's enum (`Warning`, not
//!   `warn`); `show_level` is `true` because minivmm always shows it.
//!
//! Not rendered, because they are not part of a VM's configuration in
//! Firecracker's sense:
//!
//! - the seccomp mode: in Firecracker a property of the process
//!   (`--no-seccomp`, `--seccomp-filter`), never of its config file or
//!   `FullVmConfiguration`; read back, it is [`SeccompMode::default`], and
//!   whoever starts a VM from the file chooses it again with `--seccomp`.
//! - the net device's `bounce_buffer`: a benchmark baseline no input can set
//!   (always `false` from `finish`).
//!
//! Paths that are not UTF-8 cannot be JSON strings and are written lossily
//! (U+FFFD), so they do not round-trip. Two things rendered here fall outside
//! Firecracker's API description (`minivmm_tests::fc_schema` checks it): a
//! card on a descriptor with no `host_dev_name` (required there), and more
//! than 32 vCPUs (its `vcpu_count` maximum; minivmm takes up to 254).
//!
//! [`SeccompMode::default`]: crate::process::seccomp::SeccompMode

use std::path::Path;

use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use devices::virtio::block::CacheType;
use devices::virtio::net::{IoEngine, Offloads};
use devices::virtio::rng::RngConfig;
use devices::virtio::vsock::VsockConfig;
use log::LevelFilter;
use serde_json::{json, Value};

use super::mmds::MmdsConfig;
use super::net::MacAddr;
use super::{
    DriveConfig, HostQuirks, LoggerConfig, MetricsConfig, NicConfig, TapBackend, VmmConfig,
};

/// The whole configuration in the config-file layout (see the module doc):
/// what [`super::file::parse`] reads back into `cfg`.
pub fn to_file_json(cfg: &VmmConfig) -> Value {
    let mut boot_source = json!({
        "kernel_image_path": path(&cfg.kernel),
        "initrd_path": cfg.initramfs.as_deref().map(path),
        "boot_args": cfg.boot_args,
    });
    if let Some(extra) = &cfg.cmdline_extra {
        boot_source["cmdline_extra"] = json!(extra);
    }
    let mut machine = json!({
        "vcpu_count": cfg.vcpus,
        "mem_size_mib": cfg.mem_mib,
        "smt": cfg.smt,
        "track_dirty_pages": cfg.track_dirty_pages,
        "huge_pages": cfg.huge_pages.name(),
    });
    if cfg.host_quirks != HostQuirks::Auto {
        machine["host_quirks"] = json!(host_quirks(cfg.host_quirks));
    }
    json!({
        "boot-source": boot_source,
        "machine-config": machine,
        "network-interfaces": cfg.nets.iter().map(interface).collect::<Vec<_>>(),
        "drives": cfg.drives.iter().map(drive).collect::<Vec<_>>(),
        "logger": logger(&cfg.logger),
        "metrics": cfg.metrics.as_ref().map(metrics),
        "balloon": cfg.balloon.as_ref().map(super::balloon::render),
        "cpu-config": null,
        "entropy": cfg.entropy.as_ref().map(entropy),
        "memory-hotplug": null,
        "mmds-config": cfg.mmds.as_ref().map(mmds),
        "pmem": [],
        "vsock": cfg.vsock.as_ref().map(vsock),
    })
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// As `--host-quirks` and the file's `host_quirks` spell it.
fn host_quirks(q: HostQuirks) -> &'static str {
    match q {
        HostQuirks::Auto => "auto",
        HostQuirks::On => "on",
        HostQuirks::Off => "off",
    }
}

/// Firecracker's spelling (its block devices' `io_engine`).
fn io_engine(e: IoEngine) -> &'static str {
    match e {
        IoEngine::Async => "Async",
        IoEngine::Sync => "Sync",
    }
}

/// Firecracker's `level` enum: `Error`, `Warning`, `Info`, `Debug`,
/// `Trace`, `Off`.
fn level(l: LevelFilter) -> &'static str {
    match l {
        LevelFilter::Off => "Off",
        LevelFilter::Error => "Error",
        LevelFilter::Warn => "Warning",
        LevelFilter::Info => "Info",
        LevelFilter::Debug => "Debug",
        LevelFilter::Trace => "Trace",
    }
}

/// The names `parse_offloads` reads, one per offload offered; `[]` is none.
fn offloads(o: Offloads) -> Vec<&'static str> {
    [
        (o.csum, "csum"),
        (o.tso4, "tso4"),
        (o.tso6, "tso6"),
        (o.ufo, "ufo"),
    ]
    .into_iter()
    .filter_map(|(on, name)| on.then_some(name))
    .collect()
}

fn bucket(b: TokenBucketConfig) -> Value {
    json!({
        "size": b.size,
        "one_time_burst": b.one_time_burst,
        "refill_time": b.refill_time,
    })
}

/// `null` without buckets, as Firecracker's `RateLimiterConfig::into_option`.
fn limiter(rl: &RateLimiterConfig) -> Value {
    if rl.is_unlimited() {
        return Value::Null;
    }
    json!({
        "bandwidth": rl.bandwidth.map(bucket),
        "ops": rl.ops.map(bucket),
    })
}

fn interface(n: &NicConfig) -> Value {
    let d = &n.device;
    let (name, fd) = match &n.tap {
        TapBackend::Named(name) => (Some(name), None),
        TapBackend::Fd { fd, name } => (name.as_ref(), Some(*fd)),
    };
    let mut v = json!({
        "iface_id": n.id,
        "host_dev_name": name,
        "guest_mac": MacAddr(d.mac).to_string(),
        "mtu": d.mtu,
        "rx_rate_limiter": limiter(&d.rx_rate_limiter),
        "tx_rate_limiter": limiter(&d.tx_rate_limiter),
        "queue_size": d.queue_size,
        "offloads": offloads(d.offloads),
        "mrg_rxbuf": d.mrg_rxbuf,
        "tx_weight_bytes": d.tx_weight_bytes,
        "tx_weight_packets": d.tx_weight_packets,
        "rx_weight_bytes": d.rx_weight_bytes,
        "rx_weight_packets": d.rx_weight_packets,
        "pass_time_budget_us": d.pass_time_budget_us,
        "io_engine": io_engine(d.io_engine),
    });
    if let Some(fd) = fd {
        v["host_dev_fd"] = json!(fd);
    }
    v
}

fn drive(d: &DriveConfig) -> Value {
    let b = &d.device;
    json!({
        "drive_id": b.id,
        "path_on_host": path(&b.path),
        "is_root_device": d.is_root_device,
        "is_read_only": b.read_only,
        "partuuid": d.partuuid,
        "cache_type": match b.cache_type {
            CacheType::Unsafe => "Unsafe",
            CacheType::Writeback => "Writeback",
        },
        "io_engine": io_engine(b.io_engine),
        "rate_limiter": limiter(&b.rate_limiter),
        "socket": null,
        "queue_size": b.queue_size,
    })
}

fn entropy(e: &RngConfig) -> Value {
    json!({ "rate_limiter": limiter(&e.rate_limiter) })
}

/// Firecracker's `MmdsConfig`, every field written.
fn mmds(m: &MmdsConfig) -> Value {
    json!({
        "version": m.version,
        "network_interfaces": m.network_interfaces,
        "ipv4_address": m.ipv4_address.to_string(),
        "imds_compat": m.imds_compat,
    })
}

fn vsock(v: &VsockConfig) -> Value {
    json!({ "guest_cid": v.guest_cid, "uds_path": path(&v.uds_path) })
}

/// `null` at the defaults (see the module doc).
fn logger(l: &LoggerConfig) -> Value {
    if *l == LoggerConfig::default() {
        return Value::Null;
    }
    json!({
        "log_path": l.path.as_deref().map(path),
        "level": level(l.level),
        "show_level": l.show_level,
        "show_log_origin": l.show_origin,
        "module": l.module,
    })
}

fn metrics(m: &MetricsConfig) -> Value {
    let mut v = json!({
        "metrics_path": path(&m.path),
        "interval_s": m.interval_s,
        "emit_id": m.emit_id,
    });
    if !m.properties.is_empty() {
        v["properties"] = json!(m.properties);
    }
    v
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use clap::Parser;
    use devices::virtio::net::NetConfig;
    use minivmm_tests::fc_schema::{
        definitions, firecracker_network_example, validate, validate_minivmm,
    };

    use super::*;
    use crate::config::cli::{parse_net, Cli};
    use crate::config::drive::parse_disk;
    use crate::config::entropy::parse_rng;
    use crate::config::file;
    use crate::config::settings::Settings;
    use crate::config::vsock::parse_vsock;
    use crate::config::{DEFAULT_MEM_MIB, DEFAULT_METRICS_INTERVAL_S};
    use crate::process::seccomp::SeccompMode;

    /// Image files for drives (`finish` checks that they exist), removed on
    /// drop.
    struct Images(PathBuf);

    impl Images {
        fn new(tag: &str) -> Images {
            let dir =
                std::env::temp_dir().join(format!("minivmm-render-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Images(dir)
        }

        fn file(&self, name: &str) -> String {
            let p = self.0.join(name);
            std::fs::write(&p, vec![0u8; 4096]).unwrap();
            p.to_str().unwrap().to_string()
        }
    }

    impl Drop for Images {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Renders `cfg`, reads it back as a config file and checks it is `cfg`
    /// again (seccomp aside: see the module doc), and that rendering that
    /// gives the same JSON. Returns the rendering.
    fn round_trip(cfg: &VmmConfig) -> Value {
        let rendered = to_file_json(cfg);
        let text = rendered.to_string();
        let settings = file::parse(&text).unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let back = settings
            .finish()
            .unwrap_or_else(|e| panic!("{e:?}\n{text}"));
        let want = VmmConfig {
            seccomp: SeccompMode::default(),
            ..cfg.clone()
        };
        assert_eq!(back, want, "{text}");
        assert_eq!(to_file_json(&back), rendered);
        rendered
    }

    fn any_nic(c: &VmmConfig, f: impl Fn(&NicConfig) -> bool) -> bool {
        c.nets.iter().any(f)
    }

    fn any_dev(c: &VmmConfig, f: impl Fn(&NetConfig) -> bool) -> bool {
        c.nets.iter().any(|n| f(&n.device))
    }

    /// Whether some card's `field` differs from the device's default.
    fn any_dev_off_default(c: &VmmConfig, field: fn(&NetConfig) -> u64) -> bool {
        any_dev(c, |n| field(n) != field(&NetConfig::default()))
    }

    fn minimal() -> VmmConfig {
        Settings {
            kernel: Some("k".into()),
            ..Settings::default()
        }
        .finish()
        .unwrap()
    }

    /// Every field of the configuration off its default at least once:
    /// four cards (a named TAP with every key, a descriptor with a name, one
    /// without, a named TAP at the bounds), three drives, a logger, metrics.
    fn everything(img: &Images) -> VmmConfig {
        let net = |s: &str| parse_net(s).unwrap();
        let disk = |s: String| parse_disk(&s).unwrap();
        Settings {
            kernel: Some("/boot/vmlinux".into()),
            initramfs: Some("/boot/initramfs.cpio".into()),
            boot_args: Some("console=ttyS0 reboot=k panic=1".into()),
            cmdline_extra: Some("ip=dhcp quiet".into()),
            mem_mib: Some(2048),
            vcpus: Some(4),
            track_dirty_pages: Some(true),
            nets: vec![
                net(
                    "tap=tap0,id=wan,mac=02:00:00:00:00:01,mtu=9000,queue_size=1024,\
                     offloads=csum+tso4,mrg_rxbuf=off,tx_weight_bytes=0,tx_weight_packets=64,\
                     rx_weight_bytes=0x1000,rx_weight_packets=0,pass_time_budget_us=0,\
                     io_engine=sync,rx_bw_size=2500000,rx_bw_one_time_burst=1000,\
                     rx_bw_refill_time=100,rx_ops_size=2000,rx_ops_refill_time=100,\
                     tx_bw_size=1000000,tx_bw_refill_time=50",
                ),
                net(
                    "fd=5,tap=tap5,id=lan,offloads=none,ops_size=10,ops_one_time_burst=5,\
                     ops_refill_time=1000",
                ),
                net("fd=7,offloads=csum+tso6+ufo,tx_ops_size=1,tx_ops_refill_time=1"),
                net("tap=tap3,mtu=68,queue_size=1,offloads=all"),
            ],
            drives: vec![
                disk(format!(
                    "path={},id=rootfs,root=on,readonly=on,partuuid=0eaa91a0-01,cache=writeback,\
                     io_engine=sync,queue_size=64,bw_size=10485760,bw_one_time_burst=4096,\
                     bw_refill_time=1000,ops_size=100,ops_refill_time=10",
                    img.file("root.img")
                )),
                disk(format!("path={}", img.file("data.img"))),
                disk(format!(
                    "path={},id=ro,readonly=on,queue_size=32768,ops_size=5,ops_refill_time=1",
                    img.file("ro.img")
                )),
            ],
            entropy: Some(
                parse_rng("bw_size=1000,bw_one_time_burst=10,bw_refill_time=100").unwrap(),
            ),
            vsock: Some(parse_vsock("cid=0xfffffffe,socket=/run/minivmm/v.sock").unwrap()),
            mmds: Some(crate::config::mmds::MmdsSpec {
                version: devices::mmds::MmdsVersion::V2,
                network_interfaces: vec!["lan".into(), "wan".into()],
                ipv4_address: Some([169, 254, 170, 2].into()),
                imds_compat: true,
            }),
            metrics_path: Some("/run/minivmm/metrics.fifo".into()),
            metrics_interval_s: Some(0),
            metrics_emit_id: Some(true),
            metrics_properties: Some([("az".to_string(), "eu-1".to_string())].into()),
            log_path: Some("/var/log/minivmm.log".into()),
            log_level: Some(LevelFilter::Trace),
            log_module: Some("devices::virtio::net".into()),
            log_show_origin: Some(true),
            log_show_level: Some(false),
            host_quirks: Some(HostQuirks::On),
            seccomp: Some(SeccompMode::Log),
            ..Settings::default()
        }
        .finish()
        .unwrap()
    }

    /// A config file (Firecracker's layout with minivmm's keys) under the
    /// command line, as `minivmm --config-file vm.json ...` builds it.
    fn from_the_command_line(img: &Images) -> VmmConfig {
        let file = img.0.join("vm.json");
        let text = r#"{
          "boot-source": {"kernel_image_path": "vmlinux", "initrd_path": "initramfs.cpio",
                          "boot_args": "console=ttyS0", "cmdline_extra": "a=1"},
          "machine-config": {"vcpu_count": 2, "mem_size_mib": 512, "smt": false, "host_quirks": "auto"},
          "network-interfaces": [
            {"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:AC:10:00:02", "mtu": 1500,
             "rx_rate_limiter": {"bandwidth": {"size": 2500000, "one_time_burst": 0, "refill_time": 100},
                                 "ops": {"size": 2000, "refill_time": 100}},
             "tx_rate_limiter": {"bandwidth": {"size": 2500000, "refill_time": 100}, "ops": null}},
            {"iface_id": "eth1", "host_dev_name": "tap1", "queue_size": 1024,
             "offloads": ["csum", "tso4", "tso6"], "tx_weight_packets": 128, "io_engine": "Sync"}
          ],
          "metrics": {"metrics_path": "metrics.fifo", "interval_s": 10},
          "logger": {"log_path": "minivmm.log", "level": "Info", "show_level": true, "show_log_origin": false},
          "entropy": {"rate_limiter": {"ops": {"size": 100, "refill_time": 1000}}},
          "vsock": {"vsock_id": "vsock0", "guest_cid": 3, "uds_path": "v.sock"},
          "balloon": null, "mmds-config": {"network_interfaces": ["eth1"], "version": "V2"}
        }"#;
        std::fs::write(&file, text).unwrap();
        let disk = format!("path={},io_engine=sync", img.file("cli.img"));
        Cli::try_parse_from([
            "minivmm",
            "--config-file",
            file.to_str().unwrap(),
            "--cmdline",
            "b=2",
            "--net",
            "fd=9,tap=tap9,id=extra",
            "--disk",
            &disk,
            "--mem",
            "64",
            "--host-quirks",
            "off",
            "--no-mrg-rxbuf",
            "--tx-weight-bytes",
            "0x1000",
            "--seccomp",
            "off",
            "--rng",
        ])
        .unwrap()
        .into_config()
        .unwrap()
    }

    #[test]
    fn every_configuration_comes_back_as_it_was() {
        let img = Images::new("round-trip");
        let mut configs = vec![minimal(), everything(&img), from_the_command_line(&img)];
        for level in [
            LevelFilter::Off,
            LevelFilter::Error,
            LevelFilter::Warn,
            LevelFilter::Info,
            LevelFilter::Debug,
            LevelFilter::Trace,
        ] {
            // With a path, so that `Warn` is not the default logger too.
            let mut c = minimal();
            c.logger.level = level;
            c.logger.path = Some("minivmm.log".into());
            configs.push(c);
        }
        let mut c = minimal();
        (c.boot_args, c.cmdline_extra) = (Some(String::new()), Some(String::new()));
        c.host_quirks = HostQuirks::Off;
        c.metrics = Some(MetricsConfig {
            path: "m".into(),
            interval_s: DEFAULT_METRICS_INTERVAL_S,
            emit_id: false,
            properties: Default::default(),
        });
        c.vcpus = 254;
        c.entropy = Some(RngConfig::default());
        configs.push(c);
        for cfg in &configs {
            round_trip(cfg);
        }

        // What the configurations above cover: each field off its default
        // at least once (so a field the renderer forgot cannot hide).
        type Covers = fn(&VmmConfig) -> bool;
        let checks: Vec<(&str, Covers)> = vec![
            ("initramfs", |c| c.initramfs.is_some()),
            ("boot_args", |c| c.boot_args.is_some()),
            ("empty boot_args", |c| c.boot_args.as_deref() == Some("")),
            ("cmdline_extra", |c| c.cmdline_extra.is_some()),
            ("mem_mib", |c| c.mem_mib != DEFAULT_MEM_MIB),
            ("more than 32 vCPUs", |c| c.vcpus > 32),
            ("host_quirks on", |c| c.host_quirks == HostQuirks::On),
            ("host_quirks off", |c| c.host_quirks == HostQuirks::Off),
            ("metrics", |c| c.metrics.is_some()),
            ("metrics interval", |c| {
                c.metrics
                    .as_ref()
                    .is_some_and(|m| m.interval_s != DEFAULT_METRICS_INTERVAL_S)
            }),
            ("log path", |c| c.logger.path.is_some()),
            ("log module", |c| c.logger.module.is_some()),
            ("log origin", |c| c.logger.show_origin),
            ("log level hidden", |c| !c.logger.show_level),
            ("seccomp", |c| c.seccomp != SeccompMode::default()),
            ("fd with a name", |c| {
                any_nic(c, |n| {
                    matches!(&n.tap, TapBackend::Fd { name: Some(_), .. })
                })
            }),
            ("fd without a name", |c| {
                any_nic(c, |n| matches!(&n.tap, TapBackend::Fd { name: None, .. }))
            }),
            ("iface_id", |c| any_nic(c, |n| !n.id.starts_with("net"))),
            ("guest_mac", |c| any_dev(c, |n| n.mac[0] != 6)),
            ("queue_size", |c| {
                any_dev(c, |n| n.queue_size != NetConfig::default().queue_size)
            }),
            ("mtu", |c| any_dev(c, |n| n.mtu.is_some())),
            ("no offloads", |c| {
                any_dev(c, |n| n.offloads == Offloads::NONE)
            }),
            ("some offloads", |c| {
                any_dev(c, |n| n.offloads.csum && n.offloads != Offloads::ALL)
            }),
            ("mrg_rxbuf", |c| any_dev(c, |n| !n.mrg_rxbuf)),
            ("tx_weight_bytes", |c| {
                any_dev_off_default(c, |n| n.tx_weight_bytes)
            }),
            ("tx_weight_packets", |c| {
                any_dev_off_default(c, |n| n.tx_weight_packets)
            }),
            ("rx_weight_bytes", |c| {
                any_dev_off_default(c, |n| n.rx_weight_bytes)
            }),
            ("rx_weight_packets", |c| {
                any_dev_off_default(c, |n| n.rx_weight_packets)
            }),
            ("pass_time_budget_us", |c| {
                any_dev_off_default(c, |n| n.pass_time_budget_us)
            }),
            ("io_engine", |c| {
                any_dev(c, |n| n.io_engine == IoEngine::Sync)
            }),
            ("rx bandwidth with a burst", |c| {
                any_dev(c, |n| {
                    n.rx_rate_limiter
                        .bandwidth
                        .is_some_and(|b| b.one_time_burst > 0)
                })
            }),
            ("rx ops", |c| {
                any_dev(c, |n| n.rx_rate_limiter.ops.is_some())
            }),
            ("tx bandwidth", |c| {
                any_dev(c, |n| n.tx_rate_limiter.bandwidth.is_some())
            }),
            ("tx ops with a burst", |c| {
                any_dev(c, |n| {
                    n.tx_rate_limiter.ops.is_some_and(|b| b.one_time_burst > 0)
                })
            }),
            ("tx ops alone", |c| {
                any_dev(c, |n| {
                    n.tx_rate_limiter.ops.is_some() && n.tx_rate_limiter.bandwidth.is_none()
                })
            }),
            ("root drive", |c| c.drives.iter().any(|d| d.is_root_device)),
            ("read-only drive", |c| {
                c.drives.iter().any(|d| d.device.read_only)
            }),
            ("partuuid", |c| {
                c.drives.iter().any(|d| d.partuuid.is_some())
            }),
            ("cache_type", |c| {
                c.drives
                    .iter()
                    .any(|d| d.device.cache_type == CacheType::Writeback)
            }),
            ("drive io_engine", |c| {
                c.drives
                    .iter()
                    .any(|d| d.device.io_engine == IoEngine::Sync)
            }),
            ("drive bandwidth with a burst", |c| {
                c.drives.iter().any(|d| {
                    d.device
                        .rate_limiter
                        .bandwidth
                        .is_some_and(|b| b.one_time_burst > 0)
                })
            }),
            ("drive ops", |c| {
                c.drives.iter().any(|d| d.device.rate_limiter.ops.is_some())
            }),
            ("drive queue_size", |c| {
                c.drives.iter().any(|d| d.device.queue_size != 256)
            }),
            ("entropy without a limiter", |c| {
                c.entropy.is_some_and(|e| e.rate_limiter.is_unlimited())
            }),
            ("entropy bandwidth with a burst", |c| {
                c.entropy.is_some_and(|e| {
                    e.rate_limiter
                        .bandwidth
                        .is_some_and(|b| b.one_time_burst > 0)
                })
            }),
            ("entropy ops", |c| {
                c.entropy.is_some_and(|e| e.rate_limiter.ops.is_some())
            }),
            ("vsock", |c| c.vsock.is_some()),
        ];
        for (what, covered) in checks {
            assert!(configs.iter().any(covered), "no configuration has {what}");
        }
        for level in ["Off", "Error", "Warning", "Info", "Debug", "Trace"] {
            assert!(
                configs
                    .iter()
                    .any(|c| to_file_json(c)["logger"]["level"] == level),
                "{level}"
            );
        }
    }

    #[test]
    fn the_sections_are_firecrackers_and_unset_ones_are_null() {
        let mut cfg = minimal();
        cfg.seccomp = SeccompMode::Off;
        let v = round_trip(&cfg);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        let fc: Vec<&String> = definitions()["FullVmConfiguration"]["properties"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(keys, fc);
        for section in [
            "balloon",
            "cpu-config",
            "entropy",
            "memory-hotplug",
            "mmds-config",
            "vsock",
            "logger",
            "metrics",
        ] {
            assert_eq!(v[section], Value::Null, "{section}");
        }
        assert_eq!(v["pmem"], json!([]));
        assert_eq!(v["drives"], json!([]));
        assert_eq!(v["network-interfaces"], json!([]));
        assert_eq!(
            v["boot-source"],
            json!({"kernel_image_path": "k", "initrd_path": null, "boot_args": null})
        );
        assert_eq!(
            v["machine-config"],
            json!({"vcpu_count": 1, "mem_size_mib": 128, "smt": false,
                   "track_dirty_pages": false, "huge_pages": "None"})
        );
        // The seccomp mode is the process's, not the VM's.
        assert!(!v.to_string().contains("seccomp"), "{v}");
        // A VM that uses nothing of minivmm's own is Firecracker's exactly.
        assert_eq!(validate("FullVmConfiguration", &v), Ok(()));
    }

    #[test]
    fn minivmm_keys_appear_where_they_say_something() {
        let mut cfg = minimal();
        for (quirks, want) in [
            (HostQuirks::Auto, Value::Null),
            (HostQuirks::On, json!("on")),
            (HostQuirks::Off, json!("off")),
        ] {
            cfg.host_quirks = quirks;
            assert_eq!(to_file_json(&cfg)["machine-config"]["host_quirks"], want);
        }
        cfg.cmdline_extra = Some("quiet".into());
        assert_eq!(to_file_json(&cfg)["boot-source"]["cmdline_extra"], "quiet");
        cfg.logger = LoggerConfig {
            level: LevelFilter::Info,
            ..LoggerConfig::default()
        };
        assert_eq!(
            to_file_json(&cfg)["logger"],
            json!({"log_path": null, "level": "Info", "show_level": true,
                   "show_log_origin": false, "module": null})
        );
    }

    #[test]
    fn cards_and_drives_show_every_setting() {
        let img = Images::new("devices");
        let v = round_trip(&everything(&img));
        let nets = &v["network-interfaces"];
        assert_eq!(
            nets[0],
            json!({
                "iface_id": "wan", "host_dev_name": "tap0", "guest_mac": "02:00:00:00:00:01",
                "mtu": 9000,
                "rx_rate_limiter": {
                    "bandwidth": {"size": 2500000, "one_time_burst": 1000, "refill_time": 100},
                    "ops": {"size": 2000, "one_time_burst": 0, "refill_time": 100}
                },
                "tx_rate_limiter": {
                    "bandwidth": {"size": 1000000, "one_time_burst": 0, "refill_time": 50},
                    "ops": null
                },
                "queue_size": 1024, "offloads": ["csum", "tso4"], "mrg_rxbuf": false,
                "tx_weight_bytes": 0, "tx_weight_packets": 64, "rx_weight_bytes": 4096,
                "rx_weight_packets": 0, "pass_time_budget_us": 0, "io_engine": "Sync"
            })
        );
        assert_eq!(
            (&nets[1]["host_dev_fd"], &nets[1]["host_dev_name"]),
            (&json!(5), &json!("tap5"))
        );
        assert_eq!(nets[1]["offloads"], json!([]));
        assert_eq!(
            (&nets[2]["host_dev_fd"], &nets[2]["host_dev_name"]),
            (&json!(7), &Value::Null)
        );
        assert_eq!(nets[2]["rx_rate_limiter"], Value::Null);
        assert_eq!(nets[2]["offloads"], json!(["csum", "tso6", "ufo"]));
        assert_eq!(nets[3]["offloads"], json!(["csum", "tso4", "tso6", "ufo"]));
        assert_eq!(nets[3]["mrg_rxbuf"], true);
        assert_eq!(nets[3]["io_engine"], "Async");
        assert!(nets[3].get("host_dev_fd").is_none());
        assert_eq!(nets[3]["mtu"], 68);
        let drives = &v["drives"];
        assert_eq!(
            drives[0],
            json!({
                "drive_id": "rootfs", "path_on_host": img.0.join("root.img").to_str().unwrap(),
                "is_root_device": true, "is_read_only": true, "partuuid": "0eaa91a0-01",
                "cache_type": "Writeback", "io_engine": "Sync",
                "rate_limiter": {
                    "bandwidth": {"size": 10485760, "one_time_burst": 4096, "refill_time": 1000},
                    "ops": {"size": 100, "one_time_burst": 0, "refill_time": 10}
                },
                "socket": null, "queue_size": 64
            })
        );
        assert_eq!(
            drives[1],
            json!({
                "drive_id": "disk1", "path_on_host": img.0.join("data.img").to_str().unwrap(),
                "is_root_device": false, "is_read_only": false, "partuuid": null,
                "cache_type": "Unsafe", "io_engine": "Async", "rate_limiter": null,
                "socket": null, "queue_size": 256
            })
        );
        assert_eq!(
            v["logger"],
            json!({"log_path": "/var/log/minivmm.log", "level": "Trace", "show_level": false,
                   "show_log_origin": true, "module": "devices::virtio::net"})
        );
        assert_eq!(
            v["metrics"],
            json!({"metrics_path": "/run/minivmm/metrics.fifo", "interval_s": 0,
                   "emit_id": true, "properties": {"az": "eu-1"}})
        );
        assert_eq!(v["boot-source"]["initrd_path"], "/boot/initramfs.cpio");
        assert_eq!(
            v["entropy"],
            json!({"rate_limiter": {
                "bandwidth": {"size": 1000, "one_time_burst": 10, "refill_time": 100},
                "ops": null
            }})
        );
    }

    #[test]
    fn the_entropy_device_is_firecrackers_section_and_its_flag_keeps_the_files_limiter() {
        let img = Images::new("entropy");
        let cfg = from_the_command_line(&img);
        // `--rng` alone over the file's section: the file's limiter stays.
        let ops = cfg.entropy.and_then(|e| e.rate_limiter.ops);
        assert_eq!(ops.map(|b| (b.size, b.refill_time)), Some((100, 1000)));
        let v = round_trip(&cfg);
        assert_eq!(validate("EntropyDevice", &v["entropy"]), Ok(()));
        let mut plain = minimal();
        plain.entropy = Some(RngConfig::default());
        assert_eq!(round_trip(&plain)["entropy"], json!({"rate_limiter": null}));
        // The device takes a window, and its id, beside the others'.
        assert_eq!(
            plain.device_ids().collect::<Vec<_>>(),
            [(crate::config::DeviceKind::Rng, "entropy")]
        );
    }

    #[test]
    fn the_vsock_device_is_firecrackers_section_without_vsock_id() {
        let img = Images::new("vsock");
        let cfg = from_the_command_line(&img);
        let v = round_trip(&cfg);
        assert_eq!(v["vsock"], json!({"guest_cid": 3, "uds_path": "v.sock"}));
        assert_eq!(validate("Vsock", &v["vsock"]), Ok(()));
        let all = round_trip(&everything(&img));
        assert_eq!(
            all["vsock"],
            json!({"guest_cid": 4294967294u64, "uds_path": "/run/minivmm/v.sock"})
        );
        // The device takes a window, and its id, after the entropy device.
        let ids: Vec<_> = cfg.device_ids().map(|(_, id)| id).collect();
        assert_eq!(ids.last(), Some(&"vsock"));
        assert_eq!(ids[ids.len() - 2], "entropy");
        assert_eq!(round_trip(&minimal())["vsock"], Value::Null);
    }

    /// Every value `source` gives is in `rendered` at the same place; a
    /// `null` there is `null` or absent here.
    fn assert_keeps(source: &Value, rendered: &Value, at: &str) {
        match source {
            Value::Object(m) => {
                for (k, v) in m {
                    let here = format!("{at}.{k}");
                    match rendered.get(k) {
                        Some(r) => assert_keeps(v, r, &here),
                        None => assert!(v.is_null(), "{here}: {v} is not rendered"),
                    }
                }
            }
            Value::Array(a) => {
                let r = rendered
                    .as_array()
                    .unwrap_or_else(|| panic!("{at}: {rendered}"));
                assert_eq!(a.len(), r.len(), "{at}");
                for (i, (x, y)) in a.iter().zip(r).enumerate() {
                    assert_keeps(x, y, &format!("{at}[{i}]"));
                }
            }
            _ => assert_eq!(source, rendered, "{at}"),
        }
    }

    #[test]
    fn firecrackers_example_keeps_every_value() {
        let img = Images::new("fc-example");
        // Firecracker's tests/framework/vm_config_network.json with its
        // root drive on a real file.
        let mut source = firecracker_network_example();
        source["drives"][0]["path_on_host"] = json!(img.file("bionic.rootfs.ext4"));
        let cfg = file::parse(&source.to_string()).unwrap().finish().unwrap();
        let rendered = round_trip(&cfg);
        assert_keeps(&source, &rendered, "$");
        assert_eq!(validate_minivmm("FullVmConfiguration", &rendered), Ok(()));
        // What minivmm adds are its own keys, which Firecracker's
        // description does not list.
        assert_eq!(
            validate("FullVmConfiguration", &rendered),
            Err("$.drives[0].queue_size: unknown property (not in Drive)".into())
        );
    }

    #[test]
    fn renderings_validate_against_firecrackers_description() {
        let img = Images::new("schema");
        for cfg in [minimal(), from_the_command_line(&img)] {
            let v = to_file_json(&cfg);
            assert_eq!(validate_minivmm("FullVmConfiguration", &v), Ok(()), "{v}");
        }
        let mut all = everything(&img);
        let v = to_file_json(&all);
        // Outside Firecracker's description (see the module doc): a card on
        // a descriptor with no name ...
        assert_eq!(
            validate_minivmm("FullVmConfiguration", &v),
            Err("$.network-interfaces[2]: missing required property 'host_dev_name'".into())
        );
        all.nets.remove(2);
        let v = to_file_json(&all);
        assert_eq!(validate_minivmm("FullVmConfiguration", &v), Ok(()), "{v}");
        assert_eq!(
            validate_minivmm("MachineConfiguration", &v["machine-config"]),
            Ok(())
        );
        // ... and more than 32 vCPUs.
        all.vcpus = 33;
        assert_eq!(
            validate_minivmm("FullVmConfiguration", &to_file_json(&all)),
            Err("$.machine-config.vcpu_count: 33 is above the maximum 32".into())
        );
    }
}
