// SPDX-License-Identifier: Apache-2.0
//! The human report: netperf-style fixed-width tables printed from the same
//! JSON value `--json` writes, so the two never disagree.

use std::fmt::Write;

use serde_json::{json, Value};

/// Kernel release, CPU model and core count of this machine.
pub fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    json!({ "kernel": kernel.trim(), "cpu": model, "cores": cores, "loadavg_at_start": loadavg() })
}

/// /proc/loadavg as it reads.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// The frame-size label of a limit row: the JSON keys say 65536 for the
/// 64 KiB class, whose frames are 65,000 bytes.
fn size_label(r: &Value) -> String {
    match (r["size"].as_u64(), r["frame_bytes"].as_u64()) {
        (Some(s), Some(f)) if s != f => format!("{f} GSO"),
        (Some(s), _) => s.to_string(),
        _ => "?".into(),
    }
}

/// The rows of a scenario's results `section`, once its `title` is written into `s` after a
/// blank line; `None`, and nothing written, where the run has no such rows.
fn titled_rows<'a>(s: &mut String, section: &'a Value, title: &str) -> Option<&'a Vec<Value>> {
    let rows = section["rows"].as_array()?;
    let _ = writeln!(s, "\n{title}");
    Some(rows)
}

fn limit_table(s: &mut String, lim: &Value) {
    let Some(rows) = titled_rows(s, lim, "LIMIT  (median of rounds; ratio = minivmm / raw)") else {
        return;
    };
    let _ = writeln!(
        s,
        "{:<4} {:>9} {:<12} {:>10} {:>10} {:>8} {:>10} {:>5} {:>6} {:>7} {:>6} {:>8} {:>8}",
        "dir",
        "frame B",
        "mode",
        "frames/s",
        "offered/s",
        "Gb/s",
        "cpu ns/fr",
        "busy",
        "steal",
        "fr/pass",
        "ratio",
        "cpu rat.",
        "judged"
    );
    for r in rows {
        let med = &r["median"];
        let (dir, size) = (r["dir"].as_str().unwrap_or(""), &r["size"]);
        let key = |what: &str| format!("{dir}_{what}_{size}");
        let (ratio, cpu_ratio, judged) = match r["mode"].as_str() {
            Some("raw") => (String::new(), String::new(), String::new()),
            Some("minivmm") => (
                format!("{:.3}", f(&lim[key("ratio").as_str()])),
                format!("{:.3}", f(&lim[key("cpu_ratio").as_str()])),
                format!(
                    "{:.3}{}",
                    f(&lim[key("judged_ratio").as_str()]),
                    if lim[key("judged_by").as_str()] == "cpu" {
                        " c"
                    } else {
                        ""
                    }
                ),
            ),
            Some("minivmm_sync") => (
                format!("{:.3}", f(&lim[key("sync_ratio").as_str()])),
                format!("{:.3}", f(&lim[key("sync_cpu_ratio").as_str()])),
                String::new(),
            ),
            Some("bounce") => (
                format!("{:.3}", f(&lim[key("bounce_ratio").as_str()])),
                String::new(),
                String::new(),
            ),
            _ => (String::new(), String::new(), String::new()),
        };
        let offered = match med["offered_per_s"].as_f64() {
            Some(o) if o > 0.0 => format!("{o:.0}"),
            _ => String::new(),
        };
        // Older results have no passes; raw loops have none.
        let per_pass = match med["frames_per_pass"].as_f64() {
            Some(p) if p > 0.0 => format!("{p:.1}"),
            _ => String::new(),
        };
        // Older results have no steal figure.
        let steal = med["host_steal"]
            .as_f64()
            .map_or_else(String::new, |x| format!("{:.1}%", x * 100.0));
        let _ = writeln!(
            s,
            "{:<4} {:>9} {:<12} {:>10.0} {:>10} {:>8.3} {:>10.0} {:>5.2} {:>6} {:>7} {:>6} {:>8} {:>8}",
            dir,
            size_label(r),
            r["mode"].as_str().unwrap_or(""),
            f(&med["frames_per_s"]),
            offered,
            f(&med["gbps"]),
            f(&med["cpu_ns_per_frame"]),
            f(&med["thread_busy"]),
            steal,
            per_pass,
            ratio,
            cpu_ratio,
            judged
        );
    }
    let _ = writeln!(
        s,
        "- TX frames/s count only frames the TAP took (used entries minus tx_dropped: {} refused over all runs).",
        rows.iter()
            .map(|r| r["median"]["tx_dropped"].as_u64().unwrap_or(0))
            .sum::<u64>()
    );
    let _ = writeln!(
        s,
        "- \"65000 GSO\": 65,000-byte TCP frames with a TSO header (the JSON keys call this class 65536)."
    );
    let _ = writeln!(
        s,
        "- steal: share of this machine's CPU time (all vCPUs) the hypervisor gave to others in the mode's windows\n  \
         (/proc/stat); fr/pass: frames per device pass."
    );
    let _ = writeln!(
        s,
        "- offered/s: what the host sender pushed during each RX window. Where the raw loop read at least {:.0} % of it,",
        crate::scenarios::SENDER_BOUND * 100.0
    );
    let _ = writeln!(
        s,
        "  the sender bounds the cell and it is judged by the CPU ratio (\"c\" in judged), else by frames/s."
    );
    let _ = writeln!(
        s,
        "- TX: minivmm = io_engine Async (up to {} frames per io_uring_enter, the default); minivmm_sync = one",
        devices::virtio::io_engine::MAX_BATCH
    );
    let _ = writeln!(
        s,
        "  writev per frame; raw_batched = the raw loop batching its writes the same way (the second limit)."
    );
    for size in [64, 1514, 65536] {
        if !lim[format!("tx_batched_ratio_{size}")].is_null() {
            let _ = writeln!(
                s,
                "  tx {size}: minivmm / raw_batched = {:.3} (cpu ratio {:.3}); minivmm_sync / raw = {:.3} (cpu ratio {:.3})",
                f(&lim[format!("tx_batched_ratio_{size}")]),
                f(&lim[format!("tx_batched_cpu_ratio_{size}")]),
                f(&lim[format!("tx_sync_ratio_{size}")]),
                f(&lim[format!("tx_sync_cpu_ratio_{size}")])
            );
        }
    }
    let mut noted = false;
    for dir in ["rx", "tx"] {
        for size in [64, 1514, 65536] {
            let Some(rounds) = lim[format!("{dir}_round_ratios_{size}")].as_array() else {
                continue;
            };
            if !noted {
                noted = true;
                let _ = writeln!(
                    s,
                    "- minivmm / raw of each round (the two windows side by side), whose medians make the ratio:"
                );
            }
            let v: Vec<String> = rounds.iter().map(|r| format!("{:.2}", f(r))).collect();
            let _ = writeln!(s, "  {dir} {size}: {}", v.join(" "));
        }
    }
    for size in [64, 1514, 65536] {
        if lim[format!("rx_sender_bound_{size}")].as_bool() == Some(true) {
            let _ = writeln!(
                s,
                "  rx {size}: sender-bound (offered {:.0}/s); judged by cpu ratio {:.3}",
                f(&lim[format!("rx_offered_fps_{size}")]),
                f(&lim[format!("rx_cpu_ratio_{size}")])
            );
        }
    }
}

