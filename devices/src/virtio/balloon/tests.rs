// SPDX-License-Identifier: Apache-2.0
//! Tests of the balloon.
