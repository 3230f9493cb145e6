// SPDX-License-Identifier: Apache-2.0
//! Tests that catch a broken device.
//!
//! Each test here was checked by breaking the device on purpose and seeing
//! it fail (the mutation it guards against is named in its doc comment):
//! RX buffers are filled with non-zero stale bytes before every frame and the
//! backend's headers carry non-zero bytes where `num_buffers` goes, so a byte
//! the device should have written and did not shows; every payload is
//! compared byte for byte, over every chain shape a driver can post (one
//! buffer, several, the header split over descriptors, indirect tables,
//! direct descriptors followed by a table, one frame over many chains).

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::fixture::*;
use crate::virtio::net::tx::MAX_TX_CHAIN_LEN;
use crate::virtio::net::{NetConfig, MAX_FRAME_GSO, VNET_HDR_LEN};
use crate::virtio::queue::IOV_MAX;

fn cfg() -> NetConfig {
    NetConfig::default()
}

fn with_queue_size(queue_size: u16) -> NetConfig {
    NetConfig {
        queue_size,
        ..NetConfig::default()
    }
}

/// RX chain shapes of 1526 bytes each (one MTU frame, header inclusive).
fn rx_shapes() -> Vec<(&'static str, Vec<u32>, Layout)> {
    vec![
        ("one buffer", vec![1526], Layout::Direct),
        ("three buffers", vec![100, 700, 726], Layout::Direct),
        ("header alone", vec![12, 1514], Layout::Direct),
        ("header split 5+7", vec![5, 7, 1514], Layout::Direct),
        ("num_buffers split", vec![11, 1515], Layout::Direct),
        (
            "header in bytes",
            vec![1; 12].into_iter().chain([1514]).collect(),
            Layout::Direct,
        ),
        ("indirect", vec![12, 1514], Layout::Indirect),
        (
            "indirect, header split",
            vec![4, 8, 300, 1214],
            Layout::Indirect,
        ),
        ("direct then indirect", vec![6, 600, 920], Layout::Mixed(1)),
        (
            "two direct then indirect",
            vec![10, 2, 1000, 514],
            Layout::Mixed(2),
        ),
    ]
}

/// Every RX chain shape, with and without MRG_RXBUF, with a frame that fills
/// the chain exactly and one that leaves stale bytes after it: the frame
/// lands byte for byte, `num_buffers` is 1 in both of its bytes, the used
/// length is the frame's, and nothing past it is written.
///
/// Catches: reversing the segments of a multi-descriptor RX chain; writing
/// only the low byte of `num_buffers`; a used length other than the bytes
/// written.
#[test]
fn rx_every_chain_shape_lands_byte_exact() {
    for features in [MRG_FEATURES | RING_INDIRECT, BASE_FEATURES | RING_INDIRECT] {
        let mut h = NetFixture::new(cfg(), features);
        for (what, lens, layout) in rx_shapes() {
            for (i, len) in [1526usize, 12 + 60, 12 + 1].into_iter().enumerate() {
                let head = h.post_rx_shaped(&lens, layout);
                h.kick_rx();
                h.restain_rx();
                let f = noisy_frame(len, i as u8 + 1);
                h.deliver(&f);
                let got = h.take_rx_frames();
                assert_eq!(got.len(), 1, "{what}, {len} bytes");
                assert_eq!(got[0].heads, vec![head], "{what}");
                assert_eq!(got[0].lens, vec![len as u32], "{what}");
                got[0].assert_is(&f);
                assert_eq!(got[0].num_buffers(), 1, "{what}");
            }
        }
        assert_eq!(h.metric(|m| &m.malformed_chains), 0);
        assert_eq!(h.metric(|m| &m.rx_dropped), 0);
    }
}

