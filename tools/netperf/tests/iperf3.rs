// SPDX-License-Identifier: Apache-2.0
//! Cross-check against a peer nobody here wrote: Debian's `iperf3`, on loopback, in the same
//! run. Our TCP_STREAM and iperf3's TCP throughput must agree within an order of magnitude;
//! a tool that miscounts (bits vs bytes, sent vs received, wrong elapsed time) lands outside.
//!
//! This is its own test binary so that cargo runs it alone, not competing for the CPU with the
//! other loopback tests, which would skew one figure against the other.

mod common;

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::{num, run_json, Server};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Kills the iperf3 server however the test ends.
struct Reap(std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn tcp_stream_agrees_with_iperf3() {
    if Command::new("iperf3")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_err()
    {
        println!("SKIP: iperf3 is not on PATH (Debian package iperf3); no cross-check run");
        return;
    }
    let port = free_port().to_string();
    let _server = Reap(
        Command::new("iperf3")
            .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn iperf3 -s"),
    );
    // iperf3 has no ready signal; retry the client briefly while the server binds. With -J a
    // refused connection can still exit 0, with an "error" member in the JSON.
    let deadline = Instant::now() + Duration::from_secs(5);
    let j = loop {
        let out = Command::new("iperf3")
            .args(["-c", "127.0.0.1", "-p", &port, "-t", "2", "-J"])
            .output()
            .expect("run iperf3 -c");
        let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let failed = !out.status.success() || j.get("error").is_some() || j.is_null();
        if !failed {
            break j;
        }
        assert!(Instant::now() < deadline, "iperf3 client failed: {out:?}");
        thread::sleep(Duration::from_millis(100));
    };
    let iperf_mbps = num(&j, &["end", "sum_received", "bits_per_second"]) / 1e6;

    let ours = Server::start();
    let v = run_json(ours.port, "TCP_STREAM", "2", &[]);
    let our_mbps = num(&v, &["throughput_mbps"]);

    let ratio = our_mbps / iperf_mbps;
    println!(
        "loopback TCP throughput: mvperf TCP_STREAM {our_mbps:.0} Mbit/s, iperf3 {iperf_mbps:.0} \
         Mbit/s, ratio {ratio:.2}"
    );
    assert!(
        (0.1..=10.0).contains(&ratio),
        "mvperf {our_mbps} vs iperf3 {iperf_mbps} Mbit/s: not the same order of magnitude"
    );
}
