// SPDX-License-Identifier: Apache-2.0
//! Driver-side test harness for the vsock device (tests only).
//!
//! [`VsockFixture`] binds the device's listener in a temporary directory,
//! wires a [`Vsock`] (over the real Unix backend or [`FaultyBackend`]) to
//! an `EventManager`, activates it as the transport does and drives its
//! three queues with the shared [`DriverQueue`]. The guest's side is
//! packets: [`VsockFixture::send`] posts a TX chain (header and payload
//! cut into descriptors as a test says), [`VsockFixture::recv`] reads back
//! what the device put in the RX buffers. The host's side is plain Unix
//! sockets, as a host agent would use them.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use event_manager::{EventManager, SubscriberOps};
use vm_memory::{Bytes, GuestAddress};

use crate::virtio::iov::IoVecs;
use crate::virtio::metrics::DeviceMetrics;
use crate::virtio::queue::{GuestRegions, RingFeatures, SplitQueue};
use crate::virtio::test_utils::contract::ContractDevice;
use crate::virtio::test_utils::{guest_memory, DriverQueue, MockDriver, Segment, TestIrq};
use crate::virtio::vsock::backend::{UnixBackend, VsockBackend};
use crate::virtio::vsock::device::features::*;
use crate::virtio::vsock::device::CONFIG_LEN;
use crate::virtio::vsock::packet::{Header, Op, HDR_LEN, TYPE_STREAM};
use crate::virtio::vsock::pass::TX_INDEX;
use crate::virtio::vsock::{Tunables, Vsock, VsockConfig, VsockMetrics};
use crate::virtio::{GuestMemory, Interrupt, VirtioDevice};

/// The guest's CID in every fixture.
pub const CID: u64 = 3;
/// Size of the test guest memory.
pub const MEM_SIZE: u64 = 32 << 20;
const BUF_BASE: u64 = 0x100000;
/// The guest's `buf_alloc` unless a test says otherwise (Linux's default).
pub const GUEST_BUF: u32 = 256 * 1024;

/// Everything the device offers.
pub const FEATURES: u64 =
    1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX | 1 << VIRTIO_RING_F_INDIRECT_DESC;

/// A directory removed with everything in it when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "minivmm-vsock-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Operations of the backend a fault can be injected into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op2 {
    Accept,
    Connect,
    Recv,
    Send,
    ReadBytes,
    WriteBytes,
    Shutdown,
}

/// A fault a [`FaultyBackend`] injects into the next operation of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails with this errno (nothing moved).
    Errno(i32),
    /// Moves at most this many bytes.
    Short(usize),
    /// A `recv` as from a socket with more data than the room offered:
    /// fills it all with `0xab` and reads nothing from the socket (more
    /// than a socket buffer holds can be in one pass so).
    Fill,
}

/// The real backend, failing on demand.
#[derive(Default)]
pub struct FaultyBackend {
    pub inner: UnixBackend,
    pub faults: HashMap<Op2, VecDeque<Fault>>,
    pub calls: HashMap<Op2, u64>,
    /// The bytes each `readv` offered room for, in order.
    pub recv_room: Vec<usize>,
}

impl FaultyBackend {
    pub fn inject(&mut self, op: Op2, faults: &[Fault]) {
        self.faults.entry(op).or_default().extend(faults);
    }

    fn next(&mut self, op: Op2) -> Option<Fault> {
        *self.calls.entry(op).or_default() += 1;
        self.faults.get_mut(&op).and_then(VecDeque::pop_front)
    }

    fn errno(&mut self, op: Op2) -> io::Result<Option<usize>> {
        match self.next(op) {
            Some(Fault::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
            Some(Fault::Short(n)) => Ok(Some(n)),
            Some(Fault::Fill) | None => Ok(None),
        }
    }
}

/// The first `n` bytes' worth of `v`'s segments.
fn cut<R>(v: IoVecs<'_>, n: usize, f: impl FnOnce(IoVecs<'_>) -> R) -> R {
    let mut buf = vec![0u8; n.min(v.len())];
    // Only the test's transfers go through here: a bounce copy keeps the
    // cut simple (the device's own path is the zero-copy one).
    let data = v.gather();
    let n = buf.len();
    buf.copy_from_slice(&data[..n]);
    crate::virtio::iov::host_buf(&mut buf, f)
}

impl VsockBackend for FaultyBackend {
    type Stream = UnixStream;