/// With MRG_RXBUF one frame spreads over chains of every shape, in ring
/// order, each but the last filled to the byte, and `num_buffers` counts
/// them.
#[test]
fn rx_mergeable_frame_over_chains_of_every_shape() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES | RING_INDIRECT);
    let chains: Vec<(Vec<u32>, Layout)> = vec![
        (vec![100], Layout::Direct),
        (vec![5, 7, 88], Layout::Direct),
        (vec![30, 70, 100], Layout::Indirect),
        (vec![10, 90, 100], Layout::Mixed(1)),
        (vec![1, 299], Layout::Indirect),
        (vec![1526], Layout::Direct),
    ];
    let heads: Vec<u16> = chains
        .iter()
        .map(|(l, layout)| h.post_rx_shaped(l, *layout))
        .collect();
    h.kick_rx();
    h.restain_rx();
    let f = noisy_frame(1526, 9);
    h.deliver(&f);
    let got = h.take_rx_frames();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].heads, heads);
    assert_eq!(got[0].lens, vec![100, 100, 200, 200, 300, 626]);
    got[0].assert_is(&f);
    assert_eq!(h.metric(|m| &m.rx_buffers), 6);
}

/// A 64 KiB frame over 328 chains of 200 bytes (queue of 512): `num_buffers`
/// needs its high byte (0x148).
///
/// Catches: writing only the low byte of `num_buffers`, even where the
/// backend's header had 0 there.
#[test]
fn rx_num_buffers_above_255() {
    let mut h = NetFixture::new(
        with_queue_size(512),
        MRG_FEATURES | GUEST_GSO | RING_INDIRECT,
    );
    let shapes = [
        (vec![200], Layout::Direct),
        (vec![120, 80], Layout::Direct),
        (vec![50, 150], Layout::Indirect),
    ];
    for i in 0..340 {
        let (lens, layout) = &shapes[i % shapes.len()];
        h.post_rx_shaped(lens, *layout);
    }
    h.kick_rx();
    let mut f = frame(VNET_HDR_LEN + MAX_FRAME_GSO, 3);
    f[10] = 0;
    f[11] = 0;
    h.deliver(&f);
    let got = h.take_rx_frames();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].num_buffers(), 328);
    got[0].assert_is(&f);
}

/// The whole ring holds less than the largest frame the backend may deliver
/// (16 entries of 1526 bytes with guest GSO, which allows 65562): once the
/// driver has posted every descriptor it has, the device must read, or it
/// waits for buffers the driver cannot post. A frame larger than what is
/// posted is dropped, and the chains wait for the next one.
///
/// Catches: removing the guard for a ring whose whole posted capacity is
/// smaller than the largest frame (an RX deadlock).
#[test]
fn rx_ring_smaller_than_the_largest_frame_still_reads() {
    for layout in [Layout::Direct, Layout::Indirect] {
        let mut h = NetFixture::new(
            with_queue_size(16),
            MRG_FEATURES | GUEST_GSO | RING_INDIRECT,
        );
        for _ in 0..16 {
            h.post_rx_shaped(&[1526], layout);
        }
        h.kick_rx();
        let sizes = [12 + 1514, 12 + 30000, 12 + 100, 12 + 20000, 12 + 60];
        for (i, &len) in sizes.iter().enumerate() {
            h.restain_rx();
            let f = noisy_frame(len, i as u8);
            h.deliver(&f);
            let got = h.take_rx_frames();
            if len > 16 * 1526 {
                // More than the 16 posted chains hold: dropped.
                assert!(got.is_empty(), "{layout:?}: a {len}-byte frame");
                continue;
            }
            assert_eq!(got.len(), 1, "{layout:?}: a {len}-byte frame never came");
            got[0].assert_is(&f);
            // A driver reposts what it got back.
            for _ in &got[0].heads {
                h.post_rx_shaped(&[1526], layout);
            }
            h.kick_rx();
        }
        assert_eq!(h.metric(|m| &m.rx_dropped), 1, "{layout:?}");
        assert_eq!(h.metric(|m| &m.rx_frames), 4, "{layout:?}");
    }
}

