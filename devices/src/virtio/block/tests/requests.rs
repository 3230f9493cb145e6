// SPDX-License-Identifier: Apache-2.0
//! Features, configuration space, opening the image, and each request type
//! as a guest sees it.

use vm_memory::GuestAddress;

use super::fixture::*;
use crate::virtio::block::device::config_offsets as off;
use crate::virtio::block::device::features::*;
use crate::virtio::block::{Block, BlockConfig, BlockError, CacheType, IoEngine, SEG_MAX};
use crate::virtio::VirtioDevice;

const SECTOR: usize = 512;

/// Whether this host's temp file system punches holes and zeroes ranges,
/// tried independently of the device.
fn fs_can(mode: vmm_sys_util::fallocate::FallocateMode) -> bool {
    let dir = TempDir::new();
    let p = dir.file("probe", &[1u8; 8192]);
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    vmm_sys_util::fallocate::fallocate(&f, mode, true, 0, 4096).is_ok()
}

fn image(sectors: usize) -> Vec<u8> {
    let mut rng = Rng(0x1234_5678);
    random_bytes(&mut rng, sectors * SECTOR)
}

fn read_config(blk: &Block, offset: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0xffu8; len];
    blk.read_config(offset, &mut v);
    v
}

#[test]
fn test_features_follow_the_configuration_and_the_file_system() {
    use vmm_sys_util::fallocate::FallocateMode;
    let dir = TempDir::new();
    let path = dir.file("d.img", &image(8));
    let punch = fs_can(FallocateMode::PunchHole);
    let zero = fs_can(FallocateMode::ZeroRange);

    let blk = Block::new(BlockConfig::new("d", &path), test_memory()).unwrap();
    let f = blk.avail_features();
    for b in [
        VIRTIO_F_VERSION_1,
        VIRTIO_BLK_F_BLK_SIZE,
        VIRTIO_BLK_F_SEG_MAX,
        VIRTIO_RING_F_EVENT_IDX,
        VIRTIO_RING_F_INDIRECT_DESC,
    ] {
        assert_ne!(f & bit(b), 0, "feature {b} missing");
    }
    assert_eq!(f & bit(VIRTIO_BLK_F_FLUSH), 0, "Unsafe offers no FLUSH");
    assert_eq!(f & bit(VIRTIO_BLK_F_RO), 0);
    assert_eq!(f & bit(VIRTIO_BLK_F_DISCARD) != 0, punch);
    assert_eq!(f & bit(VIRTIO_BLK_F_WRITE_ZEROES) != 0, punch && zero);
    assert_eq!(blk.device_type(), 2);
    assert_eq!(blk.queue_max_sizes(), &[256]);
    drop(blk);

    let mut c = BlockConfig::new("d", &path);
    c.cache_type = CacheType::Writeback;
    c.queue_size = 1024;
    let blk = Block::new(c, test_memory()).unwrap();
    assert_ne!(blk.avail_features() & bit(VIRTIO_BLK_F_FLUSH), 0);
    assert_eq!(blk.queue_max_sizes(), &[1024]);
    drop(blk);

    let mut c = BlockConfig::new("d", &path);
    c.read_only = true;
    let blk = Block::new(c, test_memory()).unwrap();
    let f = blk.avail_features();
    assert_ne!(f & bit(VIRTIO_BLK_F_RO), 0);
    assert_eq!(
        f & (bit(VIRTIO_BLK_F_DISCARD) | bit(VIRTIO_BLK_F_WRITE_ZEROES)),
        0
    );
}

#[test]
fn test_config_space_holds_the_drive_s_limits() {
    let dir = TempDir::new();
    let path = dir.file("d.img", &image(1000));
    let blk = Block::new(BlockConfig::new("d", &path), test_memory()).unwrap();
    let le32 = |o: usize| u32::from_le_bytes(read_config(&blk, o as u64, 4).try_into().unwrap());
    assert_eq!(
        u64::from_le_bytes(read_config(&blk, 0, 8).try_into().unwrap()),
        1000
    );
    assert_eq!(le32(off::SEG_MAX), SEG_MAX);
    assert_eq!(le32(off::BLK_SIZE), 512);
    if blk.avail_features() & bit(VIRTIO_BLK_F_DISCARD) != 0 {
        assert_eq!(le32(off::MAX_DISCARD_SECTORS), 1 << 21);
        assert_eq!(le32(off::MAX_DISCARD_SEG), 1);
        assert_eq!(le32(off::DISCARD_SECTOR_ALIGNMENT), 1);
    }
    if blk.avail_features() & bit(VIRTIO_BLK_F_WRITE_ZEROES) != 0 {
        assert_eq!(le32(off::MAX_WRITE_ZEROES_SECTORS), 1 << 21);
        assert_eq!(le32(off::MAX_WRITE_ZEROES_SEG), 1);
        assert_eq!(
            read_config(&blk, off::WRITE_ZEROES_MAY_UNMAP as u64, 1),
            [1]
        );
    }
    // Reads at every width and offset, and writes (ignored and counted),
    // are the contract suite's; an offset past any window reads zeros.
    assert_eq!(read_config(&blk, u64::MAX, 4), [0; 4]);
    assert_eq!(read_config(&blk, u64::MAX - 1, 8), [0; 8]);
}

