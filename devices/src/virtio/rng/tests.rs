// SPDX-License-Identifier: Apache-2.0
//! The entropy device driven from the guest's side through the real MMIO
//! transport ([`DeviceRig`]): what it serves, what it refuses, what the
//! host's failures and the rate limiter do, how its passes are bounded.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::GuestAddress;

use super::*;
use crate::rate_limiter::TokenBucketConfig;
use crate::virtio::iov::IoVecs;
use crate::virtio::queue::{
    MAX_PASS_READS, PASS_WEIGHT_BYTES, PASS_WEIGHT_CHAINS, VIRTQ_DESC_F_WRITE,
};
use crate::virtio::test_utils::contract::{contract_suite, ContractDevice};
use crate::virtio::test_utils::{guest_memory, DeviceRig, MockDriver, Segment, UsedElem};
use crate::virtio::{GuestMemory, VirtioDevice, VIRTIO_MMIO_INT_VRING};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// Guest memory of the tests.
const MEM_SIZE: usize = 16 << 20;
/// What a Linux driver acks: everything offered.
const FEATURES: u64 =
    1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_RING_F_EVENT_IDX | 1 << VIRTIO_RING_F_INDIRECT_DESC;

/// The entropy device in the contract suite: requests of 8-byte buffers.
impl ContractDevice for Rng {
    type Keep = ();
    const QUEUE: usize = 0;
    const CONFIG_LEN: u64 = 0;
    const REFUSED: &'static str = "malformed_chains";

    fn make(mem: &GuestMemory) -> (Self, ()) {
        (Rng::new(RngConfig::default(), mem.clone()).unwrap(), ())
    }

    fn request(drv: &mut MockDriver, bufs: usize) -> Vec<Segment> {
        (0..bufs)
            .map(|_| Segment::writable(drv.alloc(8, 8).unwrap(), 8))
            .collect()
    }
}

contract_suite!(Rng);

/// What one call of a [`ScriptedSource`] does.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Fills at most this many bytes.
    Short(usize),
    /// Fails with this errno.
    Errno(i32),
}

/// A source that fills with a running byte pattern (so every byte written
/// is known) and does what its script says, call by call.
#[derive(Debug, Clone, Default)]
struct ScriptedSource {
    script: Arc<Mutex<VecDeque<Step>>>,
    calls: Arc<Mutex<Vec<usize>>>,
    next: u8,
}

impl EntropySource for ScriptedSource {
    fn fill(&mut self, buf: IoVecs<'_>) -> io::Result<usize> {
        self.calls.lock().unwrap().push(buf.len());
        let n = match self.script.lock().unwrap().pop_front() {
            Some(Step::Errno(e)) => return Err(io::Error::from_raw_os_error(e)),
            Some(Step::Short(n)) => n.min(buf.len()),
            None => buf.len(),
        };
        let bytes: Vec<u8> = (0..n)
            .map(|_| {
                self.next = self.next.wrapping_add(1) | 1;
                self.next
            })
            .collect();
        Ok(buf.scatter(&bytes))
    }
}

/// An initialised device with `cfg` over `source`.
fn rig_with<S: EntropySource + 'static>(cfg: RngConfig, source: S) -> DeviceRig<Rng<S>> {
    let mem = guest_memory(MEM_SIZE).unwrap();
    let dev = Rng::with_source(cfg, mem.clone(), source).unwrap();
    let mut rig = DeviceRig::new(&mem, dev);
    rig.drv.init(FEATURES).unwrap();
    rig.run_until_idle();
    rig
}

/// An initialised device over `getrandom`.
fn rig(cfg: RngConfig) -> DeviceRig<Rng> {
    rig_with(cfg, Getrandom)
}

