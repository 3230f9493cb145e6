// SPDX-License-Identifier: Apache-2.0
//! Driver-side test helpers: a mock virtio driver that talks to an
//! [`MmioTransport`] only through register accesses, and a dummy device.
//!
//! [`MockDriver`] plays the guest: it negotiates features through the MMIO
//! registers, lays out split virtqueues (virtio 1.1 §2.6) in guest memory at
//! addresses it allocates from a bump allocator, posts descriptor chains,
//! publishes the avail index, kicks through QueueNotify and reads back the used
//! ring. It knows nothing about any particular device type, so the net device
//! tests and the benchmark harness in `tools/bench` share it.
//!
//! Unlike `virtio_queue::mock::MockSplitQueue`, which borrows the memory and
//! builds a `Queue` directly, the driver here owns its state (so it can live in
//! a test fixture or a benchmark thread), recycles descriptors when the device
//! returns them, and reaches the device only the way a guest would.
//!
//! Compiled for unit tests and with the `test-utils` feature.
//!
//! ```ignore
//! let mut drv = MockDriver::new(mem.clone(), MmioTransport::new(mem, device)?)?;
//! drv.init(1 << VIRTIO_F_VERSION_1)?;
//! let buf = drv.alloc(1500, 8)?;
//! drv.submit(0, &[Segment::writable(buf, 1500)])?;
//! // ... run the device ...
//! for e in drv.used(0)? { /* e.id, e.len */ }
//! ```

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryError, GuestMemoryRegion,
};
use vmm_sys_util::eventfd::EventFd;

use super::mmio::{
    MmioTransport, QUEUE_NOTIFY_OFFSET, REG_DEVICE_FEATURES, REG_DEVICE_FEATURES_SEL,
    REG_DRIVER_FEATURES, REG_DRIVER_FEATURES_SEL, REG_INTERRUPT_ACK, REG_INTERRUPT_STATUS,
    REG_QUEUE_DESC_HIGH, REG_QUEUE_DESC_LOW, REG_QUEUE_DEVICE_HIGH, REG_QUEUE_DEVICE_LOW,
    REG_QUEUE_DRIVER_HIGH, REG_QUEUE_DRIVER_LOW, REG_QUEUE_NUM, REG_QUEUE_NUM_MAX, REG_QUEUE_READY,
    REG_QUEUE_SEL, REG_STATUS,
};
use super::queue::{RingArea, SplitQueue};
use super::{status, ActivateError, GuestMemory, Interrupt, VirtioDevice};

/// Descriptor flag: the chain continues in `next` (virtio 1.1 §2.6.5).
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the buffer is device-writable (virtio 1.1 §2.6.5).
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is an indirect table (virtio 1.1 §2.6.5.3).
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
/// Avail ring flag: the driver wants no interrupts (virtio 1.1 §2.6.7).
pub const VIRTQ_AVAIL_F_NO_INTERRUPT: u16 = 1;
/// Used ring flag: the device wants no notifications (virtio 1.1 §2.6.8).
pub const VIRTQ_USED_F_NO_NOTIFY: u16 = 1;

/// The transport has no more than this many queues worth probing.
const MAX_PROBED_QUEUES: u32 = 64;

/// Errors of the mock driver. In tests they mean the device (or the test)
/// did something the driver cannot go on from.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// FEATURES_OK did not stick after writing the driver features.
    #[error("device refused FEATURES_OK (status {status:#x})")]
    FeaturesRejected {
        /// Status read back.
        status: u32,
    },
    /// DRIVER_OK did not activate the device.
    #[error("device not live after DRIVER_OK (status {status:#x})")]
    NotLive {
        /// Status read back.
        status: u32,
    },
    /// The queue index is not one the driver set up.
    #[error("queue {0} is not set up")]
    NoSuchQueue(usize),
    /// QueueNumMax is 0 for this queue, or the requested size is above it.
    #[error("queue {index} cannot have size {size} (max {max})")]
    InvalidQueueSize {
        /// Queue index.
        index: usize,
        /// Requested size.
        size: u16,
        /// QueueNumMax.
        max: u16,
    },
    /// The bump allocator ran out of guest memory.
    #[error("cannot allocate {len} bytes of guest memory")]
    OutOfGuestMemory {
        /// Requested length.
        len: u64,
    },
    /// A chain needs more descriptors than the queue has free.
    #[error("queue {queue} has {free} free descriptors, chain needs {needed}")]
    NoFreeDescriptors {
        /// Queue index.
        queue: usize,
        /// Descriptors needed.
        needed: usize,
        /// Descriptors free.
        free: usize,
    },
    /// A chain must have at least one segment.
    #[error("empty descriptor chain")]
    EmptyChain,
    /// A guest memory access failed.
    #[error("guest memory access failed")]
    Memory(#[from] GuestMemoryError),
}

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
}

/// One used-ring entry (virtio 1.1 §2.6.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsedElem {
    /// Head descriptor index of the returned chain.
    pub id: u32,
    /// Bytes the device wrote into the chain.
    pub len: u32,
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

