// SPDX-License-Identifier: Apache-2.0
//! Disk boot tests: the guest boots from the ext4 root disk of `resources/build.sh`
//! (virtio-blk, no initramfs) and its writes reach the host's image, or, on a read-only
//! drive, never do.
//!
//! Two boots (30 to 120 s each on a PVM-backed host), side by side:
//! - a Firecracker config file in the layout of Firecracker's own
//!   `tests/framework/vm_config_network.json` (a root drive, read-write, and a network
//!   card): the guest's init writes a file whose bytes come from a seed the test picks,
//!   syncs and remounts the root read-only, serves on its NIC and answers pings; after
//!   SIGTERM the host reads the file out of the image with `debugfs` (no mount) and
//!   `e2fsck -fn` finds the file system clean;
//! - `--disk ...,readonly=on`: the guest's attempt to create a file fails with EROFS, its
//!   write to the block device itself is refused, and the image hashes the same after the
//!   VM as before.
//!
//! Both boot copies of the cached image, never the image itself. Two checks need no boot:
//! the image holds the initramfs's init (also as `/sbin/init`) and is clean as built, and
//! the host's idea of the test file's bytes is what the init script writes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use minivmm_tests::{
    cli_args, debugfs_cat, debugfs_stat, disk_copy, disk_test_content, e2fsck_clean, exit_metrics,
    fc_schema, guest_image_if, metric, repo_root, sha256_file, Need, NetNs, Vm, DISK_READONLY_OK,
    DISK_TEST_FILE, DISK_WRITE_OK, READY,
};

const HOST_IP: &str = "10.0.7.1";
const GUEST_IP: &str = "10.0.7.2";
/// As the other boot tests: a boot is 30 to 120 s on a quiet PVM host, far more under load.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// From MINIVMM-READY to the disk check's line: a 180 KB write, a sync and a remount,
/// all through an emulated guest kernel.
const DISK_STEP_TIMEOUT: Duration = Duration::from_secs(300);
/// The drive id of both tests, the key of its counters in the metrics.
const DRIVE_ID: &str = "rootfs";

/// A directory of this test's own under the system's temporary directory.
fn scratch(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("minivmm-disk-{tag}-{}", std::process::id()))
}

/// A seed no earlier run used, so a stale image cannot pass: letters and digits only, as
/// init wants.
fn fresh_seed() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("seed{}n{nanos}", std::process::id())
}

/// Counter `key` of the test's drive in metrics line `m`.
fn counter(m: &serde_json::Value, key: &str) -> u64 {
    metric(m, DRIVE_ID, key)
}

/// The words of the guest kernel's command line, as its console shows them.
fn kernel_cmdline(console: &str) -> Vec<String> {
    console
        .lines()
        .find_map(|l| l.split_once("Kernel command line:").map(|(_, c)| c))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The line of `console` that contains `pattern`, or a panic with the report.
fn line_with<'a>(console: &'a str, pattern: &str, report: &str) -> &'a str {
    console
        .lines()
        .find(|l| l.contains(pattern))
        .unwrap_or_else(|| panic!("no console line with '{pattern}'\n{report}"))
}

/// Boot checks both disk tests share: the guest kernel booted the disk, with no initramfs,
/// as root with `root=/dev/vda` and `mode` (`rw` or `ro`), and ran the disk's init.
fn assert_booted_from_disk(vm: &Vm, mode: &str) {
    let console = vm.console();
    let report = vm.report();
    vm.assert_userspace_ran();
    let words = kernel_cmdline(&console);
    assert!(
        words.iter().any(|w| w == "root=/dev/vda") && words.iter().any(|w| w == mode),
        "the kernel command line lacks root=/dev/vda {mode}: {words:?}\n{report}"
    );
    // Printed only when the kernel finds an initramfs to unpack.
    assert!(
        !console.contains("Trying to unpack rootfs image"),
        "the guest was given an initramfs\n{report}"
    );
    let mounted = line_with(&console, "VFS: Mounted root (ext4 filesystem)", &report);
    assert_eq!(
        mounted.contains("readonly"),
        mode == "ro",
        "root mounted other than {mode}: {mounted}\n{report}"
    );
    // The kernel runs /sbin/init on a disk root (/init is the initramfs's).
    assert!(
        console.contains("Run /sbin/init as init process"),
        "{report}"
    );
}

