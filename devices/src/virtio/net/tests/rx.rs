// SPDX-License-Identifier: Apache-2.0
//! RX through the whole device: frames into one or many buffers, with and
//! without MRG_RXBUF, and every malformed chain the device must return
//! without writing.

use vm_memory::{Bytes, GuestAddress};

use super::fixture::*;
use crate::virtio::net::{NetConfig, RX_INDEX};

fn cfg() -> NetConfig {
    NetConfig::default()
}

// ---- RX ----

/// Reads the num_buffers field of a received header.
fn num_buffers(h: &NetFixture, addr: u64) -> u16 {
    h.mem.read_obj(GuestAddress(addr + 10)).unwrap()
}

/// Asserts that one frame came back spread over the first `n` of `bufs`,
/// the last holding `last_len` bytes, and that its header says `n`
/// (num_buffers); returns the used entries.
#[track_caller]
fn assert_one_frame_in(
    h: &mut NetFixture,
    bufs: &[(u16, u64)],
    n: usize,
    last_len: u32,
) -> Vec<(u32, u32)> {
    let used = h.rxq.take_used(&h.mem);
    assert_eq!(used.len(), n);
    assert_eq!(used[n - 1].1, last_len);
    assert_eq!(num_buffers(h, bufs[0].1), n as u16);
    used
}

#[test]
fn test_rx_one_buffer_header_inclusive() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let bufs = h.offer_rx(&[1526; 10]);
    // Stale bytes where num_buffers goes: the device must overwrite them.
    for (_, a) in &bufs {
        h.mem.write_obj(0xffffu16, GuestAddress(a + 10)).unwrap();
    }
    let frames: Vec<Vec<u8>> = (0..10).map(|i| frame(12 + 1514, i)).collect();
    for f in &frames {
        h.peer.send(f).unwrap();
    }
    h.run_until_idle();
    let used = h.rxq.take_used(&h.mem);
    assert_eq!(used.len(), 10);
    for (i, ((id, len), (head, addr))) in used.iter().zip(&bufs).enumerate() {
        assert_eq!((*id, *len), (u32::from(*head), 1526));
        assert_eq!(num_buffers(&h, *addr), 1);
        assert_eq!(h.read(addr + 12, 1514), frames[i][12..]);
    }
    assert_eq!(h.metric(|m| &m.rx_frames), 10);
    assert_eq!(h.metric(|m| &m.rx_buffers), 10);
    assert_eq!(h.metric(|m| &m.rx_bytes), 10 * 1514);
}

#[test]
fn test_rx_mtu_sized_buffers_need_two() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let bufs = h.offer_rx(&[1500; 20]);
    h.peer_sends(10, 12 + 1514);
    h.run_until_idle();
    let used = h.rxq.take_used(&h.mem);
    assert_eq!(used.len(), 20);
    for pair in used.chunks(2) {
        assert_eq!((pair[0].1, pair[1].1), (1500, 26));
    }
    assert_eq!(num_buffers(&h, bufs[0].1), 2);
    assert_eq!(num_buffers(&h, bufs[18].1), 2);
    assert_eq!(h.metric(|m| &m.rx_frames), 10);
    assert_eq!(h.metric(|m| &m.rx_buffers), 20);
}

#[test]
fn test_rx_two_buffers_data() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let bufs = h.offer_rx(&[1000, 1000]);
    let f = frame(12 + 1514, 5);
    h.deliver(&f);
    let used = h.rxq.take_used(&h.mem);
    assert_eq!(
        used,
        vec![(u32::from(bufs[0].0), 1000), (u32::from(bufs[1].0), 526)]
    );
    assert_in_two_buffers(&h, &bufs, &f);
}

/// Asserts that `f`, an MTU frame (1526 bytes with its header), landed in
/// the two 1000-byte `bufs` and that its header says 2 (num_buffers).
#[track_caller]
fn assert_in_two_buffers(h: &NetFixture, bufs: &[(u16, u64)], f: &[u8]) {
    assert_eq!(num_buffers(h, bufs[0].1), 2);
    let mut got = h.read(bufs[0].1, 1000);
    got.extend(h.read(bufs[1].1, 526));
    assert_eq!(got[12..], f[12..]);
}

