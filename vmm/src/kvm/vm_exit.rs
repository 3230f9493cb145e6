// SPDX-License-Identifier: Apache-2.0
//! Why a VM ends, and how that reaches the main thread.
//!
//! Any thread (a vCPU, the event loop) may learn that the VM must end. The
//! first reason reported wins and wakes the event loop through an `EventFd`,
//! which then tears down in one place: terminal restored, metrics written,
//! process exit code chosen from the reason.

use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::EventFd;

/// Why the VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmExit {
    /// The guest reset the machine (i8042 reset pulse or KVM reset event).
    Reset,
    /// The guest reset the machine after its kernel reported a panic
    /// through the pvpanic register.
    PanicReset,
    /// The guest powered off.
    PowerOff,
    /// The host asked us to stop (SIGTERM/SIGINT).
    Signal(i32),
    /// A failure the VM cannot survive (KVM error, triple fault, emulation failure).
    Fault(String),
}

impl VmExit {
    /// The process exit status for this reason; documented in the README.
    pub fn exit_code(&self) -> i32 {
        match self {
            VmExit::Reset | VmExit::PowerOff | VmExit::Signal(_) => 0,
            VmExit::Fault(_) => 2,
            VmExit::PanicReset => 3,
        }
    }

    /// Whether a fault must also be written to stderr: the log line alone
    /// would not reach the operator when the log is off (`level` below
    /// `Error`) or goes to a file. Other ends are not errors.
    pub fn needs_stderr(&self, level: log::LevelFilter, log_to_file: bool) -> bool {
        matches!(self, VmExit::Fault(_)) && (level < log::LevelFilter::Error || log_to_file)
    }

    /// One line for the log.
    pub fn describe(&self) -> String {
        match self {
            VmExit::Reset => "guest reset the machine".to_string(),
            VmExit::PanicReset => {
                "guest reset the machine after a kernel panic (reported by the guest kernel \
                 through pvpanic)"
                    .to_string()
            }
            VmExit::PowerOff => "guest powered off".to_string(),
            VmExit::Signal(sig) => format!("stopped by signal {sig}"),
            VmExit::Fault(msg) => msg.clone(),
        }
    }
}

/// Where the VM's end is reported: a cloneable latch that keeps the first
/// reason reported (later ones are ignored) and wakes the event loop.
#[derive(Clone)]
pub struct ExitLatch {
    reason: Arc<Mutex<Option<VmExit>>>,
    evt: Arc<EventFd>,
}

impl ExitLatch {
    /// An empty latch with its wake-up `EventFd`.
    pub fn new() -> std::io::Result<Self> {
        Ok(ExitLatch {
            reason: Arc::new(Mutex::new(None)),
            evt: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
        })
    }

    /// Records `reason` unless one was recorded already, and wakes the loop.
    pub fn report(&self, reason: VmExit) {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(reason);
        }
        drop(slot);
        if let Err(e) = self.evt.write(1) {
            log::error!("cannot wake the event loop: {e}");
        }
    }

    /// The recorded reason, if any.
    pub fn reason(&self) -> Option<VmExit> {
        self.reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The wake-up `EventFd` the event loop watches.
    pub fn evt(&self) -> &EventFd {
        &self.evt
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_reaches_stderr_only_where_the_log_would_not_show_it() {
        use log::LevelFilter::{Error, Off, Warn};
        let fault = VmExit::Fault("KVM_RUN failed".into());
        // The log is on stderr at error level or above: one line there is enough.
        assert!(!fault.needs_stderr(Error, false));
        assert!(!fault.needs_stderr(Warn, false));
        // Off, or in a file: stderr gets its own line.
        assert!(fault.needs_stderr(Off, false));
        assert!(fault.needs_stderr(Error, true));
        assert!(fault.needs_stderr(Warn, true));
        for end in [
            VmExit::Reset,
            VmExit::PowerOff,
            VmExit::Signal(15),
            VmExit::PanicReset,
        ] {
            assert!(!end.needs_stderr(Off, true), "{end:?}");
        }
    }

    #[test]
    fn first_reason_wins_and_wakes() {
        let exit = ExitLatch::new().unwrap();
        assert_eq!(exit.reason(), None);
        exit.clone().report(VmExit::Reset);
        exit.report(VmExit::Fault("later".into()));
        assert_eq!(exit.reason(), Some(VmExit::Reset));
        assert_eq!(exit.evt().read().unwrap(), 2);
    }

    #[test]
    fn each_end_is_described_in_its_own_words() {
        assert_eq!(VmExit::Reset.describe(), "guest reset the machine");
        assert_eq!(
            VmExit::PanicReset.describe(),
            "guest reset the machine after a kernel panic (reported by the guest kernel through pvpanic)"
        );
        assert_eq!(VmExit::PowerOff.describe(), "guest powered off");
        assert_eq!(VmExit::Signal(15).describe(), "stopped by signal 15");
        assert_eq!(
            VmExit::Fault("triple fault".into()).describe(),
            "triple fault"
        );
    }

    #[test]
    fn exit_codes() {
        assert_eq!(VmExit::Reset.exit_code(), 0);
        assert_eq!(VmExit::PowerOff.exit_code(), 0);
        assert_eq!(VmExit::Signal(15).exit_code(), 0);
        assert_eq!(VmExit::Fault("x".into()).exit_code(), 2);
        assert_eq!(VmExit::PanicReset.exit_code(), 3);
    }
}
