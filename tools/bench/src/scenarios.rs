// SPDX-License-Identifier: Apache-2.0
//! The benchmark's experiments, each a named scenario producing a JSON object.
//!
//! Device and raw runs alternate round by round (raw, device, bounce, then
//! bounce, device, raw, ...) and each figure is the median over rounds, so
//! machine noise hits both sides of every ratio alike.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use devices::virtio::io_engine::MAX_BATCH;
use devices::virtio::net::{IoEngine, NetConfig, Offloads};
use serde_json::{json, Map, Value};

use crate::frames::{self, HOST_MAC};
use crate::host::{self, Measured, Sender, Traffic};
use crate::rig::{Rig, RigConfig};
use crate::stats::{self, median, ratio};
use crate::sys;

/// Frame size of the "64 KiB" class: a 65000-byte TCP super-frame (44 MSS
/// segments of 1460 bytes plus headers; the largest IPv4 packet is 65535).
/// Its JSON keys keep the name 65536 (`limit.rx_ratio_65536`); the report
/// prints the frame size.
pub const GSO_FRAME: usize = 65000;
/// An RX cell is bound by the host sender, not by the reader, when the raw
/// loop reads at least this share of what the sender offered in the same
/// window: its frames/s ratio then measures how the threads shared the
/// cores, and the cell is judged by the CPU ratio instead.
pub const SENDER_BOUND: f64 = 0.9;
/// A posted buffer that takes the largest GSO frame plus the vnet header.
pub const BIG_BUF: u32 = 65562;

/// Durations of one run.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Interleaved rounds per comparison.
    pub rounds: usize,
    /// Rounds of the cells whose ratios carry goals (the `limit` scenario
    /// and the vsock cells): more than the others, because one window's
    /// rate moves by about 6 % on these shared cores (a vsock `tx_4k`
    /// round's ratio 0.57 to 1.31) and the median of n rounds narrows that
    /// by about 1.25/sqrt(n) (5 rounds left the 65000 GSO cells 0.85 to
    /// 0.96 run to run, and vsock `tx_4k` 0.76 to 0.94).
    pub limit_rounds: usize,
    /// Time before counting starts.
    pub warmup: Duration,
    /// Counting window.
    pub window: Duration,
    /// Window of each latency configuration.
    pub latency_window: Duration,
    /// Every rig's driver negotiates EVENT_IDX (`--event-idx on`; off in
    /// every figure of BENCHMARKS.md).
    pub event_idx: bool,
    /// Every rig's card serves MMDS (`--mmds on`; off in every figure of
    /// BENCHMARKS.md but the MMDS section's): its frames are not for MMDS,
    /// so the run shows what a card MMDS serves pays for other traffic.
    pub mmds: bool,
}

impl Timing {
    /// `--quick`: every scenario in well under 3 minutes on 2 cores.
    pub fn quick() -> Timing {
        Timing {
            rounds: 2,
            limit_rounds: 5,
            warmup: Duration::from_millis(150),
            window: Duration::from_millis(500),
            latency_window: Duration::from_millis(1200),
            event_idx: false,
            mmds: false,
        }
    }
    /// The full run.
    pub fn full() -> Timing {
        Timing {
            rounds: 5,
            limit_rounds: 9,
            warmup: Duration::from_millis(300),
            window: Duration::from_millis(1500),
            latency_window: Duration::from_secs(3),
            event_idx: false,
            mmds: false,
        }
    }
    /// The smoke test's tiny run.
    pub fn smoke() -> Timing {
        Timing {
            rounds: 1,
            limit_rounds: 1,
            warmup: Duration::from_millis(100),
            window: Duration::from_millis(300),
            latency_window: Duration::from_millis(600),
            event_idx: false,
            mmds: false,
        }
    }
}

/// Direction of a limit test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Host → TAP → guest buffers.
    Rx,
    /// Guest chains → TAP → host.
    Tx,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Rx => "rx",
            Dir::Tx => "tx",
        }
    }
}