#[test]
fn test_rx_many_buffers_gso() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES | GUEST_GSO);
    // Page-sized buffers, as Linux posts with big packets.
    let bufs = h.offer_rx(&[4096; 20]);
    let f = frame(12 + 65550, 6);
    h.deliver(&f);
    // 65562 = 16 * 4096 + 26
    let used = assert_one_frame_in(&mut h, &bufs, 17, 26);
    assert!(used[..16].iter().all(|&(_, l)| l == 4096));
    let mut got = Vec::new();
    for (i, (_, l)) in used.iter().enumerate() {
        got.extend(h.read(bufs[i].1, *l as usize));
    }
    assert_eq!(got[12..], f[12..]);
    assert_eq!(h.metric(|m| &m.rx_buffers), 17);
    // The 3 buffers left stay cached; a small frame takes the first.
    h.peer.send(&frame(100, 1)).unwrap();
    h.offer_rx(&[4096; 14]);
    h.run_until_idle();
    assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(bufs[17].0), 100)]);
}

#[test]
fn test_rx_small_buffers_many() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let bufs = h.offer_rx(&[256; 8]);
    let f = frame(12 + 1514, 7);
    h.deliver(&f);
    // 1526 = 5 * 256 + 246
    assert_one_frame_in(&mut h, &bufs, 6, 246);
}

#[test]
fn test_rx_reads_without_waiting_for_64k() {
    // Without guest GSO one 1526-byte buffer is enough to read.
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    h.offer_rx(&[1526]);
    h.deliver(&frame(12 + 1514, 1));
    assert_eq!(h.metric(|m| &m.rx_frames), 1);

    // With guest GSO a 64 KiB frame may come: 1526 bytes are not enough.
    let mut h = NetFixture::new(cfg(), MRG_FEATURES | GUEST_GSO);
    h.offer_rx(&[1526]);
    h.deliver(&frame(12 + 1514, 1));
    assert_eq!(h.metric(|m| &m.rx_frames), 0);
    assert!(h
        .dev()
        .active
        .as_ref()
        .unwrap()
        .rx
        .starved_since()
        .is_some());
    h.offer_rx(&[1526; 42]);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    assert_eq!(h.metric(|m| &m.rx_buffers), 1);
}

#[test]
fn test_rx_reads_once_one_readv_can_take_no_more_buffers() {
    // 1023 buffers of 64 bytes: short of a 64 KiB frame (65,472 bytes) and
    // of the ring (2048), but one readv takes no more vectors (IOV_MAX, less
    // the one the tail needs). Waiting for more would stall the frame.
    let mut h = NetFixture::configured(|c| c.queue_size = 2048, MRG_FEATURES | GUEST_GSO);
    let bufs = h.offer_rx(&[64; 1023]);
    h.deliver(&frame(12 + 1514, 3));
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    // 1526 = 23 * 64 + 54
    assert_one_frame_in(&mut h, &bufs, 24, 54);
}

#[test]
fn test_rx_waits_for_the_whole_ring_again_after_a_frame_took_part_of_it() {
    // A 16-entry ring with guest GSO: the cache reads early only when it
    // holds every descriptor the guest can post. After one frame took one
    // buffer, 15 are left: the device must wait for the guest to post the
    // 16th, or a frame that needs all 16 would be read too soon and dropped.
    let mut h = NetFixture::configured(|c| c.queue_size = 16, MRG_FEATURES | GUEST_GSO);
    h.offer_rx(&[1526; 16]);
    h.deliver(&frame(12 + 100, 1));
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    // 24,012 bytes: 16 buffers of 1526 hold it, 15 do not.
    let big = frame(12 + 24_000, 2);
    h.deliver(&big);
    assert_eq!(h.metric(|m| &m.rx_dropped), 0, "read with 15 of 16 buffers");
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    h.offer_rx(&[1526]);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_frames), 2);
    assert_eq!(h.metric(|m| &m.rx_buffers), 17);
}

#[test]
fn test_rx_dropped_frames_count_against_the_packet_weight() {
    // Frames too big for the guest's one buffer are read and dropped; each
    // costs a read, so a flood of them must end passes at the packet weight
    // like delivered frames do, or one pass would drain the whole backlog.
    let mut h = NetFixture::configured(|c| c.rx_weight_packets = 2, BASE_FEATURES);
    h.offer_rx(&[1000]);
    h.peer_sends(6, 12 + 1514);
    h.run_once(0);
    assert_eq!(
        h.metric(|m| &m.rx_dropped),
        2,
        "the first pass stops at the weight"
    );
    assert_eq!(h.metric(|m| &m.rx_weight_hits), 1);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_dropped), 6);
    assert_eq!(h.metric(|m| &m.rx_frames), 0);
}

