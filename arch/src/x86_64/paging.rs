// SPDX-License-Identifier: Apache-2.0
//! Identity-mapped boot page tables.
//!
//! Long mode cannot be entered without paging, and the 64-bit boot protocol requires the
//! kernel, zero page, command line and initrd to be identity-mapped. We map the first 4 GiB
//! with 2 MiB pages: one PML4 entry, four PDPT entries and four full page directories (see
//! [`crate::x86_64::layout::PDE_START`]). The kernel replaces these tables early in
//! `startup_64`, so they only need to live until then.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{PDE_START, PDE_TABLES, PDPTE_START, PML4_START};

/// Page-table entry bit: present.
pub const PTE_PRESENT: u64 = 1 << 0;
/// Page-table entry bit: writable.
pub const PTE_WRITABLE: u64 = 1 << 1;
/// Page-directory entry bit: this entry maps a 2 MiB page instead of pointing to a table.
pub const PTE_PAGE_SIZE: u64 = 1 << 7;

/// Size of one large page mapped by a page-directory entry.
const LARGE_PAGE_SIZE: u64 = 2 << 20;
/// Entries in one 4 KiB paging structure.
const ENTRIES_PER_TABLE: u64 = 512;

/// Errors while writing the boot page tables.
#[derive(Debug, thiserror::Error)]
pub enum PagingError {
    /// Writing the PML4 failed.
    #[error("failed to write the PML4 into guest memory")]
    WritePml4(#[source] vm_memory::GuestMemoryError),
    /// Writing the page-directory-pointer table failed.
    #[error("failed to write the PDPT into guest memory")]
    WritePdpte(#[source] vm_memory::GuestMemoryError),
    /// Writing the page directories failed.
    #[error("failed to write the page directories into guest memory")]
    WritePde(#[source] vm_memory::GuestMemoryError),
}

/// Writes page tables identity-mapping `[0, 4 GiB)` and returns the value for CR3.
pub fn setup_identity_paging(mem: &GuestMemoryMmap<()>) -> Result<u64, PagingError> {
    let table_flags = PTE_PRESENT | PTE_WRITABLE;

    mem.write_obj(PDPTE_START | table_flags, GuestAddress(PML4_START))
        .map_err(PagingError::WritePml4)?;

    let pdpte: Vec<u8> = (0..PDE_TABLES)
        .flat_map(|i| ((PDE_START + i * 0x1000) | table_flags).to_le_bytes())
        .collect();
    mem.write_slice(&pdpte, GuestAddress(PDPTE_START))
        .map_err(PagingError::WritePdpte)?;

    // The page directories are contiguous, so entry n of the whole run maps n * 2 MiB.
    let pde: Vec<u8> = (0..PDE_TABLES * ENTRIES_PER_TABLE)
        .flat_map(|n| ((n * LARGE_PAGE_SIZE) | table_flags | PTE_PAGE_SIZE).to_le_bytes())
        .collect();
    mem.write_slice(&pde, GuestAddress(PDE_START))
        .map_err(PagingError::WritePde)?;

    Ok(PML4_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(mem: &GuestMemoryMmap<()>, addr: u64) -> u64 {
        mem.read_obj(GuestAddress(addr)).unwrap()
    }

    /// Walks the tables the way the MMU does for a 2 MiB mapping.
    fn translate(mem: &GuestMemoryMmap<()>, cr3: u64, va: u64) -> Option<u64> {
        let addr_mask = 0x000f_ffff_ffff_f000;
        let pml4e = read(mem, cr3 + ((va >> 39) & 0x1ff) * 8);
        if pml4e & PTE_PRESENT == 0 {
            return None;
        }
        let pdpte = read(mem, (pml4e & addr_mask) + ((va >> 30) & 0x1ff) * 8);
        if pdpte & PTE_PRESENT == 0 {
            return None;
        }
        let pde = read(mem, (pdpte & addr_mask) + ((va >> 21) & 0x1ff) * 8);
        if pde & PTE_PRESENT == 0 || pde & PTE_PAGE_SIZE == 0 {
            return None;
        }
        Some((pde & 0x000f_ffff_ffe0_0000) | (va & 0x1f_ffff))
    }

    #[test]
    fn entries_read_back() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let cr3 = setup_identity_paging(&mem).unwrap();
        assert_eq!(cr3, PML4_START);

        assert_eq!(read(&mem, PML4_START), PDPTE_START | 0x3);
        // Only one PML4 entry: the rest of the page stays zero.
        assert_eq!(read(&mem, PML4_START + 8), 0);

        for i in 0..4 {
            assert_eq!(
                read(&mem, PDPTE_START + i * 8),
                (PDE_START + i * 0x1000) | 0x3
            );
        }
        assert_eq!(read(&mem, PDPTE_START + 4 * 8), 0);

        assert_eq!(read(&mem, PDE_START), 0x83);
        assert_eq!(read(&mem, PDE_START + 8), (2 << 20) | 0x83);
        assert_eq!(read(&mem, PDE_START + 511 * 8), (511 << 21) | 0x83);
        // First entry of the second directory maps 1 GiB.
        assert_eq!(read(&mem, PDE_START + 0x1000), (1 << 30) | 0x83);
        // Last entry of the last directory maps the last 2 MiB below 4 GiB.
        assert_eq!(
            read(&mem, PDE_START + 0x4000 - 8),
            ((4u64 << 30) - (2 << 20)) | 0x83
        );
    }

    #[test]
    fn walk_is_identity_below_4g() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
        let cr3 = setup_identity_paging(&mem).unwrap();
        for va in [
            0,
            0x7000,
            0x10_0000,
            0x3fff_f123,
            0xbfff_f000,
            0xfee0_0000,
            0xffff_ffff,
        ] {
            assert_eq!(translate(&mem, cr3, va), Some(va), "va {va:#x}");
        }
        // 4 GiB and above are not mapped.
        assert_eq!(translate(&mem, cr3, 1 << 32), None);
    }

    #[test]
    fn fails_without_low_memory() {
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0x10_0000), 0x1000)]).unwrap();
        assert!(matches!(
            setup_identity_paging(&mem),
            Err(PagingError::WritePml4(_))
        ));
    }
}
