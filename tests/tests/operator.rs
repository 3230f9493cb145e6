// SPDX-License-Identifier: Apache-2.0
//! What an operator coming from Firecracker or Cloud Hypervisor relies on:
//! the config file, several NICs with rate limiters, metrics they can
//! collect, and exit statuses.
//!
//! - Every bad configuration and usage error is one line and exit status 1
//!   (no KVM needed: all of it is caught before KVM is opened).
//! - Metrics lines arrive on an interval, on SIGUSR1 and at exit, into a FIFO
//!   and into a file, from a VM whose "kernel" is a three-byte ELF that halts
//!   at once (seconds, not a guest boot).
//! - The vsock device's socket, from a VM on the same halting kernel: it
//!   appears, a host's `CONNECT` without a guest driver is closed and
//!   counted, the remover process runs under its filter, and the socket is
//!   gone when minivmm has ended, on SIGTERM and on SIGKILL; a path that
//!   exists is refused.
//! - One real guest boot from a config file with two NICs and rate limiters,
//!   inside a network namespace this test creates: the guest's virtio-net
//!   driver activates both NICs (their metrics carry the negotiated features)
//!   and the guest answers pings on the first.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use minivmm_tests::{
    cli_args, current_test_name, guest_image_if, metrics_lines, minivmm_bin, parse_metrics_lines,
    require, write_halting_kernel, Need, NetNs, Vm,
};

const BOOT_TIMEOUT: Duration = Duration::from_secs(420);
/// VIRTIO_F_VERSION_1 (virtio 1.1 §6).
const VERSION_1_BIT: u64 = 1 << 32;

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("minivmm-op-{}-{name}", std::process::id()))
}