/// The sides of a limit comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One `read`/`write` per frame: the limit of the contract ratios.
    Raw,
    /// TX only: [`MAX_BATCH`] writes per `io_uring_enter`, as the device
    /// batches them: the limit for a device that batches.
    RawBatched,
    /// The device as configured by default (TX: `IoEngine::Async`).
    Device,
    /// TX only: the device with `IoEngine::Sync`, one `writev` per frame.
    DeviceSync,
    /// The device copying through a host buffer (vmm-reference's way).
    Bounce,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::RawBatched => "raw_batched",
            Mode::Device => "minivmm",
            Mode::DeviceSync => "minivmm_sync",
            Mode::Bounce => "bounce",
        }
    }

    /// The sides measured in direction `dir`, in the order of a round: the
    /// device right after the raw loop, so that the two windows of the
    /// contract ratio are side by side in every round (forward or reversed).
    fn all(dir: Dir) -> &'static [Mode] {
        match dir {
            Dir::Rx => &[Mode::Raw, Mode::Device, Mode::Bounce],
            Dir::Tx => &[
                Mode::Raw,
                Mode::Device,
                Mode::RawBatched,
                Mode::DeviceSync,
                Mode::Bounce,
            ],
        }
    }
}

/// The TX message (vnet header + frame) for frames of `size` bytes.
pub(crate) fn tx_msg(size: usize) -> Vec<u8> {
    if size > 1514 {
        let (hdr, f) = frames::tso_frame(size, HOST_MAC, None, false);
        let mut m = hdr.to_bytes().to_vec();
        m.extend_from_slice(&f);
        m
    } else {
        let mut m = vec![0u8; sys::VNET_HDR_LEN];
        m.extend_from_slice(&frames::udp_frame(size, HOST_MAC, 40000));
        m
    }
}

fn row(m: &Measured) -> Value {
    json!({
        "frames_per_s": m.fps(),
        "gbps": m.gbps(),
        "cpu_ns_per_frame": m.cpu_per_frame(),
        "thread_busy": m.busy(),
        "offered_per_s": m.offered_fps(),
        "frames": m.frames,
        "tx_dropped": m.dropped,
        "frames_per_pass": m.frames_per_pass(),
        "host_steal": m.steal(),
        "secs": m.secs,
    })
}

/// Median of each figure over rounds.
fn med(v: &[Measured]) -> Value {
    let f = |g: fn(&Measured) -> f64| median(&v.iter().map(g).collect::<Vec<_>>());
    json!({
        "frames_per_s": f(Measured::fps),
        "gbps": f(Measured::gbps),
        "cpu_ns_per_frame": f(Measured::cpu_per_frame),
        "thread_busy": f(Measured::busy),
        "offered_per_s": f(Measured::offered_fps),
        "tx_dropped": v.iter().map(|m| m.dropped).sum::<u64>(),
        "frames_per_pass": f(Measured::frames_per_pass),
        "host_steal": f(Measured::steal),
        "rounds": v.iter().map(row).collect::<Vec<_>>(),
    })
}

fn fps_of(v: &Value) -> f64 {
    v["frames_per_s"].as_f64().unwrap_or(0.0)
}

/// One run of one side of a limit comparison; `offered` is the RX sender's
/// running count.
fn one_limit_run(
    dir: Dir,
    size: usize,
    mode: Mode,
    t: &Timing,
    offered: &Arc<AtomicU64>,
) -> Result<Measured> {
    let rx_buf = if size > 1514 { BIG_BUF } else { 2048 };
    match (mode, dir) {
        (Mode::Raw, Dir::Rx) => host::raw_rx(
            sys::TAP_OFFLOADS_GSO,
            rx_buf as usize,
            usize::from(NetConfig::default().queue_size),
            offered.clone(),
            t.warmup,
            t.window,
        ),
        (Mode::Raw, Dir::Tx) => host::raw_tx(&tx_msg(size), t.warmup, t.window),
        (Mode::RawBatched, _) => host::raw_tx_batched(&tx_msg(size), MAX_BATCH, t.warmup, t.window),
        (_, _) => {
            let cfg = RigConfig {
                net: NetConfig {
                    bounce_buffer: mode == Mode::Bounce,
                    io_engine: if mode == Mode::DeviceSync {
                        IoEngine::Sync
                    } else {
                        IoEngine::default()
                    },
                    ..NetConfig::default()
                },
                rx_buf_len: rx_buf,
                tx_msg: tx_msg(size),
                post_rx: dir == Dir::Rx,
                event_idx: t.event_idx,
                mmds: t.mmds,
            };
            let mut rig = Rig::new(&cfg)?;
            match dir {
                Dir::Rx => rig.run_rx(offered.clone(), t.warmup, t.window),
                Dir::Tx => rig.run_tx(t.warmup, t.window),
            }
        }
    }
}

