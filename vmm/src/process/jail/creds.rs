// SPDX-License-Identifier: Apache-2.0
//! Dropping every privilege: the last step of the jail, taken by minivmm
//! (and by the supervisor `--jail` leaves outside the PID namespace) and by
//! the `jailer` before it execs the VMM.
//!
//! In order: the capability bounding set emptied (so no later exec can
//! regain a capability, whatever the file), no supplementary groups, the gid
//! and the uid as real, effective and saved ids (the kernel then clears the
//! capabilities of a non-root uid), the capability sets cleared explicitly
//! (so a jail as uid 0 keeps none either), not dumpable (no process of the
//! same uid can trace it or read its memory, which holds guest memory), and
//! `no_new_privs`.
#![allow(unsafe_code)]

use super::sys::{check, SysError};

/// `_LINUX_CAPABILITY_VERSION_3` from linux/capability.h (libc does not
/// export the capability structures).
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Runs as `uid`:`gid` with no capability, no supplementary group, not
/// dumpable and with `no_new_privs`.
pub fn drop_privileges(uid: u32, gid: u32) -> Result<(), SysError> {
    empty_bounding_set()?;
    // SAFETY: an empty group list; the pointer is not read for 0 entries.
    check("setgroups", unsafe { libc::setgroups(0, std::ptr::null()) })?;
    // SAFETY: plain integer arguments.
    check("setresgid", unsafe { libc::setresgid(gid, gid, gid) })?;
    // SAFETY: plain integer arguments.
    check("setresuid", unsafe { libc::setresuid(uid, uid, uid) })?;
    let mut header = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: a version-3 header and the two data words it requires, both
    // live for the call; pid 0 is the calling thread.
    check("clear capabilities", unsafe {
        libc::syscall(libc::SYS_capset, &mut header, data.as_ptr())
    })?;
    // SAFETY: prctl with integer arguments only.
    check("make the process not dumpable", unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0)
    })?;
    // SAFETY: prctl with integer arguments only.
    check("no_new_privs", unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    })?;
    Ok(())
}

/// Drops every capability from the bounding set, up to the highest one the
/// kernel knows (where PR_CAPBSET_DROP answers EINVAL).
fn empty_bounding_set() -> Result<(), SysError> {
    for cap in 0.. {
        // SAFETY: prctl with integer arguments only.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if ret < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(SysError::new("empty the capability bounding set", e));
        }
    }
    Ok(())
}
