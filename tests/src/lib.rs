// SPDX-License-Identifier: Apache-2.0
//! Harness for minivmm's integration tests.
//!
//! It builds the `minivmm` binary and the guest image (`resources/build.sh`)
//! once per test binary, spawns the VMM with its serial console captured,
//! waits for console patterns with deadlines, and creates the network
//! namespace (with its TAP and addresses) that every networked test runs
//! inside, deleting it on drop. For the disk tests it copies the cached root
//! disk and reads images with e2fsprogs (`debugfs`, `e2fsck`), never mounting
//! them. Tests that need KVM, root or TUN call [`require`] first, which prints
//! why and returns false where they are missing. [`fc_schema`] checks JSON
//! answers against Firecracker's API description.
//!
//! No wait on a guest has a fixed wall-clock deadline: each follows progress
//! ([`progress`]): console bytes for the VM's own waits, output and the TAP's
//! counters for host-side commands run against the guest ([`run_watched`]),
//! measured in the VMM's own time, so a host loaded by other work slows a test
//! down without failing it, while a guest that stops still fails in bounded time.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub mod fc_paths;
pub mod fc_schema;
pub mod progress;

pub use progress::{run_watched, Expired, Patience, Watch, Watched};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lives in the repository")
        .to_path_buf()
}

/// What a test needs from the host.
#[derive(Debug, Clone, Copy)]
pub enum Need {
    /// `/dev/kvm` readable and writable.
    Kvm,
    /// Running as root (namespaces, TAP creation).
    Root,
    /// `/dev/net/tun`.
    Tun,
}

/// The name of the test running on this thread. libtest runs every test on a
/// thread named after it (also with `--test-threads=1`), so a test need not
/// spell its own name; a thread it did not name falls back to the test binary's.
pub fn current_test_name() -> String {
    let thread = std::thread::current();
    match thread.name() {
        Some(name) if name != "main" => name.to_string(),
        _ => std::env::args()
            .next()
            .and_then(|arg0| {
                let binary = Path::new(&arg0).file_name()?;
                Some(binary.to_string_lossy().into_owned())
            })
            .unwrap_or_else(|| "test".to_string()),
    }
}

/// Prints why the running test skips, as `SKIP <test>: <why>` under the
/// [`current_test_name`], for the test summary of `scripts/test.sh` to count.
pub fn print_skip(why: &str) {
    eprintln!("SKIP {}: {why}", current_test_name());
}

/// Returns whether every need is met; prints the reason for a skip
/// ([`print_skip`]) otherwise.
pub fn require(needs: &[Need]) -> bool {
    for need in needs {
        let missing = match need {
            Need::Kvm => std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/kvm")
                .err()
                .map(|e| format!("/dev/kvm is not usable ({e})")),
            Need::Root => (nix_geteuid() != 0).then(|| "not running as root".to_string()),
            Need::Tun => {
                (!Path::new("/dev/net/tun").exists()).then(|| "/dev/net/tun is missing".to_string())
            }
        };
        if let Some(why) = missing {
            print_skip(&why);
            return false;
        }
    }
    true
}

fn nix_geteuid() -> u32 {
    // /proc/self/status avoids unsafe code for a value we only compare.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
        })
        .and_then(|uid| uid.parse().ok())
        .unwrap_or(u32::MAX)
}

/// Whether this host's KVM is PVM-backed. minivmm then adds its recoveries,
/// among them the guest kernel's `pvm_syscall_fixup`, without which guest
/// userspace cannot make a system call here.
pub fn pvm_host() -> bool {
    Path::new("/sys/module/kvm_pvm").exists()
}

/// A 64-bit ELF "kernel" whose entry point is `hlt; jmp .-1` at 2 MiB: with
/// interrupts off (as the boot protocol enters) the vCPU halts for good
/// without using a CPU, so minivmm runs its event loop and nothing else.
/// Written to `path` (no guest boot: a VM on it is up in a second).
pub fn write_halting_kernel(path: &Path) -> std::io::Result<()> {
    write_elf_kernel(path, &[0xf4, 0xeb, 0xfd])
}