/// Experiment 1: device vs raw TAP loop, RX and TX, three frame sizes.
///
/// Besides the contract ratios it says, per cell, which ratio judges it
/// (`{dir}_judged_by_{size}`: "frames/s", or "cpu" where the RX sender
/// bounds the raw loop, see [`SENDER_BOUND`]) and that ratio
/// (`{dir}_judged_ratio_{size}`).
pub fn limit(t: &Timing, sizes: &[usize], dirs: &[String]) -> Result<Value> {
    let mut out = Map::new();
    let mut rows = Vec::new();
    let (udp_before, csum_before) = host::udp_counters();
    for dir in [Dir::Rx, Dir::Tx] {
        if !dirs.iter().any(|d| d == dir.name()) {
            continue;
        }
        for &size in sizes {
            let frame = if size > 1514 { GSO_FRAME } else { size };
            let sender = match dir {
                Dir::Rx if size > 1514 => Some(Sender::start(Traffic::Gso(frame))?),
                Dir::Rx => Some(Sender::start(Traffic::Udp(frame))?),
                Dir::Tx => None,
            };
            let offered = sender
                .as_ref()
                .map_or_else(|| Arc::new(AtomicU64::new(0)), Sender::counter);
            let _sink = host::sink()?;
            let modes = Mode::all(dir);
            let mut runs: Vec<Vec<Measured>> = vec![Vec::new(); modes.len()];
            // Every other round runs the modes in reverse order, so each
            // mode has the same mean position and a drift of the shared
            // machine over the rounds favours none of them.
            for round in 0..t.limit_rounds {
                for k in 0..modes.len() {
                    let i = if round % 2 == 0 {
                        k
                    } else {
                        modes.len() - 1 - k
                    };
                    runs[i].push(one_limit_run(dir, frame, modes[i], t, &offered)?);
                }
            }
            let meds: Vec<(Mode, Value)> = modes
                .iter()
                .zip(runs.iter())
                .map(|(&m, v)| (m, med(v)))
                .collect();
            let side = |m: Mode| meds.iter().find(|(x, _)| *x == m).map(|(_, v)| v);
            let (Some(raw), Some(dev), Some(bounce)) =
                (side(Mode::Raw), side(Mode::Device), side(Mode::Bounce))
            else {
                unreachable!("every direction measures raw, minivmm and bounce");
            };
            let r = ratio(fps_of(dev), fps_of(raw));
            let rb = ratio(fps_of(bounce), fps_of(raw));
            let cpu = |v: &Value| v["cpu_ns_per_frame"].as_f64().unwrap_or(0.0);
            // Efficiency: CPU the raw loop spends per frame over what the
            // device thread spends (1.0 = the device adds nothing). Unlike the
            // throughput ratio it is not capped by the host sender.
            let rc = ratio(cpu(raw), cpu(dev));
            let key = |what: &str| format!("{}_{what}_{size}", dir.name());
            out.insert(key("ratio"), json!(r));
            // Each round's device / raw frames/s, the two windows side by
            // side: how far the shared machine moved the ratio around its
            // median.
            let idx = |m: Mode| modes.iter().position(|&x| x == m);
            if let (Some(d), Some(w)) = (idx(Mode::Device), idx(Mode::Raw)) {
                let per_round: Vec<f64> = runs[d]
                    .iter()
                    .zip(&runs[w])
                    .map(|(a, b)| ratio(a.fps(), b.fps()))
                    .collect();
                out.insert(key("round_ratios"), json!(per_round));
            }
            out.insert(key("bounce_ratio"), json!(rb));
            out.insert(key("cpu_ratio"), json!(rc));
            // The second limit: the device against a raw loop that batches
            // its writes as the device does; and the device writing frame by
            // frame against the plain raw loop (what batching bought).
            if let Some(rawb) = side(Mode::RawBatched) {
                out.insert(
                    key("batched_ratio"),
                    json!(ratio(fps_of(dev), fps_of(rawb))),
                );
                out.insert(key("batched_cpu_ratio"), json!(ratio(cpu(rawb), cpu(dev))));
            }
            if let Some(sync) = side(Mode::DeviceSync) {
                out.insert(key("sync_ratio"), json!(ratio(fps_of(sync), fps_of(raw))));
                out.insert(key("sync_cpu_ratio"), json!(ratio(cpu(raw), cpu(sync))));
            }
            let mut sender_bound = false;
            if sender.is_some() {
                // What the host sender pushed during the raw loop's windows:
                // when the raw loop read (nearly) all of it, the sender, not
                // the reader, set the pace.
                let offered_fps = raw["offered_per_s"].as_f64().unwrap_or(0.0);
                sender_bound = fps_of(raw) >= SENDER_BOUND * offered_fps;
                out.insert(format!("rx_offered_fps_{size}"), json!(offered_fps));
                out.insert(format!("rx_sender_bound_{size}"), json!(sender_bound));
            }
            let (judged_by, judged) = if sender_bound {
                ("cpu", rc)
            } else {
                ("frames/s", r)
            };
            out.insert(key("judged_by"), json!(judged_by));
            out.insert(key("judged_ratio"), json!(judged));
            for (mode, v) in &meds {
                rows.push(json!({
                    "dir": dir.name(), "size": size, "frame_bytes": frame,
                    "mode": mode.name(), "median": v,
                }));
            }
        }
    }
    let (udp_after, csum_after) = host::udp_counters();
    out.insert("host_udp_datagrams".into(), json!(udp_after - udp_before));
    out.insert(
        "host_udp_csum_errors".into(),
        json!(csum_after - csum_before),
    );
    out.insert("rows".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

/// Experiments 2 and 4: frames into posted buffers of `bufs` bytes, with
/// MRG_RXBUF; `gso` selects 65000-byte super-frames instead of MTU frames.
fn buffers(t: &Timing, bufs: &[u32], gso: bool) -> Result<Value> {
    let mut out = Map::new();
    let sender = Sender::start(if gso {
        Traffic::Gso(GSO_FRAME)
    } else {
        Traffic::Udp(1514)
    })?;
    let mut runs: Vec<Vec<(Measured, f64)>> = vec![Vec::new(); bufs.len()];
    let mut last_metrics = vec![Value::Null; bufs.len()];
    for _ in 0..t.rounds {
        for (i, &b) in bufs.iter().enumerate() {
            let cfg = RigConfig {
                net: NetConfig {
                    offloads: if gso { Offloads::ALL } else { Offloads::NONE },
                    mrg_rxbuf: true,
                    ..NetConfig::default()
                },
                rx_buf_len: b,
                tx_msg: tx_msg(64),
                post_rx: true,
                event_idx: t.event_idx,
                mmds: t.mmds,
            };
            let mut rig = Rig::new(&cfg)?;
            let m = rig.run_rx(sender.counter(), t.warmup, t.window)?;
            let mx = rig.metrics();
            let dev_bpf = ratio(
                mx.rx_buffers.load(std::sync::atomic::Ordering::Relaxed) as f64,
                mx.rx_frames.load(std::sync::atomic::Ordering::Relaxed) as f64,
            );
            runs[i].push((m, dev_bpf));
            last_metrics[i] = rig.metrics_json();
        }
    }
    let mut rows = Vec::new();
    for (i, &b) in bufs.iter().enumerate() {
        let ms: Vec<Measured> = runs[i].iter().map(|r| r.0).collect();
        let bpf = median(
            &ms.iter()
                .map(|m| ratio(m.buffers as f64, m.frames as f64))
                .collect::<Vec<_>>(),
        );
        let dev_bpf = median(&runs[i].iter().map(|r| r.1).collect::<Vec<_>>());
        out.insert(format!("buffers_per_frame_{b}"), json!(bpf));
        rows.push(json!({
            "buffer_bytes": b,
            "buffers_per_frame": bpf,
            "buffers_per_frame_metrics": dev_bpf,
            "posted_bytes_per_frame": bpf * f64::from(b),
            "median": med(&ms),
            "device_metrics_last_round": last_metrics[i],
        }));
    }
    out.insert(
        "frame_bytes".into(),
        json!(if gso { GSO_FRAME } else { 1514 }),
    );
    out.insert("rows".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

/// Experiment 2: MTU frames into 1500, 1526 and 4096-byte buffers.
pub fn seed000(t: &Timing, bufs: &[u32]) -> Result<Value> {
    buffers(t, bufs, false)
}

/// Experiment 4: 64 KiB GSO frames into 1526, 4096 and 64 KiB buffers.
pub fn seed002(t: &Timing, bufs: &[u32]) -> Result<Value> {
    buffers(t, bufs, true)
}

/// One device configuration of experiment 3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weight {
    /// Name in the report and JSON (`seed001.p99_us_<name>`).
    pub name: String,
    /// tx_weight_packets (0: off).
    pub packets: u64,
    /// tx_weight_bytes (0: off).
    pub bytes: u64,
    /// pass_time_budget_us (0: off).
    pub time_us: u64,
}

impl Weight {
    /// A packet weight and a time budget alone (0 = off), named
    /// `unweighted`, `weight_N`, `time_T` or `wN_tT`.
    pub fn grid(packets: u64, time_us: u64) -> Weight {
        let name = match (packets, time_us) {
            (0, 0) => "unweighted".to_string(),
            (p, 0) => format!("weight_{p}"),
            (0, t) => format!("time_{t}"),
            (p, t) => format!("w{p}_t{t}"),
        };
        Weight {
            name,
            packets,
            bytes: 0,
            time_us,
        }
    }

    /// The device's defaults (`NetConfig::default()`), named `default`.
    pub fn default_config() -> Weight {
        let d = NetConfig::default();
        Weight {
            name: "default".into(),
            packets: d.tx_weight_packets,
            bytes: d.tx_weight_bytes,
            time_us: d.pass_time_budget_us,
        }
    }
}

/// Packet weights of the seed's table (time budget off).
pub const SEED_WEIGHTS: &[u64] = &[64, 128, 256, 512, 1024, 2048, 4096];
/// Packet weights crossed with [`TIME_BUDGETS`] to choose the default.
pub const GRID_WEIGHTS: &[u64] = &[64, 128, 256];
/// Pass time budgets (µs) crossed with [`GRID_WEIGHTS`].
pub const TIME_BUDGETS: &[u64] = &[50, 100, 200];

/// The configurations of experiment 3: the device's defaults, unweighted
/// (only the descriptor budget ends a pass), the seed's packet weights, the
/// 0x80000-byte weight alone, and weights 64/128/256 with each time budget.
pub fn seed001_configs() -> Vec<Weight> {
    let mut v = vec![Weight::default_config(), Weight::grid(0, 0)];
    v.extend(SEED_WEIGHTS.iter().map(|&p| Weight::grid(p, 0)));
    v.push(Weight {
        name: "bytes_only".into(),
        packets: 0,
        bytes: 0x80000,
        time_us: 0,
    });
    for &p in GRID_WEIGHTS {
        v.extend(TIME_BUDGETS.iter().map(|&t| Weight::grid(p, t)));
    }
    v
}

/// Experiment 3: RX latency under a TX flood of 1-byte UDP frames, per
/// device configuration.
///
/// Configurations are interleaved over `t.rounds` rounds (raw, idle, each
/// configuration, then again) and each one's samples are pooled, so a burst
/// of load from elsewhere on the machine lands on all of them alike.
pub fn seed001(t: &Timing, weights: &[Weight], probe_us: u64) -> Result<Value> {
    let _sink = host::sink()?;
    let _probes = Sender::start(Traffic::Probe(probe_us))?;
    let tiny = tx_msg(frames::UDP_OVERHEAD + 1);
    let rounds = t.rounds.max(1);
    let window = t.latency_window / rounds as u32;
    // "raw_idle" is the TAP with no device; "idle" the default device
    // without the flood.
    let idle = Weight {
        name: "idle".into(),
        ..Weight::default_config()
    };
    let mut configs: Vec<(Weight, bool)> = vec![
        (
            Weight {
                name: "raw_idle".into(),
                ..Weight::grid(0, 0)
            },
            false,
        ),
        (idle, false),
    ];
    configs.extend(weights.iter().map(|w| (w.clone(), true)));
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut tx: Vec<Vec<Measured>> = vec![Vec::new(); configs.len()];
    let mut hits = vec![(0u64, 0u64, 0u64); configs.len()];
    for _ in 0..rounds {
        for (i, (w, flood)) in configs.iter().enumerate() {
            if w.name == "raw_idle" {
                samples[i].extend(host::raw_latency(window)?);
                continue;
            }
            let cfg = RigConfig {
                net: NetConfig {
                    tx_weight_packets: w.packets,
                    tx_weight_bytes: w.bytes,
                    pass_time_budget_us: w.time_us,
                    ..NetConfig::default()
                },
                rx_buf_len: 2048,
                tx_msg: tiny.clone(),
                post_rx: true,
                event_idx: t.event_idx,
                mmds: t.mmds,
            };
            let mut rig = Rig::new(&cfg)?;
            let (s, m) = rig.run_latency(window, *flood)?;
            samples[i].extend(s);
            tx[i].push(m);
            let get = |c: &AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            let mx = rig.metrics();
            hits[i].0 += get(&mx.tx_weight_hits);
            hits[i].1 += get(&mx.time_budget_hits);
            hits[i].2 += get(&mx.desc_budget_hits);
        }
    }
    let mut out = Map::new();
    let mut rows = Vec::new();
    let idle_p99 = stats::summarize(&samples[1]).p99;
    for (i, (w, flood)) in configs.iter().enumerate() {
        let s = stats::summarize(&samples[i]);
        let m = med(&tx[i]);
        let name = &w.name;
        out.insert(format!("p99_us_{name}"), json!(s.p99));
        out.insert(format!("avg_us_{name}"), json!(s.avg));
        if *flood {
            out.insert(format!("p99_vs_idle_{name}"), json!(ratio(s.p99, idle_p99)));
            out.insert(format!("tx_fps_{name}"), json!(fps_of(&m)));
        }
        rows.push(json!({
            "config": name, "tx_weight_packets": w.packets, "tx_weight_bytes": w.bytes,
            "pass_time_budget_us": w.time_us,
            "flood": flood, "samples": s.n,
            "min_us": s.min, "avg_us": s.avg, "p50_us": s.p50, "p99_us": s.p99, "max_us": s.max,
            "p99_vs_idle": if *flood { ratio(s.p99, idle_p99) } else { 0.0 },
            "tx_frames_per_s": if *flood { fps_of(&m) } else { 0.0 },
            "device_cpu_ns_per_tx_frame": if *flood { m["cpu_ns_per_frame"].as_f64().unwrap_or(0.0) } else { 0.0 },
            "tx_weight_hits": hits[i].0,
            "time_budget_hits": hits[i].1,
            "desc_budget_hits": hits[i].2,
        }));
    }
    if let Some(p) = out.get("p99_vs_idle_default").and_then(Value::as_f64) {
        out.insert("goal_default_p99_within_2x_idle".into(), json!(p <= 2.0));
    }
    out.insert("rows".into(), Value::Array(rows));
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_row_takes_middle_round() {
        let m = |frames| Measured {
            frames,
            bytes: frames * 100,
            secs: 1.0,
            cpu_ns: frames * 10,
            buffers: frames,
            dropped: 0,
            offered: frames * 2,
            passes: frames / 10,
            steal_s: 0.0,
        };
        let v = med(&[m(30), m(10), m(20)]);
        assert_eq!(fps_of(&v), 20.0);
        assert_eq!(v["frames_per_pass"].as_f64(), Some(10.0));
        assert_eq!(v["cpu_ns_per_frame"].as_f64(), Some(10.0));
        assert_eq!(v["rounds"].as_array().map(Vec::len), Some(3));
        assert_eq!(v["offered_per_s"].as_f64(), Some(40.0));
    }

    #[test]
    fn seed001_configs_are_named_for_their_contract_keys() {
        let c = seed001_configs();
        let names: Vec<&str> = c.iter().map(|w| w.name.as_str()).collect();
        for n in [
            "default",
            "unweighted",
            "weight_256",
            "bytes_only",
            "w64_t50",
            "w256_t200",
        ] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        let unique: std::collections::HashSet<&&str> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        let d = &c[0];
        assert_eq!(d.time_us, NetConfig::default().pass_time_budget_us);
        assert_eq!(Weight::grid(128, 100).name, "w128_t100");
        assert_eq!(Weight::grid(0, 50).name, "time_50");
        assert_eq!(Weight::grid(512, 0).time_us, 0);
    }

    #[test]
    fn tx_messages_carry_header_and_frame() {
        assert_eq!(tx_msg(64).len(), 12 + 64);
        assert_eq!(tx_msg(1514).len(), 12 + 1514);
        let big = tx_msg(GSO_FRAME);
        assert_eq!(big.len(), 12 + GSO_FRAME);
        assert_eq!(big[1], frames::VIRTIO_NET_HDR_GSO_TCPV4);
    }
}