impl QueueLayout {
    /// The same layout as the transport hands it to the queue code.
    pub fn ring_addrs(&self) -> crate::virtio::queue::RingAddrs {
        crate::virtio::queue::RingAddrs {
            size: self.size,
            desc_table: self.desc_table.raw_value(),
            avail_ring: self.avail_ring.raw_value(),
            used_ring: self.used_ring.raw_value(),
        }
    }

    fn avail_idx_addr(&self) -> GuestAddress {
        self.avail_ring.unchecked_add(2)
    }

    fn avail_slot_addr(&self, idx: u16) -> GuestAddress {
        self.avail_ring
            .unchecked_add(4 + 2 * u64::from(idx % self.size))
    }

    fn used_event_addr(&self) -> GuestAddress {
        self.avail_ring.unchecked_add(4 + 2 * u64::from(self.size))
    }

    fn used_idx_addr(&self) -> GuestAddress {
        self.used_ring.unchecked_add(2)
    }

    fn used_slot_addr(&self, idx: u16) -> GuestAddress {
        self.used_ring
            .unchecked_add(4 + 8 * u64::from(idx % self.size))
    }

    fn avail_event_addr(&self) -> GuestAddress {
        self.used_ring.unchecked_add(4 + 8 * u64::from(self.size))
    }

    fn desc_addr(&self, index: u16) -> GuestAddress {
        self.desc_table.unchecked_add(16 * u64::from(index))
    }
}

/// Driver-side state of one queue.
#[derive(Debug)]
struct DriverQueue {
    layout: QueueLayout,
    free: Vec<u16>,
    /// Descriptors of each outstanding chain, by head index.
    chains: Vec<Vec<u16>>,
    /// Next avail index to fill (ahead of the published one until `publish`).
    next_avail: u16,
    /// Used index up to which entries were returned by `used`.
    last_used: u16,
}

impl DriverQueue {
    fn new(layout: QueueLayout) -> Self {
        DriverQueue {
            layout,
            // Pop from the end, so hand out descriptors 0, 1, 2, … first.
            free: (0..layout.size).rev().collect(),
            chains: vec![Vec::new(); usize::from(layout.size)],
            next_avail: 0,
            last_used: 0,
        }
    }
}

/// A bump allocator over guest memory.
#[derive(Debug, Clone, Copy)]
struct Bump {
    next: u64,
    end: u64,
}

/// The guest side of a virtio-MMIO device, for tests and benchmarks.
#[derive(Debug)]
pub struct MockDriver {
    mem: GuestMemory,
    transport: MmioTransport,
    bump: Bump,
    queues: Vec<Option<DriverQueue>>,
}

impl MockDriver {
    /// Creates a driver that allocates from the whole of the first guest
    /// memory region.
    pub fn new(mem: GuestMemory, transport: MmioTransport) -> Result<Self, DriverError> {
        let (start, len) = mem
            .iter()
            .next()
            .map(|r| (r.start_addr(), r.len()))
            .ok_or(DriverError::OutOfGuestMemory { len: 0 })?;
        Ok(Self::with_alloc_range(mem, transport, start, len))
    }

    /// Creates a driver that allocates rings and buffers only from
    /// `[start, start + len)`, leaving the rest of guest memory to the test.
    pub fn with_alloc_range(
        mem: GuestMemory,
        transport: MmioTransport,
        start: GuestAddress,
        len: u64,
    ) -> Self {
        MockDriver {
            mem,
            transport,
            bump: Bump {
                next: start.raw_value(),
                end: start.raw_value().saturating_add(len),
            },
            queues: Vec::new(),
        }
    }

    /// Guest memory.
    pub fn mem(&self) -> &GuestMemory {
        &self.mem
    }

    /// The transport under test.
    pub fn transport(&self) -> &MmioTransport {
        &self.transport
    }

    /// The transport under test, for direct register accesses.
    pub fn transport_mut(&mut self) -> &mut MmioTransport {
        &mut self.transport
    }

