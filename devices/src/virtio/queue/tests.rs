// SPDX-License-Identifier: Apache-2.0
//! Tests of the split virtqueue over plain guest memory: layout validation,
//! the ring protocol, notification suppression and chain walking, each
//! checked from the driver's side of the rings.

use std::sync::Arc;

use vm_memory::{Address, Bytes, GuestAddress};

use super::*;
use crate::virtio::test_utils::{desc_bytes, DriverQueue};
use crate::virtio::GuestMemory;

const MEM: u64 = 4 << 20;
const DESC: u64 = 0x10000;
const AVAIL: u64 = 0x20000;
const USED: u64 = 0x30000;
const BUFS: u64 = 0x100000;

fn mem() -> GuestMemory {
    GuestMemory::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
}

fn addrs(size: u16) -> RingAddrs {
    RingAddrs {
        size,
        desc_table: DESC,
        avail_ring: AVAIL,
        used_ring: USED,
    }
}

fn queue_with(m: &GuestMemory, a: RingAddrs, f: RingFeatures) -> SplitQueue {
    SplitQueue::new(Arc::new(GuestRegions::new(m).unwrap()), a, a.size, f).unwrap()
}

fn queue(m: &GuestMemory, size: u16) -> SplitQueue {
    queue_with(m, addrs(size), RingFeatures::default())
}

/// Writes descriptor `i` of the table at `table`: (addr, len, flags, next).
fn desc_at(m: &GuestMemory, table: u64, i: u16, (addr, len, flags, next): (u64, u32, u16, u16)) {
    m.write_slice(
        &desc_bytes(addr, len, flags, next),
        GuestAddress(table + 16 * u64::from(i)),
    )
    .unwrap();
}

/// The driver's side of a queue laid out by `addrs`: the shared
/// [`DriverQueue`], with the shorthand these tests use (descriptors by
/// index, failures as panics).
struct Driver(DriverQueue);

impl Driver {
    fn new(a: RingAddrs) -> Self {
        Driver(DriverQueue::new(a.into()))
    }
    fn desc(&self, m: &GuestMemory, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.0.write_desc(m, i, addr, len, flags, next).unwrap();
    }
    fn publish(&mut self, m: &GuestMemory, head: u16) {
        self.0.offer(m, head).unwrap();
    }
    /// A hostile driver's avail idx, whatever it has put in the ring.
    fn set_avail_idx(&self, m: &GuestMemory, idx: u16) {
        let avail = self.0.layout().avail_ring;
        m.write_obj(idx, avail.unchecked_add(2)).unwrap();
    }
    fn used_idx(&self, m: &GuestMemory) -> u16 {
        self.0.used_idx(m).unwrap()
    }
    fn used_elem(&self, m: &GuestMemory, i: u16) -> (u32, u32) {
        let e = self.0.used_elem(m, i).unwrap();
        (e.id, e.len)
    }
    fn used_flags(&self, m: &GuestMemory) -> u16 {
        self.0.used_flags(m).unwrap()
    }
    fn avail_event(&self, m: &GuestMemory) -> u16 {
        self.0.avail_event(m).unwrap()
    }
    fn set_used_event(&self, m: &GuestMemory, v: u16) {
        self.0.set_used_event(m, v).unwrap();
    }
    fn set_avail_flags(&self, m: &GuestMemory, v: u16) {
        self.0.set_avail_flags(m, v).unwrap();
    }
}

const TX: ChainRules = ChainRules {
    device_writes: false,
    min_len: 12,
    max_len: 12 + 65550,
};
const RX: ChainRules = ChainRules {
    device_writes: true,
    min_len: 12,
    max_len: usize::MAX,
};

/// Pops the next chain and walks it with `rules`.
fn pop_walk(
    q: &mut SplitQueue,
    rules: &ChainRules,
) -> (Result<Chain, ChainError>, Vec<IoSeg>, u32) {
    let mut b = Budget::new(u32::MAX);
    let head = q.pop(&mut b).unwrap().expect("a chain");
    let mut segs = Vec::new();
    let r = q.walk(head, rules, &mut segs, &mut b);
    (r, segs, b.spent())
}

// ---- layout ----