#[test]
fn test_capacity_rounds_a_partial_last_sector_down_and_never_touches_it() {
    let mut data = image(8);
    let tail: Vec<u8> = (0..100).map(|i| i as u8 ^ 0x5a).collect();
    data.extend_from_slice(&tail);
    let mut h = BlockFixture::new(&data, |_| {}, BASE_FEATURES);
    assert_eq!(h.dev().capacity(), 8);
    let mut cap = [0u8; 8];
    h.dev().read_config(0, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 8);
    // The last whole sector is reachable, the partial one is not.
    assert_eq!(h.read_ok(7, 512), data[7 * SECTOR..8 * SECTOR]);
    for (sector, len) in [(8, 512), (7, 1024)] {
        let p = h.post_read(sector, len);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_IOERR, 1);
        let p = h.post_write(sector, &vec![1; len as usize]);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_IOERR, 1);
    }
    assert_eq!(h.metric(|m| &m.malformed_requests), 4);
    let img = h.image();
    assert_eq!(img.len(), data.len());
    assert_eq!(img[8 * SECTOR..], tail[..]);
}

#[test]
fn test_write_then_read_back() {
    let data = image(64);
    let mut h = BlockFixture::new(&data, |_| {}, BASE_FEATURES);
    let new: Vec<u8> = (0..4096).map(|i| (i * 13 % 251) as u8).collect();
    let w = h.post_write(10, &new);
    h.go();
    assert_answer(&mut h, &w, VIRTIO_BLK_S_OK, 1);
    let mut model = data.clone();
    model[10 * SECTOR..10 * SECTOR + 4096].copy_from_slice(&new);
    assert_eq!(h.image(), model);
    let r = h.post_read(9, 4096 + 1024);
    h.go();
    assert_answer(&mut h, &r, VIRTIO_BLK_S_OK, 4096 + 1024 + 1);
    assert_eq!(
        h.read(r.parts[1].0, 5120),
        model[9 * SECTOR..9 * SECTOR + 5120]
    );
    assert_eq!(h.metric(|m| &m.write_count), 1);
    assert_eq!(h.metric(|m| &m.write_bytes), 4096);
    assert_eq!(h.metric(|m| &m.read_count), 1);
    assert_eq!(h.metric(|m| &m.read_bytes), 5120);
    // EVENT_IDX with used_event 0: one interrupt, the second suppressed.
    assert_eq!(h.irq.used.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(h.metric(|m| &m.queue.interrupts_suppressed), 1);
    assert!(h.dev().uses_io_uring(), "Async is the default");
}

#[test]
fn test_flush_completes_with_either_cache_type() {
    for cache in [CacheType::Unsafe, CacheType::Writeback] {
        let mut h = BlockFixture::new(&image(8), |c| c.cache_type = cache, BASE_FEATURES);
        let p = h.post_bare(VIRTIO_BLK_T_FLUSH, 0);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 1);
        assert_eq!(h.metric(|m| &m.flush_count), 1, "{cache:?}");
    }
}

