// SPDX-License-Identifier: Apache-2.0
//! The `jailer` entry point: Firecracker's jailer's command line and steps,
//! so that an orchestrator that starts Firecracker through its jailer
//! (firecracker-go-sdk, firecracker-containerd, Kata Containers) starts
//! minivmm the same way.
//!
//! ```text
//! jailer --id ID --exec-file PATH --uid UID --gid GID [--chroot-base-dir DIR]
//!        [--netns PATH] [--daemonize] [--new-pid-ns] [--cgroup FILE=VALUE]...
//!        [--cgroup-version 1|2] [--parent-cgroup NAME]
//!        [--resource-limit fsize=N|no-file=N]... [-- VMM FLAGS]
//! ```
//!
//! [`Jailer::run`] takes Firecracker's jailer's steps in its order: every
//! inherited descriptor but stdio closed and the environment emptied (at
//! start, by the binary, `vmm/src/bin/jailer.rs`); the arguments checked (the id as Firecracker's, the
//! exec file a static executable: the jail holds no shared library); the
//! chroot `<chroot-base-dir>/<exec-file name>/<id>/root` made and the exec
//! file copied into it, owned by the uid (a copy, so two VMs never share
//! the binary's pages), and what minivmm reads of the host's `/sys`
//! mirrored there ([`Jailer::mirror_host_facts`]); the network namespace joined; the rlimits; the
//! cgroup ([`super::jail::cgroup`], Firecracker's rules for which leaves
//! exist); the device nodes and the mount namespace with the chroot as its
//! root ([`super::jail::mount`]); `/`, `/dev`, `/dev/net` and `/run` owned
//! by the uid, mode 0700 (the VMM makes its API socket there); with
//! `--daemonize` a double fork, a new session and stdio on `/dev/null`;
//! with `--new-pid-ns` a fork into a new PID namespace whose parent exits;
//! the pid of the process that execs written to `/<exec-file name>.pid` in
//! the chroot; every privilege dropped ([`super::jail::creds`], more than
//! Firecracker's jailer, which only changes the ids); and an exec of
//! `/<exec-file name> --id ID --start-time-us T --start-time-cpu-us C
//! --parent-cpu-time-us P` and the flags after `--`, with an empty
//! environment. SIGXFSZ is ignored when `fsize` is bounded, and the VMM
//! inherits that (a write past the limit fails instead of killing it).
//!
//! `--cgroup-version` defaults to 1, as Firecracker's: a command line
//! written for Firecracker's jailer means the same here.
#![allow(unsafe_code)]

use std::ffi::{CString, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Parser;

use super::jail::cgroup::{parse_file, parse_parent, CgroupError, CgroupSpec, CgroupVersion};
use super::jail::sys::SysError;
use super::jail::{creds, join_netns, mount, pidns, JailError, ResourceLimits};
use crate::kvm::pvm::PVM_MODULE;

/// Firecracker's jailer's default chroot base.
pub const DEFAULT_CHROOT_BASE: &str = "/srv/jailer";

/// The folders of the chroot the VMM's uid owns, mode 0700, as
/// Firecracker's jailer makes them (`/run` holds the default API socket).
const OWNED_FOLDERS: [&str; 4] = ["/", "/dev", "/dev/net", "/run"];

/// Firecracker's jailer's command line.
#[derive(Debug, Parser, PartialEq)]
#[command(
    name = "jailer",
    version = concat!("v", env!("CARGO_PKG_VERSION")),
    about = "Starts a VMM jailed as Firecracker's jailer does (its flags, its chroot layout).",
    after_help = "Every argument after -- goes to the VMM."
)]
pub struct JailerArgs {
    /// The VM's id: 1 to 64 letters, digits and '-'.
    #[arg(long)]
    pub id: String,
    /// The VMM binary (a static executable), copied into the jail.
    #[arg(long, value_name = "PATH")]
    pub exec_file: PathBuf,
    /// The uid the VMM runs as.
    #[arg(long)]
    pub uid: u32,
    /// The gid the VMM runs as.
    #[arg(long)]
    pub gid: u32,
    /// Where jails are made: the chroot is DIR/<exec-file name>/<id>/root.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_CHROOT_BASE)]
    pub chroot_base_dir: PathBuf,
    /// A network namespace to join (e.g. /var/run/netns/NAME).
    #[arg(long, value_name = "PATH")]
    pub netns: Option<PathBuf>,
    /// Start a new session, stdio on /dev/null, and leave the caller.
    #[arg(long)]
    pub daemonize: bool,
    /// Exec the VMM as the first process of a new PID namespace; the
    /// jailer exits once its pid is written.
    #[arg(long)]
    pub new_pid_ns: bool,
    /// Write VALUE into FILE of the VM's cgroup (cpuset.cpus=0); repeatable.
    #[arg(long = "cgroup", value_name = "FILE=VALUE")]
    pub cgroup: Vec<String>,
    /// The cgroup hierarchy: 1 or 2.
    #[arg(long, value_name = "1|2", default_value = "1")]
    pub cgroup_version: String,
    /// Where the VM's cgroup goes, below the hierarchy's root [default: the
    /// exec file's name].
    #[arg(long, value_name = "NAME")]
    pub parent_cgroup: Option<String>,
    /// fsize=BYTES or no-file=N (default 2048); repeatable.
    #[arg(long = "resource-limit", value_name = "RESOURCE=N")]
    pub resource_limit: Vec<String>,
    /// The VMM's own flags.
    #[arg(last = true, value_name = "VMM FLAGS")]
    pub vmm_args: Vec<OsString>,
}

