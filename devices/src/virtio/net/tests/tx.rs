// SPDX-License-Identifier: Apache-2.0
//! TX through the whole device: frames out of single- and multi-descriptor
//! chains, EAGAIN and refusals, and every malformed chain the device must
//! return without sending.

use std::sync::atomic::Ordering;

use vm_memory::{Bytes, GuestAddress};

use super::fixture::*;
use crate::virtio::net::{NetConfig, TX_INDEX};

fn cfg() -> NetConfig {
    NetConfig::default()
}

// ---- TX ----

#[test]
fn test_tx_single_descriptor() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let f = frame(1514 + 12, 1);
    let head = h.post_tx(&f, &[]);
    h.kick_tx();
    check_metric_after_block!(h.metrics.tx_frames, 1, h.run_until_idle());
    assert_eq!(h.peer_frames(), vec![f]);
    assert_eq!(h.txq.take_used(&h.mem), vec![(u32::from(head), 0)]);
    assert_eq!(h.metric(|m| &m.tx_bytes), 1514);
    assert_eq!(h.irq.count(), 1);
}

#[test]
fn test_tx_multi_descriptor() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    // Header alone, then the frame in uneven pieces, as Linux lays out
    // a linear head plus page fragments.
    let f = frame(12 + 3000, 2);
    let head = h.post_tx(&f, &[12, 100, 1, 2000]);
    let f2 = frame(12 + 60, 3);
    let head2 = h.post_tx(&f2, &[5]);
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.peer_frames(), vec![f, f2]);
    assert_eq!(
        h.txq.take_used(&h.mem),
        vec![(u32::from(head), 0), (u32::from(head2), 0)]
    );
    assert_eq!(h.metric(|m| &m.tx_bytes), 3000 + 60);
}

#[test]
fn test_tx_bounce_buffer_matches() {
    let mut h = NetFixture::configured(|c| c.bounce_buffer = true, MRG_FEATURES);
    let f = frame(12 + 1400, 4);
    h.post_tx(&f, &[12, 700]);
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.peer_frames(), vec![f]);
}

#[test]
fn test_tx_eagain_waits_for_epollout() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    // Room for about two frames (the kernel doubles the value; a
    // message larger than the buffer would be refused with EMSGSIZE).
    h.dev().backend().set_send_buffer(40000).unwrap();
    let frames: Vec<Vec<u8>> = (0..8).map(|i| frame(12 + 30000, i)).collect();
    for f in &frames {
        h.post_tx(f, &[12]);
    }
    h.kick_tx();
    h.run_until_idle();
    let first = h.peer_frames();
    assert!(first.len() < 8, "the socket never pushed back");
    assert!(h.metric(|m| &m.tap_eagain) >= 1);
    // Nothing is lost or reordered, and the retry came from EPOLLOUT
    // (no further kick).
    let mut got = first;
    for _ in 0..100 {
        h.run_until_idle();
        got.extend(h.peer_frames());
        if got.len() == 8 {
            break;
        }
    }
    assert_eq!(got, frames);
    assert!(h.metric(|m| &m.tx_eagain_retries) >= 1);
    assert_eq!(h.txq.take_used(&h.mem).len(), 8);
    assert!(!h.dev().active.as_ref().unwrap().tx.is_blocked());
}

/// A short or 0-byte write by the backend (a frame-preserving one took
/// part of a frame) is a dropped frame, not a sent one; its chain comes
/// back like any other.
#[test]
fn test_tx_short_write_is_a_dropped_frame() {
    let (b, peer) = FaultBackend::pair();
    b.script.lock().unwrap().write_fault_at(0, Fault::Short(20));
    b.script.lock().unwrap().write_fault_at(0, Fault::Zero);
    let mem =
        vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
    let mut h = NetFixture::with_backend(b, peer, cfg(), mem);
    h.activate(MRG_FEATURES);
    let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(12 + 100, i)).collect();
    let heads: Vec<(u32, u32)> = frames
        .iter()
        .map(|f| (u32::from(h.post_tx(f, &[12])), 0))
        .collect();
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.txq.take_used(&h.mem), heads);
    assert_eq!(
        h.peer_frames(),
        vec![frames[0][..20].to_vec(), frames[2].clone()]
    );
    assert_eq!(h.metric(|m| &m.tx_frames), 1);
    assert_eq!(h.metric(|m| &m.tx_bytes), 100);
    assert_eq!(h.metric(|m| &m.tx_dropped), 2);
}

