// SPDX-License-Identifier: Apache-2.0
//! Scenario `block`: the virtio-blk device against a raw loop on the same
//! image file, in the same run.
//!
//! The device is driven from the driver side, as the network device is: the
//! real `Block` on its event loop behind its MMIO transport, requests
//! (16-byte header, one data buffer, status byte) in guest memory, `DEPTH`
//! of them in flight, each used one replaced by the next. The raw loop does
//! what the device's `Sync` engine should cost at best: one `preadv` or
//! `pwritev` per request of the same size at the same offsets, into a host
//! buffer, one at a time.
//!
//! Cells: 4 KiB random reads and writes, 128 KiB sequential reads and
//! writes, on a file in the page cache (written once before the first
//! window), for each engine. A cell's figure is the median over interleaved
//! rounds of requests per second and of CPU time per request of the one
//! thread that runs the driver and the device (the driver's ring writes are
//! in it: about 0.2 µs per request, see `rig.rs`; the io_uring engine's
//! kernel-side work is in it when the kernel completes inline, as it does
//! for the page cache). `O_DIRECT` is not offered by the device, so there is
//! no direct-I/O cell.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use devices::virtio::block::{Block, BlockConfig, IoEngine};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::test_utils::{guest_memory, MockDriver, Rng, Segment};
use devices::virtio::VirtioDevice;
use event_manager::{EventManager, SubscriberOps};
use serde_json::{json, Value};
use vm_memory::{Bytes, GuestAddress};

use crate::scenarios::Timing;
use crate::stats::{median, ratio};
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
}

fn window<F: FnMut() -> Result<u64>>(t: &Timing, mut batch: F) -> Result<Sample> {
    let clock = sys::current_thread_cpu_clock();
    let warm_end = Instant::now() + t.warmup;
    while Instant::now() < warm_end {
        batch()?;
    }
    let (t0, c0) = (Instant::now(), sys::clock_ns(clock));
    let mut n = 0;
    while t0.elapsed() < t.window {
        n += batch()?;
    }
    let (dt, dc) = (t0.elapsed(), sys::clock_ns(clock) - c0);
    Ok(Sample {
        per_s: n as f64 / dt.as_secs_f64(),
        cpu_ns: dc as f64 / n.max(1) as f64,
    })
}

/// The raw loop: one positioned read or write per request.
fn raw_window(t: &Timing, file: &File, w: Workload, file_len: u64) -> Result<Sample> {
    let mut buf = vec![0x5au8; w.size as usize];
    let mut off = Offsets::new(w, file_len);
    window(t, || {
        for _ in 0..64 {
            let at = off.next();
            if w.write {
                file.write_all_at(&buf, at).context("raw pwrite")?;
            } else {
                file.read_exact_at(&mut buf, at).context("raw pread")?;
            }
        }
        Ok(64)
    })
}

/// The device with `DEPTH` requests in flight.
struct DeviceRig {
    driver: MockDriver,
    em: EventManager<Arc<Mutex<Block>>>,
    slots: Vec<(GuestAddress, GuestAddress, GuestAddress)>,
    by_head: Vec<usize>,
    metrics: Arc<devices::virtio::block::BlockMetrics>,
}

