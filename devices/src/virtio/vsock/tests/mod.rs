// SPDX-License-Identifier: Apache-2.0
//! The vsock device's test suites, each driving a whole
//! [`Vsock`](super::Vsock) from the driver side over real Unix sockets.
