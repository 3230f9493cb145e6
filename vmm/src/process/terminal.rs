// SPDX-License-Identifier: Apache-2.0
//! The console's terminal mode, and leaving the process when it must end
//! at once.
//!
//! When stdin is a terminal the console puts it in raw mode, so keys reach
//! the guest as typed. Every way out of minivmm must give the user back the
//! terminal they had: the normal way drops [`RawTerminal`]; the two abrupt
//! ones, the seccomp SIGSYS handler and the panic hook, call
//! [`restore_at_crash`], which may run in a signal handler and on any thread
//! under its filter. So the mode to restore is saved before any filter, in
//! memory that is never written again, and restoring it is one `tcsetattr`
//! on fd 0: glibc's `TCSETS` ioctl and the `TCGETS` it reads the mode back
//! with, both in every thread's allowlist for exactly this, on fd 0 only.
//!
//! The panic hook ([`install_panic_hook`]) makes a panic anywhere end the
//! whole process with [`PANIC_EXIT_STATUS`] and one line on stderr. Without
//! it a panicking vCPU thread would die alone and leave the VM hung with its
//! terminal raw, and with `RUST_BACKTRACE` set the default hook would open
//! files to symbolise the backtrace, which the filters forbid (status 148
//! instead of the panic's line).
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Exit status of a panic, on any thread: a bug in minivmm. The status a
/// Rust program's main thread gets for one, here for every thread.
pub const PANIC_EXIT_STATUS: i32 = 101;

/// The terminal mode stdin had before the console made it raw.
static SAVED: OnceLock<libc::termios> = OnceLock::new();
/// Raw mode is on: the saved mode is what to restore.
static RAW: AtomicBool = AtomicBool::new(false);

/// Raw mode on a terminal stdin for as long as this lives.
#[derive(Debug)]
pub struct RawTerminal {
    active: bool,
}

impl RawTerminal {
    /// Puts stdin in raw mode if it is a terminal (otherwise does nothing).
    /// Call it before the seccomp filters are installed.
    pub(crate) fn new() -> Self {
        RawTerminal {
            active: enter_raw(libc::STDIN_FILENO),
        }
    }

