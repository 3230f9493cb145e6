// SPDX-License-Identifier: Apache-2.0
//! Driver-side test harness for the network device (tests only).
//!
//! [`TestQueue`] plays the guest driver: it lays out a split virtqueue in
//! guest memory, writes descriptors and avail entries, and reads the used
//! ring, all through plain guest-memory accesses so tests can also write the
//! malformed chains a driver never should. [`Harness`] wires a [`Net`] over a
//! `SOCK_SEQPACKET` pair to an `EventManager`, activates it the way the
//! transport does, and gives tests the peer end of the socket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use event_manager::{EventManager, SubscriberOps};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryMmap};

use super::device::features::*;
use super::device::Net;
use super::metrics::NetMetrics;
use super::tap::SeqPacket;
use super::{NetConfig, RX_INDEX, TX_INDEX, VNET_HDR_LEN};
use crate::virtio::queue::{GuestRegions, RingAddrs, RingFeatures, SplitQueue};
use crate::virtio::{GuestMemory, Interrupt, VirtioDevice};

/// VRING_DESC_F_NEXT (virtio 1.1 §2.6.5).
pub const F_NEXT: u16 = 1;
/// VRING_DESC_F_WRITE.
pub const F_WRITE: u16 = 2;

/// VRING_DESC_F_INDIRECT.
pub const F_INDIRECT: u16 = 4;
/// VIRTIO_RING_F_EVENT_IDX as a feature bit.
pub const RING_EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
/// VIRTIO_RING_F_INDIRECT_DESC as a feature bit.
pub const RING_INDIRECT: u64 = 1 << VIRTIO_RING_F_INDIRECT_DESC;

/// Size of the test guest memory.
pub const MEM_SIZE: u64 = 64 << 20;

/// A split virtqueue seen from the driver.
pub struct TestQueue {
    pub size: u16,
    desc: GuestAddress,
    avail: GuestAddress,
    used: GuestAddress,
    next_desc: u16,
    avail_idx: u16,
    /// Used entries already consumed by `take_used`.
    pub used_seen: u16,
}

