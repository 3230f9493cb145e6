// SPDX-License-Identifier: Apache-2.0
//! The boot GDT and IDT, and the `kvm_segment` values that match them.
//!
//! The kernel is entered directly in 64-bit long mode, so the VMM must provide a GDT whose
//! descriptors agree with the hidden segment state it loads through `KVM_SET_SREGS`: the
//! kernel's first `lgdt`/segment reload happens only later. Each descriptor is the 8-byte
//! legacy format (Intel SDM Vol. 3A §3.4.5); the `flags` argument of [`gdt_entry`] packs the
//! access byte (bits 0..8) and the flags nibble G/DB/L/AVL (bits 12..16), the same notation
//! Linux uses in `GDT_ENTRY()`.

use kvm_bindings::kvm_segment;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{BOOT_GDT_MAX, BOOT_GDT_START, BOOT_IDT_START};

/// Flags of the 64-bit kernel code segment: G=1, L=1, present, DPL 0, code execute/read,
/// accessed.
pub const CODE64_FLAGS: u16 = 0xa09b;
/// Flags of the kernel data segment: G=1, D/B=1, present, DPL 0, data read/write, accessed.
pub const DATA_FLAGS: u16 = 0xc093;
/// Flags of the task state segment: G=1, present, system, type 0xb (busy 64-bit TSS). KVM
/// refuses to enter a guest whose TR is not a busy TSS.
pub const TSS_FLAGS: u16 = 0x808b;

/// GDT index of the code segment (selector 0x08).
pub const CODE_INDEX: u8 = 1;
/// GDT index of the data segment (selector 0x10).
pub const DATA_INDEX: u8 = 2;
/// GDT index of the TSS (selector 0x18).
pub const TSS_INDEX: u8 = 3;

/// Errors while writing the boot GDT or IDT.
#[derive(Debug, thiserror::Error)]
pub enum GdtError {
    /// The table does not fit the space reserved for it in the layout.
    #[error("GDT has {0} entries, at most {BOOT_GDT_MAX} fit")]
    TooManyEntries(usize),
    /// Writing the GDT into guest memory failed.
    #[error("failed to write the GDT into guest memory")]
    WriteGdt(#[source] vm_memory::GuestMemoryError),
    /// Writing the IDT into guest memory failed.
    #[error("failed to write the IDT into guest memory")]
    WriteIdt(#[source] vm_memory::GuestMemoryError),
}

/// Encodes a GDT descriptor from its flags (see the module docs), base and 20-bit limit.
pub fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let base = u64::from(base);
    let limit = u64::from(limit);
    let flags = u64::from(flags);
    ((base & 0xff00_0000) << (56 - 24))
        | ((flags & 0x0000_f0ff) << 40)
        | ((limit & 0x000f_0000) << (48 - 16))
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0x0000_ffff)
}

/// The 32-bit base address of a descriptor.
pub fn get_base(entry: u64) -> u64 {
    ((entry & 0xff00_0000_0000_0000) >> 32)
        | ((entry & 0x0000_00ff_0000_0000) >> 16)
        | ((entry & 0x0000_0000_ffff_0000) >> 16)
}

/// The raw 20-bit limit field of a descriptor (in units of 4 KiB when G is set).
pub fn get_limit(entry: u64) -> u32 {
    (((entry & 0x000f_0000_0000_0000) >> 32) | (entry & 0x0000_0000_0000_ffff)) as u32
}

/// The byte-granular limit the CPU enforces: the raw limit scaled by 4 KiB when G is set.
/// This is what `kvm_segment::limit` holds (KVM reports the same value from `KVM_GET_SREGS`).
pub fn get_effective_limit(entry: u64) -> u32 {
    let limit = get_limit(entry);
    if get_g(entry) == 1 {
        (limit << 12) | 0xfff
    } else {
        limit
    }
}

/// Granularity bit (G).
pub fn get_g(entry: u64) -> u8 {
    ((entry >> 55) & 1) as u8
}

