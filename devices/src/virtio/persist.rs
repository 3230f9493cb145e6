// SPDX-License-Identifier: Apache-2.0
//! What a virtio device and its transport save in a snapshot, and the
//! checks a restore makes of it.
//!
//! Every device has two parts in a snapshot. The transport's part
//! ([`TransportState`]) is the same for every device: the status, the
//! negotiated features, the selectors, each queue's size, readiness and ring
//! addresses, and the InterruptStatus register. The transport takes it back
//! with [`MmioTransport::restore`](super::mmio::MmioTransport::restore),
//! which validates the queues exactly as at DRIVER_OK and re-activates the
//! device over them, each ring picked up where `used.idx` says
//! ([`SplitQueue::resume_from_ring`](super::queue::SplitQueue::resume_from_ring)).
//!
//! The device's own part is whatever it keeps beyond the transport (rate
//! limiter buckets, a balloon's target, an MMDS store): a device adds it by
//! overriding [`VirtioDevice::save_state`](super::VirtioDevice::save_state)
//! and [`VirtioDevice::restore_state`](super::VirtioDevice::restore_state)
//! in its one `impl VirtioDevice`, with a `Serialize + Deserialize` struct
//! of its own turned into a JSON value by [`to_value`] and back by
//! [`from_value`]. A device that keeps nothing overrides neither. The state
//! file is input from outside: `restore_state` gets a value that may be
//! anything and must refuse what it cannot use, never panic.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Why a saved device state cannot be restored; each is one line.
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The saved state is for another kind of device.
    #[error("the saved state is of device type {saved}, this device is type {actual}")]
    DeviceType {
        /// Saved.
        saved: u32,
        /// This device's.
        actual: u32,
    },
    /// The saved queues do not match the device's.
    #[error("the saved state has {saved} queue(s) of maximum sizes {saved_sizes:?}, this device {actual_sizes:?}")]
    Queues {
        /// How many were saved.
        saved: usize,
        /// Their maximum sizes.
        saved_sizes: Vec<u16>,
        /// This device's.
        actual_sizes: Vec<u16>,
    },
    /// A register value no driver could have set.
    #[error("invalid saved transport state: {0}")]
    Transport(String),
    /// The rings failed the checks of DRIVER_OK, or the device refused
    /// activation.
    #[error("the saved queues cannot be activated: {0}")]
    Activate(String),
    /// The device's own part is malformed.
    #[error("invalid saved device state: {0}")]
    Device(String),
}

/// One queue as the driver programmed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// QueueNumMax: the device's, checked against the restored device.
    pub max_size: u16,
    /// QueueNum as written.
    pub size: u32,
    /// QueueReady.
    pub ready: bool,
    /// QueueDesc.
    pub desc_table: u64,
    /// QueueDriver (the avail ring).
    pub avail_ring: u64,
    /// QueueDevice (the used ring).
    pub used_ring: u64,
}

/// The register window of one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransportState {
    /// DeviceID, checked against the restored device.
    pub device_id: u32,
    /// Status.
    pub status: u32,
    /// Whether the device was activated (DRIVER_OK taken).
    pub activated: bool,
    /// DeviceFeaturesSel.
    pub device_features_sel: u32,
    /// DriverFeaturesSel.
    pub driver_features_sel: u32,
    /// The features the driver acknowledged.
    pub acked_features: u64,
    /// QueueSel.
    pub queue_sel: u32,
    /// Every queue.
    pub queues: Vec<QueueState>,
    /// InterruptStatus.
    pub interrupt_status: u32,
}

/// A device and its transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VirtioState {
    /// The transport's part.
    pub transport: TransportState,
    /// The device's own part (`null` for a device that keeps nothing).
    pub device: serde_json::Value,
}

/// A device's own state as the snapshot stores it.
pub fn to_value<T: Serialize>(state: &T) -> serde_json::Value {
    // A derived Serialize of plain fields cannot fail (no map with
    // non-string keys is used for device state).
    serde_json::to_value(state).unwrap_or(serde_json::Value::Null)
}

/// A device's own state back from the snapshot; malformed is an error.
pub fn from_value<T: DeserializeOwned>(value: &serde_json::Value) -> Result<T, PersistError> {
    T::deserialize(value).map_err(|e| PersistError::Device(e.to_string()))
}
