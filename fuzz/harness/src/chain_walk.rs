// SPDX-License-Identifier: Apache-2.0
//! Target `chain_walk`: the datapath's descriptor-chain walk against
//! rust-vmm's virtio-queue, on the same arbitrary descriptor tables.
//!
//! The input writes a descriptor table and indirect tables (any address,
//! length, flags and link) and names a head; both walk it. virtio-queue
//! follows what it is given and stops at the first thing it cannot follow;
//! ours also enforces the device's limits (direction, length bounds, at most
//! `MAX_CHAIN_SEGS` buffers, INDIRECT only when negotiated and never with
//! NEXT), so it may refuse chains virtio-queue walks. The oracles:
//! - when ours accepts a chain, virtio-queue yields exactly the same
//!   buffers in the same order (empty buffers aside: ours maps none), each
//!   of the direction the rules ask for, and the lengths add up;
//! - a walk, accepted or refused, reads at most `MAX_CHAIN_SEGS + 2`
//!   descriptors, and a refused one leaves the caller's segments as they
//!   were.

use std::sync::Arc;

use arbitrary::Arbitrary;
use devices::virtio::queue::{
    Budget, ChainRules, GuestRegions, RingAddrs, RingFeatures, SplitQueue, MAX_CHAIN_SEGS,
};
use devices::virtio::GuestMemory;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};

const MEM: u64 = 0x4_0000;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1_0000;
const USED: u64 = 0x1_1000;
/// Indirect tables and buffers live here.
const AREA: u64 = 0x2_0000;

#[derive(Debug, Clone, Copy, Arbitrary)]
enum Where {
    /// In the area, 16-byte slot `n`.
    Slot(u16),
    /// Anywhere.
    Raw(u64),
}

impl Where {
    fn get(self) -> u64 {
        match self {
            Where::Slot(n) => AREA + 16 * u64::from(n) % (MEM - AREA),
            Where::Raw(a) => a,
        }
    }
}

#[derive(Debug, Clone, Copy, Arbitrary)]
struct Desc {
    addr: Where,
    len: u16,
    big: bool,
    flags: u8,
    next: u16,
}

impl Desc {
    fn bytes(self) -> [u8; 16] {
        let len = if self.big {
            u32::from(self.len) << 8
        } else {
            u32::from(self.len)
        };
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&self.addr.get().to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&u16::from(self.flags & 7).to_le_bytes());
        d[14..].copy_from_slice(&self.next.to_le_bytes());
        d
    }
}

#[derive(Debug, Clone, Arbitrary)]
struct Input {
    size_log2: u8,
    indirect: bool,
    device_writes: bool,
    min_len: u8,
    max_len: u32,
    head: u16,
    ring: Vec<Desc>,
    tables: Vec<(u16, Vec<Desc>)>,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    crate::with_input(data, walk_both);
}

fn walk_both(input: &Input) {
    let size: u16 = 1 << (input.size_log2 % 9);
    let mem = GuestMemory::from_ranges(&[(GuestAddress(0), MEM as usize)]).expect("fixed layout");
    for (i, d) in input.ring.iter().take(usize::from(size)).enumerate() {
        let _ = mem.write_slice(&d.bytes(), GuestAddress(DESC + 16 * i as u64));
    }
    for (slot, table) in input.tables.iter().take(8) {
        let at = Where::Slot(*slot).get();
        for (i, d) in table.iter().take(512).enumerate() {
            let _ = mem.write_slice(&d.bytes(), GuestAddress(at + 16 * i as u64));
        }
    }
    let head = input.head % (2 * size);
    // The avail ring holds the head, published.
    mem.write_obj(head, GuestAddress(AVAIL + 4))
        .expect("in memory");
    mem.write_obj(1u16, GuestAddress(AVAIL + 2))
        .expect("in memory");

    let regions = Arc::new(GuestRegions::new(&mem).expect("mapped"));
    let addrs = RingAddrs {
        size,
        desc_table: DESC,
        avail_ring: AVAIL,
        used_ring: USED,
    };
    let features = RingFeatures {
        event_idx: false,
        indirect: input.indirect,
    };
    let q = SplitQueue::new(regions, addrs, size, features).expect("valid layout");
    let rules = ChainRules {
        device_writes: input.device_writes,
        min_len: usize::from(input.min_len),
        max_len: input.max_len as usize,
    };
    let mut segs = Vec::new();
    let mut budget = Budget::new(u32::MAX);
    let ours = q.walk(head, &rules, &mut segs, &mut budget);
    assert!(
        budget.spent() as usize <= MAX_CHAIN_SEGS + 2,
        "one walk read {} descriptors",
        budget.spent()
    );
    let Ok(chain) = ours else {
        assert!(segs.is_empty(), "a refused walk left segments behind");
        return;
    };

    // Host addresses back to guest ones (one region at guest address 0).
    let host0 = mem
        .get_host_address(GuestAddress(0))
        .expect("mapped memory") as usize;
    let got: Vec<(u64, usize)> = segs
        .iter()
        .map(|s| ((s.base() - host0) as u64, s.len()))
        .collect();
    assert_eq!(chain.nsegs, got.len());
    assert_eq!(chain.len, got.iter().map(|g| g.1).sum::<usize>());
    assert!(chain.len >= rules.min_len && chain.len <= rules.max_len);

    let mut o = Queue::new(size).expect("valid size");
    o.try_set_desc_table_address(GuestAddress(DESC))
        .expect("aligned");
    o.try_set_avail_ring_address(GuestAddress(AVAIL))
        .expect("aligned");
    o.try_set_used_ring_address(GuestAddress(USED))
        .expect("aligned");
    o.set_ready(true);
    let theirs = o
        .iter(&mem)
        .expect("a ready queue")
        .next()
        .expect("one chain published");
    assert_eq!(theirs.head_index(), head);
    let mut want = Vec::new();
    for d in theirs {
        assert_eq!(
            d.is_write_only(),
            rules.device_writes,
            "a buffer of the wrong direction was accepted"
        );
        if d.len() > 0 {
            want.push((d.addr().0, d.len() as usize));
        }
    }
    assert_eq!(got, want, "our walk and virtio-queue's differ");
}
