// SPDX-License-Identifier: Apache-2.0
//! Driver-side test harness for the network device (tests only).
//!
//! [`NetFixture`] wires a [`Net`] over a `SOCK_SEQPACKET` pair to an
//! `EventManager`, activates it the way the transport does, and gives tests
//! the peer end of the socket. Its two queues are
//! [`DriverQueue`](crate::virtio::test_utils::DriverQueue)s, the guest-side
//! ring writer every driver-side harness shares, so tests can also write the
//! malformed chains a driver never should. [`transport_rig`] puts the
//! device behind the real MMIO transport ([`DeviceRig`]), reached through
//! [`MockDriver`].

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use event_manager::EventManager;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::virtio::iov::IoVecs;
use crate::virtio::net::device::features::*;
use crate::virtio::net::device::{Net, CONFIG_SPACE_LEN};
use crate::virtio::net::metrics::NetMetrics;
use crate::virtio::net::tap::{NetBackend, SeqPacket};
use crate::virtio::net::{NetConfig, RX_INDEX, TX_INDEX, VNET_HDR_LEN};
use crate::virtio::queue::{RingAddrs, SplitQueue};
pub use crate::virtio::queue::{VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
pub(crate) use crate::virtio::test_utils::checks::{check_metric_after_block, test_log};
use crate::virtio::test_utils::contract::ContractDevice;
pub use crate::virtio::test_utils::queue_at;
pub use crate::virtio::test_utils::DirectRig;
pub use crate::virtio::test_utils::DriverQueue;
use crate::virtio::test_utils::{write_indirect_table, DeviceRig, MockDriver, Segment};
pub use crate::virtio::DeviceMetrics;

/// The used entries a queue returned since the last call, as `(id, len)`
/// pairs: the shape the suites compare and destructure.
pub trait TakeUsed {
    /// [`DriverQueue::used`] as pairs.
    fn take_used(&mut self, mem: &GuestMemory) -> Vec<(u32, u32)>;
}

impl TakeUsed for DriverQueue {
    fn take_used(&mut self, mem: &GuestMemory) -> Vec<(u32, u32)> {
        let used = self.used(mem).expect("the used ring is in guest memory");
        used.into_iter().map(|e| (e.id, e.len)).collect()
    }
}
use crate::virtio::{GuestMemory, VirtioDevice};

/// VIRTIO_RING_F_EVENT_IDX as a feature bit.
pub const RING_EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
/// VIRTIO_RING_F_INDIRECT_DESC as a feature bit.
pub const RING_INDIRECT: u64 = 1 << VIRTIO_RING_F_INDIRECT_DESC;

/// Size of the test guest memory.
pub const MEM_SIZE: u64 = 64 << 20;

/// The RX and TX queues a transport would hand the device for the
/// driver's rings `rxq` and `txq`, in the device's queue order.
pub fn rx_tx_queues(
    mem: &GuestMemory,
    rxq: &DriverQueue,
    txq: &DriverQueue,
    features: u64,
) -> Vec<SplitQueue> {
    vec![
        queue_at(mem, rxq.ring_addrs(), features),
        queue_at(mem, txq.ring_addrs(), features),
    ]
}

/// The feature set a modern Linux guest acks with offloads off.
pub const BASE_FEATURES: u64 =
    1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MAC | 1 << VIRTIO_NET_F_STATUS;
/// BASE_FEATURES plus MRG_RXBUF.
pub const MRG_FEATURES: u64 = BASE_FEATURES | 1 << VIRTIO_NET_F_MRG_RXBUF;
/// Guest receive offloads that allow 64 KiB frames.
pub const GUEST_GSO: u64 =
    1 << VIRTIO_NET_F_GUEST_CSUM | 1 << VIRTIO_NET_F_GUEST_TSO4 | 1 << VIRTIO_NET_F_GUEST_TSO6;

/// A device over a socket pair (or a backend wrapping one end of it, such
/// as a fault-injecting one), activated straight and driven from the
/// driver side: the shared [`DirectRig`] (the device, its event loop, its
/// interrupt, the buffer allocator, reached through `Deref`) with the two
/// rings and the socket's other end.
pub struct NetFixture<B: NetBackend + 'static = SeqPacket> {
    pub rig: DirectRig<Net<B>>,
    /// Guest memory (the rig's, kept here too so a test borrows it beside
    /// a ring).
    pub mem: GuestMemory,
    pub peer: SeqPacket,
    pub rxq: DriverQueue,
    pub txq: DriverQueue,
    pub metrics: Arc<NetMetrics>,
    /// Buffers of each RX chain posted with `post_rx_shaped` and not yet
    /// returned, by head.
    pub rx_chains: HashMap<u16, Vec<(u64, u32)>>,
}

