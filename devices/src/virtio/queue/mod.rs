// SPDX-License-Identifier: Apache-2.0
//! Split virtqueues (virtio 1.1 §2.6), device side, for the datapath.
//!
//! virtio-queue walks every ring field and descriptor through vm-memory's
//! checked accessors and writes a used element with a fence and an index
//! store each; under callgrind that was most of the ~1,100 instructions the
//! device thread spent per 64-byte TX frame. [`SplitQueue`] does what
//! vhost-net does instead:
//!
//! - **Translated once.** At DRIVER_OK the transport validates the layout and
//!   translates each ring area to a host pointer: the size is a power of two
//!   no larger than QueueNumMax; the descriptor table is 16-aligned, the
//!   avail ring 2-aligned and the used ring 4-aligned; each area (descriptor
//!   table 16n bytes, avail ring 6 + 2n, used ring 6 + 8n, event fields
//!   included whether or not EVENT_IDX is negotiated) lies inside one guest
//!   memory region. Any guest address is fine, 0 included.
//! - **Read once.** `avail.idx` is loaded with acquire ordering and cached
//!   until the ring is drained; every descriptor is copied out of guest
//!   memory once (two volatile 8-byte loads) and never read again, so a
//!   second vCPU rewriting it mid-walk changes nothing (no TOCTOU).
//! - **Published in batches.** Used elements are written as chains complete;
//!   `used.idx` is stored (release) once per pass in
//!   [`publish_used`](SplitQueue::publish_used), which also decides, over the
//!   whole batch, whether the driver wants an interrupt (`used_event` with
//!   EVENT_IDX, `VRING_AVAIL_F_NO_INTERRUPT` without).
//! - **Two fences, both store-load.** One after re-enabling notifications
//!   and before re-reading `avail.idx`, one after publishing `used.idx` and
//!   before reading `used_event`/`avail.flags`. Everything else is plain
//!   acquire/release, which costs nothing on x86.
//!
//! Chains are walked by [`SplitQueue::walk`] (module `chain`), which enforces
//! the spec's limits and the device's own, and charges every descriptor it
//! reads to the pass's [`Budget`].
//!
//! **Overlapping rings.** The transport refuses, at DRIVER_OK, any layout in
//! which two areas overlap, within one queue or across the device's queues
//! ([`check_overlaps`]), and sets DEVICE_NEEDS_RESET: no driver has a reason
//! to alias its rings, and the one that does can make the device's own
//! notification writes change the indices it reads. The datapath does not
//! rely on that check for liveness, though: buffers may still point into the
//! rings and a second vCPU can rewrite any field at any time, so every loop
//! over a ring is bounded by the descriptor budget, whatever the ring says.
//! [`SplitQueue::new`] itself does not check overlaps, so tests can build the
//! layouts the transport refuses and show that.
//!
//! Everything here is pure over a memory snapshot: no file descriptors, no
//! epoll, so a pass can be run and fuzzed from a test.
//!
//! This module and `memory` are allowed `unsafe` for the raw ring and
//! buffer accesses, each with its bounds argument. The rest of the crate's
//! `unsafe` is in the system calls on guest memory and host descriptors:
//! `virtio::iov` (`readv`, `writev`, `getrandom`), `virtio::io_engine` and
//! the block device's `io`, `backend` and `uring` (io_uring and positioned
//! I/O), the network device's `tap` (its ioctls), and the rate limiter's
//! timerfd; every other module denies it (`#![deny(unsafe_code)]` at the
//! crate root).
#![allow(unsafe_code)]

mod chain;
pub mod dirty;
mod memory;

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC, VRING_AVAIL_F_NO_INTERRUPT,
    VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE, VRING_USED_F_NO_NOTIFY,
};

pub use chain::{split_seg, Chain, ChainError, ChainRules, FirstSeg, MixedChain, MAX_CHAIN_SEGS};
pub(crate) use memory::HostArea;
pub use memory::{GuestRegions, IoSeg, MemoryError, IOV_MAX};

