// SPDX-License-Identifier: Apache-2.0
//! virtio devices and the virtio-MMIO transport (virtio 1.1 §4.2): the
//! pieces every device shares here, each device in its folder (`net`,
//! `block`, `rng`).
//!
//! The transport ([`mmio::MmioTransport`]) owns everything the specification
//! puts in the register window: feature negotiation, the status state machine,
//! queue configuration and the interrupt status register. A device implements
//! [`VirtioDevice`] and only sees fully configured queues, handed over once in
//! [`VirtioDevice::activate`] when the driver sets DRIVER_OK: validated and
//! translated to host pointers ([`queue::SplitQueue`]). What the transport
//! reads of every device (ID, features, queue sizes, notification eventfds)
//! lives in one [`VirtioCommon`] that each device embeds.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::EventFd;

pub use common::VirtioCommon;
pub use metrics::DeviceMetrics;
use queue::SplitQueue;

pub mod block;
mod common;
pub(crate) mod events;
pub mod io_engine;
pub mod iov;
pub mod metrics;
pub mod mmio;
pub mod net;
pub(crate) mod pass;
pub mod persist;
pub mod queue;
pub(crate) mod request_queue;
pub mod rng;
#[cfg(any(test, feature = "test-utils"))]
pub mod test_utils;
pub mod time_counter;
pub mod vsock;

/// Guest memory as every device in minivmm sees it.
pub type GuestMemory = GuestMemoryMmap<()>;

/// Device status bits (virtio 1.1 §2.1).
pub mod status {
    /// The guest noticed the device.
    pub const ACKNOWLEDGE: u32 = 1;
    /// The guest knows how to drive the device.
    pub const DRIVER: u32 = 2;
    /// The driver is set up and ready to drive the device.
    pub const DRIVER_OK: u32 = 4;
    /// The driver has acknowledged the features it understands.
    pub const FEATURES_OK: u32 = 8;
    /// The device hit an error from which it cannot recover without a reset.
    pub const DEVICE_NEEDS_RESET: u32 = 64;
    /// The guest gave up on the device.
    pub const FAILED: u32 = 128;
}

/// Interrupt status bits of the MMIO transport (virtio 1.1 §4.2.2, InterruptStatus).
pub const VIRTIO_MMIO_INT_VRING: u32 = 0x1;
/// The device configuration changed.
pub const VIRTIO_MMIO_INT_CONFIG: u32 = 0x2;

/// How a device raises an interrupt in the guest.
pub trait Interrupt: Send + Sync {
    /// Tells the guest that a used ring has new entries.
    fn signal_used_queue(&self);
    /// Tells the guest that the device configuration space changed.
    fn signal_config_change(&self);
    /// The device found a queue it cannot use (a corrupt ring): the
    /// transport sets DEVICE_NEEDS_RESET and notifies the driver with a
    /// configuration-change interrupt (virtio 1.1 §2.1.2).
    fn signal_device_error(&self);
}

/// The MMIO transport's interrupt: sets a bit in the InterruptStatus register
/// and kicks an `EventFd` that the VMM registers as a KVM irqfd (or a test reads).
#[derive(Debug)]
pub struct IrqTrigger {
    /// The InterruptStatus register, shared with the transport that reads and acks it.
    pub status: Arc<AtomicU32>,
    /// Signalled for each interrupt; an irqfd under KVM.
    pub evt: EventFd,
    /// Set by the device on an unrecoverable error; the transport folds it
    /// into DEVICE_NEEDS_RESET and clears it on reset.
    pub needs_reset: AtomicBool,
}

impl IrqTrigger {
    /// Creates a trigger with a cleared status register.
    pub fn new() -> std::io::Result<Self> {
        Ok(IrqTrigger {
            status: Arc::new(AtomicU32::new(0)),
            evt: EventFd::new(libc::EFD_NONBLOCK)?,
            needs_reset: AtomicBool::new(false),
        })
    }

    fn raise(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::SeqCst);
        // A failed write means the counter is saturated, i.e. an interrupt is
        // already pending; the guest will see the status bit either way.
        if let Err(e) = self.evt.write(1) {
            log::error!("failed to signal interrupt: {e}");
        }
    }
}

impl Interrupt for IrqTrigger {
    fn signal_used_queue(&self) {
        self.raise(VIRTIO_MMIO_INT_VRING);
    }

    fn signal_config_change(&self) {
        self.raise(VIRTIO_MMIO_INT_CONFIG);
    }

    fn signal_device_error(&self) {
        self.needs_reset.store(true, Ordering::SeqCst);
        self.raise(VIRTIO_MMIO_INT_CONFIG);
    }
}

/// Why a device refused activation.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    /// The driver configured fewer or more queues than the device needs.
    #[error("expected {expected} queues, driver set up {got}")]
    QueueCount {
        /// Queues the device needs.
        expected: usize,
        /// Queues the driver made ready.
        got: usize,
    },
    /// A host resource the device needs could not be set up.
    #[error("device activation failed: {0}")]
    Backend(String),
}

