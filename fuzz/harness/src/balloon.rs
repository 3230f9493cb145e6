// SPDX-License-Identifier: Apache-2.0
//! Target `balloon_datapath`: the real balloon, on its event loop, behind
//! its MMIO transport, giving pages back with the real `madvise` on real
//! guest memory, driven by arbitrary page frame numbers, statistics,
//! hinting commands and ranges, reported ranges, raw ring and descriptor
//! contents, configuration writes, and the API's calls (target, statistics
//! interval, hinting runs) in any order.
//!
//! The input picks the device (queue size, which optional features it
//! offers, which the driver declines) and a sequence of steps.
//!
//! Oracles after every step, whatever the input:
//! - nothing panics, and once the guest stops the loop goes idle within a
//!   bounded number of iterations;
//! - nothing outside guest memory is ever given to `madvise`: every range
//!   the device gives back is whole host pages inside one of guest
//!   memory's mappings (checked at the call, before the real `madvise`);
//! - no pass reads more than `MAX_PASS_READS` ring entries and
//!   descriptors, and no pass makes more `madvise` calls than its page
//!   weight and one chain allow;
//! - the device writes nothing into a chain: every used length is 0.
//!
//! And while the guest has written only structured chains:
//! - every used id is a head the driver published on that queue and has
//!   not had back;
//! - the page frame numbers outside guest memory are exactly the ones
//!   counted refused, and the pages inflated and deflated exactly the
//!   distinct ones inside it, for the chains answered.
//!
//! Structured page frame numbers and ranges point into the first MiB of
//! guest memory, which the driver's allocator never hands out, so giving
//! them back never zeroes a ring the rig reads; raw steps may point
//! anywhere.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use devices::virtio::balloon::{
    Balloon, BalloonConfig, Madvise, PageDiscard, MAX_PFNS_PER_CHAIN, PASS_WEIGHT_PAGES,
};
use devices::virtio::queue::{IoSeg, MAX_PASS_READS};
use devices::virtio::test_utils::{guest_memory, DeviceRig, Segment, UsedElem, BUF_BASE};
use devices::virtio::{GuestMemory, VirtioDevice};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};

/// Guest memory; structured pages come from below [`BUF_BASE`].
const MEM_LEN: u64 = 4 << 20;
const PAGE: u64 = 4096;
/// Pages structured chains name inside guest memory (the first MiB).
const SAFE_PAGES: u32 = (BUF_BASE / PAGE) as u32;
/// Event-loop iterations in which the device must go idle.
const IDLE_ITERATIONS: usize = 4096;
/// Steps taken of an input.
const MAX_STEPS: usize = 64;
const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
/// `madvise` calls one pass may make: its page weight, the pages of the
/// chain that crossed it (at most a chain's page frame numbers or
/// segments).
const MAX_CALLS_PER_PASS: u64 = PASS_WEIGHT_PAGES + MAX_PFNS_PER_CHAIN as u64;

/// The device.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Setup {
    /// log2 of the queue size, folded into 0..=8.
    pub queue_size_log2: u8,
    /// Offer statistics (a 1 s interval).
    pub stats: bool,
    /// Offer free page hinting.
    pub hinting: bool,
    /// Offer free page reporting.
    pub reporting: bool,
    /// Offer DEFLATE_ON_OOM.
    pub deflate_on_oom: bool,
    /// Features to decline, one bit per offered bit (VERSION_1 stays).
    pub decline: u64,
}

/// Which of the balloon's queues.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Arbitrary)]
pub enum Q {
    /// Inflate.
    Inflate,
    /// Deflate.
    Deflate,
    /// Statistics.
    Stats,
    /// Hinting.
    Hint,
    /// Reporting.
    Report,
}

/// One page frame number of a structured chain.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Pfn {
    /// A page of the first MiB (folded).
    Inside(u16),
    /// A page past the end of guest memory (offset folded).
    Outside(u32),
}

