// SPDX-License-Identifier: Apache-2.0
//! The experiments of issue 4, each a named scenario producing a JSON object.
//!
//! Device and raw runs alternate round by round (raw, device, bounce, raw,
//! ...) and each figure is the median over rounds, so machine noise hits
//! both sides of every ratio alike.

use std::time::Duration;

use anyhow::Result;
use devices::virtio::net::{NetConfig, Offloads};
use serde_json::{json, Map, Value};

use crate::frames::{self, HOST_MAC};
use crate::host::{self, Measured, Sender, Traffic};
use crate::rig::{Rig, RigConfig};
use crate::stats::{self, median, ratio};
use crate::sys;

/// Frame size of the "64 KiB" class: a 65000-byte TCP super-frame (44 MSS
/// segments of 1460 bytes plus headers; the largest IPv4 packet is 65535).
pub const GSO_FRAME: usize = 65000;
/// A posted buffer that takes the largest GSO frame plus the vnet header.
pub const BIG_BUF: u32 = 65562;

/// Durations of one run.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Interleaved rounds per comparison.
    pub rounds: usize,
    /// Time before counting starts.
    pub warmup: Duration,
    /// Counting window.
    pub window: Duration,
    /// Window of each latency configuration.
    pub latency_window: Duration,
}

impl Timing {
    /// `--quick`: every scenario in well under 3 minutes on 2 cores.
    pub fn quick() -> Timing {
        Timing {
            rounds: 2,
            warmup: Duration::from_millis(150),
            window: Duration::from_millis(500),
            latency_window: Duration::from_millis(1200),
        }
    }
    /// The full run.
    pub fn full() -> Timing {
        Timing {
            rounds: 5,
            warmup: Duration::from_millis(300),
            window: Duration::from_millis(1500),
            latency_window: Duration::from_secs(3),
        }
    }
    /// The smoke test's tiny run.
    pub fn smoke() -> Timing {
        Timing {
            rounds: 1,
            warmup: Duration::from_millis(100),
            window: Duration::from_millis(300),
            latency_window: Duration::from_millis(600),
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

/// The three sides of a limit comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Raw,
    Device,
    Bounce,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::Device => "minivmm",
            Mode::Bounce => "bounce",
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
        "frames": m.frames,
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
        "rounds": v.iter().map(row).collect::<Vec<_>>(),
    })
}

fn fps_of(v: &Value) -> f64 {
    v["frames_per_s"].as_f64().unwrap_or(0.0)
}

fn one_limit_run(dir: Dir, size: usize, mode: Mode, t: &Timing) -> Result<Measured> {
    let rx_buf = if size > 1514 { BIG_BUF } else { 2048 };
    match (mode, dir) {
        (Mode::Raw, Dir::Rx) => host::raw_rx(
            sys::TAP_OFFLOADS_GSO,
            rx_buf as usize,
            usize::from(NetConfig::default().queue_size),
            t.warmup,
            t.window,
        ),
        (Mode::Raw, Dir::Tx) => host::raw_tx(&tx_msg(size), t.warmup, t.window),
        (_, _) => {
            let cfg = RigConfig {
                net: NetConfig {
                    bounce_buffer: mode == Mode::Bounce,
                    ..NetConfig::default()
                },
                rx_buf_len: rx_buf,
                tx_msg: tx_msg(size),
                post_rx: dir == Dir::Rx,
            };
            let mut rig = Rig::new(&cfg)?;
            match dir {
                Dir::Rx => rig.run_rx(t.warmup, t.window),
                Dir::Tx => rig.run_tx(t.warmup, t.window),
            }
        }
    }
}

