// SPDX-License-Identifier: Apache-2.0
//! Scenario `block`: the virtio-blk device against a raw loop on the same
//! image file, in the same run.
//!
//! The device is driven from the driver side, as the network device is: the
//! real `Block` on its event loop behind its MMIO transport, requests
//! (16-byte header, one data buffer, status byte) in guest memory, `DEPTH`
//! of them in flight, each used one replaced by the next. The raw loop does
//! what the device's `Sync` engine should cost at best: one `pread` or
//! `pwrite` per request of the same size at the same offsets, one at a
//! time, into (or from) the device's own data buffers in turn.
//!
//! Cells: 4 KiB random reads and writes, 128 KiB sequential reads and
//! writes, on a file in the page cache (written once before the first
//! window), for each engine. A cell's figure is the median over interleaved
//! rounds of requests per second and of CPU time per request of the one
//! thread that runs the driver and the device (the driver harness's turns
//! are in it, and also timed apart and reported, see [`DeviceRig`]; the
//! io_uring engine's kernel-side work is in it when the kernel completes
//! inline, as it does for the page cache). `O_DIRECT` is not offered by the device, so there is
//! no direct-I/O cell.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use devices::virtio::block::{Block, BlockConfig, FileBackend, IoEngine};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::queue::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use devices::virtio::test_utils::{desc_bytes, guest_memory, MockDriver, Rng};
use devices::virtio::{DeviceMetrics, VirtioDevice};
use event_manager::{EventManager, SubscriberOps};
use serde_json::{json, Value};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use crate::rig::host_mem::HostRange;
use crate::rig::{ring_ranges, ring_slot, LeanRing};
use crate::scenarios::Timing;
use crate::stats::{medians, ratio, Medians, Window};
use crate::sys;

/// Requests in flight on the device (Linux's virtio-blk keeps up to the
/// queue size; 16 keeps the rig's memory small).
const DEPTH: usize = 16;
const SECTOR: u64 = 512;

/// One workload.
#[derive(Debug, Clone, Copy)]
struct Workload {
    name: &'static str,
    size: u32,
    write: bool,
    random: bool,
}

const WORKLOADS: &[Workload] = &[
    Workload {
        name: "randread_4k",
        size: 4096,
        write: false,
        random: true,
    },
    Workload {
        name: "randwrite_4k",
        size: 4096,
        write: true,
        random: true,
    },
    Workload {
        name: "seqread_128k",
        size: 128 << 10,
        write: false,
        random: false,
    },
    Workload {
        name: "seqwrite_128k",
        size: 128 << 10,
        write: true,
        random: false,
    },
];

/// Where the next request goes.
struct Offsets {
    rng: Rng,
    next: u64,
    file_len: u64,
    w: Workload,
}

impl Offsets {
    fn new(w: Workload, file_len: u64) -> Self {
        Offsets {
            rng: Rng(0x5eed_b10c),
            next: 0,
            file_len,
            w,
        }
    }

    fn next(&mut self) -> u64 {
        let size = u64::from(self.w.size);
        let slots = self.file_len / size;
        let slot = if self.w.random {
            self.rng.next_u64() % slots
        } else {
            let s = self.next % slots;
            self.next += 1;
            s
        };
        slot * size
    }
}

/// Requests per second and CPU ns per request of one window.
#[derive(Debug, Clone, Copy)]
struct Sample {
    per_s: f64,
    cpu_ns: f64,
    /// Requests counted.
    n: u64,
    /// Wall ns per request in the driver harness's turns (0 for the raw
    /// loop, which has none).
    harness_ns: f64,
}

/// Runs `batch` through the warm-up, then counts a window of it;
/// `batch(counting)` returns the requests it completed.
fn window<F: FnMut(bool) -> Result<u64>>(t: &Timing, mut batch: F) -> Result<Sample> {
    let clock = sys::current_thread_cpu_clock();
    let warm_end = Instant::now() + t.warmup;
    while Instant::now() < warm_end {
        batch(false)?;
    }
    let (t0, c0) = (Instant::now(), sys::clock_ns(clock));
    let mut n = 0;
    while t0.elapsed() < t.window {
        n += batch(true)?;
    }
    let (dt, dc) = (t0.elapsed(), sys::clock_ns(clock) - c0);
    Ok(Sample {
        per_s: n as f64 / dt.as_secs_f64(),
        cpu_ns: dc as f64 / n.max(1) as f64,
        n,
        harness_ns: 0.0,
    })
}

