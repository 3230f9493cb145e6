// SPDX-License-Identifier: Apache-2.0
//! Snapshots through Firecracker's API: `PUT /snapshot/create` on a paused
//! VM and `PUT /snapshot/load` in a fresh minivmm, driven with `curl
//! --unix-socket` as the README shows them.
//!
//! - Without KVM: every refused request is a `400` with one line (load
//!   with a Uffd backend, after a configuration, of a file that is no
//!   snapshot; create before start); `--snapshot-version`
//!   and `--describe-snapshot`.
//! - With KVM, a guest that needs no boot (a loop that prints a console
//!   line and counts): create refused while running; paused, snapshotted,
//!   the process killed; a new one loads it paused, resumes, and the guest
//!   goes on printing where it stopped; the files are not changed by a
//!   load, so a second load works; a corrupted state file, another
//!   version, a short memory file and a missing one, and a vsock override
//!   for a VM without vsock, are refused with one line. Its console has a
//!   bucket of two bytes an hour, which its first lines spend: loaded into
//!   a process whose console (`PUT /serial` before the load) has the same
//!   bucket, the guest's next bytes are dropped (the metrics count them)
//!   and none printed, where a fresh bucket would print two lines.
//! - With KVM, a guest without a boot whose count is in memory, started
//!   with `track_dirty_pages` (never restored): a Full snapshot, then two
//!   Diffs of one page each; both rebased in order onto a copy of the Full
//!   memory equal, byte for byte, a Full snapshot of the second Diff's
//!   moment, and the guest loaded from them counts on from its last count.
//!   That restored VM, loaded again with `track_dirty_pages`, takes two
//!   Diffs of its own, which rebase onto its loaded memory and load.
//! - With KVM and root, the same guest under the jail (`--jail`, as
//!   `nobody`): Full and Diff snapshots at the jail's paths (a host path
//!   is not found), made by the jail's uid; rebased outside, the files load
//!   in a new jailed minivmm, every thread under its filter, and its guest
//!   counts on.
//! - With KVM, root and TUN, the project's guest booted from its disk and
//!   serving, with `track_dirty_pages` and a vsock device: a file written
//!   to its disk; a TCP connection to its mvperf server opened and used;
//!   paused, Full snapshot; resumed, used, paused, Diff; again, a second
//!   Diff (each far smaller than memory), then a request sent on the held
//!   connection while the VM is paused; minivmm killed. The two Diffs
//!   rebased in order onto a copy of the Full memory load into a new
//!   minivmm on the same TAP with `resume_vm` and another vsock socket
//!   (`vsock_override`): the held connection gets its answer (the host's
//!   TCP retransmits) and goes on, and the guest's server counts every
//!   transaction made on it, before and after; the vsock device sent one
//!   transport reset (its metrics) and a `CONNECT` on the new socket
//!   reaches the guest's server, VSOCK_RR runs. Then the Full snapshot
//!   loads (on the saved vsock socket) and the guest answers ping and an
//!   mvperf TCP_RR through the same TAP, the vsock device reset and
//!   reached again, its console goes on (Ctrl-Alt-Del reaches its init,
//!   which reboots: minivmm exits 0), the file is on the disk; MMDS's
//!   configuration came back, its store is the new process's (filled
//!   before that load, empty at the next), the drive's and entropy
//!   device's buckets loaded. That restore tracks dirty pages and takes a
//!   Diff snapshot; merged onto a copy of the Full memory file
//!   (`--rebase-snap`), it loads, and that guest answers ping, TCP_RR and
//!   vsock too. The load's answer time, the first ping, the create times
//!   and sizes are printed as `FIGURE` lines (BENCHMARKS.md).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use minivmm_tests::{
    cli_args, debugfs_cat, disk_copy, disk_test_content, guest_image_if, jail_args, last_metrics,
    metric, minivmm_bin, mvperf_bin, write_counting_kernel, write_ticking_kernel, Need, NetNs,
    Patience, Vm, COUNT_BASE, DISK_TEST_FILE, DISK_WRITE_OK, JAIL_ID,
};
use serde_json::{json, Value};

const HOST_IP: &str = "10.0.9.1";
const GUEST_IP: &str = "10.0.9.2";
/// As the other boot tests: a boot is 30 to 120 s on a quiet PVM host.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

/// One request with curl; the status and the body.
fn curl(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    minivmm_tests::api_curl(sock, method, path, body)
}

/// A request that must be answered `204`.
fn ok(sock: &Path, method: &str, path: &str, body: Value) {
    let (code, text) = curl(sock, method, path, Some(&body.to_string()));
    assert_eq!((code, text.as_str()), (204, ""), "{method} {path} {body}");
}

/// A request that must be refused with one `fault_message` line holding
/// `needle`.
fn refused(sock: &Path, method: &str, path: &str, body: Value, needle: &str) {
    let (code, text) = curl(sock, method, path, Some(&body.to_string()));
    assert_eq!(code, 400, "{method} {path} {body} was not refused: {text}");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let msg = v["fault_message"].as_str().expect("fault_message");
    assert!(!msg.contains('\n'), "{msg:?}");
    assert!(
        msg.contains(needle),
        "{method} {path}: '{msg}' lacks '{needle}'"
    );
}

/// A GET that must be answered `200` with JSON; the JSON.
fn get_json(sock: &Path, path: &str) -> Value {
    let (code, text) = curl(sock, "GET", path, None);
    assert_eq!(code, 200, "GET {path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {e}: {text}"))
}