fn buffers_tables(s: &mut String, out: &Value) {
    for (name, title) in [
        (
            "seed000",
            "SEED000  MTU frames into posted buffers (MRG_RXBUF)",
        ),
        (
            "seed002",
            "SEED002  65,000-byte GSO frames into posted buffers (MRG_RXBUF)",
        ),
    ] {
        if let Some(rows) = titled_rows(s, &out[name], title) {
            let _ = writeln!(
                s,
                "{:>8} {:>10} {:>10} {:>14} {:>12} {:>9} {:>12}",
                "buffer", "bufs/frm", "(metrics)", "posted B/frm", "frames/s", "Gb/s", "cpu ns/frm"
            );
            for r in rows {
                let med = &r["median"];
                let _ = writeln!(
                    s,
                    "{:>8} {:>10.2} {:>10.2} {:>14.0} {:>12.0} {:>9.3} {:>12.0}",
                    r["buffer_bytes"].as_u64().unwrap_or(0),
                    f(&r["buffers_per_frame"]),
                    f(&r["buffers_per_frame_metrics"]),
                    f(&r["posted_bytes_per_frame"]),
                    f(&med["frames_per_s"]),
                    f(&med["gbps"]),
                    f(&med["cpu_ns_per_frame"])
                );
            }
        }
    }
}

