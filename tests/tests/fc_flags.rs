// SPDX-License-Identifier: Apache-2.0
//! Every flag of Firecracker 1.17's `--help`, given to minivmm, and the
//! effect each has (no guest boots here; the one boot with the launcher's
//! flags is in `fc_api.rs`):
//!
//! - `--help` lists every Firecracker flag, and minivmm's own spelling beside
//!   where one differs (`--level`/`--log-level`, `--metrics-path`/`--metrics`);
//! - the API flags: no flag at all serves the API on `/run/firecracker.socket`
//!   (seen in a private mount namespace); `--http-api-max-payload-size` moves
//!   the body limit both ways; `--metrics-path` set the metrics up, so
//!   `PUT /metrics` is refused;
//! - the filters: `--no-seccomp` leaves every thread unfiltered, the default
//!   filters the API thread; `--seccomp-filter` installs the file's filters
//!   (a call its `api` filter traps ends minivmm with 148, naming it), a bad
//!   file is one line, and it conflicts with `--no-seccomp`;
//! - `--enable-pci` prints one warning line; `--snapshot-version` prints
//!   minivmm's snapshot layout version and `--describe-snapshot` refuses a
//!   file that is no snapshot;
//!   `--mmds-size-limit` and the payload limit refuse values out of range;
//!   `--module`, `--level` with Firecracker's names, `--show-level` and
//!   `--show-log-origin` are taken (their effect on log lines is checked by
//!   the logger's unit tests and the boot in `fc_api.rs`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use minivmm_tests::fc_paths::request;
use minivmm_tests::{minivmm_bin, require, threads_of, Need};

/// The flags Firecracker 1.17's `--help` lists (its `src/firecracker/src/main.rs`).
const FIRECRACKER_FLAGS: [&str; 23] = [
    "api-sock",
    "id",
    "seccomp-filter",
    "no-seccomp",
    "start-time-us",
    "start-time-cpu-us",
    "parent-cpu-time-us",
    "config-file",
    "metadata",
    "no-api",
    "log-path",
    "level",
    "module",
    "show-level",
    "show-log-origin",
    "metrics-path",
    "boot-timer",
    "version",
    "snapshot-version",
    "describe-snapshot",
    "http-api-max-payload-size",
    "mmds-size-limit",
    "enable-pci",
];

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minivmm-fcflags-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(args: &[&str]) -> Output {
    Command::new(minivmm_bin())
        .args(args)
        .output()
        .expect("running minivmm")
}

/// A minivmm this test started, killed if the test fails before it ends it.
struct Served(Option<Child>);

