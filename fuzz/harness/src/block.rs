// SPDX-License-Identifier: Apache-2.0
//! Target `block_datapath`: the real virtio-blk device, on its event loop,
//! behind its MMIO transport, over an image file, driven by arbitrary guest
//! requests and arbitrary ring and descriptor contents.
//!
//! The input picks the drive (image size in sectors plus a partial tail,
//! read-only or not, cache type, engine, queue size) and a sequence of
//! steps: structured requests (any type, any sector, data split over any
//! number of buffers of any length, the header split or not, the status
//! byte readable or writable, data buffers the wrong way round, through an
//! indirect table or not), raw descriptors and avail entries anywhere,
//! kicks, event-loop iterations, and resets with re-initialisation.
//!
//! Oracles, whatever the input:
//! - once the guest stops, the event loop goes idle within a bounded number
//!   of iterations (a pass that yields is re-queued, each consumes work);
//! - the image file keeps its size (no request reaches past the capacity),
//!   and a read-only image keeps its bytes.
//!
//! And while the guest has written only structured requests (nothing raw
//! that could rewrite a ring or a chain the device holds), per activation:
//! - every used id is a head the driver published and has not had back;
//!   every published request comes back exactly once;
//! - the used length is at most the chain's device-writable bytes;
//! - the status byte of a request with a writable status byte is OK, IOERR
//!   or UNSUPP, and it is OK exactly when the request is well formed (the
//!   model below says so), IOERR or UNSUPP otherwise;
//! - the image matches a byte model: OUT writes it, IN data equals it, and
//!   the used length of a good IN is its data length plus the status byte.
//!   Requests in flight together may complete in any order (the io_uring
//!   engine does), so a sector that two overlapping writes in flight
//!   together, or a write and a read, both touch is not checked until a
//!   later write makes it known again.
//!
//! The model of a well-formed request follows virtio 1.1 §5.2.6: a 16-byte
//! device-readable header (type, reserved, sector), then data of a multiple
//! of 512 bytes going the way the type says, then one device-writable
//! status byte as the last byte; IN and OUT within the capacity; OUT only
//! on a writable drive. GET_ID is well formed with at least 20 writable
//! bytes of data; FLUSH with no data. Other types are answered UNSUPP when
//! their header and status byte are in place; DISCARD and WRITE_ZEROES are
//! left to the device's unit tests (their support depends on the host file
//! system), so the oracle accepts any of the three statuses for them and
//! stops modelling the image's bytes in their range.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use devices::virtio::block::{Block, BlockConfig, CacheType, IoEngine};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::test_utils::{MockDriver, Segment};
use devices::virtio::{GuestMemory, VirtioDevice};
use event_manager::{EventManager, SubscriberOps};
use vm_memory::{Address, Bytes, GuestAddress};

const SECTOR: u64 = 512;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
const T_DISCARD: u32 = 11;
const T_WRITE_ZEROES: u32 = 13;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;
/// Event-loop iterations in which the device must go idle once the guest
/// stops; each pass consumes at least one request.
const IDLE_ITERATIONS: usize = 4096;
/// Guest memory: the driver's rings and buffers come from the first 768
/// KiB, raw descriptors point anywhere.
const MEM_LEN: usize = 0x10_0000;
const ALLOC_LEN: u64 = 0xc_0000;
/// The drive id GET_ID must return (padded with zeros to 20 bytes).
const DRIVE_ID: &str = "fuzzdisk";

/// The drive.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct DriveSetup {
    /// Whole sectors of the image, folded into 1..=64.
    pub sectors: u8,
    /// Bytes after the last whole sector, folded into 0..512.
    pub tail: u16,
    /// Open the image read-only.
    pub read_only: bool,
    /// `Writeback` (FLUSH is an fdatasync) rather than `Unsafe`.
    pub writeback: bool,
    /// The io_uring engine rather than one system call per request.
    pub async_engine: bool,
    /// log2 of the queue size, folded into 0..=8.
    pub queue_size_log2: u8,
    /// Features to decline, one bit per offered feature bit (VERSION_1 is
    /// always accepted).
    pub decline: u64,
}

