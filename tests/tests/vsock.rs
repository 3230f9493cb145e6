// SPDX-License-Identifier: Apache-2.0
//! vsock as Firecracker's clients use it, on one guest boot (KVM and the guest image; no
//! network card, no root needed beyond KVM):
//!
//! - configured through the API with `PUT /vsock/vsock0` and the deprecated `vsock_id`, the
//!   socket appears at `uds_path` before `InstanceStart` (clients wait for it), and
//!   `GET /vm/config` shows Firecracker's section without `vsock_id`;
//! - the guest (`minivmm.vsock_hello=PORT`) connects to the host's port PORT: a host
//!   listener on `<uds_path>_PORT` receives `MINIVMM-VSOCK-HELLO 3`;
//! - a host client connects to `uds_path`, sends `CONNECT 12865\n` and gets `OK <port>\n`
//!   from the guest's mvperf server, and mvperf's VSOCK_STREAM, VSOCK_MAERTS and VSOCK_RR run
//!   against it through the device, each with traffic;
//! - the metrics show the connections and bytes under `vsock`, nothing malformed; after
//!   `SendCtrlAltDel` minivmm exits 0 and its socket is gone, the host's listener left alone.
//!
//! All of it under the default `--seccomp on`, so the event loop's list is what the device
//! needs on a real guest's traffic.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use minivmm_tests::fc_schema::validate_minivmm;
use minivmm_tests::{guest_image_if, last_metrics, mvperf_bin, Need, Vm};
use serde_json::{json, Value};

/// See tests/netperf.rs: an emulated guest under load needs minutes.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// The host port the guest says hello to.
const HELLO_PORT: u32 = 5000;
/// The guest's mvperf server's vsock port.
const MVPERF_PORT: u32 = 12865;

fn curl(sock: &Path, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
    let body = body.map(Value::to_string);
    let (code, text, _) = minivmm_tests::api_curl_within(sock, 30, method, path, body.as_deref());
    (code, text)
}

fn put(sock: &Path, path: &str, body: Value) {
    let (code, text) = curl(sock, "PUT", path, Some(&body));
    assert_eq!((code, text.as_str()), (204, ""), "PUT {path} {body}");
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The host's listener for the guest's hello: what the first connection sends.
fn hello_listener(path: PathBuf) -> mpsc::Receiver<String> {
    let l = UnixListener::bind(&path).expect("the host's listener");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
            let mut got = String::new();
            let _ = s.read_to_string(&mut got);
            let _ = tx.send(got);
        }
    });
    rx
}

/// One `CONNECT` by hand, as Firecracker's vsock documentation shows it; the `OK` line.
fn connect_by_hand(uds: &Path, port: u32) -> String {
    let mut s = UnixStream::connect(uds).expect("connect to uds_path");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(format!("CONNECT {port}\n").as_bytes()).unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while line.last() != Some(&b'\n') {
        match s.read(&mut b) {
            Ok(1) => line.push(b[0]),
            other => panic!("no OK line: {other:?} after {line:?}"),
        }
    }
    String::from_utf8(line).expect("ASCII")
}

fn mvperf_vsock(uds: &Path, test: &str, extra: &[&str]) -> Value {
    let out = Command::new(mvperf_bin())
        .args(["-t", test, "--uds"])
        .arg(uds)
        .args(["-l", "5", "--grace", "60", "--json"])
        .args(extra)
        .output()
        .expect("running mvperf");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{test} through minivmm's vsock: {}", stdout.trim());
    serde_json::from_str(stdout.trim()).expect("one JSON object")
}

