// SPDX-License-Identifier: Apache-2.0
//! [`DummyDevice`]: a device that does nothing but record what the
//! transport did to it, for the transport's own tests.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use crate::virtio::queue::SplitQueue;
use crate::virtio::{ActivateError, Interrupt, VirtioDevice};

/// A device that does nothing but record what the transport did to it.
pub struct DummyDevice {
    /// Reported device ID.
    pub device_type: u32,
    /// Offered features.
    pub avail_features: u64,
    /// QueueNumMax of each queue.
    pub max_sizes: Vec<u16>,
    /// One notification eventfd per queue.
    pub queue_evts: Vec<EventFd>,
    /// Configuration space contents.
    pub config: Vec<u8>,
    /// Make `activate` fail.
    pub fail_activate: bool,
    /// Calls to `activate`.
    pub activate_calls: usize,
    /// Calls to `reset`.
    pub reset_calls: usize,
    /// Features passed to the last `activate`.
    pub acked_features: u64,
    /// Queues passed to the last `activate`.
    pub queues: Vec<SplitQueue>,
    /// Interrupt passed to the last `activate`.
    pub interrupt: Option<Arc<dyn Interrupt>>,
}

impl std::fmt::Debug for DummyDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DummyDevice")
            .field("device_type", &self.device_type)
            .field("activate_calls", &self.activate_calls)
            .field("reset_calls", &self.reset_calls)
            .field("acked_features", &self.acked_features)
            .finish_non_exhaustive()
    }
}

impl DummyDevice {
    /// Device ID 0x1234, features VERSION_1 | EVENT_IDX | bit 0, queues of
    /// 256 and 64 entries, 16 bytes of config space holding 0, 1, 2, ….
    pub fn new() -> std::io::Result<Self> {
        let max_sizes = vec![256, 64];
        let queue_evts = max_sizes
            .iter()
            .map(|_| EventFd::new(libc::EFD_NONBLOCK))
            .collect::<std::io::Result<_>>()?;
        Ok(DummyDevice {
            device_type: 0x1234,
            avail_features: (1 << 32) | (1 << 29) | 1,
            max_sizes,
            queue_evts,
            config: (0..16).collect(),
            fail_activate: false,
            activate_calls: 0,
            reset_calls: 0,
            acked_features: 0,
            queues: Vec::new(),
            interrupt: None,
        })
    }
}

impl VirtioDevice for DummyDevice {
    fn device_type(&self) -> u32 {
        self.device_type
    }

    fn avail_features(&self) -> u64 {
        self.avail_features
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &self.max_sizes
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let Some(src) = usize::try_from(offset)
            .ok()
            .and_then(|o| self.config.get(o..o.checked_add(data.len())?))
        else {
            return;
        };
        data.copy_from_slice(src);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        if let Some(dst) = usize::try_from(offset)
            .ok()
            .and_then(|o| self.config.get_mut(o..o.checked_add(data.len())?))
        {
            dst.copy_from_slice(data);
        }
    }

    fn queue_events(&self) -> &[EventFd] {
        &self.queue_evts
    }

    fn activate(
        &mut self,
        acked_features: u64,
        queues: Vec<SplitQueue>,
        interrupt: Arc<dyn Interrupt>,
    ) -> Result<(), ActivateError> {
        self.activate_calls += 1;
        if self.fail_activate {
            return Err(ActivateError::Backend("dummy told to fail".into()));
        }
        self.acked_features = acked_features;
        self.queues = queues;
        self.interrupt = Some(interrupt);
        Ok(())
    }

    fn reset(&mut self) {
        self.reset_calls += 1;
        self.queues.clear();
        self.interrupt = None;
    }
}