/// A request a kernel worker completes wakes the event loop asleep in
/// `epoll_wait`: io_uring never runs an fsync inline, so a `Writeback`
/// FLUSH on `Async` always goes to an io-wq worker, whose completion
/// reaches the loop as task work (posted cooperatively, see `uring`). Each
/// turn may sleep 3 s; a loop that slept through the completion would
/// spend at least one whole turn.
#[test]
fn test_a_completion_from_a_kernel_worker_wakes_the_waiting_loop() {
    use std::time::{Duration, Instant};
    let mut h = BlockFixture::new(
        &image(64),
        |c| {
            c.io_engine = IoEngine::Async;
            c.cache_type = CacheType::Writeback;
        },
        BASE_FEATURES,
    );
    let w = h.post_write(0, &[0x77; 16 * SECTOR]);
    let f = h.post_bare(VIRTIO_BLK_T_FLUSH, 0);
    h.kick();
    let start = Instant::now();
    let unanswered = |h: &BlockFixture| h.status(&f) == 0xee || h.status(&w) == 0xee;
    while unanswered(&h) && start.elapsed() < Duration::from_secs(10) {
        h.run_once(3_000);
    }
    let took = start.elapsed();
    assert!(!unanswered(&h), "no answer in {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "the loop slept through a completion: answered after {took:?}"
    );
    let mut used = h.used();
    used.sort_unstable();
    assert_eq!(used, [(u32::from(w.head), 1), (u32::from(f.head), 1)]);
    assert_eq!(
        (h.status(&w), h.status(&f)),
        (VIRTIO_BLK_S_OK, VIRTIO_BLK_S_OK)
    );
    assert_eq!(h.metric(|m| &m.flush_count), 1);
    assert_eq!(h.image()[..16 * SECTOR], [0x77; 16 * SECTOR]);
}

#[test]
fn test_get_id_is_the_drive_id_zero_padded() {
    let mut h = BlockFixture::new(&image(8), |c| c.id = "rootfs".into(), BASE_FEATURES);
    let mut want = [0u8; 20];
    want[..6].copy_from_slice(b"rootfs");
    for (buf, written) in [(20u32, 20u32), (8, 8), (64, 20)] {
        let p = h.post(
            &[
                Part::Out(header(VIRTIO_BLK_T_GET_ID, 0)),
                Part::In(buf),
                Part::In(1),
            ],
            Layout::Direct,
        );
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, written + 1);
        let got = h.read(p.parts[1].0, buf as usize);
        assert_eq!(got[..written as usize], want[..written as usize]);
        assert!(
            got[written as usize..].iter().all(|&b| b == 0xee),
            "past the id"
        );
    }
    assert_eq!(h.metric(|m| &m.get_id_count), 3);
    // An id longer than GET_ID can return is refused at creation.
    let dir = TempDir::new();
    let path = dir.file("d.img", &image(1));
    let err = Block::new(BlockConfig::new("x".repeat(21), &path), test_memory()).unwrap_err();
    assert!(matches!(err, BlockError::Config { .. }), "{err}");
}

/// DISCARD needs a file system that punches holes, WRITE_ZEROES one that
/// also zeroes ranges, whatever the other can do (what the host's file
/// system reports, told here by the backend).
#[test]
fn test_discard_and_write_zeroes_follow_what_the_file_system_can_do() {
    use crate::virtio::block::backend::{DiskInfo, FileBackend};
    let dir = TempDir::new();
    let path = dir.file("d.img", &image(8));
    let offered = |punch_hole, zero_range| {
        let mut backend = FaultyBackend::new(FileBackend::open(&path, false).unwrap());
        backend.info = Some(DiskInfo {
            size: 8 * SECTOR as u64,
            punch_hole,
            zero_range,
        });
        let blk = Block::with_backend(BlockConfig::new("d", &path), test_memory(), backend);
        let f = blk.unwrap().avail_features();
        (
            f & bit(VIRTIO_BLK_F_DISCARD) != 0,
            f & bit(VIRTIO_BLK_F_WRITE_ZEROES) != 0,
        )
    };
    assert_eq!(offered(false, false), (false, false));
    assert_eq!(offered(false, true), (false, false));
    assert_eq!(offered(true, false), (true, false));
    assert_eq!(offered(true, true), (true, true));
}

/// An image whose size is not a whole number of sectors says so once, at
/// open, with the bytes the guest cannot see; a whole one says nothing.
#[test]
fn test_a_partial_last_sector_is_logged_at_open() {
    use crate::virtio::test_utils::checks::test_log;
    let dir = TempDir::new();
    for (name, len, want) in [
        ("whole.img", 8 * SECTOR, None),
        ("tail.img", 8 * SECTOR + 100, Some(100)),
    ] {
        let path = dir.file(name, &vec![0; len]);
        let before = test_log::lines().len();
        let blk = Block::new(BlockConfig::new("d", &path), test_memory()).unwrap();
        assert_eq!(blk.capacity(), 8);
        let lines: Vec<String> = test_log::lines()[before..]
            .iter()
            .filter(|l| l.contains("not a whole number"))
            .cloned()
            .collect();
        match want {
            None => assert!(lines.is_empty(), "{lines:?}"),
            Some(tail) => {
                assert_eq!(lines.len(), 1, "{lines:?}");
                assert!(
                    lines[0].contains(&format!("the last {tail} bytes")),
                    "{}",
                    lines[0]
                );
            }
        }
    }
}