/// A 64-bit ELF "kernel" that prints an empty console line (a newline to COM1) and then
/// counts `0x100000` down, over and over: a guest that keeps making progress without a boot,
/// one line about every second where the guest kernel runs emulated (the PVM hosts), far more
/// often on hardware virtualization. Written to `path`.
pub fn write_ticking_kernel(path: &Path) -> std::io::Result<()> {
    let code = [
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8 (COM1's data register)
        0xb0, 0x0a, // mov al, '\n'
        0xee, // out dx, al
        0xb9, 0x00, 0x00, 0x10, 0x00, // mov ecx, 0x100000
        0xff, 0xc9, // dec ecx
        0x75, 0xfc, // jnz (the dec)
        0xeb, 0xee, // jmp (the start)
    ];
    write_elf_kernel(path, &code)
}

/// Where [`write_counting_kernel`]'s guest keeps its count: guest-physical 3 MiB, a page
/// nothing else writes.
pub const COUNTER_GPA: u64 = 0x30_0000;

/// The first of the 64 characters [`write_counting_kernel`]'s guest prints, `'0'` to `'o'`.
pub const COUNT_BASE: u8 = b'0';

/// A 64-bit ELF "kernel" like [`write_ticking_kernel`]'s, whose state is in guest memory: each
/// round it adds one to the byte at [`COUNTER_GPA`] and prints the byte's low six bits as one
/// character from [`COUNT_BASE`] (`'0'`, `'1'`, ... `'o'`, then `'0'` again), then a newline,
/// then counts `0x100000` down. A restored guest prints the successor of the last character it
/// printed before its snapshot only if the memory it was restored with holds its last count.
pub fn write_counting_kernel(path: &Path) -> std::io::Result<()> {
    let [a0, a1, a2, a3] = u32::try_from(COUNTER_GPA)
        .expect("below 4 GiB")
        .to_le_bytes();
    let code = [
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8 (COM1's data register)
        0xfe, 0x04, 0x25, a0, a1, a2, a3, // inc byte [COUNTER_GPA]
        0x8a, 0x04, 0x25, a0, a1, a2, a3, // mov al, [COUNTER_GPA]
        0x24, 0x3f, // and al, 0x3f
        0x04, COUNT_BASE, // add al, COUNT_BASE
        0xee,       // out dx, al
        0xb0, 0x0a, // mov al, '\n'
        0xee, // out dx, al
        0xb9, 0x00, 0x00, 0x10, 0x00, // mov ecx, 0x100000
        0xff, 0xc9, // dec ecx
        0x75, 0xfc, // jnz (the dec)
        0xeb, 0xdb, // jmp (the start)
    ];
    write_elf_kernel(path, &code)
}

/// Writes a 64-bit ELF executable to `path` whose one segment, loaded at 2 MiB and entered
/// there, is `code`.
fn write_elf_kernel(path: &Path, code: &[u8]) -> std::io::Result<()> {
    const LOAD: u64 = 0x20_0000;
    const CODE_OFF: u64 = 0x1000;
    let mut f = Vec::new();
    f.extend_from_slice(b"\x7fELF\x02\x01\x01\x00");
    f.extend_from_slice(&[0; 8]);
    f.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f.extend_from_slice(&0x3eu16.to_le_bytes()); // EM_X86_64
    f.extend_from_slice(&1u32.to_le_bytes());
    f.extend_from_slice(&LOAD.to_le_bytes()); // e_entry
    f.extend_from_slice(&64u64.to_le_bytes()); // e_phoff
    f.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    f.extend_from_slice(&0u32.to_le_bytes());
    f.extend_from_slice(&64u16.to_le_bytes()); // e_ehsize
    f.extend_from_slice(&56u16.to_le_bytes()); // e_phentsize
    f.extend_from_slice(&1u16.to_le_bytes()); // e_phnum
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    f.extend_from_slice(&5u32.to_le_bytes()); // R X
    f.extend_from_slice(&CODE_OFF.to_le_bytes());
    f.extend_from_slice(&LOAD.to_le_bytes()); // p_vaddr
    f.extend_from_slice(&LOAD.to_le_bytes()); // p_paddr
    f.extend_from_slice(&(code.len() as u64).to_le_bytes());
    f.extend_from_slice(&(code.len() as u64).to_le_bytes());
    f.extend_from_slice(&0x1000u64.to_le_bytes());
    f.resize(CODE_OFF as usize, 0);
    f.extend_from_slice(code);
    std::fs::write(path, f)
}

/// What the guest kernel logs when `pvm_syscall_fixup` is on
/// (resources/kernel/pvm-syscall-fixup.patch).
pub const SYSCALL_FIXUP_ACTIVE: &str = "pvm_syscall_fixup: active";

/// What the guest's init prints once userspace runs.
pub const READY: &str = "MINIVMM-READY";

/// What the guest's self-test (`minivmm.mode=selftest`, `mvperf selftest`) prints when every
/// check held; a failure prints `MINIVMM-SELFTEST FAIL <what>`.
pub const SELFTEST_PASS: &str = "MINIVMM-SELFTEST PASS";

/// Console text that means a guest program or the guest kernel crashed: the kernel's log of a
/// user-mode fault (`segfault at`, `traps:` for #GP/#UD/#DE and friends), a kernel-mode
/// `general protection` fault, and a panic. Any of them fails a boot test whatever the exit
/// status, because a guest program that dies leaves the VMM running and exiting 0.
pub const CRASH_MARKERS: [&str; 4] = [
    "segfault at",
    "traps:",
    "general protection",
    "Kernel panic",
];

/// The kernel's panic banner as the guest's init prints it with `minivmm.panic=fake`, to
/// /dev/console just before it reboots (`resources/initramfs/init`): what any guest process
/// can print, which must not make minivmm report a panic.
pub const FAKE_PANIC: &str =
    "[    9.999999] Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100";

/// What the guest kernel prints when it panics because init exited with status 1
/// (`minivmm.panic=kernel`).
pub const INIT_EXIT_PANIC: &str =
    "Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000100";

/// The console lines that contain a [`CRASH_MARKERS`] entry.
pub fn crash_lines(console: &str) -> Vec<&str> {
    console
        .lines()
        .filter(|l| CRASH_MARKERS.iter().any(|m| l.contains(m)))
        .collect()
}

/// Panics, naming the lines and showing `report`, if `console` has any crash line. The one
/// check every boot test runs (through [`Vm::assert_no_crash`], or directly where a test reads
/// the console itself).
pub fn assert_no_crash(console: &str, report: &str) {
    let bad = crash_lines(console);
    assert!(
        bad.is_empty(),
        "the guest crashed ({} console line(s) with {CRASH_MARKERS:?}):\n{}\n{report}",
        bad.len(),
        bad.join("\n")
    );
}

/// The exit status of a minivmm whose thread made a system call its seccomp filter forbids.
pub const BAD_SYSCALL_STATUS: i32 = 148;

/// The line minivmm's SIGSYS handler writes before it ends with [`BAD_SYSCALL_STATUS`]
/// (`minivmm: error: forbidden system call 219 (restart_syscall) under seccomp, ...`),
/// if `stderr` has one.
pub fn forbidden_call(stderr: &str) -> Option<&str> {
    stderr.lines().find(|l| l.contains("forbidden system call"))
}

/// Why minivmm's exit `code` is not the one a test wanted, for its failure message: for
/// [`BAD_SYSCALL_STATUS`] the call the filter refused, by name, from minivmm's `stderr`.
pub fn exit_note(code: Option<i32>, stderr: &str) -> String {
    match (code, forbidden_call(stderr)) {
        (Some(BAD_SYSCALL_STATUS), Some(line)) => {
            format!("minivmm exited 148: a seccomp filter refused a system call: {line}")
        }
        (Some(BAD_SYSCALL_STATUS), None) => {
            "minivmm exited 148 (a seccomp filter refused a system call) without naming it"
                .to_string()
        }
        (code, _) => format!("minivmm exited with {code:?}"),
    }
}

/// Runs `cargo build --release` for one package and returns the path of `bin`.
fn cargo_build_bin(package: &str, bin: &str) -> Result<PathBuf> {
    cargo_build(package, bin, &[], None)
}

/// Runs `cargo build --release` with `extra` arguments and `rustflags` (if
/// given) for one package and returns the path of `bin`.
fn cargo_build(
    package: &str,
    bin: &str,
    extra: &[&str],
    rustflags: Option<&str>,
) -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    if let Some(flags) = rustflags {
        cmd.env("RUSTFLAGS", flags);
    }
    let out = cmd
        .current_dir(repo_root())
        .args([
            "build",
            "--release",
            "--message-format=json",
            "-p",
            package,
            "--bin",
            bin,
        ])
        .args(extra)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo build")?;
    if !out.status.success() {
        bail!("cargo build -p {package} failed");
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact" && v["target"]["name"] == bin {
            if let Some(exe) = v["executable"].as_str() {
                return Ok(PathBuf::from(exe));
            }
        }
    }
    bail!("cargo build did not report the {bin} executable")
}

