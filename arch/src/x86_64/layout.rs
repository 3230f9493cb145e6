// SPDX-License-Identifier: Apache-2.0
//! Guest physical memory layout for an x86_64 minivmm guest.
//!
//! The low 1 MiB holds the tiny boot structures the VMM writes before the first instruction
//! runs (GDT, IDT, zero page, stack, page tables, command line, MP table). Their addresses
//! follow the traditional PC layout also used by Firecracker and vmm-reference, so they stay
//! clear of the real-mode IVT/BDA at 0..0x500, of the EBDA just below 640 KiB and of the
//! legacy VGA/ROM hole at 0xa0000..0x100000. The kernel itself is loaded at [`HIMEM_START`].
//!
//! Below 4 GiB a 1 GiB hole ([`MMIO_GAP_START`]..[`MMIO_GAP_END`]) is left without RAM for
//! device windows (virtio-MMIO, IOAPIC, LAPIC, KVM's TSS pages); RAM that does not fit below
//! the hole continues at 4 GiB.

use vm_memory::GuestAddress;

/// Boot GDT: 0x500 is the first byte after the real-mode IVT (0..0x400) and the BIOS data
/// area (0x400..0x500), so nothing the kernel reads early lives there.
pub const BOOT_GDT_START: u64 = 0x500;

/// Number of boot GDT entries (null, code, data, TSS). The IDT follows 4 * 8 bytes later.
pub const BOOT_GDT_MAX: usize = 4;

/// Boot IDT: right after the 4-entry GDT. The kernel installs its own IDT before enabling
/// interrupts, so an empty one (limit 7, one zero entry) is enough until then.
pub const BOOT_IDT_START: u64 = 0x520;

/// The zero page (`struct boot_params`, 4 KiB): any free page below 1 MiB works; 0x7000 is
/// the conventional choice and is passed to the kernel in RSI.
pub const ZERO_PAGE_START: u64 = 0x7000;

/// Initial stack pointer: the boot stack grows down through the page 0x8000..0x9000, which
/// is otherwise unused and ends just below the page tables.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;

/// PML4 (CR3 points here). One entry is used.
pub const PML4_START: u64 = 0x9000;

/// The page-directory-pointer table: entries 0..4 point to the four page directories.
pub const PDPTE_START: u64 = 0xa000;

/// First of four page directories (0xb000, 0xc000, 0xd000, 0xe000), each with 512 2 MiB
/// pages: together they identity-map the whole first 4 GiB. 4 GiB rather than 1 GiB because
/// the 64-bit boot protocol requires the zero page, command line and initrd to be mapped, and
/// [`crate::x86_64::initrd_load_addr`] may place the initrd just below [`MMIO_GAP_START`].
pub const PDE_START: u64 = 0xb000;

/// Number of page directories written at [`PDE_START`] (one per GiB identity-mapped).
pub const PDE_TABLES: u64 = 4;

/// Kernel command line: 0x20000 is above the page tables and far below the EBDA, with room
/// for much more than [`CMDLINE_MAX_SIZE`].
pub const CMDLINE_START: u64 = 0x20000;

/// Maximum command-line length including the terminating NUL. Linux 6.1 on x86 defines
/// `COMMAND_LINE_SIZE` as 2048 (arch/x86/include/asm/setup.h) and truncates anything longer.
pub const CMDLINE_MAX_SIZE: usize = 2048;

/// Start of "high" memory: the kernel is loaded here (1 MiB), above the legacy VGA/BIOS hole.
pub const HIMEM_START: u64 = 0x10_0000;

/// Extended BIOS data area: the last KiB below 640 KiB. It is marked reserved in the e820 map
/// and holds the MP table, because Linux scans 639 KiB..640 KiB for the MP floating pointer.
pub const EBDA_START: u64 = 0x9_fc00;

/// The MP table (floating pointer first, then the configuration table) lives in the EBDA.
pub const MPTABLE_START: u64 = EBDA_START;

/// End of the EBDA / start of the legacy VGA and ROM hole, never RAM in the e820 map.
pub const EBDA_END: u64 = 0xa_0000;

/// Start of the 32-bit MMIO gap: 3 GiB. RAM beyond this moves to [`MMIO_GAP_END`].
pub const MMIO_GAP_START: u64 = 0xc000_0000;

/// End of the 32-bit MMIO gap (exclusive): 4 GiB.
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;

/// Size of the 32-bit MMIO gap (1 GiB).
pub const MMIO_GAP_SIZE: u64 = MMIO_GAP_END - MMIO_GAP_START;

/// Base of the virtio-MMIO device windows, inside the gap and well below the IOAPIC/LAPIC.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;

/// Size of one virtio-MMIO window: one page, as `virtio_mmio.device=4K@...` announces.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;

/// The boot-timer register (Firecracker's boot-time device): the guest writes
/// [`BOOT_COMPLETE`] here once it has booted. The first page of the gap, below every
/// virtio window.
pub const BOOT_TIMER_ADDR: u64 = MMIO_GAP_START;

