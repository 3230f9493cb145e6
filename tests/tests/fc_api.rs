// SPDX-License-Identifier: Apache-2.0
//! Every path and method of Firecracker's API description, sent to minivmm
//! once before boot and once after, each answer checked against the
//! description (`tests/data/firecracker.yaml`, read by
//! `minivmm_tests::fc_paths`): the success status it lists with an empty
//! body for `204` and a body its definition admits for `200`, or, where
//! minivmm refuses, a `400` whose body is Firecracker's `Error` with one
//! `fault_message` line saying what is missing, never "unknown path".
//!
//! - Before boot (no KVM needed): a minivmm configured through the API only.
//! - After boot (KVM, root, TUN; one guest boot): Firecracker's example
//!   configuration (`tests/framework/vm_config_network.json`: a root drive and
//!   a network card) started with the flags a Firecracker launcher passes,
//!   `--enable-pci --level Info --show-level --show-log-origin --metrics-path
//!   --no-seccomp`. The boot itself is checked too: the one warning line of
//!   `--enable-pci`, log lines with their level and origin, metrics lines,
//!   no seccomp filter on any thread.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use minivmm_tests::fc_paths::{operations, request, Operation};
use minivmm_tests::fc_schema::{self, validate, validate_minivmm};
use minivmm_tests::{
    cli_args, disk_copy, guest_image_if, metrics_lines, minivmm_bin, Need, NetNs, Vm,
};
use serde_json::{json, Value};

const HOST_IP: &str = "10.0.9.1";
const GUEST_IP: &str = "10.0.9.2";
/// As the other boot tests: 30 to 120 s on a quiet PVM host, far more under load.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// The id every `{placeholder}` of a path gets: the example's drive and card
/// ids are the ones its paths name.
const DRIVE: &str = "rootfs";
const IFACE: &str = "eth0";

/// What minivmm answers one operation with.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    /// The description's success status.
    Ok,
    /// `400`, the fault message containing this.
    Fault(&'static str),
}

/// Files the requests name, in a directory of the test's own.
struct Files {
    dir: PathBuf,
    kernel: PathBuf,
    image: PathBuf,
}