    /// Reads a 32-bit register.
    pub fn read_reg(&mut self, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        self.transport.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    /// Writes a 32-bit register.
    pub fn write_reg(&mut self, offset: u64, value: u32) {
        self.transport.write(offset, &value.to_le_bytes());
    }

    /// The Status register.
    pub fn status(&mut self) -> u32 {
        self.read_reg(REG_STATUS)
    }

    /// Sets `bit` on top of the current status, as Linux's `virtio_add_status`.
    pub fn add_status(&mut self, bit: u32) {
        let s = self.status();
        self.write_reg(REG_STATUS, s | bit);
    }

    /// Reads the 64 feature bits the device offers.
    pub fn device_features(&mut self) -> u64 {
        self.write_reg(REG_DEVICE_FEATURES_SEL, 0);
        let lo = self.read_reg(REG_DEVICE_FEATURES);
        self.write_reg(REG_DEVICE_FEATURES_SEL, 1);
        let hi = self.read_reg(REG_DEVICE_FEATURES);
        u64::from(lo) | (u64::from(hi) << 32)
    }

    /// Writes the 64 driver (acked) feature bits.
    pub fn write_driver_features(&mut self, features: u64) {
        self.write_reg(REG_DRIVER_FEATURES_SEL, 0);
        self.write_reg(REG_DRIVER_FEATURES, features as u32);
        self.write_reg(REG_DRIVER_FEATURES_SEL, 1);
        self.write_reg(REG_DRIVER_FEATURES, (features >> 32) as u32);
    }

    /// Steps 1–6 of virtio 1.1 §3.1.1: reset, ACKNOWLEDGE, DRIVER, write
    /// `features` (as given, not masked) and set FEATURES_OK. Returns the
    /// device's offered features; fails if FEATURES_OK did not stick.
    pub fn negotiate(&mut self, features: u64) -> Result<u64, DriverError> {
        self.reset();
        self.add_status(status::ACKNOWLEDGE);
        self.add_status(status::DRIVER);
        let offered = self.device_features();
        self.write_driver_features(features);
        self.add_status(status::FEATURES_OK);
        let status = self.status();
        if status & status::FEATURES_OK == 0 {
            return Err(DriverError::FeaturesRejected { status });
        }
        Ok(offered)
    }

    /// Writes 0 to Status and forgets all driver-side queue state.
    pub fn reset(&mut self) {
        self.write_reg(REG_STATUS, 0);
        self.queues.clear();
    }

    /// QueueNumMax of queue `index` (0: no such queue).
    pub fn queue_num_max(&mut self, index: u32) -> u16 {
        self.write_reg(REG_QUEUE_SEL, index);
        // QueueNumMax is at most 32768 (virtio 1.1 §2.6); clamp anything else.
        u16::try_from(self.read_reg(REG_QUEUE_NUM_MAX)).unwrap_or(0)
    }

    /// Allocates the rings of queue `index` with `size` entries, programs
    /// them into the transport and sets QueueReady.
    pub fn setup_queue(&mut self, index: usize, size: u16) -> Result<QueueLayout, DriverError> {
        let sel = u32::try_from(index).map_err(|_| DriverError::NoSuchQueue(index))?;
        let max = self.queue_num_max(sel);
        if size == 0 || size > max {
            return Err(DriverError::InvalidQueueSize { index, size, max });
        }
        let n = u64::from(size);
        // Sizes and alignments of virtio 1.1 §2.6; the descriptor table is
        // page-aligned only to keep dumps readable.
        let layout = QueueLayout {
            size,
            desc_table: self.alloc(16 * n, 4096)?,
            avail_ring: self.alloc(6 + 2 * n, 2)?,
            used_ring: self.alloc(6 + 8 * n, 4)?,
        };
        self.setup_queue_at(index, layout)?;
        Ok(layout)
    }

    /// Programs queue `index` with rings wherever `layout` says, valid or
    /// not (overlapping, misaligned, at address 0...), zeroes the parts of
    /// them that are guest memory, and sets QueueReady. The driver then uses
    /// the queue as laid out, so tests can show what the device makes of
    /// any layout.
    pub fn setup_queue_at(&mut self, index: usize, layout: QueueLayout) -> Result<(), DriverError> {
        let sel = u32::try_from(index).map_err(|_| DriverError::NoSuchQueue(index))?;
        let n = usize::from(layout.size);
        // Start from a clean ring: the bump allocator may hand out memory a
        // previous (reset) queue used.
        for (addr, len) in [
            (layout.desc_table, 16 * n),
            (layout.avail_ring, 6 + 2 * n),
            (layout.used_ring, 6 + 8 * n),
        ] {
            let _ = self.mem.write_slice(&vec![0; len], addr);
        }

        self.write_reg(REG_QUEUE_SEL, sel);
        self.write_reg(REG_QUEUE_NUM, u32::from(layout.size));
        let regs = [
            (REG_QUEUE_DESC_LOW, REG_QUEUE_DESC_HIGH, layout.desc_table),
            (
                REG_QUEUE_DRIVER_LOW,
                REG_QUEUE_DRIVER_HIGH,
                layout.avail_ring,
            ),
            (
                REG_QUEUE_DEVICE_LOW,
                REG_QUEUE_DEVICE_HIGH,
                layout.used_ring,
            ),
        ];
        for (lo, hi, addr) in regs {
            self.write_reg(lo, addr.raw_value() as u32);
            self.write_reg(hi, (addr.raw_value() >> 32) as u32);
        }
        self.write_reg(REG_QUEUE_READY, 1);

        if self.queues.len() <= index {
            self.queues.resize_with(index + 1, || None);
        }
        self.queues[index] = Some(DriverQueue::new(layout));
        Ok(())
    }

    /// Sets up every queue the transport reports (QueueNumMax > 0), each
    /// with `size` entries or its QueueNumMax if `size` is `None` or larger.
    pub fn setup_queues(&mut self, size: Option<u16>) -> Result<usize, DriverError> {
        let mut count = 0;
        for sel in 0..MAX_PROBED_QUEUES {
            let max = self.queue_num_max(sel);
            if max == 0 {
                break;
            }
            let size = size.map_or(max, |s| s.min(max));
            self.setup_queue(sel as usize, size)?;
            count += 1;
        }
        Ok(count)
    }

    /// Sets DRIVER_OK and checks that the device went live.
    pub fn driver_ok(&mut self) -> Result<(), DriverError> {
        self.add_status(status::DRIVER_OK);
        let status = self.status();
        if status & status::DRIVER_OK == 0 || status & status::DEVICE_NEEDS_RESET != 0 {
            return Err(DriverError::NotLive { status });
        }
        Ok(())
    }

    /// The whole initialisation (virtio 1.1 §3.1.1) with every queue at its
    /// maximum size. Returns the device's offered features.
    pub fn init(&mut self, features: u64) -> Result<u64, DriverError> {
        self.init_with_queue_size(features, None)
    }

    /// [`init`](Self::init) with queues of at most `size` entries.
    pub fn init_with_queue_size(
        &mut self,
        features: u64,
        size: Option<u16>,
    ) -> Result<u64, DriverError> {
        let offered = self.negotiate(features)?;
        self.setup_queues(size)?;
        self.driver_ok()?;
        Ok(offered)
    }

    /// Allocates `len` bytes of guest memory aligned to `align` (a power of
    /// two). The memory is not zeroed.
    pub fn alloc(&mut self, len: u64, align: u64) -> Result<GuestAddress, DriverError> {
        let oom = DriverError::OutOfGuestMemory { len };
        let align = align.max(1);
        let start = self
            .bump
            .next
            .checked_next_multiple_of(align)
            .ok_or(DriverError::OutOfGuestMemory { len })?;
        let end = start
            .checked_add(len)
            .ok_or(DriverError::OutOfGuestMemory { len })?;
        if end > self.bump.end {
            return Err(oom);
        }
        self.bump.next = end;
        Ok(GuestAddress(start))
    }

    /// Writes `data` into guest memory at `addr`.
    pub fn write_mem(&self, addr: GuestAddress, data: &[u8]) -> Result<(), DriverError> {
        Ok(self.mem.write_slice(data, addr)?)
    }

    /// Reads `len` bytes of guest memory at `addr`.
    pub fn read_mem(&self, addr: GuestAddress, len: usize) -> Result<Vec<u8>, DriverError> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, addr)?;
        Ok(v)
    }

    /// Where queue `index` lives in guest memory.
    pub fn layout(&self, index: usize) -> Result<QueueLayout, DriverError> {
        Ok(self.queue(index)?.layout)
    }

    /// Descriptors of queue `index` not currently in an outstanding chain.
    pub fn free_descriptors(&self, index: usize) -> Result<usize, DriverError> {
        Ok(self.queue(index)?.free.len())
    }

    fn queue(&self, index: usize) -> Result<&DriverQueue, DriverError> {
        self.queues
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(DriverError::NoSuchQueue(index))
    }

    /// Writes a descriptor chain of `segments` and puts its head in the next
    /// avail slot, without publishing it. Returns the head index, which is
    /// the `id` the device returns in the used ring.
    pub fn add_chain(&mut self, index: usize, segments: &[Segment]) -> Result<u16, DriverError> {
        if segments.is_empty() {
            return Err(DriverError::EmptyChain);
        }
        self.add_descs(index, segments.len(), |i| {
            let s = segments[i];
            let flags = if s.device_writable {
                VIRTQ_DESC_F_WRITE
            } else {
                0
            };
            (s.addr, s.len, flags)
        })
    }

    /// [`add_chain`](Self::add_chain) with the segments after the first
    /// `direct` in an indirect table written at `table` (16 bytes per
    /// segment; VIRTIO_RING_F_INDIRECT_DESC must be negotiated). The table
    /// takes one descriptor of the ring; it must stay untouched until the
    /// chain is used.
    pub fn add_chain_indirect(
        &mut self,
        index: usize,
        segments: &[Segment],
        direct: usize,
        table: GuestAddress,
    ) -> Result<u16, DriverError> {
        let direct = direct.min(segments.len());
        let rest = &segments[direct..];
        if rest.is_empty() {
            return self.add_chain(index, segments);
        }
        for (i, s) in rest.iter().enumerate() {
            let mut flags = if s.device_writable {
                VIRTQ_DESC_F_WRITE
            } else {
                0
            };
            if i + 1 < rest.len() {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            let next = if i + 1 < rest.len() { i as u16 + 1 } else { 0 };
            self.mem.write_slice(
                &desc_bytes(s.addr, s.len, flags, next),
                table.unchecked_add(16 * i as u64),
            )?;
        }
        // A table too long for the field is one the device refuses anyway.
        let len = u32::try_from(16 * rest.len()).unwrap_or(u32::MAX);
        self.add_descs(index, direct + 1, |i| {
            if i < direct {
                let s = segments[i];
                let flags = if s.device_writable {
                    VIRTQ_DESC_F_WRITE
                } else {
                    0
                };
                (s.addr, s.len, flags)
            } else {
                (table, len, VIRTQ_DESC_F_INDIRECT)
            }
        })
    }

    /// The head the next chain of queue `index` will get (the descriptor
    /// the driver hands out next), if any is free.
    pub fn next_head(&self, index: usize) -> Option<u16> {
        self.queue(index).ok()?.free.last().copied()
    }

    /// Writes `n` descriptors `desc(0..n)` (address, length, flags; NEXT is
    /// added) from the free list and puts the head in the next avail slot.
    fn add_descs(
        &mut self,
        index: usize,
        n: usize,
        desc: impl Fn(usize) -> (GuestAddress, u32, u16),
    ) -> Result<u16, DriverError> {
        // Borrow the fields apart: cloning `mem` would allocate on every
        // chain, which the benchmark harness would then measure.
        let mem = &self.mem;
        let q = queue_in(&mut self.queues, index)?;
        let Some(&head) = q.free.last().filter(|_| q.free.len() >= n) else {
            return Err(DriverError::NoFreeDescriptors {
                queue: index,
                needed: n,
                free: q.free.len(),
            });
        };
        // A free head's chain vector is empty but keeps its capacity, so
        // steady-state submission does not allocate.
        let mut chain = std::mem::take(&mut q.chains[usize::from(head)]);
        chain.clear();
        for _ in 0..n {
            chain.extend(q.free.pop());
        }
        for (i, &d) in chain.iter().enumerate() {
            let next = chain.get(i + 1).copied();
            let (addr, len, mut flags) = desc(i);
            if next.is_some() {
                flags |= VIRTQ_DESC_F_NEXT;
            }
            let raw = desc_bytes(addr, len, flags, next.unwrap_or(0));
            if let Err(e) = mem.write_slice(&raw, q.layout.desc_addr(d)) {
                // Give the descriptors back so the queue stays consistent.
                q.free.extend(chain.drain(..).rev());
                q.chains[usize::from(head)] = chain;
                return Err(e.into());
            }
        }
        q.chains[usize::from(head)] = chain;
        mem.write_obj(head.to_le(), q.layout.avail_slot_addr(q.next_avail))?;
        q.next_avail = q.next_avail.wrapping_add(1);
        Ok(head)
    }

    /// Makes every chain added so far visible to the device (avail idx store
    /// with release ordering, after the ring writes).
    pub fn publish(&mut self, index: usize) -> Result<(), DriverError> {
        let q = self.queue(index)?;
        fence(Ordering::SeqCst);
        self.mem.store(
            q.next_avail.to_le(),
            q.layout.avail_idx_addr(),
            Ordering::Release,
        )?;
        Ok(())
    }

    /// Notifies queue `index` through the QueueNotify register.
    pub fn kick(&mut self, index: usize) {
        self.write_reg(QUEUE_NOTIFY_OFFSET, index as u32);
    }

    /// [`add_chain`](Self::add_chain), [`publish`](Self::publish) and
    /// [`kick`](Self::kick) in one call.
    pub fn submit(&mut self, index: usize, segments: &[Segment]) -> Result<u16, DriverError> {
        let head = self.add_chain(index, segments)?;
        self.publish(index)?;
        self.kick(index);
        Ok(head)
    }

    /// The avail idx the driver has published.
    pub fn avail_idx(&self, index: usize) -> Result<u16, DriverError> {
        let q = self.queue(index)?;
        Ok(u16::from_le(
            self.mem
                .load(q.layout.avail_idx_addr(), Ordering::Acquire)?,
        ))
    }

    /// The device's used idx.
    pub fn used_idx(&self, index: usize) -> Result<u16, DriverError> {
        let q = self.queue(index)?;
        Ok(u16::from_le(
            self.mem.load(q.layout.used_idx_addr(), Ordering::Acquire)?,
        ))
    }

    /// Used-ring entries added since the last call, oldest first. Their
    /// chains' descriptors become free for reuse.
    pub fn used(&mut self, index: usize) -> Result<Vec<UsedElem>, DriverError> {
        let mut out = Vec::new();
        self.used_into(index, &mut out)?;
        Ok(out)
    }

    /// [`used`](Self::used) appending to `out`, for loops that should not
    /// allocate. Returns how many entries were appended.
    pub fn used_into(
        &mut self,
        index: usize,
        out: &mut Vec<UsedElem>,
    ) -> Result<usize, DriverError> {
        let used_idx = self.used_idx(index)?;
        let mem = &self.mem;
        let q = queue_in(&mut self.queues, index)?;
        let before = out.len();
        while q.last_used != used_idx {
            let slot = q.layout.used_slot_addr(q.last_used);
            let id = u32::from_le(mem.read_obj(slot)?);
            let len = u32::from_le(mem.read_obj(slot.unchecked_add(4))?);
            // An id that is not an outstanding head is a device bug; the test
            // sees it in the returned entry, the driver frees nothing.
            if let Some(chain) = usize::try_from(id).ok().and_then(|i| q.chains.get_mut(i)) {
                q.free.extend(chain.drain(..).rev());
            }
            out.push(UsedElem { id, len });
            q.last_used = q.last_used.wrapping_add(1);
        }
        Ok(out.len() - before)
    }

    /// The used ring's flags (VIRTQ_USED_F_NO_NOTIFY).
    pub fn used_flags(&self, index: usize) -> Result<u16, DriverError> {
        let q = self.queue(index)?;
        Ok(u16::from_le(self.mem.read_obj(q.layout.used_ring)?))
    }

    /// Sets the avail ring's flags (VIRTQ_AVAIL_F_NO_INTERRUPT).
    pub fn set_avail_flags(&mut self, index: usize, flags: u16) -> Result<(), DriverError> {
        let q = self.queue(index)?;
        Ok(self.mem.write_obj(flags.to_le(), q.layout.avail_ring)?)
    }

    /// The `avail_event` field the device writes at the end of the used ring
    /// (EVENT_IDX, virtio 1.1 §2.6.10).
    pub fn avail_event(&self, index: usize) -> Result<u16, DriverError> {
        let q = self.queue(index)?;
        Ok(u16::from_le(
            self.mem
                .load(q.layout.avail_event_addr(), Ordering::Acquire)?,
        ))
    }

    /// The `used_event` field at the end of the avail ring.
    pub fn used_event(&self, index: usize) -> Result<u16, DriverError> {
        let q = self.queue(index)?;
        Ok(u16::from_le(
            self.mem
                .load(q.layout.used_event_addr(), Ordering::Acquire)?,
        ))
    }

    /// Sets `used_event`: with EVENT_IDX the driver wants an interrupt only
    /// once the device's used idx passes this value.
    pub fn set_used_event(&mut self, index: usize, value: u16) -> Result<(), DriverError> {
        let q = self.queue(index)?;
        self.mem
            .store(value.to_le(), q.layout.used_event_addr(), Ordering::Release)?;
        Ok(())
    }

    /// The InterruptStatus register.
    pub fn interrupt_status(&mut self) -> u32 {
        self.read_reg(REG_INTERRUPT_STATUS)
    }

    /// Writes `bits` to InterruptACK.
    pub fn ack_interrupt(&mut self, bits: u32) {
        self.write_reg(REG_INTERRUPT_ACK, bits);
    }

    /// Consumes the interrupt eventfd's counter: how many times the device
    /// signalled since the last call (0 if none).
    pub fn take_irq_count(&self) -> u64 {
        self.transport.interrupt_evt().read().unwrap_or(0)
    }
}

