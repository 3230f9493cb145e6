// SPDX-License-Identifier: Apache-2.0
//! vCPUs: configuration from `arch` values and the run loop.
//!
//! Exit dispatch is the pure [`handle_exit`], which takes a bus and returns
//! what the loop must do, so it is tested with synthetic exits and no KVM.
//! The loop itself adds the two things that need the vCPU fd: retrying
//! `KVM_RUN` on EAGAIN/EINTR (an AP waiting for INIT/SIPI returns EAGAIN) and,
//! on a PVM host, recovering the INT3 emulation failure.
#![allow(unsafe_code)]

use std::sync::Arc;

use kvm_bindings::{
    kvm_regs, kvm_vcpu_events, CpuId, Msrs, KVM_SYSTEM_EVENT_RESET, KVM_SYSTEM_EVENT_SHUTDOWN,
};
use kvm_ioctls::{VcpuExit, VcpuFd};
use log::{debug, info};

use crate::pvm;
use crate::vm_exit::{ExitLatch, VmExit};

/// Where port and MMIO exits go.
pub trait ExitBus: Send + Sync {
    /// A guest `in` from `port`: `data` holds `data.len() / size` accesses
    /// of `size` bytes, every one to `port` (a string instruction, `rep
    /// insb`, is one exit with many; a plain `in` one).
    fn pio_read(&self, port: u16, size: usize, data: &mut [u8]);
    /// A guest `out` to `port`, in accesses of `size` bytes as for
    /// [`ExitBus::pio_read`].
    fn pio_write(&self, port: u16, size: usize, data: &[u8]);
    /// A guest load from an unbacked physical address.
    fn mmio_read(&self, addr: u64, data: &mut [u8]);
    /// A guest store to an unbacked physical address.
    fn mmio_write(&self, addr: u64, data: &[u8]);
}

/// What the run loop does after an exit.
#[derive(Debug, PartialEq, Eq)]
pub enum ExitAction {
    /// Enter the guest again.
    Continue,
    /// KVM's emulator failed; the loop reads the details from `kvm_run`.
    InternalError,
    /// The VM must end.
    Stop(VmExit),
}

/// How long an AP waiting for its start-up IPI sleeps between KVM_RUN
/// attempts: far below what Linux allows an AP to come up (seconds).
const AP_WAIT_BACKOFF: std::time::Duration = std::time::Duration::from_micros(200);

/// #BP, raised by INT3.
const BP_VECTOR: u8 = 3;

/// A vCPU exit as [`handle_exit`] takes it: KVM's own, except that a port
/// I/O exit also carries the size of each access, which `VcpuExit` leaves
/// out (`kvm_run.io.size`; the data holds `io.count` such accesses).
#[derive(Debug)]
pub enum Exit<'a> {
    /// `in` or `rep ins*` from `port`.
    PortIn {
        /// The port every access goes to.
        port: u16,
        /// Bytes per access: 1, 2 or 4.
        size: usize,
        /// The accesses, back to back, for the bus to fill.
        data: &'a mut [u8],
    },
    /// `out` or `rep outs*` to `port`.
    PortOut {
        /// The port every access goes to.
        port: u16,
        /// Bytes per access: 1, 2 or 4.
        size: usize,
        /// The accesses, back to back.
        data: &'a [u8],
    },
    /// Every other exit, as KVM reported it.
    Kvm(VcpuExit<'a>),
}

/// The size of one access of a port I/O exit of `len` bytes: KVM's
/// `io.size` where it divides the data into whole accesses (it always does),
/// else the whole exit as one access rather than a byte lost.
fn port_access_size(size: usize, len: usize) -> usize {
    if (1..=4).contains(&size) && len.is_multiple_of(size) {
        size
    } else {
        len.max(1)
    }
}