#[test]
fn sizes_must_be_powers_of_two_up_to_the_maximum() {
    let m = mem();
    let r = Arc::new(GuestRegions::new(&m).unwrap());
    for (size, max) in [(0, 256), (3, 256), (100, 256), (512, 256), (1024, 1024)] {
        let res = SplitQueue::new(r.clone(), addrs(size), max, RingFeatures::default());
        assert_eq!(res.is_ok(), size == 1024, "size {size} max {max}");
    }
    assert!(SplitQueue::new(r, addrs(1), 1, RingFeatures::default()).is_ok());
}

#[test]
fn misaligned_or_outside_areas_are_refused() {
    let m = mem();
    let r = Arc::new(GuestRegions::new(&m).unwrap());
    let new = |a| SplitQueue::new(r.clone(), a, 256, RingFeatures::default());
    for (a, want) in [
        (
            RingAddrs {
                desc_table: DESC + 8,
                ..addrs(256)
            },
            RingArea::DescTable,
        ),
        (
            RingAddrs {
                avail_ring: AVAIL + 1,
                ..addrs(256)
            },
            RingArea::AvailRing,
        ),
        (
            RingAddrs {
                used_ring: USED + 2,
                ..addrs(256)
            },
            RingArea::UsedRing,
        ),
    ] {
        assert!(matches!(new(a), Err(QueueError::Misaligned { area, .. }) if area == want));
    }
    // What the log says when the driver's layout is refused.
    let err = new(RingAddrs {
        avail_ring: AVAIL + 1,
        ..addrs(256)
    })
    .unwrap_err();
    assert_eq!(err.to_string(), "avail ring at 0x20001 is misaligned");
    for (a, name) in [
        (
            RingAddrs {
                desc_table: DESC + 8,
                ..addrs(256)
            },
            "descriptor table",
        ),
        (
            RingAddrs {
                used_ring: USED + 2,
                ..addrs(256)
            },
            "used ring",
        ),
    ] {
        let err = new(a).unwrap_err().to_string();
        assert!(err.starts_with(name), "{err}");
    }
    // Each area, event fields included, must end inside memory: the avail
    // ring of 256 entries is 6 + 512 bytes and may end at the last byte, the
    // used ring is 6 + 2048 bytes.
    let end = RingAddrs {
        avail_ring: MEM - (6 + 2 * 256),
        ..addrs(256)
    };
    assert!(new(end).is_ok());
    let end = RingAddrs {
        avail_ring: MEM - (4 + 2 * 256),
        ..addrs(256)
    };
    assert!(new(end).is_err());
    let past = RingAddrs {
        used_ring: MEM - (4 + 8 * 256),
        ..addrs(256)
    };
    assert!(matches!(
        new(past),
        Err(QueueError::OutsideMemory {
            area: RingArea::UsedRing,
            ..
        })
    ));
    let wrap = RingAddrs {
        avail_ring: u64::MAX - 1,
        ..addrs(256)
    };
    assert!(matches!(new(wrap), Err(QueueError::OutsideMemory { .. })));
}

#[test]
fn an_area_across_two_regions_is_refused() {
    // Two adjacent regions are two mappings: a ring across the boundary
    // could not be one host pointer.
    let m =
        GuestMemory::from_ranges(&[(GuestAddress(0), 0x10000), (GuestAddress(0x10000), 0x10000)])
            .unwrap();
    let r = Arc::new(GuestRegions::new(&m).unwrap());
    let a = RingAddrs {
        size: 16,
        desc_table: 0x10000 - 0x80,
        avail_ring: 0x12000,
        used_ring: 0x13000,
    };
    assert!(matches!(
        SplitQueue::new(r.clone(), a, 256, RingFeatures::default()),
        Err(QueueError::OutsideMemory {
            area: RingArea::DescTable,
            ..
        })
    ));
    let a = RingAddrs {
        desc_table: 0x10000 - 0x100,
        ..a
    };
    assert!(SplitQueue::new(r, a, 256, RingFeatures::default()).is_ok());
}

#[test]
fn rings_at_guest_address_zero_work() {
    let m = mem();
    let a = RingAddrs {
        size: 8,
        desc_table: 0x1000,
        avail_ring: 0,
        used_ring: 0x2000,
    };
    let mut q = queue_with(&m, a, RingFeatures::default());
    let mut d = Driver::new(a);
    m.write_slice(&[7u8; 20], GuestAddress(BUFS)).unwrap();
    d.desc(&m, 3, BUFS, 20, 0, 0);
    d.publish(&m, 3);
    let (r, segs, _) = pop_walk(&mut q, &TX);
    assert_eq!(r.unwrap().head, 3);
    assert_eq!(segs.len(), 1);
    q.add_used(3, 0);
    assert_eq!(q.publish_used(), Notify::Interrupt);
    assert_eq!(d.used_idx(&m), 1);
    assert_eq!(d.used_elem(&m, 0), (3, 0));
}

