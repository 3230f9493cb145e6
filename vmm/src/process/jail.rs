// SPDX-License-Identifier: Apache-2.0
//! minivmm's own jail (`--jail DIR --uid UID --gid GID`), as strong as
//! Firecracker's jailer, and the steps the `jailer` entry point shares
//! with it ([`super::jailer`]).
//!
//! [`enter`] runs at start-up, before minivmm opens any file the user
//! named (the config file included), in every mode. In order, each step a
//! one-line [`JailError`]:
//! 1. the environment emptied, its strings overwritten (the launching
//!    shell's variables, secrets among them, are not left in memory), but
//!    `RUST_LOG`, which the log still reads;
//! 2. the network namespace joined (`--netns PATH`), so the TAPs named
//!    later are that namespace's and the host's sockets, abstract Unix
//!    sockets and loopback ports included, are out of reach;
//! 3. rlimits ([`ResourceLimits`]): no core dumps (a core would hold guest
//!    memory), open files bounded (2048 unless `--resource-limit no-file=N`)
//!    and, with `--resource-limit fsize=N`, the size of every file written
//!    (SIGXFSZ ignored, so a write past it fails instead of killing the VM);
//! 4. a cgroup leaf of its own with the limits given ([`cgroup`]);
//! 5. the device nodes `dev/kvm` and `dev/net/tun` made inside DIR and a
//!    mount namespace whose root is DIR ([`mount`]);
//! 6. a PID namespace whose init is minivmm, in a session of its own
//!    ([`pidns`]; the process the caller started stays outside as its
//!    supervisor);
//! 7. no privilege left ([`creds`]): the ids, no capability, not dumpable,
//!    `no_new_privs`.
//!
//! What stays reachable: the jail directory's contents, the two device
//! nodes, the network namespace's devices, and the descriptors minivmm
//! opens or inherits on purpose (stdio, `fd=N` TAPs; [`close_inherited`]
//! closes the others once the configuration says which those are).
#![allow(unsafe_code)]

pub mod cgroup;
pub mod creds;
pub mod mount;
pub mod pidns;
pub mod sys;

use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use self::cgroup::{CgroupError, CgroupSpec, CgroupVersion};
use self::sys::{check, SysError};
use crate::process::seccomp::SeccompMode;

/// Open files a jailed process may hold unless told otherwise (Firecracker's
/// jailer's default).
pub const NOFILE_LIMIT: u64 = 2048;

/// Where the cgroup leaves of minivmm's own jail go, below each hierarchy's
/// root, unless `--parent-cgroup` says otherwise.
pub const DEFAULT_PARENT_CGROUP: &str = "minivmm";

/// The environment variables a jailed process keeps.
pub const KEPT_ENV: [&str; 1] = ["RUST_LOG"];

/// The rlimits of a jail (`--resource-limit fsize=N|no-file=N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResourceLimits {
    /// The largest offset a write may reach, in bytes (RLIMIT_FSIZE).
    pub fsize: Option<u64>,
    /// One more than the highest descriptor number (RLIMIT_NOFILE).
    pub nofile: u64,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            fsize: None,
            nofile: NOFILE_LIMIT,
        }
    }
}

/// Where, as whom and under which limits a jailed minivmm runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailConfig {
    /// The new root: an existing directory.
    pub root: PathBuf,
    /// The uid to run as.
    pub uid: u32,
    /// The gid to run as.
    pub gid: u32,
    /// The instance id: the name of the cgroup leaf.
    pub id: String,
    /// A network namespace to join (a path such as `/var/run/netns/NAME`).
    pub netns: Option<PathBuf>,
    /// The cgroup leaf and its limits.
    pub cgroup: CgroupSpec,
    /// The rlimits.
    pub limits: ResourceLimits,
    /// The seccomp mode of the supervisor left outside the PID namespace.
    pub seccomp: SeccompMode,
}

impl JailConfig {
    /// A jail in `root` as `uid`:`gid` for instance `id`, with the defaults:
    /// no network namespace, a v2 leaf under [`DEFAULT_PARENT_CGROUP`] with
    /// no limit, [`ResourceLimits::default`], seccomp on.
    pub fn new(root: PathBuf, uid: u32, gid: u32, id: &str) -> Self {
        JailConfig {
            root,
            uid,
            gid,
            id: id.to_string(),
            netns: None,
            cgroup: CgroupSpec {
                version: CgroupVersion::V2,
                parent: PathBuf::from(DEFAULT_PARENT_CGROUP),
                files: Vec::new(),
            },
            limits: ResourceLimits::default(),
            seccomp: SeccompMode::On,
        }
    }
}

