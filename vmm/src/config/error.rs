// SPDX-License-Identifier: Apache-2.0
//! Errors in the values a VM is configured with, whichever input gave them
//! (the command line or the config file). Each is one line that names the
//! setting; the bounds they quote are the ones [`super`] documents.

use devices::rate_limiter::RateLimiterError;

use super::{MAX_MEM_MIB, MAX_NICS, MAX_VCPUS, MIN_MEM_MIB};

/// Errors in user-supplied configuration values. Each is one line that
/// names the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The MAC address did not parse.
    #[error("invalid MAC address '{0}': expected six hex octets like 06:00:ac:10:00:02")]
    Mac(String),
    /// A multicast MAC cannot be a unicast NIC address.
    #[error("invalid MAC address '{0}': the multicast bit is set")]
    MulticastMac(String),
    /// Memory size is out of range.
    #[error("memory size {0} MiB is too small: at least {MIN_MEM_MIB} MiB is needed")]
    MemTooSmall(u64),
    /// Memory size would not fit the address space we lay out.
    #[error("memory size {0} MiB is too large: at most {max} MiB", max = MAX_MEM_MIB)]
    MemTooLarge(u64),
    /// 2 MiB pages cannot back an odd number of MiB.
    #[error("memory size {0} MiB is not a multiple of 2 MiB, which huge_pages \"2M\" needs")]
    MemNotHugePages(u64),
    /// With SMT the vCPUs must fill whole cores.
    #[error("{0} vCPUs with smt: the count must be 1 or even (two threads per core)")]
    SmtOddVcpus(u64),
    /// The console's rate limiter is invalid.
    #[error("serial rate_limiter: {0}")]
    Serial(String),
    /// vCPU count is zero.
    #[error("the vCPU count must be at least 1")]
    NoVcpus,
    /// vCPU count exceeds what the MP table and APIC ids support.
    #[error("{0} vCPUs is too many: at most {MAX_VCPUS} are supported")]
    TooManyVcpus(u64),
    /// Bad value for the host quirks switch.
    #[error("invalid host quirks setting '{0}': expected auto, on or off")]
    Quirks(String),
    /// A number that does not parse.
    #[error("invalid number '{0}': expected decimal or 0x-prefixed hexadecimal")]
    Number(String),
    /// Neither the command line nor the config file names a kernel.
    #[error("no kernel: give --kernel or boot-source.kernel_image_path in --config-file")]
    NoKernel,
    /// A `--net` or `--disk` value that does not parse.
    #[error("{flag} '{spec}': {reason}")]
    OptionSpec {
        /// The option (`--net`, `--disk`).
        flag: &'static str,
        /// The value as given.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A TAP name the kernel would refuse.
    #[error(
        "network interface '{id}': invalid TAP name '{name}': 1 to 15 bytes, no '/', NUL or space"
    )]
    TapName {
        /// The NIC.
        id: String,
        /// The name given.
        name: String,
    },
    /// A NIC without a TAP.
    #[error("network interface '{0}' has no TAP: give tap=NAME (host_dev_name) or fd=N")]
    NoTap(String),
    /// Two NICs on one TAP.
    #[error("TAP '{0}' is given to two network interfaces; each needs its own TAP")]
    DuplicateTap(String),
    /// Two NICs on one file descriptor.
    #[error("fd {0} is given to two network interfaces; each needs its own TAP")]
    DuplicateFd(i32),
    /// A descriptor minivmm itself uses.
    #[error("fd={0}: descriptors 0, 1 and 2 are minivmm's own; pass a TAP fd of 3 or more")]
    StdioFd(i64),
    /// Two devices with one id (see [`super::ids`]).
    #[error("id '{id}' is used twice, by {first} and by {second}: device ids are metrics keys")]
    DuplicateId {
        /// The id.
        id: String,
        /// The device that has it first, in words.
        first: &'static str,
        /// The device that has it too.
        second: &'static str,
    },
    /// Two NICs with one MAC (as the MAC prints).
    #[error("MAC address {0} is given to two network interfaces")]
    DuplicateMac(String),
    /// An id that breaks the rule for device ids (see [`super::ids`]).
    #[error("invalid {what} id '{id}': {reason}")]
    BadId {
        /// The kind of device, in words.
        what: &'static str,
        /// The id given.
        id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// More NICs than IRQ lines for them.
    #[error("{0} network interfaces is too many: at most {MAX_NICS}")]
    TooManyNics(usize),
    /// A value too large for the device setting it is for (the device's
    /// own bounds are checked by [`devices::virtio::net::NetConfig::validate`]).
    #[error("network interface '{id}': {what} {value} is too large (at most 65535)")]
    TooLarge {
        /// The NIC.
        id: String,
        /// The setting ("MTU", "queue size").
        what: &'static str,
        /// The value given.
        value: u64,
    },
    /// Settings the network device refuses.
    #[error("network interface '{id}'")]
    Device {
        /// The NIC.
        id: String,
        /// What the device refused.
        #[source]
        source: devices::virtio::net::NetConfigError,
    },
    /// A bad rate limiter bucket.
    #[error("network interface '{id}': {dir}_rate_limiter")]
    RateLimiter {
        /// The NIC.
        id: String,
        /// "rx" or "tx".
        dir: &'static str,
        /// What is wrong.
        #[source]
        source: RateLimiterError,
    },
    /// A drive that cannot be used.
    #[error("drive '{id}': {reason}")]
    Drive {
        /// The drive id.
        id: String,
        /// What is wrong.
        reason: String,
    },
    /// More virtio devices than IRQ lines.
    #[error(
        "{0} virtio devices (network interfaces, drives, the entropy and vsock devices and \
         the balloon) is too many: at most {MAX_NICS}"
    )]
    TooManyDevices(usize),
    /// A vsock device the VMM cannot make (a reserved CID, a path that
    /// cannot be a socket).
    #[error("vsock: {0}")]
    Vsock(String),
    /// A balloon target above guest memory.
    #[error("balloon: amount_mib {0} is more than the guest's {1} MiB of memory")]
    BalloonTooLarge(u32, u64),
    /// A balloon beside hugetlbfs guest memory.
    #[error(
        "balloon: huge pages support is incompatible with memory ballooning \
         (machine-config huge_pages \"2M\")"
    )]
    BalloonHugePages,
    /// A bad rate limiter bucket of the entropy device.
    #[error("entropy device: rate_limiter")]
    Entropy(#[source] RateLimiterError),
    /// An MMDS configuration that does not fit the VM.
    #[error("mmds-config")]
    Mmds(#[from] super::mmds::MmdsConfigError),
    /// A log level that does not parse.
    #[error("invalid log level '{0}': expected off, error, warn(ing), info, debug or trace")]
    LogLevel(String),
    /// A metrics interval without a metrics path.
    #[error("a metrics interval needs a metrics path (--metrics or metrics.metrics_path)")]
    IntervalWithoutMetrics,
}
