// SPDX-License-Identifier: Apache-2.0
//! minivmm's own jail (`--jail DIR --uid --gid`) seen from outside, on a VM
//! whose "kernel" halts at once (seconds, no guest boot; root and KVM):
//!
//! - the jailed minivmm (the only child of the process the test started,
//!   which stays outside as its supervisor) shows in `/proc` its own PID,
//!   mount and network namespaces (the one `--netns` names), its cgroup
//!   leaf with the limits given (v2, and v1 where the host has the pids
//!   controller there), RLIMIT_FSIZE and RLIMIT_NOFILE, none of the
//!   launcher's environment, a session of its own, no capability,
//!   `no_new_privs` and its seccomp filter on every thread; SIGTERM to the
//!   supervisor ends it with 0;
//! - every path the user gives resolves inside the jail, in every mode: a
//!   kernel named by its host path is not found, the config file and the
//!   kernel it names are read from the jail;
//! - the vsock socket (`--vsock cid=N,socket=PATH`) is bound inside the
//!   jail, by the jail's uid (a host path is not found there), served, and
//!   removed when minivmm ends by its remover, which runs in the jail's PID
//!   namespace as the jail's uid under its own filter;
//! - an inherited TAP descriptor (`--net fd=N`) survives the jail, while an
//!   inherited descriptor the configuration does not name is closed.
//!
//! What a process inside can reach (with no filter) is tested in
//! `vmm/src/process/jail/tests.rs`; the `jailer` entry point in
//! `tests/jailer.rs`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use minivmm_tests::{
    cgroup_mounts, children_of, cli_args, jail_args, minivmm_bin, remove_cgroups, require,
    threads_of, vsock_connect_is_closed, write_halting_kernel, Need, NetNs, Vm, JAIL_ID,
};

/// The file size limit the tests give.
const FSIZE: u64 = 1 << 20;

/// A jail directory holding the halting kernel as `/halt.elf`.
fn jail_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("minivmm-jailtest-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    write_halting_kernel(&dir.join("halt.elf")).unwrap();
    dir
}

/// `--jail DIR --uid --gid --id ID --parent-cgroup PARENT` and `extra`.
fn jailed_args(dir: &Path, id: &str, parent: &str, extra: &[&str]) -> Vec<String> {
    let mut args = jail_args(dir, id, parent);
    args.extend(cli_args(&["--mem", "64"]));
    args.extend(cli_args(extra));
    args
}

/// A cgroup parent of this test process's own (removed by [`Cleanup`]).
fn parent_cgroup(tag: &str) -> String {
    format!("minivmm-test-{tag}-{}", std::process::id())
}

/// Removes a test's jail directory and cgroup leaf when dropped.
struct Cleanup(PathBuf, String, String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        remove_cgroups(&self.1, &self.2);
    }
}

/// The jailed minivmm's pid once it runs its VM (its vCPU thread exists).
fn wait_jailed(vm: &mut Vm) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(pid) = vm.jailed_pid() {
            if threads_of(pid)
                .iter()
                .any(|(name, _)| name.starts_with("fc_vcpu"))
            {
                return pid;
            }
        }
        if vm.wait_exit(Duration::from_millis(100)).is_some() {
            panic!("minivmm exited\n{}", vm.report());
        }
    }
    panic!("no jailed minivmm running a VM after 60 s\n{}", vm.report());
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

fn ns(pid: &str, kind: &str) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap()
}

/// Whether a hierarchy of `version` 2 (true) or 1 holds `controller`.
fn has_controller(v2: bool, controller: &str) -> bool {
    cgroup_mounts().iter().any(|(mount, is_v2)| {
        *is_v2 == v2
            && match v2 {
                true => std::fs::read_to_string(mount.join("cgroup.controllers"))
                    .unwrap_or_default()
                    .split_whitespace()
                    .any(|c| c == controller),
                false => mount.join(format!("{controller}.max")).exists(),
            }
    })
}

