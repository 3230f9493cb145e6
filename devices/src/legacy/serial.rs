// SPDX-License-Identifier: Apache-2.0
//! 8250/16550A UART on the legacy COM1 ports (the guest console).
//!
//! The register logic is `vm_superio::Serial`; this module adds what the VMM
//! needs around it:
//! - [`EventFdTrigger`], the `Trigger` that signals an `EventFd` the VMM
//!   registers as a KVM irqfd for IRQ 4;
//! - an input queue in front of the UART's 64-byte receive FIFO, so the event
//!   loop can hand over whatever it read from stdin in one call. Bytes move
//!   into the FIFO only once the guest has drained it, which keeps the guest
//!   at one receive interrupt per FIFO-full instead of one per byte (that
//!   matters on a host where guest kernel code runs at ~2M instr/s);
//! - error handling that keeps guest-caused conditions away from the event
//!   loop: a failed write to the host output is logged, never returned.

use std::collections::VecDeque;
use std::io::{self, Write};

use serde::{Deserialize, Serialize};
use vm_superio::serial::{Error as UartError, NoEvents, SerialState};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::warn::warn_rate_limited;

/// Upper bound on host input waiting for FIFO room. Stdin can deliver more
/// than a guest that is not reading will ever consume; past this the caller
/// learns that bytes were dropped instead of the VMM growing without limit.
pub const MAX_PENDING_INPUT: usize = 64 * 1024;

/// Register offset of RBR/THR in the 16550 layout (with DLAB clear).
const DATA_OFFSET: u8 = 0;
/// The UART decodes eight consecutive ports (COM1: 0x3f8 to 0x3ff).
pub const SERIAL_PORT_LEN: u16 = 8;

/// Errors of the serial device. None is caused by the guest.
#[derive(Debug, thiserror::Error)]
pub enum SerialError {
    /// The interrupt eventfd could not be created.
    #[error("failed to create the serial interrupt eventfd")]
    CreateEventFd(#[source] io::Error),
    /// Host input arrived faster than the guest reads it.
    #[error("serial input queue full, {dropped} bytes dropped")]
    InputOverflow {
        /// Bytes that were not queued.
        dropped: usize,
    },
    /// Raising the interrupt failed.
    #[error("failed to raise the serial interrupt")]
    Trigger(#[source] io::Error),
    /// A saved receive FIFO longer than the UART's.
    #[error("the saved serial receive FIFO holds {0} bytes, more than the UART's")]
    RestoreFifo(usize),
}

/// A `vm_superio::Trigger` that writes to an `EventFd` (a KVM irqfd under the
/// VMM, a plain counter in tests).
#[derive(Debug)]
pub struct EventFdTrigger(EventFd);

impl EventFdTrigger {
    /// Creates a trigger with a fresh non-blocking `EventFd`.
    pub fn new() -> io::Result<Self> {
        Ok(EventFdTrigger(EventFd::new(libc::EFD_NONBLOCK)?))
    }

    /// The underlying `EventFd`.
    pub fn evt(&self) -> &EventFd {
        &self.0
    }
}

impl Trigger for EventFdTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// The guest console UART.
pub struct SerialDevice {
    uart: Serial<EventFdTrigger, NoEvents, Box<dyn Write + Send>>,
    /// Host input not yet in the UART's receive FIFO.
    pending: VecDeque<u8>,
    /// Capacity of the receive FIFO when empty.
    fifo_size: usize,
}

impl std::fmt::Debug for SerialDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialDevice")
            .field("pending", &self.pending.len())
            .finish_non_exhaustive()
    }
}

