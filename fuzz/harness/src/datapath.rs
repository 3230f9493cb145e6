// SPDX-License-Identifier: Apache-2.0
//! Target `net_datapath`: the RX and TX datapath of the real virtio-net
//! device, on its event loop, over arbitrary guest memory contents (rings,
//! descriptors, indirect tables, headers) and arbitrary backend frames,
//! with an in-memory backend.
//!
//! The input picks the features, the queue size, the weights and where the
//! rings go (packed as a driver lays them out, or anywhere, overlaps the
//! transport would refuse included), then a sequence of guest and network
//! steps: raw writes anywhere, descriptors and indirect-table entries with
//! any flags, lengths and links, avail entries (any head) and indices,
//! flags and event indices, frames from the backend, EAGAIN on sends,
//! kicks, loop iterations, and resets with re-activation.
//!
//! Oracles, whatever the input:
//! - no pass reads more than `MAX_PASS_READS` ring entries and descriptors;
//! - once the guest and the network stop, the event loop goes idle within
//!   a bounded number of iterations (a pass that yields is re-queued, and
//!   each consumes at least one chain or frame);
//! - no host-side error is counted (the backend is healthy);
//! - every used length of TX is 0.
//!
//! And while the guest has written only structured descriptors into buffers
//! above the packed rings (so that nothing but the device writes a used
//! ring), per activation:
//! - every used id is a head the driver published and has not had back
//!   (each published chain comes back at most once);
//! - the RX used lengths add up to the bytes of the frames delivered, and
//!   the TX frames the backend got add up to the bytes sent.
//!
//! Both TX engines: every input runs over the in-memory backend (one
//! `send_frame` per frame), and an input with bit 5 of `Setup::features`
//! runs a second time over a socket the device writes to in io_uring
//! batches (`SockBackend`, see `net_rig`). The oracles above hold for both
//! (`Eagain` steps do nothing to the socket: a batched backend must not
//! push back), and on the batched run:
//! - `tx_batches > 0` once a frame went out, where the host lets the
//!   device build its ring (0 with the bounce buffer, which writes frame by
//!   frame, and always 0 over the in-memory backend);
//! - the frames reach the peer in the order of their chains: each is the
//!   frame of the next `TxChain` not yet seen, or of one after it (a chain
//!   the device refused sends nothing), never an earlier one. Checked while
//!   the used-ring oracles above apply, the guest wrote nothing but
//!   `TxChain`, `RxChain`, RX avail entries and event indices, and no
//!   chain's buffers or TX descriptors were handed out
//!   again (so a frame is what its chain held when posted). Should the
//!   socket push back (EAGAIN) on the ring path, which a batched backend
//!   must not do, the check records a frame out of order in [`Reach`]
//!   instead of failing: the order is then lost by design.

use std::collections::HashMap;

use crate::net_rig::{
    DatapathFixture, GuestDesc, GuestTableEntry, Placement, RxChains, Setup, TxChain,
};
use arbitrary::Arbitrary;
use devices::virtio::DeviceMetrics;

/// One step of the guest or the network.
#[derive(Debug, Clone, Arbitrary)]
enum Step {
    /// Raw bytes anywhere in guest memory (rings included).
    Poke { addr: u32, bytes: Vec<u8> },
    /// A descriptor of queue `q`'s table.
    Desc(GuestDesc),
    /// Entry `i` of an indirect table at `at`.
    TableEntry(GuestTableEntry),
    /// Heads put in queue `q`'s avail ring and published.
    Avail { q: bool, heads: Vec<u16> },
    /// Queue `q`'s avail idx set to anything.
    AvailIdx { q: bool, idx: u16 },
    /// Queue `q`'s avail flags (NO_INTERRUPT) or `used_event`.
    Event { q: bool, flags: bool, value: u16 },
    /// `1 + copies % 16` well-formed RX chains, published.
    RxChain(RxChains),
    /// A well-formed TX chain holding a `len`-byte frame split at `cuts`.
    TxChain(TxChain),
    /// A frame from the network: `len` bytes (header included; folded below
    /// 1600 unless `big`) of `fill`.
    Frame { len: u16, big: bool, fill: u8 },
    /// The next `n % 4` sends return EAGAIN.
    Eagain { n: u8 },
    /// A queue notification.
    Kick { q: bool },
    /// One event-loop iteration.
    Run,
    /// A device reset, and the driver setting the same rings up again.
    Reset,
}