impl<B: NetBackend + 'static> std::ops::Deref for NetFixture<B> {
    type Target = DirectRig<Net<B>>;
    fn deref(&self) -> &Self::Target {
        &self.rig
    }
}

impl<B: NetBackend + 'static> std::ops::DerefMut for NetFixture<B> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.rig
    }
}

impl NetFixture<SeqPacket> {
    /// Builds, registers and activates a device with `features` acked.
    pub fn new(cfg: NetConfig, features: u64) -> Self {
        let mut h = Self::new_inactive(cfg);
        h.activate(features);
        h
    }

    /// [`new`](Self::new) with the default configuration changed by `cfg`.
    pub fn configured(cfg: impl FnOnce(&mut NetConfig), features: u64) -> Self {
        let mut c = NetConfig::default();
        cfg(&mut c);
        Self::new(c, features)
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
    /// not depend on how fast the test machine runs ([`NetFixture::timed`]
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
        NetFixture::with_backend(dev_end, peer, cfg, mem)
    }
}

impl<B: NetBackend + 'static> NetFixture<B> {
    /// Builds and registers a device over `backend`, whose other end is
    /// `peer`, without activating it.
    pub fn with_backend(backend: B, peer: SeqPacket, cfg: NetConfig, mem: GuestMemory) -> Self {
        peer.set_nonblocking(true).unwrap();
        let qs = cfg.queue_size;
        let net = Net::with_backend(backend, cfg, mem.clone()).unwrap();
        let metrics = net.metrics();
        let rxq = DriverQueue::packed(&mem, GuestAddress(0x10000), qs);
        let txq = DriverQueue::packed(&mem, GuestAddress(0x80000), qs);
        NetFixture {
            rig: DirectRig::new(mem.clone(), net),
            mem,
            peer,
            rxq,
            txq,
            metrics,
            rx_chains: HashMap::new(),
        }
    }

    /// Activates the device as the transport does at DRIVER_OK, then lets
    /// the event loop pick the activation up.
    pub fn activate(&mut self, features: u64) {
        let rings = [self.rxq.ring_addrs(), self.txq.ring_addrs()];
        if let Err(e) = self.rig.activate_rings(features, &rings) {
            panic!("activation failed: {e:?}");
        }
        self.run_until_idle();
    }

    /// Activates the device with its queues wherever `layouts` say,
    /// without the transport's overlap check (as if a layout it refuses had
    /// got through), and runs the loop at most `max` iterations.
    pub fn activate_at(&mut self, features: u64, layouts: [RingAddrs; 2], max: usize) {
        self.rxq = DriverQueue::zeroed(&self.mem, layouts[0].into());
        self.txq = DriverQueue::zeroed(&self.mem, layouts[1].into());
        self.rig.activate_rings(features, &layouts).unwrap();
        self.run_bounded(max);
    }

    /// Posts one single-descriptor RX buffer per size; returns (head, addr).
    pub fn post_rx(&mut self, sizes: &[u32]) -> Vec<(u16, u64)> {
        let mut out = Vec::new();
        for &len in sizes {
            let addr = self.alloc(u64::from(len));
            let head = self
                .rxq
                .post_chain(&self.mem, &[(addr, len, VIRTQ_DESC_F_WRITE)])
                .unwrap();
            out.push((head, addr));
        }
        out
    }

    /// [`post_rx`](Self::post_rx) and a kick of the RX queue.
    pub fn offer_rx(&mut self, sizes: &[u32]) -> Vec<(u16, u64)> {
        let bufs = self.post_rx(sizes);
        self.kick_rx();
        bufs
    }

    /// Offers on queue `index` ([`RX_INDEX`] or [`TX_INDEX`]) a chain of
    /// `(offset, len, flags)` descriptors into a fresh buffer of `buf_len`
    /// bytes, which the test may lay out as no driver should; returns its
    /// head.
    pub fn post_chain_in_buffer(
        &mut self,
        index: usize,
        buf_len: u64,
        descs: &[(u64, u32, u16)],
    ) -> u16 {
        let a = self.alloc(buf_len);
        let descs: Vec<_> = descs.iter().map(|&(off, l, f)| (a + off, l, f)).collect();
        let q = if index == RX_INDEX {
            &mut self.rxq
        } else {
            &mut self.txq
        };
        q.post_chain(&self.mem, &descs).unwrap()
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
        self.txq.post_chain(&self.mem, &descs).unwrap()
    }

    /// Posts `n` one-descriptor TX frames of `len` bytes ([`frame`] seeds
    /// 0, 1, ..., wrapping) and kicks the TX queue.
    pub fn offer_tx_frames(&mut self, n: usize, len: usize) {
        for i in 0..n {
            self.post_tx(&frame(len, i as u8), &[]);
        }
        self.kick_tx();
    }

    pub fn kick_rx(&self) {
        self.dev().queue_events()[RX_INDEX].write(1).unwrap();
    }

    pub fn kick_tx(&self) {
        self.dev().queue_events()[TX_INDEX].write(1).unwrap();
    }

    /// The peer sends `n` frames of `len` bytes ([`frame`] seeds 0, 1, ...).
    pub fn peer_sends(&self, n: u8, len: usize) {
        for i in 0..n {
            self.peer.send(&frame(len, i)).unwrap();
        }
    }

    /// The peer sends `frame` and the loop runs until idle.
    pub fn deliver(&mut self, frame: &[u8]) {
        self.peer.send(frame).unwrap();
        self.run_until_idle();
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

    pub fn metric(&self, f: impl Fn(&NetMetrics) -> &AtomicU64) -> u64 {
        f(&self.metrics).load(Ordering::Relaxed)
    }
}