/// Why the jailer stopped; each one line.
#[derive(Debug, thiserror::Error)]
pub enum JailerError {
    /// A flag is invalid.
    #[error("{0}")]
    Usage(String),
    /// The exec file is missing or not a regular file.
    #[error("--exec-file {}: not a regular file", .0.display())]
    NotAFile(PathBuf),
    /// The exec file needs a program interpreter (shared libraries).
    #[error(
        "--exec-file {}: dynamically linked (it needs {interp}), but the jail holds no shared \
         library: give a static build (README, \"Jailer\")",
        .path.display()
    )]
    Dynamic {
        /// The exec file.
        path: PathBuf,
        /// Its program interpreter.
        interp: String,
    },
    /// The exec file is not a 64-bit ELF executable.
    #[error("--exec-file {}: not a 64-bit ELF executable", .0.display())]
    NotElf(PathBuf),
    /// The chroot base is missing or not a directory.
    #[error("--chroot-base-dir {}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    /// A file of the jail could not be made.
    #[error("cannot {what} {}", .path.display())]
    Io {
        /// What was done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A step the jail shares with minivmm's own failed.
    #[error(transparent)]
    Jail(#[from] JailError),
    /// A system call failed.
    #[error(transparent)]
    Sys(#[from] SysError),
    /// The cgroup could not be set up.
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> JailerError {
    let path = path.to_path_buf();
    move |source| JailerError::Io { what, path, source }
}

/// The jailer's work, checked: where and as whom the VMM runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jailer {
    /// The VM's id.
    pub id: String,
    /// The exec file, canonical.
    pub exec_file: PathBuf,
    /// Its file name: the chroot's folder and the binary's name inside.
    pub exec_name: OsString,
    /// `<chroot-base-dir>/<exec name>/<id>/root`.
    pub chroot: PathBuf,
    /// The uid the VMM runs as.
    pub uid: u32,
    /// The gid the VMM runs as.
    pub gid: u32,
    /// A network namespace to join.
    pub netns: Option<PathBuf>,
    /// `--daemonize`.
    pub daemonize: bool,
    /// `--new-pid-ns`.
    pub new_pid_ns: bool,
    /// The cgroup.
    pub cgroup: CgroupSpec,
    /// The rlimits.
    pub limits: ResourceLimits,
    /// The VMM's own flags.
    pub vmm_args: Vec<OsString>,
}

/// What kind of executable a file is, for the jail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Executable {
    /// A 64-bit ELF file without a program interpreter: runs in a jail.
    Static,
    /// A 64-bit ELF file that needs this program interpreter (`PT_INTERP`).
    Dynamic(String),
    /// Not a 64-bit little-endian ELF file, or one cut short.
    NotElf,
}

/// Reads the ELF header and program headers at the start of `file`.
pub fn executable(file: &mut impl Read) -> Executable {
    let mut image = Vec::new();
    // The headers and the interpreter's name sit at the start of the file.
    if file.take(64 << 10).read_to_end(&mut image).is_err() {
        return Executable::NotElf;
    }
    elf_interpreter(&image).map_or(Executable::NotElf, |interp| {
        interp.map_or(Executable::Static, Executable::Dynamic)
    })
}

/// The interpreter of the ELF image `image` (`Some(None)`: none), or
/// `None` when it is not a whole 64-bit little-endian ELF header.
fn elf_interpreter(image: &[u8]) -> Option<Option<String>> {
    let bytes = |o: usize, n: usize| image.get(o..o.checked_add(n)?);
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes(o, 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes(o, 4)?.try_into().ok()?));
    let usize_at =
        |o: usize| usize::try_from(u64::from_le_bytes(bytes(o, 8)?.try_into().ok()?)).ok();
    if bytes(0, 6)? != [0x7f, b'E', b'L', b'F', 2, 1] {
        return None;
    }
    let (phoff, phentsize, phnum) = (usize_at(32)?, u16_at(54)?, u16_at(56)?);
    for i in 0..usize::from(phnum) {
        let ph = phoff.checked_add(i.checked_mul(usize::from(phentsize))?)?;
        if u32_at(ph)? != libc::PT_INTERP {
            continue;
        }
        let name = bytes(usize_at(ph + 8)?, usize_at(ph + 32)?)?;
        let name = name.split(|&b| b == 0).next().unwrap_or_default();
        return Some(Some(String::from_utf8_lossy(name).into_owned()));
    }
    Some(None)
}

