// SPDX-License-Identifier: Apache-2.0
//! Model-specific registers set on every vCPU before boot.
//!
//! KVM leaves most MSRs at their reset value, which is what a kernel entered through the
//! 64-bit boot protocol expects, but a VMM should start every vCPU from the same known state
//! (also after a reboot within the same process), so the syscall MSRs, the TSC and
//! MISC_ENABLE are written explicitly, the set Firecracker and vmm-reference use.

use kvm_bindings::kvm_msr_entry;

/// IA32_TSC: the time-stamp counter.
pub const MSR_IA32_TSC: u32 = 0x10;
/// IA32_SYSENTER_CS.
pub const MSR_IA32_SYSENTER_CS: u32 = 0x174;
/// IA32_SYSENTER_ESP.
pub const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
/// IA32_SYSENTER_EIP.
pub const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
/// IA32_MISC_ENABLE.
pub const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
/// IA32_MISC_ENABLE bit 0: fast-string operations (`rep movs`/`stos`) enabled. Linux checks
/// it to decide whether to use `rep movsb` copies; firmware normally sets it.
pub const MSR_IA32_MISC_ENABLE_FAST_STRING: u64 = 1;
/// IA32_MTRR_DEF_TYPE: default memory type and MTRR enable.
pub const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
/// MTRR_DEF_TYPE bit 11: MTRRs enabled.
const MTRR_ENABLE: u64 = 1 << 11;
/// Memory type write-back.
const MTRR_MEM_TYPE_WB: u64 = 0x6;
/// STAR: segment selectors for `syscall`/`sysret`.
pub const MSR_STAR: u32 = 0xc000_0081;
/// LSTAR: 64-bit `syscall` entry point.
pub const MSR_LSTAR: u32 = 0xc000_0082;
/// CSTAR: compatibility-mode `syscall` entry point.
pub const MSR_CSTAR: u32 = 0xc000_0083;
/// SYSCALL_MASK (FMASK): RFLAGS bits cleared on `syscall`.
pub const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
/// KERNEL_GS_BASE: the GS base `swapgs` exchanges with.
pub const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

fn entry(index: u32, data: u64) -> kvm_msr_entry {
    kvm_msr_entry {
        index,
        data,
        ..Default::default()
    }
}

/// MSR values for `KVM_SET_MSRS` on every vCPU before boot.
///
/// The syscall/sysenter MSRs are zeroed (the kernel programs them itself), the TSC starts at
/// 0, fast strings are enabled, and the MTRRs default to write-back: without enabled MTRRs
/// Linux treats all memory as uncached when it sets up PAT. The caller should check that
/// `KVM_SET_MSRS` reports every entry as written.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    vec![
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_TSC, 0),
        entry(MSR_IA32_MISC_ENABLE, MSR_IA32_MISC_ENABLE_FAST_STRING),
        entry(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(index: u32) -> Option<u64> {
        boot_msr_entries()
            .iter()
            .find(|e| e.index == index)
            .map(|e| e.data)
    }

    #[test]
    fn expected_values() {
        assert_eq!(find(MSR_IA32_MISC_ENABLE), Some(1));
        assert_eq!(find(MSR_IA32_TSC), Some(0));
        assert_eq!(find(MSR_MTRR_DEF_TYPE), Some(0x806));
        for index in [
            MSR_IA32_SYSENTER_CS,
            MSR_IA32_SYSENTER_ESP,
            MSR_IA32_SYSENTER_EIP,
            MSR_STAR,
            MSR_LSTAR,
            MSR_CSTAR,
            MSR_SYSCALL_MASK,
            MSR_KERNEL_GS_BASE,
        ] {
            assert_eq!(find(index), Some(0), "MSR {index:#x}");
        }
    }

    #[test]
    fn no_duplicates() {
        let entries = boot_msr_entries();
        let mut indices: Vec<u32> = entries.iter().map(|e| e.index).collect();
        indices.sort_unstable();
        indices.dedup();
        assert_eq!(indices.len(), entries.len());
        assert_eq!(entries.len(), 11);
    }
}
