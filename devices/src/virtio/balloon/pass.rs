// SPDX-License-Identifier: Apache-2.0
//! The balloon's datapath: one bounded pass over one of its queues
//! ([`BalloonVirtio::process`]), and the statistics request the timer makes
//! ([`BalloonVirtio::request_stats`]).
//!
//! | queue | a chain is | the device |
//! |---|---|---|
//! | inflate | device-readable `u32` page frame numbers, at most [`MAX_PFNS_PER_CHAIN`] | checks each against guest memory, gives the good ones back (one `madvise` per run of contiguous pages), counts the others |
//! | deflate | the same | checks and counts them; the guest's next access faults the pages back in |
//! | stats | device-readable 10-byte entries, at most [`MAX_STATS`] | takes the report and holds the chain until it wants the next one |
//! | hinting | a 4-byte device-readable command id, or device-writable hinted ranges | records the guest's command; gives the ranges of the run the host started back |
//! | reporting | device-writable reported ranges | gives them back |
//!
//! Every chain but the held statistics buffer is returned at once, used
//! length 0 (the device writes nothing into the guest). A refused chain is
//! returned the same way and counted in `malformed_chains`.
//!
//! **Every pass is bounded** by the shared descriptor budget and chain
//! weight, and by [`PASS_WEIGHT_PAGES`] pages given back or checked, so a
//! pass makes at most a few thousand `madvise` calls and reads at most
//! `MAX_PASS_READS` ring entries and descriptors, whatever the guest
//! writes; the event glue re-queues a pass that yields behind every other
//! ready event. Used entries are published, and the interrupt decided,
//! once per pass.

use std::sync::atomic::{AtomicU64, Ordering};

use super::discard::PageDiscard;
use super::metrics::BalloonMetrics;
use super::stats::{BalloonStats, MAX_STATS, STAT_ENTRY_LEN};
use super::{
    Vq, BALLOON_PAGE_SIZE, FREE_PAGE_HINT_DONE, FREE_PAGE_HINT_STOP, MAX_PFNS_PER_CHAIN,
    PASS_WEIGHT_PAGES, VIRTIO_BALLOON_PFN_SHIFT,
};
use crate::virtio::events;
use crate::virtio::iov::{self, whole_pages};
use crate::virtio::pass::{self, more_after_drained, queue_failed, refuse_chain};
use crate::virtio::queue::{
    Budget, Chain, ChainError, ChainRules, IoSeg, QueueError, SplitQueue, PASS_WEIGHT_CHAINS,
};
use crate::virtio::Interrupt;
use crate::warn::warn_rate_limited;

const DEVICE: &str = "virtio-balloon";

/// How a pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassStatus {
    /// The avail ring is empty and notifications are enabled again.
    Done,
    /// A weight or the descriptor budget ran out with chains available.
    Yield,
    /// The queue is unusable until the driver resets the device.
    Broken,
}

/// Where a free page hinting run stands (Firecracker's protocol).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HintState {
    /// The command id in the configuration space: a run id (2 and up), or
    /// STOP or DONE.
    pub host_cmd: u32,
    /// The last run id the host handed out.
    pub last_cmd_id: u32,
    /// The last command id the guest sent.
    pub guest_cmd: Option<u32>,
    /// Tell the guest DONE as soon as it says it has hinted everything.
    pub ack_on_stop: bool,
    /// The guest sent STOP since the device last looked.
    pub guest_stopped: bool,
}

impl HintState {
    /// Whether a run is under way: hinted ranges are given back only then.
    pub fn running(&self) -> bool {
        self.host_cmd != FREE_PAGE_HINT_STOP && self.host_cmd != FREE_PAGE_HINT_DONE
    }
}

/// What a pass may use and change besides its queue.
pub struct PassEnv<'a, D: PageDiscard> {
    /// Where pages go back.
    pub discard: &'a mut D,
    /// The counters.
    pub metrics: &'a BalloonMetrics,
    /// The interrupt of the activation.
    pub irq: &'a dyn Interrupt,
    /// The statistics the driver last reported.
    pub stats: &'a mut BalloonStats,
    /// The free page hinting run.
    pub hint: &'a mut HintState,
}

/// One queue of an activation.
#[derive(Debug)]
struct Queue {
    vq: Vq,
    queue: SplitQueue,
    broken: bool,
}

/// What one pass has done so far.
struct Progress {
    budget: Budget,
    chains: u32,
    pages: u64,
}

impl Progress {
    fn spent(&self) -> bool {
        self.chains >= PASS_WEIGHT_CHAINS
            || self.pages >= PASS_WEIGHT_PAGES
            || self.budget.exhausted()
    }
}

