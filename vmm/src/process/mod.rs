// SPDX-License-Identifier: Apache-2.0
//! Process hardening: what stands between a compromised minivmm thread, or
//! a hostile operator-side event, and the host.
//!
//! - [`settle`]: what the C library and std ask the system once, asked
//!   before any filter;
//! - [`jail`]: the mount namespace, ids, rlimits and device nodes of
//!   `--jail`;
//! - [`remover`]: the process that removes the vsock socket when minivmm
//!   ends, however it ends;
//! - [`seccomp`]: one system-call allowlist per kind of thread;
//! - [`seccomp_file`]: `--seccomp-filter`, the filters from Firecracker's
//!   seccompiler JSON instead;
//! - [`signals`]: SIGTERM, SIGINT and SIGUSR1 as events on the event loop;
//! - [`syscall_names`]: the system calls' names, for the SIGSYS handler's
//!   line;
//! - [`terminal`]: the console's terminal mode, restored on every way out.
//!
//! The VM's own kernel state (memory, vCPUs) is in [`crate::kvm`].

pub mod jail;
pub mod jailer;
pub mod remover;
pub mod seccomp;
pub mod seccomp_file;
pub mod settle;
pub mod signals;
pub mod syscall_names;
pub mod terminal;
