// SPDX-License-Identifier: Apache-2.0
//! When the device asks for kicks and raises interrupts, with a driver
//! that negotiated VERSION_1 alone (ring flags, no event indexes): the RX
//! queue wants no kick while it holds buffers and wants one as soon as work
//! waits for a buffer; the passes of one event raise one interrupt, and
//! none the driver turned off.

use std::io::Write;

use super::fixture::{guest_hdr, read_n, test_tunables, VsockFixture};
use crate::virtio::metrics::DeviceMetrics;
use crate::virtio::queue::{VIRTQ_AVAIL_F_NO_INTERRUPT, VIRTQ_USED_F_NO_NOTIFY};
use crate::virtio::vsock::device::features::VIRTIO_F_VERSION_1;
use crate::virtio::vsock::packet::Op;
use crate::virtio::vsock::UnixBackend;
use crate::virtio::VirtioDevice;

const GUEST_PORT: u32 = 1000;
const HOST_PORT: u32 = 52;

/// An activated device whose driver negotiated VERSION_1 only.
fn flags_driver() -> VsockFixture {
    let mut f = VsockFixture::with(test_tunables(), UnixBackend, false);
    f.activate(1 << VIRTIO_F_VERSION_1);
    f
}

fn rx_used_flags(f: &VsockFixture) -> u16 {
    f.qs[0].used_flags(&f.mem).unwrap()
}

#[test]
fn rx_kicks_are_off_while_buffers_are_left_and_asked_for_when_work_waits() {
    let mut f = flags_driver();
    let l = f.host_listen(HOST_PORT);
    f.post_rx(2, 4096);
    let mut host = f.open_from_guest(&l, GUEST_PORT, HOST_PORT);
    // The RESPONSE took one buffer; one is left: no kick is needed.
    assert_eq!(f.rx_outstanding(), 1);
    assert_eq!(rx_used_flags(&f), VIRTQ_USED_F_NO_NOTIFY);

    host.write_all(b"a").unwrap();
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].data, b"a");
    // The last buffer went with nothing waiting: still no kick wanted.
    assert_eq!(f.rx_outstanding(), 0);
    assert_eq!(rx_used_flags(&f), VIRTQ_USED_F_NO_NOTIFY);

    // Data waits and no buffer is left: the device asks for the kick that
    // tells it buffers came.
    host.write_all(b"b").unwrap();
    f.run_until_idle();
    assert_eq!(rx_used_flags(&f), 0, "kicks asked for");
    f.post_rx(2, 4096);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].data, b"b");
    assert_eq!(rx_used_flags(&f), VIRTQ_USED_F_NO_NOTIFY);
}

#[test]
fn the_passes_of_one_event_raise_one_interrupt() {
    let mut f = flags_driver();
    let l = f.host_listen(HOST_PORT);
    f.post_rx(4, 4096);
    let before = f.irq.count();
    // One TX kick: the REQUEST's chain comes back on TX and the RESPONSE
    // goes out on RX in the same event.
    let _host = f.open_from_guest(&l, GUEST_PORT, HOST_PORT);
    assert_eq!(f.irq.count() - before, 1, "{}", f.metrics.to_json());
    assert_eq!(f.metric(|m| &m.interrupts), f.irq.count());
    assert_eq!(f.metric(|m| &m.tx_packets), 1);
    assert_eq!(f.metric(|m| &m.rx_packets), 1);
}

#[test]
fn a_driver_that_turned_interrupts_off_gets_none() {
    let mut f = flags_driver();
    let l = f.host_listen(HOST_PORT);
    f.post_rx(4, 4096);
    for q in 0..2 {
        f.qs[q]
            .set_avail_flags(&f.mem, VIRTQ_AVAIL_F_NO_INTERRUPT)
            .unwrap();
    }
    let before = f.irq.count();
    let _host = f.open_from_guest(&l, GUEST_PORT, HOST_PORT);
    assert_eq!(f.irq.count(), before);
    assert_eq!(f.metric(|m| &m.interrupts_suppressed), 2, "one a queue");
    // Turned on again for RX only: its next packet interrupts.
    f.qs[0].set_avail_flags(&f.mem, 0).unwrap();
    f.send(&guest_hdr(GUEST_PORT, HOST_PORT, Op::CreditRequest), &[]);
    let pkts = f.recv();
    assert_eq!(pkts.len(), 1);
    assert_eq!(pkts[0].op(), Some(Op::CreditUpdate));
    assert_eq!(f.irq.count() - before, 1);
    assert_eq!(f.metric(|m| &m.interrupts_suppressed), 3, "TX's");
}

#[test]
fn kicks_are_never_read_and_each_brings_the_loop_back() {
    let mut f = VsockFixture::new();
    let l = f.host_listen(HOST_PORT);
    f.post_rx(8, 4096);
    let mut host = f.open_from_guest(&l, GUEST_PORT, HOST_PORT);
    // Each `send` kicks the TX queue once more and runs the loop until
    // nothing is ready: a kick left unread must neither keep the loop busy
    // (it goes idle) nor hide the kicks after it (each packet arrives).
    for i in 0..3u8 {
        f.send(&guest_hdr(GUEST_PORT, HOST_PORT, Op::Rw), &[b'0' + i]);
    }
    assert_eq!(read_n(&mut host, 3), b"012");
    assert_eq!(f.metric(|m| &m.tx_packets), 4);
    let kicks = f.dev().queue_events()[1].try_clone().unwrap();
    assert_eq!(
        kicks.read().unwrap(),
        4,
        "the REQUEST's kick and three more, unread"
    );
}
