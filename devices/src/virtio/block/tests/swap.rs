// SPDX-License-Identifier: Apache-2.0
//! The image replaced while the device runs (`Block::swap_backend`), the
//! same image grown or shrunk (`Block::resize`), and the rate limits
//! changed (`Block::set_rate_limiter`), seen from the driver's side: the
//! capacity in the configuration space, ConfigGeneration, the
//! configuration-change interrupt, and what requests read and write.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::fixture::*;
use crate::rate_limiter::RateLimiterConfig;
use crate::virtio::block::backend::{DiskInfo, FileBackend};
use crate::virtio::block::device::config_offsets;
use crate::virtio::block::device::features::{VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES};
use crate::virtio::block::CacheType;
use crate::virtio::block::{BlockError, IoEngine};
use crate::virtio::{VirtioDevice, VIRTIO_MMIO_INT_CONFIG};

const SECTOR: usize = 512;

/// The capacity field, as the device's configuration space holds it.
fn capacity<B: crate::virtio::block::BlockBackend + 'static>(h: &BlockFixture<B>) -> u64 {
    let mut b = [0u8; 8];
    h.dev().read_config(config_offsets::CAPACITY as u64, &mut b);
    u64::from_le_bytes(b)
}

#[test]
fn test_a_new_image_reaches_the_driver_through_the_transport() {
    let dir = TempDir::new();
    let old = random_bytes(&mut Rng(41), 32 * SECTOR);
    let new = random_bytes(&mut Rng(42), 96 * SECTOR);
    let old_path = dir.file("old.img", &old);
    let new_path = dir.file("new.img", &new);
    let mut f = mmio_rig("swap0", &old_path);
    f.init();
    const GENERATION: u64 = 0xfc;
    assert_eq!(f.capacity(), 32);
    assert_eq!(f.drv.read_reg(GENERATION), 0);
    assert_eq!(f.drv.interrupt_status() & VIRTIO_MMIO_INT_CONFIG, 0);
    f.drv.take_irq_count();

    let backend = FileBackend::open(&new_path, false).unwrap();
    f.dev().swap_backend(backend, new_path.clone()).unwrap();
    // What the guest's driver sees: an interrupt whose status says the
    // configuration changed, a new generation, the new capacity.
    assert!(f.drv.take_irq_count() >= 1, "no interrupt");
    assert_eq!(
        f.drv.interrupt_status() & VIRTIO_MMIO_INT_CONFIG,
        VIRTIO_MMIO_INT_CONFIG
    );
    assert_eq!(f.drv.read_reg(GENERATION), 1);
    assert_eq!(f.capacity(), 96);
    f.drv.ack_interrupt(VIRTIO_MMIO_INT_CONFIG);
    assert_eq!(f.drv.interrupt_status() & VIRTIO_MMIO_INT_CONFIG, 0);
    assert_eq!(f.dev().config().path, new_path);
    assert_eq!(f.dev().capacity(), 96);

    // A read past the old end, and one of the first sectors: the new bytes.
    for sector in [60u64, 0] {
        let (buf, st) = f.submit_read(sector, 1024);
        let used = f.wait_used();
        assert_eq!(used.len(), 1, "sector {sector}");
        assert_eq!(f.drv.read_mem(st, 1).unwrap(), [VIRTIO_BLK_S_OK]);
        let at = sector as usize * SECTOR;
        assert_eq!(f.drv.read_mem(buf, 1024).unwrap(), new[at..at + 1024]);
    }
    // The old image's lock went with it; the new one is held.
    assert!(FileBackend::open(&old_path, false).is_ok());
    assert!(matches!(
        FileBackend::open(&new_path, false),
        Err(BlockError::Locked(_))
    ));
    assert_eq!(std::fs::read(&old_path).unwrap(), old);
}

#[test]
fn test_an_image_opened_unlocked_says_which_file_it_is_and_how_big() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new();
    let path = dir.file("d.img", &[0u8; 3 * SECTOR]);
    let link = dir.0.join("link.img");
    std::fs::hard_link(&path, &link).unwrap();
    let meta = std::fs::metadata(&path).unwrap();
    let unlocked = FileBackend::open_unlocked(&path, false).unwrap();
    assert_eq!(unlocked.size(), 3 * SECTOR as u64);
    let id = unlocked.id();
    assert_eq!((id.dev, id.ino), (meta.dev(), meta.ino()));
    // A hard link is the same file; the lock carries the id along.
    assert_eq!(FileBackend::open_unlocked(&link, true).unwrap().id(), id);
    let locked = unlocked.lock().unwrap();
    assert_eq!(locked.id(), id);
    let other = dir.file("e.img", &[0u8; SECTOR]);
    assert_ne!(FileBackend::open(&other, false).unwrap().id(), id);
    // Not locked until asked: a second open succeeds, its lock does not.
    let second = FileBackend::open_unlocked(&link, false).unwrap();
    assert!(matches!(second.lock(), Err(BlockError::Locked(p)) if p == link));
}