/// Dispatches one exit. Pure apart from the bus.
pub fn handle_exit(exit: Exit<'_>, bus: &dyn ExitBus) -> ExitAction {
    let exit = match exit {
        Exit::PortIn { port, size, data } => {
            bus.pio_read(port, port_access_size(size, data.len()), data);
            return ExitAction::Continue;
        }
        Exit::PortOut { port, size, data } => {
            bus.pio_write(port, port_access_size(size, data.len()), data);
            return ExitAction::Continue;
        }
        Exit::Kvm(exit) => exit,
    };
    match exit {
        // Only reached by a caller that did not split port I/O by access
        // size: one access of the whole data.
        VcpuExit::IoIn(port, data) => bus.pio_read(port, data.len().max(1), data),
        VcpuExit::IoOut(port, data) => bus.pio_write(port, data.len().max(1), data),
        VcpuExit::MmioRead(addr, data) => bus.mmio_read(addr, data),
        VcpuExit::MmioWrite(addr, data) => bus.mmio_write(addr, data),
        // With the in-kernel irqchip HLT is handled in KVM; an exit here only
        // means a signal or a halted AP poked; enter again.
        VcpuExit::Hlt | VcpuExit::Intr | VcpuExit::IrqWindowOpen => {}
        VcpuExit::InternalError => return ExitAction::InternalError,
        VcpuExit::Shutdown => {
            return ExitAction::Stop(VmExit::Fault(
                "guest triple fault (KVM_EXIT_SHUTDOWN)".to_string(),
            ))
        }
        VcpuExit::SystemEvent(kind, _) => {
            return ExitAction::Stop(match kind {
                KVM_SYSTEM_EVENT_RESET => VmExit::Reset,
                KVM_SYSTEM_EVENT_SHUTDOWN => VmExit::PowerOff,
                other => VmExit::Fault(format!("unexpected KVM system event {other}")),
            })
        }
        VcpuExit::FailEntry(reason, cpu) => {
            return ExitAction::Stop(VmExit::Fault(format!(
                "KVM failed to enter the guest on cpu {cpu} (hardware reason {reason:#x})"
            )))
        }
        other => return ExitAction::Stop(VmExit::Fault(format!("unexpected vCPU exit {other:?}"))),
    }
    ExitAction::Continue
}