/// TX chains of every shape leave as the guest laid them out, byte for byte,
/// and come back used with length 0.
#[test]
fn tx_every_chain_shape_leaves_byte_exact() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES | RING_INDIRECT);
    let shapes: Vec<(&str, usize, Vec<u32>, Layout)> = vec![
        ("one buffer", 1526, vec![1526], Layout::Direct),
        ("header alone", 1526, vec![12, 1514], Layout::Direct),
        ("header split", 1526, vec![5, 7, 1514], Layout::Direct),
        (
            "empty buffers between",
            612,
            vec![12, 0, 500, 0, 100],
            Layout::Direct,
        ),
        ("200 small buffers", 1600, vec![8; 200], Layout::Direct),
        ("indirect", 1526, vec![12, 700, 814], Layout::Indirect),
        ("indirect, 200 small", 1600, vec![8; 200], Layout::Indirect),
        (
            "direct then indirect",
            1526,
            vec![12, 1000, 514],
            Layout::Mixed(1),
        ),
        ("runt: header only", 12, vec![12], Layout::Direct),
    ];
    for (i, (what, len, lens, layout)) in shapes.into_iter().enumerate() {
        let f = noisy_frame(len, i as u8);
        let head = h.post_tx_shaped(&f, &lens, layout);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.peer_frames(), vec![f], "{what}");
        assert_eq!(
            h.txq.take_used(&h.mem),
            vec![(u32::from(head), 0)],
            "{what}"
        );
    }
    assert_eq!(h.metric(|m| &m.malformed_chains), 0);
}

/// A TX chain of exactly `MAX_TX_CHAIN_LEN` bytes (a 64 KiB GSO frame and
/// its header) is sent, in one buffer or in pages; one byte more is refused.
///
/// Catches: accepting a chain of exactly the limit as too long (an
/// off-by-one on MAX_TX_CHAIN_LEN).
#[test]
fn tx_chain_of_exactly_the_limit_is_sent() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES | RING_INDIRECT);
    assert_eq!(MAX_TX_CHAIN_LEN, 12 + 65550);
    let f = frame(12 + 65550, 1);
    let mut pages = vec![12u32];
    pages.extend(std::iter::repeat_n(4096, 16));
    pages.push(65550 - 16 * 4096);
    for (lens, layout) in [
        (vec![f.len() as u32], Layout::Direct),
        (vec![12, 65550], Layout::Direct),
        (pages.clone(), Layout::Direct),
        (pages, Layout::Indirect),
    ] {
        h.post_tx_shaped(&f, &lens, layout);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.peer_frames(), vec![f.clone()], "{lens:?} {layout:?}");
    }
    let long = frame(12 + 65551, 2);
    let head = h.post_tx_shaped(&long, &[12, 65551], Layout::Direct);
    h.kick_tx();
    h.run_until_idle();
    assert!(h.peer_frames().is_empty());
    assert_eq!(h.metric(|m| &m.malformed_chains), 1);
    assert_eq!(h.txq.take_used(&h.mem).last(), Some(&(u32::from(head), 0)));
}

/// A chain of 1024 buffers is refused, also when all but one are empty
/// (they add no I/O vector but cost a descriptor read each: with a large
/// queue one chain could otherwise make a pass read tens of thousands).
///
/// Catches: removing the chain walk's buffer-count guard, or allowing
/// IOV_MAX (rather than IOV_MAX - 1) buffers in a chain.
#[test]
fn chain_of_1024_buffers_is_refused_even_if_mostly_empty() {
    assert_eq!(IOV_MAX, 1024);
    for layout in [Layout::Direct, Layout::Indirect] {
        let mut h = NetFixture::new(with_queue_size(2048), MRG_FEATURES | RING_INDIRECT);
        let f = frame(12 + 100, 4);
        let mut lens = vec![f.len() as u32];
        lens.extend([0; 1022]);
        // 1023 buffers: fine.
        h.post_tx_shaped(&f, &lens, layout);
        lens.push(0);
        let head = h.post_tx_shaped(&f, &lens, layout);
        h.kick_tx();
        h.run_until_idle();
        assert_eq!(h.peer_frames(), vec![f], "{layout:?}");
        assert_eq!(h.metric(|m| &m.malformed_chains), 1, "{layout:?}");
        // Used order is free (a refused chain is returned when walked, a
        // sent one when its batch is written).
        let used = h.txq.take_used(&h.mem);
        assert_eq!(used.len(), 2, "{layout:?}");
        assert!(used.contains(&(u32::from(head), 0)), "{used:?}");
    }
}

