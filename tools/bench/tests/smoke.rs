// SPDX-License-Identifier: Apache-2.0
//! Smoke test: the benchmark binary runs its tiny `smoke` scenario end to end
//! (namespace, TAP, raw loops, the real device on its event loop, JSON) in a
//! few seconds. Needs root and /dev/net/tun; skips with a printed reason
//! otherwise. Figures are only checked for shape and sanity, never speed.

use std::process::Command;

fn skip_reason() -> Option<&'static str> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (needs CAP_NET_ADMIN for a namespace and a TAP)");
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("the `ip` tool (iproute2) is missing");
    }
    None
}

#[test]
fn smoke_scenario_produces_contract_shaped_json() {
    if let Some(why) = skip_reason() {
        eprintln!("SKIPPED smoke_scenario_produces_contract_shaped_json: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("netbench-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("out.json");
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_netbench"))
        .args(["--scenario", "smoke", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "netbench failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed().as_secs() < 60,
        "smoke run took {:?}",
        started.elapsed()
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();

    for key in ["rx_ratio_1514", "tx_ratio_1514", "rx_bounce_ratio_1514"] {
        let r = v["limit"][key].as_f64().unwrap_or(-1.0);
        assert!(r > 0.0 && r.is_finite(), "limit.{key} = {r}");
    }
    // Frames really reached the host stack with good checksums.
    assert!(v["limit"]["host_udp_datagrams"].as_u64().unwrap_or(0) > 0);
    assert_eq!(v["limit"]["host_udp_csum_errors"].as_u64(), Some(0));
    // Header-inclusive sizing: a 1514-byte frame plus its 12-byte header
    // fills exactly one 1526-byte buffer.
    assert_eq!(v["seed000"]["buffers_per_frame_1526"].as_f64(), Some(1.0));
    let rows = v["seed001"]["rows"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = rows.iter().filter_map(|r| r["config"].as_str()).collect();
    assert_eq!(names, ["raw_idle", "idle", "default"]);
    for r in &rows {
        assert!(r["samples"].as_u64().unwrap_or(0) > 10, "{r}");
    }
    // The TX flood really ran beside the probes.
    assert!(
        rows[2]["tx_frames_per_s"].as_f64().unwrap_or(0.0) > 0.0,
        "{}",
        rows[2]
    );
    assert!(v["seed001"]["p99_us_idle"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(v["seed001"]["p99_us_default"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(v["seed001"]["p99_vs_idle_default"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(stdout.contains("LIMIT"), "{stdout}");
    assert!(stdout.contains("1514"), "{stdout}");
    // The RX sender's offer is measured in each window, and every cell
    // says which ratio judges it.
    assert!(v["limit"]["rx_offered_fps_1514"].as_f64().unwrap_or(0.0) > 0.0);
    assert!(v["limit"]["rx_sender_bound_1514"].is_boolean());
    for dir in ["rx", "tx"] {
        let by = v["limit"][format!("{dir}_judged_by_1514")].as_str();
        assert!(matches!(by, Some("cpu") | Some("frames/s")), "{by:?}");
    }

    // The summary of a results directory reads the same JSON, unprivileged.
    std::fs::copy(&json, dir.join("latest.json")).unwrap();
    let report = Command::new(env!("CARGO_BIN_EXE_netbench"))
        .arg("--report")
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{text}");
    assert!(
        text.contains("GOALS") && text.contains("limit.rx_ratio_1514"),
        "{text}"
    );

    // The namespace was removed.
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let name = v["namespace"].as_str().unwrap_or("?").to_string();
    assert!(name.starts_with("netbench-"), "{name}");
    assert!(!String::from_utf8_lossy(&ns.stdout).contains(&name));
    let _ = std::fs::remove_dir_all(&dir);
}
