// SPDX-License-Identifier: Apache-2.0
//! What KVM holds of a VM and its vCPUs, read out for a snapshot and put
//! back into a fresh VM at restore.
//!
//! A vCPU's state is every piece KVM keeps of it: the general and special
//! registers, the XSAVE area (x87, SSE and whatever else the host saves) and
//! the XCRs, the MSRs KVM lists as saveable, the local APIC, the MP state,
//! the pending events, the debug registers and the CPUID it was given. The
//! VM's state is the in-kernel irqchip (both PICs and the IOAPIC), the PIT
//! and the KVM clock. Every value is a `kvm_bindings` structure, serialized
//! through that crate's own serde support, so the layout is the kernel's
//! and nothing is retyped here.
//!
//! The order of a restore is KVM's, as Firecracker and Cloud Hypervisor
//! apply it: CPUID before anything that depends on it (MSRs, XSAVE), the
//! special registers before the general ones, the MSRs before the events,
//! the MP state, the LAPIC last but the events (a LAPIC set before the
//! MSRs would see the APIC base change again).

use kvm_bindings::{
    kvm_clock_data, kvm_debugregs, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_pit_state2,
    kvm_regs, kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs, KVM_IRQCHIP_IOAPIC,
    KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_MAX_CPUID_ENTRIES,
};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use serde::{Deserialize, Serialize};

/// Errors reading or writing KVM state.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A get or set ioctl failed.
    #[error("KVM refused to {what}")]
    Ioctl {
        /// What was read or written.
        what: &'static str,
        /// The ioctl's error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// A saved list does not fit KVM's limit for it.
    #[error("the saved {0} list is longer than KVM allows")]
    TooLong(&'static str),
    /// Fewer MSRs were taken back than saved.
    #[error("KVM accepted {set} of the {saved} saved MSRs (first refused: {first:#x})")]
    Msrs {
        /// Accepted.
        set: usize,
        /// Saved.
        saved: usize,
        /// The index KVM stopped at.
        first: u32,
    },
}

fn ioctl(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> StateError {
    move |source| StateError::Ioctl { what, source }
}

/// One vCPU as KVM holds it.
#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    /// General registers.
    pub regs: kvm_regs,
    /// Segment, control and descriptor-table registers.
    pub sregs: kvm_sregs,
    /// The XSAVE area (the legacy x87/SSE region and the extended ones).
    pub xsave: kvm_xsave,
    /// XCR0 and friends.
    pub xcrs: kvm_xcrs,
    /// Every MSR of KVM's saveable list that this vCPU could read.
    pub msrs: Vec<kvm_bindings::kvm_msr_entry>,
    /// The local APIC's register page.
    pub lapic: kvm_lapic_state,
    /// Running, halted, waiting for SIPI...
    pub mp_state: kvm_mp_state,
    /// Pending exceptions, interrupts, NMIs, SMIs.
    pub events: kvm_vcpu_events,
    /// DR0-DR3, DR6, DR7.
    pub debug_regs: kvm_debugregs,
    /// The CPUID the vCPU was given.
    pub cpuid: Vec<kvm_bindings::kvm_cpuid_entry2>,
}

impl std::fmt::Debug for VcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuState")
            .field("rip", &self.regs.rip)
            .field("msrs", &self.msrs.len())
            .field("cpuid", &self.cpuid.len())
            .field("mp_state", &self.mp_state.mp_state)
            .finish_non_exhaustive()
    }
}

/// The MSRs KVM lists for save and restore, read in one call where the
/// vCPU takes them all; an index KVM refuses to read (it stops at the
/// first) is left out and the rest read on.
pub fn saveable_msrs(kvm: &Kvm) -> Result<Vec<u32>, StateError> {
    let list = kvm
        .get_msr_index_list()
        .map_err(ioctl("list the saveable MSRs"))?;
    Ok(list.as_slice().to_vec())
}

fn read_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_bindings::kvm_msr_entry>, StateError> {
    let mut out = Vec::with_capacity(indices.len());
    let mut rest = indices;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(kvm_bindings::KVM_MAX_MSR_ENTRIES)];
        let entries: Vec<_> = chunk
            .iter()
            .map(|&index| kvm_bindings::kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = Msrs::from_entries(&entries).map_err(|_| StateError::TooLong("MSR"))?;
        let read = fd.get_msrs(&mut msrs).map_err(ioctl("read the MSRs"))?;
        out.extend_from_slice(&msrs.as_slice()[..read]);
        // KVM stops at the first MSR it cannot read: skip that one.
        let skip = (read + 1).min(chunk.len());
        rest = &rest[skip..];
    }
    Ok(out)
}