/// Why the jail could not be entered; each names the step.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// The directory does not exist or is not a directory.
    #[error("jail directory {}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A system call of one step failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The cgroup could not be set up.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The network namespace could not be opened or joined.
    #[error("jail: cannot join the network namespace {}", .path.display())]
    Netns {
        /// The namespace's path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A `--resource-limit` argument is not `fsize=N` or `no-file=N`.
    #[error("--resource-limit '{0}': expected fsize=BYTES or no-file=N")]
    ResourceLimit(String),
    /// The mount table could not be read.
    #[error("jail: cannot read /proc/mounts")]
    Mounts(#[source] io::Error),
}

impl ResourceLimits {
    /// Takes one `--resource-limit` argument: `fsize=BYTES` or `no-file=N`
    /// (decimal, as Firecracker's jailer reads them).
    pub fn set(&mut self, spec: &str) -> Result<(), JailError> {
        let bad = || JailError::ResourceLimit(spec.to_string());
        let (name, value) = spec.split_once('=').ok_or_else(bad)?;
        let value: u64 = value.parse().map_err(|_| bad())?;
        match name {
            "fsize" => self.fsize = Some(value),
            "no-file" => self.nofile = value,
            _ => return Err(bad()),
        }
        Ok(())
    }

    /// Sets the limits (soft and hard) and no core dumps; ignores SIGXFSZ
    /// when the file size is bounded (the ignored disposition survives an
    /// exec, so the `jailer`'s VMM gets it too).
    pub fn apply(&self) -> Result<(), SysError> {
        let limits = [
            ("rlimit core", libc::RLIMIT_CORE, Some(0)),
            ("rlimit nofile", libc::RLIMIT_NOFILE, Some(self.nofile)),
            ("rlimit fsize", libc::RLIMIT_FSIZE, self.fsize),
        ];
        for (step, resource, limit) in limits {
            let Some(limit) = limit else { continue };
            let r = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            // SAFETY: a valid rlimit that lives for the call.
            check(step, unsafe { libc::setrlimit(resource, &r) })?;
        }
        if self.fsize.is_some() {
            // SAFETY: SIG_IGN for a signal that has no handler in minivmm.
            if unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) } == libc::SIG_ERR {
                return Err(SysError::last("ignore SIGXFSZ"));
            }
        }
        Ok(())
    }
}

extern "C" {
    /// The C library's environment (environ(7)).
    static mut environ: *const *mut libc::c_char;
}

/// Empties the environment but the variables named in `keep`, overwriting
/// every string first, so that no variable of the launcher's is left in
/// memory or in `/proc/PID/environ`. Single-threaded callers only.
pub fn empty_environment(keep: &[&str]) {
    let kept: Vec<(&str, OsString)> = keep
        .iter()
        .filter_map(|&k| std::env::var_os(k).map(|v| (k, v)))
        .collect();
    // SAFETY: the caller is single-threaded, so nothing reads the
    // environment meanwhile; `environ` is null or a null-terminated array
    // of NUL-terminated strings in writable memory (the initial stack, or
    // the C library's copies), each overwritten within its own length
    // before clearenv drops the array.
    unsafe {
        let mut p = environ;
        while !p.is_null() && !(*p).is_null() {
            let s = *p;
            std::ptr::write_bytes(s, 0, libc::strlen(s));
            p = p.add(1);
        }
        libc::clearenv();
    }
    for (k, v) in kept {
        std::env::set_var(k, v);
    }
}

/// Joins the network namespace at `path`.
pub fn join_netns(path: &Path) -> Result<(), JailError> {
    let err = |source| JailError::Netns {
        path: path.to_path_buf(),
        source,
    };
    let ns = std::fs::File::open(path).map_err(err)?;
    // SAFETY: a namespace descriptor that lives for the call.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(err(io::Error::last_os_error()));
    }
    Ok(())
}

/// Enters the jail (see the module doc). Single-threaded callers only: the
/// namespace and credential calls act on the calling thread, and the PID
/// namespace needs a fork. Returns in the jailed process; the process that
/// called it stays outside as its supervisor and never returns.
pub fn enter(cfg: &JailConfig) -> Result<(), JailError> {
    if !cfg.root.is_dir() {
        return Err(JailError::NotADirectory(cfg.root.clone()));
    }
    empty_environment(&KEPT_ENV);
    if let Some(ns) = &cfg.netns {
        join_netns(ns)?;
    }
    cfg.limits.apply()?;
    let mounts = std::fs::read_to_string("/proc/mounts").map_err(JailError::Mounts)?;
    cfg.cgroup
        .plan(&cfg.id, &mounts, true)?
        .apply(std::process::id())?;
    mount::device_nodes(&cfg.root, cfg.uid, cfg.gid)?;
    mount::pivot_into(&cfg.root)?;
    pidns::supervised(cfg.uid, cfg.gid, cfg.seccomp)?;
    Ok(())
}

/// Closes every inherited descriptor but 0, 1, 2 and `keep` (works in the
/// jail, which has no `/proc`).
pub fn close_inherited(keep: &[i32]) -> Result<(), SysError> {
    sys::close_all_but(keep)
}

#[cfg(test)]
mod tests;
