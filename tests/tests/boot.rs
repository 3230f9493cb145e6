// SPDX-License-Identifier: Apache-2.0
//! Boot tests: the real guest kernel from `resources/build.sh` under minivmm.
//!
//! A boot costs 30 to 90 s on a PVM-backed host (the guest kernel runs
//! instruction-emulated there), so each scenario boots once and checks
//! everything it can on that boot: the bzImage boots with 1 vCPU, the ELF
//! vmlinux with 2, and both must reach guest userspace (init prints
//! MINIVMM-READY), run the guest self-test (`minivmm.mode=selftest`: threads
//! and their thread-local storage, clone with a new TLS, fork, exec, signals,
//! context switches, each checked by `mvperf selftest`) to its PASS line,
//! reboot, and leave minivmm exiting 0 by itself. The vmlinux boot also runs
//! with `--boot-timer`: init's write of 123 to the register must show as
//! one `Guest-boot-time` line (the bzImage boot, without it, must show
//! none). The vmlinux boot also has the entropy device (`--rng`): init's
//! `minivmm.rng=check` must find it current in the guest's hw_random core
//! and read 512 bytes from `/dev/hwrng`, and the metrics line minivmm writes
//! at exit must count at least those bytes served (`entropy.entropy_bytes`;
//! the guest kernel's own hwrng reads add to them). Before it reboots, the
//! vmlinux guest's init also prints the kernel's panic banner to
//! /dev/console (`minivmm.panic=fake`), as any guest process could: minivmm
//! must still exit 0, since only the guest kernel's pvpanic report means a
//! panic. A third boot panics the guest kernel for real (init exits,
//! `minivmm.panic=kernel`): minivmm must learn it from the kernel's pvpanic
//! driver and exit 3. Any other kernel panic or crash line on the console
//! (`segfault at`, `traps:`, ...) is a failure on every host. Bad-input cases need no boot and run in well under a second
//! each.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use minivmm_tests::{
    cli_args, exit_metrics, guest_image, guest_image_if, metric, minivmm_bin, Need, Vm, FAKE_PANIC,
    INIT_EXIT_PANIC, READY, RNG_CHECK_BYTES, RNG_OK, SELFTEST_PASS,
};

/// Generous: a boot is 30-90 s on a quiet PVM host, CI runs two at once on 2
/// cores, and on the shared development host under load one took 6 minutes.
/// A stall window (the harness's waits follow progress): console silence
/// this long, of the VMM's own time, fails the boot; three times it in all.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);
/// From MINIVMM-READY to minivmm's exit: the self-test (20 to 90 s of guest
/// time on a PVM host; 196 s before its last phase on an AMD host running
/// three VMs on 2 cores; its own watchdog fails after 600 s without
/// progress), then init syncs and resets the VM. Also a stall window over the
/// console (the self-test prints a line per phase).
const EXIT_TIMEOUT: Duration = Duration::from_secs(660);

/// What the guest kernel logs when it registers the pvpanic device minivmm
/// announces (resources/kernel/pvpanic-mmio-cmdline.patch).
const PVPANIC_DEVICE: &str = "pvpanic-mmio: device at 0xc0001000-0xc0001000 from the command line";

/// What minivmm logs when the guest kernel's pvpanic driver reports a panic.
const PVPANIC_REPORT: &str = "the guest kernel reported a panic through the pvpanic device";

/// What a boot checks beside the self-test.
#[derive(Default)]
struct Extras<'a> {
    /// `--boot-timer`.
    boot_timer: bool,
    /// The entropy device, with this metrics path.
    entropy: Option<&'a Path>,
    /// `minivmm.panic=fake`.
    fake_panic: bool,
}