/// The queues of one activation.
#[derive(Debug)]
pub struct BalloonVirtio {
    queues: Vec<Queue>,
    /// The statistics buffer held until the next request.
    stats_head: Option<u16>,
    segs: Vec<IoSeg>,
    bytes: Vec<u8>,
    runs: Vec<IoSeg>,
}

impl BalloonVirtio {
    /// Wraps the queues the driver set up, in order, as `vqs` names them.
    pub(crate) fn new(vqs: &[Vq], queues: Vec<SplitQueue>) -> Self {
        BalloonVirtio {
            queues: vqs
                .iter()
                .zip(queues)
                .map(|(&vq, queue)| Queue {
                    vq,
                    queue,
                    broken: false,
                })
                .collect(),
            stats_head: None,
            segs: Vec::new(),
            bytes: Vec::new(),
            runs: Vec::new(),
        }
    }

    /// Which queue sits at index `i`.
    pub fn vq_at(&self, i: usize) -> Option<Vq> {
        self.queues.get(i).map(|q| q.vq)
    }

    /// Whether the statistics queue is set up.
    pub fn has(&self, vq: Vq) -> bool {
        self.queues.iter().any(|q| q.vq == vq)
    }

    /// One pass over queue `vq` (module doc).
    pub fn process<D: PageDiscard>(&mut self, vq: Vq, env: &mut PassEnv<'_, D>) -> PassStatus {
        let Some(i) = self.queues.iter().position(|q| q.vq == vq) else {
            return PassStatus::Done;
        };
        let m = env.metrics;
        let q = &mut self.queues[i];
        let Some(budget) = pass::begin(&mut q.queue, q.broken, &m.queue.passes) else {
            return PassStatus::Broken;
        };
        let mut p = Progress {
            budget,
            chains: 0,
            pages: 0,
        };
        let status = match self.drain(i, &mut p, env) {
            Ok(s) => s,
            Err(e) => {
                queue_failed(&m.queue.queue_errors, DEVICE, vq.name(), &e);
                self.queues[i].broken = true;
                PassStatus::Broken
            }
        };
        let yielded = status == PassStatus::Yield;
        pass::end(
            &mut self.queues[i].queue,
            &p.budget,
            yielded,
            env.irq,
            &m.queue,
        );
        status
    }

    /// Serves chains of queue `i` until its ring is empty or a bound is
    /// reached.
    fn drain<D: PageDiscard>(
        &mut self,
        i: usize,
        p: &mut Progress,
        env: &mut PassEnv<'_, D>,
    ) -> Result<PassStatus, QueueError> {
        loop {
            if p.spent() {
                if self.queues[i].queue.has_available()? {
                    return Ok(PassStatus::Yield);
                }
            } else if let Some(head) = self.queues[i].queue.pop(&mut p.budget)? {
                p.chains += 1;
                p.pages += self.serve(i, head, &mut p.budget, env);
                continue;
            }
            if !more_after_drained(&mut self.queues[i].queue, &mut p.budget)? {
                return Ok(PassStatus::Done);
            }
        }
    }

    /// Serves the chain at `head` of queue `i`; returns the pages it gave
    /// back or checked (the pass's page weight).
    fn serve<D: PageDiscard>(
        &mut self,
        i: usize,
        head: u16,
        budget: &mut Budget,
        env: &mut PassEnv<'_, D>,
    ) -> u64 {
        self.segs.clear();
        let vq = self.queues[i].vq;
        let pages = match vq {
            Vq::Inflate | Vq::Deflate => self.page_numbers(i, head, budget, env),
            Vq::Stats => {
                self.stats(i, head, budget, env);
                return 0;
            }
            Vq::Hint => self.hint(i, head, budget, env),
            Vq::Report => self.report(i, head, budget, env),
        };
        if let Some(pages) = pages {
            self.queues[i].queue.add_used(head, 0);
            return pages;
        }
        0
    }

    /// Walks the chain at `head` of queue `i` under `rules` into
    /// `self.segs`; `None` when it is refused (and given back).
    fn walk(
        &mut self,
        i: usize,
        head: u16,
        rules: &ChainRules,
        budget: &mut Budget,
        m: &BalloonMetrics,
    ) -> Option<Chain> {
        let walked = self.queues[i]
            .queue
            .walk(head, rules, &mut self.segs, budget);
        self.walked(i, head, walked, m)
    }

    /// The chain a walk of `head` of queue `i` gave, or `None` after the
    /// chain was refused for the walk's error (given back with length 0,
    /// counted, logged).
    fn walked<C>(
        &mut self,
        i: usize,
        head: u16,
        walked: Result<C, ChainError>,
        m: &BalloonMetrics,
    ) -> Option<C> {
        let err = match walked {
            Ok(chain) => return Some(chain),
            Err(e) => e,
        };
        let q = &mut self.queues[i];
        refuse_chain(
            &mut q.queue,
            &m.malformed_chains,
            DEVICE,
            q.vq.name(),
            head,
            err,
        );
        None
    }