/// Errors configuring a vCPU.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// KVM refused to create the vCPU.
    #[error("cannot create vCPU {0}")]
    Create(u8, #[source] kvm_ioctls::Error),
    /// A register or state ioctl failed.
    #[error("cannot set {what} on vCPU {id}")]
    Set {
        /// What was being set.
        what: &'static str,
        /// Which vCPU.
        id: u8,
        /// The ioctl error.
        #[source]
        source: kvm_ioctls::Error,
    },
    /// arch could not lay out the boot state.
    #[error("cannot prepare boot registers of vCPU {0}")]
    Arch(u8, #[source] arch::x86_64::RegsError),
    /// Fewer MSRs were accepted than given.
    #[error("vCPU {id} accepted {set} of {wanted} boot MSRs")]
    Msrs {
        /// Which vCPU.
        id: u8,
        /// Accepted.
        set: usize,
        /// Given.
        wanted: usize,
    },
}

/// One virtual CPU and what its exits reach.
pub struct Vcpu {
    fd: VcpuFd,
    id: u8,
    bus: Arc<dyn ExitBus>,
    recover_int3: bool,
}

fn set_err(what: &'static str, id: u8) -> impl FnOnce(kvm_ioctls::Error) -> VcpuError {
    move |source| VcpuError::Set { what, id, source }
}

impl Vcpu {
    /// Wraps a created vCPU fd.
    pub fn new(fd: VcpuFd, id: u8, bus: Arc<dyn ExitBus>, recover_int3: bool) -> Self {
        Vcpu {
            fd,
            id,
            bus,
            recover_int3,
        }
    }

    /// This vCPU's index (and APIC id).
    pub fn id(&self) -> u8 {
        self.id
    }

    /// Applies CPUID, MSRs, FPU and LAPIC LINT setup; the boot vCPU also gets
    /// the long-mode registers pointing at the kernel entry.
    pub fn configure(
        &self,
        base_cpuid: &CpuId,
        nr_vcpus: u8,
        mem: &vm_memory::GuestMemoryMmap<()>,
        boot: Option<(u64, u64)>,
    ) -> Result<(), VcpuError> {
        let id = self.id;
        let mut cpuid = base_cpuid.clone();
        arch::x86_64::filter_cpuid(&mut cpuid, id, nr_vcpus);
        self.fd.set_cpuid2(&cpuid).map_err(set_err("CPUID", id))?;

        let entries = arch::x86_64::boot_msr_entries();
        let msrs =
            Msrs::from_entries(&entries).expect("the boot MSR list is far below the FAM limit");
        let set = self.fd.set_msrs(&msrs).map_err(set_err("MSRs", id))?;
        if set != entries.len() {
            return Err(VcpuError::Msrs {
                id,
                set,
                wanted: entries.len(),
            });
        }

        self.fd
            .set_fpu(&arch::x86_64::setup_fpu())
            .map_err(set_err("FPU", id))?;

        let mut lapic = self.fd.get_lapic().map_err(set_err("LAPIC (get)", id))?;
        arch::x86_64::set_lint(&mut lapic);
        self.fd.set_lapic(&lapic).map_err(set_err("LAPIC", id))?;

        // Application processors start in wait-for-SIPI; Linux sets their
        // state itself when it brings them up, so only the BSP gets registers.
        if let Some((entry, zero_page)) = boot {
            let mut sregs = self.fd.get_sregs().map_err(set_err("sregs (get)", id))?;
            arch::x86_64::setup_sregs(mem, &mut sregs).map_err(|e| VcpuError::Arch(id, e))?;
            self.fd.set_sregs(&sregs).map_err(set_err("sregs", id))?;
            self.fd
                .set_regs(&arch::x86_64::setup_regs(entry, zero_page))
                .map_err(set_err("regs", id))?;
        }
        Ok(())
    }

    /// Runs the vCPU until the VM must end, then reports why to `exit`.
    pub fn run(mut self, exit: ExitLatch) {
        let reason = self.run_loop();
        debug!("vCPU {} stops: {reason:?}", self.id);
        exit.report(reason);
    }

    fn run_loop(&mut self) -> VmExit {
        loop {
            let action = match self.fd.run() {
                Ok(VcpuExit::IoIn(port, data)) => {
                    let (ptr, len) = (data.as_mut_ptr(), data.len());
                    let size = self.port_io_size();
                    // SAFETY: `ptr` and `len` are the data of the exit KVM_RUN
                    // just returned: `len` bytes at `io.data_offset` inside
                    // this vCPU's kvm_run mapping, which stays mapped while
                    // `self.fd` lives and which KVM touches only inside
                    // KVM_RUN. The exit's own slice is no longer used, and
                    // `port_io_size` read only the `io` header, so this is
                    // the one reference to those bytes until the next run.
                    let data = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                    handle_exit(Exit::PortIn { port, size, data }, self.bus.as_ref())
                }
                Ok(VcpuExit::IoOut(port, data)) => {
                    let (ptr, len) = (data.as_ptr(), data.len());
                    let size = self.port_io_size();
                    // SAFETY: as for IoIn above; read-only here.
                    let data = unsafe { std::slice::from_raw_parts(ptr, len) };
                    handle_exit(Exit::PortOut { port, size, data }, self.bus.as_ref())
                }
                Ok(exit) => handle_exit(Exit::Kvm(exit), self.bus.as_ref()),
                Err(e) if e.errno() == libc::EINTR => continue,
                Err(e) if e.errno() == libc::EAGAIN => {
                    // An AP still waiting for INIT/SIPI (seen on a PVM host,
                    // where KVM_RUN returns instead of blocking): back off
                    // briefly rather than spin a core the BSP needs.
                    std::thread::sleep(AP_WAIT_BACKOFF);
                    continue;
                }
                Err(e) => return VmExit::Fault(format!("KVM_RUN failed on vCPU {}: {e}", self.id)),
            };
            match action {
                ExitAction::Continue => {}
                ExitAction::Stop(reason) => return reason,
                ExitAction::InternalError => {
                    if let Err(msg) = self.recover_internal_error() {
                        return VmExit::Fault(msg);
                    }
                }
            }
        }
    }

    /// The size of each access of the port I/O exit KVM_RUN just returned.
    fn port_io_size(&mut self) -> usize {
        let run = self.fd.get_kvm_run();
        // SAFETY: KVM_RUN returned with exit_reason KVM_EXIT_IO (the exit was
        // IoIn or IoOut), for which the kernel fills the `io` member of the
        // union; it is plain old data, so reading it as that member is sound.
        let io = unsafe { run.__bindgen_anon_1.io };
        usize::from(io.size)
    }

    /// Recovers an INT3 that KVM failed to emulate (PVM host): skip the byte
    /// and inject #BP as the CPU would have. Anything else is fatal.
    fn recover_internal_error(&mut self) -> Result<(), String> {
        let run = self.fd.get_kvm_run();
        // SAFETY: KVM_RUN returned with exit_reason KVM_EXIT_INTERNAL_ERROR
        // (that is how we got here), and for that exit reason the kernel fills
        // the `internal` member of the union; it is plain old data, so reading
        // it as that member is sound.
        let internal = unsafe { run.__bindgen_anon_1.internal };
        let insn = pvm::emulation_failure_insn(internal.suberror, internal.ndata, &internal.data);
        let mut regs = self.fd.get_regs().map_err(|e| format!("get regs: {e}"))?;
        match &insn {
            Some(bytes) if self.recover_int3 && pvm::is_recoverable_int3(bytes) => {}
            _ => {
                return Err(format!(
                    "guest instruction at RIP {:#x} failed emulation (suberror {}, bytes {:02x?}); \
                     on a PVM host the guest command line may need more words, see --host-quirks",
                    regs.rip,
                    internal.suberror,
                    insn.unwrap_or_default()
                ))
            }
        }
        let mut events: kvm_vcpu_events = self
            .fd
            .get_vcpu_events()
            .map_err(|e| format!("get events: {e}"))?;
        complete_int3(&mut regs, &mut events);
        self.fd
            .set_regs(&regs)
            .map_err(|e| format!("set regs: {e}"))?;
        self.fd
            .set_vcpu_events(&events)
            .map_err(|e| format!("set events: {e}"))?;
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            info!("PVM host: recovered an INT3 emulation failure by injecting #BP (logged once)")
        });
        Ok(())
    }
}

