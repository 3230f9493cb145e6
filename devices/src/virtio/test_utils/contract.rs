// SPDX-License-Identifier: Apache-2.0
//! The contract every virtio device passes, written once: a device driven
//! through the real MMIO transport ([`DeviceRig`]) as a driver drives it
//! and as a hostile driver would.
//!
//! | test | what the device must do |
//! |---|---|
//! | `negotiation` | offer VERSION_1; FEATURES_OK refused without it or with a feature it did not offer; the features of an activation shown in its metrics |
//! | `status_machine` | never start on a status written out of order or after FAILED; start after a reset |
//! | `queue_errors` | never start with a queue the transport refuses (size, alignment, outside memory, overlapping, not ready): DEVICE_NEEDS_RESET instead, and start after a reset |
//! | `wrong_queues` | refuse an activation with too few or too many queues, or queues over another memory |
//! | `kick_before_driver_ok` | serve a request posted and kicked before DRIVER_OK once DRIVER_OK comes |
//! | `activation_twice` | shrug off DRIVER_OK written twice; a second activation without a reset replaces the first |
//! | `reset_clears` | after a reset serve nothing of the old rings, not even a kick already made; start clean on new rings with new features |
//! | `config_space` | answer reads at every offset and width consistently (zeros past its end), ignore and count writes (but to the bytes the driver may write) |
//! | `looping_chains` | refuse a chain that loops or links out of its table, give it back with length 0, count it, go on |
//! | `outside_memory` | the same for buffers outside guest memory or across its end |
//! | `avail_index` | stop only the queue when the avail index runs too far ahead (DEVICE_NEEDS_RESET), come back after a reset |
//! | `descriptor_budget` | read no more than `MAX_PASS_READS` per pass however long the chains, and answer every one |
//!
//! A device joins by implementing [`ContractDevice`] beside its tests and
//! writing one line, `contract_suite!(TheDevice);`, in its test module.

use std::sync::Arc;

use event_manager::MutEventSubscriber;
use vm_memory::GuestAddress;

use super::{
    guest_memory, queue_at, DeviceRig, DriverQueue, MockDriver, QueueLayout, Segment, TestIrq,
    UsedElem,
};
use crate::virtio::mmio::{
    CONFIG_SPACE_OFFSET, REG_CONFIG_GENERATION, REG_QUEUE_READY, REG_QUEUE_SEL, REG_STATUS,
};
use crate::virtio::queue::{
    MAX_PASS_READS, PASS_DESC_BUDGET, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE,
};
use crate::virtio::{status, ActivateError, GuestMemory, VirtioDevice, VIRTIO_MMIO_INT_CONFIG};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

/// Guest memory of every contract test.
pub const MEM_SIZE: u64 = 32 << 20;

/// What the contract needs to know of a device.
pub trait ContractDevice: VirtioDevice + MutEventSubscriber + Sized + 'static {
    /// What the device needs kept alive beside it (a socket's other end,
    /// the directory of an image).
    type Keep;
    /// The queue whose chains the device takes on a kick alone, whatever
    /// the world outside does (the network device's TX queue).
    const QUEUE: usize;
    /// Bytes of its configuration space.
    const CONFIG_LEN: u64;
    /// Its counter of chains refused and given back with length 0.
    const REFUSED: &'static str;
    /// The bytes of its configuration space the driver may write (the
    /// balloon's `actual`); the contract leaves them alone. None by default.
    const WRITABLE_CONFIG: std::ops::Range<u64> = 0..0;

    /// A device over `mem` with its defaults (and no time budget: what a
    /// pass does must not depend on the machine's speed).
    fn make(mem: &GuestMemory) -> (Self, Self::Keep);

    /// A well-formed request of `bufs` buffers (at least 3) for
    /// [`QUEUE`](Self::QUEUE), its memory allocated and written through
    /// `drv`; its first buffer at least 2 bytes long.
    fn request(drv: &mut MockDriver, bufs: usize) -> Vec<Segment>;
}

/// The contract's rig: a device over [`MEM_SIZE`] bytes of guest memory
/// behind its transport, not initialised, and what it keeps.
pub fn rig<D: ContractDevice>() -> (DeviceRig<D>, D::Keep) {
    let mem = guest_memory(MEM_SIZE as usize).expect("guest memory");
    let (dev, keep) = D::make(&mem);
    (DeviceRig::new(&mem, dev), keep)
}

