// SPDX-License-Identifier: Apache-2.0
//! Driver-side test harness for the block device (tests only).
//!
//! [`BlockFixture`] puts an image in a temporary directory, wires a
//! [`Block`] over it (or over [`FaultyBackend`], which fails on demand) to
//! an `EventManager`, activates it as the transport does and drives its
//! queue with the shared [`DriverQueue`]. Requests are built from
//! [`Part`]s, so a test says exactly how a request is cut into descriptors
//! and in which direction each goes, and what it reads back is what a
//! guest sees: status bytes, used lengths, guest memory, the file.
//!
//! [`mmio_rig`] instead puts the device behind the real MMIO transport
//! ([`DeviceRig`]) and reaches it only through a [`MockDriver`]'s register
//! accesses.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress};

use crate::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use crate::virtio::block::backend::{BlockBackend, DiskInfo, FallocMode, FileBackend, OpKind};
use crate::virtio::block::device::config_offsets;
use crate::virtio::block::device::features::*;
use crate::virtio::block::request::{take_range, HEADER_LEN};
use crate::virtio::block::{Block, BlockConfig, BlockError, BlockMetrics, IoEngine};
use crate::virtio::queue::IoSeg;
pub use crate::virtio::test_utils::checks::TempDir;
use crate::virtio::test_utils::contract::ContractDevice;
pub use crate::virtio::test_utils::DirectRig;
use crate::virtio::test_utils::{guest_memory, DeviceRig, MockDriver, UsedElem, BUF_BASE};
pub use crate::virtio::test_utils::{DriverQueue, Rng, Segment};
use crate::virtio::{GuestMemory, VirtioDevice};

pub use crate::virtio::block::request::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES,
};

/// Size of the test guest memory.
pub const MEM_SIZE: u64 = 64 << 20;

/// A feature bit.
pub const fn bit(b: u32) -> u64 {
    1 << b
}

/// What a Linux guest acks of what the device offers (all of it).
pub const BASE_FEATURES: u64 = bit(VIRTIO_F_VERSION_1)
    | bit(VIRTIO_BLK_F_BLK_SIZE)
    | bit(VIRTIO_BLK_F_SEG_MAX)
    | bit(VIRTIO_RING_F_EVENT_IDX)
    | bit(VIRTIO_RING_F_INDIRECT_DESC)
    | bit(VIRTIO_BLK_F_FLUSH)
    | bit(VIRTIO_BLK_F_DISCARD)
    | bit(VIRTIO_BLK_F_WRITE_ZEROES)
    | bit(VIRTIO_BLK_F_RO);

/// A fault a [`FaultyBackend`] injects into the next operation of a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fails with this errno (nothing moved).
    Errno(i32),
    /// Moves at most this many bytes (a short transfer).
    Short(usize),
}

/// A real image that fails on demand: each operation (a system call with
/// `Sync`, a completion with `Async`) takes the next fault queued for its
/// kind, if any.
pub struct FaultyBackend {
    pub inner: FileBackend,
    /// What `info` reports instead of the file's, if set.
    pub info: Option<DiskInfo>,
    pub faults: HashMap<OpKind, VecDeque<Fault>>,
    /// Operations seen, by kind.
    pub calls: HashMap<OpKind, u64>,
}

impl FaultyBackend {
    pub fn new(inner: FileBackend) -> Self {
        FaultyBackend {
            inner,
            info: None,
            faults: HashMap::new(),
            calls: HashMap::new(),
        }
    }

    pub fn inject(&mut self, kind: OpKind, faults: &[Fault]) {
        self.faults.entry(kind).or_default().extend(faults);
    }

    fn next(&mut self, kind: OpKind) -> Option<Fault> {
        *self.calls.entry(kind).or_default() += 1;
        self.faults.get_mut(&kind).and_then(VecDeque::pop_front)
    }

    /// Faults queued and not used yet.
    pub fn pending(&self) -> usize {
        self.faults.values().map(VecDeque::len).sum()
    }