    fn accept(&mut self, l: &UnixListener) -> io::Result<UnixStream> {
        self.errno(Op2::Accept)?;
        self.inner.accept(l)
    }
    fn connect(&mut self, path: &Path) -> io::Result<UnixStream> {
        self.errno(Op2::Connect)?;
        self.inner.connect(path)
    }
    fn recv(&mut self, s: &mut UnixStream, bufs: IoVecs<'_>) -> io::Result<usize> {
        self.recv_room.push(bufs.len());
        if self.faults.get(&Op2::Recv).and_then(|q| q.front()) == Some(&Fault::Fill) {
            self.next(Op2::Recv);
            return Ok(bufs.scatter(&vec![0xab; bufs.len()]));
        }
        match self.errno(Op2::Recv)? {
            None => self.inner.recv(s, bufs),
            Some(n) => {
                let mut tmp = vec![0u8; n.min(bufs.len())];
                let got = self.inner.read_bytes(s, &mut tmp)?;
                Ok(bufs.scatter(&tmp[..got]))
            }
        }
    }
    fn send(&mut self, s: &mut UnixStream, bufs: IoVecs<'_>) -> io::Result<usize> {
        match self.errno(Op2::Send)? {
            None => self.inner.send(s, bufs),
            Some(n) => cut(bufs, n, |v| self.inner.send(s, v)),
        }
    }
    fn read_bytes(&mut self, s: &mut UnixStream, buf: &mut [u8]) -> io::Result<usize> {
        self.errno(Op2::ReadBytes)?;
        self.inner.read_bytes(s, buf)
    }
    fn write_bytes(&mut self, s: &mut UnixStream, buf: &[u8]) -> io::Result<usize> {
        match self.errno(Op2::WriteBytes)? {
            None => self.inner.write_bytes(s, buf),
            Some(n) => self.inner.write_bytes(s, &buf[..n.min(buf.len())]),
        }
    }
    fn shutdown_write(&mut self, s: &mut UnixStream) -> io::Result<()> {
        self.errno(Op2::Shutdown)?;
        self.inner.shutdown_write(s)
    }
}

/// A packet as the guest sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pkt {
    pub hdr: Header,
    pub data: Vec<u8>,
}

impl Pkt {
    pub fn op(&self) -> Option<Op> {
        Op::from_u16(self.hdr.op)
    }
}

/// A header from the guest's `guest_port` to the host's `host_port`.
pub fn guest_hdr(guest_port: u32, host_port: u32, op: Op) -> Header {
    Header {
        src_cid: CID,
        dst_cid: 2,
        src_port: guest_port,
        dst_port: host_port,
        kind: TYPE_STREAM,
        op: op as u16,
        buf_alloc: GUEST_BUF,
        ..Header::default()
    }
}

/// The device over a listener in a temporary directory, driven from the
/// driver side.
pub struct VsockFixture<B: VsockBackend + 'static = UnixBackend> {
    pub dir: TempDir,
    pub uds: PathBuf,
    pub mem: GuestMemory,
    pub dev: Arc<Mutex<Vsock<B>>>,
    pub evmgr: EventManager<Arc<Mutex<Vsock<B>>>>,
    pub qs: [DriverQueue; 3],
    pub irq: Arc<TestIrq>,
    pub metrics: Arc<VsockMetrics>,
    /// Where each posted RX chain's buffer starts, by head.
    rx_bufs: HashMap<u16, u64>,
    next_buf: u64,
}

/// Short time-outs, so tests see them.
pub fn test_tunables() -> Tunables {
    Tunables {
        connect_timeout: Duration::from_millis(200),
        shutdown_timeout: Duration::from_millis(200),
        ..Tunables::default()
    }
}

impl VsockFixture<UnixBackend> {
    /// An activated device with the test bounds.
    pub fn new() -> Self {
        Self::with(test_tunables(), UnixBackend, true)
    }
}

impl VsockFixture<FaultyBackend> {
    /// An activated device over a [`FaultyBackend`].
    pub fn faulty() -> Self {
        Self::with(test_tunables(), FaultyBackend::default(), true)
    }

    /// How many calls of kind `op` the backend has been asked for.
    pub fn calls(&self, op: Op2) -> u64 {
        self.dev()
            .backend_mut()
            .calls
            .get(&op)
            .copied()
            .unwrap_or(0)
    }
}

