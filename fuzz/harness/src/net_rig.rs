// SPDX-License-Identifier: Apache-2.0
//! What the datapath targets share: the real virtio-net device on its event
//! loop over an in-memory backend, activated directly (as the transport
//! does at DRIVER_OK) with rings wherever the input puts them, and the
//! driver-side writes a guest makes.
//!
//! Two backends, both recording what the device sent in a [`Wire`]:
//! [`MemBackend`] (frames in memory; the device writes each TX frame with
//! one `send_frame`, which can be told to return EAGAIN) and
//! [`SockBackend`] (TX frames go to a `SOCK_SEQPACKET` peer, the device end
//! made `with_batched_writes`, so the device batches them through its
//! io_uring `WriteRing`; the rig drains the peer into the [`Wire`] after every
//! loop iteration). RX frames come from memory with both.
//!
//! Guest memory is one 1 MiB region. Packed ring layouts sit in the first
//! 256 KiB, [`BUF_AREA`] (where structured descriptors point) above it.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::Arbitrary;
use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use devices::virtio::io_engine::WriteRing;
use devices::virtio::iov::IoVecs;
use devices::virtio::net::{Net, NetBackend, NetConfig, NetMetrics, SeqPacket};
use devices::virtio::queue::{
    GuestRegions, RingAddrs, RingFeatures, SplitQueue, MAX_PASS_READS, VIRTQ_DESC_F_INDIRECT,
    VIRTQ_DESC_F_WRITE,
};
use devices::virtio::test_utils::{
    desc_bytes, write_indirect_table, DriverQueue, QueueLayout, TestIrq,
};
use devices::virtio::{DeviceMetrics, GuestMemory, Interrupt, VirtioDevice};
use event_manager::{EventManager, SubscriberOps};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_GUEST_TSO4, VIRTIO_NET_F_MRG_RXBUF,
};
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Guest memory size.
pub const MEM_SIZE: u64 = 1 << 20;
/// Where structured buffers and indirect tables go: above every packed
/// ring, so that they never alias one.
pub const BUF_AREA: u64 = 0x4_0000;

/// Feature bits (virtio 1.1 §5.1.3, §6), from virtio-bindings rather than
/// the device's own table, which the target does not trust.
pub const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
/// VIRTIO_NET_F_MRG_RXBUF.
pub const MRG_RXBUF: u64 = 1 << VIRTIO_NET_F_MRG_RXBUF;
/// VIRTIO_RING_F_INDIRECT_DESC.
pub const INDIRECT: u64 = 1 << VIRTIO_RING_F_INDIRECT_DESC;
/// VIRTIO_RING_F_EVENT_IDX.
pub const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
/// GUEST_CSUM | GUEST_TSO4: 64 KiB frames on RX.
pub const GUEST_GSO: u64 = 1 << VIRTIO_NET_F_GUEST_CSUM | 1 << VIRTIO_NET_F_GUEST_TSO4;

/// The frames the backend holds for the device and those it took from it,
/// with an eventfd that is readable while frames wait (as a socket is).
#[derive(Default)]
pub struct Wire {
    /// Frames for the device to receive.
    pub rx: VecDeque<Vec<u8>>,
    /// Frames the device sent.
    pub tx: Vec<Vec<u8>>,
    /// Sends that return EAGAIN before the next one goes through.
    pub tx_eagain: u32,
}

/// An in-memory backend: readiness through an eventfd, frames in a
/// [`Wire`]. It never fails but for the EAGAINs it is told to return.
pub struct MemBackend {
    evt: EventFd,
    /// What the backend holds, shared with the target.
    pub wire: Arc<Mutex<Wire>>,
}

impl MemBackend {
    fn new() -> Self {
        MemBackend {
            evt: EventFd::new(EFD_NONBLOCK).expect("eventfd"),
            wire: Arc::default(),
        }
    }

    /// Queues a frame for the device to receive.
    pub fn push(&self, frame: Vec<u8>) {
        lock(&self.wire).rx.push_back(frame);
        let _ = self.evt.write(1);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The next RX frame of `wire` into `bufs`, like a datagram socket: the
/// frame is consumed whole, and the length is what fit. With none left,
/// `quiet` makes the backend's fd stop being readable, and the answer is
/// EAGAIN.
fn recv_from_wire(
    wire: &Mutex<Wire>,
    bufs: IoVecs<'_>,
    quiet: impl FnOnce(),
) -> std::io::Result<usize> {
    match lock(wire).rx.pop_front() {
        Some(f) => Ok(bufs.scatter(&f)),
        None => {
            quiet();
            Err(std::io::ErrorKind::WouldBlock.into())
        }
    }
}

impl AsRawFd for MemBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.evt.as_raw_fd()
    }
}