    fn transfer(
        &mut self,
        kind: OpKind,
        segs: &[IoSeg],
        f: impl FnOnce(&mut FileBackend, &[IoSeg]) -> io::Result<usize>,
    ) -> io::Result<usize> {
        match self.next(kind) {
            None => f(&mut self.inner, segs),
            Some(Fault::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
            Some(Fault::Short(n)) => {
                let mut cut = Vec::new();
                take_range(segs, 0, n, &mut cut);
                if cut.is_empty() {
                    return Ok(0);
                }
                f(&mut self.inner, &cut)
            }
        }
    }

    fn simple(
        &mut self,
        kind: OpKind,
        f: impl FnOnce(&mut FileBackend) -> io::Result<()>,
    ) -> io::Result<()> {
        match self.next(kind) {
            Some(Fault::Errno(e)) => Err(io::Error::from_raw_os_error(e)),
            _ => f(&mut self.inner),
        }
    }
}

impl AsRawFd for FaultyBackend {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl BlockBackend for FaultyBackend {
    fn info(&self) -> DiskInfo {
        self.info.unwrap_or_else(|| self.inner.info())
    }
    fn read_at(&mut self, segs: &[IoSeg], offset: u64) -> io::Result<usize> {
        self.transfer(OpKind::Read, segs, |b, s| b.read_at(s, offset))
    }
    fn write_at(&mut self, segs: &[IoSeg], offset: u64) -> io::Result<usize> {
        self.transfer(OpKind::Write, segs, |b, s| b.write_at(s, offset))
    }
    fn datasync(&mut self) -> io::Result<()> {
        self.simple(OpKind::Flush, |b| b.datasync())
    }
    fn fallocate(&mut self, mode: FallocMode, offset: u64, len: u64) -> io::Result<()> {
        self.simple(OpKind::Fallocate, |b| b.fallocate(mode, offset, len))
    }
    fn completed(&mut self, kind: OpKind, res: i32) -> i32 {
        match self.next(kind) {
            None => res,
            Some(Fault::Errno(e)) => -e,
            // The kernel moved `res` bytes; the device is told fewer and
            // moves the rest again (the same bytes: reads and writes of
            // the same range are idempotent).
            Some(Fault::Short(n)) => res.min(n as i32),
        }
    }
}

/// One buffer of a request as the test lays it out.
#[derive(Debug, Clone)]
pub enum Part {
    /// Device-readable bytes the driver wrote.
    Out(Vec<u8>),
    /// A device-writable buffer of this many bytes (filled with 0xee).
    In(u32),
}

/// Where the parts of a posted request ended up.
#[derive(Debug, Clone)]
pub struct Posted {
    pub head: u16,
    /// Each part's guest address and length.
    pub parts: Vec<(u64, u32)>,
}

/// How a chain is described to the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Direct,
    /// The first `n` parts in ring descriptors, the rest in an indirect table.
    Indirect(usize),
}

/// `struct virtio_blk_req`'s header.
pub fn header(kind: u32, sector: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_LEN);
    h.extend_from_slice(&kind.to_le_bytes());
    h.extend_from_slice(&0u32.to_le_bytes());
    h.extend_from_slice(&sector.to_le_bytes());
    h
}

/// One `struct virtio_blk_discard_write_zeroes`.
pub fn dwz(sector: u64, num: u32, flags: u32) -> Vec<u8> {
    let mut v = sector.to_le_bytes().to_vec();
    v.extend_from_slice(&num.to_le_bytes());
    v.extend_from_slice(&flags.to_le_bytes());
    v
}

/// `len` pseudo-random bytes.
pub fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

/// A bucket of `size` tokens refilled every `refill_ms`, with no burst.
pub fn bucket(size: u64, refill_ms: u64) -> Option<TokenBucketConfig> {
    Some(TokenBucketConfig {
        size,
        one_time_burst: 0,
        refill_time: refill_ms,
    })
}

/// A limit of `size` requests every `refill_ms`, whatever their bytes.
pub fn ops_limit(size: u64, refill_ms: u64) -> RateLimiterConfig {
    RateLimiterConfig {
        bandwidth: None,
        ops: bucket(size, refill_ms),
    }
}

/// A device over an image in a temporary directory, activated straight and
/// driven from the driver side: the shared [`DirectRig`] (the device, its
/// event loop, its interrupt, reached through `Deref`) with the image and
/// the request queue's ring.
pub struct BlockFixture<B: BlockBackend + 'static = FileBackend> {
    pub rig: DirectRig<Block<B>>,
    /// Guest memory (the rig's, kept here too so a test borrows it beside
    /// the ring).
    pub mem: GuestMemory,
    pub dir: TempDir,
    pub path: PathBuf,
    pub q: DriverQueue,
    pub metrics: Arc<BlockMetrics>,
}

impl<B: BlockBackend + 'static> std::ops::Deref for BlockFixture<B> {
    type Target = DirectRig<Block<B>>;
    fn deref(&self) -> &Self::Target {
        &self.rig
    }
}

impl<B: BlockBackend + 'static> std::ops::DerefMut for BlockFixture<B> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.rig
    }
}