impl Served {
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    fn take(mut self) -> Child {
        self.0.take().expect("taken once")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// minivmm serving the API at `sock`, with `args` beside.
fn serve(sock: &Path, args: &[&str]) -> Served {
    let child = Command::new(minivmm_bin())
        .arg("--api-sock")
        .arg(sock)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut served = Served(Some(child));
    if let Some(c) = served.0.as_mut() {
        wait_for(sock, c);
    }
    served
}

fn wait_for(sock: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !sock.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("minivmm ended before {} appeared: {status}", sock.display());
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops `served` with SIGTERM; its status and stderr.
fn stop(served: Served) -> (Option<i32>, String) {
    let child = served.take();
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn one_line_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("minivmm: error: "), "{err}");
    assert!(err.contains(needle), "want '{needle}' in '{err}'");
}

#[test]
fn help_lists_every_firecracker_flag_and_minivmms_spelling_beside() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in FIRECRACKER_FLAGS {
        assert!(
            help.contains(&format!("--{flag}")),
            "--help lacks --{flag}:\n{help}"
        );
    }
    // Both spellings, in the entry of one flag (clap lists the alias under it).
    for (ours, theirs) in [("--log-level", "--level"), ("--metrics", "--metrics-path")] {
        let entry: Vec<&str> = help
            .lines()
            .skip_while(|l| !l.trim_start().starts_with(&format!("{ours} ")))
            .take_while(|l| !l.trim().is_empty() || l.len() > 1)
            .take(6)
            .collect();
        assert!(
            entry
                .iter()
                .any(|l| l.contains(&format!("[alias: {theirs}]"))),
            "no {theirs} beside {ours}: {entry:?}\n{help}"
        );
    }
    // Firecracker's level names are taken, in any case.
    for level in [
        "Error", "Warning", "Info", "Debug", "Trace", "Off", "warning",
    ] {
        one_line_error(
            &run(&["--level", level, "--no-api", "--kernel", "/nonexistent/k"]),
            "/nonexistent/k",
        );
    }
    one_line_error(&run(&["--level", "Loud", "--kernel", "/k"]), "Loud");
}

#[test]
fn no_flag_at_all_serves_the_api_on_firecrackers_default_socket() {
    if !require(&[Need::Root]) {
        return;
    }
    // A private /run, so the host's is never touched.
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs none /run && exec {}",
            minivmm_bin().display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Through the namespace's root: /proc/PID/root/run/firecracker.socket.
    let sock = PathBuf::from(format!("/proc/{}/root/run/firecracker.socket", child.id()));
    let mut child = Served(Some(child));
    if let Some(c) = child.0.as_mut() {
        wait_for(&sock, c);
    }
    let (status, body) = request(&sock, "GET", "/", None).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"state\":\"Not started\""), "{body}");
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn the_payload_limit_moves_both_ways() {
    let dir = scratch("payload");
    // A body of 60,000 bytes: over Firecracker's default of 51,200.
    let big = format!(
        r#"{{"kernel_image_path":"/nonexistent","boot_args":"{}"}}"#,
        "x".repeat(60_000)
    );
    let sock = dir.join("default.sock");
    let child = serve(&sock, &[]);
    let (status, body) = request(&sock, "PUT", "/boot-source", Some(&big)).unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("exceeds the limit of 51200 bytes"), "{body}");
    stop(child);
    // Raised: the same body is read, and refused only for its kernel.
    let sock = dir.join("raised.sock");
    let child = serve(&sock, &["--http-api-max-payload-size", "100000"]);
    let (status, body) = request(&sock, "PUT", "/boot-source", Some(&big)).unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("/nonexistent"), "{body}");
    stop(child);
    // Lowered: a small body is too much.
    let sock = dir.join("lowered.sock");
    let child = serve(&sock, &["--http-api-max-payload-size", "16"]);
    let (status, body) = request(
        &sock,
        "PUT",
        "/machine-config",
        Some(r#"{"vcpu_count":1,"mem_size_mib":128}"#),
    )
    .unwrap();
    assert_eq!(status, 400);
    assert!(body.contains("exceeds the limit of 16 bytes"), "{body}");
    stop(child);
    for (flag, value) in [
        ("--http-api-max-payload-size", "0"),
        ("--mmds-size-limit", "0"),
        ("--mmds-size-limit", "lots"),
    ] {
        one_line_error(&run(&[flag, value, "--kernel", "/k"]), flag);
    }
    // Taken in range (the MMDS code reads it).
    one_line_error(
        &run(&[
            "--mmds-size-limit",
            "4096",
            "--no-api",
            "--kernel",
            "/nonexistent/k",
        ]),
        "/nonexistent/k",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn metrics_set_up_by_the_flag_are_not_set_up_again() {
    let dir = scratch("metrics");
    let sock = dir.join("api.sock");
    let m = dir.join("m.json");
    let child = serve(&sock, &["--metrics-path", m.to_str().unwrap()]);
    let body = format!(
        r#"{{"metrics_path":"{}"}}"#,
        dir.join("other.json").display()
    );
    let (status, text) = request(&sock, "PUT", "/metrics", Some(&body)).unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("--metrics-path"), "{text}");
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `Seccomp:` mode of minivmm's API thread once it is `want`, or what
/// it is after 10 s: the socket is bound just before the thread starts, and
/// the thread installs its filter as its first act.
fn api_thread_mode(pid: u32, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mode = threads_of(pid)
            .into_iter()
            .find(|(name, _)| name == "fc_api")
            .map(|(_, mode)| mode)
            .unwrap_or_default();
        if mode == want || Instant::now() >= deadline {
            return mode;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn seccomp_flags_choose_the_filters() {
    let dir = scratch("seccomp");
    let sock = dir.join("default.sock");
    let child = serve(&sock, &[]);
    assert_eq!(api_thread_mode(child.id(), "2"), "2");
    stop(child);
    let sock = dir.join("none.sock");
    let child = serve(&sock, &["--no-seccomp"]);
    assert!(request(&sock, "GET", "/", None).is_some_and(|(s, _)| s == 200));
    assert_eq!(api_thread_mode(child.id(), "0"), "0");
    assert!(request(&sock, "GET", "/", None).is_some_and(|(s, _)| s == 200));
    stop(child);
    // A Firecracker filter file whose api filter traps accept4: the first
    // connection ends minivmm with 148, the line naming the call.
    let file = dir.join("filters.json");
    std::fs::write(
        &file,
        r#"{
          "vmm": {"default_action": "allow", "filter_action": "trap", "filter": []},
          "vcpu": {"default_action": "allow", "filter_action": "trap", "filter": []},
          "api": {"default_action": "allow", "filter_action": "trap",
                  "filter": [{"syscall": "accept4", "comment": "to see the file's filter act"}]}
        }"#,
    )
    .unwrap();
    let sock = dir.join("file.sock");
    let child = serve(&sock, &["--seccomp-filter", file.to_str().unwrap()]);
    assert_eq!(api_thread_mode(child.id(), "2"), "2");
    let _ = std::os::unix::net::UnixStream::connect(&sock);
    let out = child.take().wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(148), "{err}");
    assert!(err.contains("accept4"), "{err}");
    // A compiled (non-JSON) file, and a file with a category missing.
    std::fs::write(dir.join("compiled.bpf"), [3u8, b'v', b'm', b'm', 0, 1]).unwrap();
    one_line_error(
        &run(&[
            "--seccomp-filter",
            dir.join("compiled.bpf").to_str().unwrap(),
            "--kernel",
            "/k",
        ]),
        "not JSON",
    );
    std::fs::write(
        dir.join("two.json"),
        r#"{"vmm": {"default_action": "allow", "filter_action": "trap", "filter": []},
            "api": {"default_action": "allow", "filter_action": "trap", "filter": []}}"#,
    )
    .unwrap();
    one_line_error(
        &run(&[
            "--seccomp-filter",
            dir.join("two.json").to_str().unwrap(),
            "--kernel",
            "/k",
        ]),
        "'vcpu' is missing",
    );
    one_line_error(
        &run(&[
            "--seccomp-filter",
            file.to_str().unwrap(),
            "--no-seccomp",
            "--kernel",
            "/k",
        ]),
        "cannot be used with",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn enable_pci_warns_once_and_snapshot_queries_answer() {
    let dir = scratch("pci");
    let sock = dir.join("api.sock");
    let child = serve(&sock, &["--enable-pci"]);
    let (code, err) = stop(child);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("minivmm: warning: --enable-pci:") && err.contains("virtio-MMIO"),
        "{err}"
    );
    let out = run(&["--snapshot-version"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with('v'));
    let out = run(&["--describe-snapshot", "/nonexistent/vm.state"]);
    assert_eq!(out.status.code(), Some(1));
    // The logger's flags are taken (with a file that does not boot).
    one_line_error(
        &run(&[
            "--no-api",
            "--kernel",
            "/nonexistent/k",
            "--module",
            "vmm::api",
            "--show-level",
            "--show-log-origin",
            "--level",
            "Debug",
        ]),
        "/nonexistent/k",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