/// Firecracker's `tests/framework/vm_config_network.json` with its paths,
/// boot arguments, TAP and MAC changed to this test's and 256 MiB of memory;
/// every other value and section as there.
fn firecracker_config(kernel: &Path, boot_args: &str, drive: &Path, tap: &str) -> String {
    let p = |p: &Path| p.to_str().expect("UTF-8 path").to_string();
    let mut v = fc_schema::firecracker_network_example();
    v["boot-source"]["kernel_image_path"] = p(kernel).into();
    v["boot-source"]["boot_args"] = boot_args.into();
    v["drives"][0]["drive_id"] = DRIVE_ID.into();
    v["drives"][0]["path_on_host"] = p(drive).into();
    v["machine-config"]["mem_size_mib"] = 256.into();
    v["network-interfaces"][0]["host_dev_name"] = tap.into();
    v["network-interfaces"][0]["guest_mac"] = "06:00:ac:10:00:02".into();
    serde_json::to_string_pretty(&v).expect("a JSON value serializes")
}

#[test]
fn firecracker_config_boots_a_read_write_disk_root_that_keeps_its_writes() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let dir = scratch("rw");
    let disk = disk_copy(&dir, "rootfs.ext4").unwrap();
    let seed = fresh_seed();
    let want = disk_test_content(&seed);
    let ns = NetNs::new("disk", "tap0", &format!("{HOST_IP}/24")).unwrap();
    // As `boot_args` is the whole command line in a config file, it carries minivmm's
    // defaults; minivmm adds root=/dev/vda rw (the root drive) and the MMIO words.
    let boot_args = format!(
        "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
         minivmm.disk=write:{seed} ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off"
    );
    let config = dir.join("vm_config_network.json");
    std::fs::write(
        &config,
        firecracker_config(&img.vmlinux, &boot_args, &disk, &ns.tap),
    )
    .unwrap();
    // The file leaves `metrics` null, as Firecracker's does; the flag beside it adds one.
    let metrics = dir.join("metrics.json");
    let args = cli_args(&[
        "--config-file",
        config.to_str().unwrap(),
        "--metrics",
        metrics.to_str().unwrap(),
        "--log-level",
        "info",
    ]);

    let mut vm = Vm::spawn(&args, Some(&ns.name)).unwrap();
    let ready = vm.wait_for(READY, BOOT_TIMEOUT);
    assert!(ready, "no {READY}\n{}", vm.report());
    let written = vm.wait_for("MINIVMM-DISK-WRITE", DISK_STEP_TIMEOUT);
    let console = vm.console();
    assert!(written, "no disk write line\n{}", vm.report());
    let line = line_with(&console, "MINIVMM-DISK-WRITE", &vm.report()).to_string();
    assert_eq!(
        line.trim(),
        format!("{DISK_WRITE_OK} bytes={} seed={seed}", want.len()),
        "{}",
        vm.report()
    );
    assert!(
        vm.wait_for("MINIVMM-SERVING", BOOT_TIMEOUT),
        "the guest never served\n{}",
        vm.report()
    );
    eprintln!(
        "FIGURE disk rw: MINIVMM-SERVING {:.1} s after start",
        vm.uptime()
    );
    assert_booted_from_disk(&vm, "rw");
    // The NIC works beside the disk.
    let ping_out = ns.ping(GUEST_IP, &[]);
    assert!(
        ping_out.contains("3 received"),
        "ping:\n{ping_out}\n{}",
        vm.report()
    );

    // Init remounted the root read-only after its sync: stopping the VM now must leave
    // the file system clean.
    vm.terminate(Duration::from_secs(30));
    vm.assert_no_crash();
    let console = vm.console();
    assert!(
        console.contains("EXT4-fs (vda): re-mounted"),
        "init did not remount the root read-only\n{}",
        vm.report()
    );

    let got = debugfs_cat(&disk, DISK_TEST_FILE).unwrap();
    assert!(
        got == want,
        "{DISK_TEST_FILE} in the image: {} bytes, want {}; first differing byte at {:?}",
        got.len(),
        want.len(),
        got.iter().zip(&want).position(|(a, b)| a != b)
    );
    let fsck = e2fsck_clean(&disk).unwrap();
    eprintln!("e2fsck -fn after the boot:\n{fsck}");
    // The device carried the writes: at least the file's bytes, the journal's on top.
    let m = exit_metrics(&metrics);
    assert!(counter(&m, "write_bytes") >= want.len() as u64, "{m}");
    assert!(counter(&m, "read_bytes") > 0, "{m}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn read_only_disk_root_refuses_writes_and_stays_byte_identical() {
    let Some(img) = guest_image_if(&[Need::Kvm]) else {
        return;
    };
    let dir = scratch("ro");
    let disk = disk_copy(&dir, "rootfs.ext4").unwrap();
    let before = sha256_file(&disk).unwrap();
    assert_eq!(
        before,
        sha256_file(&img.disk).unwrap(),
        "the copy is not the image"
    );
    let metrics = dir.join("metrics.json");
    let drive = format!(
        "path={},id={DRIVE_ID},readonly=on,root=on",
        disk.to_str().unwrap()
    );
    let args = cli_args(&[
        "--kernel",
        img.vmlinux.to_str().unwrap(),
        "--disk",
        &drive,
        "--vcpus",
        "2",
        "--mem",
        "256",
        // No mode: after the check init syncs and reboots, and minivmm exits by itself.
        "--cmdline",
        "minivmm.disk=readonly",
        "--metrics",
        metrics.to_str().unwrap(),
        "--log-level",
        "info",
    ]);

    let mut vm = Vm::spawn(&args, None).unwrap();
    let ready = vm.wait_for(READY, BOOT_TIMEOUT);
    let status = vm.wait_exit(if ready {
        DISK_STEP_TIMEOUT
    } else {
        Duration::from_secs(1)
    });
    let report = vm.report();
    assert!(ready, "no {READY} (minivmm status {status:?})\n{report}");
    let status = status.unwrap_or_else(|| panic!("minivmm did not exit after the check\n{report}"));
    eprintln!(
        "FIGURE disk ro: minivmm exited ({status}) after {:.1} s",
        vm.uptime()
    );
    assert_eq!(status.code(), Some(0), "{report}");
    assert_booted_from_disk(&vm, "ro");
    let console = vm.console();
    let line = line_with(&console, "MINIVMM-DISK-READONLY", &report);
    eprintln!("guest: {}", line.trim());
    assert!(line.contains(DISK_READONLY_OK), "{report}");
    assert!(line.contains("EROFS"), "{report}");

    let after = sha256_file(&disk).unwrap();
    assert_eq!(
        before, after,
        "the read-only image changed under the guest\n{report}"
    );
    let m = exit_metrics(&metrics);
    assert_eq!(counter(&m, "write_count"), 0, "{m}");
    assert_eq!(counter(&m, "write_bytes"), 0, "{m}");
    assert!(counter(&m, "read_bytes") > 0, "{m}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// No boot: the cached image holds the initramfs's init at /init and, for the kernel's
/// disk-root default, /sbin/init, has room to write and is clean as built.
#[test]
fn root_disk_image_holds_the_init_and_is_clean() {
    let Some(img) = guest_image_if(&[Need::Root]) else {
        return;
    };
    let init = std::fs::read(repo_root().join("resources/initramfs/init")).unwrap();
    assert_eq!(debugfs_cat(&img.disk, "/init").unwrap(), init);
    let sbin = debugfs_stat(&img.disk, "/sbin/init").unwrap();
    assert!(
        sbin.contains("Type: symlink") && sbin.contains("Fast link dest: \"../init\""),
        "{sbin}"
    );
    for bin in ["/bin/busybox", "/bin/mvperf"] {
        assert!(
            debugfs_stat(&img.disk, bin)
                .unwrap()
                .contains("Type: regular"),
            "no {bin} in the root disk"
        );
    }
    assert_eq!(std::fs::metadata(&img.disk).unwrap().len(), 64 << 20);
    e2fsck_clean(&img.disk).unwrap();
}

/// No boot: the bytes the host expects in the test file are those the init's
/// `disk_pattern` writes, run by the same busybox the image carries.
#[test]
fn disk_test_content_matches_the_init_script() {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        eprintln!("SKIP disk_test_content_matches_the_init_script: no /bin/busybox");
        return;
    }
    let init = std::fs::read_to_string(repo_root().join("resources/initramfs/init")).unwrap();
    // The function alone: from its first line to the first line that is just "}".
    let start = init
        .find("disk_pattern() {")
        .expect("init defines disk_pattern");
    let end = start
        + init[start..]
            .find("\n}\n")
            .expect("disk_pattern ends with a lone }")
        + 3;
    let seed = "abc-XYZ_123";
    let script = format!("{}disk_pattern {seed}\n", &init[start..end]);
    let out = Command::new(busybox)
        .args(["sh", "-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout == disk_test_content(seed),
        "the init writes other bytes"
    );
}