/// The raw loop: one positioned read or write per request, into (or from)
/// the device's `DEPTH` data buffers in turn. The very pages the device's
/// requests use, so neither side copies into memory the other keeps hotter
/// in the CPU's caches, and with `O_DIRECT` both hand the disk the same
/// physical pages (with buffers of its own, the raw loop's 128 KiB direct
/// reads ran 7,600 to 10,800 a second from run to run, the device's 8,000
/// to 8,400 throughout, as the pages happened to lie).
fn raw_window(
    t: &Timing,
    file: &File,
    w: Workload,
    file_len: u64,
    bufs: &[HostRange],
) -> Result<Sample> {
    let mut off = Offsets::new(w, file_len);
    let mut i = 0;
    window(t, |_| {
        for _ in 0..64 {
            bufs[i].transfer(file, off.next(), w.write)?;
            i = (i + 1) % bufs.len();
        }
        Ok(64)
    })
}

/// `path` opened for direct I/O, or `None` where its file system refuses
/// it (EINVAL: tmpfs).
fn open_direct(path: &PathBuf) -> Result<Option<File>> {
    use std::os::unix::fs::OpenOptionsExt;
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(e) => Err(e).context("open the image with O_DIRECT"),
    }
}

/// The device with `DEPTH` requests in flight, and a lean driver in front
/// of it (as `rig.rs`'s for the network device): each slot's three
/// descriptors (header, data, status byte) are written once, at addresses
/// that never change, so posting a request is the header's two words, the
/// status byte and one avail slot through host pointers, then a release
/// store of `avail.idx` for the batch; reaping is a used-index load and two
/// 32-bit reads per answer. Kicks write the queue's eventfd directly, as
/// KVM's ioeventfd does. `MockDriver` (through the real `MmioTransport`)
/// only negotiates and sets the queue up.
struct DeviceRig {
    /// Negotiation and queue set-up; kept for the transport it owns.
    _driver: MockDriver,
    em: EventManager<Arc<Mutex<Block>>>,
    /// Each slot's header, data buffer and status byte.
    hdrs: Vec<HostRange>,
    data: Vec<HostRange>,
    status: Vec<HostRange>,
    avail: HostRange,
    used: HostRange,
    size: u16,
    next_avail: u16,
    last_used: u16,
    /// `avail.idx` at the last kick decision (EVENT_IDX).
    published: u16,
    in_flight: usize,
    event_idx: bool,
    kick: EventFd,
    /// Slots answered in this turn, reposted after every answer is read.
    done: Vec<usize>,
    metrics: Arc<devices::virtio::block::BlockMetrics>,
}

/// VIRTIO_RING_F_EVENT_IDX.
const EVENT_IDX_BIT: u32 = devices::virtio::block::device::features::VIRTIO_RING_F_EVENT_IDX;

/// Descriptors per request: header, data, status byte.
const DESCS: usize = 3;

