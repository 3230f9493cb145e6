// SPDX-License-Identifier: Apache-2.0
//! minivmm's VMM: configuration, KVM set-up, device placement, vCPUs and the
//! event loop. Device logic lives in the `devices` crate and boot tables in
//! `arch`; this crate applies them to KVM and runs the VM.
#![deny(unsafe_code)]

pub mod api;
pub mod builder;
pub mod config;
pub mod device_manager;
pub mod event_loop;
pub mod jail;
pub mod kernel;
pub mod kvm;
pub mod line_writer;
pub mod logger;
pub mod memory;
pub mod metrics;
pub mod pause;
pub mod pvm;
pub mod seccomp;
pub mod signals;
pub mod terminal;
pub mod vcpu;
pub mod vm_exit;
pub mod vmm;

/// Formats an error and its causes on one line (`a: b: c`): every
/// configuration or start-up failure is reported this way. Control
/// characters are escaped, so that a value the user typed (a MAC with a
/// newline in it) cannot split the line.
pub fn error_line(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    one_line(s)
}

/// `s` with its control characters escaped (`\n`, `\u{1b}`), so that it
/// prints as one line whatever it holds.
pub fn one_line(s: String) -> String {
    if !s.contains(char::is_control) {
        return s;
    }
    let mut line = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            line.extend(c.escape_default());
        } else {
            line.push(c);
        }
    }
    line
}

/// CLOCK_MONOTONIC in microseconds: the clock Firecracker's jailer gives
/// its start time in (`--start-time-us`).
#[allow(unsafe_code)]
pub fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1000
}