#[test]
fn overlaps_are_refused_and_adjacent_areas_accepted() {
    let a = RingAddrs {
        size: 16,
        desc_table: 0x1000,
        avail_ring: 0x1100,
        used_ring: 0x1124,
    };
    // Adjacent: desc ends at 0x1100, avail (6 + 32) ends at 0x1126... which
    // the used ring at 0x1124 overlaps.
    assert_eq!(
        check_overlaps(&[a]),
        Err(QueueError::Overlap(
            0,
            RingArea::AvailRing,
            0,
            RingArea::UsedRing
        ))
    );
    let a = RingAddrs {
        used_ring: 0x1128,
        ..a
    };
    assert_eq!(check_overlaps(&[a]), Ok(()));
    // Across queues, even the same area of both.
    let b = RingAddrs {
        desc_table: 0x2000,
        avail_ring: 0x1100,
        used_ring: 0x3000,
        ..a
    };
    assert_eq!(
        check_overlaps(&[a, b]),
        Err(QueueError::Overlap(
            0,
            RingArea::AvailRing,
            1,
            RingArea::AvailRing
        ))
    );
    let b = RingAddrs {
        avail_ring: 0x1128 + 6 + 128,
        ..b
    };
    assert_eq!(check_overlaps(&[a, b]), Ok(()));
    // Areas near the top of the address space do not wrap the check.
    let top = RingAddrs {
        desc_table: u64::MAX - 0xf,
        ..b
    };
    assert!(check_overlaps(&[top]).is_ok());
}

// ---- the ring protocol ----

#[test]
fn used_entries_are_published_once_per_batch() {
    let m = mem();
    let mut q = queue(&m, 8);
    let mut d = Driver::new(addrs(8));
    for i in 0..5 {
        d.desc(&m, i, BUFS, 64, VIRTQ_DESC_F_WRITE, 0);
        d.publish(&m, i);
    }
    let mut b = Budget::new(100);
    let mut heads = Vec::new();
    while let Some(h) = q.pop(&mut b).unwrap() {
        heads.push(h);
        q.add_used(h, 10 + u32::from(h));
        // Written, not yet shown to the driver.
        assert_eq!(d.used_idx(&m), 0);
    }
    assert_eq!(heads, [0, 1, 2, 3, 4]);
    assert_eq!(b.spent(), 5);
    assert_eq!(q.publish_used(), Notify::Interrupt);
    assert_eq!(d.used_idx(&m), 5);
    for i in 0..5 {
        assert_eq!(d.used_elem(&m, i), (u32::from(i), 10 + u32::from(i)));
    }
    // Nothing new: no decision, no interrupt.
    assert_eq!(q.publish_used(), Notify::Nothing);
}

#[test]
fn a_hostile_driver_cannot_make_unpublished_entries_wrap() {
    let m = mem();
    let mut q = queue(&m, 4);
    let d = Driver::new(addrs(4));
    // Entries beyond a ring's worth are published as they would wrap.
    for i in 0..4 {
        q.add_used(i, 0);
    }
    assert_eq!(d.used_idx(&m), 4);
    q.add_used(0, 0);
    assert_eq!(d.used_idx(&m), 4);
    q.publish_used();
    assert_eq!(d.used_idx(&m), 5);
}

#[test]
fn avail_index_too_far_ahead_breaks_the_queue() {
    let m = mem();
    let mut q = queue(&m, 8);
    let d = Driver::new(addrs(8));
    d.set_avail_idx(&m, 8);
    assert!(q.has_available().unwrap());
    d.set_avail_idx(&m, 9);
    let mut fresh = queue(&m, 8);
    assert_eq!(
        fresh.pop(&mut Budget::new(10)),
        Err(QueueError::AvailIndex {
            idx: 9,
            next_avail: 0
        })
    );
    // The first queue had cached 8; it only sees 9 once it re-reads.
    let mut b = Budget::new(100);
    for _ in 0..8 {
        assert!(q.pop(&mut b).unwrap().is_some());
    }
    d.set_avail_idx(&m, 8 + 9);
    assert!(q.pop(&mut b).is_err());
    assert!(q.enable_notifications().is_err());
}