impl TestQueue {
    /// A queue wherever `a` says (overlapping, at 0, anything), its parts
    /// zeroed where they are guest memory.
    pub fn with_addrs(mem: &GuestMemory, a: RingAddrs) -> Self {
        for (_, addr, len) in a.areas() {
            let _ = mem.write_slice(&vec![0u8; len as usize], GuestAddress(addr));
        }
        TestQueue {
            size: a.size,
            desc: GuestAddress(a.desc_table),
            avail: GuestAddress(a.avail_ring),
            used: GuestAddress(a.used_ring),
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    pub fn new(mem: &GuestMemory, base: GuestAddress, size: u16) -> Self {
        let desc = base;
        let avail = desc.unchecked_add(16 * u64::from(size));
        let used = GuestAddress((avail.0 + 6 + 2 * u64::from(size) + 3) & !3);
        let end = used.0 + 6 + 8 * u64::from(size);
        mem.write_slice(&vec![0u8; (end - base.0) as usize], base)
            .unwrap();
        TestQueue {
            size,
            desc,
            avail,
            used,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// Where the rings are.
    pub fn addrs(&self) -> RingAddrs {
        RingAddrs {
            size: self.size,
            desc_table: self.desc.0,
            avail_ring: self.avail.0,
            used_ring: self.used.0,
        }
    }

    /// The device-side queue the transport would hand over with `features`
    /// acked (EVENT_IDX and INDIRECT_DESC are taken from them).
    pub fn create_queue(&self, mem: &GuestMemory, features: u64) -> SplitQueue {
        queue_at(mem, self.addrs(), features)
    }

    /// Writes descriptor `idx` as given.
    pub fn write_desc(
        &self,
        mem: &GuestMemory,
        idx: u16,
        addr: u64,
        len: u32,
        flags: u16,
        next: u16,
    ) {
        let a = self.desc.unchecked_add(16 * u64::from(idx));
        mem.write_obj(addr, a).unwrap();
        mem.write_obj(len, a.unchecked_add(8)).unwrap();
        mem.write_obj(flags, a.unchecked_add(12)).unwrap();
        mem.write_obj(next, a.unchecked_add(14)).unwrap();
    }

    /// Writes a chain of `(addr, len, flags)` descriptors (NEXT is added)
    /// into free table slots and returns its head, without publishing it.
    pub fn write_chain(&mut self, mem: &GuestMemory, descs: &[(u64, u32, u16)]) -> u16 {
        let idxs: Vec<u16> = (0..descs.len())
            .map(|i| (self.next_desc + i as u16) % self.size)
            .collect();
        self.next_desc = (self.next_desc + descs.len() as u16) % self.size;
        for (i, &(addr, len, flags)) in descs.iter().enumerate() {
            let last = i + 1 == descs.len();
            let (flags, next) = if last {
                (flags & !F_NEXT, 0)
            } else {
                (flags | F_NEXT, idxs[i + 1])
            };
            self.write_desc(mem, idxs[i], addr, len, flags, next);
        }
        idxs[0]
    }

    /// The table slot the next `write_chain` starts at.
    pub fn next_desc(&self) -> u16 {
        self.next_desc
    }

    /// Makes `head` available to the device.
    pub fn publish(&mut self, mem: &GuestMemory, head: u16) {
        let slot = self.avail_idx % self.size;
        mem.write_obj(head, self.avail.unchecked_add(4 + 2 * u64::from(slot)))
            .unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        mem.write_obj(self.avail_idx, self.avail.unchecked_add(2))
            .unwrap();
    }

    /// Writes and publishes a chain; returns its head.
    pub fn add_chain(&mut self, mem: &GuestMemory, descs: &[(u64, u32, u16)]) -> u16 {
        let head = self.write_chain(mem, descs);
        self.publish(mem, head);
        head
    }

    /// The device's used index.
    pub fn used_idx(&self, mem: &GuestMemory) -> u16 {
        mem.read_obj(self.used.unchecked_add(2)).unwrap()
    }

    /// Used ring flags (VRING_USED_F_NO_NOTIFY = 1).
    pub fn used_flags(&self, mem: &GuestMemory) -> u16 {
        mem.read_obj(self.used).unwrap()
    }

    /// `avail_event`, written by the device with EVENT_IDX.
    pub fn avail_event(&self, mem: &GuestMemory) -> u16 {
        mem.read_obj(self.used.unchecked_add(4 + 8 * u64::from(self.size)))
            .unwrap()
    }

    /// Sets `used_event`: the driver wants an interrupt once the used index
    /// passes this value.
    pub fn set_used_event(&self, mem: &GuestMemory, v: u16) {
        mem.write_obj(v, self.avail.unchecked_add(4 + 2 * u64::from(self.size)))
            .unwrap();
    }

    /// Returns the used entries `(id, len)` the test has not seen yet.
    pub fn take_used(&mut self, mem: &GuestMemory) -> Vec<(u32, u32)> {
        let idx = self.used_idx(mem);
        let mut out = Vec::new();
        while self.used_seen != idx {
            let slot = u64::from(self.used_seen % self.size);
            let e = self.used.unchecked_add(4 + 8 * slot);
            out.push((
                mem.read_obj(e).unwrap(),
                mem.read_obj(e.unchecked_add(4)).unwrap(),
            ));
            self.used_seen = self.used_seen.wrapping_add(1);
        }
        out
    }
}

/// A device-side queue at `addrs`, validated as the transport does it
/// (without the overlap check, so tests can build what it refuses).
pub fn queue_at(mem: &GuestMemory, addrs: RingAddrs, features: u64) -> SplitQueue {
    let regions = Arc::new(GuestRegions::new(mem).unwrap());
    SplitQueue::new(
        regions,
        addrs,
        addrs.size.max(256),
        RingFeatures::from_bits(features),
    )
    .unwrap()
}

/// Counts used-buffer interrupts and device-error reports.
#[derive(Default)]
pub struct TestIrq {
    pub used: AtomicU64,
    pub config: AtomicU64,
    pub device_errors: AtomicU64,
}

impl TestIrq {
    pub fn count(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

impl Interrupt for TestIrq {
    fn signal_used_queue(&self) {
        self.used.fetch_add(1, Ordering::SeqCst);
    }
    fn signal_config_change(&self) {
        self.config.fetch_add(1, Ordering::SeqCst);
    }
    fn signal_device_error(&self) {
        self.device_errors.fetch_add(1, Ordering::SeqCst);
    }
}

/// The feature set a modern Linux guest acks with offloads off.
pub const BASE_FEATURES: u64 =
    1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MAC | 1 << VIRTIO_NET_F_STATUS;
/// BASE_FEATURES plus MRG_RXBUF.
pub const MRG_FEATURES: u64 = BASE_FEATURES | 1 << VIRTIO_NET_F_MRG_RXBUF;
/// Guest receive offloads that allow 64 KiB frames.
pub const GUEST_GSO: u64 =
    1 << VIRTIO_NET_F_GUEST_CSUM | 1 << VIRTIO_NET_F_GUEST_TSO4 | 1 << VIRTIO_NET_F_GUEST_TSO6;

/// A device over a socket pair, driven from the driver side.
pub struct Harness {
    pub mem: GuestMemory,
    pub net: Arc<Mutex<Net<SeqPacket>>>,
    pub peer: SeqPacket,
    pub evmgr: EventManager<Arc<Mutex<Net<SeqPacket>>>>,
    pub rxq: TestQueue,
    pub txq: TestQueue,
    pub irq: Arc<TestIrq>,
    pub metrics: Arc<NetMetrics>,
    next_buf: u64,
}

impl Harness {
    /// Builds, registers and activates a device with `features` acked.
    pub fn new(cfg: NetConfig, features: u64) -> Self {
        let mut h = Self::new_inactive(cfg);
        h.activate(features);
        h
    }

    /// Builds and registers a device without activating it.
    pub fn new_inactive(cfg: NetConfig) -> Self {
        Self::new_inactive_with(
            cfg,
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap(),
        )
    }

    /// [`new_inactive`](Self::new_inactive) over `mem`, which must cover
    /// the first `MEM_SIZE` bytes of guest addresses (in any regions).
    ///
    /// The time budget of a pass is off: how many frames a pass moves must
    /// not depend on how fast the test machine runs ([`Harness::timed`]
    /// keeps it).
    pub fn new_inactive_with(cfg: NetConfig, mem: GuestMemory) -> Self {
        Self::build(
            NetConfig {
                pass_time_budget_us: 0,
                ..cfg
            },
            mem,
        )
    }

    /// [`new`](Self::new) with `cfg`'s time budget kept.
    pub fn timed(cfg: NetConfig, features: u64) -> Self {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
        let mut h = Self::build(cfg, mem);
        h.activate(features);
        h
    }

    fn build(cfg: NetConfig, mem: GuestMemory) -> Self {
        let (dev_end, peer) = SeqPacket::pair().unwrap();
        peer.set_nonblocking(true).unwrap();
        let qs = cfg.queue_size;
        let net = Arc::new(Mutex::new(
            Net::with_backend(dev_end, cfg, mem.clone()).unwrap(),
        ));
        let metrics = net.lock().unwrap().metrics();
        let mut evmgr = EventManager::new().unwrap();
        evmgr.add_subscriber(net.clone());
        let rxq = TestQueue::new(&mem, GuestAddress(0x10000), qs);
        let txq = TestQueue::new(&mem, GuestAddress(0x80000), qs);
        Harness {
            mem,
            net,
            peer,
            evmgr,
            rxq,
            txq,
            irq: Arc::new(TestIrq::default()),
            metrics,
            next_buf: 0x100000,
        }
    }

    /// Activates the device as the transport does at DRIVER_OK, then lets
    /// the event loop pick the activation up.
    pub fn activate(&mut self, features: u64) {
        let queues = vec![
            self.rxq.create_queue(&self.mem, features),
            self.txq.create_queue(&self.mem, features),
        ];
        self.dev()
            .activate(features, queues, self.irq.clone())
            .unwrap();
        self.run_until_idle();
    }

    /// Activates the device with its queues wherever `layouts` say,
    /// without the transport's overlap check (as if a layout it refuses had
    /// got through), and runs the loop at most `max` iterations.
    pub fn activate_at(&mut self, features: u64, layouts: [RingAddrs; 2], max: usize) {
        self.rxq = TestQueue::with_addrs(&self.mem, layouts[0]);
        self.txq = TestQueue::with_addrs(&self.mem, layouts[1]);
        let queues = layouts
            .iter()
            .map(|a| queue_at(&self.mem, *a, features))
            .collect();
        self.dev()
            .activate(features, queues, self.irq.clone())
            .unwrap();
        self.run_bounded(max);
    }

    /// Runs the loop until nothing is ready, at most `max` iterations;
    /// `None` if it was still busy.
    pub fn run_bounded(&mut self, max: usize) -> Option<usize> {
        (0..max).find(|_| self.run_once(0) == 0)
    }

    pub fn dev(&self) -> MutexGuard<'_, Net<SeqPacket>> {
        self.net.lock().unwrap()
    }

    /// Allocates `len` bytes of guest memory for buffers (16-byte aligned).
    pub fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next_buf;
        self.next_buf = (self.next_buf + len + 15) & !15;
        assert!(self.next_buf < MEM_SIZE, "test guest memory exhausted");
        a
    }

    /// Posts one single-descriptor RX buffer per size; returns (head, addr).
    pub fn post_rx(&mut self, sizes: &[u32]) -> Vec<(u16, u64)> {
        let mut out = Vec::new();
        for &len in sizes {
            let addr = self.alloc(u64::from(len));
            let head = self.rxq.add_chain(&self.mem, &[(addr, len, F_WRITE)]);
            out.push((head, addr));
        }
        out
    }

    /// Places `frame` (header included) in guest memory split as `split`
    /// descriptor lengths (the rest in a last descriptor) and publishes it.
    pub fn post_tx(&mut self, frame: &[u8], split: &[usize]) -> u16 {
        let mut descs = Vec::new();
        let mut off = 0;
        for &len in split.iter().chain(std::iter::once(
            &(frame.len() - split.iter().sum::<usize>()),
        )) {
            let addr = self.alloc(len as u64);
            self.mem
                .write_slice(&frame[off..off + len], GuestAddress(addr))
                .unwrap();
            descs.push((addr, len as u32, 0));
            off += len;
        }
        self.txq.add_chain(&self.mem, &descs)
    }

    pub fn kick_rx(&self) {
        self.dev().queue_events()[RX_INDEX].write(1).unwrap();
    }

    pub fn kick_tx(&self) {
        self.dev().queue_events()[TX_INDEX].write(1).unwrap();
    }

    /// One event-loop iteration; returns the events dispatched.
    pub fn run_once(&mut self, timeout_ms: i32) -> usize {
        self.evmgr.run_with_timeout(timeout_ms).unwrap()
    }

    /// Runs the loop until nothing is ready; returns the iterations.
    pub fn run_until_idle(&mut self) -> usize {
        for i in 0..10_000 {
            if self.run_once(0) == 0 {
                return i;
            }
        }
        panic!("event loop never went idle (busy loop?)");
    }

    /// Reads every message the device sent to the peer.
    pub fn peer_frames(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 70000];
        while let Ok(n) = self.peer.recv(&mut buf) {
            out.push(buf[..n].to_vec());
        }
        out
    }

    /// Reads `len` bytes of guest memory.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    pub fn metric(&self, f: impl Fn(&NetMetrics) -> &AtomicU64) -> u64 {
        f(&self.metrics).load(Ordering::Relaxed)
    }
}

/// A vnet header (all zeros: no offload) followed by `len - 12` bytes of a
/// pattern seeded by `seed`.
pub fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = vec![0u8; len];
    for (i, b) in f.iter_mut().enumerate().skip(VNET_HDR_LEN) {
        *b = seed.wrapping_add((i * 7) as u8);
    }
    f
}

/// Asserts that a metric changed by `delta` across `block`.
macro_rules! check_metric_after_block {
    ($metric:expr, $delta:expr, $block:expr) => {{
        let before = $metric.load(std::sync::atomic::Ordering::Relaxed);
        let r = $block;
        let after = $metric.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(
            after - before,
            $delta,
            "{} changed by {}",
            stringify!($metric),
            after - before
        );
        r
    }};
}
pub(crate) use check_metric_after_block;