/// Writable buffers of `lens` bytes, each filled with 0xee and followed by
/// 16 bytes of 0xee the device must not touch.
fn buffers<D: VirtioDevice + event_manager::MutEventSubscriber>(
    rig: &mut DeviceRig<D>,
    lens: &[u32],
) -> Vec<Segment> {
    lens.iter()
        .map(|&len| {
            let a = rig.drv.alloc(u64::from(len) + 16, 8).unwrap();
            rig.drv
                .write_mem(a, &vec![0xee; len as usize + 16])
                .unwrap();
            Segment::writable(a, len)
        })
        .collect()
}

/// The bytes of `segs` in order, and whether every byte after each stayed
/// 0xee.
fn contents<D: VirtioDevice + event_manager::MutEventSubscriber>(
    rig: &DeviceRig<D>,
    segs: &[Segment],
) -> (Vec<u8>, bool) {
    let mut data = Vec::new();
    let mut margins = true;
    for s in segs {
        data.extend(rig.drv.read_mem(s.addr, s.len as usize).unwrap());
        let after = rig
            .drv
            .read_mem(GuestAddress(s.addr.0 + u64::from(s.len)), 16)
            .unwrap();
        margins &= after.iter().all(|&b| b == 0xee);
    }
    (data, margins)
}

#[test]
fn test_a_request_is_filled_in_place_and_counted() {
    let mut r = rig(RngConfig::default());
    assert_eq!(r.drv.read_reg(0x008), 4, "device ID of an entropy source");
    let segs = buffers(&mut r, &[100, 300]);
    let head = r.drv.submit(0, &segs).unwrap();
    r.run_until_idle();
    assert_eq!(
        r.drv.used(0).unwrap(),
        [UsedElem {
            id: u32::from(head),
            len: 400
        }]
    );
    let (data, margins) = contents(&r, &segs);
    assert!(margins, "a byte past a buffer was written");
    // 100 random bytes all 0xee, or all the same: 2^-800.
    for part in [&data[..100], &data[100..]] {
        assert!(part.iter().any(|&b| b != part[0]), "not random: {part:?}");
    }
    assert_ne!(r.drv.interrupt_status() & VIRTIO_MMIO_INT_VRING, 0);
    assert_eq!(r.metric("entropy_bytes"), 400);
    assert_eq!(r.metric("requests"), 1);
    assert_eq!(r.metric("interrupts"), 1);
    assert_eq!(r.metric("features_negotiated"), FEATURES);
}

#[test]
fn test_one_call_per_segment_and_a_request_gets_at_most_its_cap() {
    let src = ScriptedSource::default();
    let calls = src.calls.clone();
    let mut r = rig_with(RngConfig::default(), src);
    let lens = [48 << 10, 48 << 10];
    let segs = buffers(&mut r, &lens);
    r.drv.submit(0, &segs).unwrap();
    r.run_until_idle();
    let cap = MAX_REQUEST_BYTES as u32;
    assert_eq!(r.drv.used(0).unwrap()[0].len, cap);
    // The first segment whole, the second up to the cap: one call each.
    assert_eq!(*calls.lock().unwrap(), [48 << 10, (64 - 48) << 10]);
    let (data, _) = contents(&r, &segs);
    assert!(data[..cap as usize].iter().all(|&b| b & 1 == 1), "filled");
    assert!(
        data[cap as usize..].iter().all(|&b| b == 0xee),
        "past the cap"
    );
    assert_eq!(r.metric("entropy_bytes"), u64::from(cap));
}

#[test]
fn test_short_returns_and_eintr_are_asked_again() {
    let src = ScriptedSource::default();
    src.script.lock().unwrap().extend([
        Step::Short(10),
        Step::Errno(libc::EINTR),
        Step::Short(50),
        Step::Short(0),
    ]);
    let calls = src.calls.clone();
    let mut r = rig_with(RngConfig::default(), src);
    let segs = buffers(&mut r, &[100]);
    r.drv.submit(0, &segs).unwrap();
    r.run_until_idle();
    assert_eq!(r.drv.used(0).unwrap()[0].len, 100);
    // 10, EINTR (asked again), 50, nothing (asked again), the rest.
    assert_eq!(*calls.lock().unwrap(), [100, 90, 90, 40, 40]);
    let (data, margins) = contents(&r, &segs);
    assert!(margins && data.iter().all(|&b| b & 1 == 1));
    assert_eq!(r.metric("host_rng_fails"), 0);
}

