// SPDX-License-Identifier: Apache-2.0
//! The oracles the two configuration targets ([`crate::cli`] and
//! [`crate::config_file`]) share: whichever input the user wrote, a refusal
//! is one line and an accepted configuration is within minivmm's bounds.

use std::collections::HashSet;
use std::fmt::Debug;

use vmm::config::{VmmConfig, MAX_MEM_MIB, MAX_VCPUS, MIN_MEM_MIB};
use vmm::error_line;

/// A configuration error reaches the user as one non-empty line.
/// `input` is what was parsed, for the failure message.
pub fn assert_one_line(e: &dyn std::error::Error, input: &dyn Debug) {
    let line = error_line(e);
    assert!(!line.is_empty(), "empty error for {input:?}");
    assert!(
        !line.contains(['\n', '\r']),
        "a configuration error spans lines for {input:?}: {line:?}"
    );
}

/// An accepted configuration has its memory and vCPU count within bounds,
/// and every card a unique id, a power-of-two queue size the device can
/// have, a unicast MAC and offloads the device accepts.
pub fn assert_within_bounds(cfg: &VmmConfig, input: &dyn Debug) {
    assert!(
        (MIN_MEM_MIB..=MAX_MEM_MIB).contains(&cfg.mem_mib),
        "{input:?}"
    );
    assert!((1..=MAX_VCPUS).contains(&cfg.vcpus), "{input:?}");
    let mut ids = HashSet::new();
    for net in &cfg.nets {
        assert!(ids.insert(net.id.clone()), "duplicate id from {input:?}");
        let q = net.device.queue_size;
        assert!(
            q.is_power_of_two() && q <= 32768,
            "queue size {q} accepted from {input:?}"
        );
        assert_eq!(
            net.device.mac[0] & 1,
            0,
            "multicast MAC accepted from {input:?}"
        );
        assert!(net.device.offloads.validate().is_ok(), "{input:?}");
    }
}