impl DeviceRig {
    fn new(
        path: &PathBuf,
        engine: IoEngine,
        w: Workload,
        event_idx: bool,
        direct: bool,
    ) -> Result<Self> {
        let size = w.size;
        let mem_len = (DEPTH as u64 * (u64::from(size) + 8192) + (1 << 20)).next_power_of_two();
        let mem = guest_memory(mem_len as usize).context("guest memory")?;
        let mut cfg = BlockConfig::new("bench", path);
        cfg.io_engine = engine;
        let backend = if direct {
            FileBackend::open_direct(path, false)
        } else {
            FileBackend::open(path, false)
        }
        .context("the image")?;
        let block = Arc::new(Mutex::new(
            Block::with_backend(cfg, mem.clone(), backend).context("the block device")?,
        ));
        let (offered, metrics, kick) = {
            let b = block.lock().expect("lock");
            (
                b.avail_features(),
                b.metrics(),
                b.queue_events()[0].try_clone()?,
            )
        };
        let dev: Arc<Mutex<dyn VirtioDevice>> = block.clone();
        let transport = MmioTransport::new(mem.clone(), dev).context("transport")?;
        let mut driver = MockDriver::new(mem.clone(), transport).context("driver")?;
        // VERSION_1, and EVENT_IDX only when asked for (off: a kick per
        // batch, as the net rigs do by default).
        let mut features = 1 << 32;
        if event_idx {
            features |= 1 << EVENT_IDX_BIT;
        }
        let qsize = (DEPTH * 4) as u16;
        driver
            .init_with_queue_size(offered & features, Some(qsize))
            .context("driver init")?;
        let layout = driver.layout(0).context("queue layout")?;
        let mut em = EventManager::new().context("event manager")?;
        em.add_subscriber(block);
        let (mut hdrs, mut bufs, mut status) = (Vec::new(), Vec::new(), Vec::new());
        let data_flags = if w.write { 0 } else { VIRTQ_DESC_F_WRITE };
        for slot in 0..DEPTH {
            let hdr = driver.alloc(16, 16).context("alloc")?;
            let data = driver.alloc(u64::from(size), 4096).context("alloc")?;
            // Written once, as a guest fills a buffer before writing it
            // out: untouched, it reads as the kernel's shared zero page,
            // and `pwrite` copied from that 20 % slower here than from
            // written memory (128 KiB page-cache writes: 0.85 of a raw loop
            // over buffers of its own, all of it in the kernel's copy).
            mem.write_slice(&vec![0x5au8; size as usize], data)
                .context("data buffer")?;
            let st = driver.alloc(1, 1).context("alloc")?;
            let d = (slot * DESCS) as u16;
            let descs = [
                (hdr, 16, VIRTQ_DESC_F_NEXT, d + 1),
                (data, size, data_flags | VIRTQ_DESC_F_NEXT, d + 2),
                (st, 1, VIRTQ_DESC_F_WRITE, 0),
            ];
            for (i, (addr, len, flags, next)) in descs.into_iter().enumerate() {
                let at = layout.desc_table.0 + 16 * (u64::from(d) + i as u64);
                mem.write_slice(&desc_bytes(addr.0, len, flags, next), GuestAddress(at))
                    .context("descriptor")?;
            }
            hdrs.push(HostRange::new(&mem, hdr, 16)?);
            bufs.push(HostRange::new(&mem, data, size as usize)?);
            status.push(HostRange::new(&mem, st, 1)?);
        }
        let (avail, used) = ring_ranges(&mem, &layout)?;
        Ok(DeviceRig {
            _driver: driver,
            em,
            hdrs,
            data: bufs,
            status,
            avail,
            used,
            size: qsize,
            next_avail: 0,
            last_used: 0,
            published: 0,
            in_flight: 0,
            event_idx,
            kick,
            done: Vec::with_capacity(DEPTH),
            metrics,
        })
    }

    /// Writes slot `slot`'s request for offset `at` and puts its head in
    /// the next avail slot (published by `publish`).
    fn post(&mut self, slot: usize, w: Workload, at: u64) {
        let h = &self.hdrs[slot];
        h.write_u64(0, u64::from(w.write));
        h.write_u64(8, at / SECTOR);
        self.status[slot].write_u8(0, 0xff);
        let head = (slot * DESCS) as u16;
        let off = ring_slot(self.next_avail, self.size, 2);
        // Published by the Release store of `avail.idx` in `publish`.
        self.avail
            .u16_at(off)
            .store(head.to_le(), Ordering::Relaxed);
        self.next_avail = self.next_avail.wrapping_add(1);
        self.in_flight += 1;
    }

    /// Makes the posted requests visible and kicks unless the device said
    /// not to.
    fn publish(&mut self) -> Result<()> {
        let ring = LeanRing {
            avail: &self.avail,
            used: &self.used,
            size: self.size,
            event_idx: self.event_idx,
            kick: &self.kick,
        };
        ring.publish(self.next_avail, &mut self.published)
            .context("kick")
    }

    /// Posts the first `DEPTH` requests and kicks.
    fn start(&mut self, w: Workload, off: &mut Offsets) -> Result<()> {
        for slot in 0..DEPTH {
            self.post(slot, w, off.next());
        }
        self.publish()
    }

    /// One turn of the event loop: the device's work (a pass, or
    /// completions), apart from the driver's so callgrind can tell them
    /// apart.
    #[inline(never)]
    fn device_turn(&mut self) -> Result<()> {
        self.em.run_with_timeout(1).context("event loop")?;
        Ok(())
    }