/// The rig initialised with everything the device offers.
fn live<D: ContractDevice>() -> (DeviceRig<D>, D::Keep) {
    let (mut r, keep) = rig::<D>();
    let offered = r.drv.device_features();
    r.drv.init(offered).expect("the device starts");
    r.run_until_idle();
    (r, keep)
}

/// Posts and kicks a request of `bufs` buffers; its head and writable
/// bytes.
fn submit<D: ContractDevice>(r: &mut DeviceRig<D>, bufs: usize) -> (u16, u64) {
    let segs = D::request(&mut r.drv, bufs);
    let head = r.drv.submit(D::QUEUE, &segs).expect("room in the ring");
    (head, writable(&segs))
}

fn writable(segs: &[Segment]) -> u64 {
    segs.iter()
        .filter(|s| s.device_writable)
        .map(|s| u64::from(s.len))
        .sum()
}

/// Asserts that the used ring returned `head` alone, served: within its
/// writable bytes and not refused.
#[track_caller]
fn assert_served<D: ContractDevice>(r: &mut DeviceRig<D>, (head, cap): (u16, u64), refused: u64) {
    let used = r.drv.used(D::QUEUE).expect("the used ring");
    assert_eq!(used.len(), 1, "one answer for {head}: {used:?}");
    assert_eq!(used[0].id, u32::from(head));
    assert!(
        u64::from(used[0].len) <= cap,
        "used length past the buffers"
    );
    assert_eq!(r.metric(D::REFUSED), refused, "{}", r.metrics());
}

/// Publishes and kicks the chains at `heads` (added, not published), and
/// asserts that the used ring returned them in order, each with length 0,
/// that they were counted as refused, and that a request after them is
/// served.
#[track_caller]
fn refused_then_served<D: ContractDevice>(r: &mut DeviceRig<D>, heads: &[u16]) {
    r.drv.publish(D::QUEUE).expect("publish");
    r.drv.kick(D::QUEUE);
    r.run_until_idle();
    let used = r.drv.used(D::QUEUE).expect("the used ring");
    let want: Vec<UsedElem> = heads
        .iter()
        .map(|&h| UsedElem {
            id: u32::from(h),
            len: 0,
        })
        .collect();
    assert_eq!(used, want);
    let refused = heads.len() as u64;
    assert_eq!(r.metric(D::REFUSED), refused);
    let req = submit(r, 3);
    r.run_until_idle();
    assert_served(r, req, refused);
}

/// Feature negotiation.
pub fn negotiation<D: ContractDevice>() {
    let (mut r, _keep) = rig::<D>();
    let offered = r.drv.device_features();
    let version_1 = 1u64 << VIRTIO_F_VERSION_1;
    assert_ne!(offered & version_1, 0, "VERSION_1 offered");
    assert!(
        r.drv.negotiate(offered & !version_1).is_err(),
        "accepted without VERSION_1"
    );
    let unoffered = (0..64).map(|b| 1u64 << b).find(|b| offered & b == 0);
    let unoffered = unoffered.expect("a feature bit the device does not offer");
    assert!(
        r.drv.negotiate(offered | unoffered).is_err(),
        "accepted an unoffered feature"
    );
    assert!(!r.drv.transport().is_activated());
    r.drv.init(version_1).expect("VERSION_1 alone is enough");
    r.run_until_idle();
    assert_eq!(r.metric("features_negotiated"), version_1);
    r.drv.init(offered).expect("everything offered");
    r.run_until_idle();
    assert_eq!(r.metric("features_negotiated"), offered);
    let req = submit(&mut r, 3);
    r.run_until_idle();
    assert_served(&mut r, req, 0);
}

/// The status state machine.
pub fn status_machine<D: ContractDevice>() {
    use status::*;
    let (mut r, _keep) = rig::<D>();
    let offered = r.drv.device_features();
    // All at once, or DRIVER_OK first: nothing sticks.
    for s in [ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK, DRIVER_OK] {
        r.drv.write_reg(REG_STATUS, s);
        assert_eq!(r.drv.status(), 0, "status {s:#x} from 0");
    }
    // DRIVER_OK without FEATURES_OK.
    r.drv.add_status(ACKNOWLEDGE);
    r.drv.add_status(DRIVER);
    r.drv.add_status(DRIVER_OK);
    assert_eq!(r.drv.status(), ACKNOWLEDGE | DRIVER);
    // FAILED: nothing moves on until a reset.
    r.drv.negotiate(offered).expect("features");
    r.drv.setup_queues(None).expect("queues");
    r.drv.add_status(FAILED);
    r.drv.add_status(DRIVER_OK);
    assert_eq!(r.drv.status() & DRIVER_OK, 0);
    r.run_until_idle();
    assert!(!r.drv.transport().is_activated());
    assert_eq!(r.metric("features_negotiated"), 0, "no activation");
    r.drv.init(offered).expect("a reset starts over");
    r.run_until_idle();
    assert!(r.drv.transport().is_activated());
    let req = submit(&mut r, 3);
    r.run_until_idle();
    assert_served(&mut r, req, 0);
}