/// The network device in the contract suite: its TX queue, which it drains
/// on a kick alone, frames to a socket peer.
impl ContractDevice for Net<SeqPacket> {
    type Keep = SeqPacket;
    const QUEUE: usize = TX_INDEX;
    const CONFIG_LEN: u64 = CONFIG_SPACE_LEN as u64;
    const REFUSED: &'static str = "malformed_chains";

    fn make(mem: &GuestMemory) -> (Self, SeqPacket) {
        let (dev_end, peer) = SeqPacket::pair().unwrap();
        peer.set_nonblocking(true).unwrap();
        let cfg = NetConfig {
            pass_time_budget_us: 0,
            ..NetConfig::default()
        };
        (Net::with_backend(dev_end, cfg, mem.clone()).unwrap(), peer)
    }

    /// The vnet header, then a byte per buffer: frames small enough that
    /// a ring of them fits the socket's buffer.
    fn request(drv: &mut MockDriver, bufs: usize) -> Vec<Segment> {
        let len = VNET_HDR_LEN + bufs - 1;
        let frame = drv.alloc(len as u64, 8).unwrap();
        drv.write_mem(frame, &vec![0; len]).unwrap();
        let mut segs = vec![Segment::readable(frame, VNET_HDR_LEN as u32)];
        segs.extend(
            (VNET_HDR_LEN..len).map(|i| Segment::readable(GuestAddress(frame.0 + i as u64), 1)),
        );
        segs
    }
}

/// The event loop of a [`Net`] over a socket pair.
pub type NetLoop = EventManager<Arc<Mutex<Net<SeqPacket>>>>;

