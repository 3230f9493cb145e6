// SPDX-License-Identifier: Apache-2.0
//! The balloon driven from the guest's side through the real MMIO
//! transport ([`DeviceRig`]): inflation giving pages back (recorded, and on
//! a real mapping whose RSS drops), deflation, refused page numbers and
//! chains, statistics at the polling interval, hinting runs, reporting,
//! the target and the configuration space, and bounded passes.
#![allow(unsafe_code)]

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

use super::device::CONFIG_LEN;
use super::*;
use crate::virtio::mmio::CONFIG_SPACE_OFFSET;
use crate::virtio::queue::{IoSeg, PASS_WEIGHT_CHAINS};
use crate::virtio::test_utils::contract::{contract_suite, ContractDevice};
use crate::virtio::test_utils::{guest_memory, DeviceRig, MockDriver, Segment, UsedElem};
use crate::virtio::{status, GuestMemory, VirtioDevice, VIRTIO_MMIO_INT_CONFIG};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// Guest memory of the tests.
const MEM_SIZE: usize = 16 << 20;
const V1: u64 = 1 << VIRTIO_F_VERSION_1;
const PAGE: u64 = BALLOON_PAGE_SIZE;

/// The balloon in the contract suite: inflate requests whose buffers each
/// carry the page frame number of a page of the request's own.
impl ContractDevice for Balloon {
    type Keep = ();
    const QUEUE: usize = 0;
    const CONFIG_LEN: u64 = CONFIG_LEN;
    const REFUSED: &'static str = "malformed_chains";
    const WRITABLE_CONFIG: std::ops::Range<u64> = 4..8;

    fn make(mem: &GuestMemory) -> (Self, ()) {
        (
            Balloon::new(BalloonConfig::default(), mem.clone()).unwrap(),
            (),
        )
    }

    fn request(drv: &mut MockDriver, bufs: usize) -> Vec<Segment> {
        let page = drv.alloc(PAGE, PAGE).unwrap();
        let pfn = ((page.0 >> VIRTIO_BALLOON_PFN_SHIFT) as u32).to_le_bytes();
        (0..bufs)
            .map(|_| {
                let a = drv.alloc(4, 4).unwrap();
                drv.write_mem(a, &pfn).unwrap();
                Segment::readable(a, 4)
            })
            .collect()
    }
}

contract_suite!(Balloon);

/// A discarder that records every range it is given (host address and
/// length) and fails when told to.
#[derive(Debug, Clone, Default)]
struct Recorder {
    calls: Arc<Mutex<Vec<(usize, usize)>>>,
    fail: Arc<Mutex<Option<i32>>>,
}

impl PageDiscard for Recorder {
    fn discard(&mut self, pages: IoSeg) -> io::Result<()> {
        self.calls.lock().unwrap().push((pages.base(), pages.len()));
        match *self.fail.lock().unwrap() {
            Some(e) => Err(io::Error::from_raw_os_error(e)),
            None => Ok(()),
        }
    }
}

impl Recorder {
    fn calls(&self) -> Vec<(usize, usize)> {
        self.calls.lock().unwrap().clone()
    }
}

type Rig<D = Recorder> = DeviceRig<Balloon<D>>;

/// A device with `cfg` over `mem`, initialised with `features`.
fn rig_on<D: PageDiscard + 'static>(
    mem: GuestMemory,
    cfg: BalloonConfig,
    discard: D,
    features: u64,
) -> Rig<D> {
    let dev = Balloon::with_discard(cfg, mem.clone(), discard).unwrap();
    let mut r = DeviceRig::new(&mem, dev);
    r.drv.init(features).unwrap();
    r.run_until_idle();
    r
}

/// A recorded device with `cfg`, every feature it offers acked.
fn rig(cfg: BalloonConfig) -> (Rig, Recorder) {
    let rec = Recorder::default();
    let mem = guest_memory(MEM_SIZE).unwrap();
    let offered = Balloon::with_discard(cfg, mem.clone(), rec.clone())
        .unwrap()
        .avail_features();
    (rig_on(mem, cfg, rec.clone(), offered), rec)
}

/// The host address of guest address `gpa` in the rig's memory.
fn host(r: &Rig<impl PageDiscard + 'static>, gpa: u64) -> usize {
    let mem = r.drv.mem();
    let region = mem.find_region(GuestAddress(gpa)).unwrap();
    let off = gpa - region.start_addr().0;
    region.get_host_address(MemoryRegionAddress(off)).unwrap() as usize
}

