// SPDX-License-Identifier: Apache-2.0
//! The jail's cgroup: a leaf of its own, `<hierarchy>/<parent>/<id>`, with
//! the limits given (`--cgroup FILE=VALUE`), which the process joins before
//! it drops its privileges.
//!
//! Both versions are supported, as by Firecracker's jailer, whose command
//! line this follows (`--cgroup`, `--cgroup-version`, `--parent-cgroup`):
//!
//! - **v2**: one unified hierarchy (the `cgroup2` mount in `/proc/mounts`).
//!   The controller of each file (`pids` for `pids.max`) must be available
//!   there, and is enabled in `cgroup.subtree_control` from the hierarchy's
//!   root down to the leaf's parent. Core files (`cgroup.max.descendants`)
//!   need no controller (Firecracker's jailer refuses them).
//! - **v1**: one hierarchy per controller, found by the mount's options; a
//!   leaf in each hierarchy a file names, `cpuset.cpus` and `cpuset.mems`
//!   inherited from the parents where empty (a cpuset takes no process
//!   without them).
//!
//! Which leaves exist is [`CgroupSpec::plan`]'s choice: minivmm's own
//! `--jail` always makes a v2 leaf (`always`), so every jailed VM is in a
//! cgroup of its own; the `jailer` does what Firecracker's does: a leaf
//! wherever a file is given and, with v2 and no file, joins the parent
//! cgroup if it exists. A leaf that already holds processes is refused (two
//! VMs with one id would share their limits). Leaves stay after the VM
//! ends, as Firecracker's do: the operator removes them (`rmdir`).

use std::io;
use std::path::{Component, Path, PathBuf};

/// Which cgroup hierarchy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// One hierarchy per controller.
    V1,
    /// The unified hierarchy.
    V2,
}

