// SPDX-License-Identifier: Apache-2.0
//! Per-vCPU CPUID adjustments on top of `KVM_GET_SUPPORTED_CPUID`.
//!
//! KVM's supported list describes the host: its APIC ids, core counts and cache sharing are
//! the host's, identical for every vCPU. Linux derives its CPU topology from these leaves, and
//! with two vCPUs reporting the same APIC id it refuses to bring up the second one. So each
//! vCPU gets its own APIC id, and the topology leaves describe one socket with `nr_vcpus`
//! single-threaded cores, matching the processor entries of the MP table
//! ([`crate::x86_64::mptable`], where APIC id = vCPU index). With SMT (Firecracker's
//! `machine-config.smt`, more than one vCPU) the same vCPUs are two threads per core: vCPUs
//! 2k and 2k+1 are the threads of core k (APIC id bit 0 is the thread), and the caches of a
//! core (L1, L2) are shared by its two threads. Every other leaf is left exactly as
//! KVM reported it.
//!
//! Both vendors' topology paths are covered: Intel-style leaves 1, 4, 0xb and 0x1f, and on AMD
//! hosts 0x8000_0008 (core count), 0x8000_001d (cache sharing) and 0x8000_001e (core id). On
//! AMD, KVM reports leaf 0xb as a single all-zero subleaf; it is kept invalid so Linux takes
//! the AMD path (see `update_topology_leaf`). This was checked by booting Linux 6.1 with two
//! vCPUs on an AMD EPYC host: one package, two cores.
//!
//! Leaf 1 ECX bit 24 (TSC-deadline timer) is left as KVM reports it. Hosts before Linux 6.14
//! never report it (it depends on the in-kernel LAPIC; a VMM may set it after checking
//! `KVM_CAP_TSC_DEADLINE_TIMER`); newer hosts report it unconditionally (KVM commit
//! 9be4ec35d668), which is correct for minivmm because it always creates the in-kernel
//! irqchip. Without the bit Linux simply uses the LAPIC one-shot timer, so there is nothing
//! to clear.

use kvm_bindings::{kvm_cpuid_entry2, CpuId};

/// Leaf 1 ECX bit 31: running under a hypervisor. Linux checks it before probing the
/// hypervisor leaves at 0x4000_0000 and to pick paravirtual defaults.
pub const ECX_HYPERVISOR_BIT: u32 = 1 << 31;
/// Leaf 1 EDX bit 28: EBX bits 23..16 holds a valid logical-processor count.
pub const EDX_HTT_BIT: u32 = 1 << 28;

/// x2APIC topology level type "SMT" (leaf 0xb/0x1f ECX[15:8]).
const LEVEL_TYPE_SMT: u32 = 1;
/// x2APIC topology level type "Core".
const LEVEL_TYPE_CORE: u32 = 2;

/// "AuthenticAMD" in leaf 0 EBX.
const AMD_VENDOR_EBX: u32 = 0x6874_7541;

/// Number of APIC-id bits needed to number `count` cores: ceil(log2(count)).
fn apic_id_bits(count: u32) -> u32 {
    if count <= 1 {
        0
    } else {
        32 - (count - 1).leading_zeros()
    }
}

/// Leaf 1: initial APIC id, logical-processor count, hypervisor bit.
fn update_leaf1(entry: &mut kvm_cpuid_entry2, vcpu_id: u8, nr_vcpus: u8) {
    // Keep EBX[15:0] (brand index, CLFLUSH line size).
    entry.ebx =
        (entry.ebx & 0x0000_ffff) | (u32::from(vcpu_id) << 24) | (u32::from(nr_vcpus) << 16);
    entry.ecx |= ECX_HYPERVISOR_BIT;
    if nr_vcpus > 1 {
        entry.edx |= EDX_HTT_BIT;
    } else {
        entry.edx &= !EDX_HTT_BIT;
    }
}

/// The guest's topology: `nr_vcpus` logical processors in one package,
/// `threads` (1 or 2) of them per core.
#[derive(Debug, Clone, Copy)]
struct Topology {
    nr_vcpus: u8,
    threads: u8,
}

impl Topology {
    fn cores(self) -> u8 {
        self.nr_vcpus / self.threads
    }
}

