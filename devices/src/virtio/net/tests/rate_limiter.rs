// SPDX-License-Identifier: Apache-2.0
//! The rate limiters in the datapath, driven through the event
//! loop over a socket pair with real time: short refill times keep every
//! test well under a second.
//!
//! What must hold: a throttled direction holds its frame back without loss
//! (TX: no used entry; RX: the frame stays in the backend), sleeps in epoll
//! until its timer fires (no pass, no event while throttled), never holds up
//! the other direction, composes with the weights, is counted in the
//! metrics, and a reset while throttled leaves nothing stuck.

use std::time::{Duration, Instant};

use event_manager::EventSet;
use vm_memory::GuestAddress;

use super::fixture::*;
use crate::rate_limiter::{RateLimiterConfig, RateLimiterError, TokenBucketConfig};
use crate::virtio::net::{Net, NetConfig, NetError, SeqPacket, RX_INDEX, TX_INDEX};
use crate::virtio::VirtioDevice;

fn bucket(size: u64, refill_ms: u64) -> Option<TokenBucketConfig> {
    Some(TokenBucketConfig {
        size,
        one_time_burst: 0,
        refill_time: refill_ms,
    })
}

fn bw(size: u64, refill_ms: u64) -> RateLimiterConfig {
    RateLimiterConfig {
        bandwidth: bucket(size, refill_ms),
        ops: None,
    }
}

fn ops(size: u64, refill_ms: u64) -> RateLimiterConfig {
    RateLimiterConfig {
        bandwidth: None,
        ops: bucket(size, refill_ms),
    }
}

fn tx_limited(l: RateLimiterConfig) -> NetConfig {
    NetConfig {
        tx_rate_limiter: l,
        ..NetConfig::default()
    }
}

fn rx_limited(l: RateLimiterConfig) -> NetConfig {
    NetConfig {
        rx_rate_limiter: l,
        ..NetConfig::default()
    }
}

/// Runs the loop until `done` holds or 2 s pass; returns the events
/// dispatched. Each iteration sleeps in epoll until something is ready.
fn run_until(h: &mut NetFixture, mut done: impl FnMut(&mut NetFixture) -> bool) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut events = 0;
    while !done(h) {
        assert!(Instant::now() < deadline, "{}", h.metrics.to_json());
        events += h.run_once(50);
    }
    events
}

/// Runs the loop until `n` frames reached the peer; returns them in order
/// with the events dispatched.
fn collect_tx(h: &mut NetFixture, n: usize, mut got: Vec<Vec<u8>>) -> (Vec<Vec<u8>>, usize) {
    let events = run_until(h, |h| {
        got.extend(h.peer_frames());
        got.len() >= n
    });
    (got, events)
}

/// Whether the limiter of queue `dir` is blocked; checks that its timer is
/// registered exactly then.
fn throttled<B: crate::virtio::net::NetBackend + 'static>(h: &NetFixture<B>, dir: usize) -> bool {
    let dev = h.dev();
    let (limiter, registered) = if dir == TX_INDEX {
        (&dev.tx_limiter, dev.registered.tx_timer)
    } else {
        (&dev.rx_limiter, dev.registered.rx_timer)
    };
    let blocked = limiter.as_ref().is_some_and(|l| l.is_blocked());
    assert_eq!(registered, blocked, "timer registered iff throttled");
    blocked
}

fn tx_throttled<B: crate::virtio::net::NetBackend + 'static>(h: &NetFixture<B>) -> bool {
    throttled::<B>(h, TX_INDEX)
}

fn rx_throttled(h: &NetFixture) -> bool {
    throttled::<SeqPacket>(h, RX_INDEX)
}

/// Whether a TX chain is held back by the limiter.
fn tx_chain_pending(h: &NetFixture) -> bool {
    h.dev().active.as_ref().is_some_and(|a| a.tx.is_throttled())
}

/// A device allowed one TX frame per `period_ms` that has sent the first of
/// two frames and holds the second back.
fn tx_second_frame_held(period_ms: u64) -> NetFixture {
    let mut h = NetFixture::new(tx_limited(ops(1, period_ms)), MRG_FEATURES);
    h.post_tx(&frame(12 + 64, 1), &[]);
    h.post_tx(&frame(12 + 64, 2), &[]);
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.peer_frames().len(), 1);
    assert!(tx_throttled(&h));
    h
}