/// Posts one chain of page frame numbers on queue `q` (one buffer) and
/// kicks it; the chain's head.
fn post_pfns<D: PageDiscard + 'static>(r: &mut Rig<D>, q: usize, pfns: &[u32]) -> u16 {
    let bytes: Vec<u8> = pfns.iter().flat_map(|p| p.to_le_bytes()).collect();
    let a = r.drv.alloc(bytes.len() as u64, 4).unwrap();
    r.drv.write_mem(a, &bytes).unwrap();
    let head = r
        .drv
        .submit(q, &[Segment::readable(a, bytes.len() as u32)])
        .unwrap();
    r.drv.kick(q);
    head
}

/// `n` pages of guest memory, page-aligned; the first one's frame number.
fn pages<D: PageDiscard + 'static>(r: &mut Rig<D>, n: u64) -> u32 {
    let a = r.drv.alloc(n * PAGE, PAGE).unwrap();
    (a.0 >> VIRTIO_BALLOON_PFN_SHIFT) as u32
}

/// The configuration space as the driver reads it.
fn config<D: PageDiscard + 'static>(r: &mut Rig<D>) -> [u32; 3] {
    let mut b = [0u8; CONFIG_LEN as usize];
    r.drv.transport_mut().read(CONFIG_SPACE_OFFSET, &mut b);
    let w = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    [w(0), w(4), w(8)]
}

#[test]
fn test_inflated_pages_go_back_one_call_per_contiguous_run() {
    let (mut r, rec) = rig(BalloonConfig::default());
    let p = pages(&mut r, 4);
    let q = pages(&mut r, 2) + 1;
    // Out of order, with a duplicate: sorted, once each.
    let head = post_pfns(&mut r, 0, &[p + 2, q, p, p + 1, p]);
    r.run_until_idle();
    assert_eq!(
        r.drv.used(0).unwrap(),
        [UsedElem {
            id: head.into(),
            len: 0
        }]
    );
    let base = host(&r, u64::from(p) * PAGE);
    let other = host(&r, u64::from(q) * PAGE);
    assert_eq!(
        rec.calls(),
        [(base, 3 * PAGE as usize), (other, PAGE as usize)]
    );
    assert_eq!(r.metric("inflate_count"), 1);
    assert_eq!(r.metric("pages_inflated"), 4);
    assert_eq!(r.metric("inflate_freed"), 4 * PAGE);
    assert_eq!(r.metric("discard_calls"), 2);
    assert_eq!(r.metric("pfns_refused"), 0);
    assert_eq!(r.metric("malformed_chains"), 0);
}

#[test]
fn test_page_numbers_outside_guest_memory_are_refused_and_counted() {
    // Two regions with a hole between them.
    let mem = GuestMemory::from_ranges(&[
        (GuestAddress(0), 8 << 20),
        (GuestAddress(16 << 20), 4 << 20),
    ])
    .unwrap();
    let rec = Recorder::default();
    let mut r = rig_on(mem, BalloonConfig::default(), rec.clone(), V1);
    let good = pages(&mut r, 1);
    let hole = ((12u64 << 20) >> 12) as u32;
    let past = ((20u64 << 20) >> 12) as u32;
    let second = ((16u64 << 20) >> 12) as u32;
    post_pfns(&mut r, 0, &[hole, good, past, u32::MAX, second]);
    r.run_until_idle();
    assert_eq!(r.metric("pfns_refused"), 3);
    assert_eq!(r.metric("pages_inflated"), 2);
    let calls = rec.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.contains(&(host(&r, u64::from(good) * PAGE), PAGE as usize)));
    assert!(calls.contains(&(host(&r, 16 << 20), PAGE as usize)));
    // The same on the deflate queue: counted, nothing given back.
    post_pfns(&mut r, 1, &[hole, good]);
    r.run_until_idle();
    assert_eq!(r.metric("pfns_refused"), 4);
    assert_eq!(r.metric("pages_deflated"), 1);
    assert_eq!(r.metric("deflate_count"), 1);
    assert_eq!(rec.calls().len(), 2, "deflation gives nothing back");
}