#[test]
fn test_a_failing_host_returns_what_was_filled_and_counts() {
    let src = ScriptedSource::default();
    src.script.lock().unwrap().extend([
        Step::Short(30),
        Step::Errno(libc::EAGAIN),
        // The next request: nothing twice in a row.
        Step::Short(0),
        Step::Short(0),
        // The next: EINTR twice in a row.
        Step::Errno(libc::EINTR),
        Step::Errno(libc::EINTR),
    ]);
    let mut r = rig_with(RngConfig::default(), src);
    let a = buffers(&mut r, &[64, 64]);
    let b = buffers(&mut r, &[64]);
    let d = buffers(&mut r, &[64]);
    let c = buffers(&mut r, &[64]);
    let heads: Vec<u16> = [&a, &b, &d, &c]
        .iter()
        .map(|s| r.drv.add_chain(0, s).unwrap())
        .collect();
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_until_idle();
    let used: Vec<(u32, u32)> = r
        .drv
        .used(0)
        .unwrap()
        .iter()
        .map(|e| (e.id, e.len))
        .collect();
    let h = |i: usize| u32::from(heads[i]);
    assert_eq!(used, [(h(0), 30), (h(1), 0), (h(2), 0), (h(3), 64)]);
    let (data, _) = contents(&r, &a);
    assert!(
        data[30..].iter().all(|&b| b == 0xee),
        "nothing past what was filled"
    );
    assert_eq!(r.metric("host_rng_fails"), 3);
    assert_eq!(r.metric("host_errors"), 3);
    assert_eq!(r.metric("requests"), 4);
    assert_eq!(r.metric("entropy_bytes"), 94, "the sum of the used lengths");
}

#[test]
fn test_hostile_chains_are_refused_counted_and_given_back_empty() {
    let mut r = rig(RngConfig::default());
    let outside = GuestAddress(MEM_SIZE as u64 + 0x1000);
    let good = buffers(&mut r, &[32]);
    let readable = {
        let s = buffers(&mut r, &[32]);
        vec![s[0], Segment::readable(s[0].addr, 8)]
    };
    let chains: Vec<(&str, Vec<Segment>)> = vec![
        ("a device-readable buffer", readable.clone()),
        (
            "a buffer outside guest memory",
            vec![Segment::writable(outside, 64)],
        ),
        (
            "across the end of guest memory",
            vec![Segment::writable(GuestAddress(MEM_SIZE as u64 - 8), 64)],
        ),
        ("no byte to fill", vec![Segment::writable(good[0].addr, 0)]),
    ];
    let mut heads = Vec::new();
    for (_, segs) in &chains {
        heads.push(r.drv.add_chain(0, segs).unwrap());
    }
    // A chain that loops: its one descriptor links to itself.
    let looped = r.drv.add_chain(0, &good).unwrap();
    let (q, mem) = r.drv.queue_mut(0).unwrap();
    let g = good[0];
    q.write_desc(mem, looped, g.addr.0, g.len, VIRTQ_DESC_F_WRITE | 1, looped)
        .unwrap();
    heads.push(looped);
    let fine = r.drv.add_chain(0, &good).unwrap();
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_until_idle();
    let used = r.drv.used(0).unwrap();
    let want: Vec<UsedElem> = heads
        .iter()
        .map(|&h| UsedElem {
            id: u32::from(h),
            len: 0,
        })
        .chain([UsedElem {
            id: u32::from(fine),
            len: 32,
        }])
        .collect();
    assert_eq!(used, want);
    assert_eq!(r.metric("malformed_chains"), 5);
    assert_eq!(r.metric("requests"), 1);
    assert_eq!(r.metric("entropy_bytes"), 32);
    let (data, _) = contents(&r, &readable[..1]);
    assert!(
        data.iter().all(|&b| b == 0xee),
        "a refused chain was written"
    );
}

