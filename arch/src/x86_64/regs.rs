// SPDX-License-Identifier: Apache-2.0
//! Initial vCPU register state for the Linux 64-bit boot protocol.
//!
//! The protocol (Documentation/x86/boot.rst, "64-bit Boot Protocol") enters the kernel in long
//! mode with paging on, flat `__BOOT_CS`/`__BOOT_DS` segments, interrupts off and RSI pointing
//! at the zero page. These functions compute that state as `kvm_bindings` values; the VMM
//! applies them with `KVM_SET_REGS`, `KVM_SET_SREGS`, `KVM_SET_FPU`, `KVM_SET_MSRS` and
//! `KVM_SET_LAPIC`.

use kvm_bindings::{kvm_fpu, kvm_lapic_state, kvm_regs, kvm_sregs};
use vm_memory::GuestMemoryMmap;

use super::gdt::{
    boot_gdt_table, kvm_segment_from_gdt, write_gdt_table, write_idt_value, GdtError, CODE_INDEX,
    DATA_INDEX, TSS_INDEX,
};
use super::layout::{BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER};
use super::paging::{setup_identity_paging, PagingError};

pub use super::msr::boot_msr_entries;

/// CR0 bit 0: protected mode.
pub const X86_CR0_PE: u64 = 1 << 0;
/// CR0 bit 4: extension type, hard-wired to 1 on every CPU since the 486.
pub const X86_CR0_ET: u64 = 1 << 4;
/// CR0 bit 29: not write-through (set at reset).
pub const X86_CR0_NW: u64 = 1 << 29;
/// CR0 bit 30: cache disable (set at reset).
pub const X86_CR0_CD: u64 = 1 << 30;
/// CR0 bit 31: paging.
pub const X86_CR0_PG: u64 = 1 << 31;
/// CR4 bit 5: physical address extension, required for long mode.
pub const X86_CR4_PAE: u64 = 1 << 5;
/// EFER bit 8: long mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// EFER bit 10: long mode active. KVM expects it set together with LME and CR0.PG.
pub const EFER_LMA: u64 = 1 << 10;

/// Initial RFLAGS: only bit 1, which is reserved and always reads as 1; IF is clear.
const BOOT_RFLAGS: u64 = 0x2;
/// Limit of the one-entry boot IDT.
const BOOT_IDT_LIMIT: u16 = 7;

/// Local APIC register offset of LVT LINT0.
pub const APIC_LVT0: usize = 0x350;
/// Local APIC register offset of LVT LINT1.
pub const APIC_LVT1: usize = 0x360;
/// LVT delivery mode NMI.
pub const APIC_MODE_NMI: u32 = 0x4;
/// LVT delivery mode ExtINT (the 8259 PIC's output).
pub const APIC_MODE_EXTINT: u32 = 0x7;