/// Reads every piece of `fd`'s state; `msr_indices` from [`saveable_msrs`].
pub fn save_vcpu(fd: &VcpuFd, msr_indices: &[u32]) -> Result<VcpuState, StateError> {
    let cpuid = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl("read the CPUID"))?;
    Ok(VcpuState {
        // The MP state and the events first: KVM settles a pending
        // INIT/SIPI and in-flight event into them as they are read.
        mp_state: fd.get_mp_state().map_err(ioctl("read the MP state"))?,
        events: fd
            .get_vcpu_events()
            .map_err(ioctl("read the vCPU events"))?,
        regs: fd.get_regs().map_err(ioctl("read the registers"))?,
        sregs: fd
            .get_sregs()
            .map_err(ioctl("read the special registers"))?,
        xsave: fd.get_xsave().map_err(ioctl("read the XSAVE area"))?,
        xcrs: fd.get_xcrs().map_err(ioctl("read the XCRs"))?,
        msrs: read_msrs(fd, msr_indices)?,
        lapic: fd.get_lapic().map_err(ioctl("read the local APIC"))?,
        debug_regs: fd
            .get_debug_regs()
            .map_err(ioctl("read the debug registers"))?,
        cpuid: cpuid.as_slice().to_vec(),
    })
}

/// Puts `state` into a fresh vCPU `fd`. The order is KVM's, not the
/// struct's: the MP state before the registers (KVM decides from it what
/// a pending INIT means), the special registers before the local APIC (they
/// carry the APIC base), the local APIC before the MSRs (KVM drops a
/// TSC-deadline write while the APIC timer is not in TSC-deadline mode, and
/// an idle guest's one armed timer is that deadline), the events last (the
/// register writes clear a pending exception they put back).
#[allow(unsafe_code)]
pub fn restore_vcpu(fd: &VcpuFd, state: &VcpuState) -> Result<(), StateError> {
    let cpuid = CpuId::from_entries(&state.cpuid).map_err(|_| StateError::TooLong("CPUID"))?;
    fd.set_cpuid2(&cpuid).map_err(ioctl("set the CPUID"))?;
    fd.set_mp_state(state.mp_state)
        .map_err(ioctl("set the MP state"))?;
    fd.set_regs(&state.regs)
        .map_err(ioctl("set the registers"))?;
    fd.set_sregs(&state.sregs)
        .map_err(ioctl("set the special registers"))?;
    // SAFETY: `state.xsave` is a whole `kvm_xsave` (4 KiB), the size
    // KVM_SET_XSAVE reads; a host with a larger XSAVE area (AMX) would need
    // KVM_SET_XSAVE2, whose buffer this is not, and reports a larger
    // KVM_CAP_XSAVE2 size, which the snapshot's own host saved with
    // KVM_GET_XSAVE into the same 4 KiB.
    unsafe { fd.set_xsave(&state.xsave) }.map_err(ioctl("set the XSAVE area"))?;
    fd.set_xcrs(&state.xcrs).map_err(ioctl("set the XCRs"))?;
    fd.set_debug_regs(&state.debug_regs)
        .map_err(ioctl("set the debug registers"))?;
    fd.set_lapic(&state.lapic)
        .map_err(ioctl("set the local APIC"))?;
    for chunk in state.msrs.chunks(kvm_bindings::KVM_MAX_MSR_ENTRIES) {
        let msrs = Msrs::from_entries(chunk).map_err(|_| StateError::TooLong("MSR"))?;
        let set = fd.set_msrs(&msrs).map_err(ioctl("set the MSRs"))?;
        if set != chunk.len() {
            return Err(StateError::Msrs {
                set,
                saved: chunk.len(),
                first: chunk[set].index,
            });
        }
    }
    fd.set_vcpu_events(&state.events)
        .map_err(ioctl("set the vCPU events"))?;
    Ok(())
}

/// Where each vCPU thread puts its state when a snapshot asks (the
/// errand of [`crate::kvm::pause::PauseGate::run_errand`]): one slot per
/// vCPU, by index, and the MSR list they read.
#[derive(Debug)]
pub struct VcpuStateSlots {
    msr_indices: Vec<u32>,
    slots: std::sync::Mutex<Vec<Option<Result<VcpuState, String>>>>,
}

