// SPDX-License-Identifier: Apache-2.0
//! The device behind the real MMIO transport, driven only through register
//! accesses by the transport's mock driver: the path a guest takes.

use vm_memory::GuestAddress;

use super::fixture::{frame, TransportFixture};
use crate::virtio::net::device::{features::*, offload_features};
use crate::virtio::net::*;
use crate::virtio::test_utils::Segment;
use crate::virtio::VIRTIO_MMIO_INT_VRING;

#[test]
fn test_through_mmio_transport() {
    let TransportFixture {
        mut em,
        mut drv,
        peer,
        net,
        metrics,
    } = TransportFixture::new(16 << 20);

    // Ack everything offered, as Linux does for these bits.
    let want = 1u64 << VIRTIO_F_VERSION_1
        | 1 << VIRTIO_NET_F_MAC
        | 1 << VIRTIO_NET_F_STATUS
        | 1 << VIRTIO_NET_F_MRG_RXBUF
        | 1 << VIRTIO_RING_F_EVENT_IDX
        | offload_features(Offloads::ALL);
    let offered = drv.init(want).unwrap();
    assert_eq!(offered & want, want);
    let mut run = || while em.run_with_timeout(0).unwrap() > 0 {};
    run();
    assert_eq!(
        metrics
            .features_negotiated
            .load(std::sync::atomic::Ordering::Relaxed),
        want
    );

    // RX: header-inclusive buffers, one per MTU frame... but with guest
    // TSO acked the device waits for 64 KiB of buffers: post 43.
    let mut bufs = Vec::new();
    for _ in 0..43 {
        let a = drv.alloc(1526, 64).unwrap();
        drv.add_chain(RX_INDEX, &[Segment::writable(a, 1526)])
            .unwrap();
        bufs.push(a);
    }
    drv.publish(RX_INDEX).unwrap();
    drv.kick(RX_INDEX);
    let f = frame(12 + 1514, 3);
    peer.send(&f).unwrap();
    run();
    let used = drv.used(RX_INDEX).unwrap();
    assert_eq!(used.len(), 1);
    assert_eq!(used[0].len, 1526);
    let got = drv.read_mem(bufs[0], 1526).unwrap();
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1);
    assert_eq!(got[12..], f[12..]);
    assert_ne!(drv.interrupt_status() & VIRTIO_MMIO_INT_VRING, 0);

    // TX: header and frame in two descriptors.
    let t = frame(12 + 600, 4);
    let a = drv.alloc(t.len() as u64, 16).unwrap();
    drv.write_mem(a, &t).unwrap();
    drv.submit(
        TX_INDEX,
        &[
            Segment::readable(a, 12),
            Segment::readable(GuestAddress(a.0 + 12), 600),
        ],
    )
    .unwrap();
    run();
    let mut buf = vec![0u8; 2000];
    let n = peer.recv(&mut buf).unwrap();
    assert_eq!(buf[..n], t[..]);
    assert_eq!(drv.used(TX_INDEX).unwrap().len(), 1);

    // Reset through the Status register, then come back up without MRG.
    drv.reset();
    run();
    assert!(!net.lock().unwrap().is_activated());
    drv.init(1 << VIRTIO_F_VERSION_1).unwrap();
    run();
    let a = drv.alloc(1526, 64).unwrap();
    drv.submit(RX_INDEX, &[Segment::writable(a, 1526)]).unwrap();
    peer.send(&frame(12 + 100, 5)).unwrap();
    run();
    assert_eq!(drv.used(RX_INDEX).unwrap()[0].len, 112);
}
