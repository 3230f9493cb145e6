// SPDX-License-Identifier: Apache-2.0
//! The pvpanic device: the guest kernel's own word that it panicked.
//!
//! QEMU's pvpanic is one 8-bit register. Reading it gives the events the
//! device supports; the guest kernel's pvpanic driver reads it once when it
//! binds and, from its panic notifier (the first one `panic()` calls),
//! writes the event: [`PVPANIC_PANICKED`], or [`PVPANIC_CRASH_LOADED`] when
//! a crash kernel is loaded and is about to take over. The write comes from
//! kernel code on the panicking CPU, before the kernel resets or halts, so
//! whoever watches the register learns of the panic from the kernel itself
//! rather than from text a guest process could also print on the console.
//! The register sits where guest userspace cannot reach it; where that is
//! is the VMM's choice (see `vmm::device_manager`).
//!
//! This is the device logic only, with no I/O: [`PvPanic::write`] says what
//! the guest reported and the VMM acts on it. Bits the device does not
//! support are ignored, as QEMU ignores the ones it does not offer (newer
//! kernels than 6.1 know a third bit, `PVPANIC_SHUTDOWN`, which a driver
//! sends only when the read offers it); a write of them alone reports
//! nothing. Only the register's byte is decoded: other bytes
//! of a wider access read as all ones and are dropped on write, as on an
//! 8-bit bus.

/// The guest kernel panicked (`PVPANIC_PANICKED`, `1 << 0` in Linux's
/// `include/uapi/misc/pvpanic.h`; no bindings crate carries that header).
pub const PVPANIC_PANICKED: u8 = 0x01;
/// The guest kernel panicked and a crash kernel (kdump) is loaded
/// (`PVPANIC_CRASH_LOADED`, `1 << 1` in the same header).
pub const PVPANIC_CRASH_LOADED: u8 = 0x02;
/// The events this device supports, both of the above: what a read of the
/// register returns, and what the driver masks its writes with.
pub const PVPANIC_SUPPORTED: u8 = 0x03;
/// Bytes of the device's window: the one register.
pub const PVPANIC_SIZE: u64 = 1;

/// What a write to the register reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PanicEvent {
    /// The supported event bits of this write (never 0).
    pub events: u8,
    /// Whether this is the first write that reported an event: the VMM
    /// logs that one.
    pub first: bool,
}

impl PanicEvent {
    /// Whether a crash kernel is taking over ([`PVPANIC_CRASH_LOADED`]).
    pub fn crash_loaded(&self) -> bool {
        self.events & PVPANIC_CRASH_LOADED != 0
    }
}

/// The pvpanic register and the events the guest has reported.
#[derive(Debug, Default)]
pub struct PvPanic {
    /// Every supported event bit the guest has written, accumulated.
    reported: u8,
}

impl PvPanic {
    /// A device to which the guest has reported nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A read of `data.len()` bytes at `offset` in the window: the
    /// register gives the supported events.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = if offset.checked_add(i as u64) == Some(0) {
                PVPANIC_SUPPORTED
            } else {
                0xff
            };
        }
    }

    /// A write of `data` at `offset` in the window. Returns the event the
    /// guest reported, if the register's byte carries a supported one.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Option<PanicEvent> {
        let byte = match (offset, data.first()) {
            (0, Some(&b)) => b,
            _ => return None,
        };
        let events = byte & PVPANIC_SUPPORTED;
        if events == 0 {
            return None;
        }
        let first = self.reported == 0;
        self.reported |= events;
        Some(PanicEvent { events, first })
    }

    /// Every supported event the guest has reported so far (0: none).
    pub fn reported(&self) -> u8 {
        self.reported
    }

    /// Whether the guest kernel has reported a panic of any kind.
    pub fn panicked(&self) -> bool {
        self.reported != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_supported_events_are_linux_s_two_bits() {
        assert_eq!(PVPANIC_PANICKED, 1 << 0);
        assert_eq!(PVPANIC_CRASH_LOADED, 1 << 1);
        assert_eq!(PVPANIC_SUPPORTED, PVPANIC_PANICKED | PVPANIC_CRASH_LOADED);
    }

    #[test]
    fn the_register_reads_the_supported_events_and_nothing_else_decodes() {
        let dev = PvPanic::new();
        let mut b = [0u8; 1];
        dev.read(0, &mut b);
        assert_eq!(b, [0b11]);
        // A wider read: the register, then bytes nobody decodes.
        let mut w = [0u8; 4];
        dev.read(0, &mut w);
        assert_eq!(w, [PVPANIC_SUPPORTED, 0xff, 0xff, 0xff]);
        let mut off = [0u8; 2];
        dev.read(1, &mut off);
        assert_eq!(off, [0xff, 0xff]);
        dev.read(u64::MAX, &mut off);
        assert_eq!(off, [0xff, 0xff]);
        // Reading reports nothing.
        assert!(!dev.panicked());
    }

    #[test]
    fn a_panic_is_reported_once_as_first_and_accumulates() {
        let mut dev = PvPanic::new();
        assert_eq!(
            dev.write(0, &[PVPANIC_PANICKED]),
            Some(PanicEvent {
                events: PVPANIC_PANICKED,
                first: true
            })
        );
        assert!(dev.panicked());
        let again = dev.write(0, &[PVPANIC_CRASH_LOADED]).unwrap();
        assert!(!again.first);
        assert!(again.crash_loaded());
        assert_eq!(dev.reported(), PVPANIC_SUPPORTED);
    }

    #[test]
    fn crash_loaded_alone_is_a_panic() {
        let mut dev = PvPanic::new();
        let ev = dev.write(0, &[PVPANIC_CRASH_LOADED]).unwrap();
        assert!(ev.first && ev.crash_loaded());
        assert!(dev.panicked());
        assert_eq!(dev.reported(), PVPANIC_CRASH_LOADED);
    }

    #[test]
    fn unsupported_bits_and_other_bytes_report_nothing() {
        let mut dev = PvPanic::new();
        // 0, the newer PVPANIC_SHUTDOWN bit, every other unsupported bit.
        for v in [0u8, 1 << 2, 0xfc] {
            assert_eq!(dev.write(0, &[v]), None, "{v:#x}");
        }
        // A write past the register, or of nothing.
        assert_eq!(dev.write(1, &[PVPANIC_PANICKED]), None);
        assert_eq!(dev.write(u64::MAX, &[0xff]), None);
        assert_eq!(dev.write(0, &[]), None);
        assert!(!dev.panicked());
        // Supported bits among unsupported ones count, and only they.
        let ev = dev.write(0, &[0xfd]).unwrap();
        assert_eq!(ev.events, PVPANIC_PANICKED);
        assert!(!ev.crash_loaded());
        assert_eq!(dev.reported(), PVPANIC_PANICKED);
    }

    #[test]
    fn a_wide_write_counts_its_first_byte_only() {
        let mut dev = PvPanic::new();
        // A 16-bit store whose second byte would be a panic.
        assert_eq!(dev.write(0, &[0, PVPANIC_PANICKED]), None);
        assert!(!dev.panicked());
        let ev = dev.write(0, &[PVPANIC_PANICKED, 0, 0, 0]).unwrap();
        assert_eq!(ev.events, PVPANIC_PANICKED);
    }
}
