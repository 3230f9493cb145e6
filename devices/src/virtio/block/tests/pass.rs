// SPDX-License-Identifier: Apache-2.0
//! The bounds of a pass, a corrupt ring, and resets with requests in
//! flight.

use std::sync::atomic::Ordering;

use super::fixture::*;
use crate::virtio::block::pass::PASS_REQUESTS;
use crate::virtio::block::{IoEngine, OpKind};
use crate::virtio::queue::MAX_PASS_READS;
use crate::virtio::VirtioDevice;

const SECTOR: usize = 512;

/// An IN of one sector at `sector`, through a one-descriptor indirect table
/// (so thousands fit in the ring).
fn post_small_read(h: &mut BlockFixture, sector: u64) -> Posted {
    h.post(
        &[
            Part::Out(header(VIRTIO_BLK_T_IN, sector)),
            Part::In(512),
            Part::In(1),
        ],
        Layout::Indirect(0),
    )
}

#[test]
fn test_thousands_of_requests_get_bounded_passes_and_all_answers() {
    let data = random_bytes(&mut Rng(9), 64 * SECTOR);
    let mut h = BlockFixture::with_engine(IoEngine::Sync, &data, |c| c.queue_size = 4096);
    let n = 4000;
    let posted: Vec<Posted> = (0..n).map(|i| post_small_read(&mut h, i % 64)).collect();
    h.kick();
    // One loop iteration runs one pass: at most PASS_REQUESTS answered.
    h.run_once(0);
    assert_eq!(h.q.used_idx(&h.mem).unwrap(), PASS_REQUESTS as u16);
    let mut iterations = 1;
    while h.run_once(0) > 0 {
        iterations += 1;
        assert!(iterations < 1000, "never idle");
    }
    let used = h.used();
    assert_eq!(used.len(), n as usize, "every request answered once");
    for (p, &(id, len)) in posted.iter().zip(&used) {
        assert_eq!((id, len), (u32::from(p.head), 513));
        assert_eq!(h.status(p), VIRTIO_BLK_S_OK);
    }
    let sector = |i: usize| (i % 64) * SECTOR;
    for (i, p) in posted.iter().enumerate().step_by(397) {
        assert_eq!(h.read(p.parts[1].0, 512), data[sector(i)..sector(i) + 512]);
    }
    let yields = h.metric(|m| &m.queue.pass_yields);
    assert_eq!(yields, n / u64::from(PASS_REQUESTS), "{yields}");
    assert!(h.metric(|m| &m.queue.max_descs_per_pass) <= u64::from(MAX_PASS_READS));
}

#[test]
fn test_a_flood_of_refused_chains_is_bounded_too() {
    let data = vec![0u8; 8 * SECTOR];
    let mut h = BlockFixture::new(&data, |c| c.io_engine = IoEngine::Sync, BASE_FEATURES);
    let mem = h.mem.clone();
    // 256 heads outside the table, published at once.
    for _ in 0..256 {
        h.q.push_avail(&mem, 0xffff).unwrap();
    }
    h.q.publish(&mem).unwrap();
    h.go();
    assert_eq!(h.metric(|m| &m.malformed_requests), 256);
    assert!(h.used().is_empty());
    // The ring still works.
    let p = h.post_read(0, 512);
    h.go();
    assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 513);
}

#[test]
fn test_a_reset_waits_for_requests_in_flight_and_none_lands_after() {
    let data = random_bytes(&mut Rng(11), 1024 * SECTOR);
    let mut h = BlockFixture::faulty(
        &data,
        |c| {
            c.io_engine = IoEngine::Async;
            c.queue_size = 512;
        },
        BASE_FEATURES,
    );
    assert!(h.dev().uses_io_uring());
    // Each first completion reports a short read: the pass, which answers
    // what completed during its submission, puts the rest of each on the
    // ring again, and that completion waits for the event loop.
    h.dev()
        .backend_mut()
        .inject(OpKind::Read, &[Fault::Short(512); 100]);
    let posted: Vec<Posted> = (0..100).map(|i| h.post_read(i * 8, 4096)).collect();
    h.kick();
    // The pass submits them; reset before the loop reaps a completion.
    h.run_once(0);
    let in_flight = h.dev().engine.as_ref().unwrap().in_flight();
    assert!(in_flight > 0, "nothing was in flight at the reset");
    h.dev().reset();
    assert_eq!(h.dev().engine.as_ref().unwrap().in_flight(), 0);
    let used_idx = h.q.used_idx(&h.mem).unwrap();
    let snapshot: Vec<Vec<u8>> = posted.iter().map(|p| h.read(p.parts[1].0, 4097)).collect();
    for _ in 0..20 {
        h.run_once(5);
    }
    assert_eq!(h.q.used_idx(&h.mem).unwrap(), used_idx, "used after reset");
    for (p, before) in posted.iter().zip(&snapshot) {
        assert_eq!(
            &h.read(p.parts[1].0, 4097),
            before,
            "guest memory written after reset"
        );
    }
    // A new activation starts clean.
    h.activate(BASE_FEATURES);
    assert_eq!(h.read_ok(3, 512), data[3 * SECTOR..4 * SECTOR]);
}