impl NetBackend for MemBackend {
    fn recv_frame(&self, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        recv_from_wire(&self.wire, bufs, || {
            let _ = self.evt.read();
        })
    }

    fn send_frame(&self, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        let mut w = lock(&self.wire);
        if w.tx_eagain > 0 {
            w.tx_eagain -= 1;
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        let f = bufs.gather();
        let n = f.len();
        w.tx.push(f);
        Ok(n)
    }
}

/// A backend whose TX goes through a real socket, with batched writes: the
/// device end of a `SOCK_SEQPACKET` pair made
/// [`with_batched_writes`](SeqPacket::with_batched_writes) with SO_SNDBUF
/// as large as the host allows. The device writes TX frames to it itself
/// (io_uring batches, or one `writev` each without a ring), never through
/// `send_frame`; the rig drains the peer into the [`Wire`]. RX frames come
/// from the [`Wire`] as with [`MemBackend`]; a one-byte message from the
/// peer per frame makes the socket readable meanwhile (the socket's
/// readiness is what the device polls), and they are drained once no
/// frame waits, as `MemBackend` drains its eventfd.
pub struct SockBackend {
    sock: SeqPacket,
    /// What the backend holds, shared with the target.
    pub wire: Arc<Mutex<Wire>>,
}

impl AsRawFd for SockBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

impl NetBackend for SockBackend {
    fn recv_frame(&self, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        recv_from_wire(&self.wire, bufs, || {
            // The device end is non-blocking (`Net::with_backend`).
            let mut b = [0u8; 1];
            while self.sock.recv(&mut b).is_ok() {}
        })
    }

    fn batched_writes(&self) -> bool {
        self.sock.batched_writes()
    }
}

/// The backend of a rig.
pub enum Backend {
    /// In memory, one `send_frame` per TX frame.
    Mem(MemBackend),
    /// A socket the device writes TX frames to in batches.
    Sock(SockBackend),
}

impl AsRawFd for Backend {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Backend::Mem(b) => b.as_raw_fd(),
            Backend::Sock(b) => b.as_raw_fd(),
        }
    }
}

impl NetBackend for Backend {
    fn recv_frame(&self, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        match self {
            Backend::Mem(b) => b.recv_frame(bufs),
            Backend::Sock(b) => b.recv_frame(bufs),
        }
    }

    fn send_frame(&self, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        match self {
            Backend::Mem(b) => b.send_frame(bufs),
            Backend::Sock(b) => b.send_frame(bufs),
        }
    }

    fn batched_writes(&self) -> bool {
        match self {
            Backend::Mem(b) => b.batched_writes(),
            Backend::Sock(b) => b.batched_writes(),
        }
    }
}

/// Whether this host lets the device build its io_uring `WriteRing` (a
/// container's seccomp profile or the `io_uring_disabled` sysctl may not):
/// where it does not, the device writes frame by frame, as it should.
pub fn uring_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        SeqPacket::pair()
            .ok()
            .is_some_and(|(a, _b)| WriteRing::new(a.as_raw_fd()).is_ok())
    })
}

/// How the input places a queue.
#[derive(Debug, Clone, Copy)]
pub enum Placement {
    /// Descriptor table, avail and used rings one after the other in slot
    /// `n % 4` of the first 256 KiB (64 KiB each): what a driver does.
    Packed(u8),
    /// Anywhere (the queue code validates; the overlap check the transport
    /// adds is skipped, as if a layout it refuses had got through).
    Raw {
        /// Descriptor table.
        desc: u32,
        /// Avail ring.
        avail: u32,
        /// Used ring.
        used: u32,
    },
}

impl<'a> Arbitrary<'a> for Placement {
    // Packed seven times in eight: a layout anywhere is mostly refused, and
    // the datapath needs an accepted one to be reached at all.
    fn arbitrary(u: &mut arbitrary::Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        if b < 224 {
            return Ok(Placement::Packed(b));
        }
        Ok(Placement::Raw {
            desc: u32::arbitrary(u)?,
            avail: u32::arbitrary(u)?,
            used: u32::arbitrary(u)?,
        })
    }
}