/// A fresh memory for a fixture.
pub fn test_memory() -> GuestMemory {
    crate::virtio::test_utils::guest_memory(MEM_SIZE as usize).unwrap()
}

impl BlockFixture<FileBackend> {
    /// A device over an image holding `image`, configured by `cfg` (its
    /// path is replaced), activated with `features`.
    pub fn new(image: &[u8], cfg: impl FnOnce(&mut BlockConfig), features: u64) -> Self {
        let dir = TempDir::new();
        let path = dir.file("disk.img", image);
        Self::over(dir, path, cfg, features)
    }

    /// [`BlockFixture::new`] on `engine`, configured further by `cfg`, with
    /// everything offered acked.
    pub fn with_engine(engine: IoEngine, image: &[u8], cfg: impl FnOnce(&mut BlockConfig)) -> Self {
        let cfg = |c: &mut BlockConfig| {
            c.io_engine = engine;
            cfg(c);
        };
        Self::new(image, cfg, BASE_FEATURES)
    }

    /// [`BlockFixture::new`] over an image the caller made at `path`, in
    /// `dir`.
    pub fn over(
        dir: TempDir,
        path: PathBuf,
        cfg: impl FnOnce(&mut BlockConfig),
        features: u64,
    ) -> Self {
        let open = |p: &Path, ro| Some(FileBackend::open(p, ro).unwrap());
        Self::build(dir, path, cfg, features, open).expect("opened")
    }

    /// [`BlockFixture::new`] over an image opened with `O_DIRECT`
    /// ([`FileBackend::open_direct`]), or `None` where the temporary
    /// directory's file system refuses direct I/O (EINVAL: tmpfs).
    pub fn direct(image: &[u8], cfg: impl FnOnce(&mut BlockConfig), features: u64) -> Option<Self> {
        let dir = TempDir::new();
        let path = dir.file("disk.img", image);
        let open = |p: &Path, ro| match FileBackend::open_direct(p, ro) {
            Ok(b) => Some(b),
            Err(BlockError::Open { source, .. }) if source.raw_os_error() == Some(libc::EINVAL) => {
                None
            }
            Err(e) => panic!("{e}"),
        };
        Self::build(dir, path, cfg, features, open)
    }
}

impl BlockFixture<FaultyBackend> {
    /// [`BlockFixture::new`] over a [`FaultyBackend`].
    pub fn faulty(image: &[u8], cfg: impl FnOnce(&mut BlockConfig), features: u64) -> Self {
        let dir = TempDir::new();
        let path = dir.file("disk.img", image);
        let open = |p: &Path, ro| Some(FaultyBackend::new(FileBackend::open(p, ro).unwrap()));
        Self::build(dir, path, cfg, features, open).expect("opened")
    }
}

