// SPDX-License-Identifier: Apache-2.0
//! Target `mmio_transport`: the virtio-MMIO transport with the real
//! virtio-net device behind it, driven by arbitrary register sequences.
//!
//! Inputs mix raw accesses (any offset, any width, config space included)
//! with driver-shaped steps (negotiate, program a queue, DRIVER_OK) so the
//! fuzzer reaches the activated states quickly. After every access the
//! oracles below are checked against what the transport shows through its
//! registers and accessors, and against the device's own view:
//!
//! - identity registers are constant; DeviceFeatures shows the offered
//!   features page by page; config space reads return the MAC and status;
//! - status bits are never cleared except by a write of 0, which resets
//!   everything (status, acked features, interrupts, queue readiness, device);
//! - DRIVER_OK implies FEATURES_OK implies DRIVER implies ACKNOWLEDGE;
//! - with FEATURES_OK, no feature is acked that was not offered and
//!   VIRTIO_F_VERSION_1 is acked; the acked set is frozen from then on;
//! - after DRIVER_OK (and after FAILED or DEVICE_NEEDS_RESET) no status bit
//!   but FAILED and DEVICE_NEEDS_RESET can appear and queue readiness is
//!   frozen; before FEATURES_OK no queue is ready;
//! - DRIVER_OK without DEVICE_NEEDS_RESET means the device was activated,
//!   and the transport and the device agree on that; a refused activation
//!   sets DEVICE_NEEDS_RESET and raises the configuration interrupt;
//! - InterruptStatus holds only the two defined bits.

use arbitrary::Arbitrary;
use devices::virtio::mmio::MmioTransport;
use devices::virtio::status::*;
use devices::virtio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};

use crate::common::{guest_memory, Addr, MemLayout, NetSetup, NetUnderTest};

// Register offsets (virtio 1.1 §4.2.2, "MMIO Device Register Layout"),
// written out here so the oracle does not trust the transport's own table.
const MAGIC_VALUE: u64 = 0x00;
const VERSION: u64 = 0x04;
const DEVICE_ID: u64 = 0x08;
const VENDOR_ID: u64 = 0x0c;
const DEVICE_FEATURES: u64 = 0x10;
const DEVICE_FEATURES_SEL: u64 = 0x14;
const DRIVER_FEATURES: u64 = 0x20;
const DRIVER_FEATURES_SEL: u64 = 0x24;
const QUEUE_SEL: u64 = 0x30;
const QUEUE_NUM_MAX: u64 = 0x34;
const QUEUE_NUM: u64 = 0x38;
const QUEUE_READY: u64 = 0x44;
const QUEUE_NOTIFY: u64 = 0x50;
const INTERRUPT_STATUS: u64 = 0x60;
const INTERRUPT_ACK: u64 = 0x64;
const STATUS: u64 = 0x70;
const QUEUE_DESC_LOW: u64 = 0x80;
const QUEUE_DESC_HIGH: u64 = 0x84;
const QUEUE_DRIVER_LOW: u64 = 0x90;
const QUEUE_DRIVER_HIGH: u64 = 0x94;
const QUEUE_DEVICE_LOW: u64 = 0xa0;
const QUEUE_DEVICE_HIGH: u64 = 0xa4;
const SHM_SEL: u64 = 0xac;
const SHM_LEN_LOW: u64 = 0xb0;
const SHM_BASE_HIGH: u64 = 0xbc;
const CONFIG_GENERATION: u64 = 0xfc;
const CONFIG: u64 = 0x100;

/// "virt" (virtio 1.1 §4.2.2).
const MAGIC: u32 = 0x7472_6976;
/// VIRTIO_F_VERSION_1.
const VERSION_1: u64 = 1 << 32;
/// Device ID of a network card (virtio 1.1 §5).
const NET_DEVICE_ID: u32 = 1;
/// VIRTIO_NET_S_LINK_UP, the status field of the net config space.
const LINK_UP: u16 = 1;