#[derive(Debug, Clone, Arbitrary)]
struct Input {
    setup: Setup,
    steps: Vec<Step>,
}

/// Steps taken from one input at most (the loop must stay fast).
const MAX_STEPS: usize = 256;

/// What the driver expects back, per activation.
#[derive(Default)]
struct Expect {
    /// Heads published and not returned, with multiplicity, per queue.
    out: [HashMap<u16, u32>; 2],
    /// Used entries seen, per queue.
    seen: [u16; 2],
    /// RX bytes in used entries, TX frames' bytes the backend got, at the
    /// start of this activation's accounting.
    rx_used_bytes: u64,
    /// The order oracle still applies (batched run).
    ordered: bool,
    /// Frames of this activation's `TxChain`s, in order.
    tx_posted: Vec<Vec<u8>>,
    /// The next of `tx_posted` a frame at the peer may be.
    tx_next: usize,
    /// Frames at the peer already checked (index into `Wire::tx`).
    peer_seen: usize,
}

impl Expect {
    fn new(rig: &DatapathFixture) -> Self {
        let w = rig.wire.lock().unwrap_or_else(|p| p.into_inner());
        Expect {
            rx_used_bytes: rig.metric(|m| &m.rx_bytes) + 12 * rig.metric(|m| &m.rx_frames),
            ordered: rig.is_batched(),
            peer_seen: w.tx.len(),
            ..Expect::default()
        }
    }
}

/// What one input made the device do (for tests that check the inputs
/// reach the datapath at all).
#[derive(Debug, Default, Clone, Copy)]
pub struct Reach {
    /// The layout was accepted and the device activated.
    pub activated: bool,
    /// Frames delivered to the guest.
    pub rx_frames: u64,
    /// Frames sent by the guest.
    pub tx_frames: u64,
    /// Chains refused.
    pub malformed: u64,
    /// Passes cut short by a weight or the descriptor budget.
    pub yields: u64,
    /// Queues broken (until a reset).
    pub queue_errors: u64,
    /// The input ran over the batched backend too.
    pub batched: bool,
    /// Frames sent on that run.
    pub batched_tx_frames: u64,
    /// io_uring submissions on that run.
    pub tx_batches: u64,
    /// Frames whose order the oracle checked on that run.
    pub ordered_frames: u64,
    /// Times the socket pushed back (EAGAIN) on that run.
    pub batched_pushback: u64,
    /// A frame reached the peer out of its chain's order after a pushback
    /// on the ring path (outside the batched backend's contract).
    pub reordered_after_pushback: bool,
}

/// Runs one input.
pub fn run(data: &[u8]) {
    reach(data);
}

/// Runs one input and says what it reached.
pub fn reach(data: &[u8]) -> Reach {
    let mut reached = Reach::default();
    crate::with_input(data, |input: &Input| reached = drive(input.clone()));
    reached
}

fn drive(input: Input) -> Reach {
    let mut reached = drive_on(input.clone(), false);
    if input.setup.batched() {
        let b = drive_on(input, true);
        reached.batched = b.activated;
        reached.batched_tx_frames = b.tx_frames;
        reached.tx_batches = b.tx_batches;
        reached.ordered_frames = b.ordered_frames;
        reached.batched_pushback = b.batched_pushback;
        reached.reordered_after_pushback = b.reordered_after_pushback;
    }
    reached
}

