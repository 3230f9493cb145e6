// SPDX-License-Identifier: Apache-2.0
//! Every minivmm thread runs under its seccomp filter, `--seccomp` does what
//! the README says, and the paths a thread takes rarely (signals, stops,
//! pauses, the exit into a stalled FIFO, the API's error answers) run under
//! `--seccomp on` too.
//!
//! Two tests boot the real guest kernel (2 vCPUs, the project's initramfs)
//! only until it prints its first console line, which proves the vCPUs
//! entered the guest, read `/proc/<pid>/task/*/status`, then stop minivmm
//! with SIGTERM: the shutdown path (signalfd, metrics file, exit) runs under
//! the filter too. Under `on` the boot also takes console input from its
//! pseudo-terminal, writes a metrics line on SIGUSR1 and is stopped and
//! continued (SIGSTOP, SIGCONT) a few times while the guest kernel runs.
//!
//! The other tests run a VM on a "kernel" that halts at once (no guest boot:
//! up in a second) with `--seccomp on`, because what they exercise is
//! minivmm's own threads:
//! - SIGSTOP and SIGCONT while API requests flow, before any VM exists,
//!   with a VM running and with it paused, and the same with the process's
//!   cgroup frozen and thawed (cgroup v2 `cgroup.freeze`): a thread stopped
//!   inside a timed wait resumes it through `restart_syscall`, which no list
//!   allowed (minivmm exited 148);
//! - SIGTERM while the metrics FIFO's reader has stalled: the exit wrote its
//!   last line by sleeping until the reader took it, and the event loop may
//!   not sleep (148); now the lines the reader did not take are counted;
//! - the run-time API's rarer requests (pause and resume, FlushMetrics,
//!   SendCtrlAltDel, limiter changes, a drive's image swapped, refused
//!   requests), SIGUSR1, the log and the metrics into FIFOs, and SIGINT.
//!
//! A forbidden call fails a test with the call's name: minivmm's SIGSYS
//! handler writes it (`forbidden system call 219 (restart_syscall)`), and
//! [`exit_note`] puts that line in the failure message. The guest's network
//! path and its i8042 reset run under the default filter in `netperf.rs`
//! and `boot.rs`; that a forbidden call ends the process with status 148 is
//! shown in `vmm::process::seccomp`'s unit tests, and that it and a panic
//! give the terminal back in `vmm::process::terminal`'s.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use minivmm_tests::pty::{self, canonical};
use minivmm_tests::{
    assert_no_crash, cli_args, exit_note, guest_image, minivmm_bin, parse_metrics_lines,
    print_skip, require, write_halting_kernel, Need, NetNs, Patience, Vm, Watch,
};