    /// Reads the answers the device published since the last call: checks
    /// each status byte, frees its slot into `done`.
    fn reap(&mut self) -> Result<()> {
        let used_idx = u16::from_le(self.used.u16_at(2).load(Ordering::Acquire));
        while self.last_used != used_idx {
            let off = ring_slot(self.last_used, self.size, 8);
            let (id, len) = self.used.read_u32_pair(off);
            let slot = id as usize / DESCS;
            anyhow::ensure!(
                (id as usize).is_multiple_of(DESCS) && slot < DEPTH,
                "used id {id} is no request's head"
            );
            let status = self.status[slot].read_u8(0);
            anyhow::ensure!(
                status == 0,
                "request failed with status {status} (used length {len}): {}",
                self.metrics.to_json()
            );
            self.done.push(slot);
            self.last_used = self.last_used.wrapping_add(1);
            self.in_flight -= 1;
        }
        if self.event_idx {
            // As Linux's virtqueue_enable_cb: an interrupt for the next
            // answer.
            let off = 4 + 2 * usize::from(self.size);
            self.avail
                .u16_at(off)
                .store(self.last_used.to_le(), Ordering::Release);
        }
        Ok(())
    }

    /// The driver's turn: reads the answers, posts as many new requests,
    /// kicks. Returns the requests answered.
    #[inline(never)]
    fn driver_turn(&mut self, w: Workload, off: &mut Offsets) -> Result<u64> {
        self.reap()?;
        let n = self.done.len() as u64;
        // Every answer is read before any slot is posted again.
        for i in 0..self.done.len() {
            let slot = self.done[i];
            self.post(slot, w, off.next());
        }
        self.done.clear();
        if n > 0 {
            self.publish()?;
        }
        Ok(n)
    }

    /// Lets the requests in flight finish before the rig is dropped or
    /// measured again.
    fn settle(&mut self) -> Result<()> {
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end && self.in_flight > 0 {
            self.em.run_with_timeout(1).context("event loop")?;
            self.reap()?;
            self.done.clear();
        }
        anyhow::ensure!(
            self.in_flight == 0,
            "{} requests never answered",
            self.in_flight
        );
        Ok(())
    }

    /// One window of the device; the driver's turns are timed apart
    /// (wall clock: a turn never blocks), for the harness's share.
    fn measure(&mut self, t: &Timing, w: Workload, file_len: u64) -> Result<Sample> {
        let mut off = Offsets::new(w, file_len);
        self.start(w, &mut off)?;
        let mut driver_ns = 0u64;
        let mut sample = window(t, |counting| {
            self.device_turn()?;
            let t0 = Instant::now();
            let n = self.driver_turn(w, &mut off)?;
            if counting {
                driver_ns += t0.elapsed().as_nanos() as u64;
            }
            Ok(n)
        })?;
        sample.harness_ns = driver_ns as f64 / sample.n.max(1) as f64;
        self.settle()?;
        Ok(sample)
    }

    /// `n` requests, untimed (`--block-cost`).
    fn run_n(&mut self, w: Workload, file_len: u64, n: u64) -> Result<()> {
        let mut off = Offsets::new(w, file_len);
        self.start(w, &mut off)?;
        let mut done = 0;
        while done < n {
            self.device_turn()?;
            done += self.driver_turn(w, &mut off)?;
        }
        self.settle()
    }
}

/// The raw loop's `n` requests, untimed (`--block-cost raw`), over the
/// device's data buffers as in [`raw_window`].
#[inline(never)]
fn raw_n(file: &File, w: Workload, file_len: u64, n: u64, bufs: &[HostRange]) -> Result<()> {
    let mut off = Offsets::new(w, file_len);
    for r in 0..n {
        bufs[r as usize % bufs.len()].transfer(file, off.next(), w.write)?;
    }
    Ok(())
}

