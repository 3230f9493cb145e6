// SPDX-License-Identifier: Apache-2.0
//! A jail of minivmm's own, in the spirit of Firecracker's jailer: once the
//! VM is built and before the guest runs, the process moves into a new mount
//! namespace whose root is a directory the operator chose, drops to an
//! unprivileged uid and gid, and keeps no capability.
//!
//! [`enter`] does, in this order, each step a one-line [`JailError`]:
//! 1. a new mount namespace, with every mount made private so nothing the
//!    process does there propagates to the host;
//! 2. the jail directory bind-mounted on itself (pivot_root needs a mount
//!    point), then `dev/kvm` and `dev/net/tun` made inside it, where the
//!    host has them, as nodes of the same devices owned by the jail's uid
//!    and gid, mode 0600 (as Firecracker's jailer makes them): the only
//!    device nodes reachable, for the TAPs and the VM opened after the
//!    jail (descriptors already open stay valid);
//! 3. `pivot_root` into it and the old root detached, so no path resolves
//!    outside the directory any more;
//! 4. no supplementary groups, then the gid and the uid (real, effective
//!    and saved), after which the kernel clears every capability of a
//!    non-root uid; the capability sets are cleared explicitly too, so a jail
//!    with uid 0 keeps none either;
//! 5. `no_new_privs`, so no later exec can gain privileges;
//! 6. rlimits: no core dumps (a core would hold guest memory) and a bound
//!    on open files.
//!
//! What stays reachable: descriptors opened before (guest memory, KVM, the
//! TAPs, the disk images, the API socket, log and metrics files), the
//! jail directory's contents, and the two device nodes. Paths given later
//! (through the API) resolve inside the directory.
//!
//! [`close_inherited`] is the other half: at start-up, before minivmm opens
//! anything, it closes every descriptor it inherited but stdin, stdout,
//! stderr and the ones the configuration names (`fd=N` TAPs), so what the
//! jail keeps is only what minivmm itself owns.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Open files a jailed minivmm may hold (Firecracker's jailer sets 2048).
pub const NOFILE_LIMIT: u64 = 2048;

/// Where and as whom minivmm runs once jailed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailConfig {
    /// The new root: an existing directory.
    pub root: PathBuf,
    /// The uid to run as.
    pub uid: u32,
    /// The gid to run as.
    pub gid: u32,
}

