// SPDX-License-Identifier: Apache-2.0
//! virtio-balloon, the memory balloon (virtio 1.1 §5.5; Firecracker's
//! `/balloon`, as its 1.14 has it: statistics, free page hinting and free
//! page reporting).
//!
//! This module's public items are the interface the VMM builds against:
//! [`BalloonConfig`] (plain data chosen by the VMM), [`Balloon`] (the
//! device, a [`VirtioDevice`](super::VirtioDevice) and an event-manager
//! subscriber, shared as `Arc<Mutex<Balloon>>` as the other devices are),
//! [`BalloonMetrics`] (counters with a JSON view under the device's id), and
//! what the API reads and sets while it runs ([`BalloonStats`],
//! [`HintingStatus`], [`BalloonError`]).
//!
//! The device, split as the others are:
//!
//! | module | role |
//! |---|---|
//! | `device` | features, the configuration space (target, actual, hinting command), activation and reset, what the API changes while it runs |
//! | `pass` | bounded passes over the five queues: page numbers checked and given back, statistics read and held, hinted and reported ranges given back |
//! | `discard` | giving pages back: `madvise(MADV_DONTNEED)` on guest memory, or a test's recorder |
//! | `stats` | the statistics the driver reports, by tag |
//! | `event_handler` | the event-manager glue, the statistics timer |
//! | `metrics` | the counters (field names are a contract) |
//!
//! **The protocol.** The host sets a target (`num_pages`, 4 KiB pages) in
//! the configuration space and raises a configuration interrupt; the
//! driver allocates pages and sends their page frame numbers (little-endian
//! `u32`s, the guest address shifted right by 12) on the inflate queue, or
//! takes pages back and sends theirs on the deflate queue, and writes the
//! number it holds in `actual`. Optional queues follow in this order, each
//! present only when its feature is negotiated (virtio 1.1 §5.5.2: the
//! driver numbers the queues it sets up consecutively): statistics
//! (`STATS_VQ`), free page hinting (`FREE_PAGE_HINT`), free page reporting
//! (`PAGE_REPORTING`). Offered besides: VERSION_1, EVENT_IDX, INDIRECT_DESC.
//!
//! **Pages given back.** An inflated page is dropped from the host with
//! `madvise(MADV_DONTNEED)` on its guest memory (minivmm maps guest memory
//! private and anonymous, so the host frees it and a later guest access
//! reads zeros); a deflated page needs nothing (the guest's next access
//! faults a zeroed one in). Hinted and reported ranges are dropped the same
//! way. Contiguous page numbers are given back with one call per run.
//!
//! **Hostile guests.** A page number outside guest memory is refused and
//! counted (`pfns_refused`); nothing outside guest memory is ever given
//! to `madvise` (the seam's only way in is a segment from a checked
//! translation, and the fuzz target checks every call). A chain with a
//! buffer of the wrong direction, outside guest memory, looping, or of a
//! length that is no whole number of page numbers or statistics is
//! refused: returned with used length 0, counted in `malformed_chains`,
//! logged at a limited rate. A corrupt ring stops that queue until the
//! driver resets the device. Every pass is bounded by the shared
//! descriptor budget and weights, and by [`PASS_WEIGHT_PAGES`].
//!
//! **System calls.** In [`Balloon::new`], before seccomp: `eventfd2`, and
//! `timerfd_create` with statistics. On the event loop: `madvise`
//! (`MADV_DONTNEED` on guest memory, the one call this device adds to the
//! event loop's list), `read`/`write` on the eventfds, `timerfd_settime`
//! and `read` on the statistics timer, `epoll_ctl`. On a vCPU thread:
//! `write` on an eventfd at activation and reset.

pub mod device;
pub mod discard;
pub mod event_handler;
pub mod metrics;
pub mod pass;
pub mod stats;

#[cfg(test)]
mod tests;

pub use device::{Balloon, BalloonError, HintingStatus};
pub use discard::{Madvise, PageDiscard};
pub use metrics::BalloonMetrics;
pub use stats::BalloonStats;

// virtio-bindings has no virtio_balloon module; these are the values of
// Linux's include/uapi/linux/virtio_balloon.h and virtio 1.1 §5.5.3.
/// Feature: the statistics queue (virtio 1.1 §5.5.3).
pub const VIRTIO_BALLOON_F_STATS_VQ: u32 = 1;
/// Feature: the guest may take pages back from the balloon when it runs
/// out of memory.
pub const VIRTIO_BALLOON_F_DEFLATE_ON_OOM: u32 = 2;
/// Feature: free page hinting (the host asks, the guest hints free ranges).
pub const VIRTIO_BALLOON_F_FREE_PAGE_HINT: u32 = 3;
/// Feature: free page reporting (the guest reports free ranges by itself).
pub const VIRTIO_BALLOON_F_PAGE_REPORTING: u32 = 5;