/// How many vCPUs share the cache that EAX of a deterministic cache leaf describes, minus
/// one (EAX[25:14]). Intel's leaf 4 and AMD's 0x8000_001d lay out EAX[7:0] alike. L1/L2 are
/// private to a core (shared by its threads), L3 is shared by the whole package. `None` for
/// the entry of cache type 0, which terminates the list and carries no topology.
fn cache_sharing_minus_one(eax: u32, topo: Topology) -> Option<u32> {
    if eax & 0x1f == 0 {
        return None;
    }
    let level = (eax >> 5) & 0x7;
    Some(if level >= 3 {
        u32::from(topo.nr_vcpus - 1)
    } else {
        u32::from(topo.threads - 1)
    })
}

/// Leaf 4 (Intel deterministic cache parameters), one entry per cache.
fn update_leaf4(entry: &mut kvm_cpuid_entry2, topo: Topology) {
    let Some(sharing_minus_one) = cache_sharing_minus_one(entry.eax, topo) else {
        return;
    };
    let cores_minus_one = u32::from(topo.cores() - 1).min(0x3f);
    entry.eax = (entry.eax & 0x0000_3fff) | (sharing_minus_one << 14) | (cores_minus_one << 26);
}

/// Leaves 0xb and 0x1f (extended topology): SMT level of `threads` threads, core level of
/// `nr_vcpus` logical processors, x2APIC id = vCPU index in every subleaf.
///
/// `complete` says whether KVM reported both subleaf 0 and subleaf 1 with a valid level.
/// If not (an AMD host reports leaf 0xb as one all-zero subleaf), the leaf stays "not
/// implemented" (EBX = 0): making only subleaf 0 valid would tell Linux that each vCPU is its
/// own package, because the missing core level reads as zeros.
fn update_topology_leaf(entry: &mut kvm_cpuid_entry2, vcpu_id: u8, topo: Topology, complete: bool) {
    let index = entry.index;
    match index {
        0 if complete => {
            entry.eax = apic_id_bits(u32::from(topo.threads));
            entry.ebx = u32::from(topo.threads);
            entry.ecx = (LEVEL_TYPE_SMT << 8) | index;
        }
        1 if complete => {
            entry.eax = apic_id_bits(u32::from(topo.nr_vcpus));
            entry.ebx = u32::from(topo.nr_vcpus);
            entry.ecx = (LEVEL_TYPE_CORE << 8) | index;
        }
        _ => {
            // Level type 0: no further levels (on an incomplete leaf, none at all).
            entry.eax = 0;
            entry.ebx = 0;
            entry.ecx = index & 0xff;
        }
    }
    entry.edx = u32::from(vcpu_id);
}

/// Leaf 0x8000_0008 on AMD: ECX[7:0] = cores per package - 1; ApicIdSize (ECX[15:12]) is
/// cleared so Linux derives it from that count.
fn update_amd_size_leaf(entry: &mut kvm_cpuid_entry2, nr_vcpus: u8) {
    entry.ecx = (entry.ecx & !0xf0ff) | u32::from(nr_vcpus - 1);
}

/// Leaf 0x8000_001d on AMD (cache topology): L1/L2 private to a core, L3 shared by all.
fn update_amd_cache_leaf(entry: &mut kvm_cpuid_entry2, topo: Topology) {
    let Some(sharing_minus_one) = cache_sharing_minus_one(entry.eax, topo) else {
        return;
    };
    entry.eax = (entry.eax & !(0xfff << 14)) | (sharing_minus_one << 14);
}

/// Leaf 0x8000_001e on AMD (extended APIC id, compute unit id, node id).
fn update_amd_topology_leaf(entry: &mut kvm_cpuid_entry2, vcpu_id: u8, topo: Topology) {
    entry.eax = u32::from(vcpu_id);
    // Threads per compute unit - 1 in EBX[15:8]; the compute unit (core) id below.
    entry.ebx = (u32::from(topo.threads - 1) << 8) | u32::from(vcpu_id / topo.threads);
    // One node, node id 0.
    entry.ecx = 0;
}

