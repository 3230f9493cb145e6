// SPDX-License-Identifier: Apache-2.0
//! Legacy PC devices: the 8250 UART and the i8042 keyboard controller.
pub mod i8042;
pub mod serial;
