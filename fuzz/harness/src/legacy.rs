// SPDX-License-Identifier: Apache-2.0
//! Target `legacy_pio`: the UART and the i8042 driven by arbitrary port I/O
//! of 1, 2 or 4 bytes, interleaved with host console input.
//!
//! A reference model of the 16550A as minivmm presents it (divisor latch,
//! loopback, a 64-byte receive FIFO fed from a bounded pending queue only
//! once the guest has emptied it) predicts every register the guest reads
//! back and every byte it transmits. Oracles, after every access:
//!
//! - the bytes that reach the console output are exactly the bytes written
//!   to THR (DLAB clear, loopback off), in order, wide accesses included;
//!   with a failing host console (a closed stdout) they are lost and
//!   nothing else changes;
//! - LCR, MCR, scratch, IER and the divisor latch read back what was written
//!   (IER keeps its four defined bits);
//! - RBR returns host input in order, each byte once; LSR's data-ready bit
//!   is set exactly when the FIFO holds data; IIR always shows the FIFO bits;
//! - the host input queue drops input beyond its bound and says so;
//! - the i8042 reads 0 on both ports, 0xff between and after them, and its
//!   reset line fires once per 0xFE command byte on port 0x64, never otherwise.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use devices::legacy::i8042::{COMMAND_OFFSET, I8042};
use devices::legacy::serial::{SerialDevice, MAX_PENDING_INPUT, SERIAL_PORT_LEN};

/// The 16550's receive FIFO.
const FIFO_SIZE: usize = 64;
const LCR_DLAB: u8 = 0x80;
const MCR_LOOP: u8 = 0x10;
const LSR_DR: u8 = 0x01;
const LSR_THR_EMPTY: u8 = 0x60;
const IIR_FIFO_BITS: u8 = 0xc0;
/// The i8042 command that pulses the CPU reset line.
const CMD_RESET_CPU: u8 = 0xfe;

/// An access width the x86 `in`/`out` instructions have.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Width {
    /// `inb`/`outb`.
    Byte,
    /// `inw`/`outw`.
    Word,
    /// `inl`/`outl`.
    Dword,
}

impl Width {
    fn len(self) -> usize {
        match self {
            Width::Byte => 1,
            Width::Word => 2,
            Width::Dword => 4,
        }
    }
}

/// One action on the legacy devices.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// `in` from COM1 at this offset (folded to 0..=9, so wide accesses run
    /// past the UART).
    SerialIn(u8, Width),
    /// `out` to COM1 at this offset with these bytes (little endian).
    SerialOut(u8, Width, u32),
    /// The host types on the console.
    Input(Vec<u8>),
    /// A burst of host input large enough to reach the pending bound.
    InputFlood(u16),
    /// `in` from port 0x60 + offset (folded to 0..=5).
    I8042In(u8, Width),
    /// `out` to port 0x60 + offset (folded to 0..=5).
    I8042Out(u8, Width, u32),
}

/// One input: the actions, in order.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// The host's console output fails (a closed stdout): every byte is
    /// lost, and nothing else may change.
    pub broken_output: bool,
    /// The actions.
    pub ops: Vec<Op>,
}

/// Runs one input (the libFuzzer entry point).
pub fn run(data: &[u8]) {
    crate::with_input(data, |i: &Input| run_input(i));
}

/// The host console: collects output, or fails every write.
#[derive(Clone, Default)]
struct Console(Arc<Mutex<Vec<u8>>>, bool);

impl Write for Console {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.1 {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The reference model of the UART.
struct Uart {
    lcr: u8,
    mcr: u8,
    ier: u8,
    scratch: u8,
    dll: u8,
    dlm: u8,
    fifo: VecDeque<u8>,
    pending: VecDeque<u8>,
    output: Vec<u8>,
    /// Output bytes are lost (the host console fails).
    lost: bool,
}

impl Uart {
    /// A UART at power-on as the guest finds it: 8N1, OUT2 set (most
    /// drivers need it for interrupts), divisor 12 (9600 baud).
    fn new() -> Self {
        Uart {
            lcr: 0x03,
            mcr: 0x08,
            ier: 0,
            scratch: 0,
            dll: 0x0c,
            dlm: 0,
            fifo: VecDeque::new(),
            pending: VecDeque::new(),
            output: Vec::new(),
            lost: false,
        }
    }

    fn dlab(&self) -> bool {
        self.lcr & LCR_DLAB != 0
    }

    fn looped(&self) -> bool {
        self.mcr & MCR_LOOP != 0
    }

    /// minivmm moves host input into the FIFO only once the guest emptied
    /// it, and not in loopback mode.
    fn refill(&mut self) {
        if !self.pending.is_empty() && self.fifo.is_empty() && !self.looped() {
            let n = self.pending.len().min(FIFO_SIZE);
            self.fifo.extend(self.pending.drain(..n));
        }
    }

    fn write(&mut self, offset: u16, value: u8) {
        match offset {
            0 if self.dlab() => self.dll = value,
            1 if self.dlab() => self.dlm = value,
            // Loopback: the byte comes back in the receive FIFO, if it fits.
            0 if self.looped() && self.fifo.len() < FIFO_SIZE => self.fifo.push_back(value),
            0 if self.looped() => {}
            0 if self.lost => {}
            0 => self.output.push(value),
            1 => self.ier = value & 0x0f,
            3 => self.lcr = value,
            4 => self.mcr = value,
            7 => self.scratch = value,
            _ => {}
        }
    }