impl SerialDevice {
    /// Creates a UART whose transmitted bytes go to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Result<Self, SerialError> {
        let trigger = EventFdTrigger::new().map_err(SerialError::CreateEventFd)?;
        let uart = Serial::new(trigger, out);
        let fifo_size = uart.fifo_capacity();
        Ok(SerialDevice {
            uart,
            pending: VecDeque::new(),
            fifo_size,
        })
    }

    /// The interrupt `EventFd`; the VMM registers it as the irqfd of IRQ 4.
    pub fn irq_evt(&self) -> &EventFd {
        self.uart.interrupt_evt().evt()
    }

    /// Handles a guest read of the register at `offset` (0–7).
    pub fn read(&mut self, offset: u8) -> u8 {
        let value = self.uart.read(offset);
        if offset == DATA_OFFSET {
            // A read of RBR with DLAB set returns the divisor latch and does
            // not consume input; refilling an unchanged FIFO is a no-op then.
            if let Err(e) = self.refill_fifo() {
                log::error!("serial: {e}");
            }
        }
        value
    }

    /// Handles a guest write of `value` to the register at `offset` (0–7).
    pub fn write(&mut self, offset: u8, value: u8) {
        match self.uart.write(offset, value) {
            Ok(()) => {}
            // The byte is lost but the guest must not stall on a host-side
            // output problem (e.g. a closed stdout).
            Err(UartError::IOError(e)) => {
                warn_rate_limited!("serial: failed to write guest output: {e}")
            }
            Err(e) => log::error!("serial: {e}"),
        }
    }

    /// Handles a guest `in` of `data.len()` bytes at `offset` from the base
    /// port: byte `i` comes from register `offset + i`, and a byte past the
    /// last register reads 0xff (see [`super`] for why).
    pub fn pio_read(&mut self, offset: u16, data: &mut [u8]) {
        super::split_read(offset, data, |off| {
            u8::try_from(off)
                .ok()
                .filter(|&o| u16::from(o) < SERIAL_PORT_LEN)
                .map(|o| self.read(o))
        });
    }

    /// Handles a guest `out` of `data` at `offset` from the base port: byte
    /// `i` goes to register `offset + i`; bytes past the last register are
    /// dropped.
    pub fn pio_write(&mut self, offset: u16, data: &[u8]) {
        super::split_write(offset, data, |off, value| {
            if let Some(o) = u8::try_from(off)
                .ok()
                .filter(|&o| u16::from(o) < SERIAL_PORT_LEN)
            {
                self.write(o, value);
            }
        });
    }

    /// Queues host input (stdin) for the guest. Bytes enter the receive FIFO
    /// as the guest drains it, raising the receive interrupt when IER enables
    /// it. If more than [`MAX_PENDING_INPUT`] bytes would be waiting, the
    /// excess is dropped and reported as [`SerialError::InputOverflow`].
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> Result<(), SerialError> {
        let room = MAX_PENDING_INPUT.saturating_sub(self.pending.len());
        let taken = bytes.len().min(room);
        self.pending.extend(&bytes[..taken]);
        self.refill_fifo()?;
        if taken < bytes.len() {
            return Err(SerialError::InputOverflow {
                dropped: bytes.len() - taken,
            });
        }
        Ok(())
    }

    /// Host input queued but not yet in the receive FIFO.
    pub fn pending_input(&self) -> usize {
        self.pending.len()
    }

    /// Moves pending input into the FIFO once the guest has emptied it.
    fn refill_fifo(&mut self) -> Result<(), SerialError> {
        if self.pending.is_empty() || self.uart.fifo_capacity() < self.fifo_size {
            return Ok(());
        }
        let chunk: Vec<u8> = self.pending.iter().take(self.fifo_size).copied().collect();
        match self.uart.enqueue_raw_bytes(&chunk) {
            Ok(n) => {
                self.pending.drain(..n);
                Ok(())
            }
            // Cannot happen with an empty FIFO; keep the bytes for later.
            Err(UartError::FullFifo) => Ok(()),
            Err(UartError::Trigger(e)) => Err(SerialError::Trigger(e)),
            // enqueue_raw_bytes does no output I/O.
            Err(UartError::IOError(e)) => Err(SerialError::Trigger(e)),
        }
    }
}

/// The UART's registers and receive FIFO in a snapshot (host input not yet
/// in the FIFO is not saved: it belongs to this process's stdin).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerialSnapshot {
    /// Divisor latch, low and high byte.
    pub divisor: [u8; 2],
    /// IER.
    pub interrupt_enable: u8,
    /// IIR.
    pub interrupt_identification: u8,
    /// LCR.
    pub line_control: u8,
    /// LSR.
    pub line_status: u8,
    /// MCR.
    pub modem_control: u8,
    /// MSR.
    pub modem_status: u8,
    /// SCR.
    pub scratch: u8,
    /// The receive FIFO.
    pub fifo: Vec<u8>,
}

impl SerialDevice {
    /// The UART's state for a snapshot.
    pub fn save(&self) -> SerialSnapshot {
        let s = self.uart.state();
        SerialSnapshot {
            divisor: [s.baud_divisor_low, s.baud_divisor_high],
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            fifo: s.in_buffer,
        }
    }

