// SPDX-License-Identifier: Apache-2.0
//! How passes end and interrupt: the byte and packet weights, interrupt
//! coalescing of re-queued passes, and the time budget.

use super::fixture::*;
use crate::virtio::net::pass::{coalesce_limit, CLOCK_STRIDE};
use crate::virtio::net::NetConfig;

fn cfg() -> NetConfig {
    NetConfig::default()
}

// ---- weights ----

/// One RX buffer and `n` tiny TX frames posted, an RX frame waiting in
/// the backend, both queues kicked, one loop iteration run; returns the
/// TX frames.
fn flood_tx_beside_one_rx_frame(h: &mut NetFixture, n: u8) -> Vec<Vec<u8>> {
    h.post_rx(&[1526]);
    let tx: Vec<Vec<u8>> = (0..n).map(|i| frame(12 + 64, i)).collect();
    for f in &tx {
        h.post_tx(f, &[]);
    }
    h.peer.send(&frame(12 + 100, 0xaa)).unwrap();
    h.kick_rx();
    h.kick_tx();
    h.run_once(0);
    tx
}

#[test]
fn test_tx_packet_weight_lets_rx_run_first() {
    let mut h = NetFixture::configured(|c| c.tx_weight_packets = 4, MRG_FEATURES);
    // One loop iteration: one TX pass of 4 frames, and the RX frame.
    flood_tx_beside_one_rx_frame(&mut h, 10);
    assert_eq!(h.peer_frames().len(), 4);
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 1);
    h.run_once(0);
    assert_eq!(h.peer_frames().len(), 4);
    h.run_until_idle();
    assert_eq!(h.peer_frames().len(), 2);
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 2);
    // The activation pass, then 4 + 4 + 2.
    assert_eq!(h.metric(|m| &m.tx_passes), 4);
}

#[test]
fn test_tx_byte_weight() {
    let mut h = NetFixture::configured(
        |c| {
            c.tx_weight_bytes = 3000;
            c.tx_weight_packets = 0;
        },
        MRG_FEATURES,
    );
    h.offer_tx_frames(10, 1012);
    h.run_once(0);
    // 2 * 1012 < 3000 <= 3 * 1012
    assert_eq!(h.peer_frames().len(), 3);
    h.run_until_idle();
    assert_eq!(h.peer_frames().len(), 7);
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 3);
}

/// 200 TX frames and one kick: one pass sends them all.
fn assert_one_pass_drains_200(mut h: NetFixture) {
    h.offer_tx_frames(200, 100);
    h.run_once(0);
    assert_eq!(h.peer_frames().len(), 200);
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 0);
    assert_eq!(h.metric(|m| &m.time_budget_hits), 0);
    assert_eq!(h.metric(|m| &m.tx_passes), 2); // activation + this one
}

#[test]
fn test_no_weight_drains_in_one_pass() {
    assert_one_pass_drains_200(NetFixture::configured(
        |c| {
            c.tx_weight_bytes = 0;
            c.tx_weight_packets = 0;
        },
        MRG_FEATURES,
    ));
}

#[test]
fn test_rx_packet_weight() {
    let mut h = NetFixture::configured(|c| c.rx_weight_packets = 2, MRG_FEATURES);
    h.offer_rx(&[1526; 8]);
    h.peer_sends(5, 12 + 100);
    h.run_once(0);
    assert_eq!(h.metric(|m| &m.rx_frames), 2);
    assert_eq!(h.metric(|m| &m.rx_weight_hits), 1);
    // While deferred, the backend is not polled for reading; the
    // re-queue event runs the next pass.
    h.run_once(0);
    assert_eq!(h.metric(|m| &m.rx_frames), 4);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_frames), 5);
}

/// `frames` frames of 112 bytes into a device with an RX packet weight
/// of 2 (every pass but the last is cut short and re-queued), run to
/// idle; returns the harness.
fn rx_in_short_passes(features: u64, frames: u8, used_event: Option<u16>) -> NetFixture {
    let mut h = NetFixture::configured(|c| c.rx_weight_packets = 2, features);
    if let Some(e) = used_event {
        h.rxq.set_used_event(&h.mem, e).unwrap();
    }
    h.post_rx(&vec![1526; usize::from(frames)]);
    h.kick_rx();
    h.peer_sends(frames, 12 + 100);
    h
}

#[test]
fn test_a_requeued_pass_leaves_its_interrupt_to_the_next_one() {
    let mut h = rx_in_short_passes(MRG_FEATURES, 5, None);
    h.run_once(0);
    // The entries are published (a polling driver sees them); the
    // interrupt waits for the pass right behind.
    assert_eq!(h.rxq.used_idx(&h.mem).unwrap(), 2);
    assert_eq!(h.metric(|m| &m.interrupts), 0);
    assert_eq!(h.metric(|m| &m.interrupts_coalesced), 1);
    h.run_until_idle();
    assert_eq!(h.rxq.used_idx(&h.mem).unwrap(), 5);
    // One interrupt, from the pass that drained the backend.
    assert_eq!(h.metric(|m| &m.interrupts), 1);
    assert_eq!(h.metric(|m| &m.rx_weight_hits), 2);
}

