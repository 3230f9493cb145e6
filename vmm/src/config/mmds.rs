// SPDX-License-Identifier: Apache-2.0
//! MMDS's configuration: the config file's `mmds-config` section and
//! `PUT /mmds/config` ([`MmdsSpec`], Firecracker's `MmdsConfig` body), and
//! its check against the network cards ([`finish_mmds`]).
//!
//! Firecracker's rules: `network_interfaces` names at least one card, and
//! every name is a card's id; `ipv4_address` is link-local (169.254.0.0/16)
//! and defaults to 169.254.169.254; `version` is `V1` (the default) or
//! `V2`; `imds_compat` defaults to false. The store itself, its bound
//! (`--mmds-size-limit`) and its first content (`--metadata`) are the
//! process's, not the configuration's: they outlive the pre-boot API.

use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use devices::mmds::{Mmds, MmdsError, MmdsVersion, SharedMmds};
use serde::Deserialize;

use super::NicConfig;

/// The section as written (Firecracker's `MmdsConfig`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmdsSpec {
    /// `V1` or `V2`.
    #[serde(default)]
    pub version: MmdsVersion,
    /// The ids of the cards MMDS answers on.
    pub network_interfaces: Vec<String>,
    /// The address MMDS answers at.
    pub ipv4_address: Option<Ipv4Addr>,
    /// IMDS text whatever `Accept` says.
    #[serde(default)]
    pub imds_compat: bool,
}

/// MMDS as the VM runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MmdsConfig {
    /// `V1` or `V2`.
    pub version: MmdsVersion,
    /// The ids of the cards MMDS answers on, each a card of the VM.
    pub network_interfaces: Vec<String>,
    /// The address MMDS answers at (link-local).
    pub ipv4_address: Ipv4Addr,
    /// IMDS text whatever `Accept` says.
    pub imds_compat: bool,
}

/// Why an MMDS configuration is refused (Firecracker's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MmdsConfigError {
    /// `network_interfaces` is empty.
    #[error("The list of network interface IDs that allow forwarding MMDS requests is empty.")]
    EmptyNetworkIfaceList,
    /// The address is outside 169.254.0.0/16.
    #[error("The MMDS IPv4 address is not link local.")]
    InvalidIpv4Addr,
    /// A name in `network_interfaces` is no card's id.
    #[error(
        "The list of network interface IDs provided contains at least one ID that does not \
         correspond to any existing network interface: '{0}'."
    )]
    InvalidNetworkInterfaceId(String),
}

/// Checks `spec` against the VM's cards and applies the default address.
pub fn finish_mmds(spec: MmdsSpec, nets: &[NicConfig]) -> Result<MmdsConfig, MmdsConfigError> {
    if spec.network_interfaces.is_empty() {
        return Err(MmdsConfigError::EmptyNetworkIfaceList);
    }
    let ipv4_address = spec
        .ipv4_address
        .unwrap_or(Ipv4Addr::from(devices::mmds::DEFAULT_IPV4));
    if !ipv4_address.is_link_local() {
        return Err(MmdsConfigError::InvalidIpv4Addr);
    }
    if let Some(id) = spec
        .network_interfaces
        .iter()
        .find(|id| !nets.iter().any(|n| &n.id == *id))
    {
        return Err(MmdsConfigError::InvalidNetworkInterfaceId(id.clone()));
    }
    Ok(MmdsConfig {
        version: spec.version,
        network_interfaces: spec.network_interfaces,
        ipv4_address,
        imds_compat: spec.imds_compat,
    })
}

impl MmdsConfig {
    /// The address MMDS answers at on `id`'s card, if it serves that card.
    pub fn address_on(&self, id: &str) -> Option<[u8; 4]> {
        self.network_interfaces
            .iter()
            .any(|n| n == id)
            .then(|| self.ipv4_address.octets())
    }
}

/// Bytes of a `--metadata` file read at most beyond the store's bound: room
/// for the indentation a compact store of that size may be written with.
const METADATA_SLACK: u64 = 16 << 20;