/// Errors while preparing the special registers.
#[derive(Debug, thiserror::Error)]
pub enum RegsError {
    /// The boot GDT or IDT could not be written.
    #[error("failed to write the boot GDT/IDT")]
    Gdt(#[from] GdtError),
    /// The boot page tables could not be written.
    #[error("failed to write the boot page tables")]
    Paging(#[from] PagingError),
}

/// General-purpose registers at the kernel's 64-bit entry point `entry`, with RSI pointing at
/// the zero page `boot_params`.
pub fn setup_regs(entry: u64, boot_params: u64) -> kvm_regs {
    kvm_regs {
        rip: entry,
        rsp: BOOT_STACK_POINTER,
        // The kernel does not need a frame pointer, but a sane one helps stack walkers.
        rbp: BOOT_STACK_POINTER,
        rsi: boot_params,
        rflags: BOOT_RFLAGS,
        ..Default::default()
    }
}

/// Writes the boot GDT, IDT and page tables into `mem` and updates `sregs` (as read from
/// `KVM_GET_SREGS`, so fields such as `apic_base` keep KVM's values) for long mode.
pub fn setup_sregs(mem: &GuestMemoryMmap<()>, sregs: &mut kvm_sregs) -> Result<(), RegsError> {
    let gdt = boot_gdt_table();
    write_gdt_table(&gdt, mem)?;
    sregs.gdt.base = BOOT_GDT_START;
    // The limit is the offset of the last valid byte: 4 entries * 8 bytes - 1.
    sregs.gdt.limit = (std::mem::size_of_val(&gdt) - 1) as u16;

    write_idt_value(0, mem)?;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = BOOT_IDT_LIMIT;

    let code = kvm_segment_from_gdt(gdt[usize::from(CODE_INDEX)], CODE_INDEX);
    let data = kvm_segment_from_gdt(gdt[usize::from(DATA_INDEX)], DATA_INDEX);
    let tss = kvm_segment_from_gdt(gdt[usize::from(TSS_INDEX)], TSS_INDEX);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;

    sregs.cr3 = setup_identity_paging(mem)?;
    sregs.cr4 |= X86_CR4_PAE;
    // KVM's reset CR0 (0x6000_0010) has CD and NW set, as real hardware does; firmware would
    // clear them before handing over, and running the early kernel with caches "disabled"
    // can make KVM map guest memory uncached, so clear them here.
    sregs.cr0 = (sregs.cr0 & !(X86_CR0_CD | X86_CR0_NW)) | X86_CR0_PE | X86_CR0_ET | X86_CR0_PG;
    sregs.efer |= EFER_LME | EFER_LMA;
    Ok(())
}

/// FPU state at boot: the x87 control word and MXCSR at their architectural reset values
/// (all exceptions masked, round-to-nearest, 64-bit precision); KVM's zeroed default would
/// unmask every floating-point exception.
pub fn setup_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

fn get_lapic_reg(lapic: &kvm_lapic_state, offset: usize) -> u32 {
    let mut bytes = [0u8; 4];
    for (i, b) in bytes.iter_mut().enumerate() {
        // c_char is i8 here; the cast reinterprets the byte, it does not convert a value.
        *b = lapic.regs[offset + i] as u8;
    }
    u32::from_le_bytes(bytes)
}

fn set_lapic_reg(lapic: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, b) in value.to_le_bytes().iter().enumerate() {
        lapic.regs[offset + i] = *b as std::os::raw::c_char;
    }
}

fn with_delivery_mode(reg: u32, mode: u32) -> u32 {
    // Delivery mode is bits 8..11 of an LVT entry.
    (reg & !0x700) | (mode << 8)
}

/// Configures the local APIC's LINT0 as ExtINT and LINT1 as NMI in a `KVM_GET_LAPIC` state,
/// the virtual-wire wiring the MP table announces: the 8259 PIC feeds LINT0 until Linux
/// switches to the IOAPIC, and LINT1 carries NMIs.
pub fn set_lint(lapic: &mut kvm_lapic_state) {
    let lvt0 = get_lapic_reg(lapic, APIC_LVT0);
    set_lapic_reg(lapic, APIC_LVT0, with_delivery_mode(lvt0, APIC_MODE_EXTINT));
    let lvt1 = get_lapic_reg(lapic, APIC_LVT1);
    set_lapic_reg(lapic, APIC_LVT1, with_delivery_mode(lvt1, APIC_MODE_NMI));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x86_64::layout::PML4_START;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn regs_for_entry() {
        let regs = setup_regs(0x100_0000, 0x7000);
        assert_eq!(regs.rip, 0x100_0000);
        assert_eq!(regs.rsp, BOOT_STACK_POINTER);
        assert_eq!(regs.rbp, BOOT_STACK_POINTER);
        assert_eq!(regs.rsi, 0x7000);
        assert_eq!(regs.rflags, 2);
        assert_eq!(regs.rax, 0);
    }

    #[test]
    fn sregs_long_mode() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        // As KVM_GET_SREGS returns it after vCPU creation.
        let mut sregs = kvm_sregs {
            apic_base: 0xfee0_0900,
            cr0: 0x6000_0010,
            ..Default::default()
        };
        setup_sregs(&mem, &mut sregs).unwrap();

        assert_eq!(sregs.gdt.base, BOOT_GDT_START);
        assert_eq!(sregs.gdt.limit, 31);
        assert_eq!(sregs.idt.base, BOOT_IDT_START);
        assert_eq!(sregs.idt.limit, 7);
        assert_eq!(sregs.cs.selector, 0x08);
        assert_eq!(sregs.cs.l, 1);
        for seg in [sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss] {
            assert_eq!(seg.selector, 0x10);
            assert_eq!(seg.type_, 0x3);
        }
        assert_eq!(sregs.tr.selector, 0x18);
        assert_eq!(sregs.tr.type_, 0xb);

        assert_eq!(sregs.cr3, PML4_START);
        assert_eq!(sregs.cr0, 0x8000_0011);
        assert_eq!(sregs.cr4, 0x20);
        assert_eq!(sregs.efer, 0x500);
        assert_eq!(sregs.apic_base, 0xfee0_0900, "untouched fields are kept");

        // The GDT in memory matches the segments loaded into the hidden state.
        let code: u64 = mem.read_obj(GuestAddress(BOOT_GDT_START + 8)).unwrap();
        assert_eq!(code, 0x00af_9b00_0000_ffff);
        // And the page tables exist.
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_START)).unwrap();
        assert_ne!(pml4, 0);
    }

    #[test]
    fn sregs_fail_without_low_memory() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0x10_0000), 0x1000)]).unwrap();
        let mut sregs = kvm_sregs::default();
        assert!(matches!(
            setup_sregs(&mem, &mut sregs),
            Err(RegsError::Gdt(_))
        ));
    }

    #[test]
    fn fpu_defaults() {
        let fpu = setup_fpu();
        assert_eq!(fpu.fcw, 0x37f);
        assert_eq!(fpu.mxcsr, 0x1f80);
    }

    #[test]
    fn lint_delivery_modes() {
        let mut lapic = kvm_lapic_state::default();
        // Masked LVT entries with a vector and a stale delivery mode, as after reset.
        set_lapic_reg(&mut lapic, APIC_LVT0, 0x0001_0320);
        set_lapic_reg(&mut lapic, APIC_LVT1, 0x0001_0720);
        set_lint(&mut lapic);
        assert_eq!(get_lapic_reg(&lapic, APIC_LVT0), 0x0001_0720);
        assert_eq!(get_lapic_reg(&lapic, APIC_LVT1), 0x0001_0420);
        // Raw byte layout is little-endian at 0x350.
        assert_eq!(lapic.regs[APIC_LVT0 + 1] as u8, 0x07);
        assert_eq!(lapic.regs[APIC_LVT1 + 1] as u8, 0x04);
        // Nothing else changed.
        let nonzero = lapic.regs.iter().filter(|b| **b != 0).count();
        assert_eq!(nonzero, 6);
    }
}
