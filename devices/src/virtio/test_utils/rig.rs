// SPDX-License-Identifier: Apache-2.0
//! [`DeviceRig`]: any device on its own event loop behind the real MMIO
//! transport, reached only the way a guest reaches it (through a
//! [`MockDriver`]): what every device's transport tests, the contract
//! suite and the entropy device's suite drive.

use std::sync::{Arc, Mutex, MutexGuard};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::MockDriver;
use crate::virtio::mmio::MmioTransport;
use crate::virtio::{GuestMemory, VirtioDevice};

/// Where the driver's allocations start: the first 1 MiB is left to tests
/// that place rings and buffers by hand.
pub const DRIVER_ALLOC_BASE: u64 = 0x100000;

/// Event-loop iterations after which a loop that is still busy is taken
/// for a spinning one.
const IDLE_LIMIT: usize = 10_000;

/// A device on its own event loop behind its transport, and the driver
/// that reaches it.
pub struct DeviceRig<D: VirtioDevice + MutEventSubscriber + 'static> {
    /// The device, as the VMM shares it.
    pub dev: Arc<Mutex<D>>,
    /// Its event loop (the VMM's main thread, here the test's).
    pub em: EventManager<Arc<Mutex<D>>>,
    /// The guest's driver, allocating from [`DRIVER_ALLOC_BASE`] to the end
    /// of the first memory region.
    pub drv: MockDriver,
}

impl<D: VirtioDevice + MutEventSubscriber + 'static> DeviceRig<D> {
    /// `dev` over `mem`, registered with a fresh event loop and put behind
    /// a transport; not initialised.
    pub fn new(mem: &GuestMemory, dev: D) -> Self {
        let dev = Arc::new(Mutex::new(dev));
        let mut em = EventManager::new().expect("an epoll instance");
        em.add_subscriber(dev.clone());
        let transport_dev: Arc<Mutex<dyn VirtioDevice>> = dev.clone();
        let t = MmioTransport::new(mem.clone(), transport_dev).expect("a transport");
        let end = mem
            .iter()
            .next()
            .map_or(0, |r| r.start_addr().raw_value() + r.len());
        let drv = MockDriver::with_alloc_range(
            mem.clone(),
            t,
            GuestAddress(DRIVER_ALLOC_BASE),
            end.saturating_sub(DRIVER_ALLOC_BASE),
        );
        DeviceRig { dev, em, drv }
    }

    /// The device, locked.
    pub fn dev(&self) -> MutexGuard<'_, D> {
        self.dev.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One event-loop iteration of at most `timeout_ms`; the events
    /// dispatched.
    pub fn run_once(&mut self, timeout_ms: i32) -> usize {
        self.em
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