/// A device allowed one RX frame per `period_ms`, with `bufs` buffers
/// posted, that has delivered the first of two frames and leaves the
/// second in the backend.
fn rx_second_frame_held(period_ms: u64, bufs: usize) -> NetFixture {
    let mut h = NetFixture::new(rx_limited(ops(1, period_ms)), MRG_FEATURES);
    h.post_rx(&vec![1526; bufs]);
    h.kick_rx();
    h.peer.send(&frame(12 + 64, 1)).unwrap();
    h.deliver(&frame(12 + 64, 2));
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    assert!(rx_throttled(&h));
    h
}

#[test]
fn test_tx_bandwidth_limit_keeps_the_chain_until_the_timer() {
    // 10,000 bytes per 100 ms: 100 bytes per ms, a 1000-byte frame per 10 ms.
    let mut h = NetFixture::new(tx_limited(bw(10_000, 100)), MRG_FEATURES);
    let frames: Vec<Vec<u8>> = (0..20).map(|i| frame(12 + 1000, i)).collect();
    let heads: Vec<u16> = frames.iter().map(|f| h.post_tx(f, &[12])).collect();
    let start = Instant::now();
    h.kick_tx();
    h.run_until_idle();
    // The full bucket pays for 10 frames; the 11th waits in the device
    // with no used entry, and the backend is not polled for writing.
    let first = h.peer_frames();
    assert_eq!(first.len(), 10);
    assert_eq!(h.txq.take_used(&h.mem).len(), 10);
    assert!(tx_throttled(&h) && tx_chain_pending(&h));
    assert_eq!(h.metric(|m| &m.tx_rate_limiter_throttled), 1);
    assert_eq!(h.dev().registered.backend, Some(EventSet::IN));
    assert!(h.metrics.tx_throttled_ns.is_running());

    // No kick from here on: the timer alone moves the rest, in order.
    let (got, _) = collect_tx(&mut h, 20, first);
    let elapsed = start.elapsed();
    assert_eq!(got, frames);
    let used: Vec<u32> = h.txq.take_used(&h.mem).iter().map(|u| u.0).collect();
    let want: Vec<u32> = heads[10..].iter().map(|&x| u32::from(x)).collect();
    assert_eq!(used, want);
    // 10 more frames of 1000 bytes at 100 bytes per ms: 100 ms at least
    // (a timerfd never fires early).
    assert!(elapsed >= Duration::from_millis(99), "{elapsed:?}");
    // One wait per frame (each waits 10 ms, longer than the 1 ms minimum).
    let throttled = h.metric(|m| &m.tx_rate_limiter_throttled);
    assert!((2..=10).contains(&throttled), "{throttled}");
    let ns = h.metrics.tx_throttled_ns.ended_ns();
    assert!(ns >= 50_000_000 && ns <= elapsed.as_nanos() as u64, "{ns}");
    assert!(!tx_throttled(&h) && !tx_chain_pending(&h));
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 0);
    assert_eq!(h.metric(|m| &m.tap_eagain), 0);
}

#[test]
fn test_tx_ops_limit_sleeps_between_frames() {
    // 3 frames per 30 ms: one every 10 ms once the bucket is spent.
    let mut h = NetFixture::new(tx_limited(ops(3, 30)), MRG_FEATURES);
    let frames: Vec<Vec<u8>> = (0..8).map(|i| frame(12 + 64, i)).collect();
    for f in &frames {
        h.post_tx(f, &[]);
    }
    let start = Instant::now();
    h.kick_tx();
    h.run_until_idle();
    let first = h.peer_frames();
    assert_eq!(first.len(), 3);
    let passes = h.metric(|m| &m.tx_passes);
    let (got, events) = collect_tx(&mut h, 8, first);
    assert!(start.elapsed() >= Duration::from_millis(49));
    assert_eq!(got, frames);
    // Each of the 5 frames cost one timer event and one pass: no spinning.
    assert!(events <= 7, "{events} events for 5 frames");
    assert!(h.metric(|m| &m.tx_passes) - passes <= 7);
}

