// SPDX-License-Identifier: Apache-2.0
//! [`DriverQueue`]: the guest's side of one split virtqueue (virtio 1.1
//! §2.6), written with plain guest-memory accesses.
//!
//! It is the one ring writer of every driver-side harness: [`MockDriver`]
//! keeps one per queue, the network device's test fixture drives its two
//! queues with it, and the fuzz targets write their (often malformed) chains
//! through it. It offers two ways of placing descriptors, and a queue uses
//! one of them:
//!
//! - as a well-behaved driver: [`add_chain`](DriverQueue::add_chain) and
//!   [`add_chain_indirect`](DriverQueue::add_chain_indirect) take
//!   descriptors from a free list, and [`used`](DriverQueue::used) gives
//!   them back when the device returns their chain;
//! - as tests and fuzzers need: [`write_desc`](DriverQueue::write_desc)
//!   writes any descriptor anywhere in the table (loops, out-of-range
//!   `next`, undefined flags), and [`write_chain`](DriverQueue::write_chain)
//!   lays chains out in the table's slots in order, wrapping, whatever is
//!   outstanding.
//!
//! Either way, [`push_avail`](DriverQueue::push_avail) puts a head in the
//! next avail slot and [`publish`](DriverQueue::publish) stores `avail.idx`;
//! the event-index fields and ring flags are read and written in place.
//!
//! [`MockDriver`]: super::MockDriver

use std::sync::atomic::{fence, Ordering};

use vm_memory::{Address, Bytes, GuestAddress};

use super::DriverError;
use crate::virtio::queue::{
    RingAddrs, VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
};
use crate::virtio::GuestMemory;

/// One buffer of a descriptor chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Guest physical address of the buffer.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
    /// Whether the device may write it (VIRTQ_DESC_F_WRITE).
    pub device_writable: bool,
}

impl Segment {
    /// A buffer the device reads (a TX frame, a request).
    pub fn readable(addr: GuestAddress, len: u32) -> Self {
        Segment {
            addr,
            len,
            device_writable: false,
        }
    }

    /// A buffer the device writes (an RX buffer, a response).
    pub fn writable(addr: GuestAddress, len: u32) -> Self {
        Segment {
            addr,
            len,
            device_writable: true,
        }
    }

    /// Its descriptor's `(addr, len, flags)`, without NEXT.
    fn desc(&self) -> (u64, u32, u16) {
        let flags = if self.device_writable {
            VIRTQ_DESC_F_WRITE
        } else {
            0
        };
        (self.addr.raw_value(), self.len, flags)
    }
}

/// One used-ring entry (virtio 1.1 §2.6.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index of the returned chain.
    pub id: u32,
    /// Bytes the device wrote into the chain.
    pub len: u32,
}

/// Compares with an `(id, len)` pair, the way tests write expected entries.
impl PartialEq<(u32, u32)> for UsedElem {
    fn eq(&self, other: &(u32, u32)) -> bool {
        (self.id, self.len) == *other
    }
}

/// Guest addresses of one queue's three parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLayout {
    /// Queue size (number of descriptors).
    pub size: u16,
    /// Descriptor table.
    pub desc_table: GuestAddress,
    /// Available (driver) ring.
    pub avail_ring: GuestAddress,
    /// Used (device) ring.
    pub used_ring: GuestAddress,
}

impl From<RingAddrs> for QueueLayout {
    fn from(a: RingAddrs) -> Self {
        QueueLayout {
            size: a.size,
            desc_table: GuestAddress(a.desc_table),
            avail_ring: GuestAddress(a.avail_ring),
            used_ring: GuestAddress(a.used_ring),
        }
    }
}

impl QueueLayout {
    /// The three parts one after the other from `base`, as compact as their
    /// alignments allow (virtio 1.1 §2.6): the table at `base`, the avail
    /// ring right after it, the used ring at the next multiple of 4.
    pub fn packed(base: GuestAddress, size: u16) -> Self {
        let n = u64::from(size);
        let avail = base.unchecked_add(16 * n);
        let used = GuestAddress((avail.raw_value() + 6 + 2 * n).next_multiple_of(4));
        QueueLayout {
            size,
            desc_table: base,
            avail_ring: avail,
            used_ring: used,
        }
    }