/// Resident bytes of the mapping that starts at `base`, from
/// /proc/self/smaps.
fn rss_of_mapping(base: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let prefix = format!("{base:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&prefix));
    assert!(lines.next().is_some(), "no mapping at {base:#x}");
    let rss = lines.find(|l| l.starts_with("Rss:")).expect("an Rss line");
    let kb: u64 = rss.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

#[test]
fn test_inflation_drops_the_rss_of_real_guest_memory_and_deflation_refaults() {
    let mem = guest_memory(64 << 20).unwrap();
    let mut r = rig_on(mem.clone(), BalloonConfig::default(), Madvise, V1);
    // Touch 32 MiB past the rings and buffers, then balloon all of it.
    let start = 16u64 << 20;
    let len = 32u64 << 20;
    let fill = vec![0xa5u8; len as usize];
    vm_memory::Bytes::write_slice(&mem, &fill, GuestAddress(start)).unwrap();
    let base = host(&r, 0);
    let before = rss_of_mapping(base);
    assert!(before >= len, "touched memory resident: {before}");
    let first = (start >> 12) as u32;
    let count = (len / PAGE) as u32;
    // Linux sends 256 page frame numbers a chain.
    for c in 0..count / 256 {
        let chunk: Vec<u32> = (0..256).map(|k| first + c * 256 + k).collect();
        post_pfns(&mut r, 0, &chunk);
        r.run_until_idle();
    }
    let after = rss_of_mapping(base);
    assert!(
        before - after >= len * 8 / 10,
        "RSS {before} -> {after}: less than 80% of {len} given back"
    );
    assert_eq!(r.metric("pages_inflated"), u64::from(count));
    assert_eq!(r.metric("discard_fails"), 0);
    // Given back means zeros on the next read.
    let mut b = [0xffu8; 16];
    vm_memory::Bytes::read_slice(&mem, &mut b, GuestAddress(start + 4096)).unwrap();
    assert_eq!(b, [0u8; 16]);
    // Deflated pages come back as the guest touches them.
    post_pfns(&mut r, 1, &[first, first + 1]);
    r.run_until_idle();
    vm_memory::Bytes::write_slice(&mem, &fill[..2 * PAGE as usize], GuestAddress(start)).unwrap();
    assert!(rss_of_mapping(base) >= after + 2 * PAGE);
    assert_eq!(r.metric("pages_deflated"), 2);
}

#[test]
fn test_malformed_page_number_chains_are_refused_and_answered() {
    let (mut r, rec) = rig(BalloonConfig::default());
    let p = pages(&mut r, 1);
    let a = r.drv.alloc(4 * (MAX_PFNS_PER_CHAIN as u64 + 1), 4).unwrap();
    r.drv.write_mem(a, &p.to_le_bytes()).unwrap();
    let chains = [
        vec![Segment::writable(a, 4)],
        vec![Segment::readable(a, 6)],
        vec![Segment::readable(a, 4 * (MAX_PFNS_PER_CHAIN as u32 + 1))],
        vec![
            Segment::readable(a, 2),
            Segment::readable(GuestAddress(a.0 + 2), 2),
        ],
    ];
    let heads: Vec<u16> = chains
        .iter()
        .map(|c| r.drv.add_chain(0, c).unwrap())
        .collect();
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_until_idle();
    let used = r.drv.used(0).unwrap();
    let want: Vec<UsedElem> = heads
        .iter()
        .map(|&h| UsedElem {
            id: h.into(),
            len: 0,
        })
        .collect();
    assert_eq!(used, want);
    assert_eq!(r.metric("malformed_chains"), 3);
    // The last one, its page frame number split over two buffers, counts.
    assert_eq!(r.metric("pages_inflated"), 1);
    assert_eq!(rec.calls().len(), 1);
}

#[test]
fn test_a_failed_madvise_is_a_host_error_and_the_chain_is_answered() {
    let cfg = BalloonConfig {
        free_page_reporting: true,
        ..Default::default()
    };
    let (mut r, rec) = rig(cfg);
    *rec.fail.lock().unwrap() = Some(libc::EINVAL);
    let p = pages(&mut r, 2);
    let head = post_pfns(&mut r, 0, &[p, p + 1]);
    r.run_until_idle();
    assert_eq!(
        r.drv.used(0).unwrap(),
        [UsedElem {
            id: head.into(),
            len: 0
        }]
    );
    assert_eq!(r.metric("discard_fails"), 1);
    assert_eq!(r.metric("host_errors"), 1);
    assert_eq!(r.metric("inflate_freed"), 0);
    // A reported range likewise (reporting is the third queue here).
    post_range(&mut r, 2, 2);
    r.run_until_idle();
    assert_eq!(r.drv.used(2).unwrap().len(), 1);
    assert_eq!(r.metric("free_page_report_fails"), 1);
    assert_eq!(r.metric("free_page_report_count"), 0);
    assert_eq!(r.metric("discard_fails"), 2);
    assert_eq!(r.metric("discard_calls"), 2);
}

#[test]
fn test_the_target_reaches_the_driver_once_it_runs_and_never_exceeds_memory() {
    let cfg = BalloonConfig {
        amount_mib: 4,
        ..Default::default()
    };
    let mem = guest_memory(MEM_SIZE).unwrap();
    let mut dev = Balloon::with_discard(cfg, mem.clone(), Recorder::default()).unwrap();
    assert!(matches!(dev.set_target(8), Err(BalloonError::NotActivated)));
    assert_eq!(dev.config().amount_mib, 4);
    let too_big = BalloonConfig {
        amount_mib: 17,
        ..Default::default()
    };
    let err = Balloon::new(too_big, mem.clone()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the balloon's target of 17 MiB is more than the guest's 16 MiB of memory"
    );
    let mut r = DeviceRig::new(&mem, dev);
    r.drv.init(V1).unwrap();
    r.run_until_idle();
    assert_eq!(config(&mut r), [4 * 256, 0, 0]);
    let generation = r.drv.read_reg(crate::virtio::mmio::REG_CONFIG_GENERATION);
    r.drv.ack_interrupt(u32::MAX);
    r.dev().set_target(10).unwrap();
    assert_eq!(config(&mut r)[0], 10 * 256);
    assert_ne!(r.drv.interrupt_status() & VIRTIO_MMIO_INT_CONFIG, 0);
    assert_ne!(
        r.drv.read_reg(crate::virtio::mmio::REG_CONFIG_GENERATION),
        generation
    );
    assert_eq!(r.metric("config_interrupts"), 1);
    assert!(matches!(
        r.dev().set_target(17),
        Err(BalloonError::TooLarge { .. })
    ));
    assert_eq!(r.dev().config().amount_mib, 10);
    // The driver reports what it holds in `actual`; nothing else sticks.
    r.drv
        .transport_mut()
        .write(CONFIG_SPACE_OFFSET + 4, &(7u32 * 256).to_le_bytes());
    r.drv.transport_mut().write(CONFIG_SPACE_OFFSET, &[0xff; 4]);
    r.drv
        .transport_mut()
        .write(CONFIG_SPACE_OFFSET + 8, &[0xff; 4]);
    assert_eq!(config(&mut r), [10 * 256, 7 * 256, 0]);
    assert_eq!(r.metric("config_writes_ignored"), 2);
}

/// One statistics entry.
fn stat(tag: u16, val: u64) -> Vec<u8> {
    let mut e = tag.to_le_bytes().to_vec();
    e.extend_from_slice(&val.to_le_bytes());
    e
}

/// Posts a statistics report on queue 2 and kicks it; its head.
fn post_stats<D: PageDiscard + 'static>(r: &mut Rig<D>, entries: &[(u16, u64)]) -> u16 {
    let bytes: Vec<u8> = entries.iter().flat_map(|&(t, v)| stat(t, v)).collect();
    let a = r.drv.alloc(bytes.len().max(1) as u64, 8).unwrap();
    r.drv.write_mem(a, &bytes).unwrap();
    let head = r
        .drv
        .submit(2, &[Segment::readable(a, bytes.len() as u32)])
        .unwrap();
    r.drv.kick(2);
    head
}

#[test]
fn test_statistics_are_held_and_asked_for_again_at_the_polling_interval() {
    let cfg = BalloonConfig {
        stats_polling_interval_s: 1,
        ..Default::default()
    };
    let (mut r, _) = rig(cfg);
    assert!(matches!(
        r.dev().set_stats_interval(0),
        Err(BalloonError::StatisticsStateChange)
    ));
    let head = post_stats(&mut r, &[(4, 1 << 20), (5, 16 << 20), (99, 1)]);
    r.run_until_idle();
    // Held: nothing in the used ring until the timer asks again.
    assert!(r.drv.used(2).unwrap().is_empty());
    let s = r.dev().latest_stats().unwrap();
    assert_eq!(s.free_memory, Some(1 << 20));
    assert_eq!(s.total_memory, Some(16 << 20));
    assert_eq!(r.metric("stats_updates_count"), 1);
    assert_eq!(r.metric("stats_update_fails"), 1);
    let t = Instant::now();
    let mut used = Vec::new();
    while used.is_empty() && t.elapsed() < Duration::from_secs(5) {
        r.run_once(200);
        used = r.drv.used(2).unwrap();
    }
    let waited = t.elapsed();
    assert_eq!(
        used,
        [UsedElem {
            id: head.into(),
            len: 0
        }]
    );
    assert!(
        waited >= Duration::from_millis(700) && waited < Duration::from_secs(3),
        "asked after {waited:?} with a 1 s interval"
    );
    assert_eq!(r.metric("stats_requests"), 1);
    // The driver answers with a new report; the latest values win.
    post_stats(&mut r, &[(4, 2 << 20)]);
    r.run_until_idle();
    let s = r.dev().latest_stats().unwrap();
    assert_eq!(
        (s.free_memory, s.total_memory),
        (Some(2 << 20), Some(16 << 20))
    );
    // A new interval asks at once.
    r.dev().set_stats_interval(30).unwrap();
    assert_eq!(r.drv.used(2).unwrap().len(), 1);
    assert_eq!(r.dev().config().stats_polling_interval_s, 30);
}

/// A report of every statistic the device takes (`MAX_STATS` entries) is
/// read to its last entry; a report one entry longer is refused.
#[test]
fn test_a_statistics_report_is_read_up_to_its_largest_size() {
    let cfg = BalloonConfig {
        stats_polling_interval_s: 1,
        ..Default::default()
    };
    let (mut r, _) = rig(cfg);
    let mut entries = vec![(5, 16 << 20); stats::MAX_STATS - 1];
    entries.push((4, 7 << 20));
    post_stats(&mut r, &entries);
    r.run_until_idle();
    assert_eq!(r.dev().latest_stats().unwrap().free_memory, Some(7 << 20));
    assert_eq!(r.metric("stats_updates_count"), 1);
    entries.push((4, 9 << 20));
    post_stats(&mut r, &entries);
    r.run_until_idle();
    assert_eq!(r.dev().latest_stats().unwrap().free_memory, Some(7 << 20));
    assert_eq!(r.metric("stats_updates_count"), 1);
    assert_eq!(r.metric("malformed_chains"), 1, "{}", r.metrics());
}

#[test]
fn test_statistics_are_refused_when_not_configured() {
    let (r, _) = rig(BalloonConfig::default());
    assert!(matches!(
        r.dev().latest_stats(),
        Err(BalloonError::StatisticsDisabled)
    ));
    assert!(matches!(
        r.dev().set_stats_interval(5),
        Err(BalloonError::StatisticsStateChange)
    ));
    assert!(r.dev().set_stats_interval(0).is_ok());
    assert_eq!(
        r.dev().avail_features() & (1 << VIRTIO_BALLOON_F_STATS_VQ),
        0
    );
}

/// Posts a hinting command id (4 device-readable bytes) on queue `q`.
fn post_cmd<D: PageDiscard + 'static>(r: &mut Rig<D>, q: usize, cmd: u32) {
    let a = r.drv.alloc(4, 4).unwrap();
    r.drv.write_mem(a, &cmd.to_le_bytes()).unwrap();
    r.drv.submit(q, &[Segment::readable(a, 4)]).unwrap();
    r.drv.kick(q);
}

