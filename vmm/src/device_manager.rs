// SPDX-License-Identifier: Apache-2.0
//! Device placement and the exit buses.
//!
//! The device manager decides where the legacy devices live (port ranges,
//! IRQ lines), holds the [`Registry`] of the virtio devices (which places
//! each in its MMIO window and wires it into KVM), and dispatches vCPU port
//! and MMIO exits to them. It holds no device logic.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arch::x86_64::layout;
use devices::legacy::i8042::I8042;
use devices::legacy::serial::SerialDevice;
use kvm_ioctls::VmFd;

use crate::guest_panic::{pvpanic_word, PanicRegister};
use crate::kvm::vcpu::ExitBus;
use crate::metrics::VcpuExits;
use crate::registry::{lock, Registry};

/// COM1: the port range and ISA IRQ every PC OS expects.
const SERIAL_PORT: u16 = 0x3f8;
const SERIAL_PORT_LEN: u16 = 8;
const SERIAL_IRQ: u32 = 4;
/// The i8042 data and command/status ports.
const I8042_DATA_PORT: u16 = 0x60;
const I8042_CMD_PORT: u16 = 0x64;
/// The keyboard's ISA IRQ.
const I8042_KBD_IRQ: u32 = 1;

/// Errors wiring devices.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The serial port could not be created.
    #[error("cannot create the serial port")]
    Serial(#[source] devices::legacy::serial::SerialError),
    /// The i8042 could not be created.
    #[error("cannot create the i8042 controller")]
    I8042(#[source] devices::legacy::i8042::I8042Error),
    /// KVM refused an irqfd.
    #[error("cannot register irqfd for IRQ {0}")]
    Irqfd(u32, #[source] kvm_ioctls::Error),
}

/// All devices of a VM and the buses that reach them.
#[derive(Default)]
pub struct DeviceManager {
    serial: Option<Arc<Mutex<SerialDevice>>>,
    i8042: Option<Arc<Mutex<I8042>>>,
    pvpanic: Option<PanicRegister>,
    virtio: Registry,
    cmdline_words: Vec<String>,
    exits: Arc<VcpuExits>,
    /// Set by `--boot-timer`: when minivmm started.
    boot_timer: std::sync::OnceLock<std::time::Instant>,
    boot_logged: AtomicBool,
}

impl DeviceManager {
    /// An empty device manager.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts a 16550A-compatible UART at COM1 with IRQ 4, writing to `out`.
    pub fn attach_serial(
        &mut self,
        vm: &VmFd,
        out: Box<dyn Write + Send>,
    ) -> Result<Arc<Mutex<SerialDevice>>, DeviceError> {
        let serial = SerialDevice::new(out).map_err(DeviceError::Serial)?;
        vm.register_irqfd(serial.irq_evt(), SERIAL_IRQ)
            .map_err(|e| DeviceError::Irqfd(SERIAL_IRQ, e))?;
        let serial = Arc::new(Mutex::new(serial));
        self.serial = Some(serial.clone());
        Ok(serial)
    }

    /// Puts the i8042 at ports 0x60/0x64 with the keyboard on IRQ 1; its
    /// reset `EventFd` ends the VM.
    pub fn attach_i8042(&mut self, vm: &VmFd) -> Result<Arc<Mutex<I8042>>, DeviceError> {
        let i8042 = I8042::new().map_err(DeviceError::I8042)?;
        vm.register_irqfd(i8042.kbd_interrupt_evt(), I8042_KBD_IRQ)
            .map_err(|e| DeviceError::Irqfd(I8042_KBD_IRQ, e))?;
        let dev = Arc::new(Mutex::new(i8042));
        self.i8042 = Some(dev.clone());
        Ok(dev)
    }

    /// Puts the pvpanic register at [`layout::PVPANIC_ADDR`] and announces
    /// it on the kernel command line; the guest kernel's panic report
    /// through it sets `panicked`.
    pub fn attach_pvpanic(&mut self, panicked: Arc<AtomicBool>) {
        self.pvpanic = Some(PanicRegister::new(panicked));
        self.cmdline_words.push(pvpanic_word());
    }

    fn pvpanic_at(&self, addr: u64) -> Option<&PanicRegister> {
        self.pvpanic.as_ref().filter(|r| r.contains(addr))
    }

    /// The virtio devices.
    pub fn virtio(&self) -> &Registry {
        &self.virtio
    }

    /// The virtio devices, to attach one.
    pub fn virtio_mut(&mut self) -> &mut Registry {
        &mut self.virtio
    }

    /// Kernel command-line words: where each virtio device is, then those
    /// of the other devices (the pvpanic and boot-timer registers).
    pub fn cmdline_words(&self) -> Vec<String> {
        self.virtio
            .cmdline_words()
            .chain(self.cmdline_words.iter().cloned())
            .collect()
    }

    /// Logs, once, the time from `start` to the guest's one-byte write of
    /// [`layout::BOOT_COMPLETE`] to [`layout::BOOT_TIMER_ADDR`]
    /// (`--boot-timer`), and announces the register on the kernel command
    /// line (`minivmm.boot_timer=0xc0000000`) so that the project's init writes it only
    /// when something listens. Without it the register ignores writes.
    pub fn enable_boot_timer(&mut self, start: std::time::Instant) {
        if self.boot_timer.set(start).is_ok() {
            self.cmdline_words.push(boot_timer_word());
        }
    }

    /// A write to the boot-timer register; returns the line it logged.
    fn boot_timer_write(&self, data: &[u8]) -> Option<String> {
        let start = self.boot_timer.get()?;
        // Firecracker's device takes only a one-byte write of the value; a
        // wider store that merely begins with it is something else.
        if data != [layout::BOOT_COMPLETE] || self.boot_logged.swap(true, Ordering::SeqCst) {
            return None;
        }
        let line = boot_time_line(start.elapsed(), crate::process_cpu_us());
        log::info!(target: crate::event_loop::LOG_TARGET, "{line}");
        Some(line)
    }

    /// The vCPU exit counters the exit bus keeps.
    pub fn vcpu_exits(&self) -> Arc<VcpuExits> {
        self.exits.clone()
    }
}

/// The kernel command-line word naming the boot-timer register, added with
/// `--boot-timer` (the init of `resources/` reads it).
fn boot_timer_word() -> String {
    format!("minivmm.boot_timer={:#x}", layout::BOOT_TIMER_ADDR)
}

/// Firecracker's boot-time line, word for word, so that what parses its
/// logs parses ours: the wall time since start, then the process's CPU
/// time until then.
fn boot_time_line(wall: std::time::Duration, cpu_us: u64) -> String {
    let us = wall.as_micros();
    format!(
        "Guest-boot-time = {us:>6} us {} ms, {cpu_us:>6} CPU us {} CPU ms",
        us / 1000,
        cpu_us / 1000
    )
}

fn count(c: &std::sync::atomic::AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl DeviceManager {
    /// One `in` of `data.len()` bytes at `port`. A 2- or 4-byte access goes
    /// to the device owning its first port, which serves the following bytes
    /// from its next registers (see devices::legacy for the x86 bus
    /// semantics).
    fn port_read(&self, port: u16, data: &mut [u8]) {
        match port {
            p if (SERIAL_PORT..SERIAL_PORT + SERIAL_PORT_LEN).contains(&p) => {
                if let Some(s) = &self.serial {
                    return lock(s).pio_read(p - SERIAL_PORT, data);
                }
            }
            I8042_DATA_PORT | I8042_CMD_PORT => {
                if let Some(d) = &self.i8042 {
                    return lock(d).pio_read(port - I8042_DATA_PORT, data);
                }
            }
            _ => {}
        }
        // Unclaimed ports float high on a PC bus.
        data.fill(0xff);
    }

    /// One `out` of `data.len()` bytes at `port`, as [`Self::port_read`].
    fn port_write(&self, port: u16, data: &[u8]) {
        match port {
            p if (SERIAL_PORT..SERIAL_PORT + SERIAL_PORT_LEN).contains(&p) => {
                if let Some(s) = &self.serial {
                    lock(s).pio_write(p - SERIAL_PORT, data);
                }
            }
            I8042_DATA_PORT | I8042_CMD_PORT => {
                if let Some(d) = &self.i8042 {
                    lock(d).pio_write(port - I8042_DATA_PORT, data);
                }
            }
            _ => {}
        }
    }
}

impl ExitBus for DeviceManager {
    // A string instruction (`rep outsb`) is one exit of many accesses, all
    // to the same port: each is one access there, never bytes spread over
    // the following ports.
    fn pio_read(&self, port: u16, size: usize, data: &mut [u8]) {
        count(&self.exits.io_in);
        for access in data.chunks_mut(size.max(1)) {
            self.port_read(port, access);
        }
    }

    fn pio_write(&self, port: u16, size: usize, data: &[u8]) {
        count(&self.exits.io_out);
        for access in data.chunks(size.max(1)) {
            self.port_write(port, access);
        }
    }

    fn mmio_read(&self, addr: u64, data: &mut [u8]) {
        count(&self.exits.mmio_read);
        if let Some(reg) = self.pvpanic_at(addr) {
            return reg.read(addr, data);
        }
        match self.virtio.at(addr) {
            Some((slot, offset)) => lock(&slot.transport).read(offset, data),
            None => data.fill(0xff),
        }
    }

    fn mmio_write(&self, addr: u64, data: &[u8]) {
        count(&self.exits.mmio_write);
        if addr == layout::BOOT_TIMER_ADDR {
            self.boot_timer_write(data);
            return;
        }
        if let Some(reg) = self.pvpanic_at(addr) {
            reg.write(addr, data);
            return;
        }
        if let Some((slot, offset)) = self.virtio.at(addr) {
            lock(&slot.transport).write(offset, data);
        }
    }
}

impl crate::snapshot::create::VirtioSlots for DeviceManager {
    fn virtio_slots(&self) -> &[crate::registry::VirtioSlot] {
        self.virtio().slots()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A device manager with COM1 only, and what COM1 transmits.
    fn with_serial() -> (DeviceManager, Shared) {
        let out = Shared::default();
        let mut dm = DeviceManager::new();
        dm.serial = Some(Arc::new(Mutex::new(
            SerialDevice::new(Box::new(out.clone())).unwrap(),
        )));
        (dm, out)
    }

    #[test]
    fn unclaimed_ports_and_addresses_read_all_ones() {
        let dm = DeviceManager::new();
        let mut b = [0u8; 2];
        dm.pio_read(0x80, 2, &mut b);
        assert_eq!(b, [0xff, 0xff]);
        let mut w = [0u8; 4];
        dm.mmio_read(0xd000_0000, &mut w);
        assert_eq!(w, [0xff; 4]);
        // Writes to nothing are ignored rather than fatal.
        dm.pio_write(0x3f8, 1, b"x");
        dm.mmio_write(0xd000_0070, &[0; 4]);
        // Every exit is counted by kind.
        let e = dm.vcpu_exits();
        let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(
            (n(&e.io_in), n(&e.io_out), n(&e.mmio_read), n(&e.mmio_write)),
            (1, 1, 1, 1)
        );
    }

    #[test]
    fn a_wide_port_access_reaches_every_byte() {
        let (dm, out) = with_serial();
        // `out 0x3f8, ax`: 'A' to THR, then 0x0f (every interrupt) to IER.
        dm.pio_write(0x3f8, 2, &[b'A', 0x0f]);
        let mut ier = [0u8; 2];
        dm.pio_read(0x3f9, 2, &mut ier);
        assert_eq!(ier[0], 0x0f);
        assert_eq!(out.0.lock().unwrap().as_slice(), b"A");
        // `in ax, 0x3ff`: scratch, then a port nobody decodes.
        dm.pio_write(0x3ff, 1, &[0x42]);
        let mut w = [0u8; 2];
        dm.pio_read(0x3ff, 2, &mut w);
        assert_eq!(w, [0x42, 0xff]);
    }

    #[test]
    fn a_string_port_access_goes_to_one_port() {
        let (dm, out) = with_serial();
        // `rep outsb` of eight bytes to THR: eight characters transmitted,
        // nothing written to IER, FCR, LCR, MCR or the scratch register.
        let regs = |dm: &DeviceManager| {
            [0x3f9, 0x3fb, 0x3fc, 0x3ff].map(|port| {
                let mut r = [0u8; 1];
                dm.pio_read(port, 1, &mut r);
                r[0]
            })
        };
        let before = regs(&dm);
        dm.pio_write(0x3f8, 1, b"\x0f\x07\x80\x1fabc\x42");
        assert_eq!(out.0.lock().unwrap().as_slice(), b"\x0f\x07\x80\x1fabc\x42");
        assert_eq!(regs(&dm), before, "IER, LCR, MCR or scratch was written");
        // `rep insb` from LSR: every access reads LSR (THR empty, idle),
        // not the MSR and scratch register after it.
        let mut lsr = [0u8; 3];
        dm.pio_read(0x3fd, 1, &mut lsr);
        assert_eq!(lsr[0], lsr[1]);
        assert_eq!(lsr[1], lsr[2]);
        assert_ne!(lsr[0] & 0x60, 0, "LSR reports an empty transmitter");
        // One exit each, however many accesses.
        let e = dm.vcpu_exits();
        assert_eq!(e.io_out.load(Ordering::Relaxed), 1);
        assert_eq!(e.io_in.load(Ordering::Relaxed), 9);
    }

    #[test]
    fn a_string_write_to_the_i8042_data_port_cannot_reach_its_command_port() {
        let mut dm = DeviceManager::new();
        let i8042 = Arc::new(Mutex::new(I8042::new().unwrap()));
        dm.i8042 = Some(i8042.clone());
        // Five bytes to 0x60, the last 0xfe (the reset command, were it
        // written to 0x64).
        dm.pio_write(0x60, 1, &[0, 0, 0, 0, 0xfe]);
        assert!(i8042.lock().unwrap().reset_evt().read().is_err(), "reset");
        // The same byte as a command does reset.
        dm.pio_write(0x64, 1, &[0xfe]);
        assert_eq!(i8042.lock().unwrap().reset_evt().read().unwrap(), 1);
    }

    #[test]
    fn the_boot_timer_logs_once_and_only_when_enabled_and_told() {
        let mut dm = DeviceManager::new();
        // Off: a write is ignored (and reaches no device), and the command
        // line announces nothing.
        dm.mmio_write(layout::BOOT_TIMER_ADDR, &[layout::BOOT_COMPLETE]);
        assert!(!dm.boot_logged.load(Ordering::SeqCst));
        assert_eq!(dm.boot_timer_write(&[layout::BOOT_COMPLETE]), None);
        assert!(dm.cmdline_words().is_empty());
        dm.enable_boot_timer(std::time::Instant::now());
        dm.enable_boot_timer(std::time::Instant::now());
        assert_eq!(dm.cmdline_words(), ["minivmm.boot_timer=0xc0000000"]);
        dm.mmio_write(layout::BOOT_TIMER_ADDR, &[7]);
        assert!(!dm.boot_logged.load(Ordering::SeqCst));
        dm.mmio_write(layout::BOOT_TIMER_ADDR + 1, &[layout::BOOT_COMPLETE]);
        assert!(!dm.boot_logged.load(Ordering::SeqCst));
        // Firecracker's width: one byte, not a wider store starting with it.
        dm.mmio_write(layout::BOOT_TIMER_ADDR, &[layout::BOOT_COMPLETE, 0, 0, 0]);
        assert!(!dm.boot_logged.load(Ordering::SeqCst));
        dm.mmio_write(layout::BOOT_TIMER_ADDR, &[layout::BOOT_COMPLETE]);
        assert!(dm.boot_logged.load(Ordering::SeqCst));
        // Once: a second boot-complete write logs nothing.
        assert_eq!(dm.boot_timer_write(&[layout::BOOT_COMPLETE]), None);
        assert_eq!(dm.vcpu_exits().mmio_write.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn the_pvpanic_register_is_on_the_bus_and_announced() {
        let mut dm = DeviceManager::new();
        let at = layout::PVPANIC_ADDR;
        // Not attached: the address is nobody's.
        let mut b = [0u8; 1];
        dm.mmio_read(at, &mut b);
        assert_eq!(b, [0xff]);
        let panicked = Arc::new(AtomicBool::new(false));
        dm.attach_pvpanic(panicked.clone());
        assert_eq!(dm.cmdline_words(), ["pvpanic_mmio.device=1@0xc0001000"]);
        dm.mmio_read(at, &mut b);
        assert_eq!(b, [0b11]);
        // The byte after the register is not its, nor is a virtio window.
        dm.mmio_write(at + 1, &[1]);
        dm.mmio_write(layout::VIRTIO_MMIO_BASE, &[1]);
        assert!(!panicked.load(Ordering::SeqCst));
        dm.mmio_write(at, &[1]);
        assert!(panicked.load(Ordering::SeqCst));
        let e = dm.vcpu_exits();
        assert_eq!(e.mmio_read.load(Ordering::Relaxed), 2);
        assert_eq!(e.mmio_write.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn the_boot_time_counts_from_start() {
        let mut dm = DeviceManager::new();
        let start = std::time::Instant::now() - std::time::Duration::from_secs(2);
        dm.enable_boot_timer(start);
        let line = dm.boot_timer_write(&[layout::BOOT_COMPLETE]).unwrap();
        let us: u64 = line
            .strip_prefix("Guest-boot-time = ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!((2_000_000..60_000_000).contains(&us), "{line}");
    }

    #[test]
    fn the_boot_time_line_is_firecrackers() {
        let wall = std::time::Duration::from_micros(1_234_567);
        assert_eq!(
            boot_time_line(wall, 45_678),
            "Guest-boot-time = 1234567 us 1234 ms,  45678 CPU us 45 CPU ms"
        );
        assert_eq!(
            boot_time_line(std::time::Duration::from_micros(999), 5),
            "Guest-boot-time =    999 us 0 ms,      5 CPU us 0 CPU ms"
        );
    }

    #[test]
    fn the_i8042_keyboard_interrupt_is_irq_1() {
        let Some((_kvm, vm, _mem)) = crate::builder::test_vm(32) else {
            return;
        };
        let mut dm = DeviceManager::new();
        let i8042 = dm.attach_i8042(&vm).unwrap();
        let dev = i8042.lock().unwrap();
        // KVM refuses an eventfd that already is an irqfd: it was wired.
        assert!(vm
            .register_irqfd(dev.kbd_interrupt_evt(), I8042_KBD_IRQ)
            .is_err());
    }
}