/// Boots `kernel` in self-test mode: init must print MINIVMM-READY, the
/// self-test its PASS line, then init reboots and minivmm must exit 0 by
/// itself. With `boot_timer` (`--boot-timer`) minivmm must log the guest's
/// boot-complete write once, with a time between its first vCPU entry and
/// MINIVMM-READY; without it, nothing of the boot timer may show. With
/// `entropy` (a metrics path) the VM has the entropy device and the guest
/// checks it (see the module doc). With `fake_panic` init prints the
/// kernel's panic banner before it reboots, which must change nothing.
/// Returns the finished VM for more checks.
fn boot_to_ready(kernel: &Path, vcpus: &str, extras: Extras) -> Vm {
    let Extras {
        boot_timer,
        entropy,
        fake_panic,
    } = extras;
    let img = guest_image();
    let mut words = "minivmm.mode=selftest".to_string();
    if entropy.is_some() {
        words.push_str(" minivmm.rng=check");
    }
    if fake_panic {
        words.push_str(" minivmm.panic=fake");
    }
    let mut args = cli_args(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--initramfs",
        img.initramfs.to_str().unwrap(),
        "--vcpus",
        vcpus,
        "--mem",
        "256",
        "--cmdline",
        &words,
        "--log-level",
        "info",
    ]);
    if boot_timer {
        args.push("--boot-timer".into());
    }
    if let Some(metrics) = entropy {
        let _ = std::fs::remove_file(metrics);
        let metrics = metrics.to_str().unwrap();
        args.extend(cli_args(&[
            "--rng",
            "--metrics",
            metrics,
            "--metrics-interval",
            "0",
        ]));
    }
    let name = kernel.file_name().unwrap().to_string_lossy().into_owned();
    let mut vm = Vm::spawn(&args, None).unwrap();
    if fake_panic {
        vm.expect_crash_line(FAKE_PANIC);
    }
    let ready = vm.wait_for(READY, BOOT_TIMEOUT);
    let ready_at = vm.uptime();
    let status = vm.wait_exit(if ready {
        EXIT_TIMEOUT
    } else {
        Duration::from_secs(1)
    });
    let report = vm.report();
    assert!(
        ready,
        "{name}, {vcpus} vCPU(s): no {READY} (minivmm status {status:?})\n{report}"
    );
    let status = status.unwrap_or_else(|| {
        panic!("{name}, {vcpus} vCPU(s): minivmm did not exit within {EXIT_TIMEOUT:?} of {READY}\n{report}")
    });
    eprintln!(
        "FIGURE boot {name} {vcpus} vCPU(s): {READY} {ready_at:.1} s after start, \
         minivmm exited ({status}) after {:.1} s",
        vm.uptime()
    );
    if fake_panic {
        check_fake_panic(&vm, status.code(), &report);
    }
    assert_eq!(status.code(), Some(0), "{report}");
    vm.assert_userspace_ran();
    let console = vm.console();
    assert!(console.contains("Linux version"), "{report}");
    assert!(console.contains("Run /init as init process"), "{report}");
    let pass = console
        .lines()
        .find(|l| l.contains(SELFTEST_PASS))
        .unwrap_or_else(|| panic!("{name}, {vcpus} vCPU(s): no {SELFTEST_PASS}\n{report}"));
    eprintln!("FIGURE selftest {name} {vcpus} vCPU(s): {}", pass.trim());
    assert!(console.contains("self-test done, rebooting"), "{report}");
    let log = vm.stderr();
    assert!(
        log.contains("from start to first vCPU entry"),
        "no boot-time report\n{report}"
    );
    assert!(log.contains("run time:"), "no run-time report\n{report}");
    assert!(
        !log.contains("after a kernel panic") && !log.contains(PVPANIC_REPORT),
        "minivmm saw a panic\n{report}"
    );
    assert!(
        console.contains(PVPANIC_DEVICE),
        "the guest kernel did not register the pvpanic device\n{report}"
    );
    check_boot_timer(&log, boot_timer, ready_at, &report);
    if let Some(metrics) = entropy {
        check_entropy(&console, metrics, &report);
    }
    eprintln!(
        "FIGURE boot-timer {name} {vcpus} vCPU(s): {}",
        log.lines()
            .find(|l| l.contains(BOOT_TIME))
            .map_or("(off)", str::trim)
    );
    vm
}

