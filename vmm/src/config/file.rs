// SPDX-License-Identifier: Apache-2.0
//! `--config-file`: Firecracker's JSON layout, read into [`Settings`].
//!
//! A Firecracker user's file works as written when it uses what minivmm has:
//! `boot-source`, `machine-config`, `network-interfaces` (with
//! `rx_rate_limiter`/`tx_rate_limiter`), `drives` (with `rate_limiter`),
//! `entropy` (with `rate_limiter`), `vsock` (with the deprecated `vsock_id`,
//! accepted and ignored), `balloon`, `mmds-config`, `metrics` and `logger`; every other Firecracker section may be `null` (as
//! Firecracker's own example files write them). Anything minivmm does not do,
//! a vhost-user drive (`socket`) and so on, or
//! `smt: true`, is refused with one line naming it rather than ignored, and so
//! is every unknown key. minivmm's own settings sit beside Firecracker's in
//! the section they belong to (documented in the README): `cmdline_extra` in
//! `boot-source`; `host_quirks` in `machine-config`; `interval_s` in
//! `metrics`; `host_dev_fd`, `queue_size`, `offloads`, `mrg_rxbuf`, the four
//! weights, `pass_time_budget_us` and `io_engine` in each network interface;
//! `queue_size` in each drive. `pmem` may also be `[]`, as Firecracker's
//! `GET /vm/config` writes it (and so does [`super::render`]).
//!
//! Each section is deserialized on its own (serde, `deny_unknown_fields`) so
//! that an error names the section it is in. A key given twice anywhere in
//! the file is refused ([`super::json`]), as Firecracker refuses it.

use std::path::{Path, PathBuf};

use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::drive::{parse_cache_type, DriveSpec};
use super::entropy::EntropySpec;
use super::error::ConfigError;
use super::net::{parse_offloads, MacAddr, NetSpec};
use super::parse::{parse_host_quirks, parse_io_engine, parse_level};
use super::settings::Settings;
use super::vsock::VsockSpec;
use super::{HugePages, SerialConfig};

