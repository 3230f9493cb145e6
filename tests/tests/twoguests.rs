// SPDX-License-Identifier: Apache-2.0
//! Two guests talking: two minivmm VMs on two TAPs joined by a Linux bridge
//! inside one private namespace (every address lives only there).
//!
//! Guest A serves (`minivmm.mode=serve`: mvperf server and `iperf3 -s`);
//! once it does, guest B boots in `minivmm.mode=client` with
//! `minivmm.peer=` A's address, and its init pings A, runs mvperf TCP_STREAM
//! and TCP_RR and iperf3 against it, and prints each result behind
//! `MINIVMM-CLIENT`. Every frame between them crosses both VMs' virtio-net
//! devices and the bridge, so both VMs' metrics must show the traffic. Both
//! end with 0 on SIGTERM. Two boots, one after the other (a boot is 30 to
//! 120 s on a PVM host; two at once on two shared cores only slow both).
//! Every wait follows progress (the harness's `Watch`): B's console, in the
//! time both VMMs got a CPU, so a host loaded by other work slows the test
//! without failing it; inside B, mvperf's own waits follow progress too.

use std::time::Duration;

use minivmm_tests::{
    cli_args, guest_image, last_metrics, metric, require, Need, NetNs, Patience, Vm, READY,
};

const HOST_CIDR: &str = "10.0.5.1/24";
const A_IP: &str = "10.0.5.2";
const B_IP: &str = "10.0.5.3";
/// A boot's stall window: console silence this long (of the VMM's own time)
/// fails it; [`Vm::wait_for`] caps it at three times this.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// B's client run: ping, two 5 s mvperf tests and a 5 s iperf3, each with
/// first-run delays on both emulated guests; B prints a line before each
/// step, so this long without a line (in the time either VMM got a CPU)
/// is a stall. An mvperf that fails ends after its grace (60 s) with a line.
const CLIENT_STALL: Duration = Duration::from_secs(600);

/// Counter `key` of a guest's NIC in metrics line `m`.
fn frames(m: &serde_json::Value, key: &str) -> u64 {
    metric(m, "net0", key)
}

/// Starts a guest on `tap` of namespace `ns`, with MAC `mac`, writing its
/// metrics to `metrics` and booting with `cmdline`.
fn spawn_guest(ns: &NetNs, tap: &str, mac: &str, metrics: &std::path::Path, cmdline: &str) -> Vm {
    let mut args = guest_image().vmlinux_and_initramfs_args();
    args.extend(cli_args(&[
        "--tap",
        tap,
        "--mac",
        mac,
        "--mem",
        "256",
        "--metrics",
        metrics.to_str().unwrap(),
        "--cmdline",
        cmdline,
        "--log-level",
        "info",
    ]));
    Vm::spawn(&args, Some(&ns.name)).unwrap()
}