/// Posts one device-writable range of `n` pages on queue `q`; its guest
/// address.
fn post_range<D: PageDiscard + 'static>(r: &mut Rig<D>, q: usize, n: u64) -> u64 {
    let a = r.drv.alloc(n * PAGE, PAGE).unwrap();
    r.drv
        .submit(q, &[Segment::writable(a, (n * PAGE) as u32)])
        .unwrap();
    r.drv.kick(q);
    a.0
}

#[test]
fn test_a_hinting_run_gives_back_what_the_guest_hints_for_it_and_is_acknowledged() {
    let cfg = BalloonConfig {
        free_page_hinting: true,
        ..Default::default()
    };
    let (mut r, rec) = rig(cfg);
    // Without statistics the hinting queue is the third.
    let q = 2;
    // Ranges before any run are not given back.
    post_range(&mut r, q, 2);
    r.run_until_idle();
    assert!(rec.calls().is_empty());
    assert_eq!(
        r.dev().hinting_status().unwrap(),
        HintingStatus {
            host_cmd: 0,
            guest_cmd: None
        }
    );
    r.dev().start_hinting(true).unwrap();
    assert_eq!(config(&mut r)[2], 2);
    post_cmd(&mut r, q, 2);
    r.run_until_idle();
    // The guest took the run's id: the run goes on until it says STOP.
    assert_eq!(config(&mut r)[2], 2);
    let a = post_range(&mut r, q, 4);
    r.run_until_idle();
    assert_eq!(rec.calls(), [(host(&r, a), 4 * PAGE as usize)]);
    assert_eq!(r.metric("free_page_hint_count"), 1);
    assert_eq!(r.metric("free_page_hint_freed"), 4 * PAGE);
    // Done: STOP from the guest, DONE from the host at once.
    post_cmd(&mut r, q, FREE_PAGE_HINT_STOP);
    r.run_until_idle();
    assert_eq!(config(&mut r)[2], FREE_PAGE_HINT_DONE);
    let status = r.dev().hinting_status().unwrap();
    assert_eq!(
        serde_json::to_value(status).unwrap(),
        serde_json::json!({"host_cmd": 1, "guest_cmd": 0})
    );
    // With no run under way nothing is given back, even under the id the
    // host shows (DONE).
    post_cmd(&mut r, q, FREE_PAGE_HINT_DONE);
    post_range(&mut r, q, 1);
    r.run_until_idle();
    assert_eq!(rec.calls().len(), 1, "a range given back after DONE");
    // A second run without acknowledgement: a new id; a range sent under
    // the old one is not given back; stop says DONE.
    r.dev().start_hinting(false).unwrap();
    assert_eq!(config(&mut r)[2], 3);
    post_cmd(&mut r, q, 2);
    post_range(&mut r, q, 1);
    post_cmd(&mut r, q, FREE_PAGE_HINT_STOP);
    r.run_until_idle();
    assert_eq!(config(&mut r)[2], 3, "no acknowledgement asked for");
    assert_eq!(rec.calls().len(), 1);
    r.dev().stop_hinting().unwrap();
    assert_eq!(config(&mut r)[2], FREE_PAGE_HINT_DONE);
    // Every chain was answered.
    assert_eq!(r.drv.used(q).unwrap().len(), 9);
    // A range the host cannot give back is counted as such.
    *rec.fail.lock().unwrap() = Some(libc::EINVAL);
    r.dev().start_hinting(true).unwrap();
    post_cmd(&mut r, q, 4);
    post_range(&mut r, q, 1);
    r.run_until_idle();
    assert_eq!(r.metric("free_page_hint_fails"), 1);
    assert_eq!(r.metric("free_page_hint_count"), 1);
}

