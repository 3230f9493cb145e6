// SPDX-License-Identifier: Apache-2.0
//! x86_64 boot setup for minivmm.
//!
//! Everything in this crate is a pure function: it either writes boot structures into a
//! `vm_memory::GuestMemoryMmap` or returns `kvm_bindings` values (`kvm_regs`, `kvm_sregs`,
//! `kvm_fpu`, MSR entries, a filtered `CpuId`). No ioctl is issued here and the crate does not
//! depend on `kvm-ioctls`: the `vmm` crate applies the values to its vCPUs. Keeping the boot
//! logic free of KVM lets every table be unit-tested by writing it into plain guest memory and
//! reading it back.
//!
//! The crate has no unsafe code: the packed boot structures come from `linux_loader::bootparam`,
//! which already implements `ByteValued` for them, and the MP table is serialised by hand.

#![deny(missing_docs)]
#![deny(unsafe_code)]

#[cfg(target_arch = "x86_64")]
pub mod x86_64;