/// Runs the input over the in-memory backend, or the batched one.
fn drive_on(input: Input, batched: bool) -> Reach {
    let Some(mut rig) = DatapathFixture::with_backend(input.setup, batched) else {
        return Reach::default();
    };
    let size = rig.setup.size();
    // Structured so far: the guest wrote only descriptors into the buffer
    // area of packed rings, and avail entries through `publish`.
    let mut structured = match (input.setup.rx, input.setup.tx) {
        (Placement::Packed(a), Placement::Packed(b)) => a % 4 != b % 4,
        _ => false,
    };
    let mut expect = Expect::new(&rig);
    let mut reached = Reach::default();
    let mut frames = 0usize;

    for step in input.steps.into_iter().take(MAX_STEPS) {
        match step {
            Step::Poke { addr, bytes } => {
                structured = false;
                expect.ordered = false;
                rig.poke(u64::from(addr), &bytes[..bytes.len().min(64)]);
            }
            Step::Desc(d) => {
                structured &= d.addr.in_area();
                expect.ordered = false;
                rig.guest_desc(&d);
            }
            Step::TableEntry(e) => {
                structured &= e.at.in_area() && e.addr.in_area();
                expect.ordered = false;
                rig.guest_table_entry(&e);
            }
            Step::Avail { q, heads } => {
                let q = usize::from(q);
                // RX heads name RX descriptors only; TX heads could make any
                // descriptor a frame.
                expect.ordered &= q == 0;
                let heads = &heads[..heads.len().min(usize::from(size))];
                // More chains out than the ring holds: the device may use
                // a slot twice between two looks at the used ring.
                let out: u32 = expect.out[q].values().sum();
                structured &= out as usize + heads.len() <= usize::from(size);
                for &h in heads {
                    *expect.out[q].entry(h).or_default() += 1;
                }
                rig.publish(q, heads);
            }
            Step::RxChain(c) => {
                // Room in the ring is checked per chain, before it counts
                // as out.
                for head in rig.post_rx_chains(&c) {
                    structured &= can_publish(&expect, 0, size);
                    *expect.out[0].entry(head).or_default() += 1;
                }
            }
            Step::TxChain(c) => {
                structured &= can_publish(&expect, 1, size);
                let (head, frame) = rig.post_tx_chain(&c);
                *expect.out[1].entry(head).or_default() += 1;
                expect.tx_posted.push(frame);
            }
            Step::AvailIdx { q, idx } => {
                structured = false;
                expect.ordered = false;
                let a = rig.addrs[usize::from(q)];
                rig.poke(a.avail_ring + 2, &idx.to_le_bytes());
            }
            Step::Event { q, flags, value } => {
                let a = rig.addrs[usize::from(q)];
                let off = if flags { 0 } else { 4 + 2 * u64::from(a.size) };
                rig.poke(a.avail_ring + off, &value.to_le_bytes());
            }
            Step::Frame { len, big, fill } => {
                frames += 1;
                let len = if big { len } else { len % 1600 };
                let mut f = vec![fill; usize::from(len)];
                for (i, b) in f.iter_mut().enumerate().skip(12) {
                    *b = b.wrapping_add(i as u8);
                }
                rig.push_frame(f);
            }
            Step::Eagain { n } => {
                // Nothing on the batched backend (see the module doc).
                rig.inject_eagain(u32::from(n % 4));
            }
            Step::Kick { q } => rig.kick(usize::from(q)),
            Step::Run => {
                rig.run(1);
                check(&rig, &mut expect, structured, &mut reached);
            }
            Step::Reset => {
                check(&rig, &mut expect, structured, &mut reached);
                rig.reset();
                if !rig.activate() {
                    return Reach::default();
                }
                expect = Expect::new(&rig);
            }
        }
    }
    // The guest and the network stop: the loop goes idle.
    let bound = rig.idle_bound(frames);
    assert!(
        rig.run(bound),
        "the event loop is still busy after {bound} iterations: {}",
        rig.metrics.to_json()
    );
    check(&rig, &mut expect, structured, &mut reached);
    Reach {
        activated: true,
        rx_frames: rig.metric(|m| &m.rx_frames),
        tx_frames: rig.metric(|m| &m.tx_frames),
        malformed: rig.metric(|m| &m.malformed_chains),
        yields: rig.metric(|m| &m.rx_weight_hits)
            + rig.metric(|m| &m.tx_weight_hits)
            + rig.metric(|m| &m.desc_budget_hits),
        queue_errors: rig.metric(|m| &m.queue_errors),
        tx_batches: rig.metric(|m| &m.tx_batches),
        batched_pushback: if batched {
            rig.metric(|m| &m.tap_eagain)
        } else {
            0
        },
        ..reached
    }
}

