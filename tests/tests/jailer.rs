// SPDX-License-Identifier: Apache-2.0
//! The `jailer` entry point, driven with Firecracker's jailer's flags as an
//! orchestrator drives it (root and KVM; the static `minivmm` and `jailer`,
//! [`static_minivmm_and_jailer`]):
//!
//! - its chroot is `<chroot-base-dir>/<exec-file name>/<id>/root`, holding
//!   the VMM's copy, the device nodes and `/run`, all the uid's, and the pid
//!   file; the VMM it execs in place gets `--id` and the start-time flags,
//!   an empty environment, the network namespace, the cgroup leaf and the
//!   rlimits asked for, and no capability;
//! - with `--daemonize --new-pid-ns` the jailer leaves at once, and the pid
//!   file names the VMM, init of its PID namespace, stdio on /dev/null;
//! - a dynamically linked exec file, a bad id, a missing base: one line,
//!   status 1;
//! - one guest boot through it (TUN and the guest image too): the VMM
//!   configured through its API socket in the jail with the requests
//!   firecracker-go-sdk sends, the guest answering ping through its TAP
//!   from the network namespace the jailer joined.

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use minivmm_tests::{
    guest_image_if, pvm_host, remove_cgroups, require, static_minivmm_and_jailer, threads_of,
    write_halting_kernel, Need, NetNs, Vm, JAIL_ID,
};

const HOST_IP: &str = "10.0.2.1";
const GUEST_IP: &str = "10.0.2.2";
/// See tests/netperf.rs: an emulated guest under load needs minutes.
const BOOT_TIMEOUT: Duration = Duration::from_secs(900);

/// A chroot base of this test's own, and the cgroup parent of its VMs;
/// both removed on drop.
struct Base {
    dir: PathBuf,
    parent: String,
    id: String,
}

impl Base {
    fn new(tag: &str) -> Base {
        let dir = std::env::temp_dir().join(format!("minivmm-jailer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Base {
            dir,
            parent: format!("minivmm-jailer-test-{tag}-{}", std::process::id()),
            id: format!("{tag}-{}", std::process::id()),
        }
    }

    /// The chroot the jailer makes for the static minivmm, made beforehand
    /// as a caller does to link the guest's files into it.
    fn chroot(&self) -> PathBuf {
        let root = self.dir.join("minivmm").join(&self.id).join("root");
        std::fs::create_dir_all(&root).unwrap();
        root
    }

    /// Firecracker's jailer's flags for this base, then `extra`, then `--`
    /// and the VMM's `vmm` flags.
    fn command(&self, extra: &[&str], vmm: &[&str]) -> Command {
        let (minivmm, jailer) = static_minivmm_and_jailer();
        let uid = JAIL_ID.to_string();
        let mut cmd = Command::new(jailer);
        cmd.args(["--id", &self.id, "--uid", &uid, "--gid", &uid])
            .arg("--exec-file")
            .arg(minivmm)
            .arg("--chroot-base-dir")
            .arg(&self.dir)
            .args(["--parent-cgroup", &self.parent])
            .args(extra)
            .arg("--")
            .args(vmm);
        cmd
    }
}

impl Drop for Base {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        remove_cgroups(&self.parent, &self.id);
    }
}

fn proc_file(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{name}")).unwrap_or_default()
}