#[test]
fn test_rx_bandwidth_limit_stops_reading_the_backend() {
    // 2500 bytes per 25 ms: 100 bytes per ms.
    let mut h = NetFixture::new(rx_limited(bw(2500, 25)), MRG_FEATURES);
    let bufs = h.offer_rx(&[1526; 8]);
    let frames: Vec<Vec<u8>> = (0..6).map(|i| frame(12 + 1000, i)).collect();
    for f in &frames {
        h.peer.send(f).unwrap();
    }
    let start = Instant::now();
    h.run_until_idle();
    // The third frame is admitted on the 500 bytes left and leaves a debt
    // of 500 (5 ms): the fourth is not read, and the backend fd is out of
    // the epoll set.
    assert_eq!(h.metric(|m| &m.rx_frames), 3);
    assert!(rx_throttled(&h));
    assert_eq!(h.dev().registered.backend, None);
    assert_eq!(h.metric(|m| &m.rx_rate_limiter_throttled), 1);
    assert_eq!(h.metric(|m| &m.rx_dropped), 0);

    run_until(&mut h, |h| h.metric(|m| &m.rx_frames) == 6);
    // Each of the last three waits for the debt of the one before: 5, 10
    // and 10 ms.
    let elapsed = start.elapsed();
    assert!(elapsed >= Duration::from_millis(24), "{elapsed:?}");
    let used = h.rxq.take_used(&h.mem);
    assert_eq!(used.len(), 6);
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(used[i], (u32::from(bufs[i].0), 1012));
        assert_eq!(h.read(bufs[i].1 + 12, 1000), f[12..]);
    }
    assert_eq!(h.metric(|m| &m.rx_weight_hits), 0);
    assert!(h.metrics.rx_throttled_ns.total_ns() >= 10_000_000);
}

#[test]
fn test_rx_ops_limit() {
    // 2 frames per 20 ms: one every 10 ms once the bucket is spent.
    let mut h = NetFixture::new(rx_limited(ops(2, 20)), MRG_FEATURES);
    h.offer_rx(&[1526; 8]);
    h.peer_sends(5, 12 + 64);
    let start = Instant::now();
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_frames), 2);
    let passes = h.metric(|m| &m.rx_passes);
    let events = run_until(&mut h, |h| h.metric(|m| &m.rx_frames) == 5);
    assert!(start.elapsed() >= Duration::from_millis(29));
    assert!(events <= 5, "{events} events for 3 frames");
    assert!(h.metric(|m| &m.rx_passes) - passes <= 5);
    assert!((1..=4).contains(&h.metric(|m| &m.rx_rate_limiter_throttled)));
}

#[test]
fn test_throttled_tx_neither_spins_nor_blocks_rx() {
    // One frame, then the next token is 10 s away.
    let mut h = NetFixture::new(tx_limited(ops(1, 10_000)), MRG_FEATURES);
    h.offer_tx_frames(3, 12 + 64);
    h.run_until_idle();
    assert_eq!(h.peer_frames().len(), 1);
    assert!(tx_throttled(&h));
    // The loop sleeps: nothing is ready for 100 ms.
    let passes = h.metric(|m| &m.tx_passes);
    assert_eq!(h.run_once(100), 0);
    // A kick is drained without a pass.
    h.post_tx(&frame(12 + 64, 3), &[]);
    h.kick_tx();
    assert_eq!(h.run_until_idle(), 1);
    assert_eq!(h.metric(|m| &m.tx_passes), passes);
    assert!(h.peer_frames().is_empty());

    // RX runs as usual meanwhile.
    h.offer_rx(&[1526; 5]);
    h.peer_sends(5, 12 + 100);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_frames), 5);
    assert!(tx_throttled(&h));
    assert_eq!(h.txq.take_used(&h.mem).len(), 1);
}

