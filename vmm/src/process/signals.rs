// SPDX-License-Identifier: Apache-2.0
//! SIGTERM, SIGINT and SIGUSR1 as events on the event loop.
//!
//! The signals are blocked in every thread (the mask is set before the vCPU
//! threads are spawned, which inherit it) and read from a signalfd, so a stop
//! request is handled on the main thread between events, never inside an
//! async-signal context.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use vmm_sys_util::signal::{self, block_signal, create_sigset};

/// A non-blocking signalfd for a set of blocked signals.
pub struct SignalFd {
    fd: OwnedFd,
}

impl SignalFd {
    /// Blocks `signals` in the calling thread (and the threads it spawns
    /// afterwards), if they are not blocked already, and opens a signalfd
    /// that reports them.
    pub fn new(signals: &[libc::c_int]) -> io::Result<Self> {
        for &sig in signals {
            match block_signal(sig) {
                // Blocked already (by the pre-boot API loop's signalfd, whose
                // pending signals this one reports as well): what we want.
                Ok(()) | Err(signal::Error::SignalAlreadyBlocked(_)) => {}
                Err(e) => return Err(io::Error::other(format!("block signal {sig}: {e}"))),
            }
        }
        let set = create_sigset(signals).map_err(|e| io::Error::from_raw_os_error(e.errno()))?;
        // SAFETY: `set` is a valid, initialised sigset_t that outlives the
        // call; -1 asks for a new fd; the flags are valid signalfd flags.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: signalfd returned a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(SignalFd { fd })
    }

    /// Reads one pending signal number, or `None` if none is pending.
    pub fn read(&self) -> io::Result<Option<i32>> {
        let mut info = std::mem::MaybeUninit::<libc::signalfd_siginfo>::zeroed();
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: the buffer is `size` bytes of writable memory owned by
        // `info`, and the fd is a signalfd we own.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), info.as_mut_ptr().cast(), size) };
        if n < 0 {
            let err = io::Error::last_os_error();
            return match err.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(err),
            };
        }
        if n as usize != size {
            return Err(io::Error::other("short read from signalfd"));
        }
        // SAFETY: the kernel filled the whole struct (n == size above), and
        // every bit pattern is a valid signalfd_siginfo.
        let info = unsafe { info.assume_init() };
        Ok(Some(info.ssi_signo as i32))
    }
}

impl AsRawFd for SignalFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_signalfd_for_blocked_signals_is_fine_and_both_see_them() {
        // On a thread of its own: the mask is per thread.
        std::thread::spawn(|| {
            let sig = libc::SIGUSR2;
            let first = SignalFd::new(&[sig]).expect("first");
            let second = SignalFd::new(&[sig]).expect("second, the signal already blocked");
            assert_eq!(first.read().expect("read"), None);
            // SAFETY: raise sends a blocked signal to this thread; it stays
            // pending until a signalfd reads it.
            unsafe { libc::raise(sig) };
            assert_eq!(second.read().expect("read"), Some(sig));
            assert_eq!(
                first.read().expect("read"),
                None,
                "read once, by one of them"
            );
        })
        .join()
        .expect("thread");
    }
}
