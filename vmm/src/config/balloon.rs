// SPDX-License-Identifier: Apache-2.0
//! The balloon (virtio-balloon): the config file's `balloon` section and
//! the body of `PUT /balloon` ([`BalloonSpec`], Firecracker's `Balloon`),
//! its check ([`finish_balloon`]) and its form in `GET /balloon` and
//! `GET /vm/config` ([`render`]).
//!
//! Firecracker's fields: `amount_mib` and `deflate_on_oom` (required),
//! `stats_polling_interval_s` (0, statistics off, by default),
//! `free_page_hinting` and `free_page_reporting` (false by default). A VM
//! has one balloon at most; its id, its key in the metrics line, is
//! Firecracker's: [`BALLOON_ID`]. The target may not exceed guest memory.

use devices::virtio::balloon::BalloonConfig;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ConfigError;
use super::HugePages;

/// The balloon's id: its metrics key (Firecracker's), its name in log
/// lines.
pub const BALLOON_ID: &str = "balloon";

/// The balloon as the user wrote it (Firecracker's `Balloon` body).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BalloonSpec {
    /// Target size in MiB.
    pub amount_mib: u32,
    /// Let the guest take pages back when it runs out of memory.
    pub deflate_on_oom: bool,
    /// Seconds between statistics; 0 turns them off.
    #[serde(default)]
    pub stats_polling_interval_s: u16,
    /// Free page hinting.
    #[serde(default)]
    pub free_page_hinting: bool,
    /// Free page reporting.
    #[serde(default)]
    pub free_page_reporting: bool,
}

impl BalloonSpec {
    /// The device configuration it says (the default queue size).
    pub fn config(self) -> BalloonConfig {
        BalloonConfig {
            amount_mib: self.amount_mib,
            deflate_on_oom: self.deflate_on_oom,
            stats_polling_interval_s: self.stats_polling_interval_s,
            free_page_hinting: self.free_page_hinting,
            free_page_reporting: self.free_page_reporting,
            ..BalloonConfig::default()
        }
    }
}

/// The device configuration for `spec` in a guest of `mem_mib` MiB.
pub fn finish_balloon(
    spec: BalloonSpec,
    mem_mib: u64,
    pages: HugePages,
) -> Result<BalloonConfig, ConfigError> {
    // The balloon gives pages back 4 KiB at a time; a hugetlbfs page cannot
    // be given back in part (Firecracker refuses the pair the same way).
    if pages == HugePages::Hugetlbfs2M {
        return Err(ConfigError::BalloonHugePages);
    }
    if u64::from(spec.amount_mib) > mem_mib {
        return Err(ConfigError::BalloonTooLarge(spec.amount_mib, mem_mib));
    }
    Ok(spec.config())
}

/// The balloon in Firecracker's layout (`GET /balloon`, `GET /vm/config`).
pub fn render(b: &BalloonConfig) -> Value {
    json!({
        "amount_mib": b.amount_mib,
        "deflate_on_oom": b.deflate_on_oom,
        "stats_polling_interval_s": b.stats_polling_interval_s,
        "free_page_hinting": b.free_page_hinting,
        "free_page_reporting": b.free_page_reporting,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn firecrackers_body_with_its_defaults_and_the_target_bounded_by_memory() {
        let s: BalloonSpec =
            serde_json::from_value(json!({"amount_mib": 64, "deflate_on_oom": true})).unwrap();
        let b = finish_balloon(s, 128, HugePages::None).unwrap();
        assert_eq!(
            render(&b),
            json!({"amount_mib": 64, "deflate_on_oom": true, "stats_polling_interval_s": 0,
                   "free_page_hinting": false, "free_page_reporting": false})
        );
        let e = finish_balloon(s, 63, HugePages::Transparent).unwrap_err();
        assert_eq!(
            e.to_string(),
            "balloon: amount_mib 64 is more than the guest's 63 MiB of memory"
        );
        let e = finish_balloon(s, 128, HugePages::Hugetlbfs2M).unwrap_err();
        assert_eq!(
            e.to_string(),
            "balloon: huge pages support is incompatible with memory ballooning \
             (machine-config huge_pages \"2M\")"
        );
        for bad in [
            json!({"amount_mib": 1}),
            json!({"deflate_on_oom": false}),
            json!({"amount_mib": -1, "deflate_on_oom": false}),
            json!({"amount_mib": 1, "deflate_on_oom": false, "stats_polling_interval_s": 70000}),
            json!({"amount_mib": 1, "deflate_on_oom": false, "size": 1}),
        ] {
            assert!(
                serde_json::from_value::<BalloonSpec>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }
}
