// SPDX-License-Identifier: Apache-2.0
//! virtio-MMIO transport, version 2 (virtio 1.1 §4.2.2).
//!
//! [`MmioTransport`] is the register window the guest driver talks to. It owns
//! feature negotiation, the device status state machine, per-queue
//! configuration and the InterruptStatus register; the device behind it only
//! sees the outcome, once, through [`VirtioDevice::activate`] when the driver
//! sets DRIVER_OK.
//!
//! Design points:
//! - Every value the guest writes is untrusted. Nothing here panics on a
//!   register value: wrong-width or misaligned accesses, writes in the wrong
//!   state and out-of-range selectors are ignored with a rate-limited warning.
//! - Queue parameters are kept raw until DRIVER_OK and validated there in one
//!   place: size, alignment, each ring area inside one guest memory region
//!   (then translated to a host pointer once, see [`super::queue`]), and no
//!   two areas overlapping, within a queue or across the device's queues. A
//!   queue that cannot be used, overlapping rings, or a device that refuses
//!   activation move the device to DEVICE_NEEDS_RESET and raise a
//!   configuration-change interrupt (virtio 1.1 §2.1.2) instead of failing
//!   the VMM.
//! - QueueNotify that arrives as an MMIO exit (no ioeventfd registered) is
//!   forwarded to the device's queue `EventFd`; the transport keeps duplicates
//!   of those descriptors so the notify path never takes the device lock.
//! - The transport sets the ring features (VIRTIO_RING_F_EVENT_IDX,
//!   VIRTIO_RING_F_INDIRECT_DESC) on each activated queue itself from what
//!   the driver acked, so devices get ready-to-use queues.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use vmm_sys_util::eventfd::EventFd;

use super::persist::{PersistError, QueueState, TransportState, VirtioState};
use super::queue::dirty::DirtyPages;
use super::queue::{
    check_overlaps, GuestRegions, RingAddrs, RingFeatures, SplitQueue, MAX_QUEUE_SIZE,
};
use super::{status, GuestMemory, Interrupt, IrqTrigger, VirtioDevice};
use super::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
use crate::warn::warn_rate_limited;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// Size of one virtio-MMIO register window (virtio 1.1 §4.2.2: registers up
/// to 0xfc, device configuration from 0x100; one page per device).
pub const MMIO_WINDOW_SIZE: u64 = 0x1000;
/// Offset of QueueNotify; the VMM registers queue ioeventfds at this offset
/// with the queue index as datamatch.
pub const QUEUE_NOTIFY_OFFSET: u64 = 0x50;

/// "virt" in little endian (virtio 1.1 §4.2.2, MagicValue).
pub const MMIO_MAGIC_VALUE: u32 = 0x7472_6976;
/// Version 2 is the non-legacy (virtio 1.0+) register layout.
pub const MMIO_VERSION: u32 = 2;
/// VendorID reported to the guest: "MMVM" read as little-endian ASCII
/// ("minivmm"). The spec leaves the value to the implementation and Linux only
/// prints it.
pub const MMIO_VENDOR_ID: u32 = 0x4d56_4d4d;

// Register offsets (virtio 1.1 §4.2.2, table "MMIO Device Register Layout").
pub(crate) const REG_MAGIC_VALUE: u64 = 0x00;
pub(crate) const REG_VERSION: u64 = 0x04;
pub(crate) const REG_DEVICE_ID: u64 = 0x08;
pub(crate) const REG_VENDOR_ID: u64 = 0x0c;
pub(crate) const REG_DEVICE_FEATURES: u64 = 0x10;
pub(crate) const REG_DEVICE_FEATURES_SEL: u64 = 0x14;
pub(crate) const REG_DRIVER_FEATURES: u64 = 0x20;
pub(crate) const REG_DRIVER_FEATURES_SEL: u64 = 0x24;
pub(crate) const REG_QUEUE_SEL: u64 = 0x30;
pub(crate) const REG_QUEUE_NUM_MAX: u64 = 0x34;
pub(crate) const REG_QUEUE_NUM: u64 = 0x38;
pub(crate) const REG_QUEUE_READY: u64 = 0x44;
pub(crate) const REG_QUEUE_NOTIFY: u64 = QUEUE_NOTIFY_OFFSET;
pub(crate) const REG_INTERRUPT_STATUS: u64 = 0x60;
pub(crate) const REG_INTERRUPT_ACK: u64 = 0x64;
pub(crate) const REG_STATUS: u64 = 0x70;
pub(crate) const REG_QUEUE_DESC_LOW: u64 = 0x80;
pub(crate) const REG_QUEUE_DESC_HIGH: u64 = 0x84;
pub(crate) const REG_QUEUE_DRIVER_LOW: u64 = 0x90;
pub(crate) const REG_QUEUE_DRIVER_HIGH: u64 = 0x94;
pub(crate) const REG_QUEUE_DEVICE_LOW: u64 = 0xa0;
pub(crate) const REG_QUEUE_DEVICE_HIGH: u64 = 0xa4;
// Shared memory regions (virtio 1.2 §4.2.2); no device here has any.
pub(crate) const REG_SHM_SEL: u64 = 0xac;
pub(crate) const REG_SHM_LEN_LOW: u64 = 0xb0;
pub(crate) const REG_SHM_LEN_HIGH: u64 = 0xb4;
pub(crate) const REG_SHM_BASE_LOW: u64 = 0xb8;
pub(crate) const REG_SHM_BASE_HIGH: u64 = 0xbc;
pub(crate) const REG_CONFIG_GENERATION: u64 = 0xfc;
/// Start of the device-specific configuration space.
pub const CONFIG_SPACE_OFFSET: u64 = 0x100;

/// Errors creating a [`MmioTransport`]. Nothing the guest does produces one.
#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    /// The interrupt eventfd could not be created.
    #[error("failed to create the interrupt eventfd")]
    CreateIrqTrigger(#[source] io::Error),
    /// A queue notification eventfd could not be duplicated.
    #[error("failed to duplicate the notification eventfd of queue {index}")]
    CloneQueueEvent {
        /// Queue index.
        index: usize,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The device reports a different number of queue events than queues.
    #[error("device has {queues} queues but {events} queue events")]
    QueueEventCount {
        /// Entries in `queue_max_sizes()`.
        queues: usize,
        /// Entries in `queue_events()`.
        events: usize,
    },
    /// A queue maximum size is zero, not a power of two or above 32768
    /// (virtio 1.1 §2.6).
    #[error("queue {index} has an invalid maximum size {size}")]
    InvalidQueueMaxSize {
        /// Queue index.
        index: usize,
        /// The offending size.
        size: u16,
    },
}

/// Driver-programmed parameters of one queue, kept raw until DRIVER_OK.
#[derive(Debug, Clone, Copy)]
struct QueueConfig {
    max_size: u16,
    /// As written to QueueNum; may be invalid until checked at DRIVER_OK.
    size: u32,
    ready: bool,
    desc_table: u64,
    avail_ring: u64,
    used_ring: u64,
}

impl QueueConfig {
    fn new(max_size: u16) -> Self {
        // QueueNum resets to QueueNumMax so a driver that never writes it
        // still gets a valid size, as virtio-queue's `Queue::reset` does.
        QueueConfig {
            max_size,
            size: u32::from(max_size),
            ready: false,
            desc_table: 0,
            avail_ring: 0,
            used_ring: 0,
        }
    }

    /// The ring addresses, once the driver made the queue ready with a size
    /// that fits in 16 bits (the rest is checked by `SplitQueue::new`).
    fn addrs(&self) -> Result<RingAddrs, String> {
        if !self.ready {
            return Err("not ready".into());
        }
        let size = u16::try_from(self.size)
            .map_err(|_| format!("invalid size {} (max {})", self.size, self.max_size))?;
        Ok(RingAddrs {
            size,
            desc_table: self.desc_table,
            avail_ring: self.avail_ring,
            used_ring: self.used_ring,
        })
    }
}

/// The virtio-MMIO register window of one device.
pub struct MmioTransport {
    mem: GuestMemory,
    device: Arc<Mutex<dyn VirtioDevice>>,
    interrupt: Arc<IrqTrigger>,
    /// Duplicates of the device's queue eventfds, for QueueNotify exits.
    queue_evts: Vec<EventFd>,
    // Snapshots of the device's constant identity, taken at construction so
    // plain register reads do not take the device lock.
    device_id: u32,
    avail_features: u64,
    queues: Vec<QueueConfig>,
    status: u32,
    activated: bool,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    queue_sel: u32,
    /// Where the queues mark the buffers the device may write, when the VM
    /// tracks dirty pages for Diff snapshots.
    dirty: Option<Arc<DirtyPages>>,
}

impl std::fmt::Debug for MmioTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MmioTransport")
            .field("device_id", &self.device_id)
            .field("status", &self.status)
            .field("activated", &self.activated)
            .field("acked_features", &self.acked_features)
            .finish_non_exhaustive()
    }
}