impl DeviceRig {
    fn new(path: &PathBuf, engine: IoEngine, size: u32) -> Result<Self> {
        let mem_len = (DEPTH as u64 * (u64::from(size) + 8192) + (1 << 20)).next_power_of_two();
        let mem = guest_memory(mem_len as usize).context("guest memory")?;
        let mut cfg = BlockConfig::new("bench", path);
        cfg.io_engine = engine;
        let block = Arc::new(Mutex::new(
            Block::new(cfg, mem.clone()).context("the block device")?,
        ));
        let offered = block.lock().expect("lock").avail_features();
        let metrics = block.lock().expect("lock").metrics();
        let dev: Arc<Mutex<dyn VirtioDevice>> = block.clone();
        let transport = MmioTransport::new(mem.clone(), dev).context("transport")?;
        let mut driver = MockDriver::new(mem, transport).context("driver")?;
        // VERSION_1 and nothing the rig does not use (no EVENT_IDX: a kick
        // per batch, as the net rigs do by default).
        driver
            .init_with_queue_size(offered & (1 << 32), Some(DEPTH as u16 * 4))
            .context("driver init")?;
        let mut em = EventManager::new().context("event manager")?;
        em.add_subscriber(block);
        let mut slots = Vec::new();
        for _ in 0..DEPTH {
            let hdr = driver.alloc(16, 16).context("alloc")?;
            let data = driver.alloc(u64::from(size), 4096).context("alloc")?;
            let status = driver.alloc(1, 1).context("alloc")?;
            slots.push((hdr, data, status));
        }
        Ok(DeviceRig {
            driver,
            em,
            slots,
            by_head: vec![usize::MAX; DEPTH * 4],
            metrics,
        })
    }