/// The release `minivmm` binary, built once per test process.
pub fn minivmm_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| cargo_build_bin("vmm", "minivmm").expect("building minivmm"))
        .clone()
}

/// The target of the static builds (the guest image's `mvperf` is built
/// the same way, `resources/initramfs/build.sh`).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The static release `minivmm` and `jailer` (`-C target-feature=+crt-static`,
/// `--target` [`STATIC_TARGET`], kept apart from the ordinary build): a
/// jail holds no shared library, so the binary the `jailer` copies into
/// one must need none. Built once per test process.
pub fn static_minivmm_and_jailer() -> (PathBuf, PathBuf) {
    static BINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BINS.get_or_init(|| {
        let build = |bin| {
            cargo_build(
                "vmm",
                bin,
                &["--target", STATIC_TARGET],
                Some("-C target-feature=+crt-static"),
            )
            .expect("building the static minivmm and jailer")
        };
        (build("minivmm"), build("jailer"))
    })
    .clone()
}

/// The release `mvperf` binary (host side of the netperf-style tests).
pub fn mvperf_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| cargo_build_bin("netperf", "mvperf").expect("building mvperf"))
        .clone()
}

/// The guest image from `resources/build.sh`.
#[derive(Debug, Clone)]
pub struct GuestImage {
    /// ELF kernel.
    pub vmlinux: PathBuf,
    /// bzImage of the same kernel.
    pub bzimage: PathBuf,
    /// Initramfs with busybox, /init and mvperf.
    pub initramfs: PathBuf,
    /// The ext4 root disk holding the same files (and `/sbin/init`). It is the cache's own
    /// copy: boot a [`disk_copy`] of it, never the image itself.
    pub disk: PathBuf,
}

impl GuestImage {
    /// The words that boot the ELF kernel with the initramfs as root.
    pub fn vmlinux_and_initramfs_args(&self) -> Vec<String> {
        cli_args(&[
            "--kernel",
            self.vmlinux.to_str().expect("UTF-8 path"),
            "--initramfs",
            self.initramfs.to_str().expect("UTF-8 path"),
        ])
    }
}

