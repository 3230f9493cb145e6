// SPDX-License-Identifier: Apache-2.0
//! The jail entered for real, in a child test process (root): what a
//! process inside can and cannot reach, with no seccomp filter, so the
//! jail alone stands between it and the host; and what `/proc` shows of it
//! from outside. The child (`jail_child`, run by re-executing this test
//! binary) enters the jail with [`enter`], becomes the supervisor outside
//! the new PID namespace while its child probes from inside and prints one
//! line per probe, then waits until the test closes its stdin.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::cgroup::{CgroupVersion, Plan};
use super::*;

/// The uid and gid the jails of these tests run as (`nobody`).
const JAIL_ID: u32 = 65534;
/// The file size limit the probe runs under.
const FSIZE: u64 = 1 << 20;
/// How the child learns what to do: `KEY=VALUE;KEY=VALUE...` in one
/// variable, read before the jail empties the environment.
const CHILD_ENV: &str = "MINIVMM_JAIL_TEST";

fn field(text: &str, name: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

fn errno_of<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(e) => e
            .raw_os_error()
            .map_or_else(|| format!("{:?}", e.kind()), |n| n.to_string()),
    }
}

/// The probes, run inside the jail; one `KEY value` line each.
fn probe(args: &std::collections::HashMap<String, String>) -> Vec<String> {
    use std::os::linux::net::SocketAddrExt;
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    let num = |k: &str| arg(k).parse::<i32>().unwrap_or(0);
    let mut out = Vec::new();
    // SAFETY: getters with no pointer arguments.
    let (pid, uid, gid) = unsafe { (libc::getpid(), libc::getuid(), libc::getgid()) };
    out.push(format!("PID {pid}"));
    out.push(format!("IDS {uid} {gid}"));
    // A host process by its host pid: invisible from a PID namespace.
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(num("host"), 0) };
    out.push(format!(
        "HOST {}",
        errno_of(check("kill", r).map_err(|e| e.source))
    ));
    // A process of the same uid outside: not traceable.
    let null = std::ptr::null_mut::<libc::c_void>();
    // SAFETY: PTRACE_ATTACH takes a pid; address and data are unused.
    let r = unsafe { libc::ptrace(libc::PTRACE_ATTACH, num("tracee"), null, null) };
    out.push(format!(
        "TRACE {}",
        errno_of(check("ptrace", r).map_err(|e| e.source))
    ));
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(arg("abstract")).unwrap();
    let r = std::os::unix::net::UnixStream::connect_addr(&addr);
    out.push(format!("ABSTRACT {}", errno_of(r)));
    let tcp: std::net::SocketAddr = format!("127.0.0.1:{}", arg("port")).parse().unwrap();
    let r = std::net::TcpStream::connect_timeout(&tcp, Duration::from_secs(2));
    out.push(format!("TCP {}", errno_of(r)));
    let r = std::fs::write("/w/big", vec![0u8; FSIZE as usize + 4096]);
    out.push(format!("FSIZE {}", errno_of(r)));
    out.push(format!(
        "FSIZE_LEN {}",
        std::fs::metadata("/w/big").map_or(0, |m| m.len())
    ));
    out.push(format!("ENV {}", std::env::vars_os().count()));
    let mut names: Vec<String> = std::fs::read_dir("/")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    out.push(format!("ROOT {}", names.join(",")));
    out.push(format!(
        "ESCAPE {}",
        Path::new("/../../etc/passwd").exists()
    ));
    // SAFETY: a getter with no pointer arguments.
    let nnp = unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) };
    out.push(format!("NNP {nnp}"));
    let mut header = [0x2008_0522u32, 0];
    let mut data = [0u32; 6];
    // SAFETY: a version-3 header and room for its two data words.
    unsafe { libc::syscall(libc::SYS_capget, header.as_mut_ptr(), data.as_mut_ptr()) };
    out.push(format!("CAPS {:x}", data.iter().fold(0, |a, w| a | w)));
    let opens = |p: &str| {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(p);
        errno_of(f)
    };
    out.push(format!("KVM {}", opens("/dev/kvm")));
    out.push(format!("TUN {}", opens("/dev/net/tun")));
    out
}

