// SPDX-License-Identifier: Apache-2.0
//! Guest memory: allocation through vm-memory and registration with KVM.
//!
//! Anonymous private memory, advised `MADV_HUGEPAGE` (transparent huge
//! pages), or with Firecracker's `huge_pages: "2M"` mapped from the host's
//! hugetlbfs pool (`MAP_HUGETLB | MAP_HUGE_2MB`). Such a mapping reserves
//! its pages when it is made, so a host with too few free 2 MiB pages fails
//! here, in one line, rather than with a SIGBUS when the guest first
//! touches a page the pool cannot give.
#![allow(unsafe_code)]

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use vm_memory::mmap::{GuestRegionMmap, MmapRegion};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::config::HugePages;

/// Errors creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The host could not map the memory.
    #[error("cannot allocate {0} MiB of guest memory")]
    Allocate(u64, #[source] vm_memory::mmap::FromRangesError),
    /// The host's hugetlbfs pool cannot back the memory.
    #[error(
        "huge_pages \"2M\": the host has too few free 2 MiB huge pages for {0} MiB of guest \
         memory ({1} free; raise /proc/sys/vm/nr_hugepages)"
    )]
    HugePages(u64, u64, #[source] std::io::Error),
    /// The 2 MiB regions could not be put together (a bug in the layout).
    #[error("cannot lay out {0} MiB of guest memory in 2 MiB pages")]
    HugeLayout(u64),
    /// KVM refused a memory slot.
    #[error("cannot register guest memory slot {0} with KVM")]
    Register(u32, #[source] kvm_ioctls::Error),
}

/// How many 2 MiB pages the host's pool has free (`HugePages_Free` of
/// `/proc/meminfo`), for the error line; 0 when it cannot be read.
fn free_huge_pages() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("HugePages_Free:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Maps `regions` from the hugetlbfs pool in 2 MiB pages.
fn huge_regions(
    regions: &[(GuestAddress, usize)],
    mem_mib: u64,
) -> Result<GuestMemoryMmap<()>, MemoryError> {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | libc::MAP_HUGE_2MB;
    let mut mapped = Vec::with_capacity(regions.len());
    for &(addr, len) in regions {
        let region = MmapRegion::<()>::build(None, len, libc::PROT_READ | libc::PROT_WRITE, flags)
            .map_err(|e| {
                let io = match e {
                    vm_memory::mmap::MmapRegionError::Mmap(io) => io,
                    other => std::io::Error::other(other.to_string()),
                };
                MemoryError::HugePages(mem_mib, free_huge_pages(), io)
            })?;
        mapped.push(GuestRegionMmap::new(region, addr).ok_or(MemoryError::HugeLayout(mem_mib))?);
    }
    GuestMemoryMmap::from_regions(mapped).map_err(|_| MemoryError::HugeLayout(mem_mib))
}

/// Allocates `regions` of memory backed as `pages` says and hands each to
/// KVM as a slot, asking for transparent huge pages when `thp` (and the
/// pages are not hugetlbfs pages, huge already), with KVM's dirty log when
/// `dirty_log` (`track_dirty_pages`).
///
/// A VM with a balloon gets none: the balloon gives 4 KiB pages back with
/// `MADV_DONTNEED`, which splits a huge page's mapping, and khugepaged
/// would later collapse such a range into a whole huge page again (the
/// default `max_ptes_none` lets it fill 511 holes of 512), taking back the
/// memory the guest gave up.
pub fn create_guest_memory(
    vm: &VmFd,
    regions: &[(GuestAddress, usize)],
    mem_mib: u64,
    pages: HugePages,
    thp: bool,
    dirty_log: bool,
) -> Result<GuestMemoryMmap<()>, MemoryError> {
    let mem = match pages {
        HugePages::Hugetlbfs2M => huge_regions(regions, mem_mib)?,
        HugePages::None | HugePages::Transparent => GuestMemoryMmap::<()>::from_ranges(regions)
            .map_err(|e| MemoryError::Allocate(mem_mib, e))?,
    };
    register_guest_memory(vm, &mem, dirty_log, thp && pages != HugePages::Hugetlbfs2M)?;
    Ok(mem)
}

/// Hands every region of `mem` to KVM as a slot, numbered in order;
/// `dirty_log` has KVM track the pages the guest writes
/// (`KVM_MEM_LOG_DIRTY_PAGES`, for Diff snapshots); `thp` asks for
/// transparent huge pages ([`create_guest_memory`] says when not).
pub fn register_guest_memory(
    vm: &VmFd,
    mem: &GuestMemoryMmap<()>,
    dirty_log: bool,
    thp: bool,
) -> Result<(), MemoryError> {
    for (slot, region) in mem.iter().enumerate() {
        let slot = slot as u32;
        let host_addr = mem
            .get_host_address(region.start_addr())
            .expect("a region's start address is inside the memory it came from");
        // Transparent huge pages where the host allows them (Cloud
        // Hypervisor's default too), for "None" as for "Transparent":
        // loading an 8.7 MB vmlinux then takes
        // five 2 MiB faults instead of 2,150 4 KiB ones (4 to 5 ms of CPU on
        // the development hosts instead of 9 to 12, most of start-up), and
        // KVM can map the guest with large pages. Only advice: where THP is
        // off, or this fails, only speed changes (a private file mapping,
        // a restored guest's memory, takes no huge pages anyway).
        if thp {
            // SAFETY: the range is exactly the anonymous mapping `region`
            // owns; MADV_HUGEPAGE only changes how the kernel backs it, not
            // its contents or permissions.
            let ret = unsafe {
                libc::madvise(host_addr.cast(), region.len() as usize, libc::MADV_HUGEPAGE)
            };
            if ret != 0 {
                log::debug!(
                    "guest memory slot {slot}: no transparent huge pages: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
        let kvm_region = kvm_userspace_memory_region {
            slot,
            flags: if dirty_log {
                KVM_MEM_LOG_DIRTY_PAGES
            } else {
                0
            },
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host_addr as u64,
        };
        // SAFETY: the host range [userspace_addr, +memory_size) is the mmap
        // owned by `mem`'s region, which lives as long as the returned
        // GuestMemoryMmap; the VMM keeps that value (and so the mapping) alive
        // for as long as the VM fd exists, and slots do not overlap because
        // vm-memory rejects overlapping ranges.
        unsafe { vm.set_user_memory_region(kvm_region) }
            .map_err(|e| MemoryError::Register(slot, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_MIB: usize = 2 << 20;
    /// The pool is the host's: the two tests take turns with it.
    static POOL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// `HugePages_Total` and `HugePages_Rsvd` of `/proc/meminfo`.
    fn pool() -> (u64, u64) {
        let m = std::fs::read_to_string("/proc/meminfo").unwrap();
        let field = |name: &str| {
            m.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0)
        };
        (field("HugePages_Total:"), field("HugePages_Rsvd:"))
    }

    #[test]
    fn too_few_huge_pages_is_one_line_saying_so() {
        let _pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        // One page more than the pool has free: the mapping itself fails.
        let want = free_huge_pages() + 1;
        let regions = [(GuestAddress(0), want as usize * TWO_MIB)];
        let err = huge_regions(&regions, want * 2).unwrap_err();
        let line = crate::error_line(&err);
        assert!(
            line.starts_with(&format!(
                "huge_pages \"2M\": the host has too few free 2 MiB huge pages for {} MiB",
                want * 2
            )),
            "{line}"
        );
        assert!(line.contains("raise /proc/sys/vm/nr_hugepages"), "{line}");
        assert!(!line.contains('\n'));
    }

    /// With pages in the pool (this test adds four, as root, and gives them
    /// back), the guest memory is reserved from it as it is mapped.
    #[test]
    fn two_mib_pages_come_from_the_pool() {
        let _pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        const NR: &str = "/proc/sys/vm/nr_hugepages";
        let Ok(before) = std::fs::read_to_string(NR) else {
            return minivmm_tests::print_skip("no hugetlbfs");
        };
        let before: u64 = before.trim().parse().unwrap();
        if std::fs::write(NR, (before + 4).to_string()).is_err() {
            return minivmm_tests::print_skip("cannot add huge pages (not root)");
        }
        let (total, rsvd) = pool();
        let result = if total >= before + 4 {
            let regions = [
                (GuestAddress(0), TWO_MIB),
                (GuestAddress(1 << 30), 2 * TWO_MIB),
            ];
            huge_regions(&regions, 6).map(|mem| {
                let reserved = pool().1 - rsvd;
                (mem.num_regions(), reserved)
            })
        } else {
            Err(MemoryError::HugeLayout(0))
        };
        std::fs::write(NR, before.to_string()).unwrap();
        if total < before + 4 {
            return minivmm_tests::print_skip("the kernel found no memory for 4 huge pages");
        }
        // Three pages, reserved at the mapping, none touched yet.
        assert_eq!(result.unwrap(), (2, 3));
    }
}
