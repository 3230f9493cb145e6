// SPDX-License-Identifier: Apache-2.0
//! Target `snapshot_state`: the snapshot loader, fed any bytes as a state
//! file and any transport state a file could hold.
//!
//! An input is one of three kinds (its first byte says which):
//!
//! 1. Bytes that go through the state file's reader as `PUT
//!    /snapshot/load` reads them (`format::describe`, `format::decode` into
//!    the whole `SnapshotState`) and, when they decode, through the
//!    configuration rebuild (`load::settings`). Oracles: no panic; every
//!    refusal is one line; a file that decodes re-encodes to bytes that
//!    decode again.
//! 2. A transport state saved from a driven transport (a device behind it
//!    activated over two queues, chains taken and completed) is edited field
//!    by field as a hostile file could (status, features, selectors, ring
//!    addresses and sizes, interrupt status, the device's own part), carried
//!    through the state file's encoding, and restored into a fresh transport
//!    over a fresh device on the same memory. Oracles: a refusal is one line
//!    and activates nothing; an accepted state reads back as saved through
//!    the registers and `save`, the device is activated exactly when the
//!    state says so, over queues whose rings lie in guest memory where the
//!    state put them, picked up at `used.idx`; and the device can then drain
//!    its queues without a panic, every chain it takes being one the driver
//!    could have posted (a head below the queue size).
//! 3. A rate limiter's buckets saved after some traffic, edited as a
//!    hostile file could, and restored (see [`crate::snapshot_buckets`]):
//!    the device-owned state a state file carries besides the transport.

use std::sync::{Arc, Mutex};

use arbitrary::Arbitrary;
use devices::virtio::mmio::MmioTransport;
use devices::virtio::persist::{QueueState, VirtioState};
use devices::virtio::queue::Budget;
use devices::virtio::test_utils::{guest_memory, DummyDevice, MockDriver, Segment};
use devices::virtio::GuestMemory;
use vmm::snapshot::{format, load, SnapshotState};

const MEM_SIZE: usize = 1 << 20;
const VERSION_1: u64 = 1 << 32;
const EVENT_IDX: u64 = 1 << 29;

/// One change a hostile file could make to a saved transport.
#[derive(Debug, Clone, Arbitrary)]
#[allow(missing_docs)]
pub enum Edit {
    DeviceId(u32),
    Status(u32),
    Activated(bool),
    DeviceFeaturesSel(u32),
    DriverFeaturesSel(u32),
    AckedFeatures(u64),
    QueueSel(u32),
    InterruptStatus(u32),
    DropQueue,
    QueueMaxSize(u8, u16),
    QueueSize(u8, u32),
    QueueReady(u8, bool),
    DescTable(u8, u64),
    AvailRing(u8, u64),
    UsedRing(u8, u64),
    /// Moves a ring by a small offset (misalignment, overlap).
    Nudge(u8, u8, i16),
    /// The used ring's `idx` in guest memory (where a restore resumes).
    UsedIdx(u8, u16),
    DeviceNull,
    DeviceJson(u8),
}

/// One structured input (part 2).
#[derive(Debug, Clone, Arbitrary)]
pub struct Input {
    /// How many chains the driver posts and the device completes before the
    /// snapshot (each queue: posted, taken, completed).
    pub traffic: [(u8, u8, u8); 2],
    /// Edits to the saved transport.
    pub edits: Vec<Edit>,
}

/// Runs one input (see the module doc): an even first byte makes the
/// rest a state file (part 1), so that a seed can be a real one after it;
/// one of 3 modulo 4 makes the rest a structured bucket input (part 3);
/// any other odd one a structured [`Input`] (part 2).
pub fn run(data: &[u8]) {
    match data.split_first() {
        Some((mode, rest)) if mode % 2 == 0 => raw_file(rest),
        Some((mode, rest)) if mode % 4 == 3 => {
            crate::with_input(rest, crate::snapshot_buckets::run);
        }
        Some((_, rest)) => crate::with_input(rest, transport),
        None => {}
    }
}

fn one_line(msg: &str) {
    assert!(!msg.is_empty() && !msg.contains('\n'), "{msg:?}");
}

