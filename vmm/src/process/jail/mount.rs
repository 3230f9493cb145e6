// SPDX-License-Identifier: Apache-2.0
//! The jail's file system: a mount namespace of its own whose root is the
//! jail directory, and the two device nodes made inside it.
//!
//! [`pivot_into`] takes Firecracker's jailer's steps: `unshare(CLONE_NEWNS)`;
//! every mount made a slave, recursively (mounts and unmounts the host makes
//! still reach the copy, so a host file system is not kept busy by a jail,
//! while nothing done inside propagates out); the jail directory bind-mounted
//! on itself (pivot_root needs a mount point); `pivot_root` into it and the
//! old root detached, so no path resolves outside the directory any more.
//!
//! [`device_nodes`] makes `dev/kvm` and `dev/net/tun` in the jail, where the
//! host has them, as nodes of the host's devices (their numbers read from
//! the host's nodes, not retyped) owned by the jail's uid and gid, mode 0600
//! as Firecracker's jailer makes them: the host's nodes are often root's
//! alone, and the jailed uid must open them (the VM, and a TAP named by the
//! configuration or the API, are opened inside the jail).
#![allow(unsafe_code)]

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::sys::{check, cpath, SysError};

/// The host device nodes made inside a jail.
pub const DEVICES: [&str; 2] = ["kvm", "net/tun"];

fn bind_onto_itself(dir: &Path) -> Result<(), SysError> {
    let step = "bind the jail directory onto itself";
    let path = cpath(step, dir)?;
    // SAFETY: the source and target are the same NUL-terminated path, which
    // outlives the call; the null fstype and data are allowed for a bind.
    check(step, unsafe {
        libc::mount(
            path.as_ptr(),
            path.as_ptr(),
            std::ptr::null(),
            libc::MS_BIND | libc::MS_REC,
            std::ptr::null(),
        )
    })?;
    Ok(())
}

/// Moves the calling process into a new mount namespace whose root is
/// `root` (see the module doc). Its working directory is then `/`.
pub fn pivot_into(root: &Path) -> Result<(), SysError> {
    // SAFETY: unshare takes flags only.
    check("unshare(CLONE_NEWNS)", unsafe {
        libc::unshare(libc::CLONE_NEWNS)
    })?;
    let slash = cpath("make every mount a slave", Path::new("/"))?;
    // SAFETY: a NUL-terminated path; a propagation change takes no source,
    // type or data.
    check("make every mount a slave", unsafe {
        libc::mount(
            std::ptr::null(),
            slash.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    })?;
    bind_onto_itself(root)?;
    std::env::set_current_dir(root).map_err(SysError::at("chdir into the jail"))?;
    let dot = cpath("pivot_root", Path::new("."))?;
    // SAFETY: pivot_root(".", ".") stacks the old root on the new one (see
    // pivot_root(2)); both arguments are the same NUL-terminated path.
    check("pivot_root", unsafe {
        libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr())
    })?;
    // SAFETY: detaches the old root, now mounted on "."; a path and flags.
    check("detach the old root", unsafe {
        libc::umount2(dot.as_ptr(), libc::MNT_DETACH)
    })?;
    std::env::set_current_dir("/").map_err(SysError::at("chdir to the new root"))
}

/// Makes the [`DEVICES`] the host has inside `root` (see the module doc).
/// `root` must be on a file system that allows device nodes.
pub fn device_nodes(root: &Path, uid: u32, gid: u32) -> Result<(), SysError> {
    for dev in DEVICES {
        let host = Path::new("/dev").join(dev);
        if host.exists() {
            device_node(&host, &root.join("dev").join(dev), uid, gid)?;
        }
    }
    Ok(())
}

fn device_node(host: &Path, inside: &Path, uid: u32, gid: u32) -> Result<(), SysError> {
    let rdev = std::fs::metadata(host)
        .map_err(SysError::at("stat a host device node"))?
        .rdev();
    if let Some(dir) = inside.parent() {
        std::fs::create_dir_all(dir).map_err(SysError::at("create dev/ in the jail"))?;
    }
    match std::fs::remove_file(inside) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(SysError::new("replace a device node", e)),
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
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;

    fn scratch(tag: &str) -> Option<std::path::PathBuf> {
        // SAFETY: a getter.
        if unsafe { libc::geteuid() } != 0 {
            minivmm_tests::print_skip("mknod needs root (CI runs as root)");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("minivmm-mount-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Some(dir)
    }

    #[test]
    fn the_device_nodes_are_the_hosts_devices_owned_by_the_jails_ids() {
        let Some(dir) = scratch("nodes") else { return };
        // A stale file where a node goes is replaced.
        std::fs::create_dir_all(dir.join("dev/net")).unwrap();
        std::fs::write(dir.join("dev/kvm"), "stale").unwrap();
        device_nodes(&dir, 65534, 65533).unwrap();
        for dev in DEVICES {
            let host = Path::new("/dev").join(dev);
            let Ok(host) = std::fs::metadata(host) else {
                continue;
            };
            let node = std::fs::metadata(dir.join("dev").join(dev)).unwrap();
            assert!(node.file_type().is_char_device(), "{dev}");
            assert_eq!(node.rdev(), host.rdev(), "{dev}");
            assert_eq!((node.uid(), node.gid()), (65534, 65533), "{dev}");
            assert_eq!(node.mode() & 0o7777, 0o600, "{dev}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_directory_where_a_node_goes_is_an_error_naming_the_step() {
        if !Path::new("/dev/kvm").exists() {
            minivmm_tests::print_skip("no /dev/kvm on this host");
            return;
        }
        let Some(dir) = scratch("dir") else { return };
        std::fs::create_dir_all(dir.join("dev/kvm")).unwrap();
        let e = device_nodes(&dir, 1, 1).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(e.step, "replace a device node");
        assert_eq!(e.source.raw_os_error(), Some(libc::EISDIR));
    }
}
