// SPDX-License-Identifier: Apache-2.0
//! Block devices: what `--disk` and the config file's `drives` say
//! ([`DriveSpec`]), the checks every drive passes ([`finish_drives`]), and
//! the kernel command-line words of a root drive ([`root_words`]).
//!
//! `--disk path=FILE[,id=ID][,readonly=on][,root=on][,partuuid=UUID]
//! [,io_engine=sync|async][,cache=unsafe|writeback][,queue_size=N]
//! [,bw_size=..,bw_one_time_burst=..,bw_refill_time=..][,ops_...]` is Cloud
//! Hypervisor's habit; `drives` is Firecracker's layout (`drive_id`,
//! `path_on_host`, `is_root_device`, `is_read_only`, `partuuid`,
//! `cache_type`, `io_engine`, `rate_limiter`). Drives from the file come
//! first, then those of the command line, in the order given: that is the
//! order of their MMIO windows and IRQs (after the network cards) and so of
//! the guest's `/dev/vda`, `/dev/vdb`, ...
//!
//! Checked here, as plain data, each a one-line error naming the drive: an
//! id that breaks the device-id rule ([`super::ids`], which also keeps two
//! devices from sharing one), more than one root drive, a queue size
//! outside the bounds, a vhost-user `socket`. The images themselves are
//! the builder's to check (`crate::images`: a missing, unreadable or
//! non-regular file, two drives on one file), before anything is opened
//! for the VM; a locked image (another VM has it) is found when the device
//! opens it, also before boot.

use std::path::PathBuf;

use devices::rate_limiter::RateLimiterConfig;
use devices::virtio::block::{BlockConfig, CacheType, IoEngine, DEFAULT_QUEUE_SIZE, ID_BYTES};
use devices::virtio::queue::MAX_QUEUE_SIZE;

use super::error::ConfigError;
use super::ids::check_device_id;
use super::parse::{
    key_values, limiter_from_keys, limiter_key, on_off, parse_io_engine, parse_number, parse_option,
};
use super::DriveConfig;

/// One drive as the user wrote it (no defaults applied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriveSpec {
    /// `id=` / `drive_id`.
    pub id: Option<String>,
    /// `path=` / `path_on_host`.
    pub path: Option<PathBuf>,
    /// `readonly=` / `is_read_only`.
    pub read_only: Option<bool>,
    /// `root=` / `is_root_device`.
    pub root: Option<bool>,
    /// `partuuid=` / `partuuid`.
    pub partuuid: Option<String>,
    /// `cache=` / `cache_type`.
    pub cache_type: Option<CacheType>,
    /// `io_engine=` / `io_engine`.
    pub io_engine: Option<IoEngine>,
    /// `queue_size=` (minivmm's own).
    pub queue_size: Option<u64>,
    /// The limiter keys / `rate_limiter`.
    pub rate_limiter: Option<RateLimiterConfig>,
}

/// Parses a `cache_type` (`Unsafe` or `Writeback`, any case).
pub fn parse_cache_type(v: &str) -> Result<CacheType, String> {
    match v.to_ascii_lowercase().as_str() {
        "unsafe" => Ok(CacheType::Unsafe),
        "writeback" => Ok(CacheType::Writeback),
        _ => Err(format!(
            "unknown cache type '{v}': expected Unsafe or Writeback"
        )),
    }
}

/// Parses one `--disk` value.
pub fn parse_disk(spec: &str) -> Result<DriveSpec, ConfigError> {
    parse_option("--disk", spec, parse_disk_keys)
}

fn parse_disk_keys(spec: &str) -> Result<DriveSpec, String> {
    let mut d = DriveSpec::default();
    // [bw, ops] x (size, one_time_burst, refill_time)
    let mut buckets = [[None::<u64>; 3]; 2];
    let num = |v: &str| parse_number(v).map_err(|e| e.to_string());
    for (key, value) in key_values(spec.split(','))? {
        match key {
            "path" => d.path = Some(value.into()),
            "id" => d.id = Some(value.to_string()),
            "readonly" => d.read_only = Some(on_off(key, value)?),
            "root" => d.root = Some(on_off(key, value)?),
            "partuuid" => d.partuuid = Some(value.to_string()),
            "cache" => d.cache_type = Some(parse_cache_type(value)?),
            "io_engine" => d.io_engine = Some(parse_io_engine(value)?),
            "queue_size" => d.queue_size = Some(num(value)?),
            "socket" | "vhost_user" => {
                return Err("vhost-user drives are not supported by minivmm".into())
            }
            _ => {
                let (kind, field) =
                    limiter_key(key).ok_or_else(|| format!("unknown key '{key}' (see --help)"))?;
                buckets[kind][field] = Some(num(value)?);
            }
        }
    }
    if buckets.iter().flatten().any(Option::is_some) {
        d.rate_limiter = Some(limiter_from_keys(&buckets, "")?);
    }
    if d.path.is_none() {
        return Err("path=FILE is missing".into());
    }
    Ok(d)
}