impl JailerArgs {
    /// Checks the flags and the files they name (see the module doc).
    pub fn validate(self) -> Result<Jailer, JailerError> {
        let usage = |e: &dyn std::error::Error| JailerError::Usage(e.to_string());
        crate::config::cli::check_id(&self.id).map_err(|e| usage(&e))?;
        let exec_file = std::fs::canonicalize(&self.exec_file)
            .ok()
            .filter(|p| p.is_file())
            .ok_or_else(|| JailerError::NotAFile(self.exec_file.clone()))?;
        let mut f = std::fs::File::open(&exec_file).map_err(io_err("open", &exec_file))?;
        match executable(&mut f) {
            Executable::Static => {}
            Executable::NotElf => return Err(JailerError::NotElf(exec_file)),
            Executable::Dynamic(interp) => {
                return Err(JailerError::Dynamic {
                    path: exec_file,
                    interp,
                })
            }
        }
        let exec_name = exec_file
            .file_name()
            .expect("a canonical path to a file has a file name")
            .to_os_string();
        let base = std::fs::canonicalize(&self.chroot_base_dir)
            .ok()
            .filter(|p| p.is_dir())
            .ok_or_else(|| JailerError::NotADirectory(self.chroot_base_dir.clone()))?;
        let chroot = base.join(&exec_name).join(&self.id).join("root");
        let parent = match &self.parent_cgroup {
            Some(p) => parse_parent(p)?,
            None => PathBuf::from(&exec_name),
        };
        let mut cgroup = CgroupSpec {
            version: CgroupVersion::parse(&self.cgroup_version)?,
            parent,
            files: Vec::new(),
        };
        for c in &self.cgroup {
            cgroup.files.push(parse_file(c)?);
        }
        let mut limits = ResourceLimits::default();
        for r in &self.resource_limit {
            limits.set(r)?;
        }
        Ok(Jailer {
            id: self.id,
            exec_file,
            exec_name,
            chroot,
            uid: self.uid,
            gid: self.gid,
            netns: self.netns,
            daemonize: self.daemonize,
            new_pid_ns: self.new_pid_ns,
            cgroup,
            limits,
            vmm_args: self.vmm_args,
        })
    }
}

impl Jailer {
    /// The chroot, and the exec file copied into it as the uid's, mode as
    /// the original's. A hard link to another file is refused: the copy
    /// would write through it.
    pub fn copy_exec_file(&self) -> Result<PathBuf, JailerError> {
        std::fs::create_dir_all(&self.chroot).map_err(io_err("create", &self.chroot))?;
        let to = self.chroot.join(&self.exec_name);
        let mut from =
            std::fs::File::open(&self.exec_file).map_err(io_err("open", &self.exec_file))?;
        let mode = from
            .metadata()
            .map_err(io_err("stat", &self.exec_file))?
            .mode();
        let mut copy = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .custom_flags(libc::O_NOFOLLOW)
            .mode(0o700)
            .open(&to)
            .map_err(io_err("create", &to))?;
        if copy.metadata().map_err(io_err("stat", &to))?.nlink() > 1 {
            return Err(io_err("overwrite", &to)(io::Error::other(
                "it has other hard links",
            )));
        }
        copy.set_len(0).map_err(io_err("truncate", &to))?;
        std::io::copy(&mut from, &mut copy).map_err(io_err("copy the exec file to", &to))?;
        std::os::unix::fs::fchown(&copy, Some(self.uid), Some(self.gid))
            .map_err(io_err("chown", &to))?;
        // The mode again: a file that was there keeps its own on open.
        copy.set_permissions(std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(io_err("chmod", &to))?;
        Ok(to)
    }

    /// What the VMM reads of the host's `/sys`, which the jail does not
    /// have, mirrored into the chroot (as Firecracker's jailer copies the
    /// CPU cache and MIDR files there on aarch64): minivmm's PVM-host check
    /// looks for [`PVM_MODULE`], so an empty directory of that name stands
    /// for the host's where the host has it.
    pub fn mirror_host_facts(&self) -> Result<(), JailerError> {
        if Path::new(PVM_MODULE).is_dir() {
            let inside = self.chroot.join(PVM_MODULE.trim_start_matches('/'));
            std::fs::create_dir_all(&inside).map_err(io_err("create", &inside))?;
        }
        Ok(())
    }

    /// Makes the folders of [`OWNED_FOLDERS`] (inside the jail) the uid's.
    fn own_folders(&self) -> Result<(), JailerError> {
        for folder in OWNED_FOLDERS.map(Path::new) {
            std::fs::create_dir_all(folder).map_err(io_err("create", folder))?;
            std::fs::set_permissions(folder, std::fs::Permissions::from_mode(0o700))
                .map_err(io_err("chmod", folder))?;
            std::os::unix::fs::chown(folder, Some(self.uid), Some(self.gid))
                .map_err(io_err("chown", folder))?;
        }
        Ok(())
    }

    /// Writes `pid` to `/<exec name>.pid` (inside the jail), where
    /// Firecracker's jailer writes it.
    fn write_pid(&self, pid: i32) -> Result<(), JailerError> {
        let mut name = self.exec_name.clone();
        name.push(".pid");
        let path = Path::new("/").join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| io::Write::write_all(&mut f, pid.to_string().as_bytes()))
            .map_err(io_err("write", &path))
    }
}

/// `s` as a C string for exec (arguments come from the command line, where
/// no NUL can be).
fn c_string(s: impl Into<OsString>) -> Result<CString, JailerError> {
    CString::new(s.into().into_vec())
        .map_err(|_| JailerError::Usage("an argument holds a NUL byte".into()))
}

impl Jailer {
    /// Takes every step of the module doc and execs the VMM; returns only
    /// when a step failed. `started_us` is when the jailer started
    /// (CLOCK_MONOTONIC, passed on as `--start-time-us`).
    pub fn run(&self, started_us: u64) -> JailerError {
        match self.jail_and_exec(started_us) {
            Err(e) => e,
            Ok(never) => match never {},
        }
    }