/// The registers of the window, for structured accesses.
#[derive(Debug, Clone, Copy, Arbitrary)]
#[allow(missing_docs)]
pub enum Reg {
    MagicValue,
    Version,
    DeviceId,
    VendorId,
    DeviceFeatures,
    DeviceFeaturesSel,
    DriverFeatures,
    DriverFeaturesSel,
    QueueSel,
    QueueNumMax,
    QueueNum,
    QueueReady,
    QueueNotify,
    InterruptStatus,
    InterruptAck,
    Status,
    QueueDescLow,
    QueueDescHigh,
    QueueDriverLow,
    QueueDriverHigh,
    QueueDeviceLow,
    QueueDeviceHigh,
    ShmSel,
    ShmLenLow,
    ShmBaseHigh,
    ConfigGeneration,
}

impl Reg {
    fn offset(self) -> u64 {
        match self {
            Reg::MagicValue => MAGIC_VALUE,
            Reg::Version => VERSION,
            Reg::DeviceId => DEVICE_ID,
            Reg::VendorId => VENDOR_ID,
            Reg::DeviceFeatures => DEVICE_FEATURES,
            Reg::DeviceFeaturesSel => DEVICE_FEATURES_SEL,
            Reg::DriverFeatures => DRIVER_FEATURES,
            Reg::DriverFeaturesSel => DRIVER_FEATURES_SEL,
            Reg::QueueSel => QUEUE_SEL,
            Reg::QueueNumMax => QUEUE_NUM_MAX,
            Reg::QueueNum => QUEUE_NUM,
            Reg::QueueReady => QUEUE_READY,
            Reg::QueueNotify => QUEUE_NOTIFY,
            Reg::InterruptStatus => INTERRUPT_STATUS,
            Reg::InterruptAck => INTERRUPT_ACK,
            Reg::Status => STATUS,
            Reg::QueueDescLow => QUEUE_DESC_LOW,
            Reg::QueueDescHigh => QUEUE_DESC_HIGH,
            Reg::QueueDriverLow => QUEUE_DRIVER_LOW,
            Reg::QueueDriverHigh => QUEUE_DRIVER_HIGH,
            Reg::QueueDeviceLow => QUEUE_DEVICE_LOW,
            Reg::QueueDeviceHigh => QUEUE_DEVICE_HIGH,
            Reg::ShmSel => SHM_SEL,
            Reg::ShmLenLow => SHM_LEN_LOW,
            Reg::ShmBaseHigh => SHM_BASE_HIGH,
            Reg::ConfigGeneration => CONFIG_GENERATION,
        }
    }
}

/// One guest action on the register window.
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// A 4-byte aligned write to a register.
    Write(Reg, u32),
    /// A 4-byte aligned read of a register.
    Read(Reg),
    /// Any write: offset in the page (config space included), 0 to 8 bytes.
    RawWrite(u16, Vec<u8>),
    /// Any read: offset and width (folded to 0..=8).
    RawRead(u16, u8),
    /// ACKNOWLEDGE, DRIVER, ack features (both pages), FEATURES_OK, as a
    /// driver does. The acked set is `offered & mask` unless `raw`, then
    /// `mask` itself (almost always with unoffered bits, refused).
    Negotiate {
        /// Which features to ack.
        mask: u64,
        /// Ack `mask` as is.
        raw: bool,
    },
    /// Programs queue `index` and makes it ready, as a driver does.
    SetupQueue(u8, QueueSetup),
    /// A whole driver initialisation, as Linux does it: reset, negotiate
    /// `offered & mask`, program both queues, DRIVER_OK.
    Driver(u64, [QueueSetup; 2]),
    /// Sets DRIVER_OK on top of the current status.
    DriverOk,
    /// Writes 0 to Status.
    Reset,
}

/// One queue as the driver programs it.
#[derive(Debug, Clone, Arbitrary)]
pub struct QueueSetup {
    /// QueueNum: below 0xe0, 2^(n mod (log2 QueueNumMax + 1)) (valid);
    /// else 2^(n mod 16) (often too large).
    pub size_log2: u8,
    /// Descriptor table.
    pub desc: Addr,
    /// Driver (avail) ring.
    pub avail: Addr,
    /// Device (used) ring.
    pub used: Addr,
}