/// Builds (or reuses from the cache) the guest image, once per test process.
pub fn guest_image() -> GuestImage {
    static IMAGE: OnceLock<GuestImage> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let script = repo_root().join("resources/build.sh");
            let out = Command::new("bash")
                .arg(&script)
                .stderr(Stdio::inherit())
                .output()
                .expect("running resources/build.sh");
            assert!(out.status.success(), "resources/build.sh failed");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let lines: Vec<&str> = stdout.lines().collect();
            // The contract: the last four lines are vmlinux, bzImage, initramfs, root disk.
            assert!(
                lines.len() >= 4,
                "resources/build.sh printed fewer than 4 lines"
            );
            let last = &lines[lines.len() - 4..];
            let image = GuestImage {
                vmlinux: PathBuf::from(last[0]),
                bzimage: PathBuf::from(last[1]),
                initramfs: PathBuf::from(last[2]),
                disk: PathBuf::from(last[3]),
            };
            for p in [
                &image.vmlinux,
                &image.bzimage,
                &image.initramfs,
                &image.disk,
            ] {
                assert!(
                    p.is_absolute() && p.exists(),
                    "build.sh gave a bad path {}",
                    p.display()
                );
            }
            image
        })
        .clone()
}

/// The guest image ([`guest_image`]) for a test that needs every one of
/// `needs` to boot it; `None`, after [`require`] printed why, when it must skip.
pub fn guest_image_if(needs: &[Need]) -> Option<GuestImage> {
    require(needs).then(guest_image)
}

/// The file the guest's init writes on a disk root with `minivmm.disk=write:SEED`
/// (resources/initramfs/init).
pub const DISK_TEST_FILE: &str = "/minivmm-disk-test";

/// What init prints once it wrote, synced and (by remounting the root read-only) cleanly
/// closed [`DISK_TEST_FILE`]: the full line is `MINIVMM-DISK-WRITE ok bytes=B seed=SEED`;
/// a failure prints `MINIVMM-DISK-WRITE FAIL <what>`.
pub const DISK_WRITE_OK: &str = "MINIVMM-DISK-WRITE ok";

/// What init prints with `minivmm.disk=readonly` when creating [`DISK_TEST_FILE`] failed
/// with EROFS and the kernel refused a write to the root's block device; a failure prints
/// `MINIVMM-DISK-READONLY FAIL <what>`.
pub const DISK_READONLY_OK: &str = "MINIVMM-DISK-READONLY ok";

/// What init prints with `minivmm.rng=check` when the entropy device is the guest's current
/// hardware generator and `/dev/hwrng` gave [`RNG_CHECK_BYTES`] from it: the full line is
/// `MINIVMM-RNG ok current=virtio_rng.N bytes=512`; a failure prints `MINIVMM-RNG FAIL <what>`.
pub const RNG_OK: &str = "MINIVMM-RNG ok";

/// The bytes init reads from `/dev/hwrng` with `minivmm.rng=check`.
pub const RNG_CHECK_BYTES: u64 = 512;

/// The bytes init writes to [`DISK_TEST_FILE`] for `seed`: 4096 distinct lines (so a block
/// at the wrong offset shows), built the same way as the init's `disk_pattern`.
pub fn disk_test_content(seed: &str) -> Vec<u8> {
    (100_000..100_000 + 4096)
        .flat_map(|n| format!("{seed} line {n} of the minivmm disk test\n").into_bytes())
        .collect()
}

/// A private copy of the cached root disk ([`GuestImage::disk`]) at `dir/name`, for a boot
/// that may write to it: the cached image stays as built for every other test.
pub fn disk_copy(dir: &Path, name: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = dir.join(name);
    std::fs::copy(guest_image().disk, &copy)
        .with_context(|| format!("copying the root disk to {}", copy.display()))?;
    Ok(copy)
}

