// SPDX-License-Identifier: Apache-2.0
//! The control plane Firecracker's clients speak: HTTP/1.1 on a Unix socket.
//!
//! [`http`] is the wire format: a bounded, incremental request parser and
//! the answers (`204`, `200` with JSON, `400` with `fault_message`). The
//! socket server, the routes and the commands it sends the VMM build on it.
pub mod http;