// The ring flags at the width of the ring fields they go in (u16);
// virtio-bindings has them as u32.
/// Descriptor flag: the chain continues in `next` (virtio 1.1 §2.6.5).
pub const VIRTQ_DESC_F_NEXT: u16 = VRING_DESC_F_NEXT as u16;
/// Descriptor flag: the buffer is device-writable.
pub const VIRTQ_DESC_F_WRITE: u16 = VRING_DESC_F_WRITE as u16;
/// Descriptor flag: the buffer is an indirect descriptor table (§2.6.5.3).
pub const VIRTQ_DESC_F_INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;
/// Avail ring flag: the driver wants no interrupts (without EVENT_IDX).
pub const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = VRING_AVAIL_F_NO_INTERRUPT as u16;
/// Used ring flag: the device wants no notifications (without EVENT_IDX).
pub const VIRTQ_USED_F_NO_NOTIFY: u16 = VRING_USED_F_NO_NOTIFY as u16;
/// Largest queue size a split virtqueue can have (virtio 1.1 §2.6).
pub const MAX_QUEUE_SIZE: u16 = 32768;

const DESC_TABLE_ALIGN: usize = 16;
const AVAIL_RING_ALIGN: usize = 2;
const USED_RING_ALIGN: usize = 4;
/// Offsets inside the avail and used rings (virtio 1.1 §2.6.6, §2.6.8).
const RING_FLAGS: usize = 0;
const RING_IDX: usize = 2;
const RING_ENTRIES: usize = 4;

/// The three parts of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingArea {
    /// The descriptor table.
    DescTable,
    /// The available (driver) ring, `used_event` included.
    AvailRing,
    /// The used (device) ring, `avail_event` included.
    UsedRing,
}

impl std::fmt::Display for RingArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RingArea::DescTable => "descriptor table",
            RingArea::AvailRing => "avail ring",
            RingArea::UsedRing => "used ring",
        })
    }
}

/// Where the driver put one queue (QueueNum, QueueDesc, QueueDriver,
/// QueueDevice).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingAddrs {
    /// Queue size (number of descriptors).
    pub size: u16,
    /// Guest address of the descriptor table.
    pub desc_table: u64,
    /// Guest address of the avail ring.
    pub avail_ring: u64,
    /// Guest address of the used ring.
    pub used_ring: u64,
}

impl RingAddrs {
    /// Each area with its guest address and length in bytes, event fields
    /// included.
    pub fn areas(&self) -> [(RingArea, u64, u64); 3] {
        let n = u64::from(self.size);
        [
            (RingArea::DescTable, self.desc_table, 16 * n),
            (RingArea::AvailRing, self.avail_ring, 6 + 2 * n),
            (RingArea::UsedRing, self.used_ring, 6 + 8 * n),
        ]
    }
}

/// Why a queue cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// QueueNum is zero, not a power of two or above QueueNumMax.
    #[error("invalid queue size {size} (max {max})")]
    Size {
        /// The size the driver chose.
        size: u16,
        /// QueueNumMax.
        max: u16,
    },
    /// An area is not aligned as virtio 1.1 §2.6 requires.
    #[error("{area} at {addr:#x} is misaligned")]
    Misaligned {
        /// Which area.
        area: RingArea,
        /// Its guest address.
        addr: u64,
    },
    /// An area does not lie inside one guest memory region.
    #[error("{area} at {addr:#x} ({len} bytes) is not inside one guest memory region")]
    OutsideMemory {
        /// Which area.
        area: RingArea,
        /// Its guest address.
        addr: u64,
        /// Its length.
        len: u64,
    },
    /// Two areas overlap (see the module docs).
    #[error("queue {0} {1} overlaps queue {2} {3}")]
    Overlap(usize, RingArea, usize, RingArea),
    /// `avail.idx` ran more than a queue size ahead of the device.
    #[error("avail idx {idx} is more than the queue size ahead of {next_avail}")]
    AvailIndex {
        /// The index the driver published.
        idx: u16,
        /// The next entry the device would read.
        next_avail: u16,
    },
}