/// The device with the default configuration behind the real MMIO
/// transport over a socket pair, in `mem_size` bytes of guest memory
/// ([`DeviceRig`]: reached only the way a guest reaches it), and the
/// socket's other end (non-blocking).
pub fn transport_rig(mem_size: u64) -> (DeviceRig<Net<SeqPacket>>, SeqPacket) {
    let mem = crate::virtio::test_utils::guest_memory(mem_size as usize).unwrap();
    let (dev_end, peer) = SeqPacket::pair().unwrap();
    peer.set_nonblocking(true).unwrap();
    let net = Net::with_backend(dev_end, NetConfig::default(), mem.clone()).unwrap();
    (DeviceRig::new(&mem, net), peer)
}

/// How the buffers of a chain are described to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One ring descriptor per buffer.
    Direct,
    /// One ring descriptor pointing to an indirect table of every buffer.
    Indirect,
    /// The first `n` buffers in ring descriptors, the rest in an indirect
    /// table behind them.
    Mixed(usize),
}

/// The byte a fresh RX buffer holds at `addr` before the device writes it:
/// never 0 or 1, and different from its neighbours, so a byte the device
/// should have written and did not (or wrote in the wrong place) shows.
pub fn stale_byte(addr: u64) -> u8 {
    0x80 | (addr.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 57) as u8
}

/// A frame as the backend delivers it with a header of non-zero bytes
/// (`num_buffers` included, as stale as a TAP leaves it), so a header field
/// the device must write and does not shows.
pub fn noisy_frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f = frame(len, seed);
    for (i, b) in f.iter_mut().take(VNET_HDR_LEN.min(len)).enumerate() {
        *b = 0xe0 | i as u8;
    }
    f
}

/// One frame the driver took from the RX used ring.
#[derive(Debug)]
pub struct RxFrame {
    /// Header and frame, gathered from the chains in used-ring order.
    pub data: Vec<u8>,
    /// The chains, in the order the device used them.
    pub heads: Vec<u16>,
    /// The length the device reported for each.
    pub lens: Vec<u32>,
}

impl RxFrame {
    /// `num_buffers` as the device wrote it.
    pub fn num_buffers(&self) -> u16 {
        u16::from_le_bytes([self.data[10], self.data[11]])
    }

    /// Asserts the frame is `sent` byte for byte, but for `num_buffers`,
    /// which must say how many chains it took.
    pub fn assert_is(&self, sent: &[u8]) {
        assert_eq!(usize::from(self.num_buffers()), self.heads.len());
        assert_eq!(self.data.len(), sent.len(), "frame length");
        assert_eq!(self.data[..10], sent[..10], "header");
        if let Some(i) = (12..sent.len()).find(|&i| self.data[i] != sent[i]) {
            panic!("frame byte {i} is {:#x}, sent {:#x}", self.data[i], sent[i]);
        }
    }
}

