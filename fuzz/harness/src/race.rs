// SPDX-License-Identifier: Apache-2.0
//! Target `net_datapath_race`: a second thread (another vCPU of a hostile
//! guest) rewrites rings, descriptors and indirect tables as fast as it can
//! while the device's passes run.
//!
//! The input is what `net_datapath` takes for the guest's ordinary steps,
//! plus the list of writes the second thread repeats, each aimed at a part
//! of a ring (avail idx and entries, used idx and entries, flags and event
//! indices, descriptors) or at the buffer area, until the steps are done.
//! Nothing about ring contents can be asserted while they change under the
//! device, so the oracles are those that must hold whatever the guest does:
//! no pass reads more than `MAX_PASS_READS` ring entries and descriptors,
//! no host-side error is counted, nothing panics, and once the second thread
//! stops the event loop goes idle within a bounded number of iterations.
//! The frames the backend got add up to `tx_bytes + 12 * tx_frames` (each
//! write takes what the chain's descriptors said when walked, whatever the
//! second thread did to the bytes).
//!
//! As in `net_datapath`, an input with bit 5 of `Setup::features` runs a
//! second time over the socket backend the device writes to in io_uring
//! batches, with the same oracles and `tx_batches > 0` once a frame went
//! out where the device has its ring: the batches' segments point into
//! guest memory the second thread is rewriting while the kernel reads it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arbitrary::Arbitrary;
use devices::virtio::DeviceMetrics;
use vm_memory::{Bytes, GuestAddress};

use crate::net_rig::{
    DatapathFixture, GuestDesc, GuestTableEntry, RxChains, Setup, TxChain, BUF_AREA, MEM_SIZE,
};

/// What the second thread writes.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Part {
    /// A queue's descriptor table.
    Desc,
    /// A queue's avail ring (flags, idx, entries, used_event).
    Avail,
    /// A queue's used ring (flags, idx, entries, avail_event).
    Used,
    /// The buffer area (indirect tables, headers).
    Buffers,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
struct Write {
    q: bool,
    part: Part,
    off: u16,
    value: u64,
    width: u8,
}

/// The guest's ordinary steps (a subset of `net_datapath`'s).
#[derive(Debug, Clone, Arbitrary)]
enum Step {
    Desc(GuestDesc),
    TableEntry(GuestTableEntry),
    Avail { q: bool, heads: Vec<u16> },
    RxChain(RxChains),
    TxChain(TxChain),
    Frame { len: u16, fill: u8 },
    Kick { q: bool },
    Run,
    Reset,
}

#[derive(Debug, Clone, Arbitrary)]
struct Input {
    setup: Setup,
    writes: Vec<Write>,
    steps: Vec<Step>,
}

const MAX_STEPS: usize = 128;

/// Runs one input.
pub fn run(data: &[u8]) {
    crate::with_input(data, |input: &Input| drive(input.clone()));
}

fn drive(input: Input) {
    drive_on(input.clone(), false);
    if input.setup.batched() {
        drive_on(input, true);
    }
}

/// Runs the input over the in-memory backend, or the batched one.
fn drive_on(input: Input, batched: bool) {
    let Some(mut rig) = DatapathFixture::with_backend(input.setup, batched) else {
        return;
    };
    let size = rig.setup.size();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = (!input.writes.is_empty()).then(|| {
        let (mem, stop, addrs) = (rig.mem.clone(), stop.clone(), rig.addrs);
        let writes = input.writes.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for w in &writes {
                    let a = addrs[usize::from(w.q)];
                    let (base, len) = match w.part {
                        Part::Desc => (a.desc_table, 16 * u64::from(a.size)),
                        Part::Avail => (a.avail_ring, 6 + 2 * u64::from(a.size)),
                        Part::Used => (a.used_ring, 6 + 8 * u64::from(a.size)),
                        Part::Buffers => (BUF_AREA, MEM_SIZE - BUF_AREA),
                    };
                    let width = [1, 2, 4, 8][usize::from(w.width % 4)];
                    let off = u64::from(w.off) % len;
                    let bytes = w.value.to_le_bytes();
                    let _ = mem.write_slice(&bytes[..width], GuestAddress(base + off));
                    n += 1;
                }
            }
            n
        })
    });
    let mut frames = 0usize;
    for step in input.steps.into_iter().take(MAX_STEPS) {
        match step {
            Step::Desc(d) => rig.guest_desc(&d),
            Step::TableEntry(e) => rig.guest_table_entry(&e),
            Step::Avail { q, heads } => {
                rig.publish(usize::from(q), &heads[..heads.len().min(usize::from(size))]);
            }
            Step::RxChain(c) => {
                rig.post_rx_chains(&c);
            }
            Step::TxChain(c) => {
                rig.post_tx_chain(&c);
            }
            Step::Frame { len, fill } => {
                frames += 1;
                let f = vec![fill; usize::from(len % 1600)];
                rig.push_frame(f);
            }
            Step::Kick { q } => rig.kick(usize::from(q)),
            Step::Run => {
                rig.run(1);
            }
            Step::Reset => {
                rig.reset();
                if !rig.activate() {
                    break;
                }
            }
        }
        rig.check_shared_oracles();
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(w) = writer {
        let _ = w.join().expect("the writer thread never panics");
    }
    let bound = rig.idle_bound(frames);
    assert!(
        rig.run(bound),
        "the event loop is still busy after {bound} iterations once the guest stopped: {}",
        rig.metrics.to_json()
    );
    rig.check_shared_oracles();
}