#[test]
fn test_passes_yield_at_the_shared_weights() {
    let cfg = RngConfig {
        queue_size: 1024,
        ..RngConfig::default()
    };
    let mut r = rig_with(cfg, ScriptedSource::default());
    // More chains than the chain weight, one byte each.
    let n = PASS_WEIGHT_CHAINS as usize + 40;
    let buf = buffers(&mut r, &[1])[0];
    for _ in 0..n {
        r.drv.add_chain(0, &[buf]).unwrap();
    }
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_once(0);
    assert_eq!(r.drv.used(0).unwrap().len(), PASS_WEIGHT_CHAINS as usize);
    assert_eq!(r.metric("pass_yields"), 1);
    r.run_until_idle();
    assert_eq!(r.drv.used(0).unwrap().len(), 40);

    // Chains of the request cap: the byte weight ends the pass.
    let big = buffers(&mut r, &[MAX_REQUEST_BYTES as u32]);
    for _ in 0..12 {
        r.drv.add_chain(0, &big).unwrap();
    }
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_once(0);
    let per_pass = (PASS_WEIGHT_BYTES as usize).div_ceil(MAX_REQUEST_BYTES);
    assert_eq!(r.drv.used(0).unwrap().len(), per_pass);
    r.run_until_idle();
    assert_eq!(r.drv.used(0).unwrap().len(), 12 - per_pass);
    assert!(r.metric("max_descs_per_pass") <= u64::from(MAX_PASS_READS));
}

/// A limit of `size` tokens every `refill_ms` in the ops bucket
/// (`ops`) or the bandwidth bucket.
fn limit(ops: bool, size: u64, refill_ms: u64) -> RngConfig {
    let bucket = Some(TokenBucketConfig {
        size,
        one_time_burst: 0,
        refill_time: refill_ms,
    });
    let mut cfg = RngConfig::default();
    if ops {
        cfg.rate_limiter.ops = bucket;
    } else {
        cfg.rate_limiter.bandwidth = bucket;
    }
    cfg
}

/// Runs the loop until `n` used entries came back or 5 s passed.
fn collect(r: &mut DeviceRig<Rng>, n: usize) -> Vec<UsedElem> {
    let start = Instant::now();
    let mut used = Vec::new();
    while used.len() < n && start.elapsed() < Duration::from_secs(5) {
        r.run_once(20);
        used.extend(r.drv.used(0).unwrap());
    }
    used
}

#[test]
fn test_the_ops_bucket_holds_requests_back_in_order() {
    // Two requests per 100 ms.
    let mut r = rig(limit(true, 2, 100));
    let segs = buffers(&mut r, &[16]);
    let heads: Vec<u32> = (0..5)
        .map(|_| u32::from(r.drv.add_chain(0, &segs).unwrap()))
        .collect();
    r.drv.publish(0).unwrap();
    let start = Instant::now();
    r.drv.kick(0);
    r.run_once(0);
    let first = r.drv.used(0).unwrap();
    let due = 2 + (start.elapsed().as_millis() / 50) as usize;
    assert!(
        (2..=due.min(4)).contains(&first.len()),
        "{} served",
        first.len()
    );
    assert!(r.metric("rate_limiter_throttled") >= 1);
    // A kick while throttled runs no pass.
    let passes = r.metric("passes");
    r.drv.kick(0);
    r.run_once(0);
    assert_eq!(r.metric("passes"), passes);
    let rest = collect(&mut r, 5 - first.len());
    let took = start.elapsed();
    let order: Vec<u32> = first.iter().chain(&rest).map(|e| e.id).collect();
    assert_eq!(order, heads, "a held request keeps its place");
    assert!(first.iter().chain(&rest).all(|e| e.len == 16));
    assert!(
        took >= Duration::from_millis(100),
        "5 requests at 20/s took {took:?}"
    );
    assert!(r.dev().metrics().throttled_ns.total_ns() >= 50_000_000);
}

