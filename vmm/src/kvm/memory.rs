// SPDX-License-Identifier: Apache-2.0
//! Guest memory: allocation through vm-memory and registration with KVM.
#![allow(unsafe_code)]

use kvm_bindings::{kvm_userspace_memory_region, KVM_MEM_LOG_DIRTY_PAGES};
use kvm_ioctls::VmFd;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

/// Errors creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The host could not map the memory.
    #[error("cannot allocate {0} MiB of guest memory")]
    Allocate(u64, #[source] vm_memory::mmap::FromRangesError),
    /// KVM refused a memory slot.
    #[error("cannot register guest memory slot {0} with KVM")]
    Register(u32, #[source] kvm_ioctls::Error),
}

/// Allocates `regions` of anonymous memory and hands each to KVM as a slot.
pub fn create_guest_memory(
    vm: &VmFd,
    regions: &[(GuestAddress, usize)],
    mem_mib: u64,
) -> Result<GuestMemoryMmap<()>, MemoryError> {
    let mem = GuestMemoryMmap::<()>::from_ranges(regions)
        .map_err(|e| MemoryError::Allocate(mem_mib, e))?;
    register_guest_memory(vm, &mem, false)?;
    Ok(mem)
}

/// Hands every region of `mem` to KVM as a slot, numbered in order;
/// `dirty_log` has KVM track the pages the guest writes
/// (`KVM_MEM_LOG_DIRTY_PAGES`, for Diff snapshots).
pub fn register_guest_memory(
    vm: &VmFd,
    mem: &GuestMemoryMmap<()>,
    dirty_log: bool,
) -> Result<(), MemoryError> {
    for (slot, region) in mem.iter().enumerate() {
        let slot = slot as u32;
        let host_addr = mem
            .get_host_address(region.start_addr())
            .expect("a region's start address is inside the memory it came from");
        // Transparent huge pages where the host allows them (Cloud
        // Hypervisor's default too): loading an 8.7 MB vmlinux then takes
        // five 2 MiB faults instead of 2,150 4 KiB ones (4 to 5 ms of CPU on
        // the development hosts instead of 9 to 12, most of start-up), and
        // KVM can map the guest with large pages. Only advice: where THP is
        // off, or this fails, only speed changes (a private file mapping,
        // a restored guest's memory, takes no huge pages anyway).
        // SAFETY: the range is exactly the mapping `region` owns;
        // MADV_HUGEPAGE only changes how the kernel backs it, not its
        // contents or permissions.
        let ret =
            unsafe { libc::madvise(host_addr.cast(), region.len() as usize, libc::MADV_HUGEPAGE) };
        if ret != 0 {
            log::debug!(
                "guest memory slot {slot}: no transparent huge pages: {}",
                std::io::Error::last_os_error()
            );
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