/// Experiment 1: device vs raw TAP loop, RX and TX, three frame sizes.
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
            let _sink = host::sink()?;
            let offered0 = (
                sender.as_ref().map_or(0, Sender::sent),
                std::time::Instant::now(),
            );
            let mut runs: [Vec<Measured>; 3] = Default::default();
            for _ in 0..t.rounds {
                for (i, mode) in [Mode::Raw, Mode::Device, Mode::Bounce]
                    .into_iter()
                    .enumerate()
                {
                    runs[i].push(one_limit_run(dir, frame, mode, t)?);
                }
            }
            if let Some(snd) = &sender {
                // What the host sender managed to push, across all rounds
                // (including set-up gaps): an RX figure near it is sender-bound.
                let fps = (snd.sent() - offered0.0) as f64 / offered0.1.elapsed().as_secs_f64();
                out.insert(format!("rx_offered_fps_{size}"), json!(fps));
            }
            let [raw, dev, bounce] = runs.map(|v| med(&v));
            let r = ratio(fps_of(&dev), fps_of(&raw));
            let rb = ratio(fps_of(&bounce), fps_of(&raw));
            out.insert(format!("{}_ratio_{}", dir.name(), size), json!(r));
            out.insert(format!("{}_bounce_ratio_{}", dir.name(), size), json!(rb));
            // Efficiency: CPU the raw loop spends per frame over what the
            // device thread spends (1.0 = the device adds nothing). Unlike the
            // throughput ratio it is not capped by the host sender.
            let cpu = |v: &Value| v["cpu_ns_per_frame"].as_f64().unwrap_or(0.0);
            out.insert(
                format!("{}_cpu_ratio_{}", dir.name(), size),
                json!(ratio(cpu(&raw), cpu(&dev))),
            );
            for (mode, v) in [
                (Mode::Raw, raw),
                (Mode::Device, dev),
                (Mode::Bounce, bounce),
            ] {
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
    let _sender = Sender::start(if gso {
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
            };
            let mut rig = Rig::new(&cfg)?;
            let m = rig.run_rx(t.warmup, t.window)?;
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

/// One TX weight configuration of experiment 3.
#[derive(Debug, Clone, Copy)]
pub struct Weight {
    /// Name in the report and JSON.
    pub name: &'static str,
    /// tx_weight_packets (0: off).
    pub packets: u64,
    /// tx_weight_bytes (0: off).
    pub bytes: u64,
}

/// The weights of the seed's table.
pub const WEIGHTS: &[Weight] = &[
    Weight {
        name: "unweighted",
        packets: 0,
        bytes: 0,
    },
    Weight {
        name: "weight_64",
        packets: 64,
        bytes: 0,
    },
    Weight {
        name: "weight_128",
        packets: 128,
        bytes: 0,
    },
    Weight {
        name: "weight_256",
        packets: 256,
        bytes: 0,
    },
    Weight {
        name: "weight_512",
        packets: 512,
        bytes: 0,
    },
    Weight {
        name: "weight_1024",
        packets: 1024,
        bytes: 0,
    },
    Weight {
        name: "weight_2048",
        packets: 2048,
        bytes: 0,
    },
    Weight {
        name: "weight_4096",
        packets: 4096,
        bytes: 0,
    },
    Weight {
        name: "bytes_only",
        packets: 0,
        bytes: 0x80000,
    },
];

/// Experiment 3: RX latency under a TX flood of 1-byte UDP frames, per weight.
///
/// Configurations are interleaved over `t.rounds` rounds (raw, idle, each
/// weight, then again) and each one's samples are pooled, so a burst of
/// load from elsewhere on the machine lands on all of them alike.
pub fn seed001(t: &Timing, weights: &[Weight], probe_us: u64) -> Result<Value> {
    let _sink = host::sink()?;
    let _probes = Sender::start(Traffic::Probe(probe_us))?;
    let tiny = tx_msg(frames::UDP_OVERHEAD + 1);
    let rounds = t.rounds.max(1);
    let window = t.latency_window / rounds as u32;
    // (name, packets, bytes, flood); "raw_idle" is the TAP with no device.
    let mut configs: Vec<(&str, u64, u64, bool)> =
        vec![("raw_idle", 0, 0, false), ("idle", 0, 0, false)];
    configs.extend(weights.iter().map(|w| (w.name, w.packets, w.bytes, true)));
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut tx: Vec<Vec<Measured>> = vec![Vec::new(); configs.len()];
    let mut hits = vec![0u64; configs.len()];
    for _ in 0..rounds {
        for (i, &(name, packets, bytes, flood)) in configs.iter().enumerate() {
            if name == "raw_idle" {
                samples[i].extend(host::raw_latency(window)?);
                continue;
            }
            let cfg = RigConfig {
                net: NetConfig {
                    tx_weight_packets: packets,
                    tx_weight_bytes: bytes,
                    ..NetConfig::default()
                },
                rx_buf_len: 2048,
                tx_msg: tiny.clone(),
                post_rx: true,
            };
            let mut rig = Rig::new(&cfg)?;
            let (s, m) = rig.run_latency(window, flood)?;
            samples[i].extend(s);
            tx[i].push(m);
            hits[i] += rig
                .metrics()
                .tx_weight_hits
                .load(std::sync::atomic::Ordering::Relaxed);
        }
    }
    let mut out = Map::new();
    let mut rows = Vec::new();
    for (i, &(name, packets, bytes, flood)) in configs.iter().enumerate() {
        let s = stats::summarize(&samples[i]);
        let m = med(&tx[i]);
        out.insert(format!("p99_us_{name}"), json!(s.p99));
        out.insert(format!("avg_us_{name}"), json!(s.avg));
        rows.push(json!({
            "config": name, "tx_weight_packets": packets, "tx_weight_bytes": bytes,
            "flood": flood, "samples": s.n,
            "min_us": s.min, "avg_us": s.avg, "p50_us": s.p50, "p99_us": s.p99, "max_us": s.max,
            "tx_frames_per_s": if flood { fps_of(&m) } else { 0.0 },
            "device_cpu_ns_per_tx_frame": if flood { m["cpu_ns_per_frame"].as_f64().unwrap_or(0.0) } else { 0.0 },
            "tx_weight_hits": hits[i],
        }));
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
        };
        let v = med(&[m(30), m(10), m(20)]);
        assert_eq!(fps_of(&v), 20.0);
        assert_eq!(v["cpu_ns_per_frame"].as_f64(), Some(10.0));
        assert_eq!(v["rounds"].as_array().map(Vec::len), Some(3));
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