/// Runs an e2fsprogs tool on an image; returns (success, stdout, stderr).
fn e2fsprogs(tool: &str, args: &[&str], image: &Path) -> Result<(bool, Vec<u8>, String)> {
    let out = Command::new(tool)
        .args(args)
        .arg(image)
        .output()
        .with_context(|| format!("running {tool} (e2fsprogs)"))?;
    Ok((
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// The content of the file at `path` inside the ext4 `image`, read with `debugfs` (no
/// mount, no root). An error when the file is not there.
pub fn debugfs_cat(image: &Path, path: &str) -> Result<Vec<u8>> {
    // debugfs exits 0 whatever its command did; a missing file shows on stderr only.
    let (_, out, err) = e2fsprogs("debugfs", &["-R", &format!("stat {path}")], image)?;
    if !String::from_utf8_lossy(&out).contains("Type: regular") {
        bail!(
            "no regular file {path} in {}: {}",
            image.display(),
            err.trim()
        );
    }
    let (_, content, _) = e2fsprogs("debugfs", &["-R", &format!("cat {path}")], image)?;
    Ok(content)
}

/// What `debugfs` says of `path` inside `image` (`stat`): type, size, link target...
pub fn debugfs_stat(image: &Path, path: &str) -> Result<String> {
    let (_, out, _) = e2fsprogs("debugfs", &["-R", &format!("stat {path}")], image)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Checks the ext4 `image` with `e2fsck -fn` (forced, read-only: it changes nothing); Ok
/// with its report when it finds the file system clean (exit 0), an error with the report
/// otherwise.
pub fn e2fsck_clean(image: &Path) -> Result<String> {
    let (ok, out, err) = e2fsprogs("e2fsck", &["-fn"], image)?;
    let report = format!("{}{err}", String::from_utf8_lossy(&out));
    if !ok {
        bail!("e2fsck -fn {} is not clean:\n{report}", image.display());
    }
    Ok(report)
}

/// The SHA-256 of a file, in hex (`sha256sum`, coreutils).
pub fn sha256_file(path: &Path) -> Result<String> {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .context("running sha256sum")?;
    if !out.status.success() {
        bail!("sha256sum {} failed", path.display());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// The name and `Seccomp:` mode of every thread of process `pid`, sorted
/// (empty if it is gone).
pub fn threads_of(pid: u32) -> Vec<(String, String)> {
    let mut threads = Vec::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return threads;
    };
    for entry in entries.flatten() {
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |name: &str| status_field(&status, name);
        threads.push((field("Name:"), field("Seccomp:")));
    }
    threads.sort();
    threads
}

/// The children of process `pid`, whichever of its threads forked them.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return kids;
    };
    for task in tasks.flatten() {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        kids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    kids
}

/// The mount points of the cgroup hierarchies, v1 and v2 (`/proc/mounts`).
pub fn cgroup_mounts() -> Vec<(PathBuf, bool)> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.get(2).copied() {
                Some("cgroup2") => Some((PathBuf::from(f[1]), true)),
                Some("cgroup") => Some((PathBuf::from(f[1]), false)),
                _ => None,
            }
        })
        .collect()
}

/// Removes cgroup `parent/id` (and `parent`, once empty) from every
/// hierarchy: the leaf a jailed minivmm leaves behind when it ends, as
/// Firecracker's jailer does.
pub fn remove_cgroups(parent: &str, id: &str) {
    for (mount, _) in cgroup_mounts() {
        let _ = std::fs::remove_dir(mount.join(parent).join(id));
        let _ = std::fs::remove_dir(mount.join(parent));
    }
}

/// A host agent's `CONNECT 52` to minivmm's vsock socket at `sock`, on a VM
/// whose guest has no vsock driver: whether minivmm closed it (end of file
/// within 20 s, nothing answered), as it must while no driver is up.
pub fn vsock_connect_is_closed(sock: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut agent) = std::os::unix::net::UnixStream::connect(sock) else {
        return false;
    };
    if agent.write_all(b"CONNECT 52\n").is_err()
        || agent
            .set_read_timeout(Some(Duration::from_secs(20)))
            .is_err()
    {
        return false;
    }
    let mut b = [0u8; 16];
    matches!(agent.read(&mut b), Ok(0))
}

/// The value of field `name` (with its colon: `Seccomp:`) of a `/proc/<pid>/status` text,
/// trimmed; empty when it has none.
pub fn status_field(status: &str, name: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// One request to minivmm's API socket with curl, as the README writes it
/// (`curl --unix-socket`), given `max_time_s` seconds; the HTTP status (0
/// when curl got none: no socket, a time-out), the body and curl's stderr.
pub fn api_curl_within(
    sock: &Path,
    max_time_s: u32,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> (u16, String, String) {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--max-time",
        &max_time_s.to_string(),
        "--unix-socket",
    ])
    .arg(sock)
    .args(["-X", method, "-w", "\n%{http_code}"]);
    if let Some(b) = body {
        c.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    c.arg(format!("http://localhost{path}"));
    let out = c.output().expect("running curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        code.trim().parse().unwrap_or(0),
        body.to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`api_curl_within`] 60 s, where a request without an answer fails the
/// test; the HTTP status and the body.
pub fn api_curl(sock: &Path, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    let (code, body, stderr) = api_curl_within(sock, 60, method, path, body);
    assert!(code != 0, "curl {method} {path}: no status ({stderr})");
    (code, body)
}

/// `words` as owned strings, the form [`Vm::spawn`] takes a command line in.
pub fn cli_args(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// The uid and gid the jail tests run a jailed minivmm as (`nobody`).
pub const JAIL_ID: u32 = 65534;

/// `--jail dir --uid --gid` ([`JAIL_ID`]) `--id id --parent-cgroup parent`:
/// a jailed minivmm's command line before its own words.
pub fn jail_args(dir: &Path, id: &str, parent: &str) -> Vec<String> {
    let uid = JAIL_ID.to_string();
    cli_args(&[
        "--jail",
        &dir.display().to_string(),
        "--uid",
        &uid,
        "--gid",
        &uid,
        "--id",
        id,
        "--parent-cgroup",
        parent,
    ])
}

/// The last line of the metrics file at `path`, parsed: minivmm writes one
/// JSON line per flush (interval, SIGUSR1, exit), so the last is the newest.
pub fn last_metrics(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("metrics file");
    let last = text.lines().last().expect("at least one metrics line");
    serde_json::from_str(last).expect("metrics JSON")
}

/// The metrics line minivmm wrote as it exited (the last of the file at `path`), also
/// printed to the test's log so that a failed check on it shows every counter.
pub fn exit_metrics(path: &Path) -> serde_json::Value {
    let m = last_metrics(path);
    eprintln!("metrics at exit: {m}");
    m
}

/// Every line of the metrics file at `path`, parsed; none while it does not exist.
pub fn metrics_lines(path: &Path) -> Vec<serde_json::Value> {
    parse_metrics_lines(&std::fs::read_to_string(path).unwrap_or_default())
}

/// Every line of `text`, each one metrics JSON object.
pub fn parse_metrics_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad metrics line {l}: {e}")))
        .collect()
}

/// Counter `key` of device `device` (`net0`, a drive id) in metrics line `m`.
pub fn metric(m: &serde_json::Value, device: &str, key: &str) -> u64 {
    m[device][key]
        .as_u64()
        .unwrap_or_else(|| panic!("metrics lack {device}.{key}: {m}"))
}

/// A running minivmm with its console captured.
pub struct Vm {
    child: Child,
    console: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    started: Instant,
    /// Crash lines the test provoked on purpose (see [`Vm::expect_crash_line`]).
    expected_crashes: Vec<String>,
}

fn capture<R: Read + Send + 'static>(r: R, sink: Arc<Mutex<String>>, echo: &'static str) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(r);
        let mut line = Vec::new();
        while let Ok(n) = reader.read_until(b'\n', &mut line) {
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&line).into_owned();
            if std::env::var_os("MINIVMM_TEST_ECHO").is_some() {
                eprint!("{echo}{text}");
            }
            sink.lock().unwrap().push_str(&text);
            line.clear();
        }
    });
}