#[test]
fn two_guests_talk_through_a_bridge() {
    if !require(&[Need::Kvm, Need::Root, Need::Tun]) {
        return;
    }
    let _ = guest_image();
    let ns = NetNs::bare("two", "tap0").unwrap();
    ns.exec_ip(&["link", "add", "br0", "type", "bridge"])
        .unwrap();
    ns.exec_ip(&["addr", "add", HOST_CIDR, "dev", "br0"])
        .unwrap();
    ns.exec_ip(&["link", "set", "br0", "up"]).unwrap();
    for tap in ["tap0", "tap1"] {
        ns.exec_ip(&["tuntap", "add", "dev", tap, "mode", "tap"])
            .unwrap();
        ns.exec_ip(&["link", "set", tap, "master", "br0"]).unwrap();
        ns.exec_ip(&["link", "set", tap, "up"]).unwrap();
    }
    let pid = std::process::id();
    let metrics_a = std::env::temp_dir().join(format!("minivmm-two-a-{pid}.json"));
    let metrics_b = std::env::temp_dir().join(format!("minivmm-two-b-{pid}.json"));
    let ip = |me: &str| format!("ip={me}::10.0.5.1:255.255.255.0:guest:eth0:off");

    let mut a = spawn_guest(
        &ns,
        "tap0",
        "06:00:ac:10:00:02",
        &metrics_a,
        &format!("minivmm.mode=serve {}", ip(A_IP)),
    );
    assert!(
        a.wait_for("MINIVMM-SERVING", BOOT_TIMEOUT),
        "guest A never served\n{}",
        a.report()
    );
    a.assert_userspace_ran();
    eprintln!("guest A serving after {:.1} s", a.uptime());

    let mut b = spawn_guest(
        &ns,
        "tap1",
        "06:00:ac:10:00:03",
        &metrics_b,
        &format!("minivmm.mode=client minivmm.peer={A_IP} {}", ip(B_IP)),
    );
    // B's progress depends on A's too: the time either waited for a CPU is
    // time the host took.
    let booted = b.wait_for_with(READY, Patience::of(BOOT_TIMEOUT), &[a.pid()]);
    assert!(booted, "guest B never booted\n{}", b.report());
    eprintln!("guest B ready after {:.1} s", b.uptime());
    let done = b.wait_for_with(
        "MINIVMM-CLIENT DONE",
        Patience::of(CLIENT_STALL),
        &[a.pid()],
    );
    let console = b.console();
    for line in console.lines().filter(|l| l.contains("MINIVMM-CLIENT")) {
        eprintln!("guest B: {line}");
    }
    assert!(done, "guest B never finished\n{}", b.report());
    b.assert_userspace_ran();
    assert!(
        console.contains("MINIVMM-CLIENT DONE ok"),
        "guest B's client run failed\n{}",
        b.report()
    );
    assert!(
        // busybox ping's summary.
        console.contains("MINIVMM-CLIENT ping 3 packets transmitted, 3 packets received"),
        "{}",
        b.report()
    );
    for test in ["TCP_STREAM", "TCP_RR"] {
        let line = console
            .lines()
            .find(|l| l.contains("MINIVMM-CLIENT mvperf {") && l.contains(test))
            .unwrap_or_else(|| panic!("no {test} result\n{}", b.report()));
        let json = &line[line.find('{').expect("JSON object")..];
        let v: serde_json::Value = serde_json::from_str(json.trim()).expect("mvperf JSON");
        let figure = if test == "TCP_STREAM" {
            assert!(v["bytes"].as_f64() > Some(0.0), "{v}");
            format!("{} Mbit/s", v["throughput_mbps"])
        } else {
            assert!(v["transactions"].as_f64() > Some(0.0), "{v}");
            format!(
                "{} transactions/s, p50 {} us",
                v["transactions_per_s"], v["latency_us"]["p50"]
            )
        };
        eprintln!("FIGURE guest B -> guest A mvperf {test}: {figure}");
    }
    let iperf = console
        .lines()
        .rev()
        .find(|l| l.contains("receiver") && l.contains("bits/sec"))
        .unwrap_or_else(|| panic!("no iperf3 receiver summary\n{}", b.report()));
    eprintln!("FIGURE guest B -> guest A iperf3: {}", iperf.trim());
    assert!(
        console.contains("MINIVMM-CLIENT iperf3 ok"),
        "{}",
        b.report()
    );
    // Guest A logged each session its servers completed.
    for test in ["TCP_STREAM", "TCP_RR"] {
        assert!(
            a.wait_for(&format!("{test} done"), Duration::from_secs(30)),
            "guest A did not log {test}\n{}",
            a.report()
        );
    }

    for (name, vm) in [("A", &mut a), ("B", &mut b)] {
        vm.signal("TERM");
        let status = vm
            .wait_exit(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("guest {name}'s minivmm ignored SIGTERM"));
        assert_eq!(status.code(), Some(0), "guest {name}\n{}", vm.report());
        vm.assert_no_crash();
    }
    // Both devices carried the TCP_STREAM (at least hundreds of KB, so
    // hundreds of frames each way) and the rest.
    let (ma, mb) = (last_metrics(&metrics_a), last_metrics(&metrics_b));
    eprintln!("metrics of A at exit: {ma}");
    eprintln!("metrics of B at exit: {mb}");
    for (name, m) in [("A", &ma), ("B", &mb)] {
        assert!(frames(m, "rx_frames") > 200, "guest {name}: {m}");
        assert!(frames(m, "tx_frames") > 200, "guest {name}: {m}");
        assert_eq!(frames(m, "malformed_chains"), 0, "guest {name}: {m}");
    }
    // B sent the stream, A received it.
    assert!(frames(&ma, "rx_bytes") > 100_000, "{ma}");
    assert!(frames(&mb, "tx_bytes") > 100_000, "{mb}");
    for p in [&metrics_a, &metrics_b] {
        let _ = std::fs::remove_file(p);
    }
}