/// One step of the guest or of the API.
#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    /// An inflate or deflate chain of page frame numbers, split over
    /// `split` buffers (folded into 1..=4).
    Pfns {
        /// Deflate rather than inflate.
        deflate: bool,
        /// Its page frame numbers (at most 1,024 taken).
        pfns: Vec<Pfn>,
        /// Buffers.
        split: u8,
    },
    /// A statistics report (tags and values).
    Stats(Vec<(u16, u64)>),
    /// A hinting command id.
    HintCmd(u32),
    /// A device-writable range of the first MiB on the hinting or the
    /// reporting queue (page and length folded).
    Range {
        /// Reporting rather than hinting.
        report: bool,
        /// Offset in bytes into the first MiB.
        offset: u32,
        /// Length in bytes (folded into 1..=64 KiB).
        len: u16,
    },
    /// A descriptor written anywhere in a queue's table.
    RawDesc {
        /// The queue.
        q: Q,
        /// Table index (mod the queue size).
        index: u16,
        /// Buffer address.
        addr: u64,
        /// Buffer length.
        len: u32,
        /// Flags.
        flags: u16,
        /// Next index.
        next: u16,
    },
    /// An avail entry naming any head on a queue, published and kicked.
    RawAvail {
        /// The queue.
        q: Q,
        /// The head.
        head: u16,
    },
    /// Bytes written anywhere in guest memory.
    RawWrite {
        /// Where (folded into guest memory).
        addr: u32,
        /// What.
        bytes: Vec<u8>,
    },
    /// A configuration-space write.
    Config {
        /// Offset.
        offset: u8,
        /// Bytes.
        bytes: Vec<u8>,
    },
    /// A kick on a queue.
    Kick(Q),
    /// Event-loop iterations (folded into 1..=8).
    Run(u8),
    /// `PATCH /balloon`.
    Target(u16),
    /// `PATCH /balloon/statistics`.
    Interval(u16),
    /// `PATCH /balloon/hinting/start`.
    StartHinting(bool),
    /// `PATCH /balloon/hinting/stop`.
    StopHinting,
    /// A reset and a new initialisation.
    Reset,
}

/// A whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// The device.
    pub setup: Setup,
    /// What the guest and the API do (at most 64 steps are taken).
    pub steps: Vec<Step>,
}

/// Runs one input; with `MINIVMM_FUZZ_DEBUG` set, prints it first.
pub fn run(data: &[u8]) {
    crate::with_input(data, |input: &Input| {
        if std::env::var_os("MINIVMM_FUZZ_DEBUG").is_some() {
            eprintln!("{input:#?}");
        }
        Rig::run(input)
    });
}

/// The real `madvise`, after checking that the range is whole pages of
/// one of guest memory's host mappings; counts its calls.
#[derive(Clone)]
struct Checked {
    /// Host ranges of guest memory.
    mappings: Arc<Vec<(usize, usize)>>,
    calls: Arc<Mutex<u64>>,
}

impl PageDiscard for Checked {
    fn discard(&mut self, pages: IoSeg) -> io::Result<()> {
        let (base, len) = (pages.base(), pages.len());
        assert!(len > 0 && base % PAGE as usize == 0 && len % PAGE as usize == 0);
        assert!(
            self.mappings
                .iter()
                .any(|&(start, n)| base >= start && base + len <= start + n),
            "madvise of {len} bytes at {base:#x} outside guest memory {:x?}",
            self.mappings
        );
        if let Ok(mut c) = self.calls.lock() {
            *c += 1;
        }
        Madvise.discard(pages)
    }
}

/// The host mappings of `mem`.
fn mappings(mem: &GuestMemory) -> Vec<(usize, usize)> {
    mem.iter()
        .map(|r| {
            let host = r.get_host_address(MemoryRegionAddress(0)).expect("mapped") as usize;
            (host, r.len() as usize)
        })
        .collect()
}

/// What a structured chain expects when it is answered.
#[derive(Debug, Clone, Copy, Default)]
struct Expect {
    refused_pfns: u64,
    good_pages: u64,
    deflate: bool,
}

struct Rig {
    r: DeviceRig<Balloon<Checked>>,
    features: u64,
    calls: Arc<Mutex<u64>>,
    /// Outstanding structured chains per queue index.
    posted: HashMap<(usize, u16), Expect>,
    clean: bool,
    clean_life: bool,
    /// Sums over the answered structured chains.
    refused: u64,
    inflated: u64,
    deflated: u64,
}