impl VcpuStateSlots {
    /// Empty slots for `count` vCPUs, which read the MSRs `msr_indices`.
    pub fn new(count: usize, msr_indices: Vec<u32>) -> Self {
        VcpuStateSlots {
            msr_indices,
            slots: std::sync::Mutex::new((0..count).map(|_| None).collect()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Result<VcpuState, String>>>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// vCPU side: reads `fd`'s state into slot `id`.
    pub fn save(&self, id: u8, fd: &VcpuFd) {
        let state = save_vcpu(fd, &self.msr_indices).map_err(|e| crate::error_line(&e));
        if let Some(slot) = self.lock().get_mut(usize::from(id)) {
            *slot = Some(state);
        }
    }

    /// Empties every slot before an errand.
    pub fn clear(&self) {
        self.lock().iter_mut().for_each(|s| *s = None);
    }

    /// Every vCPU's state, in index order, once each has put it; the
    /// first failure or missing one otherwise.
    pub fn take(&self) -> Result<Vec<VcpuState>, String> {
        let mut slots = self.lock();
        let mut out = Vec::with_capacity(slots.len());
        for (id, slot) in slots.iter_mut().enumerate() {
            match slot.take() {
                Some(Ok(state)) => out.push(state),
                Some(Err(e)) => return Err(format!("vCPU {id}: {e}")),
                None => return Err(format!("vCPU {id} did not save its state")),
            }
        }
        Ok(out)
    }
}

/// The VM-wide state KVM holds.
#[derive(Clone, Serialize, Deserialize)]
pub struct VmState {
    /// The master PIC, the slave PIC and the IOAPIC, in that order.
    pub irqchips: Vec<kvm_irqchip>,
    /// The PIT's three channels.
    pub pit: kvm_pit_state2,
    /// The KVM clock: guest time goes on from here after a restore.
    pub clock: kvm_clock_data,
}

impl std::fmt::Debug for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmState")
            .field("clock", &self.clock.clock)
            .finish_non_exhaustive()
    }
}

const IRQCHIPS: [u32; 3] = [
    KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQCHIP_IOAPIC,
];

/// Reads the irqchip, PIT and clock of `vm`.
pub fn save_vm(vm: &VmFd) -> Result<VmState, StateError> {
    let mut irqchips = Vec::with_capacity(IRQCHIPS.len());
    for chip_id in IRQCHIPS {
        let mut chip = kvm_irqchip {
            chip_id,
            ..Default::default()
        };
        vm.get_irqchip(&mut chip)
            .map_err(ioctl("read the irqchip"))?;
        irqchips.push(chip);
    }
    let mut clock = vm.get_clock().map_err(ioctl("read the KVM clock"))?;
    // The flags say how the clock was read (TSC-stable, realtime); KVM
    // refuses to set a clock with flags it does not take back.
    clock.flags = 0;
    Ok(VmState {
        irqchips,
        pit: vm.get_pit2().map_err(ioctl("read the PIT"))?,
        clock,
    })
}

/// Puts `state` into a fresh VM whose irqchip and PIT exist.
pub fn restore_vm(vm: &VmFd, state: &VmState) -> Result<(), StateError> {
    for chip in &state.irqchips {
        vm.set_irqchip(chip).map_err(ioctl("set the irqchip"))?;
    }
    vm.set_pit2(&state.pit).map_err(ioctl("set the PIT"))?;
    vm.set_clock(&state.clock)
        .map_err(ioctl("set the KVM clock"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vCPU configured as the builder configures the boot vCPU.
    fn boot_vcpu(kvm: &Kvm, vm: &VmFd, mem: &vm_memory::GuestMemoryMmap<()>) -> VcpuFd {
        let cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap();
        let fd = vm.create_vcpu(0).unwrap();
        let bus: std::sync::Arc<dyn crate::kvm::vcpu::ExitBus> =
            std::sync::Arc::new(crate::device_manager::DeviceManager::new());
        let vcpu = crate::kvm::vcpu::Vcpu::new(fd, 0, bus, false);
        vcpu.configure(&cpuid, (1, false), mem, Some((0x100_0000, 0x7000)))
            .unwrap();
        vcpu.into_fd()
    }

    /// What this host's KVM does with every state ioctl: each piece read
    /// from one VM is taken by a second and reads back the same.
    #[test]
    fn every_piece_of_vcpu_and_vm_state_survives_a_round_trip() {
        let Some((kvm, vm, mem)) = crate::builder::test_vm(32) else {
            return;
        };
        let fd = boot_vcpu(&kvm, &vm, &mem);
        let indices = saveable_msrs(&kvm).unwrap();
        let saved = save_vcpu(&fd, &indices).unwrap();
        eprintln!(
            "saveable MSRs listed {}, read {}; CPUID entries {}",
            indices.len(),
            saved.msrs.len(),
            saved.cpuid.len()
        );
        assert_eq!(saved.regs.rip, 0x100_0000);
        assert!(!saved.msrs.is_empty());
        let vm_saved = save_vm(&vm).unwrap();

        let (_kvm2, vm2, _mem2) = crate::builder::test_vm(32).unwrap();
        let fd2 = vm2.create_vcpu(0).unwrap();
        restore_vm(&vm2, &vm_saved).unwrap();
        restore_vcpu(&fd2, &saved).unwrap();
        let back = save_vcpu(&fd2, &indices).unwrap();
        assert_eq!(back.regs, saved.regs);
        assert_eq!(back.sregs.cr0, saved.sregs.cr0);
        assert_eq!(back.sregs.cr3, saved.sregs.cr3);
        assert_eq!(back.sregs.efer, saved.sregs.efer);
        assert_eq!(back.mp_state, saved.mp_state);
        assert_eq!(back.xcrs.xcrs[0].value, saved.xcrs.xcrs[0].value);
        assert_eq!(back.lapic.regs[..], saved.lapic.regs[..]);
        assert_eq!(back.cpuid.len(), saved.cpuid.len());
        let vm_back = save_vm(&vm2).unwrap();
        assert_eq!(
            vm_back.pit.channels[0].count,
            vm_saved.pit.channels[0].count
        );
        // The clock goes on from the saved value, never backwards.
        assert!(vm_back.clock.clock >= vm_saved.clock.clock);
    }

    /// The local APIC's timer register (LVT Timer) and its TSC-deadline
    /// mode (bits 18:17 = 2), as the Intel SDM numbers them.
    const APIC_LVTT: usize = 0x320;
    const LVTT_TSC_DEADLINE: u32 = 2 << 17;
    /// IA32_TSC_DEADLINE.
    const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;

    fn msr(fd: &VcpuFd, index: u32) -> u64 {
        let read = read_msrs(fd, &[index]).unwrap();
        assert_eq!(read.len(), 1, "MSR {index:#x} not read");
        read[0].data
    }

    /// An idle guest's one armed timer: the APIC timer in TSC-deadline
    /// mode and a deadline ahead. Set in the order a guest sets them.
    fn arm_tsc_deadline(fd: &VcpuFd) -> Option<u64> {
        let mut lapic = fd.get_lapic().unwrap();
        let lvtt = LVTT_TSC_DEADLINE | 0xec;
        for (i, b) in lvtt.to_le_bytes().iter().enumerate() {
            lapic.regs[APIC_LVTT + i] = *b as std::os::raw::c_char;
        }
        fd.set_lapic(&lapic).unwrap();
        let deadline = msr(fd, arch::x86_64::msr::MSR_IA32_TSC) + (1 << 40);
        let entry = kvm_bindings::kvm_msr_entry {
            index: MSR_IA32_TSC_DEADLINE,
            data: deadline,
            ..Default::default()
        };
        fd.set_msrs(&Msrs::from_entries(&[entry]).unwrap()).unwrap();
        // A host whose KVM gives no TSC-deadline timer to the guest keeps
        // the write from taking.
        (msr(fd, MSR_IA32_TSC_DEADLINE) == deadline).then_some(deadline)
    }

    /// The armed TSC deadline of a paused guest is armed again after a
    /// restore: restored before the local APIC, KVM drops it and the guest
    /// sleeps until some device interrupt wakes it.
    #[test]
    fn an_armed_tsc_deadline_survives_a_round_trip() {
        let Some((kvm, vm, mem)) = crate::builder::test_vm(32) else {
            return;
        };
        let fd = boot_vcpu(&kvm, &vm, &mem);
        let Some(deadline) = arm_tsc_deadline(&fd) else {
            minivmm_tests::print_skip("this host's KVM gives the guest no TSC-deadline timer");
            return;
        };
        let saved = save_vcpu(&fd, &saveable_msrs(&kvm).unwrap()).unwrap();
        let (_kvm2, vm2, _mem2) = crate::builder::test_vm(32).unwrap();
        restore_vm(&vm2, &save_vm(&vm).unwrap()).unwrap();
        let fd2 = vm2.create_vcpu(0).unwrap();
        restore_vcpu(&fd2, &saved).unwrap();
        assert_eq!(msr(&fd2, MSR_IA32_TSC_DEADLINE), deadline);
    }

    #[test]
    fn vcpu_state_survives_json() {
        let Some((kvm, vm, mem)) = crate::builder::test_vm(32) else {
            return;
        };
        let fd = boot_vcpu(&kvm, &vm, &mem);
        let saved = save_vcpu(&fd, &saveable_msrs(&kvm).unwrap()).unwrap();
        let text = serde_json::to_string(&saved).unwrap();
        let back: VcpuState = serde_json::from_str(&text).unwrap();
        assert_eq!(back.regs, saved.regs);
        assert_eq!(back.msrs, saved.msrs);
        assert_eq!(back.xsave.region[..], saved.xsave.region[..]);
    }
}