/// Whether one more chain can be published on queue `q` with the used-ring
/// oracle still sound (no more chains out than the ring holds).
fn can_publish(expect: &Expect, q: usize, size: u16) -> bool {
    let out: u32 = expect.out[q].values().sum();
    out < u32::from(size)
}

/// The oracles that hold after every loop iteration.
fn check(rig: &DatapathFixture, expect: &mut Expect, structured: bool, reached: &mut Reach) {
    let ring = rig.check_shared_oracles();
    // Order is checked only where the used-ring oracles below apply too.
    expect.ordered &= structured;
    check_order(rig, expect, ring, reached);
    if !structured {
        return;
    }
    for q in 0..2 {
        let idx = rig.used_idx(q);
        let new = idx.wrapping_sub(expect.seen[q]);
        assert!(
            new <= rig.addrs[q].size,
            "queue {q}: used idx moved by {new} in one step"
        );
        for i in 0..new {
            let (id, len) = rig.used_elem(q, expect.seen[q].wrapping_add(i));
            let head = u16::try_from(id).unwrap_or(u16::MAX);
            let left = expect.out[q].get_mut(&head);
            assert!(
                matches!(left, Some(ref n) if **n > 0),
                "queue {q}: used id {id} was not published or came back twice"
            );
            if let Some(n) = left {
                *n -= 1;
            }
            if q == 1 {
                assert_eq!(len, 0, "TX used length");
            } else {
                expect.rx_used_bytes += u64::from(len);
            }
        }
        expect.seen[q] = idx;
    }
    assert_eq!(
        expect.rx_used_bytes,
        rig.metric(|m| &m.rx_bytes) + 12 * rig.metric(|m| &m.rx_frames),
        "RX used lengths against the bytes delivered"
    );
}

/// The batched run's order oracle (see the module doc): the frames that
/// reached the peer since the last look, against the `TxChain`s posted.
fn check_order(rig: &DatapathFixture, expect: &mut Expect, ring: bool, reached: &mut Reach) {
    expect.ordered &= !rig.reused;
    // A pushback on the ring path lets a later frame of the batch overtake
    // the refused one: outside the contract of a batched backend, recorded
    // rather than failed. Frame by frame, a pushback keeps the order.
    let pushback = ring && rig.metric(|m| &m.tap_eagain) > 0;
    let w = rig.wire.lock().unwrap_or_else(|p| p.into_inner());
    let new = &w.tx[expect.peer_seen.min(w.tx.len())..];
    expect.peer_seen = w.tx.len();
    if !expect.ordered {
        return;
    }
    for (i, f) in new.iter().enumerate() {
        let Some(k) = expect.tx_posted[expect.tx_next..]
            .iter()
            .position(|p| p == f)
        else {
            if pushback {
                reached.reordered_after_pushback = true;
                expect.ordered = false;
                return;
            }
            panic!(
                "frame {} at the peer ({} bytes) is not the frame of chain {} or of one \
                 posted after it: out of order, twice or never posted ({} chains posted): {}",
                w.tx.len() - new.len() + i,
                f.len(),
                expect.tx_next,
                expect.tx_posted.len(),
                rig.metrics.to_json()
            );
        };
        expect.tx_next += k + 1;
        reached.ordered_frames += 1;
    }
}
