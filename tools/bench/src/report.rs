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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    json!({ "kernel": kernel.trim(), "cpu": model, "cores": cores, "loadavg_at_start": load.trim() })
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
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
    if let Some(rows) = out["limit"]["rows"].as_array() {
        let _ = writeln!(s, "\nLIMIT  (median of rounds; ratio = minivmm / raw)");
        let _ = writeln!(
            s,
            "{:<4} {:>6} {:<8} {:>12} {:>9} {:>11} {:>5} {:>7} {:>8}",
            "dir", "size", "mode", "frames/s", "Gb/s", "cpu ns/frm", "busy", "ratio", "cpu rat."
        );
        for r in rows {
            let med = &r["median"];
            let key = format!(
                "{}_{}ratio_{}",
                r["dir"].as_str().unwrap_or(""),
                if r["mode"] == "bounce" { "bounce_" } else { "" },
                r["size"]
            );
            let (ratio, cpu_ratio) = match r["mode"].as_str() {
                Some("raw") => (String::new(), String::new()),
                Some("minivmm") => (
                    format!("{:.3}", f(&out["limit"][key.as_str()])),
                    format!(
                        "{:.3}",
                        f(&out["limit"][key.replace("ratio", "cpu_ratio").as_str()])
                    ),
                ),
                _ => (
                    format!("{:.3}", f(&out["limit"][key.as_str()])),
                    String::new(),
                ),
            };
            let _ = writeln!(
                s,
                "{:<4} {:>6} {:<8} {:>12.0} {:>9.3} {:>11.0} {:>5.2} {:>7} {:>8}",
                r["dir"].as_str().unwrap_or(""),
                r["size"],
                r["mode"].as_str().unwrap_or(""),
                f(&med["frames_per_s"]),
                f(&med["gbps"]),
                f(&med["cpu_ns_per_frame"]),
                f(&med["thread_busy"]),
                ratio,
                cpu_ratio
            );
        }
    }
    for (name, title) in [
        (
            "seed000",
            "SEED000  MTU frames into posted buffers (MRG_RXBUF)",
        ),
        (
            "seed002",
            "SEED002  64 KiB GSO frames into posted buffers (MRG_RXBUF)",
        ),
    ] {
        if let Some(rows) = out[name]["rows"].as_array() {
            let _ = writeln!(s, "\n{title}");
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
                    r["buffer_bytes"],
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
    if let Some(rows) = out["seed001"]["rows"].as_array() {
        let _ = writeln!(s, "\nSEED001  RX latency (µs, host send -> used ring) under a TX flood of 1-byte UDP frames");
        let _ = writeln!(
            s,
            "{:<12} {:>7} {:>8} {:>8} {:>8} {:>9} {:>10} {:>11} {:>10}",
            "tx weight", "n", "min", "avg", "p99", "max", "tx fr/s", "cpu ns/txf", "wt hits"
        );
        for r in rows {
            let _ = writeln!(
                s,
                "{:<12} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>10.0} {:>11.0} {:>10}",
                r["config"].as_str().unwrap_or(""),
                r["samples"],
                f(&r["min_us"]),
                f(&r["avg_us"]),
                f(&r["p99_us"]),
                f(&r["max_us"]),
                f(&r["tx_frames_per_s"]),
                f(&r["device_cpu_ns_per_tx_frame"]),
                r["tx_weight_hits"]
            );
        }
    }
    if let Some(rows) = out["ratelimit"]["rows"].as_array() {
        let _ = writeln!(
            s,
            "\nRATELIMIT  achieved / configured under a flood (median of rounds; 0.95..1.05 passes)"
        );
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
    if let Some(e) = out["elapsed_s"].as_f64() {
        let _ = writeln!(s, "\nelapsed {e:.1} s");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

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