impl Placement {
    /// The ring addresses for a queue of `size`.
    pub fn addrs(self, size: u16) -> RingAddrs {
        match self {
            Placement::Packed(n) => {
                QueueLayout::packed(GuestAddress(0x1_0000 * u64::from(n % 4)), size).ring_addrs()
            }
            Placement::Raw { desc, avail, used } => RingAddrs {
                size,
                desc_table: u64::from(desc) % MEM_SIZE,
                avail_ring: u64::from(avail) % MEM_SIZE,
                used_ring: u64::from(used) % MEM_SIZE,
            },
        }
    }

    /// Whether this is a packed placement.
    pub fn is_packed(self) -> bool {
        matches!(self, Placement::Packed(_))
    }
}

/// Device knobs the input picks.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Setup {
    /// Bit 0 MRG_RXBUF, 1 EVENT_IDX, 2 INDIRECT_DESC, 3 guest GSO; bit 4
    /// the copying baseline (a bounce buffer) instead of zero copy; bit 5:
    /// after the run over [`MemBackend`], the same input runs again over
    /// [`SockBackend`] (batched TX writes; see [`Setup::batched`]).
    pub features: u8,
    /// log2 of the queue size, folded into 0..=8.
    pub size_log2: u8,
    /// 0: vhost-net's weights, 1: 2 packets, 2: 3000 bytes, 3: none.
    pub weights: u8,
    /// Rate limiters on both directions: bit 0 a frame bucket of 4 frames,
    /// bit 1 a byte bucket of 3000 bytes, each refilled in 1 ms.
    pub limiter: u8,
    /// Where the RX queue goes.
    pub rx: Placement,
    /// Where the TX queue goes.
    pub tx: Placement,
}

impl Setup {
    /// The features the driver acks.
    pub fn features(&self) -> u64 {
        let f = self.features;
        let mut v = VERSION_1;
        for (bit, feature) in [
            (1, MRG_RXBUF),
            (2, EVENT_IDX),
            (4, INDIRECT),
            (8, GUEST_GSO),
        ] {
            if f & bit != 0 {
                v |= feature;
            }
        }
        v
    }

    /// Whether the input also runs over [`SockBackend`]. A second run
    /// rather than a switch: two thirds of the committed seeds had bit 5
    /// set before it meant anything, and their run over [`MemBackend`]
    /// stays what it was.
    pub fn batched(&self) -> bool {
        self.features & 32 != 0
    }

    /// The queue size.
    pub fn size(&self) -> u16 {
        1 << (self.size_log2 % 9)
    }

    fn config(&self) -> NetConfig {
        let (bytes, packets) = match self.weights % 4 {
            0 => (0x80000, 256),
            1 => (0, 2),
            2 => (3000, 0),
            _ => (0, 0),
        };
        let bucket = |on: bool, size| {
            on.then_some(TokenBucketConfig {
                size,
                one_time_burst: 0,
                refill_time: 1,
            })
        };
        let limiter = RateLimiterConfig {
            ops: bucket(self.limiter & 1 != 0, 4),
            bandwidth: bucket(self.limiter & 2 != 0, 3000),
        };
        NetConfig {
            queue_size: 256,
            bounce_buffer: self.features & 16 != 0,
            rx_rate_limiter: limiter,
            tx_rate_limiter: limiter,
            tx_weight_bytes: bytes,
            tx_weight_packets: packets,
            rx_weight_bytes: bytes,
            rx_weight_packets: packets,
            ..NetConfig::default()
        }
    }
}

type Loop = EventManager<Arc<Mutex<Net<Backend>>>>;