#[test]
fn test_hinting_is_refused_when_not_configured() {
    let (mut r, _) = rig(BalloonConfig::default());
    assert!(matches!(
        r.dev().start_hinting(true),
        Err(BalloonError::HintingNotEnabled)
    ));
    assert!(matches!(
        r.dev().hinting_status(),
        Err(BalloonError::HintingNotEnabled)
    ));
    assert!(matches!(
        r.dev().stop_hinting(),
        Err(BalloonError::HintingNotEnabled)
    ));
    r.drv.reset();
    r.run_until_idle();
}

#[test]
fn test_reported_ranges_are_given_back_in_whole_pages() {
    let cfg = BalloonConfig {
        free_page_reporting: true,
        stats_polling_interval_s: 5,
        free_page_hinting: true,
        ..Default::default()
    };
    let (mut r, rec) = rig(cfg);
    // Statistics and hinting come first: reporting is the fifth queue.
    let q = 4;
    let a = r.drv.alloc(8 * PAGE, PAGE).unwrap();
    // One whole range, one that starts and ends mid-page.
    let segs = [
        Segment::writable(a, 2 * PAGE as u32),
        Segment::writable(GuestAddress(a.0 + 3 * PAGE + 100), 3 * PAGE as u32),
    ];
    let head = r.drv.submit(q, &segs).unwrap();
    r.drv.kick(q);
    r.run_until_idle();
    assert_eq!(
        r.drv.used(q).unwrap(),
        [UsedElem {
            id: head.into(),
            len: 0
        }]
    );
    let h = host(&r, a.0);
    assert_eq!(
        rec.calls(),
        [
            (h, 2 * PAGE as usize),
            (h + 4 * PAGE as usize, 2 * PAGE as usize)
        ]
    );
    assert_eq!(r.metric("free_page_report_count"), 2);
    assert_eq!(r.metric("free_page_report_freed"), 4 * PAGE);
    // A device-readable range is refused.
    let bad = r
        .drv
        .submit(q, &[Segment::readable(a, PAGE as u32)])
        .unwrap();
    r.drv.kick(q);
    r.run_until_idle();
    assert_eq!(
        r.drv.used(q).unwrap(),
        [UsedElem {
            id: bad.into(),
            len: 0
        }]
    );
    assert_eq!(r.metric("malformed_chains"), 1);
}

