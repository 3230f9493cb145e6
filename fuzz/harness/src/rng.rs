// SPDX-License-Identifier: Apache-2.0
//! Target `rng_datapath`: the real entropy device, on its event loop,
//! behind its MMIO transport, driven by arbitrary guest requests and
//! arbitrary ring and descriptor contents, over an entropy source that
//! fails as the input says (short returns, nothing, EINTR, EAGAIN, or the
//! kernel's `getrandom` itself), with or without a rate limiter whose
//! limits change while it runs.
//!
//! The input picks the device (queue size, features declined, limits)
//! and a sequence of steps: structured requests (any number of buffers of
//! any length, some device-readable or outside guest memory, through an
//! indirect table or not), raw descriptors and avail entries anywhere,
//! bytes written anywhere, kicks, event-loop iterations, new limits, and
//! resets with re-initialisation.
//!
//! Oracles after every step, whatever the input:
//! - nothing panics, and once the guest stops the loop goes idle within a
//!   bounded number of iterations;
//! - no pass reads more than `MAX_PASS_READS` ring entries and descriptors;
//! - the limiter is never exceeded: since it was (re)configured, the bytes
//!   served are at most the bandwidth bucket, what it refilled since and
//!   one request (a request larger than the bucket goes through once it is
//!   full, in debt), and the requests likewise with the ops bucket.
//!
//! And while the guest has written only structured requests:
//! - every used id is a head the driver published and has not had back;
//!   its used length is at most the chain's writable bytes (and at most a
//!   request's cap), and 0 for a chain the device must refuse (a readable
//!   buffer, one outside guest memory, no byte to fill);
//! - the bytes the device counts served are the sum of the used lengths.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arbitrary::Arbitrary;
use devices::rate_limiter::{RateLimiterConfig, TokenBucketConfig};
use devices::virtio::iov::IoVecs;
use devices::virtio::queue::MAX_PASS_READS;
use devices::virtio::rng::{EntropySource, Getrandom, Rng, RngConfig, MAX_REQUEST_BYTES};
use devices::virtio::test_utils::{guest_memory, DeviceRig, Segment, UsedElem};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use vm_memory::{Bytes, GuestAddress};

/// Guest memory: the driver's rings and buffers come from 1 MiB on.
const MEM_LEN: u64 = 4 << 20;
/// Event-loop iterations in which the device must go idle once the guest
/// stops: each pass consumes at least one chain or waits for the limiter.
const IDLE_ITERATIONS: usize = 4096;
/// Steps taken of an input.
const MAX_STEPS: usize = 64;
/// VIRTIO_F_VERSION_1, always accepted.
const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
/// VIRTIO_RING_F_INDIRECT_DESC.
const INDIRECT: u64 = 1 << VIRTIO_RING_F_INDIRECT_DESC;

/// Limits of the rate limiter: bytes and requests per `refill_ms`.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Limits {
    /// Bandwidth bucket size in bytes (folded into 1..=65536), if any.
    pub bytes: Option<u16>,
    /// Ops bucket size (folded into 1..=256), if any.
    pub ops: Option<u8>,
    /// Refill time in ms (folded into 1..=256).
    pub refill_ms: u8,
}

impl Limits {
    fn config(self) -> RateLimiterConfig {
        let bucket = |size: u64| TokenBucketConfig {
            size,
            one_time_burst: 0,
            refill_time: u64::from(self.refill_ms) + 1,
        };
        RateLimiterConfig {
            bandwidth: self.bytes.map(|b| bucket(u64::from(b) + 1)),
            ops: self.ops.map(|o| bucket(u64::from(o) + 1)),
        }
    }
}

/// The device.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Setup {
    /// log2 of the queue size, folded into 0..=8.
    pub queue_size_log2: u8,
    /// Features to decline, one bit per offered bit (VERSION_1 stays).
    pub decline: u64,
    /// The limits it starts with.
    pub limits: Option<Limits>,
}

/// What one call of the entropy source does.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Fill {
    /// Fills the whole buffer.
    Whole,
    /// Fills at most this many bytes.
    Short(u16),
    /// Returns 0 bytes.
    Nothing,
    /// Fails with EINTR.
    Interrupted,
    /// Fails with EAGAIN (`getrandom` before the pool is initialised).
    Again,
    /// The kernel's `getrandom`.
    Kernel,
}

/// One buffer of a structured request.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct Buf {
    /// Its length (folded into 0..=4096).
    pub len: u16,
    /// Device-readable: the device must refuse the chain.
    pub readable: bool,
    /// Outside guest memory: the device must refuse the chain.
    pub outside: bool,
}

/// A structured request.
#[derive(Debug, Clone, Arbitrary)]
pub struct Request {
    /// Its buffers (at most 8 are taken).
    pub bufs: Vec<Buf>,
    /// Through an indirect table (when negotiated).
    pub indirect: bool,
}