/// `struct virtq_desc { le64 addr; le32 len; le16 flags; le16 next; }`
fn desc_bytes(addr: GuestAddress, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut raw = [0u8; 16];
    raw[0..8].copy_from_slice(&addr.raw_value().to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&flags.to_le_bytes());
    raw[14..16].copy_from_slice(&next.to_le_bytes());
    raw
}

fn queue_in(
    queues: &mut [Option<DriverQueue>],
    index: usize,
) -> Result<&mut DriverQueue, DriverError> {
    queues
        .get_mut(index)
        .and_then(Option::as_mut)
        .ok_or(DriverError::NoSuchQueue(index))
}

/// A device that does nothing but record what the transport did to it.
pub struct DummyDevice {
    /// Reported device ID.
    pub device_type: u32,
    /// Offered features.
    pub avail_features: u64,
    /// QueueNumMax of each queue.
    pub max_sizes: Vec<u16>,
    /// One notification eventfd per queue.
    pub queue_evts: Vec<EventFd>,
    /// Configuration space contents.
    pub config: Vec<u8>,
    /// Make `activate` fail.
    pub fail_activate: bool,
    /// Calls to `activate`.
    pub activate_calls: usize,
    /// Calls to `reset`.
    pub reset_calls: usize,
    /// Features passed to the last `activate`.
    pub acked_features: u64,
    /// Queues passed to the last `activate`.
    pub queues: Vec<SplitQueue>,
    /// Interrupt passed to the last `activate`.
    pub interrupt: Option<Arc<dyn Interrupt>>,
}