/// Part 1: any bytes as a state file.
fn raw_file(raw: &[u8]) {
    if let Err(e) = format::describe(raw) {
        one_line(&e.to_string());
    }
    match format::decode::<SnapshotState>(raw) {
        Err(e) => one_line(&vmm::error_line(&e)),
        Ok(state) => {
            let again = format::encode(&state);
            assert!(format::decode::<SnapshotState>(&again).is_ok());
            let params = load::LoadParams::from_body(serde_json::json!({
                "snapshot_path": "s", "mem_file_path": "m",
                "vsock_override": {"uds_path": "v.sock"}}))
            .expect("a valid body");
            if let Err(e) = load::settings(&state.config, &params, &Default::default()) {
                one_line(&e);
            }
        }
    }
}

/// A transport over a fresh dummy device on `mem`.
fn fresh(mem: &GuestMemory) -> (MmioTransport, Arc<Mutex<DummyDevice>>) {
    let dev = Arc::new(Mutex::new(DummyDevice::new().expect("eventfds")));
    let t = MmioTransport::new(mem.clone(), dev.clone()).expect("a valid device");
    (t, dev)
}

/// A driven transport: both queues activated, `traffic` on each.
fn driven(traffic: &[(u8, u8, u8); 2]) -> (MockDriver, Arc<Mutex<DummyDevice>>) {
    let mem = guest_memory(MEM_SIZE).expect("guest memory");
    let (t, dev) = fresh(&mem);
    let mut drv = MockDriver::new(mem, t).expect("driver");
    drv.init_with_queue_size(VERSION_1 | EVENT_IDX, Some(16))
        .expect("a driver that follows the spec activates the device");
    let buf = drv.alloc(64, 8).expect("room");
    for (q, &(posted, taken, done)) in traffic.iter().enumerate() {
        let posted = posted % 16;
        for _ in 0..posted {
            drv.submit(q, &[Segment::writable(buf, 64)]).expect("room");
        }
        let mut d = dev.lock().expect("device");
        let queue = &mut d.queues[q];
        let mut budget = Budget::new(1000);
        let mut heads = Vec::new();
        for _ in 0..(taken % 16).min(posted) {
            if let Ok(Some(h)) = queue.pop(&mut budget) {
                heads.push(h);
            }
        }
        // In order: what a device must have done for a snapshot.
        for h in heads.iter().take(usize::from(done % 16)) {
            queue.add_used(*h, 0);
        }
        queue.publish_used();
    }
    (drv, dev)
}

/// Queue `i` (modulo how many there are) of `state`.
fn queue_of(state: &mut VirtioState, i: u8) -> Option<&mut QueueState> {
    let n = state.transport.queues.len();
    if n == 0 {
        return None;
    }
    state.transport.queues.get_mut(usize::from(i) % n)
}

/// Applies one edit; the used-ring index edit writes guest memory.
fn apply(state: &mut VirtioState, edit: &Edit, mem: &GuestMemory) {
    use vm_memory::{Bytes, GuestAddress};
    let q = queue_of;
    let t = &mut state.transport;
    match *edit {
        Edit::DeviceId(v) => t.device_id = v,
        Edit::Status(v) => t.status = v,
        Edit::Activated(v) => t.activated = v,
        Edit::DeviceFeaturesSel(v) => t.device_features_sel = v,
        Edit::DriverFeaturesSel(v) => t.driver_features_sel = v,
        Edit::AckedFeatures(v) => t.acked_features = v,
        Edit::QueueSel(v) => t.queue_sel = v,
        Edit::InterruptStatus(v) => t.interrupt_status = v,
        Edit::DropQueue => {
            t.queues.pop();
        }
        Edit::QueueMaxSize(i, v) => {
            if let Some(q) = q(state, i) {
                q.max_size = v;
            }
        }
        Edit::QueueSize(i, v) => {
            if let Some(q) = q(state, i) {
                q.size = v;
            }
        }
        Edit::QueueReady(i, v) => {
            if let Some(q) = q(state, i) {
                q.ready = v;
            }
        }
        Edit::DescTable(i, v) => {
            if let Some(q) = q(state, i) {
                q.desc_table = v;
            }
        }
        Edit::AvailRing(i, v) => {
            if let Some(q) = q(state, i) {
                q.avail_ring = v;
            }
        }
        Edit::UsedRing(i, v) => {
            if let Some(q) = q(state, i) {
                q.used_ring = v;
            }
        }
        Edit::Nudge(i, which, by) => {
            if let Some(q) = q(state, i) {
                let ring = match which % 3 {
                    0 => &mut q.desc_table,
                    1 => &mut q.avail_ring,
                    _ => &mut q.used_ring,
                };
                *ring = ring.wrapping_add_signed(i64::from(by));
            }
        }
        Edit::UsedIdx(i, v) => {
            if let Some(q) = q(state, i) {
                // Whatever the ring's address, the write lands in memory or
                // nowhere.
                let _ = mem.write_obj(v, GuestAddress(q.used_ring.wrapping_add(2)));
            }
        }
        Edit::DeviceNull => state.device = serde_json::Value::Null,
        Edit::DeviceJson(n) => state.device = serde_json::json!({ "n": n }),
    }
}