/// A backend refusing frame after frame the same way (a TAP set down)
/// is logged once per run of refusals, not once per frame; every frame is
/// counted and its chain returned.
#[test]
fn test_tx_refusals_logged_once_per_run() {
    let (b, peer) = FaultBackend::pair();
    {
        let mut s = b.script.lock().unwrap();
        let eio = Some(Fault::Errno(libc::EIO));
        s.writes.extend(std::iter::repeat_n(eio, 10));
        s.writes.push_back(None);
        s.writes.extend(std::iter::repeat_n(eio, 3));
        s.writes
            .extend(std::iter::repeat_n(Some(Fault::Errno(libc::EINVAL)), 5));
    }
    let mem =
        vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
    let mut h = NetFixture::with_backend(b, peer, cfg(), mem);
    h.activate(MRG_FEATURES);
    let before = test_log::lines().len();
    h.offer_tx_frames(19, 12 + 60);
    h.run_until_idle();
    assert_eq!(h.txq.take_used(&h.mem).len(), 19);
    assert_eq!(h.metric(|m| &m.tx_dropped), 18);
    assert_eq!(h.peer_frames().len(), 1);
    // Runs 1 (EIO) and 2 (EIO after a frame went through) are logged;
    // run 3 (EINVAL) is the third run, which the rate limit skips.
    let lines = test_log::lines()[before..].to_vec();
    assert_eq!(lines.len(), 2, "{lines:#?}");
    assert!(lines.iter().all(|l| l.contains("Input/output error")));
}

// ---- TX malformed chains ----

/// Posts a bad TX chain followed by a good frame; checks the bad one comes
/// back with length 0, is counted, and the device keeps working.
fn check_bad_tx(write: impl FnOnce(&mut NetFixture) -> u16) {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    let bad = write(&mut h);
    let good = frame(100, 9);
    let good_head = h.post_tx(&good, &[]);
    h.kick_tx();
    check_metric_after_block!(h.metrics.malformed_chains, 1, h.run_until_idle());
    assert_eq!(h.peer_frames(), vec![good]);
    assert_eq!(
        h.txq.take_used(&h.mem),
        vec![(u32::from(bad), 0), (u32::from(good_head), 0)]
    );
}

#[test]
fn test_tx_write_only_descriptor() {
    check_bad_tx(|h| {
        h.post_chain_in_buffer(TX_INDEX, 100, &[(0, 12, 0), (12, 88, VIRTQ_DESC_F_WRITE)])
    });
}

#[test]
fn test_tx_outside_memory() {
    check_bad_tx(|h| {
        h.txq
            .post_chain(&h.mem, &[(MEM_SIZE - 10, 100, 0)])
            .unwrap()
    });
    check_bad_tx(|h| h.txq.post_chain(&h.mem, &[(u64::MAX - 5, 100, 0)]).unwrap());
}

#[test]
fn test_tx_shorter_than_header() {
    check_bad_tx(|h| h.post_chain_in_buffer(TX_INDEX, 16, &[(0, 4, 0), (4, 4, 0)]));
}

#[test]
fn test_tx_oversize_frame() {
    check_bad_tx(|h| h.post_chain_in_buffer(TX_INDEX, 70000, &[(0, 12, 0), (12, 65551, 0)]));
}

#[test]
fn test_tx_looping_chain() {
    check_bad_tx(|h| {
        let a = h.alloc(64);
        // The second descriptor points back to the first.
        h.txq
            .post_chain_linked(&h.mem, &[(a, 32, 0), (a + 32, 32, 0)], |head| head)
            .unwrap()
    });
}

#[test]
fn test_tx_next_out_of_range() {
    check_bad_tx(|h| {
        let a = h.alloc(64);
        h.txq
            .post_chain_linked(&h.mem, &[(a, 64, 0)], |_| 9999)
            .unwrap()
    });
}

#[test]
fn test_tx_head_out_of_range_is_skipped() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    // An avail entry naming descriptor 300 of a 256-entry table cannot
    // even be returned; it is counted and skipped.
    h.txq.offer(&h.mem, 300).unwrap();
    let good = frame(100, 9);
    h.post_tx(&good, &[]);
    h.kick_tx();
    check_metric_after_block!(h.metrics.malformed_chains, 1, h.run_until_idle());
    assert_eq!(h.peer_frames(), vec![good]);
}

#[test]
fn test_tx_avail_index_too_far_breaks_only_tx() {
    let mut h = NetFixture::new(cfg(), MRG_FEATURES);
    // avail idx 1000 ahead of next_avail with a 256-entry ring.
    h.mem
        .write_obj(1000u16, GuestAddress(0x80000 + 16 * 256 + 2))
        .unwrap();
    h.kick_tx();
    check_metric_after_block!(h.metrics.queue_errors, 1, h.run_until_idle());
    // The driver is told once that the device needs a reset, even when
    // it keeps kicking the broken queue.
    assert_eq!(h.irq.device_errors.load(Ordering::SeqCst), 1);
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.irq.device_errors.load(Ordering::SeqCst), 1);
    // RX still works.
    h.offer_rx(&[1526]);
    h.deliver(&frame(100, 1));
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
}