/// The body of the child test process: enters the jail the test describes
/// and, in the jailed child, runs the probes (or the signal test) and waits
/// for the test to close stdin. Never returns into libtest once jailed.
#[test]
#[ignore = "the body of the jail tests, run in a child process"]
fn jail_child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let args: std::collections::HashMap<String, String> = spec
        .split(';')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cfg = child_config(&args);
    // The jail wants a single-threaded caller (its supervisor waits for
    // signals the other threads would take): a fork of this thread alone
    // enters it, and this process waits for that fork and exits as it did.
    // SAFETY: the fork only runs this function's code, then _exits.
    let pid = unsafe { libc::fork() };
    if pid > 0 {
        let mut status = 0;
        // SAFETY: waits for the fork just made; `status` is a live int.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            99
        };
        // SAFETY: ends this process without returning into libtest.
        unsafe { libc::_exit(code) }
    }
    if let Err(e) = enter(&cfg) {
        println!("ERROR {}", crate::error_line(&e));
        std::io::stdout().flush().unwrap();
        // SAFETY: ends the fork without returning into libtest.
        unsafe { libc::_exit(3) }
    }
    // libtest wrote the test's name without a newline: the lines start here.
    println!();
    let mode = args.get("mode").cloned().unwrap_or_default();
    let code = if mode == "signal" {
        signal_child()
    } else {
        for line in probe(&args) {
            println!("{line}");
        }
        println!("READY");
        std::io::stdout().flush().unwrap();
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        0
    };
    std::io::stdout().flush().unwrap();
    // SAFETY: ends the jailed child without returning into the test
    // harness, whose other threads this fork does not have.
    unsafe { libc::_exit(code) }
}