/// One input: the device's configuration, memory, and the accesses.
#[derive(Debug, Arbitrary)]
pub struct Input {
    /// Device knobs.
    pub setup: NetSetup,
    /// Guest memory shape.
    pub mem: MemLayout,
    /// The accesses, in order.
    pub ops: Vec<Op>,
}

/// Runs one input (the libFuzzer entry point).
pub fn run(data: &[u8]) {
    crate::with_input(data, |i: &Input| {
        run_input(i);
    });
}

/// What a run reached, for tests that check the target gets deep.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Accesses made (each checked).
    pub accesses: usize,
    /// Times DRIVER_OK activated the device.
    pub activations: usize,
    /// Times DRIVER_OK was refused with DEVICE_NEEDS_RESET.
    pub refused: usize,
}

/// What the oracle remembers between accesses: values the guest wrote to
/// write-only selectors, and the observable state after the last access.
struct Model {
    offered: u64,
    config_space: [u8; 12],
    max_size: u32,
    device_features_sel: u32,
    queue_sel: u32,
    status: u32,
    acked: u64,
    ready: [bool; 2],
    outcome: Outcome,
}

/// Drives the transport with `input`, checking every oracle after each access.
pub fn run_input(input: &Input) -> Outcome {
    let mut dut = NetUnderTest::new(guest_memory(input.mem), input.setup.config());
    // virtio 1.1 §5.1.4: mac, status, max_virtqueue_pairs (1), mtu (only
    // meaningful with VIRTIO_NET_F_MTU; 0 when no MTU is configured).
    let mut config_space = [0u8; 12];
    config_space[..6].copy_from_slice(&dut.config.mac);
    config_space[6..8].copy_from_slice(&LINK_UP.to_le_bytes());
    config_space[8..10].copy_from_slice(&1u16.to_le_bytes());
    config_space[10..].copy_from_slice(&dut.config.mtu.unwrap_or(0).to_le_bytes());
    let mut model = Model {
        offered: dut.offered_features(),
        config_space,
        max_size: u32::from(dut.config.queue_size),
        device_features_sel: 0,
        queue_sel: 0,
        status: 0,
        acked: 0,
        ready: [false; 2],
        outcome: Outcome::default(),
    };
    assert!(
        model.offered & VERSION_1 != 0,
        "a v2 transport must offer VERSION_1"
    );
    model.check(&mut dut, false);
    for op in &input.ops {
        model.apply(&mut dut, op);
    }
    model.outcome
}

impl Model {
    /// One guest write, as the bus delivers it, then every oracle. The
    /// model notes the write-only selectors it can see change.
    fn write(&mut self, dut: &mut NetUnderTest, offset: u64, data: &[u8]) {
        dut.transport.write(offset, data);
        let mut reset = false;
        if let Ok(b) = <[u8; 4]>::try_from(data) {
            let v = u32::from_le_bytes(b);
            match offset {
                QUEUE_SEL => self.queue_sel = v,
                DEVICE_FEATURES_SEL => self.device_features_sel = v,
                STATUS => reset = v == 0,
                _ => {}
            }
        }
        self.check(dut, reset);
    }

    fn write32(&mut self, dut: &mut NetUnderTest, offset: u64, value: u32) {
        self.write(dut, offset, &value.to_le_bytes());
    }

    /// One guest read, checked against the model, then every oracle.
    fn read(&mut self, dut: &mut NetUnderTest, offset: u64, len: usize) {
        let mut data = vec![0u8; len];
        dut.transport.read(offset, &mut data);
        self.check_read(&mut dut.transport, offset, &data);
        self.check(dut, false);
    }

    fn read32(t: &mut MmioTransport, offset: u64) -> u32 {
        let mut b = [0u8; 4];
        t.read(offset, &mut b);
        u32::from_le_bytes(b)
    }