#[test]
fn interrupts_follow_no_interrupt_without_event_idx() {
    let m = mem();
    let mut q = queue(&m, 8);
    let d = Driver::new(addrs(8));
    d.set_avail_flags(&m, VIRTQ_AVAIL_F_NO_INTERRUPT);
    q.add_used(0, 1);
    assert_eq!(q.publish_used(), Notify::Suppressed);
    d.set_avail_flags(&m, 0);
    q.add_used(1, 1);
    assert_eq!(q.publish_used(), Notify::Interrupt);
}

#[test]
fn interrupts_follow_used_event_over_the_whole_batch() {
    let m = mem();
    let f = RingFeatures {
        event_idx: true,
        indirect: false,
    };
    let mut q = queue_with(&m, addrs(16), f);
    let d = Driver::new(addrs(16));
    // NO_INTERRUPT means nothing with EVENT_IDX.
    d.set_avail_flags(&m, VIRTQ_AVAIL_F_NO_INTERRUPT);
    // "Interrupt me once the entry at index 2 is used": a batch 0..4
    // passes it.
    d.set_used_event(&m, 2);
    for i in 0..4 {
        q.add_used(i, 0);
    }
    assert_eq!(q.publish_used(), Notify::Interrupt);
    // The next batch 4..6 does not reach 9.
    d.set_used_event(&m, 9);
    q.add_used(4, 0);
    q.add_used(5, 0);
    assert_eq!(q.publish_used(), Notify::Suppressed);
    // 6..10 passes 9 although no single publish landed on it.
    for i in 6..10 {
        q.add_used(i, 0);
    }
    assert_eq!(q.publish_used(), Notify::Interrupt);
    assert!(need_event(0xffff, 1, 0xfffe));
    assert!(!need_event(5, 5, 0));
    // The spec's window, exactly: moving from 10 to 20 passes events 10
    // to 19, not 9 and not 20.
    assert!(!need_event(9, 20, 10));
    assert!(need_event(10, 20, 10));
    assert!(need_event(19, 20, 10));
    assert!(!need_event(20, 20, 10));
}

#[test]
fn kick_suppression_without_event_idx() {
    let m = mem();
    let mut q = queue(&m, 8);
    let mut d = Driver::new(addrs(8));
    q.disable_notifications();
    assert_eq!(d.used_flags(&m), VIRTQ_USED_F_NO_NOTIFY);
    assert!(!q.enable_notifications().unwrap());
    assert_eq!(d.used_flags(&m), 0);
    // A chain published before the re-check is seen by it.
    q.disable_notifications();
    d.desc(&m, 0, BUFS, 64, 0, 0);
    d.publish(&m, 0);
    assert!(q.enable_notifications().unwrap());
}

#[test]
fn kick_suppression_with_event_idx() {
    let m = mem();
    let f = RingFeatures {
        event_idx: true,
        indirect: false,
    };
    let mut q = queue_with(&m, addrs(8), f);
    let mut d = Driver::new(addrs(8));
    for i in 0..3 {
        d.desc(&m, i, BUFS, 64, 0, 0);
        d.publish(&m, i);
    }
    let mut b = Budget::new(10);
    q.disable_notifications();
    // Flags stay untouched with EVENT_IDX.
    assert_eq!(d.used_flags(&m), 0);
    while q.pop(&mut b).unwrap().is_some() {}
    assert!(!q.enable_notifications().unwrap());
    assert_eq!(d.avail_event(&m), 3);
}

// ---- chains ----

#[test]
fn direct_chain_segments_in_order() {
    let m = mem();
    let mut q = queue(&m, 8);
    let mut d = Driver::new(addrs(8));
    d.desc(&m, 5, BUFS, 12, VIRTQ_DESC_F_NEXT, 2);
    d.desc(&m, 2, BUFS + 0x1000, 100, VIRTQ_DESC_F_NEXT, 7);
    d.desc(&m, 7, BUFS + 0x2000, 0, 0, 0);
    d.publish(&m, 5);
    let (r, segs, reads) = pop_walk(&mut q, &TX);
    let c = r.unwrap();
    assert_eq!(
        c,
        Chain {
            head: 5,
            len: 112,
            nsegs: 2,
            ring_descs: 3
        }
    );
    assert_eq!(segs.iter().map(IoSeg::len).collect::<Vec<_>>(), [12, 100]);
    assert_eq!(segs[1].base() - segs[0].base(), 0x1000);
    // The avail entry and three descriptors.
    assert_eq!(reads, 4);
}