/// Reads SIGTERM from a signalfd (the supervisor forwards it) and exits 42.
fn signal_child() -> i32 {
    let signals = crate::process::signals::SignalFd::new(&[libc::SIGTERM]).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    loop {
        if let Ok(Some(sig)) = signals.read() {
            println!("GOT {sig}");
            return 42;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn child_config(args: &std::collections::HashMap<String, String>) -> JailConfig {
    let arg = |k: &str| args.get(k).cloned().unwrap_or_default();
    let mut cfg = JailConfig::new(PathBuf::from(arg("dir")), JAIL_ID, JAIL_ID, &arg("id"));
    cfg.netns = args.get("netns").map(PathBuf::from);
    cfg.cgroup.parent = PathBuf::from(arg("parent"));
    if arg("version") == "1" {
        cfg.cgroup.version = CgroupVersion::V1;
    }
    for f in arg("files").split(',').filter(|f| !f.is_empty()) {
        cfg.cgroup.files.push(super::cgroup::parse_file(f).unwrap());
    }
    cfg.limits.set(&format!("fsize={FSIZE}")).unwrap();
    cfg.limits.set("no-file=64").unwrap();
    cfg
}

/// A jail directory for one test: a marker, `w/` writable by the jail's
/// uid; a network namespace; removed on drop, with the cgroup leaves.
struct Rig {
    dir: PathBuf,
    netns: String,
    parent: String,
}

impl Rig {
    fn new(tag: &str) -> Rig {
        let dir = std::env::temp_dir().join(format!("minivmm-jail-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("w")).unwrap();
        std::fs::write(dir.join("marker"), "inside").unwrap();
        std::os::unix::fs::chown(dir.join("w"), Some(JAIL_ID), Some(JAIL_ID)).unwrap();
        let netns = format!("minivmm-jail-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &netns])
            .stderr(Stdio::null())
            .status();
        let ok = Command::new("ip")
            .args(["netns", "add", &netns])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {netns}");
        Rig {
            dir,
            netns,
            parent: format!("minivmm-unit-{tag}-{}", std::process::id()),
        }
    }

    fn netns_path(&self) -> String {
        format!("/var/run/netns/{}", self.netns)
    }

    /// Starts `jail_child` with `spec` (the rig's own keys added).
    fn spawn(&self, spec: &str) -> Child {
        let spec = format!(
            "{spec};dir={};netns={};parent={}",
            self.dir.display(),
            self.netns_path(),
            self.parent
        );
        Command::new(std::env::current_exe().unwrap())
            .args(["--ignored", "--exact", "process::jail::tests::jail_child"])
            .args(["--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, spec)
            .env("MINIVMM_JAIL_TEST_SECRET", "hunter2")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Removes the leaves and the parent cgroups of `plan`.
    fn remove_cgroups(&self, plan: &Plan) {
        for leaf in &plan.leaves {
            let _ = std::fs::remove_dir(&leaf.dir);
            if let Some(parent) = leaf.dir.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .status();
    }
}

/// Reads the child's stdout until `READY` (or its end); the lines read.
fn until_ready(child: &mut Child) -> (Vec<String>, BufReader<std::process::ChildStdout>) {
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            break;
        }
        let line = line.trim_end().to_string();
        let ready = line == "READY";
        lines.push(line);
        if ready {
            break;
        }
    }
    (lines, out)
}

/// The only child of process `pid` (the supervisor the child test process
/// forked, the jailed process of a supervisor).
fn only_child(pid: u32) -> u32 {
    // Each thread lists the children it forked.
    let mut kids = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let text = std::fs::read_to_string(task.unwrap().path().join("children")).unwrap();
        kids.extend(text.split_whitespace().map(|p| p.parse::<u32>().unwrap()));
    }
    assert_eq!(kids.len(), 1, "children of {pid}: {kids:?}");
    kids[0]
}

fn proc_file(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{name}")).unwrap_or_default()
}

fn ns_of(pid: &str, kind: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap()
}

fn skip_unless_root() -> bool {
    // SAFETY: a getter.
    if unsafe { libc::geteuid() } != 0 {
        minivmm_tests::print_skip("entering a jail needs root (CI runs as root)");
        return true;
    }
    false
}

/// The cgroup files of the v2 run: a core limit always, `pids.max` where
/// the unified hierarchy has the pids controller.
fn v2_files(mounts: &str) -> String {
    let plan = CgroupSpec {
        version: CgroupVersion::V2,
        parent: PathBuf::from("probe"),
        files: Vec::new(),
    }
    .plan("x", mounts, true)
    .unwrap();
    let Some(leaf) = plan.leaves.first() else {
        return String::new();
    };
    let controllers =
        std::fs::read_to_string(leaf.mount.join("cgroup.controllers")).unwrap_or_default();
    match controllers.split_whitespace().any(|c| c == "pids") {
        true => "cgroup.max.descendants=0,pids.max=32".into(),
        false => "cgroup.max.descendants=0".into(),
    }
}

/// What `/proc` shows of the jailed process `gc` and its supervisor `sup`.
fn check_from_outside(rig: &Rig, sup: u32, gc: u32, plan: &Plan) {
    let status = proc_file(gc, "status");
    assert_eq!(field(&status, "NSpid:"), format!("{gc}\t1"), "{status}");
    let ids = format!("{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}");
    assert_eq!(field(&status, "Uid:"), ids);
    assert_eq!(field(&status, "Gid:"), ids);
    for caps in ["CapEff:", "CapPrm:", "CapInh:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(&status, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(field(&status, "NoNewPrivs:"), "1");
    // SIGXFSZ ignored: a write past fsize fails instead of killing it.
    let ignored = u64::from_str_radix(&field(&status, "SigIgn:"), 16).unwrap();
    assert_ne!(
        ignored & (1 << (libc::SIGXFSZ - 1)),
        0,
        "SigIgn: {ignored:x}"
    );
    // Its own PID and mount namespaces, and the network namespace given.
    for kind in ["pid", "mnt", "net"] {
        assert_ne!(ns_of(&gc.to_string(), kind), ns_of("self", kind), "{kind}");
    }
    let netns_ino = std::fs::metadata(rig.netns_path()).unwrap().ino();
    assert_eq!(
        ns_of(&gc.to_string(), "net"),
        PathBuf::from(format!("net:[{netns_ino}]"))
    );
    let limits = proc_file(gc, "limits");
    let limit = |name: &str| {
        field(&limits, name)
            .split_whitespace()
            .next()
            .map(str::to_string)
    };
    assert_eq!(limit("Max file size").as_deref(), Some(&*FSIZE.to_string()));
    assert_eq!(limit("Max open files").as_deref(), Some("64"));
    assert_eq!(limit("Max core file size").as_deref(), Some("0"));
    // The launcher's variables are gone, from /proc and from memory.
    let env_block = proc_file(gc, "environ");
    assert!(!env_block.contains("hunter2"), "{env_block:?}");
    assert!(env_block.split('\0').filter(|v| !v.is_empty()).count() <= 1);
    // A session of its own.
    let stat = proc_file(gc, "stat");
    let sid = stat.rsplit(')').next().unwrap().split_whitespace().nth(3);
    assert_eq!(sid, Some(&*gc.to_string()), "{stat}");
    // Its cgroup leaves, their limits, both processes in them.
    let cgroups = proc_file(gc, "cgroup");
    for leaf in &plan.leaves {
        let rel = leaf.dir.strip_prefix(&leaf.mount).unwrap();
        let line = format!(":/{}", rel.display());
        assert!(
            cgroups.lines().any(|l| l.ends_with(&line)),
            "{line} in {cgroups}"
        );
        for (file, value) in &leaf.files {
            let got = std::fs::read_to_string(leaf.dir.join(file)).unwrap();
            assert_eq!(got.trim(), value, "{file}");
        }
        let procs = std::fs::read_to_string(leaf.dir.join("cgroup.procs")).unwrap();
        for pid in [gc, sup] {
            assert!(
                procs.lines().any(|p| p == pid.to_string()),
                "{pid} in {procs}"
            );
        }
    }
    // The supervisor: outside the PID namespace, no privilege, filtered,
    // nothing open but stdio and the pipe the jailed process watches.
    let status = proc_file(sup, "status");
    assert_eq!(field(&status, "Uid:"), ids);
    assert_eq!(field(&status, "CapEff:"), "0000000000000000");
    assert_eq!(field(&status, "NoNewPrivs:"), "1");
    assert_eq!(field(&status, "Seccomp:"), "2");
    assert_eq!(ns_of(&sup.to_string(), "pid"), ns_of("self", "pid"));
    let fds = std::fs::read_dir(format!("/proc/{sup}/fd"))
        .unwrap()
        .count();
    assert!(fds <= 4, "the supervisor holds {fds} descriptors");
}

/// What the probes inside the jail reported.
fn check_from_inside(lines: &[String]) {
    let text = lines.join("\n");
    let line = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k} ")))
            .unwrap_or_else(|| panic!("no {k} line in\n{text}"))
            .to_string()
    };
    let esrch = libc::ESRCH.to_string();
    assert_eq!(
        line("PID"),
        "1",
        "the jailed process is its namespace's init"
    );
    assert_eq!(line("IDS"), format!("{JAIL_ID} {JAIL_ID}"));
    assert_eq!(line("HOST"), esrch, "a host process is visible");
    assert_eq!(
        line("TRACE"),
        esrch,
        "a same-uid process outside is traceable"
    );
    assert_eq!(
        line("ABSTRACT"),
        libc::ECONNREFUSED.to_string(),
        "the host's abstract socket is reachable"
    );
    let tcp = line("TCP");
    assert!(
        [libc::ECONNREFUSED, libc::ENETUNREACH]
            .map(|e| e.to_string())
            .contains(&tcp),
        "the host's 127.0.0.1 port: {tcp}"
    );
    assert_eq!(line("FSIZE"), libc::EFBIG.to_string(), "a write past fsize");
    assert_eq!(line("FSIZE_LEN"), FSIZE.to_string());
    let vars: usize = line("ENV").parse().unwrap();
    assert!(vars <= KEPT_ENV.len(), "{vars} variables");
    assert_eq!(line("ROOT"), "dev,marker,w");
    assert_eq!(line("ESCAPE"), "false");
    assert_eq!(line("NNP"), "1");
    assert_eq!(line("CAPS"), "0", "no capability left");
    // The jail's own device nodes open for the dropped uid, where the
    // host's (root's, mode 0600 here) would not.
    for (dev, key) in [("/dev/kvm", "KVM"), ("/dev/net/tun", "TUN")] {
        if Path::new(dev).exists() {
            assert_eq!(line(key), "ok", "{dev} from inside the jail");
        }
    }
}

/// Runs the probes in a jail with a cgroup leaf of `version` and `files`.
fn run_probe(tag: &str, version: CgroupVersion, files: &str) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::process::CommandExt;
    let rig = Rig::new(tag);
    let name = format!("minivmm-jail-test-{tag}-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
    let _abstract = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut tracee = Command::new("sleep")
        .arg("600")
        .uid(JAIL_ID)
        .gid(JAIL_ID)
        .spawn()
        .unwrap();
    let v = if version == CgroupVersion::V1 { 1 } else { 2 };
    let mut child = rig.spawn(&format!(
        "id=probe;version={v};files={files};host={};tracee={};abstract={name};port={}",
        std::process::id(),
        tracee.id(),
        tcp.local_addr().unwrap().port()
    ));
    let (lines, mut rest) = until_ready(&mut child);
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let spec = child_config(
        &[
            ("parent", rig.parent.clone()),
            ("version", v.to_string()),
            ("files", files.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    )
    .cgroup;
    let plan = spec.plan("probe", &mounts, true).unwrap();
    let ready = lines.last().map(String::as_str) == Some("READY");
    if ready {
        let sup = only_child(child.id());
        check_from_outside(&rig, sup, only_child(sup), &plan);
    }
    drop(child.stdin.take());
    let mut tail = String::new();
    let _ = rest.read_to_string(&mut tail);
    let status = child.wait().unwrap();
    let _ = tracee.kill();
    let _ = tracee.wait();
    rig.remove_cgroups(&plan);
    assert!(ready && status.success(), "{status}: {lines:?} {tail}");
    check_from_inside(&lines);
}

#[test]
fn a_jailed_process_reaches_nothing_outside_its_jail() {
    if skip_unless_root() {
        return;
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    run_probe("v2", CgroupVersion::V2, &v2_files(&mounts));
}

#[test]
fn a_jailed_process_gets_cgroup_v1_leaves_with_their_limits() {
    if skip_unless_root() {
        return;
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let v1_pids = mounts.lines().any(|l| {
        l.contains(" cgroup ")
            && l.split_whitespace()
                .nth(3)
                .is_some_and(|o| o.split(',').any(|o| o == "pids"))
    });
    if !v1_pids {
        minivmm_tests::print_skip("no cgroup v1 hierarchy holds the pids controller");
        return;
    }
    run_probe("v1", CgroupVersion::V1, "pids.max=32");
}

/// SIGKILL to a supervisor when dropped (its jailed process dies with it),
/// so that a failed test leaves nothing running.
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// Starts a jailed child that reads SIGTERM from a signalfd: the child
/// test process, the supervisor's pid and the jailed process's.
fn signal_rig(tag: &str) -> (Rig, Child, i32, u32) {
    let rig = Rig::new(tag);
    let mut child = rig.spawn("id=sig;mode=signal;version=2;files=");
    let (lines, out) = until_ready(&mut child);
    child.stdout = Some(out.into_inner());
    assert_eq!(lines.last().map(String::as_str), Some("READY"), "{lines:?}");
    let sup = only_child(child.id());
    let gc = only_child(sup);
    (rig, child, sup as i32, gc)
}

fn remove_signal_rig_cgroup(rig: &Rig) {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let mut spec = JailConfig::new(PathBuf::new(), 0, 0, "sig").cgroup;
    spec.parent = PathBuf::from(&rig.parent);
    rig.remove_cgroups(&spec.plan("sig", &mounts, true).unwrap());
}

fn gone(pid: u32) -> bool {
    for _ in 0..100 {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn the_supervisor_forwards_sigterm_and_exits_with_the_jailed_status() {
    if skip_unless_root() {
        return;
    }
    let (rig, mut child, sup, gc) = signal_rig("term");
    let _reap = KillOnDrop(sup);
    // A jailed process stopped and continued is no end: the supervisor
    // waits on.
    for sig in [libc::SIGSTOP, libc::SIGCONT] {
        // SAFETY: a signal to the jailed process this test started.
        unsafe { libc::kill(gc as i32, sig) };
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(child.try_wait().unwrap().is_none(), "the supervisor left");
    // SAFETY: a signal to the supervisor this test started.
    unsafe { libc::kill(sup, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    remove_signal_rig_cgroup(&rig);
    assert_eq!(status.code(), Some(42), "{out}");
    assert!(out.contains(&format!("GOT {}", libc::SIGTERM)), "{out}");
}

#[test]
fn sighup_to_the_supervisor_ends_the_jailed_process() {
    if skip_unless_root() {
        return;
    }
    let (rig, mut child, sup, gc) = signal_rig("hup");
    let _reap = KillOnDrop(sup);
    // SAFETY: a signal to the supervisor this test started.
    unsafe { libc::kill(sup, libc::SIGHUP) };
    let status = child.wait().unwrap();
    let ended = gone(gc);
    remove_signal_rig_cgroup(&rig);
    assert_eq!(status.code(), Some(128 + libc::SIGHUP));
    assert!(ended, "the jailed process outlived its supervisor");
}

#[test]
fn killing_the_supervisor_kills_the_jailed_process() {
    if skip_unless_root() {
        return;
    }
    let (rig, mut child, sup, gc) = signal_rig("kill");
    // SAFETY: a signal to the supervisor this test started.
    unsafe { libc::kill(sup, libc::SIGKILL) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(99), "the supervisor was killed");
    let ended = gone(gc);
    remove_signal_rig_cgroup(&rig);
    assert!(ended, "the jailed process outlived its supervisor");
}

#[test]
fn inherited_descriptors_are_closed_but_those_kept() {
    let null = std::fs::File::open("/dev/null").unwrap();
    let null = std::os::fd::AsRawFd::as_raw_fd(&null);
    // Three neighbours, whatever numbers the test process has in use.
    let fds = [100, 101, 102];
    for (keep, want) in [
        (vec![101, 101, 1, -5], [false, true, false]),
        (vec![102, 100], [true, false, true]),
        (vec![100, 101], [true, true, false]),
        (vec![], [false, false, false]),
    ] {
        // SAFETY: the child only makes system calls (dup2, close_range,
        // fcntl) and _exits; it touches memory set up before the fork.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            for fd in fds {
                // SAFETY: duplicates an open descriptor onto a number the
                // child then owns.
                unsafe { libc::dup2(null, fd) };
            }
            let mut code = i32::from(close_inherited(&keep).is_ok()) << 4;
            for (i, fd) in fds.iter().chain(&[2]).enumerate() {
                // SAFETY: F_GETFD only reads a descriptor's flags.
                code |= i32::from(unsafe { libc::fcntl(*fd, libc::F_GETFD) } >= 0) << i;
            }
            // SAFETY: ends the child without returning into the harness.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just made.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let want = want
            .iter()
            .enumerate()
            .fold(0x18, |a, (i, &w)| a | (i32::from(w) << i));
        assert_eq!(libc::WEXITSTATUS(status), want, "keep {keep:?} of {fds:?}");
    }
}

#[test]
fn a_file_that_is_no_network_namespace_is_refused() {
    // Opened, but setns refuses it: nothing changes for the test process.
    let e = join_netns(Path::new("/dev/null")).unwrap_err();
    assert_eq!(
        crate::error_line(&e),
        "jail: cannot join the network namespace /dev/null: Invalid argument (os error 22)"
    );
    let e = join_netns(Path::new("/nonexistent/netns")).unwrap_err();
    assert!(crate::error_line(&e).ends_with("No such file or directory (os error 2)"));
}

#[test]
fn a_missing_directory_is_one_line() {
    let e = enter(&JailConfig::new(
        "/nonexistent/minivmm-jail".into(),
        1,
        1,
        "x",
    ))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "jail directory /nonexistent/minivmm-jail: not a directory"
    );
}

#[test]
fn resource_limits_are_fsize_and_no_file() {
    let mut l = ResourceLimits::default();
    assert_eq!(
        l,
        ResourceLimits {
            fsize: None,
            nofile: NOFILE_LIMIT
        }
    );
    l.set("fsize=1048576").unwrap();
    l.set("no-file=100").unwrap();
    assert_eq!(
        l,
        ResourceLimits {
            fsize: Some(1 << 20),
            nofile: 100
        }
    );
    for bad in [
        "fsize",
        "fsize=",
        "fsize=-1",
        "nofile=3",
        "cpu=1",
        "no-file=x",
    ] {
        let e = l.set(bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("--resource-limit '{bad}': expected fsize=BYTES or no-file=N")
        );
    }
    assert_eq!(
        l,
        ResourceLimits {
            fsize: Some(1 << 20),
            nofile: 100
        }
    );
}