/// The value that says "boot complete" (Firecracker's magic number).
pub const BOOT_COMPLETE: u8 = 123;

/// The pvpanic register (QEMU's, one byte), through which the guest kernel reports a panic.
/// The second page of the gap: a page of its own, so that the guest kernel's driver holding
/// it busy keeps `/dev/mem` (with `IO_STRICT_DEVMEM`) off it, while the boot-timer page
/// before it stays open to the guest's init.
pub const PVPANIC_ADDR: u64 = MMIO_GAP_START + 0x1000;

/// First GSI handed to virtio devices. 0..4 are the legacy PIT, keyboard, cascade, COM2 and
/// COM1 (IRQ 4 for the serial console), so 5 is the first free ISA line.
pub const IRQ_BASE: u32 = 5;

/// Highest IOAPIC pin: KVM's in-kernel IOAPIC has 24 pins (0..=23).
pub const IRQ_MAX: u32 = 23;

/// IOAPIC MMIO base, the architectural default, announced in the MP table.
pub const IOAPIC_START: u64 = 0xfec0_0000;

/// Local APIC MMIO base, the architectural default (IA32_APIC_BASE reset value).
pub const APIC_START: u64 = 0xfee0_0000;

/// Three pages KVM needs for the real-mode TSS on Intel (`KVM_SET_TSS_ADDR`). Inside the
/// gap, so they never overlap RAM, and clear of the IOAPIC/LAPIC windows.
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;

// The boot structures must not overlap each other or the legacy areas; checked when the
// crate compiles so a layout edit cannot silently break boot.
const _: () = {
    assert!(BOOT_GDT_START + (BOOT_GDT_MAX as u64) * 8 <= BOOT_IDT_START);
    assert!(BOOT_IDT_START + 8 <= ZERO_PAGE_START);
    // The zero page ends where the stack's page begins.
    assert!(ZERO_PAGE_START + 0x1000 <= (BOOT_STACK_POINTER & !0xfff));
    assert!(BOOT_STACK_POINTER < PML4_START);
    assert!(PML4_START + 0x1000 == PDPTE_START);
    assert!(PDPTE_START + 0x1000 == PDE_START);
    assert!(PDE_START + PDE_TABLES * 0x1000 <= CMDLINE_START);
    assert!(CMDLINE_START + CMDLINE_MAX_SIZE as u64 <= EBDA_START);
    // Device windows lie inside the MMIO gap, clear of each other.
    assert!(VIRTIO_MMIO_BASE >= MMIO_GAP_START && VIRTIO_MMIO_BASE < IOAPIC_START);
    assert!(BOOT_TIMER_ADDR >= MMIO_GAP_START && BOOT_TIMER_ADDR + 0x1000 <= VIRTIO_MMIO_BASE);
    assert!(PVPANIC_ADDR >= BOOT_TIMER_ADDR + 0x1000 && PVPANIC_ADDR + 0x1000 <= VIRTIO_MMIO_BASE);
    assert!(PVPANIC_ADDR.is_multiple_of(0x1000));
    assert!(IOAPIC_START < APIC_START);
    assert!(KVM_TSS_ADDRESS >= APIC_START + 0x1000);
    assert!(KVM_TSS_ADDRESS + 3 * 0x1000 <= MMIO_GAP_END);
};

/// Guest memory regions for `mem_size` bytes of RAM.
///
/// RAM starts at 0. When it would reach into the MMIO gap, the part that does not fit below
/// [`MMIO_GAP_START`] is placed at [`MMIO_GAP_END`] (4 GiB) instead, so the total RAM is
/// always `mem_size`.
pub fn arch_memory_regions(mem_size: u64) -> Vec<(GuestAddress, usize)> {
    // usize is 64 bits on every host this crate builds for (it is x86_64-only), so the casts
    // cannot truncate.
    if mem_size <= MMIO_GAP_START {
        vec![(GuestAddress(0), mem_size as usize)]
    } else {
        vec![
            (GuestAddress(0), MMIO_GAP_START as usize),
            (
                GuestAddress(MMIO_GAP_END),
                (mem_size - MMIO_GAP_START) as usize,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_small_memory_is_one_region() {
        let regions = arch_memory_regions(256 << 20);
        assert_eq!(regions, vec![(GuestAddress(0), 256 << 20)]);
    }

    #[test]
    fn regions_exactly_gap_start_is_one_region() {
        let regions = arch_memory_regions(MMIO_GAP_START);
        assert_eq!(regions, vec![(GuestAddress(0), MMIO_GAP_START as usize)]);
    }

    #[test]
    fn regions_split_around_gap() {
        let regions = arch_memory_regions(5 << 30);
        assert_eq!(
            regions,
            vec![
                (GuestAddress(0), 3 << 30),
                (GuestAddress(MMIO_GAP_END), 2 << 30)
            ]
        );
        let total: usize = regions.iter().map(|r| r.1).sum();
        assert_eq!(total, 5 << 30);
    }
}