/// Refuses any two overlapping areas among `queues` (indexed as given).
pub fn check_overlaps(queues: &[RingAddrs]) -> Result<(), QueueError> {
    let areas: Vec<(usize, RingArea, u128, u128)> = queues
        .iter()
        .enumerate()
        .flat_map(|(q, a)| {
            a.areas().map(|(area, addr, len)| {
                (
                    q,
                    area,
                    u128::from(addr),
                    u128::from(addr) + u128::from(len),
                )
            })
        })
        .collect();
    for (i, a) in areas.iter().enumerate() {
        for b in &areas[i + 1..] {
            if a.2 < b.3 && b.2 < a.3 {
                return Err(QueueError::Overlap(a.0, a.1, b.0, b.1));
            }
        }
    }
    Ok(())
}

/// Ring features negotiated for a queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingFeatures {
    /// VIRTIO_RING_F_EVENT_IDX.
    pub event_idx: bool,
    /// VIRTIO_RING_F_INDIRECT_DESC.
    pub indirect: bool,
}

impl RingFeatures {
    /// The ring features in a 64-bit feature word.
    pub fn from_bits(features: u64) -> Self {
        RingFeatures {
            event_idx: features & (1 << VIRTIO_RING_F_EVENT_IDX) != 0,
            indirect: features & (1 << VIRTIO_RING_F_INDIRECT_DESC) != 0,
        }
    }
}

/// What the driver asked for after a batch of used entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notify {
    /// Nothing was used since the last decision.
    Nothing,
    /// The driver wants an interrupt.
    Interrupt,
    /// The driver suppressed the interrupt (EVENT_IDX or NO_INTERRUPT).
    Suppressed,
}

/// Ring entries and descriptors one pass of any device may read before it
/// yields, whatever its weights (a fixed hard cap: 0 weights only turn the
/// weights off). Well above what a weighted pass of real traffic reads: 256
/// frames of 19 descriptors (a 64 KiB frame in page fragments) are 5,120.
pub const PASS_DESC_BUDGET: u32 = 8192;

/// Most ring entries and descriptors a pass can read, whatever the guest
/// writes into its rings: the bound the tests and fuzz rigs hold every
/// pass to (a device stops at its budget and never looks at this). The
/// budget is checked before each chain, one chain costs at most its avail
/// entry, the descriptor pointing to an indirect table and
/// `MAX_CHAIN_SEGS + 1` buffer descriptors (the last one refused), and the
/// pass may look at `avail.idx` once more after re-enabling notifications.
pub const MAX_PASS_READS: u32 = PASS_DESC_BUDGET + MAX_CHAIN_SEGS as u32 + 3;

/// Chains (frames, requests) after which a pass yields to the event loop:
/// vhost-net's `VHOST_NET_PKT_WEIGHT`, the default weight of every device.
pub const PASS_WEIGHT_CHAINS: u32 = 256;

/// Bytes after which a pass yields to the event loop: vhost-net's
/// `VHOST_NET_WEIGHT`, the default weight of every device that moves data.
pub const PASS_WEIGHT_BYTES: u64 = 0x80000;

/// Work a pass may still do: ring entries and descriptors read, each
/// counting one, whether the chain they belong to is good or refused.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    limit: u32,
    spent: u32,
}

impl Budget {
    /// A budget of `limit` reads.
    pub fn new(limit: u32) -> Self {
        Budget { limit, spent: 0 }
    }

    /// Counts `n` reads.
    #[inline]
    pub fn charge(&mut self, n: u32) {
        self.spent = self.spent.saturating_add(n);
    }

    /// Whether the pass has spent its budget.
    #[inline]
    pub fn exhausted(&self) -> bool {
        self.spent >= self.limit
    }

