// SPDX-License-Identifier: Apache-2.0
//! Every minivmm thread runs under its seccomp filter, and `--seccomp`
//! does what the README says.
//!
//! Each test boots the real guest kernel (2 vCPUs, the project's initramfs) only
//! until it prints its first console line, which proves the vCPUs entered
//! the guest, reads `/proc/<pid>/task/*/status`, then stops minivmm with
//! SIGTERM: the shutdown path (signalfd, metrics file, exit) runs under the
//! filter too. The guest's network path and its i8042 reset run under the
//! default filter in `netperf.rs` and `boot.rs`; that a forbidden call ends
//! the process with status 148 is shown in `vmm::seccomp`'s unit tests, and
//! that it and a panic give the terminal back in `vmm::terminal`'s. With
//! `--seccomp on` stdin is a pseudo-terminal: raw while the guest runs, its
//! mode back after SIGTERM, under the filter.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use minivmm_tests::pty::{self, canonical};
use minivmm_tests::{assert_no_crash, guest_image, minivmm_bin, require, Need, Patience, Watch};

/// A minivmm whose console is collected by a reader thread.
struct Running {
    child: Child,
    console: Arc<Mutex<Vec<u8>>>,
}

impl Running {
    fn start(seccomp: &str, metrics: &std::path::Path, stdin: Stdio) -> Running {
        let img = guest_image();
        let mut child = Command::new(minivmm_bin())
            .args(["--kernel", img.vmlinux.to_str().unwrap()])
            .args(["--initramfs", img.initramfs.to_str().unwrap()])
            .args(["--vcpus", "2"])
            .args(["--metrics", metrics.to_str().unwrap()])
            .args(["--seccomp", seccomp])
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning minivmm");
        let console = Arc::new(Mutex::new(Vec::new()));
        let sink = console.clone();
        let mut out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Running { child, console }
    }

    /// Waits until the guest printed its first line (the kernel banner): 120 s
    /// of minivmm's own time (a host loaded by other work gives it less), at
    /// most three times that in all.
    fn wait_for_guest(&mut self) {
        let mut watch = Watch::new(Patience::of(Duration::from_secs(120)), &[self.child.id()]);
        loop {
            if String::from_utf8_lossy(&self.console.lock().unwrap()).contains("Linux version") {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("minivmm exited early with {status}");
            }
            if let Err(why) = watch.check(&[]) {
                panic!("the guest printed no kernel banner: {why}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// (thread name, Seccomp mode) of every thread of the process.
    fn threads(&self) -> Vec<(String, String)> {
        minivmm_tests::threads_of(self.child.id())
    }

    /// Stops minivmm with SIGTERM and returns its exit code.
    fn stop(mut self) -> Option<i32> {
        let _ = Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(200));
                let console = String::from_utf8_lossy(&self.console.lock().unwrap()).into_owned();
                assert_no_crash(&console, "(seccomp boot)");
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        panic!("minivmm ignored SIGTERM for 30 s");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn metrics_path(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("minivmm-seccomp-{tag}-{}.json", std::process::id()))
}

/// Boots with `--seccomp mode`, checks every thread's Seccomp field is
/// `want`, and that SIGTERM still ends minivmm with 0 and its metrics.
fn boot_and_check(mode: &str, want: &str) {
    let metrics = metrics_path(mode);
    let _ = std::fs::remove_file(&metrics);
    // With the filter on, the console's terminal handling runs under it.
    let tty = (mode == "on").then(pty::open);
    let stdin = match &tty {
        Some((_, slave)) => Stdio::from(slave.try_clone().expect("dup the pty")),
        None => Stdio::null(),
    };
    let mut vm = Running::start(mode, &metrics, stdin);
    vm.wait_for_guest();
    if let Some((_, slave)) = &tty {
        assert!(
            !canonical(slave),
            "a terminal stdin is raw while the guest runs"
        );
    }
    let threads = vm.threads();
    // KVM adds a kernel worker to the VM's process on the first KVM_RUN
    // (`kvm-nx-lpage-recovery`, shown truncated); it inherits the filter of
    // the vCPU that created it and runs no system calls of ours.
    let names: Vec<&str> = threads
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !n.starts_with("kvm-"))
        .collect();
    assert_eq!(
        names,
        ["fc_vcpu 0", "fc_vcpu 1", "minivmm"],
        "unexpected threads: {threads:?}"
    );
    for (name, seccomp) in &threads {
        assert_eq!(
            seccomp, want,
            "thread {name} has Seccomp {seccomp} with --seccomp {mode}"
        );
    }
    assert_eq!(
        vm.stop(),
        Some(0),
        "--seccomp {mode}: SIGTERM must end with 0"
    );
    if let Some((_, slave)) = &tty {
        assert!(
            canonical(slave),
            "the terminal's mode is back after the exit"
        );
    }
    let json = std::fs::read_to_string(&metrics).expect("metrics written at exit");
    assert!(json.trim_start().starts_with('{'), "{json}");
    let _ = std::fs::remove_file(&metrics);
    println!("--seccomp {mode}: {threads:?}");
}

#[test]
fn every_thread_runs_under_its_filter() {
    if !require(&[Need::Kvm]) {
        return;
    }
    // 2 is SECCOMP_MODE_FILTER.
    boot_and_check("on", "2");
}

#[test]
fn seccomp_log_filters_and_off_does_not() {
    if !require(&[Need::Kvm]) {
        return;
    }
    // log installs the same filters with a logging default action.
    boot_and_check("log", "2");
    boot_and_check("off", "0");
}