    /// The same layout as the transport hands it to the queue code.
    pub fn ring_addrs(&self) -> RingAddrs {
        RingAddrs {
            size: self.size,
            desc_table: self.desc_table.raw_value(),
            avail_ring: self.avail_ring.raw_value(),
            used_ring: self.used_ring.raw_value(),
        }
    }

    /// Where `field` of the avail ring lies (2-byte entries).
    fn avail(&self, field: RingField) -> GuestAddress {
        self.ring_field(self.avail_ring, 2, field)
    }

    /// Where `field` of the used ring lies (8-byte entries).
    fn used(&self, field: RingField) -> GuestAddress {
        self.ring_field(self.used_ring, 8, field)
    }

    /// Both rings are `le16 flags; le16 idx;`, `size` entries of
    /// `entry_len` bytes, then the `le16` event field (virtio 1.1 §2.6.6,
    /// §2.6.8). Entry indices wrap at the queue size.
    fn ring_field(&self, ring: GuestAddress, entry_len: u64, field: RingField) -> GuestAddress {
        let offset = match field {
            RingField::Idx => 2,
            RingField::Entry(idx) => 4 + entry_len * u64::from(idx % self.size.max(1)),
            RingField::Event => 4 + entry_len * u64::from(self.size),
        };
        ring.unchecked_add(offset)
    }

    fn desc_addr(&self, index: u16) -> GuestAddress {
        self.desc_table
            .unchecked_add(16 * u64::from(index % self.size.max(1)))
    }
}

/// A field of the avail or the used ring.
#[derive(Debug, Clone, Copy)]
enum RingField {
    /// The ring's `idx`.
    Idx,
    /// The entry at this ring index.
    Entry(u16),
    /// The event field after the entries: `used_event` in the avail ring,
    /// `avail_event` in the used ring.
    Event,
}

/// `struct virtq_desc { le64 addr; le32 len; le16 flags; le16 next; }`
/// (virtio 1.1 §2.6.5), as the bytes a driver stores.
pub fn desc_bytes(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut raw = [0u8; 16];
    raw[0..8].copy_from_slice(&addr.to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&flags.to_le_bytes());
    raw[14..16].copy_from_slice(&next.to_le_bytes());
    raw
}

/// Writes `descs` (`(addr, len, flags)`) as an indirect table at `table`:
/// entry `i` links to `i + 1` with NEXT, the last has neither.
pub fn write_indirect_table(
    mem: &GuestMemory,
    table: GuestAddress,
    descs: &[(u64, u32, u16)],
) -> Result<(), DriverError> {
    for (i, &(addr, len, flags)) in descs.iter().enumerate() {
        let (flags, next) = if i + 1 < descs.len() {
            (flags | VIRTQ_DESC_F_NEXT, i as u16 + 1)
        } else {
            (flags & !VIRTQ_DESC_F_NEXT, 0)
        };
        mem.write_slice(
            &desc_bytes(addr, len, flags, next),
            table.unchecked_add(16 * i as u64),
        )?;
    }
    Ok(())
}

/// A `le16` ring index or event field, read with acquire ordering (whichever
/// side stores it does so with release).
fn load_le16(mem: &GuestMemory, at: GuestAddress) -> Result<u16, DriverError> {
    Ok(u16::from_le(mem.load(at, Ordering::Acquire)?))
}

/// The guest's side of one split virtqueue (see the module doc).
#[derive(Debug, Clone)]
pub struct DriverQueue {
    layout: QueueLayout,
    /// Descriptors not in an outstanding chain (free-list placement).
    free: Vec<u16>,
    /// Descriptors of each outstanding chain, by head index.
    chains: Vec<Vec<u16>>,
    /// The table slot [`write_chain`](Self::write_chain) starts at next.
    next_desc: u16,
    /// Next avail index to fill (ahead of the published one until
    /// `publish`).
    next_avail: u16,
    /// Used index up to which entries were returned by `used`.
    last_used: u16,
}