    /// Checks a byte read from register `offset` and updates the model.
    fn read(&mut self, offset: u16, got: u8) {
        match offset {
            0 if self.dlab() => assert_eq!(got, self.dll, "DLL"),
            1 if self.dlab() => assert_eq!(got, self.dlm, "DLM"),
            0 => {
                let want = self.fifo.pop_front().unwrap_or(0);
                assert_eq!(got, want, "RBR");
            }
            1 => assert_eq!(got, self.ier, "IER"),
            2 => assert_eq!(got & IIR_FIFO_BITS, IIR_FIFO_BITS, "IIR FIFO bits"),
            3 => assert_eq!(got, self.lcr, "LCR"),
            4 => assert_eq!(got, self.mcr, "MCR"),
            5 => {
                assert_eq!(
                    got & LSR_DR != 0,
                    !self.fifo.is_empty(),
                    "LSR data ready ({got:#x}, FIFO {} bytes)",
                    self.fifo.len()
                );
                // The transmitter is always empty: output never waits.
                assert_eq!(got & LSR_THR_EMPTY, LSR_THR_EMPTY, "LSR THRE/TEMT");
            }
            7 => assert_eq!(got, self.scratch, "scratch"),
            _ => {}
        }
        if offset == 0 {
            self.refill();
        }
    }
}

/// Drives both devices with `input`, checking every oracle after each access.
pub fn run_input(input: &Input) {
    let console = Console(Arc::default(), input.broken_output);
    let mut serial = SerialDevice::new(Box::new(console.clone())).expect("serial device");
    let mut i8042 = I8042::new().expect("i8042 device");
    let mut uart = Uart::new();
    uart.lost = input.broken_output;
    let mut resets = 0u64;
    let mut checked = 0;

    for op in &input.ops {
        match op {
            Op::SerialIn(offset, width) => {
                let offset = u16::from(*offset % 10);
                let mut data = vec![0u8; width.len()];
                serial.pio_read(offset, &mut data);
                for (i, &b) in data.iter().enumerate() {
                    let reg = offset + i as u16;
                    if reg < SERIAL_PORT_LEN {
                        uart.read(reg, b);
                    } else {
                        assert_eq!(b, 0xff, "port past COM1 must float");
                    }
                }
            }
            Op::SerialOut(offset, width, value) => {
                let offset = u16::from(*offset % 10);
                let data = &value.to_le_bytes()[..width.len()];
                serial.pio_write(offset, data);
                for (i, &b) in data.iter().enumerate() {
                    let reg = offset + i as u16;
                    if reg < SERIAL_PORT_LEN {
                        uart.write(reg, b);
                    }
                }
            }
            Op::Input(bytes) => host_input(&mut serial, &mut uart, bytes),
            Op::InputFlood(n) => {
                let bytes: Vec<u8> = (0..usize::from(*n) * 2).map(|i| i as u8).collect();
                host_input(&mut serial, &mut uart, &bytes);
            }
            Op::I8042In(offset, width) => {
                let offset = u16::from(*offset % 6);
                let mut data = vec![0u8; width.len()];
                i8042.pio_read(offset, &mut data);
                for (i, &b) in data.iter().enumerate() {
                    let want = match offset + i as u16 {
                        0 | 4 => 0,
                        _ => 0xff,
                    };
                    assert_eq!(b, want, "i8042 port {:#x}", 0x60 + offset + i as u16);
                }
            }
            Op::I8042Out(offset, width, value) => {
                let offset = u16::from(*offset % 6);
                let data = &value.to_le_bytes()[..width.len()];
                i8042.pio_write(offset, data);
                resets += data
                    .iter()
                    .enumerate()
                    .filter(|&(i, &b)| offset + i as u16 == COMMAND_OFFSET && b == CMD_RESET_CPU)
                    .count() as u64;
            }
        }
        {
            // Only the bytes since the last check can differ.
            let out = console.0.lock().unwrap_or_else(|p| p.into_inner());
            assert_eq!(out.len(), uart.output.len(), "console output length");
            assert_eq!(
                out[checked..],
                uart.output[checked..],
                "console output differs from THR writes"
            );
            checked = out.len();
        }
        assert_eq!(
            serial.pending_input(),
            uart.pending.len(),
            "pending host input"
        );
        // The eventfd counter holds the pulses not yet consumed.
        let fired = i8042.reset_evt().read().unwrap_or(0);
        assert_eq!(fired, resets, "i8042 reset pulses");
        resets = 0;
    }
}

fn host_input(serial: &mut SerialDevice, uart: &mut Uart, bytes: &[u8]) {
    let result = serial.enqueue_input(bytes);
    let room = MAX_PENDING_INPUT - uart.pending.len();
    let taken = bytes.len().min(room);
    uart.pending.extend(&bytes[..taken]);
    uart.refill();
    assert_eq!(
        result.is_err(),
        taken < bytes.len(),
        "overflow reported iff input was dropped: {result:?}"
    );
}