fn field(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

/// Waits until process `pid` runs a VM (its vCPU thread exists).
fn wait_running(pid: u32, what: &dyn Fn() -> String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !threads_of(pid)
        .iter()
        .any(|(n, _)| n.starts_with("fc_vcpu"))
    {
        assert!(
            Instant::now() < deadline,
            "no VM running after 60 s\n{}",
            what()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the jailer left in the chroot (seen from the host) and what `/proc`
/// shows of the VMM `pid` it execs.
fn check_jailed_vmm(base: &Base, pid: u32, netns: &str) {
    let root = base.chroot();
    let own = |p: &Path, mode: u32| {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!((m.uid(), m.gid()), (JAIL_ID, JAIL_ID), "{}", p.display());
        assert_eq!(m.permissions().mode() & 0o7777, mode, "{}", p.display());
        m
    };
    for dir in ["", "dev", "dev/net", "run"] {
        own(&root.join(dir), 0o700);
    }
    for dev in ["dev/kvm", "dev/net/tun"] {
        assert!(
            own(&root.join(dev), 0o600).file_type().is_char_device(),
            "{dev}"
        );
    }
    own(&root.join("minivmm"), 0o755);
    let cmdline: Vec<String> = proc_file(pid, "cmdline")
        .split('\0')
        .map(str::to_string)
        .collect();
    assert_eq!(cmdline[..3], ["/minivmm", "--id", &base.id], "{cmdline:?}");
    for flag in [
        "--start-time-us",
        "--start-time-cpu-us",
        "--parent-cpu-time-us",
    ] {
        let i = cmdline
            .iter()
            .position(|w| w == flag)
            .unwrap_or_else(|| panic!("{cmdline:?}"));
        assert!(cmdline[i + 1].parse::<u64>().is_ok(), "{cmdline:?}");
    }
    assert_eq!(proc_file(pid, "environ"), "", "the VMM's environment");
    let status = proc_file(pid, "status");
    let ids = format!("{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}");
    assert_eq!(field(&status, "Uid:"), ids);
    assert_eq!(field(&status, "CapEff:"), "0000000000000000");
    assert_eq!(field(&status, "NoNewPrivs:"), "1");
    let ns = |p: &str, kind: &str| std::fs::read_link(format!("/proc/{p}/ns/{kind}")).unwrap();
    assert_ne!(ns(&pid.to_string(), "mnt"), ns("self", "mnt"));
    let ino = std::fs::metadata(netns).unwrap().ino();
    assert_eq!(
        ns(&pid.to_string(), "net"),
        PathBuf::from(format!("net:[{ino}]"))
    );
    let cgroups = proc_file(pid, "cgroup");
    let leaf = format!("0::/{}/{}", base.parent, base.id);
    assert!(cgroups.lines().any(|l| l == leaf), "{leaf} in {cgroups}");
    let limits = proc_file(pid, "limits");
    assert_eq!(
        field(&limits, "Max open files").split_whitespace().next(),
        Some("512"),
        "{limits}"
    );
}

#[test]
fn the_jailer_lays_out_firecrackers_chroot_and_execs_the_vmm_in_it() {
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    let base = Base::new("layout");
    write_halting_kernel(&base.chroot().join("halt.elf")).unwrap();
    let netns = NetNs::bare("jailer", "none").unwrap();
    let netns_path = format!("/var/run/netns/{}", netns.name);
    let extra = [
        "--netns",
        &netns_path,
        "--cgroup-version",
        "2",
        "--cgroup",
        "cgroup.max.descendants=0",
        "--resource-limit",
        "no-file=512",
    ];
    let vmm = [
        "--kernel",
        "/halt.elf",
        "--mem",
        "64",
        "--log-level",
        "info",
    ];
    let mut cmd = base.command(&extra, &vmm);
    cmd.env("MINIVMM_TEST_SECRET", "hunter2");
    let mut vm = Vm::spawn_command(cmd).unwrap();
    // The jailer execs the VMM in place: same pid, the pid file says so.
    wait_running(vm.pid(), &|| vm.report());
    let pid_file = base.chroot().join("minivmm.pid");
    assert_eq!(
        std::fs::read_to_string(&pid_file).unwrap(),
        vm.pid().to_string()
    );
    check_jailed_vmm(&base, vm.pid(), &netns_path);
    // The jailed VMM knows the host as the unjailed one does: on a PVM host
    // it adds its recoveries (the jailer mirrors what it reads of /sys).
    let log = vm.stderr();
    let cmdline = log
        .lines()
        .find(|l| l.contains("kernel command line"))
        .unwrap_or_else(|| panic!("no command line logged\n{log}"));
    assert_eq!(
        cmdline.contains("pvm_syscall_fixup"),
        pvm_host(),
        "{cmdline}"
    );
    vm.terminate(Duration::from_secs(30));
}

#[test]
fn daemonized_in_a_new_pid_namespace_the_vmm_is_found_by_its_pid_file() {
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    let base = Base::new("daemon");
    write_halting_kernel(&base.chroot().join("halt.elf")).unwrap();
    let mut cmd = base.command(
        &["--daemonize", "--new-pid-ns"],
        &["--kernel", "/halt.elf", "--mem", "64"],
    );
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The jailer is gone; its last child wrote the VMM's pid before leaving.
    let pid_file = base.chroot().join("minivmm.pid");
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid: u32 = loop {
        if let Ok(Ok(pid)) = std::fs::read_to_string(&pid_file).map(|s| s.parse()) {
            break pid;
        }
        assert!(Instant::now() < deadline, "no pid file");
        std::thread::sleep(Duration::from_millis(20));
    };
    wait_running(pid, &|| format!("pid {pid}"));
    let status = proc_file(pid, "status");
    assert_eq!(field(&status, "NSpid:"), format!("{pid}\t1"), "{status}");
    for fd in 0..3 {
        let link = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
        assert_eq!(link, Path::new("/dev/null"), "stdio {fd}");
    }
    let stat = proc_file(pid, "stat");
    let sid: u32 = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap()
        .parse()
        .unwrap();
    let my_sid = proc_file(std::process::id(), "stat");
    let my_sid = my_sid
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap();
    assert_ne!(
        sid.to_string(),
        my_sid,
        "the daemon left the caller's session"
    );
    // SAFETY: SIGTERM to the VMM this test started.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "the VMM ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn what_the_jailer_refuses_is_one_line_and_status_1() {
    if !require(&[Need::Root]) {
        return;
    }
    let base = Base::new("refuse");
    let run = |cmd: &mut Command| {
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (minivmm, jailer) = static_minivmm_and_jailer();
    // The ordinary build is dynamically linked: it could not run in a jail.
    let dynamic = minivmm_tests::minivmm_bin();
    let mut cmd = Command::new(&jailer);
    cmd.args(["--id", "x", "--uid", "1", "--gid", "1", "--exec-file"])
        .arg(&dynamic)
        .arg("--chroot-base-dir")
        .arg(&base.dir);
    let (code, err) = run(&mut cmd);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("jailer: error: --exec-file "), "{err}");
    assert!(err.contains("dynamically linked (it needs /"), "{err}");
    let with = |id: &str, base_dir: &Path| {
        let mut cmd = Command::new(&jailer);
        cmd.args(["--id", id, "--uid", "1", "--gid", "1", "--exec-file"])
            .arg(&minivmm)
            .arg("--chroot-base-dir")
            .arg(base_dir);
        cmd
    };
    let (code, err) = run(&mut with("a_b", &base.dir));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.starts_with("jailer: error: --id 'a_b': "), "{err}");
    let missing = base.dir.join("missing");
    let (code, err) = run(&mut with("x", &missing));
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "jailer: error: --chroot-base-dir {}: not a directory",
            missing.display()
        )
    );
    // The parser's own errors are one line too; --version is no error.
    let (code, err) = run(Command::new(&jailer).args(["--id", "x"]));
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("jailer: error: ") && err.contains("--exec-file"),
        "{err}"
    );
    let out = Command::new(&jailer).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let version = String::from_utf8_lossy(&out.stdout);
    assert!(version.starts_with("jailer v"), "{version}");
    // Nothing was made for the refused VMs.
    assert_eq!(std::fs::read_dir(&base.dir).unwrap().count(), 0);
}

