// SPDX-License-Identifier: Apache-2.0
//! The control plane Firecracker's clients speak: HTTP/1.1 on a Unix socket.
//!
//! - [`http`]: the wire format, a bounded incremental request parser and
//!   the answers (`204`, `200` with JSON, `400` with `fault_message`);
//! - [`routes`]: Firecracker's paths and methods to typed requests, with
//!   the checks that need no VMM state (id in the path against the body,
//!   the `/actions` and `/vm` bodies, features minivmm does not have).
//!
//! - [`server`]: the socket on its own thread, epoll over bounded
//!   connections, each routed request sent to the VMM as one command.
pub mod http;
pub mod routes;
pub mod server;
