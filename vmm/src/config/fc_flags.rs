// SPDX-License-Identifier: Apache-2.0
//! Firecracker's launcher flags that have no minivmm spelling of their own.
//!
//! Firecracker 1.17's `--help` lists them; a launcher written for it passes
//! them as they are, so minivmm takes each with Firecracker's meaning (or,
//! where minivmm lacks the feature, says so in one line): the logger's
//! `--show-level`, `--show-log-origin` and `--module`; `--no-seccomp` and
//! `--seccomp-filter`; `--http-api-max-payload-size` and `--mmds-size-limit`;
//! `--enable-pci` (the snapshot queries are `Cli`'s own). Those
//! with a minivmm spelling are aliases on [`super::cli::Cli`]'s own fields
//! (`--level` for `--log-level`, `--metrics-path` for `--metrics`).

use std::path::PathBuf;

use super::parse::parse_number;
use crate::api::http::{MAX_BODY_BYTES, MAX_PAYLOAD_LIMIT};

/// Firecracker's default API socket, used when no flag says how the VM is
/// configured (no `--kernel`, `--config-file`, `--api-sock` or `--no-api`).
pub const DEFAULT_API_SOCK: &str = "/run/firecracker.socket";

/// The warning `--enable-pci` prints: minivmm has no PCI transport yet.
pub const PCI_WARNING: &str = "--enable-pci: minivmm has no virtio-PCI transport yet; \
its devices stay on virtio-MMIO, which the guest kernels Firecracker publishes also carry";

fn bytes(s: &str) -> Result<u64, String> {
    parse_number(s).map_err(|e| e.to_string())
}

/// The flags, as clap reads them (flattened into [`super::cli::Cli`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct FirecrackerFlags {
    /// Show the level in every log line (Firecracker's flag; minivmm's lines
    /// show it unless the file or `PUT /logger` says `show_level: false`).
    #[arg(long)]
    pub show_level: bool,
    /// Show the source file and line of every log line (Firecracker's flag).
    #[arg(long)]
    pub show_log_origin: bool,
    /// Log only what this module path logs (Firecracker's flag), e.g. `vmm::api`.
    #[arg(long, value_name = "MODULE")]
    pub module: Option<String>,
    /// No seccomp filter on any thread: Firecracker's spelling of `--seccomp off`.
    #[arg(long, conflicts_with_all = ["seccomp_filter", "seccomp"])]
    pub no_seccomp: bool,
    /// Filters from this file instead of minivmm's own: Firecracker's seccompiler
    /// JSON, one filter per thread category (`vmm`, `api`, `vcpu`), compiled at start.
    #[arg(long, value_name = "PATH")]
    pub seccomp_filter: Option<PathBuf>,
    /// Most bytes of an API request body [default: 51200].
    #[arg(long, value_name = "BYTES", value_parser = bytes)]
    pub http_api_max_payload_size: Option<u64>,
    /// Most bytes of the MMDS data store [default: the API payload limit].
    #[arg(long, value_name = "BYTES", value_parser = bytes)]
    pub mmds_size_limit: Option<u64>,
    /// Firecracker's PCIe switch: accepted with one warning; devices stay on virtio-MMIO.
    #[arg(long)]
    pub enable_pci: bool,
}

/// The launch values these flags give, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagLimits {
    /// Most bytes of an API request body.
    pub api_payload_limit: usize,
    /// Most bytes of the MMDS data store (read by the MMDS code).
    pub mmds_size_limit: usize,
}

impl FirecrackerFlags {
    /// The payload and MMDS limits, or the one line saying which is wrong.
    pub fn limits(&self) -> Result<FlagLimits, String> {
        let payload = match self.http_api_max_payload_size {
            None => MAX_BODY_BYTES,
            Some(n) => checked_limit("--http-api-max-payload-size", n)?,
        };
        let mmds = match self.mmds_size_limit {
            None => payload,
            Some(n) => checked_limit("--mmds-size-limit", n)?,
        };
        Ok(FlagLimits {
            api_payload_limit: payload,
            mmds_size_limit: mmds,
        })
    }
}

/// A byte limit between 1 and [`MAX_PAYLOAD_LIMIT`].
fn checked_limit(flag: &str, n: u64) -> Result<usize, String> {
    match usize::try_from(n) {
        Ok(v) if (1..=MAX_PAYLOAD_LIMIT).contains(&v) => Ok(v),
        _ => Err(format!(
            "{flag} {n}: the limit is 1 to {MAX_PAYLOAD_LIMIT} bytes"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_default_to_firecrackers_and_mmds_follows_the_payload_limit() {
        let none = FirecrackerFlags::default();
        assert_eq!(
            none.limits(),
            Ok(FlagLimits {
                api_payload_limit: 51_200,
                mmds_size_limit: 51_200
            })
        );
        let payload = FirecrackerFlags {
            http_api_max_payload_size: Some(100_000),
            ..FirecrackerFlags::default()
        };
        assert_eq!(
            payload.limits(),
            Ok(FlagLimits {
                api_payload_limit: 100_000,
                mmds_size_limit: 100_000
            })
        );
        let both = FirecrackerFlags {
            mmds_size_limit: Some(4096),
            ..payload
        };
        assert_eq!(both.limits().map(|l| l.mmds_size_limit), Ok(4096));
        assert_eq!(both.limits().map(|l| l.api_payload_limit), Ok(100_000));
    }

    #[test]
    fn a_limit_outside_its_range_is_one_line_naming_the_flag() {
        for (flags, want) in [
            (
                FirecrackerFlags {
                    http_api_max_payload_size: Some(0),
                    ..FirecrackerFlags::default()
                },
                "--http-api-max-payload-size 0: the limit is 1 to 67108864 bytes",
            ),
            (
                FirecrackerFlags {
                    mmds_size_limit: Some(MAX_PAYLOAD_LIMIT as u64 + 1),
                    ..FirecrackerFlags::default()
                },
                "--mmds-size-limit 67108865: the limit is 1 to 67108864 bytes",
            ),
        ] {
            assert_eq!(flags.limits(), Err(want.to_string()));
        }
        let at_most = FirecrackerFlags {
            http_api_max_payload_size: Some(MAX_PAYLOAD_LIMIT as u64),
            mmds_size_limit: Some(1),
            ..FirecrackerFlags::default()
        };
        assert_eq!(
            at_most.limits(),
            Ok(FlagLimits {
                api_payload_limit: MAX_PAYLOAD_LIMIT,
                mmds_size_limit: 1
            })
        );
    }
}
