// SPDX-License-Identifier: Apache-2.0
//! Tests of the split virtqueue: layout validation, ring protocol, chains.