/// The device under test and the guest's side of it.
pub struct DatapathFixture {
    /// Guest memory.
    pub mem: GuestMemory,
    /// The device.
    pub net: Arc<Mutex<Net<Backend>>>,
    /// Its event loop.
    pub em: Loop,
    /// Its counters.
    pub metrics: Arc<NetMetrics>,
    /// The backend's frames.
    pub wire: Arc<Mutex<Wire>>,
    /// Interrupts raised.
    pub irq: Arc<TestIrq>,
    /// The input's knobs.
    pub setup: Setup,
    /// The peer of a [`SockBackend`] (None with [`MemBackend`]).
    peer: Option<SeqPacket>,
    /// Whether buffers or TX descriptors were handed out twice since the
    /// activation (the buffer area or the TX table wrapped), so that a
    /// chain not yet sent may have been overwritten.
    pub reused: bool,
    /// Ring addresses of RX and TX.
    pub addrs: [RingAddrs; 2],
    /// The guest's side of RX and TX: every descriptor, avail entry and
    /// used-ring read goes through them.
    queues: [DriverQueue; 2],
    /// The next free byte of the buffer area for `post_chain`.
    next_buf: u64,
    /// TX descriptors `post_chain` wrote since the activation.
    tx_descs: u32,
}

impl DatapathFixture {
    /// Builds and activates the device over a [`MemBackend`]; `None` when
    /// the queue code refuses the layout (as the transport would have at
    /// DRIVER_OK).
    pub fn new(setup: Setup) -> Option<DatapathFixture> {
        DatapathFixture::with_backend(setup, false)
    }