impl DriverQueue {
    /// A queue at `layout`, its memory left as it is.
    pub fn new(layout: QueueLayout) -> Self {
        DriverQueue {
            layout,
            // Pop from the end, so hand out descriptors 0, 1, 2, … first.
            free: (0..layout.size).rev().collect(),
            chains: vec![Vec::new(); usize::from(layout.size)],
            next_desc: 0,
            next_avail: 0,
            last_used: 0,
        }
    }

    /// A queue at `layout` (valid or not: overlapping, misaligned, at
    /// address 0...), its three parts zeroed where they are guest memory:
    /// a ring a driver starts from.
    pub fn zeroed(mem: &GuestMemory, layout: QueueLayout) -> Self {
        for (_, addr, len) in layout.ring_addrs().areas() {
            // Parts outside guest memory stay unwritten: the device is the
            // one to refuse them.
            let _ = mem.write_slice(&vec![0u8; len as usize], GuestAddress(addr));
        }
        DriverQueue::new(layout)
    }

    /// A zeroed queue of `size` entries laid out from `base` (see
    /// [`QueueLayout::packed`]).
    pub fn packed(mem: &GuestMemory, base: GuestAddress, size: u16) -> Self {
        DriverQueue::zeroed(mem, QueueLayout::packed(base, size))
    }

    /// Where the queue is.
    pub fn layout(&self) -> QueueLayout {
        self.layout
    }

    /// Where the queue is, as the device sees it.
    pub fn ring_addrs(&self) -> RingAddrs {
        self.layout.ring_addrs()
    }

    /// Queue size.
    pub fn size(&self) -> u16 {
        self.layout.size
    }

    /// Writes descriptor `idx` (folded into the table) as given: any
    /// address, length, flags and `next`.
    pub fn write_desc(
        &self,
        mem: &GuestMemory,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) -> Result<(), DriverError> {
        mem.write_slice(
            &desc_bytes(addr, len, flags, next),
            self.layout.desc_addr(idx),
        )?;
        Ok(())
    }