/// Guest memory of two regions meeting at 0x80000 (so a buffer can cross
/// from one into the other), a queue of 8 on it, and its driver.
fn two_regions() -> (GuestMemory, SplitQueue, Driver) {
    let m =
        GuestMemory::from_ranges(&[(GuestAddress(0), 0x80000), (GuestAddress(0x80000), 0x80000)])
            .unwrap();
    let a = RingAddrs {
        size: 8,
        desc_table: 0x1000,
        avail_ring: 0x2000,
        used_ring: 0x3000,
    };
    let q = queue_with(&m, a, RingFeatures::default());
    (m, q, Driver::new(a))
}

#[test]
fn buffer_across_regions_becomes_two_segments() {
    let (m, mut q, mut d) = two_regions();
    let data: Vec<u8> = (0..200).map(|i| i as u8).collect();
    m.write_slice(&data, GuestAddress(0x80000 - 50)).unwrap();
    d.desc(&m, 0, 0x80000 - 50, 200, 0, 0);
    d.publish(&m, 0);
    let (r, segs, _) = pop_walk(&mut q, &TX);
    assert_eq!(r.unwrap().nsegs, 2);
    assert_eq!((segs[0].len(), segs[1].len()), (50, 150));
    let mut got = Vec::new();
    for s in &segs {
        for i in 0..s.len() {
            // SAFETY: the segment is mapped guest memory kept alive by `m`.
            got.push(unsafe { std::ptr::read_volatile((s.base() + i) as *const u8) });
        }
    }
    assert_eq!(got, data);
    // A buffer running into unmapped space is refused.
    d.desc(&m, 1, 0x100000 - 50, 200, 0, 0);
    d.publish(&m, 1);
    assert_eq!(pop_walk(&mut q, &TX).0, Err(ChainError::OutsideMemory));
}

/// One descriptor as the driver writes it: (addr, len, flags, next).
type Desc = (u64, u32, u16, u16);

/// Where the indirect-table cases put their table.
const TABLE: u64 = BUFS + 0x8000;

const N: u16 = VIRTQ_DESC_F_NEXT;
const W: u16 = VIRTQ_DESC_F_WRITE;
const IND: u16 = VIRTQ_DESC_F_INDIRECT;

/// Lays out `ring` in descriptor slots 0.. and `table` at [`TABLE`], offers
/// head 0 and returns why the chain was refused.
fn chain_refused(ring: &[Desc], table: &[Desc], rules: &ChainRules, f: RingFeatures) -> ChainError {
    refused(
        |m, d| {
            for (i, &(addr, len, flags, next)) in (0..).zip(ring) {
                d.desc(m, i, addr, len, flags, next);
            }
            for (i, &entry) in (0..).zip(table) {
                desc_at(m, TABLE, i, entry);
            }
            d.publish(m, 0)
        },
        rules,
        f,
    )
}

fn refused(
    setup: impl FnOnce(&GuestMemory, &mut Driver),
    rules: &ChainRules,
    f: RingFeatures,
) -> ChainError {
    let m = mem();
    let mut q = queue_with(&m, addrs(16), f);
    let mut d = Driver::new(addrs(16));
    setup(&m, &mut d);
    let (r, segs, _) = pop_walk(&mut q, rules);
    assert!(segs.is_empty(), "a refused chain leaves no segments");
    r.unwrap_err()
}

fn indirect() -> RingFeatures {
    RingFeatures {
        event_idx: false,
        indirect: true,
    }
}