impl<B: BlockBackend + 'static> BlockFixture<B> {
    /// A drive over the image at `path` (in `dir`) opened by `open` (`None`
    /// if it would not open), configured by `cfg`, activated with
    /// `features`.
    fn build(
        dir: TempDir,
        path: PathBuf,
        cfg: impl FnOnce(&mut BlockConfig),
        features: u64,
        open: impl FnOnce(&Path, bool) -> Option<B>,
    ) -> Option<Self> {
        let mut c = BlockConfig::new("testdisk", &path);
        cfg(&mut c);
        c.path = path.clone();
        let backend = open(&path, c.read_only)?;
        let mem = test_memory();
        let blk = Block::with_backend(c, mem.clone(), backend).unwrap();
        let qs = blk.queue_max_sizes()[0];
        let mut h = BlockFixture {
            metrics: blk.metrics(),
            q: DriverQueue::packed(&mem, GuestAddress(0x10000), qs),
            rig: DirectRig::new(mem.clone(), blk),
            mem,
            dir,
            path,
        };
        h.activate(features);
        Some(h)
    }

    /// Activates the device as the transport does at DRIVER_OK.
    pub fn activate(&mut self, features: u64) {
        self.q = DriverQueue::packed(&self.mem, self.q.layout().desc_table, self.q.size());
        let ring = self.q.ring_addrs();
        self.rig.activate_rings(features, &[ring]).unwrap();
        self.run_until_idle();
    }

    /// Allocates `len` bytes of guest memory (16-byte aligned); starts over
    /// when the memory is used up (buffers of answered requests are free).
    pub fn alloc(&mut self, len: u64) -> u64 {
        if self.next_buf + len >= MEM_SIZE {
            self.next_buf = BUF_BASE;
        }
        self.rig.alloc(len)
    }

    /// Moves the next allocation on so that `after` bytes past it lie at a
    /// multiple of `align` (a power of two).
    pub fn align_next(&mut self, align: u64, after: u64) {
        let at = (self.next_buf + after).next_multiple_of(align);
        self.next_buf = at - after;
    }

    /// Places `parts` in guest memory and makes the chain available (not
    /// kicked).
    pub fn post(&mut self, parts: &[Part], layout: Layout) -> Posted {
        let mut segs = Vec::new();
        let mut placed = Vec::new();
        for p in parts {
            match p {
                Part::Out(bytes) => {
                    let a = self.alloc(bytes.len() as u64);
                    self.mem.write_slice(bytes, GuestAddress(a)).unwrap();
                    segs.push(Segment::readable(GuestAddress(a), bytes.len() as u32));
                    placed.push((a, bytes.len() as u32));
                }
                Part::In(len) => {
                    let a = self.alloc(u64::from(*len));
                    self.mem
                        .write_slice(&vec![0xee; *len as usize], GuestAddress(a))
                        .unwrap();
                    segs.push(Segment::writable(GuestAddress(a), *len));
                    placed.push((a, *len));
                }
            }
        }
        let head = match layout {
            Layout::Direct => self.q.add_chain(&self.mem, &segs).unwrap(),
            Layout::Indirect(direct) => {
                let table = self.alloc(16 * segs.len() as u64);
                self.q
                    .add_chain_indirect(&self.mem, &segs, direct, GuestAddress(table))
                    .unwrap()
            }
        };
        self.q.publish(&self.mem).unwrap();
        Posted {
            head,
            parts: placed,
        }
    }

    /// An OUT of `data` at `sector`: header, data, status, one descriptor each.
    pub fn post_write(&mut self, sector: u64, data: &[u8]) -> Posted {
        self.post(
            &[
                Part::Out(header(VIRTIO_BLK_T_OUT, sector)),
                Part::Out(data.to_vec()),
                Part::In(1),
            ],
            Layout::Direct,
        )
    }

    /// An IN of `len` bytes at `sector`.
    pub fn post_read(&mut self, sector: u64, len: u32) -> Posted {
        self.post(
            &[
                Part::Out(header(VIRTIO_BLK_T_IN, sector)),
                Part::In(len),
                Part::In(1),
            ],
            Layout::Direct,
        )
    }

    /// A DISCARD or WRITE_ZEROES (`kind`) of one segment: header (its
    /// sector field unused, so 0), the segment, status.
    pub fn post_dwz(&mut self, kind: u32, sector: u64, num: u32, flags: u32) -> Posted {
        self.post(
            &[
                Part::Out(header(kind, 0)),
                Part::Out(dwz(sector, num, flags)),
                Part::In(1),
            ],
            Layout::Direct,
        )
    }

    /// Reads `len` bytes at `sector` as one request and returns them,
    /// asserting that it alone came back, answered OK.
    #[track_caller]
    pub fn read_ok(&mut self, sector: u64, len: u32) -> Vec<u8> {
        let p = self.post_read(sector, len);
        self.go();
        assert_answer(self, &p, VIRTIO_BLK_S_OK, len + 1);
        self.read(p.parts[1].0, len as usize)
    }

    /// A request with no data: header and status.
    pub fn post_bare(&mut self, kind: u32, sector: u64) -> Posted {
        self.post(
            &[Part::Out(header(kind, sector)), Part::In(1)],
            Layout::Direct,
        )
    }

    pub fn kick(&self) {
        self.dev().queue_events()[0].write(1).unwrap();
    }

    /// Runs the loop until nothing is ready and nothing is in flight;
    /// returns the iterations.
    pub fn run_until_idle(&mut self) -> usize {
        for i in 0..100_000 {
            let in_flight = self.dev().engine.as_ref().map_or(0, |e| e.in_flight());
            let ran = self.run_once(if in_flight > 0 { 100 } else { 0 });
            if ran == 0 && in_flight == 0 {
                return i;
            }
        }
        panic!("event loop never went idle");
    }

    /// Kicks and runs the loop until idle.
    pub fn go(&mut self) {
        self.kick();
        self.run_until_idle();
    }

    /// Runs the loop until `n` used entries came back (or 5 s passed);
    /// returns them and the time it took.
    pub fn collect(&mut self, n: usize) -> (Vec<(u32, u32)>, Duration) {
        let start = Instant::now();
        let mut used = Vec::new();
        while used.len() < n && start.elapsed() < Duration::from_secs(5) {
            self.run_once(20);
            used.extend(self.used());
        }
        (used, start.elapsed())
    }

    /// The used entries since the last call, as `(id, len)`.
    pub fn used(&mut self) -> Vec<(u32, u32)> {
        let used = self.q.used(&self.mem).unwrap();
        used.into_iter().map(|e| (e.id, e.len)).collect()
    }

    /// The status byte of `p` (its last part's last byte).
    pub fn status(&self, p: &Posted) -> u8 {
        let &(a, l) = p.parts.last().unwrap();
        self.read(a + u64::from(l) - 1, 1)[0]
    }

    /// The file's bytes.
    pub fn image(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }

    pub fn metric(&self, f: impl Fn(&BlockMetrics) -> &AtomicU64) -> u64 {
        f(&self.metrics).load(Ordering::Relaxed)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Asserts one request came back with `status` and `len`, and nothing else.
#[track_caller]
pub fn assert_answer<B: BlockBackend>(h: &mut BlockFixture<B>, p: &Posted, status: u8, len: u32) {
    let used = h.used();
    assert_eq!(used, vec![(u32::from(p.head), len)], "used entries");
    assert_eq!(h.status(p), status, "status byte");
}

/// The block device in the contract suite: a 1 MiB image, `Sync` (no
/// completion arrives after the loop went idle), reads of 512-byte buffers.
impl ContractDevice for Block<FileBackend> {
    type Keep = TempDir;
    const QUEUE: usize = 0;
    const CONFIG_LEN: u64 = config_offsets::LEN as u64;
    const REFUSED: &'static str = "malformed_requests";

    fn make(mem: &GuestMemory) -> (Self, TempDir) {
        let dir = TempDir::new();
        let path = dir.file("disk.img", &vec![0x11; 1 << 20]);
        let mut cfg = BlockConfig::new("contract", path);
        cfg.io_engine = IoEngine::Sync;
        (Block::new(cfg, mem.clone()).unwrap(), dir)
    }

    fn request(drv: &mut MockDriver, bufs: usize) -> Vec<Segment> {
        let hdr = drv.alloc(16, 16).unwrap();
        drv.write_mem(hdr, &header(VIRTIO_BLK_T_IN, 0)).unwrap();
        let mut segs = vec![Segment::readable(hdr, 16)];
        for _ in 2..bufs {
            segs.push(Segment::writable(drv.alloc(512, 16).unwrap(), 512));
        }
        segs.push(Segment::writable(drv.alloc(1, 1).unwrap(), 1));
        segs
    }
}

/// A drive named `id` over the image at `path`, behind the real MMIO
/// transport ([`DeviceRig`]), in 16 MiB of guest memory; not initialised.
pub fn mmio_rig(id: &str, path: &Path) -> DeviceRig<Block> {
    let mem = guest_memory(16 << 20).unwrap();
    let blk = Block::new(BlockConfig::new(id, path), mem.clone()).unwrap();
    DeviceRig::new(&mem, blk)
}

/// What the block suites do with a drive behind its transport.
impl DeviceRig<Block> {
    /// Acks what the device offers of [`BASE_FEATURES`] (a driver may ack
    /// only that) and runs the loop until idle; returns the acked features.
    pub fn init(&mut self) -> u64 {
        let acked = self.drv.device_features() & BASE_FEATURES;
        self.drv.init(acked).unwrap();
        self.run_until_idle();
        acked
    }

    /// The capacity field of the configuration space, in sectors.
    pub fn capacity(&mut self) -> u64 {
        u64::from(self.drv.read_reg(0x100)) | u64::from(self.drv.read_reg(0x104)) << 32
    }

    /// Submits an IN of `len` bytes at `sector` on queue 0; returns where
    /// the data and the status byte land.
    pub fn submit_read(&mut self, sector: u64, len: u32) -> (GuestAddress, GuestAddress) {
        let hdr = self.drv.alloc(16, 16).unwrap();
        self.drv
            .write_mem(hdr, &header(VIRTIO_BLK_T_IN, sector))
            .unwrap();
        let buf = self.drv.alloc(u64::from(len), 16).unwrap();
        let st = self.drv.alloc(1, 1).unwrap();
        self.drv
            .submit(
                0,
                &[
                    Segment::readable(hdr, 16),
                    Segment::writable(buf, len),
                    Segment::writable(st, 1),
                ],
            )
            .unwrap();
        (buf, st)
    }

    /// Runs the loop until it is idle with something used on queue 0
    /// (completions may need a moment with the io_uring), or about 2 s
    /// passed; returns the used entries.
    pub fn wait_used(&mut self) -> Vec<UsedElem> {
        for _ in 0..100 {
            if self.run_once(20) == 0 && self.drv.used_idx(0).unwrap() > 0 {
                break;
            }
        }
        self.drv.used(0).unwrap()
    }
}