    /// Reads counted so far.
    pub fn spent(&self) -> u32 {
        self.spent
    }
}

/// `vring_need_event` (virtio 1.1 §2.6.7.2): whether moving the index from
/// `old` to `new` passed `event`.
#[inline]
pub fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The device side of one split virtqueue.
///
/// Invariants (set in [`new`](Self::new), relied on by every ring access):
/// `size` is a power of two, `mask == size - 1`; `desc`, `avail` and `used`
/// are `16 * size`, `6 + 2 * size` and `6 + 8 * size` bytes long and 16-, 2-
/// and 4-aligned on the host; all three come from `mem`, which keeps them
/// mapped.
pub struct SplitQueue {
    mem: Arc<GuestRegions>,
    addrs: RingAddrs,
    mask: u16,
    desc: HostArea,
    avail: HostArea,
    used: HostArea,
    features: RingFeatures,
    /// The next avail entry to read.
    next_avail: u16,
    /// The last `avail.idx` read (already validated).
    avail_idx: u16,
    /// The next used entry to write.
    next_used: u16,
    /// The last `used.idx` stored.
    published: u16,
    /// `used.idx` at the last interrupt decision.
    signalled: u16,
    /// Without EVENT_IDX: whether `used.flags` allows notifications, as far
    /// as the device wrote it (a zeroed ring does). Enabling always writes.
    kicks_on: bool,
}

impl std::fmt::Debug for SplitQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SplitQueue")
            .field("addrs", &self.addrs)
            .field("features", &self.features)
            .field("next_avail", &self.next_avail)
            .field("next_used", &self.next_used)
            .finish_non_exhaustive()
    }
}

impl SplitQueue {
    /// Validates `addrs` against `max_size` and guest memory (see the module
    /// docs; overlaps are [`check_overlaps`]' job) and translates the rings.
    pub fn new(
        mem: Arc<GuestRegions>,
        addrs: RingAddrs,
        max_size: u16,
        features: RingFeatures,
    ) -> Result<Self, QueueError> {
        let size = addrs.size;
        if size == 0 || !size.is_power_of_two() || size > max_size.min(MAX_QUEUE_SIZE) {
            return Err(QueueError::Size {
                size,
                max: max_size,
            });
        }
        let translate = |(area, addr, len): (RingArea, u64, u64), align: usize| {
            if addr % align as u64 != 0 {
                return Err(QueueError::Misaligned { area, addr });
            }
            // `area` also checks the host address's alignment, which matches
            // the guest's for any page-aligned region.
            mem.area(addr, len as usize, align)
                .ok_or(QueueError::OutsideMemory { area, addr, len })
        };
        let [d, a, u] = addrs.areas();
        let desc = translate(d, DESC_TABLE_ALIGN)?;
        let avail = translate(a, AVAIL_RING_ALIGN)?;
        let used = translate(u, USED_RING_ALIGN)?;
        Ok(SplitQueue {
            mem,
            addrs,
            mask: size - 1,
            desc,
            avail,
            used,
            features,
            next_avail: 0,
            avail_idx: 0,
            next_used: 0,
            published: 0,
            signalled: 0,
            kicks_on: true,
        })
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.addrs.size
    }

    /// Where the rings are in guest memory.
    pub fn addrs(&self) -> RingAddrs {
        self.addrs
    }

    /// The ring features this queue runs with.
    pub fn features(&self) -> RingFeatures {
        self.features
    }

    /// The memory snapshot the rings and buffers are translated with.
    pub fn memory(&self) -> &Arc<GuestRegions> {
        &self.mem
    }

    /// Offset of `used_event` in the avail ring, `avail_event` in the used ring.
    fn avail_used_event(&self) -> usize {
        RING_ENTRIES + 2 * usize::from(self.addrs.size)
    }

    fn used_avail_event(&self) -> usize {
        RING_ENTRIES + 8 * usize::from(self.addrs.size)
    }