impl Rig {
    fn run(input: &Input) {
        let s = input.setup;
        let cfg = BalloonConfig {
            amount_mib: 0,
            deflate_on_oom: s.deflate_on_oom,
            stats_polling_interval_s: u16::from(s.stats),
            free_page_hinting: s.hinting,
            free_page_reporting: s.reporting,
            queue_size: 1 << (s.queue_size_log2 % 9),
        };
        let mem = guest_memory(MEM_LEN as usize).expect("guest memory");
        let calls = Arc::new(Mutex::new(0));
        let discard = Checked {
            mappings: Arc::new(mappings(&mem)),
            calls: calls.clone(),
        };
        let dev = Balloon::with_discard(cfg, mem.clone(), discard).expect("a valid device");
        let mut r = DeviceRig::new(&mem, dev);
        let offered = r.drv.device_features();
        let features = (offered & !s.decline) | VERSION_1;
        r.drv.init(features).expect("the device starts");
        let mut rig = Rig {
            r,
            features,
            calls,
            posted: HashMap::new(),
            clean: true,
            clean_life: true,
            refused: 0,
            inflated: 0,
            deflated: 0,
        };
        for step in input.steps.iter().take(MAX_STEPS) {
            let before = (rig.calls(), rig.r.metric("passes"));
            rig.step(step);
            rig.check(before);
        }
        let before = (rig.calls(), rig.r.metric("passes"));
        let idle = rig.r.run_bounded(IDLE_ITERATIONS);
        assert!(idle.is_some(), "the event loop never went idle");
        rig.take_used();
        rig.check(before);
    }

    fn calls(&self) -> u64 {
        self.calls.lock().map(|c| *c).unwrap_or(0)
    }