/// What `/proc` shows of a jailed minivmm `pid` whose supervisor is `sup`.
fn check_jailed(pid: u32, sup: u32, netns: &str) {
    let status = proc_file(pid, "status");
    // Its own PID namespace, in which it is pid 1.
    assert_eq!(field(&status, "NSpid:"), format!("{pid}\t1"), "{status}");
    let ids = format!("{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}");
    assert_eq!(field(&status, "Uid:"), ids);
    assert_eq!(field(&status, "Gid:"), ids);
    assert_eq!(field(&status, "Groups:"), "");
    for caps in ["CapEff:", "CapPrm:", "CapInh:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(&status, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(field(&status, "NoNewPrivs:"), "1");
    for kind in ["pid", "mnt", "net"] {
        assert_ne!(
            ns(&pid.to_string(), kind),
            ns("self", kind),
            "{kind} namespace"
        );
    }
    let ino = std::fs::metadata(netns).unwrap().ino();
    assert_eq!(
        ns(&pid.to_string(), "net"),
        PathBuf::from(format!("net:[{ino}]"))
    );
    let limits = proc_file(pid, "limits");
    let limit = |name: &str| {
        field(&limits, name)
            .split_whitespace()
            .next()
            .map(str::to_string)
    };
    assert_eq!(limit("Max file size"), Some(FSIZE.to_string()), "{limits}");
    assert_eq!(limit("Max open files").as_deref(), Some("256"), "{limits}");
    assert_eq!(
        limit("Max core file size").as_deref(),
        Some("0"),
        "{limits}"
    );
    let env = proc_file(pid, "environ");
    assert!(!env.contains("hunter2"), "the launcher's variable: {env:?}");
    let vars = env.split('\0').filter(|v| !v.is_empty()).count();
    assert!(vars <= 1, "{vars} environment variables: {env:?}");
    let stat = proc_file(pid, "stat");
    let sid = stat.rsplit(')').next().unwrap().split_whitespace().nth(3);
    assert_eq!(sid, Some(&*pid.to_string()), "a session of its own: {stat}");
    let threads = threads_of(pid);
    assert!(threads.len() >= 2, "{threads:?}");
    assert!(threads.iter().all(|(_, mode)| mode == "2"), "{threads:?}");
    // The supervisor: outside the PID namespace, just as unprivileged.
    let status = proc_file(sup, "status");
    assert_eq!(field(&status, "Uid:"), ids);
    assert_eq!(field(&status, "CapEff:"), "0000000000000000");
    assert_eq!(field(&status, "NoNewPrivs:"), "1");
    assert_eq!(field(&status, "Seccomp:"), "2");
    assert_eq!(ns(&sup.to_string(), "pid"), ns("self", "pid"));
}

/// Runs a jailed VM with cgroup `version` and `files` and checks it from
/// outside (see the module doc).
fn jailed_vm_in_cgroup(tag: &str, version: &str, files: &[&str]) {
    let netns = NetNs::bare(tag, "none").unwrap();
    let netns_path = format!("/var/run/netns/{}", netns.name);
    let dir = jail_dir(tag);
    let (parent, id) = (parent_cgroup(tag), "jailtest");
    let _cleanup = Cleanup(dir.clone(), parent.clone(), id.into());
    let fsize = format!("fsize={FSIZE}");
    let mut extra = vec!["--kernel", "/halt.elf", "--netns", &netns_path];
    extra.extend(["--cgroup-version", version]);
    extra.extend([
        "--resource-limit",
        &fsize,
        "--resource-limit",
        "no-file=256",
    ]);
    for f in files {
        extra.extend(["--cgroup", f]);
    }
    let mut cmd = Command::new(minivmm_bin());
    cmd.args(jailed_args(&dir, id, &parent, &extra))
        .env("MINIVMM_TEST_SECRET", "hunter2");
    let mut vm = Vm::spawn_command(cmd).unwrap();
    let pid = wait_jailed(&mut vm);
    check_jailed(pid, vm.pid(), &netns_path);
    // The leaf, its limits, the jailed minivmm in it.
    let cgroups = proc_file(pid, "cgroup");
    let leaf_line = format!(":/{parent}/{id}");
    let v2 = version == "2";
    for (mount, is_v2) in cgroup_mounts().into_iter().filter(|(_, v)| *v == v2) {
        let leaf = mount.join(&parent).join(id);
        let named: Vec<&&str> = files
            .iter()
            .filter(|f| leaf.join(f.split('=').next().unwrap()).exists())
            .collect();
        if !leaf.exists() {
            continue;
        }
        assert!(
            !named.is_empty() || is_v2,
            "{} made for no file",
            leaf.display()
        );
        for f in named {
            let (file, value) = f.split_once('=').unwrap();
            let got = std::fs::read_to_string(leaf.join(file)).unwrap();
            assert_eq!(got.trim(), value, "{}", leaf.join(file).display());
        }
        let procs = std::fs::read_to_string(leaf.join("cgroup.procs")).unwrap();
        assert!(procs.lines().any(|p| p == pid.to_string()), "{procs}");
    }
    let in_leaf = cgroups.lines().filter(|l| l.ends_with(&leaf_line)).count();
    assert!(in_leaf >= 1, "{leaf_line} in {cgroups}");
    vm.terminate(Duration::from_secs(30));
}

#[test]
fn a_jailed_minivmm_has_namespaces_a_cgroup_v2_leaf_and_limits_of_its_own() {
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    if !cgroup_mounts().iter().any(|(_, v2)| *v2) {
        minivmm_tests::print_skip("no cgroup v2 hierarchy is mounted");
        return;
    }
    // A core limit always; pids.max where the v2 hierarchy has pids.
    let mut files = vec!["cgroup.max.descendants=0"];
    if has_controller(true, "pids") {
        files.push("pids.max=64");
    }
    jailed_vm_in_cgroup("v2", "2", &files);
}

#[test]
fn a_jailed_minivmm_joins_cgroup_v1_leaves_with_their_limits() {
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    if !has_controller(false, "pids") {
        minivmm_tests::print_skip("no cgroup v1 hierarchy holds the pids controller");
        return;
    }
    jailed_vm_in_cgroup("v1", "1", &["pids.max=64"]);
}

/// Runs minivmm to completion: (exit status, stderr).
fn run(args: &[String]) -> (Option<i32>, String) {
    let out = Command::new(minivmm_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running minivmm");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_path_the_user_gives_resolves_inside_the_jail() {
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    let dir = jail_dir("paths");
    let parent = parent_cgroup("paths");
    let _cleanup = Cleanup(dir.clone(), parent.clone(), "paths".into());
    // A kernel the host has, but the jail does not: not found.
    let host_kernel = std::env::temp_dir().join(format!("minivmm-host-{}.elf", std::process::id()));
    write_halting_kernel(&host_kernel).unwrap();
    let host = host_kernel.to_str().unwrap();
    let (code, err) = run(&jailed_args(&dir, "paths", &parent, &["--kernel", host]));
    let _ = std::fs::remove_file(&host_kernel);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(host) && err.contains("No such file"), "{err}");
    // The same for the config file: read from the jail, or not at all.
    let config = r#"{"boot-source": {"kernel_image_path": "/halt.elf"},
        "machine-config": {"vcpu_count": 1, "mem_size_mib": 64}}"#;
    std::fs::write(dir.join("vm.json"), config).unwrap();
    let host_config = dir.join("vm.json");
    let host_config = host_config.to_str().unwrap();
    let (code, err) = run(&jailed_args(
        &dir,
        "paths",
        &parent,
        &["--config-file", host_config],
    ));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(host_config), "{err}");
    let args = jailed_args(&dir, "paths", &parent, &["--config-file", "/vm.json"]);
    let mut vm = Vm::spawn(&args, None).unwrap();
    wait_jailed(&mut vm);
    vm.terminate(Duration::from_secs(30));
}

