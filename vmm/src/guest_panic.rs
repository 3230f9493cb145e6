// SPDX-License-Identifier: Apache-2.0
//! How minivmm learns that the guest kernel panicked.
//!
//! Only the guest kernel can say so: its pvpanic driver writes QEMU's
//! pvpanic register ([`devices::legacy::pvpanic`]) from its first panic
//! notifier, before the kernel resets the machine, and [`PanicRegister`]
//! sets the flag the event loop reads when the reset comes (exit status 3).
//! The register is at [`layout::PVPANIC_ADDR`], announced to the guest by
//! [`pvpanic_word`] (`pvpanic_mmio.device=1@0xc0001000`, which the project's
//! kernel understands through `resources/kernel/pvpanic-mmio-cmdline.patch`).
//! Guest userspace cannot write it: the driver maps the page busy, and the
//! kernel's `IO_STRICT_DEVMEM` then refuses it to `/dev/mem`; it has no port
//! that `ioperm` could open.
//!
//! Console text decides nothing: a guest process can write the kernel's
//! panic banner to `/dev/console` and reboot. [`ConsoleOut`] still notices
//! the banner, once, and logs it, which tells an operator whose guest kernel
//! lacks the pvpanic driver why a guest that printed a panic ended with 0.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arch::x86_64::layout;
use devices::legacy::pvpanic::{PanicEvent, PvPanic, PVPANIC_SIZE};
use log::warn;

/// The kernel command-line word that tells the guest kernel's pvpanic-mmio
/// driver where the register is.
pub fn pvpanic_word() -> String {
    format!(
        "pvpanic_mmio.device={PVPANIC_SIZE}@{:#x}",
        layout::PVPANIC_ADDR
    )
}

/// The pvpanic register on the MMIO bus, and the flag its panic report
/// sets.
pub struct PanicRegister {
    dev: Mutex<PvPanic>,
    panicked: Arc<AtomicBool>,
}

impl PanicRegister {
    /// A register whose panic report sets `panicked`.
    pub fn new(panicked: Arc<AtomicBool>) -> Self {
        PanicRegister {
            dev: Mutex::new(PvPanic::new()),
            panicked,
        }
    }

    /// Whether `addr` is in the register's window.
    pub fn contains(&self, addr: u64) -> bool {
        (layout::PVPANIC_ADDR..layout::PVPANIC_ADDR + PVPANIC_SIZE).contains(&addr)
    }

    /// A guest read at `addr` (in the window): the supported events.
    pub fn read(&self, addr: u64, data: &mut [u8]) {
        self.lock().read(addr - layout::PVPANIC_ADDR, data);
    }

    /// A guest write at `addr` (in the window). A panic report sets the
    /// flag and, the first time, logs what the guest kernel said.
    pub fn write(&self, addr: u64, data: &[u8]) -> Option<PanicEvent> {
        let event = self.lock().write(addr - layout::PVPANIC_ADDR, data)?;
        self.panicked.store(true, Ordering::SeqCst);
        if event.first {
            warn!(
                "the guest kernel reported a panic through the pvpanic device ({}); \
                 minivmm exits with 3 when the guest resets",
                if event.crash_loaded() {
                    "CRASH_LOADED: a crash kernel takes over"
                } else {
                    "PANICKED"
                }
            );
        }
        Some(event)
    }

    /// A poisoned lock means a vCPU thread panicked; the state is still the
    /// best there is.
    fn lock(&self) -> std::sync::MutexGuard<'_, PvPanic> {
        self.dev.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A writer for the serial console that notices the guest kernel's panic
/// banner and logs it, once. It decides nothing: any guest process can
/// print the same text.
pub struct ConsoleOut<W: Write> {
    out: W,
    tail: Vec<u8>,
    banner_seen: bool,
}

/// What Linux prints first in every panic.
const PANIC_MARK: &[u8] = b"Kernel panic - not syncing";

impl<W: Write> ConsoleOut<W> {
    /// Wraps `out`.
    pub fn new(out: W) -> Self {
        ConsoleOut {
            out,
            tail: Vec::with_capacity(2 * PANIC_MARK.len()),
            banner_seen: false,
        }
    }