    /// As [`DatapathFixture::new`], over a [`SockBackend`] if `batched`.
    pub fn with_backend(setup: Setup, batched: bool) -> Option<DatapathFixture> {
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)])
            .expect("fixed, valid memory");
        let (backend, wire, peer) = if batched {
            let (dev, peer) = SeqPacket::pair().expect("socket pair");
            // As large as the host allows (net.core.wmem_max, doubled):
            // the peer is drained only between loop iterations.
            dev.set_send_buffer(usize::MAX).expect("SO_SNDBUF");
            peer.set_send_buffer(usize::MAX).expect("SO_SNDBUF");
            peer.set_nonblocking(true).expect("non-blocking peer");
            let wire = Arc::<Mutex<Wire>>::default();
            let b = SockBackend {
                sock: dev.with_batched_writes(),
                wire: wire.clone(),
            };
            (Backend::Sock(b), wire, Some(peer))
        } else {
            let b = MemBackend::new();
            let wire = b.wire.clone();
            (Backend::Mem(b), wire, None)
        };
        let net = Arc::new(Mutex::new(
            Net::with_backend(backend, setup.config(), mem.clone()).expect("valid config"),
        ));
        let metrics = lock(&net).metrics();
        let mut em = Loop::new().expect("event manager");
        em.add_subscriber(net.clone());
        let size = setup.size();
        let mut rig = DatapathFixture {
            mem,
            net,
            em,
            metrics,
            wire,
            irq: Arc::default(),
            setup,
            peer,
            reused: false,
            addrs: [setup.rx.addrs(size), setup.tx.addrs(size)],
            queues: [setup.rx, setup.tx].map(|p| DriverQueue::new(p.addrs(size).into())),
            next_buf: BUF_AREA,
            tx_descs: 0,
        };
        rig.activate().then_some(rig)
    }

    /// Zeroes the rings and activates the device on them, as a driver does
    /// after a reset; false if the queue code refuses the layout.
    pub fn activate(&mut self) -> bool {
        let regions = Arc::new(GuestRegions::new(&self.mem).expect("mapped memory"));
        let features = self.setup.features();
        let mut queues = Vec::new();
        self.queues = self.addrs.map(|a| DriverQueue::zeroed(&self.mem, a.into()));
        for a in self.addrs {
            match SplitQueue::new(regions.clone(), a, 256, RingFeatures::from_bits(features)) {
                Ok(q) => queues.push(q),
                Err(_) => return false,
            }
        }
        self.reused = false;
        self.tx_descs = 0;
        let irq: Arc<dyn Interrupt> = self.irq.clone();
        if lock(&self.net).activate(features, queues, irq).is_err() {
            return false;
        }
        self.run(4);
        true
    }

    /// Resets the device (a Status write of 0).
    pub fn reset(&mut self) {
        lock(&self.net).reset();
        self.run(4);
    }

    /// Runs at most `max` loop iterations; whether the loop went idle.
    /// The peer of a [`SockBackend`] is drained after each.
    pub fn run(&mut self, max: usize) -> bool {
        (0..max).any(|_| {
            let idle = self.em.run_with_timeout(0).expect("epoll") == 0;
            self.drain_peer();
            idle
        })
    }

    /// Whether the device runs over a [`SockBackend`].
    pub fn is_batched(&self) -> bool {
        self.peer.is_some()
    }

    /// The oracles both datapath targets check after every step, whatever
    /// the guest wrote: no pass read more than [`MAX_PASS_READS`] ring
    /// entries and descriptors, no host-side error was counted (the backend
    /// is healthy), and those of [`check_tx_wire`](Self::check_tx_wire),
    /// whose answer (whether the device has its ring) it returns.
    pub fn check_shared_oracles(&self) -> bool {
        let reads = self.metric(|m| &m.max_descs_per_pass);
        assert!(
            reads <= u64::from(MAX_PASS_READS),
            "a pass read {reads} ring entries and descriptors"
        );
        assert_eq!(
            self.metric(|m| &m.host_errors),
            0,
            "{}",
            self.metrics.to_json()
        );
        self.check_tx_wire()
    }

    /// The oracles on what reached the backend, shared by the datapath
    /// targets: the frames and bytes there are the device's `tx_frames` and
    /// `tx_bytes` (plus a 12-byte header each), and io_uring batches exist
    /// exactly where the device has its ring (a batching backend, io_uring
    /// on the host, no bounce buffer) and wrote anything. Returns whether
    /// it has the ring.
    pub fn check_tx_wire(&self) -> bool {
        let (sent_frames, sent_bytes): (u64, u64) = {
            let w = self.wire.lock().unwrap_or_else(|p| p.into_inner());
            (w.tx.len() as u64, w.tx.iter().map(|f| f.len() as u64).sum())
        };
        assert_eq!(sent_frames, self.metric(|m| &m.tx_frames));
        assert_eq!(sent_bytes, self.metric(|m| &m.tx_bytes) + 12 * sent_frames);
        let ring = self.is_batched() && uring_available() && self.setup.features & 16 == 0;
        let batches = self.metric(|m| &m.tx_batches);
        if ring {
            assert!(
                sent_frames == 0 || batches > 0,
                "{sent_frames} frames sent on the batched backend without a batch: {}",
                self.metrics.to_json()
            );
        } else {
            assert_eq!(
                batches,
                0,
                "TX batches without a ring: {}",
                self.metrics.to_json()
            );
        }
        ring
    }

    /// Moves what the device sent to the peer into the [`Wire`].
    fn drain_peer(&self) {
        let Some(peer) = &self.peer else { return };
        // Larger than any TX frame: a frame cut short would show in the
        // byte count.
        let mut buf = vec![0u8; 1 << 17];
        let mut w = lock(&self.wire);
        while let Ok(n) = peer.recv(&mut buf) {
            w.tx.push(buf[..n].to_vec());
        }
    }

    /// Makes the next sends of a [`MemBackend`] return EAGAIN; false (and
    /// nothing done) with a [`SockBackend`], whose writes the device makes
    /// itself.
    pub fn inject_eagain(&self, n: u32) -> bool {
        if self.is_batched() {
            return false;
        }
        lock(&self.wire).tx_eagain = n;
        true
    }

    /// Notifies queue `q` (0 RX, 1 TX).
    pub fn kick(&self, q: usize) {
        let _ = lock(&self.net).queue_events()[q].write(1);
    }

    /// Writes bytes into guest memory wherever they fit.
    pub fn poke(&self, addr: u64, bytes: &[u8]) {
        let _ = self.mem.write_slice(bytes, GuestAddress(addr % MEM_SIZE));
    }

    /// Writes a descriptor as the fuzzer described it into queue `d.q`'s
    /// table: only the three flag bits the spec defines, `next` folded into
    /// the ring.
    pub fn guest_desc(&self, d: &GuestDesc) {
        // A descriptor outside guest memory is one the device never reads.
        let _ = self.queues[usize::from(d.q)].write_desc(
            &self.mem,
            d.idx,
            d.addr.get(),
            u32::from(d.len),
            u16::from(d.flags & 7),
            d.next % self.setup.size().max(1),
        );
    }

    /// Writes an indirect-table entry as the fuzzer described it (the three
    /// defined flag bits).
    pub fn guest_table_entry(&self, e: &GuestTableEntry) {
        let d = desc_bytes(
            e.addr.get(),
            u32::from(e.len),
            u16::from(e.flags & 7),
            u16::from(e.next),
        );
        self.poke(e.at.get().wrapping_add(16 * u64::from(e.i)), &d);
    }

    /// Gives the device a frame from the network.
    pub fn push_frame(&self, frame: Vec<u8>) {
        match lock(&self.net).backend() {
            Backend::Mem(b) => b.push(frame),
            Backend::Sock(b) => {
                lock(&b.wire).rx.push_back(frame);
                // One ring of the bell per frame; if the socket is full,
                // enough rings wait already.
                if let Some(peer) = &self.peer {
                    let _ = peer.send(&[0]);
                }
            }
        }
    }

    /// Loop iterations within which the device must go idle once the guest
    /// and the network stop, after `frames` frames from the network: at
    /// most one pass per chain the rings can hold and per frame, and a few
    /// more.
    pub fn idle_bound(&self, frames: usize) -> usize {
        2 * (2 * usize::from(self.setup.size()) + frames) + 16
    }

    /// Puts `heads` in the next avail slots of queue `q` and publishes them.
    pub fn publish(&mut self, q: usize, heads: &[u16]) {
        // The device accepted the rings, so they are guest memory.
        for &h in heads {
            let _ = self.queues[q].push_avail(&self.mem, h);
        }
        let _ = self.queues[q].publish(&self.mem);
    }

    /// Takes `len` bytes of the buffer area (wrapping to its start).
    fn alloc(&mut self, len: u64) -> u64 {
        if self.next_buf + len > MEM_SIZE {
            self.next_buf = BUF_AREA;
            self.reused = true;
        }
        let a = self.next_buf;
        self.next_buf = (a + len + 15) & !15;
        a
    }

    /// Writes a well-formed chain of buffers of `lens` bytes for queue `q`
    /// (device-writable for RX) as a driver would: the first `direct`
    /// buffers in the next descriptors of the ring, the rest in an indirect
    /// table; TX buffers hold `frame`'s bytes in order. Publishes it and
    /// returns its head.
    pub fn post_chain(&mut self, q: usize, lens: &[u16], direct: usize, frame: &[u8]) -> u16 {
        let size = self.addrs[q].size;
        let flag = if q == 0 { VIRTQ_DESC_F_WRITE } else { 0 };
        let mut off = 0;
        let bufs: Vec<(u64, u32, u16)> = lens
            .iter()
            .map(|&l| {
                let a = self.alloc(u64::from(l));
                let end = (off + usize::from(l)).min(frame.len());
                if off < end {
                    self.poke(a, &frame[off..end]);
                }
                off += usize::from(l);
                (a, u32::from(l), flag)
            })
            .collect();
        let direct = direct.min(bufs.len());
        let mut descs = bufs[..direct].to_vec();
        let rest = &bufs[direct..];
        if !rest.is_empty() {
            let table = self.alloc(16 * rest.len() as u64);
            // The buffer area is guest memory.
            let _ = write_indirect_table(&self.mem, GuestAddress(table), rest);
            descs.push((table, 16 * rest.len() as u32, VIRTQ_DESC_F_INDIRECT));
        }
        // `descs` is never empty: a chain has a buffer or a table.
        let head = self.queues[q].write_chain(&self.mem, &descs).unwrap_or(0);
        if q == 1 {
            self.tx_descs += descs.len() as u32;
            self.reused |= self.tx_descs > u32::from(size);
        }
        self.publish(q, &[head]);
        head
    }

    /// Posts the RX chains `c` describes (at most 8 buffers, each folded
    /// below 4 KiB; nothing for an empty list) and kicks RX. Returns their
    /// heads, in the order posted.
    pub fn post_rx_chains(&mut self, c: &RxChains) -> Vec<u16> {
        let lens: Vec<u16> = c.lens.iter().take(8).map(|&l| l % 4096).collect();
        if lens.is_empty() {
            return Vec::new();
        }
        let heads = (0..=c.copies % 16)
            .map(|_| self.post_chain(0, &lens, usize::from(c.direct), &[]))
            .collect();
        self.kick(0);
        heads
    }

    /// Posts the TX chain `c` describes and kicks TX. Returns its head and
    /// the frame it holds.
    pub fn post_tx_chain(&mut self, c: &TxChain) -> (u16, Vec<u8>) {
        let frame = tx_frame(c.len, c.fill);
        let lens = split(frame.len(), &c.cuts);
        let head = self.post_chain(1, &lens, usize::from(c.direct), &frame);
        self.kick(1);
        (head, frame)
    }

    /// The device's used idx of queue `q`.
    pub fn used_idx(&self, q: usize) -> u16 {
        self.queues[q].used_idx(&self.mem).unwrap_or(0)
    }

    /// Used element `i` (folded into the ring) of queue `q`.
    pub fn used_elem(&self, q: usize, i: u16) -> (u32, u32) {
        self.queues[q]
            .used_elem(&self.mem, i)
            .map_or((u32::MAX, u32::MAX), |e| (e.id, e.len))
    }

    /// A counter's value.
    pub fn metric(&self, f: impl Fn(&NetMetrics) -> &AtomicU64) -> u64 {
        f(&self.metrics).load(Ordering::Relaxed)
    }
}

