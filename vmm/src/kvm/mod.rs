// SPDX-License-Identifier: Apache-2.0
//! The VM's KVM state: what minivmm holds in the kernel for the guest and
//! the threads that run it.
//!
//! - [`checks`]: opening `/dev/kvm` and checking every capability up front;
//! - [`memory`]: guest memory and its registration with KVM;
//! - [`vcpu`]: vCPU configuration and the run loop with its pure exit
//!   dispatch;
//! - [`pause`]: parking the vCPUs between two `KVM_RUN`s (`PATCH /vm`);
//! - [`vm_exit`]: why a VM ends and how that reaches the main thread;
//! - [`pvm`]: the recoveries a PVM-backed host needs.
//!
//! The irqchip and PIT are created by the builder's `create_irqchip` step.
//! What protects the process itself (jail, seccomp, signals) is in
//! [`crate::process`].

pub mod checks;
pub mod memory;
pub mod pause;
pub mod pvm;
pub mod state;
pub mod vcpu;
pub mod vm_exit;

pub use checks::{open_and_check, KvmError};