impl<B: VsockBackend + 'static> VsockFixture<B> {
    /// A device with bounds `tun` over `backend`, activated if `activate`.
    pub fn with(tun: Tunables, backend: B, activate: bool) -> Self {
        let dir = TempDir::new();
        let uds = dir.0.join("v.sock");
        let mem = guest_memory(MEM_SIZE as usize).unwrap();
        let cfg = VsockConfig {
            id: "vsock0".into(),
            guest_cid: CID,
            uds_path: uds.clone(),
        };
        // The driver's rings as large as the device allows (at most 1024:
        // each has 64 KiB of guest memory).
        let qsize = tun.queue_size;
        assert!(qsize <= 1024);
        let dev = Vsock::with_backend(cfg, tun, mem.clone(), backend).unwrap();
        let metrics = dev.metrics();
        let dev = Arc::new(Mutex::new(dev));
        let mut evmgr = EventManager::new().unwrap();
        evmgr.add_subscriber(dev.clone());
        let qs = std::array::from_fn(|i| {
            DriverQueue::packed(&mem, GuestAddress(0x10000 + 0x10000 * i as u64), qsize)
        });
        let mut f = VsockFixture {
            dir,
            uds,
            mem,
            dev,
            evmgr,
            qs,
            irq: Arc::new(TestIrq::default()),
            metrics,
            rx_bufs: HashMap::new(),
            next_buf: BUF_BASE,
        };
        if activate {
            f.activate(FEATURES);
        }
        f
    }

    /// Activates the device as the transport does at DRIVER_OK.
    pub fn activate(&mut self, features: u64) {
        let regions = Arc::new(GuestRegions::new(&self.mem).unwrap());
        let mut queues = Vec::new();
        for q in &mut self.qs {
            *q = DriverQueue::packed(&self.mem, q.layout().desc_table, q.size());
            let sq = SplitQueue::new(
                regions.clone(),
                q.ring_addrs(),
                q.size(),
                RingFeatures::from_bits(features),
            )
            .unwrap();
            queues.push(sq);
        }
        self.rx_bufs.clear();
        let irq: Arc<dyn Interrupt> = self.irq.clone();
        self.dev().activate(features, queues, irq).unwrap();
        self.run_until_idle();
    }

    pub fn dev(&self) -> MutexGuard<'_, Vsock<B>> {
        self.dev.lock().unwrap()
    }

    /// `len` bytes of guest memory, 16-aligned; starts over at the end.
    pub fn alloc(&mut self, len: u64) -> u64 {
        if self.next_buf + len >= MEM_SIZE {
            self.next_buf = BUF_BASE;
        }
        let a = self.next_buf;
        self.next_buf = (self.next_buf + len + 15) & !15;
        a
    }

    /// Runs the loop until nothing is ready; returns the iterations.
    pub fn run_until_idle(&mut self) -> usize {
        for i in 0..10_000 {
            if self.evmgr.run_with_timeout(0).unwrap() == 0 {
                return i;
            }
        }
        panic!("event loop never went idle: {}", self.metrics.to_json());
    }

    /// Runs the loop for about `ms` milliseconds, waiting for events.
    pub fn run_for(&mut self, ms: u64) {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            self.evmgr.run_with_timeout(5).unwrap();
        }
    }

    pub fn kick(&self, q: usize) {
        self.dev().queue_events()[q].write(1).unwrap();
    }

    /// Posts a TX chain of `hdr` and `data` cut at `cuts` (byte offsets
    /// into header + data), publishes it and kicks; returns the head.
    pub fn post_tx(&mut self, hdr: &Header, data: &[u8], cuts: &[usize]) -> u16 {
        let mut bytes = hdr.to_bytes().to_vec();
        bytes.extend_from_slice(data);
        let mut segs = Vec::new();
        let mut at = 0;
        for end in cuts.iter().copied().chain([bytes.len()]) {
            let end = end.min(bytes.len());
            if end <= at {
                continue;
            }
            let a = self.alloc((end - at) as u64);
            self.mem
                .write_slice(&bytes[at..end], GuestAddress(a))
                .unwrap();
            segs.push(Segment::readable(GuestAddress(a), (end - at) as u32));
            at = end;
        }
        let head = self.qs[1].add_chain(&self.mem, &segs).unwrap();
        self.qs[1].publish(&self.mem).unwrap();
        self.kick(1);
        head
    }

    /// Sends one packet as Linux 6.1 does (header and payload in two
    /// descriptors) and runs the loop until idle.
    pub fn send(&mut self, hdr: &Header, data: &[u8]) {
        let mut h = *hdr;
        h.len = data.len() as u32;
        self.post_tx(&h, data, &[HDR_LEN]);
        self.run_until_idle();
        // TX chains always come back with length 0.
        for e in self.qs[1].used(&self.mem).unwrap() {
            assert_eq!(e.len, 0);
        }
    }

    /// Posts `n` RX chains of a header descriptor and a `payload`-byte one
    /// (Linux 6.1's layout) and kicks.
    pub fn post_rx(&mut self, n: usize, payload: u32) {
        for _ in 0..n {
            let a = self.alloc(HDR_LEN as u64 + u64::from(payload));
            let segs = [
                Segment::writable(GuestAddress(a), HDR_LEN as u32),
                Segment::writable(GuestAddress(a + HDR_LEN as u64), payload),
            ];
            let head = self.qs[0].add_chain(&self.mem, &segs).unwrap();
            self.rx_bufs.insert(head, a);
        }
        self.qs[0].publish(&self.mem).unwrap();
        self.kick(0);
    }

    /// Posts an RX chain of the given descriptor lengths.
    pub fn post_rx_shaped(&mut self, lens: &[u32]) {
        let total: u64 = lens.iter().map(|&l| u64::from(l)).sum();
        let a = self.alloc(total);
        let mut at = a;
        let segs: Vec<_> = lens
            .iter()
            .map(|&l| {
                let s = Segment::writable(GuestAddress(at), l);
                at += u64::from(l);
                s
            })
            .collect();
        let head = self.qs[0].add_chain(&self.mem, &segs).unwrap();
        self.rx_bufs.insert(head, a);
        self.qs[0].publish(&self.mem).unwrap();
        self.kick(0);
    }

    /// The packets the device put in RX buffers since the last call.
    pub fn recv(&mut self) -> Vec<Pkt> {
        self.run_until_idle();
        self.rx_used()
    }

    /// The packets in the RX used ring now, without running the loop.
    pub fn rx_used(&mut self) -> Vec<Pkt> {
        let used = self.qs[0].used(&self.mem).unwrap();
        used.into_iter()
            .map(|e| {
                let a = self.rx_bufs.remove(&(e.id as u16)).expect("a posted chain");
                assert!(
                    e.len as usize >= HDR_LEN,
                    "RX used length {} < header",
                    e.len
                );
                let mut b = [0u8; HDR_LEN];
                self.mem.read_slice(&mut b, GuestAddress(a)).unwrap();
                let hdr = Header::parse(&b);
                assert_eq!(e.len as usize, HDR_LEN + hdr.len as usize, "used length");
                let mut data = vec![0u8; hdr.len as usize];
                self.mem
                    .read_slice(&mut data, GuestAddress(a + HDR_LEN as u64))
                    .unwrap();
                Pkt { hdr, data }
            })
            .collect()
    }

    /// RX chains posted and not used yet.
    pub fn rx_outstanding(&self) -> usize {
        self.rx_bufs.len()
    }

    /// The RX chains the device gave back since the last call without a
    /// packet (used length 0: refused), forgotten as posted.
    pub fn rx_refused(&mut self) -> Vec<u16> {
        self.run_until_idle();
        let used = self.qs[0].used(&self.mem).unwrap();
        used.into_iter()
            .map(|e| {
                assert_eq!(e.len, 0, "a packet where a refusal was expected");
                let head = e.id as u16;
                self.rx_bufs.remove(&head).expect("a posted chain");
                head
            })
            .collect()
    }

    /// Connects to the device's listener as a host agent would.
    pub fn host_connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.uds).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s
    }

    /// A host listener for guest connections to `port`.
    pub fn host_listen(&self, port: u32) -> UnixListener {
        let mut p = self.uds.clone().into_os_string();
        p.push(format!("_{port}"));
        UnixListener::bind(p).unwrap()
    }

    pub fn metric(&self, f: impl Fn(&VsockMetrics) -> &AtomicU64) -> u64 {
        f(&self.metrics).load(Ordering::Relaxed)
    }

    /// A host connection to guest port `port`, accepted by the guest:
    /// returns the host's stream and the host port the device assigned.
    pub fn open_from_host(&mut self, port: u32) -> (UnixStream, u32) {
        let mut s = self.host_connect();
        s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
        let host_port = self.expect_request(port);
        self.send(&guest_hdr(port, host_port, Op::Response), &[]);
        let want = format!("OK {host_port}\n");
        let mut got = vec![0u8; want.len()];
        s.read_exact(&mut got).unwrap();
        assert_eq!(String::from_utf8(got).unwrap(), want);
        (s, host_port)
    }

    /// The REQUEST a host connection to guest port `port` sent the guest
    /// (RX buffers posted first if none are left); its host port.
    pub fn expect_request(&mut self, port: u32) -> u32 {
        self.run_until_idle();
        if self.rx_outstanding() == 0 {
            self.post_rx(8, 4096);
        }
        let pkts = self.recv();
        let req = pkts
            .iter()
            .find(|p| p.op() == Some(Op::Request))
            .expect("REQUEST");
        assert_eq!(req.hdr.dst_port, port);
        req.hdr.src_port
    }

    /// Posts one 4-byte event buffer and runs the loop: the event the
    /// device wrote into it, or `None` while it has none to give (the
    /// buffer stays posted).
    pub fn read_event(&mut self) -> Option<u32> {
        let a = self.alloc(4);
        self.mem.write_obj(u32::MAX, GuestAddress(a)).unwrap();
        let seg = Segment::writable(GuestAddress(a), 4);
        let head = self.qs[2].add_chain(&self.mem, &[seg]).unwrap();
        self.qs[2].publish(&self.mem).unwrap();
        self.kick(2);
        self.run_until_idle();
        let used = self.qs[2].used(&self.mem).unwrap();
        if used.is_empty() {
            return None;
        }
        assert_eq!(used, [(u32::from(head), 4)]);
        Some(self.mem.read_obj(GuestAddress(a)).unwrap())
    }

    /// A guest connection from `guest_port` to the host listener `l` on
    /// `port`: returns the host's accepted stream.
    pub fn open_from_guest(&mut self, l: &UnixListener, guest_port: u32, port: u32) -> UnixStream {
        self.send(&guest_hdr(guest_port, port, Op::Request), &[]);
        if self.rx_outstanding() == 0 {
            self.post_rx(8, 4096);
        }
        // Credit updates other connections were owed may come first, and
        // may have taken every buffer posted.
        let others = |p: &Pkt| p.op() == Some(Op::CreditUpdate) && p.hdr.dst_port != guest_port;
        let mut pkts = self.recv();
        pkts.retain(|p| !others(p));
        if pkts.is_empty() {
            self.post_rx(8, 4096);
            pkts = self.recv();
            pkts.retain(|p| !others(p));
        }
        assert_eq!(pkts.len(), 1, "{pkts:?}");
        assert_eq!(pkts[0].op(), Some(Op::Response));
        assert_eq!(
            (pkts[0].hdr.src_port, pkts[0].hdr.dst_port),
            (port, guest_port)
        );
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s
    }
}