#[test]
fn test_the_queue_size_is_a_power_of_two_up_to_32768() {
    let dir = TempDir::new();
    let path = dir.file("d.img", &image(1));
    let make = |queue_size| {
        let mut cfg = BlockConfig::new("q", &path);
        cfg.queue_size = queue_size;
        Block::new(cfg, test_memory())
    };
    for qs in [1, 256, 32768] {
        let blk = make(qs).unwrap_or_else(|e| panic!("{qs}: {e}"));
        assert_eq!(blk.queue_max_sizes(), [qs]);
    }
    for qs in [0, 3, 384, 65535] {
        let err = make(qs).unwrap_err();
        assert!(matches!(err, BlockError::Config { .. }), "{qs}: {err}");
    }
}

#[test]
fn test_unknown_types_are_unsupported() {
    let mut h = BlockFixture::new(&image(8), |_| {}, BASE_FEATURES);
    for kind in [2, 3, 99, 14, u32::MAX] {
        let p = h.post_bare(kind, 0);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_UNSUPP, 1);
    }
    assert_eq!(h.metric(|m| &m.unsupported), 5);
}

#[test]
fn test_discard_and_write_zeroes_zero_their_range_only() {
    let data = image(64);
    let mut h = BlockFixture::new(&data, |_| {}, BASE_FEATURES);
    let f = h.dev().avail_features();
    if f & bit(VIRTIO_BLK_F_WRITE_ZEROES) == 0 {
        eprintln!("skipped: the temp file system cannot zero ranges");
        return;
    }
    let mut model = data.clone();
    let cases = [
        (VIRTIO_BLK_T_DISCARD, 3u64, 5u32, 0u32),
        (VIRTIO_BLK_T_WRITE_ZEROES, 20, 9, 0),
        (VIRTIO_BLK_T_WRITE_ZEROES, 40, 16, 1),
        (VIRTIO_BLK_T_DISCARD, 63, 0, 0),
    ];
    for (kind, sector, num, flags) in cases {
        let p = h.post_dwz(kind, sector, num, flags);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 1);
        let s = sector as usize * SECTOR;
        model[s..s + num as usize * SECTOR].fill(0);
        assert_eq!(h.image(), model, "{kind} at {sector}");
    }
    assert_eq!(h.metric(|m| &m.discard_count), 2);
    assert_eq!(h.metric(|m| &m.write_zeroes_count), 2);
    // Flags the spec does not allow: UNSUPP, nothing zeroed.
    for (kind, flags) in [(VIRTIO_BLK_T_DISCARD, 1), (VIRTIO_BLK_T_WRITE_ZEROES, 2)] {
        let p = h.post_dwz(kind, 0, 1, flags);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_UNSUPP, 1);
    }
    assert_eq!(h.image(), model);
}

#[test]
fn test_discard_and_write_zeroes_unsupported_unless_negotiated() {
    let data = image(8);
    let features = BASE_FEATURES & !bit(VIRTIO_BLK_F_DISCARD) & !bit(VIRTIO_BLK_F_WRITE_ZEROES);
    let mut h = BlockFixture::new(&data, |_| {}, features);
    for kind in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        let p = h.post_dwz(kind, 0, 2, 0);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_UNSUPP, 1);
    }
    assert_eq!(h.image(), data);
    assert_eq!(h.metric(|m| &m.unsupported), 2);
}

#[test]
fn test_read_only_drive_refuses_every_write_and_reads() {
    let data = image(16);
    let mut h = BlockFixture::new(&data, |c| c.read_only = true, BASE_FEATURES);
    let w = h.post_write(0, &[7; 512]);
    h.go();
    assert_answer(&mut h, &w, VIRTIO_BLK_S_IOERR, 1);
    for kind in [VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES] {
        let p = h.post_dwz(kind, 0, 2, 0);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_IOERR, 1);
    }
    assert_eq!(h.metric(|m| &m.read_only_refusals), 3);
    assert_eq!(h.read_ok(1, 1024), data[512..1536]);
    assert_eq!(h.image(), data);
    // The file itself was opened read-only: a read-only image opens.
    let mut perms = std::fs::metadata(h.path()).unwrap().permissions();
    perms.set_readonly(true);
    std::fs::set_permissions(h.path(), perms).unwrap();
    let mut c = BlockConfig::new("ro", h.path());
    c.read_only = true;
    assert!(Block::new(c, test_memory()).is_ok());
}