fn seed001_table(s: &mut String, seed: &Value) {
    let title =
        "SEED001  RX latency (µs, host send -> used ring) under a TX flood of 1-byte UDP frames";
    let Some(rows) = titled_rows(s, seed, title) else {
        return;
    };
    let _ = writeln!(
        s,
        "{:<11} {:>5} {:>7} {:>5} {:>6} {:>7} {:>7} {:>9} {:>5} {:>9} {:>8} {:>6} {:>6} {:>6} {:>6}",
        "config",
        "pkts",
        "bytes",
        "µs",
        "n",
        "min",
        "avg",
        "p99",
        "×idle",
        "max",
        "tx fr/s",
        "cpu/f",
        "wt",
        "time",
        "desc"
    );
    let off = |v: &Value| match v.as_u64() {
        Some(0) | None => "-".to_string(),
        Some(n) => n.to_string(),
    };
    for r in rows {
        let flood = r["flood"].as_bool() == Some(true);
        let _ = writeln!(
            s,
            "{:<11} {:>5} {:>7} {:>5} {:>6} {:>7.1} {:>7.1} {:>9.1} {:>5} {:>9.1} {:>8} {:>6} {:>6} {:>6} {:>6}",
            r["config"].as_str().unwrap_or(""),
            off(&r["tx_weight_packets"]),
            off(&r["tx_weight_bytes"]),
            off(&r["pass_time_budget_us"]),
            r["samples"].as_u64().unwrap_or(0),
            f(&r["min_us"]),
            f(&r["avg_us"]),
            f(&r["p99_us"]),
            if flood {
                format!("{:.1}", f(&r["p99_vs_idle"]))
            } else {
                String::new()
            },
            f(&r["max_us"]),
            if flood {
                format!("{:.0}", f(&r["tx_frames_per_s"]))
            } else {
                String::new()
            },
            if flood {
                format!("{:.0}", f(&r["device_cpu_ns_per_tx_frame"]))
            } else {
                String::new()
            },
            r["tx_weight_hits"].as_u64().unwrap_or(0),
            r["time_budget_hits"].as_u64().unwrap_or(0),
            r["desc_budget_hits"].as_u64().unwrap_or(0),
        );
    }
    let _ = writeln!(
        s,
        "- pkts/bytes/µs: TX packet weight, byte weight, pass time budget (- = off); wt/time/desc: passes ended by"
    );
    let _ = writeln!(
        s,
        "  the weights, the time budget, the 8,192-read descriptor budget. default = NetConfig::default()."
    );
    if let Some(p) = seed["p99_vs_idle_default"].as_f64() {
        let _ = write!(
            s,
            "- default: p99 {:.0} µs = {p:.2} × idle p99 {:.0} µs (goal ≤ 2: {}); TX {:.0} frames/s",
            f(&seed["p99_us_default"]),
            f(&seed["p99_us_idle"]),
            if p <= 2.0 { "met" } else { "not met" },
            f(&seed["tx_fps_default"]),
        );
        match seed["tx_fps_weight_256"].as_f64() {
            Some(w) => {
                let _ = writeln!(s, " against {w:.0} at weight_256 alone");
            }
            None => s.push('\n'),
        }
    }
}