/// Why `--metadata` cannot fill the store.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The file cannot be opened or read.
    #[error("--metadata: cannot read '{0}'")]
    Read(PathBuf, #[source] std::io::Error),
    /// The path is not a regular file (a FIFO would hold the start up).
    #[error("--metadata: '{0}' is not a regular file")]
    NotAFile(PathBuf),
    /// The file is not JSON.
    #[error("--metadata: '{0}' is not valid JSON")]
    Json(PathBuf, #[source] serde_json::Error),
    /// The content does not fit the store's bound.
    #[error("--metadata: '{0}'")]
    Store(PathBuf, #[source] MmdsError),
}

/// The process's store, bounded at `limit` bytes (`--mmds-size-limit`),
/// filled from `metadata` (`--metadata`) if given.
pub fn initial_store(metadata: Option<&Path>, limit: usize) -> Result<SharedMmds, MetadataError> {
    let mut store = Mmds::new(limit);
    if let Some(path) = metadata {
        let read = |e| MetadataError::Read(path.to_path_buf(), e);
        let file = crate::kernel::open_regular(path)
            .map_err(read)?
            .ok_or_else(|| MetadataError::NotAFile(path.to_path_buf()))?;
        let mut text = Vec::new();
        file.take(limit as u64 + METADATA_SLACK)
            .read_to_end(&mut text)
            .map_err(read)?;
        let value = super::json::parse(&text).map_err(|e| MetadataError::Json(path.into(), e))?;
        store
            .put(value)
            .map_err(|e| MetadataError::Store(path.into(), e))?;
    }
    Ok(Arc::new(Mutex::new(store)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nic(id: &str) -> NicConfig {
        NicConfig {
            id: id.into(),
            tap: crate::config::TapBackend::Named(format!("tap-{id}")),
            device: Default::default(),
        }
    }

    #[test]
    fn finish_checks_firecrackers_rules() {
        let nets = [nic("eth0"), nic("eth1")];
        let spec = |ifaces: &[&str], ip: Option<[u8; 4]>| MmdsSpec {
            version: MmdsVersion::V2,
            network_interfaces: ifaces.iter().map(|s| s.to_string()).collect(),
            ipv4_address: ip.map(Ipv4Addr::from),
            imds_compat: true,
        };
        let ok = finish_mmds(spec(&["eth1"], None), &nets).expect("valid");
        assert_eq!(ok.ipv4_address, Ipv4Addr::new(169, 254, 169, 254));
        assert_eq!(ok.address_on("eth1"), Some([169, 254, 169, 254]));
        assert_eq!(ok.address_on("eth0"), None);
        assert!(ok.imds_compat);
        let custom = finish_mmds(spec(&["eth0", "eth1"], Some([169, 254, 170, 2])), &nets);
        assert_eq!(
            custom.map(|c| c.address_on("eth0")),
            Ok(Some([169, 254, 170, 2]))
        );
        assert_eq!(
            finish_mmds(spec(&[], None), &nets),
            Err(MmdsConfigError::EmptyNetworkIfaceList)
        );
        assert_eq!(
            finish_mmds(spec(&["eth0"], Some([10, 0, 0, 1])), &nets),
            Err(MmdsConfigError::InvalidIpv4Addr)
        );
        assert_eq!(
            finish_mmds(spec(&["eth0", "eth9"], None), &nets),
            Err(MmdsConfigError::InvalidNetworkInterfaceId("eth9".into()))
        );
    }

    #[test]
    fn metadata_file_fills_the_store_or_fails_with_one_reason() {
        let dir = std::env::temp_dir().join(format!("minivmm-mmds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.json");
        std::fs::write(&good, r#"{ "latest": { "user-data": "x" } }"#).unwrap();
        let store = initial_store(Some(&good), 100).unwrap();
        assert_eq!(
            devices::mmds::lock(&store).data(),
            json!({"latest": {"user-data": "x"}})
        );
        assert_eq!(devices::mmds::lock(&store).limit(), 100);
        let empty = initial_store(None, 7).unwrap();
        assert_eq!(devices::mmds::lock(&empty).data(), json!({}));

        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{").unwrap();
        let cases = [
            (initial_store(Some(&good), 10).unwrap_err(), "doesn't fit"),
            (
                initial_store(Some(&bad), 100).unwrap_err(),
                "not valid JSON",
            ),
            (
                initial_store(Some(&dir), 100).unwrap_err(),
                "not a regular file",
            ),
            (
                initial_store(Some(&dir.join("none")), 100).unwrap_err(),
                "cannot read",
            ),
        ];
        for (e, want) in cases {
            let line = crate::error_line(&e);
            assert!(line.starts_with("--metadata: "), "{line}");
            assert!(line.contains(want), "{line}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