/// Guest memory of two regions (two host mappings): a buffer across their
/// boundary takes two I/O vectors. A TX chain of 600 such buffers (1200
/// vectors, more than one `writev` takes) is refused, not sent truncated;
/// the same frame in 511 of them (1022 vectors) is sent whole.
///
/// Catches: removing the chain walk's segment-count guard.
#[test]
fn chain_of_more_segments_than_one_syscall_takes_is_refused() {
    let half = MEM_SIZE as usize / 2;
    let mem =
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), half), (GuestAddress(half as u64), half)])
            .unwrap();
    let mut h = NetFixture::new_inactive_with(with_queue_size(1024), mem);
    h.activate(MRG_FEATURES | RING_INDIRECT);
    let boundary = half as u64;
    for (n, ok) in [(511usize, true), (600, false)] {
        // Every buffer is the same 4 bytes across the boundary.
        let piece = [0x11u8, 0x22, 0x33, 0x44];
        h.mem
            .write_slice(&piece, GuestAddress(boundary - 2))
            .unwrap();
        let bufs = vec![(boundary - 2, 4u32); n];
        h.add_shaped(false, &bufs, Layout::Indirect);
        h.kick_tx();
        h.run_until_idle();
        let sent = h.peer_frames();
        if ok {
            assert_eq!(sent, vec![piece.repeat(n)]);
        } else {
            assert!(
                sent.is_empty(),
                "{n} buffers: sent {:?} bytes",
                sent.first().map(Vec::len)
            );
            assert_eq!(h.metric(|m| &m.malformed_chains), 1);
        }
    }
}

/// A device with four RX chains posted and kicked, each an indirect table of
/// 256 one-byte buffers.
fn rx_cache_of_1024_vectors() -> NetFixture {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES | RING_INDIRECT);
    for _ in 0..4 {
        h.post_rx_shaped(&[1; 256], Layout::Indirect);
    }
    h.kick_rx();
    h
}

/// Four RX chains that are indirect tables of 256 one-byte buffers: 1024
/// I/O vectors and 1024 bytes in four ring entries, less than a frame may
/// need. The cache cannot grow past one `readv`, so the device reads with
/// what it has: a 500-byte frame lands in the first two chains.
///
/// Catches: removing the RX cache's "one readv could not take more" guard
/// (the device would wait for buffers forever).
#[test]
fn rx_cache_full_of_vectors_reads_what_it_has() {
    let mut h = rx_cache_of_1024_vectors();
    let f = noisy_frame(500, 5);
    h.deliver(&f);
    let got = h.take_rx_frames();
    assert_eq!(got.len(), 1, "{}", h.metrics.to_json());
    assert_eq!(got[0].lens, vec![256, 244]);
    got[0].assert_is(&f);
}

/// The same four chains: one `readv` takes at most three of them (768
/// vectors and the truncation byte; four would be 1025), so a 1100-byte
/// frame does not fit and is dropped, not delivered cut to 1024 bytes; a
/// 700-byte one then lands in the first three.
///
/// Catches: removing the guard that stops offering chains to one readv at
/// IOV_MAX vectors.
#[test]
fn rx_frame_longer_than_one_readv_takes_is_dropped_not_truncated() {
    let mut h = rx_cache_of_1024_vectors();
    h.deliver(&noisy_frame(1100, 6));
    assert!(h.take_rx_frames().is_empty());
    assert_eq!(h.metric(|m| &m.rx_dropped), 1);
    h.restain_rx();
    let f = noisy_frame(700, 7);
    h.deliver(&f);
    let got = h.take_rx_frames();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].lens, vec![256, 256, 188]);
    got[0].assert_is(&f);
}

