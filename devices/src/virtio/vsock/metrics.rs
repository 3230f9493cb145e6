// SPDX-License-Identifier: Apache-2.0
//! Counters of the vsock device, serialized under its id in the VMM's
//! metrics lines (`{"vsock0": <object>}`).
//!
//! The serialized form (serde, field name = JSON key) is a contract, as the
//! other devices': every field below is a key; more may be added, none
//! renamed. `tx_*` is the guest-to-host direction and `rx_*` host-to-guest,
//! as the queues are named. Connections: `conns_opened_host` (a host
//! process's `CONNECT` the guest accepted), `conns_opened_guest` (a guest
//! REQUEST the host listener accepted), `conns_refused` (either refused:
//! nothing listening, the guest's RST, no RESPONSE in time, the cap),
//! `conns_capped` (refused because `max_connections` were open),
//! `conns_active` (a gauge), `conns_timed_out`, `conns_closed` (clean
//! ends). What the guest got wrong: `malformed_packets` (header checks,
//! chains), `unknown_ops` and `bad_types` (answered RST),
//! `protocol_errors`, `credit_exceeded` (both reset the connection).
//! Credit: `rx_credit_stalls` (host data waited for a guest without room),
//! `tx_credit_stalls` (the guest used all the credit it was given).
//! Short writes: `tx_short_writes` (the host socket refused part of a
//! packet), of which `tx_chains_held` kept their chain until the socket
//! took the rest, and `tx_bytes_copied` the bytes copied instead.
//! `max_descs_per_pass` is what a fuzzer checks the pass bound against.

use std::sync::atomic::AtomicU64;

use serde::Serialize;

use crate::virtio::metrics::{Counters, QueueCounters};

/// Lock-free counters of one vsock device.
#[derive(Debug, Default, Serialize)]
pub struct VsockMetrics {
    /// Host-initiated connections the guest accepted.
    pub conns_opened_host: AtomicU64,
    /// Guest-initiated connections the host listener accepted.
    pub conns_opened_guest: AtomicU64,
    /// Connections refused, either way.
    pub conns_refused: AtomicU64,
    /// Of those, refused because the connection cap was reached.
    pub conns_capped: AtomicU64,
    /// Connections open now (a gauge), host sockets awaiting their line
    /// included.
    pub conns_active: AtomicU64,
    /// Connections reset at their deadline (no `CONNECT` line, no
    /// RESPONSE, a SHUTDOWN the host did not drain).
    pub conns_timed_out: AtomicU64,
    /// Connections that ended cleanly (both sides shut down).
    pub conns_closed: AtomicU64,
    /// Payload bytes from the guest to the host.
    pub tx_bytes: AtomicU64,
    /// Packets from the guest, malformed ones included.
    pub tx_packets: AtomicU64,
    /// Payload bytes from the host to the guest.
    pub rx_bytes: AtomicU64,
    /// Packets to the guest.
    pub rx_packets: AtomicU64,
    /// RSTs sent to the guest.
    pub rsts_sent: AtomicU64,
    /// RSTs received from the guest.
    pub rsts_received: AtomicU64,
    /// RSTs dropped because too many waited for RX buffers.
    pub rsts_dropped: AtomicU64,
    /// Host data waited because the guest had no room (once per stall).
    pub rx_credit_stalls: AtomicU64,
    /// Packets from the guest that used up the credit it had been given.
    pub tx_credit_stalls: AtomicU64,
    /// Packets whose payload went past the guest's credit (connection reset).
    pub credit_exceeded: AtomicU64,
    /// Guest writes the host socket did not take whole (the rest waits).
    pub tx_short_writes: AtomicU64,
    /// Of those, packets whose rest waited in their TX chain, held.
    pub tx_chains_held: AtomicU64,
    /// Bytes of the others' rest, copied because the chains held were at
    /// their bound (or copied data waited before them).
    pub tx_bytes_copied: AtomicU64,
    /// Chains or headers refused (short, wrong CID, length beyond the chain).
    pub malformed_packets: AtomicU64,
    /// Packets with an op the specification does not define, answered RST.
    pub unknown_ops: AtomicU64,
    /// Packets of a socket type other than stream, answered RST.
    pub bad_types: AtomicU64,
    /// Packets a connection's state does not allow (connection reset).
    pub protocol_errors: AtomicU64,
    /// Host connections whose first line was not `CONNECT <port>\n`.
    pub bad_connect_lines: AtomicU64,
    /// Host socket failures (EPIPE, ECONNRESET, a failed accept).
    pub host_socket_errors: AtomicU64,
    /// TRANSPORT_RESET events delivered to the guest.
    pub transport_resets: AtomicU64,
    /// The counters of its passes (`passes`, `pass_yields`, `descs_walked`,
    /// `max_descs_per_pass`, `queue_errors`, `interrupts`,
    /// `interrupts_suppressed`).
    #[serde(flatten)]
    pub queue: QueueCounters,
    /// Host-side faults (eventfd, epoll, timer).
    pub host_errors: AtomicU64,
    /// Guest writes to the read-only configuration space, ignored.
    pub config_writes_ignored: AtomicU64,
    /// The 64-bit feature word the driver acknowledged at activation.
    pub features_negotiated: AtomicU64,
}

impl Counters for VsockMetrics {
    const DEVICE: &'static str = "virtio-vsock";
    fn host_error_counter(&self) -> &AtomicU64 {
        &self.host_errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::events;
    use crate::virtio::metrics::{assert_counter_keys, DeviceMetrics};

    /// The contract's keys: a renamed field fails here.
    const KEYS: [&str; 37] = [
        "conns_opened_host",
        "conns_opened_guest",
        "conns_refused",
        "conns_capped",
        "conns_active",
        "conns_timed_out",
        "conns_closed",
        "tx_bytes",
        "tx_packets",
        "rx_bytes",
        "rx_packets",
        "rsts_sent",
        "rsts_received",
        "rsts_dropped",
        "rx_credit_stalls",
        "tx_credit_stalls",
        "credit_exceeded",
        "tx_short_writes",
        "tx_chains_held",
        "tx_bytes_copied",
        "malformed_packets",
        "unknown_ops",
        "bad_types",
        "protocol_errors",
        "bad_connect_lines",
        "host_socket_errors",
        "transport_resets",
        "descs_walked",
        "max_descs_per_pass",
        "pass_yields",
        "passes",
        "queue_errors",
        "host_errors",
        "interrupts",
        "interrupts_suppressed",
        "config_writes_ignored",
        "features_negotiated",
    ];

    #[test]
    fn test_json_has_every_contract_field() {
        let m = VsockMetrics::default();
        events::add(&m.tx_bytes, 4096);
        let json = m.to_json();
        assert_counter_keys(&json, &KEYS);
        assert_eq!(json["tx_bytes"], 4096);
        assert_eq!(m.device_name(), "virtio-vsock");
    }
}