/// The ways a driver can lay out queue [`ContractDevice::QUEUE`] that the
/// transport refuses at DRIVER_OK: what, and the layout or register change.
fn bad_queues(
    good: QueueLayout,
    mem_end: u64,
    other: QueueLayout,
) -> Vec<(&'static str, QueueLayout)> {
    let at = |f: fn(&mut QueueLayout)| {
        let mut l = good;
        f(&mut l);
        l
    };
    vec![
        ("size 0", at(|l| l.size = 0)),
        ("size not a power of two", at(|l| l.size -= 1)),
        (
            "size above QueueNumMax",
            at(|l| l.size = l.size.saturating_mul(2)),
        ),
        ("misaligned descriptor table", at(|l| l.desc_table.0 += 8)),
        ("misaligned used ring", at(|l| l.used_ring.0 += 2)),
        ("avail ring outside memory", {
            let mut l = good;
            l.avail_ring = GuestAddress(mem_end);
            l
        }),
        ("used ring across the end of memory", {
            let mut l = good;
            l.used_ring = GuestAddress(mem_end - 8);
            l
        }),
        ("used ring on another queue's descriptors", {
            let mut l = good;
            l.used_ring = other.desc_table;
            l
        }),
    ]
}

/// Queue configuration errors.
pub fn queue_errors<D: ContractDevice>() {
    let (mut r, _keep) = rig::<D>();
    let offered = r.drv.device_features();
    let n = r.dev().queue_max_sizes().len();
    r.drv.negotiate(offered).expect("features");
    r.drv.setup_queues(None).expect("queues");
    let layouts: Vec<QueueLayout> = (0..n).map(|i| r.drv.layout(i).expect("a queue")).collect();
    let good = layouts[D::QUEUE];
    let mut cases = bad_queues(good, MEM_SIZE, layouts[(D::QUEUE + 1) % n]);
    // A queue its own desc table and used ring share only if it is alone.
    if n == 1 {
        cases.pop();
        let mut l = good;
        l.used_ring = GuestAddress(good.desc_table.0);
        cases.push(("used ring on the descriptor table", l));
    }
    for (what, layout) in cases {
        r.drv.negotiate(offered).expect("features");
        for (i, &l) in layouts.iter().enumerate() {
            let l = if i == D::QUEUE { layout } else { l };
            r.drv.setup_queue_at(i, l).expect("registers");
        }
        refused_at_driver_ok(&mut r, what);
    }
    // A queue never made ready.
    r.drv.negotiate(offered).expect("features");
    r.drv.setup_queues(None).expect("queues");
    r.drv.write_reg(REG_QUEUE_SEL, D::QUEUE as u32);
    r.drv.write_reg(REG_QUEUE_READY, 0);
    refused_at_driver_ok(&mut r, "a queue not ready");
    assert_eq!(r.metric("features_negotiated"), 0, "never activated");
    r.drv.init(offered).expect("a reset starts over");
    r.run_until_idle();
    let req = submit(&mut r, 3);
    r.run_until_idle();
    assert_served(&mut r, req, 0);
}

/// DRIVER_OK with a queue the transport refuses: DEVICE_NEEDS_RESET and a
/// configuration interrupt, no activation, an event loop that goes idle.
#[track_caller]
fn refused_at_driver_ok<D: ContractDevice>(r: &mut DeviceRig<D>, what: &str) {
    r.drv.ack_interrupt(u32::MAX);
    r.drv.add_status(status::DRIVER_OK);
    r.run_until_idle();
    assert!(!r.drv.transport().is_activated(), "{what}: activated");
    assert_ne!(r.drv.status() & status::DEVICE_NEEDS_RESET, 0, "{what}");
    assert_ne!(
        r.drv.interrupt_status() & VIRTIO_MMIO_INT_CONFIG,
        0,
        "{what}"
    );
}