/// Chains the backend pushed back (EAGAIN) and a chain the limiter holds
/// back, at once: the loop sleeps until the limiter's timer, although the
/// backend is writable, then sends everything in order. (It spun on
/// EPOLLOUT with no pass to run, about 500 iterations a millisecond:
/// found by the net_datapath fuzz target.)
#[test]
fn test_tx_pushed_back_and_throttled_sleeps_until_the_timer() {
    let (b, peer) = FaultBackend::pair();
    let mem =
        vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
    // Two frames' worth of ops, refilled over a second (one op each 500 ms).
    let mut h = NetFixture::with_backend(b, peer, tx_limited(ops(2, 1000)), mem);
    h.activate(MRG_FEATURES);
    // The second write is pushed back.
    h.dev()
        .backend()
        .script
        .lock()
        .unwrap()
        .write_fault_at(1, Fault::Errno(libc::EAGAIN));
    let frames: Vec<Vec<u8>> = (0..3).map(|i| frame(12 + 64, i)).collect();
    for f in &frames {
        h.post_tx(f, &[]);
    }
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.peer_frames(), frames[..1]);
    assert!(tx_throttled(&h));
    assert_eq!(h.metric(|m| &m.tap_eagain), 1);
    // Writable backend, throttled TX: nothing to do for 100 ms, unless the
    // test thread was kept off the CPU until the refill was due (a loaded
    // host), when the timer's wake-up is the right one.
    let throttled = Instant::now();
    let woke = h.run_once(100);
    if woke == 0 {
        assert!(throttled.elapsed() >= Duration::from_millis(90));
    } else {
        assert!(
            throttled.elapsed() >= Duration::from_millis(400),
            "the loop woke with nothing to do after {:?}",
            throttled.elapsed()
        );
    }
    // The timer: the pushed-back chain, then the held-back one, in order.
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.metric(|m| &m.tx_frames) < 3 && Instant::now() < deadline {
        h.run_once(50);
    }
    assert_eq!(h.peer_frames(), frames[1..]);
    assert_eq!(h.txq.take_used(&h.mem).len(), 3);
}

#[test]
fn test_throttled_rx_neither_spins_nor_blocks_tx() {
    let mut h = NetFixture::new(rx_limited(ops(1, 10_000)), MRG_FEATURES);
    h.offer_rx(&[1526; 4]);
    h.peer_sends(3, 12 + 100);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    assert!(rx_throttled(&h));
    // Frames wait in the backend, yet the loop sleeps: the fd is not polled.
    let passes = h.metric(|m| &m.rx_passes);
    assert_eq!(h.run_once(100), 0);
    // New buffers and their kick start no pass either.
    h.offer_rx(&[1526; 4]);
    h.run_until_idle();
    assert_eq!(h.metric(|m| &m.rx_passes), passes);

    // TX runs as usual meanwhile.
    let frames: Vec<Vec<u8>> = (0..5).map(|i| frame(12 + 200, i)).collect();
    for f in &frames {
        h.post_tx(f, &[]);
    }
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.peer_frames(), frames);
    assert_eq!(h.metric(|m| &m.rx_frames), 1);
    assert!(rx_throttled(&h));
}

#[test]
fn test_the_timer_alone_wakes_the_device() {
    // TX: one frame per 50 ms.
    let mut h = tx_second_frame_held(50);
    let start = Instant::now();
    // One event, the timer, about 50 ms later; it sends the frame.
    assert_eq!(h.run_once(1000), 1);
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(40), "{waited:?}");
    assert!(waited < Duration::from_millis(900), "{waited:?}");
    assert_eq!(h.peer_frames(), vec![frame(12 + 64, 2)]);
    assert!(!tx_throttled(&h));

    // RX likewise: the second frame is read when the timer fires.
    let mut h = rx_second_frame_held(50, 3);
    let start = Instant::now();
    assert_eq!(h.run_once(1000), 1);
    assert!(start.elapsed() >= Duration::from_millis(40));
    assert_eq!(h.metric(|m| &m.rx_frames), 2);
    // RX cannot tell an empty backend without reading it: the next read
    // waits for a token too, and finding nothing, polls the backend again.
    assert!(rx_throttled(&h));
    assert_eq!(h.run_once(1000), 1);
    assert_eq!(h.metric(|m| &m.rx_frames), 2);
    assert!(!rx_throttled(&h));
    assert_eq!(h.dev().registered.backend, Some(EventSet::IN));
    assert_eq!(h.run_once(50), 0);
}