#[test]
fn test_a_full_ring_waits_for_completions_and_loses_nothing() {
    let data = random_bytes(&mut Rng(12), 1024 * SECTOR);
    let mut h = BlockFixture::new(&data, |c| c.io_engine = IoEngine::Async, BASE_FEATURES);
    // More requests than the ring holds (128), through indirect tables.
    let posted: Vec<Posted> = (0..250).map(|i| post_small_read(&mut h, i)).collect();
    h.go();
    let used = h.used();
    assert_eq!(used.len(), 250);
    let mut ids: Vec<u32> = used.iter().map(|u| u.0).collect();
    ids.sort_unstable();
    let mut want: Vec<u32> = posted.iter().map(|p| u32::from(p.head)).collect();
    want.sort_unstable();
    assert_eq!(ids, want);
    for (i, p) in posted.iter().enumerate() {
        assert_eq!(h.status(p), VIRTIO_BLK_S_OK);
        assert_eq!(
            h.read(p.parts[1].0, 512),
            data[i * SECTOR..(i + 1) * SECTOR]
        );
    }
    assert!(h.metric(|m| &m.max_in_flight) <= 128);
}

/// With `Async`, requests the kernel completes inside the submission (reads
/// of a file in the page cache) are answered by the pass that submitted
/// them: one event, one submission, one publication, one interrupt, and the
/// ring is left with nothing to wake the loop for. Data and counters are
/// those of any answer. (Not writes: a file system without non-blocking
/// buffered writes, ext4 among them, hands every write to a kernel worker.)
#[test]
fn test_page_cache_reads_are_answered_in_the_pass_that_submits_them() {
    let data = random_bytes(&mut Rng(13), 64 * SECTOR);
    let mut h = BlockFixture::new(&data, |c| c.io_engine = IoEngine::Async, BASE_FEATURES);
    assert!(h.dev().uses_io_uring());
    let reads: Vec<Posted> = (0..16).map(|i| h.post_read(i * 4, 2048)).collect();
    let passes = h.metric(|m| &m.queue.passes);
    h.kick();
    assert_eq!(h.run_once(0), 1, "one event: the kick");
    let used = h.used();
    assert_eq!(used.len(), 16, "every request answered by the first pass");
    assert_eq!(h.metric(|m| &m.queue.passes), passes + 1);
    assert_eq!(h.metric(|m| &m.ring_submissions), 1);
    assert_eq!(h.metric(|m| &m.queue.interrupts), 1);
    assert_eq!(h.irq.used.load(Ordering::Relaxed), 1);
    assert_eq!(h.dev().engine.as_ref().unwrap().in_flight(), 0);
    assert_eq!(h.run_once(0), 0, "nothing left to wake the loop");
    let mut want: Vec<(u32, u32)> = reads.iter().map(|p| (u32::from(p.head), 2049)).collect();
    let mut got = used;
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
    for (i, p) in reads.iter().enumerate() {
        assert_eq!(h.status(p), VIRTIO_BLK_S_OK);
        let at = i * 4 * SECTOR;
        assert_eq!(h.read(p.parts[1].0, 2048), data[at..at + 2048]);
    }
    assert_eq!(h.metric(|m| &m.read_count), 16);
    assert_eq!(h.metric(|m| &m.read_bytes), 16 * 2048);
}