impl<B: NetBackend + 'static> NetFixture<B> {
    /// Writes a chain of `bufs` laid out as `layout` (device-writable for
    /// RX) and publishes it; returns its head.
    pub fn add_shaped(&mut self, rx: bool, bufs: &[(u64, u32)], layout: Layout) -> u16 {
        let flag = if rx { VIRTQ_DESC_F_WRITE } else { 0 };
        let direct = match layout {
            Layout::Direct => bufs.len(),
            Layout::Indirect => 0,
            Layout::Mixed(n) => n.min(bufs.len()),
        };
        let mut descs: Vec<(u64, u32, u16)> =
            bufs[..direct].iter().map(|&(a, l)| (a, l, flag)).collect();
        let rest: Vec<(u64, u32, u16)> =
            bufs[direct..].iter().map(|&(a, l)| (a, l, flag)).collect();
        if !rest.is_empty() {
            let table = self.alloc(16 * rest.len() as u64);
            write_indirect_table(&self.mem, GuestAddress(table), &rest).unwrap();
            descs.push((table, 16 * rest.len() as u32, VIRTQ_DESC_F_INDIRECT));
        }
        let q = if rx { &mut self.rxq } else { &mut self.txq };
        q.post_chain(&self.mem, &descs).unwrap()
    }

    /// Posts an RX chain of buffers of `lens` bytes, each in its own
    /// allocation with a gap after it, filled with [`stale_byte`]s.
    pub fn post_rx_shaped(&mut self, lens: &[u32], layout: Layout) -> u16 {
        let bufs: Vec<(u64, u32)> = lens
            .iter()
            .map(|&l| (self.alloc(u64::from(l) + 48), l))
            .collect();
        for &(a, l) in &bufs {
            self.stain(a, l);
        }
        let head = self.add_shaped(true, &bufs, layout);
        assert!(self.rx_chains.insert(head, bufs).is_none(), "head reused");
        head
    }

    /// Fills `len` bytes at `addr` with their stale bytes.
    fn stain(&self, addr: u64, len: u32) {
        let v: Vec<u8> = (addr..addr + u64::from(len)).map(stale_byte).collect();
        self.mem.write_slice(&v, GuestAddress(addr)).unwrap();
    }

    /// Refills every RX buffer posted and not yet returned with its stale
    /// bytes (before a frame arrives, so stale bytes show).
    pub fn restain_rx(&self) {
        for bufs in self.rx_chains.values() {
            for &(a, l) in bufs {
                self.stain(a, l);
            }
        }
    }

    /// Places `frame` in guest memory split into buffers of `lens` bytes
    /// (which must add up to its length; 0 is allowed), each in its own
    /// allocation, laid out as `layout`, and publishes the chain.
    pub fn post_tx_shaped(&mut self, frame: &[u8], lens: &[u32], layout: Layout) -> u16 {
        assert_eq!(lens.iter().map(|&l| l as usize).sum::<usize>(), frame.len());
        let mut off = 0;
        let mut bufs = Vec::new();
        for &l in lens {
            let a = self.alloc(u64::from(l) + 48);
            let l = l as usize;
            self.mem
                .write_slice(&frame[off..off + l], GuestAddress(a))
                .unwrap();
            bufs.push((a, l as u32));
            off += l;
        }
        self.add_shaped(false, &bufs, layout)
    }

    /// Takes the frames the device returned in chains posted with
    /// [`post_rx_shaped`](Self::post_rx_shaped), checking what the driver
    /// relies on: each used id is an outstanding chain (returned once),
    /// every chain of a frame but the last is full, and no byte past a used
    /// length was written.
    pub fn take_rx_frames(&mut self) -> Vec<RxFrame> {
        let used = self.rxq.take_used(&self.mem);
        let mut frames = Vec::new();
        let mut it = used.into_iter().peekable();
        while it.peek().is_some() {
            let mut f = RxFrame {
                data: Vec::new(),
                heads: Vec::new(),
                lens: Vec::new(),
            };
            loop {
                let Some((id, len)) = it.next() else {
                    panic!("frame of {} buffers cut short", f.num_buffers());
                };
                let head = u16::try_from(id).expect("used id above 65535");
                let bufs = self
                    .rx_chains
                    .remove(&head)
                    .unwrap_or_else(|| panic!("used id {id} is not an outstanding chain"));
                let cap: u32 = bufs.iter().map(|b| b.1).sum();
                assert!(len <= cap, "chain {head}: used length {len} > {cap}");
                let mut left = len;
                for &(a, l) in &bufs {
                    let n = left.min(l);
                    f.data.extend(self.read(a, n as usize));
                    let stale: Vec<u8> = (a + u64::from(n)..a + u64::from(l))
                        .map(stale_byte)
                        .collect();
                    assert_eq!(
                        self.read(a + u64::from(n), (l - n) as usize),
                        stale,
                        "chain {head}: bytes past the used length were written"
                    );
                    left -= n;
                }
                f.heads.push(head);
                f.lens.push(len);
                if f.data.len() >= 12 && f.heads.len() >= usize::from(f.num_buffers()) {
                    break;
                }
                assert_eq!(
                    len, cap,
                    "chain {head} is not the last of its frame but not full"
                );
            }
            frames.push(f);
        }
        frames
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

/// What one backend call does instead of (or on top of) its system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails with this errno; the socket is not touched.
    Errno(i32),
    /// Fails with an error of this kind and no errno, as a backend that is
    /// not a file descriptor may; the socket is not touched.
    Kind(std::io::ErrorKind),
    /// Returns 0; the socket is not touched.
    Zero,
    /// RX: reads the next frame but reports only this many bytes. TX: sends
    /// only this many bytes of the frame and says so.
    Short(usize),
    /// Runs `Script::hook` (e.g. a vCPU resetting the device) and then does
    /// the call as usual.
    Hook,
}

