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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake cgroup tree: plain directories and files stand for the
    /// hierarchies (the kernel's files are written and read the same way).
    struct Fake(PathBuf);

    impl Fake {
        fn new(tag: &str) -> Fake {
            let dir =
                std::env::temp_dir().join(format!("minivmm-cgroup-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for sub in ["unified", "pids", "cpuset"] {
                std::fs::create_dir_all(dir.join(sub)).unwrap();
            }
            std::fs::write(dir.join("unified/cgroup.controllers"), "cpu pids\n").unwrap();
            Fake(dir)
        }

        fn p(&self, rel: &str) -> PathBuf {
            self.0.join(rel)
        }

        /// A mount table naming the fake hierarchies, with other lines.
        fn mounts(&self) -> String {
            let d = self.0.display();
            format!(
                "proc /proc proc rw 0 0\n\
                 cgroup2 {d}/unified cgroup2 rw,nsdelegate 0 0\n\
                 cgroup {d}/pids cgroup rw,relatime,pids 0 0\n\
                 cgroup {d}/cpuset cgroup rw,cpuset 0 0\n\
                 short line\n"
            )
        }

        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.p(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn spec(version: CgroupVersion, files: &[&str]) -> CgroupSpec {
        CgroupSpec {
            version,
            parent: PathBuf::from("vms/all"),
            files: files.iter().map(|f| parse_file(f).unwrap()).collect(),
        }
    }

    #[test]
    fn files_parents_and_versions_are_checked() {
        assert_eq!(
            parse_file("pids.max=64").unwrap(),
            ("pids.max".into(), "64".into())
        );
        assert_eq!(
            parse_file("cpuset.cpus=0-1,3").unwrap(),
            ("cpuset.cpus".into(), "0-1,3".into())
        );
        for bad in [
            "pids.max",
            "pids.max=",
            "pidsmax=1",
            ".max=1",
            "pids.=1",
            "a/b.c=1",
            "p.m=1\n2",
        ] {
            let e = parse_file(bad).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("--cgroup '{bad}': expected FILE=VALUE")),
                "{e}"
            );
        }
        assert_eq!(parse_parent("a/b").unwrap(), Path::new("a/b"));
        for bad in ["", "..", "/abs", "a/../b", "./a"] {
            let e = parse_parent(bad).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("--parent-cgroup '{bad}': expected a relative path without '.' or '..'")
            );
        }
        assert_eq!(CgroupVersion::parse("1").unwrap(), CgroupVersion::V1);
        assert_eq!(CgroupVersion::parse("2").unwrap(), CgroupVersion::V2);
        assert_eq!(
            CgroupVersion::parse("v2").unwrap_err().to_string(),
            "--cgroup-version 'v2': expected 1 or 2"
        );
        assert_eq!(controller("pids.max"), "pids");
        assert_eq!(controller("cgroup.max.depth"), "cgroup");
    }

    #[test]
    fn the_mount_table_is_read_with_its_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\134b\011"), "/a\\b\t");
        assert_eq!(unescape(r"/a\08b\"), r"/a\08b\");
        let m = cgroup_mounts(
            "cgroup2 /sys/fs/cgroup/my\\040v2 cgroup2 rw 0 0\n\
             cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,cpu,cpuacct 0 0\n\
             tmpfs /sys/fs/cgroup tmpfs rw 0 0\n",
        );
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].dir.as_path(), m[0].v2),
            (Path::new("/sys/fs/cgroup/my v2"), true)
        );
        assert_eq!(
            (m[1].dir.as_path(), m[1].v2),
            (Path::new("/sys/fs/cgroup/cpu,cpuacct"), false)
        );
        assert_eq!(m[1].options, ["rw", "cpu", "cpuacct"]);
    }

    #[test]
    fn a_v2_leaf_enables_its_controllers_down_to_its_parent_and_holds_the_limits() {
        let f = Fake::new("v2");
        let plan = spec(
            CgroupVersion::V2,
            &["pids.max=64", "cgroup.max.descendants=0"],
        )
        .plan("vm-1", &f.mounts(), false)
        .unwrap();
        assert_eq!(plan.join, None);
        assert_eq!(plan.leaves.len(), 1);
        assert_eq!(plan.leaves[0].dir, f.p("unified/vms/all/vm-1"));
        assert_eq!(plan.leaves[0].mount, f.p("unified"));
        plan.apply(4242).unwrap();
        assert_eq!(f.read("unified/vms/all/vm-1/pids.max"), "64");
        assert_eq!(f.read("unified/vms/all/vm-1/cgroup.max.descendants"), "0");
        assert_eq!(f.read("unified/vms/all/vm-1/cgroup.procs"), "4242");
        for dir in ["unified", "unified/vms", "unified/vms/all"] {
            assert_eq!(
                f.read(&format!("{dir}/cgroup.subtree_control")),
                "+pids",
                "{dir}"
            );
        }
        assert!(!f.p("unified/vms/all/vm-1/cgroup.subtree_control").exists());
        // A leaf that holds a process is another VM's.
        let e = plan.apply(4343).unwrap_err().to_string();
        assert_eq!(
            e,
            format!(
                "cgroup {} already holds processes: is another VM running with this id?",
                f.p("unified/vms/all/vm-1").display()
            )
        );
    }

    #[test]
    fn without_files_a_v2_leaf_only_when_always_and_the_jailer_joins_the_parent() {
        let f = Fake::new("v2none");
        let s = spec(CgroupVersion::V2, &[]);
        let plan = s.plan("vm-1", &f.mounts(), true).unwrap();
        assert_eq!(plan.leaves.len(), 1);
        assert!(plan.leaves[0].files.is_empty());
        plan.apply(7).unwrap();
        assert_eq!(f.read("unified/vms/all/vm-1/cgroup.procs"), "7");
        assert!(
            !f.p("unified/cgroup.subtree_control").exists(),
            "no controller to enable"
        );
        // The jailer's rule: no file, v2: join the parent when it exists.
        let plan = s.plan("vm-2", &f.mounts(), false).unwrap();
        assert_eq!(
            plan,
            Plan {
                leaves: Vec::new(),
                join: Some(f.p("unified/vms/all"))
            }
        );
        plan.apply(8).unwrap();
        assert_eq!(f.read("unified/vms/all/cgroup.procs"), "8");
        let mut gone = s.clone();
        gone.parent = PathBuf::from("missing");
        assert_eq!(
            gone.plan("vm-2", &f.mounts(), false).unwrap(),
            Plan::default()
        );
        // No v2 hierarchy: nothing without files, an error with some.
        let v1_only = "cgroup /x cgroup rw,pids 0 0\n";
        assert_eq!(s.plan("vm", v1_only, true).unwrap(), Plan::default());
        assert_eq!(s.plan("vm", v1_only, false).unwrap(), Plan::default());
        let e = spec(CgroupVersion::V2, &["pids.max=1"])
            .plan("vm", v1_only, true)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cgroup: no cgroup v2 hierarchy is mounted (try --cgroup-version 1)"
        );
    }

    #[test]
    fn a_controller_the_v2_hierarchy_lacks_is_refused() {
        let f = Fake::new("v2lack");
        let e = spec(CgroupVersion::V2, &["cgroup.max.depth=1", "memory.max=1G"])
            .plan("vm-1", &f.mounts(), true)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "cgroup: the memory controller is not available in the v2 hierarchy at {} \
                 (a v1 hierarchy may hold it: try --cgroup-version 1)",
                f.p("unified").display()
            )
        );
        assert!(
            !f.p("unified/vms").exists(),
            "nothing made for a refused plan"
        );
        std::fs::remove_file(f.p("unified/cgroup.controllers")).unwrap();
        let e = spec(CgroupVersion::V2, &["pids.max=1"])
            .plan("vm-1", &f.mounts(), true)
            .unwrap_err();
        assert!(e.to_string().starts_with("cgroup: cannot read "), "{e}");
    }

    #[test]
    fn v1_leaves_one_per_hierarchy_and_a_cpuset_inherits_its_parents_cpus() {
        let f = Fake::new("v1");
        std::fs::write(f.p("cpuset/cpuset.cpus"), "0-3\n").unwrap();
        std::fs::write(f.p("cpuset/cpuset.mems"), "0\n").unwrap();
        // An existing level with its own CPUs passes those on.
        std::fs::create_dir_all(f.p("cpuset/vms")).unwrap();
        std::fs::write(f.p("cpuset/vms/cpuset.cpus"), "2-3").unwrap();
        let plan = spec(
            CgroupVersion::V1,
            &["pids.max=10", "cpuset.mems=0", "pids.max=20"],
        )
        .plan("vm-1", &f.mounts(), true)
        .unwrap();
        assert_eq!(plan.leaves.len(), 2);
        assert_eq!(plan.leaves[0].dir, f.p("pids/vms/all/vm-1"));
        assert_eq!(plan.leaves[0].files.len(), 2, "both pids files in one leaf");
        assert_eq!(plan.leaves[1].dir, f.p("cpuset/vms/all/vm-1"));
        plan.apply(99).unwrap();
        assert_eq!(
            f.read("pids/vms/all/vm-1/pids.max"),
            "20",
            "in order: the last wins"
        );
        assert_eq!(f.read("pids/vms/all/vm-1/cgroup.procs"), "99");
        assert_eq!(f.read("cpuset/vms/all/vm-1/cgroup.procs"), "99");
        assert_eq!(f.read("cpuset/vms/cpuset.mems"), "0");
        assert_eq!(f.read("cpuset/vms/cpuset.cpus"), "2-3");
        assert_eq!(f.read("cpuset/vms/all/cpuset.cpus"), "2-3");
        assert_eq!(f.read("cpuset/vms/all/vm-1/cpuset.cpus"), "2-3");
        assert!(
            !f.p("pids/vms/all/vm-1/cpuset.cpus").exists(),
            "pids is no cpuset"
        );
        assert!(!f.p("unified/vms").exists(), "v1 leaves only");
        let e = spec(CgroupVersion::V1, &["memory.limit_in_bytes=1"])
            .plan("vm-1", &f.mounts(), true)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "cgroup: no cgroup v1 hierarchy holds the memory controller"
        );
        // Without files, v1 makes nothing.
        assert_eq!(
            spec(CgroupVersion::V1, &[])
                .plan("vm", &f.mounts(), true)
                .unwrap(),
            Plan::default()
        );
    }

    #[test]
    fn a_leaf_whose_processes_cannot_be_read_is_an_error() {
        let f = Fake::new("procs");
        std::fs::create_dir_all(f.p("unified/vms/all/vm-1/cgroup.procs")).unwrap();
        let e = spec(CgroupVersion::V2, &[])
            .plan("vm-1", &f.mounts(), true)
            .unwrap()
            .apply(1)
            .unwrap_err();
        assert_eq!(
            crate::error_line(&e),
            format!(
                "cgroup: cannot read {}: Is a directory (os error 21)",
                f.p("unified/vms/all/vm-1/cgroup.procs").display()
            )
        );
    }

    #[test]
    fn a_write_the_kernel_refuses_names_the_file() {
        let f = Fake::new("refuse");
        // A directory where the limit's file would be: the write fails.
        std::fs::create_dir_all(f.p("unified/vms/all/vm-1/pids.max")).unwrap();
        let e = spec(CgroupVersion::V2, &["pids.max=64"])
            .plan("vm-1", &f.mounts(), true)
            .unwrap()
            .apply(1)
            .unwrap_err();
        assert_eq!(
            crate::error_line(&e),
            format!(
                "cgroup: cannot write 64 to {}: Is a directory (os error 21)",
                f.p("unified/vms/all/vm-1/pids.max").display()
            )
        );
    }
}
