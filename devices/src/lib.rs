// SPDX-License-Identifier: Apache-2.0
//! Devices of minivmm.
//!
//! Device logic lives here with no knowledge of KVM: a device exposes register
//! accessors (`read`/`write` at an offset), the `EventFd`s it wants the VMM to
//! wire as ioeventfds and irqfds, and an event-manager subscriber for its
//! backend work. Address choice, GSI allocation and KVM registration belong to
//! the `vmm` crate, so the same device code runs under the VMM and under the
//! driver-side test and benchmark harnesses.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod legacy;
pub mod mmds;
pub mod rate_limiter;
pub mod virtio;
mod warn;
