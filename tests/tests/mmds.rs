// SPDX-License-Identifier: Apache-2.0
//! MMDS boot tests: a guest reads the metadata store over its own network
//! card, as a guest on Firecracker does with curl, with the image's own
//! client `mvperf http` (`minivmm.mmds=`, see resources/initramfs/init).
//!
//! Two boots (30 to 120 s each on a quiet PVM-backed host), run one at a
//! time as every boot test:
//! - through the API as Firecracker's clients do it: `PUT /mmds/config`
//!   (V2 on eth0), `PUT /mmds`, `InstanceStart`; the guest prints the store
//!   it read with a session token, exactly as put; then `PATCH /mmds`, and
//!   the guest's next fetch (every few seconds, `minivmm.mmds_repeat=`)
//!   prints the merged store; the card's counters show the tokens and
//!   requests; everything under `--seccomp on`;
//! - without an API, as flintlock starts Firecracker: `--config-file` with
//!   an `mmds-config` section (V1) and `--metadata FILE`: the guest prints
//!   the file's store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use minivmm_tests::{
    cli_args, guest_image_if, last_metrics, metric, metrics_lines, Need, NetNs, Vm, READY,
};
use serde_json::{json, Value};

const HOST_IP: &str = "10.0.36.1";
const GUEST_IP: &str = "10.0.36.2";
/// As the other boot tests: a boot is 30 to 120 s on a quiet PVM host, far
/// more under load.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// From the first fetch to one that shows a change: the repeat interval,
/// two `mvperf http` runs and the token under an emulated guest kernel.
const REFETCH_TIMEOUT: Duration = Duration::from_secs(300);
/// The guest fetches the store again this often (seconds).
const REPEAT_S: u32 = 5;
/// The line init prints for each fetch.
const MMDS_LINE: &str = "MINIVMM-MMDS ";

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minivmm-mmds-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn boot_args(version: &str) -> String {
    format!(
        "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve minivmm.mmds={version} \
         minivmm.mmds_repeat={REPEAT_S} ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off"
    )
}

/// One request with curl on the API socket; the status and the body.
fn api(sock: &Path, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let body = body.map(Value::to_string);
    let (code, text, _) = minivmm_tests::api_curl_within(sock, 30, method, path, body.as_deref());
    (code, text)
}

fn ok(sock: &Path, method: &str, path: &str, body: Value) {
    let (code, text) = api(sock, method, path, Some(&body));
    assert_eq!((code, text.as_str()), (204, ""), "{method} {path} {body}");
}

/// The card's MMDS counters (and its frame counters) in metrics line `m`,
/// for a failure message: whether the guest's frames reached MMDS and its
/// answers the guest.
fn mmds_counters(m: &Value) -> String {
    m["eth0"]
        .as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| k.starts_with("mmds_") || k.ends_with("_frames"))
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("no eth0 in {m}"))
}

/// Waits for a fetch that printed exactly `store` (compact, keys sorted:
/// what serde_json writes and what MMDS answers); on failure says what the
/// fetches printed and, from `counters`, what the card's MMDS saw.
fn wait_for_store(vm: &mut Vm, store: &Value, timeout: Duration, counters: &dyn Fn() -> String) {
    let line = format!("{MMDS_LINE}{}", serde_json::to_string(store).unwrap());
    let seen = vm.wait_for(&line, timeout);
    let fetched: Vec<String> = vm
        .console()
        .lines()
        .filter(|l| l.starts_with("MINIVMM-MMDS"))
        .map(str::to_string)
        .collect();
    if !seen {
        panic!(
            "no fetch printed {store}; fetches: {fetched:?}\ncard: {}\n{}",
            counters(),
            vm.report()
        );
    }
}

/// The guest's uptime as init stamped it on the last console line that
/// contains `text` (`minivmm-init: [UPTIME] ...`), if any.
fn guest_stamp(vm: &Vm, text: &str) -> Option<f64> {
    let console = vm.console();
    let line = console.lines().rfind(|l| l.contains(text))?;
    let stamp = line.strip_prefix("minivmm-init: [")?.split(']').next()?;
    stamp.parse().ok()
}