#[test]
fn test_metrics_show_throttling_in_progress_and_done() {
    let mut h = tx_second_frame_held(60);
    std::thread::sleep(Duration::from_millis(20));
    // A metrics line written now already counts the wait in progress.
    let json = h.metrics.to_json();
    assert_eq!(json["tx_rate_limiter_throttled"], 1);
    assert!(json["tx_throttled_ns"].as_u64().unwrap() >= 20_000_000);
    assert_eq!(json["rx_rate_limiter_throttled"], 0);
    assert_eq!(json["rx_throttled_ns"], 0);
    run_until(&mut h, |h| h.metric(|m| &m.tx_frames) == 2);
    let json = h.metrics.to_json();
    assert_eq!(json["tx_rate_limiter_throttled"], 1);
    let ns = json["tx_throttled_ns"].as_u64().unwrap();
    assert!(ns >= 50_000_000, "{ns}");
    assert!(!h.metrics.tx_throttled_ns.is_running());
}

#[test]
fn test_throttling_counts_no_weight_hit() {
    // Weight 4 frames per pass, 6 frames in the bucket, then 1 per second.
    let mut h = NetFixture::configured(
        |c| {
            c.tx_weight_packets = 4;
            c.tx_rate_limiter = ops(6, 6000);
        },
        MRG_FEATURES,
    );
    h.offer_tx_frames(10, 12 + 64);
    h.run_once(0);
    assert_eq!(h.peer_frames().len(), 4);
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 1);
    h.run_until_idle();
    // The re-queued pass sent 2 and was throttled: no second weight hit.
    assert_eq!(h.peer_frames().len(), 2);
    assert_eq!(h.metric(|m| &m.tx_weight_hits), 1);
    assert_eq!(h.metric(|m| &m.desc_budget_hits), 0);
    assert_eq!(h.metric(|m| &m.tx_rate_limiter_throttled), 1);
    assert!(tx_throttled(&h));
}

#[test]
fn test_tx_reset_while_throttled_leaves_nothing_stuck() {
    let mut h = tx_second_frame_held(50);

    h.dev().reset();
    h.run_until_idle();
    // The queues are gone, the armed timer stays registered.
    assert!(!h.dev().registered.queues);
    assert!(h.dev().registered.tx_timer);

    // The driver starts over; its frames go once the limiter allows.
    h.rxq = DriverQueue::packed(&h.mem, GuestAddress(0x10000), 256);
    h.txq = DriverQueue::packed(&h.mem, GuestAddress(0x80000), 256);
    h.activate(MRG_FEATURES);
    let new: Vec<Vec<u8>> = (3..5).map(|i| frame(12 + 64, i)).collect();
    for f in &new {
        h.post_tx(f, &[]);
    }
    h.kick_tx();
    let (got, _) = collect_tx(&mut h, 2, Vec::new());
    // The chain held back before the reset belonged to the old rings.
    assert_eq!(got, new);
    assert_eq!(h.txq.take_used(&h.mem).len(), 2);
    run_until(&mut h, |h| !tx_throttled(h));
    assert!(!h.metrics.tx_throttled_ns.is_running());
    assert_eq!(h.run_once(100), 0);
}

#[test]
fn test_rx_reset_while_throttled_leaves_nothing_stuck() {
    let mut h = rx_second_frame_held(50, 2);

    h.dev().reset();
    h.run_until_idle();
    assert!(h.dev().registered.rx_timer);
    h.rxq = DriverQueue::packed(&h.mem, GuestAddress(0x10000), 256);
    h.txq = DriverQueue::packed(&h.mem, GuestAddress(0x80000), 256);
    h.activate(MRG_FEATURES);
    let bufs = h.offer_rx(&[1526; 3]);
    // The frame that waited in the backend arrives into the new rings.
    run_until(&mut h, |h| h.metric(|m| &m.rx_frames) == 2);
    assert_eq!(h.rxq.take_used(&h.mem), vec![(u32::from(bufs[0].0), 76)]);
    assert_eq!(h.read(bufs[0].1 + 12, 64), frame(12 + 64, 2)[12..]);
    run_until(&mut h, |h| !rx_throttled(h));
    assert_eq!(h.dev().registered.backend, Some(EventSet::IN));
    assert!(!h.metrics.rx_throttled_ns.is_running());
}