#[test]
fn test_the_bandwidth_bucket_charges_the_bytes_served() {
    // 1 KiB per 100 ms: four 512-byte requests take at least 100 ms.
    let mut r = rig(limit(false, 1024, 100));
    let segs = buffers(&mut r, &[512]);
    for _ in 0..4 {
        r.drv.add_chain(0, &segs).unwrap();
    }
    r.drv.publish(0).unwrap();
    let start = Instant::now();
    r.drv.kick(0);
    let used = collect(&mut r, 4);
    assert_eq!(used.len(), 4);
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(r.metric("entropy_bytes"), 2048);
    assert!(r.metric("rate_limiter_throttled") >= 1);
}

#[test]
fn test_new_limits_apply_while_it_runs_and_a_reset_drops_the_held_request() {
    let mut r = rig(limit(true, 1, 60_000));
    let segs = buffers(&mut r, &[8]);
    for _ in 0..2 {
        r.drv.add_chain(0, &segs).unwrap();
    }
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_until_idle();
    assert_eq!(r.drv.used(0).unwrap().len(), 1, "one token a minute");
    // Lifting the limit: the held request is tried again at once.
    r.dev()
        .set_rate_limiter(&crate::rate_limiter::RateLimiterConfig::default())
        .unwrap();
    assert_eq!(collect(&mut r, 1).len(), 1);
    assert_eq!(r.dev().config().rate_limiter, Default::default());
    // Limited again, a request held, then a reset: it is dropped, the
    // wait ends, and the next activation serves at once.
    r.dev()
        .set_rate_limiter(&limit(true, 1, 60_000).rate_limiter)
        .unwrap();
    for _ in 0..2 {
        r.drv.add_chain(0, &segs).unwrap();
    }
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_until_idle();
    assert_eq!(r.drv.used(0).unwrap().len(), 1);
    r.drv.reset();
    r.run_until_idle();
    assert!(!r.dev().metrics().throttled_ns.is_running());
    assert!(r.dev().set_rate_limiter(&Default::default()).is_ok());
    r.drv.init(FEATURES).unwrap();
    r.drv.submit(0, &segs).unwrap();
    r.run_until_idle();
    assert_eq!(r.drv.used(0).unwrap().len(), 1);
}

#[test]
fn test_a_bad_configuration_makes_no_device() {
    let mem = guest_memory(1 << 20).unwrap();
    for qs in [0, 3, 1 << 15 | 1] {
        let cfg = RngConfig {
            queue_size: qs,
            ..RngConfig::default()
        };
        let e = Rng::new(cfg, mem.clone()).unwrap_err();
        assert!(matches!(e, RngError::QueueSize(q) if q == qs), "{e}");
    }
    let mut cfg = limit(true, 0, 100);
    assert!(matches!(
        Rng::new(cfg, mem.clone()),
        Err(RngError::RateLimiter(_))
    ));
    cfg = limit(true, 1, 100);
    let mut dev = Rng::new(cfg, mem).unwrap();
    let bad = limit(false, 1, 0).rate_limiter;
    assert!(dev.set_rate_limiter(&bad).is_err());
    assert_eq!(
        dev.config().rate_limiter,
        cfg.rate_limiter,
        "unchanged on Err"
    );
}

