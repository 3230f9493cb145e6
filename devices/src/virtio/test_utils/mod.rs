// SPDX-License-Identifier: Apache-2.0
//! Driver-side test helpers: the guest's side of split virtqueues, a mock
//! virtio driver that talks to an [`MmioTransport`] only through register
//! accesses, and a dummy device.
//!
//! - [`DriverQueue`] (`driver_queue`): the one guest-side ring writer:
//!   descriptors, chains, indirect tables, avail publishing, used reading
//!   and the event-index fields, written with plain guest-memory accesses so
//!   that tests and fuzzers can also write what a driver never should.
//! - [`MockDriver`] (`mock_driver`) plays the guest at the register level:
//!   it negotiates features through the MMIO registers, lays out a
//!   [`DriverQueue`] per queue in guest memory at addresses it allocates from
//!   a bump allocator, posts chains, kicks through QueueNotify and reads back
//!   the used ring. It knows nothing about any particular device type.
//! - [`DeviceRig`] and [`DirectRig`] (`rig`): any device on its own event
//!   loop, behind the real transport and a `MockDriver`, or activated
//!   straight over rings the test writes. Each device's fixture is one of
//!   them with what is the device's own.
//! - `contract` (tests only): the suite every virtio device passes, written
//!   once, generic over a device (`ContractDevice`); a device joins with
//!   one line, `contract_suite!(TheDevice)`.
//! - `checks` (tests only): log capture, `check_metric_after_block!`, a
//!   temporary directory.
//! - [`DummyDevice`] (`dummy_device`): a device that records what the
//!   transport did to it.
//! - [`aliasing_cases`] and [`adjacent_cases`] (`layouts`): ring layouts that
//!   put two ring parts in contact.
//!
//! Unlike `virtio_queue::mock::MockSplitQueue`, which borrows the memory and
//! builds a `Queue` directly, the driver here owns its state (so it can live
//! in a test fixture or a benchmark thread), recycles descriptors when the
//! device returns them, and reaches the device only the way a guest would.
//!
//! Compiled for unit tests and with the `test-utils` feature.
//!
//! ```ignore
//! let mut drv = MockDriver::new(mem.clone(), MmioTransport::new(mem, device)?)?;
//! drv.init(1 << VIRTIO_F_VERSION_1)?;
//! let buf = drv.alloc(1500, 8)?;
//! drv.submit(0, &[Segment::writable(buf, 1500)])?;
//! // ... run the device ...
//! for e in drv.used(0)? { /* e.id, e.len */ }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use vm_memory::{GuestAddress, GuestMemoryError};

#[cfg(doc)]
use super::mmio::MmioTransport;
use super::queue::{GuestRegions, RingAddrs, RingFeatures, SplitQueue};
use super::{GuestMemory, Interrupt};

#[cfg(test)]
pub(crate) mod checks;
#[cfg(test)]
pub(crate) mod contract;
mod driver_queue;
mod dummy_device;
mod layouts;
mod mock_driver;
mod rig;

pub use driver_queue::{
    desc_bytes, write_indirect_table, DriverQueue, QueueLayout, Segment, UsedElem,
};
pub use dummy_device::DummyDevice;
pub use layouts::{adjacent_cases, aliasing_cases, LayoutCase};
pub use mock_driver::MockDriver;
pub use rig::{DeviceRig, DirectRig, BUF_BASE};

/// An interrupt that counts what the device raised: used-buffer
/// interrupts, configuration changes and device-error reports.
#[derive(Debug, Default)]
pub struct TestIrq {
    /// Used-buffer interrupts.
    pub used: AtomicU64,
    /// Configuration-change interrupts.
    pub config: AtomicU64,
    /// Device-error reports.
    pub device_errors: AtomicU64,
}

impl TestIrq {
    /// Used-buffer interrupts so far.
    pub fn count(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }
}

impl Interrupt for TestIrq {
    fn signal_used_queue(&self) {
        self.used.fetch_add(1, Ordering::SeqCst);
    }
    fn signal_config_change(&self) {
        self.config.fetch_add(1, Ordering::SeqCst);
    }
    fn signal_device_error(&self) {
        self.device_errors.fetch_add(1, Ordering::SeqCst);
    }
}

/// Errors of the driver-side helpers. In tests they mean the device (or the test)
/// did something the driver cannot go on from.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// FEATURES_OK did not stick after writing the driver features.
    #[error("device refused FEATURES_OK (status {status:#x})")]
    FeaturesRejected {
        /// Status read back.
        status: u32,
    },
    /// DRIVER_OK did not activate the device.
    #[error("device not live after DRIVER_OK (status {status:#x})")]
    NotLive {
        /// Status read back.
        status: u32,
    },
    /// The queue index is not one the driver set up.
    #[error("queue {0} is not set up")]
    NoSuchQueue(usize),
    /// QueueNumMax is 0 for this queue, or the requested size is above it.
    #[error("queue {index} cannot have size {size} (max {max})")]
    InvalidQueueSize {
        /// Queue index.
        index: usize,
        /// Requested size.
        size: u16,
        /// QueueNumMax.
        max: u16,
    },
    /// The bump allocator ran out of guest memory.
    #[error("cannot allocate {len} bytes of guest memory")]
    OutOfGuestMemory {
        /// Requested length.
        len: u64,
    },
    /// A chain needs more descriptors than the queue has free.
    #[error("the queue has {free} free descriptors, the chain needs {needed}")]
    NoFreeDescriptors {
        /// Descriptors needed.
        needed: usize,
        /// Descriptors free.
        free: usize,
    },
    /// A chain must have at least one segment.
    #[error("empty descriptor chain")]
    EmptyChain,
    /// A guest memory access failed.
    #[error("guest memory access failed")]
    Memory(#[from] GuestMemoryError),
}

/// xorshift64*: reproducible randomness without a dependency, for the soak
/// tests and the fuzz targets' random replay. The seed must not be 0.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// True once in `one_in` draws (never for 0).
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.next_u64().checked_rem(one_in) == Some(0)
    }
}

/// A device-side queue over the driver's rings at `addrs`, validated and
/// translated as the transport does at DRIVER_OK (without its overlap
/// check, so tests can build the layouts it refuses), with the ring
/// features of `features`: what a test hands a device's `activate`.
pub fn queue_at(mem: &GuestMemory, addrs: RingAddrs, features: u64) -> SplitQueue {
    let regions = Arc::new(GuestRegions::new(mem).expect("guest memory regions"));
    SplitQueue::new(
        regions,
        addrs,
        addrs.size.max(256),
        RingFeatures::from_bits(features),
    )
    .expect("a queue the transport would accept")
}

/// Guest memory of `size` bytes at address 0, for tests.
pub fn guest_memory(size: usize) -> Result<GuestMemory, vm_memory::mmap::FromRangesError> {
    GuestMemory::from_ranges(&[(GuestAddress(0), size)])
}
