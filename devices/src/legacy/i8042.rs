// SPDX-License-Identifier: Apache-2.0
//! i8042 keyboard controller with a PS/2 keyboard behind it.
//!
//! Two jobs. Linux reboots an x86 PC by pulsing the CPU reset line through
//! the controller (command 0xFE to port 0x64); the VMM has no reboot, so the
//! pulse signals [`I8042::reset_evt`], which the event loop watches to end
//! the VMM cleanly. And the host can press Ctrl-Alt-Del
//! ([`I8042::trigger_ctrl_alt_del`], Firecracker's `SendCtrlAltDel`): the
//! keyboard sends the three make codes and the controller raises IRQ 1
//! ([`I8042::kbd_interrupt_evt`]); Linux's atkbd driver reports the keys,
//! its VT keyboard handler sees the combination, and the kernel either
//! restarts or, once init has asked for it, sends SIGINT to init.
//!
//! For that the guest's i8042 and atkbd drivers have to find a controller
//! and a keyboard, so the model covers what they use and what a PC BIOS
//! leaves behind:
//!
//! - the status register: output buffer full, system flag, command/data
//!   (which port was written last), keyboard not inhibited; the input buffer
//!   is never full, every write is handled at once;
//! - the command byte (internal RAM byte 0) and the rest of the 32-byte RAM
//!   (0x20-0x3F read, 0x60-0x7F write), power-on value translate + aux
//!   disabled + system flag + keyboard interrupt, as a BIOS leaves it;
//! - self-test 0xAA -> 0x55, keyboard interface test 0xAB -> 0x00, keyboard
//!   interface disable/enable 0xAD/0xAE, output port read/write 0xD0/0xD1
//!   (bit 0 low holds the CPU in reset), 0xD2 (a byte as if from the
//!   keyboard), the pulse commands 0xF0-0xFF (bit 0 low pulses the reset
//!   line; 0xFF pulses nothing, Linux sends it as a null command);
//! - no auxiliary (mouse) device: 0xA7/0xA8 only flip the command byte's
//!   aux-disable bit, the aux interface test 0xA9 answers 0x02 (clock line
//!   high: nothing attached), 0xD3/0xD4 take their byte and answer nothing;
//! - a PS/2 keyboard: reset 0xFF -> ACK + 0xAA, identify 0xF2 -> ACK + 0xAB
//!   0x83, LEDs 0xED and typematic 0xF3 with their argument, enable/disable
//!   scanning 0xF4/0xF5, defaults 0xF6, scancode set 0xF0 (get and set 1, 2
//!   or 3), echo 0xEE, resend 0xFE, the set-3 key-type commands 0xF7-0xFD
//!   (ACK); any other byte is answered 0xFE (resend), as a keyboard answers
//!   a byte it does not understand.
//!
//! Unknown controller commands are ignored, as an 8042 ignores them.
//!
//! A real 8042 holds one byte for the guest; the keyboard behind it keeps
//! its own small buffer and sends the next byte once the controller's is
//! read. Here too: one output register, filled from a keyboard buffer of
//! [`KBD_BUFFER_SIZE`] bytes only while the keyboard interface is enabled.
//! The guest cannot grow it: a keyboard answer that does not fit is dropped
//! (a guest that sends commands without reading the answers loses them), and
//! the host's Ctrl-Alt-Del is refused whole with
//! [`I8042Error::BufferFull`]. A controller answer takes the output register
//! at once; a keyboard byte that was waiting there goes back to the front of
//! the keyboard buffer, so nothing is lost and the guest, which polls for
//! the answer, reads the answer.
//!
//! IRQ 1 is the output register being full while the command byte enables
//! the keyboard interrupt; each rising edge of that line is one write to
//! the interrupt `EventFd` (an irqfd, edge-triggered as an ISA line is). So
//! a guest reading a byte while more wait gets one interrupt per byte.
//!
//! With translation on (the command byte's bit 6, the PC default) the
//! controller hands the guest set-1 codes for the keyboard's set-2 codes;
//! see `translate` for which bytes it knows.

use std::collections::VecDeque;
use std::io;

use vmm_sys_util::eventfd::EventFd;