    fn apply(&mut self, dut: &mut NetUnderTest, op: &Op) {
        match op {
            Op::Write(reg, value) => self.write32(dut, reg.offset(), *value),
            Op::Read(reg) => self.read(dut, reg.offset(), 4),
            Op::RawWrite(offset, data) => {
                let data = &data[..data.len().min(8)];
                self.write(dut, u64::from(*offset) & 0xfff, data);
            }
            Op::RawRead(offset, len) => {
                self.read(dut, u64::from(*offset) & 0xfff, usize::from(*len % 9));
            }
            Op::Negotiate { mask, raw } => {
                let features = if *raw { *mask } else { self.offered & mask };
                for step in [ACKNOWLEDGE, ACKNOWLEDGE | DRIVER] {
                    self.write32(dut, STATUS, step);
                }
                for (sel, half) in [(0, features as u32), (1, (features >> 32) as u32)] {
                    self.write32(dut, DRIVER_FEATURES_SEL, sel);
                    self.write32(dut, DRIVER_FEATURES, half);
                }
                self.write32(dut, STATUS, ACKNOWLEDGE | DRIVER | FEATURES_OK);
            }
            Op::SetupQueue(index, q) => self.setup_queue(dut, *index, q),
            Op::Driver(mask, queues) => {
                self.write32(dut, STATUS, 0);
                self.apply(
                    dut,
                    &Op::Negotiate {
                        mask: *mask,
                        raw: false,
                    },
                );
                for (index, q) in queues.iter().enumerate() {
                    self.setup_queue(dut, index as u8, q);
                }
                self.apply(dut, &Op::DriverOk);
            }
            Op::DriverOk => {
                let s = dut.transport.status();
                self.write32(dut, STATUS, s | DRIVER_OK);
            }
            Op::Reset => self.write32(dut, STATUS, 0),
        }
    }

    fn setup_queue(&mut self, dut: &mut NetUnderTest, index: u8, q: &QueueSetup) {
        let max_log2 = self.max_size.trailing_zeros() as u8;
        let size_log2 = if q.size_log2 < 0xe0 {
            q.size_log2 % (max_log2 + 1)
        } else {
            q.size_log2 % 16
        };
        self.write32(dut, QUEUE_SEL, u32::from(index));
        self.write32(dut, QUEUE_NUM, 1 << size_log2);
        for (low, addr) in [
            (QUEUE_DESC_LOW, q.desc),
            (QUEUE_DRIVER_LOW, q.avail),
            (QUEUE_DEVICE_LOW, q.used),
        ] {
            self.write32(dut, low, addr.get() as u32);
            self.write32(dut, low + 4, (addr.get() >> 32) as u32);
        }
        self.write32(dut, QUEUE_READY, 1);
    }

    /// Checks a read against what the model knows the register must hold.
    fn check_read(&self, t: &mut MmioTransport, offset: u64, data: &[u8]) {
        if offset >= CONFIG {
            // Config space accepts any width: the MAC, the link status, and
            // zeros past the end (the net config is read-only for the driver,
            // so no write may have changed it).
            for (i, &b) in data.iter().enumerate() {
                let at = (offset - CONFIG) as usize + i;
                let want = self.config_space.get(at).copied().unwrap_or(0);
                assert_eq!(b, want, "config space byte {at:#x}");
            }
            return;
        }
        let Ok(bytes) = <[u8; 4]>::try_from(data) else {
            assert!(
                data.iter().all(|&b| b == 0),
                "a {}-byte register read must return zeros, got {data:?}",
                data.len()
            );
            return;
        };
        let v = u32::from_le_bytes(bytes);
        if offset & 3 != 0 {
            assert_eq!(v, 0, "misaligned read at {offset:#x}");
            return;
        }
        let queue_exists = self.queue_sel < 2;
        let want = match offset {
            MAGIC_VALUE => Some(MAGIC),
            VERSION => Some(2),
            DEVICE_ID => Some(NET_DEVICE_ID),
            DEVICE_FEATURES => Some(match self.device_features_sel {
                0 => self.offered as u32,
                1 => (self.offered >> 32) as u32,
                _ => 0,
            }),
            QUEUE_NUM_MAX => Some(if queue_exists { self.max_size } else { 0 }),
            STATUS => Some(t.status()),
            CONFIG_GENERATION => Some(0),
            INTERRUPT_STATUS => {
                assert_eq!(
                    v & !(VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG),
                    0,
                    "undefined InterruptStatus bits"
                );
                None
            }
            QUEUE_READY => {
                if !queue_exists {
                    Some(0)
                } else {
                    assert!(v <= 1, "QueueReady reads {v}");
                    None
                }
            }
            _ => None,
        };
        if let Some(want) = want {
            assert_eq!(v, want, "register {offset:#x}");
        }
    }

