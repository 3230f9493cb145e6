// SPDX-License-Identifier: Apache-2.0
//! `minivmm`: boot a Linux guest with virtio-net cards on host TAPs.
//!
//! Exit status: 0 when the guest reboots or powers off or minivmm is stopped
//! by SIGTERM/SIGINT; 1 for bad usage or configuration (the argument parser's
//! own errors included) or a failure before boot, always one line on stderr;
//! 2 when the VM fails at run time; 3 when the guest reset after a kernel
//! panic.
//! 101 when minivmm itself panicked, on any thread (a bug).
//! 148 when a thread made a system call its seccomp filter forbids.

use std::process::ExitCode;
use std::time::Instant;

use clap::error::ErrorKind;
use clap::Parser;
use log::{error, info, LevelFilter};

use vmm::config::cli::Cli;
use vmm::error_line;
use vmm::seccomp::{self, Filters};
use vmm::vm_exit::VmExit;

/// Bad usage or configuration, or a failure before the guest runs.
const EXIT_CONFIG: u8 = 1;
/// The VM failed at run time (also `VmExit::exit_code` for faults).
const EXIT_RUNTIME: u8 = 2;

fn fail(msg: &str) -> ExitCode {
    eprintln!("minivmm: error: {msg}");
    ExitCode::from(EXIT_CONFIG)
}

/// clap's own message as one line: its first paragraph (which may list the
/// missing arguments on the lines below the first), without the usage block
/// and tips that follow.
fn clap_line(e: &clap::Error) -> String {
    let rendered = e.to_string();
    let first: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .collect();
    let text = first.join(" ");
    let text = text.trim_start_matches("error: ");
    if text.is_empty() {
        "invalid arguments (see --help)".to_string()
    } else {
        format!("{text} (see --help)")
    }
}

fn main() -> ExitCode {
    let start = Instant::now();
    // Before anything can panic: a panic on any thread ends the process.
    vmm::terminal::install_panic_hook();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            // --help and --version print to stdout and succeed.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&clap_line(&e)),
    };
    let config = match cli.into_config() {
        Ok(c) => c,
        Err(e) => return fail(&error_line(&e)),
    };
    // Inherited TAP descriptors are claimed before this process opens any
    // file, so a number the user names cannot be one of ours.
    let tap_fds = match vmm::builder::claim_tap_fds(&config) {
        Ok(fds) => fds,
        Err(e) => return fail(&error_line(&e)),
    };
    // Compiled before anything starts, so a broken list is a setup error;
    // installed by the threads themselves in Vmm::run.
    let filters = match Filters::new(config.seccomp).and_then(|f| {
        seccomp::install_sigsys_handler()?;
        Ok(f)
    }) {
        Ok(f) => f,
        Err(e) => return fail(&error_line(&e)),
    };
    if let Err(e) = vmm::logger::init(&config.logger) {
        return fail(&error_line(&e));
    }
    let level = log::max_level();
    let vmm = match vmm::builder::build(&config, tap_fds) {
        Ok(v) => v,
        Err(e) => return fail(&error_line(&e)),
    };
    match vmm.run(start, filters) {
        Ok(reason) => {
            match &reason {
                VmExit::Fault(_) => error!("{}", reason.describe()),
                _ => info!("{}", reason.describe()),
            }
            if let VmExit::Fault(msg) = &reason {
                // Faults reach stderr even when the log is quieter or elsewhere.
                if level < LevelFilter::Error || config.logger.path.is_some() {
                    eprintln!("minivmm: error: {msg}");
                }
            }
            ExitCode::from(reason.exit_code() as u8)
        }
        Err(e) => {
            eprintln!("minivmm: error: cannot run the VM: {}", error_line(&e));
            ExitCode::from(EXIT_RUNTIME)
        }
    }
}