    /// Writes a chain of `(addr, len, flags)` descriptors into the table
    /// slots from [`next_desc`](Self::next_desc) on, wrapping, NEXT added
    /// to all but the last, and returns its head, without making it
    /// available. The slots are taken whether or not a chain still holds
    /// them: the caller keeps no more outstanding than the table holds.
    pub fn write_chain(
        &mut self,
        mem: &GuestMemory,
        descs: &[(u64, u32, u16)],
    ) -> Result<u16, DriverError> {
        if descs.is_empty() {
            return Err(DriverError::EmptyChain);
        }
        let size = self.layout.size.max(1);
        let head = self.next_desc % size;
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let idx = (head + i as u16) % size;
            let (flags, next) = if i + 1 < descs.len() {
                (flags | VIRTQ_DESC_F_NEXT, (idx + 1) % size)
            } else {
                (flags & !VIRTQ_DESC_F_NEXT, 0)
            };
            self.write_desc(mem, idx, addr, len, flags, next)?;
        }
        self.next_desc = (head + descs.len() as u16) % size;
        Ok(head)
    }

    /// The table slot the next [`write_chain`](Self::write_chain) starts at.
    pub fn next_desc(&self) -> u16 {
        self.next_desc
    }

    /// [`write_chain`](Self::write_chain), then
    /// [`offer`](Self::offer): the chain is the device's.
    pub fn post_chain(
        &mut self,
        mem: &GuestMemory,
        descs: &[(u64, u32, u16)],
    ) -> Result<u16, DriverError> {
        let head = self.write_chain(mem, descs)?;
        self.offer(mem, head)?;
        Ok(head)
    }

    /// [`post_chain`](Self::post_chain) with the last descriptor linked
    /// (NEXT) to descriptor `next(head)`: back into the chain for a loop,
    /// past the table for a link out of range. Returns the head.
    pub fn post_chain_linked(
        &mut self,
        mem: &GuestMemory,
        descs: &[(u64, u32, u16)],
        next: impl FnOnce(u16) -> u16,
    ) -> Result<u16, DriverError> {
        let head = self.write_chain(mem, descs)?;
        let last = (head + descs.len() as u16 - 1) % self.layout.size.max(1);
        let (addr, len, flags) = descs[descs.len() - 1];
        self.write_desc(mem, last, addr, len, flags | VIRTQ_DESC_F_NEXT, next(head))?;
        self.offer(mem, head)?;
        Ok(head)
    }

    /// Writes a chain of `segments` from the free list and puts its head in
    /// the next avail slot, without publishing it. Returns the head index,
    /// which is the `id` the device returns in the used ring.
    pub fn add_chain(
        &mut self,
        mem: &GuestMemory,
        segments: &[Segment],
    ) -> Result<u16, DriverError> {
        if segments.is_empty() {
            return Err(DriverError::EmptyChain);
        }
        self.add_descs(mem, segments.len(), |i| segments[i].desc())
    }

    /// [`add_chain`](Self::add_chain) with the segments after the first
    /// `direct` in an indirect table written at `table` (16 bytes per
    /// segment; VIRTIO_RING_F_INDIRECT_DESC must be negotiated). The table
    /// takes one descriptor of the ring; it must stay untouched until the
    /// chain is used.
    pub fn add_chain_indirect(
        &mut self,
        mem: &GuestMemory,
        segments: &[Segment],
        direct: usize,
        table: GuestAddress,
    ) -> Result<u16, DriverError> {
        let direct = direct.min(segments.len());
        let rest = &segments[direct..];
        if rest.is_empty() {
            return self.add_chain(mem, segments);
        }
        let table_descs: Vec<_> = rest.iter().map(Segment::desc).collect();
        write_indirect_table(mem, table, &table_descs)?;
        // A table too long for the field is one the device refuses anyway.
        let len = u32::try_from(16 * rest.len()).unwrap_or(u32::MAX);
        self.add_descs(mem, direct + 1, |i| {
            if i < direct {
                segments[i].desc()
            } else {
                (table.raw_value(), len, VIRTQ_DESC_F_INDIRECT)
            }
        })
    }

    /// The head the next free-list chain gets, if any descriptor is free.
    pub fn next_head(&self) -> Option<u16> {
        self.free.last().copied()
    }

    /// Descriptors not in an outstanding free-list chain.
    pub fn free_descriptors(&self) -> usize {
        self.free.len()
    }

    /// Writes `n` descriptors `desc(0..n)` (address, length, flags; NEXT is
    /// added) from the free list and puts the head in the next avail slot.
    fn add_descs(
        &mut self,
        mem: &GuestMemory,
        n: usize,
        desc: impl Fn(usize) -> (u64, u32, u16),
    ) -> Result<u16, DriverError> {
        let Some(&head) = self.free.last().filter(|_| self.free.len() >= n) else {
            return Err(DriverError::NoFreeDescriptors {
                needed: n,
                free: self.free.len(),
            });
        };
        // A free head's chain vector is empty but keeps its capacity, so
        // steady-state submission does not allocate (the benchmark harness
        // would measure it).
        let mut chain = std::mem::take(&mut self.chains[usize::from(head)]);
        chain.clear();
        for _ in 0..n {
            chain.extend(self.free.pop());
        }
        for (i, &d) in chain.iter().enumerate() {
            let next = chain.get(i + 1).copied();
            let (addr, len, mut flags) = desc(i);
            if next.is_some() {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            let raw = desc_bytes(addr, len, flags, next.unwrap_or(0));
            if let Err(e) = mem.write_slice(&raw, self.layout.desc_addr(d)) {
                // Give the descriptors back so the queue stays consistent.
                self.free.extend(chain.drain(..).rev());
                self.chains[usize::from(head)] = chain;
                return Err(e.into());
            }
        }
        self.chains[usize::from(head)] = chain;
        self.push_avail(mem, head)?;
        Ok(head)
    }

    /// Puts `head` in the next avail slot, without publishing it.
    pub fn push_avail(&mut self, mem: &GuestMemory, head: u16) -> Result<(), DriverError> {
        mem.write_obj(
            head.to_le(),
            self.layout.avail(RingField::Entry(self.next_avail)),
        )?;
        self.next_avail = self.next_avail.wrapping_add(1);
        Ok(())
    }

    /// Makes every head pushed so far visible to the device (avail idx
    /// store with release ordering, after the ring writes).
    pub fn publish(&self, mem: &GuestMemory) -> Result<(), DriverError> {
        fence(Ordering::SeqCst);
        mem.store(
            self.next_avail.to_le(),
            self.layout.avail(RingField::Idx),
            Ordering::Release,
        )?;
        Ok(())
    }

    /// [`push_avail`](Self::push_avail) and [`publish`](Self::publish).
    pub fn offer(&mut self, mem: &GuestMemory, head: u16) -> Result<(), DriverError> {
        self.push_avail(mem, head)?;
        self.publish(mem)
    }

    /// The avail idx the driver has published.
    pub fn avail_idx(&self, mem: &GuestMemory) -> Result<u16, DriverError> {
        load_le16(mem, self.layout.avail(RingField::Idx))
    }

    /// The device's used idx.
    pub fn used_idx(&self, mem: &GuestMemory) -> Result<u16, DriverError> {
        load_le16(mem, self.layout.used(RingField::Idx))
    }

    /// Used-ring entry `i` (folded into the ring), whether or not the device
    /// published it.
    pub fn used_elem(&self, mem: &GuestMemory, i: u16) -> Result<UsedElem, DriverError> {
        let slot = self.layout.used(RingField::Entry(i));
        Ok(UsedElem {
            id: u32::from_le(mem.read_obj(slot)?),
            len: u32::from_le(mem.read_obj(slot.unchecked_add(4))?),
        })
    }

    /// Used-ring entries added since the last call, oldest first. The
    /// descriptors of free-list chains become free for reuse.
    pub fn used(&mut self, mem: &GuestMemory) -> Result<Vec<UsedElem>, DriverError> {
        let mut out = Vec::new();
        self.used_into(mem, &mut out)?;
        Ok(out)
    }

    /// [`used`](Self::used) appending to `out`, for loops that should not
    /// allocate. Returns how many entries were appended.
    pub fn used_into(
        &mut self,
        mem: &GuestMemory,
        out: &mut Vec<UsedElem>,
    ) -> Result<usize, DriverError> {
        let used_idx = self.used_idx(mem)?;
        let before = out.len();
        while self.last_used != used_idx {
            let e = self.used_elem(mem, self.last_used)?;
            // An id that is not an outstanding head is a device bug; the test
            // sees it in the returned entry, the driver frees nothing.
            if let Some(chain) = usize::try_from(e.id)
                .ok()
                .and_then(|i| self.chains.get_mut(i))
            {
                self.free.extend(chain.drain(..).rev());
            }
            out.push(e);
            self.last_used = self.last_used.wrapping_add(1);
        }
        Ok(out.len() - before)
    }

    /// The used ring's flags (VIRTQ_USED_F_NO_NOTIFY).
    pub fn used_flags(&self, mem: &GuestMemory) -> Result<u16, DriverError> {
        Ok(u16::from_le(mem.read_obj(self.layout.used_ring)?))
    }

    /// Sets the avail ring's flags (VIRTQ_AVAIL_F_NO_INTERRUPT).
    pub fn set_avail_flags(&self, mem: &GuestMemory, flags: u16) -> Result<(), DriverError> {
        Ok(mem.write_obj(flags.to_le(), self.layout.avail_ring)?)
    }

    /// The `avail_event` field the device writes at the end of the used ring
    /// (EVENT_IDX, virtio 1.1 §2.6.10).
    pub fn avail_event(&self, mem: &GuestMemory) -> Result<u16, DriverError> {
        load_le16(mem, self.layout.used(RingField::Event))
    }

    /// The `used_event` field at the end of the avail ring.
    pub fn used_event(&self, mem: &GuestMemory) -> Result<u16, DriverError> {
        load_le16(mem, self.layout.avail(RingField::Event))
    }

    /// Sets `used_event`: with EVENT_IDX the driver wants an interrupt only
    /// once the device's used idx passes this value.
    pub fn set_used_event(&self, mem: &GuestMemory, value: u16) -> Result<(), DriverError> {
        mem.store(
            value.to_le(),
            self.layout.avail(RingField::Event),
            Ordering::Release,
        )?;
        Ok(())
    }
}