#[test]
fn a_guest_configured_with_put_vsock_talks_both_ways_through_its_socket() {
    let Some(img) = guest_image_if(&[Need::Kvm]) else {
        return;
    };
    let _ = mvperf_bin();
    let dir = std::env::temp_dir().join(format!("minivmm-vsock-boot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (api, uds, metrics) = (
        dir.join("api.sock"),
        dir.join("v.sock"),
        dir.join("metrics.json"),
    );
    let mut vm = Vm::spawn(&["--api-sock".into(), api.display().to_string()], None).unwrap();
    wait_until("the API socket", Duration::from_secs(20), || api.exists());
    put(
        &api,
        "/machine-config",
        json!({"vcpu_count": 1, "mem_size_mib": 256}),
    );
    put(
        &api,
        "/boot-source",
        json!({
            "kernel_image_path": img.vmlinux,
            "initrd_path": img.initramfs,
            "boot_args": format!(
                "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
                 minivmm.vsock_hello={HELLO_PORT}"
            ),
        }),
    );
    // As Firecracker's clients that still send the deprecated id write it.
    put(
        &api,
        "/vsock/vsock0",
        json!({"vsock_id": "vsock0", "guest_cid": 3, "uds_path": uds}),
    );
    assert!(uds.exists(), "the socket did not appear at PUT /vsock");
    put(
        &api,
        "/metrics",
        json!({"metrics_path": metrics, "interval_s": 0}),
    );
    let (code, text) = curl(&api, "GET", "/vm/config", None);
    assert_eq!(code, 200, "{text}");
    let cfg: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(cfg["vsock"], json!({"guest_cid": 3, "uds_path": uds}));
    assert_eq!(validate_minivmm("FullVmConfiguration", &cfg), Ok(()));
    let hello_path = PathBuf::from(format!("{}_{HELLO_PORT}", uds.display()));
    let hello = hello_listener(hello_path.clone());
    put(&api, "/actions", json!({"action_type": "InstanceStart"}));
    assert!(
        vm.wait_for("MINIVMM-SERVING", BOOT_TIMEOUT),
        "the guest never served\n{}",
        vm.report()
    );
    vm.assert_userspace_ran();

    // Guest to host: the hello, from CID 3.
    let got = hello
        .recv_timeout(Duration::from_secs(300))
        .unwrap_or_else(|_| panic!("no hello on the host's listener\n{}", vm.report()));
    assert_eq!(got, "MINIVMM-VSOCK-HELLO 3\n");
    assert!(vm.wait_for("MINIVMM-VSOCK-HELLO sent", Duration::from_secs(60)));

    // Host to guest: CONNECT by hand, then mvperf's tests.
    let ok = connect_by_hand(&uds, MVPERF_PORT);
    let assigned: u64 = ok
        .strip_prefix("OK ")
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("'{ok}' is not OK <port>"));
    assert!(assigned >= 1 << 30, "{ok}");
    for test in ["VSOCK_STREAM", "VSOCK_MAERTS"] {
        let v = mvperf_vsock(&uds, test, &[]);
        assert!(v["bytes"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    }
    let v = mvperf_vsock(&uds, "VSOCK_RR", &[]);
    assert!(v["transactions"].as_f64().unwrap_or(0.0) > 0.0, "{v}");

    put(&api, "/actions", json!({"action_type": "FlushMetrics"}));
    wait_until("a metrics line", Duration::from_secs(10), || {
        metrics.exists()
    });
    let m = last_metrics(&metrics);
    eprintln!("vsock metrics: {}", m["vsock"]);
    let counter = |k: &str| m["vsock"][k].as_u64().unwrap_or_else(|| panic!("{k}: {m}"));
    assert!(counter("conns_opened_host") >= 7, "{m}");
    assert!(counter("conns_opened_guest") >= 1, "{m}");
    assert!(counter("tx_bytes") > 0 && counter("rx_bytes") > 0, "{m}");
    for zero in [
        "malformed_packets",
        "protocol_errors",
        "credit_exceeded",
        "queue_errors",
    ] {
        assert_eq!(counter(zero), 0, "{zero}: {m}");
    }

    put(&api, "/actions", json!({"action_type": "SendCtrlAltDel"}));
    let status = vm.wait_exit(Duration::from_secs(300));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", vm.report());
    assert!(!uds.exists(), "uds_path outlived minivmm");
    assert!(hello_path.exists(), "the host's own listener was removed");
    vm.assert_no_crash();
    let _ = std::fs::remove_dir_all(&dir);
}