/// Activation with the wrong queues, straight at the device.
pub fn wrong_queues<D: ContractDevice>() {
    let (r, _keep) = rig::<D>();
    let mem = r.drv.mem().clone();
    let features = 1u64 << VIRTIO_F_VERSION_1;
    let n = r.dev().queue_max_sizes().len();
    let queues = |mem: &GuestMemory, count: usize| -> Vec<_> {
        (0..count)
            .map(|i| {
                let base = GuestAddress(0x10000 * (i as u64 + 1));
                queue_at(
                    mem,
                    DriverQueue::packed(mem, base, 16).ring_addrs(),
                    features,
                )
            })
            .collect()
    };
    let irq = Arc::new(TestIrq::default());
    for count in [0, n - 1, n + 1] {
        let err = r.dev().activate(features, queues(&mem, count), irq.clone());
        assert!(
            matches!(err, Err(ActivateError::QueueCount { expected, got }) if expected == n && got == count),
            "{count} queues: {err:?}"
        );
    }
    let elsewhere = guest_memory(MEM_SIZE as usize).expect("guest memory");
    let err = r
        .dev()
        .activate(features, queues(&elsewhere, n), irq.clone());
    assert!(matches!(err, Err(ActivateError::Backend(_))), "{err:?}");
    assert_eq!(r.metric("features_negotiated"), 0, "never activated");
    r.dev()
        .activate(features, queues(&mem, n), irq)
        .expect("the right queues");
}

/// Notifications before DRIVER_OK.
pub fn kick_before_driver_ok<D: ContractDevice>() {
    let (mut r, _keep) = rig::<D>();
    let offered = r.drv.device_features();
    r.drv.negotiate(offered).expect("features");
    r.drv.setup_queues(None).expect("queues");
    let req = submit(&mut r, 3);
    r.drv.kick(1000);
    r.run_until_idle();
    assert_eq!(
        r.drv.used_idx(D::QUEUE).expect("used idx"),
        0,
        "served before DRIVER_OK"
    );
    r.drv.driver_ok().expect("the device starts");
    r.run_until_idle();
    assert_served(&mut r, req, 0);
}

/// DRIVER_OK twice, and a second activation without a reset.
pub fn activation_twice<D: ContractDevice>() {
    let (mut r, _keep) = live::<D>();
    let s = r.drv.status();
    r.drv.write_reg(REG_STATUS, s | status::DRIVER_OK);
    assert_eq!(r.drv.status(), s);
    let req = submit(&mut r, 3);
    r.run_until_idle();
    assert_served(&mut r, req, 0);
    // The transport never does this; the device starts over on the rings
    // it is given, and the old ones are left alone.
    let mem = r.drv.mem().clone();
    let features = r.metric("features_negotiated");
    let sizes = r.dev().queue_max_sizes().to_vec();
    let mut rings: Vec<DriverQueue> = sizes
        .iter()
        .map(|&size| {
            let base = r.drv.alloc(u64::from(size) * 32, 4096).expect("memory");
            DriverQueue::packed(&mem, base, size)
        })
        .collect();
    let queues = rings
        .iter()
        .map(|q| queue_at(&mem, q.ring_addrs(), features))
        .collect();
    let irq = Arc::new(TestIrq::default());
    r.dev()
        .activate(features, queues, irq.clone())
        .expect("a second activation");
    r.run_until_idle();
    let segs = D::request(&mut r.drv, 3);
    let ring = &mut rings[D::QUEUE];
    let head = ring.add_chain(&mem, &segs).expect("room");
    ring.publish(&mem).expect("publish");
    r.dev().queue_events()[D::QUEUE].write(1).expect("kick");
    r.run_until_idle();
    let used = ring.used(&mem).expect("the new used ring");
    assert_eq!(used.len(), 1, "{used:?}");
    assert_eq!(used[0].id, u32::from(head));
    assert!(u64::from(used[0].len) <= writable(&segs));
    assert!(irq.count() >= 1, "no interrupt on the new activation");
    assert!(r.drv.used(D::QUEUE).expect("the old ring").is_empty());
}

