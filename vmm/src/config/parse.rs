// SPDX-License-Identifier: Apache-2.0
//! The value parsers every input shares: numbers, switches, log levels,
//! the `key=value` lists of `--net` and `--disk`, their limiter keys, and
//! Firecracker's spellings of `io_engine`. Each turns one string into one
//! value or a reason; none knows which device or section it serves.

use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use devices::virtio::io_engine::IoEngine;
use log::LevelFilter;

use super::error::ConfigError;
use super::HostQuirks;

/// Parses an unsigned number in decimal or, with a `0x` prefix, hexadecimal
/// (`0x80000`, as vhost-net's weights are usually written).
pub fn parse_number(s: &str) -> Result<u64, ConfigError> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => t.parse(),
    };
    parsed.map_err(|_| ConfigError::Number(s.to_string()))
}

/// Parses a log level, Firecracker's spellings (`Warning`, any case) included.
pub fn parse_level(s: &str) -> Result<LevelFilter, ConfigError> {
    match s.to_ascii_lowercase().as_str() {
        "warning" => Ok(LevelFilter::Warn),
        l => l.parse().map_err(|_| ConfigError::LogLevel(s.to_string())),
    }
}

/// Parses the host quirks switch: `auto`, `on` or `off`.
pub fn parse_host_quirks(s: &str) -> Result<HostQuirks, ConfigError> {
    match s {
        "auto" => Ok(HostQuirks::Auto),
        "on" => Ok(HostQuirks::On),
        "off" => Ok(HostQuirks::Off),
        _ => Err(ConfigError::Quirks(s.to_string())),
    }
}

/// Parses the value of `flag` (`--net`, `--disk`) with `parse`; an error
/// quotes the flag and the whole value, so the user sees which one is wrong.
pub fn parse_option<T>(
    flag: &'static str,
    spec: &str,
    parse: fn(&str) -> Result<T, String>,
) -> Result<T, ConfigError> {
    parse(spec).map_err(|reason| ConfigError::OptionSpec {
        flag,
        spec: spec.to_string(),
        reason,
    })
}

/// Parses an on/off switch (`true`/`false` too); an error names `key`.
pub fn on_off(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{key}: '{v}' is not on or off")),
    }
}

/// Parses an `io_engine` value: `Async` (io_uring batches) or `Sync`, in
/// any case, as Firecracker spells them.
pub fn parse_io_engine(v: &str) -> Result<IoEngine, String> {
    match v.to_ascii_lowercase().as_str() {
        "async" => Ok(IoEngine::Async),
        "sync" => Ok(IoEngine::Sync),
        _ => Err(format!("io_engine '{v}' is neither Async nor Sync")),
    }
}

/// The `key=value` items of a `--net` or `--disk` value, each key once and
/// each with a value; `Err` says which item is wrong.
pub fn key_values<'a>(
    items: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for item in items {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("'{item}' is not key=value"))?;
        if value.is_empty() {
            return Err(format!("{key} has no value"));
        }
        if out.iter().any(|(k, _)| *k == key) {
            return Err(format!("{key} is given twice"));
        }
        out.push((key, value));
    }
    Ok(out)
}

/// Where a limiter key without its direction (`bw_size`, `ops_refill_time`,
/// ...) goes in the table [`limiter_from_keys`] reads: (bucket, field), or
/// `None` when `key` is not a limiter key.
pub fn limiter_key(key: &str) -> Option<(usize, usize)> {
    let (bucket, field) = key.split_once('_')?;
    let bucket = match bucket {
        "bw" => 0,
        "ops" => 1,
        _ => return None,
    };
    let field = match field {
        "size" => 0,
        "one_time_burst" => 1,
        "refill_time" => 2,
        _ => return None,
    };
    Some((bucket, field))
}

/// A limiter from the `bw_*`/`ops_*` command-line keys: `keys[bucket]` is
/// (size, one_time_burst, refill_time) of bandwidth (0) and ops (1); `dir`
/// prefixes the key names in errors (`rx_`, `tx_` or nothing).
pub fn limiter_from_keys(
    keys: &[[Option<u64>; 3]; 2],
    dir: &str,
) -> Result<RateLimiterConfig, String> {
    let mut out = [None, None];
    for (k, kind) in ["bw", "ops"].iter().enumerate() {
        out[k] = match keys[k] {
            [None, None, None] => None,
            [Some(size), burst, Some(refill_time)] => Some(TokenBucketConfig {
                size,
                one_time_burst: burst.unwrap_or(0),
                refill_time,
            }),
            [None, ..] => return Err(format!("{dir}{kind}_size is missing")),
            [_, _, None] => return Err(format!("{dir}{kind}_refill_time is missing")),
        };
    }
    Ok(RateLimiterConfig {
        bandwidth: out[0],
        ops: out[1],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_decimal_and_hex() {
        assert_eq!(parse_number("524288").unwrap(), 0x80000);
        assert_eq!(parse_number("0x80000").unwrap(), 0x80000);
        assert_eq!(parse_number("0X1F").unwrap(), 31);
        for bad in ["", "0x", "-1", "12k", "0x1g", "1.5"] {
            assert!(
                matches!(parse_number(bad), Err(ConfigError::Number(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn log_levels_in_both_spellings() {
        assert_eq!(parse_level("Warning").unwrap(), LevelFilter::Warn);
        assert_eq!(parse_level("warn").unwrap(), LevelFilter::Warn);
        assert_eq!(parse_level("INFO").unwrap(), LevelFilter::Info);
        assert_eq!(parse_level("Off").unwrap(), LevelFilter::Off);
        assert!(parse_level("loud").is_err());
    }

    #[test]
    fn quirks_parse() {
        assert_eq!(parse_host_quirks("auto").unwrap(), HostQuirks::Auto);
        assert_eq!(parse_host_quirks("on").unwrap(), HostQuirks::On);
        assert_eq!(parse_host_quirks("off").unwrap(), HostQuirks::Off);
        assert!(parse_host_quirks("yes").is_err());
    }
    #[test]
    fn io_engine_in_firecracker_spelling_or_any_case() {
        for (v, want) in [
            ("Async", IoEngine::Async),
            ("async", IoEngine::Async),
            ("Sync", IoEngine::Sync),
            ("SYNC", IoEngine::Sync),
        ] {
            assert_eq!(parse_io_engine(v), Ok(want), "{v}");
        }
        assert!(parse_io_engine("uring").unwrap_err().contains("'uring'"));
    }
}