/// Why a cgroup could not be set up; each names the file or directory.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A `--cgroup` argument is not `<controller>.<name>=VALUE`.
    #[error("--cgroup '{0}': expected FILE=VALUE, FILE as <controller>.<name> (pids.max=64)")]
    Format(String),
    /// `--parent-cgroup` leaves its hierarchy or is empty.
    #[error("--parent-cgroup '{0}': expected a relative path without '.' or '..'")]
    Parent(String),
    /// `--cgroup-version` is neither 1 nor 2.
    #[error("--cgroup-version '{0}': expected 1 or 2")]
    Version(String),
    /// No cgroup v2 hierarchy is mounted.
    #[error("cgroup: no cgroup v2 hierarchy is mounted (try --cgroup-version 1)")]
    NoV2,
    /// No v1 hierarchy holds the controller.
    #[error("cgroup: no cgroup v1 hierarchy holds the {0} controller")]
    NoV1Controller(String),
    /// The controller is not available in the v2 hierarchy.
    #[error(
        "cgroup: the {controller} controller is not available in the v2 hierarchy at {} \
         (a v1 hierarchy may hold it: try --cgroup-version 1)",
        .mount.display()
    )]
    Unavailable {
        /// The controller.
        controller: String,
        /// The v2 mount point.
        mount: PathBuf,
    },
    /// The leaf holds processes already.
    #[error("cgroup {} already holds processes: is another VM running with this id?", .0.display())]
    InUse(PathBuf),
    /// A file or directory could not be read, made or written.
    #[error("cgroup: cannot {what} {}", .path.display())]
    Io {
        /// What was done (`create`, `write 64 to`).
        what: String,
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>, path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    let what = what.into();
    move |source| CgroupError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupSpec {
    /// The hierarchy version.
    pub version: CgroupVersion,
    /// Where the leaves go in each hierarchy, relative to its root.
    pub parent: PathBuf,
    /// `(file, value)` to write into the leaf, in order.
    pub files: Vec<(String, String)>,
}

impl CgroupVersion {
    /// `1` or `2`.
    pub fn parse(s: &str) -> Result<Self, CgroupError> {
        match s {
            "1" => Ok(CgroupVersion::V1),
            "2" => Ok(CgroupVersion::V2),
            _ => Err(CgroupError::Version(s.to_string())),
        }
    }
}

/// A path that stays inside its hierarchy: relative, without `.` or `..`.
fn confined(p: &Path) -> bool {
    p.components().all(|c| matches!(c, Component::Normal(_)))
}

/// `--parent-cgroup NAME`: a non-empty relative path without `.` or `..`.
pub fn parse_parent(s: &str) -> Result<PathBuf, CgroupError> {
    let p = PathBuf::from(s);
    if s.is_empty() || !confined(&p) {
        return Err(CgroupError::Parent(s.to_string()));
    }
    Ok(p)
}

/// `--cgroup FILE=VALUE`: FILE a single name `<controller>.<name>`, VALUE
/// non-empty and one line.
pub fn parse_file(s: &str) -> Result<(String, String), CgroupError> {
    let bad = || CgroupError::Format(s.to_string());
    let (file, value) = s.split_once('=').ok_or_else(bad)?;
    let named = file
        .split_once('.')
        .is_some_and(|(c, n)| !c.is_empty() && !n.is_empty());
    let one_name = !file.contains('/') && file != "." && file != "..";
    if !named || !one_name || value.is_empty() || value.contains('\n') {
        return Err(bad());
    }
    Ok((file.to_string(), value.to_string()))
}

/// The controller a file belongs to: `pids` for `pids.max`.
fn controller(file: &str) -> &str {
    file.split('.').next().unwrap_or(file)
}

/// One line of `/proc/mounts` that matters here.
#[derive(Debug)]
struct Mount {
    dir: PathBuf,
    v2: bool,
    options: Vec<String>,
}

/// `/proc/mounts` escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |a, c| a.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn cgroup_mounts(table: &str) -> Vec<Mount> {
    table
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (dir, fstype, options) = (f.get(1)?, f.get(2)?, f.get(3)?);
            let v2 = match *fstype {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(Mount {
                dir: PathBuf::from(unescape(dir)),
                v2,
                options: options.split(',').map(str::to_string).collect(),
            })
        })
        .collect()
}

/// One leaf to make and join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// The hierarchy's root.
    pub mount: PathBuf,
    /// The leaf: `<mount>/<parent>/<id>`.
    pub dir: PathBuf,
    /// In the unified hierarchy.
    pub v2: bool,
    /// What to write into it.
    pub files: Vec<(String, String)>,
}

/// The cgroups a process joins: leaves to make, or an existing cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Leaves, one per hierarchy.
    pub leaves: Vec<Leaf>,
    /// An existing cgroup to join without making a leaf (the jailer's v2
    /// `--parent-cgroup` without `--cgroup`).
    pub join: Option<PathBuf>,
}

/// Whether `controller` is listed in `<mount>/cgroup.controllers`; core
/// files (`cgroup.*`) need none.
fn v2_available(mount: &Path, controller: &str) -> Result<bool, CgroupError> {
    if controller == "cgroup" {
        return Ok(true);
    }
    let path = mount.join("cgroup.controllers");
    let list = std::fs::read_to_string(&path).map_err(io_err("read", &path))?;
    Ok(list.split_whitespace().any(|c| c == controller))
}