#[test]
fn malformed_chains_are_refused() {
    use ChainError::*;
    let plain = RingFeatures::default();
    assert_eq!(refused(|m, d| d.publish(m, 16), &TX, plain), HeadOutOfRange);
    let cases: [(ChainError, &ChainRules, &[Desc]); 8] = [
        (OutsideMemory, &TX, &[(MEM - 10, 100, 0, 0)]),
        (WriteOnlyOnTx, &TX, &[(BUFS, 12, N, 1), (BUFS, 12, W, 0)]),
        (ReadOnlyOnRx, &RX, &[(BUFS, 12, W | N, 1), (BUFS, 12, 0, 0)]),
        (Unterminated, &TX, &[(BUFS, 12, N, 1), (BUFS, 12, N, 0)]),
        (NextOutOfRange, &TX, &[(BUFS, 12, N, 16)]),
        (TooShort, &TX, &[(BUFS, 11, 0, 0)]),
        (TooLong, &TX, &[(BUFS, 12, N, 1), (BUFS, 65551, 0, 0)]),
        (IndirectNotNegotiated, &TX, &[(BUFS, 16, IND, 0)]),
    ];
    for (want, rules, ring) in cases {
        assert_eq!(chain_refused(ring, &[], rules, plain), want);
    }
    // The same layouts with INDIRECT_DESC negotiated are still refused.
    assert_eq!(
        chain_refused(&[(BUFS, 12, N, 1), (BUFS, 12, W, 0)], &[], &TX, indirect()),
        WriteOnlyOnTx
    );
}

#[test]
fn tx_chain_of_exactly_the_limit_is_accepted() {
    let m = mem();
    let mut q = queue(&m, 8);
    let mut d = Driver::new(addrs(8));
    d.desc(&m, 0, BUFS, 12, VIRTQ_DESC_F_NEXT, 1);
    d.desc(&m, 1, BUFS + 0x100, 65550, 0, 0);
    d.publish(&m, 0);
    assert_eq!(pop_walk(&mut q, &TX).0.unwrap().len, 12 + 65550);
}

#[test]
fn indirect_tables() {
    // A direct header descriptor followed by a table of two buffers, as the
    // spec allows; the table descriptor's WRITE flag is ignored.
    let m = mem();
    let mut q = queue_with(&m, addrs(16), indirect());
    let mut d = Driver::new(addrs(16));
    d.desc(&m, 0, BUFS, 12, N, 1);
    d.desc(&m, 1, TABLE, 32, IND | W, 0);
    desc_at(&m, TABLE, 0, (BUFS + 0x100, 100, N, 1));
    desc_at(&m, TABLE, 1, (BUFS + 0x200, 50, 0, 0));
    d.publish(&m, 0);
    let (r, segs, reads) = pop_walk(&mut q, &TX);
    assert_eq!(
        r.unwrap(),
        Chain {
            head: 0,
            len: 162,
            nsegs: 3,
            ring_descs: 2
        }
    );
    assert_eq!(segs[2].len(), 50);
    assert_eq!(reads, 1 + 2 + 2);

    use ChainError::*;
    let cases: [(ChainError, &[Desc], &[Desc]); 8] = [
        (IndirectWithNext, &[(TABLE, 16, IND | N, 1)], &[]),
        (
            NestedIndirect,
            &[(TABLE, 16, IND, 0)],
            &[(TABLE, 16, IND, 0)],
        ),
        (IndirectTableLength, &[(TABLE, 0, IND, 0)], &[]),
        (IndirectTableLength, &[(TABLE, 24, IND, 0)], &[]),
        // More entries than the queue size (16).
        (IndirectTableLength, &[(TABLE, 17 * 16, IND, 0)], &[]),
        (OutsideMemory, &[(MEM - 16, 32, IND, 0)], &[]),
        // A loop inside the table.
        (
            Unterminated,
            &[(TABLE, 32, IND, 0)],
            &[(BUFS, 12, N, 1), (BUFS, 12, N, 0)],
        ),
        (NextOutOfRange, &[(TABLE, 32, IND, 0)], &[(BUFS, 12, N, 2)]),
    ];
    for (want, ring, table) in cases {
        assert_eq!(chain_refused(ring, table, &TX, indirect()), want);
    }
}

#[test]
fn indirect_table_at_an_odd_address() {
    let m = mem();
    let mut q = queue_with(&m, addrs(16), indirect());
    let mut d = Driver::new(addrs(16));
    let table = BUFS + 0x8001;
    d.desc(&m, 0, table, 16, VIRTQ_DESC_F_INDIRECT, 0);
    desc_at(&m, table, 0, (BUFS, 40, 0, 0));
    d.publish(&m, 0);
    assert_eq!(pop_walk(&mut q, &TX).0.unwrap().len, 40);
}