/// Epoll refusing a throttled direction's timer (here: told the timer is not
/// registered, it registers it again and gets EEXIST) makes the limiter give
/// its wait up, and re-queues that direction's pass, not the other's, to
/// retry the held frame.
#[test]
fn test_a_refused_timer_requeues_its_own_direction() {
    for dir in [RX_INDEX, TX_INDEX] {
        let mut h = if dir == RX_INDEX {
            rx_second_frame_held(300, 2)
        } else {
            tx_second_frame_held(300)
        };
        let errors = h.metric(|m| &m.host_errors);
        {
            let mut dev = h.dev();
            let timer = if dir == RX_INDEX {
                &mut dev.registered.rx_timer
            } else {
                &mut dev.registered.tx_timer
            };
            *timer = false;
        }
        // A kick starts no pass while throttled; the registrations are
        // brought in line after it.
        if dir == RX_INDEX {
            h.kick_rx();
        } else {
            h.kick_tx();
        }
        h.run_once(0);
        assert_eq!(h.metric(|m| &m.host_errors), errors + 1, "dir {dir}");
        let dev = h.dev();
        let requeued = (dev.registered.rx_requeued, dev.registered.tx_requeued);
        assert_eq!(requeued, (dir == RX_INDEX, dir == TX_INDEX), "dir {dir}");
    }
}

#[test]
fn test_limiter_configuration() {
    let mem = || vm_memory::GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
    let (a, _b) = SeqPacket::pair().unwrap();
    let Err(err) = Net::with_backend(a, tx_limited(ops(10, 0)), mem()) else {
        panic!("a zero refill time was accepted");
    };
    assert!(matches!(
        err,
        NetError::RateLimiter("TX", RateLimiterError::ZeroRefillTime("ops"))
    ));
    assert_eq!(err.to_string(), "TX rate limiter");
    // Unlimited directions own no limiter and no timerfd.
    let (a, _b) = SeqPacket::pair().unwrap();
    let n = Net::with_backend(a, rx_limited(bw(1000, 10)), mem()).unwrap();
    assert!(n.rx_limiter.is_some() && n.tx_limiter.is_none());
    assert_eq!(n.device_type(), 1);
}

#[test]
fn test_a_live_limit_change_sends_the_held_frame_first_and_at_once() {
    // One frame per 10 s: the second frame would wait 10 s.
    let mut h = tx_second_frame_held(10_000);
    let third = frame(12 + 64, 3);
    h.post_tx(&third, &[]);
    let start = Instant::now();
    h.dev()
        .set_rate_limits(None, Some(&RateLimiterConfig::default()))
        .expect("unlimited");
    // No kick: the limiter's timer, re-armed by the change, moves the held
    // frame, and the frame behind it follows in order.
    let (got, _) = collect_tx(&mut h, 2, Vec::new());
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(got, vec![frame(12 + 64, 2), third]);
    assert!(!tx_throttled(&h));
    assert_eq!(h.dev().cfg.tx_rate_limiter, RateLimiterConfig::default());
}

#[test]
fn test_a_live_limit_on_an_unlimited_device_takes_effect() {
    let mut h = NetFixture::new(NetConfig::default(), MRG_FEATURES);
    assert!(h.dev().tx_limiter.is_none());
    h.dev()
        .set_rate_limits(None, Some(&ops(1, 10_000)))
        .expect("limited");
    h.post_tx(&frame(12 + 64, 1), &[]);
    h.post_tx(&frame(12 + 64, 2), &[]);
    h.kick_tx();
    h.run_until_idle();
    assert_eq!(h.peer_frames(), vec![frame(12 + 64, 1)]);
    assert!(tx_throttled(&h) && tx_chain_pending(&h));
    assert_eq!(h.dev().cfg.tx_rate_limiter, ops(1, 10_000));
}

#[test]
fn test_a_live_rx_limit_change_reads_the_held_frame_at_once() {
    let mut h = rx_second_frame_held(10_000, 4);
    let start = Instant::now();
    h.dev()
        .set_rate_limits(Some(&bw(1_000_000, 100)), None)
        .expect("looser");
    run_until(&mut h, |h| h.metric(|m| &m.rx_frames) == 2);
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(!rx_throttled(&h));
    // The new RX limit is in force; TX, not named, stays unlimited.
    assert_eq!(
        h.dev().rate_limits(),
        (bw(1_000_000, 100), RateLimiterConfig::default())
    );
}