/// A length: mostly whole sectors, sometimes anything.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Len {
    kind: u8,
    value: u16,
}

impl Len {
    fn get(self) -> u32 {
        match self.kind % 8 {
            0..=5 => (u32::from(self.value) % 9) * SECTOR as u32,
            6 => u32::from(self.value) % 64,
            _ => u32::from(self.value) % 0x2000,
        }
    }
}

/// A structured request.
#[derive(Debug, Clone, Arbitrary)]
pub struct Request {
    /// The request type: mostly a known one.
    kind: u8,
    raw_type: u32,
    /// The sector: mostly near the capacity, sometimes anything.
    sector_kind: u8,
    sector: u64,
    /// The data buffers (at most 6).
    data: Vec<Len>,
    /// Split the 16-byte header over two descriptors at this offset (1..16).
    header_split: Option<u8>,
    /// Header length change: 16 unless this is set (then folded to 0..32).
    header_len: Option<u8>,
    /// Make the status byte device-readable.
    status_readable: bool,
    /// Make the data buffers go the other way.
    data_flipped: bool,
    /// Status buffer length: 1 unless set (folded to 0..4).
    status_len: Option<u8>,
    /// Through an indirect table (when negotiated).
    indirect: bool,
    /// The byte OUT data is filled with (each byte offset by its index).
    fill: u8,
}

/// One step of the guest.
#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    /// A structured request, published and kicked.
    Request(Request),
    /// A structured request published without a kick.
    Quiet(Request),
    /// A descriptor written anywhere in the table.
    RawDesc {
        /// Table index (mod the queue size).
        index: u16,
        /// Buffer address.
        addr: u64,
        /// Buffer length.
        len: u32,
        /// Flags.
        flags: u16,
        /// Next index.
        next: u16,
    },
    /// An avail entry naming any head, published and kicked.
    RawAvail {
        /// The head.
        head: u16,
    },
    /// Bytes written anywhere in guest memory.
    RawWrite {
        /// Where.
        addr: u32,
        /// What.
        bytes: Vec<u8>,
    },
    /// A kick.
    Kick,
    /// Event-loop iterations (folded into 1..=8).
    Run(u8),
    /// A reset and a new initialisation.
    Reset,
}

/// A whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// The drive.
    pub drive: DriveSetup,
    /// What the guest does (at most 64 steps are taken).
    pub steps: Vec<Step>,
}

/// Runs one input; with `MINIVMM_FUZZ_DEBUG` set, prints it first.
pub fn run(data: &[u8]) {
    crate::with_input(data, |input: &Input| {
        if std::env::var_os("MINIVMM_FUZZ_DEBUG").is_some() {
            eprintln!("{input:#?}");
        }
        Rig::run(input)
    });
}