/// A guest repeating refused chains adds a bounded number of log lines
/// (the 1st, 2nd, 4th, 8th... of each kind), not one per chain, and every
/// chain still comes back.
#[test]
fn test_a_flood_of_refused_chains_logs_a_few_lines() {
    use crate::virtio::test_utils::checks::test_log;
    let mut r = rig(RngConfig::default());
    let base = test_log::records();
    let seg = buffers(&mut r, &[16])[0];
    let readable = Segment::readable(seg.addr, 16);
    let mut refused = 0;
    for _ in 0..20 {
        for _ in 0..50 {
            r.drv.add_chain(0, &[readable]).unwrap();
        }
        r.drv.publish(0).unwrap();
        r.drv.kick(0);
        r.run_until_idle();
        let used = r.drv.used(0).unwrap();
        assert!(used.iter().all(|e| e.len == 0));
        refused += used.len();
    }
    assert_eq!(refused, 1000);
    assert_eq!(r.metric("malformed_chains"), 1000);
    let lines = test_log::records() - base;
    // 1, 2, 4, ..., 512: ten lines for a thousand refusals.
    assert!((1..=12).contains(&lines), "{lines} log lines");
}

/// The shared bound is tight: a pass whose budget has one read left when
/// it takes the costliest chain there is (an indirect table of one more
/// buffer than a chain may have) reads `MAX_PASS_READS - 1`, the last read
/// of the bound being the look at `avail.idx` that only a driver racing
/// the device makes the pass take.
#[test]
fn test_a_pass_reads_up_to_the_shared_bound_and_no_more() {
    use crate::virtio::queue::{MAX_CHAIN_SEGS, PASS_DESC_BUDGET};
    let cfg = RngConfig {
        queue_size: 1024,
        ..RngConfig::default()
    };
    let mut r = rig(cfg);
    let byte = buffers(&mut r, &[1])[0];
    let post = |r: &mut DeviceRig<Rng>, bufs: usize| {
        let table = r.drv.alloc(16 * bufs as u64, 16).unwrap();
        r.drv
            .add_chain_indirect(0, &vec![byte; bufs], 0, table)
            .unwrap()
    };
    // Seven chains of 1,022 buffers (1,024 reads each: the avail entry,
    // the table's descriptor, its entries), then one of 1,021: 8,191 reads.
    for _ in 0..7 {
        post(&mut r, 1022);
    }
    post(&mut r, 1021);
    let costly = post(&mut r, MAX_CHAIN_SEGS + 1);
    r.drv.publish(0).unwrap();
    r.drv.kick(0);
    r.run_once(0);
    let used = r.drv.used(0).unwrap();
    assert_eq!(used.len(), 9);
    assert_eq!(
        used[8],
        UsedElem {
            id: u32::from(costly),
            len: 0
        }
    );
    assert_eq!(
        r.metric("malformed_chains"),
        1,
        "the costly chain is refused"
    );
    let max = r.metric("max_descs_per_pass");
    assert_eq!(
        max,
        u64::from(PASS_DESC_BUDGET) - 1 + 2 + (MAX_CHAIN_SEGS as u64 + 1)
    );
    assert_eq!(max, u64::from(MAX_PASS_READS) - 1);
}

#[test]
fn test_a_restored_entropy_device_resumes_its_bucket() {
    let mem = guest_memory(MEM_SIZE).unwrap();
    let cfg = limit(false, 1024, 60_000);
    let mut a = Rng::new(cfg, mem.clone()).unwrap();
    assert!(a.rq.limiter.as_mut().unwrap().consume(1000).unwrap());
    let state = a.save_state();
    assert_eq!(state["rate_limiter"]["bandwidth"]["budget"], 24);
    let mut b = Rng::new(cfg, mem.clone()).unwrap();
    b.restore_state(&state).unwrap();
    assert!(!b.rq.limiter.as_mut().unwrap().consume(100).unwrap());
    let mut forged = state.clone();
    forged["rate_limiter"]["bandwidth"]["refill_time"] = 1.into();
    let err = Rng::new(cfg, mem.clone())
        .unwrap()
        .restore_state(&forged)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("refill_time 1 ms, the configured one 1024 and 60000 ms"),
        "{err}"
    );
    // An unlimited device saves no bucket and takes back only that.
    let free = Rng::new(RngConfig::default(), mem).unwrap();
    assert!(free.save_state()["rate_limiter"]["bandwidth"].is_null());
}
