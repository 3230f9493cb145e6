// SPDX-License-Identifier: Apache-2.0
//! The one error every system call of the jail reports, [`SysError`]: the
//! step that failed and the kernel's reason, so that a failure reads as one
//! line (`jail: pivot_root failed: Invalid argument`).
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A system call of one jail step failed.
#[derive(Debug, thiserror::Error)]
#[error("jail: {step} failed")]
pub struct SysError {
    /// The step, in the words of the module that took it.
    pub step: &'static str,
    /// Why.
    #[source]
    pub source: io::Error,
}

impl SysError {
    /// The step failed with `source`.
    pub fn new(step: &'static str, source: io::Error) -> Self {
        SysError { step, source }
    }

    /// The step failed with the calling thread's `errno`.
    pub fn last(step: &'static str) -> Self {
        SysError::new(step, io::Error::last_os_error())
    }

    /// A closure turning an `io::Error` into this step's error.
    pub fn at(step: &'static str) -> impl Fn(io::Error) -> SysError {
        move |source| SysError::new(step, source)
    }
}

/// `Ok` for a non-negative system call result, the step's error otherwise.
pub fn check(step: &'static str, ret: impl Into<i64>) -> Result<i64, SysError> {
    let ret = ret.into();
    if ret < 0 {
        return Err(SysError::last(step));
    }
    Ok(ret)
}

/// `p` as a C string for a system call of `step`.
pub fn cpath(step: &'static str, p: &Path) -> Result<CString, SysError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        SysError::new(
            step,
            io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"),
        )
    })
}

/// Closes every descriptor above 2 but those in `keep`, however high their
/// numbers (`close_range`, so no `/proc` is needed: it may be gone).
pub fn close_all_but(keep: &[i32]) -> Result<(), SysError> {
    let mut keep: Vec<u32> = keep
        .iter()
        .filter_map(|&fd| u32::try_from(fd).ok())
        .filter(|&fd| fd > 2)
        .collect();
    keep.sort_unstable();
    keep.dedup();
    let mut first = 3u32;
    for fd in keep.into_iter().chain(std::iter::once(u32::MAX)) {
        if fd > first {
            // SAFETY: closes descriptor numbers only; the caller owns none
            // of them any more (the module's callers run before anything
            // in the process holds them).
            check("close inherited descriptors", unsafe {
                libc::syscall(libc::SYS_close_range, first, fd - 1, 0)
            })?;
        }
        first = fd.saturating_add(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_call_is_its_step_and_errno() {
        assert_eq!(check("nothing", 0).unwrap(), 0);
        assert_eq!(check("nothing", 7).unwrap(), 7);
        // SAFETY: close on a descriptor number that is never open.
        let ret = unsafe { libc::close(-1) };
        let e = check("close -1", ret).unwrap_err();
        assert_eq!(e.step, "close -1");
        assert_eq!(e.source.raw_os_error(), Some(libc::EBADF));
        assert_eq!(
            crate::error_line(&e),
            "jail: close -1 failed: Bad file descriptor (os error 9)"
        );
        let e = cpath("a path", Path::new("a\0b")).unwrap_err();
        assert_eq!(e.step, "a path");
        assert_eq!(cpath("a path", Path::new("/x")).unwrap().as_bytes(), b"/x");
    }
}