/// Why the jail could not be entered; each names the step.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// The directory does not exist or is not a directory.
    #[error("jail directory {}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A system call of one step failed.
    #[error("jail: {step} failed: {source}")]
    Step {
        /// The step, as the module doc numbers them.
        step: &'static str,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn check(step: &'static str, ret: libc::c_int) -> Result<(), JailError> {
    if ret < 0 {
        return Err(JailError::Step {
            step,
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn cpath(step: &'static str, p: &Path) -> Result<CString, JailError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| JailError::Step {
        step,
        source: io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"),
    })
}

fn bind(step: &'static str, from: &Path, to: &Path) -> Result<(), JailError> {
    let (from, to) = (cpath(step, from)?, cpath(step, to)?);
    // SAFETY: both are NUL-terminated paths that outlive the call; the
    // null fstype and data are allowed for a bind mount.
    let ret = unsafe {
        libc::mount(
            from.as_ptr(),
            to.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        )
    };
    check(step, ret)
}

/// Enters the jail (see the module doc). Single-threaded callers only:
/// `unshare(CLONE_NEWNS)` and the credential calls act on the calling
/// thread, and threads created earlier would stay outside.
pub fn enter(cfg: &JailConfig) -> Result<(), JailError> {
    if !cfg.root.is_dir() {
        return Err(JailError::NotADirectory(cfg.root.clone()));
    }
    // SAFETY: unshare takes flags only.
    check("unshare(CLONE_NEWNS)", unsafe {
        libc::unshare(libc::CLONE_NEWNS)
    })?;
    let slash = cpath("make / private", Path::new("/"))?;
    // SAFETY: a NUL-terminated path; a propagation change takes no source,
    // type or data.
    check("make / private", unsafe {
        libc::mount(
            std::ptr::null(),
            slash.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    })?;
    bind("bind the jail directory", &cfg.root, &cfg.root)?;
    for dev in ["kvm", "net/tun"] {
        let host = Path::new("/dev").join(dev);
        if host.exists() {
            device_node(&host, &cfg.root.join("dev").join(dev), cfg.uid, cfg.gid)?;
        }
    }
    std::env::set_current_dir(&cfg.root).map_err(|source| JailError::Step {
        step: "chdir into the jail",
        source,
    })?;
    let dot = cpath("pivot_root", Path::new("."))?;
    // SAFETY: pivot_root(".", ".") stacks the old root on the new one (see
    // pivot_root(2)); both arguments are the same NUL-terminated path.
    check("pivot_root", unsafe {
        libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) as libc::c_int
    })?;
    // SAFETY: detaches the old root, now mounted on "."; a path and flags.
    check("detach the old root", unsafe {
        libc::umount2(dot.as_ptr(), libc::MNT_DETACH)
    })?;
    std::env::set_current_dir("/").map_err(|source| JailError::Step {
        step: "chdir to the new root",
        source,
    })?;
    drop_privileges(cfg.uid, cfg.gid)?;
    set_rlimits()
}

/// A character device node at `inside` for the host's `host`, owned by
/// `uid`:`gid` with mode 0600, as Firecracker's jailer makes them: the
/// host's node is often root's alone, and the jailed uid must be able to
/// open it (a TAP or a VM the API configures is opened after the jail).
/// The jail directory must be on a file system that allows device nodes.
fn device_node(host: &Path, inside: &Path, uid: u32, gid: u32) -> Result<(), JailError> {
    use std::os::unix::fs::MetadataExt;
    let step = |step: &'static str| move |source| JailError::Step { step, source };
    let rdev = std::fs::metadata(host)
        .map_err(step("stat a host device node"))?
        .rdev();
    if let Some(dir) = inside.parent() {
        std::fs::create_dir_all(dir).map_err(step("create dev/ in the jail"))?;
    }
    match std::fs::remove_file(inside) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(step("replace a device node")(e)),
    }
    let path = cpath("create a device node", inside)?;
    // SAFETY: a NUL-terminated path that outlives the call; mode and
    // device number are integers.
    check("create a device node", unsafe {
        libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o600, rdev as libc::dev_t)
    })?;
    // SAFETY: the same path; plain integer ids.
    check("chown a device node", unsafe {
        libc::chown(path.as_ptr(), uid, gid)
    })
}

fn drop_privileges(uid: u32, gid: u32) -> Result<(), JailError> {
    // SAFETY: an empty group list; the pointer is not read for 0 entries.
    check("setgroups", unsafe { libc::setgroups(0, std::ptr::null()) })?;
    // SAFETY: plain integer arguments.
    check("setresgid", unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: plain integer arguments.
    check("setresuid", unsafe { libc::setresuid(uid, uid, uid) })?;
    // The kernel clears the capabilities of a non-root uid by itself; a
    // jail as uid 0 must not keep them either.
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a version-3 header and the two data words it requires, both
    // live for the call; pid 0 is the calling thread.
    check("clear capabilities", unsafe {
        libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) as libc::c_int
    })?;
    // SAFETY: prctl with integer arguments only.
    check("no_new_privs", unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    })?;
    Ok(())
}

fn set_rlimits() -> Result<(), JailError> {
    for (step, resource, limit) in [
        ("rlimit core", libc::RLIMIT_CORE, 0),
        ("rlimit nofile", libc::RLIMIT_NOFILE, NOFILE_LIMIT),
    ] {
        let r = libc::rlimit {
            rlim_cur: limit,
            rlim_max: limit,
        };
        // SAFETY: a valid rlimit that lives for the call.
        check(step, unsafe { libc::setrlimit(resource, &r) })?;
    }
    Ok(())
}