/// One step of the guest.
#[derive(Debug, Clone, Arbitrary)]
pub enum Step {
    /// A structured request, published and kicked.
    Request(Request),
    /// A structured request published without a kick.
    Quiet(Request),
    /// A descriptor written anywhere in the table.
    RawDesc {
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
    /// An avail entry naming any head, published and kicked.
    RawAvail {
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
    /// A kick.
    Kick,
    /// Event-loop iterations (folded into 1..=8).
    Run(u8),
    /// New limits while it runs (`None`: unlimited).
    Limit(Option<Limits>),
    /// A reset and a new initialisation.
    Reset,
}

/// A whole input.
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// The device.
    pub setup: Setup,
    /// The entropy source, call by call, then `Whole` for good.
    pub source: Vec<Fill>,
    /// What the guest does (at most 64 steps are taken).
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

/// The entropy source of an input: its script, then whole fills.
struct Scripted {
    script: Arc<Mutex<VecDeque<Fill>>>,
    byte: u8,
}

impl EntropySource for Scripted {
    fn fill(&mut self, buf: IoVecs<'_>) -> io::Result<usize> {
        let step = self
            .script
            .lock()
            .map(|mut s| s.pop_front())
            .unwrap_or(None);
        let n = match step.unwrap_or(Fill::Whole) {
            Fill::Whole => buf.len(),
            Fill::Short(n) => usize::from(n).min(buf.len()),
            Fill::Nothing => 0,
            Fill::Interrupted => return Err(io::ErrorKind::Interrupted.into()),
            Fill::Again => return Err(io::ErrorKind::WouldBlock.into()),
            Fill::Kernel => return Getrandom.fill(buf),
        };
        self.byte = self.byte.wrapping_add(1);
        Ok(buf.scatter(&vec![self.byte; n]))
    }
}

/// The limiter in force since `since`, when the device had served
/// `bytes` and `requests`.
struct LimitWindow {
    limits: Limits,
    since: Instant,
    bytes: u64,
    requests: u64,
}

struct Rig {
    r: DeviceRig<Rng<Scripted>>,
    features: u64,
    /// What each outstanding structured chain may get back: its cap, and
    /// whether it must be refused.
    posted: HashMap<u16, (u64, bool)>,
    /// Nothing but structured requests since the last initialisation.
    clean: bool,
    /// Nothing but structured requests since the device was made: the
    /// served bytes are the sum of the used lengths read.
    clean_life: bool,
    used_sum: u64,
    window: Option<LimitWindow>,
}

impl Rig {
    fn run(input: &Input) {
        let s = input.setup;
        let cfg = RngConfig {
            rate_limiter: s
                .limits
                .map_or_else(RateLimiterConfig::default, Limits::config),
            queue_size: 1 << (s.queue_size_log2 % 9),
        };
        let mem = guest_memory(MEM_LEN as usize).expect("guest memory");
        // Before the limiter is made: the window the oracle allows is then
        // at least as long as the limiter's own.
        let start = Instant::now();
        let source = Scripted {
            script: Arc::new(Mutex::new(input.source.iter().copied().collect())),
            byte: 0,
        };
        let dev = Rng::with_source(cfg, mem.clone(), source).expect("a valid device");
        let mut r = DeviceRig::new(&mem, dev);
        let offered = r.drv.device_features();
        let features = (offered & !s.decline) | VERSION_1;
        r.drv.init(features).expect("the device starts");
        let mut rig = Rig {
            r,
            features,
            posted: HashMap::new(),
            clean: true,
            clean_life: true,
            used_sum: 0,
            window: s.limits.map(|limits| LimitWindow {
                limits,
                since: start,
                bytes: 0,
                requests: 0,
            }),
        };
        for step in input.steps.iter().take(MAX_STEPS) {
            rig.step(step);
            rig.check();
        }
        let idle = rig.r.run_bounded(IDLE_ITERATIONS);
        assert!(idle.is_some(), "the event loop never went idle");
        rig.take_used();
        rig.check();
    }

    fn step(&mut self, step: &Step) {
        match step {
            Step::Request(req) => {
                if self.post(req) {
                    self.r.drv.kick(0);
                }
            }
            Step::Quiet(req) => {
                self.post(req);
            }
            Step::RawDesc {
                index,
                addr,
                len,
                flags,
                next,
            } => {
                self.dirty();
                if let Ok((q, mem)) = self.r.drv.queue_mut(0) {
                    let i = index % q.size();
                    let _ = q.write_desc(mem, i, *addr, *len, *flags, *next);
                }
            }
            Step::RawAvail { head } => {
                self.dirty();
                if let Ok((q, mem)) = self.r.drv.queue_mut(0) {
                    let _ = q.offer(mem, *head);
                }
                self.r.drv.kick(0);
            }
            Step::RawWrite { addr, bytes } => {
                self.dirty();
                let at = u64::from(*addr) % MEM_LEN;
                let n = bytes.len().min((MEM_LEN - at) as usize);
                let _ = self.r.drv.mem().write_slice(&bytes[..n], GuestAddress(at));
            }
            Step::Kick => self.r.drv.kick(0),
            Step::Run(n) => {
                for _ in 0..=(n % 8) {
                    self.r.run_once(0);
                }
            }
            Step::Limit(limits) => self.limit(*limits),
            Step::Reset => self.reset(),
        }
        self.take_used();
    }

    /// The guest wrote something the rig did not build.
    fn dirty(&mut self) {
        self.clean = false;
        self.clean_life = false;
    }

    /// Posts a structured request; false if it did not fit (nothing was
    /// published).
    fn post(&mut self, req: &Request) -> bool {
        let indirect = req.indirect && self.features & INDIRECT != 0;
        let mut segs = Vec::new();
        let mut refused = false;
        let mut cap = 0u64;
        for b in req.bufs.iter().take(8) {
            let len = u32::from(b.len) % 4097;
            let addr = if b.outside {
                GuestAddress(MEM_LEN + u64::from(b.len))
            } else {
                match self.r.drv.alloc(u64::from(len), 8) {
                    Ok(a) => a,
                    Err(_) => return false,
                }
            };
            refused |= b.readable || (b.outside && len > 0);
            cap += u64::from(len);
            segs.push(if b.readable {
                Segment::readable(addr, len)
            } else {
                Segment::writable(addr, len)
            });
        }
        if segs.is_empty() {
            return false;
        }
        refused |= cap == 0;
        let head = if indirect {
            let Ok(table) = self.r.drv.alloc(16 * segs.len() as u64, 16) else {
                return false;
            };
            self.r.drv.add_chain_indirect(0, &segs, 0, table)
        } else {
            self.r.drv.add_chain(0, &segs)
        };
        let Ok(head) = head else {
            return false;
        };
        let _ = self.r.drv.publish(0);
        self.posted
            .insert(head, (cap.min(MAX_REQUEST_BYTES as u64), refused));
        true
    }

    fn limit(&mut self, limits: Option<Limits>) {
        let cfg = limits.map_or_else(RateLimiterConfig::default, Limits::config);
        // Before the new buckets: a window at least as long as theirs.
        let now = Instant::now();
        self.r
            .dev()
            .set_rate_limiter(&cfg)
            .expect("limits the fuzzer builds are valid");
        self.window = limits.map(|limits| LimitWindow {
            limits,
            since: now,
            bytes: self.r.metric("entropy_bytes"),
            requests: self.r.metric("requests"),
        });
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

    /// Reads what the device used and checks it (module doc).
    fn take_used(&mut self) {
        let used: Vec<UsedElem> = self.r.drv.used(0).unwrap_or_default();
        for e in used {
            self.used_sum += u64::from(e.len);
            if !self.clean {
                continue;
            }
            let head = u16::try_from(e.id).expect("a used id names a descriptor");
            let (cap, refused) = self
                .posted
                .remove(&head)
                .unwrap_or_else(|| panic!("used id {head} is not an outstanding chain"));
            assert!(
                u64::from(e.len) <= cap,
                "used {} of a {cap}-byte chain",
                e.len
            );
            assert!(
                !refused || e.len == 0,
                "a chain to refuse got {} bytes",
                e.len
            );
        }
    }

    fn check(&mut self) {
        let m = self.r.metrics();
        let counter = |k: &str| m[k].as_u64().expect("a counter");
        let max = counter("max_descs_per_pass");
        assert!(max <= u64::from(MAX_PASS_READS), "{max} reads in one pass");
        let bytes = counter("entropy_bytes");
        if self.clean_life {
            assert_eq!(bytes, self.used_sum, "bytes counted are the used lengths");
        }
        if let Some(w) = &self.window {
            let ms = w.since.elapsed().as_millis() as u64 + 1;
            let refill = u64::from(w.limits.refill_ms) + 1;
            // A bucket of `size` refilled every `refill` ms, and one request
            // (the one that may leave it in debt), since the window opened.
            let allowed = |size: u64, one: u64| size + size * ms / refill + one;
            if let Some(b) = w.limits.bytes {
                let limit = allowed(u64::from(b) + 1, MAX_REQUEST_BYTES as u64);
                assert!(
                    bytes - w.bytes <= limit,
                    "{} bytes, {limit} allowed",
                    bytes - w.bytes
                );
            }
            if let Some(o) = w.limits.ops {
                let served = counter("requests") - w.requests;
                let limit = allowed(u64::from(o) + 1, 1);
                assert!(served <= limit, "{served} requests, {limit} allowed");
            }
        }
    }
}