/// The faults a [`FaultBackend`] injects, call by call, and what it saw.
#[derive(Default)]
pub struct Script {
    /// What the next receive calls do; `None`: a plain `readv`.
    pub reads: VecDeque<Option<Fault>>,
    /// What the next send calls do; `None`: a plain `writev`.
    pub writes: VecDeque<Option<Fault>>,
    /// Run by `Fault::Hook`, on the device thread, inside the pass.
    pub hook: Option<Box<dyn FnMut() + Send>>,
    /// Receive and send calls so far.
    pub recv_calls: u64,
    pub send_calls: u64,
}

impl Script {
    /// Queues `fault` for receive call number `n` (0: the next), plain calls
    /// before it.
    pub fn read_fault_at(&mut self, n: usize, fault: Fault) {
        self.reads.extend(std::iter::repeat_n(None, n));
        self.reads.push_back(Some(fault));
    }

    /// Queues `fault` for send call number `n` (0: the next).
    pub fn write_fault_at(&mut self, n: usize, fault: Fault) {
        self.writes.extend(std::iter::repeat_n(None, n));
        self.writes.push_back(Some(fault));
    }
}

/// A backend over one end of a socket pair that fails on demand (EAGAIN,
/// EIO, EINVAL, ENOBUFS, 0-byte and short reads and writes) as its
/// [`Script`] says, call by call.
pub struct FaultBackend {
    sock: SeqPacket,
    pub script: Arc<Mutex<Script>>,
}

impl FaultBackend {
    /// A backend and its peer.
    pub fn pair() -> (FaultBackend, SeqPacket) {
        let (sock, peer) = SeqPacket::pair().unwrap();
        let b = FaultBackend {
            sock,
            script: Arc::new(Mutex::new(Script::default())),
        };
        (b, peer)
    }

    /// Takes the next fault for a receive (`rx`) or send call, and runs the
    /// hook if that is it.
    fn next(&self, rx: bool) -> Option<Fault> {
        let mut s = self.script.lock().unwrap();
        let f = if rx {
            s.recv_calls += 1;
            s.reads.pop_front().flatten()
        } else {
            s.send_calls += 1;
            s.writes.pop_front().flatten()
        };
        if f == Some(Fault::Hook) {
            if let Some(h) = s.hook.as_mut() {
                h();
            }
        }
        f
    }
}

impl std::os::fd::AsRawFd for FaultBackend {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.sock.as_raw_fd()
    }
}

impl FaultBackend {
    /// Makes a receive (`rx`) or send call as the script says: a fault in
    /// place of the call, `short(n)` for a short transfer, `call()` for the
    /// real system call.
    fn scripted(
        &self,
        rx: bool,
        short: impl FnOnce(usize) -> std::io::Result<usize>,
        call: impl FnOnce() -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        match self.next(rx) {
            Some(Fault::Errno(e)) => Err(std::io::Error::from_raw_os_error(e)),
            Some(Fault::Kind(k)) => Err(k.into()),
            Some(Fault::Zero) => Ok(0),
            Some(Fault::Short(n)) => short(n),
            None | Some(Fault::Hook) => call(),
        }
    }
}

impl NetBackend for FaultBackend {
    fn recv_frame(&self, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        self.scripted(
            true,
            // A genuine short read: only the first `n` bytes land.
            |n| {
                let mut frame = vec![0u8; bufs.len()];
                let got = self.sock.recv(&mut frame)?;
                Ok(bufs.scatter(&frame[..got.min(n)]))
            },
            || bufs.readv(self.as_raw_fd()),
        )
    }

    fn send_frame(&self, bufs: IoVecs<'_>) -> std::io::Result<usize> {
        self.scripted(
            false,
            |n| {
                let bytes = bufs.gather();
                self.sock.send(&bytes[..n.min(bytes.len())])
            },
            || bufs.writev(self.as_raw_fd()),
        )
    }
}
