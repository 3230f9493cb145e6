// SPDX-License-Identifier: Apache-2.0
//! [`DummyDevice`]: a device that does nothing but record what the
//! transport did to it, for the transport's own tests.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use serde::Serialize;

use crate::virtio::metrics::Counters;
use crate::virtio::queue::SplitQueue;
use crate::virtio::{ActivateError, DeviceMetrics, Interrupt, VirtioCommon, VirtioDevice};

/// The dummy's counters: none of its own, the host errors every device has.
#[derive(Debug, Default, Serialize)]
pub struct DummyMetrics {
    /// Host-side faults (none: the dummy has no host side).
    pub host_errors: AtomicU64,
}

impl Counters for DummyMetrics {
    const DEVICE: &'static str = "virtio-dummy";
    fn host_error_counter(&self) -> &AtomicU64 {
        &self.host_errors
    }
}

/// A device that does nothing but record what the transport did to it.
pub struct DummyDevice {
    /// Reported device ID, offered features, QueueNumMax and notification
    /// eventfd of each queue; `acked_features` holds the features passed
    /// to the last `activate`, as they were passed.
    pub common: VirtioCommon,
    /// Configuration space contents.
    pub config: Vec<u8>,
    /// Make `activate` fail.
    pub fail_activate: bool,
    /// Calls to `activate`.
    pub activate_calls: usize,
    /// Calls to `reset`.
    pub reset_calls: usize,
    /// Queues passed to the last `activate`.
    pub queues: Vec<SplitQueue>,
    /// Interrupt passed to the last `activate`.
    pub interrupt: Option<Arc<dyn Interrupt>>,
    /// Its counters.
    pub metrics: Arc<DummyMetrics>,
}

impl std::fmt::Debug for DummyDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DummyDevice")
            .field("device_type", &self.common.device_type)
            .field("activate_calls", &self.activate_calls)
            .field("reset_calls", &self.reset_calls)
            .field("acked_features", &self.common.acked_features)
            .finish_non_exhaustive()
    }
}

impl DummyDevice {
    /// Device ID 0x1234, features VERSION_1 | EVENT_IDX | bit 0, queues of
    /// 256 and 64 entries, 16 bytes of config space holding 0, 1, 2, ….
    pub fn new() -> std::io::Result<Self> {
        Ok(DummyDevice {
            common: VirtioCommon::new(0x1234, (1 << 32) | (1 << 29) | 1, vec![256, 64])?,
            config: (0..16).collect(),
            fail_activate: false,
            activate_calls: 0,
            reset_calls: 0,
            queues: Vec::new(),
            interrupt: None,
            metrics: Arc::default(),
        })
    }
}

impl VirtioDevice for DummyDevice {
    fn common(&self) -> &VirtioCommon {
        &self.common
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
        self.common.acked_features = acked_features;
        self.queues = queues;
        self.interrupt = Some(interrupt);
        Ok(())
    }

    fn reset(&mut self) {
        self.reset_calls += 1;
        self.queues.clear();
        self.interrupt = None;
    }

    fn device_metrics(&self) -> Arc<dyn DeviceMetrics> {
        self.metrics.clone()
    }
}
