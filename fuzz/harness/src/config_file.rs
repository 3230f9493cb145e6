// SPDX-License-Identifier: Apache-2.0
//! Target `config_file`: minivmm's Firecracker-style JSON configuration,
//! from file text through `vmm::config::file::parse` and
//! `Settings::finish` to a validated `VmmConfig`.
//!
//! Inputs are either raw text or a JSON document assembled from the real
//! section and key names (Firecracker's and minivmm's own) with values of
//! every JSON type, so that most inputs get past the JSON parser and reach
//! the section and key checks. Oracles:
//!
//! - nothing panics, whatever the text;
//! - an error reaches the user as one non-empty line (`vmm::error_line`);
//! - an accepted file gives one card per `network-interfaces` entry, in
//!   order, with distinct ids, valid queue sizes, unicast MACs and valid
//!   offloads, and memory and vCPUs within their documented bounds.

use arbitrary::Arbitrary;
use serde_json::{Map, Value};

use crate::config_oracles::{assert_one_line, assert_within_bounds};

/// Keys that occur in real files, at any level.
const KEYS: &[&str] = &[
    "boot-source",
    "machine-config",
    "network-interfaces",
    "drives",
    "metrics",
    "logger",
    "vsock",
    "balloon",
    "mmds-config",
    "kernel_image_path",
    "initrd_path",
    "boot_args",
    "vcpu_count",
    "mem_size_mib",
    "smt",
    "host_quirks",
    "iface_id",
    "host_dev_name",
    "host_dev_fd",
    "guest_mac",
    "mtu",
    "queue_size",
    "offloads",
    "mrg_rxbuf",
    "tx_weight_packets",
    "pass_time_budget_us",
    "rx_rate_limiter",
    "tx_rate_limiter",
    "bandwidth",
    "ops",
    "size",
    "one_time_burst",
    "refill_time",
    "metrics_path",
    "interval_s",
    "log_path",
    "level",
    "show_level",
    "module",
    "unknown_key",
    "io_engine",
    "entropy",
    "rate_limiter",
];

/// Strings worth trying as values.
const STRINGS: &[&str] = &[
    "vmlinux",
    "tap0",
    "tap1",
    "eth0",
    "06:00:AC:10:00:02",
    "ff:ff:ff:ff:ff:ff",
    "Info",
    "Warning",
    "auto",
    "off",
    "csum",
    "tso4",
    "",
    "console=ttyS0",
    "Async",
    "Sync",
    "sync",
    "uring",
];

/// A JSON value built from the key and string vocabularies.
#[derive(Debug, Clone, Arbitrary)]
pub enum Json {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A non-negative integer.
    Num(u64),
    /// A negative integer.
    Neg(i64),
    /// A fractional number.
    Frac(u16),
    /// One of [`STRINGS`].
    Word(u8),
    /// Any string.
    Text(String),
    /// An array.
    Array(Vec<Json>),
    /// An object whose keys come from [`KEYS`] (or, rarely, anywhere).
    Object(Vec<(u8, Json)>),
}

/// Deeper structures are cut off: real files are three levels deep.
const MAX_DEPTH: usize = 5;

impl Json {
    fn to_value(&self, depth: usize) -> Value {
        if depth > MAX_DEPTH {
            return Value::Null;
        }
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Num(n) => Value::from(*n),
            Json::Neg(n) => Value::from(n.wrapping_abs().wrapping_neg()),
            Json::Frac(n) => Value::from(f64::from(*n) / 7.0),
            Json::Word(i) => Value::from(STRINGS[usize::from(*i) % STRINGS.len()]),
            Json::Text(s) => Value::from(s.as_str()),
            Json::Array(a) => Value::Array(a.iter().map(|j| j.to_value(depth + 1)).collect()),
            Json::Object(o) => {
                let mut m = Map::new();
                for (k, v) in o {
                    m.insert(
                        KEYS[usize::from(*k) % KEYS.len()].to_string(),
                        v.to_value(depth + 1),
                    );
                }
                Value::Object(m)
            }
        }
    }
}

/// One input.
#[derive(Debug, Arbitrary)]
pub enum Input {
    /// The file's bytes as they are.
    Raw(String),
    /// A document from the vocabularies, serialized.
    Doc(Json),
}

/// Runs one input (the libFuzzer entry point).
pub fn run(data: &[u8]) {
    crate::with_input(data, |i: &Input| run_input(i));
}

/// Parses the file of `input` as `--config-file` does and checks the oracles.
pub fn run_input(input: &Input) {
    let text = match input {
        Input::Raw(s) => s.clone(),
        Input::Doc(j) => j.to_value(0).to_string(),
    };
    let interfaces = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("network-interfaces").cloned())
        .and_then(|v| v.as_array().map(Vec::len));
    let settings = match vmm::config::file::parse(&text) {
        Ok(s) => s,
        Err(e) => return assert_one_line(&e, &text),
    };
    match settings.finish() {
        Err(e) => assert_one_line(&e, &text),
        Ok(cfg) => {
            assert_within_bounds(&cfg, &text);
            assert_eq!(Some(cfg.nets.len()), interfaces.or(Some(0)), "{text}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_example_is_accepted_and_a_bad_key_refused() {
        let good = r#"{"boot-source": {"kernel_image_path": "vmlinux"},
            "machine-config": {"vcpu_count": 2, "mem_size_mib": 512},
            "network-interfaces": [{"iface_id": "eth0", "host_dev_name": "tap0"},
                                   {"iface_id": "eth1", "host_dev_name": "tap1"}]}"#;
        run_input(&Input::Raw(good.to_string()));
        let cfg = vmm::config::file::parse(good).unwrap().finish().unwrap();
        assert_eq!(cfg.nets.len(), 2);
        let bad = good
            .replace("\"smt\"", "x")
            .replace("mem_size_mib", "mem_size_mb");
        assert!(vmm::config::file::parse(&bad).is_err());
        run_input(&Input::Raw(bad));
    }

    #[test]
    fn documents_from_the_vocabulary_reach_the_section_checks() {
        let doc = Json::Object(vec![(0, Json::Object(vec![(9, Json::Word(0))]))]);
        let v = doc.to_value(0);
        assert_eq!(v["boot-source"]["kernel_image_path"], "vmlinux");
        run_input(&Input::Doc(doc));
    }
}