#[test]
fn test_queues_follow_the_negotiated_features() {
    let cfg = BalloonConfig {
        free_page_reporting: true,
        stats_polling_interval_s: 5,
        free_page_hinting: true,
        deflate_on_oom: true,
        ..Default::default()
    };
    let rec = Recorder::default();
    let mem = guest_memory(MEM_SIZE).unwrap();
    // A driver that takes reporting but not statistics or hinting sets up
    // three queues; reporting is the third.
    let features = V1 | 1 << VIRTIO_BALLOON_F_PAGE_REPORTING;
    let mut r = rig_on(mem, cfg, rec.clone(), features);
    assert!(r.drv.transport().is_activated());
    assert_eq!(r.drv.status() & status::DEVICE_NEEDS_RESET, 0);
    assert_eq!(r.dev().queue_max_sizes().len(), 5);
    let a = post_range(&mut r, 2, 1);
    r.run_until_idle();
    assert_eq!(rec.calls(), [(host(&r, a), PAGE as usize)]);
    assert_eq!(r.metric("free_page_report_count"), 1);
    assert_eq!(r.dev().active_queues(V1), 2);
    assert_eq!(r.dev().active_queues(u64::MAX), 5);
}

/// Posts and kicks `chains` chains on queue `q`, each of
/// `MAX_PFNS_PER_CHAIN` page numbers of every other page (no two
/// contiguous), all in the same 2,048 pages.
fn post_scattered_chains<D: PageDiscard + 'static>(r: &mut Rig<D>, q: usize, chains: usize) {
    let p = pages(r, 2048);
    for _ in 0..chains {
        let pfns: Vec<u32> = (0..MAX_PFNS_PER_CHAIN as u32).map(|k| p + 2 * k).collect();
        let bytes: Vec<u8> = pfns.iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = r.drv.alloc(bytes.len() as u64, 4).unwrap();
        r.drv.write_mem(a, &bytes).unwrap();
        r.drv
            .add_chain(q, &[Segment::readable(a, bytes.len() as u32)])
            .unwrap();
    }
    r.drv.publish(q).unwrap();
    r.drv.kick(q);
}