impl CgroupSpec {
    /// The leaves for instance `id`, given the mount table `mounts` (the
    /// text of `/proc/mounts`); `always` makes a v2 leaf even without files
    /// (see the module doc).
    pub fn plan(&self, id: &str, mounts: &str, always: bool) -> Result<Plan, CgroupError> {
        let mounts = cgroup_mounts(mounts);
        let rel = self.parent.join(id);
        let mut plan = Plan::default();
        match self.version {
            CgroupVersion::V2 => {
                let mount = mounts.iter().find(|m| m.v2).map(|m| m.dir.clone());
                if self.files.is_empty() && !always {
                    plan.join = mount.map(|m| m.join(&self.parent)).filter(|p| p.is_dir());
                    return Ok(plan);
                }
                let Some(mount) = mount else {
                    return match self.files.is_empty() {
                        true => Ok(plan),
                        false => Err(CgroupError::NoV2),
                    };
                };
                for (file, _) in &self.files {
                    let controller = controller(file).to_string();
                    if !v2_available(&mount, &controller)? {
                        return Err(CgroupError::Unavailable { controller, mount });
                    }
                }
                plan.leaves.push(Leaf {
                    dir: mount.join(&rel),
                    mount,
                    v2: true,
                    files: self.files.clone(),
                });
            }
            CgroupVersion::V1 => {
                for (file, value) in &self.files {
                    let c = controller(file);
                    let m = mounts
                        .iter()
                        .find(|m| !m.v2 && m.options.iter().any(|o| o == c))
                        .ok_or_else(|| CgroupError::NoV1Controller(c.to_string()))?;
                    let pair = (file.clone(), value.clone());
                    match plan.leaves.iter_mut().find(|l| l.mount == m.dir) {
                        Some(leaf) => leaf.files.push(pair),
                        None => plan.leaves.push(Leaf {
                            mount: m.dir.clone(),
                            dir: m.dir.join(&rel),
                            v2: false,
                            files: vec![pair],
                        }),
                    }
                }
            }
        }
        Ok(plan)
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    std::fs::write(path, value).map_err(io_err(format!("write {value} to"), path))
}

fn read_trimmed(path: &Path) -> Result<String, CgroupError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(s.trim().to_string()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// The directories from just below `leaf.mount` down to the leaf.
fn levels(leaf: &Leaf) -> Vec<PathBuf> {
    let rel = leaf.dir.strip_prefix(&leaf.mount).unwrap_or(&leaf.dir);
    let mut dir = leaf.mount.clone();
    rel.components()
        .map(|c| {
            dir.push(c);
            dir.clone()
        })
        .collect()
}

impl Leaf {
    /// Makes the leaf and writes its files (not joined yet).
    fn make(&self) -> Result<(), CgroupError> {
        std::fs::create_dir_all(&self.dir).map_err(io_err("create", &self.dir))?;
        if !read_trimmed(&self.dir.join("cgroup.procs"))?.is_empty() {
            return Err(CgroupError::InUse(self.dir.clone()));
        }
        let levels = levels(self);
        if self.v2 {
            // A controller is usable in a cgroup once its parent enables it
            // for its children, and so on up to the root.
            for (file, _) in &self.files {
                let c = controller(file);
                if c == "cgroup" {
                    continue;
                }
                let parents = std::iter::once(&self.mount).chain(&levels[..levels.len() - 1]);
                for dir in parents {
                    write(&dir.join("cgroup.subtree_control"), &format!("+{c}"))?;
                }
            }
        } else if self.files.iter().any(|(f, _)| controller(f) == "cpuset") {
            // A cpuset takes no process until it has CPUs and memory nodes:
            // each new level inherits its parent's.
            for name in ["cpuset.cpus", "cpuset.mems"] {
                let mut above = read_trimmed(&self.mount.join(name))?;
                for dir in &levels {
                    let own = read_trimmed(&dir.join(name))?;
                    if own.is_empty() {
                        write(&dir.join(name), &above)?;
                    } else {
                        above = own;
                    }
                }
            }
        }
        for (file, value) in &self.files {
            write(&self.dir.join(file), value)?;
        }
        Ok(())
    }
}

impl Plan {
    /// Makes every leaf, writes its files, then moves process `pid` into
    /// each (every limit is in place before the process is under it).
    pub fn apply(&self, pid: u32) -> Result<(), CgroupError> {
        for leaf in &self.leaves {
            leaf.make()?;
        }
        let pid = pid.to_string();
        for dir in self.leaves.iter().map(|l| &l.dir).chain(&self.join) {
            write(&dir.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }
}
