// SPDX-License-Identifier: Apache-2.0
//! The balloon in a booted guest, driven through Firecracker's API under
//! `--seccomp on` (KVM needed; no network).
//!
//! The guest (`minivmm.balloon=watch:MIB`, resources/initramfs/init) first
//! fills all its free memory but 4 MiB with a file on a tmpfs of its own and
//! unmounts it, so its free memory is resident on the host, then prints its
//! MemTotal whenever it changes. The test:
//!
//! - waits for the driver's first statistics report (the driver sends one
//!   at probe), then for a second one, a polling interval later;
//! - inflates the balloon from the API (`PATCH /balloon`): the guest's
//!   MemTotal drops by the inflated size (Linux's driver takes each page
//!   it inflates out of MemTotal without `deflate_on_oom`),
//!   `GET /balloon/statistics` shows `actual_mib` at the target, and
//!   minivmm's RSS drops by at least 80 % of the inflated size;
//! - shows the device's statistics arriving at the polling interval (its
//!   counters in the metrics line, the body against Firecracker's
//!   `BalloonStats`);
//! - deflates it (`amount_mib` 0): MemTotal comes back.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use minivmm_tests::fc_schema::validate;
use minivmm_tests::{guest_image_if, last_metrics, metric, minivmm_bin, Need, Vm};
use serde_json::{json, Value};

/// Guest memory.
const MEM_MIB: u64 = 128;
/// The most the guest touches first (all its free memory but 4 MiB, written
/// to a tmpfs and removed): about its whole free memory at this size, where
/// every MiB costs the emulated guest kernel about 2 s.
const FILL_MIB: u64 = 64;
/// What the balloon takes.
const INFLATE_MIB: u64 = 32;
/// Seconds between statistics requests.
const STATS_INTERVAL_S: u64 = 1;
/// A stall window for the emulated guest kernel (see HOST-KVM.md): its
/// boot, its 64 MiB write, and its driver's 8,192 page allocations each
/// run at a few million instructions a second.
const GUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// One request with curl, as the README writes it; the status and the body.
fn curl(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    minivmm_tests::api_curl(sock, method, path, body)
}

fn get(sock: &Path, path: &str) -> Value {
    let (code, text) = curl(sock, "GET", path, None);
    assert_eq!(code, 200, "GET {path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"))
}

fn ok(sock: &Path, method: &str, path: &str, body: Value) {
    let (code, text) = curl(sock, method, path, Some(&body.to_string()));
    assert_eq!((code, text.as_str()), (204, ""), "{method} {path} {body}");
}

/// minivmm's resident memory in bytes (VmRSS).
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb = minivmm_tests::status_field(&status, "VmRSS:");
    let kb: u64 = kb
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("VmRSS {kb:?}"));
    kb << 10
}

/// The MemTotal (kB) of the guest's last `MINIVMM-BALLOON` line.
fn last_memtotal(console: &str) -> Option<u64> {
    console
        .lines()
        .rev()
        .find_map(|l| l.split("MINIVMM-BALLOON").nth(1))
        .and_then(|rest| rest.split("memtotal_kb=").nth(1))
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
}

/// The MiB the guest filled its free memory with (`filled_mib=`).
fn filled_mib(console: &str) -> Option<u64> {
    console
        .split("filled_mib=")
        .nth(1)
        .and_then(|n| n.split_whitespace().next()?.parse().ok())
}