/// Does what the CPU would have done for the one-byte INT3 at `regs.rip`:
/// RIP moves past it and #BP is raised (a trap, so the handler sees the next
/// RIP). The guest chooses RIP; at 2^64-1 the next instruction is at 0, as on
/// hardware, and the addition must not overflow.
fn complete_int3(regs: &mut kvm_regs, events: &mut kvm_vcpu_events) {
    regs.rip = regs.rip.wrapping_add(1);
    events.exception.injected = 1;
    events.exception.nr = BP_VECTOR;
    events.exception.has_error_code = 0;
    events.exception.error_code = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct RecordingBus(Mutex<Vec<String>>);

    impl ExitBus for RecordingBus {
        fn pio_read(&self, port: u16, size: usize, data: &mut [u8]) {
            data.fill(0xab);
            self.0
                .lock()
                .unwrap()
                .push(format!("in {port:#x} {size}x{}", data.len() / size));
        }
        fn pio_write(&self, port: u16, size: usize, data: &[u8]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("out {port:#x} {size} {data:?}"));
        }
        fn mmio_read(&self, addr: u64, data: &mut [u8]) {
            data.fill(0xcd);
            self.0
                .lock()
                .unwrap()
                .push(format!("mmio-r {addr:#x} {}", data.len()));
        }
        fn mmio_write(&self, addr: u64, data: &[u8]) {
            self.0
                .lock()
                .unwrap()
                .push(format!("mmio-w {addr:#x} {data:?}"));
        }
    }

    #[test]
    fn io_and_mmio_reach_the_bus() {
        let bus = RecordingBus::default();
        let mut buf = [0u8; 1];
        let port_in = |port, size, data| Exit::PortIn { port, size, data };
        assert_eq!(
            handle_exit(port_in(0x3fd, 1, &mut buf), &bus),
            ExitAction::Continue
        );
        assert_eq!(buf, [0xab]);
        assert_eq!(
            handle_exit(
                Exit::PortOut {
                    port: 0x3f8,
                    size: 1,
                    data: b"A"
                },
                &bus
            ),
            ExitAction::Continue
        );
        let mut word = [0u8; 4];
        assert_eq!(
            handle_exit(Exit::Kvm(VcpuExit::MmioRead(0xd000_0000, &mut word)), &bus),
            ExitAction::Continue
        );
        assert_eq!(word, [0xcd; 4]);
        assert_eq!(
            handle_exit(
                Exit::Kvm(VcpuExit::MmioWrite(0xd000_0070, &[1, 0, 0, 0])),
                &bus
            ),
            ExitAction::Continue
        );
        assert_eq!(
            *bus.0.lock().unwrap(),
            vec![
                "in 0x3fd 1x1".to_string(),
                "out 0x3f8 1 [65]".to_string(),
                "mmio-r 0xd0000000 4".to_string(),
                "mmio-w 0xd0000070 [1, 0, 0, 0]".to_string(),
            ]
        );
    }

    #[test]
    fn port_io_keeps_the_access_size_of_the_exit() {
        let bus = RecordingBus::default();
        // `rep outsb` of 8 bytes: eight 1-byte accesses; `rep insw` of two
        // words; a plain `out dx, eax`.
        let out = |port, size, data| Exit::PortOut { port, size, data };
        handle_exit(out(0x3f8, 1, b"12345678"), &bus);
        let mut words = [0u8; 4];
        handle_exit(
            Exit::PortIn {
                port: 0x60,
                size: 2,
                data: &mut words,
            },
            &bus,
        );
        handle_exit(out(0x3f8, 4, &[1, 2, 3, 4]), &bus);
        // A size that does not divide the data (never from KVM) is one
        // access, not bytes dropped; so is an IoOut handed over unsplit.
        handle_exit(out(0x80, 3, &[9, 9, 9, 9]), &bus);
        handle_exit(out(0x80, 0, &[7]), &bus);
        handle_exit(Exit::Kvm(VcpuExit::IoOut(0x70, &[5, 6])), &bus);
        assert_eq!(
            *bus.0.lock().unwrap(),
            vec![
                "out 0x3f8 1 [49, 50, 51, 52, 53, 54, 55, 56]".to_string(),
                "in 0x60 2x2".to_string(),
                "out 0x3f8 4 [1, 2, 3, 4]".to_string(),
                "out 0x80 4 [9, 9, 9, 9]".to_string(),
                "out 0x80 1 [7]".to_string(),
                "out 0x70 2 [5, 6]".to_string(),
            ]
        );
    }

    #[test]
    fn ending_exits_stop_with_their_reason() {
        let bus = RecordingBus::default();
        assert!(matches!(
            handle_exit(Exit::Kvm(VcpuExit::Shutdown), &bus),
            ExitAction::Stop(VmExit::Fault(m)) if m.contains("triple fault")
        ));
        assert_eq!(
            handle_exit(
                Exit::Kvm(VcpuExit::SystemEvent(KVM_SYSTEM_EVENT_RESET, &[])),
                &bus
            ),
            ExitAction::Stop(VmExit::Reset)
        );
        assert_eq!(
            handle_exit(
                Exit::Kvm(VcpuExit::SystemEvent(KVM_SYSTEM_EVENT_SHUTDOWN, &[])),
                &bus
            ),
            ExitAction::Stop(VmExit::PowerOff)
        );
        assert!(matches!(
            handle_exit(Exit::Kvm(VcpuExit::FailEntry(0x21, 0)), &bus),
            ExitAction::Stop(VmExit::Fault(m)) if m.contains("0x21")
        ));
        assert_eq!(
            handle_exit(Exit::Kvm(VcpuExit::InternalError), &bus),
            ExitAction::InternalError
        );
        assert_eq!(
            handle_exit(Exit::Kvm(VcpuExit::Hlt), &bus),
            ExitAction::Continue
        );
        assert!(matches!(
            handle_exit(Exit::Kvm(VcpuExit::Hyperv), &bus),
            ExitAction::Stop(VmExit::Fault(_))
        ));
        assert!(bus.0.lock().unwrap().is_empty());
    }

    #[test]
    fn int3_recovery_skips_the_byte_and_raises_bp() {
        let mut regs = kvm_regs {
            rip: 0xffff_ffff_8100_0000,
            ..Default::default()
        };
        let mut events = kvm_vcpu_events::default();
        events.exception.has_error_code = 1;
        events.exception.error_code = 0xdead;
        complete_int3(&mut regs, &mut events);
        assert_eq!(regs.rip, 0xffff_ffff_8100_0001);
        assert_eq!(events.exception.injected, 1);
        assert_eq!(events.exception.nr, BP_VECTOR);
        assert_eq!(events.exception.has_error_code, 0);
        assert_eq!(events.exception.error_code, 0);
    }

    #[test]
    fn int3_at_the_top_of_the_address_space_wraps() {
        // `rip += 1` panicked here in a debug build: a guest could end the
        // VMM with an INT3 at RIP 2^64-1.
        let mut regs = kvm_regs {
            rip: u64::MAX,
            ..Default::default()
        };
        let mut events = kvm_vcpu_events::default();
        complete_int3(&mut regs, &mut events);
        assert_eq!(regs.rip, 0);
        assert_eq!(events.exception.nr, BP_VECTOR);
    }
}