    /// Whether the panic banner went through the console.
    pub fn banner_seen(&self) -> bool {
        self.banner_seen
    }
}

impl<W: Write> Write for ConsoleOut<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        if !self.banner_seen {
            // The UART hands us one byte at a time; keep just enough
            // history to find the banner across writes.
            self.tail.extend_from_slice(&buf[..n]);
            if self.tail.windows(PANIC_MARK.len()).any(|w| w == PANIC_MARK) {
                self.banner_seen = true;
                warn!(
                    "the guest console shows a kernel panic banner; the exit status follows \
                     the guest kernel's pvpanic report only (any guest process can print this)"
                );
            }
            if self.tail.len() >= PANIC_MARK.len() {
                self.tail.drain(..self.tail.len() + 1 - PANIC_MARK.len());
            }
        }
        // Console output is interactive: show each line as soon as it ends.
        if buf[..n].contains(&b'\n') {
            self.out.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use devices::legacy::pvpanic::{PVPANIC_CRASH_LOADED, PVPANIC_PANICKED, PVPANIC_SUPPORTED};

    use super::*;

    #[test]
    fn the_word_names_the_register() {
        assert_eq!(pvpanic_word(), "pvpanic_mmio.device=1@0xc0001000");
    }

    #[test]
    fn only_the_register_s_report_sets_the_flag() {
        let flag = Arc::new(AtomicBool::new(false));
        let reg = PanicRegister::new(flag.clone());
        let at = layout::PVPANIC_ADDR;
        assert!(reg.contains(at));
        assert!(!reg.contains(at - 1));
        assert!(!reg.contains(at + PVPANIC_SIZE));
        // The driver's probe: a read, which reports nothing.
        let mut b = [0u8; 1];
        reg.read(at, &mut b);
        assert_eq!(b, [PVPANIC_SUPPORTED]);
        assert_eq!(reg.write(at, &[0]), None);
        assert!(!flag.load(Ordering::SeqCst));
        let first = reg.write(at, &[PVPANIC_PANICKED]).unwrap();
        assert!(first.first);
        assert!(flag.load(Ordering::SeqCst));
        let second = reg.write(at, &[PVPANIC_CRASH_LOADED]).unwrap();
        assert!(!second.first && second.crash_loaded());
    }

    #[test]
    fn crash_loaded_alone_sets_the_flag() {
        let flag = Arc::new(AtomicBool::new(false));
        let reg = PanicRegister::new(flag.clone());
        assert!(reg
            .write(layout::PVPANIC_ADDR, &[PVPANIC_CRASH_LOADED])
            .is_some());
        assert!(flag.load(Ordering::SeqCst));
    }

    /// A sink that keeps what it was given and counts its flushes.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>, Arc<std::sync::atomic::AtomicUsize>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.1.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn the_console_shows_each_line_as_it_ends() {
        let sink = Shared::default();
        let flushes = || sink.1.load(Ordering::SeqCst);
        let mut out = ConsoleOut::new(sink.clone());
        out.write_all(b"no end yet").unwrap();
        assert_eq!(flushes(), 0);
        out.write_all(b"\n").unwrap();
        assert_eq!(flushes(), 1);
        out.flush().unwrap();
        assert_eq!(flushes(), 2);
    }

    #[test]
    fn the_console_notices_a_banner_split_across_writes_and_passes_it_on() {
        let sink = Shared::default();
        let mut out = ConsoleOut::new(sink.clone());
        for b in b"[ 1.0] Run /init as init process\n[ 1.1] Kernel pan".iter() {
            out.write_all(&[*b]).unwrap();
        }
        assert!(!out.banner_seen());
        for b in b"ic - not syncing: Attempted to kill init!\n".iter() {
            out.write_all(&[*b]).unwrap();
        }
        assert!(out.banner_seen());
        // Text after the banner is passed on as before, and nothing piles
        // up once the banner has been seen.
        out.write_all(b"more\n").unwrap();
        assert!(out.tail.len() < PANIC_MARK.len());
        assert!(String::from_utf8(sink.0.lock().unwrap().clone())
            .unwrap()
            .ends_with("init!\nmore\n"));
    }

    #[test]
    fn the_console_keeps_only_a_banner_s_length_of_history() {
        let mut out = ConsoleOut::new(Vec::new());
        out.write_all(&[b'x'; 4096]).unwrap();
        assert_eq!(out.tail.len(), PANIC_MARK.len() - 1);
        out.write_all(b"Kernel panic? not this time - not syncing\n")
            .unwrap();
        assert!(!out.banner_seen());
        assert_eq!(out.tail.len(), PANIC_MARK.len() - 1);
    }
}