#[test]
fn the_vsock_socket_is_bound_served_and_removed_inside_the_jail() {
    use std::os::unix::fs::FileTypeExt;
    if !require(&[Need::Kvm, Need::Root]) {
        return;
    }
    let dir = jail_dir("vsock");
    let parent = parent_cgroup("vsock");
    let _cleanup = Cleanup(dir.clone(), parent.clone(), "vsock".into());
    // A directory the jail's uid may make its socket in.
    std::fs::create_dir(dir.join("w")).unwrap();
    std::os::unix::fs::chown(dir.join("w"), Some(JAIL_ID), Some(JAIL_ID)).unwrap();
    let host_sock = dir.join("w/v.sock");
    // Named by its host path, the socket's directory is not in the jail.
    let vsock = format!("cid=3,socket={}", host_sock.display());
    let (code, err) = run(&jailed_args(
        &dir,
        "vsock",
        &parent,
        &["--kernel", "/halt.elf", "--vsock", &vsock],
    ));
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&*host_sock.to_string_lossy()) && err.contains("No such file"),
        "{err}"
    );
    assert!(!host_sock.exists(), "bound outside the jail");
    // Named by its jail path: made in the jail, by the jail's uid.
    let args = jailed_args(
        &dir,
        "vsock",
        &parent,
        &["--kernel", "/halt.elf", "--vsock", "cid=3,socket=/w/v.sock"],
    );
    let mut vm = Vm::spawn(&args, None).unwrap();
    let pid = wait_jailed(&mut vm);
    let meta = std::fs::symlink_metadata(&host_sock).expect("the socket in the jail");
    assert!(meta.file_type().is_socket(), "{meta:?}");
    assert_eq!((meta.uid(), meta.gid()), (JAIL_ID, JAIL_ID));
    // Its remover: minivmm's child, in the jail's PID namespace, the jail's
    // uid, the signals blocked, under its own filter.
    let remover = children_of(pid)
        .into_iter()
        .find(|k| proc_file(*k, "comm").trim() == "minivmm-unlink")
        .unwrap_or_else(|| panic!("no remover among minivmm's children\n{}", vm.report()));
    let status = proc_file(remover, "status");
    let ids = format!("{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}\t{JAIL_ID}");
    assert_eq!(field(&status, "Uid:"), ids, "{status}");
    assert_eq!(field(&status, "Seccomp:"), "2", "{status}");
    let blocked = u64::from_str_radix(&field(&status, "SigBlk:"), 16).unwrap();
    for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGQUIT] {
        assert_ne!(blocked & 1 << (sig - 1), 0, "signal {sig} not blocked");
    }
    let fds = std::fs::read_dir(format!("/proc/{remover}/fd"))
        .unwrap()
        .count();
    assert_eq!(fds, 2, "it holds its two pipe ends and nothing else");
    let nspid = field(&status, "NSpid:");
    assert_eq!(
        nspid.split('\t').count(),
        2,
        "not in the jail's PID namespace: {nspid}"
    );
    assert_eq!(ns(&remover.to_string(), "pid"), ns(&pid.to_string(), "pid"));
    // Served: the halting guest has no driver, so a CONNECT is closed.
    assert!(vsock_connect_is_closed(&host_sock), "not closed");
    vm.terminate(Duration::from_secs(30));
    assert!(
        !host_sock.exists(),
        "the socket outlived the jailed minivmm"
    );
    assert!(dir.join("w").exists());
}

