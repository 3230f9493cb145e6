// SPDX-License-Identifier: Apache-2.0
//! Opening `/dev/kvm` and checking that it can run our VM.
//!
//! Every capability the VMM relies on is checked up front, so that a host
//! missing one gets a single clear line instead of a failure deep in boot.

use kvm_ioctls::{Cap, Kvm};

/// The only KVM API version there has ever been.
const KVM_API_VERSION: i32 = 12;

/// Capabilities minivmm cannot work without, with a word on why.
const REQUIRED_CAPS: &[(Cap, &str)] = &[
    (Cap::Irqchip, "in-kernel IOAPIC/LAPIC"),
    (Cap::Pit2, "in-kernel PIT"),
    (
        Cap::Ioeventfd,
        "queue notifications without an exit to userspace",
    ),
    (Cap::Irqfd, "device interrupts from the event loop"),
    (Cap::UserMemory, "guest memory"),
    (Cap::SetTssAddr, "the TSS area needed on Intel hosts"),
    (Cap::ExtCpuid, "CPUID setup"),
];

/// Errors opening or checking KVM.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// `/dev/kvm` is missing or cannot be opened.
    #[error("cannot open /dev/kvm (is KVM enabled and do you have permission?)")]
    Open(#[source] kvm_ioctls::Error),
    /// The API version is not 12.
    #[error("unsupported KVM API version {0}, expected {KVM_API_VERSION}")]
    ApiVersion(i32),
    /// A capability is missing.
    #[error("KVM lacks capability {0:?}, needed for {1}")]
    MissingCap(Cap, &'static str),
}

/// Opens `/dev/kvm` and checks the API version and every capability we use.
pub fn open_and_check() -> Result<Kvm, KvmError> {
    let kvm = Kvm::new().map_err(KvmError::Open)?;
    let version = kvm.get_api_version();
    if version != KVM_API_VERSION {
        return Err(KvmError::ApiVersion(version));
    }
    for (cap, why) in REQUIRED_CAPS {
        if !kvm.check_extension(*cap) {
            return Err(KvmError::MissingCap(*cap, why));
        }
    }
    Ok(kvm)
}