    /// Reads and checks `avail.idx`.
    #[inline]
    fn read_avail_idx(&self) -> Result<u16, QueueError> {
        // SAFETY: offset 2 of the avail ring (>= 6 bytes, 2-aligned).
        // Acquire: the ring entries and descriptors the driver wrote before
        // publishing this index are visible to the reads that follow.
        let idx = unsafe { self.avail.load_u16_acquire(RING_IDX) };
        if idx.wrapping_sub(self.next_avail) > self.addrs.size {
            return Err(QueueError::AvailIndex {
                idx,
                next_avail: self.next_avail,
            });
        }
        Ok(idx)
    }

    /// Picks the ring up where a device restored from a snapshot left it:
    /// every chain it completed is counted in `used.idx` (a pass publishes
    /// its used entries before it ends, and a snapshot is taken between
    /// passes), and the chains it had taken without completing are taken
    /// again. That is exact for a device that completes its chains in the
    /// order it took them (the network, entropy and vsock devices, and the
    /// block device with no request in flight): they are then the avail
    /// entries from `used.idx` on. The value comes from guest memory and
    /// is checked as any index is, at the next read of `avail.idx`.
    pub fn resume_from_ring(&mut self) {
        // SAFETY: offset 2 of the used ring (>= 6 bytes, 2-aligned).
        let used = unsafe { self.used.load_u16_acquire(RING_IDX) };
        // SAFETY: offset 0 of the used ring, 2-aligned.
        let flags = unsafe { self.used.load_u16_acquire(RING_FLAGS) };
        self.next_used = used;
        self.published = used;
        self.signalled = used;
        self.next_avail = used;
        self.avail_idx = used;
        self.kicks_on = flags & VIRTQ_USED_F_NO_NOTIFY == 0;
    }

    /// The next avail entry the device reads and the next used entry it
    /// writes.
    pub fn position(&self) -> (u16, u16) {
        (self.next_avail, self.next_used)
    }

    /// Whether the driver has made more chains available.
    #[inline]
    pub fn has_available(&mut self) -> Result<bool, QueueError> {
        if self.next_avail == self.avail_idx {
            self.avail_idx = self.read_avail_idx()?;
        }
        Ok(self.next_avail != self.avail_idx)
    }

    /// Takes the head of the next available chain, charging the avail entry
    /// to `budget`; `None` when the ring is empty.
    #[inline]
    pub fn pop(&mut self, budget: &mut Budget) -> Result<Option<u16>, QueueError> {
        if !self.has_available()? {
            return Ok(None);
        }
        budget.charge(1);
        let off = RING_ENTRIES + 2 * usize::from(self.next_avail & self.mask);
        // SAFETY: next_avail & mask < size, so off + 2 <= 4 + 2 * size, inside
        // the 6 + 2 * size bytes of the avail ring; 2-aligned.
        let head = unsafe { self.avail.read_u16(off) };
        self.next_avail = self.next_avail.wrapping_add(1);
        Ok(Some(head))
    }

    /// Writes a used element for chain `head` with `len` bytes written. The
    /// driver sees it at the next [`publish_used`](Self::publish_used).
    #[inline]
    pub fn add_used(&mut self, head: u16, len: u32) {
        let off = RING_ENTRIES + 8 * usize::from(self.next_used & self.mask);
        // SAFETY: next_used & mask < size, so off + 8 <= 4 + 8 * size, inside
        // the 6 + 8 * size bytes of the used ring; 4-aligned.
        unsafe { self.used.write_u32_pair(off, u32::from(head), len) };
        self.next_used = self.next_used.wrapping_add(1);
        // A driver that never reuses a descriptor before it is returned
        // cannot make a pass use more than `size` entries; a hostile one
        // could, and must not make us overwrite entries it has not been
        // shown yet.
        if self.next_used.wrapping_sub(self.published) >= self.addrs.size {
            self.store_used_idx();
        }
    }