/// Closes every inherited descriptor but 0, 1, 2 and `keep`.
pub fn close_inherited(keep: &[i32]) -> io::Result<()> {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        if fd > 2 && !keep.contains(&fd) {
            // SAFETY: closing a descriptor number; the directory listing's
            // own descriptor is already closed (the iterator is consumed),
            // and nothing in this process owns the others yet.
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD_ENV: &str = "MINIVMM_JAIL_TEST_DIR";

    fn field(status: &str, name: &str) -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    }

    /// Runs in a child process (see below): enters the jail and reports
    /// what the process looks like from inside.
    #[test]
    #[ignore = "the body of jailed_process_is_confined, run in a child process"]
    fn jail_child() {
        let Ok(dir) = std::env::var(CHILD_ENV) else {
            return;
        };
        // Read before the jail hides /proc.
        let status_before = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(
            field(&status_before, "Uid:").split_whitespace().next(),
            Some("0")
        );
        enter(&JailConfig {
            root: dir.into(),
            uid: 65534,
            gid: 65534,
        })
        .unwrap();
        let mut names: Vec<String> = std::fs::read_dir("/")
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        println!("ROOT {}", names.join(","));
        println!("MARKER {}", std::fs::read_to_string("/marker").unwrap());
        println!("ESCAPE {}", Path::new("/../../etc/passwd").exists());
        // SAFETY: plain getters.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        println!("IDS {uid} {gid}");
        println!(
            "NNP {}",
            // SAFETY: a getter with no pointer arguments.
            unsafe { libc::prctl(libc::PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) }
        );
        let mut r = libc::rlimit {
            rlim_cur: 1,
            rlim_max: 1,
        };
        // SAFETY: r lives for the call.
        unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut r) };
        println!("CORE {}", r.rlim_max);
        let mut header = [0x2008_0522u32, 0];
        let mut data = [0u32; 6];
        // SAFETY: a version-3 header and room for its two data words.
        let ret =
            unsafe { libc::syscall(libc::SYS_capget, header.as_mut_ptr(), data.as_mut_ptr()) };
        assert_eq!(ret, 0);
        println!("CAPS {:x}", data.iter().fold(0, |a, w| a | w));
        let opens = |p: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .is_ok()
        };
        println!("KVM {}", opens("/dev/kvm"));
        println!("TUN {}", opens("/dev/net/tun"));
    }

    #[test]
    fn jailed_process_is_confined() {
        // SAFETY: a getter.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: entering a jail needs root (CI runs as root)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("minivmm-jail-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("marker"), "inside").unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "process::jail::tests::jail_child",
                "--nocapture",
            ])
            .env(CHILD_ENV, &dir)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k} ")))
                .unwrap_or_else(|| panic!("no {k} line in {text}"))
                .to_string()
        };
        let root = line("ROOT");
        assert!(
            root.split(',').all(|n| ["dev", "marker"].contains(&n)),
            "{root}"
        );
        assert_eq!(line("MARKER"), "inside");
        assert_eq!(line("ESCAPE"), "false");
        assert_eq!(line("IDS"), "65534 65534");
        assert_eq!(line("NNP"), "1");
        assert_eq!(line("CORE"), "0");
        assert_eq!(
            line("CAPS"),
            "0",
            "no capability left, effective or permitted"
        );
        // The jail's own device nodes open for the dropped uid, where the
        // host's (root's, mode 0600 here) would not.
        for (dev, key) in [("/dev/kvm", "KVM"), ("/dev/net/tun", "TUN")] {
            if Path::new(dev).exists() {
                assert_eq!(line(key), "true", "{dev} from inside the jail");
            }
        }
    }

    #[test]
    fn a_missing_directory_is_one_line() {
        let e = enter(&JailConfig {
            root: "/nonexistent/minivmm-jail".into(),
            uid: 1,
            gid: 1,
        })
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "jail directory /nonexistent/minivmm-jail: not a directory"
        );
    }
}
