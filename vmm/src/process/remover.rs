// SPDX-License-Identifier: Apache-2.0
//! A path removed when minivmm ends, however it ends: the [`Remover`].
//!
//! The vsock device's Unix socket (`uds_path`) is a file minivmm made, and
//! it should not outlive the process that listens on it: a later minivmm
//! with the same `uds_path` would find it there and refuse to start. But
//! once the VM runs, no minivmm thread may call `unlink`: a seccomp filter
//! sees the pointer to a path, not the path, so allowing `unlink` would
//! allow removing any file the process may remove.
//!
//! So when the socket is bound (before any filter, on the main thread) a
//! small process is forked that holds the path and one end of each of two
//! pipes, and nothing else: every other descriptor closed, every signal
//! blocked (a Ctrl-C to the terminal's process group, a SIGTERM to the
//! group, does not end it before its work is done), its own seccomp filter
//! (`Thread::Remover`: read, write, `unlink` and exit). It waits on the
//! command pipe:
//!
//! - end of file (minivmm closed its end, or ended, whatever the way: a
//!   return from `main`, a panic, a forbidden system call, SIGKILL): it
//!   unlinks the path and exits;
//! - one byte ([`Remover::disarm`]: the owner removed the path itself, as
//!   a `PUT /vsock` replacing the socket does before the VM runs): it exits
//!   and leaves the path alone.
//!
//! Its end of the second pipe closes when it exits, which is how minivmm
//! waits for it: dropping a [`Remover`] closes the command pipe and reads
//! the other one to its end (`close` and `read`, in every thread's list),
//! so when a normal exit returns from `main` the path is already gone. A
//! minivmm killed outright leaves the removal to the process alone; inside
//! the jail's PID namespace, where minivmm is the first process and the
//! kernel kills every other one when it dies, a removal raced by that kill
//! may not happen (README, "vsock").
//!
//! The child of a multi-threaded process may make only async-signal-safe
//! calls: everything it needs (the path as a C string, its filter) is made
//! before the fork, and it makes raw system calls only.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use seccompiler::BpfProgram;

use super::seccomp::{self, SeccompError, SeccompMode, Thread};

/// The byte that tells the process to leave the path alone and exit.
const DISARM: u8 = b'K';
/// The byte the process writes once it runs under its filter.
const READY: u8 = b'R';
/// The process's name (`/proc/<pid>/comm`), so `ps` says what it is.
const NAME: &[u8] = b"minivmm-unlink\0";

/// Why a remover could not be started.
#[derive(Debug, thiserror::Error)]
pub enum RemoverError {
    /// The path cannot be a C string (a NUL byte in it).
    #[error("the path contains a NUL byte")]
    Path,
    /// Its seccomp filter could not be built.
    #[error(transparent)]
    Filter(#[from] SeccompError),
    /// A pipe or the fork failed.
    #[error("cannot start the process that removes it")]
    Spawn(#[source] io::Error),
    /// It ended before it said it was ready (its filter refused).
    #[error("the process that removes it did not start")]
    NotReady,
}

/// A process that removes one path when minivmm ends (see the module doc).
#[derive(Debug)]
pub struct Remover {
    /// Our end of the command pipe.
    cmd: Option<OwnedFd>,
    /// Our end of the pipe that reaches its end when the process exits.
    done: OwnedFd,
    /// The process, reaped by [`Remover::disarm`] (the only place the
    /// owner may still wait for a child).
    pid: libc::pid_t,
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, which lives across
    // the call.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just made and nothing else owns them.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// One byte from `fd`, retried on EINTR; `None` at the end of the pipe or
/// on an error.
fn read_byte(fd: RawFd) -> Option<u8> {
    let mut b = 0u8;
    loop {
        // SAFETY: read(2) writes at most one byte into `b`, alive across
        // the call.
        let n = unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) };
        if n == 1 {
            return Some(b);
        }
        if n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        return None;
    }
}

impl Remover {
    /// Forks the process that removes `path` when minivmm ends, under its
    /// filter for `mode`, and waits until it runs. Call it before this
    /// thread's own filter is installed.
    pub fn spawn(path: &Path, mode: SeccompMode) -> Result<Remover, RemoverError> {
        let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|_| RemoverError::Path)?;
        let prog = seccomp::filter(Thread::Remover, mode)?;
        let (cmd_r, cmd_w) = pipe().map_err(RemoverError::Spawn)?;
        let (done_r, done_w) = pipe().map_err(RemoverError::Spawn)?;
        // SAFETY: fork has no memory-safety preconditions. The child runs
        // `child`, which makes only async-signal-safe system calls on data
        // made before the fork, and never returns.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(RemoverError::Spawn(io::Error::last_os_error()));
        }
        if pid == 0 {
            child(
                cmd_r.as_raw_fd(),
                done_w.as_raw_fd(),
                &c_path,
                prog.as_ref(),
            );
        }
        drop((cmd_r, done_w));
        let remover = Remover {
            cmd: Some(cmd_w),
            done: done_r,
            pid,
        };
        if read_byte(remover.done.as_raw_fd()) != Some(READY) {
            remover.disarm();
            return Err(RemoverError::NotReady);
        }
        Ok(remover)
    }

    /// The process's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Tells the process to leave the path alone, waits for it to end and
    /// reaps it. For the owner that removed the path itself, before its
    /// filter (which has no `wait4`).
    pub fn disarm(mut self) {
        if let Some(cmd) = self.cmd.take() {
            // SAFETY: write(2) reads one byte of a live constant.
            unsafe { libc::write(cmd.as_raw_fd(), (&DISARM as *const u8).cast(), 1) };
        }
        let _ = read_byte(self.done.as_raw_fd());
        // SAFETY: `pid` is our child; a null status pointer is allowed.
        unsafe { libc::waitpid(self.pid, std::ptr::null_mut(), 0) };
    }
}