#[test]
fn one_refused_chain_costs_a_bounded_number_of_reads() {
    // The largest queue, and an indirect table of 32768 zero-length
    // descriptors chained in order: without the per-chain cap walking it
    // would read 32769 descriptors (65,535 with a direct chain in front).
    let m = GuestMemory::from_ranges(&[(GuestAddress(0), 8 << 20)]).unwrap();
    let size = MAX_QUEUE_SIZE;
    let a = RingAddrs {
        size,
        desc_table: 0x10000,
        avail_ring: 0x100000,
        used_ring: 0x200000,
    };
    let mut q = queue_with(&m, a, indirect());
    let mut d = Driver::new(a);
    let table = 0x400000u64;
    for i in 0..size {
        desc_at(
            &m,
            table,
            i,
            (BUFS, 0, VIRTQ_DESC_F_NEXT, i.wrapping_add(1)),
        );
    }
    d.desc(&m, 0, table, u32::from(size) * 16, VIRTQ_DESC_F_INDIRECT, 0);
    d.publish(&m, 0);
    let (r, _, reads) = pop_walk(&mut q, &TX);
    assert_eq!(r, Err(ChainError::TooManySegments));
    assert!(reads as usize <= MAX_CHAIN_SEGS + 3, "{reads} reads");

    // A direct chain of exactly MAX_CHAIN_SEGS buffers is fine, one more
    // is not.
    for (count, ok) in [
        (MAX_CHAIN_SEGS as u16, true),
        (MAX_CHAIN_SEGS as u16 + 1, false),
    ] {
        let mut q = queue_with(&m, a, indirect());
        let mut d = Driver::new(a);
        for i in 0..count {
            let last = i + 1 == count;
            let flags = if last { 0 } else { VIRTQ_DESC_F_NEXT };
            d.desc(&m, i, 0x500000 + u64::from(i) * 16, 16, flags, i + 1);
        }
        d.publish(&m, 0);
        let (r, _, reads) = pop_walk(&mut q, &TX);
        assert_eq!(r.is_ok(), ok, "{count} buffers");
        assert!(reads as usize <= MAX_CHAIN_SEGS + 3);
    }
}

#[test]
fn a_descriptor_rewritten_after_the_walk_changes_nothing() {
    let m = mem();
    let mut q = queue(&m, 8);
    let mut d = Driver::new(addrs(8));
    d.desc(&m, 0, BUFS, 64, 0, 0);
    d.publish(&m, 0);
    let (r, segs, _) = pop_walk(&mut q, &TX);
    // The guest now points the descriptor somewhere else: the segments the
    // walk produced are what was validated.
    d.desc(&m, 0, MEM + 0x1000, 0xffff_ffff, VIRTQ_DESC_F_NEXT, 7);
    assert_eq!(r.unwrap().len, 64);
    assert_eq!(segs[0].len(), 64);
}

/// virtio-queue as an oracle: for random well-formed direct chains, our walk
/// yields the same buffers in the same order.
#[test]
fn walk_matches_virtio_queue_on_random_chains() {
    use virtio_queue::{Queue, QueueOwnedT, QueueT};
    let m = mem();
    let size = 64u16;
    let mut q = queue(&m, size);
    let mut o = Queue::new(size).unwrap();
    o.try_set_desc_table_address(GuestAddress(DESC)).unwrap();
    o.try_set_avail_ring_address(GuestAddress(AVAIL)).unwrap();
    o.try_set_used_ring_address(GuestAddress(USED)).unwrap();
    o.set_ready(true);
    let mut d = Driver::new(addrs(size));
    let mut seed = 0x9e37_79b9u32;
    let mut rnd = |n: u32| {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed % n
    };
    for _ in 0..500 {
        let len = 1 + rnd(8) as u16;
        let first = rnd(u32::from(size)) as u16;
        let idxs: Vec<u16> = (0..len).map(|i| (first + i * 7) % size).collect();
        for (k, &i) in idxs.iter().enumerate() {
            let next = idxs.get(k + 1).copied();
            let flags = if next.is_some() { VIRTQ_DESC_F_NEXT } else { 0 };
            let blen = 12 + rnd(2000);
            d.desc(
                &m,
                i,
                BUFS + u64::from(rnd(0x10000)),
                blen,
                flags,
                next.unwrap_or(0),
            );
        }
        d.publish(&m, first);
        let want: Vec<(u64, u32)> = o
            .iter(&m)
            .unwrap()
            .next()
            .unwrap()
            .map(|desc| (desc.addr().0, desc.len()))
            .collect();
        let (r, segs, _) = pop_walk(&mut q, &TX);
        let base = GuestRegions::new(&m).unwrap().host_range(0, 1).unwrap();
        let got: Vec<(u64, u32)> = segs
            .iter()
            .map(|s| ((s.base() - base) as u64, s.len() as u32))
            .collect();
        assert_eq!(r.unwrap().nsegs, want.len());
        assert_eq!(got, want);
    }
}

