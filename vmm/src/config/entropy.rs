// SPDX-License-Identifier: Apache-2.0
//! The entropy device (virtio-rng): what `--rng`, the config file's
//! `entropy` section and `PUT /entropy` say ([`EntropySpec`]), and its check
//! ([`finish_entropy`]).
//!
//! Firecracker's section is `{"rate_limiter": {...}}`: a bandwidth bucket
//! in bytes and an ops bucket in requests, both optional. Cloud
//! Hypervisor's flag is `--rng src=PATH`, the host file its device reads.
//! minivmm's device fills the guest's buffers with `getrandom(2)`, which
//! draws from the pool behind `/dev/urandom`, so the one source it accepts
//! is `/dev/urandom` (Cloud Hypervisor's default); `--rng` alone means the
//! same. `--rng` also takes the `bw_*` and `ops_*` limiter keys of
//! `--disk`. A VM has one entropy device at most, as in Firecracker; its id,
//! its key in the metrics line, is Firecracker's: [`ENTROPY_ID`].

use devices::rate_limiter::RateLimiterConfig;
use devices::virtio::rng::RngConfig;

use super::error::ConfigError;
use super::parse::{key_values, limiter_from_keys, limiter_key, parse_number, parse_option};

/// The entropy device's id: its metrics key (Firecracker's), its name in
/// log lines.
pub const ENTROPY_ID: &str = "entropy";

/// The one source `--rng src=` accepts: what `getrandom(2)` reads.
pub const SOURCE: &str = "/dev/urandom";

/// The entropy device as the user wrote it (no defaults applied).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EntropySpec {
    /// The limiter keys / `rate_limiter`.
    pub rate_limiter: Option<RateLimiterConfig>,
}

impl EntropySpec {
    /// `self` with what it leaves open taken from `under` (the command line
    /// over the file: `--rng` alone keeps the file's limiter).
    pub(super) fn or(self, under: EntropySpec) -> EntropySpec {
        EntropySpec {
            rate_limiter: self.rate_limiter.or(under.rate_limiter),
        }
    }
}

/// Parses one `--rng` value (empty for `--rng` alone).
pub fn parse_rng(spec: &str) -> Result<EntropySpec, ConfigError> {
    parse_option("--rng", spec, parse_rng_keys)
}

fn parse_rng_keys(spec: &str) -> Result<EntropySpec, String> {
    // [bw, ops] x (size, one_time_burst, refill_time)
    let mut buckets = [[None::<u64>; 3]; 2];
    let items = spec.split(',').filter(|item| !item.is_empty());
    for (key, value) in key_values(items)? {
        match key {
            "src" if value == SOURCE => {}
            "src" => {
                return Err(format!(
                    "src={value}: only {SOURCE} (the device fills guest buffers with \
                     getrandom(2), the pool behind {SOURCE})"
                ))
            }
            "iommu" => return Err("iommu is not supported by minivmm (no IOMMU)".into()),
            _ => {
                let (kind, field) =
                    limiter_key(key).ok_or_else(|| format!("unknown key '{key}' (see --help)"))?;
                buckets[kind][field] = Some(parse_number(value).map_err(|e| e.to_string())?);
            }
        }
    }
    let rate_limiter = buckets
        .iter()
        .flatten()
        .any(Option::is_some)
        .then(|| limiter_from_keys(&buckets, ""))
        .transpose()?;
    Ok(EntropySpec { rate_limiter })
}

/// Applies the defaults and checks the limiter.
pub fn finish_entropy(spec: EntropySpec) -> Result<RngConfig, ConfigError> {
    let rate_limiter = spec.rate_limiter.unwrap_or_default();
    rate_limiter.validate().map_err(ConfigError::Entropy)?;
    Ok(RngConfig {
        rate_limiter,
        ..RngConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use devices::rate_limiter::TokenBucketConfig;

    #[test]
    fn rng_keys_parse_cloud_hypervisors_form_and_the_limiter_keys() {
        assert_eq!(parse_rng("").unwrap(), EntropySpec::default());
        assert_eq!(
            parse_rng("src=/dev/urandom").unwrap(),
            EntropySpec::default()
        );
        let limited = parse_rng("src=/dev/urandom,bw_size=1000,bw_refill_time=100,ops_size=5,ops_one_time_burst=2,ops_refill_time=0x10").unwrap();
        assert_eq!(
            limited.rate_limiter,
            Some(RateLimiterConfig {
                bandwidth: Some(TokenBucketConfig {
                    size: 1000,
                    one_time_burst: 0,
                    refill_time: 100,
                }),
                ops: Some(TokenBucketConfig {
                    size: 5,
                    one_time_burst: 2,
                    refill_time: 16,
                }),
            })
        );
        let cfg = finish_entropy(limited).unwrap();
        assert_eq!(cfg.rate_limiter.ops.map(|b| b.size), Some(5));
        assert_eq!(cfg.queue_size, RngConfig::default().queue_size);
        assert!(finish_entropy(EntropySpec::default())
            .unwrap()
            .rate_limiter
            .is_unlimited());
    }

    #[test]
    fn a_bad_rng_value_is_one_line_naming_it() {
        for (spec, want) in [
            (
                "src=/dev/random",
                "--rng 'src=/dev/random': src=/dev/random: only /dev/urandom",
            ),
            ("iommu=on", "--rng 'iommu=on': iommu is not supported"),
            ("colour=red", "--rng 'colour=red': unknown key 'colour'"),
            ("bw_size=5", "--rng 'bw_size=5': bw_refill_time is missing"),
            (
                "bw_size=x,bw_refill_time=1",
                "--rng 'bw_size=x,bw_refill_time=1': invalid number 'x'",
            ),
            ("src", "--rng 'src': 'src' is not key=value"),
            ("src=/dev/urandom,src=/dev/urandom", "src is given twice"),
        ] {
            let e = parse_rng(spec).unwrap_err().to_string();
            assert!(e.contains(want), "{spec}: '{e}' lacks '{want}'");
        }
        // A bucket the limiter refuses is refused when the config is made.
        let zero = parse_rng("ops_size=0,ops_refill_time=100").unwrap();
        let e = crate::error_line(&finish_entropy(zero).unwrap_err());
        assert!(e.starts_with("entropy device: rate_limiter: "), "{e}");
    }

    #[test]
    fn the_command_line_over_the_file_keeps_what_it_leaves_open() {
        let limiter = |size| {
            Some(RateLimiterConfig {
                bandwidth: Some(TokenBucketConfig {
                    size,
                    one_time_burst: 0,
                    refill_time: 100,
                }),
                ops: None,
            })
        };
        let file = EntropySpec {
            rate_limiter: limiter(10),
        };
        assert_eq!(EntropySpec::default().or(file.clone()), file);
        let flags = EntropySpec {
            rate_limiter: limiter(20),
        };
        assert_eq!(flags.clone().or(file), flags);
    }
}