/// Reads from `s` until `n` bytes came or 2 s passed.
pub fn read_n(s: &mut UnixStream, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    s.read_exact(&mut out).unwrap();
    out
}

/// Whether the host end sees EOF (not just nothing to read).
pub fn host_sees_eof(s: &mut UnixStream) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        // Closed with bytes it had not read: the peer sees a reset.
        Err(e) => e.kind() == io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

/// The vsock device in the contract suite: its TX queue, which it drains
/// on a kick alone. A request is an RST for a connection that does not
/// exist (which the device takes and answers with nothing), its header in
/// the first buffer and a payload byte in each of the others.
impl ContractDevice for Vsock<UnixBackend> {
    type Keep = TempDir;
    const QUEUE: usize = TX_INDEX;
    const CONFIG_LEN: u64 = CONFIG_LEN as u64;
    const REFUSED: &'static str = "malformed_packets";

    fn make(mem: &GuestMemory) -> (Self, TempDir) {
        let dir = TempDir::new();
        let cfg = VsockConfig {
            id: "vsock".into(),
            guest_cid: CID,
            uds_path: dir.0.join("v.sock"),
        };
        (Vsock::new(cfg, mem.clone()).unwrap(), dir)
    }

    fn request(drv: &mut MockDriver, bufs: usize) -> Vec<Segment> {
        let payload = bufs - 1;
        let hdr = Header {
            len: payload as u32,
            ..guest_hdr(1000, 52, Op::Rst)
        };
        let at = drv.alloc(HDR_LEN as u64, 8).unwrap();
        drv.write_mem(at, &hdr.to_bytes()).unwrap();
        let mut segs = vec![Segment::readable(at, HDR_LEN as u32)];
        let data = drv.alloc(payload as u64, 8).unwrap();
        drv.write_mem(data, &vec![0x5a; payload]).unwrap();
        segs.extend((0..payload).map(|i| Segment::readable(GuestAddress(data.0 + i as u64), 1)));
        segs
    }
}
