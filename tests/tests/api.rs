// SPDX-License-Identifier: Apache-2.0
//! Firecracker's control plane: the API socket driven with `curl
//! --unix-socket`, exactly as the README shows it.
//!
//! - Before boot (no KVM needed): every refused request is a `400` whose
//!   body is one `fault_message` line; accepted ones are `204`; the GETs
//!   answer JSON; a stop signal ends the process with 0 and removes the
//!   socket; the launcher's flags (`--version`, `--metadata`, `--id`,
//!   `--no-api`) behave as Firecracker's.
//! - One boot through the API alone, jailed (KVM, root, TUN): the process
//!   runs as `nobody` with no capability and `no_new_privs` in a mount
//!   namespace whose root is the jail directory (which holds the kernel,
//!   the initramfs, the socket and the metrics); configure, start,
//!   observe, pause (the guest stops answering ping; a ping sent while
//!   paused is answered after resume), change the RX limiter live (seen in
//!   the throughput a host TCP stream gets and in the metrics), replace a
//!   drive's image with a bigger one and grow that one on the host (each
//!   seen in the guest kernel's "new size" line; a missing, a locked image,
//!   a directory refused with the old image kept), change the drive's
//!   limiter, flush metrics, and `SendCtrlAltDel`, after which the guest
//!   reboots and minivmm exits 0.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use minivmm_tests::fc_schema::{validate, validate_minivmm};
use minivmm_tests::{
    guest_image_if, last_metrics, minivmm_bin, mvperf_bin, Need, NetNs, Vm, JAIL_ID,
};
use serde_json::{json, Value};

const HOST_IP: &str = "10.0.2.1";
const GUEST_IP: &str = "10.0.2.2";
/// See tests/netperf.rs: an emulated guest under load needs minutes.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

/// One request with curl, as the README writes it; the status and the body.
fn curl(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    minivmm_tests::api_curl(sock, method, path, body)
}

/// A request that must succeed with `204` and no body.
fn ok(sock: &Path, method: &str, path: &str, body: Value) {
    let (code, text) = curl(sock, method, path, Some(&body.to_string()));
    assert_eq!((code, text.as_str()), (204, ""), "{method} {path} {body}");
}

/// A PUT that must succeed with `204`.
fn put(sock: &Path, path: &str, body: Value) {
    ok(sock, "PUT", path, body);
}

/// A PATCH that must succeed with `204`.
fn patch(sock: &Path, path: &str, body: Value) {
    ok(sock, "PATCH", path, body);
}

/// A GET that must answer `200` with a JSON object.
fn get(sock: &Path, path: &str) -> Value {
    let (code, text) = curl(sock, "GET", path, None);
    assert_eq!(code, 200, "GET {path}: {text}");
    let v: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"));
    // The Firecracker API description's schema for the path (for
    // `/vm/config`, with minivmm's own config-file keys allowed beside).
    let checked = match path {
        "/" => validate("InstanceInfo", &v),
        "/version" => validate("FirecrackerVersion", &v),
        "/machine-config" => validate("MachineConfiguration", &v),
        "/vm/config" => validate_minivmm("FullVmConfiguration", &v),
        "/balloon" => validate("Balloon", &v),
        "/balloon/statistics" => validate("BalloonStats", &v),
        "/balloon/hinting/status" => validate("BalloonHintingStatus", &v),
        // The store: free-form JSON, which the description does not type.
        "/mmds" => Ok(()),
        other => panic!("no schema for GET {other}"),
    };
    if let Err(e) = checked {
        panic!("GET {path} does not validate: {e}\n{v}");
    }
    v
}