#[test]
fn test_a_read_only_drive_keeps_refusing_writes_on_its_new_image() {
    for engine in [IoEngine::Sync, IoEngine::Async] {
        let old = random_bytes(&mut Rng(43), 16 * SECTOR);
        let new = random_bytes(&mut Rng(44), 48 * SECTOR);
        let mut h = BlockFixture::with_engine(engine, &old, |c| c.read_only = true);
        let new_path = h.dir.file("new.img", &new);
        let backend = FileBackend::open(&new_path, true).unwrap();
        h.dev().swap_backend(backend, new_path.clone()).unwrap();
        assert_eq!(h.irq.config.load(Ordering::SeqCst), 1, "{engine:?}");
        assert_eq!(capacity(&h), 48);
        let w = h.post_write(40, &[7; 512]);
        h.go();
        assert_answer(&mut h, &w, VIRTIO_BLK_S_IOERR, 1);
        assert_eq!(h.metric(|m| &m.read_only_refusals), 1);
        assert_eq!(std::fs::read(&new_path).unwrap(), new);
        assert_eq!(h.read_ok(40, 1024), new[40 * SECTOR..42 * SECTOR]);
        // A read-only image is shared: readers may open it, writers not.
        assert!(FileBackend::open(&new_path, true).is_ok());
        assert!(matches!(
            FileBackend::open(&new_path, false),
            Err(BlockError::Locked(_))
        ));
    }
}

#[test]
fn test_requests_in_flight_complete_on_the_old_image_before_the_swap() {
    let old = random_bytes(&mut Rng(45), 1024 * SECTOR);
    let new = random_bytes(&mut Rng(46), 1024 * SECTOR);
    let mut h = BlockFixture::with_engine(IoEngine::Async, &old, |c| {
        c.cache_type = CacheType::Writeback;
        c.queue_size = 512;
    });
    assert!(h.dev().uses_io_uring());
    // Writes and a FLUSH behind them: page-cache I/O may complete inside
    // the submission (the pass answers it at once), but an fdatasync always
    // goes to io_uring's workers, so the FLUSH at least is still in flight
    // when the pass ends.
    // A worker can finish the FLUSH before the pass looks (a loaded
    // machine deschedules the loop thread between submission and reaping),
    // so the batch is posted again until one is caught in flight; every
    // round writes the same bytes to the same sectors.
    let data = |i: u64| vec![(i as u8).wrapping_mul(37) | 1; 4096];
    let mut posted: Vec<Posted> = Vec::new();
    let mut rounds = 0;
    loop {
        rounds += 1;
        assert!(
            rounds <= 50,
            "nothing was in flight at the swap in 50 rounds"
        );
        posted.extend((0..100).map(|i| h.post_write(i * 8, &data(i))));
        posted.push(h.post_bare(VIRTIO_BLK_T_FLUSH, 0));
        h.kick();
        // The pass submits them; the swap comes before the loop reaps any.
        h.run_once(0);
        if h.dev().engine.as_ref().unwrap().in_flight() > 0 {
            break;
        }
        h.run_until_idle();
    }
    let new_path = h.dir.file("new.img", &new);
    let backend = FileBackend::open(&new_path, false).unwrap();
    h.dev().swap_backend(backend, new_path).unwrap();
    // Every one was answered by the time the swap returned, on the old
    // image.
    assert_eq!(h.dev().engine.as_ref().unwrap().in_flight(), 0);
    let used = h.used();
    assert_eq!(used.len(), 101 * rounds);
    for p in &posted {
        assert_eq!(h.status(p), VIRTIO_BLK_S_OK);
    }
    let mut want = old.clone();
    for i in 0..100u64 {
        let at = (i * 8) as usize * SECTOR;
        want[at..at + 4096].copy_from_slice(&data(i));
    }
    assert_eq!(
        h.image(),
        want,
        "the writes in flight reached the old image"
    );
    // Later requests go to the new image, through the same ring.
    h.run_until_idle();
    let w = h.post_write(5, &[0x5a; 1024]);
    let r = h.post_read(700, 512);
    h.go();
    assert_eq!(h.used().len(), 2);
    assert_eq!(h.status(&w), VIRTIO_BLK_S_OK);
    assert_eq!(h.status(&r), VIRTIO_BLK_S_OK);
    assert_eq!(h.read(r.parts[1].0, 512), new[700 * SECTOR..701 * SECTOR]);
    let on_disk = std::fs::read(h.dir.0.join("new.img")).unwrap();
    assert_eq!(on_disk[5 * SECTOR..7 * SECTOR], [0x5a; 1024]);
    assert_eq!(h.image(), want, "the old image was written after the swap");
}