/// Default operation size bit (D/B).
pub fn get_db(entry: u64) -> u8 {
    ((entry >> 54) & 1) as u8
}

/// 64-bit code segment bit (L).
pub fn get_l(entry: u64) -> u8 {
    ((entry >> 53) & 1) as u8
}

/// Available-for-software bit (AVL).
pub fn get_avl(entry: u64) -> u8 {
    ((entry >> 52) & 1) as u8
}

/// Present bit (P).
pub fn get_p(entry: u64) -> u8 {
    ((entry >> 47) & 1) as u8
}

/// Descriptor privilege level (DPL).
pub fn get_dpl(entry: u64) -> u8 {
    ((entry >> 45) & 3) as u8
}

/// Descriptor type bit (S): 1 for code/data, 0 for system segments such as the TSS.
pub fn get_s(entry: u64) -> u8 {
    ((entry >> 44) & 1) as u8
}

/// Segment type field.
pub fn get_type(entry: u64) -> u8 {
    ((entry >> 40) & 0xf) as u8
}

/// The `kvm_segment` matching GDT `entry` stored at `table_index`, for `KVM_SET_SREGS`.
pub fn kvm_segment_from_gdt(entry: u64, table_index: u8) -> kvm_segment {
    kvm_segment {
        base: get_base(entry),
        limit: get_effective_limit(entry),
        // A selector is the table index times the 8-byte descriptor size (TI=0, RPL=0).
        selector: u16::from(table_index) * 8,
        type_: get_type(entry),
        present: get_p(entry),
        dpl: get_dpl(entry),
        db: get_db(entry),
        s: get_s(entry),
        l: get_l(entry),
        g: get_g(entry),
        avl: get_avl(entry),
        padding: 0,
        // A non-present segment must be marked unusable or VMX rejects the guest state.
        unusable: u8::from(get_p(entry) == 0),
    }
}

/// The boot GDT: null, 64-bit code, data and TSS descriptors, all flat (base 0, 4 GiB).
pub fn boot_gdt_table() -> [u64; BOOT_GDT_MAX] {
    [
        gdt_entry(0, 0, 0),
        gdt_entry(CODE64_FLAGS, 0, 0xfffff),
        gdt_entry(DATA_FLAGS, 0, 0xfffff),
        gdt_entry(TSS_FLAGS, 0, 0xfffff),
    ]
}

/// Writes `table` at [`BOOT_GDT_START`].
pub fn write_gdt_table(table: &[u64], mem: &GuestMemoryMmap<()>) -> Result<(), GdtError> {
    if table.len() > BOOT_GDT_MAX {
        return Err(GdtError::TooManyEntries(table.len()));
    }
    let bytes: Vec<u8> = table.iter().flat_map(|e| e.to_le_bytes()).collect();
    mem.write_slice(&bytes, GuestAddress(BOOT_GDT_START))
        .map_err(GdtError::WriteGdt)
}