/// The entropy device's traces of a boot with `--rng` and init's
/// `minivmm.rng=check`: the guest's check passed, and the metrics line
/// written at exit counts at least the bytes it read.
fn check_entropy(console: &str, metrics: &Path, report: &str) {
    let line = console
        .lines()
        .find(|l| l.contains("MINIVMM-RNG"))
        .unwrap_or_else(|| panic!("no MINIVMM-RNG line\n{report}"));
    assert!(
        line.contains(RNG_OK) && line.contains("current=virtio_rng"),
        "{line}\n{report}"
    );
    let m = exit_metrics(metrics);
    let served = metric(&m, "entropy", "entropy_bytes");
    assert!(served >= RNG_CHECK_BYTES, "{served} bytes served\n{report}");
    assert!(metric(&m, "entropy", "requests") > 0, "{m}");
    assert_eq!(metric(&m, "entropy", "malformed_chains"), 0, "{m}");
    eprintln!(
        "FIGURE entropy: {} / {served} bytes / {} requests",
        line.trim(),
        metric(&m, "entropy", "requests")
    );
    let _ = std::fs::remove_file(metrics);
}

/// The guest's init printed the kernel's panic banner to /dev/console and
/// rebooted: minivmm must have seen the text (its log says so) and still
/// ended with 0, since no guest process can speak for the kernel.
fn check_fake_panic(vm: &Vm, code: Option<i32>, report: &str) {
    let console = vm.console();
    assert!(
        console.lines().any(|l| l.trim_end() == FAKE_PANIC)
            && console.contains("printed a fake kernel panic banner"),
        "init did not print the fake panic banner\n{report}"
    );
    assert_eq!(
        code,
        Some(0),
        "a panic banner printed by a guest process changed minivmm's exit status\n{report}"
    );
    assert!(
        vm.stderr()
            .contains("the guest console shows a kernel panic banner"),
        "minivmm did not log the console's banner\n{report}"
    );
}

/// Firecracker's boot-time line, which minivmm logs with `--boot-timer`.
const BOOT_TIME: &str = "Guest-boot-time = ";

/// The boot-timer's traces in minivmm's log `log` of a boot that reached
/// MINIVMM-READY `ready_at` seconds after start: with `on`, the register
/// announced on the command line and one boot-time line whose wall time
/// lies between the first vCPU entry and MINIVMM-READY; without, neither.
fn check_boot_timer(log: &str, on: bool, ready_at: f64, report: &str) {
    let word = "minivmm.boot_timer=0xc0000000";
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(BOOT_TIME)).collect();
    if !on {
        assert!(!log.contains(word), "{word} without --boot-timer\n{report}");
        assert!(
            lines.is_empty(),
            "a boot time without --boot-timer\n{report}"
        );
        return;
    }
    assert!(
        log.lines()
            .any(|l| l.contains("minivmm adds to the kernel command line:") && l.contains(word)),
        "{word} not added to the command line\n{report}"
    );
    assert_eq!(lines.len(), 1, "want one boot-time line\n{report}");
    // "Guest-boot-time = 61234567 us 61234 ms,  9876543 CPU us 9876 CPU ms"
    let fields: Vec<&str> = lines[0]
        .split(BOOT_TIME)
        .nth(1)
        .unwrap()
        .split([' ', ','])
        .filter(|w| !w.is_empty())
        .collect();
    let num = |i: usize| -> u64 {
        fields
            .get(i)
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("field {i} of {:?}\n{report}", lines[0]))
    };
    let (us, ms, cpu_us, cpu_ms) = (num(0), num(2), num(4), num(7));
    assert_eq!(ms, us / 1000, "{}", lines[0]);
    assert_eq!(cpu_ms, cpu_us / 1000, "{}", lines[0]);
    let entry_ms: u64 = log
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("boot: ")?;
            rest.strip_suffix(" ms from start to first vCPU entry")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no first vCPU entry time\n{report}"));
    // The write comes from init, before MINIVMM-READY: after the guest
    // started and before the test saw its marker.
    assert!(
        us > entry_ms * 1000 && (us as f64) < ready_at * 1e6,
        "boot time {us} us, first vCPU entry at {entry_ms} ms, {READY} at {ready_at:.1} s\n{report}"
    );
    assert!(cpu_us > 0, "{}", lines[0]);
}