    fn jail_and_exec(&self, started_us: u64) -> Result<std::convert::Infallible, JailerError> {
        self.copy_exec_file()?;
        self.mirror_host_facts()?;
        if let Some(ns) = &self.netns {
            join_netns(ns)?;
        }
        self.limits.apply()?;
        let mounts = std::fs::read_to_string("/proc/mounts").map_err(JailError::Mounts)?;
        self.cgroup
            .plan(&self.id, &mounts, false)?
            .apply(std::process::id())?;
        let dev_null = match self.daemonize {
            true => Some(
                std::fs::File::open("/dev/null").map_err(io_err("open", Path::new("/dev/null")))?,
            ),
            false => None,
        };
        mount::device_nodes(&self.chroot, self.uid, self.gid)?;
        mount::pivot_into(&self.chroot)?;
        self.own_folders()?;
        // The jailer's CPU time before the forks below (a fork's child
        // starts from zero): `--parent-cpu-time-us`.
        let jailer_cpu_us = crate::process_cpu_us();
        if let Some(null) = &dev_null {
            use std::os::fd::AsRawFd;
            pidns::daemonize(null.as_raw_fd())?;
        }
        if self.new_pid_ns {
            if let Some(child) = pidns::fork_and_leave()? {
                self.write_pid(child)?;
                // SAFETY: the parent's work is done; it ends as Firecracker's
                // jailer's does, at once, exit status 0.
                unsafe { libc::_exit(0) }
            }
        } else {
            self.write_pid(std::process::id() as i32)?;
        }
        creds::drop_privileges(self.uid, self.gid)?;
        Err(self.exec(started_us, jailer_cpu_us))
    }

    /// Execs the VMM inside the jail with Firecracker's jailer's flags and
    /// an empty environment; returns why it could not.
    fn exec(&self, started_us: u64, jailer_cpu_us: u64) -> JailerError {
        let path = Path::new("/").join(&self.exec_name);
        let mut words: Vec<OsString> = vec![path.clone().into_os_string()];
        for (flag, value) in [
            ("--id", self.id.clone()),
            ("--start-time-us", started_us.to_string()),
            ("--start-time-cpu-us", crate::process_cpu_us().to_string()),
            ("--parent-cpu-time-us", jailer_cpu_us.to_string()),
        ] {
            words.extend([flag.into(), value.into()]);
        }
        words.extend(self.vmm_args.iter().cloned());
        let argv = match words
            .into_iter()
            .map(c_string)
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(argv) => argv,
            Err(e) => return e,
        };
        let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        let envp = [std::ptr::null::<libc::c_char>()];
        // SAFETY: argv[0] is the path and a NUL-terminated string; both
        // arrays are null-terminated and outlive the call, which returns
        // only on failure.
        unsafe { libc::execve(argv[0].as_ptr(), ptrs.as_ptr(), envp.as_ptr()) };
        io_err("exec", &path)(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Result<JailerArgs, String> {
        JailerArgs::try_parse_from(std::iter::once("jailer").chain(words.iter().copied()))
            .map_err(|e| crate::config::cli::clap_line(&e))
    }

    /// A scratch directory with a static "VMM" (the tests' halting ELF,
    /// which has no program interpreter) and a chroot base.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("minivmm-jailer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("base")).unwrap();
        minivmm_tests::write_halting_kernel(&dir.join("vmm")).unwrap();
        dir
    }

    fn args(dir: &Path, extra: &[&str]) -> JailerArgs {
        let exec = dir.join("vmm");
        let base = dir.join("base");
        let mut words = vec!["--id", "vm-1", "--uid", "123", "--gid", "100"];
        words.extend(["--exec-file", exec.to_str().unwrap()]);
        words.extend(["--chroot-base-dir", base.to_str().unwrap()]);
        words.extend(extra);
        parse(&words).unwrap()
    }

    #[test]
    fn firecrackers_command_line_parses_with_its_defaults() {
        let a = parse(&[
            "--id",
            "551e7604-e35c-42b3-b825-416853441234",
            "--cgroup",
            "cpuset.mems=0",
            "--cgroup",
            "cpuset.cpus=0-1",
            "--exec-file",
            "/usr/bin/firecracker",
            "--uid",
            "123",
            "--gid",
            "100",
            "--netns",
            "/var/run/netns/my_netns",
            "--daemonize",
            "--new-pid-ns",
            "--resource-limit",
            "fsize=250000000",
            "--resource-limit",
            "no-file=1024",
            "--",
            "--api-sock",
            "/run/firecracker.socket",
        ])
        .unwrap();
        assert_eq!(a.id, "551e7604-e35c-42b3-b825-416853441234");
        assert_eq!(a.cgroup, ["cpuset.mems=0", "cpuset.cpus=0-1"]);
        assert_eq!((a.uid, a.gid), (123, 100));
        assert_eq!(
            a.netns.as_deref(),
            Some(Path::new("/var/run/netns/my_netns"))
        );
        assert!(a.daemonize && a.new_pid_ns);
        assert_eq!(a.resource_limit, ["fsize=250000000", "no-file=1024"]);
        assert_eq!(a.vmm_args, ["--api-sock", "/run/firecracker.socket"]);
        // Firecracker's defaults.
        assert_eq!(a.chroot_base_dir, Path::new("/srv/jailer"));
        assert_eq!(a.cgroup_version, "1");
        assert_eq!(a.parent_cgroup, None);
        let a = parse(&["--id", "x", "--exec-file", "f", "--uid", "1", "--gid", "2"]).unwrap();
        assert!(!a.daemonize && !a.new_pid_ns && a.vmm_args.is_empty() && a.netns.is_none());
        assert!(parse(&["--exec-file", "f", "--uid", "1", "--gid", "2"])
            .unwrap_err()
            .contains("--id"));
    }

