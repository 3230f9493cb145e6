// SPDX-License-Identifier: Apache-2.0
//! `jailer`: starts minivmm (or another static VMM) jailed, with Firecracker's
//! jailer's command line (`vmm::process::jailer` does the work).
//!
//! Exit status 1 and one line on stderr when a step fails; otherwise it
//! becomes the VMM (or, with `--daemonize` or `--new-pid-ns`, exits 0 once
//! the VMM's process is on its way).

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use vmm::process::jail::{empty_environment, sys::close_all_but};
use vmm::process::jailer::JailerArgs;
use vmm::{config::cli::clap_line, error_line};

fn fail(msg: &str) -> ExitCode {
    eprintln!("jailer: error: {msg}");
    ExitCode::from(1)
}

fn main() -> ExitCode {
    let started_us = vmm::monotonic_us();
    // Nothing of the caller's goes on but stdio and the command line.
    if let Err(e) = close_all_but(&[]) {
        return fail(&error_line(&e));
    }
    empty_environment(&[]);
    let args = match JailerArgs::try_parse() {
        Ok(a) => a,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(&clap_line(&e)),
    };
    match args.validate() {
        Ok(jailer) => fail(&error_line(&jailer.run(started_us))),
        Err(e) => fail(&error_line(&e)),
    }
}
