// SPDX-License-Identifier: Apache-2.0
//! i8042 keyboard controller, kept only for its CPU reset line.
//!
//! Linux reboots an x86 PC by pulsing the reset line through the keyboard
//! controller (command 0xFE written to port 0x64). The VMM has no reboot: the
//! pulse signals [`I8042::reset_evt`], which the event loop watches to shut
//! the VMM down cleanly. The register logic is `vm_superio::I8042Device`,
//! which answers every read with 0 (no data, controller idle); a guest kernel
//! with the i8042 driver built in then gives up probing after its command
//! timeouts, so the kernel command line should carry
//! `i8042.noaux i8042.nomux i8042.nopnp i8042.dumbkbd` to keep boot short.

use std::io;

use vm_superio::I8042Device;
use vmm_sys_util::eventfd::EventFd;

use super::serial::EventFdTrigger;

/// Errors of the i8042 device. None is caused by the guest.
#[derive(Debug, thiserror::Error)]
pub enum I8042Error {
    /// The reset eventfd could not be created.
    #[error("failed to create the i8042 reset eventfd")]
    CreateEventFd(#[source] io::Error),
}

/// Offset of the data port (0x60) from the controller's base port.
pub const DATA_OFFSET: u16 = 0;
/// Offset of the command/status port (0x64) from the base port.
pub const COMMAND_OFFSET: u16 = 4;

/// The i8042 controller at ports 0x60 (offset 0, data) and 0x64 (offset 4,
/// command/status).
#[derive(Debug)]
pub struct I8042 {
    dev: I8042Device<EventFdTrigger>,
}

impl I8042 {
    /// Creates the controller with a fresh reset `EventFd`.
    pub fn new() -> Result<Self, I8042Error> {
        let trigger = EventFdTrigger::new().map_err(I8042Error::CreateEventFd)?;
        Ok(I8042 {
            dev: I8042Device::new(trigger),
        })
    }

    /// Signalled when the guest pulses the CPU reset line.
    pub fn reset_evt(&self) -> &EventFd {
        self.dev.reset_evt().evt()
    }

    /// Handles a guest read at `offset` from port 0x60.
    pub fn read(&mut self, offset: u8) -> u8 {
        self.dev.read(offset)
    }

    /// Handles a guest `in` of `data.len()` bytes at `offset` from port
    /// 0x60: byte `i` comes from port `0x60 + offset + i`, and the ports
    /// between and after the controller's two (0x61 to 0x63 belong to other
    /// devices) read 0xff.
    pub fn pio_read(&mut self, offset: u16, data: &mut [u8]) {
        super::split_read(offset, data, |off| match off {
            DATA_OFFSET | COMMAND_OFFSET => Some(self.read(off as u8)),
            _ => None,
        });
    }

    /// Handles a guest `out` of `data` at `offset` from port 0x60, byte by
    /// byte on consecutive ports; bytes on ports other than 0x60 and 0x64
    /// are dropped.
    pub fn pio_write(&mut self, offset: u16, data: &[u8]) {
        super::split_write(offset, data, |off, value| {
            if matches!(off, DATA_OFFSET | COMMAND_OFFSET) {
                self.write(off as u8, value);
            }
        });
    }

    /// Handles a guest write of `value` at `offset` from port 0x60.
    pub fn write(&mut self, offset: u8, value: u8) {
        // Failing to signal is a host problem (the eventfd counter cannot
        // realistically saturate); log it, the guest keeps running.
        if let Err(e) = self.dev.write(offset, value) {
            log::error!("i8042: failed to signal the reset event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_pulse_signals_the_reset_event() {
        let mut i = I8042::new().unwrap();
        i.write(4, 0xfe);
        assert_eq!(i.reset_evt().read().unwrap(), 1);
    }

    #[test]
    fn wide_accesses_reach_only_the_two_ports() {
        let mut i = I8042::new().unwrap();
        // `out 0x60, ax` with the reset command in AH lands on port 0x61,
        // which is not the controller's: no reset.
        i.pio_write(DATA_OFFSET, &[0x00, 0xfe]);
        assert!(i.reset_evt().read().is_err(), "reset signalled");
        // `out 0x64, ax`: the low byte is the command, the high byte falls
        // on port 0x65 and is dropped.
        i.pio_write(COMMAND_OFFSET, &[0xfe, 0x00]);
        assert_eq!(i.reset_evt().read().unwrap(), 1);
        let mut data = [0u8; 4];
        i.pio_read(DATA_OFFSET, &mut data);
        assert_eq!(data, [0, 0xff, 0xff, 0xff]);
        let mut status = [0u8; 2];
        i.pio_read(COMMAND_OFFSET, &mut status);
        assert_eq!(status, [0, 0xff]);
    }

    #[test]
    fn other_writes_do_not_signal() {
        let mut i = I8042::new().unwrap();
        // 0xFE on the data port, other commands on the command port.
        i.write(0, 0xfe);
        for cmd in [0x20, 0x60, 0xaa, 0xad, 0xd1, 0xff] {
            i.write(4, cmd);
        }
        assert!(i.reset_evt().read().is_err(), "reset signalled");
        assert_eq!(i.read(4), 0);
        assert_eq!(i.read(0), 0);
    }
}
