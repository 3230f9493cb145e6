// SPDX-License-Identifier: Apache-2.0
//! Cross-check against a peer nobody here wrote: Debian's `iperf3`, on loopback, in the same
//! run. Our TCP_STREAM and iperf3's TCP throughput must agree within the ratio both tools were
//! measured to give side by side ([`RATIO`]); a tool that miscounts (bits vs bytes, wrong
//! elapsed time) lands outside.
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

/// Turns each tool gets.
const ROUNDS: u8 = 3;
/// Accepted mvperf / iperf3 throughput ratio. Measured with this test on a 2-core development
/// machine under a load average of 7 to 8 (other builds running): 19 runs gave 0.95 to 1.52,
/// median 1.23. mvperf comes out ahead because its receiver reads 256 KiB per call where
/// iperf3's reads its 16 KiB block size. The bounds leave about a third of margin beyond what
/// was seen either side; a miscount by 2x (half the elapsed time, sent-twice bytes) or 8x
/// (bits vs bytes) lands outside.
const RATIO: std::ops::RangeInclusive<f64> = 0.6..=2.0;

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
            .args(["-s", "-B", "127.0.0.1", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn iperf3 -s"),
    );
    let ours = Server::start();
    // The two tools take turns, so that a change in the machine's load (other jobs share its
    // cores) falls on both alike; each writes 16 KiB at a time (mvperf's default, iperf3's
    // -l) so both pay the same system calls per byte.
    let (mut iperf_sum, mut our_sum) = (0.0, 0.0);
    for round in 1..=ROUNDS {
        let iperf_mbps = iperf3_mbps(&port);
        let v = run_json(ours.port, "TCP_STREAM", "1", &["-m", "16384"]);
        let our_mbps = num(&v, &["throughput_mbps"]);
        println!(
            "round {round}: mvperf TCP_STREAM {our_mbps:.0} Mbit/s, iperf3 {iperf_mbps:.0} Mbit/s"
        );
        iperf_sum += iperf_mbps;
        our_sum += our_mbps;
    }
    let ratio = our_sum / iperf_sum;
    println!(
        "loopback TCP throughput over {ROUNDS} rounds: mvperf {:.0} Mbit/s, iperf3 {:.0} Mbit/s, \
         ratio {ratio:.2}",
        our_sum / f64::from(ROUNDS),
        iperf_sum / f64::from(ROUNDS)
    );
    assert!(
        RATIO.contains(&ratio),
        "mvperf {our_sum} vs iperf3 {iperf_sum} Mbit/s (sums of {ROUNDS} rounds): ratio {ratio:.2} \
         outside {RATIO:?}"
    );
}

/// One 1-second iperf3 client run against the server on `port`; receiver-side Mbit/s.
fn iperf3_mbps(port: &str) -> f64 {
    // iperf3 has no ready signal; retry the client briefly while the server binds. With -J a
    // refused connection can still exit 0, with an "error" member in the JSON.
    let deadline = Instant::now() + Duration::from_secs(5);
    let j = loop {
        let out = Command::new("iperf3")
            .args([
                "-c",
                "127.0.0.1",
                "-p",
                port,
                "-t",
                "1",
                "-l",
                "16384",
                "-J",
            ])
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
    num(&j, &["end", "sum_received", "bits_per_second"]) / 1e6
}