#[test]
fn test_a_new_image_that_cannot_do_what_was_offered_is_refused_and_nothing_changes() {
    let old = random_bytes(&mut Rng(47), 16 * SECTOR);
    let mut h = BlockFixture::new(&old, |c| c.io_engine = IoEngine::Sync, BASE_FEATURES);
    let offered = h.dev().avail_features();
    if offered & bit(VIRTIO_BLK_F_DISCARD) == 0 {
        eprintln!("NOTE swap: the test directory's file system punches no holes; skipped");
        return;
    }
    let new_path = h.dir.file("new.img", &vec![1u8; 64 * SECTOR]);
    // Not probed: as far as the device can tell, no hole punching.
    let unprobed = FileBackend::open_unlocked(&new_path, false)
        .unwrap()
        .lock()
        .unwrap();
    let e = h
        .dev()
        .swap_backend(unprobed, new_path.clone())
        .unwrap_err()
        .to_string();
    assert!(e.contains("punch holes") && e.contains("new.img"), "{e}");
    assert!(e.starts_with("drive testdisk: "), "{e}");
    assert_eq!(capacity(&h), 16);
    assert_eq!(h.dev().config_generation(), 0);
    assert_eq!(h.irq.config.load(Ordering::SeqCst), 0);
    assert_eq!(h.dev().config().path, h.path);
    assert_eq!(h.read_ok(3, 512), old[3 * SECTOR..4 * SECTOR]);
    // The refused image was closed, its lock with it.
    assert!(FileBackend::open(&new_path, false).is_ok());

    // WRITE_ZEROES needs ranges zeroed as well.
    let h = BlockFixture::faulty(&old, |c| c.io_engine = IoEngine::Sync, BASE_FEATURES);
    assert_ne!(h.dev().avail_features() & bit(VIRTIO_BLK_F_WRITE_ZEROES), 0);
    let other = h.dir.file("other.img", &vec![2u8; 64 * SECTOR]);
    let mut b = FaultyBackend::new(FileBackend::open(&other, false).unwrap());
    b.info = Some(DiskInfo {
        size: 64 * SECTOR as u64,
        punch_hole: true,
        zero_range: false,
    });
    let e = h.dev().swap_backend(b, other).unwrap_err().to_string();
    assert!(e.contains("zero ranges"), "{e}");
    assert_eq!(capacity(&h), 16);
    assert_eq!(h.dev().config_generation(), 0);
}

#[test]
fn test_a_swap_while_not_activated_changes_the_configuration_and_interrupts_nobody() {
    let old = random_bytes(&mut Rng(48), 8 * SECTOR);
    let new = random_bytes(&mut Rng(49), 24 * SECTOR);
    let mut h = BlockFixture::new(&old, |c| c.io_engine = IoEngine::Sync, BASE_FEATURES);
    h.dev().reset();
    h.run_until_idle();
    let new_path = h.dir.file("new.img", &new);
    let backend = FileBackend::open(&new_path, false).unwrap();
    h.dev().swap_backend(backend, new_path).unwrap();
    assert_eq!(capacity(&h), 24);
    assert_eq!(h.dev().config_generation(), 1);
    assert_eq!(h.irq.config.load(Ordering::SeqCst), 0);
    // The driver comes back and finds the new image.
    h.activate(BASE_FEATURES);
    assert_eq!(h.read_ok(20, 1024), new[20 * SECTOR..22 * SECTOR]);
}