/// A TAP in the namespace the calling thread is in, opened as minivmm
/// wants an inherited one: `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`.
fn open_tap(name: &str) -> OwnedFd {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .unwrap();
    // SAFETY: an all-zero ifreq is valid; the name fits (checked below).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    assert!(name.len() < req.ifr_name.len());
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as i16;
    // SAFETY: TUNSETIFF reads and writes the live ifreq on a tun descriptor.
    let rc = unsafe { libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut req) };
    assert_eq!(rc, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
    tun.into()
}

/// `cmd` with each `(fd, to)`: `fd`, open in the test, as its descriptor
/// `to`.
fn inherit<const N: usize>(cmd: &mut Command, pairs: [(i32, i32); N]) {
    // SAFETY: fcntl and dup2 are async-signal-safe (and nothing here
    // allocates); the descriptors are open in the parent, so they are in the
    // child between fork and exec. All go out of the way first (one may sit
    // on another's target), then dup2 puts each in place, open across the
    // exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut high = pairs;
            for (fd, _) in high.iter_mut() {
                *fd = libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 100);
                if *fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (moved, to) in high {
                if libc::dup2(moved, to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

#[test]
fn an_unjailed_minivmm_leaves_inherited_descriptors_alone() {
    // Without a jail, a path such as /dev/fd/N (a log FIFO the launcher
    // opened) must keep working: only the jail closes what it inherited.
    if !require(&[Need::Kvm]) {
        return;
    }
    let kernel = std::env::temp_dir().join(format!("minivmm-unjailed-{}.elf", std::process::id()));
    write_halting_kernel(&kernel).unwrap();
    let stray_path = std::env::temp_dir().join(format!("minivmm-kept-{}", std::process::id()));
    let stray = std::fs::File::create(&stray_path).unwrap();
    let mut cmd = Command::new(minivmm_bin());
    cmd.args(["--kernel", kernel.to_str().unwrap(), "--mem", "64"]);
    inherit(&mut cmd, [(stray.as_raw_fd(), 4)]);
    let mut vm = Vm::spawn_command(cmd).unwrap();
    drop(stray);
    let pid = vm.pid();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !threads_of(pid)
        .iter()
        .any(|(n, _)| n.starts_with("fc_vcpu"))
    {
        assert!(Instant::now() < deadline, "no VM running\n{}", vm.report());
        std::thread::sleep(Duration::from_millis(50));
    }
    let kept = std::fs::read_link(format!("/proc/{pid}/fd/4"));
    let _ = std::fs::remove_file(&stray_path);
    let _ = std::fs::remove_file(&kernel);
    assert_eq!(kept.ok().as_deref(), Some(stray_path.as_path()));
    vm.terminate(Duration::from_secs(30));
}

#[test]
fn an_inherited_tap_descriptor_survives_the_jail_and_nothing_else_does() {
    if !require(&[Need::Kvm, Need::Root, Need::Tun]) {
        return;
    }
    let netns = NetNs::bare("jailfd", "tapfd0").unwrap();
    let tap = netns
        .in_thread(|| open_tap("tapfd0"))
        .join()
        .unwrap()
        .unwrap();
    let dir = jail_dir("fd");
    let parent = parent_cgroup("fd");
    let _cleanup = Cleanup(dir.clone(), parent.clone(), "fd".into());
    // Descriptor 4 is inherited too, and named by nothing.
    let stray_path = std::env::temp_dir().join(format!("minivmm-stray-{}", std::process::id()));
    let stray = std::fs::File::create(&stray_path).unwrap();
    let (tap_fd, stray_fd) = (tap.as_raw_fd(), stray.as_raw_fd());
    let mut cmd = Command::new(minivmm_bin());
    cmd.args(jailed_args(
        &dir,
        "fd",
        &parent,
        &["--kernel", "/halt.elf", "--net", "fd=3,id=lan"],
    ));
    inherit(&mut cmd, [(tap_fd, 3), (stray_fd, 4)]);
    let mut vm = Vm::spawn_command(cmd).unwrap();
    drop((tap, stray));
    let pid = wait_jailed(&mut vm);
    let links: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .collect();
    let _ = std::fs::remove_file(&stray_path);
    assert!(
        links.iter().any(|l| l == Path::new("/dev/net/tun")),
        "{links:?}"
    );
    assert!(
        !links.iter().any(|l| l == &stray_path),
        "the stray descriptor: {links:?}"
    );
    // The TAP lives while a descriptor holds it: minivmm's.
    netns.exec_ip(&["link", "show", "tapfd0"]).unwrap();
    vm.terminate(Duration::from_secs(30));
}