impl std::fmt::Debug for DummyDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DummyDevice")
            .field("device_type", &self.device_type)
            .field("activate_calls", &self.activate_calls)
            .field("reset_calls", &self.reset_calls)
            .field("acked_features", &self.acked_features)
            .finish_non_exhaustive()
    }
}

impl DummyDevice {
    /// Device ID 0x1234, features VERSION_1 | EVENT_IDX | bit 0, queues of
    /// 256 and 64 entries, 16 bytes of config space holding 0, 1, 2, ….
    pub fn new() -> std::io::Result<Self> {
        let max_sizes = vec![256, 64];
        let queue_evts = max_sizes
            .iter()
            .map(|_| EventFd::new(libc::EFD_NONBLOCK))
            .collect::<std::io::Result<_>>()?;
        Ok(DummyDevice {
            device_type: 0x1234,
            avail_features: (1 << 32) | (1 << 29) | 1,
            max_sizes,
            queue_evts,
            config: (0..16).collect(),
            fail_activate: false,
            activate_calls: 0,
            reset_calls: 0,
            acked_features: 0,
            queues: Vec::new(),
            interrupt: None,
        })
    }
}

impl VirtioDevice for DummyDevice {
    fn device_type(&self) -> u32 {
        self.device_type
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.max_sizes
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let Some(src) = usize::try_from(offset)
            .ok()
            .and_then(|o| self.config.get(o..o.checked_add(data.len())?))
        else {
            return;
        };
        data.copy_from_slice(src);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if let Some(dst) = usize::try_from(offset)
            .ok()
            .and_then(|o| self.config.get_mut(o..o.checked_add(data.len())?))
        {
            dst.copy_from_slice(data);
        }
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn activate(
        &mut self,
        acked_features: u64,
        queues: Vec<SplitQueue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        self.activate_calls += 1;
        if self.fail_activate {
            return Err(ActivateError::Backend("dummy told to fail".into()));
        }
        self.acked_features = acked_features;
        self.queues = queues;
        self.interrupt = Some(interrupt);
        Ok(())
    }

    fn reset(&mut self) {
        self.reset_calls += 1;
        self.queues.clear();
        self.interrupt = None;
    }
}

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

/// xorshift64*: reproducible randomness without a dependency, for the soak
/// tests and the fuzz targets' random replay. The seed must not be 0.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// True once in `one_in` draws (never for 0).
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.next_u64().checked_rem(one_in) == Some(0)
    }
}

