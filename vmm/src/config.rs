// SPDX-License-Identifier: Apache-2.0
//! Typed configuration of one VM.
//!
//! The CLI (`cli.rs`) turns strings into these values and validates them; the
//! builder consumes a [`VmmConfig`]. Plain data only: no file descriptors, so a
//! config can be compared, cloned and tested without touching the host.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// Smallest guest memory we accept. Below this even the tiny guest kernel
/// cannot unpack itself and its initramfs, so fail before boot with a clear line.
pub const MIN_MEM_MIB: u64 = 32;
/// The default guest memory size in MiB.
pub const DEFAULT_MEM_MIB: u64 = 256;

/// Errors in user-supplied configuration values.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// The MAC address did not parse.
    #[error("invalid MAC address '{0}': expected six hex octets like 06:00:ac:10:00:02")]
    Mac(String),
    /// A multicast MAC cannot be a unicast NIC address.
    #[error("invalid MAC address '{0}': the multicast bit is set")]
    MulticastMac(String),
    /// Memory size is out of range.
    #[error("--mem {0} MiB is too small: at least {MIN_MEM_MIB} MiB is needed")]
    MemTooSmall(u64),
    /// Memory size would not fit the address space we lay out.
    #[error("--mem {0} MiB is too large: at most {max} MiB", max = MAX_MEM_MIB)]
    MemTooLarge(u64),
    /// vCPU count is zero.
    #[error("--vcpus must be at least 1")]
    NoVcpus,
    /// vCPU count exceeds what the MP table and APIC ids support.
    #[error("--vcpus {0} is too many: at most {MAX_VCPUS} are supported")]
    TooManyVcpus(u64),
    /// A queue size that is not a power of two.
    #[error("--queue-size {0} must be a power of two between 2 and 32768")]
    QueueSize(u64),
    /// Bad value for the host quirks switch.
    #[error("invalid --host-quirks '{0}': expected auto, on or off")]
    Quirks(String),
}

/// The largest guest memory size: 64 GiB keeps our identity-mapped boot page
/// tables and the e820 map simple, and is far above what a network test VM needs.
pub const MAX_MEM_MIB: u64 = 64 * 1024;
/// The largest vCPU count: APIC ids are one byte in the MP table and the
/// IOAPIC id follows the last CPU.
pub const MAX_VCPUS: u8 = 254;

/// A guest NIC MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// A stable, locally administered default (06: is the locally
    /// administered, unicast prefix) so that guests get the same address on
    /// every boot and host-side neighbour entries stay valid.
    pub const DEFAULT: MacAddr = MacAddr([0x06, 0x00, 0xac, 0x10, 0x00, 0x02]);
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

/// The guest's network card: the host TAP and the device's own settings
/// (MAC, queue size, weights, offered features).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Host TAP interface name.
    pub tap: String,
    /// What the virtio-net device is built with.
    pub device: devices::virtio::net::NetConfig,
}

/// Everything needed to build and run one VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmmConfig {
    /// Kernel image (bzImage or ELF vmlinux).
    pub kernel: PathBuf,
    /// Optional initramfs.
    pub initramfs: Option<PathBuf>,
    /// Words appended to the default kernel command line.
    pub cmdline_extra: Option<String>,
    /// Guest memory in MiB.
    pub mem_mib: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
    /// The network card, if any.
    pub net: Option<NetConfig>,
    /// Where to write metrics JSON at exit and on SIGUSR1.
    pub metrics: Option<PathBuf>,
    /// PVM host recoveries.
    pub host_quirks: HostQuirks,
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
            assert_eq!(
                s.parse::<MacAddr>(),
                Err(ConfigError::Mac(s.to_string())),
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
        assert_eq!(validate_mem(31), Err(ConfigError::MemTooSmall(31)));
        assert_eq!(validate_mem(32), Ok(32));
        assert_eq!(validate_mem(MAX_MEM_MIB), Ok(MAX_MEM_MIB));
        assert_eq!(
            validate_mem(MAX_MEM_MIB + 1),
            Err(ConfigError::MemTooLarge(MAX_MEM_MIB + 1))
        );
    }

    #[test]
    fn vcpu_bounds() {
        assert_eq!(validate_vcpus(0), Err(ConfigError::NoVcpus));
        assert_eq!(validate_vcpus(1), Ok(1));
        assert_eq!(validate_vcpus(254), Ok(254));
        assert_eq!(validate_vcpus(255), Err(ConfigError::TooManyVcpus(255)));
    }

    #[test]
    fn queue_sizes() {
        for ok in [2, 64, 256, 1024, 32768] {
            assert_eq!(validate_queue_size(ok), Ok(ok as u16));
        }
        for bad in [0, 1, 3, 100, 65536] {
            assert_eq!(validate_queue_size(bad), Err(ConfigError::QueueSize(bad)));
        }
    }

    #[test]
    fn quirks_parse() {
        assert_eq!("auto".parse(), Ok(HostQuirks::Auto));
        assert_eq!("on".parse(), Ok(HostQuirks::On));
        assert_eq!("off".parse(), Ok(HostQuirks::Off));
        assert!("yes".parse::<HostQuirks>().is_err());
    }
}