#[test]
fn test_an_image_in_use_is_locked() {
    let dir = TempDir::new();
    let path = dir.file("d.img", &image(4));
    let ro = |p: &std::path::Path| {
        let mut c = BlockConfig::new("d", p);
        c.read_only = true;
        c
    };
    let first = Block::new(BlockConfig::new("d", &path), test_memory()).unwrap();
    for cfg in [BlockConfig::new("d", &path), ro(&path)] {
        let err = Block::new(cfg, test_memory()).unwrap_err();
        assert!(matches!(&err, BlockError::Locked(p) if p == &path), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(path.to_str().unwrap()) && !msg.contains('\n'),
            "{msg}"
        );
    }
    drop(first);
    // Readers share; a writer waits for none of them.
    let a = Block::new(ro(&path), test_memory()).unwrap();
    let _b = Block::new(ro(&path), test_memory()).unwrap();
    assert!(matches!(
        Block::new(BlockConfig::new("d", &path), test_memory()),
        Err(BlockError::Locked(_))
    ));
    drop(a);
}

#[test]
fn test_only_a_regular_file_opens() {
    let dir = TempDir::new();
    for ro in [false, true] {
        let mut c = BlockConfig::new("d", &dir.0);
        c.read_only = ro;
        let err = Block::new(c, test_memory()).unwrap_err();
        assert!(matches!(err, BlockError::NotAFile(_)), "{err}");
        assert!(err.to_string().contains(dir.0.to_str().unwrap()));
    }
    let missing = dir.0.join("missing.img");
    let err = Block::new(BlockConfig::new("d", &missing), test_memory()).unwrap_err();
    assert!(matches!(err, BlockError::Open { .. }), "{err}");
    assert!(err.to_string().contains("missing.img"), "{err}");
    // A FIFO neither hangs the open nor passes for an image.
    let fifo = dir.0.join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success()));
    let err = Block::new(BlockConfig::new("d", &fifo), test_memory()).unwrap_err();
    assert!(matches!(err, BlockError::NotAFile(_)), "{err}");
}

#[test]
fn test_header_data_and_status_may_share_descriptors() {
    let data = image(16);
    let mut h = BlockFixture::new(&data, |_| {}, BASE_FEATURES);
    // OUT: header and data in one descriptor, the header itself split.
    let new = vec![0x42u8; 1024];
    let mut hd = header(VIRTIO_BLK_T_OUT, 2)[4..].to_vec();
    hd.extend_from_slice(&new);
    let p = h.post(
        &[
            Part::Out(header(VIRTIO_BLK_T_OUT, 2)[..4].to_vec()),
            Part::Out(hd),
            Part::In(1),
        ],
        Layout::Direct,
    );
    h.go();
    assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 1);
    let mut model = data.clone();
    model[1024..2048].copy_from_slice(&new);
    assert_eq!(h.image(), model);
    // IN: data and status in one writable descriptor.
    let p = h.post(
        &[Part::Out(header(VIRTIO_BLK_T_IN, 2)), Part::In(1025)],
        Layout::Direct,
    );
    h.go();
    assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 1025);
    assert_eq!(h.read(p.parts[1].0, 1024), new);
    // Through an indirect table, header split over two entries.
    let p = h.post(
        &[
            Part::Out(header(VIRTIO_BLK_T_IN, 0)[..9].to_vec()),
            Part::Out(header(VIRTIO_BLK_T_IN, 0)[9..].to_vec()),
            Part::In(512),
            Part::In(512),
            Part::In(1),
        ],
        Layout::Indirect(1),
    );
    h.go();
    assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 1025);
    assert_eq!(h.read(p.parts[2].0, 512), model[..512]);
    assert_eq!(h.read(p.parts[3].0, 512), model[512..1024]);
    let _ = GuestAddress(0);
}