// ---- dirty pages ----

#[test]
fn the_buffers_a_device_may_write_are_marked_and_only_those() {
    use crate::virtio::queue::dirty::DirtyPages;
    let m = mem();
    let log = Arc::new(DirtyPages::new(&m));
    let regions = GuestRegions::new(&m)
        .unwrap()
        .with_dirty_log(Some(log.clone()));
    let mut q = SplitQueue::new(Arc::new(regions), addrs(16), 16, RingFeatures::default()).unwrap();
    let mut d = Driver::new(addrs(16));
    // An RX chain over two pages and a bit of a third; a TX chain elsewhere.
    d.desc(&m, 0, BUFS + 0xff0, 0x2000, VRING_DESC_F_WRITE as u16, 0);
    d.publish(&m, 0);
    d.desc(&m, 1, BUFS + 0x10000, 64, 0, 0);
    d.publish(&m, 1);
    let (r, _, _) = pop_walk(&mut q, &RX);
    r.unwrap();
    let (r, _, _) = pop_walk(&mut q, &TX);
    r.unwrap();
    for (gpa, marked) in [
        (BUFS - 1, false),
        (BUFS, true),
        (BUFS + 0x1000, true),
        (BUFS + 0x2000, true),
        (BUFS + 0x3000, false),
        (BUFS + 0x10000, false),
    ] {
        assert_eq!(log.is_marked(gpa), marked, "{gpa:#x}");
    }
    // A mixed chain (block): the readable header is not marked, the
    // writable data and status are.
    d.desc(&m, 2, BUFS + 0x20000, 16, VRING_DESC_F_NEXT as u16, 3);
    d.desc(&m, 3, BUFS + 0x30000, 512, VRING_DESC_F_WRITE as u16, 0);
    d.publish(&m, 2);
    let mut b = Budget::new(u32::MAX);
    let head = q.pop(&mut b).unwrap().unwrap();
    q.walk_mixed(head, 1 << 20, &mut Vec::new(), &mut b)
        .unwrap();
    assert!(!log.is_marked(BUFS + 0x20000));
    assert!(log.is_marked(BUFS + 0x30000));
}

/// Records what [`SplitQueue::walk_with`] shows it.
#[derive(Default)]
struct Shown(Vec<IoSeg>);

impl FirstSeg for Shown {
    const MIN_LEN: u32 = 46;

    fn seen(&mut self, seg: IoSeg) {
        self.0.push(seg);
    }
}

#[test]
fn walk_with_shows_a_long_first_buffer_in_one_region_and_nothing_else() {
    let (m, mut q, mut d) = two_regions();
    let (b0, b1) = (0x10000, 0x20000);
    let across = 0x80000 - 20;
    // (buffers of the chain, whether its first is shown)
    let cases: [(&[(u64, u32)], bool); 7] = [
        (&[(b0, 60)], true),
        (&[(b0, 46)], true),
        (&[(b0, 45)], false),
        (&[(b0, 46), (b1, 100)], true),
        (&[(b0, 12), (b1, 100)], false),
        (&[(b0, 0), (b1, 100)], false),
        (&[(across, 100)], false),
    ];
    for (bufs, shown) in cases {
        let n = bufs.len() as u16;
        for (i, &(addr, len)) in (0..n).zip(bufs) {
            let flags = if i + 1 < n { VIRTQ_DESC_F_NEXT } else { 0 };
            d.desc(&m, i, addr, len, flags, i + 1);
        }
        d.publish(&m, 0);
        let mut b = Budget::new(u32::MAX);
        let head = q.pop(&mut b).unwrap().expect("a chain");
        let (mut segs, mut look) = (Vec::new(), Shown::default());
        let chain = q.walk_with(head, &TX, &mut segs, &mut b, &mut look);
        // The same walk as without a look.
        let mut plain = Vec::new();
        assert_eq!(chain, q.walk(head, &TX, &mut plain, &mut b), "{bufs:?}");
        assert_eq!(segs, plain, "{bufs:?}");
        let expect = if shown { vec![segs[0]] } else { vec![] };
        assert_eq!(look.0, expect, "{bufs:?}");
        q.add_used(head, 0);
    }
}