/// Runs minivmm to completion: (exit status, stderr).
/// Runs minivmm on `args`, which must end it at once: a minivmm still
/// running after 60 s (one that went on to serve an API, say) is killed
/// and fails the test instead of hanging it.
fn run(args: &[String]) -> (Option<i32>, String) {
    let mut child = Command::new(minivmm_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running minivmm");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("waiting for minivmm").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?}: minivmm still ran after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("minivmm's stderr");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_config_error(args: &[String], want: &str) {
    let (code, err) = run(args);
    assert_eq!(code, Some(1), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(err.starts_with("minivmm: error: "), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: want '{want}' in '{err}'");
}

#[test]
fn usage_and_config_errors_are_one_line_and_exit_1() {
    // clap's own errors.
    assert_config_error(&cli_args(&["--bogus"]), "unexpected argument '--bogus'");
    // No argument at all serves the API on Firecracker's default socket (the
    // fc_flags test); without the API nothing else can describe the VM.
    assert_config_error(&cli_args(&["--no-api"]), "--no-api needs --config-file");
    assert_config_error(
        &cli_args(&["--kernel", "k", "--mem", "lots"]),
        "invalid number 'lots'",
    );
    assert_config_error(&cli_args(&["--kernel", "k", "--log-level", "loud"]), "loud");
    // --vsock.
    assert_config_error(
        &cli_args(&["--kernel", "k", "--vsock", "cid=1,socket=/tmp/v.sock"]),
        "vsock: guest_cid 1 is reserved",
    );
    assert_config_error(
        &cli_args(&["--kernel", "k", "--vsock", "socket=/tmp/v.sock"]),
        "--vsock 'socket=/tmp/v.sock': cid is missing",
    );
    // --net.
    assert_config_error(
        &cli_args(&["--kernel", "k", "--net", "tap=t0", "--tap", "t0"]),
        "TAP 't0' is given to two network interfaces",
    );
    assert_config_error(
        &cli_args(&[
            "--kernel",
            "k",
            "--net",
            "tap=t0,tx_bw_size=1000,tx_bw_refill_time=0",
        ]),
        "refill_time must be at least 1 ms",
    );

    let file = |name: &str, json: &str| {
        let p = tmp(name);
        std::fs::write(&p, json).unwrap();
        p
    };
    // A kernel that opens, so that the drives' images are what fails.
    let kernel = tmp("kernel");
    write_halting_kernel(&kernel).unwrap();
    let boot = format!(
        r#""boot-source": {{"kernel_image_path": "{}"}}"#,
        kernel.display()
    );
    let iface = |extra: &str| format!(r#"{{"iface_id": "eth0", "host_dev_name": "tap0"{extra}}}"#);
    let cases = [
        ("json", "{ not json".to_string(), "config file is not valid JSON"),
        (
            "unknown-key",
            format!(r#"{{{boot}, "machine-config": {{"vcpu_count": 1, "mem_size_mib": 128, "turbo": true}}}}"#),
            "in 'machine-config': unknown field `turbo`",
        ),
        (
            "unknown-section",
            format!(r#"{{{boot}, "gpu": {{}}}}"#),
            "unknown section 'gpu'",
        ),
        (
            "vsock-cid",
            format!(r#"{{{boot}, "vsock": {{"guest_cid": 2, "uds_path": "/tmp/v.sock"}}}}"#),
            "vsock: guest_cid 2 is reserved",
        ),
        (
            "vsock-key",
            format!(r#"{{{boot}, "vsock": {{"guest_cid": 3, "uds": "/tmp/v.sock"}}}}"#),
            "in 'vsock': unknown field `uds`",
        ),
        (
            "drives",
            format!(
                r#"{{{boot}, "drives": [{{"drive_id": "rootfs", "path_on_host": "r.ext4", "is_root_device": true, "is_read_only": false}}]}}"#
            ),
            "drive 'rootfs': disk image r.ext4: No such file or directory",
        ),
        (
            "vhost-user-drive",
            format!(
                r#"{{{boot}, "drives": [{{"drive_id": "rootfs", "socket": "/run/vu.sock", "is_root_device": true}}]}}"#
            ),
            "drives[0].socket: vhost-user drives are not supported by minivmm",
        ),
        (
            "cache-type",
            format!(
                r#"{{{boot}, "drives": [{{"drive_id": "rootfs", "path_on_host": "r.ext4", "is_root_device": true, "cache_type": "WriteThrough"}}]}}"#
            ),
            "drives[0].cache_type: unknown cache type 'WriteThrough': expected Unsafe or Writeback",
        ),
        (
            "bad-mac",
            format!(r#"{{{boot}, "network-interfaces": [{}]}}"#, iface(r#", "guest_mac": "06:00:ac:10:00""#)),
            "invalid MAC address '06:00:ac:10:00'",
        ),
        (
            "zero-refill",
            format!(
                r#"{{{boot}, "network-interfaces": [{}]}}"#,
                iface(r#", "rx_rate_limiter": {"ops": {"size": 100, "refill_time": 0}}"#)
            ),
            "network interface 'eth0': rx_rate_limiter: ops bucket: refill_time must be at least 1 ms",
        ),
        (
            "same-tap",
            format!(
                r#"{{{boot}, "network-interfaces": [{}, {{"iface_id": "eth1", "host_dev_name": "tap0"}}]}}"#,
                iface("")
            ),
            "TAP 'tap0' is given to two network interfaces",
        ),
    ];
    for (name, json, want) in cases {
        let p = file(name, &json);
        assert_config_error(&cli_args(&["--config-file", p.to_str().unwrap()]), want);
        std::fs::remove_file(&p).unwrap();
    }
}

#[test]
fn bad_drives_are_one_line_and_exit_1() {
    let dir = tmp("drive-images");
    std::fs::create_dir_all(&dir).unwrap();
    let img = |n: &str| {
        let p = dir.join(n);
        std::fs::write(&p, vec![0u8; 1 << 16]).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (a, b) = (img("a.img"), img("b.img"));
    let d = dir.to_str().unwrap().to_string();
    // A kernel that opens, so that the drives' images are what fails.
    let kernel = dir.join("kernel");
    write_halting_kernel(&kernel).unwrap();
    let k = kernel.to_str().unwrap();
    let disk = |spec: &str| cli_args(&["--kernel", k, "--disk", spec]);
    assert_config_error(
        &disk(&format!("path={d}/missing.img")),
        &format!("drive 'disk0': disk image {d}/missing.img: No such file or directory"),
    );
    assert_config_error(
        &disk(&format!("path={d}")),
        &format!("drive 'disk0': disk image {d} is not a regular file"),
    );
    assert_config_error(
        &cli_args(&[
            "--kernel",
            k,
            "--disk",
            &format!("path={a},root=on"),
            "--disk",
            &format!("path={b},root=on"),
        ]),
        "drive 'disk1': drive 'disk0' is the root device already; at most one may be",
    );
    assert_config_error(
        &cli_args(&[
            "--kernel",
            k,
            "--disk",
            &format!("path={a}"),
            "--disk",
            &format!("path={d}/./a.img"),
        ]),
        "is already drive 'disk0'",
    );
    assert_config_error(
        &disk(&format!("path={a},cache=none")),
        "unknown cache type 'none': expected Unsafe or Writeback",
    );
    assert_config_error(&disk("root=on"), "--disk 'root=on': path=FILE is missing");
    // A locked image (another VM has it) is found when the device opens it,
    // after KVM is set up but before the guest runs.
    if std::path::Path::new("/dev/kvm").exists() {
        let mut holder = Command::new("flock")
            .args(["-x", &a, "-c", "sleep 30"])
            .spawn()
            .expect("flock(1)");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (code, err) = run(&cli_args(&[
            "--kernel",
            &halting_kernel().display().to_string(),
            "--disk",
            &format!("path={a}"),
        ]));
        let _ = holder.kill();
        let _ = holder.wait();
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(err.lines().count(), 1, "not one line: {err}");
        assert!(
            err.contains(&format!(
                "disk image {a} is in use by another process (locked)"
            )),
            "{err}"
        );
    } else {
        eprintln!("skipped the locked-image case: /dev/kvm is missing");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn halting_kernel() -> PathBuf {
    let p = tmp("halt.elf");
    write_halting_kernel(&p).unwrap();
    p
}

/// Arguments for a VM on the halting kernel writing metrics to `metrics`.
fn halting_vm(kernel: &Path, metrics: &Path, interval: &str) -> Vec<String> {
    cli_args(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--mem",
        "64",
        "--metrics",
        metrics.to_str().unwrap(),
        "--metrics-interval",
        interval,
    ])
}

/// Reads a FIFO line by line on a thread (reopening it if a writer closes).
fn fifo_reader(path: PathBuf) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || loop {
        let Ok(f) = std::fs::File::open(&path) else {
            return;
        };
        for line in BufReader::new(f).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

#[test]
fn metrics_lines_on_an_interval_on_sigusr1_and_at_exit() {
    if !require(&[Need::Kvm]) {
        return;
    }
    let kernel = halting_kernel();

    // A FIFO, every second; the reader sees whole JSON lines as they come.
    let fifo = tmp("metrics.fifo");
    let _ = std::fs::remove_file(&fifo);
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let lines = fifo_reader(fifo.clone());
    let log = tmp("fifo-run.log");
    let _ = std::fs::remove_file(&log);
    let mut args = halting_vm(&kernel, &fifo, "1");
    args.extend(cli_args(&[
        "--log-path",
        log.to_str().unwrap(),
        "--log-level",
        "info",
        "--id",
        "metrics-vm",
    ]));
    let mut vm = Vm::spawn(&args, None).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 3 && Instant::now() < deadline {
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(200)) {
            got.push(l);
        }
    }
    assert!(
        got.len() >= 3,
        "{} lines in 20 s\n{}",
        got.len(),
        vm.report()
    );
    let parsed = parse_metrics_lines(&got.join("\n"));
    for w in parsed.windows(2) {
        let t = |v: &serde_json::Value| v["utc_timestamp_ms"].as_u64().unwrap();
        let up = |v: &serde_json::Value| v["vmm"]["uptime_ms"].as_u64().unwrap();
        let gap = up(&w[1]) - up(&w[0]);
        assert!((700..=2500).contains(&gap), "interval {gap} ms");
        assert!(t(&w[1]) >= t(&w[0]));
        assert!(w[1]["vmm"]["vcpu_exits"]["io_in"].is_u64());
    }
    // Every line names its VM, so VMs sharing one FIFO are told apart.
    for l in &parsed {
        assert_eq!(l["id"], "metrics-vm", "{l}");
    }
    // SIGUSR1 adds a line at once; SIGTERM ends the VM with 0 and a last line.
    let before = got.len();
    vm.signal("USR1");
    vm.terminate(Duration::from_secs(10));
    while let Ok(l) = lines.recv_timeout(Duration::from_millis(500)) {
        got.push(l);
    }
    assert!(got.len() >= before + 2, "no SIGUSR1 and exit lines");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::metadata(&fifo).unwrap().file_type().is_fifo(),
        "the FIFO was replaced"
    );
    // The log went to its file, every line with a timestamp and a level.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("from start to first vCPU entry"), "{text}");
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let ts = w.next().unwrap();
        assert!(ts.len() == 24 && ts.ends_with('Z'), "{line}");
        assert!(
            ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"].contains(&w.next().unwrap()),
            "{line}"
        );
    }
    std::fs::remove_file(&fifo).unwrap();
    std::fs::remove_file(&log).unwrap();

    // A file with interval 0: exactly the SIGUSR1 line and the exit line,
    // appended after what the file held.
    let file = tmp("metrics.json");
    std::fs::write(&file, "").unwrap();
    let mut vm = Vm::spawn(&halting_vm(&kernel, &file, "0"), None).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "", "no timer line");
    vm.signal("USR1");
    std::thread::sleep(Duration::from_millis(300));
    vm.terminate(Duration::from_secs(10));
    let lines = metrics_lines(&file);
    assert_eq!(lines.len(), 2);
    assert!(lines[1]["vmm"]["uptime_ms"].as_u64() >= lines[0]["vmm"]["uptime_ms"].as_u64());
    // Without --id, Firecracker's default id.
    assert_eq!(lines[0]["id"], "anonymous-instance");
    std::fs::remove_file(&file).unwrap();
    std::fs::remove_file(&kernel).unwrap();
}

/// A script that starts minivmm in the background (`minivmm ... &` in a
/// non-interactive shell) starts it with SIGINT ignored. minivmm still stops
/// on SIGINT, with 0: its stop signals are blocked and read from a
/// signalfd, and a blocked signal is queued whatever its disposition.
#[test]
fn sigint_stops_minivmm_started_with_sigint_ignored() {
    if !require(&[Need::Kvm]) {
        return;
    }
    use std::os::unix::process::CommandExt;
    let kernel = tmp("sigint-halt.elf");
    write_halting_kernel(&kernel).unwrap();
    let metrics = tmp("sigint-ignored.json");
    std::fs::write(&metrics, "").unwrap();
    let mut cmd = Command::new(minivmm_bin());
    cmd.args(halting_vm(&kernel, &metrics, "0"))
        .args(["--log-level", "info"]);
    // SAFETY: signal(2) is async-signal-safe, as pre_exec requires.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut vm = Vm::spawn_command(cmd).unwrap();
    wait_until("the first vCPU entry", Duration::from_secs(20), || {
        vm.stderr().contains("first vCPU entry")
    });
    let ignored = std::fs::read_to_string(format!("/proc/{}/status", vm.pid()))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix("SigIgn:")
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        })
        .unwrap();
    assert_ne!(
        ignored & (1 << (libc::SIGINT - 1)),
        0,
        "SIGINT is not ignored"
    );
    vm.signal("INT");
    let status = vm
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("minivmm ignored SIGINT\n{}", vm.report()));
    assert_eq!(status.code(), Some(0), "{}", vm.report());
    // Stopped as by SIGTERM: the exit's metrics line.
    assert_eq!(metrics_lines(&metrics).len(), 1);
    std::fs::remove_file(&metrics).unwrap();
    std::fs::remove_file(&kernel).unwrap();
}

/// The processes whose parent is `pid`: (pid, name, `Seccomp:` mode).
fn children_of(pid: u32) -> Vec<(u32, String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{child}/status")) else {
            continue;
        };
        let field = |name: &str| minivmm_tests::status_field(&status, name);
        if field("PPid:") == pid.to_string() {
            out.push((child, field("Name:"), field("Seccomp:")));
        }
    }
    out
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_vsock_socket_appears_is_served_and_is_gone_when_minivmm_ends() {
    if !require(&[Need::Kvm]) {
        return;
    }
    let kernel = halting_kernel();
    let dir = tmp("vsock");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("v.sock");
    let metrics = dir.join("metrics.json");
    let mut args = halting_vm(&kernel, &metrics, "0");
    let vsock = format!("cid=3,socket={}", sock.display());
    args.extend(cli_args(&["--vsock", &vsock]));
    let mut vm = Vm::spawn(&args, None).unwrap();
    wait_until("the socket", Duration::from_secs(20), || sock.exists());
    // The remover, a child of minivmm under its own filter: started once
    // the socket is there, so it may come a moment after the file.
    let remover = |kids: &[(u32, String, String)]| {
        kids.iter()
            .any(|(_, name, filter)| name == "minivmm-unlink" && filter == "2")
    };
    wait_until("the remover", Duration::from_secs(20), || {
        remover(&children_of(vm.pid()))
    });
    // No driver came up in the halting guest: a CONNECT is refused (the
    // connection closed), on the event loop under its filter.
    wait_until("the VM running", Duration::from_secs(20), || {
        vm.stderr().is_empty() && !metrics.exists() || metrics.exists()
    });
    assert!(minivmm_tests::vsock_connect_is_closed(&sock), "not closed");
    vm.signal("USR1");
    wait_until("a metrics line", Duration::from_secs(10), || {
        !metrics_lines(&metrics).is_empty()
    });
    let line = &metrics_lines(&metrics)[0];
    assert_eq!(line["vsock"]["conns_refused"], 1, "{line}");
    assert_eq!(line["vsock"]["conns_active"], 0, "{line}");
    vm.terminate(Duration::from_secs(10));
    assert!(!sock.exists(), "the socket outlived minivmm");
    // A path that exists is refused with one line, and left alone.
    std::fs::write(&sock, b"not minivmm's").unwrap();
    let (code, err) = run(&args);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::read(&sock).unwrap(), b"not minivmm's");
    std::fs::remove_file(&sock).unwrap();
    // Killed outright, minivmm leaves the removal to the remover.
    let mut vm = Vm::spawn(&args, None).unwrap();
    wait_until("the socket", Duration::from_secs(20), || sock.exists());
    vm.signal("KILL");
    vm.wait_exit(Duration::from_secs(10))
        .expect("minivmm ended");
    wait_until("the socket removed", Duration::from_secs(10), || {
        !sock.exists()
    });
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::remove_file(&kernel).unwrap();
}

#[test]
fn config_file_with_two_nics_and_rate_limiters_boots() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let test = current_test_name();
    let ns = NetNs::new("op", "tap0", "10.0.2.1/24").unwrap();
    // The second card's TAP, up, with an address of its own in the namespace.
    ns.add_tap("tap1", "10.0.3.1/24", None).unwrap();

    let metrics = tmp("boot-metrics.json");
    let log = tmp("boot.log");
    for p in [&metrics, &log] {
        let _ = std::fs::remove_file(p);
    }
    // boot_args is the whole command line, as in Firecracker (minivmm adds
    // only its device words and, on a PVM host, its recoveries); the guest
    // serves so that it stays up to be pinged.
    let config = serde_json::json!({
        "boot-source": {
            "kernel_image_path": img.vmlinux,
            "initrd_path": img.initramfs,
            "boot_args": "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
                          ip=10.0.2.2::10.0.2.1:255.255.255.0:guest:eth0:off"
        },
        "machine-config": { "vcpu_count": 1, "mem_size_mib": 256, "smt": false },
        "drives": [],
        "network-interfaces": [
            {
                "iface_id": "eth0",
                "host_dev_name": "tap0",
                "guest_mac": "06:00:AC:10:00:02",
                // Loose bandwidth, tight ops: 50 frames/s in, 10 frames/s
                // out. The guest's frames are mostly echo replies, which
                // the RX limiter already paces: TX is throttled only if
                // its budget is tighter than RX's.
                "rx_rate_limiter": {
                    "bandwidth": { "size": 1_250_000, "one_time_burst": 0, "refill_time": 100 },
                    "ops": { "size": 5, "refill_time": 100 }
                },
                "tx_rate_limiter": {
                    "bandwidth": { "size": 1_250_000, "refill_time": 100 },
                    "ops": { "size": 1, "refill_time": 100 }
                }
            },
            {
                "iface_id": "eth1",
                "host_dev_name": "tap1",
                "mtu": 1400,
                "queue_size": 128,
                "tx_rate_limiter": { "ops": { "size": 500, "refill_time": 100 } }
            }
        ],
        "metrics": { "metrics_path": metrics, "interval_s": 5 },
        "logger": { "log_path": log, "level": "Info", "show_level": true },
        "vsock": null,
        "balloon": null
    });
    let file = tmp("vm.json");
    std::fs::write(&file, serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let mut vm = Vm::spawn(
        &cli_args(&["--config-file", file.to_str().unwrap()]),
        Some(&ns.name),
    )
    .unwrap();

    vm.assert_eth0_configured("10.0.2.2", "06:00:ac:10:00:02", BOOT_TIMEOUT);

    let replies = ns.ping("10.0.2.2", &[]);
    eprintln!("{test}: {}", replies.lines().last().unwrap_or(""));
    assert!(
        replies.contains(" 0% packet loss") || replies.contains("3 received"),
        "the guest did not answer on eth0:\n{replies}\n{}",
        vm.report()
    );

    // A burst well above 50 frames/s: both limiters hold frames back, which
    // runs their timerfds under the event loop's seccomp filter (a call
    // missing from the allowlist would end minivmm with 148 here).
    let burst = ns
        .command("ping")
        .args(["-c", "40", "-i", "0.01", "-w", "60", "10.0.2.2"])
        .output()
        .expect("running ping");
    eprintln!(
        "{test}: burst: {}",
        String::from_utf8_lossy(&burst.stdout)
            .lines()
            .last()
            .unwrap_or("")
    );

    vm.signal("USR1");
    std::thread::sleep(Duration::from_millis(500));
    let lines = metrics_lines(&metrics);
    let last = lines.last().expect("a metrics line after SIGUSR1");
    for id in ["eth0", "eth1"] {
        let f = last[id]["features_negotiated"]
            .as_u64()
            .unwrap_or_else(|| panic!("no {id} in {last}"));
        assert_ne!(
            f & VERSION_1_BIT,
            0,
            "{id}: driver did not activate: {f:#x}"
        );
    }
    assert!(last["eth0"]["rx_frames"].as_u64() >= Some(3), "{last}");
    assert!(last["eth0"]["tx_frames"].as_u64() >= Some(3), "{last}");
    for key in ["rx_rate_limiter_throttled", "tx_rate_limiter_throttled"] {
        assert!(
            last["eth0"][key].as_u64() > Some(0),
            "the burst was not throttled ({key}): {last}"
        );
    }
    // The limiters' counters are in every card's object.
    for key in [
        "rx_rate_limiter_throttled",
        "tx_rate_limiter_throttled",
        "rx_throttled_ns",
        "tx_throttled_ns",
    ] {
        assert!(last["eth0"][key].is_u64(), "{key} missing: {last}");
    }
    assert!(
        last["vmm"]["vcpu_exits"]["mmio_write"].as_u64() > Some(0),
        "{last}"
    );

    vm.terminate(Duration::from_secs(20));
    let log_text = std::fs::read_to_string(&log).unwrap();
    // minivmm says what it added to boot_args: one device word per card.
    let added = log_text
        .lines()
        .find(|l| l.contains("minivmm adds to the kernel command line"))
        .unwrap_or_else(|| panic!("no command-line note in the log:\n{log_text}"));
    assert_eq!(added.matches("virtio_mmio.device=").count(), 2, "{added}");
    for p in [&metrics, &log, &file] {
        let _ = std::fs::remove_file(p);
    }
}