impl Files {
    fn new(tag: &str) -> Files {
        let dir = std::env::temp_dir().join(format!("minivmm-fcapi-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = dir.join("vmlinux");
        std::fs::write(&kernel, b"not a kernel: the API checks only that it opens").unwrap();
        let image = dir.join("disk.img");
        std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
        Files { dir, kernel, image }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_string()
    }
}

/// What minivmm answers `method path` with, before or after boot.
fn want(method: &str, path: &str, booted: bool) -> Want {
    const LATE: &str = "is not allowed after it started";
    const EARLY: &str = "is not allowed before the microVM is started";
    let first = path.split('/').nth(1).unwrap_or("");
    match (first, method) {
        // Before boot: the description's order asks GET /balloon before
        // the PUT that configures one, and the run-time paths are refused.
        // After: the booted VM has a balloon, whose every path answers.
        ("balloon", "GET") if !booted && path == "/balloon" => {
            Want::Fault("no balloon device is configured")
        }
        ("balloon", "PUT") => {
            if booted {
                Want::Fault(LATE)
            } else {
                Want::Ok
            }
        }
        ("balloon", _) => {
            if booted {
                Want::Ok
            } else {
                Want::Fault(EARLY)
            }
        }
        ("cpu-config", _) => Want::Fault("CPU templates is not supported"),
        ("pmem", _) => Want::Fault("it needs a virtio-pmem device"),
        ("hotplug", _) => Want::Fault("it needs a virtio-mem device"),
        // The store answers in both phases; its configuration is a
        // pre-boot section, and before boot the card it names is not yet
        // put (the description lists /mmds/config before the cards).
        ("mmds", _) if path == "/mmds/config" => {
            if booted {
                Want::Fault(LATE)
            } else {
                Want::Fault("eth0")
            }
        }
        ("mmds", _) => Want::Ok,
        // Served, but neither phase of this test can take one: before boot
        // there is no snapshot file to load or VM to save, after it the VM
        // is not paused and a running VM loads none.
        ("snapshot", _) => Want::Fault("snapshot"),
        (_, "GET") => Want::Ok,
        // Configuration: before boot only.
        (
            "boot-source" | "logger" | "metrics" | "machine-config" | "entropy" | "serial"
            | "vsock",
            _,
        )
        | ("drives" | "network-interfaces", "PUT") => {
            if booted {
                Want::Fault(LATE)
            } else {
                Want::Ok
            }
        }
        // Run-time requests: after boot only.
        ("drives" | "network-interfaces" | "vm", "PATCH") | ("actions", _) => {
            if booted {
                Want::Ok
            } else {
                Want::Fault(EARLY)
            }
        }
        _ => panic!("no expectation for {method} {path}"),
    }
}

/// The body sent with `method path` (`None` for a GET).
fn body(method: &str, path: &str, booted: bool, f: &Files) -> Option<Value> {
    if method == "GET" {
        return None;
    }
    let image = f.image.to_str().unwrap();
    Some(match (method, path) {
        ("PUT", "/actions") if booted => json!({"action_type": "FlushMetrics"}),
        ("PUT", "/actions") => json!({"action_type": "SendCtrlAltDel"}),
        ("PUT", "/boot-source") => {
            json!({"kernel_image_path": f.kernel, "boot_args": "console=ttyS0"})
        }
        ("PUT", "/drives/rootfs") => json!({"drive_id": DRIVE, "path_on_host": image,
                                            "is_root_device": true, "is_read_only": false}),
        ("PATCH", "/drives/rootfs") => json!({"drive_id": DRIVE, "rate_limiter":
                                              {"bandwidth": {"size": 100_000_000, "refill_time": 100}}}),
        ("PUT", "/network-interfaces/eth0") => {
            json!({"iface_id": IFACE, "host_dev_name": "tap-fcapi"})
        }
        ("PATCH", "/network-interfaces/eth0") => json!({"iface_id": IFACE}),
        ("PUT", "/logger") => json!({"log_path": f.path("api.log"), "level": "Info",
                                     "show_level": true, "show_log_origin": false}),
        ("PUT", "/metrics") => json!({"metrics_path": f.path("api-metrics.json"),
                                      "emit_id": true, "properties": {"suite": "fc_api"}}),
        ("PUT", "/machine-config") => json!({"vcpu_count": 1, "mem_size_mib": 128}),
        ("PATCH", "/machine-config") => json!({"vcpu_count": 1}),
        ("PUT", "/entropy") => json!({}),
        ("PUT", "/serial") => json!({"serial_out_path": f.path("serial.out")}),
        ("PUT", "/vsock") => json!({"guest_cid": 3, "uds_path": f.path("v.sock")}),
        ("PATCH", "/vm") if booted => json!({"state": "Resumed"}),
        ("PATCH", "/vm") => json!({"state": "Paused"}),
        ("PUT", "/balloon") => json!({"amount_mib": 0, "deflate_on_oom": false}),
        ("PATCH", "/balloon") => json!({"amount_mib": 0}),
        ("PATCH", "/balloon/statistics") => json!({"stats_polling_interval_s": 1}),
        ("PUT", "/pmem/rootfs") => json!({"id": DRIVE, "path_on_host": image}),
        ("PUT", "/mmds/config") => json!({"network_interfaces": [IFACE]}),
        ("PUT", "/snapshot/create") => {
            json!({"snapshot_path": f.path("s"), "mem_file_path": f.path("m")})
        }
        ("PUT", "/snapshot/load") => json!({"snapshot_path": f.path("s")}),
        ("PUT", "/hotplug/memory") => json!({"total_size_mib": 1024}),
        ("PATCH", "/hotplug/memory") => json!({"requested_size_mib": 0}),
        _ => json!({}),
    })
}

/// Sends `op` and checks the answer; returns the line the test prints.
fn check(sock: &Path, op: &Operation, booted: bool, f: &Files) -> String {
    let path = op.concrete(DRIVE);
    let path = if op.path.starts_with("/network-interfaces") {
        op.concrete(IFACE)
    } else {
        path
    };
    let sent = body(&op.method, &path, booted, f).map(|b| b.to_string());
    let (status, text) = request(sock, &op.method, &path, sent.as_deref())
        .unwrap_or_else(|| panic!("{} {path}: no answer", op.method));
    let what = format!(
        "{} {path} ({})",
        op.method,
        if booted { "after boot" } else { "before boot" }
    );
    assert!(!text.contains("unknown path"), "{what}: {text}");
    match want(&op.method, &path, booted) {
        Want::Ok => {
            let ok = op.success().expect("a success status");
            assert_eq!(status, ok, "{what}: {text}");
            if ok == 204 {
                assert_eq!(text, "", "{what}");
            } else {
                let v: Value =
                    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
                // GET /mmds alone has no named definition: its schema is an
                // inline `type: object`.
                let checked = match op.ok_body.as_deref() {
                    Some(def @ "FullVmConfiguration") => validate_minivmm(def, &v),
                    Some(def) => validate(def, &v),
                    None if v.is_object() => Ok(()),
                    None => Err("not an object".to_string()),
                };
                checked.unwrap_or_else(|e| panic!("{what}: {e}\n{v}"));
            }
        }
        Want::Fault(needle) => {
            assert_eq!(status, 400, "{what}: {text}");
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
            validate("Error", &v).unwrap_or_else(|e| panic!("{what}: {e}: {v}"));
            let msg = v["fault_message"].as_str().unwrap_or_default();
            assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{what}: {v}");
            assert!(!msg.is_empty() && !msg.contains('\n'), "{what}: {msg:?}");
            assert!(msg.contains(needle), "{what}: '{msg}' lacks '{needle}'");
        }
    }
    format!("{what}: {status}")
}

/// Sends every operation of the description, in its order.
fn every_operation(sock: &Path, booted: bool, f: &Files) {
    let ops = operations();
    assert_eq!(ops.len(), 38);
    for op in ops {
        let t = Instant::now();
        let line = check(sock, op, booted, f);
        eprintln!("{line} in {:.3} s", t.elapsed().as_secs_f64());
    }
}

/// Ends the API-only minivmm with SIGKILL if the test fails before it stops it.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn wait_for_socket(sock: &Path, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sock.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("minivmm ended before its socket appeared: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn before_boot_every_path_answers_as_the_description_says() {
    let f = Files::new("pre");
    let sock = f.dir.join("api.sock");
    let mut child = Reaper(
        std::process::Command::new(minivmm_bin())
            .args(["--api-sock", sock.to_str().unwrap(), "--id", "fc-api"])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for_socket(&sock, &mut child.0);
    every_operation(&sock, false, &f);
    // What the PUTs configured is what the document says.
    let (_, text) = request(&sock, "GET", "/vm/config", None).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        v["metrics"]["properties"],
        json!({"suite": "fc_api"}),
        "{v}"
    );
    assert_eq!(v["machine-config"]["mem_size_mib"], 128, "{v}");
    // The metrics are set up once.
    let again = json!({"metrics_path": f.path("again.json")}).to_string();
    let (status, text) = request(&sock, "PUT", "/metrics", Some(&again)).unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("set up once"), "{text}");
    // SIGTERM before InstanceStart is a clean end.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status();
    let status = child.0.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(&f.dir);
}