/// Page frame numbers are guest addresses shifted by 12, whatever the
/// guest's page size (virtio 1.1 §5.5.6).
pub const VIRTIO_BALLOON_PFN_SHIFT: u32 = 12;
/// Bytes of the page a page frame number names.
pub const BALLOON_PAGE_SIZE: u64 = 1 << VIRTIO_BALLOON_PFN_SHIFT;
/// 4 KiB pages in a MiB.
pub const PAGES_PER_MIB: u32 = 256;

/// `free_page_hint_cmd_id` value: no hinting run (the guest may reuse the
/// pages it hinted).
pub const FREE_PAGE_HINT_STOP: u32 = 0;
/// `free_page_hint_cmd_id` value: the host is done with the run's hints.
pub const FREE_PAGE_HINT_DONE: u32 = 1;

/// Default QueueNumMax of every queue (Firecracker's).
pub const DEFAULT_QUEUE_SIZE: u16 = 256;

/// Most page frame numbers one inflate or deflate chain may carry: a 4 KiB
/// array (Linux sends at most 256 a chain).
pub const MAX_PFNS_PER_CHAIN: usize = 1024;

/// Pages a pass gives back (or takes note of) before it yields to the
/// event loop: 64 MiB, so one pass costs at most a few thousand `madvise`
/// calls whatever the guest sends.
pub const PASS_WEIGHT_PAGES: u64 = 16384;

/// Configuration of the balloon, plain data chosen by the VMM (the fields
/// of Firecracker's `PUT /balloon`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalloonConfig {
    /// Target size in MiB.
    pub amount_mib: u32,
    /// Offer DEFLATE_ON_OOM: the guest may take pages back under memory
    /// pressure.
    pub deflate_on_oom: bool,
    /// Seconds between statistics requests; 0 turns the statistics queue
    /// off for the device's life.
    pub stats_polling_interval_s: u16,
    /// Offer free page hinting (host-initiated runs).
    pub free_page_hinting: bool,
    /// Offer free page reporting (the guest reports by itself).
    pub free_page_reporting: bool,
    /// QueueNumMax of every queue: a power of two up to 32768.
    pub queue_size: u16,
}

impl Default for BalloonConfig {
    /// An empty balloon with no optional feature.
    fn default() -> Self {
        BalloonConfig {
            amount_mib: 0,
            deflate_on_oom: false,
            stats_polling_interval_s: 0,
            free_page_hinting: false,
            free_page_reporting: false,
            queue_size: DEFAULT_QUEUE_SIZE,
        }
    }
}

/// The balloon's queues, in the order they are numbered (those whose
/// feature is not negotiated are skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vq {
    /// Page frame numbers the guest gives up.
    Inflate,
    /// Page frame numbers the guest takes back.
    Deflate,
    /// The statistics buffer, held until the next request.
    Stats,
    /// Free page hinting: command ids and hinted ranges.
    Hint,
    /// Free page reporting: reported ranges.
    Report,
}

impl Vq {
    /// Every queue, in order.
    pub const ALL: [Vq; 5] = [Vq::Inflate, Vq::Deflate, Vq::Stats, Vq::Hint, Vq::Report];

    /// The feature that brings the queue, if it is optional.
    pub fn feature(self) -> Option<u32> {
        match self {
            Vq::Inflate | Vq::Deflate => None,
            Vq::Stats => Some(VIRTIO_BALLOON_F_STATS_VQ),
            Vq::Hint => Some(VIRTIO_BALLOON_F_FREE_PAGE_HINT),
            Vq::Report => Some(VIRTIO_BALLOON_F_PAGE_REPORTING),
        }
    }

    /// The queues present with `features`, in queue-index order.
    pub fn present(features: u64) -> Vec<Vq> {
        Vq::ALL
            .into_iter()
            .filter(|q| q.feature().is_none_or(|f| features & (1 << f) != 0))
            .collect()
    }

    /// Its name in log lines.
    pub fn name(self) -> &'static str {
        match self {
            Vq::Inflate => "inflate ",
            Vq::Deflate => "deflate ",
            Vq::Stats => "stats ",
            Vq::Hint => "hinting ",
            Vq::Report => "reporting ",
        }
    }
}