    /// Refuses the chain at `head` of queue `i` whose length `len` is no
    /// whole number of `unit`-byte entries.
    fn refuse_len(&mut self, i: usize, head: u16, len: usize, unit: usize, m: &BalloonMetrics) {
        let n = events::inc(&m.malformed_chains);
        let q = &mut self.queues[i];
        warn_rate_limited!(
            count = n,
            "{DEVICE}: {}chain {head} refused: {len} bytes is no whole number of {unit}-byte entries",
            q.vq.name()
        );
        q.queue.add_used(head, 0);
    }

    /// An inflate or deflate chain: the page frame numbers it carries,
    /// checked, and (inflate) given back. `None` when it is refused.
    fn page_numbers<D: PageDiscard>(
        &mut self,
        i: usize,
        head: u16,
        budget: &mut Budget,
        env: &mut PassEnv<'_, D>,
    ) -> Option<u64> {
        const RULES: ChainRules = ChainRules {
            device_writes: false,
            min_len: 4,
            max_len: MAX_PFNS_PER_CHAIN * 4,
        };
        let m = env.metrics;
        let chain = self.walk(i, head, &RULES, budget, m)?;
        if !chain.len.is_multiple_of(4) {
            self.refuse_len(i, head, chain.len, 4, m);
            return None;
        }
        // Read once: the guest may rewrite the array meanwhile.
        self.bytes.clear();
        iov::copy_from_segs(&self.segs, &mut self.bytes);
        let inflate = self.queues[i].vq == Vq::Inflate;
        let pages = self.check_pfns(i, m);
        if inflate {
            events::inc(&m.inflate_count);
            events::add(&m.pages_inflated, pages);
            self.give_back_runs(env);
        } else {
            events::inc(&m.deflate_count);
            events::add(&m.pages_deflated, pages);
        }
        Some(pages)
    }

    /// Translates the page frame numbers in `self.bytes` against guest
    /// memory; the pages of those inside it go to `self.runs` (sorted by
    /// host address, once each), the others are counted in `pfns_refused`.
    /// Returns how many were good.
    fn check_pfns(&mut self, i: usize, m: &BalloonMetrics) -> u64 {
        self.runs.clear();
        let mem = self.queues[i].queue.memory().clone();
        let mut refused = 0;
        for pfn in self.bytes.chunks_exact(4) {
            let pfn = u32::from_le_bytes([pfn[0], pfn[1], pfn[2], pfn[3]]);
            let gpa = u64::from(pfn) << VIRTIO_BALLOON_PFN_SHIFT;
            match mem.segment(gpa, BALLOON_PAGE_SIZE) {
                Some(seg) => self.runs.push(seg),
                None => refused += 1,
            }
        }
        if refused > 0 {
            let n = m.pfns_refused.fetch_add(refused, Ordering::Relaxed) + refused;
            warn_rate_limited!(
                count = n,
                "{DEVICE}: {refused} page frame numbers outside guest memory refused"
            );
        }
        self.runs.sort_unstable_by_key(IoSeg::base);
        self.runs.dedup();
        self.runs.len() as u64
    }

    /// Gives the pages in `self.runs` back, one call per run of pages
    /// contiguous on the host.
    fn give_back_runs<D: PageDiscard>(&mut self, env: &mut PassEnv<'_, D>) {
        let mut k = 0;
        while k < self.runs.len() {
            let mut run = self.runs[k];
            k += 1;
            while let Some(joined) = self.runs.get(k).and_then(|&next| iov::join_segs(run, next)) {
                run = joined;
                k += 1;
            }
            if give_back(env, run).is_some() {
                events::add(&env.metrics.inflate_freed, run.len() as u64);
            }
        }
    }

    /// A statistics chain: the report taken, the chain held until the next
    /// request (one held before it is given back: a driver that posts two
    /// wants both answered).
    fn stats<D: PageDiscard>(
        &mut self,
        i: usize,
        head: u16,
        budget: &mut Budget,
        env: &mut PassEnv<'_, D>,
    ) {
        const RULES: ChainRules = ChainRules {
            device_writes: false,
            min_len: 0,
            max_len: MAX_STATS * STAT_ENTRY_LEN,
        };
        let m = env.metrics;
        let Some(chain) = self.walk(i, head, &RULES, budget, m) else {
            return;
        };
        if !chain.len.is_multiple_of(STAT_ENTRY_LEN) {
            return self.refuse_len(i, head, chain.len, STAT_ENTRY_LEN, m);
        }
        self.bytes.clear();
        iov::copy_from_segs(&self.segs, &mut self.bytes);
        events::add(&m.stats_update_fails, env.stats.take_report(&self.bytes));
        events::inc(&m.stats_updates_count);
        if let Some(old) = self.stats_head.replace(head) {
            self.queues[i].queue.add_used(old, 0);
        }
    }

