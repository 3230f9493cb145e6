// SPDX-License-Identifier: Apache-2.0
//! x86_64 boot setup: the guest memory layout and every structure the Linux 64-bit boot
//! protocol expects to find in memory or in vCPU registers at the kernel's entry point.
//!
//! Order of use in a VMM (each step is independent of KVM):
//! 1. [`arch_memory_regions`] to create guest RAM around the 32-bit MMIO gap;
//! 2. load the kernel (linux-loader) and [`write_cmdline`]; place the initramfs with
//!    [`initrd_load_addr`];
//! 3. [`configure_zero_page`] and [`setup_mptable`];
//! 4. per vCPU: [`filter_cpuid`], [`boot_msr_entries`], [`setup_regs`], [`setup_sregs`],
//!    [`setup_fpu`], [`set_lint`].

pub mod boot_params;
pub mod cpuid;
pub mod gdt;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod paging;
pub mod regs;

pub use boot_params::{
    configure_zero_page, e820_entries, initrd_load_addr, kernel_entry_point, write_cmdline,
    BootParamsError, ZeroPageConfig,
};
pub use cpuid::filter_cpuid;
pub use gdt::GdtError;
pub use layout::arch_memory_regions;
pub use mptable::{setup_mptable, MptableError};
pub use msr::boot_msr_entries;
pub use paging::{setup_identity_paging, PagingError};
pub use regs::{set_lint, setup_fpu, setup_regs, setup_sregs, RegsError};