/// Reset and re-activation with the state cleared.
pub fn reset_clears<D: ContractDevice>() {
    let (mut r, _keep) = live::<D>();
    let offered = r.metric("features_negotiated");
    let req = submit(&mut r, 3);
    r.run_until_idle();
    assert_served(&mut r, req, 0);
    // Posted and kicked, then a reset before the loop ran.
    submit(&mut r, 3);
    let old = r.drv.layout(D::QUEUE).expect("the queue");
    let mem = r.drv.mem().clone();
    r.drv.reset();
    r.run_until_idle();
    assert!(!r.drv.transport().is_activated());
    assert_eq!(
        r.dev().common().acked_features,
        0,
        "features of the old activation"
    );
    let stale = DriverQueue::new(old).used_idx(&mem).expect("old used idx");
    assert_eq!(stale, 1, "the old ring was served after the reset");
    // A reset device polls no queue: a kick now wakes nothing.
    r.drv.kick(D::QUEUE);
    assert_eq!(r.run_once(0), 0, "a kick reached a reset device");
    let version_1 = 1u64 << VIRTIO_F_VERSION_1;
    r.drv.init(version_1).expect("the device starts again");
    r.run_until_idle();
    assert_eq!(r.metric("features_negotiated"), version_1);
    assert_ne!(offered, version_1, "the features changed");
    let req = submit(&mut r, 3);
    r.run_until_idle();
    assert_served(&mut r, req, 0);
    assert_eq!(
        r.drv.used_idx(D::QUEUE).expect("used idx"),
        1,
        "a clean ring"
    );
    assert_eq!(
        DriverQueue::new(old).used_idx(&mem).expect("old used idx"),
        1
    );
}

/// Configuration-space reads and writes at every offset and width.
pub fn config_space<D: ContractDevice>() {
    let (mut r, _keep) = live::<D>();
    let end = D::CONFIG_LEN + 16;
    let read = |r: &mut DeviceRig<D>, off: u64, width: usize| {
        let mut b = vec![0xa5; width];
        r.drv
            .transport_mut()
            .read(CONFIG_SPACE_OFFSET + off, &mut b);
        b
    };
    let bytes: Vec<u8> = (0..end).map(|o| read(&mut r, o, 1)[0]).collect();
    assert!(
        bytes[D::CONFIG_LEN as usize..].iter().all(|&b| b == 0),
        "past its end"
    );
    let generation = r.drv.read_reg(REG_CONFIG_GENERATION);
    let check = |r: &mut DeviceRig<D>| {
        for width in [1, 2, 4, 8] {
            for off in 0..end {
                let want: Vec<u8> = (off..off + width as u64)
                    .map(|o| bytes.get(o as usize).copied().unwrap_or(0))
                    .collect();
                assert_eq!(read(r, off, width), want, "{width} bytes at {off:#x}");
            }
        }
    };
    check(&mut r);
    let mut writes = 0;
    let w = D::WRITABLE_CONFIG;
    for width in [1, 2, 4, 8] {
        for off in 0..end {
            if off < w.end && w.start < off + width as u64 {
                continue;
            }
            r.drv
                .transport_mut()
                .write(CONFIG_SPACE_OFFSET + off, &vec![0x5a; width]);
            writes += 1;
        }
    }
    check(&mut r);
    assert_eq!(r.metric("config_writes_ignored"), writes);
    assert_eq!(r.drv.read_reg(REG_CONFIG_GENERATION), generation);
}

/// Chains that loop or link out of their table.
pub fn looping_chains<D: ContractDevice>() {
    let (mut r, _keep) = live::<D>();
    let mut heads = Vec::new();
    for link_out in [false, true] {
        let segs = D::request(&mut r.drv, 3);
        let head = r.drv.add_chain(D::QUEUE, &segs).expect("room");
        // A fresh free list hands out consecutive descriptors.
        let last = head + segs.len() as u16 - 1;
        let (q, mem) = r.drv.queue_mut(D::QUEUE).expect("the queue");
        let next = if link_out { q.size() } else { head };
        let s = segs[segs.len() - 1];
        let flags = if s.device_writable {
            VIRTQ_DESC_F_WRITE
        } else {
            0
        };
        q.write_desc(mem, last, s.addr.0, s.len, flags | VIRTQ_DESC_F_NEXT, next)
            .expect("the table");
        heads.push(head);
    }
    refused_then_served(&mut r, &heads);
}

/// Buffers outside guest memory.
pub fn outside_memory<D: ContractDevice>() {
    let (mut r, _keep) = live::<D>();
    let mut heads = Vec::new();
    for (i, addr) in [MEM_SIZE - 1, MEM_SIZE, u64::MAX - 16]
        .into_iter()
        .enumerate()
    {
        let mut segs = D::request(&mut r.drv, 3);
        // The first buffer across the end, the last one past it, the middle
        // one where the address wraps.
        let k = [0, segs.len() - 1, 1][i];
        segs[k].addr = GuestAddress(addr);
        heads.push(r.drv.add_chain(D::QUEUE, &segs).expect("room"));
    }
    refused_then_served(&mut r, &heads);
}