impl Drop for Remover {
    /// Closes the command pipe, so the process removes the path, and waits
    /// until it has ended.
    fn drop(&mut self) {
        drop(self.cmd.take());
        let _ = read_byte(self.done.as_raw_fd());
    }
}

/// Closes every descriptor but the two of `keep`, with close_range(2).
fn close_all_but(keep: [RawFd; 2]) {
    let (lo, hi) = (keep[0].min(keep[1]) as u32, keep[0].max(keep[1]) as u32);
    let ranges = [
        (0, lo.checked_sub(1)),
        (lo + 1, hi.checked_sub(1)),
        (hi + 1, Some(u32::MAX)),
    ];
    for (first, last) in ranges {
        match last {
            Some(last) if first <= last => {
                // SAFETY: close_range takes integers only; it closes
                // descriptors this process (the child) owns alone.
                unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
            }
            _ => {}
        }
    }
}

/// The forked process (see the module doc). Never returns.
fn child(cmd: RawFd, done: RawFd, path: &CString, prog: Option<&BpfProgram>) -> ! {
    // SAFETY: every call below is async-signal-safe and takes integers or
    // pointers to memory made before the fork (the full signal set on this
    // stack, the path, the filter, the name constant).
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        close_all_but([cmd, done]);
        libc::prctl(libc::PR_SET_NAME, NAME.as_ptr());
        if let Some(p) = prog {
            if seccompiler::apply_filter(p).is_err() {
                libc::_exit(1);
            }
        }
        libc::write(done, (&READY as *const u8).cast(), 1);
        if read_byte(cmd) != Some(DISARM) {
            libc::syscall(libc::SYS_unlink, path.as_ptr());
        }
        libc::_exit(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("minivmm-remover-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The process's state letter in /proc (None once it is reaped).
    fn state(pid: libc::pid_t) -> Option<char> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        s.rsplit_once(')')?.1.trim_start().chars().next()
    }

    /// Whether `pid` is a zombie or gone within 30 s (a moment on a quiet
    /// host; only a failing test waits it all on a loaded one).
    fn exits(pid: libc::pid_t) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::time::Instant::now() < deadline {
            if matches!(state(pid), Some('Z') | None) {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn dropping_it_removes_the_path_before_it_returns() {
        let d = scratch("drop");
        let path = d.join("v.sock");
        std::fs::write(&path, b"").unwrap();
        let r = Remover::spawn(&path, SeccompMode::On).unwrap();
        let pid = r.pid();
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_eq!(comm.trim(), "minivmm-unlink");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.contains("Seccomp:\t2"), "{status}");
        let blocked = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:\t"))
            .map(|hex| u64::from_str_radix(hex, 16).unwrap())
            .unwrap();
        for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGQUIT] {
            assert_ne!(blocked & 1 << (sig - 1), 0, "signal {sig} not blocked");
        }
        // It holds nothing of ours but its two pipe ends.
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count();
        assert_eq!(fds, 2);
        assert!(path.exists(), "removed too early");
        drop(r);
        assert!(!path.exists(), "not removed by the time drop returned");
        // Not yet reaped (the owner's filter has no wait4), but gone: its
        // pipe end closes as it exits, a moment before it is a zombie.
        assert!(exits(pid), "still running: {:?}", state(pid));
        // SAFETY: reaps our test's child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn disarmed_it_leaves_the_path_and_is_reaped() {
        let d = scratch("disarm");
        let path = d.join("v.sock");
        std::fs::write(&path, b"").unwrap();
        let r = Remover::spawn(&path, SeccompMode::On).unwrap();
        let pid = r.pid();
        r.disarm();
        assert!(path.exists());
        assert_eq!(state(pid), None, "reaped");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Run by the next test in a process of its own (this test binary,
    /// started again): spawns a remover for the path in
    /// `MINIVMM_REMOVER_OWNER`, prints its pid and waits to be killed.
    /// Returns at once when run with the others.
    #[test]
    fn owner_helper() {
        let Some(path) = std::env::var_os("MINIVMM_REMOVER_OWNER") else {
            return;
        };
        let r = Remover::spawn(Path::new(&path), SeccompMode::On).unwrap();
        println!("remover-pid {}", r.pid());
        std::thread::sleep(std::time::Duration::from_secs(600));
    }

    #[test]
    fn signals_do_not_stop_it_and_the_owners_death_removes_the_path() {
        use std::io::BufRead;
        let d = scratch("death");
        let path = d.join("v.sock");
        std::fs::write(&path, b"").unwrap();
        let mut owner = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "process::remover::tests::owner_helper",
                "--nocapture",
            ])
            .env("MINIVMM_REMOVER_OWNER", &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(owner.stdout.take().unwrap());
        let pid: libc::pid_t = out
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("remover-pid ").map(|p| p.parse().unwrap()))
            .expect("the owner printed its remover's pid");
        // SAFETY: signals to the remover, a process this test started.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
            libc::kill(pid, libc::SIGINT);
            libc::kill(pid, libc::SIGHUP);
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            matches!(state(pid), Some('S' | 'R')),
            "it ended on a signal"
        );
        assert!(path.exists());
        owner.kill().unwrap();
        owner.wait().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while path.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!path.exists(), "the owner's death left the path");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Run by the next test in a process of its own: with no descriptor
    /// number to spare (RLIMIT_NOFILE 3, stdio open), prints what `spawn`
    /// returned. Returns at once when run with the others.
    #[test]
    fn no_descriptor_helper() {
        if std::env::var_os("MINIVMM_REMOVER_NOFILE").is_none() {
            return;
        }
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit read and write the struct above.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            lim.rlim_cur = 3;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
        let got = match Remover::spawn(Path::new("/nonexistent/v.sock"), SeccompMode::Off) {
            Err(RemoverError::Spawn(e)) => format!("Spawn {:?}", e.raw_os_error()),
            Err(e) => format!("other: {e}"),
            Ok(_) => "started".into(),
        };
        println!("spawn: {got}");
    }

    #[test]
    fn with_no_descriptor_to_spare_it_is_a_spawn_error() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "process::remover::tests::no_descriptor_helper",
                "--nocapture",
            ])
            .env("MINIVMM_REMOVER_NOFILE", "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let want = format!("spawn: Spawn Some({})", libc::EMFILE);
        assert!(text.contains(&want), "{text}");
    }

    extern "C" fn nothing(_: libc::c_int) {}

    #[test]
    fn a_wait_a_signal_interrupts_goes_on_until_the_end_of_the_pipe() {
        use std::os::unix::thread::JoinHandleExt;
        use std::time::Duration;
        // A real-time signal no other code here uses (the vCPU kick is
        // SIGRTMIN + 5).
        let sig = libc::SIGRTMIN() + 9;
        // SAFETY: installs a handler that does nothing, without SA_RESTART,
        // so that a blocked read(2) returns EINTR; the struct is zeroed
        // and then filled.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
        }
        let (r, w) = pipe().unwrap();
        let fd = r.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            // SAFETY: unblocks one signal for this thread, through a set
            // on its stack.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            }
            let _ = tx.send(read_byte(fd));
        });
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: the thread is joinable until joined below, so its
            // handle is valid (an ended one gets ESRCH).
            unsafe { libc::pthread_kill(t.as_pthread_t(), sig) };
        }
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "a signal ended the wait"
        );
        drop(w);
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(5)),
            Ok(None),
            "the end of the pipe did not end the wait"
        );
        t.join().unwrap();
    }

    #[test]
    fn a_path_with_a_nul_is_refused() {
        use std::os::unix::ffi::OsStrExt;
        let p = Path::new(std::ffi::OsStr::from_bytes(b"a\0b"));
        assert!(matches!(
            Remover::spawn(p, SeccompMode::Off),
            Err(RemoverError::Path)
        ));
    }
}
