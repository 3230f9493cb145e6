// SPDX-License-Identifier: Apache-2.0
//! The two ways the suites hold a device on its own event loop:
//!
//! - [`DeviceRig`]: behind the real MMIO transport, reached only the way a
//!   guest reaches it (through a [`MockDriver`]): what the contract suite,
//!   every device's transport tests and the entropy device's suite drive;
//! - [`DirectRig`]: activated straight over rings the test writes, for
//!   what no driver should write (each device's direct fixture is one).
//!
//! [`DriverQueue`]: super::DriverQueue

use std::sync::{Arc, Mutex, MutexGuard};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::{queue_at, MockDriver, TestIrq};
use crate::virtio::mmio::MmioTransport;
use crate::virtio::queue::RingAddrs;
use crate::virtio::{ActivateError, GuestMemory, Interrupt, VirtioDevice};

/// Where the driver's allocations, and the buffers of a [`DirectRig`],
/// start: the first 1 MiB is left to tests that place rings by hand.
pub const BUF_BASE: u64 = 0x100000;

/// Event-loop iterations after which a loop that is still busy is taken
/// for a spinning one.
const IDLE_LIMIT: usize = 10_000;

/// A device on its own event loop, activated straight, as the transport
/// does at DRIVER_OK, over rings the test writes with
/// [`DriverQueue`](super::DriverQueue)s: so
/// a test can write what no driver should, and activate with layouts the
/// transport would refuse. What each device's direct fixture is built on.
pub struct DirectRig<D: VirtioDevice + MutEventSubscriber + 'static> {
    /// Guest memory.
    pub mem: GuestMemory,
    /// The device, as the VMM shares it.
    pub dev: Arc<Mutex<D>>,
    /// Its event loop.
    pub evmgr: EventManager<Arc<Mutex<D>>>,
    /// The interrupt of its activations.
    pub irq: Arc<TestIrq>,
    /// The next buffer [`alloc`](Self::alloc) hands out.
    pub next_buf: u64,
}

impl<D: VirtioDevice + MutEventSubscriber + 'static> DirectRig<D> {
    /// `dev` over `mem`, registered with a fresh event loop; not activated.
    pub fn new(mem: GuestMemory, dev: D) -> Self {
        let dev = Arc::new(Mutex::new(dev));
        let mut evmgr = EventManager::new().expect("an epoll instance");
        evmgr.add_subscriber(dev.clone());
        DirectRig {
            mem,
            dev,
            evmgr,
            irq: Arc::new(TestIrq::default()),
            next_buf: BUF_BASE,
        }
    }

    /// The device, locked.
    pub fn dev(&self) -> MutexGuard<'_, D> {
        self.dev.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Activates the device with `features` over the driver's rings at
    /// `rings`, in the device's queue order, as the transport does at
    /// DRIVER_OK (without its overlap check).
    pub fn activate_rings(
        &mut self,
        features: u64,
        rings: &[RingAddrs],
    ) -> Result<(), ActivateError> {
        let queues = rings
            .iter()
            .map(|&a| queue_at(&self.mem, a, features))
            .collect();
        let irq: Arc<dyn Interrupt> = self.irq.clone();
        self.dev().activate(features, queues, irq)
    }

    /// One event-loop iteration of at most `timeout_ms`; the events
    /// dispatched.
    pub fn run_once(&mut self, timeout_ms: i32) -> usize {
        self.evmgr
            .run_with_timeout(timeout_ms)
            .expect("epoll_wait on the test's loop")
    }

    /// Runs the loop until nothing is ready, at most `max` iterations;
    /// `None` if it was still busy.
    pub fn run_bounded(&mut self, max: usize) -> Option<usize> {
        (0..max).find(|_| self.run_once(0) == 0)
    }

    /// Runs the loop until nothing is ready; returns the iterations. A loop
    /// still busy after 10,000 is a spinning device: the test fails.
    pub fn run_until_idle(&mut self) -> usize {
        self.run_bounded(IDLE_LIMIT)
            .expect("event loop never went idle (busy loop?)")
    }

    /// Allocates `len` bytes of guest memory for buffers (16-byte
    /// aligned); running out of guest memory fails the test.
    pub fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next_buf;
        self.next_buf = (self.next_buf + len + 15) & !15;
        let end = self.mem.last_addr().raw_value();
        assert!(self.next_buf <= end, "test guest memory exhausted");
        a
    }

    /// Reads `len` bytes of guest memory at `addr`.
    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem
            .read_slice(&mut v, GuestAddress(addr))
            .expect("guest memory");
        v
    }

    /// The device's counters as its metrics line has them.
    pub fn metrics(&self) -> serde_json::Value {
        self.dev().device_metrics().to_json()
    }

    /// One counter of the device's metrics line; a key it does not have
    /// fails the test.
    pub fn metric(&self, key: &str) -> u64 {
        let m = self.metrics();
        m[key]
            .as_u64()
            .unwrap_or_else(|| panic!("no counter {key} in {m}"))
    }
}

/// A device on its own event loop behind its transport, and the driver
/// that reaches it: a [`DirectRig`] (the device, its loop; reached through
/// `Deref`) that the test activates only through the driver.
pub struct DeviceRig<D: VirtioDevice + MutEventSubscriber + 'static> {
    /// The device on its event loop.
    pub rig: DirectRig<D>,
    /// The guest's driver, allocating from [`BUF_BASE`] to the end
    /// of the first memory region.
    pub drv: MockDriver,
}

impl<D: VirtioDevice + MutEventSubscriber + 'static> std::ops::Deref for DeviceRig<D> {
    type Target = DirectRig<D>;
    fn deref(&self) -> &Self::Target {
        &self.rig
    }
}

impl<D: VirtioDevice + MutEventSubscriber + 'static> std::ops::DerefMut for DeviceRig<D> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.rig
    }
}

impl<D: VirtioDevice + MutEventSubscriber + 'static> DeviceRig<D> {
    /// `dev` over `mem`, registered with a fresh event loop and put behind
    /// a transport; not initialised.
    pub fn new(mem: &GuestMemory, dev: D) -> Self {
        let rig = DirectRig::new(mem.clone(), dev);
        let transport_dev: Arc<Mutex<dyn VirtioDevice>> = rig.dev.clone();
        let t = MmioTransport::new(mem.clone(), transport_dev).expect("a transport");
        let end = mem
            .iter()
            .next()
            .map_or(0, |r| r.start_addr().raw_value() + r.len());
        let drv = MockDriver::with_alloc_range(
            mem.clone(),
            t,
            GuestAddress(BUF_BASE),
            end.saturating_sub(BUF_BASE),
        );
        DeviceRig { rig, drv }
    }
}