/// Firecracker's example with this test's kernel, root disk, TAP and boot
/// arguments (minivmm's defaults and a served guest), 256 MiB, and a balloon
/// with statistics and free page hinting, so every balloon path has a
/// device to answer after boot.
fn example_config(kernel: &Path, disk: &Path, tap: &str) -> String {
    let mut v = fc_schema::firecracker_network_example();
    v["boot-source"]["kernel_image_path"] = json!(kernel);
    v["boot-source"]["boot_args"] = json!(format!(
        "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
         ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off"
    ));
    v["drives"][0]["path_on_host"] = json!(disk);
    v["machine-config"]["mem_size_mib"] = json!(256);
    v["network-interfaces"][0]["host_dev_name"] = json!(tap);
    v["balloon"] = json!({"amount_mib": 0, "deflate_on_oom": false,
                          "stats_polling_interval_s": 1, "free_page_hinting": true});
    serde_json::to_string_pretty(&v).unwrap()
}

#[test]
fn firecrackers_example_boots_with_its_launcher_flags_and_every_path_answers_after() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let f = Files::new("boot");
    let disk = disk_copy(&f.dir, "rootfs.ext4").unwrap();
    let ns = NetNs::new("fcapi", "tap0", &format!("{HOST_IP}/24")).unwrap();
    let config = f.dir.join("vm_config_network.json");
    std::fs::write(&config, example_config(&img.vmlinux, &disk, &ns.tap)).unwrap();
    let (sock, metrics, log) = (
        f.dir.join("api.sock"),
        f.dir.join("metrics.json"),
        f.dir.join("fc.log"),
    );
    let args = cli_args(&[
        "--config-file",
        config.to_str().unwrap(),
        "--api-sock",
        sock.to_str().unwrap(),
        "--enable-pci",
        "--level",
        "Info",
        "--show-level",
        "--show-log-origin",
        "--log-path",
        log.to_str().unwrap(),
        "--metrics-path",
        metrics.to_str().unwrap(),
        "--no-seccomp",
    ]);
    let mut vm = Vm::spawn(&args, Some(&ns.name)).unwrap();
    let serving = vm.wait_for("MINIVMM-SERVING", BOOT_TIMEOUT);
    assert!(serving, "the guest never served\n{}", vm.report());
    eprintln!(
        "FIGURE fc_api: MINIVMM-SERVING {:.1} s after start",
        vm.uptime()
    );
    // --enable-pci: one warning line, the devices on virtio-MMIO.
    let stderr = vm.stderr();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("--enable-pci"))
        .collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(warnings[0].contains("virtio-MMIO"), "{stderr}");
    assert!(vm.console().contains("virtio_mmio"), "{}", vm.report());
    // --no-seccomp: no thread is filtered.
    let threads = vm.threads();
    assert!(threads.iter().all(|(_, mode)| mode == "0"), "{threads:?}");
    assert!(
        ns.ping(GUEST_IP, &[]).contains("3 received"),
        "{}",
        vm.report()
    );

    every_operation(&sock, true, &f);

    // --level Info --show-level --show-log-origin: info lines with their
    // level and source position.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let info = text
        .lines()
        .find(|l| l.contains(" INFO "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(info.contains(".rs:"), "no origin in '{info}'");
    assert!(!text.contains(" DEBUG "), "{text}");
    vm.terminate(Duration::from_secs(60));
    vm.assert_no_crash();
    // --metrics-path: lines at FlushMetrics (the matrix sent one) and exit.
    let lines = metrics_lines(&metrics);
    assert!(lines.len() >= 2, "{lines:?}");
    assert!(lines
        .iter()
        .all(|m| m["rootfs"].is_object() && m["eth0"].is_object()));
    // Firecracker's uart counter (no serial limiter here: nothing dropped).
    assert!(
        lines
            .iter()
            .all(|m| m["uart"]["rate_limiter_dropped_bytes"] == 0),
        "{lines:?}"
    );
    let _ = std::fs::remove_dir_all(&f.dir);
}