/// Adjusts KVM's supported CPUID for vCPU `vcpu_id` of `nr_vcpus`, two threads per core
/// with `smt` (see the module docs).
///
/// `nr_vcpus` of 0 is treated as 1; SMT needs an even count of at least two (one vCPU, or an
/// odd count, stays one thread per core). Subleaves are rewritten only where KVM reported
/// them; none are added.
pub fn filter_cpuid(cpuid: &mut CpuId, vcpu_id: u8, nr_vcpus: u8, smt: bool) {
    let nr_vcpus = nr_vcpus.max(1);
    let threads = if smt && nr_vcpus >= 2 && nr_vcpus.is_multiple_of(2) {
        2
    } else {
        1
    };
    let topo = Topology { nr_vcpus, threads };
    let entries = cpuid.as_slice();
    let is_amd = entries
        .iter()
        .any(|e| e.function == 0 && e.ebx == AMD_VENDOR_EBX);
    let has_level = |function: u32, index: u32| {
        entries
            .iter()
            .any(|e| e.function == function && e.index == index && e.ebx != 0)
    };
    let complete_0xb = has_level(0xb, 0) && has_level(0xb, 1);
    let complete_0x1f = has_level(0x1f, 0) && has_level(0x1f, 1);

    for entry in cpuid.as_mut_slice() {
        match entry.function {
            0x1 => update_leaf1(entry, vcpu_id, nr_vcpus),
            0x4 => update_leaf4(entry, topo),
            0xb => update_topology_leaf(entry, vcpu_id, topo, complete_0xb),
            0x1f => update_topology_leaf(entry, vcpu_id, topo, complete_0x1f),
            0x8000_0008 if is_amd => update_amd_size_leaf(entry, nr_vcpus),
            0x8000_001d if is_amd => update_amd_cache_leaf(entry, topo),
            0x8000_001e if is_amd => update_amd_topology_leaf(entry, vcpu_id, topo),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvm_bindings::KVM_CPUID_FLAG_SIGNIFCANT_INDEX;

    fn leaf(function: u32, index: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            flags: if matches!(function, 0x4 | 0xb | 0x1f) {
                KVM_CPUID_FLAG_SIGNIFCANT_INDEX
            } else {
                0
            },
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    /// Leaf 0 of an Intel host: max basic leaf 0x1f, vendor "GenuineIntel".
    fn intel_vendor_leaf() -> kvm_cpuid_entry2 {
        leaf(0x0, 0, 0x1f, 0x756e_6547, 0x6c65_746e, 0x4965_6e69)
    }

    /// A host-like list: Intel vendor, host APIC id 7 on 16 logical CPUs.
    fn intel_cpuid() -> CpuId {
        CpuId::from_entries(&[
            intel_vendor_leaf(),
            leaf(0x1, 0, 0x000906ea, 0x0710_0800, 0x7ffa_fbff, 0xbfeb_fbff),
            leaf(0x4, 0, 0x1c00_4121, 0x01c0_003f, 0x3f, 0),
            leaf(0x4, 1, 0x1c00_4122, 0x01c0_003f, 0x3f, 0),
            leaf(0x4, 2, 0x1c00_4143, 0x00c0_003f, 0x3ff, 0),
            leaf(0x4, 3, 0x1c03_c163, 0x03c0_003f, 0x2fff, 0x6),
            leaf(0x4, 4, 0, 0, 0, 0),
            leaf(0xb, 0, 1, 2, 0x100, 7),
            leaf(0xb, 1, 4, 16, 0x201, 7),
            leaf(0xb, 2, 0, 0, 2, 7),
            leaf(0x8000_0008, 0, 0x3027, 0, 0, 0),
        ])
        .unwrap()
    }

    /// A host-like list of an AMD EPYC host.
    fn amd_cpuid() -> CpuId {
        CpuId::from_entries(&[
            // "AuthenticAMD"
            leaf(0x0, 0, 0x10, 0x6874_7541, 0x444d_4163, 0x6974_6e65),
            leaf(0x1, 0, 0x00a00f11, 0x0102_0800, 0x8120_2000, 0x078b_fbff),
            // What KVM reports on an AMD EPYC host: one all-zero subleaf.
            leaf(0xb, 0, 0, 0, 0, 1),
            leaf(0x8000_0008, 0, 0x3030, 0, 0x7007, 0),
            leaf(0x8000_001d, 1, 0x0000_0122, 0x01c0_003f, 0x3f, 0),
            leaf(0x8000_001d, 3, 0x0000_4163, 0x03c0_003f, 0x7fff, 1),
            leaf(0x8000_001e, 0, 9, 0x104, 0x300, 0),
        ])
        .unwrap()
    }

    /// `cpuid` as [`filter_cpuid`] leaves it for vCPU `vcpu_id` of `nr_vcpus`.
    fn filtered(mut cpuid: CpuId, vcpu_id: u8, nr_vcpus: u8) -> CpuId {
        filter_cpuid(&mut cpuid, vcpu_id, nr_vcpus, false);
        cpuid
    }

    /// The same with SMT.
    fn filtered_smt(mut cpuid: CpuId, vcpu_id: u8, nr_vcpus: u8) -> CpuId {
        filter_cpuid(&mut cpuid, vcpu_id, nr_vcpus, true);
        cpuid
    }

    fn get(cpuid: &CpuId, function: u32, index: u32) -> kvm_cpuid_entry2 {
        *cpuid
            .as_slice()
            .iter()
            .find(|e| e.function == function && e.index == index)
            .unwrap()
    }

    /// EAX, EBX and ECX of leaf `function`, subleaf `index`.
    fn abc(cpuid: &CpuId, function: u32, index: u32) -> (u32, u32, u32) {
        let e = get(cpuid, function, index);
        (e.eax, e.ebx, e.ecx)
    }

    #[test]
    fn apic_ids_per_vcpu() {
        for vcpu in 0..4u8 {
            let cpuid = filtered(intel_cpuid(), vcpu, 4);
            let l1 = get(&cpuid, 1, 0);
            assert_eq!(l1.ebx >> 24, u32::from(vcpu));
            assert_eq!((l1.ebx >> 16) & 0xff, 4);
            // CLFLUSH size kept.
            assert_eq!(l1.ebx & 0xffff, 0x0800);
            for sub in 0..3 {
                assert_eq!(get(&cpuid, 0xb, sub).edx, u32::from(vcpu));
            }
        }
    }

    #[test]
    fn hypervisor_and_htt_bits() {
        let l1 = get(&filtered(intel_cpuid(), 0, 2), 1, 0);
        assert_ne!(l1.ecx & ECX_HYPERVISOR_BIT, 0);
        assert_ne!(l1.edx & EDX_HTT_BIT, 0);
        // Other feature bits untouched.
        assert_eq!(l1.ecx & !ECX_HYPERVISOR_BIT, 0x7ffa_fbff);

        let cpuid = filtered(intel_cpuid(), 0, 1);
        assert_eq!(get(&cpuid, 1, 0).edx & EDX_HTT_BIT, 0);
    }

    #[test]
    fn extended_topology_levels() {
        let cpuid = filtered(intel_cpuid(), 2, 3);
        assert_eq!(abc(&cpuid, 0xb, 0), (0, 1, 0x100));
        // 3 cores need 2 APIC-id bits.
        assert_eq!(abc(&cpuid, 0xb, 1), (2, 3, 0x201));
        assert_eq!(abc(&cpuid, 0xb, 2), (0, 0, 2));
    }

    #[test]
    fn cache_leaf_cores_and_sharing() {
        let cpuid = filtered(intel_cpuid(), 0, 4);
        for sub in 0..3 {
            let e = get(&cpuid, 4, sub);
            assert_eq!(e.eax >> 26, 3, "cores per package - 1, subleaf {sub}");
            assert_eq!((e.eax >> 14) & 0xfff, 0, "L1/L2 private, subleaf {sub}");
        }
        let l3 = get(&cpuid, 4, 3);
        assert_eq!(l3.eax >> 26, 3);
        assert_eq!((l3.eax >> 14) & 0xfff, 3);
        // Cache type/level bits kept.
        assert_eq!(l3.eax & 0x3fff, 0x0163);
        // Terminator untouched.
        assert_eq!(get(&cpuid, 4, 4).eax, 0);
    }

    #[test]
    fn smt_gives_two_threads_per_core_on_both_vendors() {
        // Intel: 4 vCPUs are 2 cores of 2 threads; the thread is APIC id bit 0.
        let cpuid = filtered_smt(intel_cpuid(), 3, 4);
        assert_eq!(abc(&cpuid, 0xb, 0), (1, 2, 0x100));
        assert_eq!(abc(&cpuid, 0xb, 1), (2, 4, 0x201));
        assert_eq!(get(&cpuid, 0xb, 0).edx, 3);
        for sub in 0..3 {
            let e = get(&cpuid, 4, sub);
            assert_eq!(e.eax >> 26, 1, "cores per package - 1, subleaf {sub}");
            assert_eq!((e.eax >> 14) & 0xfff, 1, "L1/L2 per core, subleaf {sub}");
        }
        assert_eq!((get(&cpuid, 4, 3).eax >> 14) & 0xfff, 3);
        // AMD: threads per compute unit and the core id.
        let cpuid = filtered_smt(amd_cpuid(), 3, 4);
        assert_eq!(abc(&cpuid, 0x8000_001e, 0), (3, 0x101, 0));
        assert_eq!(get(&cpuid, 0x8000_0008, 0).ecx, 3);
        assert_eq!((get(&cpuid, 0x8000_001d, 1).eax >> 14) & 0xfff, 1);
        assert_eq!((get(&cpuid, 0x8000_001d, 3).eax >> 14) & 0xfff, 3);
        // One vCPU, or an odd count, stays one thread per core.
        for (id, n) in [(0, 1), (2, 3)] {
            assert_eq!(
                filtered_smt(intel_cpuid(), id, n).as_slice(),
                filtered(intel_cpuid(), id, n).as_slice()
            );
        }
    }

    #[test]
    fn amd_cache_and_topology_leaves_stay_as_intel_reports_them() {
        // An Intel host may list 0x8000_001d and 0x8000_001e (as zeros, or
        // whatever its microcode says): they are AMD's to rewrite only.
        let mut entries = intel_cpuid().as_slice().to_vec();
        entries.push(leaf(0x8000_001d, 1, 0x0000_0122, 0x01c0_003f, 0x3f, 0));
        entries.push(leaf(0x8000_001e, 0, 0x11, 0x222, 0x333, 0));
        let cpuid = filtered_smt(CpuId::from_entries(&entries).unwrap(), 3, 4);
        assert_eq!(
            abc(&cpuid, 0x8000_001d, 1),
            (0x0000_0122, 0x01c0_003f, 0x3f)
        );
        assert_eq!(abc(&cpuid, 0x8000_001e, 0), (0x11, 0x222, 0x333));
    }

    #[test]
    fn amd_leaves_only_on_amd() {
        // Intel: 0x8000_0008 ECX untouched.
        let cpuid = filtered(intel_cpuid(), 1, 4);
        assert_eq!(get(&cpuid, 0x8000_0008, 0).ecx, 0);

        let cpuid = filtered(amd_cpuid(), 1, 4);
        assert_eq!(get(&cpuid, 0x8000_0008, 0).ecx, 3);
        assert_eq!(abc(&cpuid, 0x8000_001e, 0), (1, 1, 0));
        // Leaf 0xb stays "not implemented" so Linux uses the AMD leaves above.
        assert_eq!(abc(&cpuid, 0xb, 0), (0, 0, 0));
        // L2 private, L3 shared by all four vCPUs; the other EAX bits are kept.
        let l2 = get(&cpuid, 0x8000_001d, 1);
        assert_eq!(l2.eax, 0x0000_0122);
        let l3 = get(&cpuid, 0x8000_001d, 3);
        assert_eq!((l3.eax >> 14) & 0xfff, 3);
        assert_eq!(l3.eax & 0x3fff, 0x0163);
        // Leaf 1 is vendor-neutral.
        assert_eq!(get(&cpuid, 1, 0).ebx >> 24, 1);
    }

    #[test]
    fn incomplete_topology_leaf_is_invalidated() {
        // Subleaf 0 valid but no core level: must not be half-rewritten.
        let cpuid = CpuId::from_entries(&[
            intel_vendor_leaf(),
            leaf(0xb, 0, 1, 2, 0x100, 7),
            // A core subleaf without a level (EBX 0): the leaf is incomplete.
            leaf(0xb, 1, 0, 0, 0x001, 7),
            leaf(0x1f, 0, 1, 2, 0x100, 7),
            leaf(0x1f, 1, 4, 16, 0x201, 7),
        ])
        .unwrap();
        let cpuid = filtered(cpuid, 3, 4);
        let b = get(&cpuid, 0xb, 0);
        assert_eq!((b.ebx, b.ecx), (0, 0));
        // Nor is its core subleaf given a level.
        let b1 = get(&cpuid, 0xb, 1);
        assert_eq!((b1.eax, b1.ebx, b1.ecx, b1.edx), (0, 0, 1, 3));
        // 0x1f is complete and rewritten independently.
        let c = get(&cpuid, 0x1f, 1);
        assert_eq!((c.eax, c.ebx, c.ecx, c.edx), (2, 4, 0x201, 3));
    }

    #[test]
    fn zero_vcpus_treated_as_one() {
        let cpuid = filtered(intel_cpuid(), 0, 0);
        assert_eq!((get(&cpuid, 1, 0).ebx >> 16) & 0xff, 1);
        assert_eq!(get(&cpuid, 0xb, 1).ebx, 1);
    }

    #[test]
    fn apic_id_bit_counts() {
        for (count, bits) in [(1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (255, 8)] {
            assert_eq!(apic_id_bits(count), bits, "{count} cores");
        }
    }
}
