// SPDX-License-Identifier: Apache-2.0
//! `PUT /snapshot/load`: its body, and the configuration a snapshot
//! rebuilds its VM from.
//!
//! The body is Firecracker's `LoadSnapshotParams`: `snapshot_path`, the
//! memory as `mem_backend` (`File` only; `Uffd` is refused, not yet
//! supported) or the deprecated `mem_file_path`, `track_dirty_pages` (or the
//! deprecated `enable_diff_snapshots`: KVM's dirty log and the devices'
//! for Diff snapshots), `resume_vm`, `network_overrides`
//! (another TAP for a card, as a clone needs), `vsock_override` (another
//! path for the vsock device's listener),
//! `clock_realtime` (only `false`) and `huge_pages` (`Snapshot` or `None`).
//!
//! The configuration is the snapshot's own (the `GET /vm/config` document
//! it saved, read by the config file's parser), with the overrides
//! applied and with this process's logger, metrics and console (those of
//! the process that saved it are that process's files; see
//! [`OWN_SECTIONS`]). MMDS's configuration
//! (`mmds-config`: version, address, the cards it serves, `imds_compat`)
//! comes back with it and is checked as a config file's is; its store
//! does not (see [`super`]).

use std::path::PathBuf;

use serde::Deserialize;
use serde_json::Value;

use super::format;
use super::SnapshotState;
use crate::config::settings::Settings;

/// Firecracker's `MemBackendType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum BackendType {
    /// Guest memory mapped from a file.
    File,
    /// Guest memory served by a userfaultfd handler.
    Uffd,
}

/// Firecracker's `MemBackendConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemBackend {
    /// File or Uffd.
    pub backend_type: BackendType,
    /// The memory file (or the handler's socket).
    pub backend_path: PathBuf,
}

/// Firecracker's `NetworkOverride`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkOverride {
    /// The card.
    pub iface_id: String,
    /// Its new TAP.
    pub host_dev_name: String,
}

/// Firecracker's `VsockOverride`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockOverride {
    /// The listener's new path.
    pub uds_path: PathBuf,
}

/// The body of `PUT /snapshot/load` as sent.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadBody {
    snapshot_path: PathBuf,
    #[serde(default)]
    mem_file_path: Option<PathBuf>,
    #[serde(default)]
    mem_backend: Option<MemBackend>,
    #[serde(default)]
    enable_diff_snapshots: Option<bool>,
    #[serde(default)]
    track_dirty_pages: Option<bool>,
    #[serde(default)]
    resume_vm: bool,
    #[serde(default)]
    network_overrides: Vec<NetworkOverride>,
    #[serde(default)]
    vsock_override: Option<VsockOverride>,
    #[serde(default)]
    clock_realtime: bool,
    #[serde(default)]
    huge_pages: Option<String>,
}

/// A checked `PUT /snapshot/load`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadParams {
    /// The state file.
    pub snapshot_path: PathBuf,
    /// The memory file.
    pub mem_path: PathBuf,
    /// Track the pages the guest writes, for Diff snapshots.
    pub track_dirty_pages: bool,
    /// Run the guest at once (else it waits, paused, for `PATCH /vm`).
    pub resume_vm: bool,
    /// New TAPs for cards, by id.
    pub network_overrides: Vec<NetworkOverride>,
    /// A new path for the vsock device's listener.
    pub vsock_override: Option<VsockOverride>,
}

impl LoadParams {
    /// Reads and checks the body; `Err` is the fault message.
    pub fn from_body(body: Value) -> Result<Self, String> {
        let b: LoadBody =
            serde_json::from_value(body).map_err(|e| format!("snapshot/load: {e}"))?;
        let mem_path = match (b.mem_backend, b.mem_file_path) {
            (Some(_), Some(_)) => {
                return Err(
                    "snapshot/load: give mem_backend or the deprecated mem_file_path, \
                            not both"
                        .into(),
                )
            }
            (None, None) => {
                return Err("snapshot/load: mem_backend (or mem_file_path) is required".into())
            }
            (Some(m), None) => match m.backend_type {
                BackendType::File => m.backend_path,
                BackendType::Uffd => {
                    return Err(
                        "snapshot/load: the Uffd memory backend is not supported by \
                                minivmm yet; use a File backend"
                            .into(),
                    )
                }
            },
            (None, Some(p)) => p,
        };
        if b.clock_realtime {
            return Err(
                "snapshot/load: clock_realtime is not supported by minivmm; the \
                        guest clock goes on from where the snapshot left it"
                    .into(),
            );
        }
        if let Some(h) = b.huge_pages.filter(|h| h != "Snapshot" && h != "None") {
            return Err(format!(
                "snapshot/load: huge_pages {h:?} is not supported by minivmm (Snapshot or None)"
            ));
        }
        let track_dirty_pages = match (b.track_dirty_pages, b.enable_diff_snapshots) {
            (Some(t), Some(e)) if t != e => {
                return Err("snapshot/load: track_dirty_pages and the deprecated \
                            enable_diff_snapshots disagree"
                    .into())
            }
            (t, e) => t.or(e).unwrap_or(false),
        };
        Ok(LoadParams {
            snapshot_path: b.snapshot_path,
            mem_path,
            track_dirty_pages,
            resume_vm: b.resume_vm,
            network_overrides: b.network_overrides,
            vsock_override: b.vsock_override,
        })
    }
}

