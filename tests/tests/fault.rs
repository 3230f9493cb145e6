// SPDX-License-Identifier: Apache-2.0
//! Faults under a running minivmm: its TAP set down and then deleted while
//! it runs.
//!
//! The VM runs a "kernel" that halts at once (no guest boot: seconds), so
//! its virtio-net device is never activated and what this shows is the
//! VMM's side: the event loop keeps running (metrics lines keep coming, with
//! no error counted) and SIGTERM still ends minivmm with status 0. What the
//! activated device does under the same faults (a log line once, the
//! `backend_hangups` and `tx_dropped` counters, every chain returned, no
//! spinning) is `devices`' `real_tap_set_down_and_deleted_under_a_running_device`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use minivmm_tests::{cli_args, metrics_lines, require, write_halting_kernel, Need, NetNs, Vm};

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("minivmm-fault-{}-{name}", std::process::id()))
}

/// Waits until the metrics file holds at least `n` lines.
fn wait_lines(path: &Path, n: usize, vm: &Vm) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines = metrics_lines(path);
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "{} metrics lines after 20 s, want {n}\n{}",
            lines.len(),
            vm.report()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn tap_set_down_and_deleted_under_a_running_vmm() {
    if !require(&[Need::Kvm, Need::Root, Need::Tun]) {
        return;
    }
    let ns = NetNs::new("fault", "tap0", "10.0.4.1/24").unwrap();
    let kernel = tmp("halt.elf");
    write_halting_kernel(&kernel).unwrap();
    let metrics = tmp("metrics.json");
    let _ = std::fs::remove_file(&metrics);
    let args = cli_args(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--mem",
        "64",
        "--tap",
        "tap0",
        "--metrics",
        metrics.to_str().unwrap(),
        "--metrics-interval",
        "1",
    ]);
    let mut vm = Vm::spawn(&args, Some(&ns.name)).unwrap();
    let first = wait_lines(&metrics, 1, &vm).len();

    ns.exec_ip(&["link", "set", "tap0", "down"]).unwrap();
    let down = wait_lines(&metrics, first + 2, &vm).len();
    ns.exec_ip(&["link", "del", "tap0"]).unwrap();
    // The event loop goes on: two more interval lines.
    let lines = wait_lines(&metrics, down + 2, &vm);
    let net = &lines.last().unwrap()["net0"];
    assert_eq!(net["host_errors"], 0, "{net}");
    assert_eq!(net["backend_hangups"], 0, "{net}");

    vm.terminate(Duration::from_secs(10));
    let _ = std::fs::remove_file(&metrics);
    let _ = std::fs::remove_file(&kernel);
}