/// Guest memory of `size` bytes at address 0, for tests.
pub fn guest_memory(size: usize) -> Result<GuestMemory, vm_memory::mmap::FromRangesError> {
    GuestMemory::from_ranges(&[(GuestAddress(0), size)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use virtio_queue::{Queue, QueueOwnedT, QueueT};

    /// virtio-queue's view of a queue the transport activated: an
    /// independent reading of the same rings.
    fn oracle(q: &SplitQueue) -> Queue {
        let a = q.addrs();
        let mut o = Queue::new(a.size).unwrap();
        o.set_size(a.size);
        o.try_set_desc_table_address(GuestAddress(a.desc_table))
            .unwrap();
        o.try_set_avail_ring_address(GuestAddress(a.avail_ring))
            .unwrap();
        o.try_set_used_ring_address(GuestAddress(a.used_ring))
            .unwrap();
        o.set_event_idx(q.features().event_idx);
        o.set_ready(true);
        o
    }

    #[test]
    fn driver_chain_reaches_device_and_used_ring_comes_back() {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut drv = MockDriver::new(mem.clone(), t).unwrap();
        drv.init_with_queue_size(1 << 32, Some(8)).unwrap();

        let a = drv.alloc(100, 8).unwrap();
        let b = drv.alloc(200, 8).unwrap();
        drv.write_mem(a, b"hello").unwrap();
        let head = drv
            .submit(1, &[Segment::readable(a, 5), Segment::writable(b, 200)])
            .unwrap();
        assert_eq!(drv.free_descriptors(1).unwrap(), 6);
        assert_eq!(dev.lock().unwrap().queue_evts[1].read().unwrap(), 1);

        // Device side: pop the chain with virtio-queue and return it.
        let d = dev.lock().unwrap();
        let q = &mut oracle(&d.queues[1]);
        let chain = q.iter(&mem).unwrap().next().unwrap();
        let descs: Vec<_> = chain.clone().collect();
        assert_eq!(descs.len(), 2);
        assert_eq!(descs[0].addr(), a);
        assert_eq!(descs[0].len(), 5);
        assert!(!descs[0].is_write_only());
        assert_eq!(descs[1].addr(), b);
        assert!(descs[1].is_write_only());
        q.add_used(&mem, chain.head_index(), 42).unwrap();
        drop(d);

        assert_eq!(
            drv.used(1).unwrap(),
            vec![UsedElem {
                id: u32::from(head),
                len: 42
            }]
        );
        assert!(drv.used(1).unwrap().is_empty());
        assert_eq!(drv.free_descriptors(1).unwrap(), 8);
    }

    #[test]
    fn indirect_chain_reaches_device_and_frees_one_ring_descriptor() {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        dev.lock().unwrap().avail_features |= 1 << 28;
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut drv = MockDriver::new(mem.clone(), t).unwrap();
        drv.init_with_queue_size(1 << 32 | 1 << 28, Some(8))
            .unwrap();

        let bufs: Vec<GuestAddress> = (0..4).map(|_| drv.alloc(64, 8).unwrap()).collect();
        let table = drv.alloc(48, 16).unwrap();
        let segs = [
            Segment::readable(bufs[0], 12),
            Segment::readable(bufs[1], 20),
            Segment::readable(bufs[2], 0),
            Segment::readable(bufs[3], 30),
        ];
        assert_eq!(drv.next_head(1), Some(0));
        let head = drv.add_chain_indirect(1, &segs, 1, table).unwrap();
        assert_eq!(head, 0);
        drv.publish(1).unwrap();
        // One direct descriptor and the one pointing to the table.
        assert_eq!(drv.free_descriptors(1).unwrap(), 6);
        assert_eq!(drv.next_head(1), Some(2));

        let d = dev.lock().unwrap();
        let q = &mut oracle(&d.queues[1]);
        let chain = q.iter(&mem).unwrap().next().unwrap();
        let got: Vec<_> = chain.clone().map(|d| (d.addr(), d.len())).collect();
        let want: Vec<_> = segs.iter().map(|s| (s.addr, s.len)).collect();
        assert_eq!(got, want);
        q.add_used(&mem, chain.head_index(), 0).unwrap();
        drop(d);
        assert_eq!(drv.used(1).unwrap().len(), 1);
        assert_eq!(drv.free_descriptors(1).unwrap(), 8);
    }

    #[test]
    fn descriptors_recycle_across_many_chains() {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut drv = MockDriver::new(mem.clone(), t).unwrap();
        drv.init_with_queue_size(1 << 32, Some(4)).unwrap();
        let buf = drv.alloc(64, 8).unwrap();
        let mut q = oracle(&dev.lock().unwrap().queues[0]);
        // 3 × size chains of 2 descriptors wrap the avail and used rings.
        for i in 0..12u32 {
            drv.submit(0, &[Segment::readable(buf, 1), Segment::writable(buf, 2)])
                .unwrap();
            let chain = q.iter(&mem).unwrap().next().unwrap();
            q.add_used(&mem, chain.head_index(), i).unwrap();
            let used = drv.used(0).unwrap();
            assert_eq!(used.len(), 1);
            assert_eq!(used[0].len, i);
        }
        assert_eq!(drv.free_descriptors(0).unwrap(), 4);
        assert_eq!(drv.used_idx(0).unwrap(), 12);
        assert_eq!(drv.avail_idx(0).unwrap(), 12);
    }

    #[test]
    fn out_of_order_completion_frees_the_right_descriptors() {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut drv = MockDriver::new(mem.clone(), t).unwrap();
        drv.init_with_queue_size(1 << 32, Some(4)).unwrap();
        let s = Segment::writable(GuestAddress(0x1000), 1);
        let a = drv.add_chain(0, &[s, s]).unwrap();
        let b = drv.add_chain(0, &[s]).unwrap();
        drv.publish(0).unwrap();
        assert_eq!((a, b), (0, 2));
        {
            let mut d = dev.lock().unwrap();
            let q = &mut d.queues[0];
            q.add_used(b, 1);
            q.publish_used();
        }
        assert_eq!(drv.used(0).unwrap(), vec![UsedElem { id: 2, len: 1 }]);
        assert_eq!(drv.free_descriptors(0).unwrap(), 2);
        // Only descriptors 2 and 3 are free: a 3-descriptor chain must wait.
        assert!(drv.add_chain(0, &[s, s, s]).is_err());
        let c = drv.add_chain(0, &[s, s]).unwrap();
        assert_eq!(c, 2);
        let desc = drv.layout(0).unwrap().desc_table;
        // Descriptor 2, returned with `b`, heads the new chain and links to 3.
        let next: u16 = mem.read_obj(desc.unchecked_add(16 * 2 + 14)).unwrap();
        assert_eq!(next, 3);
    }

    #[test]
    fn chain_larger_than_free_descriptors_is_refused() {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev).unwrap();
        let mut drv = MockDriver::new(mem, t).unwrap();
        drv.init_with_queue_size(1 << 32, Some(2)).unwrap();
        let s = Segment::readable(GuestAddress(0), 1);
        assert!(matches!(
            drv.add_chain(0, &[s, s, s]),
            Err(DriverError::NoFreeDescriptors {
                needed: 3,
                free: 2,
                ..
            })
        ));
        assert!(matches!(
            drv.add_chain(0, &[]),
            Err(DriverError::EmptyChain)
        ));
        assert!(matches!(
            drv.add_chain(5, &[s]),
            Err(DriverError::NoSuchQueue(5))
        ));
    }

    #[test]
    fn event_idx_fields_are_where_the_device_looks() {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut drv = MockDriver::new(mem.clone(), t).unwrap();
        drv.init_with_queue_size((1 << 32) | (1 << 29), Some(16))
            .unwrap();
        drv.set_used_event(0, 7).unwrap();
        assert_eq!(drv.used_event(0).unwrap(), 7);
        for _ in 0..5 {
            drv.submit(0, &[Segment::readable(GuestAddress(0), 1)])
                .unwrap();
        }
        let mut d = dev.lock().unwrap();
        let q = &mut d.queues[0];
        assert!(q.features().event_idx);
        let mut budget = crate::virtio::queue::Budget::new(100);
        while q.pop(&mut budget).unwrap().is_some() {}
        // With EVENT_IDX, re-enabling notifications asks for a kick at the
        // next entry the device has not seen.
        assert!(!q.enable_notifications().unwrap());
        drop(d);
        assert_eq!(drv.avail_event(0).unwrap(), 5);
    }

    #[test]
    fn bump_allocator_aligns_and_runs_out() {
        let mem = guest_memory(0x10000).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev).unwrap();
        let mut drv = MockDriver::with_alloc_range(mem, t, GuestAddress(0x1001), 0x2000);
        assert_eq!(drv.alloc(3, 1).unwrap(), GuestAddress(0x1001));
        assert_eq!(drv.alloc(8, 64).unwrap(), GuestAddress(0x1040));
        assert!(matches!(
            drv.alloc(0x2000, 1),
            Err(DriverError::OutOfGuestMemory { len: 0x2000 })
        ));
        assert!(matches!(drv.alloc(1, 0), Ok(GuestAddress(0x1048))));
    }
}