#[test]
fn test_a_pass_yields_at_its_page_weight_and_every_chain_is_answered() {
    let (mut r, rec) = rig(BalloonConfig::default());
    // 40 chains of 1,024 scattered page numbers: 40,960 pages, 2.5 times
    // the page weight, every other page so no two are contiguous.
    let chains = 40;
    post_scattered_chains(&mut r, 0, chains);
    r.run_once(0);
    let first = rec.calls().len() as u64;
    assert!(
        first <= PASS_WEIGHT_PAGES + MAX_PFNS_PER_CHAIN as u64,
        "{first} madvise calls in one pass"
    );
    r.run_until_idle();
    assert_eq!(r.drv.used(0).unwrap().len(), chains);
    assert!(r.metric("pass_yields") >= 2, "{}", r.metrics());
    assert_eq!(
        r.metric("pages_inflated"),
        (chains * MAX_PFNS_PER_CHAIN) as u64
    );
}

/// A yielded pass of a queue other than the first is run again too: each
/// queue's pending bit is its own.
#[test]
fn test_a_yielded_deflate_pass_runs_again_until_every_chain_is_answered() {
    let (mut r, _) = rig(BalloonConfig::default());
    let chains = 40;
    post_scattered_chains(&mut r, 1, chains);
    r.run_once(0);
    let first = r.drv.used(1).unwrap().len();
    assert!(first < chains, "{first} chains in the first pass");
    r.run_until_idle();
    assert_eq!(first + r.drv.used(1).unwrap().len(), chains);
    assert!(r.metric("pass_yields") >= 2, "{}", r.metrics());
}

/// A reported range weighs on its pass by the whole pages it names: 20
/// chains of 1,024 pages each (the same range every time), and the first
/// pass stops after the 16 that reach the page weight.
#[test]
fn test_reported_pages_count_against_the_pass_page_weight() {
    let cfg = BalloonConfig {
        free_page_reporting: true,
        ..Default::default()
    };
    let (mut r, rec) = rig(cfg);
    // Inflate, deflate, then reporting.
    let q = 2;
    let per_chain = MAX_PFNS_PER_CHAIN as u64;
    let a = r.drv.alloc(per_chain * PAGE, PAGE).unwrap();
    let chains = 20;
    for _ in 0..chains {
        r.drv
            .add_chain(q, &[Segment::writable(a, (per_chain * PAGE) as u32)])
            .unwrap();
    }
    r.drv.publish(q).unwrap();
    r.drv.kick(q);
    r.run_once(0);
    let first = r.drv.used(q).unwrap().len();
    assert_eq!(first as u64, PASS_WEIGHT_PAGES / per_chain);
    assert_eq!(rec.calls().len(), first);
    r.run_until_idle();
    assert_eq!(first + r.drv.used(q).unwrap().len(), chains);
    assert_eq!(r.metric("free_page_report_count"), chains as u64);
    // One pass yielded; none of the others (the first passes of every
    // queue at activation, the last one here) did.
    assert_eq!(r.metric("pass_yields"), 1, "{}", r.metrics());
}

/// A pass answers at most `PASS_WEIGHT_CHAINS` chains, however light: 300
/// inflate chains of one page each on a ring of 512.
#[test]
fn test_a_pass_yields_at_its_chain_weight() {
    let cfg = BalloonConfig {
        queue_size: 512,
        ..Default::default()
    };
    let (mut r, _) = rig(cfg);
    let pfn = pages(&mut r, 1);
    let a = r.drv.alloc(4, 4).unwrap();
    r.drv.write_mem(a, &pfn.to_le_bytes()).unwrap();
    let chains = 300;
    for _ in 0..chains {
        r.drv.add_chain(0, &[Segment::readable(a, 4)]).unwrap();
    }
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_once(0);
    let first = r.drv.used(0).unwrap().len();
    assert_eq!(first, PASS_WEIGHT_CHAINS as usize);
    r.run_until_idle();
    assert_eq!(first + r.drv.used(0).unwrap().len(), chains);
    assert_eq!(r.metric("pages_inflated"), chains as u64);
    assert_eq!(r.metric("pass_yields"), 1, "{}", r.metrics());
}