/// Copies what a driver's read of a device's configuration space covers;
/// bytes past its end read as zeros, as an absent field would.
pub(crate) fn read_config_space(space: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Some(src) = usize::try_from(offset).ok().and_then(|o| space.get(o..)) else {
        return;
    };
    let n = data.len().min(src.len());
    data[..n].copy_from_slice(&src[..n]);
}

/// The checks every device makes of the queues a transport hands it at
/// activation: as many as the device has, each translated against the
/// device's own guest memory (the view its datapath reads buffers through).
pub(crate) fn check_queues(
    queues: &[SplitQueue],
    expected: usize,
    mem: &GuestMemory,
) -> Result<(), ActivateError> {
    if queues.len() != expected {
        return Err(ActivateError::QueueCount {
            expected,
            got: queues.len(),
        });
    }
    if !queues.iter().all(|q| q.memory().is_snapshot_of(mem)) {
        return Err(ActivateError::Backend(
            "queues translated against another guest memory".into(),
        ));
    }
    Ok(())
}

/// A virtio device behind a transport.
pub trait VirtioDevice: Send {
    /// The state every device keeps for the transport, which the getters
    /// below read.
    fn common(&self) -> &VirtioCommon;
    /// Device ID (virtio 1.1 §5, `virtio_bindings::virtio_ids`): 1 for a
    /// network card, 2 for a block device, 4 for an entropy source.
    fn device_type(&self) -> u32 {
        self.common().device_type
    }
    /// The feature bits the device offers (including VIRTIO_F_VERSION_1).
    fn avail_features(&self) -> u64 {
        self.common().avail_features
    }
    /// Maximum size of each queue; the length of the slice is the number of queues.
    fn queue_max_sizes(&self) -> &[u16] {
        &self.common().queue_sizes
    }
    /// Reads the device-specific configuration space at `offset`.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes the device-specific configuration space at `offset`.
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The ConfigGeneration register (virtio 1.1 §2.4.1): a value the
    /// device changes whenever its configuration space changes, so a driver
    /// that reads a field in several accesses can tell a torn read (it
    /// reads the generation before and after, and again on a change). A
    /// device whose configuration never changes keeps 0.
    fn config_generation(&self) -> u32 {
        0
    }
    /// One `EventFd` per queue, signalled when the driver notifies that queue.
    /// The VMM registers each as an ioeventfd on QueueNotify with the queue
    /// index as datamatch; the transport writes it itself when a notify
    /// reaches it as an MMIO exit.
    fn queue_events(&self) -> &[EventFd] {
        &self.common().queue_evts
    }
    /// Starts the device with the negotiated features and the queues the
    /// driver made ready, validated and translated by the transport (sizes,
    /// alignment, placement in guest memory, no overlaps; see
    /// [`queue`]), with the ring features (EVENT_IDX, INDIRECT_DESC) set.
    fn activate(
        &mut self,
        acked_features: u64,
        queues: Vec<SplitQueue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError>;
    /// Returns the device to its state before activation (driver wrote 0 to Status).
    fn reset(&mut self);
    /// The device's counters, shared with the VMM's metrics writer, which
    /// collects every device's through this one trait.
    fn device_metrics(&self) -> Arc<dyn DeviceMetrics>;
    /// Called once the transport re-activated a restored device over its
    /// queues, before the guest runs again: what the device owes the guest
    /// after a restore. The vsock device sends
    /// VIRTIO_VSOCK_EVENT_TRANSPORT_RESET (its host connections did not
    /// survive); the default does nothing.
    fn restored(&mut self) {}
    /// Brings the device to a point a snapshot can be taken at, with the
    /// vCPUs paused: every chain it took is either completed or among the
    /// last it took, in order (see
    /// [`SplitQueue::resume_from_ring`](queue::SplitQueue::resume_from_ring)).
    /// A device that completes in order is there between any two passes
    /// (the default); the block device waits for its requests in flight.
    fn quiesce(&mut self) -> Result<(), persist::PersistError> {
        Ok(())
    }
    /// The device's own state for a snapshot, beyond what the transport
    /// saves (features, queues, interrupt status): see [`persist`]. A
    /// device that keeps nothing more returns `null`, the default.
    fn save_state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Takes back what [`save_state`](Self::save_state) returned, before
    /// the transport re-activates the device over its restored queues. The
    /// value comes from a file: anything malformed is an error, never a
    /// panic. The default takes only `null`.
    fn restore_state(&mut self, state: &serde_json::Value) -> Result<(), persist::PersistError> {
        if state.is_null() {
            Ok(())
        } else {
            Err(persist::PersistError::Device(
                "this device keeps no state of its own".into(),
            ))
        }
    }
}
