// SPDX-License-Identifier: Apache-2.0
//! `jailer`: starts minivmm (or another static VMM) jailed, with Firecracker's
//! jailer's command line; the work is `vmm::process::jailer`.

fn main() -> std::process::ExitCode {
    vmm::process::jailer::main()
}