/// An avail index far ahead of the device.
pub fn avail_index<D: ContractDevice>() {
    let (mut r, _keep) = live::<D>();
    let layout = r.drv.layout(D::QUEUE).expect("the queue");
    let mem = r.drv.mem().clone();
    let idx = layout.size + 1;
    vm_memory::Bytes::write_obj(&mem, idx.to_le(), GuestAddress(layout.avail_ring.0 + 2))
        .expect("avail.idx");
    r.drv.kick(D::QUEUE);
    r.run_until_idle();
    assert_eq!(r.metric("queue_errors"), 1);
    assert_ne!(r.drv.status() & status::DEVICE_NEEDS_RESET, 0);
    assert_eq!(r.drv.used_idx(D::QUEUE).expect("used idx"), 0);
    // More kicks change nothing, and nothing spins.
    r.drv.kick(D::QUEUE);
    r.run_until_idle();
    assert_eq!(r.metric("queue_errors"), 1);
    let offered = r.drv.device_features();
    r.drv.init(offered).expect("a reset starts over");
    r.run_until_idle();
    let req = submit(&mut r, 3);
    r.run_until_idle();
    assert_served(&mut r, req, 0);
}

/// Buffers per chain and chains posted in the descriptor-budget test: 90
/// chains of 128 buffers (what a block request may have) behind indirect
/// tables are about 11,700 reads, over the budget of one pass.
const BUDGET_BUFS: usize = 128;
const BUDGET_CHAINS: usize = 90;

/// The descriptor budget.
pub fn descriptor_budget<D: ContractDevice>() {
    let (mut r, _keep) = live::<D>();
    let mut heads = Vec::new();
    for _ in 0..BUDGET_CHAINS {
        let segs = D::request(&mut r.drv, BUDGET_BUFS);
        let table = r.drv.alloc(16 * segs.len() as u64, 16).expect("memory");
        heads.push(
            r.drv
                .add_chain_indirect(D::QUEUE, &segs, 0, table)
                .expect("room"),
        );
    }
    r.drv.publish(D::QUEUE).expect("publish");
    r.drv.kick(D::QUEUE);
    r.run_until_idle();
    let used = r.drv.used(D::QUEUE).expect("the used ring");
    let mut answered: Vec<u16> = used.iter().map(|e| e.id as u16).collect();
    answered.sort_unstable();
    assert_eq!(answered, heads, "every chain answered once");
    let max = r.metric("max_descs_per_pass");
    assert!(max <= u64::from(MAX_PASS_READS), "{max} reads in one pass");
    assert!(
        max >= u64::from(PASS_DESC_BUDGET),
        "the budget never ended a pass: {max}"
    );
    assert_eq!(r.metric(D::REFUSED), 0);
}

/// The contract suite for a device type implementing [`ContractDevice`]:
/// one `#[test]` per contract test, in a module `contract`.
macro_rules! contract_suite {
    ($device:ty) => {
        mod contract {
            use super::*;
            use $crate::virtio::test_utils::contract as c;

            #[test]
            fn negotiation() {
                c::negotiation::<$device>();
            }
            #[test]
            fn status_machine() {
                c::status_machine::<$device>();
            }
            #[test]
            fn queue_errors() {
                c::queue_errors::<$device>();
            }
            #[test]
            fn wrong_queues() {
                c::wrong_queues::<$device>();
            }
            #[test]
            fn kick_before_driver_ok() {
                c::kick_before_driver_ok::<$device>();
            }
            #[test]
            fn activation_twice() {
                c::activation_twice::<$device>();
            }
            #[test]
            fn reset_clears() {
                c::reset_clears::<$device>();
            }
            #[test]
            fn config_space() {
                c::config_space::<$device>();
            }
            #[test]
            fn looping_chains() {
                c::looping_chains::<$device>();
            }
            #[test]
            fn outside_memory() {
                c::outside_memory::<$device>();
            }
            #[test]
            fn avail_index() {
                c::avail_index::<$device>();
            }
            #[test]
            fn descriptor_budget() {
                c::descriptor_budget::<$device>();
            }
        }
    };
}
pub(crate) use contract_suite;
