// SPDX-License-Identifier: Apache-2.0
//! The device behind the real MMIO transport, reached only through register
//! accesses by the mock driver, as the VMM attaches it (like `Net`).

use std::sync::atomic::Ordering;

use super::fixture::*;
use crate::virtio::block::device::config_offsets;

#[test]
fn test_through_mmio_transport() {
    let dir = TempDir::new();
    let data = random_bytes(&mut Rng(31), 32 * 512);
    let path = dir.file("d.img", &data);
    let mut f = MmioFixture::new("mmio0", &path);
    let metrics = f.blk.lock().unwrap().metrics();
    // The device ID register, then the config space through the window.
    assert_eq!(f.drv.read_reg(0x008), 2);
    assert_eq!(f.capacity(), 32);
    assert_eq!(f.drv.read_reg(0x100 + config_offsets::BLK_SIZE as u64), 512);
    let acked = f.init();
    assert_eq!(metrics.features_negotiated.load(Ordering::Relaxed), acked);
    let (buf, st) = f.submit_read(2, 1024);
    let used = f.wait_used();
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].len, 1025);
    assert_eq!(f.drv.read_mem(st, 1).unwrap(), [VIRTIO_BLK_S_OK]);
    assert_eq!(f.drv.read_mem(buf, 1024).unwrap(), data[1024..2048]);
    assert_ne!(
        f.drv.interrupt_status() & crate::virtio::VIRTIO_MMIO_INT_VRING,
        0
    );
    // A reset through the status register deactivates the device.
    f.drv.reset();
    assert!(!f.blk.lock().unwrap().is_activated());
}