    fn store_used_idx(&mut self) {
        if self.published != self.next_used {
            // SAFETY: offset 2 of the used ring (>= 6 bytes, 2-aligned).
            // Release: the used elements, and the buffer contents the device
            // wrote before them, are visible before the index that hands
            // them over.
            unsafe { self.used.store_u16_release(RING_IDX, self.next_used) };
            self.published = self.next_used;
        }
    }

    /// Publishes every used element written so far with one `used.idx`
    /// store and leaves the interrupt decision to the next
    /// [`publish_used`](Self::publish_used), which then decides for every
    /// entry since the last decision (with EVENT_IDX, `used_event` is checked
    /// against that whole range, so a deferred decision loses nothing).
    pub fn publish_used_quietly(&mut self) {
        self.store_used_idx();
    }

    /// Used entries written since the last interrupt decision.
    pub fn unsignalled(&self) -> u16 {
        self.next_used.wrapping_sub(self.signalled)
    }

    /// Publishes every used element written so far with one `used.idx` store
    /// and says whether the driver wants an interrupt for the batch since the
    /// last call.
    pub fn publish_used(&mut self) -> Notify {
        self.store_used_idx();
        if self.published == self.signalled {
            return Notify::Nothing;
        }
        let old = self.signalled;
        self.signalled = self.published;
        // Store-load fence: the driver re-enables interrupts (used_event or
        // flags) and then re-reads used.idx; we store used.idx and then read
        // its request. Without a full fence between our store and our load
        // both sides can read the other's old value and the interrupt is
        // lost.
        fence(Ordering::SeqCst);
        let want = if self.features.event_idx {
            // SAFETY: used_event is the last 2 bytes of the avail ring
            // (offset 4 + 2 * size of 6 + 2 * size), 2-aligned.
            let event = unsafe { self.avail.load_u16_acquire(self.avail_used_event()) };
            need_event(event, self.published, old)
        } else {
            // SAFETY: offset 0 of the avail ring, 2-aligned.
            let flags = unsafe { self.avail.load_u16_acquire(RING_FLAGS) };
            flags & VIRTQ_AVAIL_F_NO_INTERRUPT == 0
        };
        if want {
            Notify::Interrupt
        } else {
            Notify::Suppressed
        }
    }

    /// Tells the driver it need not notify the device (while the device is
    /// draining the ring anyway). A no-op with EVENT_IDX: `avail_event` then
    /// simply stays behind the driver.
    #[inline]
    pub fn disable_notifications(&mut self) {
        if self.kicks_on && !self.features.event_idx {
            // SAFETY: offset 0 of the used ring, 2-aligned. A late kick is
            // harmless, so no ordering is needed.
            unsafe { self.used.write_u16(RING_FLAGS, VIRTQ_USED_F_NO_NOTIFY) };
        }
        self.kicks_on = false;
    }

    /// Asks the driver to notify the device of new chains, then says whether
    /// chains arrived meanwhile (the caller processes them, and a pass counts
    /// each such re-check against its budget).
    pub fn enable_notifications(&mut self) -> Result<bool, QueueError> {
        if self.features.event_idx {
            // SAFETY: avail_event is the last 2 bytes of the used ring
            // (offset 4 + 8 * size of 6 + 8 * size), 2-aligned.
            unsafe {
                self.used
                    .store_u16_release(self.used_avail_event(), self.next_avail)
            };
        } else {
            // SAFETY: offset 0 of the used ring, 2-aligned.
            unsafe { self.used.store_u16_release(RING_FLAGS, 0) };
        }
        self.kicks_on = true;
        // Store-load fence: the driver publishes avail.idx and then reads
        // our flags / avail_event to decide whether to kick. If our re-read
        // of avail.idx below could pass our store above, both sides could
        // read the old value: no kick, and a chain left waiting for good.
        fence(Ordering::SeqCst);
        self.avail_idx = self.read_avail_idx()?;
        Ok(self.avail_idx != self.next_avail)
    }
}

#[cfg(test)]
mod tests;
