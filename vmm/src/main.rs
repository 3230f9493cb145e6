// SPDX-License-Identifier: Apache-2.0
//! `minivmm`: boot a Linux guest with a virtio-net card on a host TAP.
//!
//! Exit status: 0 when the guest reboots or powers off or minivmm is stopped
//! by SIGTERM/SIGINT; 1 for a bad configuration or a failure before boot;
//! 2 when the VM fails at run time; 3 when the guest reset after a kernel panic;
//! 148 when a thread made a system call its seccomp filter forbids.

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use log::{error, info, LevelFilter, Log, Metadata, Record};

use vmm::cli::{error_line, Cli};
use vmm::seccomp::{self, Filters};
use vmm::vm_exit::VmExit;

/// Logs to stderr, one line per record, so that the guest console on stdout
/// stays clean.
struct StderrLogger(LevelFilter);

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata) -> bool {
        metadata.level() <= self.0
    }

    fn log(&self, record: &Record) {
        if self.enabled(record.metadata()) {
            eprintln!(
                "minivmm: {}: {}",
                record.level().as_str().to_lowercase(),
                record.args()
            );
        }
    }

    fn flush(&self) {}
}

fn main() -> ExitCode {
    let start = Instant::now();
    let cli = Cli::parse();
    let level = cli.log_level;
    let seccomp_mode = cli.seccomp;
    // A second logger cannot be installed in this process; ignore the error.
    let _ = log::set_logger(Box::leak(Box::new(StderrLogger(level))));
    log::set_max_level(level);

    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("minivmm: error: {}", error_line(&e));
            return ExitCode::from(1);
        }
    };
    // Compiled before anything starts, so a broken list is a setup error;
    // installed by the threads themselves in Vmm::run.
    let filters = match Filters::new(seccomp_mode).and_then(|f| {
        seccomp::install_sigsys_handler()?;
        Ok(f)
    }) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("minivmm: error: {}", error_line(&e));
            return ExitCode::from(1);
        }
    };
    let vmm = match vmm::builder::build(&config) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("minivmm: error: {}", error_line(&e));
            return ExitCode::from(1);
        }
    };
    match vmm.run(start, filters) {
        Ok(reason) => {
            match &reason {
                VmExit::Fault(_) => error!("{}", reason.describe()),
                _ => info!("{}", reason.describe()),
            }
            if let VmExit::Fault(msg) = &reason {
                // Faults are reported even at the quietest log level.
                if level < LevelFilter::Error {
                    eprintln!("minivmm: error: {msg}");
                }
            }
            ExitCode::from(reason.exit_code() as u8)
        }
        Err(e) => {
            eprintln!("minivmm: error: cannot run the VM: {}", error_line(&e));
            ExitCode::from(2)
        }
    }
}