impl MmioTransport {
    /// Creates the transport for `device`, with a fresh interrupt trigger.
    pub fn new(mem: GuestMemory, device: Arc<Mutex<dyn VirtioDevice>>) -> Result<Self, MmioError> {
        let interrupt = Arc::new(IrqTrigger::new().map_err(MmioError::CreateIrqTrigger)?);
        let (device_id, avail_features, queues, queue_evts) = {
            let dev = lock(&device);
            let max_sizes = dev.queue_max_sizes();
            let events = dev.queue_events();
            if max_sizes.len() != events.len() {
                return Err(MmioError::QueueEventCount {
                    queues: max_sizes.len(),
                    events: events.len(),
                });
            }
            let mut queues = Vec::with_capacity(max_sizes.len());
            for (index, &size) in max_sizes.iter().enumerate() {
                if size == 0 || !size.is_power_of_two() || size > MAX_QUEUE_SIZE {
                    return Err(MmioError::InvalidQueueMaxSize { index, size });
                }
                queues.push(QueueConfig::new(size));
            }
            let queue_evts = events
                .iter()
                .enumerate()
                .map(|(index, e)| {
                    e.try_clone()
                        .map_err(|source| MmioError::CloneQueueEvent { index, source })
                })
                .collect::<Result<Vec<_>, _>>()?;
            (dev.device_type(), dev.avail_features(), queues, queue_evts)
        };
        Ok(MmioTransport {
            mem,
            device,
            interrupt,
            queue_evts,
            device_id,
            avail_features,
            queues,
            status: 0,
            activated: false,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            queue_sel: 0,
            dirty: None,
        })
    }

    /// Has the device's queues mark every buffer it may write in `log`,
    /// from the next activation on (the VM tracks dirty pages).
    pub fn set_dirty_log(&mut self, log: Arc<DirtyPages>) {
        self.dirty = Some(log);
    }

    /// The interrupt eventfd; the VMM registers it as a KVM irqfd.
    pub fn interrupt_evt(&self) -> &EventFd {
        &self.interrupt.evt
    }

    /// The InterruptStatus register, shared with the device's interrupt.
    pub fn interrupt_status(&self) -> Arc<AtomicU32> {
        self.interrupt.status.clone()
    }

    /// The device behind this transport.
    pub fn device(&self) -> Arc<Mutex<dyn VirtioDevice>> {
        self.device.clone()
    }

    /// The device status register (virtio 1.1 §2.1).
    pub fn status(&self) -> u32 {
        self.status
    }

    /// Whether DRIVER_OK activated the device (and no reset happened since).
    pub fn is_activated(&self) -> bool {
        self.activated
    }

    /// The features the driver acked (meaningful once FEATURES_OK stuck).
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// The window's registers and the device's own state, for a snapshot
    /// (taken between two passes of the device, with the vCPUs paused),
    /// once the device is quiescent ([`VirtioDevice::quiesce`]).
    pub fn save(&self) -> Result<VirtioState, PersistError> {
        let mut device = lock(&self.device);
        device.quiesce()?;
        let transport = TransportState {
            device_id: self.device_id,
            status: self.status,
            activated: self.activated,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            acked_features: self.acked_features,
            queue_sel: self.queue_sel,
            queues: self
                .queues
                .iter()
                .map(|q| QueueState {
                    max_size: q.max_size,
                    size: q.size,
                    ready: q.ready,
                    desc_table: q.desc_table,
                    avail_ring: q.avail_ring,
                    used_ring: q.used_ring,
                })
                .collect(),
            interrupt_status: self.interrupt.status.load(Ordering::SeqCst),
        };
        Ok(VirtioState {
            transport,
            device: device.save_state(),
        })
    }

    /// Takes back what [`save`](Self::save) returned, into a transport
    /// that has not been touched since it was made. The saved state is
    /// input from outside: it is checked as the driver's register writes
    /// would have been (features offered, status reachable), the device's
    /// own part by the device, and an activated device's queues exactly as
    /// at DRIVER_OK before the device is activated over them, each ring
    /// resumed from its `used.idx`. An activated device whose interrupt
    /// status was not clear gets its interrupt again: the driver had not
    /// acknowledged it, and it may have been raised after the vCPUs' local
    /// APICs were saved (a block request completed as the device
    /// quiesced), so the guest might never see it. With the status clear
    /// there is nothing the driver has not taken: an interrupt it was
    /// still to take is in its saved local APIC, and used entries it asked
    /// not to be interrupted for it polls; one more interrupt per device
    /// would cost the restored guest a handler run and two register exits
    /// each. On an error the transport is left half restored; the caller
    /// discards the VM.
    pub fn restore(&mut self, state: &VirtioState) -> Result<(), PersistError> {
        let t = &state.transport;
        self.check_restorable(t)?;
        lock(&self.device).restore_state(&state.device)?;
        self.status = t.status;
        self.device_features_sel = t.device_features_sel;
        self.driver_features_sel = t.driver_features_sel;
        self.acked_features = t.acked_features;
        self.queue_sel = t.queue_sel;
        for (q, saved) in self.queues.iter_mut().zip(&t.queues) {
            q.size = saved.size;
            q.ready = saved.ready;
            q.desc_table = saved.desc_table;
            q.avail_ring = saved.avail_ring;
            q.used_ring = saved.used_ring;
        }
        self.interrupt
            .status
            .store(t.interrupt_status, Ordering::SeqCst);
        if t.activated {
            let mut queues = self.build_queues().map_err(PersistError::Activate)?;
            queues.iter_mut().for_each(SplitQueue::resume_from_ring);
            let interrupt: Arc<dyn Interrupt> = self.interrupt.clone();
            let mut device = lock(&self.device);
            device
                .activate(self.acked_features, queues, interrupt)
                .map_err(|e| PersistError::Activate(e.to_string()))?;
            device.restored();
            self.activated = true;
            if t.interrupt_status != 0 {
                self.interrupt.raise(t.interrupt_status);
            }
        }
        Ok(())
    }

    /// The checks of [`restore`](Self::restore) that need no device lock.
    fn check_restorable(&self, t: &TransportState) -> Result<(), PersistError> {
        use status::*;
        if t.device_id != self.device_id {
            return Err(PersistError::DeviceType {
                saved: t.device_id,
                actual: self.device_id,
            });
        }
        let actual_sizes: Vec<u16> = self.queues.iter().map(|q| q.max_size).collect();
        let saved_sizes: Vec<u16> = t.queues.iter().map(|q| q.max_size).collect();
        if saved_sizes != actual_sizes {
            return Err(PersistError::Queues {
                saved: t.queues.len(),
                saved_sizes,
                actual_sizes,
            });
        }
        let bad = |why: String| Err(PersistError::Transport(why));
        let steps = t.status & !(DEVICE_NEEDS_RESET | FAILED);
        let reachable = [
            0,
            ACKNOWLEDGE,
            ACKNOWLEDGE | DRIVER,
            ACKNOWLEDGE | DRIVER | FEATURES_OK,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK,
        ];
        if !reachable.contains(&steps) {
            return bad(format!("status {:#x} cannot be reached", t.status));
        }
        if t.activated && steps & DRIVER_OK == 0 {
            return bad(format!("activated in status {:#x}", t.status));
        }
        if t.acked_features & !self.avail_features != 0 {
            return bad(format!(
                "acked features {:#x} were not offered ({:#x})",
                t.acked_features, self.avail_features
            ));
        }
        if steps & FEATURES_OK != 0 && t.acked_features & (1 << VIRTIO_F_VERSION_1) == 0 {
            return bad("FEATURES_OK without VIRTIO_F_VERSION_1".into());
        }
        if t.interrupt_status & !(VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG) != 0 {
            return bad(format!("interrupt status {:#x}", t.interrupt_status));
        }
        Ok(())
    }