/// What a posted request expects back.
#[derive(Debug)]
struct Posted {
    /// Device-writable bytes in the chain.
    writable: u32,
    /// Where its status byte is, when it has a writable one as its last byte.
    status_at: Option<GuestAddress>,
    /// The status the model predicts: `None` where any status is allowed.
    expect: Option<u8>,
    /// A good IN: where its data went, the sector and length.
    read_back: Option<(Vec<(GuestAddress, u32)>, u64)>,
    /// A good GET_ID: where the first 20 bytes went.
    id_at: Option<Vec<(GuestAddress, u32)>>,
    /// Its total data length (for the used length of a good IN).
    data_len: u32,
    /// The sectors a good IN or OUT covers, and whether it writes them.
    range: Option<(u64, u64, bool)>,
    /// A good IN that overlapped a write in flight: its data is not checked.
    tainted: bool,
    /// A good OUT: where its bytes go in the model, applied once the
    /// request is published (a chain that does not fit is never seen).
    model_write: Option<(usize, Vec<u8>)>,
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// A temporary image file, removed on drop.
struct Image {
    path: PathBuf,
}

impl Image {
    fn new(len: u64, fill: &[u8]) -> Image {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        // Prefer memory: the target must not wear a disk down.
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() {
            dir.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let path = dir.join(format!(
            "minivmm-fuzz-blk-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let mut f = File::create(&path).expect("create the image");
        f.write_all(&fill[..len as usize]).expect("fill the image");
        Image { path }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut f = File::open(&self.path).expect("open the image");
        let mut v = Vec::new();
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.read_to_end(&mut v).expect("read the image");
        v
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

type Loop = EventManager<Arc<Mutex<Block>>>;

struct Rig {
    driver: MockDriver,
    em: Loop,
    image: Image,
    model: Vec<u8>,
    /// Sectors whose content the model cannot know (see the module doc).
    unknown: Vec<bool>,
    /// The model holds: false for good once the guest wrote raw bytes or
    /// descriptors (a request the rig did not build may have written).
    model_valid: bool,
    capacity: u64,
    cfg: BlockConfig,
    features: u64,
    queue_size: u16,
    posted: HashMap<u16, Posted>,
    /// Nothing but structured requests since the last initialisation.
    clean: bool,
    /// Where the next data buffer goes (a ring over the buffer area).
    next_buf: u64,
    buf_start: u64,
    /// No buffer of the request being built is placed yet.
    request_start: bool,
}

impl Rig {
    fn run(input: &Input) {
        let d = input.drive;
        let sectors = u64::from(d.sectors % 64) + 1;
        let tail = u64::from(d.tail) % SECTOR;
        let len = sectors * SECTOR + tail;
        let fill: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        let image = Image::new(len, &fill);
        let mut cfg = BlockConfig::new(DRIVE_ID, &image.path);
        cfg.read_only = d.read_only;
        cfg.cache_type = if d.writeback {
            CacheType::Writeback
        } else {
            CacheType::Unsafe
        };
        cfg.io_engine = if d.async_engine {
            IoEngine::Async
        } else {
            IoEngine::Sync
        };
        cfg.queue_size = 1 << (d.queue_size_log2 % 9);
        let mem = GuestMemory::from_ranges(&[(GuestAddress(0), MEM_LEN)]).expect("guest memory");
        let block = Block::new(cfg.clone(), mem.clone()).expect("a valid drive");
        let block = Arc::new(Mutex::new(block));
        let offered = block.lock().expect("device lock").avail_features();
        let dev: Arc<Mutex<dyn VirtioDevice>> = block.clone();
        let transport = MmioTransport::new(mem.clone(), dev).expect("transport");
        let driver = MockDriver::with_alloc_range(mem, transport, GuestAddress(0), ALLOC_LEN);
        let mut em = Loop::new().expect("event manager");
        em.add_subscriber(block);
        let version_1 = 1u64 << 32;
        let features = (offered & !d.decline) | (offered & version_1);
        let mut rig = Rig {
            driver,
            em,
            model: fill[..(sectors * SECTOR) as usize].to_vec(),
            unknown: vec![false; sectors as usize],
            model_valid: true,
            capacity: sectors,
            image,
            queue_size: cfg.queue_size,
            cfg,
            features,
            posted: HashMap::new(),
            clean: true,
            next_buf: 0,
            buf_start: 0,
            request_start: true,
        };
        rig.init();
        let before = rig.image.bytes();
        for step in input.steps.iter().take(64) {
            rig.step(step);
        }
        rig.settle();
        let after = rig.image.bytes();
        assert_eq!(after.len(), before.len(), "the image changed size");
        if rig.cfg.read_only {
            assert!(after == before, "a read-only image changed");
        }
        if rig.model_valid {
            for (i, unknown) in rig.unknown.iter().enumerate() {
                let r = i * SECTOR as usize..(i + 1) * SECTOR as usize;
                if !*unknown && after[r.clone()] != rig.model[r.clone()] {
                    let at = r.clone().find(|&b| after[b] != rig.model[b]).unwrap_or(0);
                    panic!(
                        "sector {i} of the image differs from the model from byte {at}: \
                         image {:02x?}, model {:02x?}",
                        &after[at..(at + 8).min(r.end)],
                        &rig.model[at..(at + 8).min(r.end)]
                    );
                }
            }
        }
    }

    /// The guest did something the rig did not build: the used-ring rules
    /// stop applying until the next initialisation, the image model for good.
    fn taint(&mut self) {
        self.clean = false;
        self.model_valid = false;
    }

    fn init(&mut self) {
        self.driver.reset();
        self.posted.clear();
        self.clean = true;
        // Rings first; the buffers take what is left of the area.
        if self
            .driver
            .init_with_queue_size(self.features, Some(self.queue_size))
            .is_err()
        {
            self.clean = false;
            return;
        }
        let start = self.driver.alloc(1, 4096).expect("room after the rings");
        self.buf_start = start.raw_value();
        self.next_buf = self.buf_start;
    }

    /// Room for `len` bytes in the buffer area; the area is reused from its
    /// start once it is full (only after every request came back, so no
    /// buffer the device holds is handed out twice).
    fn buf(&mut self, len: u32) -> Option<GuestAddress> {
        let len = u64::from(len.max(1));
        if self.next_buf + len > ALLOC_LEN {
            // Only before the request's first buffer: a request's own
            // buffers (its indirect table too) must never overlap.
            if !self.posted.is_empty() || !self.request_start {
                return None;
            }
            self.next_buf = self.buf_start;
            if self.next_buf + len > ALLOC_LEN {
                return None;
            }
        }
        let at = self.next_buf;
        self.next_buf += len;
        self.request_start = false;
        Some(GuestAddress(at))
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Request(r) => {
                if self.post(r) {
                    self.driver.kick(0);
                }
            }
            Step::Quiet(r) => {
                self.post(r);
            }
            Step::RawDesc {
                index,
                addr,
                len,
                flags,
                next,
            } => {
                let Ok(layout) = self.driver.layout(0) else {
                    return;
                };
                let i = u64::from(*index % layout.size);
                let bytes = devices::virtio::test_utils::desc_bytes(*addr, *len, *flags, *next);
                let at = layout.desc_table.unchecked_add(i * 16);
                let _ = self.driver.mem().write_slice(&bytes, at);
                self.taint();
            }
            Step::RawAvail { head } => {
                if let Ok(q) = self.driver.queue_mut(0) {
                    let (q, mem) = q;
                    let _ = q.push_avail(mem, *head);
                    let _ = q.publish(mem);
                    self.driver.kick(0);
                }
                self.taint();
            }
            Step::RawWrite { addr, bytes } => {
                let at = GuestAddress(u64::from(*addr) % MEM_LEN as u64);
                let n = bytes.len().min(MEM_LEN - at.raw_value() as usize);
                let _ = self.driver.mem().write_slice(&bytes[..n], at);
                self.taint();
            }
            Step::Kick => self.driver.kick(0),
            Step::Run(n) => {
                for _ in 0..=(n % 8) {
                    let _ = self.em.run_with_timeout(0).expect("epoll");
                }
                self.collect();
            }
            Step::Reset => {
                self.settle();
                self.init();
            }
        }
    }

    /// Builds, places and publishes one request; false when it does not fit.
    fn post(&mut self, r: &Request) -> bool {
        if self.driver.layout(0).is_err() {
            return false;
        }
        self.request_start = true;
        let negotiated_indirect = self.features & (1 << 28) != 0;
        let kind = match r.kind % 10 {
            0 | 1 => T_IN,
            2 | 3 => T_OUT,
            4 => T_FLUSH,
            5 => T_GET_ID,
            6 => T_DISCARD,
            7 => T_WRITE_ZEROES,
            _ => r.raw_type,
        };
        let sector = match r.sector_kind % 4 {
            0 | 1 => r.sector % (self.capacity + 2),
            2 => self.capacity.saturating_sub(r.sector % 4),
            _ => r.sector,
        };
        let header_len = r.header_len.map_or(16, |l| u32::from(l % 32));
        let status_len = r.status_len.map_or(1, |l| u32::from(l % 4));
        let data: Vec<u32> = r.data.iter().take(6).map(|l| l.get()).collect();

        // The header.
        let mut header = [0u8; 16];
        header[..4].copy_from_slice(&kind.to_le_bytes());
        header[8..].copy_from_slice(&sector.to_le_bytes());
        let mut segs = Vec::new();
        let Some(hdr_at) = self.buf(header_len.max(16)) else {
            return false;
        };
        let _ = self.driver.mem().write_slice(&header, hdr_at);
        match r.header_split.map(|s| u32::from(s % 15) + 1) {
            Some(split) if header_len > split => {
                segs.push(Segment::readable(hdr_at, split));
                segs.push(Segment::readable(
                    hdr_at.unchecked_add(u64::from(split)),
                    header_len - split,
                ));
            }
            _ if header_len > 0 => segs.push(Segment::readable(hdr_at, header_len)),
            _ => {}
        }

        // The data.
        let device_writes_data = matches!(kind, T_IN | T_GET_ID) ^ r.data_flipped;
        let mut data_bufs = Vec::new();
        for (i, &len) in data.iter().enumerate() {
            let Some(at) = self.buf(len) else {
                return false;
            };
            if !device_writes_data {
                let bytes: Vec<u8> = (0..len)
                    .map(|j| r.fill.wrapping_add((i as u32 * 31 + j) as u8))
                    .collect();
                let _ = self.driver.mem().write_slice(&bytes, at);
            } else {
                // A pattern the device must overwrite on a good IN.
                let _ = self.driver.mem().write_slice(&vec![0xee; len as usize], at);
            }
            data_bufs.push((at, len));
            segs.push(Segment {
                addr: at,
                len,
                device_writable: device_writes_data,
            });
        }

        // The status byte.
        let Some(status_at) = self.buf(status_len) else {
            return false;
        };
        let _ = self
            .driver
            .mem()
            .write_slice(&[0xff; 4][..status_len as usize], status_at);
        if status_len > 0 {
            segs.push(Segment {
                addr: status_at,
                len: status_len,
                device_writable: !r.status_readable,
            });
        }
        if segs.is_empty() {
            return false;
        }

        // What the model says.
        let data_len: u32 = data.iter().sum();
        // The chain walk refuses an indirect table with more entries than
        // the queue has (virtio 1.1 §2.6.5.3.1): such a chain comes back
        // with no status written. Zero-length buffers are walked over.
        let walk_ok =
            !(r.indirect && negotiated_indirect && segs.len() > usize::from(self.queue_size));
        let has_status = status_len == 1 && !r.status_readable && walk_ok;
        let header_ok = header_len == 16;
        let dirs_ok = !r.data_flipped || data.is_empty();
        let in_range = |s: u64, len: u32| {
            u64::from(len) % SECTOR == 0
                && s.checked_mul(SECTOR)
                    .and_then(|b| b.checked_add(u64::from(len)))
                    .is_some_and(|end| end <= self.capacity * SECTOR)
        };
        let mut expect = None;
        let mut read_back = None;
        let mut id_at = None;
        let mut range = None;
        let mut model_write = None;
        if has_status && header_ok {
            expect = Some(match kind {
                // Zero-length transfers: the spec is silent, either answer.
                T_IN | T_OUT if data_len == 0 => return self.publish_unmodelled(segs, r),
                T_IN if dirs_ok && in_range(sector, data_len) => {
                    read_back = Some((data_bufs.clone(), sector));
                    range = Some((sector, u64::from(data_len) / SECTOR, false));
                    S_OK
                }
                T_OUT if dirs_ok && in_range(sector, data_len) && !self.cfg.read_only => {
                    let mut bytes = Vec::with_capacity(data_len as usize);
                    for (i, &len) in data.iter().enumerate() {
                        bytes.extend(
                            (0..len).map(|j| r.fill.wrapping_add((i as u32 * 31 + j) as u8)),
                        );
                    }
                    model_write = Some(((sector * SECTOR) as usize, bytes));
                    range = Some((sector, u64::from(data_len) / SECTOR, true));
                    S_OK
                }
                T_IN | T_OUT => S_IOERR,
                T_FLUSH if data.is_empty() => S_OK,
                T_GET_ID if dirs_ok && data_len >= 20 => {
                    id_at = Some(data_bufs.clone());
                    S_OK
                }
                // A FLUSH with data or a GET_ID with less room than the
                // id: malformed, but a device may also serve what fits.
                T_FLUSH | T_GET_ID => return self.publish_unmodelled(segs, r),
                T_DISCARD | T_WRITE_ZEROES => {
                    // Support depends on the host; stop modelling what such
                    // a request may touch: the whole image, as its ranges
                    // are in its data.
                    self.taint();
                    return self.publish(segs, r.indirect && negotiated_indirect, None);
                }
                _ => S_UNSUPP,
            });
        }
        let writable = segs
            .iter()
            .filter(|s| s.device_writable)
            .map(|s| s.len)
            .sum();
        let posted = Posted {
            writable,
            status_at: has_status.then_some(status_at),
            expect,
            read_back,
            id_at,
            data_len,
            range,
            tainted: false,
            model_write: None,
        };
        let mut posted = posted;
        posted.model_write = model_write;
        self.publish(segs, r.indirect && negotiated_indirect, Some(posted))
    }

    /// A request whose outcome the model does not predict.
    fn publish_unmodelled(&mut self, segs: Vec<Segment>, r: &Request) -> bool {
        let indirect = r.indirect && self.features & (1 << 28) != 0;
        self.publish(segs, indirect, None)
    }

    fn range_unknown(&self, start: u64, n: u64) -> bool {
        (start..start + n).any(|s| self.unknown[s as usize])
    }

    /// Before a request on `range` is posted: a new write over a write in
    /// flight makes the sectors unknown, over a read in flight taints that
    /// read, and alone makes its sectors known again. Returns whether a new
    /// read is tainted (a write in flight overlaps it).
    fn note_overlaps(&mut self, range: (u64, u64), writes: bool) -> bool {
        let mut conflict = false;
        for p in self.posted.values_mut() {
            let Some((s, n, w)) = p.range else { continue };
            if !overlaps(range, (s, n)) {
                continue;
            }
            if w {
                conflict = true;
            } else if writes {
                p.tainted = true;
            }
        }
        if writes {
            for s in range.0..range.0 + range.1 {
                self.unknown[s as usize] = conflict;
            }
        }
        !writes && conflict
    }

    fn publish(&mut self, segs: Vec<Segment>, indirect: bool, posted: Option<Posted>) -> bool {
        let head = if indirect {
            let Some(table) = self.buf(16 * segs.len() as u32) else {
                return false;
            };
            self.driver.add_chain_indirect(0, &segs, 0, table)
        } else {
            self.driver.add_chain(0, &segs)
        };
        let Ok(head) = head else {
            return false;
        };
        if self.driver.publish(0).is_err() {
            return false;
        }
        let writable = segs
            .iter()
            .filter(|s| s.device_writable)
            .map(|s| s.len)
            .sum();
        let posted = posted.unwrap_or(Posted {
            writable,
            status_at: None,
            expect: None,
            read_back: None,
            id_at: None,
            data_len: 0,
            range: None,
            tainted: false,
            model_write: None,
        });
        let mut posted = posted;
        if let Some((start, n, writes)) = posted.range {
            posted.tainted = self.note_overlaps((start, n), writes);
        }
        if let Some((off, bytes)) = posted.model_write.take() {
            self.model[off..off + bytes.len()].copy_from_slice(&bytes);
        }
        if self.clean {
            assert!(
                self.posted.insert(head, posted).is_none(),
                "head {head} handed out while the device holds it"
            );
        }
        true
    }

    /// Runs the loop until it is idle (and every request came back, while
    /// the model holds), then checks what came back.
    fn settle(&mut self) {
        self.driver.kick(0);
        let is_async = self.cfg.io_engine == IoEngine::Async;
        let mut idle_rounds = 0;
        for _ in 0..IDLE_ITERATIONS {
            // Ready work first, without waiting; the io_uring engine
            // completes in the kernel, so it gets a millisecond to do so
            // while requests are out (or, when the rig cannot know, twice).
            let mut n = self.em.run_with_timeout(0).expect("epoll");
            let waiting = self.clean && !self.posted.is_empty();
            let unknown = !self.clean;
            if n == 0 && is_async && (waiting || (unknown && idle_rounds < 2)) {
                n = self.em.run_with_timeout(1).expect("epoll");
            }
            self.collect();
            if n == 0 {
                idle_rounds += 1;
                let enough = if is_async && unknown { 2 } else { 1 };
                if idle_rounds >= enough && (!self.clean || self.posted.is_empty()) {
                    break;
                }
            } else {
                idle_rounds = 0;
            }
        }
        if self.clean {
            assert!(
                self.posted.is_empty(),
                "{} requests never came back: {:?}",
                self.posted.len(),
                self.posted.keys().collect::<Vec<_>>()
            );
        }
    }

    /// Takes the used entries and checks each against what was posted.
    fn collect(&mut self) {
        let Ok(used) = self.driver.used(0) else {
            return;
        };
        if !self.clean {
            return;
        }
        let mem = self.driver.mem().clone();
        for u in used {
            let head = u.id as u16;
            let p = self
                .posted
                .remove(&head)
                .unwrap_or_else(|| panic!("used id {} was not outstanding", u.id));
            assert!(
                u.len <= p.writable,
                "used length {} beyond the {} writable bytes",
                u.len,
                p.writable
            );
            let Some(at) = p.status_at else {
                continue;
            };
            let status: u8 = mem.read_obj(at).expect("status byte");
            assert!(
                matches!(status, S_OK | S_IOERR | S_UNSUPP),
                "status {status:#x} is no status: used {u:?}, {p:?}"
            );
            if let Some(expect) = p.expect {
                assert_eq!(status, expect, "head {head}: {p:?}");
            }
            if p.read_back.is_some() {
                assert_eq!(u.len, p.data_len + 1, "used length of a good IN");
            }
            if let Some((bufs, sector)) = p.read_back.as_ref().filter(|_| {
                !p.tainted && self.model_valid && {
                    let (s, n, _) = p.range.expect("a good IN has a range");
                    !self.range_unknown(s, n)
                }
            }) {
                let mut off = (*sector * SECTOR) as usize;
                for &(at, len) in bufs {
                    let mut got = vec![0u8; len as usize];
                    mem.read_slice(&mut got, at).expect("data");
                    assert!(
                        got == self.model[off..off + len as usize],
                        "IN data differs from the image at byte {off}"
                    );
                    off += len as usize;
                }
            }
            if let Some(bufs) = &p.id_at {
                let mut got = Vec::new();
                for &(at, len) in bufs {
                    let mut b = vec![0u8; len as usize];
                    mem.read_slice(&mut b, at).expect("id");
                    got.extend_from_slice(&b);
                }
                let mut want = [0u8; 20];
                want[..DRIVE_ID.len()].copy_from_slice(DRIVE_ID.as_bytes());
                assert_eq!(&got[..20], &want, "GET_ID");
            }
        }
    }
}