    /// Reads QueueReady of both queues, restoring the guest's QueueSel.
    fn probe_ready(&self, t: &mut MmioTransport) -> [bool; 2] {
        let mut ready = [false; 2];
        for (i, r) in ready.iter_mut().enumerate() {
            t.write(QUEUE_SEL, &(i as u32).to_le_bytes());
            *r = Self::read32(t, QUEUE_READY) == 1;
        }
        t.write(QUEUE_SEL, &self.queue_sel.to_le_bytes());
        ready
    }

    /// The invariants after an access; `reset` says the access wrote 0 to
    /// Status.
    fn check(&mut self, dut: &mut NetUnderTest, reset: bool) {
        if reset {
            // The reset cleared the selectors; the probes below restore them.
            self.device_features_sel = 0;
            self.queue_sel = 0;
        }
        let t = &mut dut.transport;
        let s = t.status();
        let acked = t.acked_features();
        let isr = Self::read32(t, INTERRUPT_STATUS);
        let ready = self.probe_ready(t);
        let activated = t.is_activated();
        let device_activated = dut.device_activated();
        let prev = self.status;

        assert_eq!(isr & !(VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG), 0);
        assert_eq!(
            activated, device_activated,
            "transport and device disagree on activation (status {s:#x})"
        );
        if reset {
            assert_eq!(s, 0, "status after reset");
            assert_eq!(acked, 0, "acked features after reset");
            assert_eq!(isr, 0, "InterruptStatus after reset");
            assert_eq!(ready, [false; 2], "queue readiness after reset");
            assert!(!activated, "activated after reset");
        } else {
            assert_eq!(
                prev & !s,
                0,
                "status bits cleared without a reset: {prev:#x} -> {s:#x}"
            );
            if prev & FEATURES_OK != 0 || prev & DRIVER == 0 {
                assert_eq!(
                    acked, self.acked,
                    "acked features changed outside the DRIVER state ({prev:#x})"
                );
            }
            let mut allowed_new = !0;
            if prev & (FAILED | DEVICE_NEEDS_RESET) != 0 {
                allowed_new = FAILED;
            } else if prev & DRIVER_OK != 0 {
                allowed_new = FAILED | DEVICE_NEEDS_RESET;
            }
            assert_eq!(
                s & !prev & !allowed_new,
                0,
                "status {prev:#x} -> {s:#x} gained bits it may not"
            );
            if prev & (DRIVER_OK | FAILED | DEVICE_NEEDS_RESET) != 0 {
                assert_eq!(ready, self.ready, "queue readiness changed when frozen");
            }
        }
        // The chain of status bits (virtio 1.1 §3.1.1).
        if s & DRIVER_OK != 0 {
            assert_ne!(s & FEATURES_OK, 0, "DRIVER_OK without FEATURES_OK: {s:#x}");
        }
        if s & FEATURES_OK != 0 {
            assert_ne!(s & DRIVER, 0, "FEATURES_OK without DRIVER: {s:#x}");
            assert_eq!(
                acked & !self.offered,
                0,
                "acked features that were not offered"
            );
            assert_ne!(acked & VERSION_1, 0, "FEATURES_OK without VERSION_1");
        } else {
            assert_eq!(ready, [false; 2], "a queue is ready before FEATURES_OK");
        }
        if s & DRIVER != 0 {
            assert_ne!(s & ACKNOWLEDGE, 0, "DRIVER without ACKNOWLEDGE: {s:#x}");
        }
        // Activation: DRIVER_OK means an activated device unless the device
        // refused, which must show as DEVICE_NEEDS_RESET and an interrupt.
        if activated {
            assert_ne!(s & DRIVER_OK, 0, "activated without DRIVER_OK");
        }
        if s & DRIVER_OK != 0 && !activated {
            assert_ne!(
                s & DEVICE_NEEDS_RESET,
                0,
                "DRIVER_OK, not activated, and no DEVICE_NEEDS_RESET"
            );
        }
        if s & DRIVER_OK != 0 && prev & DRIVER_OK == 0 {
            if activated {
                self.outcome.activations += 1;
            } else {
                assert_ne!(
                    isr & VIRTIO_MMIO_INT_CONFIG,
                    0,
                    "a refused activation raised no configuration interrupt"
                );
                self.outcome.refused += 1;
            }
        }
        self.outcome.accesses += 1;
        self.status = s;
        self.acked = acked;
        self.ready = ready;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arbitrary::Unstructured;

    /// VIRTIO_NET_F_MAC.
    const MAC: u64 = 1 << 5;

    fn queue(index: u8, base: u64) -> Op {
        Op::SetupQueue(
            index,
            QueueSetup {
                size_log2: 8,
                desc: Addr::raw(base),
                avail: Addr::raw(base + 0x1000),
                used: Addr::raw(base + 0x2000),
            },
        )
    }

    fn input(ops: Vec<Op>) -> Input {
        Input {
            setup: NetSetup {
                queue_size_log2: 8,
                offloads: 0xf,
                mrg_rxbuf: true,
            },
            mem: MemLayout::Large,
            ops,
        }
    }

    #[test]
    fn a_driver_shaped_input_activates_the_device_under_every_oracle() {
        let out = run_input(&input(vec![
            Op::Negotiate {
                mask: VERSION_1 | MAC,
                raw: false,
            },
            queue(0, 0x1_0000),
            queue(1, 0x2_0000),
            Op::DriverOk,
            // Frozen now: none of these may change anything.
            Op::Write(Reg::QueueNum, 2),
            Op::Write(Reg::DriverFeatures, u32::MAX),
            Op::Write(Reg::Status, 0x0f & !ACKNOWLEDGE),
            Op::Read(Reg::Status),
            Op::RawRead(0x100, 6),
            Op::Reset,
            // Again after a reset, with a queue the driver forgot.
            Op::Negotiate {
                mask: VERSION_1,
                raw: false,
            },
            queue(0, 0x1_0000),
            Op::DriverOk,
        ]));
        assert_eq!(out.activations, 1, "{out:?}");
        assert_eq!(out.refused, 1, "{out:?}");
    }

    #[test]
    fn features_that_were_not_offered_never_stick() {
        // Bit 40 is offered by no device here; FEATURES_OK must not stick,
        // so DRIVER_OK cannot either.
        let out = run_input(&input(vec![
            Op::Negotiate {
                mask: VERSION_1 | (1 << 40),
                raw: true,
            },
            queue(0, 0x1_0000),
            queue(1, 0x2_0000),
            Op::DriverOk,
        ]));
        assert_eq!((out.activations, out.refused), (0, 0), "{out:?}");
    }

    #[test]
    fn rings_outside_memory_are_refused_at_driver_ok() {
        let out = run_input(&input(vec![
            Op::Negotiate {
                mask: VERSION_1,
                raw: false,
            },
            queue(0, 0x1_0000),
            queue(1, 0xffff_f000),
            Op::DriverOk,
        ]));
        assert_eq!((out.activations, out.refused), (0, 1), "{out:?}");
    }

    /// The input structure must let plain random bytes reach the activated
    /// states: before `Addr` favoured pages and `Op::Driver` existed, 537k
    /// executions of a campaign never activated the device.
    #[test]
    fn random_inputs_reach_activation_and_refusal() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut total = Outcome::default();
        for _ in 0..5000 {
            let data: Vec<u8> = (0..512)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(&data)) {
                let o = run_input(&input);
                total.accesses += o.accesses;
                total.activations += o.activations;
                total.refused += o.refused;
            }
        }
        assert!(total.activations > 0, "{total:?}");
        assert!(total.refused > 0, "{total:?}");
    }
}