    /// Takes back a saved state, keeping this device's output and interrupt
    /// descriptor; an interrupt the state shows pending is raised again. A
    /// FIFO longer than the UART's is refused.
    pub fn restore(&mut self, saved: &SerialSnapshot) -> Result<(), SerialError> {
        if saved.fifo.len() > self.fifo_size {
            return Err(SerialError::RestoreFifo(saved.fifo.len()));
        }
        let state = SerialState {
            baud_divisor_low: saved.divisor[0],
            baud_divisor_high: saved.divisor[1],
            interrupt_enable: saved.interrupt_enable,
            interrupt_identification: saved.interrupt_identification,
            line_control: saved.line_control,
            line_status: saved.line_status,
            modem_control: saved.modem_control,
            modem_status: saved.modem_status,
            scratch: saved.scratch,
            in_buffer: saved.fifo.clone(),
        };
        let evt = self
            .irq_evt()
            .try_clone()
            .map_err(SerialError::CreateEventFd)?;
        let out = std::mem::replace(self.uart.writer_mut(), Box::new(io::sink()));
        match Serial::from_state(&state, EventFdTrigger(evt), NoEvents, out) {
            Ok(uart) => {
                self.uart = uart;
                Ok(())
            }
            Err(UartError::Trigger(e)) => Err(SerialError::Trigger(e)),
            Err(_) => Err(SerialError::RestoreFifo(saved.fifo.len())),
        }
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_restored_uart_has_the_registers_and_fifo_and_raises_a_pending_interrupt() {
        let mut a = SerialDevice::new(Box::new(io::sink())).unwrap();
        // IER: receive-data interrupt on; LCR 8N1; scratch; two bytes in.
        a.write(1, 0x01);
        a.write(3, 0x03);
        a.write(7, 0x5a);
        a.enqueue_input(b"hi").unwrap();
        let saved = a.save();
        assert_eq!(saved.fifo, b"hi");
        let text = serde_json::to_string(&saved).unwrap();
        let saved: SerialSnapshot = serde_json::from_str(&text).unwrap();

        let out = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut b = SerialDevice::new(Box::new(Shared(out.clone()))).unwrap();
        b.restore(&saved).unwrap();
        assert_eq!(b.save(), saved);
        // The pending receive interrupt is raised again on the same eventfd.
        assert_eq!(b.irq_evt().read().unwrap(), 1);
        assert_eq!(b.read(7), 0x5a);
        assert_eq!(b.read(0), b'h');
        assert_eq!(b.read(0), b'i');
        // The restored UART still writes to this device's output.
        b.write(0, b'x');
        assert_eq!(*out.lock().unwrap(), b"x");

        let too_long = SerialSnapshot {
            fifo: vec![0; 65],
            ..saved
        };
        assert!(matches!(
            b.restore(&too_long),
            Err(SerialError::RestoreFifo(65))
        ));
    }
    use super::*;
    use std::sync::{Arc, Mutex};

    const IER: u8 = 1;
    const LCR: u8 = 3;
    const MCR: u8 = 4;
    const LSR: u8 = 5;
    const IER_RDA: u8 = 0x01;
    const LSR_DR: u8 = 0x01;

    #[derive(Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct BrokenPipe;

    impl Write for BrokenPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn serial() -> (SerialDevice, SharedBuf) {
        let out = SharedBuf::default();
        (SerialDevice::new(Box::new(out.clone())).unwrap(), out)
    }

    /// Reads RBR while LSR says data is ready.
    fn drain(s: &mut SerialDevice) -> Vec<u8> {
        let mut v = Vec::new();
        while s.read(LSR) & LSR_DR != 0 {
            v.push(s.read(DATA_OFFSET));
        }
        v
    }

    #[test]
    fn thr_bytes_reach_the_output() {
        let (mut s, out) = serial();
        for b in b"Linux version" {
            s.write(DATA_OFFSET, *b);
        }
        assert_eq!(out.0.lock().unwrap().as_slice(), b"Linux version");
    }

    #[test]
    fn a_wide_out_reaches_consecutive_registers() {
        // `out 0x3f8, eax` with EAX = 0x03_00_00_41: 'A' to THR, 0 to IER,
        // 0 to FCR, 8N1 to LCR: every byte reaches its register, not only the
        // first.
        let (mut s, out) = serial();
        s.write(IER, IER_RDA);
        s.pio_write(0, &[b'A', 0, 0, 0x03]);
        assert_eq!(out.0.lock().unwrap().as_slice(), b"A");
        assert_eq!(s.read(IER), 0, "the second byte must land in IER");
        assert_eq!(s.read(LCR), 0x03, "the fourth byte must land in LCR");
        // A 2-byte write to the scratch register: the byte past COM1 is dropped.
        s.pio_write(7, &[0x5a, b'B']);
        assert_eq!(s.read(7), 0x5a);
        assert_eq!(out.0.lock().unwrap().as_slice(), b"A");
    }

    #[test]
    fn a_wide_in_reads_consecutive_registers() {
        let (mut s, _) = serial();
        s.write(LCR, 0x03);
        s.write(MCR, 0x08);
        s.write(7, 0xa5);
        let mut one = [0u8; 4];
        for (i, b) in one.iter_mut().enumerate() {
            *b = s.read(3 + i as u8);
        }
        let mut wide = [0u8; 4];
        s.pio_read(3, &mut wide);
        // LCR, MCR, LSR, MSR: what four single-byte reads return, not 0xff
        // past the first.
        assert_eq!(wide, one);
        assert_eq!(wide[..2], [0x03, 0x08]);
        // Scratch, then one port past COM1, which floats.
        let mut two = [0u8; 2];
        s.pio_read(7, &mut two);
        assert_eq!(two, [0xa5, 0xff]);
        // An input byte read through a wide access is consumed once.
        s.enqueue_input(b"xy").unwrap();
        let mut rbr = [0u8; 2];
        s.pio_read(0, &mut rbr);
        assert_eq!(rbr, [b'x', 0]);
        assert_eq!(drain(&mut s), b"y");
    }

    #[test]
    fn divisor_latch_writes_do_not_reach_the_output() {
        let (mut s, out) = serial();
        s.write(LCR, 0x80);
        s.write(DATA_OFFSET, 0x0c);
        s.write(LCR, 0x03);
        s.write(DATA_OFFSET, b'x');
        assert_eq!(out.0.lock().unwrap().as_slice(), b"x");
    }

    #[test]
    fn input_is_readable_and_interrupts_when_enabled() {
        let (mut s, _) = serial();
        s.write(IER, IER_RDA);
        s.enqueue_input(b"ok\n").unwrap();
        assert_eq!(s.irq_evt().read().unwrap(), 1);
        assert_eq!(drain(&mut s), b"ok\n");
        assert_eq!(s.read(LSR) & LSR_DR, 0);
    }

    #[test]
    fn input_without_ier_raises_no_interrupt() {
        let (mut s, _) = serial();
        s.enqueue_input(b"a").unwrap();
        assert!(s.irq_evt().read().is_err(), "interrupt raised with IER=0");
        assert_eq!(drain(&mut s), b"a");
    }

    #[test]
    fn input_beyond_fifo_is_delivered_in_fifo_sized_batches() {
        let (mut s, _) = serial();
        s.write(IER, IER_RDA);
        let input: Vec<u8> = (0..200u8).collect();
        s.enqueue_input(&input).unwrap();
        assert_eq!(s.pending_input(), 200 - 64);
        // One interrupt for the first FIFO load, not one per byte.
        assert_eq!(s.irq_evt().read().unwrap(), 1);
        assert_eq!(drain(&mut s), input);
        assert_eq!(s.pending_input(), 0);
        // Each refill after the guest emptied the FIFO raised one more.
        assert_eq!(s.irq_evt().read().unwrap(), 3);
    }

    #[test]
    fn input_overflow_drops_excess_and_says_so() {
        let (mut s, _) = serial();
        s.enqueue_input(&vec![b'x'; MAX_PENDING_INPUT]).unwrap();
        let err = s.enqueue_input(&[b'y'; 100]).unwrap_err();
        assert!(
            matches!(err, SerialError::InputOverflow { dropped: 36 }),
            "{err:?}"
        );
        assert_eq!(drain(&mut s).len(), MAX_PENDING_INPUT + 64);
        // What the bound promises a paste into the console: 64 KiB wait.
        let (mut s, _) = serial();
        s.enqueue_input(&vec![b'z'; 64 * 1024]).unwrap();
        assert_eq!(drain(&mut s).len(), 64 * 1024);
    }

    #[test]
    fn loopback_mode_keeps_host_input_pending() {
        let (mut s, _) = serial();
        s.write(MCR, 0x10);
        s.enqueue_input(b"later").unwrap();
        assert_eq!(s.pending_input(), 5);
        s.write(MCR, 0);
        // Any RBR read retries the refill.
        s.read(DATA_OFFSET);
        assert_eq!(drain(&mut s), b"later");
    }

    #[test]
    fn broken_output_is_not_fatal() {
        let mut s = SerialDevice::new(Box::new(BrokenPipe)).unwrap();
        s.write(IER, 0x02);
        s.irq_evt().read().unwrap();
        // Reading IIR acknowledges the THR-empty interrupt.
        s.read(2);
        s.write(DATA_OFFSET, b'x');
        // The THR-empty interrupt still fires so the guest does not hang.
        assert_eq!(s.irq_evt().read().unwrap(), 1);
    }
}