/// Polls `GET /balloon/statistics` until `done` holds of it, within `limit`.
fn stats_until(sock: &Path, limit: Duration, done: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let s = get(sock, "/balloon/statistics");
        if done(&s) {
            return s;
        }
        assert!(start.elapsed() < limit, "statistics never got there: {s}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_guests_lines_parse() {
    let console = "minivmm-init: [1.0] x\nMINIVMM-BALLOON ready memtotal_kb=87036 filled_mib=41\n\
                   MINIVMM-BALLOON memtotal_kb=54268\n";
    assert_eq!(last_memtotal(console), Some(54268));
    let ready = "MINIVMM-BALLOON ready memtotal_kb=87036 filled_mib=41\n";
    assert_eq!(last_memtotal(ready), Some(87036));
    assert_eq!(filled_mib(console), Some(41));
    assert_eq!(filled_mib("MINIVMM-BALLOON ready memtotal_kb=1"), None);
}

#[test]
fn a_balloon_inflated_from_the_api_shows_in_the_guest_and_in_the_hosts_rss() {
    let Some(image) = guest_image_if(&[Need::Kvm]) else {
        return;
    };
    let dir = Scratch(std::env::temp_dir().join(format!("minivmm-balloon-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let sock = dir.0.join("api.sock");
    let metrics = dir.0.join("metrics.json");
    let config = json!({
        "boot-source": {
            "kernel_image_path": image.vmlinux,
            "initrd_path": image.initramfs,
            "cmdline_extra": format!("minivmm.balloon=watch:{FILL_MIB}"),
        },
        "machine-config": {"vcpu_count": 1, "mem_size_mib": MEM_MIB},
        "balloon": {
            "amount_mib": 0,
            "deflate_on_oom": false,
            "stats_polling_interval_s": STATS_INTERVAL_S,
        },
        "metrics": {"metrics_path": metrics},
    });
    let file = dir.0.join("config.json");
    std::fs::write(&file, config.to_string()).unwrap();
    let bin = minivmm_bin();
    let mut cmd = Command::new(&bin);
    cmd.arg("--config-file")
        .arg(&file)
        .arg("--api-sock")
        .arg(&sock)
        .args(["--seccomp", "on"]);
    let mut vm = Vm::spawn_command(cmd).expect("minivmm starts");
    let pid = vm.pid();

    assert!(
        vm.wait_for("MINIVMM-BALLOON ready", GUEST_TIMEOUT),
        "{}",
        vm.report()
    );
    let before_kb = last_memtotal(&vm.console()).expect("a MemTotal");
    // The RSS check below needs the pages the balloon takes to be resident:
    // nearly all free memory must have been touched, well over the target.
    let filled = filled_mib(&vm.console()).expect("filled_mib");
    assert!(
        filled >= 2 * INFLATE_MIB,
        "the guest filled only {filled} MiB"
    );
    // The driver's first report (sent at probe), then the next ones, a
    // polling interval apart.
    let first = stats_until(&sock, GUEST_TIMEOUT, |s| s["total_memory"].is_u64());
    validate("BalloonStats", &first).unwrap_or_else(|e| panic!("{e}: {first}"));
    assert_eq!(first["target_mib"], 0);
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "FlushMetrics"}),
    );
    let a = last_metrics(&metrics);
    std::thread::sleep(Duration::from_secs(6));
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "FlushMetrics"}),
    );
    let b = last_metrics(&metrics);
    let requests =
        metric(&b, "balloon", "stats_requests") - metric(&a, "balloon", "stats_requests");
    let updates =
        metric(&b, "balloon", "stats_updates_count") - metric(&a, "balloon", "stats_updates_count");
    // One request a second, each answered with a report (the emulated
    // guest may answer one late).
    assert!((4..=8).contains(&requests), "{requests} requests in 6 s");
    assert!(
        updates + 1 >= requests,
        "{updates} reports for {requests} requests"
    );

    let rss_before = rss(pid);
    ok(
        &sock,
        "PATCH",
        "/balloon",
        json!({"amount_mib": INFLATE_MIB}),
    );
    let want_kb = before_kb - INFLATE_MIB * 1024;
    let shown = format!("MINIVMM-BALLOON memtotal_kb={want_kb}");
    assert!(vm.wait_for(&shown, GUEST_TIMEOUT), "{}", vm.report());
    let s = stats_until(&sock, GUEST_TIMEOUT, |s| s["actual_mib"] == INFLATE_MIB);
    assert_eq!(s["target_mib"], INFLATE_MIB);
    assert_eq!(s["target_pages"], INFLATE_MIB * 256);
    let rss_after = rss(pid);
    let dropped = rss_before.saturating_sub(rss_after);
    eprintln!(
        "balloon: RSS {} MiB -> {} MiB ({} KiB given back for {INFLATE_MIB} MiB inflated)",
        rss_before >> 20,
        rss_after >> 20,
        dropped >> 10
    );
    assert!(
        dropped >= INFLATE_MIB * (1 << 20) * 8 / 10,
        "RSS dropped {dropped} bytes for {INFLATE_MIB} MiB inflated"
    );
    assert_eq!(get(&sock, "/balloon")["amount_mib"], INFLATE_MIB);
    assert_eq!(
        get(&sock, "/vm/config")["balloon"]["amount_mib"],
        INFLATE_MIB
    );
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "FlushMetrics"}),
    );
    let m = last_metrics(&metrics);
    assert_eq!(metric(&m, "balloon", "pfns_refused"), 0);
    assert!(
        metric(&m, "balloon", "pages_inflated") >= INFLATE_MIB * 256,
        "{m}"
    );
    assert_eq!(metric(&m, "balloon", "discard_fails"), 0);

    // Deflated: the guest has its memory back.
    ok(&sock, "PATCH", "/balloon", json!({"amount_mib": 0}));
    let back = format!("MINIVMM-BALLOON memtotal_kb={before_kb}");
    assert!(vm.wait_for(&back, GUEST_TIMEOUT), "{}", vm.report());
    stats_until(&sock, GUEST_TIMEOUT, |s| s["actual_mib"] == 0);
    vm.assert_no_crash();
    vm.terminate(Duration::from_secs(30));
}