/// Reads and checks the state file (see [`format`]).
pub fn read_state(params: &LoadParams) -> Result<SnapshotState, String> {
    let bytes = format::read_file(&params.snapshot_path).map_err(|e| crate::error_line(&e))?;
    format::decode(&bytes).map_err(|e| crate::error_line(&e))
}

/// The sections of the configuration that are the loading process's, not
/// the snapshot's: its log, its metrics and its console (what `PUT
/// /logger`, `/metrics` and `/serial` put before the load, as Firecracker
/// takes them from the process that loads). No other may be put before a
/// load.
pub const OWN_SECTIONS: [&str; 3] = ["logger", "metrics", "serial"];

/// The settings the snapshot's VM is rebuilt from: its saved configuration
/// (`config`, the state's) with the overrides of `params` applied (and its
/// `track_dirty_pages`) and this
/// process's sections ([`OWN_SECTIONS`], from `own`; absent ones at their
/// defaults) in place of its own.
pub fn settings(
    config: &Value,
    params: &LoadParams,
    own: &serde_json::Map<String, Value>,
) -> Result<Settings, String> {
    let overrides = &params.network_overrides;
    let mut doc = config.clone();
    let Some(obj) = doc.as_object_mut() else {
        return Err("the snapshot's configuration is not a JSON object".into());
    };
    if let Some(v) = &params.vsock_override {
        let Some(vsock) = obj.get_mut("vsock").and_then(Value::as_object_mut) else {
            return Err("vsock_override: the snapshot has no vsock device".into());
        };
        let path = v.uds_path.to_string_lossy().into_owned();
        vsock.insert("uds_path".into(), Value::String(path));
    }
    for name in OWN_SECTIONS {
        let section = own.get(name).cloned().unwrap_or(Value::Null);
        obj.insert(name.into(), section);
    }
    // Whether the restored VM tracks dirty pages is the load's to say, as
    // in Firecracker, whatever the saved VM did.
    if let Some(machine) = obj.get_mut("machine-config").and_then(Value::as_object_mut) {
        machine.insert(
            "track_dirty_pages".into(),
            Value::Bool(params.track_dirty_pages),
        );
    }
    let cards = obj
        .get_mut("network-interfaces")
        .and_then(Value::as_array_mut);
    let mut cards = cards.map(std::mem::take).unwrap_or_default();
    for o in overrides {
        let card = cards
            .iter_mut()
            .find(|c| c.get("iface_id").and_then(Value::as_str) == Some(o.iface_id.as_str()))
            .ok_or_else(|| {
                format!(
                    "network_overrides: the snapshot has no network interface '{}'",
                    o.iface_id
                )
            })?;
        if let Some(card) = card.as_object_mut() {
            card.insert(
                "host_dev_name".into(),
                Value::String(o.host_dev_name.clone()),
            );
            card.remove("host_dev_fd");
        }
    }
    obj.insert("network-interfaces".into(), Value::Array(cards));
    crate::config::file::parse(&doc.to_string())
        .map_err(|e| format!("the snapshot's configuration: {}", crate::error_line(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn load(v: Value) -> Result<LoadParams, String> {
        LoadParams::from_body(v)
    }

    #[test]
    fn the_memory_comes_from_a_file_backend_or_the_deprecated_path() {
        let p = load(json!({"snapshot_path": "s", "mem_backend":
            {"backend_type": "File", "backend_path": "m"}, "resume_vm": true}))
        .unwrap();
        assert_eq!(p.mem_path, PathBuf::from("m"));
        assert!(p.resume_vm && !p.track_dirty_pages);
        let p = load(json!({"snapshot_path": "s", "mem_file_path": "m2",
            "enable_diff_snapshots": true}))
        .unwrap();
        assert_eq!(p.mem_path, PathBuf::from("m2"));
        assert!(p.track_dirty_pages && !p.resume_vm);
    }

    /// A saved configuration with one card and MMDS on it.
    fn with_mmds(mmds: Value) -> Value {
        json!({"boot-source": {"kernel_image_path": "/k"},
               "network-interfaces": [{"iface_id": "eth0", "host_dev_name": "tap0"}],
               "mmds-config": mmds})
    }

    fn params(overrides: Value) -> LoadParams {
        load(json!({"snapshot_path": "s", "mem_file_path": "m",
                    "network_overrides": overrides}))
        .unwrap()
    }

    #[test]
    fn the_mmds_configuration_comes_back_with_the_snapshot() {
        use crate::config::mmds::MmdsConfig;
        let saved = with_mmds(json!({"version": "V2", "network_interfaces": ["eth0"],
            "ipv4_address": "169.254.1.2", "imds_compat": true}));
        let first = settings(&saved, &params(json!([])), &Default::default())
            .unwrap()
            .finish()
            .unwrap();
        let want = MmdsConfig {
            version: devices::mmds::MmdsVersion::V2,
            network_interfaces: vec!["eth0".into()],
            ipv4_address: std::net::Ipv4Addr::new(169, 254, 1, 2),
            imds_compat: true,
        };
        assert_eq!(first.mmds.as_ref(), Some(&want));
        // Saved again as a snapshot saves it, with the card on another TAP
        // (a clone): MMDS still serves that card.
        let again = crate::config::render::to_file_json(&first);
        let clone = settings(
            &again,
            &params(json!([{"iface_id": "eth0", "host_dev_name": "tap1"}])),
            &Default::default(),
        )
        .unwrap()
        .finish()
        .unwrap();
        assert_eq!(clone.mmds, Some(want));
        assert_eq!(
            clone.nets[0].tap,
            crate::config::TapBackend::Named("tap1".into())
        );
    }

    #[test]
    fn the_log_metrics_and_console_are_the_loading_process_s() {
        let mut saved = with_mmds(json!({"network_interfaces": ["eth0"]}));
        saved["logger"] = json!({"level": "Debug", "log_path": "/old.log"});
        let mut own = serde_json::Map::new();
        own.insert(
            "serial".into(),
            json!({"rate_limiter": {"size": 100, "refill_time": 1000}}),
        );
        let cfg = settings(&saved, &params(json!([])), &own)
            .unwrap()
            .finish()
            .unwrap();
        let bucket = cfg.serial.rate_limiter.expect("the process's console");
        assert_eq!((bucket.size, bucket.refill_time), (100, 1000));
        assert_eq!(cfg.logger, crate::config::LoggerConfig::default());
        let cfg = settings(&saved, &params(json!([])), &Default::default())
            .unwrap()
            .finish()
            .unwrap();
        assert_eq!(cfg.serial.rate_limiter, None);
    }

    /// A VM started with `track_dirty_pages` saved: the load says whether
    /// the restored one tracks (`GET /vm/config` shows the load's choice).
    #[test]
    fn the_load_says_whether_the_restored_vm_tracks_dirty_pages() {
        let mut saved = with_mmds(Value::Null);
        for (was, asked) in [(true, false), (false, true), (true, true)] {
            saved["machine-config"] = json!({"vcpu_count": 1, "mem_size_mib": 64,
                                             "track_dirty_pages": was});
            let mut p = params(json!([]));
            p.track_dirty_pages = asked;
            let cfg = settings(&saved, &p, &Default::default())
                .unwrap()
                .finish()
                .unwrap();
            assert_eq!(cfg.track_dirty_pages, asked, "saved {was}, loaded {asked}");
        }
    }

    #[test]
    fn a_forged_mmds_configuration_is_refused_with_one_line() {
        for (mmds, want) in [
            (
                json!({"network_interfaces": ["eth0"], "ipv4_address": "10.0.0.1"}),
                "not link local",
            ),
            (
                json!({"network_interfaces": ["eth9"]}),
                "does not correspond to any existing network interface: 'eth9'",
            ),
            (json!({"network_interfaces": []}), "is empty"),
            (
                json!({"network_interfaces": ["eth0"], "version": "V9"}),
                "V9",
            ),
        ] {
            let err = settings(
                &with_mmds(mmds.clone()),
                &params(json!([])),
                &Default::default(),
            )
            .and_then(|s| s.finish().map_err(|e| crate::error_line(&e)))
            .unwrap_err();
            assert!(err.contains(want), "{mmds}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn what_minivmm_cannot_do_is_refused_by_name() {
        let cases = [
            (
                json!({"snapshot_path": "s", "mem_backend":
                    {"backend_type": "Uffd", "backend_path": "sock"}}),
                "Uffd memory backend is not supported",
            ),
            (
                json!({"snapshot_path": "s"}),
                "mem_backend (or mem_file_path) is required",
            ),
            (
                json!({"snapshot_path": "s", "mem_file_path": "m", "mem_backend":
                    {"backend_type": "File", "backend_path": "m"}}),
                "not both",
            ),
            (
                json!({"snapshot_path": "s", "mem_file_path": "m", "clock_realtime": true}),
                "clock_realtime",
            ),
            (
                json!({"snapshot_path": "s", "mem_file_path": "m", "huge_pages": "2M"}),
                "huge_pages",
            ),
            (
                json!({"snapshot_path": "s", "mem_file_path": "m",
                    "track_dirty_pages": true, "enable_diff_snapshots": false}),
                "disagree",
            ),
            (
                json!({"snapshot_path": "s", "mem_file_path": "m", "bogus": 1}),
                "unknown field",
            ),
        ];
        for (body, want) in cases {
            let err = load(body.clone()).unwrap_err();
            assert!(err.contains(want), "{body}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
