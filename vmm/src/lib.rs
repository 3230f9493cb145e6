// SPDX-License-Identifier: Apache-2.0
//! minivmm's VMM: configuration, KVM set-up, device placement, vCPUs and the
//! event loop. Device logic lives in the `devices` crate and boot tables in
//! `arch`; this crate applies them to KVM and runs the VM.
#![deny(unsafe_code)]

pub mod api;
pub mod builder;
pub mod config;
pub mod control;
pub mod device_manager;
pub mod event_loop;
pub mod guest_panic;
pub mod host_socket;
pub mod images;
pub mod kernel;
pub mod kvm;
pub mod line_writer;
pub mod listen;
pub mod logger;
pub mod metrics;
pub mod process;
pub mod registry;
pub mod serial_out;
pub mod snapshot;
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
pub fn monotonic_us() -> u64 {
    clock_us(libc::CLOCK_MONOTONIC)
}

/// The CPU time this process has used, every thread together, in
/// microseconds (what Firecracker's boot-time line reports as CPU time).
pub fn process_cpu_us() -> u64 {
    clock_us(libc::CLOCK_PROCESS_CPUTIME_ID)
}

#[allow(unsafe_code)]
fn clock_us(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call. Both clocks
    // used here always exist, so the call cannot fail.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    timespec_us(&ts)
}

fn timespec_us(ts: &libc::timespec) -> u64 {
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1000
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_timespec_is_whole_microseconds() {
        let ts = libc::timespec {
            tv_sec: 3,
            tv_nsec: 250_999,
        };
        assert_eq!(timespec_us(&ts), 3_000_250);
    }

    #[test]
    fn the_cpu_clock_counts_work_and_the_monotonic_clock_counts_sleep() {
        let before = process_cpu_us();
        // Spin until 20 ms of CPU time show (other tests' threads only add
        // to it); a clock that stands still fails at the deadline.
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_cpu_us() < before + 20_000 {
            assert!(Instant::now() < deadline, "CPU time stayed at {before} us");
            std::hint::spin_loop();
        }
        // The monotonic clock moves while the process sleeps.
        let m = monotonic_us();
        std::thread::sleep(Duration::from_millis(20));
        assert!(monotonic_us() >= m + 20_000);
    }
}