/// Errors of the i8042 device.
#[derive(Debug, thiserror::Error)]
pub enum I8042Error {
    /// An eventfd could not be created.
    #[error("failed to create an i8042 eventfd")]
    CreateEventFd(#[source] io::Error),
    /// The keyboard buffer has no room for the whole key sequence (the
    /// guest is not reading it); nothing was queued.
    #[error(
        "the i8042 keyboard buffer has room for {room} of the {needed} bytes; nothing was queued"
    )]
    BufferFull {
        /// Bytes the sequence needs.
        needed: usize,
        /// Bytes free.
        room: usize,
    },
    /// The guest turned keyboard scanning off (command 0xF5); a keyboard
    /// then sends no keys, so nothing was queued.
    #[error("the guest has disabled keyboard scanning; nothing was queued")]
    ScanningDisabled,
    /// The keyboard interrupt could not be signalled (a host problem); the
    /// bytes are queued and the guest sees them when it next reads.
    #[error("failed to signal the i8042 keyboard interrupt")]
    Interrupt(#[source] io::Error),
    /// A saved controller state no guest could have produced.
    #[error("invalid saved i8042 state: {0}")]
    Restore(&'static str),
}

/// Offset of the data port (0x60) from the controller's base port.
pub const DATA_OFFSET: u16 = 0;
/// Offset of the command/status port (0x64) from the base port.
pub const COMMAND_OFFSET: u16 = 4;
/// Bytes the keyboard holds for the guest, besides the controller's output
/// register (a PS/2 keyboard's buffer is of this order; Linux's i8042
/// driver flushes at most this many).
pub const KBD_BUFFER_SIZE: usize = 16;

// Status register (port 0x64, read).
const STS_OBF: u8 = 0x01;
const STS_SYS: u8 = 0x04;
const STS_CMD: u8 = 0x08;
/// The keyboard-inhibit (keylock) switch is open: Linux warns otherwise.
const STS_UNLOCKED: u8 = 0x10;

// Command byte (internal RAM byte 0).
const CTR_KBD_INT: u8 = 0x01;
const CTR_SYS: u8 = 0x04;
const CTR_KBD_DISABLED: u8 = 0x10;
const CTR_AUX_DISABLED: u8 = 0x20;
const CTR_XLATE: u8 = 0x40;
/// What a PC BIOS leaves: translation on, keyboard interrupt on, POST
/// passed, no mouse.
const CTR_POWER_ON: u8 = CTR_XLATE | CTR_AUX_DISABLED | CTR_SYS | CTR_KBD_INT;

// Output port (0xD0/0xD1). Bit 0 is the CPU reset line, active low; bit 1
// is the A20 gate, which guest memory does not need (it is never masked).
const OUTP_RESET_HIGH: u8 = 0x01;
const OUTP_POWER_ON: u8 = 0x03;

// Controller commands (port 0x64, write).
const CMD_READ_RAM_FIRST: u8 = 0x20;
const CMD_READ_RAM_LAST: u8 = 0x3f;
const CMD_WRITE_RAM_FIRST: u8 = 0x60;
const CMD_WRITE_RAM_LAST: u8 = 0x7f;
const CMD_AUX_DISABLE: u8 = 0xa7;
const CMD_AUX_ENABLE: u8 = 0xa8;
const CMD_AUX_TEST: u8 = 0xa9;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_KBD_TEST: u8 = 0xab;
const CMD_KBD_DISABLE: u8 = 0xad;
const CMD_KBD_ENABLE: u8 = 0xae;
const CMD_READ_OUTPUT_PORT: u8 = 0xd0;
const CMD_WRITE_OUTPUT_PORT: u8 = 0xd1;
const CMD_WRITE_KBD_BUFFER: u8 = 0xd2;
const CMD_WRITE_AUX_BUFFER: u8 = 0xd3;
const CMD_WRITE_AUX: u8 = 0xd4;
const CMD_PULSE_FIRST: u8 = 0xf0;

// Controller answers.
const SELF_TEST_OK: u8 = 0x55;
const INTERFACE_OK: u8 = 0x00;
/// Aux interface test: clock line stuck high, what a port with nothing
/// attached reports (Linux then gives up on a mouse at once).
const AUX_NOTHING_ATTACHED: u8 = 0x02;

// Keyboard commands (port 0x60, write, no controller command pending).
const KBD_SET_LEDS: u8 = 0xed;
const KBD_ECHO: u8 = 0xee;
const KBD_SCANCODE_SET: u8 = 0xf0;
const KBD_IDENTIFY: u8 = 0xf2;
const KBD_TYPEMATIC: u8 = 0xf3;
const KBD_ENABLE: u8 = 0xf4;
const KBD_DISABLE: u8 = 0xf5;
const KBD_DEFAULTS: u8 = 0xf6;
const KBD_SET3_FIRST: u8 = 0xf7;
const KBD_SET3_LAST: u8 = 0xfd;
const KBD_RESEND: u8 = 0xfe;
const KBD_RESET: u8 = 0xff;

// Keyboard answers.
const KBD_ACK: u8 = 0xfa;
const KBD_NAK: u8 = 0xfe;
const KBD_SELF_TEST_OK: u8 = 0xaa;
/// A multifunction PS/2 keyboard (MF2): 0xAB 0x83.
const KBD_ID: [u8; 2] = [0xab, 0x83];
/// 10.9 characters/s after 500 ms, the PS/2 power-on typematic value.
const KBD_TYPEMATIC_DEFAULT: u8 = 0x2b;

/// The make codes of left Ctrl, left Alt and Delete in scancode sets 1, 2
/// and 3 (set 3 has no 0xE0 prefixes).
const CTRL_ALT_DEL_SET1: &[u8] = &[0x1d, 0x38, 0xe0, 0x53];
const CTRL_ALT_DEL_SET2: &[u8] = &[0x14, 0x11, 0xe0, 0x71];
const CTRL_ALT_DEL_SET3: &[u8] = &[0x11, 0x19, 0x64];

/// What the controller hands the guest for a byte the keyboard sent while
/// translation is on. A real 8042 maps every set-2 code to its set-1 code;
/// this keyboard only ever sends its answers and the Ctrl-Alt-Del make
/// codes, so only those are listed: the set-2 codes of Ctrl, Alt and Delete,
/// the identity's second byte (0xAB 0x83 reads 0xAB 0x41 through a
/// translating controller) and the scancode set numbers. The answers 0xFA,
/// 0xFE, 0xAA, 0xAB, 0xEE and the 0xE0 prefix pass unchanged, as they do on
/// a PC; so do the set-1 and set-3 codes, which a real controller would
/// garble (no driver selects set 1 or 3 behind a translating controller:
/// Linux keeps set 2 while translating).
fn translate(byte: u8) -> u8 {
    match byte {
        0x14 => 0x1d,
        0x11 => 0x38,
        0x71 => 0x53,
        0x83 => 0x41,
        0x01 => 0x43,
        0x02 => 0x41,
        0x03 => 0x3f,
        other => other,
    }
}

/// The byte in the controller's output register and where it came from.
#[derive(Debug, Clone, Copy)]
struct Output {
    byte: u8,
    /// From the keyboard buffer (counted against its bound) rather than a
    /// controller answer.
    from_kbd: bool,
}

/// The PS/2 keyboard's own state.
#[derive(Debug)]
struct Keyboard {
    /// Bytes sent to the controller, not yet in its output register
    /// (translated already if translation was on when they were sent).
    buffer: VecDeque<u8>,
    scanning: bool,
    /// Scancode set, 1 to 3.
    set: u8,
    leds: u8,
    typematic: u8,
    /// A command (0xED, 0xF3, 0xF0) waiting for its argument byte.
    awaiting_arg: Option<u8>,
    /// The last byte sent, untranslated, for 0xFE (resend).
    last_sent: u8,
}

impl Keyboard {
    fn new() -> Self {
        Keyboard {
            buffer: VecDeque::with_capacity(KBD_BUFFER_SIZE),
            scanning: true,
            set: 2,
            leds: 0,
            typematic: KBD_TYPEMATIC_DEFAULT,
            awaiting_arg: None,
            // The power-on self-test result the BIOS read.
            last_sent: KBD_SELF_TEST_OK,
        }
    }

    fn defaults(&mut self) {
        self.set = 2;
        self.typematic = KBD_TYPEMATIC_DEFAULT;
    }
}

/// The i8042 controller at ports 0x60 (offset 0, data) and 0x64 (offset 4,
/// command/status), with its keyboard.
#[derive(Debug)]
pub struct I8042 {
    reset_evt: EventFd,
    kbd_evt: EventFd,
    /// Internal RAM; byte 0 is the command byte.
    ram: [u8; 32],
    output_port: u8,
    sys_flag: bool,
    /// The last write went to port 0x64 (status bit 3).
    last_write_command: bool,
    /// A controller command waiting for its data-port byte.
    awaiting_data: Option<u8>,
    out: Option<Output>,
    /// What a data-port read returns while the output register is empty:
    /// the register keeps its last byte.
    last_out: u8,
    kbd: Keyboard,
    /// IRQ 1 as last signalled: output full and keyboard interrupt enabled.
    irq_level: bool,
}

impl I8042 {
    /// Creates the controller in its power-on state, with fresh reset and
    /// keyboard-interrupt `EventFd`s.
    pub fn new() -> Result<Self, I8042Error> {
        let evt = || EventFd::new(libc::EFD_NONBLOCK).map_err(I8042Error::CreateEventFd);
        let mut ram = [0u8; 32];
        ram[0] = CTR_POWER_ON;
        Ok(I8042 {
            reset_evt: evt()?,
            kbd_evt: evt()?,
            ram,
            output_port: OUTP_POWER_ON,
            sys_flag: true,
            last_write_command: false,
            awaiting_data: None,
            out: None,
            last_out: 0,
            kbd: Keyboard::new(),
            irq_level: false,
        })
    }

    /// Signalled when the guest pulses the CPU reset line.
    pub fn reset_evt(&self) -> &EventFd {
        &self.reset_evt
    }

    /// Signalled on every rising edge of IRQ 1 (register it as the irqfd of
    /// GSI 1).
    pub fn kbd_interrupt_evt(&self) -> &EventFd {
        &self.kbd_evt
    }

    /// Bytes waiting for the guest: the keyboard buffer and the output
    /// register. Never more than [`KBD_BUFFER_SIZE`] + 1.
    pub fn pending_bytes(&self) -> usize {
        self.kbd.buffer.len() + usize::from(self.out.is_some())
    }

    /// Presses Ctrl-Alt-Del: the keyboard sends the make codes of left
    /// Ctrl, left Alt and Delete in its current scancode set (set 2,
    /// `0x14 0x11 0xE0 0x71`, which a translating controller hands the
    /// guest as `0x1D 0x38 0xE0 0x53`) and IRQ 1 rises if the output
    /// register was empty and the guest enabled the interrupt. The keys are
    /// not released: the guest reboots on the combination.
    ///
    /// All or nothing: with too little room in the keyboard buffer (the
    /// guest is not reading it) nothing is queued and the error says so; a
    /// keyboard whose scanning the guest turned off sends nothing either.
    pub fn trigger_ctrl_alt_del(&mut self) -> Result<(), I8042Error> {
        if !self.kbd.scanning {
            return Err(I8042Error::ScanningDisabled);
        }
        let codes = match self.kbd.set {
            1 => CTRL_ALT_DEL_SET1,
            3 => CTRL_ALT_DEL_SET3,
            _ => CTRL_ALT_DEL_SET2,
        };
        let room = self.kbd_room();
        if codes.len() > room {
            return Err(I8042Error::BufferFull {
                needed: codes.len(),
                room,
            });
        }
        self.kbd_send(codes);
        self.update_irq().map_err(I8042Error::Interrupt)
    }

    /// Handles a guest read at `offset` from port 0x60; ports other than
    /// 0x60 and 0x64 read 0xff.
    pub fn read(&mut self, offset: u8) -> u8 {
        match u16::from(offset) {
            DATA_OFFSET => self.read_data(),
            COMMAND_OFFSET => self.status(),
            _ => 0xff,
        }
    }

    /// Handles a guest write of `value` at `offset` from port 0x60; writes
    /// to ports other than 0x60 and 0x64 are dropped.
    pub fn write(&mut self, offset: u8, value: u8) {
        match u16::from(offset) {
            DATA_OFFSET => self.write_data(value),
            COMMAND_OFFSET => self.write_command(value),
            _ => return,
        }
        self.guest_update_irq();
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

    fn ctr(&self) -> u8 {
        self.ram[0]
    }

    fn status(&self) -> u8 {
        let mut status = STS_UNLOCKED;
        if self.out.is_some() {
            status |= STS_OBF;
        }
        if self.sys_flag {
            status |= STS_SYS;
        }
        if self.last_write_command {
            status |= STS_CMD;
        }
        status
    }

    fn read_data(&mut self) -> u8 {
        if let Some(out) = self.out.take() {
            self.last_out = out.byte;
            // The line falls with the read; the next byte, if any, makes
            // a new edge.
            self.guest_update_irq();
            self.refill();
        }
        self.guest_update_irq();
        self.last_out
    }

    fn write_command(&mut self, cmd: u8) {
        self.last_write_command = true;
        // A new command abandons one still waiting for its byte.
        self.awaiting_data = None;
        match cmd {
            CMD_READ_RAM_FIRST..=CMD_READ_RAM_LAST => {
                self.answer(self.ram[usize::from(cmd - CMD_READ_RAM_FIRST)]);
            }
            CMD_WRITE_RAM_FIRST..=CMD_WRITE_RAM_LAST
            | CMD_WRITE_OUTPUT_PORT
            | CMD_WRITE_KBD_BUFFER
            | CMD_WRITE_AUX_BUFFER
            | CMD_WRITE_AUX => self.awaiting_data = Some(cmd),
            CMD_AUX_DISABLE => self.ram[0] |= CTR_AUX_DISABLED,
            CMD_AUX_ENABLE => self.ram[0] &= !CTR_AUX_DISABLED,
            CMD_AUX_TEST => self.answer(AUX_NOTHING_ATTACHED),
            CMD_SELF_TEST => {
                self.sys_flag = true;
                self.answer(SELF_TEST_OK);
            }
            CMD_KBD_TEST => self.answer(INTERFACE_OK),
            CMD_KBD_DISABLE => self.ram[0] |= CTR_KBD_DISABLED,
            CMD_KBD_ENABLE => {
                self.ram[0] &= !CTR_KBD_DISABLED;
                self.refill();
            }
            CMD_READ_OUTPUT_PORT => self.answer(self.output_port),
            // Bits 0-3 low pulse those output lines; bit 0 is reset.
            CMD_PULSE_FIRST..=0xff if cmd & OUTP_RESET_HIGH == 0 => self.pulse_reset(),
            _ => {}
        }
    }

    fn write_data(&mut self, value: u8) {
        self.last_write_command = false;
        match self.awaiting_data.take() {
            Some(cmd @ CMD_WRITE_RAM_FIRST..=CMD_WRITE_RAM_LAST) => {
                self.ram[usize::from(cmd - CMD_WRITE_RAM_FIRST)] = value;
                if cmd == CMD_WRITE_RAM_FIRST {
                    self.sys_flag = value & CTR_SYS != 0;
                    // The keyboard interface may have been enabled.
                    self.refill();
                }
            }
            Some(CMD_WRITE_OUTPUT_PORT) => {
                self.output_port = value;
                if value & OUTP_RESET_HIGH == 0 {
                    self.pulse_reset();
                }
            }
            Some(CMD_WRITE_KBD_BUFFER) => self.answer(value),
            // No mouse: the byte goes nowhere.
            Some(_) => {}
            None => self.keyboard_command(value),
        }
    }

    /// A byte for the keyboard: a command, or the argument of the one
    /// before.
    fn keyboard_command(&mut self, byte: u8) {
        if let Some(cmd) = self.kbd.awaiting_arg.take() {
            match cmd {
                KBD_SET_LEDS => {
                    self.kbd.leds = byte & 0x07;
                    self.kbd_answer(&[KBD_ACK]);
                }
                KBD_TYPEMATIC => {
                    self.kbd.typematic = byte & 0x7f;
                    self.kbd_answer(&[KBD_ACK]);
                }
                // KBD_SCANCODE_SET: 0 asks, 1-3 select.
                _ => match byte {
                    0 => self.kbd_answer(&[KBD_ACK, self.kbd.set]),
                    1..=3 => {
                        self.kbd.set = byte;
                        self.kbd_answer(&[KBD_ACK]);
                    }
                    _ => self.kbd_answer(&[KBD_NAK]),
                },
            }
            return;
        }
        match byte {
            KBD_SET_LEDS | KBD_TYPEMATIC | KBD_SCANCODE_SET => {
                self.kbd.awaiting_arg = Some(byte);
                self.kbd_answer(&[KBD_ACK]);
            }
            KBD_ECHO => self.kbd_answer(&[KBD_ECHO]),
            KBD_IDENTIFY => self.kbd_answer(&[KBD_ACK, KBD_ID[0], KBD_ID[1]]),
            // Enabling, disabling and resetting start from an empty buffer.
            KBD_ENABLE => {
                self.kbd.buffer.clear();
                self.kbd.scanning = true;
                self.kbd_answer(&[KBD_ACK]);
            }
            KBD_DISABLE => {
                self.kbd.buffer.clear();
                self.kbd.scanning = false;
                self.kbd.defaults();
                self.kbd_answer(&[KBD_ACK]);
            }
            KBD_DEFAULTS => {
                self.kbd.defaults();
                self.kbd_answer(&[KBD_ACK]);
            }
            KBD_SET3_FIRST..=KBD_SET3_LAST => self.kbd_answer(&[KBD_ACK]),
            KBD_RESEND => self.kbd_answer(&[self.kbd.last_sent]),
            KBD_RESET => {
                self.kbd.buffer.clear();
                self.kbd.scanning = true;
                self.kbd.leds = 0;
                self.kbd.defaults();
                self.kbd_answer(&[KBD_ACK, KBD_SELF_TEST_OK]);
            }
            _ => self.kbd_answer(&[KBD_NAK]),
        }
    }

    /// Free bytes in the keyboard buffer; a keyboard byte in the output
    /// register still counts (it may go back, see [`Self::answer`]).
    fn kbd_room(&self) -> usize {
        let held = usize::from(self.out.is_some_and(|o| o.from_kbd));
        KBD_BUFFER_SIZE.saturating_sub(self.kbd.buffer.len() + held)
    }

    /// The keyboard answers a command; an answer that does not fit whole is
    /// dropped (the guest sent commands without reading the answers).
    fn kbd_answer(&mut self, bytes: &[u8]) {
        if bytes.len() <= self.kbd_room() {
            self.kbd_send(bytes);
        } else {
            log::debug!("i8042: keyboard buffer full, answer {bytes:02x?} dropped");
        }
    }

    /// Sends `bytes` (which fit) from the keyboard to the controller.
    fn kbd_send(&mut self, bytes: &[u8]) {
        let xlate = self.ctr() & CTR_XLATE != 0;
        for &b in bytes {
            self.kbd
                .buffer
                .push_back(if xlate { translate(b) } else { b });
            self.kbd.last_sent = b;
        }
        self.refill();
    }

    /// Moves the next keyboard byte into an empty output register while the
    /// keyboard interface is enabled.
    fn refill(&mut self) {
        if self.out.is_some() || self.ctr() & CTR_KBD_DISABLED != 0 {
            return;
        }
        if let Some(byte) = self.kbd.buffer.pop_front() {
            self.out = Some(Output {
                byte,
                from_kbd: true,
            });
        }
    }

    /// A controller answer: it takes the output register at once.
    fn answer(&mut self, byte: u8) {
        if let Some(out) = self.out.take() {
            if out.from_kbd {
                // Counted in `kbd_room` all along: the bound holds.
                self.kbd.buffer.push_front(out.byte);
            }
        }
        self.out = Some(Output {
            byte,
            from_kbd: false,
        });
    }

    fn pulse_reset(&mut self) {
        // Failing to signal is a host problem (the eventfd counter cannot
        // realistically saturate); log it, the guest keeps running.
        if let Err(e) = self.reset_evt.write(1) {
            log::error!("i8042: failed to signal the reset event: {e}");
        }
    }

    /// Signals IRQ 1 if the line just rose.
    fn update_irq(&mut self) -> io::Result<()> {
        let level = self.out.is_some() && self.ctr() & CTR_KBD_INT != 0;
        let rose = level && !self.irq_level;
        self.irq_level = level;
        if rose {
            self.kbd_evt.write(1)?;
        }
        Ok(())
    }

    /// [`Self::update_irq`] on a guest access: a failure is the host's and
    /// only logged.
    fn guest_update_irq(&mut self) {
        if let Err(e) = self.update_irq() {
            log::error!("i8042: failed to signal the keyboard interrupt: {e}");
        }
    }
}

/// The controller and its keyboard in a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct I8042Snapshot {
    /// Internal RAM; byte 0 is the command byte.
    pub ram: Vec<u8>,
    /// The output port.
    pub output_port: u8,
    /// The status register's system flag.
    pub sys_flag: bool,
    /// The last write went to the command port.
    pub last_write_command: bool,
    /// A command waiting for its data byte.
    pub awaiting_data: Option<u8>,
    /// The output register: its byte and whether the keyboard sent it.
    pub out: Option<(u8, bool)>,
    /// The output register's last byte.
    pub last_out: u8,
    /// The keyboard's bytes not yet in the output register.
    pub kbd_buffer: Vec<u8>,
    /// Keyboard scanning on.
    pub kbd_scanning: bool,
    /// Scancode set (1 to 3).
    pub kbd_set: u8,
    /// LEDs.
    pub kbd_leds: u8,
    /// Typematic rate and delay.
    pub kbd_typematic: u8,
    /// A keyboard command waiting for its argument.
    pub kbd_awaiting_arg: Option<u8>,
    /// The keyboard's last byte, for resend.
    pub kbd_last_sent: u8,
    /// IRQ 1 as last signalled.
    pub irq_level: bool,
}

impl I8042 {
    /// The controller's state for a snapshot.
    pub fn save(&self) -> I8042Snapshot {
        I8042Snapshot {
            ram: self.ram.to_vec(),
            output_port: self.output_port,
            sys_flag: self.sys_flag,
            last_write_command: self.last_write_command,
            awaiting_data: self.awaiting_data,
            out: self.out.map(|o| (o.byte, o.from_kbd)),
            last_out: self.last_out,
            kbd_buffer: self.kbd.buffer.iter().copied().collect(),
            kbd_scanning: self.kbd.scanning,
            kbd_set: self.kbd.set,
            kbd_leds: self.kbd.leds,
            kbd_typematic: self.kbd.typematic,
            kbd_awaiting_arg: self.kbd.awaiting_arg,
            kbd_last_sent: self.kbd.last_sent,
            irq_level: self.irq_level,
        }
    }

    /// Takes back a saved state, keeping this controller's descriptors. A
    /// state no guest could have produced (a RAM of another size, a
    /// keyboard buffer over its bound, an unknown scancode set) is refused
    /// and changes nothing.
    pub fn restore(&mut self, saved: &I8042Snapshot) -> Result<(), I8042Error> {
        let ram: [u8; 32] = saved
            .ram
            .as_slice()
            .try_into()
            .map_err(|_| I8042Error::Restore("RAM is not 32 bytes"))?;
        if saved.kbd_buffer.len() > KBD_BUFFER_SIZE {
            return Err(I8042Error::Restore("keyboard buffer over its bound"));
        }
        if !(1..=3).contains(&saved.kbd_set) {
            return Err(I8042Error::Restore("unknown scancode set"));
        }
        self.ram = ram;
        self.output_port = saved.output_port;
        self.sys_flag = saved.sys_flag;
        self.last_write_command = saved.last_write_command;
        self.awaiting_data = saved.awaiting_data;
        self.out = saved.out.map(|(byte, from_kbd)| Output { byte, from_kbd });
        self.last_out = saved.last_out;
        self.kbd.buffer = saved.kbd_buffer.iter().copied().collect();
        self.kbd.scanning = saved.kbd_scanning;
        self.kbd.set = saved.kbd_set;
        self.kbd.leds = saved.kbd_leds;
        self.kbd.typematic = saved.kbd_typematic;
        self.kbd.awaiting_arg = saved.kbd_awaiting_arg;
        self.kbd.last_sent = saved.kbd_last_sent;
        self.irq_level = saved.irq_level;
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_restored_controller_answers_as_the_saved_one() {
        let mut a = I8042::new().unwrap();
        // The guest writes the command byte, then Ctrl-Alt-Del is queued.
        a.write(COMMAND_OFFSET as u8, 0x60);
        a.write(DATA_OFFSET as u8, 0x47);
        a.trigger_ctrl_alt_del().unwrap();
        let saved = a.save();
        let text = serde_json::to_string(&saved).unwrap();
        let saved: I8042Snapshot = serde_json::from_str(&text).unwrap();
        let mut b = I8042::new().unwrap();
        b.restore(&saved).unwrap();
        assert_eq!(b.save(), saved);
        assert_eq!(b.pending_bytes(), a.pending_bytes());
        for _ in 0..a.pending_bytes() {
            assert_eq!(b.read(DATA_OFFSET as u8), a.read(DATA_OFFSET as u8));
        }
        for (bad, why) in [
            (
                I8042Snapshot {
                    ram: vec![0; 31],
                    ..saved.clone()
                },
                "RAM",
            ),
            (
                I8042Snapshot {
                    kbd_buffer: vec![0; KBD_BUFFER_SIZE + 1],
                    ..saved.clone()
                },
                "bound",
            ),
            (
                I8042Snapshot {
                    kbd_set: 4,
                    ..saved.clone()
                },
                "scancode",
            ),
        ] {
            let before = b.save();
            let err = b.restore(&bad).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert_eq!(b.save(), before, "a refused state changed nothing");
        }
    }
    use super::*;

    fn cmd(i: &mut I8042, c: u8) {
        i.write(4, c);
    }

    fn data(i: &mut I8042, d: u8) {
        i.write(0, d);
    }

    /// Every byte waiting, read the way a polling driver does; the
    /// interrupts those reads raised are consumed.
    fn drain(i: &mut I8042) -> Vec<u8> {
        let mut got = Vec::new();
        while i.read(4) & STS_OBF != 0 {
            got.push(i.read(0));
            assert!(got.len() <= KBD_BUFFER_SIZE + 1, "endless output");
        }
        interrupts(i);
        got
    }

    fn interrupts(i: &I8042) -> u64 {
        i.kbd_interrupt_evt().read().unwrap_or(0)
    }

    fn resets(i: &I8042) -> u64 {
        i.reset_evt().read().unwrap_or(0)
    }

    /// Linux's `__i8042_command`: wait for an empty input buffer, write the
    /// command, its parameters to the data port, then wait for and read each
    /// answer byte; `None` where the driver would time out.
    fn linux_command(i: &mut I8042, command: u8, params: &[u8], answers: usize) -> Option<Vec<u8>> {
        const TIMEOUT: usize = 100;
        let wait_write = |i: &mut I8042| (0..TIMEOUT).any(|_| i.read(4) & 0x02 == 0);
        assert!(wait_write(i));
        i.write(4, command);
        for &p in params {
            assert!(wait_write(i));
            i.write(0, p);
        }
        let mut got = Vec::new();
        for _ in 0..answers {
            if !(0..TIMEOUT).any(|_| i.read(4) & STS_OBF != 0) {
                return None;
            }
            got.push(i.read(0));
        }
        Some(got)
    }

    /// A keyboard command as Linux's ps2_command sends it: the byte, then
    /// the answer bytes, each announced by an interrupt.
    fn kbd_command(i: &mut I8042, byte: u8, answers: usize) -> Vec<u8> {
        data(i, byte);
        let mut got = Vec::new();
        for _ in 0..answers {
            assert_eq!(interrupts(i), 1, "one interrupt per answer byte");
            got.push(i.read(0));
        }
        assert_eq!(interrupts(i), 0, "an interrupt without data");
        assert_eq!(i.read(4) & STS_OBF, 0, "more than {answers} answer bytes");
        got
    }

    #[test]
    fn power_on_state_is_what_a_bios_leaves() {
        let mut i = I8042::new().unwrap();
        // Keyboard not inhibited, system flag, nothing to read.
        assert_eq!(i.read(4), STS_UNLOCKED | STS_SYS);
        assert_eq!(linux_command(&mut i, 0x20, &[], 1), Some(vec![0x65]));
        assert_eq!(linux_command(&mut i, 0xd0, &[], 1), Some(vec![0x03]));
        assert_eq!(i.pending_bytes(), 0);
        assert_eq!(resets(&i), 0);
    }

    #[test]
    fn controller_commands_answer_as_an_8042() {
        let mut i = I8042::new().unwrap();
        for (command, answer) in [(0xaa, 0x55), (0xab, 0x00), (0xa9, 0x02)] {
            assert_eq!(linux_command(&mut i, command, &[], 1), Some(vec![answer]));
        }
        // The command byte and the rest of the RAM read back what was
        // written; the status's system flag follows the command byte's.
        assert_eq!(linux_command(&mut i, 0x60, &[0x30], 0), Some(vec![]));
        assert_eq!(i.read(4) & STS_SYS, 0);
        assert_eq!(linux_command(&mut i, 0x20, &[], 1), Some(vec![0x30]));
        assert_eq!(linux_command(&mut i, 0x7f, &[0x5a], 0), Some(vec![]));
        assert_eq!(linux_command(&mut i, 0x3f, &[], 1), Some(vec![0x5a]));
        assert_eq!(linux_command(&mut i, 0x21, &[], 1), Some(vec![0]));
        // Self-test sets the system flag again.
        assert_eq!(linux_command(&mut i, 0xaa, &[], 1), Some(vec![0x55]));
        assert_ne!(i.read(4) & STS_SYS, 0);
        // Keyboard interface disable and enable are command byte bits, and
        // so are the aux ones.
        cmd(&mut i, 0xae);
        cmd(&mut i, 0xa8);
        assert_eq!(linux_command(&mut i, 0x20, &[], 1), Some(vec![0x00]));
        cmd(&mut i, 0xad);
        cmd(&mut i, 0xa7);
        assert_eq!(linux_command(&mut i, 0x20, &[], 1), Some(vec![0x30]));
        // Output port.
        assert_eq!(linux_command(&mut i, 0xd1, &[0xdf], 0), Some(vec![]));
        assert_eq!(linux_command(&mut i, 0xd0, &[], 1), Some(vec![0xdf]));
        // 0xD2: the byte comes back as keyboard data.
        assert_eq!(linux_command(&mut i, 0xd2, &[0x99], 1), Some(vec![0x99]));
        // No mouse: the aux loop and aux write answer nothing.
        assert_eq!(linux_command(&mut i, 0xd3, &[0x5a], 1), None);
        assert_eq!(linux_command(&mut i, 0xd4, &[0xff], 1), None);
        // Unknown commands are ignored.
        for c in [0x00, 0x10, 0xc0, 0xca, 0xcb, 0xe0] {
            assert_eq!(linux_command(&mut i, c, &[], 1), None, "command {c:#x}");
        }
        assert_eq!(resets(&i), 0);
    }

    #[test]
    fn status_tells_which_port_was_written_last() {
        let mut i = I8042::new().unwrap();
        assert_eq!(i.read(4) & STS_CMD, 0);
        cmd(&mut i, 0x60);
        assert_ne!(i.read(4) & STS_CMD, 0);
        data(&mut i, 0x65);
        assert_eq!(i.read(4) & STS_CMD, 0);
        // The input buffer is never full: every write is taken at once.
        assert_eq!(i.read(4) & 0x02, 0);
    }

    #[test]
    fn keyboard_commands_answer_as_a_ps2_keyboard() {
        let mut i = I8042::new().unwrap();
        // Untranslated, to see the keyboard's own bytes.
        assert_eq!(linux_command(&mut i, 0x60, &[0x25], 0), Some(vec![]));
        let cases: &[(&[u8], &[u8])] = &[
            (&[0xff], &[0xfa, 0xaa]),
            (&[0xf2], &[0xfa, 0xab, 0x83]),
            (&[0xf4], &[0xfa]),
            (&[0xf5], &[0xfa]),
            (&[0xf6], &[0xfa]),
            (&[0xed, 0x07], &[0xfa, 0xfa]),
            (&[0xf3, 0x20], &[0xfa, 0xfa]),
            (&[0xf0, 0x00], &[0xfa, 0xfa, 0x02]),
            (&[0xf0, 0x03], &[0xfa, 0xfa]),
            (&[0xf0, 0x00], &[0xfa, 0xfa, 0x03]),
            (&[0xf0, 0x01], &[0xfa, 0xfa]),
            (&[0xf0, 0x00], &[0xfa, 0xfa, 0x01]),
            (&[0xf0, 0x04], &[0xfa, 0xfe]),
            (&[0xee], &[0xee]),
            (&[0xf7], &[0xfa]),
            (&[0xfd], &[0xfa]),
            // Resend repeats the last byte sent.
            (&[0xfe], &[0xfa]),
            (&[0xf2, 0xfe], &[0xfa, 0xab, 0x83, 0x83]),
            // Not a command.
            (&[0x42], &[0xfe]),
            (&[0xf1], &[0xfe]),
            // Reset goes back to set 2 and enables scanning.
            (
                &[0xf5, 0xff, 0xf0, 0x00],
                &[0xfa, 0xfa, 0xaa, 0xfa, 0xfa, 0x02],
            ),
        ];
        for (sent, want) in cases {
            for &b in *sent {
                data(&mut i, b);
            }
            assert_eq!(drain(&mut i), *want, "after {sent:02x?}");
        }
        assert!(i.trigger_ctrl_alt_del().is_ok(), "scanning after reset");
    }

    #[test]
    fn a_translating_controller_hands_over_set_1() {
        let mut i = I8042::new().unwrap();
        data(&mut i, 0xf2);
        assert_eq!(drain(&mut i), [0xfa, 0xab, 0x41]);
        data(&mut i, 0xf0);
        data(&mut i, 0x00);
        assert_eq!(drain(&mut i), [0xfa, 0xfa, 0x41]);
    }

    /// What Linux 6.1's i8042 driver does at boot (i8042_platform_init,
    /// i8042_controller_check, i8042_controller_init, then
    /// i8042_setup_kbd), and, without `i8042.dumbkbd`, atkbd's probe and
    /// activation through the keyboard port.
    #[test]
    fn linux_probes_the_controller_and_the_keyboard() {
        let mut i = I8042::new().unwrap();
        // A20 on through the output port, then the null command for SMM
        // firmware: neither resets.
        assert_eq!(linux_command(&mut i, 0xd1, &[0xdf], 0), Some(vec![]));
        assert_eq!(linux_command(&mut i, 0xff, &[], 0), Some(vec![]));
        assert_eq!(resets(&i), 0);
        // Controller check: the flush finds nothing.
        assert!(drain(&mut i).is_empty());
        // Controller init: two equal reads of the command byte, keylock off,
        // keyboard disabled with its interrupt, translation kept.
        let a = linux_command(&mut i, 0x20, &[], 1).unwrap();
        let b = linux_command(&mut i, 0x20, &[], 1).unwrap();
        assert_eq!(a, b);
        let mut ctr = a[0];
        assert_ne!(i.read(4) & STS_UNLOCKED, 0, "keylock");
        assert_ne!(ctr & CTR_XLATE, 0, "translated by the BIOS");
        ctr = (ctr | CTR_KBD_DISABLED) & !CTR_KBD_INT;
        assert_eq!(linux_command(&mut i, 0x60, &[ctr], 0), Some(vec![]));
        // Each command byte read raised IRQ 1 (the BIOS left the interrupt
        // on), which no handler takes yet, as on a PC.
        assert_eq!(interrupts(&i), 2);
        assert!(drain(&mut i).is_empty());
        // i8042_setup_kbd: IRQ 1 requested, the port enabled with its
        // interrupt.
        ctr = (ctr & !CTR_KBD_DISABLED) | CTR_KBD_INT;
        assert_eq!(linux_command(&mut i, 0x60, &[ctr], 0), Some(vec![]));
        assert_eq!(interrupts(&i), 0, "nothing to read yet");
        // atkbd_probe: identify (translated), deactivate; then
        // atkbd_reset_state (LEDs off, typematic) and atkbd_activate.
        assert_eq!(kbd_command(&mut i, 0xf2, 3), [0xfa, 0xab, 0x41]);
        assert_eq!(kbd_command(&mut i, 0xf5, 1), [0xfa]);
        assert_eq!(kbd_command(&mut i, 0xed, 1), [0xfa]);
        assert_eq!(kbd_command(&mut i, 0x00, 1), [0xfa]);
        assert_eq!(kbd_command(&mut i, 0xf3, 1), [0xfa]);
        assert_eq!(kbd_command(&mut i, 0x00, 1), [0xfa]);
        assert_eq!(kbd_command(&mut i, 0xf4, 1), [0xfa]);
        // And the keys arrive, one interrupt per byte.
        i.trigger_ctrl_alt_del().unwrap();
        let mut got = Vec::new();
        while interrupts(&i) == 1 {
            got.push(i.read(0));
        }
        assert_eq!(got, [0x1d, 0x38, 0xe0, 0x53]);
        assert_eq!(i.read(4) & STS_OBF, 0);
        // With the driver's direct mode (`i8042.direct`, or a BIOS that
        // left translation off) the guest reads set 2.
        ctr &= !CTR_XLATE;
        assert_eq!(linux_command(&mut i, 0x60, &[ctr], 0), Some(vec![]));
        i.trigger_ctrl_alt_del().unwrap();
        assert_eq!(drain(&mut i), [0x14, 0x11, 0xe0, 0x71]);
    }

    #[test]
    fn ctrl_alt_del_raises_irq_1_once_per_byte() {
        let mut i = I8042::new().unwrap();
        i.trigger_ctrl_alt_del().unwrap();
        assert_eq!(i.pending_bytes(), 4);
        assert_ne!(i.read(4) & STS_OBF, 0);
        for (n, want) in [0x1d, 0x38, 0xe0, 0x53].into_iter().enumerate() {
            assert_eq!(interrupts(&i), 1, "interrupt for byte {n}");
            assert_eq!(i.read(0), want);
        }
        assert_eq!(interrupts(&i), 0);
        assert_eq!(i.read(4) & STS_OBF, 0);
        // The output register keeps its last byte.
        assert_eq!(i.read(0), 0x53);
        assert_eq!(interrupts(&i), 0);
        // Scancode set 3 (no prefix), untranslated.
        assert_eq!(linux_command(&mut i, 0x60, &[0x25], 0), Some(vec![]));
        data(&mut i, 0xf0);
        data(&mut i, 0x03);
        assert_eq!(drain(&mut i), [0xfa, 0xfa]);
        i.trigger_ctrl_alt_del().unwrap();
        assert_eq!(drain(&mut i), [0x11, 0x19, 0x64]);
        data(&mut i, 0xf0);
        data(&mut i, 0x01);
        drain(&mut i);
        i.trigger_ctrl_alt_del().unwrap();
        assert_eq!(drain(&mut i), [0x1d, 0x38, 0xe0, 0x53]);
    }

    #[test]
    fn the_interrupt_follows_the_command_byte() {
        let mut i = I8042::new().unwrap();
        // Interrupt off: the bytes wait, no interrupt.
        assert_eq!(linux_command(&mut i, 0x60, &[0x64], 0), Some(vec![]));
        i.trigger_ctrl_alt_del().unwrap();
        assert_eq!(interrupts(&i), 0);
        // Turning it on with a byte waiting raises the line.
        assert_eq!(linux_command(&mut i, 0x60, &[0x65], 0), Some(vec![]));
        assert_eq!(interrupts(&i), 1);
        assert_eq!(drain(&mut i), [0x1d, 0x38, 0xe0, 0x53]);
        // Keyboard interface disabled: the keys wait in the keyboard, the
        // guest sees nothing until it enables the interface again.
        cmd(&mut i, 0xad);
        i.trigger_ctrl_alt_del().unwrap();
        assert_eq!(i.read(4) & STS_OBF, 0);
        assert_eq!(interrupts(&i), 0);
        cmd(&mut i, 0xae);
        assert_eq!(interrupts(&i), 1);
        assert_eq!(drain(&mut i), [0x1d, 0x38, 0xe0, 0x53]);
        // Scanning off: the keyboard sends no keys.
        data(&mut i, 0xf5);
        assert_eq!(drain(&mut i), [0xfa]);
        assert!(matches!(
            i.trigger_ctrl_alt_del(),
            Err(I8042Error::ScanningDisabled)
        ));
        assert_eq!(i.pending_bytes(), 0);
    }

    #[test]
    fn a_controller_answer_goes_before_waiting_keys() {
        let mut i = I8042::new().unwrap();
        i.trigger_ctrl_alt_del().unwrap();
        // The guest polls for the command byte while a key waits in the
        // output register: it gets the command byte, then every key.
        assert_eq!(linux_command(&mut i, 0x20, &[], 1), Some(vec![0x65]));
        assert_eq!(drain(&mut i), [0x1d, 0x38, 0xe0, 0x53]);
    }

    #[test]
    fn the_keyboard_buffer_is_bounded() {
        let mut i = I8042::new().unwrap();
        // 16 bytes in the keyboard (one of them in the output register).
        for _ in 0..KBD_BUFFER_SIZE / 4 {
            i.trigger_ctrl_alt_del().unwrap();
        }
        assert_eq!(i.pending_bytes(), KBD_BUFFER_SIZE);
        match i.trigger_ctrl_alt_del() {
            Err(I8042Error::BufferFull { needed: 4, room: 0 }) => {}
            other => panic!("want BufferFull, got {other:?}"),
        }
        assert_eq!(i.pending_bytes(), KBD_BUFFER_SIZE);
        // A guest that never reads cannot grow it with commands either: the
        // keyboard's answers are dropped, a controller answer takes only
        // the output register.
        for _ in 0..1000 {
            data(&mut i, 0xf2);
            data(&mut i, 0xee);
            cmd(&mut i, 0x20);
            assert!(i.pending_bytes() <= KBD_BUFFER_SIZE + 1);
        }
        // Room for 3 of 4: still all or nothing.
        let mut i = I8042::new().unwrap();
        for _ in 0..3 {
            i.trigger_ctrl_alt_del().unwrap();
        }
        data(&mut i, 0xee);
        match i.trigger_ctrl_alt_del() {
            Err(I8042Error::BufferFull { needed: 4, room: 3 }) => {}
            other => panic!("want BufferFull, got {other:?}"),
        }
        let got = drain(&mut i);
        assert_eq!(got.len(), 13);
        assert_eq!(got[12], 0xee);
        // Drained, it takes keys again.
        i.trigger_ctrl_alt_del().unwrap();
        assert_eq!(drain(&mut i), [0x1d, 0x38, 0xe0, 0x53]);
    }

    #[test]
    fn reset_pulse_signals_the_reset_event() {
        let mut i = I8042::new().unwrap();
        i.write(4, 0xfe);
        assert_eq!(resets(&i), 1);
        // Every pulse command with bit 0 low pulses the reset line.
        for c in 0xf0..=0xffu8 {
            i.write(4, c);
            assert_eq!(resets(&i), u64::from(c & 1 == 0), "command {c:#x}");
        }
        // So does writing the output port with bit 0 low.
        assert_eq!(linux_command(&mut i, 0xd1, &[0xde], 0), Some(vec![]));
        assert_eq!(resets(&i), 1);
        assert_eq!(linux_command(&mut i, 0xd1, &[0xdf], 0), Some(vec![]));
        assert_eq!(resets(&i), 0);
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
        // The 0x00 went to the keyboard, which did not understand it.
        let mut bytes = [0u8; 4];
        i.pio_read(DATA_OFFSET, &mut bytes);
        assert_eq!(bytes, [0xfe, 0xff, 0xff, 0xff]);
        let mut status = [0u8; 2];
        i.pio_read(COMMAND_OFFSET, &mut status);
        assert_eq!(status, [STS_UNLOCKED | STS_SYS | STS_CMD, 0xff]);
    }

    #[test]
    fn other_writes_do_not_signal() {
        let mut i = I8042::new().unwrap();
        // 0xFE on the data port, other commands on the command port.
        i.write(0, 0xfe);
        for c in [0x20, 0x60, 0xaa, 0xad, 0xd1, 0xff] {
            i.write(4, c);
        }
        assert!(i.reset_evt().read().is_err(), "reset signalled");
        // Offsets the controller does not decode.
        i.write(1, 0xfe);
        i.write(5, 0xfe);
        assert!(i.reset_evt().read().is_err(), "reset signalled");
        assert_eq!(i.read(1), 0xff);
    }
}