#[test]
fn test_a_saturated_direction_interrupts_every_64_entries() {
    let mut h = rx_in_short_passes(MRG_FEATURES, 140, None);
    // Where the used index stood at each interrupt, one pass at a time.
    let mut at = Vec::new();
    for _ in 0..1_000 {
        if h.run_once(0) == 0 {
            break;
        }
        if h.metric(|m| &m.interrupts) > at.len() as u64 {
            at.push(h.rxq.used_idx(&h.mem).unwrap());
        }
    }
    assert_eq!(h.rxq.used_idx(&h.mem).unwrap(), 140);
    // After the 32nd pass (64 entries waiting: the limit itself, not one
    // pass more), the 64th (128) and the pass that found the backend empty.
    assert_eq!(at, vec![64, 128, 140]);
    assert_eq!(h.metric(|m| &m.interrupts), 3);
    assert_eq!(h.metric(|m| &m.rx_weight_hits), 70);
}

#[test]
fn test_a_small_ring_waits_for_at_most_a_quarter_of_it() {
    for (ring, limit) in [(1024, 64), (256, 64), (32, 8), (2, 1), (1, 1)] {
        assert_eq!(coalesce_limit(ring), limit, "a ring of {ring}");
    }
}

/// With EVENT_IDX the decision that follows covers every entry since
/// the last one: a `used_event` crossed by a re-queued pass still gets
/// its interrupt, once.
#[test]
fn test_a_deferred_decision_honours_used_event_crossed_meanwhile() {
    for event in [0u16, 1, 3] {
        let mut h = rx_in_short_passes(MRG_FEATURES | RING_EVENT_IDX, 5, Some(event));
        h.run_once(0);
        assert_eq!(h.metric(|m| &m.interrupts), 0, "used_event {event}");
        h.run_until_idle();
        assert_eq!(h.metric(|m| &m.interrupts), 1, "used_event {event}");
    }
    // Not crossed (the driver waits for the 6th entry): none.
    let mut h = rx_in_short_passes(MRG_FEATURES | RING_EVENT_IDX, 5, Some(5));
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.interrupts), 0);
    assert_eq!(h.metric(|m| &m.interrupts_suppressed), 1);
}

#[test]
fn test_rx_byte_weight_runs_tx_between_passes() {
    let mut h = NetFixture::configured(
        |c| {
            c.rx_weight_bytes = 2000;
            c.rx_weight_packets = 0;
        },
        MRG_FEATURES,
    );
    h.offer_rx(&[1526; 8]);
    h.peer_sends(6, 12 + 1000);
    h.run_once(0);
    assert_eq!(h.metric(|m| &m.rx_frames), 2);
    h.post_tx(&frame(100, 1), &[]);
    h.kick_tx();
    h.run_once(0);
    assert_eq!(h.metric(|m| &m.tx_frames), 1);
    assert_eq!(h.metric(|m| &m.rx_frames), 4);
}

// ---- time budget ----

/// A device whose passes end by time only: weights off, a 1 µs budget,
/// which any [`CLOCK_STRIDE`] frames through a socket exceed.
fn timed_only() -> NetConfig {
    NetConfig {
        tx_weight_bytes: 0,
        tx_weight_packets: 0,
        rx_weight_bytes: 0,
        rx_weight_packets: 0,
        pass_time_budget_us: 1,
        ..cfg()
    }
}

#[test]
fn test_tx_time_budget_ends_the_pass_and_lets_rx_run() {
    let mut h = NetFixture::timed(timed_only(), MRG_FEATURES);
    let tx = flood_tx_beside_one_rx_frame(&mut h, 64);
    // The clock is read every CLOCK_STRIDE frames, so the pass ended at
    // one of those looks, long before the ring was empty; RX ran in the
    // same loop iteration.
    let first = h.peer_frames();
    assert!(
        !first.is_empty() && first.len() < tx.len(),
        "{}",
        first.len()
    );
    assert!(
        (first.len() as u64).is_multiple_of(CLOCK_STRIDE),
        "{}",
        first.len()
    );
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    assert!(h.metric(|m| &m.time_budget_hits) >= 1);
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 0);
    assert_eq!(h.metric(|m| &m.desc_budget_hits), 0);
    // Every frame still goes out, in order.
    h.run_until_idle();
    let mut all = first;
    all.extend(h.peer_frames());
    assert_eq!(all, tx);
    assert_eq!(h.txq.take_used(&h.mem).len(), tx.len());
}

#[test]
fn test_rx_time_budget_ends_the_pass() {
    let mut h = NetFixture::timed(timed_only(), MRG_FEATURES);
    h.offer_rx(&[1526; 32]);
    h.peer_sends(16, 12 + 100);
    h.run_once(0);
    let first = h.metric(|m| &m.rx_frames);
    assert!(
        first > 0 && first < 16 && first.is_multiple_of(CLOCK_STRIDE),
        "{first}"
    );
    assert!(h.metric(|m| &m.time_budget_hits) >= 1);
    assert_eq!(h.metric(|m| &m.rx_weight_hits), 0);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_frames), 16);
}

#[test]
fn test_time_budget_not_reached_changes_nothing() {
    // A budget no pass reaches: one pass drains the ring, as without it.
    assert_one_pass_drains_200(NetFixture::timed(
        NetConfig {
            pass_time_budget_us: 60_000_000,
            ..timed_only()
        },
        MRG_FEATURES,
    ));
}

#[test]
fn test_default_config_has_a_time_budget_and_tests_turn_it_off() {
    assert_eq!(
        NetConfig::default().pass_time_budget(),
        Some(std::time::Duration::from_micros(
            crate::virtio::net::DEFAULT_PASS_TIME_BUDGET_US
        ))
    );
    let h = NetFixture::new(cfg(), MRG_FEATURES);
    assert_eq!(h.dev().active.as_ref().unwrap().tx.time_budget, None);
    let h = NetFixture::timed(cfg(), MRG_FEATURES);
    assert!(h.dev().active.as_ref().unwrap().tx.time_budget.is_some());
}