#[test]
fn test_a_bad_live_limit_changes_nothing() {
    let mut h = tx_second_frame_held(10_000);
    let bad = RateLimiterConfig {
        bandwidth: bucket(0, 100),
        ops: None,
    };
    let e = h
        .dev()
        .set_rate_limits(Some(&ops(5, 100)), Some(&bad))
        .expect_err("size 0");
    assert!(matches!(e, NetError::RateLimiter(..)), "{e}");
    // Neither direction changed, the held frame still waits.
    assert_eq!(h.dev().cfg.tx_rate_limiter, ops(1, 10_000));
    assert_eq!(h.dev().cfg.rx_rate_limiter, RateLimiterConfig::default());
    assert!(h.dev().rx_limiter.is_none());
    h.run_once(50);
    assert!(h.peer_frames().is_empty());
    assert!(tx_throttled(&h) && tx_chain_pending(&h));
}

#[test]
fn test_a_restored_card_resumes_its_buckets() {
    // One TX frame per minute, spent; a restored card must not send the
    // next frame at once, as a card with full buckets would.
    let h = tx_second_frame_held(60_000);
    let state = h.dev().save_state();
    let saved: serde_json::Value = state.clone();
    assert_eq!(saved["tx_rate_limiter"]["ops"]["budget"], 0);
    assert!(saved["rx_rate_limiter"]["ops"].is_null());

    let mut restored = NetFixture::new_inactive(tx_limited(ops(1, 60_000)));
    restored.dev().restore_state(&state).expect("restores");
    restored.activate(MRG_FEATURES);
    restored.post_tx(&frame(12 + 64, 3), &[]);
    restored.kick_tx();
    restored.run_until_idle();
    assert!(
        restored.peer_frames().is_empty(),
        "the spent token came back"
    );
    assert!(tx_throttled(&restored) && tx_chain_pending(&restored));

    // A card restored from a fresh card's state sends at once.
    let fresh = NetFixture::new_inactive(tx_limited(ops(1, 60_000)));
    let full = fresh.dev().save_state();
    let mut other = NetFixture::new_inactive(tx_limited(ops(1, 60_000)));
    other.dev().restore_state(&full).expect("restores");
    other.activate(MRG_FEATURES);
    other.post_tx(&frame(12 + 64, 4), &[]);
    other.kick_tx();
    other.run_until_idle();
    assert_eq!(other.peer_frames().len(), 1);
}

#[test]
fn test_a_forged_card_state_is_refused_and_changes_nothing() {
    let h = tx_second_frame_held(60_000);
    let good = h.dev().save_state();
    let same = || NetFixture::new_inactive(tx_limited(ops(1, 60_000)));
    // Another configuration's card: its RX bucket is not in the state.
    let other = || {
        NetFixture::new_inactive(NetConfig {
            rx_rate_limiter: bw(1000, 100),
            ..tx_limited(ops(1, 60_000))
        })
    };
    let mut forged = good.clone();
    forged["tx_rate_limiter"]["ops"]["budget"] = 2.into();
    let mut extra = good.clone();
    extra["mmds"] = 1.into();
    // A valid RX half does not go in when the TX half is refused.
    let mut half = other().dev().save_state();
    half["rx_rate_limiter"]["bandwidth"]["budget"] = 500.into();
    half["tx_rate_limiter"]["ops"]["budget"] = 2.into();
    let cases = [
        (
            same(),
            forged,
            "tx_rate_limiter: the saved ops bucket holds 2 tokens",
        ),
        (
            other(),
            half,
            "tx_rate_limiter: the saved ops bucket holds 2 tokens",
        ),
        (
            other(),
            good.clone(),
            "rx_rate_limiter: the configuration has a bandwidth bucket",
        ),
        (
            same(),
            serde_json::Value::Null,
            "invalid saved device state",
        ),
        (same(), extra, "unknown field"),
    ];
    for (target, state, want) in cases {
        let before = target.dev().save_state();
        let err = target.dev().restore_state(&state).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
        assert!(!err.contains('\n'));
        assert_eq!(
            target.dev().save_state(),
            before,
            "a refusal changed {want}"
        );
    }
}