#[test]
fn test_rx_without_mrg_drops_frame_too_big() {
    let mut h = NetFixture::new(cfg(), BASE_FEATURES);
    // Two chains that together would hold the frame: without MRG_RXBUF a
    // frame takes one chain or none.
    let bufs = h.offer_rx(&[1000, 1000]);
    h.peer.send(&frame(12 + 1514, 1)).unwrap();
    check_metric_after_block!(h.metrics.rx_dropped, 1, h.run_until_idle());
    // Not split, not consumed: the chain waits for a frame that fits,
    // and with nothing used the guest gets no interrupt.
    assert!(h.rxq.take_used(&h.mem).is_empty());
    assert_eq!(h.irq.count(), 0);
    assert_eq!(h.metric(|m| &m.interrupts_suppressed), 0);
    let small = frame(12 + 500, 2);
    h.deliver(&small);
    assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(bufs[0].0), 512)]);
    assert_eq!(num_buffers(&h, bufs[0].1), 1);
    assert_eq!(h.read(bufs[0].1 + 12, 500), small[12..]);
}

#[test]
fn test_rx_without_mrg_exact_fit() {
    // A frame exactly as long as the chain is not mistaken for a
    // truncated one.
    let mut h = NetFixture::new(cfg(), BASE_FEATURES);
    let bufs = h.offer_rx(&[1526, 1526]);
    h.peer.send(&frame(12 + 1514, 1)).unwrap();
    h.deliver(&frame(12 + 1514, 2));
    assert_eq!(
        h.rxq.take_used(&h.mem),
        vec![(u32::from(bufs[0].0), 1526), (u32::from(bufs[1].0), 1526)]
    );
    assert_eq!(h.metric(|m| &m.rx_dropped), 0);
}

#[test]
fn test_rx_bounce_buffer_matches() {
    let mut h = NetFixture::configured(|c| c.bounce_buffer = true, MRG_FEATURES);
    let bufs = h.offer_rx(&[1000, 1000]);
    let f = frame(12 + 1514, 8);
    h.deliver(&f);
    assert_eq!(h.rxq.take_used(&h.mem).len(), 2);
    assert_in_two_buffers(&h, &bufs, &f);
}

#[test]
fn test_rx_header_split_across_descriptors() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let a = h.alloc(2000);
    // num_buffers straddles the first two descriptors (bytes 10 and 11).
    let head = h
        .rxq
        .post_chain(
            &h.mem,
            &[
                (a, 11, VIRTQ_DESC_F_WRITE),
                (a + 100, 1515, VIRTQ_DESC_F_WRITE),
            ],
        )
        .unwrap();
    h.kick_rx();
    h.deliver(&frame(12 + 1514, 3));
    assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(head), 1526)]);
    assert_eq!(h.read(a + 10, 1), vec![1]);
    assert_eq!(h.read(a + 100, 1), vec![0]);
}

// ---- RX malformed chains ----

fn check_bad_rx(write: impl FnOnce(&mut NetFixture) -> u16) {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let bad = write(&mut h);
    let good = h.offer_rx(&[1526]);
    h.peer.send(&frame(12 + 1514, 1)).unwrap();
    check_metric_after_block!(h.metrics.malformed_chains, 1, h.run_until_idle());
    assert_eq!(
        h.rxq.take_used(&h.mem),
        vec![(u32::from(bad), 0), (u32::from(good[0].0), 1526)]
    );
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
}

#[test]
fn test_rx_read_only_descriptor() {
    check_bad_rx(|h| {
        h.post_chain_in_buffer(
            RX_INDEX,
            2000,
            &[(0, 1000, VIRTQ_DESC_F_WRITE), (1000, 1000, 0)],
        )
    });
}

#[test]
fn test_rx_outside_memory() {
    check_bad_rx(|h| {
        h.rxq
            .post_chain(&h.mem, &[(MEM_SIZE - 100, 1526, VIRTQ_DESC_F_WRITE)])
            .unwrap()
    });
}

#[test]
fn test_rx_shorter_than_header() {
    check_bad_rx(|h| h.post_chain_in_buffer(RX_INDEX, 16, &[(0, 8, VIRTQ_DESC_F_WRITE)]));
}

#[test]
fn test_rx_looping_chain() {
    check_bad_rx(|h| {
        let a = h.alloc(64);
        h.rxq
            .post_chain_linked(&h.mem, &[(a, 64, VIRTQ_DESC_F_WRITE)], |head| head)
            .unwrap()
    });
}

#[test]
fn test_rx_short_backend_frame_is_dropped() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    h.offer_rx(&[1526]);
    h.peer.send(&[0u8; 5]).unwrap();
    check_metric_after_block!(h.metrics.rx_dropped, 1, h.run_until_idle());
    assert!(h.rxq.take_used(&h.mem).is_empty());
}
