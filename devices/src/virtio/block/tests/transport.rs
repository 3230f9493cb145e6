// SPDX-License-Identifier: Apache-2.0
//! The device behind the real MMIO transport, reached only through register
//! accesses by the mock driver, as the VMM attaches it (like `Net`).

use std::sync::{Arc, Mutex};

use event_manager::{EventManager, SubscriberOps};
use vm_memory::Bytes;

use super::fixture::*;
use crate::virtio::block::device::config_offsets;
use crate::virtio::block::{Block, BlockConfig};
use crate::virtio::mmio::MmioTransport;
use crate::virtio::test_utils::{guest_memory, MockDriver};
use crate::virtio::VirtioDevice;

#[test]
fn test_through_mmio_transport() {
    let dir = TempDir::new();
    let data = random_bytes(&mut Rng(31), 32 * 512);
    let path = dir.file("d.img", &data);
    let mem = guest_memory(16 << 20).unwrap();
    let blk = Arc::new(Mutex::new(
        Block::new(BlockConfig::new("mmio0", &path), mem.clone()).unwrap(),
    ));
    let metrics = blk.lock().unwrap().metrics();
    let mut em = EventManager::new().unwrap();
    em.add_subscriber(blk.clone());
    let dev: Arc<Mutex<dyn VirtioDevice>> = blk.clone();
    let t = MmioTransport::new(mem.clone(), dev).unwrap();
    let mut drv = MockDriver::with_alloc_range(
        mem.clone(),
        t,
        vm_memory::GuestAddress(0x100000),
        (16 << 20) - 0x100000,
    );
    // The device ID register, then the config space through the window.
    assert_eq!(drv.read_reg(0x008), 2);
    let cap = u64::from(drv.read_reg(0x100)) | u64::from(drv.read_reg(0x104)) << 32;
    assert_eq!(cap, 32);
    assert_eq!(drv.read_reg(0x100 + config_offsets::BLK_SIZE as u64), 512);
    // Ack what is offered (a driver may ack only that).
    let offered = drv.device_features();
    drv.init(offered & BASE_FEATURES).unwrap();
    let mut run = || while em.run_with_timeout(0).unwrap() > 0 {};
    run();
    assert_eq!(
        metrics
            .features_negotiated
            .load(std::sync::atomic::Ordering::Relaxed),
        offered & BASE_FEATURES
    );
    let hdr = drv.alloc(16, 16).unwrap();
    mem.write_slice(&header(VIRTIO_BLK_T_IN, 2), hdr).unwrap();
    let buf = drv.alloc(1024, 16).unwrap();
    let st = drv.alloc(1, 1).unwrap();
    drv.submit(
        0,
        &[
            Segment::readable(hdr, 16),
            Segment::writable(buf, 1024),
            Segment::writable(st, 1),
        ],
    )
    .unwrap();
    // Completions may need a moment with the io_uring.
    for _ in 0..50 {
        if em.run_with_timeout(20).unwrap() == 0 && drv.used_idx(0).unwrap() > 0 {
            break;
        }
    }
    let used = drv.used(0).unwrap();
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].len, 1025);
    assert_eq!(drv.read_mem(st, 1).unwrap(), [VIRTIO_BLK_S_OK]);
    assert_eq!(drv.read_mem(buf, 1024).unwrap(), data[1024..2048]);
    assert_ne!(
        drv.interrupt_status() & crate::virtio::VIRTIO_MMIO_INT_VRING,
        0
    );
    // A reset through the status register deactivates the device.
    drv.reset();
    assert!(!blk.lock().unwrap().is_activated());
}