fn wait_for_socket(sock: &Path) {
    for _ in 0..500 {
        if sock.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("no API socket at {}", sock.display());
}

#[test]
fn a_guest_reads_the_store_put_through_the_api_and_a_patch_on_its_next_fetch() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let ns = NetNs::new("mmds", "tap0", &format!("{HOST_IP}/24")).unwrap();
    let dir = scratch("api");
    let sock = dir.join("api.sock");
    let metrics = dir.join("metrics.json");
    let args = cli_args(&["--api-sock", sock.to_str().unwrap(), "--seccomp", "on"]);
    let mut vm = Vm::spawn(&args, Some(&ns.name)).unwrap();
    wait_for_socket(&sock);

    let path = |p: &Path| p.to_str().expect("UTF-8 path").to_string();
    ok(
        &sock,
        "PUT",
        "/boot-source",
        json!({"kernel_image_path": path(&img.vmlinux), "initrd_path": path(&img.initramfs),
               "boot_args": boot_args("V2")}),
    );
    ok(
        &sock,
        "PUT",
        "/network-interfaces/eth0",
        json!({"iface_id": "eth0", "host_dev_name": ns.tap, "guest_mac": "06:00:ac:10:00:02"}),
    );
    ok(
        &sock,
        "PUT",
        "/mmds/config",
        json!({"version": "V2", "ipv4_address": "169.254.169.254", "network_interfaces": ["eth0"]}),
    );
    let store = json!({"latest": {"meta-data": {"ami-id": "ami-12345678",
                                                "reservation-id": "r-fea54097"}},
                       "user-data": "#cloud-config"});
    ok(&sock, "PUT", "/mmds", store.clone());
    ok(
        &sock,
        "PUT",
        "/metrics",
        json!({"metrics_path": path(&metrics)}),
    );
    let (code, cfg) = api(&sock, "GET", "/vm/config", None);
    assert_eq!(code, 200);
    let cfg: Value = serde_json::from_str(&cfg).unwrap();
    assert_eq!(
        cfg["mmds-config"],
        json!({"version": "V2", "ipv4_address": "169.254.169.254", "network_interfaces": ["eth0"]})
    );
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "InstanceStart"}),
    );

    assert!(
        vm.wait_for(READY, BOOT_TIMEOUT),
        "no {READY}\n{}",
        vm.report()
    );
    let ready = vm.uptime();
    // On a failure the counters are flushed through the API and read back.
    let counters = || {
        let (code, _) = api(
            &sock,
            "PUT",
            "/actions",
            Some(&json!({"action_type": "FlushMetrics"})),
        );
        if code != 204 {
            return format!("FlushMetrics answered {code}");
        }
        mmds_counters(&last_metrics(&metrics))
    };
    wait_for_store(&mut vm, &store, BOOT_TIMEOUT, &counters);
    eprintln!(
        "FIGURE mmds api: {READY} {ready:.1} s after start, the first fetch (V2: a token and a GET) \
         {:.1} s; guest uptime {:?} s when it began reading",
        vm.uptime(),
        guest_stamp(&vm, "reading MMDS")
    );

    // A change the guest's next fetch sees (RFC 7396: null removes a key).
    ok(
        &sock,
        "PATCH",
        "/mmds",
        json!({"latest": {"meta-data": {"ami-id": "ami-87654321", "reservation-id": null}}}),
    );
    let merged = json!({"latest": {"meta-data": {"ami-id": "ami-87654321"}},
                        "user-data": "#cloud-config"});
    let (code, got) = api(&sock, "GET", "/mmds", None);
    assert_eq!(
        (code, serde_json::from_str::<Value>(&got).unwrap()),
        (200, merged.clone())
    );
    wait_for_store(&mut vm, &merged, REFETCH_TIMEOUT, &counters);
    eprintln!(
        "FIGURE mmds api: the merged store fetched {:.1} s after start",
        vm.uptime()
    );
    // After boot the configuration stays as it is.
    let (code, _) = api(
        &sock,
        "PUT",
        "/mmds/config",
        Some(&json!({"network_interfaces": ["eth0"]})),
    );
    assert_eq!(code, 400);

    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "FlushMetrics"}),
    );
    let m = last_metrics(&metrics);
    eprintln!("FIGURE mmds api: card counters {}", mmds_counters(&m));
    // Each fetch is a token and a GET, under the card's id.
    assert!(metric(&m, "eth0", "mmds_tokens_issued") >= 2, "{m}");
    assert!(metric(&m, "eth0", "mmds_requests_accepted") >= 4, "{m}");
    assert_eq!(metric(&m, "eth0", "mmds_rx_no_token"), 0, "{m}");
    assert!(metric(&m, "eth0", "mmds_tx_frames") > 0, "{m}");
    vm.terminate(Duration::from_secs(30));
    vm.assert_no_crash();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn metadata_file_and_the_config_files_mmds_config_serve_without_an_api() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let ns = NetNs::new("mmdsfile", "tap0", &format!("{HOST_IP}/24")).unwrap();
    let dir = scratch("file");
    let path = |p: &Path| p.to_str().expect("UTF-8 path").to_string();
    let store = json!({"instance-id": "i-0123", "latest": {"user-data": "hello"}});
    let metadata = dir.join("metadata.json");
    std::fs::write(&metadata, serde_json::to_string_pretty(&store).unwrap()).unwrap();
    let config = dir.join("vm.json");
    let metrics_file = dir.join("metrics.json");
    let file = json!({
        "boot-source": {"kernel_image_path": path(&img.vmlinux),
                        "initrd_path": path(&img.initramfs), "boot_args": boot_args("V1")},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 256},
        "network-interfaces": [{"iface_id": "eth0", "host_dev_name": ns.tap,
                                "guest_mac": "06:00:ac:10:00:02"}],
        "mmds-config": {"network_interfaces": ["eth0"]},
        "metrics": {"metrics_path": path(&metrics_file)}
    });
    std::fs::write(&config, file.to_string()).unwrap();
    let args = cli_args(&[
        "--no-api",
        "--config-file",
        config.to_str().unwrap(),
        "--metadata",
        metadata.to_str().unwrap(),
        "--seccomp",
        "on",
    ]);
    let mut vm = Vm::spawn(&args, Some(&ns.name)).unwrap();
    assert!(
        vm.wait_for(READY, BOOT_TIMEOUT),
        "no {READY}\n{}",
        vm.report()
    );
    let ready = vm.uptime();
    // Without an API the counters are the last line minivmm wrote (every
    // 60 s).
    let counters = || match metrics_lines(&metrics_file).last() {
        Some(m) => mmds_counters(m),
        None => "no metrics line yet".to_string(),
    };
    wait_for_store(&mut vm, &store, BOOT_TIMEOUT, &counters);
    eprintln!(
        "FIGURE mmds file: {READY} {ready:.1} s after start, the fetch (V1, one GET) {:.1} s; \
         guest uptime {:?} s when it began reading",
        vm.uptime(),
        guest_stamp(&vm, "reading MMDS")
    );
    vm.terminate(Duration::from_secs(30));
    vm.assert_no_crash();
    let m = last_metrics(&metrics_file);
    eprintln!("FIGURE mmds file: card counters {}", mmds_counters(&m));
    // One GET per fetch, answered without a token under V1 and counted.
    assert!(metric(&m, "eth0", "mmds_requests_accepted") >= 1, "{m}");
    assert!(metric(&m, "eth0", "mmds_rx_no_token") >= 1, "{m}");
    assert_eq!(metric(&m, "eth0", "mmds_tokens_issued"), 0, "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}