/// Offsets past 4 GiB reach the image whole (the system calls take the
/// offset in one 64-bit argument), with both engines: a sparse 6 GiB image,
/// a read of what the test wrote at 5 GiB, and a write there read back.
#[test]
fn test_requests_reach_offsets_past_4_gib() {
    use std::os::unix::fs::FileExt;
    const AT: u64 = 5 << 30;
    for engine in [IoEngine::Sync, IoEngine::Async] {
        let dir = TempDir::new();
        let path = dir.file("big.img", &[]);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(6 << 30).unwrap();
        f.write_all_at(&[0x5a; 512], AT).unwrap();
        // The same offset modulo 4 GiB holds zeros: a truncated offset
        // would read those.
        let mut h = BlockFixture::over(dir, path.clone(), |c| c.io_engine = engine, BASE_FEATURES);
        let p = h.post_read(AT / 512, 512);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 513);
        assert_eq!(h.read(p.parts[1].0, 512), [0x5a; 512], "{engine:?}");
        let p = h.post_write(AT / 512 + 1, &[0xa5; 512]);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 1);
        let image = std::fs::File::open(&path).unwrap();
        let mut back = [0u8; 512];
        image.read_exact_at(&mut back, AT + 512).unwrap();
        assert_eq!(back, [0xa5; 512], "{engine:?}");
        let mut low = [1u8; 1024];
        image.read_exact_at(&mut low, AT - (4 << 30)).unwrap();
        assert_eq!(low, [0; 1024], "nothing landed 4 GiB lower ({engine:?})");
    }
}

/// The open flags of `fd`, from /proc (`flags:` is octal).
fn fd_flags(fd: std::os::fd::RawFd) -> libc::c_int {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .unwrap()
        .trim();
    libc::c_int::from_str_radix(flags, 8).unwrap()
}

/// The image is opened close-on-exec and blocking, and through the page
/// cache unless asked otherwise.
#[test]
fn test_the_image_fd_is_close_on_exec_blocking_and_buffered() {
    use std::os::fd::AsRawFd;
    let h = BlockFixture::new(&image(8), |_| {}, BASE_FEATURES);
    let flags = fd_flags(h.dev().backend().as_raw_fd());
    assert_ne!(flags & libc::O_CLOEXEC, 0, "close-on-exec");
    assert_eq!(flags & libc::O_NONBLOCK, 0, "blocking");
    assert_eq!(flags & libc::O_DIRECT, 0, "buffered");
}

/// An image opened with O_DIRECT (`FileBackend::open_direct`, where the
/// temporary directory's file system allows it) keeps the flag after the
/// open's non-blocking step, and serves aligned requests with both
/// engines; guest buffers the file system's alignment refuses are answered
/// IOERR, nothing else changes.
#[test]
fn test_a_direct_image_serves_aligned_requests_and_refuses_misaligned_buffers() {
    use std::os::fd::AsRawFd;
    let data = image(64);
    for engine in [IoEngine::Sync, IoEngine::Async] {
        let Some(mut h) = BlockFixture::direct(&data, |c| c.io_engine = engine, BASE_FEATURES)
        else {
            eprintln!("skipped: the temporary directory's file system refuses O_DIRECT");
            return;
        };
        let flags = fd_flags(h.dev().backend().as_raw_fd());
        assert_ne!(flags & libc::O_DIRECT, 0, "O_DIRECT kept ({engine:?})");
        assert_ne!(flags & libc::O_CLOEXEC, 0, "close-on-exec ({engine:?})");
        assert_eq!(flags & libc::O_NONBLOCK, 0, "blocking ({engine:?})");
        // Header, then a page-aligned data buffer.
        h.align_next(4096, crate::virtio::block::request::HEADER_LEN as u64);
        assert_eq!(h.read_ok(8, 4096), data[8 * SECTOR..16 * SECTOR]);
        h.align_next(4096, crate::virtio::block::request::HEADER_LEN as u64);
        let p = h.post_write(16, &[0x3c; 4096]);
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_OK, 1);
        assert_eq!(h.image()[16 * SECTOR..24 * SECTOR], [0x3c; 4096]);
        // The same read into two buffers of 100 and 3,996 bytes: direct I/O
        // takes only whole logical blocks per buffer.
        let p = h.post(
            &[
                Part::Out(header(VIRTIO_BLK_T_IN, 8)),
                Part::In(100),
                Part::In(3996),
                Part::In(1),
            ],
            Layout::Direct,
        );
        h.go();
        assert_answer(&mut h, &p, VIRTIO_BLK_S_IOERR, 1);
        assert_eq!(h.metric(|m| &m.io_errors), 1, "{engine:?}");
        assert_eq!(h.image()[..8 * SECTOR], data[..8 * SECTOR]);
    }
}
