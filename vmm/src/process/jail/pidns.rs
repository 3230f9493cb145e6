// SPDX-License-Identifier: Apache-2.0
//! A PID namespace of the jail's own: the jailed process is its init (its
//! pid is 1) and sees no process outside it, so it can neither signal nor
//! trace one, nor read what `/proc` would say about them.
//!
//! A process cannot enter a new PID namespace itself; its next child is the
//! new namespace's first process. Two ways to use that:
//!
//! - [`supervised`] (minivmm's `--jail`): the child goes on as minivmm; the
//!   parent stays, as the process the caller started and waits for, and
//!   supervises: it drops its privileges too, closes every descriptor,
//!   runs under its own seccomp filter, forwards SIGTERM, SIGINT and
//!   SIGUSR1 to the child (which reads them from its signalfd), turns the
//!   signals whose default action would have ended an unjailed minivmm
//!   (SIGHUP, SIGQUIT, SIGUSR2, SIGALRM) into a SIGKILL of the child, and
//!   exits with the child's status (128 + the signal when a signal ended
//!   it). The child dies with the parent (`PR_SET_PDEATHSIG`), so killing
//!   the process the caller knows still ends the VM. The namespace's init
//!   gets no signal it has no handler for, nor one it blocks with a default
//!   action: the child keeps SIGTERM, SIGINT and SIGUSR1 blocked from the
//!   start, so one sent before minivmm's signalfd exists waits for it.
//! - [`fork_and_leave`] (the `jailer`'s `--new-pid-ns`, as Firecracker's):
//!   the parent writes the child's pid where the caller reads it and exits.
#![allow(unsafe_code)]

use super::creds::drop_privileges;
use super::sys::{check, close_all_but, SysError};
use crate::process::seccomp::{self, SeccompMode, Thread};

/// Forwarded to the child as they are.
pub const FORWARDED: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1];
/// Would end an unjailed minivmm by their default action: they end the
/// child with SIGKILL.
pub const FATAL: [libc::c_int; 4] = [libc::SIGHUP, libc::SIGQUIT, libc::SIGUSR2, libc::SIGALRM];

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: an all-zero sigset_t is a valid value for sigemptyset to set.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
    }
    set
}

fn watched() -> Vec<libc::c_int> {
    FORWARDED
        .iter()
        .chain(&FATAL)
        .chain(&[libc::SIGCHLD])
        .copied()
        .collect()
}

/// `unshare(CLONE_NEWPID)` then `fork`: the child's pid in the parent,
/// `None` in the child (pid 1 of the new namespace).
fn fork_into_new_namespace() -> Result<Option<libc::pid_t>, SysError> {
    // SAFETY: unshare takes flags only.
    check("unshare(CLONE_NEWPID)", unsafe {
        libc::unshare(libc::CLONE_NEWPID)
    })?;
    // SAFETY: the caller is single-threaded (the jail's precondition), so
    // the child is a full copy of it, free to allocate and run Rust code.
    let pid = check("fork into the new PID namespace", unsafe { libc::fork() })?;
    Ok((pid != 0).then_some(pid as libc::pid_t))
}

/// Forks into a new PID namespace; returns in the child, which is then in
/// a new session, as `uid`:`gid` with no privilege (see the module doc).
/// The parent never returns: it supervises the child and exits with its
/// status. Single-threaded callers only.
pub fn supervised(uid: u32, gid: u32, mode: SeccompMode) -> Result<(), SysError> {
    let mut before = sigset(&[]);
    let all = sigset(&watched());
    // SAFETY: both sets are live sigset_t values.
    check("block signals", unsafe {
        libc::sigprocmask(libc::SIG_BLOCK, &all, &mut before)
    })?;
    let mut pipe = [0; 2];
    // SAFETY: `pipe` has room for the two descriptors.
    check("pipe", unsafe {
        libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC)
    })?;
    let [alive_r, alive_w] = pipe;
    match fork_into_new_namespace()? {
        Some(child) => {
            // SAFETY: the read end is this process's own copy.
            unsafe { libc::close(alive_r) };
            let code = match supervisor_setup(alive_w, uid, gid, mode) {
                Ok(()) => supervise(child),
                Err(e) => {
                    eprintln!("minivmm: error: {}", crate::error_line(&e));
                    // SAFETY: kills the child this process just forked.
                    unsafe { libc::kill(child, libc::SIGKILL) };
                    1
                }
            };
            // SAFETY: ends this process; nothing of it is shared with the
            // child (separate address spaces), so no destructor is owed.
            unsafe { libc::_exit(code) }
        }
        None => {
            // SAFETY: the write end is this process's own copy.
            unsafe { libc::close(alive_w) };
            child_setup(&before, alive_r, uid, gid)
        }
    }
}