/// One RX chain of 1024 two-byte buffers (queue of 1024): with the
/// truncation byte it would need 1025 vectors, so it is refused; a frame
/// longer than it is never delivered cut short.
///
/// Catches: allowing IOV_MAX (rather than IOV_MAX - 1) buffers in a chain.
#[test]
fn rx_chain_of_1024_buffers_is_refused() {
    let mut h = NetFixture::new(with_queue_size(1024), MRG_FEATURES | RING_INDIRECT);
    let head = h.post_rx_shaped(&[2; 1024], Layout::Indirect);
    h.kick_rx();
    h.deliver(&noisy_frame(2100, 8));
    assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(head), 0)]);
    assert_eq!(h.metric(|m| &m.malformed_chains), 1);
    assert_eq!(h.metric(|m| &m.rx_frames), 0);
}

/// No RX interrupt when nothing was used: a frame waiting with no buffers
/// posted (starved), a frame too big for the one chain without MRG_RXBUF
/// (dropped), a 0-byte message (a runt), an RX kick with the backend empty;
/// then exactly one for a frame delivered. With EVENT_IDX the suppressed
/// counter does not move either.
///
/// Catches: signalling an RX interrupt (or deciding on one) when nothing was
/// used.
#[test]
fn no_rx_interrupt_when_nothing_was_used() {
    for features in [BASE_FEATURES, BASE_FEATURES | RING_EVENT_IDX] {
        let mut h = NetFixture::new(cfg(), features);
        h.rxq.set_used_event(&h.mem, 0).unwrap();
        // Starved.
        h.deliver(&frame(12 + 1514, 1));
        assert_eq!(h.metric(|m| &m.rx_no_avail_buffer), 1);
        // Dropped: 1000 bytes posted, no MRG_RXBUF.
        h.post_rx_shaped(&[1000], Layout::Direct);
        h.kick_rx();
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.rx_dropped), 1);
        // A runt.
        h.deliver(&[]);
        assert_eq!(h.metric(|m| &m.rx_dropped), 2);
        // A kick with nothing to read: the pass reads EAGAIN.
        h.post_rx_shaped(&[1000], Layout::Direct);
        h.kick_rx();
        h.run_until_idle();
        assert!(h.metric(|m| &m.rx_passes) >= 3);
        assert_eq!(h.irq.count(), 0, "features {features:#x}");
        assert_eq!(h.metric(|m| &m.interrupts), 0);
        assert_eq!(h.metric(|m| &m.interrupts_suppressed), 0);
        // Something used: one interrupt.
        h.restain_rx();
        let f = noisy_frame(12 + 100, 2);
        h.deliver(&f);
        h.take_rx_frames()[0].assert_is(&f);
        assert_eq!(h.irq.count(), 1, "features {features:#x}");
    }
}

/// While an RX pass waits behind its weight, the loop wakes for its re-queue
/// event only, not also for the backend it cannot read yet; while the guest
/// posts no buffers, it does not wake at all.
///
/// Catches: dropping either RX deferral from the backend's epoll interest
/// (a flood would wake the loop for nothing at every iteration; a starved
/// device would spin on the level-triggered fd).
#[test]
fn rx_deferred_or_starved_does_not_wake_for_the_backend() {
    let mut h = NetFixture::configured(|c| c.rx_weight_packets = 2, MRG_FEATURES);
    for _ in 0..3 {
        h.post_rx_shaped(&[1526], Layout::Direct);
    }
    h.peer_sends(6, 12 + 100);
    // The backend: two frames, then the pass yields to its weight.
    assert_eq!(h.run_once(0), 1);
    assert_eq!(h.metric(|m| &m.rx_frames), 2);
    // The re-queue event alone: the third frame, and the ring is empty.
    assert_eq!(h.run_once(0), 1);
    assert_eq!(h.metric(|m| &m.rx_frames), 3);
    // The backend again: no buffers, starved.
    assert_eq!(h.run_once(0), 1);
    assert_eq!(h.metric(|m| &m.rx_no_avail_buffer), 1);
    // Three frames wait, the guest posts nothing: the loop sleeps.
    for _ in 0..3 {
        assert_eq!(h.run_once(10), 0);
    }
    assert_eq!(h.take_rx_frames().len(), 3);
}