impl Vm {
    /// Starts minivmm with `args`, inside network namespace `netns` if given.
    pub fn spawn(args: &[String], netns: Option<&str>) -> Result<Vm> {
        let bin = minivmm_bin();
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        cmd.args(args);
        Vm::spawn_command(cmd)
    }

    /// Starts `cmd` (minivmm, or a launcher that execs it in place, such as
    /// the `jailer`) with stdin from /dev/null and its console and log
    /// captured.
    pub fn spawn_command(mut cmd: Command) -> Result<Vm> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("spawning minivmm")?;
        let console = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        capture(
            child.stdout.take().expect("piped stdout"),
            console.clone(),
            "guest| ",
        );
        capture(
            child.stderr.take().expect("piped stderr"),
            stderr.clone(),
            "vmm| ",
        );
        Ok(Vm {
            child,
            console,
            stderr,
            started: Instant::now(),
            expected_crashes: Vec::new(),
        })
    }

    /// Everything the guest printed so far.
    pub fn console(&self) -> String {
        self.console.lock().unwrap().clone()
    }

    /// Everything minivmm logged so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until the console contains `pattern`; false (after a line saying why) when the
    /// guest stops making progress or minivmm exits first. `timeout` is a stall window, not a
    /// deadline: the wait fails after `timeout` of the VMM's own time without a console byte,
    /// or at [`Patience::CAP_FACTOR`] times `timeout` in all ([`Patience::of`]).
    pub fn wait_for(&mut self, pattern: &str, timeout: Duration) -> bool {
        self.wait_for_with(pattern, Patience::of(timeout), &[])
    }

    /// [`Vm::wait_for`] with its own patience, also counting the CPU waits of the processes
    /// `others` (a peer VM this guest's progress depends on) as time the host took away.
    pub fn wait_for_with(&mut self, pattern: &str, patience: Patience, others: &[u32]) -> bool {
        let what = format!("console text {pattern:?}");
        self.wait_until(&what, patience, others, |console| console.contains(pattern))
            .is_ok()
    }

    /// Waits until `done(console so far)` holds, under a [`Watch`] of `patience` whose progress
    /// is console output and whose own time is that of minivmm and of `others`. On failure it
    /// prints why (`what` names the wait) and returns it: the watch's verdict, or minivmm's
    /// exit.
    pub fn wait_until(
        &mut self,
        what: &str,
        patience: Patience,
        others: &[u32],
        mut done: impl FnMut(&str) -> bool,
    ) -> Result<(), String> {
        let mut pids = vec![self.pid()];
        pids.extend_from_slice(others);
        let mut watch = Watch::new(patience, &pids);
        loop {
            let console = self.console();
            if done(&console) {
                // How close a passing wait came to its window, for the log.
                eprintln!(
                    "{}: {what} after {:.1} s; longest silence {:.1} s of the VMM's own time \
                     (window {:.0} s)",
                    current_test_name(),
                    watch.waited().as_secs_f64(),
                    watch.longest_idle().as_secs_f64(),
                    patience.stall.as_secs_f64()
                );
                return Ok(());
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                // Let the reader threads drain what is left.
                std::thread::sleep(Duration::from_millis(200));
                if done(&self.console()) {
                    return Ok(());
                }
                let why = format!("minivmm exited ({status}) first");
                eprintln!("{}: waiting for {what}: {why}", current_test_name());
                return Err(why);
            }
            if let Err(e) = watch.check(&[console.len() as u64]) {
                let why = e.to_string();
                eprintln!("{}: waiting for {what}: {why}", current_test_name());
                return Err(why);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for minivmm to exit by itself; `None` when it did not. Like [`Vm::wait_for`],
    /// `timeout` is a stall window over console output, capped at [`Patience::CAP_FACTOR`]
    /// times it.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut exited = None;
        let child = &mut self.child;
        let console = self.console.clone();
        let mut watch = Watch::new(Patience::of(timeout), &[child.id()]);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                exited = Some(status);
                break;
            }
            let bytes = console.lock().unwrap().len() as u64;
            if let Err(e) = watch.check(&[bytes]) {
                eprintln!("{}: waiting for minivmm to exit: {e}", current_test_name());
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if exited.is_some() {
            std::thread::sleep(Duration::from_millis(200));
        }
        exited
    }

    /// Waits up to `timeout` for the guest kernel to report eth0 configured
    /// from `ip=` with address `guest_ip`, and asserts that eth0 is the
    /// virtio-net card with MAC `mac` (lower case, as the kernel prints it).
    pub fn assert_eth0_configured(&mut self, guest_ip: &str, mac: &str, timeout: Duration) {
        // The kernel prints "IP-Config: Complete:" and, a line later, the
        // device with its MAC and address: wait for that whole report.
        let configured = self.wait_for(&format!("ipaddr={guest_ip},"), timeout);
        assert!(
            configured,
            "the guest did not configure eth0\n{}",
            self.report()
        );
        eprintln!("guest configured eth0 after {:.1} s", self.uptime());
        assert!(
            self.console()
                .contains(&format!("device=eth0, hwaddr={mac}")),
            "eth0 is not our virtio-net card\n{}",
            self.report()
        );
    }

    /// The exit status if minivmm has exited, without waiting.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends SIGTERM and asserts that minivmm exits within `timeout`, with
    /// status 0.
    pub fn terminate(&mut self, timeout: Duration) {
        self.signal("TERM");
        let status = self.wait_exit(timeout).unwrap_or_else(|| {
            panic!("minivmm ignored SIGTERM for {timeout:?}\n{}", self.report())
        });
        assert_eq!(
            status.code(),
            Some(0),
            "{}\n{}",
            exit_note(status.code(), &self.stderr()),
            self.report()
        );
    }

    /// Sends a signal to minivmm (not to `ip netns exec`, which execs it, so
    /// the pid is minivmm's own).
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status();
    }

    /// minivmm's pid (`ip netns exec` execs it, so the child is minivmm).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The pid of the jailed minivmm a `--jail` run started: minivmm's own
    /// process stays outside the jail's PID namespace as its supervisor,
    /// and the jailed minivmm is its only child.
    pub fn jailed_pid(&self) -> Option<u32> {
        children_of(self.pid()).first().copied()
    }

    /// The name and `Seccomp:` mode of every thread of minivmm, sorted.
    pub fn threads(&self) -> Vec<(String, String)> {
        threads_of(self.pid())
    }

    /// Seconds since spawn.
    pub fn uptime(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Asserts that guest userspace ran (init printed its marker, nothing
    /// panicked) and that the guest kernel's system-call fix-up was on
    /// exactly where it is needed: on a PVM host, where without it no guest
    /// process could make a system call, and nowhere else (`--host-quirks
    /// auto` leaves an ordinary host alone). So a PVM host whose kernel or
    /// VMM lost the fix fails here, loudly, instead of passing without
    /// userspace.
    pub fn assert_userspace_ran(&self) {
        let console = self.console();
        let report = self.report();
        self.assert_no_crash();
        if pvm_host() {
            assert!(
                console.contains(SYSCALL_FIXUP_ACTIVE),
                "PVM host, but the guest kernel did not log '{SYSCALL_FIXUP_ACTIVE}': \
                 the kernel lacks resources/kernel/pvm-syscall-fixup.patch or minivmm did not \
                 add the word\n{report}"
            );
        } else {
            assert!(
                !console.contains(SYSCALL_FIXUP_ACTIVE),
                "the system-call fix-up is on although this host is not PVM-backed\n{report}"
            );
        }
        assert!(
            console.contains(READY),
            "guest userspace never printed {READY}\n{report}"
        );
    }

    /// Fails if the console so far has a crash line ([`CRASH_MARKERS`]) other than those the
    /// test expects ([`Vm::expect_crash_line`]). Also run when the VM is dropped, so a test
    /// that forgets it still fails on a crash.
    pub fn assert_no_crash(&self) {
        let console = self.console();
        let unexpected: String = console
            .lines()
            .filter(|l| !self.expected_crashes.iter().any(|e| l.contains(e.as_str())))
            .flat_map(|l| [l, "\n"])
            .collect();
        assert_no_crash(&unexpected, &self.report());
    }

    /// Tells the crash checks that console lines containing `text` are the test's own doing
    /// (a panic it provoked), not a crash. Every other crash line still fails the test.
    pub fn expect_crash_line(&mut self, text: &str) {
        self.expected_crashes.push(text.to_string());
    }

    /// A summary for assertion messages: the tail of the console and the log.
    pub fn report(&self) -> String {
        let console = self.console();
        let tail: String = console
            .chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!(
            "--- console tail ---\n{tail}\n--- minivmm stderr ---\n{}",
            self.stderr()
        )
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // A test already failing has said why; a second panic here would abort.
        if !std::thread::panicking() {
            std::thread::sleep(Duration::from_millis(200));
            self.assert_no_crash();
        }
    }
}

/// A network namespace with a TAP and a host address, deleted on drop.
/// Everything a test sends goes to addresses that exist only inside it.
pub struct NetNs {
    /// Namespace name.
    pub name: String,
    /// TAP device inside it.
    pub tap: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl NetNs {
    /// Creates namespace `minivmm-<tag>-<pid>` holding TAP `tap` with
    /// `host_cidr` (e.g. "10.0.2.1/24"), link up.
    pub fn new(tag: &str, tap: &str, host_cidr: &str) -> Result<NetNs> {
        let ns = NetNs::bare(tag, tap)?;
        ns.add_tap(tap, host_cidr, None)?;
        Ok(ns)
    }

    /// Adds TAP `tap` with `host_cidr`, link up; `owner` is the uid that may
    /// open it besides root.
    pub fn add_tap(&self, tap: &str, host_cidr: &str, owner: Option<u32>) -> Result<()> {
        let owner = owner.map(|uid| uid.to_string());
        let mut add = vec!["tuntap", "add", "dev", tap, "mode", "tap"];
        if let Some(uid) = &owner {
            add.extend(["user", uid.as_str()]);
        }
        self.exec_ip(&add)?;
        self.exec_ip(&["addr", "add", host_cidr, "dev", tap])?;
        self.exec_ip(&["link", "set", tap, "up"])
    }

    /// Creates namespace `minivmm-<tag>-<pid>` with only loopback up; the test adds
    /// its own devices (`tap` names the first TAP it will create, for reference).
    pub fn bare(tag: &str, tap: &str) -> Result<NetNs> {
        let name = format!("minivmm-{tag}-{}", std::process::id());
        // A leftover from a crashed earlier run of the same pid is harmless to remove.
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let ns = NetNs {
            name,
            tap: tap.to_string(),
        };
        ns.exec_ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs `ip ARGS` inside the namespace.
    pub fn exec_ip(&self, args: &[&str]) -> Result<()> {
        let mut full = vec!["netns", "exec", &self.name, "ip"];
        full.extend_from_slice(args);
        ip(&full)
    }

    /// A command that runs `program` inside the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    /// Pings `addr` from inside the namespace three times, half a second
    /// apart, with `options` (such as `-s SIZE`) added; returns ping's output.
    /// Each reply is progress: ping is ended (with SIGINT, so it prints its
    /// summary) after [`PING_PATIENCE`]'s stall window without one.
    pub fn ping(&self, addr: &str, options: &[&str]) -> String {
        let cap = PING_PATIENCE.cap.as_secs().to_string();
        let out = run_watched(
            self.command("ping")
                // A deadline, not -W: iputils with -W alone exits before a late
                // reply (an emulated guest's first 8000-byte reply took over a
                // second) and counts it lost. The deadline is the cap; the
                // watch ends a ping that stopped hearing replies sooner.
                .args(["-c", "3", "-i", "0.5", "-w", &cap])
                .args(options)
                .arg(addr),
            PING_PATIENCE,
            &[],
            Vec::new,
        )
        .expect("running ping");
        let mut text = out.stdout_text();
        if let Some(why) = out.expired {
            text.push_str(&format!("(ping ended by the test's watch: {why})\n"));
        }
        text
    }

    /// The bytes received and sent on `dev` inside the namespace (`ip -s link`), as progress
    /// marks for a [`run_watched`] command that moves traffic through it; none if unreadable.
    pub fn link_bytes(&self, dev: &str) -> Vec<u64> {
        let out = Command::new("ip")
            .args(["-n", &self.name, "-j", "-s", "link", "show", "dev", dev])
            .output();
        let Ok(out) = out else {
            return Vec::new();
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            return Vec::new();
        };
        let stats = &v[0]["stats64"];
        ["rx", "tx"]
            .iter()
            .filter_map(|dir| stats[*dir]["bytes"].as_u64())
            .collect()
    }
}

/// How long [`NetNs::ping`] waits: 30 s without a reply (what its fixed deadline was), 120 s in
/// all while replies come.
pub const PING_PATIENCE: Patience =
    Patience::new(Duration::from_secs(30), Duration::from_secs(120));

impl NetNs {
    /// Runs `f` on a new thread that has joined this namespace, so sockets it
    /// opens live there (only that thread switches; the test process stays put).
    pub fn in_thread<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<Result<T>> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter_netns(&path)?;
            Ok(f())
        })
    }
}

#[allow(unsafe_code)]
fn enter_netns(path: &str) -> Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).with_context(|| format!("opening {path}"))?;
    // SAFETY: the fd is a valid open namespace file for the duration of the
    // call; setns(CLONE_NEWNET) only changes the calling thread's network
    // namespace, which is the point of running on a dedicated thread.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!("setns({path}): {}", std::io::Error::last_os_error());
    }
    Ok(())
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Pseudo-terminals for tests of the console's terminal mode.
pub mod pty {
    #![allow(unsafe_code)]

    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    /// A new pair (master, slave), in the default canonical, echoing mode.
    pub fn open() -> (OwnedFd, OwnedFd) {
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: openpty writes two fds into the live ints; name, termios
        // and window size are not asked for (null).
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: openpty succeeded: both fds are open and ours alone.
        unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) }
    }

    /// Whether the terminal on `fd` edits lines and echoes (is not raw).
    pub fn canonical(fd: &OwnedFd) -> bool {
        // SAFETY: all-zero is a valid termios for tcgetattr to fill.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `t` is a live termios for the kernel to fill; the fd is open.
        let r = unsafe { libc::tcgetattr(fd.as_raw_fd(), &mut t) };
        assert_eq!(r, 0, "tcgetattr: {}", std::io::Error::last_os_error());
        t.c_lflag & (libc::ICANON | libc::ECHO) == (libc::ICANON | libc::ECHO)
    }
}