/// A minivmm whose console and stderr are collected by reader threads.
struct Running {
    child: Child,
    console: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

/// Collects everything `from` yields into `sink`, on a thread.
fn collect(mut from: impl Read + Send + 'static, sink: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
}

impl Running {
    fn start(seccomp: &str, metrics: &Path, stdin: Stdio) -> Running {
        let img = guest_image();
        let mut child = Command::new(minivmm_bin())
            .args(["--kernel", img.vmlinux.to_str().unwrap()])
            .args(["--initramfs", img.initramfs.to_str().unwrap()])
            .args(["--vcpus", "2"])
            .args(["--metrics", metrics.to_str().unwrap()])
            .args(["--metrics-interval", "0"])
            .args(["--seccomp", seccomp])
            .stdin(stdin)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawning minivmm");
        let console = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        collect(child.stdout.take().expect("piped stdout"), console.clone());
        collect(child.stderr.take().expect("piped stderr"), stderr.clone());
        Running {
            child,
            console,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Panics with `why` and how minivmm ended (the refused call, for 148).
    fn fail(&mut self, why: &str) -> ! {
        std::thread::sleep(Duration::from_millis(200));
        let code = self.child.try_wait().ok().flatten().map(|s| s.code());
        let note = match code {
            Some(code) => exit_note(code, &self.stderr()),
            None => "minivmm still runs".to_string(),
        };
        panic!("{why}: {note}\n--- minivmm stderr ---\n{}", self.stderr());
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
            if let Ok(Some(_)) = self.child.try_wait() {
                self.fail("minivmm exited before the guest printed a line");
            }
            if let Err(why) = watch.check(&[]) {
                self.fail(&format!("the guest printed no kernel banner: {why}"));
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
                if status.code() != Some(0) {
                    self.fail("SIGTERM did not end minivmm with 0");
                }
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

fn tmp(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("minivmm-seccomp-{}-{tag}", std::process::id()))
}

/// Boots with `--seccomp mode`, checks every thread's Seccomp field is
/// `want`, and that SIGTERM still ends minivmm with 0 and its metrics. Under
/// `on` the boot also reads console input, writes a line on SIGUSR1 and is
/// stopped and continued while the guest kernel runs.
fn boot_and_check(mode: &str, want: &str) {
    let metrics = tmp(&format!("{mode}.json"));
    let _ = std::fs::remove_file(&metrics);
    // With the filter on, the console's terminal handling runs under it.
    let tty = (mode == "on").then(pty::open);
    let stdin = match &tty {
        Some((_, slave)) => Stdio::from(slave.try_clone().expect("dup the pty")),
        None => Stdio::null(),
    };
    let mut vm = Running::start(mode, &metrics, stdin);
    vm.wait_for_guest();
    if let Some((master, slave)) = &tty {
        assert!(
            !canonical(slave),
            "a terminal stdin is raw while the guest runs"
        );
        // Console input: the event loop reads it and queues it in the UART.
        let mut typing = std::fs::File::from(master.try_clone().expect("dup the pty master"));
        typing.write_all(b"echo typed\r").expect("typing");
        // The guest kernel runs (emulated on a PVM host: MMIO and port exits
        // by the thousand, an AP backing off in its sleep) while the whole
        // process is stopped and continued.
        if let Err(why) = stop_and_continue(vm.child.id(), 20) {
            vm.fail(&why);
        }
        signal(vm.child.id(), libc::SIGUSR1);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::fs::read_to_string(&metrics)
            .unwrap_or_default()
            .is_empty()
        {
            assert!(Instant::now() < deadline, "no metrics line on SIGUSR1");
            std::thread::sleep(Duration::from_millis(50));
        }
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
    let lines = parse_metrics_lines(&json);
    let want_lines = if mode == "on" { 2 } else { 1 };
    assert_eq!(lines.len(), want_lines, "{json}");
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

// ---- signals, stops and freezes against minivmm's own threads ----

#[allow(unsafe_code)]
fn signal(pid: u32, sig: libc::c_int) {
    let pid = libc::pid_t::try_from(pid).expect("a pid fits pid_t");
    // SAFETY: kill has no memory-safety preconditions; `pid` is a child
    // this test spawned and has not reaped.
    unsafe { libc::kill(pid, sig) };
}

/// The state letter of process `pid` (`/proc/<pid>/stat`), "" once gone.
fn proc_state(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

/// Whether process `pid` has ended (a zombie, or gone).
fn ended(pid: u32) -> bool {
    matches!(proc_state(pid).as_str(), "" | "Z" | "X")
}

/// Stops `pid` with SIGSTOP and continues it with SIGCONT, `times` times:
/// each time it waits until the kernel shows the process stopped, and the
/// pauses between vary so that the stops land in different places. An
/// error when the process ended meanwhile.
fn stop_and_continue(pid: u32, times: u32) -> Result<(), String> {
    for i in 0..times {
        signal(pid, libc::SIGSTOP);
        let deadline = Instant::now() + Duration::from_secs(10);
        while proc_state(pid) != "T" {
            if ended(pid) {
                return Err(format!("minivmm ended after {i} SIGSTOP/SIGCONT"));
            }
            if Instant::now() > deadline {
                return Err(format!("minivmm did not stop ({:?})", proc_state(pid)));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(5));
        signal(pid, libc::SIGCONT);
        std::thread::sleep(Duration::from_millis(u64::from(3 + i % 7 * 3)));
    }
    if ended(pid) {
        return Err(format!("minivmm ended after {times} SIGSTOP/SIGCONT"));
    }
    Ok(())
}

/// One HTTP request on `stream` (kept alive) and its answer: (status, body).
fn exchange(
    stream: &mut UnixStream,
    method: &str,
    path: &str,
    body: &str,
) -> Result<(u16, String), String> {
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("sending: {e}"))?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let head_end = got.windows(4).position(|w| w == b"\r\n\r\n");
        if let Some(end) = head_end {
            let head = String::from_utf8_lossy(&got[..end]).into_owned();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                let status = head
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| format!("no status code in {head:?}"))?;
                let body = String::from_utf8_lossy(&got[end + 4..end + 4 + len]).into_owned();
                return Ok((status, body));
            }
        }
        let n = stream
            .read(&mut buf)
            .map_err(|e| format!("reading the answer: {e}"))?;
        if n == 0 {
            return Err("the API closed the connection mid-answer".into());
        }
        got.extend_from_slice(&buf[..n]);
    }
}

fn connect(sock: &Path) -> UnixStream {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match UnixStream::connect(sock) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                return s;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no API socket: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// One request on a connection of its own; panics unless the status is
/// `want`, and returns the body.
fn request(sock: &Path, method: &str, path: &str, body: &str, want: u16) -> String {
    let (status, answer) = exchange(&mut connect(sock), method, path, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    assert_eq!(status, want, "{method} {path} {body}: {answer}");
    answer
}

/// A client sending `GET /` on one kept-alive connection as fast as it is
/// answered, until stopped; counts the answers.
struct Traffic {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(sock: &Path) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let (s, a, sock) = (stop.clone(), answered.clone(), sock.to_path_buf());
        // A request that fails ends the client; the test then says why,
        // from how minivmm ended.
        let thread = std::thread::spawn(move || {
            let mut stream = connect(&sock);
            while !s.load(Ordering::SeqCst) {
                if !matches!(exchange(&mut stream, "GET", "/", ""), Ok((200, _))) {
                    return;
                }
                a.fetch_add(1, Ordering::SeqCst);
            }
        });
        Traffic {
            stop,
            answered,
            thread: Some(thread),
        }
    }

    fn answered(&self) -> u64 {
        self.answered.load(Ordering::SeqCst)
    }

    /// Waits until `more` answers came after this call; an error when the
    /// client stopped (a request failed) or 30 s passed first.
    fn wait_for(&self, more: u64) -> Result<(), String> {
        let target = self.answered() + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.answered() < target {
            if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return Err("an API request failed".into());
            }
            if Instant::now() > deadline {
                return Err("the API stopped answering".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.answered()
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Runs `disturb` (stops, freezes) against `vm` while API requests flow,
/// and checks the API answered throughout; a failure says how minivmm
/// ended (the refused call, for 148).
fn under_traffic(
    vm: &mut Vm,
    sock: &Path,
    what: &str,
    disturb: impl FnOnce() -> Result<(), String>,
) {
    let traffic = Traffic::start(sock);
    let outcome = traffic.wait_for(10).and_then(|()| {
        let before = traffic.answered();
        disturb()?;
        traffic.wait_for(10)?;
        Ok(traffic.answered() - before)
    });
    traffic.finish();
    match outcome {
        Ok(answered) => println!("{what}: {answered} requests answered"),
        Err(why) => fail(vm, &format!("{what}: {why}")),
    }
}

/// Panics with `why` and how `vm` ended (the refused call, for 148).
fn fail(vm: &mut Vm, why: &str) -> ! {
    let note = match vm.wait_exit(Duration::from_secs(5)) {
        Some(status) => exit_note(status.code(), &vm.stderr()),
        None => "minivmm still runs".to_string(),
    };
    panic!("{why}: {note}\n{}", vm.report());
}

/// Asserts that `vm` exited with `want` after `sig`, naming a refused call.
fn end_with(vm: &mut Vm, sig: &str, want: i32) {
    vm.signal(sig);
    let status = vm
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("minivmm ignored SIG{sig}\n{}", vm.report()));
    assert_eq!(
        status.code(),
        Some(want),
        "{}\n{}",
        exit_note(status.code(), &vm.stderr()),
        vm.report()
    );
}

/// Waits until every thread of `vm` is filtered, the main thread last: the
/// VM runs and its signals are the event loop's (a SIGUSR1 before that
/// would end minivmm, the signal's default action).
fn wait_until_running(vm: &Vm) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !vm
        .threads()
        .iter()
        .any(|(name, seccomp)| name == "minivmm" && seccomp == "2")
    {
        assert!(
            Instant::now() < deadline,
            "the VM never ran
{}",
            vm.report()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The halting kernel, 2 vCPUs (on a PVM host the AP backs off in a sleep
/// for as long as the VM runs: another timed wait to stop in), the filter
/// on, and these words.
fn halting_vm(kernel: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = cli_args(&[
        "--kernel",
        kernel.to_str().unwrap(),
        "--mem",
        "64",
        "--vcpus",
        "2",
        "--seccomp",
        "on",
    ]);
    args.extend(cli_args(extra));
    args
}

fn halting_kernel(tag: &str) -> PathBuf {
    let p = tmp(&format!("{tag}.elf"));
    write_halting_kernel(&p).unwrap();
    p
}

#[test]
fn sigstop_and_sigcont_during_api_traffic_before_boot() {
    let sock = tmp("preboot.sock");
    let _ = std::fs::remove_file(&sock);
    let mut vm = Vm::spawn(
        &cli_args(&["--api-sock", sock.to_str().unwrap(), "--seccomp", "on"]),
        None,
    )
    .unwrap();
    let pid = vm.pid();
    under_traffic(&mut vm, &sock, "before boot, stopped and continued", || {
        stop_and_continue(pid, 40)
    });
    // Still configurable after it all.
    request(
        &sock,
        "PUT",
        "/machine-config",
        r#"{"vcpu_count": 1, "mem_size_mib": 64}"#,
        204,
    );
    // A stop signal before InstanceStart: a clean end, the socket removed.
    end_with(&mut vm, "TERM", 0);
    assert!(!sock.exists(), "the socket was left behind");
}

#[test]
fn sigstop_and_sigcont_with_a_vm_running_and_paused() {
    if !require(&[Need::Kvm]) {
        return;
    }
    let kernel = halting_kernel("stop");
    let sock = tmp("stop.sock");
    let _ = std::fs::remove_file(&sock);
    let mut vm = Vm::spawn(
        &halting_vm(&kernel, &["--api-sock", sock.to_str().unwrap()]),
        None,
    )
    .unwrap();
    let pid = vm.pid();
    under_traffic(&mut vm, &sock, "running, stopped and continued", || {
        stop_and_continue(pid, 40)
    });
    request(&sock, "PATCH", "/vm", r#"{"state": "Paused"}"#, 204);
    under_traffic(&mut vm, &sock, "paused, stopped and continued", || {
        stop_and_continue(pid, 40)
    });
    assert!(request(&sock, "GET", "/", "", 200).contains("Paused"));
    request(&sock, "PATCH", "/vm", r#"{"state": "Resumed"}"#, 204);
    assert!(request(&sock, "GET", "/", "", 200).contains("Running"));
    end_with(&mut vm, "TERM", 0);
    let _ = std::fs::remove_file(&kernel);
}

/// A cgroup v2 directory of its own for one test, removed on drop (once the
/// process in it is gone).
struct FreezableCgroup {
    dir: PathBuf,
}

impl FreezableCgroup {
    /// A new leaf under the cgroup v2 hierarchy's root, if this host has one
    /// with the freezer (`cgroup.freeze`, Linux 5.2) and lets us make it.
    fn new(tag: &str) -> Result<FreezableCgroup, String> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").map_err(|e| e.to_string())?;
        let root = mounts
            .lines()
            .find_map(|l| {
                let mut w = l.split_whitespace();
                let (_, dir, fstype) = (w.next()?, w.next()?, w.next()?);
                (fstype == "cgroup2").then(|| PathBuf::from(dir))
            })
            .ok_or("no cgroup v2 hierarchy is mounted")?;
        let dir = root.join(format!("minivmm-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .map_err(|e| format!("cannot make a cgroup in {}: {e}", root.display()))?;
        let cg = FreezableCgroup { dir };
        if !cg.dir.join("cgroup.freeze").exists() {
            return Err("the cgroup v2 hierarchy has no freezer (cgroup.freeze)".into());
        }
        Ok(cg)
    }

    fn enter(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .expect("moving minivmm into the cgroup");
    }

    /// Freezes the cgroup, waits until the kernel says it is frozen, and
    /// thaws it, `times` times; an error when `pid` (in the cgroup) ended
    /// meanwhile.
    fn freeze_and_thaw(&self, pid: u32, times: u32) -> Result<(), String> {
        for i in 0..times {
            std::fs::write(self.dir.join("cgroup.freeze"), "1").expect("freezing");
            let deadline = Instant::now() + Duration::from_secs(10);
            while !std::fs::read_to_string(self.dir.join("cgroup.events"))
                .unwrap_or_default()
                .contains("frozen 1")
            {
                if Instant::now() > deadline {
                    return Err("the cgroup never froze".into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            std::thread::sleep(Duration::from_millis(5));
            std::fs::write(self.dir.join("cgroup.freeze"), "0").expect("thawing");
            if ended(pid) {
                return Err(format!("minivmm ended after {i} freezes"));
            }
            std::thread::sleep(Duration::from_millis(u64::from(3 + i % 7 * 3)));
        }
        if ended(pid) {
            return Err(format!("minivmm ended after {times} freezes"));
        }
        Ok(())
    }
}

impl Drop for FreezableCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.freeze"), "0");
        let _ = std::fs::remove_dir(&self.dir);
    }
}

#[test]
fn a_frozen_cgroup_thaws_with_the_vm_running_and_paused() {
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    let cgroup = match FreezableCgroup::new("freeze") {
        Ok(c) => c,
        Err(why) => {
            print_skip(&why);
            return;
        }
    };
    let kernel = halting_kernel("freeze");
    let sock = tmp("freeze.sock");
    let _ = std::fs::remove_file(&sock);
    let mut vm = Vm::spawn(
        &halting_vm(&kernel, &["--api-sock", sock.to_str().unwrap()]),
        None,
    )
    .unwrap();
    let pid = vm.pid();
    cgroup.enter(pid);
    under_traffic(&mut vm, &sock, "running, frozen and thawed", || {
        cgroup.freeze_and_thaw(pid, 40)
    });
    request(&sock, "PATCH", "/vm", r#"{"state": "Paused"}"#, 204);
    under_traffic(&mut vm, &sock, "paused, frozen and thawed", || {
        cgroup.freeze_and_thaw(pid, 40)
    });
    request(&sock, "PATCH", "/vm", r#"{"state": "Resumed"}"#, 204);
    end_with(&mut vm, "TERM", 0);
    drop(vm);
    drop(cgroup);
    let _ = std::fs::remove_file(&kernel);
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    assert!(Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("running mkfifo")
        .success());
}

/// Bytes waiting in the pipe behind `reader` (FIONREAD).
#[allow(unsafe_code)]
fn unread_bytes(reader: &std::fs::File) -> usize {
    use std::os::fd::AsRawFd;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into the live `n`; the fd is open.
    let r = unsafe { libc::ioctl(reader.as_raw_fd(), libc::FIONREAD, &mut n) };
    assert_eq!(r, 0, "FIONREAD: {}", std::io::Error::last_os_error());
    usize::try_from(n).unwrap_or(0)
}

#[test]
fn sigterm_with_a_stalled_metrics_fifo_reader() {
    if !require(&[Need::Kvm]) {
        return;
    }
    let kernel = halting_kernel("stall");
    let fifo = tmp("stall.fifo");
    mkfifo(&fifo);
    let mut vm = Vm::spawn(
        &halting_vm(
            &kernel,
            &[
                "--metrics",
                fifo.to_str().unwrap(),
                "--metrics-interval",
                "0",
            ],
        ),
        None,
    )
    .unwrap();
    // A reader that opened the FIFO and then stopped reading.
    let mut reader = std::fs::File::open(&fifo).expect("opening the FIFO to read");
    wait_until_running(&vm);
    // Lines on SIGUSR1 until the pipe holds 64 KiB, then as many again, for
    // minivmm to keep waiting.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut full_at = None;
    let mut signals = 0;
    while full_at.is_none_or(|n| signals < 2 * n) {
        assert!(
            Instant::now() < deadline,
            "the pipe did not fill: {} bytes after {signals} signals\n{}",
            unread_bytes(&reader),
            vm.report()
        );
        vm.signal("USR1");
        signals += 1;
        std::thread::sleep(Duration::from_millis(3));
        if full_at.is_none() && unread_bytes(&reader) >= 60_000 {
            full_at = Some(signals);
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    end_with(&mut vm, "TERM", 0);
    // The exit line did not fit: it and the lines waiting behind the pipe
    // are counted, and minivmm says so.
    let stderr = vm.stderr();
    let warning = stderr
        .lines()
        .find(|l| l.contains("the metrics reader did not take the last"))
        .unwrap_or_else(|| panic!("no warning about the lines dropped at exit\n{stderr}"));
    let lost: u64 = warning
        .split("the last ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in '{warning}'"));
    assert!(lost >= 2, "{warning}");
    // What the pipe held: whole lines, in order, then perhaps the start of
    // one more (a line the pipe took only in part stays cut).
    let mut got = Vec::new();
    reader.read_to_end(&mut got).unwrap();
    let text = String::from_utf8_lossy(&got);
    let whole = text.rsplit_once('\n').map_or("", |(w, _)| w);
    let lines = parse_metrics_lines(whole);
    assert!(lines.len() > 100, "{} lines", lines.len());
    for w in lines.windows(2) {
        assert!(w[1]["vmm"]["uptime_ms"].as_u64() >= w[0]["vmm"]["uptime_ms"].as_u64());
    }
    println!(
        "{} lines read, {lost} dropped at exit: {warning}",
        lines.len()
    );
    let _ = std::fs::remove_file(&fifo);
    let _ = std::fs::remove_file(&kernel);
}

/// Reads a FIFO on a thread until every writer closed it; returns the text.
fn fifo_collector(path: &Path) -> std::thread::JoinHandle<String> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Ok(mut f) = std::fs::File::open(&path) {
            let _ = f.read_to_string(&mut text);
        }
        text
    })
}

/// `path` opened and locked exclusively, as another VM's drive would be.
#[allow(unsafe_code)]
fn hold_lock(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("opening the image to lock");
    // SAFETY: flock on an fd this function owns; no memory is involved.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(r, 0, "flock: {}", std::io::Error::last_os_error());
    f
}

fn image(path: &Path, mib: u64) {
    let f = std::fs::File::create(path).expect("creating an image");
    f.set_len(mib << 20).expect("sizing the image");
}

/// The run-time API's rarer requests, SIGUSR1, a log and metrics into FIFOs,
/// and SIGINT, all under `--seccomp on`, against a VM with a network card
/// (a TAP in a namespace of its own) and a drive.
#[test]
fn the_rare_paths_run_under_seccomp_on() {
    if !require(&[Need::Kvm, Need::Root, Need::Tun]) {
        return;
    }
    let ns = NetNs::new("seccomp-rare", "tap0", "10.0.9.1/24").unwrap();
    let kernel = halting_kernel("rare");
    let sock = tmp("rare.sock");
    let (metrics, log) = (tmp("rare-metrics.fifo"), tmp("rare-log.fifo"));
    let (disk_a, disk_b, held) = (tmp("a.img"), tmp("b.img"), tmp("held.img"));
    let _ = std::fs::remove_file(&sock);
    mkfifo(&metrics);
    mkfifo(&log);
    image(&disk_a, 1);
    image(&disk_b, 2);
    image(&held, 1);
    let metrics_text = fifo_collector(&metrics);
    let log_text = fifo_collector(&log);
    let mut vm = Vm::spawn(
        &halting_vm(
            &kernel,
            &[
                "--api-sock",
                sock.to_str().unwrap(),
                "--tap",
                "tap0",
                "--disk",
                &format!("path={},id=scratch", disk_a.display()),
                "--metrics",
                metrics.to_str().unwrap(),
                "--metrics-interval",
                "1",
                "--log-path",
                log.to_str().unwrap(),
                "--log-level",
                "debug",
                "--id",
                "rare-vm",
            ],
        ),
        Some(&ns.name),
    )
    .unwrap();
    let pid = vm.pid();
    wait_until_running(&vm);
    request(&sock, "GET", "/", "", 200);
    // Pause and resume, twice, with a stop in between.
    for _ in 0..2 {
        request(&sock, "PATCH", "/vm", r#"{"state": "Paused"}"#, 204);
        if let Err(why) = stop_and_continue(pid, 3) {
            fail(&mut vm, &why);
        }
        request(&sock, "PATCH", "/vm", r#"{"state": "Paused"}"#, 204);
        request(&sock, "PATCH", "/vm", r#"{"state": "Resumed"}"#, 204);
    }
    // Metrics on request and on SIGUSR1.
    request(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "FlushMetrics"}"#,
        204,
    );
    vm.signal("USR1");
    // A card's limiter made live, then turned off; a drive's image swapped
    // and its limiter made; the guest pressing Ctrl-Alt-Del (a halted guest
    // ignores it).
    request(
        &sock,
        "PATCH",
        "/network-interfaces/net0",
        r#"{"iface_id": "net0", "rx_rate_limiter": {"ops": {"size": 10, "refill_time": 100}},
            "tx_rate_limiter": {"bandwidth": {"size": 100000, "refill_time": 100}}}"#,
        204,
    );
    request(
        &sock,
        "PATCH",
        "/network-interfaces/net0",
        r#"{"iface_id": "net0", "rx_rate_limiter": {"ops": {"size": 0, "refill_time": 100}}}"#,
        204,
    );
    request(
        &sock,
        "PATCH",
        "/drives/scratch",
        &format!(
            r#"{{"drive_id": "scratch", "path_on_host": "{}",
                "rate_limiter": {{"ops": {{"size": 50, "refill_time": 100}}}}}}"#,
            disk_b.display()
        ),
        204,
    );
    request(
        &sock,
        "PUT",
        "/actions",
        r#"{"action_type": "SendCtrlAltDel"}"#,
        204,
    );
    // Refused: a missing image, a directory, an image another holds, an
    // unknown card, a request of the wrong phase, a bad body.
    let _lock = hold_lock(&held);
    for (method, path, body) in [
        (
            "PATCH",
            "/drives/scratch",
            r#"{"drive_id": "scratch", "path_on_host": "/nonexistent/x.img"}"#.to_string(),
        ),
        (
            "PATCH",
            "/drives/scratch",
            format!(
                r#"{{"drive_id": "scratch", "path_on_host": "{}"}}"#,
                std::env::temp_dir().display()
            ),
        ),
        (
            "PATCH",
            "/drives/scratch",
            format!(
                r#"{{"drive_id": "scratch", "path_on_host": "{}"}}"#,
                held.display()
            ),
        ),
        (
            "PATCH",
            "/network-interfaces/eth9",
            r#"{"iface_id": "eth9"}"#.to_string(),
        ),
        (
            "PUT",
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 64}"#.to_string(),
        ),
        ("PATCH", "/vm", r#"{"state": "Sleeping"}"#.to_string()),
        ("PUT", "/actions", "{not json".to_string()),
    ] {
        let answer = request(&sock, method, path, &body, 400);
        assert!(answer.contains("fault_message"), "{answer}");
    }
    let config = request(&sock, "GET", "/vm/config", "", 200);
    assert!(
        config.contains(&disk_b.display().to_string()),
        "the swap did not land: {config}"
    );
    // A line on the metrics timer, then SIGINT, a stop signal like SIGTERM.
    std::thread::sleep(Duration::from_millis(1500));
    end_with(&mut vm, "INT", 0);
    let metrics_lines = parse_metrics_lines(&metrics_text.join().unwrap());
    assert!(
        metrics_lines.len() >= 3,
        "{} metrics lines",
        metrics_lines.len()
    );
    for line in &metrics_lines {
        assert_eq!(line["id"], "rare-vm", "{line}");
        assert!(
            line["net0"].is_object() && line["scratch"].is_object(),
            "{line}"
        );
    }
    let log_text = log_text.join().unwrap();
    assert!(
        log_text.contains("[rare-vm]") && log_text.contains("DEBUG"),
        "the log FIFO got no debug lines:\n{log_text}"
    );
    for p in [&sock, &metrics, &log, &disk_a, &disk_b, &held, &kernel] {
        let _ = std::fs::remove_file(p);
    }
}
