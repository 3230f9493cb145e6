// SPDX-License-Identifier: Apache-2.0
//! [`MockDriver`]: the guest's side of a virtio-MMIO device at the register
//! level, for tests and benchmarks (see the parent module).

use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::{DriverError, DriverQueue, QueueLayout, Segment, UsedElem};
use crate::virtio::mmio::{
    MmioTransport, QUEUE_NOTIFY_OFFSET, REG_DEVICE_FEATURES, REG_DEVICE_FEATURES_SEL,
    REG_DRIVER_FEATURES, REG_DRIVER_FEATURES_SEL, REG_INTERRUPT_ACK, REG_INTERRUPT_STATUS,
    REG_QUEUE_DESC_HIGH, REG_QUEUE_DESC_LOW, REG_QUEUE_DEVICE_HIGH, REG_QUEUE_DEVICE_LOW,
    REG_QUEUE_DRIVER_HIGH, REG_QUEUE_DRIVER_LOW, REG_QUEUE_NUM, REG_QUEUE_NUM_MAX, REG_QUEUE_READY,
    REG_QUEUE_SEL, REG_STATUS,
};
use crate::virtio::{status, GuestMemory};

/// The transport has no more than this many queues worth probing.
const MAX_PROBED_QUEUES: u32 = 64;

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
    /// The guest's side of each queue set up, by index.
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
        // Start from a clean ring: the bump allocator may hand out memory a
        // previous (reset) queue used.
        self.queues[index] = Some(DriverQueue::zeroed(&self.mem, layout));
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
        Ok(self.queue(index)?.layout())
    }

    /// Descriptors of queue `index` not currently in an outstanding chain.
    pub fn free_descriptors(&self, index: usize) -> Result<usize, DriverError> {
        Ok(self.queue(index)?.free_descriptors())
    }

    /// The guest's side of queue `index`.
    pub fn queue(&self, index: usize) -> Result<&DriverQueue, DriverError> {
        self.queues
            .get(index)
            .and_then(Option::as_ref)
            .ok_or(DriverError::NoSuchQueue(index))
    }

    /// The guest's side of queue `index`, and guest memory to write it in.
    pub fn queue_mut(
        &mut self,
        index: usize,
    ) -> Result<(&mut DriverQueue, &GuestMemory), DriverError> {
        let q = self
            .queues
            .get_mut(index)
            .and_then(Option::as_mut)
            .ok_or(DriverError::NoSuchQueue(index))?;
        Ok((q, &self.mem))
    }

    /// [`DriverQueue::add_chain`] on queue `index`.
    pub fn add_chain(&mut self, index: usize, segments: &[Segment]) -> Result<u16, DriverError> {
        let (q, mem) = self.queue_mut(index)?;
        q.add_chain(mem, segments)
    }

    /// [`DriverQueue::add_chain_indirect`] on queue `index`.
    pub fn add_chain_indirect(
        &mut self,
        index: usize,
        segments: &[Segment],
        direct: usize,
        table: GuestAddress,
    ) -> Result<u16, DriverError> {
        let (q, mem) = self.queue_mut(index)?;
        q.add_chain_indirect(mem, segments, direct, table)
    }

    /// The head the next chain of queue `index` will get (the descriptor
    /// the driver hands out next), if any is free.
    pub fn next_head(&self, index: usize) -> Option<u16> {
        self.queue(index).ok()?.next_head()
    }

    /// Makes every chain added to queue `index` so far visible to the
    /// device.
    pub fn publish(&mut self, index: usize) -> Result<(), DriverError> {
        self.queue(index)?.publish(&self.mem)
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

    /// The avail idx the driver has published on queue `index`.
    pub fn avail_idx(&self, index: usize) -> Result<u16, DriverError> {
        self.queue(index)?.avail_idx(&self.mem)
    }

    /// The device's used idx of queue `index`.
    pub fn used_idx(&self, index: usize) -> Result<u16, DriverError> {
        self.queue(index)?.used_idx(&self.mem)
    }

    /// [`DriverQueue::used`] on queue `index`.
    pub fn used(&mut self, index: usize) -> Result<Vec<UsedElem>, DriverError> {
        let (q, mem) = self.queue_mut(index)?;
        q.used(mem)
    }

    /// [`DriverQueue::used_into`] on queue `index`.
    pub fn used_into(
        &mut self,
        index: usize,
        out: &mut Vec<UsedElem>,
    ) -> Result<usize, DriverError> {
        let (q, mem) = self.queue_mut(index)?;
        q.used_into(mem, out)
    }

    /// The used ring's flags of queue `index` (VIRTQ_USED_F_NO_NOTIFY).
    pub fn used_flags(&self, index: usize) -> Result<u16, DriverError> {
        self.queue(index)?.used_flags(&self.mem)
    }

    /// Sets the avail ring's flags of queue `index`
    /// (VIRTQ_AVAIL_F_NO_INTERRUPT).
    pub fn set_avail_flags(&mut self, index: usize, flags: u16) -> Result<(), DriverError> {
        self.queue(index)?.set_avail_flags(&self.mem, flags)
    }

    /// The `avail_event` field of queue `index` (EVENT_IDX, virtio 1.1
    /// §2.6.10).
    pub fn avail_event(&self, index: usize) -> Result<u16, DriverError> {
        self.queue(index)?.avail_event(&self.mem)
    }

    /// The `used_event` field of queue `index`.
    pub fn used_event(&self, index: usize) -> Result<u16, DriverError> {
        self.queue(index)?.used_event(&self.mem)
    }

    /// Sets `used_event` of queue `index`.
    pub fn set_used_event(&mut self, index: usize, value: u16) -> Result<(), DriverError> {
        self.queue(index)?.set_used_event(&self.mem, value)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::queue::SplitQueue;
    use crate::virtio::test_utils::{guest_memory, DummyDevice};
    use std::sync::{Arc, Mutex};
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

    /// A driver that acked `features` (the dummy device offers them on top
    /// of its own) with queues of `size`, and the device behind it.
    fn initialised(features: u64, size: u16) -> (GuestMemory, Arc<Mutex<DummyDevice>>, MockDriver) {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        dev.lock().unwrap().common.avail_features |= features;
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut drv = MockDriver::new(mem.clone(), t).unwrap();
        drv.init_with_queue_size(features, Some(size)).unwrap();
        (mem, dev, drv)
    }

    #[test]
    fn driver_chain_reaches_device_and_used_ring_comes_back() {
        let (mem, dev, mut drv) = initialised(1 << 32, 8);

        let a = drv.alloc(100, 8).unwrap();
        let b = drv.alloc(200, 8).unwrap();
        drv.write_mem(a, b"hello").unwrap();
        let head = drv
            .submit(1, &[Segment::readable(a, 5), Segment::writable(b, 200)])
            .unwrap();
        assert_eq!(drv.free_descriptors(1).unwrap(), 6);
        assert_eq!(dev.lock().unwrap().common.queue_evts[1].read().unwrap(), 1);

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
        let (mem, dev, mut drv) = initialised(1 << 32 | 1 << 28, 8);

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
        let (mem, dev, mut drv) = initialised(1 << 32, 4);
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
        let (mem, dev, mut drv) = initialised(1 << 32, 4);
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
        let (_, _, mut drv) = initialised(1 << 32, 2);
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
        let (_, dev, mut drv) = initialised((1 << 32) | (1 << 29), 16);
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