    #[test]
    fn the_chroot_is_base_exec_name_id_root_and_the_flags_are_checked() {
        let dir = scratch("layout");
        let j = args(
            &dir,
            &["--cgroup", "pids.max=10", "--resource-limit", "fsize=4096"],
        )
        .validate()
        .unwrap();
        let base = std::fs::canonicalize(dir.join("base")).unwrap();
        assert_eq!(j.chroot, base.join("vmm/vm-1/root"));
        assert_eq!(j.exec_name, "vmm");
        assert_eq!(j.exec_file, std::fs::canonicalize(dir.join("vmm")).unwrap());
        assert_eq!(j.cgroup.version, CgroupVersion::V1);
        assert_eq!(j.cgroup.parent, Path::new("vmm"), "the exec file's name");
        assert_eq!(j.cgroup.files, [("pids.max".to_string(), "10".to_string())]);
        assert_eq!(
            j.limits,
            ResourceLimits {
                fsize: Some(4096),
                nofile: 2048
            }
        );
        let j = args(&dir, &["--cgroup-version", "2", "--parent-cgroup", "a/b"])
            .validate()
            .unwrap();
        assert_eq!(
            (j.cgroup.version, j.cgroup.parent),
            (CgroupVersion::V2, "a/b".into())
        );
        let refused =
            |extra: &[&str]| crate::error_line(&args(&dir, extra).validate().unwrap_err());
        let exec = dir.join("vmm");
        for (extra, want) in [
            (
                vec!["--cgroup", "pids"],
                "--cgroup 'pids': expected FILE=VALUE",
            ),
            (
                vec!["--cgroup-version", "3"],
                "--cgroup-version '3': expected 1 or 2",
            ),
            (vec!["--parent-cgroup", "../x"], "--parent-cgroup '../x'"),
            (
                vec!["--resource-limit", "cpu=1"],
                "--resource-limit 'cpu=1'",
            ),
        ] {
            let got = refused(&extra);
            assert!(got.starts_with(want), "{extra:?}: {got}");
        }
        let mut a = args(&dir, &[]);
        a.id = "a/b".into();
        assert!(crate::error_line(&a.validate().unwrap_err()).starts_with("--id 'a/b'"));
        let mut a = args(&dir, &[]);
        a.chroot_base_dir = dir.join("missing");
        let e = crate::error_line(&a.validate().unwrap_err());
        assert_eq!(
            e,
            format!(
                "--chroot-base-dir {}: not a directory",
                dir.join("missing").display()
            )
        );
        let mut a = args(&dir, &[]);
        a.exec_file = dir.clone();
        let e = crate::error_line(&a.validate().unwrap_err());
        assert_eq!(
            e,
            format!("--exec-file {}: not a regular file", dir.display())
        );
        std::fs::write(&exec, "#!/bin/sh\n").unwrap();
        let e = crate::error_line(&args(&dir, &[]).validate().unwrap_err());
        let canonical = std::fs::canonicalize(&exec).unwrap();
        assert_eq!(
            e,
            format!(
                "--exec-file {}: not a 64-bit ELF executable",
                canonical.display()
            )
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A 64-bit ELF header with `phnum` program headers of `ptype` at 64,
    /// the first one's segment the interpreter's name.
    fn elf(ptype: u32, interp: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 64 + 56];
        f[..6].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1]);
        f[32..40].copy_from_slice(&64u64.to_le_bytes());
        f[54..56].copy_from_slice(&56u16.to_le_bytes());
        f[56..58].copy_from_slice(&1u16.to_le_bytes());
        f[64..68].copy_from_slice(&ptype.to_le_bytes());
        f[72..80].copy_from_slice(&120u64.to_le_bytes());
        f[96..104].copy_from_slice(&(interp.len() as u64).to_le_bytes());
        f.extend_from_slice(interp);
        f
    }

    #[test]
    fn a_dynamic_executable_is_told_from_a_static_one() {
        let check = |image: Vec<u8>| executable(&mut &image[..]);
        let ld = b"/lib64/ld-linux-x86-64.so.2\0";
        assert_eq!(
            check(elf(libc::PT_INTERP, ld)),
            Executable::Dynamic("/lib64/ld-linux-x86-64.so.2".into())
        );
        assert_eq!(check(elf(libc::PT_LOAD, ld)), Executable::Static);
        let mut two = elf(libc::PT_LOAD, b"");
        two[56..58].copy_from_slice(&2u16.to_le_bytes());
        two.truncate(120);
        two.extend_from_slice(&elf(libc::PT_INTERP, b"/x\0")[64..120]);
        two[120 + 8..120 + 16].copy_from_slice(&176u64.to_le_bytes());
        two.extend_from_slice(b"/x\0");
        assert_eq!(
            check(two),
            Executable::Dynamic("/x".into()),
            "the second header"
        );
        // Cut short, 32-bit, big-endian, not ELF.
        let mut cut = elf(libc::PT_INTERP, ld);
        cut.truncate(100);
        assert_eq!(check(cut), Executable::NotElf);
        let mut cut = elf(libc::PT_INTERP, ld);
        cut.truncate(125);
        assert_eq!(check(cut), Executable::NotElf, "the name cut short");
        for (at, byte) in [(4, 1), (5, 2), (1, b'X')] {
            let mut f = elf(libc::PT_LOAD, b"");
            f[at] = byte;
            assert_eq!(check(f), Executable::NotElf);
        }
        assert_eq!(check(Vec::new()), Executable::NotElf);
        // The real thing: the C library's own shell is dynamic here.
        if let Ok(mut sh) = std::fs::File::open("/bin/sh") {
            assert!(matches!(
                executable(&mut sh),
                Executable::Dynamic(_) | Executable::Static
            ));
        }
    }

    #[test]
    fn the_exec_file_is_copied_whole_as_the_uids_and_never_through_a_link() {
        // SAFETY: a getter.
        if unsafe { libc::geteuid() } != 0 {
            minivmm_tests::print_skip("chown needs root (CI runs as root)");
            return;
        }
        let dir = scratch("copy");
        std::fs::set_permissions(dir.join("vmm"), std::fs::Permissions::from_mode(0o751)).unwrap();
        let j = args(&dir, &[]).validate().unwrap();
        // A longer file in the way is replaced, not overwritten in part.
        std::fs::create_dir_all(&j.chroot).unwrap();
        std::fs::write(j.chroot.join("vmm"), vec![7u8; 100_000]).unwrap();
        let to = j.copy_exec_file().unwrap();
        assert_eq!(to, j.chroot.join("vmm"));
        assert_eq!(
            std::fs::read(&to).unwrap(),
            std::fs::read(dir.join("vmm")).unwrap()
        );
        let meta = std::fs::metadata(&to).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (123, 100));
        assert_eq!(meta.mode() & 0o7777, 0o751);
        // A hard link to another file is refused, and that file untouched.
        std::fs::remove_file(&to).unwrap();
        std::fs::write(dir.join("other"), "other").unwrap();
        std::fs::hard_link(dir.join("other"), &to).unwrap();
        let e = crate::error_line(&j.copy_exec_file().unwrap_err());
        assert_eq!(
            e,
            format!("cannot overwrite {}: it has other hard links", to.display())
        );
        assert_eq!(std::fs::read_to_string(dir.join("other")).unwrap(), "other");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A static x86-64 executable that exits with its argc:
    /// `mov rdi, [rsp]; mov eax, 60; syscall`, loaded at 0x401000.
    fn exit_argc_elf() -> Vec<u8> {
        static_elf(&[0x48, 0x8b, 0x3c, 0x24, 0xb8, 60, 0, 0, 0, 0x0f, 0x05])
    }

    /// A static x86-64 executable that sleeps 60 s, then exits 0 (so that
    /// one a failed test left behind goes by itself): `lea rdi, [rip+18];
    /// xor esi, esi; mov eax, 35; syscall` (nanosleep), `mov eax, 60; xor
    /// edi, edi; syscall`, and the timespec `{60, 0}`.
    fn pause_elf() -> Vec<u8> {
        let mut code = vec![0x48, 0x8d, 0x3d, 18, 0, 0, 0, 0x31, 0xf6, 0xb8, 35, 0, 0, 0];
        code.extend([0x0f, 0x05, 0xb8, 60, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05]);
        code.extend(60u64.to_le_bytes());
        code.extend(0u64.to_le_bytes());
        static_elf(&code)
    }

    /// `code` as a static x86-64 executable loaded at 0x401000.
    fn static_elf(code: &[u8]) -> Vec<u8> {
        let mut f = elf(libc::PT_LOAD, b"");
        f.truncate(120);
        f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        f[18..20].copy_from_slice(&0x3eu16.to_le_bytes()); // EM_X86_64
        f[20..24].copy_from_slice(&1u32.to_le_bytes());
        f[24..32].copy_from_slice(&0x40_1000u64.to_le_bytes()); // e_entry
        f[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        f[68..72].copy_from_slice(&5u32.to_le_bytes()); // R X
        f[72..80].copy_from_slice(&0x1000u64.to_le_bytes()); // p_offset
        f[80..88].copy_from_slice(&0x40_1000u64.to_le_bytes()); // p_vaddr
        f[88..96].copy_from_slice(&0x40_1000u64.to_le_bytes()); // p_paddr
        f[96..104].copy_from_slice(&(code.len() as u64).to_le_bytes());
        f[104..112].copy_from_slice(&(code.len() as u64).to_le_bytes());
        f[112..120].copy_from_slice(&0x1000u64.to_le_bytes());
        f.resize(0x1000, 0);
        f.extend_from_slice(code);
        f
    }

    const CHILD_ENV: &str = "MINIVMM_JAILER_TEST";
    /// `1`: the jailer runs as a session leader, `0`: it does not; set,
    /// the jailer's output goes to stderr (null), out of the VMM's hands.
    const LEADER_ENV: &str = "MINIVMM_JAILER_TEST_LEADER";

    /// The body of the run tests, in a child test process: parses the
    /// jailer's words from the environment, forks (a single-threaded
    /// process takes the jail) and reports how the fork ended.
    #[test]
    #[ignore = "the body of the jailer run tests, run in a child process"]
    fn jailer_child() {
        let Ok(words) = std::env::var(CHILD_ENV) else {
            return;
        };
        let jailer = parse(&words.split(' ').collect::<Vec<_>>())
            .unwrap()
            .validate()
            .unwrap();
        // SAFETY: the fork runs the jailer, which execs or _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            if let Some(leader) = std::env::var_os(LEADER_ENV) {
                if leader == "1" {
                    // SAFETY: no arguments; a fork's child leads no group.
                    unsafe { libc::setsid() };
                }
                // The VMM of these tests pauses for good: it must not hold
                // the output the test reads to its end (stderr is null).
                // SAFETY: duplicates an open descriptor onto stdout.
                unsafe { libc::dup2(2, 1) };
            }
            let e = jailer.run(crate::monotonic_us());
            println!("\nERROR {}", crate::error_line(&e));
            std::io::Write::flush(&mut std::io::stdout()).unwrap();
            // SAFETY: ends the fork without returning into libtest.
            unsafe { libc::_exit(3) }
        }
        let mut status = 0;
        // SAFETY: waits for the fork just made; `status` is a live int.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        println!("\nFORK {pid} STATUS {}", libc::WEXITSTATUS(status));
        std::io::Write::flush(&mut std::io::stdout()).unwrap();
        // SAFETY: ends the child test process without returning into libtest.
        unsafe { libc::_exit(0) }
    }

    /// Runs the jailer with `flags` on the exit-argc executable in a
    /// child; its output, and the fork's pid and exit status.
    fn run_jailer(dir: &Path, flags: &[&str]) -> (String, u32, i32) {
        run_jailer_on(dir, &exit_argc_elf(), flags, None)
    }

    /// Runs the jailer with `flags` on executable `vmm`, which pauses, in a
    /// child, as a session leader if `leader`.
    fn run_paused(dir: &Path, vmm: &[u8], flags: &[&str], leader: bool) -> (String, u32, i32) {
        run_jailer_on(dir, vmm, flags, Some(leader))
    }

    /// Runs the jailer with `flags` on executable `vmm` in a child; with
    /// `leader` given, as a session leader or not and with its output out
    /// of the VMM's hands.
    fn run_jailer_on(
        dir: &Path,
        vmm: &[u8],
        flags: &[&str],
        leader: Option<bool>,
    ) -> (String, u32, i32) {
        std::fs::write(dir.join("vmm"), vmm).unwrap();
        std::fs::set_permissions(dir.join("vmm"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut words = vec!["--id", "vm-1", "--uid", "65534", "--gid", "65534"];
        let (exec, base) = (dir.join("vmm"), dir.join("base"));
        words.extend(["--exec-file", exec.to_str().unwrap()]);
        words.extend(["--chroot-base-dir", base.to_str().unwrap()]);
        words.extend(flags);
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([
            "--ignored",
            "--exact",
            "process::jailer::tests::jailer_child",
        ])
        .args(["--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, words.join(" "));
        if let Some(leader) = leader {
            cmd.env(LEADER_ENV, if leader { "1" } else { "0" })
                .stderr(std::process::Stdio::null());
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let fork = text
            .lines()
            .find_map(|l| l.strip_prefix("FORK "))
            .unwrap_or_else(|| panic!("{text}"));
        let (pid, status) = fork.split_once(" STATUS ").unwrap();
        (text.clone(), pid.parse().unwrap(), status.parse().unwrap())
    }

    fn skip_unless_root() -> bool {
        // SAFETY: a getter.
        if unsafe { libc::geteuid() } != 0 {
            minivmm_tests::print_skip("the jail needs root (CI runs as root)");
            return true;
        }
        false
    }

    #[test]
    fn the_jailer_execs_the_vmm_in_its_chroot_with_firecrackers_flags() {
        if skip_unless_root() {
            return;
        }
        let dir = scratch("run");
        let parent = format!("minivmm-jailer-unit-{}", std::process::id());
        let flags = [
            "--cgroup-version",
            "2",
            "--parent-cgroup",
            &parent,
            "--cgroup",
            "cgroup.max.descendants=0",
            "--",
            "--api-sock",
            "/run/firecracker.socket",
        ];
        let (text, pid, status) = run_jailer(&dir, &flags);
        // argv: the path, four flags with their values, the two after `--`.
        assert_eq!(status, 1 + 8 + 2, "{text}");
        let root = std::fs::canonicalize(dir.join("base"))
            .unwrap()
            .join("vmm/vm-1/root");
        assert_eq!(
            std::fs::read_to_string(root.join("vmm.pid")).unwrap(),
            pid.to_string()
        );
        for (p, mode) in [
            ("", 0o700),
            ("dev", 0o700),
            ("dev/net", 0o700),
            ("run", 0o700),
            ("vmm", 0o755),
        ] {
            let m = std::fs::metadata(root.join(p)).unwrap();
            assert_eq!(
                (m.uid(), m.gid(), m.mode() & 0o7777),
                (65534, 65534, mode),
                "{p}"
            );
        }
        if Path::new("/dev/kvm").exists() {
            let m = std::fs::metadata(root.join("dev/kvm")).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o7777), (65534, 0o600));
        }
        // The host's PVM module mirrored where minivmm looks for it.
        let mirrored = root.join("sys/module/kvm_pvm").is_dir();
        assert_eq!(
            mirrored,
            Path::new(PVM_MODULE).is_dir(),
            "sys/module/kvm_pvm"
        );
        // The leaf was made, its limit written, the jailer moved in.
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        let v2 = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(2) == Some("cgroup2"));
        if let Some(v2) = v2.and_then(|l| l.split_whitespace().nth(1)) {
            let leaf = Path::new(v2).join(&parent).join("vm-1");
            let limit = std::fs::read_to_string(leaf.join("cgroup.max.descendants"));
            let _ = std::fs::remove_dir(&leaf);
            let _ = std::fs::remove_dir(leaf.parent().unwrap());
            assert_eq!(limit.unwrap().trim(), "0");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The pid the jailer wrote into the chroot of `dir`'s VM.
    fn vmm_pid(dir: &Path) -> u32 {
        let root = std::fs::canonicalize(dir.join("base")).unwrap();
        let pid_file = root.join("vmm/vm-1/root/vmm.pid");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Ok(Ok(p)) = std::fs::read_to_string(&pid_file).map(|s| s.parse()) {
                return p;
            }
            assert!(std::time::Instant::now() < deadline, "no pid file");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Field `n` (from 1, as proc(5) numbers them) of /proc/PID/stat.
    fn stat_field(pid: u32, n: usize) -> String {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after = stat.rsplit(')').next().unwrap();
        after.split_whitespace().nth(n - 3).unwrap().to_string()
    }

    /// Waits until `pid` runs the exec'd program (its copy in the chroot).
    fn wait_exec(pid: u32) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/exe")).map_or(true, |e| !e.ends_with("vmm")) {
            assert!(
                std::time::Instant::now() < deadline,
                "{pid} never exec'd the VMM"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn kill(pid: u32) {
        // SAFETY: SIGKILL to the VMM process this test started.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }

    /// Runs the paused VMM with `flags` (the jailer a session leader if
    /// `leader`): the jailer's fork's pid, the VMM's pid, and its session
    /// id, process group, NSpid line and stdio as read before it is killed.
    fn paused_vmm(
        tag: &str,
        flags: &[&str],
        leader: bool,
    ) -> (u32, u32, [String; 3], Vec<PathBuf>) {
        let dir = scratch(tag);
        let (text, pid, status) = run_paused(&dir, &pause_elf(), flags, leader);
        assert_eq!(status, 0, "{flags:?}: {text}");
        let vmm = vmm_pid(&dir);
        wait_exec(vmm);
        let status = std::fs::read_to_string(format!("/proc/{vmm}/status")).unwrap();
        let nspid = status
            .lines()
            .find(|l| l.starts_with("NSpid:"))
            .unwrap_or_default();
        let seen = [stat_field(vmm, 6), stat_field(vmm, 5), nspid.to_string()];
        let stdio = (0..3)
            .map(|fd| std::fs::read_link(format!("/proc/{vmm}/fd/{fd}")).unwrap())
            .collect();
        kill(vmm);
        let _ = std::fs::remove_dir_all(&dir);
        (pid, vmm, seen, stdio)
    }

    #[test]
    fn with_new_pid_ns_the_jailer_leaves_and_the_vmm_is_init_of_its_own() {
        if skip_unless_root() {
            return;
        }
        for leader in [true, false] {
            let (jailer, vmm, [sid, _, nspid], _) = paused_vmm("pidns", &["--new-pid-ns"], leader);
            assert_ne!(vmm, jailer);
            assert_eq!(nspid, format!("NSpid:\t{vmm}\t1"));
            // A jailer that leads its session gives the VMM a session of
            // its own (its end would send the session SIGHUP); one that
            // does not leaves the VMM in its own (the jailer's) session.
            match leader {
                true => assert_eq!(sid, vmm.to_string()),
                false => assert_eq!(sid, stat_field(std::process::id(), 6)),
            }
        }
    }

    #[test]
    fn daemonized_the_vmm_has_stdio_on_dev_null_and_a_session_it_does_not_lead() {
        if skip_unless_root() {
            return;
        }
        let (jailer, vmm, [sid, pgrp, nspid], stdio) =
            paused_vmm("daemon", &["--daemonize"], false);
        assert_ne!(vmm, jailer);
        assert_eq!(nspid, format!("NSpid:\t{vmm}"), "no new PID namespace");
        assert_eq!(stdio, [Path::new("/dev/null"); 3]);
        assert_ne!(sid, stat_field(std::process::id(), 6), "a new session");
        assert_ne!(
            sid,
            vmm.to_string(),
            "not its leader: it cannot regain a terminal"
        );
        assert_eq!(
            pgrp, sid,
            "the process group of the first fork, which leads the session"
        );
    }

    #[test]
    fn a_failed_step_comes_back_as_one_line() {
        if skip_unless_root() {
            return;
        }
        let dir = scratch("fail");
        let (text, _, status) = run_jailer(&dir, &["--netns", "/nonexistent/netns"]);
        assert_eq!(status, 3, "{text}");
        assert!(
            text.contains(
                "ERROR jail: cannot join the network namespace /nonexistent/netns: No such file"
            ),
            "{text}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