/// A descriptor of queue `q`'s table, with any flags, length and link (a
/// `Desc` step of the datapath targets; the fields are the input layout
/// their corpora were written in).
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct GuestDesc {
    /// RX (false) or TX (true).
    pub q: bool,
    /// Index in the table (folded by the queue writer).
    pub idx: u16,
    /// Buffer address.
    pub addr: BufAddr,
    /// Buffer length.
    pub len: u16,
    /// Flags, of which the three defined bits are kept.
    pub flags: u8,
    /// Next index (folded into the ring).
    pub next: u16,
}

/// Entry `i` of an indirect table at `at`, with any flags, length and link
/// (a `TableEntry` step of the datapath targets).
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct GuestTableEntry {
    /// Where the table is.
    pub at: BufAddr,
    /// Entry index.
    pub i: u8,
    /// Buffer address.
    pub addr: BufAddr,
    /// Buffer length.
    pub len: u16,
    /// Flags, of which the three defined bits are kept.
    pub flags: u8,
    /// Next index in the table.
    pub next: u8,
}

/// `1 + copies % 16` well-formed RX chains of buffers of these lengths (the
/// first `direct` in ring descriptors, the rest in an indirect table),
/// published (an `RxChain` step of the datapath targets).
#[derive(Debug, Clone, Arbitrary)]
pub struct RxChains {
    /// Buffer lengths (the first 8, folded below 4 KiB).
    pub lens: Vec<u16>,
    /// How many buffers go in ring descriptors.
    pub direct: u8,
    /// How many more copies of the chain to post.
    pub copies: u8,
}

