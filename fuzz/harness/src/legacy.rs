// SPDX-License-Identifier: Apache-2.0
//! Target `legacy_pio`: the UART and the i8042 driven by arbitrary port I/O
//! of 1, 2 or 4 bytes, interleaved with host console input and the host's
//! Ctrl-Alt-Del.
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
//! - the i8042 reads 0xff between and after its two ports; its reset line
//!   fires once per reset pulse (a 0xF0-0xFE command with bit 0 low) and per
//!   output-port write with bit 0 low, never otherwise;
//! - a model of the controller's command byte, internal RAM, output port and
//!   which commands wait for a data byte predicts the answer of every
//!   controller command (0x20-0x3F, 0xA9, 0xAA, 0xAB, 0xD0, 0xD2) that the
//!   guest reads right after it, and the status register's fixed bits,
//!   system flag and command/data bit on every status read (and a peek
//!   after every action);
//! - IRQ 1 fires exactly when the line (output full, keyboard interrupt on)
//!   rises, at most once per action, never with the interrupt off;
//! - the bytes waiting for the guest never exceed the keyboard buffer and
//!   the output register, whatever the guest sends without reading; the
//!   host's Ctrl-Alt-Del queues a whole key sequence or nothing, and says
//!   which.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use devices::legacy::i8042::{I8042Error, COMMAND_OFFSET, DATA_OFFSET, I8042, KBD_BUFFER_SIZE};
use devices::legacy::serial::{SerialDevice, MAX_PENDING_INPUT, SERIAL_PORT_LEN};

/// The 16550's receive FIFO.
const FIFO_SIZE: usize = 64;
const LCR_DLAB: u8 = 0x80;
const MCR_LOOP: u8 = 0x10;
const LSR_DR: u8 = 0x01;
const LSR_THR_EMPTY: u8 = 0x60;
const IIR_FIFO_BITS: u8 = 0xc0;
const STS_OBF: u8 = 0x01;
const STS_SYS: u8 = 0x04;
const STS_CMD: u8 = 0x08;
const CTR_KBD_INT: u8 = 0x01;
const CTR_SYS: u8 = 0x04;
/// The command byte a PC BIOS leaves (translate, aux off, POST, interrupt).
const CTR_POWER_ON: u8 = 0x65;

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
    /// One of the controller commands the model knows
    /// ([`I8042_COMMANDS`], by index) to port 0x64 (random bytes rarely hit
    /// the few that answer); with `true`, then one read of port 0x60, as a
    /// driver waiting for the answer does.
    I8042Command(u8, bool),
    /// One of the bytes a keyboard driver sends ([`KBD_BYTES`], by index)
    /// to port 0x60: commands, and arguments for the ones that take one.
    I8042KbdByte(u8),
    /// The guest reads port 0x60 while the status shows data, as a driver
    /// flushes (at most 64 reads).
    I8042Drain,
    /// The host presses Ctrl-Alt-Del 1 + n % 8 times in a row (enough to
    /// fill the keyboard buffer).
    CtrlAltDel(u8),
}

/// Every controller command the model answers or acts on, and a few it
/// ignores.
const I8042_COMMANDS: &[u8] = &[
    0x20, 0x21, 0x3f, 0x60, 0x61, 0x7f, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xad, 0xae, 0xc0, 0xca, 0xd0,
    0xd1, 0xd2, 0xd3, 0xd4, 0xe0, 0xf0, 0xf1, 0xfe, 0xff,
];