#[test]
fn test_a_reset_clears_what_the_driver_said_and_disarms_the_timer() {
    let cfg = BalloonConfig {
        stats_polling_interval_s: 1,
        free_page_hinting: true,
        amount_mib: 2,
        ..Default::default()
    };
    let (mut r, _) = rig(cfg);
    assert!(r.dev().is_activated());
    post_stats(&mut r, &[(4, 5)]);
    r.drv
        .transport_mut()
        .write(CONFIG_SPACE_OFFSET + 4, &512u32.to_le_bytes());
    r.dev().start_hinting(true).unwrap();
    r.run_until_idle();
    assert!(r.dev().glue.timer_armed);
    r.drv.reset();
    r.run_until_idle();
    assert!(!r.dev().is_activated(), "activated after a reset");
    assert!(!r.dev().glue.timer_armed, "timer armed after a reset");
    assert_eq!(config(&mut r), [512, 0, FREE_PAGE_HINT_STOP]);
    let s = r.dev().latest_stats().unwrap();
    assert_eq!((s.free_memory, s.actual_pages, s.target_mib), (None, 0, 2));
    // No timer event reaches a reset device.
    assert_eq!(r.run_once(1500), 0);
    // A new run after the reset gets a new id.
    let offered = r.dev().avail_features();
    r.drv.init(offered).unwrap();
    r.run_until_idle();
    assert!(r.dev().glue.timer_armed);
    r.dev().start_hinting(true).unwrap();
    assert_eq!(config(&mut r)[2], 3);
}

#[test]
fn test_the_queue_size_must_be_a_power_of_two_up_to_the_maximum() {
    let mem = guest_memory(MEM_SIZE).unwrap();
    let with = |queue_size| {
        Balloon::new(
            BalloonConfig {
                queue_size,
                ..Default::default()
            },
            mem.clone(),
        )
    };
    for bad in [0, 3, 96, u16::MAX] {
        assert!(
            matches!(with(bad), Err(BalloonError::QueueSize(q)) if q == bad),
            "queue size {bad} accepted"
        );
    }
    for good in [1, 2, 256, crate::virtio::queue::MAX_QUEUE_SIZE] {
        assert!(with(good).is_ok(), "queue size {good} refused");
    }
}

#[test]
fn test_the_features_offered_are_the_ring_s_and_the_configuration_s() {
    use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
    let mem = guest_memory(MEM_SIZE).unwrap();
    let ring = V1 | 1 << VIRTIO_RING_F_EVENT_IDX | 1 << VIRTIO_RING_F_INDIRECT_DESC;
    let offered = |cfg| Balloon::new(cfg, mem.clone()).unwrap().avail_features();
    assert_eq!(offered(BalloonConfig::default()), ring);
    for (cfg, bit) in [
        (
            BalloonConfig {
                deflate_on_oom: true,
                ..Default::default()
            },
            VIRTIO_BALLOON_F_DEFLATE_ON_OOM,
        ),
        (
            BalloonConfig {
                stats_polling_interval_s: 1,
                ..Default::default()
            },
            VIRTIO_BALLOON_F_STATS_VQ,
        ),
        (
            BalloonConfig {
                free_page_hinting: true,
                ..Default::default()
            },
            VIRTIO_BALLOON_F_FREE_PAGE_HINT,
        ),
        (
            BalloonConfig {
                free_page_reporting: true,
                ..Default::default()
            },
            VIRTIO_BALLOON_F_PAGE_REPORTING,
        ),
    ] {
        assert_eq!(offered(cfg), ring | 1 << bit, "feature bit {bit}");
    }
}

#[test]
fn test_a_target_of_all_of_memory_is_accepted() {
    let mem = guest_memory(MEM_SIZE).unwrap();
    let all = BalloonConfig {
        amount_mib: (MEM_SIZE >> 20) as u32,
        ..Default::default()
    };
    assert!(Balloon::new(all, mem).is_ok());
}

#[test]
fn test_the_statistics_carry_the_target_and_what_the_driver_holds() {
    let cfg = BalloonConfig {
        amount_mib: 6,
        stats_polling_interval_s: 1,
        ..Default::default()
    };
    let (mut r, _) = rig(cfg);
    // The driver says it holds 5 MiB and a page.
    r.drv
        .transport_mut()
        .write(CONFIG_SPACE_OFFSET + 4, &(5u32 * 256 + 1).to_le_bytes());
    let s = r.dev().latest_stats().unwrap();
    assert_eq!(
        (s.target_pages, s.target_mib, s.actual_pages, s.actual_mib),
        (6 * 256, 6, 5 * 256 + 1, 5)
    );
    // `metrics()` is the set the device counts into (the VMM's writer
    // reads it): a write to the read-only target is counted there.
    let m = r.dev().metrics();
    r.drv.transport_mut().write(CONFIG_SPACE_OFFSET, &[0xff; 4]);
    assert_eq!(
        m.config_writes_ignored
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}
