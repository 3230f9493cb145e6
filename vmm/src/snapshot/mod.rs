// SPDX-License-Identifier: Apache-2.0
//! Snapshots: a paused VM saved to a state file and a memory file, and
//! loaded into a fresh minivmm (Firecracker's `PUT /snapshot/create` and
//! `PUT /snapshot/load`).
//!
//! - [`format`]: the state file (a versioned header with a CRC-32, then the
//!   state as JSON) and its checks;
//! - [`memory`]: the memory file, written whole and mapped back privately;
//! - [`create`]: what `PUT /snapshot/create` does on the event loop with
//!   the vCPUs paused;
//! - [`load`]: the body of `PUT /snapshot/load` and the state it reads.
//!
//! The state ([`SnapshotState`]) is the configuration the VM was built
//! from (in the config-file layout, so the load rebuilds the same devices
//! through the builder's own steps), the VM's and every vCPU's KVM state
//! ([`crate::kvm::state`]), the UART with its output's rate limiter bucket
//! and the i8042, and every virtio device's transport and own state
//! ([`devices::virtio::persist`]: the network, block and entropy devices'
//! own state is their rate limiters' buckets), in MMIO window order.
//!
//! Not in it, as Firecracker keeps neither: the MMDS data store (the
//! restored VM serves the new process's store, which the client fills
//! before or after the load) and its V2 session tokens. MMDS's
//! configuration (version, address, cards, `imds_compat`) is part of the
//! configuration.

pub mod create;
pub mod format;
pub mod load;
pub mod memory;
pub mod restore;

use devices::legacy::i8042::I8042Snapshot;
use devices::legacy::serial::SerialSnapshot;
use devices::rate_limiter::persist::TokenBucketState;
use devices::virtio::persist::VirtioState;
use serde::{Deserialize, Serialize};

use crate::kvm::state::{VcpuState, VmState};

/// One virtio device in a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceSnapshot {
    /// Its kind, as `DeviceKind::name` spells it.
    pub kind: String,
    /// Its id.
    pub id: String,
    /// Its transport's and its own state.
    pub state: VirtioState,
}

/// Everything a state file holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotState {
    /// The configuration, as `GET /vm/config` shows it.
    pub config: serde_json::Value,
    /// Guest memory in MiB (the memory file's layout follows from it).
    pub mem_mib: u64,
    /// The irqchip, PIT and clock.
    pub vm: VmState,
    /// Every vCPU, by index.
    pub vcpus: Vec<VcpuState>,
    /// The console UART.
    pub serial: SerialSnapshot,
    /// The console output's bucket (`PUT /serial`'s `rate_limiter`).
    pub serial_rate_limiter: Option<TokenBucketState>,
    /// The keyboard controller.
    pub i8042: I8042Snapshot,
    /// The virtio devices, in MMIO window order.
    pub virtio: Vec<DeviceSnapshot>,
}
