// SPDX-License-Identifier: Apache-2.0
//! Ring layouts that put two ring parts in contact: what the transport must
//! refuse or accept and the datapath must survive.

use vm_memory::GuestAddress;

use super::QueueLayout;
use crate::virtio::queue::RingArea;

/// Two queues' layouts that put two ring parts in contact, for tests of
/// what the transport must refuse or accept and the datapath must survive.
#[derive(Debug, Clone)]
pub struct LayoutCase {
    /// What touches what, e.g. "q1 used.flags / q1 avail.idx".
    pub what: String,
    /// Layouts of queues 0 and 1.
    pub layouts: [QueueLayout; 2],
}

/// A ring field: name, area, offset, length.
type RingField = (&'static str, RingArea, u64, u64);

/// The fields of a queue of `size` entries.
fn ring_fields(size: u16) -> [RingField; 9] {
    let n = u64::from(size);
    [
        ("desc table", RingArea::DescTable, 0, 16 * n),
        ("avail.flags", RingArea::AvailRing, 0, 2),
        ("avail.idx", RingArea::AvailRing, 2, 2),
        ("avail.ring", RingArea::AvailRing, 4, 2 * n),
        ("used_event", RingArea::AvailRing, 4 + 2 * n, 2),
        ("used.flags", RingArea::UsedRing, 0, 2),
        ("used.idx", RingArea::UsedRing, 2, 2),
        ("used.ring", RingArea::UsedRing, 4, 8 * n),
        ("avail_event", RingArea::UsedRing, 4 + 8 * n, 2),
    ]
}

fn area_align(area: RingArea) -> u64 {
    match area {
        RingArea::DescTable => 16,
        RingArea::AvailRing => 2,
        RingArea::UsedRing => 4,
    }
}

fn area_len(area: RingArea, size: u16) -> u64 {
    let n = u64::from(size);
    match area {
        RingArea::DescTable => 16 * n,
        RingArea::AvailRing => 6 + 2 * n,
        RingArea::UsedRing => 6 + 8 * n,
    }
}

/// Two queues of `size` (up to 256) entries with every part far from the
/// others, `moved` parts (queue, area, address) put elsewhere.
fn two_queues(size: u16, moved: &[(usize, RingArea, u64)]) -> [QueueLayout; 2] {
    let mut addrs = [[0x40000u64, 0x48000, 0x50000], [0x58000, 0x60000, 0x68000]];
    for &(q, area, addr) in moved {
        let i = match area {
            RingArea::DescTable => 0,
            RingArea::AvailRing => 1,
            RingArea::UsedRing => 2,
        };
        addrs[q][i] = addr;
    }
    addrs.map(|[d, a, u]| QueueLayout {
        size,
        desc_table: GuestAddress(d),
        avail_ring: GuestAddress(a),
        used_ring: GuestAddress(u),
    })
}

/// Every pair of ring fields in different areas, within one queue and
/// across queues 0 and 1, placed to share at least one byte with every area
/// correctly aligned (virtio 1.1 §2.6) in the first 1 MiB of guest memory.
///
/// Of the 129 pairs, 4 cannot overlap and are left out: used rings are
/// 4-aligned, so one used ring's `flags` (bytes 0-1 mod 4) never meets
/// another's `idx` or `avail_event` (bytes 2-3 mod 4).
pub fn aliasing_cases(size: u16) -> Vec<LayoutCase> {
    let all: Vec<(usize, RingField)> = (0..2)
        .flat_map(|q| ring_fields(size).into_iter().map(move |f| (q, f)))
        .collect();
    let mut out = Vec::new();
    for (i, &(qa, (na, area_a, off_a, len_a))) in all.iter().enumerate() {
        for &(qb, (nb, area_b, off_b, len_b)) in &all[i + 1..] {
            if qa == qb && area_a == area_b {
                continue;
            }
            // Area A at an aligned start near 0x20000, area B so that one
            // byte of field A is one of the bytes of field B.
            let mut found = None;
            'search: for pa in (0x20000..0x20010).step_by(area_align(area_a) as usize) {
                for ta in pa + off_a..pa + off_a + len_a.min(16) {
                    for db in 0..len_b.min(16) {
                        let pb = ta - off_b - db;
                        if pb % area_align(area_b) == 0 {
                            found = Some((pa, pb));
                            break 'search;
                        }
                    }
                }
            }
            let Some((pa, pb)) = found else {
                continue;
            };
            out.push(LayoutCase {
                what: format!("q{qa} {na} / q{qb} {nb}"),
                layouts: two_queues(size, &[(qa, area_a, pa), (qb, area_b, pb)]),
            });
        }
    }
    out
}

/// Every ordered pair of ring areas of queues 0 and 1 laid end to end: the
/// second at the first address after the first that its alignment allows.
pub fn adjacent_cases(size: u16) -> Vec<LayoutCase> {
    let areas = [RingArea::DescTable, RingArea::AvailRing, RingArea::UsedRing];
    let mut out = Vec::new();
    for qa in 0..2 {
        for qb in 0..2 {
            for a in areas {
                for b in areas {
                    if qa == qb && a == b {
                        continue;
                    }
                    let pa = 0x20000;
                    let pb = (pa + area_len(a, size)).next_multiple_of(area_align(b));
                    out.push(LayoutCase {
                        what: format!("q{qa} {a} then q{qb} {b}"),
                        layouts: two_queues(size, &[(qa, a, pa), (qb, b, pb)]),
                    });
                }
            }
        }
    }
    out
}