/// A request that must be refused: `400` with exactly one key,
/// `fault_message`, a one-line message containing `needle`.
fn refused(sock: &Path, method: &str, path: &str, body: Option<&str>, needle: &str) {
    let (code, text) = curl(sock, method, path, body);
    assert_eq!(code, 400, "{method} {path} was not refused: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    validate("Error", &v).unwrap_or_else(|e| panic!("{method} {path}: {e}: {v}"));
    let obj = v.as_object().expect("an object");
    assert_eq!(obj.len(), 1, "{v}");
    let msg = obj["fault_message"].as_str().expect("fault_message");
    assert!(!msg.contains('\n') && !msg.is_empty(), "{msg:?}");
    assert!(
        msg.contains(needle),
        "{method} {path}: '{msg}' lacks '{needle}'"
    );
}

fn wait_for_socket(sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn sock_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("minivmm-api-{tag}-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn minivmm(args: &[&str]) -> std::process::Output {
    Command::new(minivmm_bin())
        .args(args)
        .output()
        .expect("running minivmm")
}

fn one_line_error(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(needle), "{err}");
}

#[test]
fn launcher_flags_behave_as_firecrackers() {
    let out = minivmm(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with(&format!("minivmm v{}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    // The store's first content is read at start: a missing file is one
    // line, before anything else.
    one_line_error(
        &minivmm(&[
            "--no-api",
            "--metadata",
            "/nonexistent/x.json",
            "--kernel",
            "/k",
        ]),
        "--metadata: cannot read '/nonexistent/x.json'",
    );
    one_line_error(&minivmm(&["--id", "no spaces", "--kernel", "/k"]), "--id");
    one_line_error(
        &minivmm(&["--no-api", "--api-sock", "/tmp/x.sock"]),
        "--api-sock",
    );
    // Neither a kernel, nor a file, nor an API to configure one through.
    one_line_error(&minivmm(&["--no-api"]), "--kernel");
    // The jailer's timing flags are accepted (the kernel is what fails).
    one_line_error(
        &minivmm(&[
            "--kernel",
            "/nonexistent/vmlinux",
            "--start-time-us",
            "1",
            "--start-time-cpu-us",
            "2",
            "--parent-cpu-time-us",
            "3",
            "--id",
            "vm-1",
        ]),
        "/nonexistent/vmlinux",
    );
    // The socket path must not exist (Firecracker's rule).
    let taken = sock_path("taken");
    std::fs::write(&taken, b"").unwrap();
    one_line_error(
        &minivmm(&["--api-sock", taken.to_str().unwrap()]),
        "already exists",
    );
    let _ = std::fs::remove_file(&taken);
}

#[test]
fn before_boot_every_bad_request_is_a_400_with_one_fault_line() {
    let sock = sock_path("errors");
    let mut vm = Vm::spawn(
        &[
            "--api-sock".into(),
            sock.display().to_string(),
            "--id".into(),
            "api-errors".into(),
            "--mmds-size-limit".into(),
            "64".into(),
        ],
        None,
    )
    .unwrap();
    wait_for_socket(&sock);

    let info = get(&sock, "/");
    assert_eq!(info["id"], "api-errors");
    assert_eq!(info["state"], "Not started");
    assert_eq!(info["app_name"], "minivmm");
    assert_eq!(
        get(&sock, "/version")["firecracker_version"],
        format!("1.17.0+minivmm.{}", env!("CARGO_PKG_VERSION"))
    );
    let m = get(&sock, "/machine-config");
    assert_eq!(
        (m["vcpu_count"].as_u64(), m["smt"].as_bool()),
        (Some(1), Some(false))
    );

    // The wire: malformed JSON, a body too big, an unknown path or method.
    refused(
        &sock,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count":"#),
        "JSON",
    );
    let huge = format!(r#"{{"boot_args":"{}"}}"#, "x".repeat(60 * 1024));
    refused(&sock, "PUT", "/boot-source", Some(&huge), "");
    refused(&sock, "GET", "/no-such-path", None, "/no-such-path");
    refused(&sock, "DELETE", "/machine-config", None, "DELETE");
    // Shapes: an unknown field, a missing one, an id that differs.
    let extra = r#"{"vcpu_count":1,"mem_size_mib":128,"hugepages":"2M"}"#;
    refused(&sock, "PUT", "/machine-config", Some(extra), "hugepages");
    refused(
        &sock,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count":1}"#),
        "mem_size_mib",
    );
    let other_id = r#"{"drive_id":"b","path_on_host":"/x","is_root_device":false}"#;
    refused(&sock, "PUT", "/drives/a", Some(other_id), "differs");
    // Values: as the command line checks them.
    let zero = r#"{"vcpu_count":0,"mem_size_mib":128}"#;
    refused(&sock, "PUT", "/machine-config", Some(zero), "vCPU");
    let missing =
        r#"{"drive_id":"rootfs","path_on_host":"/nonexistent/disk.ext4","is_root_device":true}"#;
    refused(
        &sock,
        "PUT",
        "/drives/rootfs",
        Some(missing),
        "/nonexistent/disk.ext4",
    );
    let kernel = r#"{"kernel_image_path":"/nonexistent/vmlinux"}"#;
    refused(
        &sock,
        "PUT",
        "/boot-source",
        Some(kernel),
        "/nonexistent/vmlinux",
    );
    let mac = r#"{"iface_id":"eth0","host_dev_name":"tap0","guest_mac":"06:00"}"#;
    refused(&sock, "PUT", "/network-interfaces/eth0", Some(mac), "06:00");
    let bucket = r#"{"rate_limiter":{"bandwidth":{"size":1000}}}"#;
    refused(&sock, "PUT", "/entropy", Some(bucket), "refill_time");
    refused(
        &sock,
        "PUT",
        "/entropy",
        Some(r#"{"src":"/dev/urandom"}"#),
        "src",
    );
    // A body missing its fields, and a snapshot of a VM not yet started.
    refused(&sock, "PUT", "/vsock", Some("{}"), "vsock");
    refused(
        &sock,
        "PUT",
        "/snapshot/create",
        Some(r#"{"snapshot_path":"s","mem_file_path":"m"}"#),
        "before the microVM is started",
    );
    // The balloon: Firecracker's body, and its run-time paths only once
    // the VM runs.
    refused(
        &sock,
        "PUT",
        "/balloon",
        Some("{}"),
        "missing field `amount_mib`",
    );
    let too_big = r#"{"amount_mib":4096,"deflate_on_oom":false}"#;
    refused(
        &sock,
        "PUT",
        "/balloon",
        Some(too_big),
        "more than the guest's",
    );
    refused(
        &sock,
        "GET",
        "/balloon",
        None,
        "no balloon device is configured",
    );
    refused(
        &sock,
        "PATCH",
        "/balloon",
        Some(r#"{"amount_mib":1}"#),
        "before the microVM",
    );
    refused(
        &sock,
        "GET",
        "/balloon/statistics",
        None,
        "before the microVM",
    );
    refused(
        &sock,
        "PATCH",
        "/balloon/hinting/start",
        None,
        "before the microVM",
    );
    // The wrong phase.
    refused(
        &sock,
        "PATCH",
        "/vm",
        Some(r#"{"state":"Paused"}"#),
        "before the microVM",
    );
    // As Firecracker: a drive is changed with PATCH only once the VM runs.
    refused(
        &sock,
        "PATCH",
        "/drives/rootfs",
        Some(r#"{"drive_id":"rootfs","path_on_host":"/x"}"#),
        "before the microVM",
    );
    for action in ["FlushMetrics", "SendCtrlAltDel"] {
        let body = format!(r#"{{"action_type":"{action}"}}"#);
        refused(&sock, "PUT", "/actions", Some(&body), "before the microVM");
    }
    refused(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type":"Reboot"}"#),
        "Reboot",
    );
    // Nothing to boot yet.
    refused(
        &sock,
        "PUT",
        "/actions",
        Some(r#"{"action_type":"InstanceStart"}"#),
        "kernel",
    );

    // MMDS: a configuration naming no card, a patch before any content,
    // a store over --mmds-size-limit (64 bytes here) changing nothing.
    refused(
        &sock,
        "PUT",
        "/mmds/config",
        Some(r#"{"network_interfaces":["eth0"]}"#),
        "does not correspond to any existing network interface",
    );
    refused(
        &sock,
        "PATCH",
        "/mmds",
        Some(r#"{"a":1}"#),
        "not initialized",
    );
    put(&sock, "/mmds", json!({"latest": {"ami-id": "ami-1"}}));
    let big = format!(r#"{{"latest":"{}"}}"#, "x".repeat(64));
    refused(&sock, "PUT", "/mmds", Some(&big), "doesn't fit");
    refused(&sock, "PATCH", "/mmds", Some(&big), "doesn't fit");
    patch(&sock, "/mmds", json!({"latest": {"user-data": "u"}}));
    assert_eq!(
        get(&sock, "/mmds"),
        json!({"latest": {"ami-id": "ami-1", "user-data": "u"}})
    );

    // What was accepted is what GET /vm/config returns; refused requests
    // left no trace.
    put(
        &sock,
        "/machine-config",
        json!({"vcpu_count": 2, "mem_size_mib": 300}),
    );
    patch(&sock, "/machine-config", json!({"mem_size_mib": 320}));
    let cfg = get(&sock, "/vm/config");
    assert_eq!(cfg["machine-config"]["vcpu_count"], 2);
    assert_eq!(cfg["machine-config"]["mem_size_mib"], 320);
    assert_eq!(cfg["drives"], json!([]));
    assert_eq!(cfg["network-interfaces"], json!([]));
    assert_eq!(cfg["vsock"], Value::Null);
    assert_eq!(cfg["entropy"], Value::Null);
    assert_eq!(cfg["balloon"], Value::Null);
    assert_eq!(cfg["mmds-config"], Value::Null);
    assert!(cfg.get("boot-source").is_none(), "{cfg}");
    // A balloon put before boot: Firecracker's body with its defaults.
    put(
        &sock,
        "/balloon",
        json!({"amount_mib": 16, "deflate_on_oom": true, "stats_polling_interval_s": 2}),
    );
    let balloon = get(&sock, "/balloon");
    assert_eq!(balloon["free_page_hinting"], false);
    assert_eq!(get(&sock, "/vm/config")["balloon"], balloon);

    vm.terminate(Duration::from_secs(10));
    assert!(!sock.exists(), "the socket was left behind");
}

/// Host TCP_STREAM into the guest through the limiter; Mbit/s.
fn stream_into_guest(ns: &NetNs) -> f64 {
    let out = ns
        .command(mvperf_bin())
        .args([
            "-t",
            "TCP_STREAM",
            "-H",
            GUEST_IP,
            "-l",
            "5",
            "--grace",
            "60",
            "--json",
        ])
        .output()
        .expect("mvperf");
    assert!(
        out.status.success(),
        "TCP_STREAM: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("mvperf JSON");
    eprintln!("MVPERF {v}");
    v["throughput_mbps"].as_f64().expect("throughput")
}

fn ping_once(ns: &NetNs, deadline_s: u32) -> (bool, Duration) {
    let t = Instant::now();
    let ok = ns
        .command("ping")
        .args(["-c", "1", "-w", &deadline_s.to_string(), GUEST_IP])
        .output()
        .expect("ping")
        .status
        .success();
    (ok, t.elapsed())
}

/// A jail directory owned by [`JAIL_ID`], holding the kernel and initramfs
/// (hard links where the file system allows, copies otherwise) and a marker.
fn jail_dir(img: &minivmm_tests::GuestImage) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minivmm-api-jail-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (from, name) in [
        (&img.vmlinux, "vmlinux"),
        (&img.initramfs, "initramfs.cpio"),
    ] {
        let to = dir.join(name);
        if std::fs::hard_link(from, &to).is_err() {
            std::fs::copy(from, &to).unwrap();
        }
    }
    std::fs::write(dir.join("marker"), "the jail").unwrap();
    // Raw images for the drive the test changes (1, 4 and 1 MiB), the
    // jailed minivmm's to write.
    for (name, mib) in [
        ("scratch.img", 1),
        ("scratch-big.img", 4),
        ("locked.img", 1),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, vec![0u8; mib << 20]).unwrap();
        std::os::unix::fs::chown(&p, Some(JAIL_ID), Some(JAIL_ID)).unwrap();
    }
    std::os::unix::fs::chown(&dir, Some(JAIL_ID), Some(JAIL_ID)).unwrap();
    dir
}

/// The path of a jail's file as the host sees it, opened and locked as
/// another VM would hold its image, until dropped.
fn hold_lock(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    // SAFETY: flock on a descriptor this function owns; no memory involved.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
    f
}

/// How long the guest kernel may take to log a drive's new size after the
/// configuration-change interrupt (a work item on a loaded emulated guest).
const RESIZE_TIMEOUT: Duration = Duration::from_secs(180);

/// Points drive `scratch` at `/scratch-big.img` (naming the image it already
/// has tells the guest its new size) and asserts that the guest kernel then
/// sees `blocks` 512-byte blocks; `what` is what the guest should have seen.
fn point_scratch_at_big_image(vm: &mut Vm, sock: &Path, blocks: u64, what: &str) {
    patch(
        sock,
        "/drives/scratch",
        json!({"drive_id": "scratch", "path_on_host": "/scratch-big.img"}),
    );
    assert!(
        vm.wait_for(
            &format!("[vda] new size: {blocks} 512-byte logical blocks"),
            RESIZE_TIMEOUT
        ),
        "the guest did not see {what}\n{}",
        vm.report()
    );
}

/// One `Key:` line of /proc/PID/status.
fn status_field(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key} in status"))
}

#[test]
fn a_jailed_guest_configured_started_paused_limited_and_stopped_through_the_api() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let _ = mvperf_bin();
    let ns = NetNs::bare("api", "tap0").unwrap();
    // The jailed minivmm opens the TAP as its own uid.
    ns.add_tap("tap0", &format!("{HOST_IP}/24"), Some(JAIL_ID))
        .unwrap();
    let jail = jail_dir(&img);
    let cgroup_parent = format!("minivmm-api-test-{}", std::process::id());
    // Paths as the jailed process sees them, and as the host does.
    let sock = jail.join("api.sock");
    let metrics = jail.join("metrics.json");
    let id = JAIL_ID.to_string();
    let mut vm = Vm::spawn(
        &[
            "--api-sock".into(),
            "/api.sock".into(),
            "--jail".into(),
            jail.display().to_string(),
            "--uid".into(),
            id.clone(),
            "--gid".into(),
            id,
            "--id".into(),
            "jailed-api".into(),
            "--parent-cgroup".into(),
            cgroup_parent.clone(),
        ],
        Some(&ns.name),
    )
    .unwrap();
    wait_for_socket(&sock);

    // The jail: the dropped ids, no capability, no_new_privs, the root. The
    // process the test started supervises the jailed minivmm from outside
    // its PID namespace.
    let pid = vm
        .jailed_pid()
        .unwrap_or_else(|| panic!("no jailed minivmm\n{}", vm.report()));
    let ids = format!("{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}");
    assert_eq!(status_field(pid, "Uid:"), ids);
    assert_eq!(status_field(pid, "Gid:"), ids);
    assert_eq!(status_field(pid, "Groups:"), "");
    assert_eq!(status_field(pid, "CapEff:"), "0000000000000000");
    assert_eq!(status_field(pid, "CapPrm:"), "0000000000000000");
    assert_eq!(status_field(pid, "NoNewPrivs:"), "1");
    let root = PathBuf::from(format!("/proc/{pid}/root"));
    assert_eq!(
        std::fs::read_to_string(root.join("marker")).unwrap(),
        "the jail"
    );
    assert!(
        !root.join("etc/passwd").exists(),
        "the host's /etc is reachable"
    );

    // The README's flow.
    put(
        &sock,
        "/machine-config",
        json!({"vcpu_count": 1, "mem_size_mib": 256}),
    );
    put(
        &sock,
        "/boot-source",
        json!({
            "kernel_image_path": "/vmlinux",
            "initrd_path": "/initramfs.cpio",
            "boot_args": format!(
                "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
                 ip={GUEST_IP}::{HOST_IP}:255.255.255.0:guest:eth0:off"
            ),
        }),
    );
    put(
        &sock,
        "/network-interfaces/eth0",
        json!({"iface_id": "eth0", "host_dev_name": "tap0"}),
    );
    put(
        &sock,
        "/drives/scratch",
        json!({"drive_id": "scratch", "path_on_host": "/scratch.img",
               "is_root_device": false, "is_read_only": false}),
    );
    put(
        &sock,
        "/metrics",
        json!({"metrics_path": "/metrics.json", "interval_s": 0}),
    );
    // The entropy device, as Firecracker's clients add it: the guest
    // kernel's hw_random core reads from it on its own.
    let entropy =
        json!({"rate_limiter": {"ops": {"size": 100, "one_time_burst": 0, "refill_time": 100}}});
    put(&sock, "/entropy", entropy.clone());
    put(
        &sock,
        "/logger",
        json!({"level": "Info", "show_level": true}),
    );
    put(&sock, "/actions", json!({"action_type": "InstanceStart"}));
    assert_eq!(get(&sock, "/")["state"], "Running");
    refused(
        &sock,
        "PUT",
        "/boot-source",
        Some(r#"{"kernel_image_path":"/x"}"#),
        "after it started",
    );
    assert!(
        vm.wait_for("MINIVMM-SERVING", BOOT_TIMEOUT),
        "the guest never served\n{}",
        vm.report()
    );
    vm.assert_userspace_ran();
    // The log PUT /logger asked for, each line with the instance id.
    assert!(
        vm.stderr().contains("INFO  [jailed-api] vmm::"),
        "no log line with the id\n{}",
        vm.report()
    );
    // The API thread under its own filter (the default --seccomp on).
    let threads = minivmm_tests::threads_of(pid);
    assert!(
        threads.iter().any(|(n, s)| n == "fc_api" && s == "2"),
        "no filtered fc_api thread: {threads:?}"
    );
    let (up, _) = ping_once(&ns, 30);
    assert!(up, "no ping before the pause\n{}", vm.report());

    // Pause: the guest is silent; a ping sent now is answered after resume.
    patch(&sock, "/vm", json!({"state": "Paused"}));
    assert_eq!(get(&sock, "/")["state"], "Paused");
    let (answered, _) = ping_once(&ns, 3);
    assert!(!answered, "a paused guest answered ping");
    let late = ns.in_thread(|| {
        let t = Instant::now();
        let out = Command::new("ping")
            .args(["-c", "1", "-w", "60", GUEST_IP])
            .output()
            .expect("ping");
        (out.status.success(), t.elapsed())
    });
    std::thread::sleep(Duration::from_secs(3));
    patch(&sock, "/vm", json!({"state": "Resumed"}));
    assert_eq!(get(&sock, "/")["state"], "Running");
    let (late_ok, waited) = late.join().unwrap().unwrap();
    assert!(
        late_ok,
        "the ping sent while paused was lost\n{}",
        vm.report()
    );
    assert!(
        waited >= Duration::from_secs(3),
        "answered while paused: {waited:?}"
    );

    // A limiter on the guest's RX (host to guest), set live: 25,000 bytes
    // per 100 ms is 2 Mbit/s.
    let before = stream_into_guest(&ns);
    patch(
        &sock,
        "/network-interfaces/eth0",
        json!({"iface_id": "eth0",
               "rx_rate_limiter": {"bandwidth": {"size": 2500, "refill_time": 100}}}),
    );
    let limited = stream_into_guest(&ns);
    put(&sock, "/actions", json!({"action_type": "FlushMetrics"}));
    let m = last_metrics(&metrics);
    let throttled = m["eth0"]["rx_rate_limiter_throttled"]
        .as_u64()
        .expect("metric");
    assert!(throttled > 0, "{m}");
    // 2,500 bytes per 100 ms: 0.2 Mbit/s, plus the first full bucket.
    assert!(
        limited < 0.3,
        "limited stream got {limited} Mbit/s (before: {before})"
    );
    let cfg = get(&sock, "/vm/config");
    let nic = &cfg["network-interfaces"][0];
    assert_eq!(nic["rx_rate_limiter"]["bandwidth"]["size"], 2500, "{cfg}");
    assert_eq!(
        cfg["entropy"]["rate_limiter"]["ops"],
        entropy["rate_limiter"]["ops"]
    );
    let served = m["entropy"]["entropy_bytes"]
        .as_u64()
        .expect("entropy metrics");
    assert!(
        served > 0,
        "the guest took nothing from the entropy device: {m}"
    );
    refused(&sock, "PUT", "/entropy", Some("{}"), "after it started");
    refused(
        &sock,
        "PATCH",
        "/network-interfaces/eth0",
        Some(r#"{"iface_id":"eth0","rx_rate_limiter":{"bandwidth":{"size":5}}}"#),
        "refill_time",
    );
    refused(
        &sock,
        "PATCH",
        "/network-interfaces/eth9",
        Some(r#"{"iface_id":"eth9"}"#),
        "eth9",
    );

    // The drive's image replaced while the guest runs: its kernel reads the
    // new capacity on the configuration-change interrupt and says so. The
    // paths are the jail's; the API thread opens them under its filter.
    assert!(
        vm.console().contains("[vda] 2048 512-byte logical blocks"),
        "the guest did not see the 1 MiB drive\n{}",
        vm.report()
    );
    let drive = |path: &str| json!({"drive_id": "scratch", "path_on_host": path}).to_string();
    let _held = hold_lock(&jail.join("locked.img"));
    for (body, why) in [
        (drive("/missing.img"), "No such file"),
        (drive("/"), "not a regular file"),
        (drive("/locked.img"), "in use by another process (locked)"),
        (r#"{"drive_id":"scratch"}"#.to_string(), "nothing to change"),
        (
            r#"{"drive_id":"scratch","is_read_only":true}"#.to_string(),
            "is_read_only",
        ),
    ] {
        refused(&sock, "PATCH", "/drives/scratch", Some(&body), why);
    }
    refused(
        &sock,
        "PATCH",
        "/drives/nope",
        Some(r#"{"drive_id":"nope","path_on_host":"/scratch-big.img"}"#),
        "no drive 'nope'",
    );
    let cfg = get(&sock, "/vm/config");
    assert_eq!(cfg["drives"][0]["path_on_host"], "/scratch.img", "{cfg}");
    point_scratch_at_big_image(&mut vm, &sock, 8192, "the 4 MiB image");
    // The host grows the image in use; naming it again tells the guest.
    std::fs::OpenOptions::new()
        .write(true)
        .open(jail.join("scratch-big.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    point_scratch_at_big_image(&mut vm, &sock, 16384, "the image grow");
    patch(
        &sock,
        "/drives/scratch",
        json!({"drive_id": "scratch",
               "rate_limiter": {"ops": {"size": 100, "refill_time": 100}}}),
    );
    let cfg = get(&sock, "/vm/config");
    let d = &cfg["drives"][0];
    assert_eq!(d["path_on_host"], "/scratch-big.img", "{cfg}");
    assert_eq!(d["rate_limiter"]["ops"]["size"], 100, "{cfg}");
    // The old image is free again: another VM could take it.
    drop(hold_lock(&jail.join("scratch.img")));

    // Ctrl-Alt-Del: the guest's init reboots, minivmm exits 0.
    put(&sock, "/actions", json!({"action_type": "SendCtrlAltDel"}));
    let status = vm
        .wait_exit(Duration::from_secs(300))
        .unwrap_or_else(|| panic!("no exit after SendCtrlAltDel\n{}", vm.report()));
    assert_eq!(status.code(), Some(0), "{}", vm.report());
    vm.assert_no_crash();
    let _ = std::fs::remove_dir_all(&jail);
    minivmm_tests::remove_cgroups(&cgroup_parent, "jailed-api");
}