/// Writes the single 8-byte boot IDT entry at [`BOOT_IDT_START`].
pub fn write_idt_value(val: u64, mem: &GuestMemoryMmap<()>) -> Result<(), GdtError> {
    mem.write_obj(val, GuestAddress(BOOT_IDT_START))
        .map_err(GdtError::WriteIdt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_round_trip() {
        let entry = gdt_entry(0xa09b, 0x1234_5678, 0xabcde);
        assert_eq!(get_base(entry), 0x1234_5678);
        assert_eq!(get_limit(entry), 0xabcde);
        assert_eq!(get_g(entry), 1);
        assert_eq!(get_db(entry), 0);
        assert_eq!(get_l(entry), 1);
        assert_eq!(get_avl(entry), 0);
        assert_eq!(get_p(entry), 1);
        assert_eq!(get_dpl(entry), 0);
        assert_eq!(get_s(entry), 1);
        assert_eq!(get_type(entry), 0xb);
    }

    #[test]
    fn known_encodings() {
        // The flat 64-bit code/data descriptors Linux itself uses (GDT_ENTRY_KERNEL_CS/DS).
        assert_eq!(gdt_entry(CODE64_FLAGS, 0, 0xfffff), 0x00af_9b00_0000_ffff);
        assert_eq!(gdt_entry(DATA_FLAGS, 0, 0xfffff), 0x00cf_9300_0000_ffff);
        assert_eq!(gdt_entry(TSS_FLAGS, 0, 0xfffff), 0x008f_8b00_0000_ffff);
        assert_eq!(gdt_entry(0, 0, 0), 0);
    }

    #[test]
    fn dpl_and_avl_decode() {
        // Access byte 0xf3: present, DPL 3, data; flags nibble 0x1: AVL only.
        let entry = gdt_entry(0x10f3, 0, 0xff);
        assert_eq!(get_dpl(entry), 3);
        assert_eq!(get_avl(entry), 1);
        assert_eq!(get_g(entry), 0);
        assert_eq!(get_effective_limit(entry), 0xff);
    }

    #[test]
    fn code_segment_fields() {
        let seg = kvm_segment_from_gdt(boot_gdt_table()[1], CODE_INDEX);
        assert_eq!(seg.selector, 0x08);
        assert_eq!(seg.base, 0);
        assert_eq!(seg.limit, 0xffff_ffff);
        assert_eq!(seg.type_, 0xb);
        assert_eq!((seg.present, seg.dpl, seg.s), (1, 0, 1));
        assert_eq!((seg.l, seg.db, seg.g, seg.avl), (1, 0, 1, 0));
        assert_eq!(seg.unusable, 0);
    }

    #[test]
    fn data_segment_fields() {
        let seg = kvm_segment_from_gdt(boot_gdt_table()[2], DATA_INDEX);
        assert_eq!(seg.selector, 0x10);
        assert_eq!(seg.limit, 0xffff_ffff);
        assert_eq!(seg.type_, 0x3);
        assert_eq!((seg.present, seg.dpl, seg.s), (1, 0, 1));
        assert_eq!((seg.l, seg.db, seg.g), (0, 1, 1));
    }

    #[test]
    fn tss_segment_fields() {
        let seg = kvm_segment_from_gdt(boot_gdt_table()[3], TSS_INDEX);
        assert_eq!(seg.selector, 0x18);
        assert_eq!(seg.type_, 0xb);
        assert_eq!((seg.present, seg.s), (1, 0));
        assert_eq!((seg.l, seg.db, seg.g), (0, 0, 1));
    }

    #[test]
    fn null_segment_is_unusable() {
        let seg = kvm_segment_from_gdt(0, 0);
        assert_eq!(seg.present, 0);
        assert_eq!(seg.unusable, 1);
    }

    #[test]
    fn write_and_read_back() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let table = boot_gdt_table();
        write_gdt_table(&table, &mem).unwrap();
        for (i, expected) in table.iter().enumerate() {
            let got: u64 = mem
                .read_obj(GuestAddress(BOOT_GDT_START + 8 * i as u64))
                .unwrap();
            assert_eq!(got, *expected);
        }
        mem.write_obj(0xdead_beef_u64, GuestAddress(BOOT_IDT_START))
            .unwrap();
        write_idt_value(0, &mem).unwrap();
        assert_eq!(
            mem.read_obj::<u64>(GuestAddress(BOOT_IDT_START)).unwrap(),
            0
        );
    }

    #[test]
    fn too_many_entries() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let err = write_gdt_table(&[0; 5], &mem).unwrap_err();
        assert!(matches!(err, GdtError::TooManyEntries(5)));
    }

    #[test]
    fn write_outside_memory_fails() {
        // Memory that starts above the GDT: nothing to write into.
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0x10_0000), 0x1000)]).unwrap();
        assert!(matches!(
            write_gdt_table(&boot_gdt_table(), &mem),
            Err(GdtError::WriteGdt(_))
        ));
        assert!(matches!(
            write_idt_value(0, &mem),
            Err(GdtError::WriteIdt(_))
        ));
    }
}