/// Keyboard commands, and arguments (LED bits, typematic, scancode sets).
const KBD_BYTES: &[u8] = &[
    0xed, 0xee, 0xf0, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xfe, 0xff, 0x00, 0x01, 0x02, 0x03, 0x04,
    0x07, 0x2b, 0x42,
];

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
    let mut kbc = Kbc::new();
    let mut uart = Uart::new();
    uart.lost = input.broken_output;
    let mut checked = 0;

    for op in &input.ops {
        // The status before the last i8042 access; an action of several
        // accesses checks after each.
        let mut before = kbc.peek(&mut i8042);
        // A data-port read that emptied the output register (then maybe
        // refilled it: a second edge in a row without a status change).
        let mut took = false;
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
                    match offset + i as u16 {
                        DATA_OFFSET => {
                            took = before.obf;
                            kbc.data_read(b);
                        }
                        COMMAND_OFFSET => kbc.check_status(b),
                        port => assert_eq!(b, 0xff, "i8042 port {:#x}", 0x60 + port),
                    }
                }
            }
            Op::I8042Out(offset, width, value) => {
                let offset = u16::from(*offset % 6);
                let data = &value.to_le_bytes()[..width.len()];
                i8042.pio_write(offset, data);
                for (i, &b) in data.iter().enumerate() {
                    match offset + i as u16 {
                        DATA_OFFSET => kbc.data_write(b),
                        COMMAND_OFFSET => kbc.command(b),
                        _ => {}
                    }
                }
            }
            Op::I8042Command(n, read_back) => {
                let cmd = I8042_COMMANDS[usize::from(*n) % I8042_COMMANDS.len()];
                i8042.write(COMMAND_OFFSET as u8, cmd);
                kbc.command(cmd);
                if *read_back {
                    before = kbc.check_i8042(&mut i8042, before, false);
                    took = before.obf;
                    let b = i8042.read(DATA_OFFSET as u8);
                    kbc.data_read(b);
                }
            }
            Op::I8042KbdByte(n) => {
                let byte = KBD_BYTES[usize::from(*n) % KBD_BYTES.len()];
                i8042.write(DATA_OFFSET as u8, byte);
                kbc.data_write(byte);
            }
            Op::I8042Drain => {
                for _ in 0..64 {
                    if !before.obf {
                        break;
                    }
                    let b = i8042.read(DATA_OFFSET as u8);
                    kbc.data_read(b);
                    before = kbc.check_i8042(&mut i8042, before, true);
                }
            }
            Op::CtrlAltDel(n) => {
                for _ in 0..n % 8 {
                    ctrl_alt_del(&mut i8042);
                    before = kbc.check_i8042(&mut i8042, before, false);
                }
                ctrl_alt_del(&mut i8042);
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
        kbc.check_i8042(&mut i8042, before, took);
    }
}

/// What a status peek shows of the i8042 between accesses.
#[derive(Clone, Copy)]
struct Peek {
    obf: bool,
    /// IRQ 1: output full and the keyboard interrupt enabled.
    line: bool,
}

/// The reference model of the i8042 controller (not of its keyboard, whose
/// bytes it never predicts).
struct Kbc {
    ram: [u8; 32],
    output_port: u8,
    sys: bool,
    last_write_command: bool,
    /// A command waiting for its data byte.
    awaiting: Option<u8>,
    /// The answer the next data-port read returns: a controller answer
    /// takes the output register at once, and only a later write can
    /// change that.
    answer: Option<u8>,
    /// Reset pulses since the last check.
    resets: u64,
}

impl Kbc {
    fn new() -> Self {
        let mut ram = [0u8; 32];
        ram[0] = CTR_POWER_ON;
        Kbc {
            ram,
            output_port: 0x03,
            sys: true,
            last_write_command: false,
            awaiting: None,
            answer: None,
            resets: 0,
        }
    }

    fn command(&mut self, cmd: u8) {
        self.last_write_command = true;
        self.awaiting = None;
        self.answer = None;
        match cmd {
            0x20..=0x3f => self.answer = Some(self.ram[usize::from(cmd - 0x20)]),
            0x60..=0x7f | 0xd1..=0xd4 => self.awaiting = Some(cmd),
            0xa7 => self.ram[0] |= 0x20,
            0xa8 => self.ram[0] &= !0x20,
            0xa9 => self.answer = Some(0x02),
            0xaa => {
                self.sys = true;
                self.answer = Some(0x55);
            }
            0xab => self.answer = Some(0x00),
            0xad => self.ram[0] |= 0x10,
            0xae => self.ram[0] &= !0x10,
            0xd0 => self.answer = Some(self.output_port),
            0xf0..=0xff if cmd & 1 == 0 => self.resets += 1,
            _ => {}
        }
    }