/// One request with curl on the VMM's socket: (status, body).
fn curl(sock: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "30", "--unix-socket"])
        .arg(sock)
        .args([
            "-X",
            method,
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ])
        .args(["-w", "\n%{http_code}"])
        .arg(format!("http://localhost{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

#[test]
fn a_guest_booted_through_the_jailer_answers_ping_through_its_tap() {
    let Some(img) = guest_image_if(&[Need::Kvm, Need::Root, Need::Tun]) else {
        return;
    };
    let base = Base::new("boot");
    let root = base.chroot();
    // As with Firecracker's jailer, the caller links the guest's files in.
    for (from, name) in [
        (&img.vmlinux, "vmlinux"),
        (&img.initramfs, "initramfs.cpio"),
    ] {
        if std::fs::hard_link(from, root.join(name)).is_err() {
            std::fs::copy(from, root.join(name)).unwrap();
        }
    }
    let netns = NetNs::bare("jailerboot", "tap0").unwrap();
    netns
        .add_tap("tap0", &format!("{HOST_IP}/24"), Some(JAIL_ID))
        .unwrap();
    let netns_path = format!("/var/run/netns/{}", netns.name);
    let cmd = base.command(
        &["--netns", &netns_path, "--cgroup-version", "2"],
        &[
            "--api-sock",
            "/run/firecracker.socket",
            "--log-level",
            "info",
        ],
    );
    let mut vm = Vm::spawn_command(cmd).unwrap();
    let sock = root.join("run/firecracker.socket");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "no API socket\n{}", vm.report());
        std::thread::sleep(Duration::from_millis(20));
    }
    // What firecracker-go-sdk sends, each answered 204.
    let boot_args = format!(
        "console=ttyS0 reboot=k panic=-1 pci=off minivmm.mode=serve \
         ip={GUEST_IP}::{HOST_IP}:255.255.255.0:guest:eth0:off"
    );
    for (path, body) in [
        (
            "/machine-config",
            r#"{"vcpu_count": 1, "mem_size_mib": 256, "smt": false}"#.to_string(),
        ),
        (
            "/boot-source",
            format!(
                r#"{{"kernel_image_path": "/vmlinux", "initrd_path": "/initramfs.cpio", "boot_args": "{boot_args}"}}"#
            ),
        ),
        (
            "/network-interfaces/eth0",
            r#"{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "06:00:ac:10:00:02"}"#
                .into(),
        ),
        ("/actions", r#"{"action_type": "InstanceStart"}"#.into()),
    ] {
        let (code, text) = curl(&sock, "PUT", path, &body);
        assert_eq!(code, 204, "PUT {path}: {text}\n{}", vm.report());
    }
    assert!(
        vm.wait_for("MINIVMM-SERVING", BOOT_TIMEOUT),
        "the guest never served\n{}",
        vm.report()
    );
    vm.assert_userspace_ran();
    let ping = netns.ping(GUEST_IP, &[]);
    assert!(
        ping.contains(&format!("bytes from {GUEST_IP}")),
        "no answer to ping through the TAP:\n{ping}\n{}",
        vm.report()
    );
    // The VMM is the process the test started (the jailer exec'd in place).
    let status = proc_file(vm.pid(), "status");
    assert_eq!(field(&status, "CapEff:"), "0000000000000000");
    assert_eq!(
        std::fs::read_to_string(root.join("minivmm.pid")).unwrap(),
        vm.pid().to_string()
    );
    vm.terminate(Duration::from_secs(60));
}
