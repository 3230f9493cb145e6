// SPDX-License-Identifier: Apache-2.0
//! Boot tests: the real guest kernel from `resources/build.sh` under minivmm.
//!
//! A boot costs 55 to 90 s on a PVM-backed host, so each scenario boots once
//! and checks everything it can on that boot. Bad-input cases need no boot
//! and run in well under a second each.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use minivmm_tests::{guest_image, guest_userspace_runs, minivmm_bin, require, Need, Vm};

/// Generous: a boot is 55-90 s here, and CI runs up to three at once on 2 cores.
const BOOT_TIMEOUT: Duration = Duration::from_secs(420);

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

/// Boots with the ordinary /init and checks the kernel came up and the VMM
/// ended by itself with the status that matches what the guest did.
fn boot_and_check(vcpus: &str, extra_console: &[&str]) {
    let img = guest_image();
    let args = s(&[
        "--kernel",
        img.vmlinux.to_str().unwrap(),
        "--initramfs",
        img.initramfs.to_str().unwrap(),
        "--vcpus",
        vcpus,
        "--mem",
        "256",
        "--log-level",
        "info",
    ]);
    let mut vm = Vm::spawn(&args, None).unwrap();
    let status = vm.wait_exit(BOOT_TIMEOUT);
    let report = vm.report();
    let console = vm.console();
    let status =
        status.unwrap_or_else(|| panic!("minivmm did not exit within {BOOT_TIMEOUT:?}\n{report}"));
    eprintln!(
        "boot with {vcpus} vCPU(s) ended after {:.1} s: {status}",
        vm.uptime()
    );
    assert!(console.contains("Linux version"), "{report}");
    assert!(console.contains("Run /init as init process"), "{report}");
    for want in extra_console {
        assert!(console.contains(want), "missing '{want}'\n{report}");
    }
    let log = vm.stderr();
    assert!(
        log.contains("from start to first vCPU entry"),
        "no boot-time report\n{report}"
    );
    assert!(log.contains("run time:"), "no run-time report\n{report}");
    if console.contains("MINIVMM-READY") {
        // Real KVM: init ran, printed its marker and rebooted.
        assert_eq!(status.code(), Some(0), "{report}");
    } else {
        // PVM host: init cannot run, the kernel panics and resets through
        // the i8042; minivmm says so with status 3.
        assert!(
            !guest_userspace_runs(),
            "init did not run on a host that should run it\n{report}"
        );
        assert!(console.contains("Kernel panic"), "{report}");
        assert_eq!(status.code(), Some(3), "{report}");
        assert!(log.contains("after a kernel panic"), "{report}");
    }
}

#[test]
fn vmlinux_boots_and_exits_cleanly() {
    if !require("vmlinux_boots_and_exits_cleanly", &[Need::Kvm]) {
        return;
    }
    boot_and_check("1", &[]);
}

#[test]
fn two_vcpus_come_up() {
    if !require("two_vcpus_come_up", &[Need::Kvm]) {
        return;
    }
    boot_and_check("2", &["Brought up 1 node, 2 CPUs"]);
}

/// The decompressor runs emulated here (LZ4 keeps it to about half a
/// minute), so this one boot checks loading and entry: the decompressed
/// kernel's first line appears on the console; then SIGTERM ends minivmm
/// with status 0.
#[test]
fn bzimage_loads_and_enters() {
    if !require("bzimage_loads_and_enters", &[Need::Kvm]) {
        return;
    }
    let img = guest_image();
    let args = s(&[
        "--kernel",
        img.bzimage.to_str().unwrap(),
        "--initramfs",
        img.initramfs.to_str().unwrap(),
        "--cmdline",
        "earlyprintk=serial,ttyS0,115200",
        "--log-level",
        "info",
    ]);
    let mut vm = Vm::spawn(&args, None).unwrap();
    let booted = vm.wait_for("Linux version", BOOT_TIMEOUT);
    assert!(booted, "the bzImage kernel never printed\n{}", vm.report());
    assert!(
        vm.stderr().contains("bzImage kernel at 0x100200"),
        "{}",
        vm.report()
    );
    eprintln!("bzImage: kernel banner after {:.1} s", vm.uptime());
    vm.signal("TERM");
    let status = vm
        .wait_exit(Duration::from_secs(10))
        .expect("minivmm ignored SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", vm.report());
}

/// Runs minivmm to completion and returns (exit code, stderr).
fn run_fail(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(minivmm_bin()).args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_one_line_error(args: &[&str], want: &str) {
    let (code, err) = run_fail(args);
    assert_ne!(code, Some(0), "{args:?} succeeded");
    assert!(err.contains(want), "{args:?}: want '{want}' in '{err}'");
    // One clear line (clap's usage errors add a usage hint; ours are one line).
    if err.starts_with("minivmm: error:") {
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: more than one line: {err}"
        );
    }
}

#[test]
fn bad_input_gets_one_clear_line() {
    if !require("bad_input_gets_one_clear_line", &[Need::Kvm]) {
        return;
    }
    let img = guest_image();
    let tmp = std::env::temp_dir().join(format!("minivmm-bad-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let garbage = tmp.join("garbage");
    std::fs::write(&garbage, vec![0x5a; 4096]).unwrap();
    let truncated = tmp.join("truncated");
    let vmlinux = std::fs::read(&img.vmlinux).unwrap();
    std::fs::write(&truncated, &vmlinux[..vmlinux.len() / 3]).unwrap();
    let truncated_bz = tmp.join("truncated-bz");
    let bz = std::fs::read(&img.bzimage).unwrap();
    std::fs::write(&truncated_bz, &bz[..bz.len() / 2]).unwrap();
    let big = tmp.join("big.cpio");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(200 << 20).unwrap();
    let k = img.vmlinux.to_str().unwrap();
    let p = |p: &Path| p.to_str().unwrap().to_string();

    assert_one_line_error(&["--kernel", "/nonexistent/vmlinux"], "cannot open kernel");
    assert_one_line_error(
        &["--kernel", &p(&garbage)],
        "neither an ELF vmlinux nor a bzImage",
    );
    assert_one_line_error(&["--kernel", &p(&truncated)], "cannot load kernel");
    assert_one_line_error(&["--kernel", &p(&truncated_bz)], "is truncated");
    assert_one_line_error(
        &["--kernel", k, "--initramfs", "/nonexistent/initrd"],
        "cannot open initramfs",
    );
    assert_one_line_error(
        &["--kernel", k, "--initramfs", &p(&big), "--mem", "128"],
        "does not fit",
    );
    assert_one_line_error(&["--kernel", k, "--mem", "16"], "too small");
    assert_one_line_error(&["--kernel", k, "--vcpus", "0"], "at least 1");
    assert_one_line_error(&["--kernel", k, "--vcpus", "4096"], "too many");
    // An interface name longer than IFNAMSIZ cannot be a TAP.
    assert_one_line_error(
        &["--kernel", k, "--tap", "this-name-is-far-too-long"],
        "TAP",
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

/// With /dev hidden in a private mount namespace there is no /dev/kvm.
#[test]
fn missing_dev_kvm_is_one_clear_line() {
    if !require("missing_dev_kvm_is_one_clear_line", &[Need::Root]) {
        return;
    }
    let img = guest_image();
    let script = format!(
        "mount -t tmpfs none /dev && exec {} --kernel {}",
        minivmm_bin().display(),
        img.vmlinux.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "sh", "-c", &script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot open /dev/kvm"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}