/// The bzImage's decompressor runs emulated here (LZ4 keeps it to about half
/// a minute), so the image the README boots is also the one that proves a
/// single vCPU reaches userspace and exits cleanly.
#[test]
fn bzimage_with_one_vcpu_boots_to_ready_and_exits_0() {
    let Some(img) = guest_image_if(&[Need::Kvm]) else {
        return;
    };
    let vm = boot_to_ready(&img.bzimage, "1", Extras::default());
    assert!(
        vm.stderr().contains("bzImage kernel at 0x100200"),
        "{}",
        vm.report()
    );
}

#[test]
fn vmlinux_with_two_vcpus_boots_to_ready_and_exits_0() {
    let Some(img) = guest_image_if(&[Need::Kvm]) else {
        return;
    };
    let metrics =
        std::env::temp_dir().join(format!("minivmm-boot-rng-{}.json", std::process::id()));
    let extras = Extras {
        boot_timer: true,
        entropy: Some(&metrics),
        fake_panic: true,
    };
    let vm = boot_to_ready(&img.vmlinux, "2", extras);
    assert!(
        vm.console().contains("Brought up 1 node, 2 CPUs"),
        "{}",
        vm.report()
    );
}

/// A real guest kernel panic: init exits after MINIVMM-READY, the kernel
/// panics ("Attempted to kill init!"), its pvpanic driver writes the
/// register, and with `panic=-1` it resets at once. minivmm must log the
/// report and exit 3.
#[test]
fn a_guest_kernel_panic_reaches_minivmm_through_pvpanic_and_exits_3() {
    let Some(img) = guest_image_if(&[Need::Kvm]) else {
        return;
    };
    let args = cli_args(&[
        "--kernel",
        img.vmlinux.to_str().unwrap(),
        "--initramfs",
        img.initramfs.to_str().unwrap(),
        "--cmdline",
        "minivmm.panic=kernel",
        "--log-level",
        "info",
    ]);
    let mut vm = Vm::spawn(&args, None).unwrap();
    vm.expect_crash_line(INIT_EXIT_PANIC);
    let ready = vm.wait_for(READY, BOOT_TIMEOUT);
    let status = vm.wait_exit(if ready {
        EXIT_TIMEOUT
    } else {
        Duration::from_secs(1)
    });
    let report = vm.report();
    assert!(ready, "no {READY} (minivmm status {status:?})\n{report}");
    let status = status.unwrap_or_else(|| {
        panic!("minivmm did not exit within {EXIT_TIMEOUT:?} of {READY}\n{report}")
    });
    eprintln!(
        "FIGURE panic boot: minivmm exited ({status}) after {:.1} s",
        vm.uptime()
    );
    vm.assert_userspace_ran();
    let console = vm.console();
    assert!(console.contains(PVPANIC_DEVICE), "{report}");
    assert!(
        console.contains(INIT_EXIT_PANIC),
        "the guest kernel did not panic\n{report}"
    );
    let log = vm.stderr();
    assert!(
        log.contains(&format!("{PVPANIC_REPORT} (PANICKED)")),
        "no pvpanic report in minivmm's log\n{report}"
    );
    assert!(
        log.contains("guest reset the machine after a kernel panic"),
        "{report}"
    );
    assert_eq!(status.code(), Some(3), "{report}");
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
    let Some(img) = guest_image_if(&[Need::Kvm]) else {
        return;
    };
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
    let Some(img) = guest_image_if(&[Need::Root]) else {
        return;
    };
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