fn state_of(sock: &Path) -> String {
    get_json(sock, "/")["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn wait_for_socket(sock: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sock.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A scratch directory of this test, empty.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("minivmm-snap-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// minivmm on an API socket in `dir` (inside `netns` if given).
fn api_vmm(dir: &Path, name: &str, netns: Option<&str>) -> (Vm, PathBuf) {
    let sock = dir.join(format!("{name}.sock"));
    let _ = std::fs::remove_file(&sock);
    let args = vec![
        "--api-sock".to_string(),
        sock.display().to_string(),
        "--id".into(),
        name.into(),
    ];
    let vm = Vm::spawn(&args, netns).unwrap();
    wait_for_socket(&sock);
    (vm, sock)
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

fn create_body(dir: &Path, tag: &str) -> Value {
    json!({"snapshot_type": "Full", "snapshot_path": p(&dir.join(format!("{tag}.state"))),
           "mem_file_path": p(&dir.join(format!("{tag}.mem")))})
}

fn load_body(dir: &Path, tag: &str, resume: bool) -> Value {
    json!({"snapshot_path": p(&dir.join(format!("{tag}.state"))),
           "mem_backend": {"backend_type": "File", "backend_path": p(&dir.join(format!("{tag}.mem")))},
           "resume_vm": resume})
}

fn minivmm(args: &[&str]) -> std::process::Output {
    Command::new(minivmm_bin())
        .args(args)
        .output()
        .expect("running minivmm")
}

#[test]
fn refused_requests_and_the_version_flags_need_no_kvm() {
    let dir = scratch("refused");
    let out = minivmm(&["--snapshot-version"]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "v2.0.0\n");
    let junk = dir.join("junk");
    std::fs::write(&junk, b"not a snapshot\n").unwrap();
    let out = minivmm(&["--describe-snapshot", &p(&junk)]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "minivmm: error: not a minivmm snapshot state file (no snapshot header)\n"
    );

    let (mut vm, sock) = api_vmm(&dir, "refused", None);
    let mem = p(&dir.join("mem"));
    let cases = [
        (
            json!({"snapshot_path": p(&junk), "mem_backend":
                {"backend_type": "Uffd", "backend_path": "/uffd.sock"}}),
            "Uffd memory backend is not supported by minivmm yet",
        ),
        (
            json!({"snapshot_path": p(&junk), "mem_file_path": mem}),
            "not a minivmm snapshot state file",
        ),
        (
            json!({"snapshot_path": p(&dir.join("missing")), "mem_file_path": mem}),
            "cannot read the snapshot state file",
        ),
        (
            json!({"snapshot_path": p(&junk)}),
            "mem_backend (or mem_file_path) is required",
        ),
    ];
    for (body, needle) in cases {
        refused(&sock, "PUT", "/snapshot/load", body, needle);
    }
    refused(
        &sock,
        "PUT",
        "/snapshot/create",
        create_body(&dir, "x"),
        "not allowed before the microVM is started",
    );
    // After a configuration, a load is refused: the snapshot brings its own.
    ok(
        &sock,
        "PUT",
        "/machine-config",
        json!({"vcpu_count": 1, "mem_size_mib": 64}),
    );
    refused(
        &sock,
        "PUT",
        "/snapshot/load",
        json!({"snapshot_path": p(&junk), "mem_file_path": mem}),
        "not allowed after the microVM was configured (machine-config was put)",
    );
    assert_eq!(state_of(&sock), "Not started");
    vm.terminate(Duration::from_secs(10));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// How long a test waits for the ticking guest's next lines: about a
/// second each on a quiet PVM host, far more on a loaded one (the guest's
/// kernel-mode loop is emulated); only a failing test waits this long.
const TICK_PATIENCE: Duration = Duration::from_secs(600);

/// Console lines printed so far (the ticking guest prints empty ones).
fn lines(vm: &Vm) -> usize {
    vm.console().matches('\n').count()
}

/// Waits until the console has more than `than` lines.
fn wait_lines(vm: &mut Vm, than: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if lines(vm) > than {
            return true;
        }
        if vm.exited().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_guest_without_a_boot_goes_on_after_a_load_and_the_files_load_twice() {
    if !minivmm_tests::require(&[Need::Kvm]) {
        return;
    }
    let dir = scratch("tick");
    let kernel = dir.join("ticking.elf");
    write_ticking_kernel(&kernel).unwrap();
    let (mut vm, sock) = api_vmm(&dir, "tick-a", None);
    ok(
        &sock,
        "PUT",
        "/machine-config",
        json!({"vcpu_count": 1, "mem_size_mib": 64}),
    );
    ok(
        &sock,
        "PUT",
        "/boot-source",
        json!({"kernel_image_path": p(&kernel)}),
    );
    // Buckets that go into the state file: an entropy device's (no driver
    // takes it up: it is saved full) and the console's, two bytes an hour,
    // which the guest's first two lines spend.
    ok(
        &sock,
        "PUT",
        "/entropy",
        json!({"rate_limiter": {"bandwidth":
            {"size": 1000, "one_time_burst": 100, "refill_time": 100}}}),
    );
    ok(&sock, "PUT", "/serial", console_bucket());
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "InstanceStart"}),
    );
    assert!(wait_lines(&mut vm, 1, TICK_PATIENCE), "{}", vm.report());
    refused(
        &sock,
        "PUT",
        "/snapshot/create",
        create_body(&dir, "a"),
        "must be paused",
    );
    refused(
        &sock,
        "PUT",
        "/snapshot/load",
        load_body(&dir, "a", true),
        "not allowed after the microVM started",
    );
    ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
    let t = Instant::now();
    ok(&sock, "PUT", "/snapshot/create", create_body(&dir, "a"));
    eprintln!(
        "FIGURE tick create (64 MiB): {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    // A VM started without track_dirty_pages has no Diff to give.
    refused(
        &sock,
        "PUT",
        "/snapshot/create",
        json!({"snapshot_type": "Diff", "snapshot_path": p(&dir.join("x.state")),
               "mem_file_path": p(&dir.join("x.mem"))}),
        "track_dirty_pages",
    );
    vm.signal("KILL");
    vm.wait_exit(Duration::from_secs(10)).expect("killed");
    let state = dir.join("a.state");
    let mem = dir.join("a.mem");
    assert_eq!(std::fs::metadata(&mem).unwrap().len(), 64 << 20);
    let out = minivmm(&["--describe-snapshot", &p(&state)]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "v2.0.0\n");
    let before = (std::fs::read(&state).unwrap(), std::fs::read(&mem).unwrap());

    for round in 0..3 {
        let (mut vm, sock) = api_vmm(&dir, &format!("tick-b{round}"), None);
        if round == 2 {
            spent_console_bucket_resumes(&dir, &mut vm, &sock);
            continue;
        }
        let t = Instant::now();
        let mut body = load_body(&dir, "a", false);
        // The first load tracks dirty pages, for a Diff snapshot below.
        body["track_dirty_pages"] = json!(round == 0);
        // Its console is this process's: stdout, without the saved bucket.
        ok(&sock, "PUT", "/snapshot/load", body);
        eprintln!(
            "FIGURE tick load answered: {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
        assert_eq!(state_of(&sock), "Paused");
        refused(
            &sock,
            "PUT",
            "/snapshot/load",
            load_body(&dir, "a", true),
            "after the microVM",
        );
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(lines(&vm), 0, "a paused restored guest ran");
        ok(&sock, "PATCH", "/vm", json!({"state": "Resumed"}));
        assert_eq!(state_of(&sock), "Running");
        assert!(
            wait_lines(&mut vm, 1, TICK_PATIENCE),
            "round {round}: the restored guest printed nothing\n{}",
            vm.report()
        );
        if round == 0 {
            diff_and_rebase(&dir, &mut vm, &sock);
        }
        vm.terminate(Duration::from_secs(10));
        assert!(
            (std::fs::read(&state).unwrap(), std::fs::read(&mem).unwrap()) == before,
            "a load changed the snapshot files"
        );
    }

    // Damaged files are refused before anything runs.
    let text = std::fs::read(&state).unwrap();
    let mut flipped = text.clone();
    let at = flipped.len() - 10;
    flipped[at] ^= 0x20;
    std::fs::write(dir.join("bad.state"), &flipped).unwrap();
    std::fs::copy(&mem, dir.join("bad.mem")).unwrap();
    let version = String::from_utf8(text.clone())
        .unwrap()
        .replacen("\"2.0.0\"", "\"9.0.0\"", 1);
    std::fs::write(dir.join("v9.state"), version).unwrap();
    std::fs::copy(&mem, dir.join("v9.mem")).unwrap();
    std::fs::write(dir.join("short.state"), &text).unwrap();
    std::fs::write(dir.join("short.mem"), vec![0u8; 4096]).unwrap();
    std::fs::write(dir.join("nomem.state"), &text).unwrap();
    let (mut vm, sock) = api_vmm(&dir, "tick-c", None);
    let mut vsock = load_body(&dir, "a", true);
    vsock["vsock_override"] = json!({"uds_path": p(&dir.join("v.sock"))});
    refused(
        &sock,
        "PUT",
        "/snapshot/load",
        vsock,
        "the snapshot has no vsock device",
    );
    for (tag, needle) in [
        ("bad", "the snapshot state file is corrupted: CRC-32"),
        (
            "v9",
            "the snapshot state file is version 9.0.0; this minivmm reads only version 2.0.0",
        ),
        ("short", "the memory file holds 4096 bytes"),
        ("nomem", "cannot open the memory file"),
    ] {
        refused(
            &sock,
            "PUT",
            "/snapshot/load",
            load_body(&dir, tag, true),
            needle,
        );
    }
    assert_eq!(state_of(&sock), "Not started");
    vm.terminate(Duration::from_secs(10));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// How long the counting guest may print nothing before a wait for it
/// fails, in minivmm's own time (a line is about a second of it on a PVM
/// host, far less on hardware virtualization).
const COUNT_STALL: Duration = Duration::from_secs(120);

/// Waits, following the console, until the counting guest of `vm` has
/// printed `more` counts beyond those it had.
fn wait_counts(vm: &mut Vm, more: usize, what: &str) {
    let want = lines(vm) + more;
    let r = vm.wait_until(what, Patience::of(COUNT_STALL), &[], |c| {
        c.matches('\n').count() >= want
    });
    assert!(r.is_ok(), "{what}: {r:?}\n{}", vm.report());
}

/// The counting guest's last count on `console` (its last character that
/// is not a newline).
fn last_count(console: &str) -> u8 {
    console
        .bytes()
        .rev()
        .find(|&b| b != b'\n')
        .expect("a count on the console")
}

/// The count the counting guest prints after `c`.
fn next_count(c: u8) -> u8 {
    COUNT_BASE + (c - COUNT_BASE + 1) % 64
}

/// A snapshot of the paused VM of `sock`: `tag.state` and `tag.mem`;
/// returns the memory file's bytes of data (a Diff's are its dirty pages).
fn snapshot(sock: &Path, dir: &Path, tag: &str, kind: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut body = create_body(dir, tag);
    body["snapshot_type"] = json!(kind);
    let t = Instant::now();
    ok(sock, "PUT", "/snapshot/create", body);
    let meta = std::fs::metadata(dir.join(format!("{tag}.mem"))).unwrap();
    eprintln!(
        "FIGURE {kind} snapshot '{tag}': create {:.1} ms, {} bytes of data in a {} byte file",
        t.elapsed().as_secs_f64() * 1e3,
        meta.blocks() * 512,
        meta.len()
    );
    meta.blocks() * 512
}

/// `minivmm --rebase-snap`: the Diff memory file `diff` copied onto `base`.
fn rebase(base: &Path, diff: &Path) {
    let out = minivmm(&[
        "--rebase-snap",
        "--base-file",
        &p(base),
        "--diff-file",
        &p(diff),
    ]);
    assert!(
        out.status.success(),
        "rebasing {} onto {}: {}",
        diff.display(),
        base.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `track_dirty_pages` on a VM that was booted, never restored: Full, then
/// two Diffs, each of a few pages; both rebased in order onto a copy of the
/// Full memory give exactly the memory a Full snapshot of that moment
/// holds, and the guest loaded from them counts on from its last count
/// (its count is in memory, written between every two snapshots).
#[test]
fn a_booted_vm_tracking_dirty_pages_takes_diffs_that_rebase_in_order() {
    if !minivmm_tests::require(&[Need::Kvm]) {
        return;
    }
    let dir = scratch("count");
    let kernel = dir.join("counting.elf");
    write_counting_kernel(&kernel).unwrap();
    let (mut vm, sock) = api_vmm(&dir, "count-a", None);
    ok(
        &sock,
        "PUT",
        "/machine-config",
        json!({"vcpu_count": 1, "mem_size_mib": 64, "track_dirty_pages": true}),
    );
    let machine = get_json(&sock, "/machine-config");
    assert_eq!(machine["track_dirty_pages"], json!(true), "{machine}");
    ok(
        &sock,
        "PUT",
        "/boot-source",
        json!({"kernel_image_path": p(&kernel)}),
    );
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "InstanceStart"}),
    );
    wait_counts(&mut vm, 2, "the first counts");
    let cfg = get_json(&sock, "/vm/config");
    assert_eq!(cfg["machine-config"]["track_dirty_pages"], json!(true));

    ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
    assert_eq!(snapshot(&sock, &dir, "base", "Full"), 64 << 20);
    for diff in ["d1", "d2"] {
        ok(&sock, "PATCH", "/vm", json!({"state": "Resumed"}));
        wait_counts(&mut vm, 1, &format!("a count before {diff}"));
        ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
        let data = snapshot(&sock, &dir, diff, "Diff");
        // The count's page at least; far less than the 64 MiB.
        assert!(data > 0 && data < 1 << 20, "{diff}: {data} bytes of data");
        assert_eq!(
            std::fs::metadata(dir.join(format!("{diff}.mem")))
                .unwrap()
                .len(),
            64 << 20
        );
    }
    // The same paused moment as d2, whole.
    snapshot(&sock, &dir, "whole", "Full");
    let console = vm.console();
    vm.signal("KILL");
    vm.wait_exit(Duration::from_secs(10)).expect("killed");

    let chain = dir.join("chain.mem");
    std::fs::copy(dir.join("base.mem"), &chain).unwrap();
    rebase(&chain, &dir.join("d1.mem"));
    rebase(&chain, &dir.join("d2.mem"));
    let whole = std::fs::read(dir.join("whole.mem")).unwrap();
    assert!(
        std::fs::read(dir.join("base.mem")).unwrap() != whole,
        "the guest wrote nothing after the Full snapshot"
    );
    assert!(
        std::fs::read(&chain).unwrap() == whole,
        "the Full memory with both Diffs rebased in order is not the memory at the second Diff"
    );
    std::fs::copy(dir.join("d2.state"), dir.join("chain.state")).unwrap();
    let (mut restored, rsock) = api_vmm(&dir, "count-b", None);
    ok(
        &rsock,
        "PUT",
        "/snapshot/load",
        load_body(&dir, "chain", true),
    );
    // Tracking is the load's to say; this one did not ask.
    let cfg = get_json(&rsock, "/vm/config");
    assert_eq!(cfg["machine-config"]["track_dirty_pages"], json!(false));
    wait_counts(
        &mut restored,
        1,
        "a count after the load of the rebased Diffs",
    );
    counts_on(&restored, &console);
    restored.terminate(Duration::from_secs(10));
    diffs_of_a_restored_vm(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Asserts that the first count `vm` printed is the one after the last
/// count on `before` (the console of the VM its snapshot was taken from).
fn counts_on(vm: &Vm, before: &str) {
    let after = vm.console();
    let first = after.bytes().find(|&b| b != b'\n').expect("a count");
    assert_eq!(
        first as char,
        next_count(last_count(before)) as char,
        "the guest did not count on from its last count"
    );
}

/// A restored VM's own Diffs: `chain` (a Full memory with two Diffs
/// rebased onto it) loaded with `track_dirty_pages`, two Diffs taken of
/// it, each a few pages; rebased in order onto a copy of `chain.mem`, they
/// load, and that guest counts on from the second Diff's moment.
fn diffs_of_a_restored_vm(dir: &Path) {
    let (mut vm, sock) = api_vmm(dir, "count-c", None);
    let mut body = load_body(dir, "chain", true);
    body["track_dirty_pages"] = json!(true);
    ok(&sock, "PUT", "/snapshot/load", body);
    let cfg = get_json(&sock, "/vm/config");
    assert_eq!(cfg["machine-config"]["track_dirty_pages"], json!(true));
    for diff in ["r1", "r2"] {
        if diff != "r1" {
            ok(&sock, "PATCH", "/vm", json!({"state": "Resumed"}));
        }
        wait_counts(
            &mut vm,
            1,
            &format!("a count of the restored VM before {diff}"),
        );
        ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
        let data = snapshot(&sock, dir, diff, "Diff");
        assert!(data > 0 && data < 1 << 20, "{diff}: {data} bytes of data");
    }
    // Paused at r2's moment.
    let console = vm.console();
    vm.signal("KILL");
    vm.wait_exit(Duration::from_secs(10)).expect("killed");
    let again = dir.join("again.mem");
    std::fs::copy(dir.join("chain.mem"), &again).unwrap();
    rebase(&again, &dir.join("r1.mem"));
    rebase(&again, &dir.join("r2.mem"));
    std::fs::copy(dir.join("r2.state"), dir.join("again.state")).unwrap();
    let (mut restored, rsock) = api_vmm(dir, "count-d", None);
    ok(
        &rsock,
        "PUT",
        "/snapshot/load",
        load_body(dir, "again", true),
    );
    wait_counts(
        &mut restored,
        1,
        "a count after the load of the restored VM's Diffs",
    );
    counts_on(&restored, &console);
    restored.terminate(Duration::from_secs(10));
}

/// A jailed minivmm (`--jail dir`, as `nobody`, a cgroup leaf `id` under
/// `parent`) on the API socket `/ID.sock` of its jail; the socket's host
/// path.
fn jailed_vmm(dir: &Path, id: &str, parent: &str) -> (Vm, PathBuf) {
    let mut args = jail_args(dir, id, parent);
    args.extend(cli_args(&["--api-sock", &format!("/{id}.sock")]));
    let vm = Vm::spawn(&args, None).unwrap();
    let sock = dir.join(format!("{id}.sock"));
    wait_for_socket(&sock);
    (vm, sock)
}

/// Snapshots under the jail, as Firecracker's jailed users take them:
/// every path in the requests is the jail's (a host path is not found),
/// the files are made there by the jail's uid, KVM's dirty log is read
/// and the files written by threads under their filters; a new jailed
/// minivmm on the same directory maps the memory file (the Full one with
/// the Diff rebased onto it outside, owned by root, read-only to the jail)
/// and loads the state, and its guest counts on.
#[test]
fn a_jailed_minivmm_snapshots_and_loads_inside_its_jail() {
    use std::os::unix::fs::MetadataExt;
    if !minivmm_tests::require(&[Need::Kvm, Need::Root]) {
        return;
    }
    let dir = scratch("jail");
    write_counting_kernel(&dir.join("counting.elf")).unwrap();
    std::os::unix::fs::chown(&dir, Some(JAIL_ID), Some(JAIL_ID)).unwrap();
    let parent = format!("minivmm-test-snapjail-{}", std::process::id());
    let (mut vm, sock) = jailed_vmm(&dir, "jail-a", &parent);
    ok(
        &sock,
        "PUT",
        "/machine-config",
        json!({"vcpu_count": 1, "mem_size_mib": 64, "track_dirty_pages": true}),
    );
    ok(
        &sock,
        "PUT",
        "/boot-source",
        json!({"kernel_image_path": "/counting.elf"}),
    );
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "InstanceStart"}),
    );
    wait_counts(&mut vm, 1, "the jailed guest's first count");
    ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
    refused(
        &sock,
        "PUT",
        "/snapshot/create",
        create_body(&dir, "host"),
        "No such file",
    );
    let jail_body = |tag: &str, kind: &str| {
        json!({"snapshot_type": kind, "snapshot_path": format!("/{tag}.state"),
               "mem_file_path": format!("/{tag}.mem")})
    };
    ok(&sock, "PUT", "/snapshot/create", jail_body("a", "Full"));
    ok(&sock, "PATCH", "/vm", json!({"state": "Resumed"}));
    wait_counts(&mut vm, 1, "a jailed count before the Diff");
    ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
    ok(&sock, "PUT", "/snapshot/create", jail_body("d", "Diff"));
    let console = vm.console();
    vm.terminate(Duration::from_secs(30));
    for file in ["a.state", "a.mem", "d.state", "d.mem"] {
        let meta = std::fs::metadata(dir.join(file)).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (JAIL_ID, JAIL_ID), "{file}");
    }
    let d = std::fs::metadata(dir.join("d.mem")).unwrap();
    assert!(d.blocks() * 512 < 1 << 20, "the Diff is not sparse: {d:?}");

    std::fs::copy(dir.join("a.mem"), dir.join("r.mem")).unwrap();
    rebase(&dir.join("r.mem"), &dir.join("d.mem"));
    std::fs::copy(dir.join("d.state"), dir.join("r.state")).unwrap();
    let (mut restored, rsock) = jailed_vmm(&dir, "jail-b", &parent);
    refused(
        &rsock,
        "PUT",
        "/snapshot/load",
        load_body(&dir, "r", true),
        "No such file",
    );
    ok(
        &rsock,
        "PUT",
        "/snapshot/load",
        json!({"snapshot_path": "/r.state",
               "mem_backend": {"backend_type": "File", "backend_path": "/r.mem"},
               "resume_vm": true}),
    );
    wait_counts(&mut restored, 1, "a count after the jailed load");
    counts_on(&restored, &console);
    let jailed = restored.jailed_pid().expect("the jailed minivmm");
    assert!(
        restored
            .threads()
            .iter()
            .chain(minivmm_tests::threads_of(jailed).iter())
            .all(|(_, mode)| mode == "2"),
        "a thread without its filter: {:?}",
        minivmm_tests::threads_of(jailed)
    );
    restored.terminate(Duration::from_secs(30));
    for id in ["jail-a", "jail-b"] {
        minivmm_tests::remove_cgroups(&parent, id);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The console's bucket of the ticking guest: two bytes an hour.
fn console_bucket() -> Value {
    json!({"rate_limiter": {"size": 2, "refill_time": 3_600_000}})
}

/// Bytes the console's bucket dropped, as the metrics written to `path`
/// last said.
fn dropped_bytes(sock: &Path, path: &Path) -> u64 {
    ok(
        sock,
        "PUT",
        "/actions",
        json!({"action_type": "FlushMetrics"}),
    );
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let last = text.lines().last().unwrap_or("{}");
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    v["uart"]["rate_limiter_dropped_bytes"]
        .as_u64()
        .unwrap_or(0)
}

/// A load into a process whose console has the saved bucket (`PUT
/// /serial` before the load, as Firecracker allows): the bucket the guest
/// spent before the snapshot resumes spent, so the restored guest's first
/// bytes are dropped, not printed (a fresh bucket would pass two).
fn spent_console_bucket_resumes(dir: &Path, vm: &mut Vm, sock: &Path) {
    let metrics = dir.join("tick-c.metrics");
    ok(
        sock,
        "PUT",
        "/metrics",
        json!({"metrics_path": p(&metrics), "interval_s": 0}),
    );
    ok(sock, "PUT", "/serial", console_bucket());
    ok(sock, "PUT", "/snapshot/load", load_body(dir, "a", true));
    let deadline = Instant::now() + TICK_PATIENCE;
    while dropped_bytes(sock, &metrics) == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing dropped\n{}",
            vm.report()
        );
        assert!(vm.exited().is_none(), "{}", vm.report());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(lines(vm), 0, "a spent console bucket came back full");
    vm.terminate(Duration::from_secs(10));
}

/// With the guest of `sock` running: paused, a Diff snapshot (sparse, the
/// memory file's size), resumed; the Diff rebased onto a copy of the Full
/// memory file `a.mem` loads in a new process, whose guest goes on.
fn diff_and_rebase(dir: &Path, vm: &mut Vm, sock: &Path) {
    use std::os::unix::fs::MetadataExt;
    ok(sock, "PATCH", "/vm", json!({"state": "Paused"}));
    let t = Instant::now();
    let mut diff = create_body(dir, "d");
    diff["snapshot_type"] = json!("Diff");
    ok(sock, "PUT", "/snapshot/create", diff);
    let meta = std::fs::metadata(dir.join("d.mem")).unwrap();
    eprintln!(
        "FIGURE tick Diff create: {:.1} ms, {} bytes allocated of {}",
        t.elapsed().as_secs_f64() * 1e3,
        meta.blocks() * 512,
        meta.len()
    );
    assert_eq!(meta.len(), 64 << 20);
    assert!(meta.blocks() * 512 < 8 << 20, "not sparse: {meta:?}");
    ok(sock, "PATCH", "/vm", json!({"state": "Resumed"}));
    let printed = lines(vm);
    assert!(wait_lines(vm, printed, TICK_PATIENCE), "{}", vm.report());

    std::fs::copy(dir.join("a.mem"), dir.join("r.mem")).unwrap();
    std::fs::copy(dir.join("d.state"), dir.join("r.state")).unwrap();
    let out = minivmm(&[
        "--rebase-snap",
        "--base-file",
        &p(&dir.join("r.mem")),
        "--diff-file",
        &p(&dir.join("d.mem")),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (mut rebased, rsock) = api_vmm(dir, "tick-rebased", None);
    ok(&rsock, "PUT", "/snapshot/load", load_body(dir, "r", true));
    assert!(
        wait_lines(&mut rebased, 1, TICK_PATIENCE),
        "the guest of a rebased Diff printed nothing\n{}",
        rebased.report()
    );
    rebased.terminate(Duration::from_secs(10));
}

/// MMDS on the served guest's card: V2 at an address of its own.
fn mmds_config() -> Value {
    json!({"network_interfaces": ["eth0"], "version": "V2", "ipv4_address": "169.254.170.2"})
}

/// After a load: MMDS's configuration is the snapshot's, its store the
/// process's (`store`), never the saved VM's.
fn mmds_after_load(sock: &Path, store: &Value) {
    let got = get_json(sock, "/mmds");
    assert_eq!(&got, store);
    let cfg = get_json(sock, "/vm/config");
    let mut want = mmds_config();
    want["imds_compat"] = json!(false);
    assert_eq!(cfg["mmds-config"], want);
    assert_eq!(
        cfg["drives"][0]["rate_limiter"]["ops"]["size"],
        json!(100_000)
    );
}

fn ping_until_answered(ns: &NetNs, deadline_s: u32) -> Option<Duration> {
    let t = Instant::now();
    let ok = ns
        .command("ping")
        .args([
            "-c",
            "1",
            "-i",
            "0.05",
            "-w",
            &deadline_s.to_string(),
            GUEST_IP,
        ])
        .output()
        .expect("ping")
        .status
        .success();
    ok.then(|| t.elapsed())
}

fn tcp_rr(ns: &NetNs) -> Value {
    let out = ns
        .command(mvperf_bin())
        .args([
            "-t", "TCP_RR", "-H", GUEST_IP, "-l", "3", "--grace", "60", "--json",
        ])
        .output()
        .expect("mvperf");
    assert!(
        out.status.success(),
        "TCP_RR: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("mvperf JSON")
}

/// The guest's mvperf server's port (TCP control connections and vsock).
const MVPERF_PORT: u16 = 12865;

/// How long a read from the guest may wait without progress before it
/// fails, in minivmm's own time: an emulated guest kernel under load takes
/// seconds per transaction, and the first one after a load waits for the
/// host's TCP to retransmit (its backoff doubles up to tens of seconds).
const GUEST_STALL: Duration = Duration::from_secs(180);

/// Reads from `r` (whose read timeout is short) until `done(what was
/// read)`, under a [`minivmm_tests::Watch`] over minivmm's process `pid`:
/// the wait fails after [`GUEST_STALL`] of its own time without a byte.
fn read_watched(r: &mut impl Read, pid: u32, what: &str, done: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let mut watch = minivmm_tests::Watch::new(Patience::of(GUEST_STALL), &[pid]);
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !done(&got) {
        match r.read(&mut buf) {
            Ok(0) => panic!("{what}: the connection ended after {got:?}"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("{what}: {e} after {got:?}"),
        }
        if let Err(e) = watch.check(&[got.len() as u64]) {
            panic!("{what}: {e} after {got:?}");
        }
    }
    got
}

/// Connects to `port` of the guest from inside `ns` (on a thread that
/// joined it; the socket stays there).
fn connect_in(ns: &NetNs, port: u16) -> TcpStream {
    let s = ns
        .in_thread(move || TcpStream::connect((GUEST_IP, port)))
        .join()
        .expect("the connecting thread")
        .expect("entering the namespace")
        .unwrap_or_else(|e| panic!("connecting to {GUEST_IP}:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s
}

/// A TCP_RR session with the guest's mvperf server that the test drives by
/// hand and holds open across snapshots, kills and loads (the protocol of
/// tools/netperf/README.md: a JSON request on a control connection, the
/// server's data port in its answer, 8-byte requests answered with 8
/// bytes of `0xa5` on the data connection, the server's count of
/// transactions on the control connection after a write shutdown).
struct HeldRr {
    ctrl: TcpStream,
    data: TcpStream,
    /// Requests sent.
    sent: u64,
    /// Responses read.
    answered: u64,
}

const RR_SIZE: usize = 8;

impl HeldRr {
    fn open(ns: &NetNs, pid: u32) -> HeldRr {
        let mut ctrl = connect_in(ns, MVPERF_PORT);
        // Its steps wait for ours as long as our grace: longer than any gap.
        let request = json!({"proto": 3, "test": "TCP_RR", "duration_s": 3600.0,
            "msg_size": 1, "req_size": RR_SIZE, "resp_size": RR_SIZE, "grace_s": 3600.0});
        ctrl.write_all(format!("{request}\n").as_bytes()).unwrap();
        let line = read_watched(
            &mut ctrl,
            pid,
            "the server's answer to the TCP_RR request",
            |b| b.ends_with(b"\n"),
        );
        let reply: Value = serde_json::from_slice(&line).expect("the server's answer");
        assert_eq!(reply["ok"], json!(true), "{reply}");
        let port = reply["data_port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok());
        let data = connect_in(ns, port.unwrap_or_else(|| panic!("no data port: {reply}")));
        data.set_nodelay(true).unwrap();
        HeldRr {
            ctrl,
            data,
            sent: 0,
            answered: 0,
        }
    }

    /// Sends one request without waiting for its response.
    fn send(&mut self) {
        let req = [self.sent as u8; RR_SIZE];
        self.data.write_all(&req).expect("sending a request");
        self.sent += 1;
    }

    /// Reads the response to every request sent and not yet answered.
    fn answers(&mut self, pid: u32, what: &str) {
        let want = (self.sent - self.answered) as usize * RR_SIZE;
        let got = read_watched(&mut self.data, pid, what, |b| b.len() >= want);
        assert!(
            got.len() == want && got.iter().all(|&b| b == 0xa5),
            "{what}: {got:?}"
        );
        self.answered = self.sent;
    }

    /// `n` transactions, one at a time, as TCP_RR makes them.
    fn transact(&mut self, n: u64, pid: u32, what: &str) {
        for _ in 0..n {
            self.send();
            self.answers(pid, what);
        }
    }

    /// Ends the test; the server's count of transactions.
    fn close(mut self, pid: u32) -> u64 {
        self.data.shutdown(Shutdown::Write).unwrap();
        let line = read_watched(&mut self.ctrl, pid, "the server's count", |b| {
            b.ends_with(b"\n")
        });
        let report: Value = serde_json::from_slice(&line).expect("the server's count");
        report["transactions"]
            .as_u64()
            .unwrap_or_else(|| panic!("no count: {report}"))
    }
}

/// `CONNECT` to the guest's mvperf server's vsock port through the vsock
/// device's socket `uds`, as a host agent does; its `OK <port>` line.
fn vsock_connect(uds: &Path, pid: u32) -> String {
    let mut s =
        UnixStream::connect(uds).unwrap_or_else(|e| panic!("connecting to {}: {e}", uds.display()));
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    s.write_all(format!("CONNECT {MVPERF_PORT}\n").as_bytes())
        .unwrap();
    let what = format!("the guest's answer to CONNECT on {}", uds.display());
    let line = read_watched(&mut s, pid, &what, |b| b.ends_with(b"\n"));
    String::from_utf8_lossy(&line).into_owned()
}

/// mvperf's VSOCK_RR through `uds` for two seconds, under a watch over
/// minivmm's process `pid`; its JSON.
fn vsock_rr(uds: &Path, pid: u32) -> Value {
    let mut cmd = Command::new(mvperf_bin());
    cmd.args(["-t", "VSOCK_RR", "--uds"])
        .arg(uds)
        .args(["-l", "2", "--grace", "60", "--json"]);
    let out = minivmm_tests::run_watched(&mut cmd, Patience::of(GUEST_STALL), &[pid], Vec::new)
        .expect("running mvperf");
    assert!(out.success(), "VSOCK_RR: {}", out.stderr_text());
    serde_json::from_slice(&out.stdout).expect("mvperf JSON")
}

/// A restored VM's vsock device, its socket at `uds`: a host connection
/// made after the load reaches the guest's server (`OK`), and the device
/// told the guest its old connections are gone (one
/// `VIRTIO_VSOCK_EVENT_TRANSPORT_RESET`, in the metrics at `metrics`).
fn vsock_after_load(sock: &Path, uds: &Path, metrics: &Path, pid: u32) -> u64 {
    let ok_line = vsock_connect(uds, pid);
    assert!(ok_line.starts_with("OK "), "CONNECT answered {ok_line:?}");
    ok(
        sock,
        "PUT",
        "/actions",
        json!({"action_type": "FlushMetrics"}),
    );
    let m = last_metrics(metrics);
    let resets = metric(&m, "vsock", "transport_resets");
    assert_eq!(resets, 1, "transport resets after one load: {}", m["vsock"]);
    resets
}

/// What the new process of a load brings along before it: its metrics
/// file (the loading process's own, as Firecracker's).
fn own_metrics(sock: &Path, dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}.metrics"));
    ok(
        sock,
        "PUT",
        "/metrics",
        json!({"metrics_path": p(&path), "interval_s": 0}),
    );
    path
}

/// The served guest booted with `track_dirty_pages` goes on after its Full
/// snapshot: Diffs `b1` and `b2` of it (the second while a request of
/// `held` is in flight: sent while the VM is paused), both with far less
/// data than memory.
fn booted_diffs(dir: &Path, sock: &Path, held: &mut HeldRr, pid: u32) {
    for diff in ["b1", "b2"] {
        ok(sock, "PATCH", "/vm", json!({"state": "Resumed"}));
        held.transact(2, pid, &format!("a transaction before Diff {diff}"));
        ok(sock, "PATCH", "/vm", json!({"state": "Paused"}));
        let data = snapshot(sock, dir, diff, "Diff");
        assert!(
            data > 0 && data < 32 << 20,
            "Diff {diff} of the booted guest: {data} bytes of data of 256 MiB"
        );
    }
    held.send();
}

/// The served guest's Full snapshot with both Diffs of the booted VM
/// rebased in order (`chain`) loads into a process on the same TAP whose
/// vsock socket is another (`vsock_override`): the TCP connection held
/// across it gets the answer to the request sent while the VM was paused
/// and goes on, and the server counts every transaction; the vsock device
/// sent one transport reset and a new connection reaches the guest.
fn chain_round(dir: &Path, ns: &NetNs, mut held: HeldRr) {
    let full_mem = dir.join("chain.mem");
    std::fs::copy(dir.join("full.mem"), &full_mem).unwrap();
    rebase(&full_mem, &dir.join("b1.mem"));
    rebase(&full_mem, &dir.join("b2.mem"));
    std::fs::copy(dir.join("b2.state"), dir.join("chain.state")).unwrap();
    let (mut vm, sock) = api_vmm(dir, "served-chain", Some(&ns.name));
    let metrics = own_metrics(&sock, dir, "served-chain");
    let uds = dir.join("v2.sock");
    let mut body = load_body(dir, "chain", true);
    body["vsock_override"] = json!({"uds_path": p(&uds)});
    let t = Instant::now();
    ok(&sock, "PUT", "/snapshot/load", body);
    let loaded = t.elapsed();
    let cfg = get_json(&sock, "/vm/config");
    assert_eq!(cfg["vsock"], json!({"guest_cid": 3, "uds_path": p(&uds)}));
    held.answers(
        vm.pid(),
        "the answer to the request in flight across the snapshot, kill and load",
    );
    let first = t.elapsed();
    held.transact(3, vm.pid(), "a transaction after the load");
    let sent = held.sent;
    let counted = held.close(vm.pid());
    eprintln!(
        "FIGURE held TCP connection: load answered {:.1} ms, the request in flight answered \
         {:.1} ms after the load request; {sent} transactions, 4 of them after the load",
        loaded.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3
    );
    assert_eq!(
        counted, sent,
        "the guest's server counted another number of transactions than were made"
    );
    let resets = vsock_after_load(&sock, &uds, &metrics, vm.pid());
    let rr = vsock_rr(&uds, vm.pid());
    eprintln!("FIGURE VSOCK_RR after the load: {rr}; transport resets {resets}");
    assert!(rr["transactions"].as_u64().unwrap_or(0) > 0, "{rr}");
    assert!(
        ping_until_answered(ns, 60).is_some(),
        "no ping\n{}",
        vm.report()
    );
    vm.terminate(Duration::from_secs(30));
    vm.assert_no_crash();
}

/// The served guest, booted with `track_dirty_pages`, a vsock device and
/// MMDS (see the module doc for what each step shows).
#[test]
fn a_served_guest_restored_in_a_new_process_answers_on_its_tap_and_keeps_its_disk() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let _ = mvperf_bin();
    let dir = scratch("served");
    let disk = disk_copy(&dir, "rootfs.ext4").unwrap();
    let seed = format!("snap{}", std::process::id());
    let ns = NetNs::new("snap", "tap0", &format!("{HOST_IP}/24")).unwrap();
    let (mut vm, sock) = api_vmm(&dir, "served-a", Some(&ns.name));
    ok(
        &sock,
        "PUT",
        "/machine-config",
        json!({"vcpu_count": 1, "mem_size_mib": 256, "track_dirty_pages": true}),
    );
    ok(
        &sock,
        "PUT",
        "/boot-source",
        json!({"kernel_image_path": p(&img.vmlinux), "boot_args": format!(
            "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
             minivmm.disk=write:{seed} ip={GUEST_IP}::{HOST_IP}:255.255.255.0::eth0:off")}),
    );
    // The drive and the entropy device have buckets too large to slow the
    // guest down, which the state file carries and the load checks against
    // the configuration.
    ok(
        &sock,
        "PUT",
        "/drives/rootfs",
        json!({"drive_id": "rootfs", "path_on_host": p(&disk), "is_root_device": true,
               "is_read_only": false, "rate_limiter": {"ops":
               {"size": 100_000, "one_time_burst": 1000, "refill_time": 100}}}),
    );
    ok(
        &sock,
        "PUT",
        "/network-interfaces/eth0",
        json!({"iface_id": "eth0", "host_dev_name": ns.tap}),
    );
    ok(
        &sock,
        "PUT",
        "/entropy",
        json!({"rate_limiter": {"bandwidth": {"size": 1_000_000, "refill_time": 100}}}),
    );
    let uds = dir.join("v.sock");
    ok(
        &sock,
        "PUT",
        "/vsock",
        json!({"guest_cid": 3, "uds_path": p(&uds)}),
    );
    ok(&sock, "PUT", "/mmds/config", mmds_config());
    ok(&sock, "PUT", "/mmds", json!({"vm": "original"}));
    let boot = Instant::now();
    ok(
        &sock,
        "PUT",
        "/actions",
        json!({"action_type": "InstanceStart"}),
    );
    assert!(vm.wait_for(DISK_WRITE_OK, BOOT_TIMEOUT), "{}", vm.report());
    assert!(
        vm.wait_for("MINIVMM-SERVING", BOOT_TIMEOUT),
        "{}",
        vm.report()
    );
    eprintln!(
        "FIGURE cold boot to MINIVMM-SERVING: {:.1} s",
        boot.elapsed().as_secs_f64()
    );
    assert!(
        ping_until_answered(&ns, 60).is_some(),
        "no ping\n{}",
        vm.report()
    );
    let before = tcp_rr(&ns);
    eprintln!("FIGURE TCP_RR before the snapshot: {before}");
    let ok_line = vsock_connect(&uds, vm.pid());
    assert!(ok_line.starts_with("OK "), "CONNECT answered {ok_line:?}");
    // A TCP connection the test holds open from here to after the load.
    let mut held = HeldRr::open(&ns, vm.pid());
    held.transact(2, vm.pid(), "a transaction before the snapshot");

    ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
    let t = Instant::now();
    ok(&sock, "PUT", "/snapshot/create", create_body(&dir, "full"));
    let create_ms = t.elapsed().as_secs_f64() * 1e3;
    let state_len = std::fs::metadata(dir.join("full.state")).unwrap().len();
    let mem_len = std::fs::metadata(dir.join("full.mem")).unwrap().len();
    eprintln!(
        "FIGURE Full snapshot of 256 MiB: create {create_ms:.1} ms, state {state_len} bytes, \
         memory {mem_len} bytes"
    );
    assert_eq!(mem_len, 256 << 20);
    booted_diffs(&dir, &sock, &mut held, vm.pid());
    let console_before = vm.console();
    vm.signal("KILL");
    vm.wait_exit(Duration::from_secs(10)).expect("killed");

    // The file the guest wrote before the snapshot is on its disk.
    assert_eq!(
        debugfs_cat(&disk, DISK_TEST_FILE).unwrap(),
        disk_test_content(&seed)
    );
    chain_round(&dir, &ns, held);

    // Round 0 loads the Full snapshot (tracking dirty pages) and takes a
    // Diff of it; round 1 loads that Diff rebased onto a copy of the Full
    // memory file. Both on the snapshot's own vsock socket.
    for (round, tag) in ["full", "rebased"].into_iter().enumerate() {
        let name = format!("served-b{round}");
        let (mut vm, sock) = api_vmm(&dir, &name, Some(&ns.name));
        let metrics = own_metrics(&sock, &dir, &name);
        // The store is the process's (Firecracker keeps none in a snapshot):
        // the first clone's is filled before its load, the second's not.
        let store = match round {
            0 => json!({"vm": "clone"}),
            _ => json!({}),
        };
        if round == 0 {
            ok(&sock, "PUT", "/mmds", store.clone());
        }
        let mut body = load_body(&dir, tag, true);
        body["track_dirty_pages"] = json!(round == 0);
        let t = Instant::now();
        ok(&sock, "PUT", "/snapshot/load", body);
        let answered = t.elapsed();
        mmds_after_load(&sock, &store);
        let first = ping_until_answered(&ns, 60);
        let first = first.unwrap_or_else(|| panic!("round {round}: no ping\n{}", vm.report()));
        eprintln!(
            "FIGURE restore {tag}: load answered {:.1} ms, first ping answered {:.1} ms \
             after the load request",
            answered.as_secs_f64() * 1e3,
            (answered + first).as_secs_f64() * 1e3
        );
        assert_eq!(state_of(&sock), "Running");
        let rr = tcp_rr(&ns);
        eprintln!("FIGURE TCP_RR after the {tag} restore: {rr}");
        assert!(rr["transactions"].as_u64().unwrap_or(0) > 0, "{rr}");
        vsock_after_load(&sock, &uds, &metrics, vm.pid());
        if round == 0 {
            ok(&sock, "PATCH", "/vm", json!({"state": "Paused"}));
            let data = snapshot(&sock, &dir, "diff", "Diff");
            assert!(data > 0, "an empty Diff of a guest that ran TCP_RR");
            ok(&sock, "PATCH", "/vm", json!({"state": "Resumed"}));
            // The console goes on: Ctrl-Alt-Del reaches init, which says so
            // and reboots, and minivmm exits 0.
            ok(
                &sock,
                "PUT",
                "/actions",
                json!({"action_type": "SendCtrlAltDel"}),
            );
            assert!(
                vm.wait_for("ctrl-alt-del: rebooting", Duration::from_secs(120)),
                "{}",
                vm.report()
            );
            let status = vm.wait_exit(Duration::from_secs(120)).expect("exits");
            assert_eq!(status.code(), Some(0), "{}", vm.report());
            vm.assert_no_crash();
            assert!(!console_before.contains("ctrl-alt-del"));
            std::fs::copy(dir.join("full.mem"), dir.join("rebased.mem")).unwrap();
            std::fs::copy(dir.join("diff.state"), dir.join("rebased.state")).unwrap();
            rebase(&dir.join("rebased.mem"), &dir.join("diff.mem"));
        } else {
            vm.terminate(Duration::from_secs(30));
            vm.assert_no_crash();
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