/// Creates the image (`file_len` bytes, in the page cache) in a fresh
/// directory; returns the directory, the image's path and the open file.
fn make_image(file_len: u64) -> Result<(PathBuf, PathBuf, File)> {
    let dir = std::env::temp_dir().join(format!("minivmm-blockbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("bench directory")?;
    let path = dir.join("image.raw");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .context("create the image")?;
    // Into the page cache once: every cell then reads cached pages.
    let chunk = vec![0xa5u8; 1 << 20];
    for i in 0..file_len >> 20 {
        file.write_all_at(&chunk, i << 20)
            .context("fill the image")?;
    }
    Ok((dir, path, file))
}

/// `netbench --block-cost MODE WORKLOAD N`: `n` requests of one cell and
/// nothing else (no windows, no clock reads), so that callgrind's counts
/// over two values of `n` give instructions per request
/// (`tools/bench/callgrind-block.sh`). MODE is `sync`, `async` or `raw`.
pub fn cost(mode: &str, workload: &str, n: u64) -> Result<()> {
    let w = *WORKLOADS
        .iter()
        .find(|w| w.name == workload)
        .with_context(|| format!("unknown workload {workload:?}"))?;
    let file_len = 32 << 20;
    let (dir, path, file) = make_image(file_len)?;
    let res = match mode {
        // The rig only lends its data buffers.
        "raw" => DeviceRig::new(&path, IoEngine::Sync, w, false, false)
            .and_then(|rig| raw_n(&file, w, file_len, n, &rig.data)),
        "sync" | "async" => {
            let engine = if mode == "sync" {
                IoEngine::Sync
            } else {
                IoEngine::Async
            };
            DeviceRig::new(&path, engine, w, false, false).and_then(|mut rig| {
                rig.run_n(w, file_len, n)?;
                eprintln!(
                    "netbench: block-cost {mode} {workload} {n}: {}",
                    rig.metrics.to_json()
                );
                Ok(())
            })
        }
        other => Err(anyhow::anyhow!("unknown mode {other:?} (sync, async, raw)")),
    };
    drop(file);
    let _ = std::fs::remove_dir_all(&dir);
    res
}

/// One cell: interleaved rounds of the raw loop and the device, the
/// medians and their ratios.
fn cell(
    t: &Timing,
    path: &PathBuf,
    raw_file: &File,
    w: Workload,
    file_len: u64,
    engine: IoEngine,
    direct: bool,
) -> Result<Value> {
    let mut rig = DeviceRig::new(path, engine, w, t.event_idx, direct)?;
    let (mut dev, mut raw) = (Vec::new(), Vec::new());
    for round in 0..t.rounds {
        // Every other round the device goes first, so neither side always
        // runs on the cache state the other left.
        if round % 2 == 0 {
            raw.push(raw_window(t, raw_file, w, file_len, &rig.data)?);
            dev.push(rig.measure(t, w, file_len)?);
        } else {
            dev.push(rig.measure(t, w, file_len)?);
            raw.push(raw_window(t, raw_file, w, file_len, &rig.data)?);
        }
    }
    let window = |s: &Sample| Window {
        per_s: s.per_s,
        cpu_ns: s.cpu_ns,
        harness_ns: s.harness_ns,
    };
    let (dw, rw): (Vec<Window>, Vec<Window>) = (
        dev.iter().map(window).collect(),
        raw.iter().map(window).collect(),
    );
    let Medians {
        dev_per_s: dp,
        raw_per_s: rp,
        dev_cpu_ns: dc,
        raw_cpu_ns: rc,
        harness_ns: h,
    } = medians(&dw, &rw);
    // Without the harness: the thread is busy throughout, so a request
    // takes 1/dp of it, h of which are the driver's. (With direct I/O the
    // thread also waits; the figure then overstates the harness's share.)
    let dp_ex = if dp > 0.0 && 1e9 / dp > h {
        1e9 / (1e9 / dp - h)
    } else {
        0.0
    };
    Ok(json!({
        "size": w.size,
        "device_per_s": dp, "raw_per_s": rp,
        "device_cpu_ns": dc, "raw_cpu_ns": rc, "harness_ns": h,
        "ratio": ratio(dp, rp), "cpu_ratio": ratio(dc, rc),
        "ratio_without_harness": ratio(dp_ex, rp),
        "cpu_ratio_without_harness": ratio(dc - h, rc),
        "round_ratios": dev.iter().zip(&raw).map(|(d, r)| ratio(d.per_s, r.per_s)).collect::<Vec<_>>(),
    }))
}

/// Runs every cell; returns the rows and the ratios.
pub fn block(t: &Timing) -> Result<Value> {
    let file_len: u64 = if t.window < Duration::from_secs(1) {
        32 << 20
    } else {
        128 << 20
    };
    let (dir, path, file) = make_image(file_len)?;
    let result = (|| -> Result<Value> {
        let mut rows = Vec::new();
        let mut ratios = serde_json::Map::new();
        // The page cache first, then direct I/O where the file system has
        // it: written back and dropped from the cache, so no direct write
        // pays for invalidating pages the other side's reads left.
        let direct_file = open_direct(&path)?;
        let mut modes: Vec<(bool, &File)> = vec![(false, &file)];
        if let Some(f) = direct_file.as_ref() {
            modes.push((true, f));
        } else {
            eprintln!(
                "netbench: block: {} refuses O_DIRECT; no direct-I/O cells",
                path.parent()
                    .map_or_else(String::new, |p| p.display().to_string())
            );
        }
        for (direct, raw_file) in modes {
            if direct {
                file.sync_all().context("write the image back")?;
                sys::drop_cached(&file).context("drop the image's cached pages")?;
            }
            for &w in WORKLOADS {
                for (engine, ename) in [(IoEngine::Sync, "sync"), (IoEngine::Async, "async")] {
                    let row = cell(t, &path, raw_file, w, file_len, engine, direct)?;
                    let cache = if direct { "direct" } else { "page" };
                    let key = if direct {
                        format!("{}_direct_{ename}", w.name)
                    } else {
                        format!("{}_{ename}", w.name)
                    };
                    for k in [
                        "ratio",
                        "cpu_ratio",
                        "ratio_without_harness",
                        "cpu_ratio_without_harness",
                    ] {
                        ratios.insert(format!("{key}_{k}"), row[k].clone());
                    }
                    eprintln!(
                        "netbench: block {key}: device {:.0}/s raw {:.0}/s ({:.3}), cpu {:.0} ns vs {:.0} ns ({:.3}), harness {:.0} ns",
                        row["device_per_s"].as_f64().unwrap_or(0.0),
                        row["raw_per_s"].as_f64().unwrap_or(0.0),
                        row["ratio"].as_f64().unwrap_or(0.0),
                        row["device_cpu_ns"].as_f64().unwrap_or(0.0),
                        row["raw_cpu_ns"].as_f64().unwrap_or(0.0),
                        row["cpu_ratio"].as_f64().unwrap_or(0.0),
                        row["harness_ns"].as_f64().unwrap_or(0.0),
                    );
                    let mut row = row;
                    row["workload"] = json!(w.name);
                    row["engine"] = json!(ename);
                    row["cache"] = json!(cache);
                    rows.push(row);
                }
            }
        }
        let mut v = json!({
            "file_len": file_len,
            "depth": DEPTH,
            "rows": rows,
            "direct": direct_file.is_some(),
        });
        v.as_object_mut().expect("an object").extend(ratios);
        Ok(v)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The block table for the summary.
pub fn table(s: &mut String, v: &Value) {
    use std::fmt::Write;
    let Some(rows) = v["rows"].as_array() else {
        return;
    };
    let _ = writeln!(
        s,
        "\nBLOCK: device ({} requests in flight) vs raw preadv/pwritev (one at a time) on the same file",
        v["depth"]
    );
    let _ = writeln!(
        s,
        "{:<14} {:<6} {:<6} {:>10} {:>10} {:>7} {:>8} {:>8} {:>7} {:>8} {:>8} {:>7}",
        "workload",
        "cache",
        "engine",
        "device/s",
        "raw/s",
        "ratio",
        "dev ns",
        "raw ns",
        "cpu x",
        "harn. ns",
        "ratio-h",
        "cpu x-h"
    );
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(0.0);
        let _ = writeln!(
            s,
            "{:<14} {:<6} {:<6} {:>10.0} {:>10.0} {:>7.3} {:>8.0} {:>8.0} {:>7.3} {:>8.0} {:>8.3} {:>7.3}",
            r["workload"].as_str().unwrap_or("?"),
            r["cache"].as_str().unwrap_or("page"),
            r["engine"].as_str().unwrap_or("?"),
            f("device_per_s"),
            f("raw_per_s"),
            f("ratio"),
            f("device_cpu_ns"),
            f("raw_cpu_ns"),
            f("cpu_ratio"),
            f("harness_ns"),
            f("ratio_without_harness"),
            f("cpu_ratio_without_harness"),
        );
    }
    if v["direct"] == false {
        let _ = writeln!(
            s,
            "- no direct-I/O cells: the image's file system refuses O_DIRECT"
        );
    }
    let _ = writeln!(
        s,
        "- cache: page = a file in the page cache; direct = the device's image and the raw loop's fd opened with O_DIRECT.\n\
         - dev ns: CPU per request of the one thread running the device's event loop and the driver harness\n  \
         (kernel work done elsewhere, io-wq workers or interrupts, is in neither side's figure);\n\
         - harn. ns: wall time per request in the harness's turns (reading answers, posting requests, the kick),\n  \
         least over the rounds (a preemption inside a turn only adds to it);\n\
         - ratio-h, cpu x-h: the same ratios with the harness's time taken out of the device's side."
    );
    for r in rows {
        if let Some(rr) = r["round_ratios"].as_array() {
            let _ = writeln!(
                s,
                "  rounds {} {} {}: {}",
                r["workload"].as_str().unwrap_or("?"),
                r["cache"].as_str().unwrap_or("page"),
                r["engine"].as_str().unwrap_or("?"),
                rr.iter()
                    .map(|x| format!("{:.2}", x.as_f64().unwrap_or(0.0)))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
}