fn startup_table(s: &mut String, st: &Value) {
    if !st.is_object() {
        return;
    }
    let _ = writeln!(
        s,
        "\nSTARTUP  minivmm start (main) to first vCPU entry, its own info-level log line; {} runs each",
        st["runs"].as_u64().unwrap_or(0)
    );
    let _ = writeln!(
        s,
        "kernel {}, initramfs {}",
        st["kernel"].as_str().unwrap_or("?"),
        st["initramfs"].as_str().unwrap_or("none")
    );
    for name in ["before", "after"] {
        let r = &st[name];
        if !r.is_object() {
            continue;
        }
        let runs: Vec<String> = r["boot_ms_runs"]
            .as_array()
            .map(|v| v.iter().map(|x| format!("{}", f(x))).collect())
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{name:<6} median {:>5.1} ms  runs [{}]  spawn->line median {:.1} ms  ({})",
            f(&r["boot_ms_median"]),
            runs.join(", "),
            f(&r["spawn_to_boot_line_ms_median"]),
            r["binary"].as_str().unwrap_or("?")
        );
        if let Some(steps) = r["steps_ms_median"].as_array() {
            let list: Vec<String> = steps
                .iter()
                .map(|p| format!("{} {:.2}", p[0].as_str().unwrap_or("?"), f(&p[1])))
                .collect();
            if !list.is_empty() {
                let _ = writeln!(
                    s,
                    "       build steps, median ms (debug runs): {}",
                    list.join(", ")
                );
                // What is not a build step: main() up to build(), and from
                // the built VM to the vCPU thread's first entry.
                let build: f64 = steps.iter().map(|p| f(&p[1])).sum();
                let debug_boot: Vec<f64> = r["debug_boot_ms_runs"]
                    .as_array()
                    .map(|v| v.iter().map(f).collect())
                    .unwrap_or_default();
                let boot = crate::stats::median(&debug_boot);
                let _ = writeln!(
                    s,
                    "       sum of steps {build:.2} ms; median boot of the debug runs {boot:.0} ms \
                     (whole ms), so main to build plus build to vCPU entry about {:.1} ms",
                    boot - build
                );
            }
        }
    }
}

fn ratelimit_table(s: &mut String, rl: &Value) {
    let title =
        "RATELIMIT  achieved / configured under a flood (median of rounds; 0.95..1.05 passes)";
    let Some(rows) = titled_rows(s, rl, title) else {
        return;
    };
    let _ = writeln!(
        s,
        "{:<7} {:>6} {:>14} {:>14} {:<9} {:>7}",
        "case", "frame", "configured", "achieved", "unit", "ratio"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<7} {:>6} {:>14.0} {:>14.0} {:<9} {:>7.3}",
            r["case"].as_str().unwrap_or(""),
            r["frame_bytes"],
            f(&r["configured"]),
            f(&r["achieved_median"]),
            r["unit"].as_str().unwrap_or(""),
            f(&r["ratio"])
        );
    }
}

/// Renders every scenario present in `out`.
pub fn table(out: &Value) -> String {
    let mut s = String::new();
    let m = &out["machine"];
    let _ = writeln!(
        s,
        "\nnetbench: minivmm virtio-net vs raw TAP ({} cores, {}, kernel {}, loadavg {}){}",
        m["cores"],
        m["cpu"].as_str().unwrap_or("?"),
        m["kernel"].as_str().unwrap_or("?"),
        m["loadavg_at_start"].as_str().unwrap_or("?"),
        if out["quick"].as_bool() == Some(true) {
            ", --quick"
        } else {
            ""
        }
    );
    limit_table(&mut s, &out["limit"]);
    buffers_tables(&mut s, out);
    seed001_table(&mut s, &out["seed001"]);
    startup_table(&mut s, &out["startup"]);
    ratelimit_table(&mut s, &out["ratelimit"]);
    crate::block::table(&mut s, &out["block"]);
    crate::vsock::table(&mut s, &out["vsock"]);
    if let Some(load) = out["machine"]["loadavg_at_end"].as_str() {
        let _ = writeln!(s, "\nloadavg at the end: {load}");
    }
    if let Some(e) = out["elapsed_s"].as_f64() {
        let _ = writeln!(s, "elapsed {e:.1} s");
    }
    s
}