/// A well-formed TX chain holding a `len`-byte frame split at `cuts` (a
/// `TxChain` step of the datapath targets).
#[derive(Debug, Clone, Arbitrary)]
pub struct TxChain {
    /// Frame length (see [`tx_frame`]).
    pub len: u16,
    /// Where the frame is cut into buffers (see [`split`]).
    pub cuts: Vec<u16>,
    /// How many buffers go in ring descriptors.
    pub direct: u8,
    /// The payload's first byte.
    pub fill: u8,
}

/// A TX frame of `len` bytes (at least a header): a zero vnet header and
/// `fill`-based payload.
pub fn tx_frame(len: u16, fill: u8) -> Vec<u8> {
    let len = usize::from(len % 2048).max(12);
    (0..len)
        .map(|i| {
            if i < 12 {
                0
            } else {
                fill.wrapping_add(i as u8)
            }
        })
        .collect()
}

/// Buffer lengths that add up to `len`, cut at `cuts` (at most 16 pieces;
/// empty ones allowed).
pub fn split(len: usize, cuts: &[u16]) -> Vec<u16> {
    let mut lens = Vec::new();
    let mut left = len;
    for &c in cuts.iter().take(15) {
        let n = usize::from(c).min(left);
        lens.push(n as u16);
        left -= n;
    }
    lens.push(left as u16);
    lens
}

/// A buffer address of a structured descriptor: mostly in [`BUF_AREA`],
/// sometimes anywhere in memory (rings included) or outside it.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum BufAddr {
    /// `BUF_AREA + n * 16`.
    Area(u16),
    /// Any address.
    Raw(u64),
}

impl BufAddr {
    /// The guest address.
    pub fn get(self) -> u64 {
        match self {
            BufAddr::Area(n) => BUF_AREA + 16 * u64::from(n) % (MEM_SIZE - BUF_AREA),
            BufAddr::Raw(a) => a,
        }
    }

    /// Whether it stays in the buffer area (cannot alias a packed ring).
    pub fn in_area(self) -> bool {
        matches!(self, BufAddr::Area(_))
    }
}