    /// A hinting chain: a command id (4 device-readable bytes) and/or
    /// hinted ranges (device-writable); the ranges are given back while the
    /// host's run is the one the guest last named. `None` when refused.
    fn hint<D: PageDiscard>(
        &mut self,
        i: usize,
        head: u16,
        budget: &mut Budget,
        env: &mut PassEnv<'_, D>,
    ) -> Option<u64> {
        let max = (MAX_PFNS_PER_CHAIN as u64) << 22;
        let m = env.metrics;
        let walked = self.queues[i]
            .queue
            .walk_mixed(head, max, &mut self.segs, budget);
        let chain = self.walked(i, head, walked, m)?;
        match chain.readable_len {
            0 => {}
            4 => {
                let (cmd, _) = iov::read_array::<4>(&self.segs[..chain.readable_segs], 0);
                let cmd = u32::from_le_bytes(cmd);
                env.hint.guest_cmd = Some(cmd);
                if cmd == FREE_PAGE_HINT_STOP || cmd == FREE_PAGE_HINT_DONE {
                    env.hint.guest_stopped = true;
                }
            }
            len => {
                self.refuse_len(i, head, len as usize, 4, m);
                return None;
            }
        }
        let h = *env.hint;
        if chain.writable_len == 0 || !h.running() || h.guest_cmd != Some(h.host_cmd) {
            return Some(0);
        }
        let c = RangeCounters {
            count: &m.free_page_hint_count,
            freed: &m.free_page_hint_freed,
            fails: &m.free_page_hint_fails,
        };
        Some(give_back_ranges(&self.segs[chain.readable_segs..], env, c))
    }

    /// A reporting chain: every reported range given back. `None` when
    /// refused.
    fn report<D: PageDiscard>(
        &mut self,
        i: usize,
        head: u16,
        budget: &mut Budget,
        env: &mut PassEnv<'_, D>,
    ) -> Option<u64> {
        const RULES: ChainRules = ChainRules {
            device_writes: true,
            min_len: 1,
            max_len: usize::MAX,
        };
        let m = env.metrics;
        self.walk(i, head, &RULES, budget, m)?;
        let c = RangeCounters {
            count: &m.free_page_report_count,
            freed: &m.free_page_report_freed,
            fails: &m.free_page_report_fails,
        };
        Some(give_back_ranges(&self.segs, env, c))
    }

    /// The statistics timer fired: gives the held buffer back (the driver
    /// answers with a new report). False when the device holds none (the
    /// driver has not answered the last request yet, or has no statistics
    /// queue).
    pub fn request_stats(&mut self, metrics: &BalloonMetrics, irq: &dyn Interrupt) -> bool {
        let Some(q) = self.queues.iter_mut().find(|q| q.vq == Vq::Stats) else {
            return false;
        };
        let Some(head) = self.stats_head.take() else {
            return false;
        };
        if q.broken {
            return false;
        }
        q.queue.add_used(head, 0);
        events::inc(&metrics.stats_requests);
        events::notify_driver(
            q.queue.publish_used(),
            irq,
            &metrics.queue.interrupts,
            &metrics.queue.interrupts_suppressed,
        );
        true
    }
}

/// The counters of the ranges of one queue (hinted or reported).
struct RangeCounters<'a> {
    count: &'a AtomicU64,
    freed: &'a AtomicU64,
    fails: &'a AtomicU64,
}

/// Gives the whole pages of each of `segs` (ranges the guest named) back,
/// each counted in `c`; returns the pages (the pass's weight).
fn give_back_ranges<D: PageDiscard>(
    segs: &[IoSeg],
    env: &mut PassEnv<'_, D>,
    c: RangeCounters<'_>,
) -> u64 {
    let mut pages = 0;
    for run in segs.iter().filter_map(|&seg| whole_pages(seg)) {
        pages += (run.len() as u64) / BALLOON_PAGE_SIZE;
        if give_back(env, run).is_some() {
            events::inc(c.count);
            events::add(c.freed, run.len() as u64);
        } else {
            events::inc(c.fails);
        }
    }
    pages
}

/// Gives `run` back through the seam: counted in `discard_calls`, a
/// failure in `discard_fails` and `host_errors` (logged, rate-limited).
fn give_back<D: PageDiscard>(env: &mut PassEnv<'_, D>, run: IoSeg) -> Option<()> {
    let m = env.metrics;
    events::inc(&m.discard_calls);
    match env.discard.discard(run) {
        Ok(()) => Some(()),
        Err(e) => {
            events::inc(&m.discard_fails);
            let n = events::inc(&m.host_errors);
            warn_rate_limited!(
                count = n,
                "{DEVICE}: cannot give {} bytes back to the host: {e}",
                run.len()
            );
            None
        }
    }
}