/// Instructions per frame from `callgrind-frames.sh` output: (dir, bytes)
/// -> instructions.
fn callgrind(text: &str) -> Vec<((String, u64), f64)> {
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                [dir, bytes, _batch, ir] => {
                    Some(((dir.to_string(), bytes.parse().ok()?), ir.parse().ok()?))
                }
                _ => None,
            }
        })
        .collect()
}

fn read_json(path: &std::path::Path) -> anyhow::Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)?;
    Ok(Some(serde_json::from_str(&text)?))
}

fn machine_line(v: &Value) -> String {
    let m = &v["machine"];
    format!(
        "{}, kernel {}, loadavg at start {}{}",
        m["cpu"].as_str().unwrap_or("?"),
        m["kernel"].as_str().unwrap_or("?"),
        m["loadavg_at_start"].as_str().unwrap_or("?"),
        if v["quick"].as_bool() == Some(true) {
            ", --quick"
        } else {
            ""
        }
    )
}

/// Before/after of every limit cell and seed001 configuration, the
/// callgrind instructions per frame, and the goals; from the files a
/// `tools/bench/run.sh` run leaves in `dir`.
pub fn summary(dir: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    let after = read_json(&dir.join("latest.json"))
        .context("read latest.json")?
        .context("no latest.json in the results directory")?;
    let before = read_json(&dir.join("baseline.json")).context("read baseline.json")?;
    let cg = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map(|t| callgrind(&t))
            .unwrap_or_default()
    };
    let (cg_after, cg_before) = (cg("callgrind.txt"), cg("callgrind-baseline.txt"));
    let mut s = table(&after);
    let none = Value::Null;
    let b = before.as_ref().unwrap_or(&none);
    let _ = writeln!(s, "\nBEFORE / AFTER");
    let _ = writeln!(s, "after:  {}", machine_line(&after));
    if before.is_some() {
        let rev = std::fs::read_to_string(dir.join("baseline-rev.txt")).unwrap_or_default();
        let _ = writeln!(s, "before: {} (commit {})", machine_line(b), rev.trim());
    }
    let _ = writeln!(
        s,
        "{:<4} {:>9} {:>15} {:>15} {:>15} {:>15} {:>13} {:>11}",
        "dir",
        "frame B",
        "fr/s ratio",
        "cpu ratio",
        "dev cpu ns/fr",
        "raw cpu ns/fr",
        "instr/frame",
        "judged"
    );
    let pair = |x: f64, y: f64, prec: usize| -> String {
        let fmt = |v: f64| {
            if v.is_nan() {
                "-".to_string()
            } else {
                format!("{v:.prec$}")
            }
        };
        format!("{} → {}", fmt(x), fmt(y))
    };
    let row_cpu = |v: &Value, dir: &str, size: u64, mode: &str| -> f64 {
        v["limit"]["rows"]
            .as_array()
            .and_then(|rows| {
                rows.iter().find(|r| {
                    r["dir"] == dir && r["size"].as_u64() == Some(size) && r["mode"] == mode
                })
            })
            .map_or(f64::NAN, |r| f(&r["median"]["cpu_ns_per_frame"]))
    };
    let ir = |list: &[((String, u64), f64)], dir: &str, size: u64| -> f64 {
        list.iter()
            .find(|((d, b), _)| d == dir && *b == size)
            .map_or(f64::NAN, |(_, v)| *v)
    };
    for dir in ["rx", "tx"] {
        for size in [64u64, 1514, 65536] {
            let k = |what: &str| format!("{dir}_{what}_{size}");
            let (la, lb) = (&after["limit"], &b["limit"]);
            if la[k("ratio")].is_null() {
                continue;
            }
            let label = if size == 65536 {
                "65000 GSO".to_string()
            } else {
                size.to_string()
            };
            let _ = writeln!(
                s,
                "{:<4} {:>9} {:>15} {:>15} {:>15} {:>15} {:>13} {:>11}",
                dir,
                label,
                pair(f(&lb[k("ratio")]), f(&la[k("ratio")]), 3),
                pair(f(&lb[k("cpu_ratio")]), f(&la[k("cpu_ratio")]), 3),
                pair(
                    row_cpu(b, dir, size, "minivmm"),
                    row_cpu(&after, dir, size, "minivmm"),
                    0
                ),
                pair(
                    row_cpu(b, dir, size, "raw"),
                    row_cpu(&after, dir, size, "raw"),
                    0
                ),
                pair(ir(&cg_before, dir, size), ir(&cg_after, dir, size), 0),
                format!(
                    "{:.3}{}",
                    f(&la[k("judged_ratio")]),
                    if la[k("judged_by")] == "cpu" {
                        " c"
                    } else {
                        ""
                    }
                ),
            );
        }
    }
    let _ = writeln!(
        s,
        "- \"x → y\": before → after. instr/frame: callgrind, device thread, 128 frames per pass (64 and 1514 B only)."
    );
    if let Some(rows) = after["seed001"]["rows"].as_array() {
        let _ = writeln!(s, "\nSEED001 before / after (p99 µs, TX frames/s)");
        for r in rows {
            let name = r["config"].as_str().unwrap_or("");
            let old = b["seed001"]["rows"]
                .as_array()
                .and_then(|v| v.iter().find(|x| x["config"] == name));
            let (p_old, t_old) = old.map_or((f64::NAN, f64::NAN), |x| {
                (f(&x["p99_us"]), f(&x["tx_frames_per_s"]))
            });
            let _ = writeln!(
                s,
                "{:<11} p99 {:>21}   tx fr/s {:>17}",
                name,
                pair(p_old, f(&r["p99_us"]), 1),
                pair(t_old, f(&r["tx_frames_per_s"]), 0)
            );
        }
    }
    let _ = writeln!(s, "\nGOALS");
    for dir in ["rx", "tx"] {
        for size in [64u64, 1514, 65536] {
            let la = &after["limit"];
            let k = |what: &str| format!("{dir}_{what}_{size}");
            if la[k("judged_ratio")].is_null() {
                continue;
            }
            let j = f(&la[k("judged_ratio")]);
            let _ = writeln!(
                s,
                "limit.{dir}_ratio_{size} = {:.4}; judged by {} = {j:.4} (>= 0.90: {})",
                f(&la[k("ratio")]),
                la[k("judged_by")].as_str().unwrap_or("?"),
                if j >= 0.9 { "met" } else { "not met" }
            );
        }
    }
    for size in [64u64, 1514, 65536] {
        let la = &after["limit"];
        if let Some(b) = la[format!("tx_batched_ratio_{size}")].as_f64() {
            let _ = writeln!(
                s,
                "  second limit: limit.tx_batched_ratio_{size} = {b:.4} (minivmm / raw loop batching as it does)"
            );
        }
    }
    for dir in ["rx", "tx"] {
        let c = f(&after["limit"][format!("{dir}_cpu_ratio_64")]);
        if !c.is_nan() {
            // "within 15 %": device CPU per frame at most 1.15 x raw.
            let _ = writeln!(
                s,
                "{dir} 64 B device CPU per frame = {:.2} x raw (<= 1.15: {})",
                1.0 / c,
                if 1.0 / c <= 1.15 { "met" } else { "not met" }
            );
        }
    }
    for cell in ["tx_4k", "tx_64k", "rx_4k", "rr_1"] {
        let v = &after["vsock"];
        let (Some(r), Some(c)) = (
            v[format!("{cell}_ratio_batched")].as_f64(),
            v[format!("{cell}_cpu_ratio_batched")].as_f64(),
        ) else {
            continue;
        };
        let h = f(&v[format!("{cell}_cpu_ratio_batched_without_harness")]);
        let _ = writeln!(
            s,
            "vsock.{cell}_ratio_batched = {r:.4} (>= 0.90: {}); cpu {c:.3} x the batched relay, \
             {h:.3} without the harness (<= 1.15: {})",
            if r >= 0.9 { "met" } else { "not met" },
            if c <= 1.15 {
                "met"
            } else if h <= 1.15 {
                "met without the harness"
            } else {
                "not met"
            }
        );
    }
    if let Some(p) = after["seed001"]["p99_vs_idle_default"].as_f64() {
        let _ = writeln!(
            s,
            "seed001 default p99 = {p:.2} x idle (<= 2: {}); unweighted p99 = {:.0} µs",
            if p <= 2.0 { "met" } else { "not met" },
            f(&after["seed001"]["p99_us_unweighted"])
        );
    }
    if let Some(ms) = after["startup"]["boot_ms_median"].as_f64() {
        let _ = writeln!(
            s,
            "start-up median {ms:.1} ms (<= 10: {})",
            if ms <= 10.0 { "met" } else { "not met" }
        );
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gso_rows_are_labelled_with_their_frame_size() {
        let r = json!({"size": 65536, "frame_bytes": 65000});
        assert_eq!(size_label(&r), "65000 GSO");
        assert_eq!(size_label(&json!({"size": 64, "frame_bytes": 64})), "64");
    }

    #[test]
    fn callgrind_lines_parse() {
        let t = "dir   bytes  batch  device-thread instructions/frame\ntx       64    128  220\nrx     1514    128  384\n";
        let v = callgrind(t);
        assert_eq!(
            v,
            vec![
                (("tx".to_string(), 64), 220.0),
                (("rx".to_string(), 1514), 384.0)
            ]
        );
    }

    #[test]
    fn table_renders_ratio_rows() {
        let out = json!({
            "machine": {"cores": 2, "cpu": "x", "kernel": "k"},
            "limit": {"rx_ratio_64": 0.5, "rx_bounce_ratio_64": 0.25, "rows": [
                {"dir": "rx", "size": 64, "mode": "raw", "median": {"frames_per_s": 100.0, "gbps": 0.1, "cpu_ns_per_frame": 5.0}},
                {"dir": "rx", "size": 64, "mode": "minivmm", "median": {"frames_per_s": 50.0, "gbps": 0.05, "cpu_ns_per_frame": 9.0}},
                {"dir": "rx", "size": 64, "mode": "bounce", "median": {"frames_per_s": 25.0, "gbps": 0.02, "cpu_ns_per_frame": 9.0}},
            ]},
        });
        let t = table(&out);
        assert!(t.contains("0.500"), "{t}");
        assert!(t.contains("0.250"), "{t}");
        assert!(!t.contains("SEED001"));
        assert!(!t.contains("STARTUP"));
        assert!(!t.contains("RATELIMIT"));
    }

    #[test]
    fn table_renders_ratelimit_rows() {
        let out = json!({
            "machine": {"cores": 2, "cpu": "x", "kernel": "k"},
            "ratelimit": {"tx_bw_ratio": 0.998, "rows": [
                {"case": "tx_bw", "frame_bytes": 1514, "configured": 200e6, "achieved_median": 199.6e6,
                 "unit": "bit/s", "ratio": 0.998},
            ]},
        });
        let t = table(&out);
        assert!(t.contains("RATELIMIT"), "{t}");
        assert!(
            t.contains("tx_bw") && t.contains("0.998") && t.contains("199600000"),
            "{t}"
        );
    }
}