    /// Handles a guest read of `data.len()` bytes at `offset` in the window.
    pub fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.take_device_error();
        if offset >= CONFIG_SPACE_OFFSET {
            // Config space accepts any width; the device bounds-checks.
            data.fill(0);
            lock(&self.device).read_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        let Ok(buf) = <&mut [u8; 4]>::try_from(&mut *data) else {
            warn_rate_limited!(
                "virtio-mmio: ignoring {}-byte read at {offset:#x}",
                data.len()
            );
            data.fill(0);
            return;
        };
        if offset & 3 != 0 {
            warn_rate_limited!("virtio-mmio: ignoring misaligned read at {offset:#x}");
            *buf = [0; 4];
            return;
        }
        let value = match offset {
            REG_MAGIC_VALUE => MMIO_MAGIC_VALUE,
            REG_VERSION => MMIO_VERSION,
            REG_DEVICE_ID => self.device_id,
            REG_VENDOR_ID => MMIO_VENDOR_ID,
            REG_DEVICE_FEATURES => match self.device_features_sel {
                0 => self.avail_features as u32,
                1 => (self.avail_features >> 32) as u32,
                _ => 0,
            },
            REG_QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| u32::from(q.max_size)),
            REG_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready)),
            REG_INTERRUPT_STATUS => self.interrupt.status.load(Ordering::SeqCst),
            REG_STATUS => self.status,
            // The device's own: it changes its configuration space on its
            // own thread (a new disk image), and the driver reads this
            // around the configuration reads, which take the lock anyway.
            REG_CONFIG_GENERATION => lock(&self.device).config_generation(),
            // All-ones length and base mean "no such region", which Linux
            // checks before using one.
            REG_SHM_LEN_LOW | REG_SHM_LEN_HIGH | REG_SHM_BASE_LOW | REG_SHM_BASE_HIGH => u32::MAX,
            _ => {
                warn_rate_limited!(
                    "virtio-mmio: read of unknown or write-only register {offset:#x}"
                );
                0
            }
        };
        *buf = value.to_le_bytes();
    }

    /// Handles a guest write of `data` at `offset` in the window.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.take_device_error();
        if offset >= CONFIG_SPACE_OFFSET {
            lock(&self.device).write_config(offset - CONFIG_SPACE_OFFSET, data);
            return;
        }
        let Ok(buf) = <[u8; 4]>::try_from(data) else {
            warn_rate_limited!(
                "virtio-mmio: ignoring {}-byte write at {offset:#x}",
                data.len()
            );
            return;
        };
        if offset & 3 != 0 {
            warn_rate_limited!("virtio-mmio: ignoring misaligned write at {offset:#x}");
            return;
        }
        let value = u32::from_le_bytes(buf);
        match offset {
            REG_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            REG_DRIVER_FEATURES => self.write_driver_features(value),
            REG_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            REG_QUEUE_SEL => self.queue_sel = value,
            REG_QUEUE_NUM => self.update_queue(offset, |q| q.size = value),
            REG_QUEUE_READY => self.update_queue(offset, |q| q.ready = value == 1),
            REG_QUEUE_NOTIFY => self.notify(value),
            REG_INTERRUPT_ACK => {
                self.interrupt.status.fetch_and(!value, Ordering::SeqCst);
            }
            REG_STATUS => self.write_status(value),
            REG_SHM_SEL => {}
            REG_QUEUE_DESC_LOW => self.update_queue(offset, |q| set_low(&mut q.desc_table, value)),
            REG_QUEUE_DESC_HIGH => {
                self.update_queue(offset, |q| set_high(&mut q.desc_table, value))
            }
            REG_QUEUE_DRIVER_LOW => {
                self.update_queue(offset, |q| set_low(&mut q.avail_ring, value))
            }
            REG_QUEUE_DRIVER_HIGH => {
                self.update_queue(offset, |q| set_high(&mut q.avail_ring, value))
            }
            REG_QUEUE_DEVICE_LOW => self.update_queue(offset, |q| set_low(&mut q.used_ring, value)),
            REG_QUEUE_DEVICE_HIGH => {
                self.update_queue(offset, |q| set_high(&mut q.used_ring, value))
            }
            _ => {
                warn_rate_limited!(
                    "virtio-mmio: write to unknown or read-only register {offset:#x}"
                )
            }
        }
    }

    fn selected_queue(&self) -> Option<&QueueConfig> {
        self.queues.get(usize::try_from(self.queue_sel).ok()?)
    }

    fn selected_queue_mut(&mut self) -> Option<&mut QueueConfig> {
        self.queues.get_mut(usize::try_from(self.queue_sel).ok()?)
    }

    /// Applies a queue register write if the spec allows it now: after
    /// FEATURES_OK, before DRIVER_OK, and never to a queue already ready
    /// (QueueReady itself stays writable so the driver can un-ready it).
    fn update_queue(&mut self, offset: u64, f: impl FnOnce(&mut QueueConfig)) {
        let configuring = self.status & (status::FEATURES_OK | status::DRIVER_OK)
            == status::FEATURES_OK
            && !self.stopped();
        if !configuring {
            warn_rate_limited!(
                "virtio-mmio: queue register {offset:#x} written in status {:#x}",
                self.status
            );
            return;
        }
        let sel = self.queue_sel;
        let Some(q) = self.selected_queue_mut() else {
            warn_rate_limited!("virtio-mmio: queue register {offset:#x} with bad QueueSel {sel}");
            return;
        };
        if q.ready && offset != REG_QUEUE_READY {
            warn_rate_limited!("virtio-mmio: queue {sel} register {offset:#x} written while ready");
            return;
        }
        f(q);
    }

    /// Whether the driver gave up (FAILED) or the device needs a reset:
    /// nothing but a reset moves the device on.
    fn stopped(&self) -> bool {
        self.status & (status::FAILED | status::DEVICE_NEEDS_RESET) != 0
    }

    fn write_driver_features(&mut self, value: u32) {
        if self.status & (status::DRIVER | status::FEATURES_OK) != status::DRIVER {
            warn_rate_limited!(
                "virtio-mmio: DriverFeatures written in status {:#x}",
                self.status
            );
            return;
        }
        match self.driver_features_sel {
            0 => self.acked_features = (self.acked_features & !0xffff_ffff) | u64::from(value),
            1 => {
                self.acked_features = (self.acked_features & 0xffff_ffff) | (u64::from(value) << 32)
            }
            sel => log_ack_above_page_1(sel, value),
        }
    }

    fn notify(&self, value: u32) {
        let Some(evt) = usize::try_from(value)
            .ok()
            .and_then(|i| self.queue_evts.get(i))
        else {
            warn_rate_limited!("virtio-mmio: QueueNotify for unknown queue {value}");
            return;
        };
        if let Err(e) = evt.write(1) {
            log::error!("virtio-mmio: failed to signal queue {value}: {e}");
        }
    }

    /// The status state machine (virtio 1.1 §3.1.1). The driver adds one
    /// step at a time and never clears a bit except by writing 0.
    fn write_status(&mut self, value: u32) {
        use status::*;
        if value == 0 {
            self.reset();
            return;
        }
        // DEVICE_NEEDS_RESET belongs to the device: drivers write back what
        // they read, so ignore the bit in the written value.
        let new = value & !DEVICE_NEEDS_RESET;
        let old = self.status & !DEVICE_NEEDS_RESET;
        if new & old != old {
            warn_rate_limited!("virtio-mmio: status {value:#x} clears bits of {old:#x}");
            return;
        }
        if new & FAILED != 0 {
            // The driver gave up; record it and accept nothing else until reset.
            self.status |= FAILED;
            return;
        }
        if self.stopped() {
            warn_rate_limited!(
                "virtio-mmio: status {value:#x} ignored, device needs reset (status {:#x})",
                self.status
            );
            return;
        }
        let added = new & !old;
        let expected_next = match old {
            0 => ACKNOWLEDGE,
            x if x == ACKNOWLEDGE => DRIVER,
            x if x == ACKNOWLEDGE | DRIVER => FEATURES_OK,
            x if x == ACKNOWLEDGE | DRIVER | FEATURES_OK => DRIVER_OK,
            _ => 0,
        };
        if added == 0 {
            return;
        }
        if added != expected_next {
            warn_rate_limited!("virtio-mmio: invalid status transition {old:#x} -> {new:#x}");
            return;
        }
        match added {
            FEATURES_OK => {
                if let Err(why) = self.check_features() {
                    // The bit does not stick; the driver sees that on read-back
                    // and gives up (virtio 1.1 §3.1.1 step 6).
                    warn_rate_limited!("virtio-mmio: refusing FEATURES_OK: {why}");
                    return;
                }
                self.status = new;
            }
            DRIVER_OK => {
                self.status = new;
                self.activate();
            }
            _ => self.status = new,
        }
    }

    fn check_features(&self) -> Result<(), String> {
        let unoffered = self.acked_features & !self.avail_features;
        if unoffered != 0 {
            return Err(format!("driver acked unoffered features {unoffered:#x}"));
        }
        if self.acked_features & (1 << VIRTIO_F_VERSION_1) == 0 {
            return Err("driver did not ack VIRTIO_F_VERSION_1".into());
        }
        Ok(())
    }

    fn activate(&mut self) {
        match self.build_queues().and_then(|queues| {
            let interrupt: Arc<dyn Interrupt> = self.interrupt.clone();
            lock(&self.device)
                .activate(self.acked_features, queues, interrupt)
                .map_err(|e| e.to_string())
        }) {
            Ok(()) => self.activated = true,
            Err(why) => {
                warn_rate_limited!(
                    "virtio-mmio: device {} not activated: {why}",
                    self.device_id
                );
                self.needs_reset();
            }
        }
    }

    /// Validates every queue, refuses overlapping rings and translates them
    /// against a fresh snapshot of guest memory.
    fn build_queues(&self) -> Result<Vec<SplitQueue>, String> {
        // Only the queues the negotiated features bring: a driver numbers
        // those consecutively and leaves the rest alone.
        let count = lock(&self.device).active_queues(self.acked_features);
        let addrs = self
            .queues
            .iter()
            .take(count)
            .enumerate()
            .map(|(i, q)| q.addrs().map_err(|e| format!("queue {i}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        let mem = Arc::new(
            GuestRegions::new(&self.mem)
                .map_err(|e| e.to_string())?
                .with_dirty_log(self.dirty.clone()),
        );
        let features = RingFeatures::from_bits(self.acked_features);
        let queues = addrs
            .iter()
            .zip(&self.queues)
            .enumerate()
            .map(|(i, (a, q))| {
                SplitQueue::new(mem.clone(), *a, q.max_size, features)
                    .map_err(|e| format!("queue {i}: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        check_overlaps(&addrs).map_err(|e| e.to_string())?;
        Ok(queues)
    }

    /// Enters DEVICE_NEEDS_RESET and tells the driver (virtio 1.1 §2.1.2).
    /// Only a refused activation gets here, after DRIVER_OK was set: the
    /// driver is up and listens for the configuration interrupt.
    fn needs_reset(&mut self) {
        debug_assert_ne!(self.status & status::DRIVER_OK, 0);
        self.status |= status::DEVICE_NEEDS_RESET;
        self.interrupt.signal_config_change();
    }

    /// Folds an error the device reported from its own thread into the
    /// status register; the device already raised the config interrupt.
    fn take_device_error(&mut self) {
        if self.interrupt.needs_reset.swap(false, Ordering::SeqCst) && self.status != 0 {
            self.status |= status::DEVICE_NEEDS_RESET;
        }
    }

    /// Driver wrote 0 to Status: back to the power-on state (virtio 1.1 §2.1.1).
    fn reset(&mut self) {
        // The device is reset even if it never activated: a failed
        // `activate` may have left partial state behind.
        lock(&self.device).reset();
        self.activated = false;
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
        self.queue_sel = 0;
        for q in &mut self.queues {
            *q = QueueConfig::new(q.max_size);
        }
        self.interrupt.status.store(0, Ordering::SeqCst);
        self.interrupt.needs_reset.store(false, Ordering::SeqCst);
    }
}

/// Locks the device, ignoring poisoning: a panicked device thread must not
/// turn every later guest register access into a panic as well.
fn lock<'a>(
    device: &'a Mutex<dyn VirtioDevice + 'static>,
) -> MutexGuard<'a, dyn VirtioDevice + 'static> {
    device.lock().unwrap_or_else(|e| e.into_inner())
}

fn set_low(reg: &mut u64, value: u32) {
    *reg = (*reg & !0xffff_ffff) | u64::from(value);
}

fn set_high(reg: &mut u64, value: u32) {
    *reg = (*reg & 0xffff_ffff) | (u64::from(value) << 32);
}

/// No feature bits above 63 exist: acking one is a driver bug that
/// FEATURES_OK cannot catch (the acked features hold 64 bits), so it is only
/// logged.
fn log_ack_above_page_1(sel: u32, value: u32) {
    if value != 0 {
        warn_rate_limited!("virtio-mmio: driver acked {value:#x} in feature page {sel}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::test_utils::{
        adjacent_cases, aliasing_cases, guest_memory, DriverError, DummyDevice, MockDriver,
        QueueLayout,
    };
    use crate::virtio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};
    use status::*;
    use vm_memory::GuestAddress;

    const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
    const EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;
    const MEM_SIZE: usize = 1 << 20;

    struct Fixture {
        dev: Arc<Mutex<DummyDevice>>,
        drv: MockDriver,
    }

    fn fixture() -> Fixture {
        fixture_with(|_| {})
    }

    /// A transport at FEATURES_OK (VERSION_1 negotiated).
    fn fixture_at_features_ok() -> Fixture {
        let mut f = fixture();
        f.reach_features_ok();
        f
    }

    /// A transport at FEATURES_OK with queue 0 programmed (256 entries,
    /// valid rings at 0x10000): where the queue-layout tests start, each
    /// programming queue 1 its own way.
    fn fixture_with_queue_0() -> Fixture {
        let mut f = fixture_at_features_ok();
        f.program_queue(0, 256, 0x10000);
        f
    }

    fn fixture_with(f: impl FnOnce(&mut DummyDevice)) -> Fixture {
        let mem = guest_memory(MEM_SIZE).unwrap();
        let mut d = DummyDevice::new().unwrap();
        f(&mut d);
        let dev = Arc::new(Mutex::new(d));
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        Fixture {
            dev,
            drv: MockDriver::new(mem, t).unwrap(),
        }
    }

    impl Fixture {
        fn read(&mut self, off: u64) -> u32 {
            self.drv.read_reg(off)
        }
        fn write(&mut self, off: u64, v: u32) {
            self.drv.write_reg(off, v)
        }
        fn activations(&self) -> usize {
            self.dev.lock().unwrap().activate_calls
        }
        /// Status ACK|DRIVER|FEATURES_OK with VERSION_1 acked.
        fn reach_features_ok(&mut self) {
            self.drv.negotiate(VERSION_1).unwrap();
        }
        /// Programs queue `sel` fully, with valid rings at `base`.
        fn program_queue(&mut self, sel: u32, num: u32, base: u64) {
            self.write(REG_QUEUE_SEL, sel);
            self.write(REG_QUEUE_NUM, num);
            self.write(REG_QUEUE_DESC_LOW, base as u32);
            self.write(REG_QUEUE_DESC_HIGH, (base >> 32) as u32);
            self.write(REG_QUEUE_DRIVER_LOW, (base + 0x4000) as u32);
            self.write(REG_QUEUE_DRIVER_HIGH, ((base + 0x4000) >> 32) as u32);
            self.write(REG_QUEUE_DEVICE_LOW, (base + 0x8000) as u32);
            self.write(REG_QUEUE_DEVICE_HIGH, ((base + 0x8000) >> 32) as u32);
            self.write(REG_QUEUE_READY, 1);
        }
        fn add_status(&mut self, bit: u32) {
            self.drv.add_status(bit)
        }
    }

    #[test]
    fn transport_and_driver_can_move_to_another_thread() {
        fn assert_send<T: Send>() {}
        assert_send::<MmioTransport>();
        assert_send::<MockDriver>();
    }

    #[test]
    fn identity_registers() {
        let mut f = fixture();
        assert_eq!(f.read(REG_MAGIC_VALUE), 0x7472_6976);
        assert_eq!(f.read(REG_VERSION), 2);
        assert_eq!(f.read(REG_DEVICE_ID), 0x1234);
        assert_eq!(f.read(REG_VENDOR_ID), MMIO_VENDOR_ID);
        assert_eq!(f.read(REG_CONFIG_GENERATION), 0);
        assert_eq!(f.read(REG_STATUS), 0);
        f.write(REG_SHM_SEL, 0);
        assert_eq!(f.read(REG_SHM_LEN_LOW), u32::MAX);
        assert_eq!(f.read(REG_SHM_LEN_HIGH), u32::MAX);
    }

    #[test]
    fn new_rejects_bad_devices() {
        let mem = guest_memory(MEM_SIZE).unwrap();
        let mut d = DummyDevice::new().unwrap();
        d.common.queue_sizes = vec![256, 100];
        let r = MmioTransport::new(mem.clone(), Arc::new(Mutex::new(d)));
        assert!(matches!(
            r,
            Err(MmioError::InvalidQueueMaxSize {
                index: 1,
                size: 100
            })
        ));
        let mut d = DummyDevice::new().unwrap();
        d.common.queue_sizes = vec![256];
        let r = MmioTransport::new(mem, Arc::new(Mutex::new(d)));
        assert!(matches!(
            r,
            Err(MmioError::QueueEventCount {
                queues: 1,
                events: 2
            })
        ));
    }

    #[test]
    fn device_features_are_paged_by_selector() {
        let mut f = fixture_with(|d| d.common.avail_features = 0x1234_5678_9abc_def0);
        assert_eq!(f.read(REG_DEVICE_FEATURES), 0x9abc_def0);
        f.write(REG_DEVICE_FEATURES_SEL, 1);
        assert_eq!(f.read(REG_DEVICE_FEATURES), 0x1234_5678);
        f.write(REG_DEVICE_FEATURES_SEL, 2);
        assert_eq!(f.read(REG_DEVICE_FEATURES), 0);
        f.write(REG_DEVICE_FEATURES_SEL, u32::MAX);
        assert_eq!(f.read(REG_DEVICE_FEATURES), 0);
        assert_eq!(f.drv.device_features(), 0x1234_5678_9abc_def0);
    }

    #[test]
    fn driver_features_are_paged_by_selector() {
        let mut f = fixture_with(|d| d.common.avail_features = u64::MAX);
        f.add_status(ACKNOWLEDGE);
        f.add_status(DRIVER);
        f.write(REG_DRIVER_FEATURES_SEL, 1);
        f.write(REG_DRIVER_FEATURES, 0x1);
        f.write(REG_DRIVER_FEATURES_SEL, 0);
        f.write(REG_DRIVER_FEATURES, 0x8000_0001);
        // Pages beyond 1 hold no features; writing them changes nothing.
        f.write(REG_DRIVER_FEATURES_SEL, 7);
        f.write(REG_DRIVER_FEATURES, 0xffff_ffff);
        assert_eq!(f.drv.transport().acked_features(), 0x1_8000_0001);
    }

    #[test]
    fn good_sequence_activates_with_configured_queues() {
        let mut f = fixture();
        assert_eq!(
            f.drv.negotiate(VERSION_1 | EVENT_IDX | 1).unwrap(),
            VERSION_1 | EVENT_IDX | 1
        );
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
        let l0 = f.drv.setup_queue(0, 128).unwrap();
        let l1 = f.drv.setup_queue(1, 64).unwrap();
        assert_eq!(f.activations(), 0);
        f.drv.driver_ok().unwrap();
        assert_eq!(
            f.read(REG_STATUS),
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK
        );
        assert!(f.drv.transport().is_activated());

        let d = f.dev.lock().unwrap();
        assert_eq!(d.activate_calls, 1);
        assert_eq!(d.common.acked_features, VERSION_1 | EVENT_IDX | 1);
        assert_eq!(d.queues.len(), 2);
        for (q, l) in d.queues.iter().zip([l0, l1]) {
            assert!(q.features().event_idx);
            assert_eq!(q.size(), l.size);
            assert_eq!(q.addrs().desc_table, l.desc_table.0);
            assert_eq!(q.addrs().avail_ring, l.avail_ring.0);
            assert_eq!(q.addrs().used_ring, l.used_ring.0);
        }
        // The interrupt handed to the device drives this transport's register.
        d.interrupt.as_ref().unwrap().signal_used_queue();
        drop(d);
        assert_eq!(f.read(REG_INTERRUPT_STATUS), VIRTIO_MMIO_INT_VRING);
        assert_eq!(f.drv.take_irq_count(), 1);
    }

    #[test]
    fn event_idx_not_set_unless_acked() {
        let mut f = fixture();
        f.drv.init(VERSION_1).unwrap();
        let d = f.dev.lock().unwrap();
        assert!(d.queues.iter().all(|q| !q.features().event_idx));
    }

    #[test]
    fn status_steps_cannot_be_skipped() {
        let mut f = fixture();
        // DRIVER before ACKNOWLEDGE.
        f.write(REG_STATUS, DRIVER);
        assert_eq!(f.read(REG_STATUS), 0);
        f.add_status(ACKNOWLEDGE);
        f.add_status(DRIVER);
        f.drv.write_driver_features(VERSION_1);
        // DRIVER_OK without FEATURES_OK.
        f.add_status(DRIVER_OK);
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER);
        // Clearing a bit without a reset.
        f.write(REG_STATUS, ACKNOWLEDGE);
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER);
        // Two steps at once.
        f.write(REG_STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER);
        assert_eq!(f.activations(), 0);
        // The proper path still works afterwards.
        f.add_status(FEATURES_OK);
        f.drv.setup_queues(None).unwrap();
        f.drv.driver_ok().unwrap();
        assert_eq!(f.activations(), 1);
    }

    #[test]
    fn a_driver_that_gave_up_reads_failed_back_until_it_resets() {
        let mut f = fixture();
        f.add_status(ACKNOWLEDGE);
        f.add_status(DRIVER);
        f.drv.write_driver_features(VERSION_1);
        f.write(REG_STATUS, ACKNOWLEDGE | DRIVER | FAILED);
        // The driver reads what it wrote, and writing it again keeps it.
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER | FAILED);
        f.write(REG_STATUS, ACKNOWLEDGE | DRIVER | FAILED);
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER | FAILED);
        // No step forward sticks, and no queue register is taken.
        f.write(REG_STATUS, ACKNOWLEDGE | DRIVER | FAILED | FEATURES_OK);
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER | FAILED);
        f.write(REG_QUEUE_SEL, 0);
        f.write(REG_QUEUE_READY, 1);
        assert_eq!(f.read(REG_QUEUE_READY), 0);
        assert_eq!(f.activations(), 0);
        // A reset brings the device back.
        f.write(REG_STATUS, 0);
        assert_eq!(f.read(REG_STATUS), 0);
        f.drv.init(VERSION_1).unwrap();
        assert_eq!(f.activations(), 1);
        // Giving up after FEATURES_OK, where queue registers are otherwise
        // taken: they are not, and DRIVER_OK does not stick.
        f.write(REG_STATUS, 0);
        f.reach_features_ok();
        let s = f.read(REG_STATUS);
        f.write(REG_STATUS, s | FAILED);
        f.write(REG_QUEUE_SEL, 0);
        f.write(REG_QUEUE_READY, 1);
        assert_eq!(f.read(REG_QUEUE_READY), 0);
        f.write(REG_STATUS, s | FAILED | DRIVER_OK);
        assert_eq!(f.read(REG_STATUS), s | FAILED);
        assert_eq!(f.activations(), 1);
    }

    #[test]
    fn features_ok_refused_for_unoffered_feature() {
        let mut f = fixture();
        let err = f.drv.negotiate(VERSION_1 | (1 << 5)).unwrap_err();
        assert!(
            matches!(err, DriverError::FeaturesRejected { status } if status == ACKNOWLEDGE | DRIVER)
        );
        // And the device never activates from there.
        f.add_status(DRIVER_OK);
        assert_eq!(f.read(REG_STATUS) & DRIVER_OK, 0);
        assert_eq!(f.activations(), 0);
    }

    #[test]
    fn features_ok_refused_without_version_1() {
        let mut f = fixture();
        assert!(matches!(
            f.drv.negotiate(1),
            Err(DriverError::FeaturesRejected { .. })
        ));
        // Fixing the features before FEATURES_OK sticks is allowed.
        f.drv.write_driver_features(VERSION_1 | 1);
        f.add_status(FEATURES_OK);
        assert_eq!(f.read(REG_STATUS), ACKNOWLEDGE | DRIVER | FEATURES_OK);
    }

    #[test]
    fn features_frozen_after_features_ok() {
        let mut f = fixture_at_features_ok();
        f.drv.write_driver_features(VERSION_1 | EVENT_IDX);
        assert_eq!(f.drv.transport().acked_features(), VERSION_1);
        f.drv.setup_queues(None).unwrap();
        f.drv.driver_ok().unwrap();
        assert_eq!(f.dev.lock().unwrap().common.acked_features, VERSION_1);
    }

    #[test]
    fn driver_features_before_driver_ignored() {
        let mut f = fixture();
        f.drv.write_driver_features(VERSION_1);
        assert_eq!(f.drv.transport().acked_features(), 0);
    }

    fn assert_needs_reset_not_activated(f: &mut Fixture) {
        let s = f.read(REG_STATUS);
        assert_ne!(s & DEVICE_NEEDS_RESET, 0, "status {s:#x}");
        assert_eq!(f.activations(), 0);
        assert!(!f.drv.transport().is_activated());
        assert_eq!(f.read(REG_INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
        assert_eq!(f.drv.take_irq_count(), 1);
    }

    /// Sets DRIVER_OK on a layout the transport must refuse: it needs a
    /// reset and the device is not activated.
    fn assert_driver_ok_refused(f: &mut Fixture) {
        f.add_status(DRIVER_OK);
        assert_needs_reset_not_activated(f);
    }

    #[test]
    fn non_power_of_two_queue_num_needs_reset() {
        let mut f = fixture_at_features_ok();
        f.program_queue(0, 100, 0x10000);
        f.program_queue(1, 64, 0x20000);
        assert_driver_ok_refused(&mut f);
    }

    #[test]
    fn oversized_or_zero_queue_num_needs_reset() {
        for num in [512, 0, 0x1_0000 + 64] {
            let mut f = fixture_with_queue_0();
            f.program_queue(1, num, 0x20000);
            assert_driver_ok_refused(&mut f);
        }
    }

    #[test]
    fn queue_not_ready_needs_reset() {
        let mut f = fixture_with_queue_0();
        assert_driver_ok_refused(&mut f);
    }

    /// Negotiates `features`, programs both queues as given and sets
    /// DRIVER_OK; returns whether the device went live.
    fn bring_up(features: u64, layouts: [QueueLayout; 2]) -> (Fixture, bool) {
        let mut f = fixture();
        f.drv.negotiate(features).unwrap();
        for (i, l) in layouts.into_iter().enumerate() {
            f.drv.setup_queue_at(i, l).unwrap();
        }
        f.add_status(DRIVER_OK);
        let live = f.drv.transport().is_activated();
        (f, live)
    }

    fn layout(size: u16, desc: u64, avail: u64, used: u64) -> QueueLayout {
        QueueLayout {
            size,
            desc_table: GuestAddress(desc),
            avail_ring: GuestAddress(avail),
            used_ring: GuestAddress(used),
        }
    }

    /// A layout that once hung the device for good: the TX used ring's
    /// `flags` on the TX avail ring's `idx`, without EVENT_IDX.
    #[test]
    fn used_flags_on_avail_idx_is_refused() {
        let a = 0x50002u64;
        assert_eq!(a % 4, 2);
        let rx = layout(256, 0x10000, 0x14000, 0x18000);
        let tx = layout(64, 0x40000, a, a + 2);
        let (mut f, live) = bring_up(VERSION_1, [rx, tx]);
        assert!(!live);
        assert_needs_reset_not_activated(&mut f);
        // The same queues apart are fine.
        let (_, live) = bring_up(VERSION_1, [rx, layout(64, 0x40000, a, a + 0x102)]);
        assert!(live);
    }

    /// Every pair of ring fields in different areas, within one queue and
    /// across RX and TX, made to share at least one byte with every area
    /// correctly aligned: refused at DRIVER_OK with DEVICE_NEEDS_RESET, with
    /// and without EVENT_IDX.
    #[test]
    fn aliasing_matrix_every_pair_of_ring_fields_is_refused() {
        let cases = aliasing_cases(16);
        // 18 fields, minus the pairs inside one area (6 + 6 per queue) and
        // the 4 that alignment keeps apart (see `aliasing_cases`).
        assert_eq!(cases.len(), 18 * 17 / 2 - 24 - 4);
        for c in cases {
            for features in [VERSION_1, VERSION_1 | EVENT_IDX] {
                let (mut f, live) = bring_up(features, c.layouts);
                assert!(!live, "{} accepted ({features:#x})", c.what);
                assert_needs_reset_not_activated(&mut f);
            }
        }
    }

    /// Every ordered pair of areas (within a queue and across queues) laid
    /// end to end: accepted.
    #[test]
    fn adjacent_areas_are_accepted() {
        let cases = adjacent_cases(16);
        assert_eq!(cases.len(), 30);
        for c in cases {
            for features in [VERSION_1, VERSION_1 | EVENT_IDX] {
                let (f, live) = bring_up(features, c.layouts);
                let status = f.drv.transport().status();
                assert!(live, "{}: status {status:#x}", c.what);
            }
        }
    }

    #[test]
    fn avail_ring_at_address_zero_is_accepted() {
        let rx = layout(256, 0x10000, 0, 0x18000);
        let tx = layout(64, 0x40000, 0x44000, 0x48000);
        let (f, live) = bring_up(VERSION_1, [rx, tx]);
        assert!(live);
        assert_eq!(f.dev.lock().unwrap().queues[0].addrs().avail_ring, 0);
    }

    #[test]
    fn a_ring_across_two_memory_regions_needs_reset() {
        let mem = GuestMemory::from_ranges(&[
            (GuestAddress(0), 0x40000),
            (GuestAddress(0x40000), 0x40000),
        ])
        .unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut f = Fixture {
            dev,
            drv: MockDriver::new(mem, t).unwrap(),
        };
        f.drv.negotiate(VERSION_1).unwrap();
        f.drv
            .setup_queue_at(0, layout(256, 0x10000, 0x14000, 0x18000))
            .unwrap();
        // The TX descriptor table (1 KiB) starts 512 bytes before the
        // boundary: inside guest memory, but in two mappings.
        f.drv
            .setup_queue_at(1, layout(64, 0x40000 - 0x200, 0x44000, 0x48000))
            .unwrap();
        assert_driver_ok_refused(&mut f);
    }

    #[test]
    fn rings_outside_guest_memory_need_reset() {
        // Entirely outside, straddling the end, and above 4 GiB via the
        // high register.
        for base in [MEM_SIZE as u64 + 0x1000, MEM_SIZE as u64 - 0x8010, 1 << 32] {
            let mut f = fixture_with_queue_0();
            f.program_queue(1, 64, base);
            assert_driver_ok_refused(&mut f);
        }
    }

    #[test]
    fn each_high_address_register_moves_its_own_ring() {
        // One ring at a time above 4 GiB (outside guest memory): the device
        // must need a reset whichever of the three it is.
        for high in [
            REG_QUEUE_DESC_HIGH,
            REG_QUEUE_DRIVER_HIGH,
            REG_QUEUE_DEVICE_HIGH,
        ] {
            let mut f = fixture_with_queue_0();
            f.write(REG_QUEUE_SEL, 1);
            f.write(REG_QUEUE_NUM, 64);
            for (low, v) in [
                (REG_QUEUE_DESC_LOW, 0x20000),
                (REG_QUEUE_DRIVER_LOW, 0x24000),
                (REG_QUEUE_DEVICE_LOW, 0x28000),
            ] {
                f.write(low, v);
            }
            f.write(high, 1);
            f.write(REG_QUEUE_READY, 1);
            assert_driver_ok_refused(&mut f);
        }
    }

    #[test]
    fn address_halves_may_come_in_either_order() {
        // High half first, then the low half: the low write keeps the high
        // half (0 here), replaces the low half written before (a stale
        // value first), and the rings are where the driver put them.
        let mut f = fixture_with_queue_0();
        f.write(REG_QUEUE_SEL, 1);
        f.write(REG_QUEUE_NUM, 64);
        for (high, low, v) in [
            (REG_QUEUE_DESC_HIGH, REG_QUEUE_DESC_LOW, 0x20000),
            (REG_QUEUE_DRIVER_HIGH, REG_QUEUE_DRIVER_LOW, 0x24000),
            (REG_QUEUE_DEVICE_HIGH, REG_QUEUE_DEVICE_LOW, 0x28000),
        ] {
            f.write(low, 0x7fff_f000);
            f.write(high, 0);
            f.write(low, v);
        }
        f.write(REG_QUEUE_READY, 1);
        f.add_status(DRIVER_OK);
        assert_eq!(f.activations(), 1);
        assert_eq!(f.read(REG_STATUS) & DEVICE_NEEDS_RESET, 0);
        let q = &f.dev.lock().unwrap().queues[1];
        let a = q.addrs();
        assert_eq!(
            (a.desc_table, a.avail_ring, a.used_ring),
            (0x20000, 0x24000, 0x28000)
        );
    }

    #[test]
    fn misaligned_rings_need_reset() {
        let mut f = fixture_with_queue_0();
        f.program_queue(1, 64, 0x20000);
        f.write(REG_QUEUE_SEL, 1);
        f.write(REG_QUEUE_READY, 0);
        f.write(REG_QUEUE_DEVICE_LOW, 0x28002);
        f.write(REG_QUEUE_READY, 1);
        assert_driver_ok_refused(&mut f);
    }

    #[test]
    fn failed_activate_needs_reset_then_reset_recovers() {
        let mut f = fixture_with(|d| d.fail_activate = true);
        f.drv.negotiate(VERSION_1).unwrap();
        f.drv.setup_queues(None).unwrap();
        assert!(f.drv.driver_ok().is_err());
        let s = f.read(REG_STATUS);
        assert_ne!(s & DEVICE_NEEDS_RESET, 0);
        assert_eq!(f.activations(), 1);
        assert!(!f.drv.transport().is_activated());
        assert_eq!(f.read(REG_INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
        // Nothing but a reset moves it on.
        f.write(REG_STATUS, s | FAILED);
        f.write(REG_STATUS, 0);
        assert_eq!(f.read(REG_STATUS), 0);
        f.dev.lock().unwrap().fail_activate = false;
        f.drv.init(VERSION_1).unwrap();
        assert!(f.drv.transport().is_activated());
    }

    #[test]
    fn queue_registers_frozen_after_driver_ok() {
        let mut f = fixture();
        f.drv.init(VERSION_1).unwrap();
        let before = f.drv.layout(0).unwrap();
        f.write(REG_QUEUE_SEL, 0);
        f.write(REG_QUEUE_READY, 0);
        f.write(REG_QUEUE_NUM, 2);
        f.write(REG_QUEUE_DESC_LOW, 0x5000);
        assert_eq!(f.read(REG_QUEUE_READY), 1);
        // Re-activating would show the changes; status writes are ignored too.
        f.add_status(DRIVER_OK);
        assert_eq!(f.activations(), 1);
        let d = f.dev.lock().unwrap();
        assert_eq!(d.queues[0].size(), before.size);
        assert_eq!(d.queues[0].addrs().desc_table, before.desc_table.0);
        drop(d);
        let t = f.drv.transport();
        assert_eq!(t.queues[0].size, u32::from(before.size));
        assert_eq!(t.queues[0].desc_table, before.desc_table.0);
        assert!(t.queues[0].ready);
    }

    #[test]
    fn queue_registers_frozen_while_ready_and_before_features_ok() {
        let mut f = fixture();
        // Before FEATURES_OK nothing sticks.
        f.add_status(ACKNOWLEDGE);
        f.add_status(DRIVER);
        f.program_queue(0, 16, 0x10000);
        assert_eq!(f.read(REG_QUEUE_READY), 0);
        assert_eq!(f.drv.transport().queues[0].size, 256);
        assert_eq!(f.drv.transport().queues[0].desc_table, 0);

        f.drv.write_driver_features(VERSION_1);
        f.add_status(FEATURES_OK);
        f.program_queue(0, 16, 0x10000);
        assert_eq!(f.read(REG_QUEUE_READY), 1);
        // Ready queue: changes ignored until the driver un-readies it.
        f.write(REG_QUEUE_NUM, 32);
        assert_eq!(f.drv.transport().queues[0].size, 16);
        f.write(REG_QUEUE_READY, 0);
        f.write(REG_QUEUE_NUM, 32);
        assert_eq!(f.drv.transport().queues[0].size, 32);
    }

    #[test]
    fn queue_num_max_per_selector() {
        let mut f = fixture();
        assert_eq!(f.drv.queue_num_max(0), 256);
        assert_eq!(f.drv.queue_num_max(1), 64);
        assert_eq!(f.drv.queue_num_max(2), 0);
        assert_eq!(f.drv.queue_num_max(u32::MAX), 0);
        // Writes with an out-of-range QueueSel are dropped, not a panic.
        f.reach_features_ok();
        f.write(REG_QUEUE_SEL, 9);
        f.write(REG_QUEUE_NUM, 4);
        f.write(REG_QUEUE_READY, 1);
        assert_eq!(f.read(REG_QUEUE_READY), 0);
    }

    #[test]
    fn a_device_error_sets_needs_reset_until_the_driver_resets() {
        let mut f = fixture();
        f.drv.init(VERSION_1).unwrap();
        let irq = f.dev.lock().unwrap().interrupt.clone().unwrap();
        irq.signal_device_error();
        let s = f.read(REG_STATUS);
        assert_eq!(
            s,
            ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK | DEVICE_NEEDS_RESET
        );
        // The driver learns of it through a configuration-change interrupt.
        assert_ne!(f.read(REG_INTERRUPT_STATUS) & VIRTIO_MMIO_INT_CONFIG, 0);
        // Only a reset clears it, and a fresh initialisation works again.
        f.write(REG_STATUS, 0);
        assert_eq!(f.read(REG_STATUS), 0);
        f.drv.init(VERSION_1).unwrap();
        assert_eq!(f.read(REG_STATUS) & DEVICE_NEEDS_RESET, 0);
        assert_eq!(f.activations(), 2);
    }

    #[test]
    fn reset_returns_to_initial_state() {
        let mut f = fixture();
        f.drv.init(VERSION_1 | EVENT_IDX).unwrap();
        f.write(REG_DEVICE_FEATURES_SEL, 1);
        f.write(REG_DRIVER_FEATURES_SEL, 1);
        f.write(REG_QUEUE_SEL, 1);
        f.dev
            .lock()
            .unwrap()
            .interrupt
            .as_ref()
            .unwrap()
            .signal_used_queue();
        assert_ne!(f.read(REG_INTERRUPT_STATUS), 0);
        let resets = f.dev.lock().unwrap().reset_calls;

        f.write(REG_STATUS, 0);
        assert_eq!(f.dev.lock().unwrap().reset_calls, resets + 1);
        let t = f.drv.transport();
        assert_eq!(t.status(), 0);
        assert!(!t.is_activated());
        assert_eq!(t.acked_features(), 0);
        assert_eq!(t.device_features_sel, 0);
        assert_eq!(t.driver_features_sel, 0);
        assert_eq!(t.queue_sel, 0);
        for q in &t.queues {
            assert!(!q.ready);
            assert_eq!(q.size, u32::from(q.max_size));
            assert_eq!((q.desc_table, q.avail_ring, q.used_ring), (0, 0, 0));
        }
        assert_eq!(t.interrupt_status().load(Ordering::SeqCst), 0);
        // Device features read back from page 0 again.
        assert_eq!(f.read(REG_DEVICE_FEATURES), (EVENT_IDX | 1) as u32);
        // And the device can be brought up again.
        f.drv.init(VERSION_1).unwrap();
        assert_eq!(f.activations(), 2);
    }

    #[test]
    fn queue_notify_signals_the_queue_event() {
        let mut f = fixture();
        f.drv.init(VERSION_1).unwrap();
        f.drv.kick(1);
        f.drv.kick(1);
        f.drv.kick(0);
        f.drv.kick(2);
        f.drv.kick(u32::MAX as usize);
        let d = f.dev.lock().unwrap();
        assert_eq!(d.common.queue_evts[0].read().unwrap(), 1);
        assert_eq!(d.common.queue_evts[1].read().unwrap(), 2);
    }

    #[test]
    fn interrupt_ack_clears_only_acked_bits() {
        let mut f = fixture();
        let status = f.drv.transport().interrupt_status();
        status.store(
            VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG,
            Ordering::SeqCst,
        );
        f.drv.ack_interrupt(VIRTIO_MMIO_INT_VRING);
        assert_eq!(f.read(REG_INTERRUPT_STATUS), VIRTIO_MMIO_INT_CONFIG);
        f.drv.ack_interrupt(VIRTIO_MMIO_INT_CONFIG);
        assert_eq!(f.read(REG_INTERRUPT_STATUS), 0);
    }

    #[test]
    fn config_space_is_delegated_at_any_width() {
        let mut f = fixture();
        let t = f.drv.transport_mut();
        let mut b = [0u8; 1];
        t.read(CONFIG_SPACE_OFFSET + 3, &mut b);
        assert_eq!(b, [3]);
        let mut b = [0u8; 2];
        t.read(CONFIG_SPACE_OFFSET + 6, &mut b);
        assert_eq!(b, [6, 7]);
        t.write(CONFIG_SPACE_OFFSET + 8, &[0xaa, 0xbb, 0xcc, 0xdd]);
        let mut b = [0u8; 8];
        t.read(CONFIG_SPACE_OFFSET + 8, &mut b);
        assert_eq!(b, [0xaa, 0xbb, 0xcc, 0xdd, 12, 13, 14, 15]);
        // Past the device's config the device ignores it and we read zeros.
        let mut b = [0xffu8; 4];
        t.read(MMIO_WINDOW_SIZE - 4, &mut b);
        assert_eq!(b, [0; 4]);
        t.read(u64::MAX, &mut b);
        assert_eq!(b, [0; 4]);
        t.write(u64::MAX, &[1]);
    }

    #[test]
    fn odd_width_and_misaligned_register_access_ignored() {
        let mut f = fixture();
        let t = f.drv.transport_mut();
        let mut b = [0xffu8; 2];
        t.read(REG_MAGIC_VALUE, &mut b);
        assert_eq!(b, [0, 0]);
        let mut b = [0xffu8; 8];
        t.read(REG_MAGIC_VALUE, &mut b);
        assert_eq!(b, [0; 8]);
        let mut b = [0xffu8; 4];
        t.read(REG_MAGIC_VALUE + 1, &mut b);
        assert_eq!(b, [0; 4]);
        let mut b = [0xffu8; 0];
        t.read(REG_STATUS, &mut b);

        t.write(REG_STATUS, &[ACKNOWLEDGE as u8]);
        t.write(REG_STATUS, &(ACKNOWLEDGE as u16).to_le_bytes());
        t.write(REG_STATUS, &u64::from(ACKNOWLEDGE).to_le_bytes());
        t.write(REG_STATUS + 2, &ACKNOWLEDGE.to_le_bytes());
        t.write(REG_STATUS, &[]);
        assert_eq!(t.status(), 0);
        t.write(REG_STATUS, &ACKNOWLEDGE.to_le_bytes());
        assert_eq!(t.status(), ACKNOWLEDGE);
    }

    #[test]
    fn arbitrary_register_traffic_never_panics() {
        // A small deterministic fuzz over the register window: every offset,
        // widths 0..=8 and a spread of values, interleaved with status writes.
        let mut f = fixture();
        let values = [
            0u32,
            1,
            2,
            3,
            4,
            8,
            0x40,
            0x80,
            0xff,
            0x1000,
            0x8000_0000,
            u32::MAX,
        ];
        let mut seed = 0x1234_5678u32;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            let off = u64::from(seed % 0x120);
            let v = values[(seed >> 9) as usize % values.len()];
            let width = (seed >> 20) as usize % 9;
            let t = f.drv.transport_mut();
            if seed & 1 == 0 {
                t.write(off, &v.to_le_bytes().repeat(2)[..width]);
            } else {
                let mut b = vec![0; width];
                t.read(off, &mut b);
            }
        }
    }
}

#[cfg(test)]
mod persist_tests {
    use super::*;
    use crate::virtio::queue::Budget;
    use crate::virtio::test_utils::{guest_memory, DummyDevice, MockDriver, Segment};
    use status::*;

    const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
    const EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

    /// A driven transport whose device took two chains of queue 0 and
    /// completed the first: used.idx 1, next_avail 2.
    fn driven() -> (MockDriver, Arc<Mutex<DummyDevice>>, Vec<u16>) {
        let mem = guest_memory(1 << 20).unwrap();
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        let t = MmioTransport::new(mem.clone(), dev.clone()).unwrap();
        let mut drv = MockDriver::new(mem, t).unwrap();
        drv.init(VERSION_1 | EVENT_IDX).unwrap();
        let buf = drv.alloc(64, 8).unwrap();
        let heads: Vec<u16> = (0..3)
            .map(|_| drv.submit(0, &[Segment::writable(buf, 64)]).unwrap())
            .collect();
        {
            let mut d = dev.lock().unwrap();
            let q = &mut d.queues[0];
            let mut budget = Budget::new(100);
            let first = q.pop(&mut budget).unwrap().unwrap();
            q.pop(&mut budget).unwrap().unwrap();
            q.add_used(first, 0);
            q.publish_used();
        }
        (drv, dev, heads)
    }

    fn fresh(mem: &GuestMemory) -> (MmioTransport, Arc<Mutex<DummyDevice>>) {
        let dev = Arc::new(Mutex::new(DummyDevice::new().unwrap()));
        (MmioTransport::new(mem.clone(), dev.clone()).unwrap(), dev)
    }

    #[test]
    fn a_restored_transport_reads_back_the_same_and_retakes_the_uncompleted_chain() {
        let (drv, _dev, heads) = driven();
        let saved = drv.transport().save().unwrap();
        assert!(saved.transport.activated);
        assert_eq!(saved.transport.acked_features, VERSION_1 | EVENT_IDX);
        // Through JSON, as the state file carries it.
        let text = serde_json::to_string(&saved).unwrap();
        let saved: VirtioState = serde_json::from_str(&text).unwrap();

        let (mut t, dev) = fresh(drv.mem());
        t.restore(&saved).unwrap();
        assert!(t.is_activated());
        assert_eq!(t.status(), ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK);
        assert_eq!(t.acked_features(), VERSION_1 | EVENT_IDX);
        // Nothing the driver had not acknowledged: no interrupt.
        assert_eq!(t.interrupt_status().load(Ordering::SeqCst), 0);
        assert!(t.interrupt_evt().read().is_err(), "an interrupt raised");
        let mut d = dev.lock().unwrap();
        assert_eq!(d.activate_calls, 1);
        assert!(d.queues[0].features().event_idx);
        // Picked up at used.idx: the chain taken but not completed comes
        // again, then the one never taken.
        assert_eq!(d.queues[0].position(), (1, 1));
        let mut budget = Budget::new(100);
        assert_eq!(d.queues[0].pop(&mut budget).unwrap(), Some(heads[1]));
        assert_eq!(d.queues[0].pop(&mut budget).unwrap(), Some(heads[2]));
        assert_eq!(d.queues[0].pop(&mut budget).unwrap(), None);
        drop(d);
        let again = t.save().unwrap();
        assert_eq!(again.transport.queues, saved.transport.queues);
        assert_eq!(again.transport.status, saved.transport.status);
    }

    /// An interrupt the driver had not acknowledged when the state was
    /// saved is raised again after the restore, once, with its status bits
    /// as they were; an inactive device raises none.
    #[test]
    fn an_unacknowledged_interrupt_is_raised_again_after_a_restore() {
        for bits in [
            VIRTIO_MMIO_INT_VRING,
            VIRTIO_MMIO_INT_CONFIG,
            VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG,
        ] {
            let (drv, _dev, _) = driven();
            let mut saved = drv.transport().save().unwrap();
            saved.transport.interrupt_status = bits;
            let (mut t, _) = fresh(drv.mem());
            t.restore(&saved).unwrap();
            assert_eq!(t.interrupt_status().load(Ordering::SeqCst), bits);
            assert_eq!(t.interrupt_evt().read().unwrap(), 1, "{bits:#x}");

            saved.transport.activated = false;
            saved.transport.status &= !DRIVER_OK;
            let (mut t, _) = fresh(drv.mem());
            t.restore(&saved).unwrap();
            assert!(t.interrupt_evt().read().is_err(), "inactive, {bits:#x}");
        }
    }

    #[test]
    fn a_transport_never_activated_restores_without_activation() {
        let mem = guest_memory(1 << 20).unwrap();
        let (mut t, _) = fresh(&mem);
        t.write(REG_STATUS, &ACKNOWLEDGE.to_le_bytes());
        t.write(REG_QUEUE_SEL, &1u32.to_le_bytes());
        let saved = t.save().unwrap();
        let (mut back, dev) = fresh(&mem);
        back.restore(&saved).unwrap();
        assert!(!back.is_activated());
        assert_eq!(back.status(), ACKNOWLEDGE);
        assert_eq!(dev.lock().unwrap().activate_calls, 0);
        assert_eq!(back.interrupt_evt().read().ok(), None, "no interrupt");
        assert_eq!(back.save().unwrap(), saved);
    }

    #[test]
    fn a_saved_state_no_driver_could_have_made_is_refused() {
        let (drv, _dev, _) = driven();
        let good = drv.transport().save().unwrap();
        type Damage = Box<dyn Fn(&mut VirtioState)>;
        let cases: Vec<(&str, Damage)> = vec![
            ("device type", Box::new(|s| s.transport.device_id = 1)),
            (
                "queue(s)",
                Box::new(|s| {
                    s.transport.queues.pop();
                }),
            ),
            (
                "queue(s)",
                Box::new(|s| s.transport.queues[0].max_size = 128),
            ),
            (
                "cannot be reached",
                Box::new(|s| s.transport.status = DRIVER_OK),
            ),
            (
                "activated in status",
                Box::new(|s| s.transport.status = ACKNOWLEDGE | DRIVER | FEATURES_OK),
            ),
            (
                "were not offered",
                Box::new(|s| s.transport.acked_features |= 1 << 40),
            ),
            ("VERSION_1", Box::new(|s| s.transport.acked_features = 0)),
            (
                "interrupt status",
                Box::new(|s| s.transport.interrupt_status = 4),
            ),
            // Rings checked as at DRIVER_OK: outside memory, misaligned,
            // overlapping, a size the queue cannot have.
            (
                "cannot be activated",
                Box::new(|s| s.transport.queues[0].desc_table = 1 << 40),
            ),
            (
                "cannot be activated",
                Box::new(|s| s.transport.queues[0].used_ring += 2),
            ),
            (
                "cannot be activated",
                Box::new(|s| s.transport.queues[1].desc_table = s.transport.queues[0].desc_table),
            ),
            (
                "cannot be activated",
                Box::new(|s| s.transport.queues[0].size = 3),
            ),
            (
                "cannot be activated",
                Box::new(|s| s.transport.queues[0].size = 1 << 20),
            ),
            (
                "cannot be activated",
                Box::new(|s| s.transport.queues[1].ready = false),
            ),
            (
                "keeps no state",
                Box::new(|s| s.device = serde_json::json!({"x": 1})),
            ),
        ];
        for (want, damage) in cases {
            let mut bad = good.clone();
            damage(&mut bad);
            let (mut t, dev) = fresh(drv.mem());
            let err = t.restore(&bad).unwrap_err().to_string();
            assert!(err.contains(want), "{want}: {err}");
            assert!(!err.contains('\n'));
            assert_eq!(dev.lock().unwrap().activate_calls, 0, "{want}: activated");
        }
    }
}