/// Errors reading a config file; each names what it is about.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("cannot read config file '{0}'")]
    Read(PathBuf, #[source] std::io::Error),
    /// The file is not JSON.
    #[error("config file is not valid JSON")]
    Json(#[source] serde_json::Error),
    /// The top level is not an object.
    #[error("config file: the top level must be a JSON object")]
    NotObject,
    /// A section name minivmm (and Firecracker) does not know.
    #[error("config file: unknown section '{0}'")]
    UnknownSection(String),
    /// A Firecracker section minivmm does not implement.
    #[error("config file: section '{0}' is not supported by minivmm{1}")]
    Unsupported(String, &'static str),
    /// A section that does not have the expected shape (unknown key,
    /// missing field, wrong type).
    #[error("config file: in '{0}'")]
    Section(String, #[source] serde_json::Error),
    /// A value minivmm cannot honour.
    #[error("config file: {0}: {1}")]
    Value(String, String),
    /// A value that does not parse (a MAC, a log level), as the command
    /// line says it.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Sections a Firecracker file may carry that minivmm does not implement;
/// `null` is accepted for each.
const UNSUPPORTED: &[&str] = &["cpu-config", "memory-hotplug", "pmem"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BootSource {
    kernel_image_path: PathBuf,
    initrd_path: Option<PathBuf>,
    boot_args: Option<String>,
    /// minivmm: words appended after everything minivmm adds to the
    /// command line, as `--cmdline` (`GET /vm/config` writes it back).
    cmdline_extra: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineConfig {
    vcpu_count: u64,
    mem_size_mib: u64,
    smt: Option<bool>,
    track_dirty_pages: Option<bool>,
    huge_pages: Option<String>,
    cpu_template: Option<String>,
    /// minivmm: `auto`, `on` or `off`.
    host_quirks: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Bucket {
    size: u64,
    one_time_burst: Option<u64>,
    refill_time: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limiter {
    bandwidth: Option<Bucket>,
    ops: Option<Bucket>,
}

impl Bucket {
    fn config(self) -> TokenBucketConfig {
        TokenBucketConfig {
            size: self.size,
            one_time_burst: self.one_time_burst.unwrap_or(0),
            refill_time: self.refill_time,
        }
    }
}

impl From<Limiter> for RateLimiterConfig {
    fn from(l: Limiter) -> Self {
        RateLimiterConfig {
            bandwidth: l.bandwidth.map(Bucket::config),
            ops: l.ops.map(Bucket::config),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Interface {
    iface_id: String,
    host_dev_name: Option<String>,
    guest_mac: Option<String>,
    mtu: Option<u64>,
    rx_rate_limiter: Option<Limiter>,
    tx_rate_limiter: Option<Limiter>,
    // minivmm's own keys.
    host_dev_fd: Option<i64>,
    queue_size: Option<u64>,
    offloads: Option<Vec<String>>,
    mrg_rxbuf: Option<bool>,
    tx_weight_bytes: Option<u64>,
    tx_weight_packets: Option<u64>,
    rx_weight_bytes: Option<u64>,
    rx_weight_packets: Option<u64>,
    pass_time_budget_us: Option<u64>,
    io_engine: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Drive {
    drive_id: String,
    path_on_host: Option<PathBuf>,
    is_root_device: bool,
    is_read_only: Option<bool>,
    partuuid: Option<String>,
    cache_type: Option<String>,
    io_engine: Option<String>,
    rate_limiter: Option<Limiter>,
    /// vhost-user: refused with its own line.
    socket: Option<String>,
    // minivmm's own key.
    queue_size: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entropy {
    rate_limiter: Option<Limiter>,
}

/// Firecracker's `VsockDeviceConfig`; the CID is read as 64 bits so that
/// one out of range gets the check's own message.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Vsock {
    /// Deprecated in Firecracker, which accepts and ignores it.
    #[allow(dead_code)]
    vsock_id: Option<String>,
    guest_cid: u64,
    uds_path: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metrics {
    metrics_path: PathBuf,
    emit_id: Option<bool>,
    properties: Option<std::collections::BTreeMap<String, String>>,
    /// minivmm: seconds between lines.
    interval_s: Option<u64>,
}

/// `PUT /serial`'s body (Firecracker reads it from the API only; minivmm's
/// file takes the same section).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Serial {
    serial_out_path: Option<PathBuf>,
    rate_limiter: Option<Bucket>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Logger {
    log_path: Option<PathBuf>,
    level: Option<String>,
    /// minivmm always shows the level; accepted for Firecracker files.
    show_level: Option<bool>,
    show_log_origin: Option<bool>,
    module: Option<String>,
}

fn section<T: DeserializeOwned>(name: &str, v: Value) -> Result<T, FileError> {
    serde_json::from_value(v).map_err(|e| FileError::Section(name.to_string(), e))
}

fn unsupported_value(key: &str, why: &str) -> FileError {
    FileError::Value(key.to_string(), why.to_string())
}

/// Reads and parses the config file at `path`.
pub fn load(path: &Path) -> Result<Settings, FileError> {
    let text = std::fs::read_to_string(path).map_err(|e| FileError::Read(path.to_path_buf(), e))?;
    parse(&text)
}

/// Parses a config file's text into what it says (no defaults applied).
pub fn parse(text: &str) -> Result<Settings, FileError> {
    let top = super::json::parse(text.as_bytes()).map_err(FileError::Json)?;
    let Value::Object(top) = top else {
        return Err(FileError::NotObject);
    };
    let mut s = Settings::default();
    for (key, value) in top {
        match key.as_str() {
            "boot-source" => boot_source(&mut s, value)?,
            "machine-config" => machine_config(&mut s, value)?,
            "network-interfaces" => {
                let list: Vec<Value> = section(&key, value)?;
                for (i, v) in list.into_iter().enumerate() {
                    s.nets.push(interface(i, v)?);
                }
            }
            "drives" if value.is_null() => {}
            "drives" => {
                let list: Vec<Value> = section(&key, value)?;
                for (i, v) in list.into_iter().enumerate() {
                    s.drives.push(drive(i, v)?);
                }
            }
            "entropy" if !value.is_null() => {
                let e: Entropy = section(&key, value)?;
                s.entropy = Some(EntropySpec {
                    rate_limiter: e.rate_limiter.map(Into::into),
                });
            }
            "vsock" if !value.is_null() => {
                let v: Vsock = section(&key, value)?;
                s.vsock = Some(VsockSpec {
                    guest_cid: v.guest_cid,
                    uds_path: v.uds_path,
                });
            }
            "metrics" if !value.is_null() => {
                let m: Metrics = section(&key, value)?;
                s.metrics_path = Some(m.metrics_path);
                s.metrics_interval_s = m.interval_s;
                s.metrics_emit_id = m.emit_id;
                s.metrics_properties = m.properties;
            }
            "serial" if !value.is_null() => {
                let c: Serial = section(&key, value)?;
                s.serial = Some(SerialConfig {
                    out_path: c.serial_out_path,
                    rate_limiter: c.rate_limiter.map(Bucket::config),
                });
            }
            "logger" if !value.is_null() => logger(&mut s, section(&key, value)?)?,
            "balloon" if !value.is_null() => s.balloon = Some(section(&key, value)?),
            "mmds-config" if !value.is_null() => s.mmds = Some(section(&key, value)?),
            "metrics" | "logger" | "entropy" | "serial" | "vsock" | "balloon" | "mmds-config" => {}
            // A list in Firecracker's layout: its `GET /vm/config` answers
            // `[]` for no pmem device (and refuses `null` there).
            "pmem" if value.as_array().is_some_and(Vec::is_empty) => {}
            k if UNSUPPORTED.contains(&k) => {
                if !value.is_null() {
                    return Err(FileError::Unsupported(key, ""));
                }
            }
            _ => return Err(FileError::UnknownSection(key)),
        }
    }
    Ok(s)
}

fn boot_source(s: &mut Settings, value: Value) -> Result<(), FileError> {
    let b: BootSource = section("boot-source", value)?;
    s.kernel = Some(b.kernel_image_path);
    s.initramfs = b.initrd_path;
    s.boot_args = b.boot_args;
    s.cmdline_extra = b.cmdline_extra;
    Ok(())
}

fn machine_config(s: &mut Settings, value: Value) -> Result<(), FileError> {
    let m: MachineConfig = section("machine-config", value)?;
    s.track_dirty_pages = m.track_dirty_pages;
    if let Some(h) = m.huge_pages {
        s.huge_pages = Some(HugePages::parse(&h).ok_or_else(|| {
            unsupported_value(
                "machine-config.huge_pages",
                &format!("'{h}' is none of \"None\", \"Transparent\" and \"2M\""),
            )
        })?);
    }
    s.smt = m.smt;
    if let Some(t) = m.cpu_template.filter(|t| t != "None") {
        return Err(unsupported_value(
            "machine-config.cpu_template",
            &format!("'{t}' is not supported (only \"None\")"),
        ));
    }
    s.vcpus = Some(m.vcpu_count);
    s.mem_mib = Some(m.mem_size_mib);
    s.host_quirks = m
        .host_quirks
        .as_deref()
        .map(parse_host_quirks)
        .transpose()?;
    Ok(())
}

fn drive(index: usize, value: Value) -> Result<DriveSpec, FileError> {
    let name = format!("drives[{index}]");
    let d: Drive = section(&name, value)?;
    if d.socket.is_some() {
        return Err(FileError::Value(
            format!("{name}.socket"),
            "vhost-user drives are not supported by minivmm".into(),
        ));
    }
    Ok(DriveSpec {
        id: Some(d.drive_id),
        path: Some(d.path_on_host.ok_or_else(|| {
            FileError::Value(format!("{name}.path_on_host"), "is missing".into())
        })?),
        read_only: d.is_read_only,
        root: Some(d.is_root_device),
        partuuid: d.partuuid,
        cache_type: d
            .cache_type
            .map(|v| parse_cache_type(&v))
            .transpose()
            .map_err(|why| FileError::Value(format!("{name}.cache_type"), why))?,
        io_engine: d
            .io_engine
            .map(|v| parse_io_engine(&v))
            .transpose()
            .map_err(|why| FileError::Value(format!("{name}.io_engine"), why))?,
        queue_size: d.queue_size,
        rate_limiter: d.rate_limiter.map(Into::into),
    })
}

fn interface(index: usize, value: Value) -> Result<NetSpec, FileError> {
    let name = format!("network-interfaces[{index}]");
    let i: Interface = section(&name, value)?;
    let offloads = match i.offloads {
        Some(list) => Some(
            parse_offloads(list.iter().map(String::as_str))
                .map_err(|why| FileError::Value(format!("{name}.offloads"), why))?,
        ),
        None => None,
    };
    Ok(NetSpec {
        id: Some(i.iface_id),
        tap: i.host_dev_name,
        fd: i.host_dev_fd,
        mac: i.guest_mac.map(|m| m.parse::<MacAddr>()).transpose()?,
        queue_size: i.queue_size,
        mtu: i.mtu,
        offloads,
        mrg_rxbuf: i.mrg_rxbuf,
        tx_weight_bytes: i.tx_weight_bytes,
        tx_weight_packets: i.tx_weight_packets,
        rx_weight_bytes: i.rx_weight_bytes,
        rx_weight_packets: i.rx_weight_packets,
        pass_time_budget_us: i.pass_time_budget_us,
        rx_rate_limiter: i.rx_rate_limiter.map(Into::into),
        tx_rate_limiter: i.tx_rate_limiter.map(Into::into),
        io_engine: i
            .io_engine
            .map(|v| parse_io_engine(&v))
            .transpose()
            .map_err(|why| FileError::Value(format!("{name}.io_engine"), why))?,
    })
}

fn logger(s: &mut Settings, l: Logger) -> Result<(), FileError> {
    s.log_show_level = l.show_level;
    s.log_path = l.log_path;
    s.log_level = l.level.as_deref().map(parse_level).transpose()?;
    s.log_show_origin = l.show_log_origin;
    s.log_module = l.module;
    Ok(())
}

/// A Firecracker `RateLimiter` object on its own (`PATCH
/// /network-interfaces/{id}` carries one per direction), `what` naming it
/// in an error.
pub fn rate_limiter(what: &str, v: Value) -> Result<RateLimiterConfig, FileError> {
    let l: Limiter = section(what, v)?;
    Ok(l.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{HostQuirks, TapBackend};
    use devices::virtio::net::{IoEngine, Offloads};
    use log::LevelFilter;
    use serde_json::{Map, Value};

    /// The README's complete example.
    pub const EXAMPLE: &str = r#"{
      "boot-source": {
        "kernel_image_path": "vmlinux",
        "initrd_path": "initramfs.cpio",
        "boot_args": "console=ttyS0 reboot=k panic=-1 pci=off ip=10.0.2.2::10.0.2.1:255.255.255.0::eth0:off"
      },
      "machine-config": { "vcpu_count": 2, "mem_size_mib": 512, "smt": false, "host_quirks": "auto" },
      "drives": [],
      "network-interfaces": [
        {
          "iface_id": "eth0",
          "host_dev_name": "tap0",
          "guest_mac": "06:00:AC:10:00:02",
          "mtu": 1500,
          "rx_rate_limiter": {
            "bandwidth": { "size": 2500000, "one_time_burst": 0, "refill_time": 100 },
            "ops": { "size": 2000, "refill_time": 100 }
          },
          "tx_rate_limiter": { "bandwidth": { "size": 2500000, "refill_time": 100 }, "ops": null }
        },
        {
          "iface_id": "eth1",
          "host_dev_name": "tap1",
          "queue_size": 1024,
          "offloads": ["csum", "tso4", "tso6"],
          "mrg_rxbuf": true,
          "tx_weight_packets": 128,
          "io_engine": "Sync"
        }
      ],
      "metrics": { "metrics_path": "metrics.fifo", "interval_s": 10 },
      "logger": { "log_path": "minivmm.log", "level": "Info", "show_level": true, "show_log_origin": false },
      "vsock": null,
      "balloon": null,
      "mmds-config": null
    }"#;

    #[test]
    fn the_readme_example_parses_into_what_it_says() {
        let s = parse(EXAMPLE).unwrap();
        let cfg = s.finish().unwrap();
        assert_eq!(cfg.kernel, PathBuf::from("vmlinux"));
        assert_eq!(cfg.initramfs, Some(PathBuf::from("initramfs.cpio")));
        assert!(cfg.boot_args.as_deref().unwrap().ends_with("eth0:off"));
        assert_eq!((cfg.vcpus, cfg.mem_mib), (2, 512));
        assert_eq!(cfg.host_quirks, HostQuirks::Auto);
        assert_eq!(cfg.nets.len(), 2);
        let (a, b) = (&cfg.nets[0], &cfg.nets[1]);
        assert_eq!(a.id, "eth0");
        assert_eq!(a.tap, TapBackend::Named("tap0".into()));
        assert_eq!(a.device.mac, MacAddr::default().0);
        assert_eq!(a.device.mtu, Some(1500));
        let bw = a.device.rx_rate_limiter.bandwidth.unwrap();
        assert_eq!(
            (bw.size, bw.one_time_burst, bw.refill_time),
            (2_500_000, 0, 100)
        );
        assert_eq!(a.device.rx_rate_limiter.ops.unwrap().size, 2000);
        assert!(a.device.tx_rate_limiter.ops.is_none());
        assert_eq!(b.id, "eth1");
        assert_eq!(b.device.queue_size, 1024);
        assert_eq!(
            b.device.offloads,
            Offloads {
                ufo: false,
                ..Offloads::ALL
            }
        );
        assert_eq!(b.device.tx_weight_packets, 128);
        assert_eq!(b.device.io_engine, IoEngine::Sync);
        assert_eq!(a.device.io_engine, IoEngine::Async);
        assert!(b.device.rx_rate_limiter.is_unlimited());
        let m = cfg.metrics.unwrap();
        assert_eq!((m.path, m.interval_s), (PathBuf::from("metrics.fifo"), 10));
        assert_eq!(cfg.logger.level, LevelFilter::Info);
        assert_eq!(cfg.logger.path, Some(PathBuf::from("minivmm.log")));
    }

    /// Firecracker's own test file with a network interface, as it is
    /// (its rootfs drive removed: minivmm has no block device).
    #[test]
    fn a_firecracker_file_works_as_written() {
        let text = r#"{
          "boot-source": { "kernel_image_path": "vmlinux.bin", "boot_args": "console=ttyS0 reboot=k panic=1", "initrd_path": null },
          "drives": [],
          "machine-config": { "vcpu_count": 2, "mem_size_mib": 1024, "smt": false, "track_dirty_pages": false },
          "cpu-config": null,
          "balloon": null,
          "network-interfaces": [
            { "iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:c0:a8:00:02",
              "rx_rate_limiter": null, "tx_rate_limiter": null }
          ],
          "vsock": null, "logger": null, "metrics": null, "mmds-config": null, "entropy": null
        }"#;
        let cfg = parse(text).unwrap().finish().unwrap();
        assert_eq!(cfg.nets[0].device.mac, [6, 0, 0xc0, 0xa8, 0, 2]);
        assert_eq!(
            cfg.boot_args.as_deref(),
            Some("console=ttyS0 reboot=k panic=1")
        );
        assert_eq!(cfg.metrics, None);
        assert!(!cfg.track_dirty_pages);
    }

    /// Firecracker's `track_dirty_pages`: a booted VM logs the pages
    /// written, for Diff snapshots; absent, it does not.
    #[test]
    fn track_dirty_pages_is_taken_as_written() {
        let file = |track: &str| {
            format!(
                r#"{{"boot-source": {{"kernel_image_path": "k"}}, "machine-config":
                   {{"vcpu_count": 1, "mem_size_mib": 64{track}}}}}"#
            )
        };
        let track = |text: String| parse(&text).unwrap().finish().unwrap().track_dirty_pages;
        assert!(track(file(r#", "track_dirty_pages": true"#)));
        assert!(!track(file(r#", "track_dirty_pages": false"#)));
        assert!(!track(file("")));
    }

    #[test]
    fn every_bad_file_is_one_line_naming_the_problem() {
        let boot = r#""boot-source": {"kernel_image_path": "k"}"#;
        let net = |extra: &str| {
            format!(
                r#"{{{boot}, "network-interfaces": [{{"iface_id": "a", "host_dev_name": "t0"{extra}}}]}}"#
            )
        };
        let cases: Vec<(String, &str)> = vec![
            ("{".into(), "not valid JSON"),
            ("[]".into(), "top level must be a JSON object"),
            // A key given twice, at the top or inside a section or a list.
            (
                format!(r#"{{{boot}, {boot}}}"#),
                "not valid JSON: duplicate field `boot-source`",
            ),
            (
                net(r#", "rx_rate_limiter": {"ops": {"size": 1, "refill_time": 1, "size": 2}}"#),
                "not valid JSON: duplicate field `size` at line 1",
            ),
            (
                format!(r#"{{{boot}, "bogus": 1}}"#),
                "unknown section 'bogus'",
            ),
            (
                format!(r#"{{{boot}, "vsock": {{"guest_cid": 3, "path": "v.sock"}}}}"#),
                "in 'vsock': unknown field `path`",
            ),
            (
                format!(r#"{{{boot}, "vsock": {{"guest_cid": 3}}}}"#),
                "in 'vsock': missing field `uds_path`",
            ),
            (
                format!(r#"{{{boot}, "vsock": {{"guest_cid": 1, "uds_path": "v.sock"}}}}"#),
                "vsock: guest_cid 1 is reserved",
            ),
            (
                format!(r#"{{{boot}, "mmds-config": {{"network_interfaces": [], "ip": 1}}}}"#),
                "in 'mmds-config': unknown field `ip`",
            ),
            (
                format!(r#"{{{boot}, "balloon": {{"amount_mib": 1}}}}"#),
                "in 'balloon': missing field `deflate_on_oom`",
            ),
            (
                format!(
                    r#"{{{boot}, "drives": [{{"drive_id": "rootfs", "path_on_host": "r.ext4"}}]}}"#
                ),
                "in 'drives[0]': missing field `is_root_device`",
            ),
            (
                format!(
                    r#"{{{boot}, "drives": [{{"drive_id": "r", "is_root_device": false, "socket": "/s"}}]}}"#
                ),
                "drives[0].socket: vhost-user drives are not supported by minivmm",
            ),
            (
                format!(
                    r#"{{{boot}, "drives": [{{"drive_id": "r", "path_on_host": "p", "is_root_device": false, "cache_type": "None"}}]}}"#
                ),
                "drives[0].cache_type: unknown cache type 'None': expected Unsafe or Writeback",
            ),
            (
                format!(
                    r#"{{{boot}, "drives": [{{"drive_id": "r", "path_on_host": "p", "is_root_device": false, "io_engine": "Fast"}}]}}"#
                ),
                "drives[0].io_engine",
            ),
            (
                format!(
                    r#"{{{boot}, "drives": [{{"drive_id": "r", "path_on_host": "p", "is_root_device": false, "rate_limiter": {{"bandwidth": {{"size": 1, "refill_tim": 1}}}}}}]}}"#
                ),
                "in 'drives[0]': unknown field `refill_tim`",
            ),
            (
                r#"{"boot-source": {"kernel_image_path": "k", "kernel_args": ""}}"#.to_string(),
                "in 'boot-source': unknown field `kernel_args`",
            ),
            (
                format!(
                    r#"{{{boot}, "machine-config": {{"vcpu_count": 3, "mem_size_mib": 64, "smt": true}}}}"#
                ),
                "3 vCPUs with smt: the count must be 1 or even",
            ),
            (
                format!(
                    r#"{{{boot}, "machine-config": {{"vcpu_count": 1, "mem_size_mib": 64, "huge_pages": "4M"}}}}"#
                ),
                "machine-config.huge_pages: '4M' is none of",
            ),
            (
                format!(
                    r#"{{{boot}, "machine-config": {{"vcpu_count": 1, "mem_size_mib": 64, "cpu_template": "T2"}}}}"#
                ),
                "machine-config.cpu_template: 'T2' is not supported",
            ),
            (
                format!(r#"{{{boot}, "machine-config": {{"vcpu_count": 1}}}}"#),
                "missing field `mem_size_mib`",
            ),
            (
                net(r#", "colour": "red""#),
                "in 'network-interfaces[0]': unknown field `colour`",
            ),
            (
                net(r#", "guest_mac": "06:00:zz:00:00:01""#),
                "invalid MAC address '06:00:zz:00:00:01'",
            ),
            (
                net(r#", "io_engine": "Uring""#),
                "network-interfaces[0].io_engine: io_engine 'Uring' is neither Async nor Sync",
            ),
            (
                net(r#", "tx_rate_limiter": {"bandwidth": {"size": 1000, "refill_time": 0}}"#),
                "tx_rate_limiter: bandwidth bucket: refill_time must be at least 1 ms",
            ),
            (
                net(r#", "rx_rate_limiter": {"ops": {"size": 10, "refill_time": 10, "burst": 1}}"#),
                "unknown field `burst`",
            ),
            (
                net(r#", "offloads": ["csum", "gro"]"#),
                "network-interfaces[0].offloads: unknown offload 'gro'",
            ),
            (net(r#", "mtu": 65536"#), "MTU 65536"),
            (
                format!(
                    r#"{{{boot}, "network-interfaces": [{{"iface_id": "a", "host_dev_name": "t0"}}, {{"iface_id": "b", "host_dev_name": "t0"}}]}}"#
                ),
                "TAP 't0' is given to two network interfaces",
            ),
            (
                format!(r#"{{{boot}, "logger": {{"level": "Loud"}}}}"#),
                "invalid log level 'Loud'",
            ),
            (
                format!(r#"{{{boot}, "metrics": {{"path": "m"}}}}"#),
                "in 'metrics': unknown field `path`",
            ),
        ];
        for (text, want) in cases {
            let line = match parse(&text) {
                Ok(s) => crate::error_line(&s.finish().unwrap_err()),
                Err(e) => crate::error_line(&e),
            };
            assert!(line.contains(want), "{text}\ngot '{line}'\nwant '{want}'");
            assert!(!line.contains('\n'), "{line}");
        }
        let missing = load(Path::new("/nonexistent/vm.json")).unwrap_err();
        assert!(crate::error_line(&missing).contains("cannot read config file"));
    }

    #[test]
    fn empty_drives_are_accepted_as_firecracker_writes_them() {
        let boot = r#""boot-source": {"kernel_image_path": "k"}"#;
        for drives in ["null", "[]"] {
            let s = parse(&format!(r#"{{{boot}, "drives": {drives}}}"#)).unwrap();
            assert_eq!(s.kernel, Some(PathBuf::from("k")), "{drives}");
        }
    }

    #[test]
    fn firecrackers_network_example_with_a_root_drive_parses() {
        // As Firecracker's repository has it, and with the keys its later
        // versions write (`socket`, `huge_pages`).
        let example = minivmm_tests::fc_schema::firecracker_network_example();
        let mut later = example.clone();
        later["drives"][0]["socket"] = Value::Null;
        later["machine-config"]["huge_pages"] = Value::from("None");
        for text in [example.to_string(), later.to_string()] {
            firecrackers_network_example_parses(&text);
        }
    }

    fn firecrackers_network_example_parses(text: &str) {
        let s = parse(text).unwrap();
        assert_eq!(s.drives.len(), 1);
        let d = &s.drives[0];
        assert_eq!(d.id.as_deref(), Some("rootfs"));
        assert_eq!(d.path, Some(PathBuf::from("bionic.rootfs.ext4")));
        assert_eq!((d.root, d.read_only), (Some(true), Some(false)));
        assert_eq!(
            d.cache_type,
            Some(devices::virtio::block::CacheType::Unsafe)
        );
        assert_eq!(d.io_engine, Some(IoEngine::Sync));
        assert_eq!((d.partuuid.as_ref(), d.rate_limiter), (None, None));
        assert_eq!(s.nets.len(), 1);
    }

    #[test]
    fn unsupported_sections_are_the_ones_firecracker_has() {
        // A null for each is accepted, as Firecracker's own files write them.
        let mut top = Map::new();
        for s in UNSUPPORTED {
            top.insert((*s).to_string(), Value::Null);
        }
        let s = parse(&Value::Object(top).to_string()).unwrap();
        assert_eq!(s, Settings::default());
    }

    #[test]
    fn the_balloon_section_is_firecrackers() {
        assert_eq!(parse(r#"{"balloon": null}"#).unwrap(), Settings::default());
        let s = parse(
            r#"{"balloon": {"amount_mib": 0, "deflate_on_oom": false, "stats_polling_interval_s": 1}}"#,
        )
        .unwrap();
        let b = s.balloon.unwrap().config();
        assert_eq!((b.amount_mib, b.stats_polling_interval_s), (0, 1));
        assert!(!b.free_page_hinting && !b.free_page_reporting && !b.deflate_on_oom);
        let e = parse(r#"{"balloon": {"amount_mib": 0, "deflate_on_oom": false, "x": 1}}"#);
        assert!(e.unwrap_err().to_string().contains("in 'balloon'"));
    }

    #[test]
    fn the_entropy_section_is_firecrackers() {
        assert_eq!(parse(r#"{"entropy": null}"#).unwrap(), Settings::default());
        let s = parse(r#"{"entropy": {}}"#).unwrap();
        assert_eq!(s.entropy, Some(EntropySpec::default()));
        let s = parse(
            r#"{"entropy": {"rate_limiter": {"bandwidth": {"size": 1000, "one_time_burst": 0, "refill_time": 100}}}}"#,
        )
        .unwrap();
        let bw = s
            .entropy
            .and_then(|e| e.rate_limiter)
            .and_then(|l| l.bandwidth);
        assert_eq!(bw.map(|b| (b.size, b.refill_time)), Some((1000, 100)));
        for (refused, want) in [
            (
                r#"{"entropy": {"src": "/dev/urandom"}}"#,
                "in 'entropy': unknown field `src`",
            ),
            (
                r#"{"entropy": {"rate_limiter": {"bandwidth": {"size": 1}}}}"#,
                "missing field `refill_time`",
            ),
            (r#"{"entropy": []}"#, "in 'entropy'"),
        ] {
            let line = crate::error_line(&parse(refused).unwrap_err());
            assert!(line.contains(want), "{refused}: {line}");
        }
    }

    #[test]
    fn the_vsock_section_is_firecrackers_with_or_without_vsock_id() {
        assert_eq!(parse(r#"{"vsock": null}"#).unwrap(), Settings::default());
        let want = Some(VsockSpec {
            guest_cid: 3,
            uds_path: "./v.sock".into(),
        });
        for text in [
            r#"{"vsock": {"guest_cid": 3, "uds_path": "./v.sock"}}"#,
            r#"{"vsock": {"vsock_id": "vsock0", "guest_cid": 3, "uds_path": "./v.sock"}}"#,
        ] {
            assert_eq!(parse(text).unwrap().vsock, want, "{text}");
        }
        let line = crate::error_line(&parse(r#"{"vsock": []}"#).unwrap_err());
        assert!(line.contains("in 'vsock'"), "{line}");
    }

    #[test]
    fn pmem_may_be_the_empty_list_firecracker_answers_with() {
        assert_eq!(parse(r#"{"pmem": []}"#).unwrap(), Settings::default());
        for refused in [
            r#"{"pmem": [{"id": "p", "path_on_host": "p.img"}]}"#,
            r#"{"pmem": {}}"#,
        ] {
            let line = crate::error_line(&parse(refused).unwrap_err());
            assert!(
                line.contains("section 'pmem' is not supported"),
                "{refused}: {line}"
            );
        }
        // Only pmem: the other sections are objects in Firecracker's layout.
        let line = crate::error_line(&parse(r#"{"cpu-config": []}"#).unwrap_err());
        assert!(
            line.contains("section 'cpu-config' is not supported"),
            "{line}"
        );
    }

    #[test]
    fn cmdline_extra_is_the_files_cmdline_words() {
        let text = r#"{"boot-source": {"kernel_image_path": "k", "boot_args": "console=ttyS0", "cmdline_extra": "ip=dhcp quiet"}}"#;
        let s = parse(text).unwrap();
        assert_eq!(s.boot_args.as_deref(), Some("console=ttyS0"));
        assert_eq!(s.cmdline_extra.as_deref(), Some("ip=dhcp quiet"));
        // `--cmdline` words come after the file's, as after its boot_args.
        let cli = Settings {
            cmdline_extra: Some("loglevel=8".into()),
            ..Settings::default()
        };
        let cfg = s.overlay(cli).finish().unwrap();
        assert_eq!(
            cfg.cmdline_extra.as_deref(),
            Some("ip=dhcp quiet loglevel=8")
        );
        let s = parse(r#"{"boot-source": {"kernel_image_path": "k"}}"#).unwrap();
        assert_eq!(s.cmdline_extra, None);
    }
}
