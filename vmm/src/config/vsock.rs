// SPDX-License-Identifier: Apache-2.0
//! The vsock device (virtio-vsock with Firecracker's host side): what
//! `--vsock`, the config file's `vsock` section and `PUT /vsock` say
//! ([`VsockSpec`]), and its check ([`finish_vsock`]).
//!
//! Firecracker's section is `{"guest_cid": N, "uds_path": PATH}`, with the
//! deprecated `vsock_id` still accepted and ignored (its `GET /vm/config`
//! leaves it out). Cloud Hypervisor's flag is `--vsock cid=N,socket=PATH`.
//! A VM has one vsock device at most, as in Firecracker; its id, its key in
//! the metrics line, is Firecracker's: [`VSOCK_ID`].
//!
//! Checked here, as plain data: the CID (0 and 1 are reserved, 2 is the
//! host, `u32::MAX` is `VMADDR_CID_ANY`) and the length of `uds_path`,
//! which must fit a Unix socket address with the `_<port>` of the guest's
//! connections after it. That nothing exists at `uds_path` is found when
//! the socket is bound (`crate::host_socket`).

use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use devices::virtio::vsock::{VsockConfig, MIN_GUEST_CID};

use super::error::ConfigError;
use super::parse::{key_values, parse_number, parse_option};

/// The vsock device's id: its metrics key (Firecracker's), its name in log
/// lines.
pub const VSOCK_ID: &str = "vsock";

/// Bytes of a Unix socket path, its terminating NUL excluded
/// (`sizeof(sun_path) - 1`).
pub const MAX_SOCKET_PATH: usize = 107;

/// What a guest connection adds to `uds_path` at most: `_4294967295`.
const PORT_SUFFIX: usize = 11;

/// The vsock device as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VsockSpec {
    /// The guest's CID.
    pub guest_cid: u64,
    /// Where minivmm listens; guest connections go to `<uds_path>_<port>`.
    pub uds_path: PathBuf,
}

/// Parses one `--vsock` value (Cloud Hypervisor's `cid=N,socket=PATH`).
pub fn parse_vsock(spec: &str) -> Result<VsockSpec, ConfigError> {
    parse_option("--vsock", spec, parse_vsock_keys)
}

fn parse_vsock_keys(spec: &str) -> Result<VsockSpec, String> {
    let (mut cid, mut socket) = (None, None);
    let items = spec.split(',').filter(|item| !item.is_empty());
    for (key, value) in key_values(items)? {
        match key {
            "cid" => cid = Some(parse_number(value).map_err(|e| e.to_string())?),
            "socket" => socket = Some(PathBuf::from(value)),
            "iommu" => return Err("iommu is not supported by minivmm (no IOMMU)".into()),
            "id" => {
                return Err(format!(
                    "id: the vsock device's id is Firecracker's, '{VSOCK_ID}' (its metrics key)"
                ))
            }
            _ => return Err(format!("unknown key '{key}' (cid and socket are)")),
        }
    }
    Ok(VsockSpec {
        guest_cid: cid.ok_or("cid is missing")?,
        uds_path: socket.ok_or("socket is missing")?,
    })
}

/// Checks the CID and the socket path.
pub fn finish_vsock(spec: VsockSpec) -> Result<VsockConfig, ConfigError> {
    let fail = |why: String| Err(ConfigError::Vsock(why));
    let cid = spec.guest_cid;
    if cid < MIN_GUEST_CID {
        return fail(format!(
            "guest_cid {cid} is reserved: a guest's CID is at least {MIN_GUEST_CID} \
             (0 and 1 are reserved, 2 is the host)"
        ));
    }
    if cid >= u64::from(u32::MAX) {
        return fail(format!(
            "guest_cid {cid} is out of range: at most {}",
            u32::MAX - 1
        ));
    }
    let len = spec.uds_path.as_os_str().len();
    if len == 0 {
        return fail("uds_path is empty".into());
    }
    if spec.uds_path.as_os_str().as_bytes().contains(&0) {
        return fail("uds_path contains a NUL byte".into());
    }
    if len + PORT_SUFFIX > MAX_SOCKET_PATH {
        return fail(format!(
            "uds_path '{}' is {len} bytes: at most {} (a Unix socket path has at most \
             {MAX_SOCKET_PATH}, and the guest's connections add _<port>)",
            spec.uds_path.display(),
            MAX_SOCKET_PATH - PORT_SUFFIX
        ));
    }
    Ok(VsockConfig {
        id: VSOCK_ID.to_string(),
        guest_cid: cid,
        uds_path: spec.uds_path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vsock_keys_parse_cloud_hypervisors_form() {
        let s = parse_vsock("cid=3,socket=/run/v.sock").unwrap();
        assert_eq!(
            s,
            VsockSpec {
                guest_cid: 3,
                uds_path: "/run/v.sock".into()
            }
        );
        assert_eq!(parse_vsock("socket=v.sock,cid=0x10").unwrap().guest_cid, 16);
        let cfg = finish_vsock(s).unwrap();
        assert_eq!(cfg.id, "vsock");
        assert_eq!(cfg.guest_cid, 3);
        assert_eq!(cfg.uds_path, PathBuf::from("/run/v.sock"));
    }

    #[test]
    fn a_bad_vsock_value_is_one_line_naming_it() {
        for (spec, want) in [
            ("cid=3", "--vsock 'cid=3': socket is missing"),
            ("socket=/v", "--vsock 'socket=/v': cid is missing"),
            ("cid=x,socket=/v", "invalid number 'x'"),
            ("cid=3,socket=/v,iommu=on", "iommu is not supported"),
            ("cid=3,socket=/v,id=v0", "'vsock' (its metrics key)"),
            ("cid=3,socket=/v,colour=red", "unknown key 'colour'"),
            ("cid=3,cid=4,socket=/v", "cid is given twice"),
            ("cid", "'cid' is not key=value"),
        ] {
            let e = parse_vsock(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec}: '{e}' lacks '{want}'");
            assert!(!e.contains('\n'));
        }
    }

    #[test]
    fn a_reserved_cid_or_a_path_that_cannot_be_a_socket_is_refused() {
        let spec = |cid, path: &str| VsockSpec {
            guest_cid: cid,
            uds_path: path.into(),
        };
        for cid in [0, 1, 2] {
            let e = finish_vsock(spec(cid, "/v")).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("vsock: guest_cid {cid} is reserved")),
                "{e}"
            );
        }
        let e = finish_vsock(spec(u64::from(u32::MAX), "/v"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("at most 4294967294"), "{e}");
        assert!(finish_vsock(spec(u64::from(u32::MAX) - 1, "/v")).is_ok());
        assert!(finish_vsock(spec(3, "")).is_err());
        assert!(finish_vsock(spec(3, "a\0b")).is_err());
        // 96 bytes and `_4294967295` fill a sun_path exactly; one more is refused.
        let longest = format!("/{}", "x".repeat(95));
        assert!(finish_vsock(spec(3, &longest)).is_ok());
        let e = finish_vsock(spec(3, &format!("{longest}y")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is 97 bytes: at most 96"), "{e}");
    }
}