    /// Whether stdin was a terminal and is in raw mode now.
    #[cfg(test)]
    pub(crate) fn is_active(&self) -> bool {
        self.active
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if self.active && !restore(libc::STDIN_FILENO) {
            log::warn!(
                "cannot restore the terminal: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Saves `fd`'s mode and makes it raw; false if `fd` is not a terminal or
/// the mode cannot be set.
fn enter_raw(fd: libc::c_int) -> bool {
    // SAFETY: an all-zero termios is a valid value to pass for tcgetattr to
    // fill; `t` lives across the call.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a live termios; tcgetattr fails (ENOTTY, EBADF) without
    // touching anything but it when `fd` is not a terminal.
    if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
        return false;
    }
    let saved = *SAVED.get_or_init(|| t);
    // What vmm-sys-util's raw mode turns off: no line editing, no
    // echo, no signals from keys (Ctrl-C goes to the guest). Input and
    // output processing stay as the user had them.
    let mut raw = saved;
    raw.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
    // SAFETY: `raw` is a valid termios that lives across the call.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
        return false;
    }
    RAW.store(true, Ordering::SeqCst);
    true
}

/// Puts the saved mode back on `fd`; true if that worked or there was
/// nothing to do. Async-signal-safe: an atomic, a read of memory written
/// once before, and `tcsetattr` (POSIX lists it as async-signal-safe).
fn restore(fd: libc::c_int) -> bool {
    if !RAW.swap(false, Ordering::SeqCst) {
        return true;
    }
    match SAVED.get() {
        // SAFETY: `t` is the termios saved by `enter_raw`, never written
        // again, and lives for the whole process.
        Some(t) => unsafe { libc::tcsetattr(fd, libc::TCSANOW, t) == 0 },
        None => true,
    }
}

/// Gives the terminal its mode back on the way out of a crash (the SIGSYS
/// handler, the panic hook). Async-signal-safe, allowed by every filter.
pub fn restore_at_crash() {
    restore(libc::STDIN_FILENO);
}

/// Makes a panic on any thread end the process at once with
/// [`PANIC_EXIT_STATUS`]: one line on stderr naming where and what, the
/// terminal restored, no unwinding into threads that share the VM's state,
/// no backtrace (its symbolisation would open files the filters forbid).
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        restore_at_crash();
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(no message)");
        let thread = std::thread::current();
        let line = format!(
            "minivmm: error: internal error (a bug): thread '{}' panicked at {}: {}\n",
            thread.name().unwrap_or("?"),
            info.location()
                .map_or_else(|| "?".to_string(), ToString::to_string),
            crate::one_line(msg.to_string()),
        );
        // SAFETY: `line` is a live buffer of `line.len()` bytes; fd 2 is
        // stderr (a failed write changes nothing). _exit never returns and
        // skips destructors other threads may be inside of; write and
        // exit_group are in every thread's allowlist.
        unsafe {
            libc::write(2, line.as_ptr().cast(), line.len());
            libc::_exit(PANIC_EXIT_STATUS);
        }
    }));
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::process::{Command, Stdio};

    use minivmm_tests::pty::{self, canonical};

    use super::*;
    use crate::process::seccomp::{self, SeccompMode, Thread, BAD_SYSCALL_EXIT_STATUS};

    /// Set in a re-executed test binary: the test named by its value runs
    /// the crash itself instead of spawning the child.
    const CHILD_ENV: &str = "MINIVMM_TERMINAL_TEST_CHILD";

    /// Runs this test binary again as `test` with stdin on a fresh pty's
    /// slave, `RUST_BACKTRACE=1`, and the child switch set; returns the exit
    /// status, stderr, and whether the slave is canonical after the child.
    fn crash_child(test: &str) -> (Option<i32>, String, bool) {
        let (master, slave) = pty::open();
        assert!(canonical(&slave), "a new pty is canonical");
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, test)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let after = canonical(&slave);
        drop(master);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            after,
        )
    }

    fn in_child(test: &str) -> bool {
        std::env::var(CHILD_ENV).is_ok_and(|v| v == test)
    }

    /// In the child: raw mode on the pty, then the vCPU filter on a
    /// thread that `crash`es.
    fn raw_then_filtered_thread(crash: fn()) -> ! {
        let t = RawTerminal::new();
        assert!(t.is_active(), "stdin is the pty");
        std::mem::forget(t);
        install_panic_hook();
        seccomp::install_sigsys_handler().unwrap();
        let prog = seccomp::filter(Thread::Vcpu, SeccompMode::On).unwrap();
        let h = std::thread::spawn(move || {
            seccomp::apply(Thread::Vcpu, prog.as_ref()).unwrap();
            crash();
        });
        let _ = h.join();
        // Not reached: the crash ends the process.
        std::process::exit(0)
    }

    #[test]
    fn a_panic_in_a_filtered_thread_ends_with_101_one_line_and_the_terminal_back() {
        const NAME: &str =
            "process::terminal::tests::a_panic_in_a_filtered_thread_ends_with_101_one_line_and_the_terminal_back";
        if in_child(NAME) {
            raw_then_filtered_thread(|| panic!("boom\nsecond line"));
        }
        let (code, stderr, canonical) = crash_child(NAME);
        assert_eq!(code, Some(PANIC_EXIT_STATUS), "stderr: {stderr}");
        let ours: Vec<&str> = stderr
            .lines()
            .filter(|l| l.starts_with("minivmm:"))
            .collect();
        assert_eq!(ours.len(), 1, "stderr: {stderr}");
        assert!(
            ours[0].contains("panicked at vmm/src/process/terminal.rs:"),
            "{}",
            ours[0]
        );
        assert!(ours[0].ends_with(r"boom\nsecond line"), "{}", ours[0]);
        // Not the default hook's output, nor a backtrace.
        assert!(!stderr.contains("stack backtrace"), "stderr: {stderr}");
        assert!(canonical, "terminal left raw");
    }

    #[test]
    fn a_forbidden_call_gives_the_terminal_back() {
        const NAME: &str = "process::terminal::tests::a_forbidden_call_gives_the_terminal_back";
        if in_child(NAME) {
            raw_then_filtered_thread(|| {
                // SAFETY: uname is in no allowlist; a null buffer would fail
                // with EFAULT, harmlessly, if the filter let it through.
                unsafe { libc::syscall(libc::SYS_uname, 0usize) };
            });
        }
        let (code, stderr, canonical) = crash_child(NAME);
        assert_eq!(code, Some(BAD_SYSCALL_EXIT_STATUS), "stderr: {stderr}");
        assert!(stderr.contains("forbidden system call"), "stderr: {stderr}");
        assert!(canonical, "terminal left raw");
    }

    #[test]
    fn raw_mode_is_entered_and_left_on_a_pty_only() {
        let (_master, slave) = pty::open();
        // Not a terminal: nothing happens.
        let (r, _w) = std::io::pipe().unwrap();
        assert!(!enter_raw(r.as_raw_fd()));
        // A pty: raw, then back.
        assert!(enter_raw(slave.as_raw_fd()));
        assert!(!canonical(&slave));
        assert!(restore(slave.as_raw_fd()));
        assert!(canonical(&slave));
        // A second restore has nothing to do.
        assert!(restore(slave.as_raw_fd()));
    }
}