    fn data_write(&mut self, value: u8) {
        self.last_write_command = false;
        self.answer = None;
        match self.awaiting.take() {
            Some(cmd @ 0x60..=0x7f) => {
                self.ram[usize::from(cmd - 0x60)] = value;
                if cmd == 0x60 {
                    self.sys = value & CTR_SYS != 0;
                }
            }
            Some(0xd1) => {
                self.output_port = value;
                if value & 1 == 0 {
                    self.resets += 1;
                }
            }
            Some(0xd2) => self.answer = Some(value),
            // Aux bytes, and keyboard commands (whose answers queue behind
            // whatever the output register holds).
            _ => {}
        }
    }

    fn data_read(&mut self, got: u8) {
        if let Some(want) = self.answer.take() {
            assert_eq!(got, want, "i8042 controller answer");
        }
    }

    fn check_status(&self, status: u8) {
        assert_eq!(status & 0xf2, 0x10, "i8042 status {status:#x}: fixed bits");
        assert_eq!(
            status & STS_SYS != 0,
            self.sys,
            "i8042 status {status:#x}: system flag"
        );
        assert_eq!(
            status & STS_CMD != 0,
            self.last_write_command,
            "i8042 status {status:#x}: command/data"
        );
        if self.answer.is_some() {
            assert_ne!(
                status & STS_OBF,
                0,
                "i8042 answer not in the output register"
            );
        }
    }

    /// The status, peeked (a status read changes nothing) and checked.
    fn peek(&self, i8042: &mut I8042) -> Peek {
        let status = i8042.read(COMMAND_OFFSET as u8);
        self.check_status(status);
        let obf = status & STS_OBF != 0;
        Peek {
            obf,
            line: obf && self.ram[0] & CTR_KBD_INT != 0,
        }
    }

    /// The oracles after one access (`took`: a data-port read that found
    /// the output register full); returns the new peek.
    fn check_i8042(&mut self, i8042: &mut I8042, before: Peek, took: bool) -> Peek {
        // The eventfd counters hold the pulses and edges not yet consumed.
        let fired = i8042.reset_evt().read().unwrap_or(0);
        assert_eq!(fired, self.resets, "i8042 reset pulses");
        self.resets = 0;
        let after = self.peek(i8042);
        let edges = i8042.kbd_interrupt_evt().read().unwrap_or(0);
        assert!(edges <= 1, "{edges} keyboard interrupts in one access");
        if edges == 1 {
            assert!(after.line, "keyboard interrupt with the line low");
            // A line already high rises again only after a read took the
            // byte that held it high.
            assert!(!before.line || took, "keyboard interrupt without an edge");
        }
        if after.line && !before.line {
            assert_eq!(edges, 1, "IRQ 1 rose without an interrupt");
        }
        assert!(
            i8042.pending_bytes() <= KBD_BUFFER_SIZE + 1,
            "{} bytes wait for the guest",
            i8042.pending_bytes()
        );
        after
    }
}

/// The host presses Ctrl-Alt-Del: a whole key sequence or nothing, and the
/// error says which.
fn ctrl_alt_del(i8042: &mut I8042) {
    let before = i8042.pending_bytes();
    let result = i8042.trigger_ctrl_alt_del();
    let after = i8042.pending_bytes();
    match result {
        // Ctrl, Alt, 0xE0 Delete; three bytes in set 3, which has no prefix.
        Ok(()) => assert!(
            after == before + 4 || after == before + 3,
            "Ctrl-Alt-Del queued {} bytes",
            after.wrapping_sub(before)
        ),
        Err(I8042Error::BufferFull { needed, room }) => {
            assert!(needed > room, "refused with room: {needed} > {room}");
            assert_eq!(after, before, "a refused sequence queued bytes");
        }
        Err(I8042Error::ScanningDisabled) => {
            assert_eq!(after, before, "a refused sequence queued bytes");
        }
        Err(e) => panic!("Ctrl-Alt-Del: {e}"),
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
