// SPDX-License-Identifier: Apache-2.0
//! Legacy PC devices: the 8250 UART, the i8042 keyboard controller and
//! QEMU's pvpanic register.
//!
//! The first two are 8-bit ISA devices. An x86 `in`/`out` of 2 or 4 bytes to such a
//! device is split by the bus into byte cycles on consecutive ports, lowest
//! byte first (`out 0x3f8, ax` writes AL to THR and AH to IER), so each
//! device serves a wide access register by register through `split_read`
//! and `split_write`. A byte that falls on a port the device does not
//! decode reads as all ones (a floating ISA bus) and is dropped on write.
pub mod i8042;
pub mod pvpanic;
pub mod serial;

/// Fills `data` from consecutive registers starting at `offset`; `read`
/// returns `None` for an offset the device does not decode.
pub(crate) fn split_read(offset: u16, data: &mut [u8], mut read: impl FnMut(u16) -> Option<u8>) {
    for (i, byte) in data.iter_mut().enumerate() {
        *byte = port_offset(offset, i).and_then(&mut read).unwrap_or(0xff);
    }
}

/// Writes `data` to consecutive registers starting at `offset`; `write`
/// ignores an offset the device does not decode.
pub(crate) fn split_write(offset: u16, data: &[u8], mut write: impl FnMut(u16, u8)) {
    for (i, &byte) in data.iter().enumerate() {
        if let Some(off) = port_offset(offset, i) {
            write(off, byte);
        }
    }
}

/// The offset of byte `i` of an access at `offset`, if it is still a port
/// (the x86 port space ends at 0xffff).
fn port_offset(offset: u16, i: usize) -> Option<u16> {
    u16::try_from(i).ok().and_then(|i| offset.checked_add(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wide_accesses_cover_consecutive_registers() {
        let regs = [10u8, 11, 12];
        let mut data = [0u8; 4];
        split_read(1, &mut data, |off| regs.get(usize::from(off)).copied());
        assert_eq!(data, [11, 12, 0xff, 0xff]);

        let mut seen = Vec::new();
        split_write(2, &[1, 2, 3], |off, v| seen.push((off, v)));
        assert_eq!(seen, [(2, 1), (3, 2), (4, 3)]);
    }

    #[test]
    fn bytes_past_the_port_space_float() {
        let mut data = [0u8; 2];
        split_read(u16::MAX, &mut data, |_| Some(7));
        assert_eq!(data, [7, 0xff]);
        let mut seen = Vec::new();
        split_write(u16::MAX, &[1, 2], |off, v| seen.push((off, v)));
        assert_eq!(seen, [(u16::MAX, 1)]);
    }
}