/// Part 2: an edited transport state restored.
fn transport(input: &Input) {
    let (drv, _dev) = driven(&input.traffic);
    let mem = drv.mem().clone();
    let mut state = drv.transport().save().expect("a quiescent dummy saves");
    for e in input.edits.iter().take(16) {
        apply(&mut state, e, &mem);
    }
    // Through the state file's encoding, as a load reads it.
    let state: VirtioState =
        format::decode(&format::encode(&state)).expect("an encoded state decodes");
    let (mut t, dev) = fresh(&mem);
    match t.restore(&state) {
        Err(e) => {
            one_line(&e.to_string());
            assert_eq!(dev.lock().expect("device").activate_calls, 0);
            assert!(!t.is_activated());
        }
        Ok(()) => accepted(&mut t, &dev, &state, &mem),
    }
}

fn accepted(
    t: &mut MmioTransport,
    dev: &Arc<Mutex<DummyDevice>>,
    state: &VirtioState,
    mem: &GuestMemory,
) {
    use vm_memory::{Bytes, GuestAddress};
    let s = &state.transport;
    assert_eq!(t.status(), s.status);
    assert_eq!(t.acked_features(), s.acked_features);
    assert_eq!(t.is_activated(), s.activated);
    let back = t.save().expect("saves again");
    assert_eq!(back.transport.queues, s.queues);
    let mut d = dev.lock().expect("device");
    assert_eq!(d.activate_calls, usize::from(s.activated));
    if !s.activated {
        return;
    }
    assert_eq!(d.queues.len(), s.queues.len());
    for (q, saved) in d.queues.iter_mut().zip(&s.queues) {
        let a = q.addrs();
        assert_eq!(
            (a.desc_table, a.avail_ring, a.used_ring, u32::from(a.size)),
            (
                saved.desc_table,
                saved.avail_ring,
                saved.used_ring,
                saved.size
            )
        );
        let used: u16 = mem
            .read_obj(GuestAddress(a.used_ring + 2))
            .expect("a validated used ring is in memory");
        assert_eq!(q.position(), (used, used));
        // A hostile avail index is refused at the read; at most a ring's
        // worth of chains is ever available.
        let mut budget = Budget::new(u32::MAX);
        let mut taken = 0u32;
        while let Ok(Some(_)) = q.pop(&mut budget) {
            taken += 1;
            assert!(
                taken <= u32::from(a.size),
                "more chains than the ring holds"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The corpus's real state files stay real under this layout (a
    /// layout change that leaves them refused would leave part 1 fuzzing
    /// only the refusals).
    #[test]
    fn the_seed_state_files_decode_and_the_previous_version_does_not() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../corpus/snapshot_state");
        let read = |name: &str| std::fs::read(dir.join(name)).expect("a seed");
        for name in ["raw-real-state", "raw-serial-bucket"] {
            let bytes = read(name);
            let state = format::decode::<SnapshotState>(&bytes[1..])
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(
                state.serial_rate_limiter.is_some(),
                name == "raw-serial-bucket"
            );
        }
        let err = format::decode::<SnapshotState>(&read("raw-v1-state")[1..]).unwrap_err();
        assert!(matches!(err, format::FormatError::Version { .. }), "{err}");
        let err = format::decode::<SnapshotState>(&read("raw-serial-bucket-i128")[1..]);
        assert!(matches!(err, Err(format::FormatError::Body(_))));
    }

    #[test]
    fn an_unedited_state_restores_and_a_hostile_one_is_refused() {
        let input = Input {
            traffic: [(5, 3, 2), (1, 1, 1)],
            edits: Vec::new(),
        };
        transport(&input);
        for edit in [
            Edit::DescTable(0, 1 << 40),
            Edit::Status(0x4),
            Edit::DeviceJson(1),
            Edit::QueueSize(1, 3),
        ] {
            let input = Input {
                edits: vec![edit],
                ..input.clone()
            };
            transport(&input);
        }
    }
}