    /// The index of queue `q` with the negotiated features, if it is set up.
    fn index(&self, q: Q) -> Option<usize> {
        let present = devices::virtio::balloon::Vq::present(self.features);
        let want = match q {
            Q::Inflate => devices::virtio::balloon::Vq::Inflate,
            Q::Deflate => devices::virtio::balloon::Vq::Deflate,
            Q::Stats => devices::virtio::balloon::Vq::Stats,
            Q::Hint => devices::virtio::balloon::Vq::Hint,
            Q::Report => devices::virtio::balloon::Vq::Report,
        };
        present.iter().position(|&v| v == want)
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Pfns {
                deflate,
                pfns,
                split,
            } => self.pfns(*deflate, pfns, *split),
            Step::Stats(entries) => {
                let bytes: Vec<u8> = entries
                    .iter()
                    .take(32)
                    .flat_map(|&(t, v)| t.to_le_bytes().into_iter().chain(v.to_le_bytes()))
                    .collect();
                self.post_bytes(Q::Stats, &bytes);
            }
            Step::HintCmd(cmd) => self.post_bytes(Q::Hint, &cmd.to_le_bytes()),
            Step::Range {
                report,
                offset,
                len,
            } => self.range(*report, *offset, *len),
            Step::RawDesc {
                q,
                index,
                addr,
                len,
                flags,
                next,
            } => {
                self.dirty();
                if let Some(i) = self.index(*q) {
                    if let Ok((queue, mem)) = self.r.drv.queue_mut(i) {
                        let at = index % queue.size();
                        let _ = queue.write_desc(mem, at, *addr, *len, *flags, *next);
                    }
                }
            }
            Step::RawAvail { q, head } => {
                self.dirty();
                if let Some(i) = self.index(*q) {
                    if let Ok((queue, mem)) = self.r.drv.queue_mut(i) {
                        let _ = queue.offer(mem, *head);
                    }
                    self.r.drv.kick(i);
                }
            }
            Step::RawWrite { addr, bytes } => {
                self.dirty();
                let at = u64::from(*addr) % MEM_LEN;
                let n = bytes.len().min((MEM_LEN - at) as usize);
                let _ = self.r.drv.mem().write_slice(&bytes[..n], GuestAddress(at));
            }
            Step::Config { offset, bytes } => {
                let off = 0x100 + u64::from(*offset % 32);
                let n = bytes.len().min(8);
                self.r.drv.transport_mut().write(off, &bytes[..n]);
            }
            Step::Kick(q) => {
                if let Some(i) = self.index(*q) {
                    self.r.drv.kick(i);
                }
            }
            Step::Run(n) => {
                for _ in 0..=(n % 8) {
                    self.r.run_once(0);
                }
            }
            Step::Target(mib) => {
                let _ = self.r.dev().set_target(u32::from(*mib) % 8);
            }
            Step::Interval(s) => {
                let _ = self.r.dev().set_stats_interval(*s % 4);
            }
            Step::StartHinting(ack) => {
                let _ = self.r.dev().start_hinting(*ack);
            }
            Step::StopHinting => {
                let _ = self.r.dev().stop_hinting();
            }
            Step::Reset => self.reset(),
        }
        self.take_used();
    }

    fn dirty(&mut self) {
        self.clean = false;
        self.clean_life = false;
    }

    /// A structured inflate or deflate chain.
    fn pfns(&mut self, deflate: bool, pfns: &[Pfn], split: u8) {
        let q = if deflate { Q::Deflate } else { Q::Inflate };
        let mut e = Expect {
            deflate,
            ..Expect::default()
        };
        let mut good = BTreeSet::new();
        let values: Vec<u32> = pfns
            .iter()
            .take(MAX_PFNS_PER_CHAIN)
            .map(|p| match *p {
                Pfn::Inside(n) => {
                    let pfn = u32::from(n) % SAFE_PAGES;
                    good.insert(pfn);
                    pfn
                }
                Pfn::Outside(n) => {
                    e.refused_pfns += 1;
                    ((MEM_LEN / PAGE) as u32).saturating_add(n % (u32::MAX / 2))
                }
            })
            .collect();
        if values.is_empty() {
            return;
        }
        e.good_pages = good.len() as u64;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let parts = usize::from(split % 4) + 1;
        self.post_split(q, &bytes, parts, Some(e));
    }

    /// One device-readable chain of `bytes` on `q`.
    fn post_bytes(&mut self, q: Q, bytes: &[u8]) {
        self.post_split(q, bytes, 1, None);
    }

    /// `bytes` in `parts` device-readable buffers on `q`, published and
    /// kicked; `expect` for a page frame number chain.
    fn post_split(&mut self, q: Q, bytes: &[u8], parts: usize, expect: Option<Expect>) {
        let Some(i) = self.index(q) else {
            return;
        };
        let Ok(a) = self.r.drv.alloc(bytes.len().max(1) as u64, 8) else {
            return;
        };
        let _ = self.r.drv.write_mem(a, bytes);
        let chunk = bytes.len().div_ceil(parts).max(1);
        let segs: Vec<Segment> = (0..bytes.len())
            .step_by(chunk)
            .map(|off| {
                let n = chunk.min(bytes.len() - off);
                Segment::readable(GuestAddress(a.0 + off as u64), n as u32)
            })
            .collect();
        let segs = if segs.is_empty() {
            vec![Segment::readable(a, 0)]
        } else {
            segs
        };
        self.submit(i, &segs, expect.unwrap_or_default());
    }

    fn submit(&mut self, i: usize, segs: &[Segment], e: Expect) {
        if let Ok(head) = self.r.drv.add_chain(i, segs) {
            let _ = self.r.drv.publish(i);
            self.r.drv.kick(i);
            self.posted.insert((i, head), e);
        }
    }

    /// A device-writable range of the first MiB on the hinting or
    /// reporting queue.
    fn range(&mut self, report: bool, offset: u32, len: u16) {
        let q = if report { Q::Report } else { Q::Hint };
        let Some(i) = self.index(q) else {
            return;
        };
        let len = u32::from(len) % (64 << 10) + 1;
        let start = u64::from(offset) % (BUF_BASE - u64::from(len));
        self.submit(
            i,
            &[Segment::writable(GuestAddress(start), len)],
            Expect::default(),
        );
    }

    fn reset(&mut self) {
        self.r.drv.reset();
        self.r.run_until_idle();
        self.posted.clear();
        self.clean = true;
        self.r
            .drv
            .init(self.features)
            .expect("the device starts again");
    }

    /// Reads what every queue used and checks it (module doc).
    fn take_used(&mut self) {
        let n = self.r.dev().queue_max_sizes().len();
        for i in 0..n {
            let used: Vec<UsedElem> = self.r.drv.used(i).unwrap_or_default();
            for u in used {
                assert_eq!(u.len, 0, "the balloon wrote {} bytes into a chain", u.len);
                if !self.clean {
                    continue;
                }
                let head = u16::try_from(u.id).expect("a used id names a descriptor");
                let e = self
                    .posted
                    .remove(&(i, head))
                    .unwrap_or_else(|| panic!("used id {head} of queue {i} is not outstanding"));
                self.refused += e.refused_pfns;
                if e.deflate {
                    self.deflated += e.good_pages;
                } else {
                    self.inflated += e.good_pages;
                }
            }
        }
    }

    fn check(&mut self, (calls, passes): (u64, u64)) {
        let m = self.r.metrics();
        let counter = |k: &str| m[k].as_u64().expect("a counter");
        let max = counter("max_descs_per_pass");
        assert!(max <= u64::from(MAX_PASS_READS), "{max} reads in one pass");
        let (calls, passes) = (self.calls() - calls, counter("passes") - passes);
        assert!(
            calls <= passes * MAX_CALLS_PER_PASS,
            "{calls} madvise calls in {passes} passes"
        );
        if self.clean_life {
            assert_eq!(counter("pfns_refused"), self.refused, "{m}");
            assert_eq!(counter("pages_inflated"), self.inflated, "{m}");
            assert_eq!(counter("pages_deflated"), self.deflated, "{m}");
        }
    }
}