    fn post(&mut self, slot: usize, w: Workload, at: u64) -> Result<()> {
        let (hdr, data, status) = self.slots[slot];
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&u32::from(w.write).to_le_bytes());
        h[8..].copy_from_slice(&(at / SECTOR).to_le_bytes());
        let mem = self.driver.mem();
        mem.write_slice(&h, hdr).context("header")?;
        mem.write_obj(0xffu8, status).context("status")?;
        let segs = [
            Segment::readable(hdr, 16),
            Segment {
                addr: data,
                len: w.size,
                device_writable: !w.write,
            },
            Segment::writable(status, 1),
        ];
        let head = self.driver.add_chain(0, &segs).context("add chain")?;
        self.by_head[usize::from(head)] = slot;
        Ok(())
    }

    /// Posts the first `DEPTH` requests and kicks.
    fn start(&mut self, w: Workload, off: &mut Offsets) -> Result<()> {
        for slot in 0..DEPTH {
            self.post(slot, w, off.next())?;
        }
        self.driver.publish(0).context("publish")?;
        self.driver.kick(0);
        Ok(())
    }

    /// One turn of the event loop: the device's work (a pass, or
    /// completions), apart from the driver's so callgrind can tell them
    /// apart.
    #[inline(never)]
    fn device_turn(&mut self) -> Result<()> {
        self.em.run_with_timeout(1).context("event loop")?;
        Ok(())
    }

    /// The driver's turn: reads the answers, posts as many new requests,
    /// kicks. Returns the requests answered.
    #[inline(never)]
    fn driver_turn(&mut self, w: Workload, off: &mut Offsets) -> Result<u64> {
        let used = self.driver.used(0).context("used ring")?;
        let n = used.len() as u64;
        // Every answer is read before any slot is posted again: a new
        // chain may take the head of an answer not yet read.
        let mut done = Vec::with_capacity(used.len());
        for u in used {
            let slot = self.by_head[u.id as usize];
            let status: u8 = self
                .driver
                .mem()
                .read_obj(self.slots[slot].2)
                .context("status")?;
            anyhow::ensure!(
                status == 0,
                "request failed with status {status} (used length {}): {}",
                u.len,
                self.metrics.to_json()
            );
            done.push(slot);
        }
        for slot in done {
            self.post(slot, w, off.next())?;
        }
        if n > 0 {
            self.driver.publish(0).context("publish")?;
            self.driver.kick(0);
        }
        Ok(n)
    }

    /// Lets the requests in flight finish before the rig is dropped or
    /// measured again.
    fn settle(&mut self) -> Result<()> {
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end && self.driver.free_descriptors(0).unwrap_or(0) < DEPTH * 4 {
            self.em.run_with_timeout(1).context("event loop")?;
            self.driver.used(0).context("used ring")?;
        }
        Ok(())
    }

    fn measure(&mut self, t: &Timing, w: Workload, file_len: u64) -> Result<Sample> {
        let mut off = Offsets::new(w, file_len);
        self.start(w, &mut off)?;
        let sample = window(t, || {
            self.device_turn()?;
            self.driver_turn(w, &mut off)
        })?;
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

/// The raw loop's `n` requests, untimed (`--block-cost raw`).
#[inline(never)]
fn raw_n(file: &File, w: Workload, file_len: u64, n: u64) -> Result<()> {
    let mut buf = vec![0x5au8; w.size as usize];
    let mut off = Offsets::new(w, file_len);
    for _ in 0..n {
        let at = off.next();
        if w.write {
            file.write_all_at(&buf, at).context("raw pwrite")?;
        } else {
            file.read_exact_at(&mut buf, at).context("raw pread")?;
        }
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
        "raw" => raw_n(&file, w, file_len, n),
        "sync" | "async" => {
            let engine = if mode == "sync" {
                IoEngine::Sync
            } else {
                IoEngine::Async
            };
            DeviceRig::new(&path, engine, w.size).and_then(|mut rig| {
                rig.run_n(w, file_len, n)?;
                eprintln!("netbench: block-cost {mode} {workload} {n}: {}", rig.metrics.to_json());
                Ok(())
            })
        }
        other => Err(anyhow::anyhow!("unknown mode {other:?} (sync, async, raw)")),
    };
    drop(file);
    let _ = std::fs::remove_dir_all(&dir);
    res
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
        for &w in WORKLOADS {
            for (engine, ename) in [(IoEngine::Sync, "sync"), (IoEngine::Async, "async")] {
                let mut rig = DeviceRig::new(&path, engine, w.size)?;
                let (mut dev, mut raw) = (Vec::new(), Vec::new());
                for _ in 0..t.rounds {
                    raw.push(raw_window(t, &file, w, file_len)?);
                    dev.push(rig.measure(t, w, file_len)?);
                }
                let med = |v: &[Sample], f: fn(&Sample) -> f64| {
                    median(&v.iter().map(f).collect::<Vec<_>>())
                };
                let (dp, rp) = (med(&dev, |s| s.per_s), med(&raw, |s| s.per_s));
                let (dc, rc) = (med(&dev, |s| s.cpu_ns), med(&raw, |s| s.cpu_ns));
                let key = format!("{}_{ename}", w.name);
                ratios.insert(format!("{key}_ratio"), json!(ratio(dp, rp)));
                ratios.insert(format!("{key}_cpu_ratio"), json!(ratio(dc, rc)));
                rows.push(json!({
                    "workload": w.name, "engine": ename, "size": w.size,
                    "device_per_s": dp, "raw_per_s": rp,
                    "device_cpu_ns": dc, "raw_cpu_ns": rc,
                    "ratio": ratio(dp, rp), "cpu_ratio": ratio(dc, rc),
                }));
                eprintln!(
                    "netbench: block {key}: device {dp:.0}/s raw {rp:.0}/s ({:.3}), cpu {dc:.0} ns vs {rc:.0} ns ({:.3})",
                    ratio(dp, rp),
                    ratio(dc, rc)
                );
            }
        }
        let mut v = json!({"file_len": file_len, "depth": DEPTH, "rows": rows});
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
        "\nBLOCK: device vs raw preadv/pwritev on the same file (page cache, {} requests in flight)",
        v["depth"]
    );
    let _ = writeln!(
        s,
        "{:<14} {:<6} {:>12} {:>12} {:>7} {:>9} {:>9} {:>7}",
        "workload", "engine", "device/s", "raw/s", "ratio", "dev ns", "raw ns", "cpu x"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<14} {:<6} {:>12.0} {:>12.0} {:>7.3} {:>9.0} {:>9.0} {:>7.3}",
            r["workload"].as_str().unwrap_or("?"),
            r["engine"].as_str().unwrap_or("?"),
            r["device_per_s"].as_f64().unwrap_or(0.0),
            r["raw_per_s"].as_f64().unwrap_or(0.0),
            r["ratio"].as_f64().unwrap_or(0.0),
            r["device_cpu_ns"].as_f64().unwrap_or(0.0),
            r["raw_cpu_ns"].as_f64().unwrap_or(0.0),
            r["cpu_ratio"].as_f64().unwrap_or(0.0),
        );
    }
}
