// SPDX-License-Identifier: Apache-2.0
//! The statistics the balloon's driver reports (virtio 1.1 §5.5.6.3), as
//! Firecracker's `GET /balloon/statistics` shows them.
//!
//! The driver's buffer is an array of 10-byte entries, a little-endian
//! `u16` tag and `u64` value each, packed. A tag the device does not know
//! is counted and skipped; a tag missing from a report keeps the value of
//! the last report that had it (Firecracker's rule).

use serde::Serialize;

/// Bytes of one statistics entry (tag and value, packed).
pub const STAT_ENTRY_LEN: usize = 10;
/// Most entries a statistics buffer may hold (Firecracker's bound; Linux
/// sends at most 16).
pub const MAX_STATS: usize = 256;

/// Statistics tags (Linux's include/uapi/linux/virtio_balloon.h; the
/// bindings crate has no virtio_balloon module).
mod tag {
    pub const SWAP_IN: u16 = 0;
    pub const SWAP_OUT: u16 = 1;
    pub const MAJFLT: u16 = 2;
    pub const MINFLT: u16 = 3;
    pub const MEMFREE: u16 = 4;
    pub const MEMTOT: u16 = 5;
    pub const AVAIL: u16 = 6;
    pub const CACHES: u16 = 7;
    pub const HTLB_PGALLOC: u16 = 8;
    pub const HTLB_PGFAIL: u16 = 9;
    pub const OOM_KILL: u16 = 10;
    pub const ALLOC_STALL: u16 = 11;
    pub const ASYNC_SCAN: u16 = 12;
    pub const DIRECT_SCAN: u16 = 13;
    pub const ASYNC_RECLAIM: u16 = 14;
    pub const DIRECT_RECLAIM: u16 = 15;
}

/// The body of `GET /balloon/statistics`: the target and actual sizes from
/// the configuration space, and the latest value of each statistic the
/// driver reported (absent until it reports one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BalloonStats {
    /// The target, in 4 KiB pages.
    pub target_pages: u32,
    /// What the driver says it holds, in 4 KiB pages.
    pub actual_pages: u32,
    /// The target in MiB.
    pub target_mib: u32,
    /// What the driver holds, in MiB.
    pub actual_mib: u32,
    /// Memory swapped in (bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_in: Option<u64>,
    /// Memory swapped out (bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub swap_out: Option<u64>,
    /// Major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_faults: Option<u64>,
    /// Minor page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub minor_faults: Option<u64>,
    /// Memory used for nothing (bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free_memory: Option<u64>,
    /// Memory the guest has (bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_memory: Option<u64>,
    /// Memory available to new programs without swapping (bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_memory: Option<u64>,
    /// Memory quickly reclaimed without I/O (bytes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_caches: Option<u64>,
    /// Successful hugetlb page allocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_allocations: Option<u64>,
    /// Failed hugetlb page allocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugetlb_failures: Option<u64>,
    /// OOM killer invocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<u64>,
    /// Allocations that stalled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_stall: Option<u64>,
    /// Memory scanned asynchronously.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_scan: Option<u64>,
    /// Memory scanned directly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_scan: Option<u64>,
    /// Memory reclaimed asynchronously.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_reclaim: Option<u64>,
    /// Memory reclaimed directly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub direct_reclaim: Option<u64>,
}

impl BalloonStats {
    /// Takes one entry of a report; false for a tag the device does not
    /// know (skipped).
    pub fn update(&mut self, tag: u16, val: u64) -> bool {
        let slot = match tag {
            tag::SWAP_IN => &mut self.swap_in,
            tag::SWAP_OUT => &mut self.swap_out,
            tag::MAJFLT => &mut self.major_faults,
            tag::MINFLT => &mut self.minor_faults,
            tag::MEMFREE => &mut self.free_memory,
            tag::MEMTOT => &mut self.total_memory,
            tag::AVAIL => &mut self.available_memory,
            tag::CACHES => &mut self.disk_caches,
            tag::HTLB_PGALLOC => &mut self.hugetlb_allocations,
            tag::HTLB_PGFAIL => &mut self.hugetlb_failures,
            tag::OOM_KILL => &mut self.oom_kill,
            tag::ALLOC_STALL => &mut self.alloc_stall,
            tag::ASYNC_SCAN => &mut self.async_scan,
            tag::DIRECT_SCAN => &mut self.direct_scan,
            tag::ASYNC_RECLAIM => &mut self.async_reclaim,
            tag::DIRECT_RECLAIM => &mut self.direct_reclaim,
            _ => return false,
        };
        *slot = Some(val);
        true
    }

    /// Takes a whole report (`bytes`, a multiple of [`STAT_ENTRY_LEN`]);
    /// returns the entries whose tag was unknown.
    pub fn take_report(&mut self, bytes: &[u8]) -> u64 {
        let mut unknown = 0;
        for e in bytes.chunks_exact(STAT_ENTRY_LEN) {
            let tag = u16::from_le_bytes([e[0], e[1]]);
            let mut v = [0u8; 8];
            v.copy_from_slice(&e[2..]);
            if !self.update(tag, u64::from_le_bytes(v)) {
                unknown += 1;
            }
        }
        unknown
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(tag: u16, val: u64) -> Vec<u8> {
        let mut e = tag.to_le_bytes().to_vec();
        e.extend_from_slice(&val.to_le_bytes());
        e
    }

    #[test]
    fn every_tag_lands_in_its_field_and_a_missing_one_keeps_its_value() {
        let mut s = BalloonStats::default();
        let report: Vec<u8> = (0..16u16)
            .flat_map(|t| entry(t, 1000 + u64::from(t)))
            .collect();
        assert_eq!(s.take_report(&report), 0);
        let json = serde_json::to_value(s).unwrap();
        let names = [
            "swap_in",
            "swap_out",
            "major_faults",
            "minor_faults",
            "free_memory",
            "total_memory",
            "available_memory",
            "disk_caches",
            "hugetlb_allocations",
            "hugetlb_failures",
            "oom_kill",
            "alloc_stall",
            "async_scan",
            "direct_scan",
            "async_reclaim",
            "direct_reclaim",
        ];
        for (t, name) in names.iter().enumerate() {
            assert_eq!(json[name], 1000 + t as u64, "{name}");
        }
        // A later report with one tag and an unknown one.
        let mut later = entry(4, 7);
        later.extend(entry(99, 1));
        assert_eq!(s.take_report(&later), 1);
        assert_eq!(s.free_memory, Some(7));
        assert_eq!(s.total_memory, Some(1005), "kept from the first report");
    }

    #[test]
    fn absent_statistics_are_left_out_of_the_body() {
        let s = BalloonStats {
            target_pages: 512,
            target_mib: 2,
            ..Default::default()
        };
        let json = serde_json::to_value(s).unwrap();
        let obj = json.as_object().unwrap();
        assert_eq!(obj.len(), 4, "{json}");
        assert_eq!(json["target_mib"], 2);
        assert_eq!(json["actual_pages"], 0);
    }
}