/// The child's half: the signal mask it had (but the forwarded signals,
/// which stay blocked), a new session, no privilege, and death with the
/// parent (checked once more after asking for it, in case the parent died
/// first: the pipe's write end, the parent's, is closed then).
fn child_setup(
    before: &libc::sigset_t,
    alive_r: libc::c_int,
    uid: u32,
    gid: u32,
) -> Result<(), SysError> {
    let mut mask = *before;
    for s in FORWARDED {
        // SAFETY: `mask` is a live sigset_t and `s` a valid signal.
        unsafe { libc::sigaddset(&mut mask, s) };
    }
    // SAFETY: `mask` is a live sigset_t; the old mask is not asked for.
    check("restore the signal mask", unsafe {
        libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut())
    })?;
    // SAFETY: no arguments; the child of a fork leads no process group.
    check("setsid", unsafe { libc::setsid() })?;
    drop_privileges(uid, gid)?;
    // SAFETY: prctl with integer arguments only.
    check("die with the supervisor", unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0)
    })?;
    let mut fd = libc::pollfd {
        fd: alive_r,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd; a zero timeout never blocks.
    check("poll the supervisor", unsafe { libc::poll(&mut fd, 1, 0) })?;
    // SAFETY: the read end is this process's own, not used again.
    unsafe { libc::close(alive_r) };
    if fd.revents & libc::POLLHUP != 0 {
        return Err(SysError::new(
            "wait for the supervisor",
            std::io::Error::other("it ended before the jail was entered"),
        ));
    }
    Ok(())
}

/// The parent's half before it supervises: no privilege, no descriptor but
/// stdio and the pipe's write end (the child's sign of life of this
/// process), its own seccomp filter.
fn supervisor_setup(
    alive_w: libc::c_int,
    uid: u32,
    gid: u32,
    mode: SeccompMode,
) -> Result<(), SysError> {
    drop_privileges(uid, gid)?;
    close_all_but(&[alive_w])?;
    let prog = seccomp::filter(Thread::Supervisor, mode)
        .map_err(|e| SysError::new("build the supervisor's filter", std::io::Error::other(e)))?;
    seccomp::install_sigsys_handler()
        .and_then(|()| seccomp::apply(Thread::Supervisor, prog.as_ref()))
        .map_err(|e| SysError::new("install the supervisor's filter", std::io::Error::other(e)))
}

/// Waits for signals and the child's end; returns the exit status to give.
fn supervise(child: libc::pid_t) -> i32 {
    let set = sigset(&watched());
    let mut fatal = None;
    loop {
        // SAFETY: `set` is a live sigset_t; no siginfo is asked for.
        let sig = unsafe { libc::sigwaitinfo(&set, std::ptr::null_mut()) };
        // Anything else than the three below is a wait a handled signal
        // interrupted (-1): waited on again.
        if sig == libc::SIGCHLD {
            let mut status = 0;
            // SAFETY: `status` is a live int; the child is ours. A child
            // stopped or continued is reported as 0 (no WUNTRACED).
            if unsafe { libc::waitpid(child, &mut status, libc::WNOHANG) } == child {
                if libc::WIFEXITED(status) {
                    return libc::WEXITSTATUS(status);
                }
                if libc::WIFSIGNALED(status) {
                    return 128 + fatal.unwrap_or(libc::WTERMSIG(status));
                }
            }
        } else if FORWARDED.contains(&sig) {
            // SAFETY: a signal to the child this process forked.
            unsafe { libc::kill(child, sig) };
        } else if FATAL.contains(&sig) {
            fatal = Some(sig);
            // SAFETY: a signal to the child this process forked.
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
    }
}

/// Forks into a new PID namespace (Firecracker's jailer's `--new-pid-ns`):
/// the child's pid (as this namespace sees it) in the parent, `None` in the
/// child. The child starts a session of its own when the parent led one,
/// so the parent's end does not send it SIGHUP.
pub fn fork_and_leave() -> Result<Option<libc::pid_t>, SysError> {
    // SAFETY: getsid and getpid take no pointer.
    let leader = unsafe { libc::getsid(0) == libc::getpid() };
    let side = fork_into_new_namespace()?;
    if side.is_none() && leader {
        // SAFETY: no arguments; the child of a fork leads no process group.
        check("setsid", unsafe { libc::setsid() })?;
    }
    Ok(side)
}

/// Becomes a daemon, as Firecracker's jailer's `--daemonize` does: forks
/// twice (the first child leads a new session, the second cannot regain a
/// terminal), the parents exiting 0, and points stdio at `dev_null`.
pub fn daemonize(dev_null: libc::c_int) -> Result<(), SysError> {
    for step in ["fork to daemonize", "fork again to daemonize"] {
        // SAFETY: single-threaded caller (the jail's precondition).
        if check(step, unsafe { libc::fork() })? != 0 {
            // SAFETY: the parent ends at once, as a daemon's parent does.
            unsafe { libc::_exit(0) }
        }
        if step == "fork to daemonize" {
            // SAFETY: no arguments; a fork's child leads no process group.
            check("setsid", unsafe { libc::setsid() })?;
        }
    }
    for fd in 0..3 {
        // SAFETY: duplicates an open descriptor onto a stdio number.
        check("point stdio at /dev/null", unsafe {
            libc::dup2(dev_null, fd)
        })?;
    }
    Ok(())
}