/// Applies the defaults and checks every drive (see the module doc); the
/// ids are checked against the other devices' by [`super::ids`], and the
/// images by the builder, which opens them.
pub fn finish_drives(specs: Vec<DriveSpec>) -> Result<Vec<DriveConfig>, ConfigError> {
    let mut out: Vec<DriveConfig> = Vec::with_capacity(specs.len());
    for (index, spec) in specs.into_iter().enumerate() {
        let drive = finish_drive(index, spec)?;
        if drive.is_root_device {
            if let Some(other) = out.iter().find(|d| d.is_root_device) {
                return Err(ConfigError::Drive {
                    id: drive.device.id,
                    reason: format!(
                        "drive '{}' is the root device already; at most one may be",
                        other.device.id
                    ),
                });
            }
        }
        out.push(drive);
    }
    Ok(out)
}

/// Applies the defaults to the drive at `index` and checks each of its
/// values: id, path, queue size, limiter, partuuid.
fn finish_drive(index: usize, spec: DriveSpec) -> Result<DriveConfig, ConfigError> {
    let id = spec.id.unwrap_or_else(|| format!("disk{index}"));
    check_device_id("drive", &id, ID_BYTES)?;
    let err = |reason: String| ConfigError::Drive {
        id: id.clone(),
        reason,
    };
    let path = spec
        .path
        .ok_or_else(|| err("no path_on_host (path=FILE)".into()))?;
    let qs = spec.queue_size.unwrap_or(u64::from(DEFAULT_QUEUE_SIZE));
    if qs == 0 || qs > u64::from(MAX_QUEUE_SIZE) || !qs.is_power_of_two() {
        return Err(err(format!(
            "queue size {qs} is not a power of two between 1 and {MAX_QUEUE_SIZE}"
        )));
    }
    let rate_limiter = spec.rate_limiter.unwrap_or_default();
    rate_limiter
        .validate()
        .map_err(|e| err(format!("rate_limiter: {e}")))?;
    if spec
        .partuuid
        .as_deref()
        .is_some_and(|u| u.is_empty() || !u.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
    {
        return Err(err("partuuid must be hex digits and '-'".into()));
    }
    Ok(DriveConfig {
        is_root_device: spec.root.unwrap_or(false),
        partuuid: spec.partuuid,
        device: BlockConfig {
            id,
            path,
            read_only: spec.read_only.unwrap_or(false),
            cache_type: spec.cache_type.unwrap_or_default(),
            io_engine: spec.io_engine.unwrap_or_default(),
            rate_limiter,
            queue_size: qs as u16,
        },
    })
}

/// The guest device name of the `index`-th virtio disk: vda, ..., vdz,
/// vdaa, ... (Linux's `virtblk_name_format`).
pub fn vd_name(index: usize) -> String {
    let mut n = index;
    let mut letters = Vec::new();
    loop {
        letters.push(b'a' + (n % 26) as u8);
        if n < 26 {
            break;
        }
        n = n / 26 - 1;
    }
    letters.reverse();
    format!("vd{}", String::from_utf8_lossy(&letters))
}

/// What a root drive adds to the kernel command line, as Firecracker adds
/// it: `root=/dev/vdX` (or `root=PARTUUID=...`) and `ro` or `rw`.
pub fn root_words(drives: &[DriveConfig]) -> Vec<String> {
    drives
        .iter()
        .enumerate()
        .find(|(_, d)| d.is_root_device)
        .map(|(i, d)| {
            let root = match &d.partuuid {
                Some(u) => format!("root=PARTUUID={u}"),
                None => format!("root=/dev/{}", vd_name(i)),
            };
            vec![
                root,
                if d.device.read_only { "ro" } else { "rw" }.to_string(),
            ]
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(dir: &std::path::Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        p
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("minivmm-drive-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn disk_keys_parse_and_defaults_apply() {
        let d = tempdir("keys");
        let p = image(&d, "a.img");
        let spec = parse_disk(&format!(
            "path={},id=rootfs,readonly=on,root=on,io_engine=sync,cache=writeback,queue_size=64,bw_size=1000,bw_refill_time=100,ops_size=10,ops_one_time_burst=5,ops_refill_time=1000",
            p.display()
        ))
        .unwrap();
        let cfg = finish_drives(vec![spec]).unwrap();
        let c = &cfg[0];
        assert!(c.is_root_device);
        assert_eq!(c.device.id, "rootfs");
        assert!(c.device.read_only);
        assert_eq!(c.device.io_engine, IoEngine::Sync);
        assert_eq!(c.device.cache_type, CacheType::Writeback);
        assert_eq!(c.device.queue_size, 64);
        let rl = c.device.rate_limiter;
        assert_eq!(
            rl.bandwidth
                .map(|b| (b.size, b.one_time_burst, b.refill_time)),
            Some((1000, 0, 100))
        );
        assert_eq!(
            rl.ops.map(|b| (b.size, b.one_time_burst, b.refill_time)),
            Some((10, 5, 1000))
        );
        let plain =
            finish_drives(vec![parse_disk(&format!("path={}", p.display())).unwrap()]).unwrap();
        let c = &plain[0].device;
        assert_eq!(
            (
                c.id.as_str(),
                c.read_only,
                c.cache_type,
                c.io_engine,
                c.queue_size
            ),
            (
                "disk0",
                false,
                CacheType::Unsafe,
                IoEngine::Async,
                DEFAULT_QUEUE_SIZE
            )
        );
        assert!(!plain[0].is_root_device);
        assert!(c.rate_limiter.is_unlimited());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn disk_spec_errors_are_one_line() {
        for (spec, want) in [
            ("id=x", "--disk 'id=x': path=FILE is missing"),
            ("path=a,path=b", "--disk 'path=a,path=b': path is given twice"),
            ("path=a,cache=none", "--disk 'path=a,cache=none': unknown cache type 'none': expected Unsafe or Writeback"),
            ("path=a,readonly=yes", "--disk 'path=a,readonly=yes': readonly: 'yes' is not on or off"),
            ("path=a,socket=/s", "--disk 'path=a,socket=/s': vhost-user drives are not supported by minivmm"),
            ("path=a,colour=red", "--disk 'path=a,colour=red': unknown key 'colour' (see --help)"),
            ("path=a,bw_size=1", "--disk 'path=a,bw_size=1': bw_refill_time is missing"),
            ("path=a,ops_refill_time=1", "--disk 'path=a,ops_refill_time=1': ops_size is missing"),
            ("path", "--disk 'path': 'path' is not key=value"),
        ] {
            assert_eq!(parse_disk(spec).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn bad_drives_are_refused_naming_the_drive() {
        // Plain data: no image needs to exist for these checks.
        let spec = |s: &str| parse_disk(s).unwrap();
        let cases: Vec<(Vec<DriveSpec>, &str)> = vec![
            (
                vec![spec("path=a,root=on"), spec("path=b,root=on")],
                "drive 'disk1': drive 'disk0' is the root device already; at most one may be",
            ),
            (
                vec![spec("path=a,queue_size=3")],
                "drive 'disk0': queue size 3 is not a power of two between 1 and 32768",
            ),
            (
                vec![spec("path=a,partuuid=zz")],
                "drive 'disk0': partuuid must be hex digits and '-'",
            ),
            (
                vec![spec("path=a,id=abcdefghij0123456789x")],
                "invalid drive id 'abcdefghij0123456789x': 1 to 20 letters, digits, '_', '-' or '.'",
            ),
            (
                vec![spec("path=a,id=a/b")],
                "invalid drive id 'a/b': 1 to 20 letters, digits, '_', '-' or '.'",
            ),
            (
                vec![spec("path=a,bw_size=5,bw_refill_time=0")],
                "drive 'disk0': rate_limiter: ",
            ),
        ];
        for (specs, want) in cases {
            let e = finish_drives(specs).unwrap_err().to_string();
            assert!(e.starts_with(want), "'{e}' is not '{want}'");
        }
        // The metrics line's own keys: a drive under one of them would
        // repeat a key of its line.
        for key in crate::config::ids::RESERVED_KEYS {
            let e = finish_drives(vec![spec(&format!("path=a,id={key}"))]).unwrap_err();
            assert!(
                e.to_string().starts_with(&format!(
                    "invalid drive id '{key}': a key of the metrics line"
                )),
                "{e}"
            );
        }
        // A spec with no path (a config file's entry without path_on_host).
        let e = finish_drives(vec![DriveSpec::default()]).unwrap_err();
        assert_eq!(e.to_string(), "drive 'disk0': no path_on_host (path=FILE)");
    }
    #[test]
    fn root_words_follow_firecracker() {
        let d = tempdir("root");
        let a = image(&d, "a.img");
        let b = image(&d, "b.img");
        let (a, b) = (a.display(), b.display());
        // The drives `--disk` makes of `specs`, checked.
        let drives = |specs: &[String]| {
            let specs = specs.iter().map(|s| parse_disk(s).unwrap()).collect();
            finish_drives(specs).unwrap()
        };
        let two = drives(&[format!("path={a}"), format!("path={b},root=on,readonly=on")]);
        assert_eq!(root_words(&two), ["root=/dev/vdb", "ro"]);
        let by_partuuid = drives(&[format!("path={a},root=on,partuuid=0eaa91a0-01")]);
        assert_eq!(
            root_words(&by_partuuid),
            ["root=PARTUUID=0eaa91a0-01", "rw"]
        );
        assert!(root_words(&drives(&[format!("path={a}")])).is_empty());
        // An id of exactly the 20 bytes GET_ID returns is fine.
        let longest_id = drives(&[format!("path={a},id=abcdefghij0123456789")]);
        assert_eq!(longest_id[0].device.id, "abcdefghij0123456789");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn virtio_disk_names_are_linuxs() {
        for (i, n) in [
            (0, "vda"),
            (1, "vdb"),
            (25, "vdz"),
            (26, "vdaa"),
            (27, "vdab"),
            (51, "vdaz"),
            (52, "vdba"),
            (701, "vdzz"),
            (702, "vdaaa"),
        ] {
            assert_eq!(vd_name(i), n, "{i}");
        }
    }
}
