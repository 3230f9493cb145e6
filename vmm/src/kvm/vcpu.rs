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

use crate::kvm::pause::PauseGate;
use crate::kvm::pvm;
use crate::kvm::state::VcpuStateSlots;
use crate::kvm::vm_exit::{ExitLatch, VmExit};

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
    pause: Arc<PauseGate>,
    /// Where this vCPU puts its state when a snapshot asks.
    states: Option<Arc<VcpuStateSlots>>,
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
            pause: Arc::new(PauseGate::new()),
            states: None,
        }
    }

    /// Whether this vCPU recovers the PVM host's INT3 emulation failures
    /// (which takes calls its seccomp filter allows only then).
    pub fn recovers_int3(&self) -> bool {
        self.recover_int3
    }

    /// Makes this vCPU honour `gate`'s pause requests (shared by all vCPUs
    /// of the VM).
    pub fn set_pause_gate(&mut self, gate: Arc<PauseGate>) {
        self.pause = gate;
    }

    /// Has this vCPU put its state into `slots` when a snapshot asks
    /// while it is parked.
    pub fn set_state_slots(&mut self, slots: Arc<VcpuStateSlots>) {
        self.states = Some(slots);
    }

    /// This vCPU's index (and APIC id).
    pub fn id(&self) -> u8 {
        self.id
    }

    /// The vCPU's KVM descriptor, for reading and writing its state.
    pub fn fd(&self) -> &VcpuFd {
        &self.fd
    }

    /// The vCPU's KVM descriptor, for a test that drives it by hand.
    #[cfg(test)]
    pub fn into_fd(self) -> VcpuFd {
        self.fd
    }

    /// Applies CPUID, MSRs, FPU and LAPIC LINT setup; the boot vCPU also gets
    /// the long-mode registers pointing at the kernel entry.
    pub fn configure(
        &self,
        base_cpuid: &CpuId,
        (nr_vcpus, smt): (u8, bool),
        mem: &vm_memory::GuestMemoryMmap<()>,
        boot: Option<(u64, u64)>,
    ) -> Result<(), VcpuError> {
        let id = self.id;
        let mut cpuid = base_cpuid.clone();
        arch::x86_64::filter_cpuid(&mut cpuid, id, nr_vcpus, smt);
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
            // Between two runs, never inside one: a paused vCPU is wholly
            // out of the guest, with no exit half served, and its state
            // read there is whole.
            if self.pause.is_paused() {
                let (fd, id) = (&self.fd, self.id);
                let states = self.states.as_deref();
                self.pause.check_with(|| {
                    if let Some(s) = states {
                        s.save(id, fd);
                    }
                });
            }
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
                Err(e) => match e.errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => {
                        // An AP still waiting for INIT/SIPI (seen on a PVM
                        // host, where KVM_RUN returns instead of blocking):
                        // back off briefly rather than spin a core the BSP
                        // needs.
                        std::thread::sleep(AP_WAIT_BACKOFF);
                        continue;
                    }
                    _ => return VmExit::Fault(format!("KVM_RUN failed on vCPU {}: {e}", self.id)),
                },
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

    /// Hand-assembled guest code run on this host's KVM through `configure`
    /// and `run`, as the builder sets a vCPU up: what these check is what
    /// only a real KVM_RUN shows (the access size of a port exit, the end of
    /// the run reaching the latch, the INT3 recovery of a PVM host).
    mod on_kvm {
        use super::*;
        use std::time::{Duration, Instant};

        use arch::x86_64::layout::ZERO_PAGE_START;
        use arch::x86_64::regs::{EFER_LMA, EFER_LME, X86_CR0_PE, X86_CR0_PG, X86_CR4_PAE};
        use kvm_bindings::{kvm_msr_entry, KVM_MAX_CPUID_ENTRIES};
        use kvm_ioctls::{Kvm, VmFd};
        use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

        use crate::builder;

        /// Where the guest code starts: a free page of the 2 MiB test VM,
        /// above the boot structures `arch` writes.
        const ENTRY: u64 = 0x1_0000;
        /// What `rep outsb` sends.
        const OUT_BUF: u64 = 0x1_1000;
        /// Where `rep insb` stores.
        const IN_BUF: u64 = 0x1_2000;
        /// The INT3 test's IDT, with a gate for vectors 0 to 3 only.
        const IDT: u64 = 0x1_3000;
        /// Its #BP handler.
        const BP_HANDLER: u64 = 0x1_0800;
        /// The UART's data port, the guest's usual port.
        const COM1: u16 = 0x3f8;
        /// Far above what the few instructions take even emulated (about
        /// 2 million a second on a PVM host).
        const DEADLINE: Duration = Duration::from_secs(30);
        /// What the bus answers to every `in`.
        const IN_BYTE: u8 = 0x5a;

        /// `mov dx, 0x3f8`.
        const MOV_DX_COM1: [u8; 4] = [0x66, 0xba, 0xf8, 0x03];
        /// `ud2`: with no IDT gate for #UD, #GP or #DF this is a triple fault.
        const UD2: [u8; 2] = [0x0f, 0x0b];

        /// One exit as the bus saw it.
        #[derive(Debug, Clone, PartialEq, Eq)]
        enum Access {
            In {
                port: u16,
                size: usize,
                len: usize,
            },
            Out {
                port: u16,
                size: usize,
                data: Vec<u8>,
            },
        }

        #[derive(Default)]
        struct Recorder(Mutex<Vec<Access>>);

        impl Recorder {
            fn accesses(&self) -> Vec<Access> {
                self.0.lock().unwrap().clone()
            }
        }

        impl ExitBus for Recorder {
            fn pio_read(&self, port: u16, size: usize, data: &mut [u8]) {
                data.fill(IN_BYTE);
                let len = data.len();
                self.0.lock().unwrap().push(Access::In { port, size, len });
            }
            fn pio_write(&self, port: u16, size: usize, data: &[u8]) {
                let data = data.to_vec();
                self.0
                    .lock()
                    .unwrap()
                    .push(Access::Out { port, size, data });
            }
            fn mmio_read(&self, addr: u64, _data: &mut [u8]) {
                panic!("unexpected MMIO read at {addr:#x}");
            }
            fn mmio_write(&self, addr: u64, _data: &[u8]) {
                panic!("unexpected MMIO write at {addr:#x}");
            }
        }

        /// A VM as the builder makes it, or `None` (with the SKIP line)
        /// where this host has no KVM.
        fn test_vm() -> Option<(Kvm, VmFd, GuestMemoryMmap)> {
            builder::test_vm(2)
        }

        fn is_pvm() -> bool {
            let pvm = pvm::is_pvm_host();
            if !pvm {
                minivmm_tests::print_skip("not a PVM host (INT3 never fails emulation here)");
            }
            pvm
        }

        /// vCPU `id` of `nr_vcpus`, configured as the builder does; the BSP
        /// (`id` 0) starts at [`ENTRY`], where `code` is.
        fn vcpu(
            (kvm, vm, mem): &(Kvm, VmFd, GuestMemoryMmap),
            id: u8,
            nr_vcpus: u8,
            code: &[u8],
            bus: Arc<Recorder>,
            recover_int3: bool,
        ) -> Vcpu {
            mem.write_slice(code, GuestAddress(ENTRY)).unwrap();
            let cpuid = kvm.get_supported_cpuid(KVM_MAX_CPUID_ENTRIES).unwrap();
            let fd = vm.create_vcpu(u64::from(id)).unwrap();
            let vcpu = Vcpu::new(fd, id, bus, recover_int3);
            let boot = (id == 0).then_some((ENTRY, ZERO_PAGE_START));
            vcpu.configure(&cpuid, (nr_vcpus, false), mem, boot)
                .unwrap();
            vcpu
        }

        /// Runs `vcpu` on its own thread, as the VMM does, and returns the
        /// reason it reported; fails (rather than hangs) past [`DEADLINE`].
        fn run_to_end(vcpu: Vcpu) -> VmExit {
            let (exit, thread) = spawn_run(vcpu);
            wait_for_end(&exit, thread, Instant::now())
        }

        /// `vcpu.run` on a thread of its own, reporting to the latch returned.
        fn spawn_run(vcpu: Vcpu) -> (ExitLatch, std::thread::JoinHandle<()>) {
            let exit = ExitLatch::new().unwrap();
            let latch = exit.clone();
            (exit, std::thread::spawn(move || vcpu.run(latch)))
        }

        /// The reason the vCPU on `thread` reports to `exit`; fails if it
        /// stops without one, or if none came [`DEADLINE`] after `start`.
        fn wait_for_end(
            exit: &ExitLatch,
            thread: std::thread::JoinHandle<()>,
            start: Instant,
        ) -> VmExit {
            loop {
                if let Some(reason) = exit.reason() {
                    thread.join().unwrap();
                    return reason;
                }
                assert!(
                    !thread.is_finished(),
                    "the vCPU stopped without reporting why"
                );
                // A stuck guest keeps its thread busy until the test binary
                // ends; the failure is reported now.
                assert!(
                    start.elapsed() < DEADLINE,
                    "the guest did not end in {DEADLINE:?}"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        fn assert_triple_fault(reason: &VmExit) {
            assert!(
                matches!(reason, VmExit::Fault(m) if m.contains("triple fault")),
                "{reason:?}"
            );
        }

        #[test]
        fn port_io_reaches_the_bus_access_by_access_and_a_triple_fault_ends_the_run() {
            let Some(vm) = test_vm() else {
                return;
            };
            let mut code = Vec::new();
            code.extend(MOV_DX_COM1);
            code.extend([0xb0, b'A', 0xee]); // mov al, 'A'; out dx, al
            code.extend([0xbe, 0x00, 0x10, 0x01, 0x00]); // mov esi, OUT_BUF
            code.extend([0xb9, 0x08, 0x00, 0x00, 0x00]); // mov ecx, 8
            code.extend([0xf3, 0x6e]); // rep outsb
            code.extend([0x66, 0xb8, 0x41, 0x42, 0x66, 0xef]); // mov ax, 0x4241; out dx, ax
            code.extend([0xbf, 0x00, 0x20, 0x01, 0x00]); // mov edi, IN_BUF
            code.extend([0xb9, 0x08, 0x00, 0x00, 0x00]); // mov ecx, 8
            code.extend([0xf3, 0x6c]); // rep insb
            code.extend(UD2);
            vm.2.write_slice(b"minivmm!", GuestAddress(OUT_BUF))
                .unwrap();
            let bus = Arc::new(Recorder::default());
            let reason = run_to_end(vcpu(&vm, 0, 1, &code, bus.clone(), false));
            assert_triple_fault(&reason);

            let accesses = bus.accesses();
            assert_eq!(
                accesses.first(),
                Some(&Access::Out {
                    port: COM1,
                    size: 1,
                    data: b"A".to_vec()
                }),
                "{accesses:?}"
            );
            // `rep outsb`: however KVM groups them into exits, eight
            // 1-byte accesses, the buffer in order.
            let mut sent = Vec::new();
            let mut rest = &accesses[1..];
            while let Some((
                Access::Out {
                    port: COM1,
                    size: 1,
                    data,
                },
                tail,
            )) = rest.split_first()
            {
                sent.extend_from_slice(data);
                rest = tail;
            }
            assert_eq!(sent, b"minivmm!", "{accesses:?}");
            // The word is one 2-byte access, not two bytes.
            assert_eq!(
                rest.first(),
                Some(&Access::Out {
                    port: COM1,
                    size: 2,
                    data: vec![0x41, 0x42]
                }),
                "{accesses:?}"
            );
            // `rep insb`: 1-byte accesses filling the buffer (KVM batches
            // string input into one exit, so here the size is not simply
            // the exit's length).
            let ins = &rest[1..];
            let mut received = 0;
            for access in ins {
                match access {
                    Access::In {
                        port: COM1,
                        size: 1,
                        len,
                    } => received += len,
                    other => panic!("unexpected {other:?} in {accesses:?}"),
                }
            }
            assert_eq!(received, 8, "{accesses:?}");
            let mut buf = [0u8; 8];
            vm.2.read_slice(&mut buf, GuestAddress(IN_BUF)).unwrap();
            assert_eq!(buf, [IN_BYTE; 8]);
        }

        /// Reads back `entries`' MSRs from `fd`.
        fn read_msrs(fd: &VcpuFd, entries: &[kvm_msr_entry]) -> Vec<(u32, u64)> {
            let wanted: Vec<kvm_msr_entry> = entries
                .iter()
                .map(|e| kvm_msr_entry {
                    index: e.index,
                    ..Default::default()
                })
                .collect();
            let mut msrs = Msrs::from_entries(&wanted).unwrap();
            assert_eq!(fd.get_msrs(&mut msrs).unwrap(), entries.len());
            msrs.as_slice().iter().map(|e| (e.index, e.data)).collect()
        }

        /// The initial APIC id CPUID leaf 1 reports (EBX bits 31:24).
        fn cpuid_apic_id(fd: &VcpuFd) -> u32 {
            let cpuid = fd.get_cpuid2(KVM_MAX_CPUID_ENTRIES).unwrap();
            let leaf1 = cpuid.as_slice().iter().find(|e| e.function == 1).unwrap();
            leaf1.ebx >> 24
        }

        #[test]
        fn configure_puts_the_bsp_in_long_mode_at_the_entry_and_sets_every_vcpu_s_msrs() {
            let Some(vm) = test_vm() else {
                return;
            };
            let bus = Arc::new(Recorder::default());
            let bsp = vcpu(&vm, 0, 4, &UD2, bus.clone(), false);
            let regs = bsp.fd.get_regs().unwrap();
            assert_eq!(regs.rip, ENTRY);
            assert_eq!(regs.rsi, ZERO_PAGE_START);
            let sregs = bsp.fd.get_sregs().unwrap();
            assert_eq!(sregs.efer & (EFER_LME | EFER_LMA), EFER_LME | EFER_LMA);
            assert_eq!(
                sregs.cr0 & (X86_CR0_PG | X86_CR0_PE),
                X86_CR0_PG | X86_CR0_PE
            );
            assert_ne!(sregs.cr4 & X86_CR4_PAE, 0);
            assert_eq!(sregs.cs.l, 1, "64-bit code segment");

            // An AP: its own id everywhere, MSRs and CPUID set, and no boot
            // registers (it waits for INIT/SIPI at the reset vector).
            let ap = vcpu(&vm, 3, 4, &UD2, bus, false);
            assert_eq!(ap.id(), 3);
            assert_eq!(bsp.id(), 0);
            assert_eq!(cpuid_apic_id(&ap.fd), 3);
            assert_eq!(cpuid_apic_id(&bsp.fd), 0);
            assert_ne!(ap.fd.get_regs().unwrap().rip, ENTRY);

            let entries = arch::x86_64::boot_msr_entries();
            for fd in [&bsp.fd, &ap.fd] {
                for (index, data) in read_msrs(fd, &entries) {
                    // The TSC has run on since it was set to 0.
                    if index == arch::x86_64::msr::MSR_IA32_TSC {
                        continue;
                    }
                    let set = entries.iter().find(|e| e.index == index).unwrap();
                    assert_eq!(data, set.data, "MSR {index:#x}");
                }
            }
        }

        /// Guest code for the INT3 tests and the IDT it needs: a #BP handler
        /// that sends 'B' and returns; the main code sends 'C' after the
        /// INT3, then ends in a triple fault.
        fn int3_guest(vm: &(Kvm, VmFd, GuestMemoryMmap), vcpu: &Vcpu, first: &[u8]) {
            let mem = &vm.2;
            let mut handler = MOV_DX_COM1.to_vec();
            handler.extend([0xb0, b'B', 0xee, 0x48, 0xcf]); // mov al, 'B'; out dx, al; iretq
            mem.write_slice(&handler, GuestAddress(BP_HANDLER)).unwrap();
            // A 64-bit interrupt gate (type 0xe, present, DPL 0) through the
            // boot code segment 0x08 (Intel SDM vol. 3, 6.14.1).
            let gate_lo = (BP_HANDLER & 0xffff)
                | (0x08 << 16)
                | (0x8e00 << 32)
                | (((BP_HANDLER >> 16) & 0xffff) << 48);
            let gate_hi = BP_HANDLER >> 32;
            let gate = IDT + 16 * u64::from(BP_VECTOR);
            mem.write_obj(gate_lo, GuestAddress(gate)).unwrap();
            mem.write_obj(gate_hi, GuestAddress(gate + 8)).unwrap();
            let mut sregs = vcpu.fd.get_sregs().unwrap();
            sregs.idt.base = IDT;
            sregs.idt.limit = 16 * 4 - 1;
            vcpu.fd.set_sregs(&sregs).unwrap();

            let mut code = first.to_vec();
            code.extend(MOV_DX_COM1);
            code.extend([0xb0, b'C', 0xee]); // mov al, 'C'; out dx, al
            code.extend(UD2);
            mem.write_slice(&code, GuestAddress(ENTRY)).unwrap();
        }

        fn sent(bus: &Recorder) -> Vec<u8> {
            bus.accesses()
                .into_iter()
                .flat_map(|a| match a {
                    Access::Out { data, .. } => data,
                    Access::In { .. } => Vec::new(),
                })
                .collect()
        }

        /// On a PVM host only: runs the IDT guest whose code starts with
        /// `first` (an INT3, or another instruction the emulator fails) with
        /// INT3 recovery on or off, under the vCPU filter such a VM gets,
        /// and returns how the run ended and what reached the bus. `None`
        /// (after a printed SKIP) elsewhere.
        fn run_emulation_failure(
            first: &[u8],
            recover_int3: bool,
        ) -> Option<(VmExit, Arc<Recorder>)> {
            let vm = test_vm()?;
            if !is_pvm() {
                return None;
            }
            let bus = Arc::new(Recorder::default());
            let vcpu = vcpu(&vm, 0, 1, &[], bus.clone(), recover_int3);
            assert_eq!(vcpu.recovers_int3(), recover_int3);
            int3_guest(&vm, &vcpu, first);
            // Under the filter a VM with these vCPUs gets: the recovery's
            // calls are allowed only with the recovery on, so a recovery
            // that needed another call, or one run without it, would end
            // the test binary with 148.
            use crate::process::seccomp::{self, Filters, SeccompMode, Thread};
            seccomp::install_sigsys_handler().unwrap();
            let prog = Filters::new(SeccompMode::On)
                .unwrap()
                .for_vm(vcpu.recovers_int3())
                .unwrap()
                .vcpu;
            let exit = ExitLatch::new().unwrap();
            let latch = exit.clone();
            let thread = std::thread::spawn(move || {
                seccomp::apply(Thread::Vcpu, prog.as_ref()).unwrap();
                vcpu.run(latch)
            });
            Some((wait_for_end(&exit, thread, Instant::now()), bus))
        }

        #[test]
        fn int3_that_fails_emulation_reaches_the_guest_handler_when_recovering() {
            let Some((reason, bus)) = run_emulation_failure(&[0xcc], true) else {
                return;
            };
            assert_eq!(
                sent(&bus),
                b"BC",
                "the handler ran, then the code after INT3"
            );
            assert_triple_fault(&reason);
        }

        #[test]
        fn int3_that_fails_emulation_ends_the_vm_without_recovery() {
            let Some((reason, bus)) = run_emulation_failure(&[0xcc], false) else {
                return;
            };
            // KVM reports the bytes it fetched (here 15), the INT3 first.
            assert!(
                matches!(&reason, VmExit::Fault(m) if m.contains("failed emulation")
                    && m.contains(&format!("RIP {ENTRY:#x}")) && m.contains("bytes [cc,")),
                "{reason:?}"
            );
            assert!(sent(&bus).is_empty(), "{:?}", bus.accesses());
        }

        #[test]
        fn other_emulation_failures_end_the_vm_even_when_recovering_int3() {
            // popcnt eax, ecx: fails emulation at CPL0 on a PVM host.
            let Some((reason, bus)) = run_emulation_failure(&[0xf3, 0x0f, 0xb8, 0xc1], true) else {
                return;
            };
            assert!(
                matches!(&reason, VmExit::Fault(m) if m.contains("failed emulation")
                    && m.contains("bytes [f3, 0f, b8, c1,")),
                "{reason:?}"
            );
            assert!(sent(&bus).is_empty(), "{:?}", bus.accesses());
        }

        /// Where the polling guest looks for its go.
        const FLAG: u64 = 0x1_4000;

        /// A guest that spins until [`FLAG`] is non-zero, then triple
        /// faults: it stays in KVM_RUN for as long as the test wants.
        fn polling_guest() -> Vec<u8> {
            let mut code = vec![0x80, 0x3c, 0x25]; // cmp byte [FLAG], 0
            code.extend((FLAG as u32).to_le_bytes());
            code.push(0x00);
            code.extend([0x74, 0xf6]); // je back to the cmp
            code.extend(UD2);
            code
        }

        /// Runs `vcpu` until `poke` has run for a while, then releases the
        /// guest; returns why the run ended.
        fn run_poked(
            vcpu: Vcpu,
            mem: &GuestMemoryMmap,
            poke: impl Fn(&std::thread::JoinHandle<()>),
        ) -> VmExit {
            let (exit, thread) = spawn_run(vcpu);
            let start = Instant::now();
            while exit.reason().is_none() && start.elapsed() < Duration::from_millis(200) {
                poke(&thread);
                std::thread::sleep(Duration::from_millis(2));
            }
            mem.write_obj(1u8, GuestAddress(FLAG)).unwrap();
            wait_for_end(&exit, thread, start)
        }

        extern "C" fn ignore_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
        }

        #[test]
        fn a_signal_interrupting_kvm_run_does_not_end_the_vm() {
            use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};
            let Some(vm) = test_vm() else {
                return;
            };
            // A handler, not the default action (which ends the process)
            // nor a blocked signal (which never interrupts): as a VMM kicks
            // a vCPU out of the guest.
            let kick = SIGRTMIN() + 5;
            register_signal_handler(kick, ignore_signal).unwrap();
            let bus = Arc::new(Recorder::default());
            let vcpu = vcpu(&vm, 0, 1, &polling_guest(), bus, false);
            let reason = run_poked(vcpu, &vm.2, |thread| {
                // The thread may just have ended; then there is no one to kick.
                let _ = thread.kill(kick);
            });
            assert_triple_fault(&reason);
        }
    }
}