#[test]
fn test_a_resize_moves_the_end_and_a_held_request_past_it_is_answered() {
    let data = random_bytes(&mut Rng(50), 16 * SECTOR);
    // One request a minute: the second one is held back.
    let mut h = BlockFixture::with_engine(IoEngine::Sync, &data, |c| {
        c.rate_limiter = ops_limit(1, 60_000)
    });
    let r0 = h.post_read(0, 512);
    let w = h.post_write(12, &[9; 1024]);
    h.go();
    assert_eq!(h.used(), vec![(u32::from(r0.head), 513)]);
    assert!(h.dev().active.as_ref().unwrap().virtio.is_throttled());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&h.path)
        .unwrap();
    // Grown: the held write still fits and stays held.
    file.set_len(32 * SECTOR as u64).unwrap();
    h.dev().resize(32 * SECTOR as u64);
    assert_eq!(capacity(&h), 32);
    assert_eq!(h.dev().config_generation(), 1);
    assert_eq!(h.irq.config.load(Ordering::SeqCst), 1);
    assert!(h.used().is_empty());
    // Shrunk to its very end (sectors 12 and 13 are the last): still held.
    file.set_len(14 * SECTOR as u64).unwrap();
    h.dev().resize(14 * SECTOR as u64);
    assert_eq!(capacity(&h), 14);
    assert!(h.used().is_empty());
    // Shrunk under it: the write is answered IOERR at once and the file
    // does not grow back.
    file.set_len(8 * SECTOR as u64).unwrap();
    h.dev().resize(8 * SECTOR as u64);
    assert_eq!(capacity(&h), 8);
    assert_eq!(h.dev().config_generation(), 3);
    assert_eq!(h.irq.config.load(Ordering::SeqCst), 3);
    assert_eq!(h.used(), vec![(u32::from(w.head), 1)]);
    assert_eq!(h.status(&w), VIRTIO_BLK_S_IOERR);
    assert!(!h.dev().active.as_ref().unwrap().virtio.is_throttled());
    // Lifting the limit releases the queue at once, not in a minute.
    h.dev()
        .set_rate_limiter(&RateLimiterConfig::default())
        .unwrap();
    let past = h.post_read(8, 512);
    let last = h.post_read(7, 512);
    h.kick();
    let used = h.collect(2).0;
    assert_eq!(
        used,
        vec![(u32::from(past.head), 1), (u32::from(last.head), 513)]
    );
    assert_eq!(h.status(&past), VIRTIO_BLK_S_IOERR, "past the new end");
    assert_eq!(h.read(last.parts[1].0, 512), data[7 * SECTOR..8 * SECTOR]);
    assert_eq!(h.image().len(), 8 * SECTOR);
}

#[test]
fn test_rate_limits_change_while_the_device_runs() {
    let data = random_bytes(&mut Rng(51), 16 * SECTOR);
    let mut h = BlockFixture::new(&data, |c| c.io_engine = IoEngine::Sync, BASE_FEATURES);
    // Unlimited stays without a limiter.
    h.dev()
        .set_rate_limiter(&RateLimiterConfig::default())
        .unwrap();
    assert!(h.dev().rq.limiter.is_none());
    // A bad one is refused and changes nothing.
    let bad = ops_limit(5, 0);
    let e = h.dev().set_rate_limiter(&bad).unwrap_err().to_string();
    assert!(e.starts_with("drive testdisk: rate limiter: "), "{e}");
    assert!(h.dev().rq.limiter.is_none());
    assert!(h.dev().config().rate_limiter.is_unlimited());
    // One request a minute, set live: the second waits.
    let slow = ops_limit(1, 60_000);
    h.dev().set_rate_limiter(&slow).unwrap();
    assert_eq!(h.dev().config().rate_limiter, slow);
    let a = h.post_read(0, 512);
    let b = h.post_read(1, 512);
    h.go();
    assert_eq!(h.used(), vec![(u32::from(a.head), 513)]);
    assert_eq!(h.metric(|m| &m.rate_limiter_throttled), 1);
    // A faster bucket replaces it and the held request goes at once.
    let fast = ops_limit(100, 10);
    h.dev().set_rate_limiter(&fast).unwrap();
    assert_eq!(h.dev().config().rate_limiter, fast);
    let t = Instant::now();
    assert_eq!(h.collect(1).0, vec![(u32::from(b.head), 513)]);
    assert!(t.elapsed() < Duration::from_secs(5));
    assert_eq!(h.read(b.parts[1].0, 512), data[SECTOR..2 * SECTOR]);
}
