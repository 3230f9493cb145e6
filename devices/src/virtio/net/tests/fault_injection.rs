// SPDX-License-Identifier: Apache-2.0
//! Fault injection: a backend that fails on demand, and
//! device resets at every step.
//!
//! [`FaultBackend`] sits on one end of a socket pair and, call by call as
//! its script says, returns EAGAIN, EINTR, EIO, EINVAL, ENOBUFS, EBADFD, 0
//! bytes or a short count, or runs a hook inside the pass (a vCPU resetting
//! the device). Resets and re-activations are injected between every two
//! steps of a scenario and from inside passes. The oracles, after every step:
//! the event loop goes idle within [`IDLE_WITHIN`] iterations; every chain the
//! driver posted comes back at most once per activation, and every one comes
//! back once the backend is healthy again; used lengths follow the spec (RX:
//! the bytes written, checked against stale bytes; TX: 0); and across
//! activations the peer receives exactly the frames of the TX chains that
//! came back, in order, while the driver receives every frame the peer sent,
//! in order, none twice.
//!
//! The real-TAP test sets the TAP down and deletes it under a running
//! device (root and /dev/net/tun, in a private network namespace).

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::fixture::*;
use crate::virtio::net::tap::{enter_private_netns, Tap};
use crate::virtio::net::{NetConfig, SeqPacket};
use crate::virtio::VirtioDevice;
use minivmm_tests::print_skip;

/// Event-loop iterations within which the device must go idle once the
/// guest and the peer stop.
const IDLE_WITHIN: usize = 64;

type FaultNetFixture = NetFixture<FaultBackend>;

fn harness(cfg: NetConfig, features: u64) -> FaultNetFixture {
    let (b, peer) = FaultBackend::pair();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
    let mut h = NetFixture::with_backend(b, peer, cfg, mem);
    h.activate(features);
    h
}

fn script(h: &FaultNetFixture) -> Arc<Mutex<Script>> {
    h.dev().backend().script.clone()
}

fn idle<B: crate::virtio::net::NetBackend + 'static>(h: &mut NetFixture<B>, what: &str) {
    assert!(
        h.run_bounded(IDLE_WITHIN).is_some(),
        "{what}: the event loop never went idle: {}",
        h.metrics.to_json()
    );
}

const FEATURES: u64 = MRG_FEATURES | RING_INDIRECT;

/// TX chain shapes, cycled through by the tests.
fn tx_shape(i: usize, len: usize) -> (Vec<u32>, Layout) {
    let len = len as u32;
    match i % 4 {
        0 => (vec![len], Layout::Direct),
        1 => (vec![12, len - 12], Layout::Direct),
        2 => (vec![5, 7, len - 12], Layout::Indirect),
        _ => (vec![12, 20, len - 32], Layout::Mixed(1)),
    }
}

/// RX chain shapes of 1526 bytes, cycled through by the tests.
fn rx_shape(i: usize) -> (Vec<u32>, Layout) {
    match i % 4 {
        0 => (vec![1526], Layout::Direct),
        1 => (vec![12, 1514], Layout::Direct),
        2 => (vec![700, 826], Layout::Indirect),
        _ => (vec![11, 515, 1000], Layout::Mixed(2)),
    }
}

const EAGAIN: Fault = Fault::Errno(libc::EAGAIN);

/// The errnos both fault matrices inject: flow control, an interrupted
/// call, and the host errors a TAP may return either way.
const ERRNO_FAULTS: [Fault; 5] = [
    EAGAIN,
    Fault::Errno(libc::EINTR),
    Fault::Errno(libc::EIO),
    Fault::Errno(libc::EINVAL),
    Fault::Errno(libc::ENOBUFS),
];

/// Where a fault matrix puts its fault: the first, a middle and the last of
/// its 8 operations.
const FAULT_POSITIONS: [usize; 3] = [0, 3, 7];

/// The TX fault matrix: every kind of failure at the first, a middle and the
/// last of 8 sends. Every chain comes back once, in order, with length 0;
/// EAGAIN and EINTR lose nothing, a refusal or a 0-byte write drops that
/// frame, a short write reaches the peer cut short and counts as dropped;
/// no host error is counted; the loop goes idle.
#[test]
fn tx_fault_matrix() {
    let others = [Fault::Errno(libc::EBADFD), Fault::Zero, Fault::Short(20)];
    for fault in ERRNO_FAULTS.into_iter().chain(others) {
        for pos in FAULT_POSITIONS {
            let what = format!("{fault:?} at send {pos}");
            let mut h = harness(NetConfig::default(), FEATURES);
            script(&h).lock().unwrap().write_fault_at(pos, fault);
            let frames: Vec<Vec<u8>> = (0..8).map(|i| noisy_frame(112 + 10 * i, i as u8)).collect();
            let heads: Vec<u16> = frames
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    let (lens, layout) = tx_shape(i, f.len());
                    h.post_tx_shaped(f, &lens, layout)
                })
                .collect();
            h.kick_tx();
            idle(&mut h, &what);
            assert_eq!(
                h.txq.take_used(&h.mem),
                heads.iter().map(|&h| (u32::from(h), 0)).collect::<Vec<_>>(),
                "{what}"
            );
            let mut want = frames.clone();
            let lost = match fault {
                Fault::Errno(e) if e == libc::EAGAIN || e == libc::EINTR => false,
                Fault::Short(n) => {
                    want[pos].truncate(n);
                    true
                }
                _ => {
                    want.remove(pos);
                    true
                }
            };
            assert_eq!(h.peer_frames(), want, "{what}");
            assert_eq!(h.metric(|m| &m.tx_frames), 8 - u64::from(lost), "{what}");
            assert_eq!(h.metric(|m| &m.tx_dropped), u64::from(lost), "{what}");
            let again = u64::from(fault == EAGAIN);
            assert_eq!(h.metric(|m| &m.tap_eagain), again, "{what}");
            assert_eq!(h.metric(|m| &m.tx_eagain_retries), again, "{what}");
            assert_eq!(h.metric(|m| &m.host_errors), 0, "{what}");
            assert_eq!(h.metric(|m| &m.malformed_chains), 0, "{what}");
            assert!(!h.dev().active.as_ref().unwrap().tx.is_blocked(), "{what}");
        }
    }
}

/// The RX fault matrix: every kind of failure at the first, a middle and the
/// last of 8 receives. A failed or empty receive loses no frame (it is read
/// by the next pass), a 0-byte one is a runt, a short one delivers what it
/// got (or drops it, shorter than a header); every frame lands byte-exact
/// in chains each used once, read errors count as host errors, the loop
/// goes idle.
#[test]
fn rx_fault_matrix() {
    let others = [Fault::Zero, Fault::Short(42), Fault::Short(5)];
    for fault in ERRNO_FAULTS.into_iter().chain(others) {
        for pos in FAULT_POSITIONS {
            let what = format!("{fault:?} at receive {pos}");
            let mut h = harness(NetConfig::default(), FEATURES);
            for i in 0..8 {
                let (lens, layout) = rx_shape(i);
                h.post_rx_shaped(&lens, layout);
            }
            h.kick_rx();
            h.run_bounded(IDLE_WITHIN);
            script(&h).lock().unwrap().read_fault_at(pos, fault);
            let frames: Vec<Vec<u8>> = (0..8)
                .map(|i| noisy_frame(100 + 150 * i, i as u8))
                .collect();
            for f in &frames {
                h.peer.send(f).unwrap();
            }
            idle(&mut h, &what);
            let mut want = frames.clone();
            let (dropped, host_errors) = match fault {
                Fault::Errno(e) if e == libc::EAGAIN || e == libc::EINTR => (0, 0),
                Fault::Errno(_) => (0, 1),
                // A runt: the real frame stays for the next read.
                Fault::Zero => (1, 0),
                Fault::Short(n) if n < 12 => {
                    want.remove(pos);
                    (1, 0)
                }
                Fault::Short(n) => {
                    want[pos].truncate(n);
                    (0, 0)
                }
                Fault::Hook | Fault::Kind(_) => unreachable!(),
            };
            let got = h.take_rx_frames();
            assert_eq!(got.len(), want.len(), "{what}");
            for (g, w) in got.iter().zip(&want) {
                g.assert_is(w);
            }
            assert_eq!(h.metric(|m| &m.rx_dropped), dropped, "{what}");
            assert_eq!(h.metric(|m| &m.host_errors), host_errors, "{what}");
            assert!(h.irq.count() > 0, "{what}");
        }
    }
}

/// The driver's view of one activation: the chains it posted and what came
/// back, checked as it goes.
#[derive(Default)]
struct Ledger {
    /// TX chains posted and not yet returned, with their frames.
    tx_out: HashMap<u16, Vec<u8>>,
    /// Frames of TX chains returned, in used-ring order (across
    /// activations).
    tx_returned: Vec<Vec<u8>>,
    /// Frames the driver received (across activations).
    rx_got: Vec<Vec<u8>>,
}

impl Ledger {
    fn post_tx(&mut self, h: &mut FaultNetFixture, f: Vec<u8>) {
        let (lens, layout) = tx_shape(self.tx_out.len() + self.tx_returned.len(), f.len());
        let head = h.post_tx_shaped(&f, &lens, layout);
        assert!(self.tx_out.insert(head, f).is_none());
    }

    /// Takes every used entry of both queues: each id must be outstanding
    /// (so returned once), TX lengths 0, RX checked by `take_rx_frames`.
    fn collect(&mut self, h: &mut FaultNetFixture) {
        for (id, len) in h.txq.take_used(&h.mem) {
            let f = self
                .tx_out
                .remove(&(id as u16))
                .unwrap_or_else(|| panic!("TX used id {id} not outstanding"));
            assert_eq!(len, 0, "TX used length");
            self.tx_returned.push(f);
        }
        for f in h.take_rx_frames() {
            self.rx_got.push(f.data.clone());
            // The frame as the peer sent it, but for num_buffers.
            let last = self.rx_got.last_mut().unwrap();
            last[10..12].copy_from_slice(&[0xea, 0xeb]);
        }
    }

    /// The driver resets the device and starts over with fresh rings: the
    /// chains it had posted are forgotten (they will never come back).
    fn reset(&mut self, h: &mut FaultNetFixture, features: u64) {
        self.collect(h);
        h.dev().reset();
        idle(h, "after a reset");
        self.tx_out.clear();
        h.rx_chains.clear();
        h.rxq = DriverQueue::packed(&h.mem, GuestAddress(0x10000), 256);
        h.txq = DriverQueue::packed(&h.mem, GuestAddress(0x80000), 256);
        h.activate(features);
    }
}

/// One step of the reset scenario.
fn step(h: &mut FaultNetFixture, l: &mut Ledger, k: usize, sent: &mut Vec<Vec<u8>>) {
    let mut send = |h: &mut FaultNetFixture, n: usize| {
        for _ in 0..n {
            let f = noisy_frame(100 + 37 * sent.len(), sent.len() as u8);
            h.peer.send(&f).unwrap();
            sent.push(f);
        }
    };
    match k {
        0 => {
            for i in 0..3 {
                let (lens, layout) = rx_shape(i);
                h.post_rx_shaped(&lens, layout);
            }
            h.kick_rx();
        }
        1 => send(h, 2),
        3 => {
            script(h).lock().unwrap().write_fault_at(2, EAGAIN);
            for i in 0..4 {
                l.post_tx(h, noisy_frame(80 + i, 0x40 + i as u8));
            }
            h.kick_tx();
        }
        // More frames than buffers: RX starves.
        5 => send(h, 3),
        8 => {
            for i in 0..2 {
                let (lens, layout) = rx_shape(i + 1);
                h.post_rx_shaped(&lens, layout);
            }
            h.kick_rx();
        }
        10 => {
            script(h)
                .lock()
                .unwrap()
                .read_fault_at(0, Fault::Errno(libc::EIO));
            script(h).lock().unwrap().write_fault_at(0, EAGAIN);
            for i in 0..2 {
                l.post_tx(h, noisy_frame(90 + i, 0x50 + i as u8));
            }
            h.kick_tx();
            send(h, 1);
        }
        // Odd steps and the rest: one loop iteration.
        _ => {
            h.run_once(0);
        }
    }
}

const STEPS: usize = 13;

/// Runs the scenario with a reset and re-activation after step `reset_at`
/// (none if past the end), then lets the driver post buffers for whatever
/// the peer sent, and checks the ledger.
fn run_scenario(reset_at: &[usize]) {
    let what = format!("reset after steps {reset_at:?}");
    let mut h = harness(NetConfig::default(), FEATURES);
    let mut l = Ledger::default();
    let mut sent = Vec::new();
    for k in 0..STEPS {
        step(&mut h, &mut l, k, &mut sent);
        if reset_at.is_empty() {
            // Without resets, the states the scenario is built to reach.
            let a = h.dev();
            let a = a.active.as_ref().unwrap();
            match k {
                4 | 11 => assert!(a.tx.is_blocked(), "step {k}: TX not blocked"),
                7 => assert!(a.rx.starved_since().is_some(), "step {k}: RX not starved"),
                _ => {}
            }
        }
        l.collect(&mut h);
        if reset_at.contains(&k) {
            l.reset(&mut h, FEATURES);
        }
    }
    idle(&mut h, &what);
    // The driver posts a buffer per frame still in flight and waits.
    for i in 0..sent.len() {
        let (lens, layout) = rx_shape(i);
        h.post_rx_shaped(&lens, layout);
    }
    h.kick_rx();
    idle(&mut h, &what);
    l.collect(&mut h);
    // Every TX chain of the last activation came back.
    assert!(l.tx_out.is_empty(), "{what}: TX chains never returned");
    // The peer got exactly the frames of the chains that came back.
    assert_eq!(h.peer_frames(), l.tx_returned, "{what}");
    // The driver got every frame the peer sent, in order, once.
    let want: Vec<Vec<u8>> = sent
        .iter()
        .map(|f| {
            let mut f = f.clone();
            f[10..12].copy_from_slice(&[0xea, 0xeb]);
            f
        })
        .collect();
    assert_eq!(l.rx_got.len(), want.len(), "{what}");
    assert!(
        l.rx_got == want,
        "{what}: RX frames lost, duplicated or reordered"
    );
    assert_eq!(h.metric(|m| &m.malformed_chains), 0, "{what}");
    assert_eq!(h.metric(|m| &m.rx_dropped), 0, "{what}");
}

/// A reset and re-activation after every step of a scenario that has TX
/// waiting on EAGAIN, RX starved, a read error and passes in flight; and
/// two resets in a row.
#[test]
fn reset_and_reactivation_at_every_step() {
    run_scenario(&[]);
    for k in 0..STEPS {
        run_scenario(&[k]);
    }
    run_scenario(&[4, 5]);
    run_scenario(&[0, 6, 11]);
}

/// The TX queue breaks (avail.idx moved 1000 ahead) in the pass that also
/// had chains pushed back (EAGAIN): those chains now wait for the driver's
/// reset, and a writable backend must not wake the loop for them. (It spun
/// on EPOLLOUT, every retry returning at once on the broken queue: found by
/// the net_datapath fuzz target, seed
/// `corpus/net_datapath/regression-tx-broken-while-pushed-back`.)
#[test]
fn a_broken_tx_queue_with_chains_pushed_back_lets_the_loop_sleep() {
    let mut h = harness(NetConfig::default(), FEATURES);
    let chains = 40;
    {
        let mem = h.mem.clone();
        let s = script(&h);
        let mut s = s.lock().unwrap();
        // During the last write of the first batch of 32, the driver moves
        // avail.idx out of range: the walk of the next chains then fails.
        s.hook = Some(Box::new(move || {
            mem.write_obj(1000u16, GuestAddress(0x80000 + 16 * 256 + 2))
                .unwrap();
        }));
        s.write_fault_at(31, Fault::Hook);
        // The first write of the second batch is pushed back.
        s.write_fault_at(0, Fault::Errno(libc::EAGAIN));
    }
    for i in 0..chains {
        h.post_tx(&noisy_frame(60 + i, i as u8), &[]);
    }
    h.kick_tx();
    idle(&mut h, "broken TX with chains pushed back");
    assert_eq!(h.metric(|m| &m.queue_errors), 1);
    assert_eq!(h.metric(|m| &m.tap_eagain), 1);
    assert_eq!(
        h.irq
            .device_errors
            .load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    assert!(!h.dev().active.as_ref().unwrap().tx.is_blocked());
}

/// A vCPU resets and re-activates the device while a pass is running (the
/// backend's hook starts it from inside the pass; it takes the device lock
/// when the pass ends, exactly as a Status write from a vCPU would), at every
/// receive and send call of a stream of traffic. The old activation's chains
/// are each returned at most once, the new one's all come back, and the loop
/// goes idle.
#[test]
fn reset_from_a_vcpu_in_the_middle_of_a_pass() {
    for (rx, call) in (0..6).flat_map(|c| [(true, c), (false, c)]) {
        let what = format!(
            "reset during {} call {call}",
            if rx { "receive" } else { "send" }
        );
        let mut h = harness(NetConfig::default(), FEATURES);
        // The new activation's rings, elsewhere in memory so the test can
        // tell the two apart.
        let new_rx = DriverQueue::packed(&h.mem, GuestAddress(0x40000), 256);
        let new_tx = DriverQueue::packed(&h.mem, GuestAddress(0xc0000), 256);
        let queues = rx_tx_queues(&h.mem, &new_rx, &new_tx, FEATURES);
        let vcpu: Arc<Mutex<Option<std::thread::JoinHandle<()>>>> = Default::default();
        {
            let (net, irq, vcpu) = (h.dev.clone(), h.irq.clone(), vcpu.clone());
            let mut queues = Some(queues);
            let s = script(&h);
            let mut s = s.lock().unwrap();
            s.hook = Some(Box::new(move || {
                let (net, irq, queues) = (net.clone(), irq.clone(), queues.take());
                let t = std::thread::spawn(move || {
                    let mut n = net.lock().unwrap();
                    n.reset();
                    if let Some(q) = queues {
                        n.activate(FEATURES, q, irq).unwrap();
                    }
                });
                *vcpu.lock().unwrap() = Some(t);
            }));
            if rx {
                s.read_fault_at(call, Fault::Hook);
            } else {
                s.write_fault_at(call, Fault::Hook);
            }
        }
        let mut l = Ledger::default();
        for i in 0..8 {
            let (lens, layout) = rx_shape(i);
            h.post_rx_shaped(&lens, layout);
            l.post_tx(&mut h, noisy_frame(60 + i, i as u8));
        }
        for i in 0..8 {
            h.peer.send(&noisy_frame(200 + i, 0x30 + i as u8)).unwrap();
        }
        h.kick_rx();
        h.kick_tx();
        idle(&mut h, &what);
        let t = vcpu.lock().unwrap().take();
        t.expect("the hook ran").join().unwrap();
        idle(&mut h, &what);
        // The old rings: every id at most once, lengths per the spec.
        l.collect(&mut h);
        // The new activation: fresh driver state on the new rings.
        h.rxq = new_rx;
        h.txq = new_tx;
        h.rx_chains.clear();
        l.tx_out.clear();
        for i in 0..8 {
            let (lens, layout) = rx_shape(i);
            h.post_rx_shaped(&lens, layout);
            l.post_tx(&mut h, noisy_frame(70 + i, 0x60 + i as u8));
        }
        h.kick_rx();
        h.kick_tx();
        idle(&mut h, &what);
        l.collect(&mut h);
        assert!(l.tx_out.is_empty(), "{what}: new TX chains never returned");
        assert_eq!(h.peer_frames(), l.tx_returned, "{what}");
        assert_eq!(l.rx_got.len(), 8, "{what}: RX frames lost or duplicated");
    }
}

/// A backend that keeps failing (every receive EIO while the fd stays
/// readable, every send EAGAIN or ENOBUFS) costs one attempt per loop
/// iteration at most, and once it recovers everything flows.
#[test]
fn a_failing_backend_costs_one_attempt_per_iteration() {
    let mut h = harness(NetConfig::default(), FEATURES);
    for i in 0..4 {
        let (lens, layout) = rx_shape(i);
        h.post_rx_shaped(&lens, layout);
    }
    h.kick_rx();
    idle(&mut h, "setup");
    {
        let s = script(&h);
        let mut s = s.lock().unwrap();
        s.reads
            .extend(std::iter::repeat_n(Some(Fault::Errno(libc::EIO)), 50));
        s.writes.extend(std::iter::repeat_n(Some(EAGAIN), 50));
    }
    let f = noisy_frame(300, 1);
    h.peer.send(&f).unwrap();
    let mut l = Ledger::default();
    l.post_tx(&mut h, noisy_frame(100, 2));
    h.kick_tx();
    for i in 0..20 {
        let before = {
            let s = script(&h);
            let s = s.lock().unwrap();
            s.recv_calls + s.send_calls
        };
        h.run_once(0);
        let s = script(&h);
        let s = s.lock().unwrap();
        assert!(s.recv_calls + s.send_calls - before <= 2, "iteration {i}");
    }
    idle(&mut h, "after the failures");
    l.collect(&mut h);
    assert!(l.tx_out.is_empty());
    assert_eq!(l.rx_got.len(), 1);
}

/// Replaces the harness' peer by a fresh socket, closing the old one: the
/// backend's peer is gone. Returns once the device took the hangup.
fn close_peer<B: crate::virtio::net::NetBackend + 'static>(h: &mut NetFixture<B>) {
    let (fresh, _other) = SeqPacket::pair().unwrap();
    drop(std::mem::replace(&mut h.peer, fresh));
    // A test forking `ip` in parallel may hold a copy of the peer fd until
    // its child execs (CLOEXEC), delaying the hangup a little.
    for _ in 0..200 {
        idle(h, "peer closed");
        if h.dev().registered.backend_hup {
            return;
        }
        h.run_once(10);
    }
    panic!("the hangup never came: {}", h.metrics.to_json());
}

/// Runs the loop until TX no longer waits on the backend (which learns the
/// other end is gone only once every copy of its fd is closed: a test
/// forking in parallel may hold one until its child execs).
fn wait_tx_unblocked<B: crate::virtio::net::NetBackend + 'static>(
    h: &mut NetFixture<B>,
    what: &str,
) {
    for _ in 0..200 {
        idle(h, what);
        if !h.dev().active.as_ref().unwrap().tx.is_blocked() {
            return;
        }
        h.run_once(10);
    }
    panic!("{what}: TX still waits: {}", h.metrics.to_json());
}

/// A hangup is logged and counted once, whatever host errors came before
/// it: its log line is rate-limited on its own count, as one keyed on
/// `host_errors` would be silent after two read errors.
#[test]
fn a_hangup_is_logged_once_whatever_came_before() {
    let mut h = harness(NetConfig::default(), FEATURES);
    h.post_rx_shaped(&[1526], Layout::Direct);
    h.post_rx_shaped(&[1526], Layout::Direct);
    h.kick_rx();
    {
        let s = script(&h);
        let mut s = s.lock().unwrap();
        s.read_fault_at(0, Fault::Errno(libc::EIO));
        s.read_fault_at(0, Fault::Errno(libc::EIO));
    }
    let f = noisy_frame(200, 1);
    h.peer.send(&f).unwrap();
    idle(&mut h, "read errors");
    h.take_rx_frames()[0].assert_is(&f);
    assert_eq!(h.metric(|m| &m.host_errors), 2);
    let before = test_log::lines().len();
    close_peer(&mut h);
    assert_eq!(h.metric(|m| &m.backend_hangups), 1);
    assert_eq!(h.metric(|m| &m.host_errors), 3);
    let lines = test_log::lines()[before..].to_vec();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("hung up"), "{lines:#?}");
    assert_eq!(h.run_once(20), 0);
}

/// Used-ring entries as `(id, len)`.
type UsedEntries = Vec<(u32, u32)>;

/// Posts `n` frames of `len` bytes (the header in its own descriptor),
/// kicks TX and runs until it waits on EAGAIN; returns the `(head, 0)` entry
/// each frame must come back as, and those that came back so far.
fn block_tx<B: crate::virtio::net::NetBackend + 'static>(
    h: &mut NetFixture<B>,
    n: u8,
    len: usize,
    what: &str,
) -> (UsedEntries, UsedEntries) {
    let heads: UsedEntries = (0..n)
        .map(|i| (u32::from(h.post_tx(&frame(len, i), &[12])), 0))
        .collect();
    h.kick_tx();
    idle(h, what);
    assert!(h.dev().active.as_ref().unwrap().tx.is_blocked(), "{what}");
    let used = h.txq.take_used(&h.mem);
    assert!(used.len() < usize::from(n), "{what}");
    (heads, used)
}

/// After the backend went away under a TX blocked by [`block_tx`]: TX stops
/// waiting and every chain has come back, those in `used` first.
fn assert_tx_drained<B: crate::virtio::net::NetBackend + 'static>(
    h: &mut NetFixture<B>,
    heads: &[(u32, u32)],
    mut used: UsedEntries,
    what: &str,
) {
    wait_tx_unblocked(h, what);
    used.extend(h.txq.take_used(&h.mem));
    assert_eq!(used, heads, "{}", h.metrics.to_json());
    assert!(!h.dev().active.as_ref().unwrap().tx.is_blocked());
}

/// The peer goes away while TX waits on EAGAIN: the waiting chain and every
/// one behind it come back (the peer is gone, so they are dropped), and the
/// loop goes idle; nothing is leaked until a reset.
#[test]
fn peer_gone_while_tx_waits_on_eagain() {
    let mut h = NetFixture::new(NetConfig::default(), FEATURES);
    h.dev().backend().set_send_buffer(40000).unwrap();
    let (heads, used) = block_tx(&mut h, 8, 12 + 30000, "TX blocked");
    // RX has no buffers, so the device does not poll for the hangup; TX
    // learns of it from its own writes.
    let (fresh, _other) = SeqPacket::pair().unwrap();
    drop(std::mem::replace(&mut h.peer, fresh));
    assert_tx_drained(&mut h, &heads, used, "peer gone");
    // Later frames come back too.
    let head = h.post_tx(&frame(100, 9), &[]);
    h.kick_tx();
    idle(&mut h, "peer gone, another frame");
    assert_eq!(h.txq.take_used(&h.mem), vec![(u32::from(head), 0)]);
}

/// A backend that is the write end of a pipe: it takes frames until the
/// pipe is full (EAGAIN), and once the read end is closed it reports
/// EPOLLERR and never EPOLLOUT again (as a deleted TAP reports EPOLLERR
/// alone).
struct PipeBackend(std::os::fd::OwnedFd);

impl std::os::fd::AsRawFd for PipeBackend {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

impl crate::virtio::net::NetBackend for PipeBackend {}

/// The backend fails for good (EPOLLERR without EPOLLOUT) while TX waits on
/// EAGAIN: the waiting chain and those behind it still come back (dropped),
/// instead of waiting for a writability that never comes.
#[test]
fn backend_error_while_tx_waits_on_eagain() {
    // The read end is a child's stdin, which it never reads.
    let mut child = Command::new("sleep")
        .arg("60")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let w = std::os::fd::OwnedFd::from(child.stdin.take().unwrap());
    let (_unused, peer) = SeqPacket::pair().unwrap();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
    let mut h = NetFixture::with_backend(PipeBackend(w), peer, NetConfig::default(), mem);
    h.activate(FEATURES);
    // 2000-byte frames (atomic pipe writes): the 64 KiB pipe takes 32.
    let (heads, used) = block_tx(&mut h, 48, 2000, "pipe full");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_tx_drained(&mut h, &heads, used, "pipe broken");
    assert_eq!(h.metric(|m| &m.tx_dropped), 48 - h.metric(|m| &m.tx_frames));
    assert_eq!(h.run_once(20), 0);
}

// ---- a real TAP set down and deleted under a running device ----

/// Frames the backend refuses are dropped and logged once per run of
/// refusals of one kind: a short write is one kind whatever its length, an
/// errno another each, and an error the backend gives no errno for (or errno
/// 0) counts as EIO. Each run's first frame is logged (rate-limited on the
/// run count), so a guest whose every frame is refused the same way costs
/// one line, and a new kind of refusal is never hidden behind an old one.
#[test]
fn refused_frames_are_dropped_and_logged_once_per_kind_of_refusal() {
    let mut h = harness(NetConfig::default(), FEATURES);
    let faults = [
        Fault::Short(5),
        Fault::Short(6),
        Fault::Errno(0),
        Fault::Short(7),
        Fault::Errno(libc::EPERM),
        Fault::Errno(libc::EINVAL),
        Fault::Errno(libc::EIO),
    ];
    {
        let s = script(&h);
        let mut s = s.lock().unwrap();
        for f in faults {
            s.write_fault_at(0, f);
        }
    }
    let heads: Vec<(u32, u32)> = (0..faults.len() as u8)
        .map(|i| (u32::from(h.post_tx(&frame(12 + 100, i), &[])), 0))
        .collect();
    let before = test_log::lines().len();
    h.kick_tx();
    idle(&mut h, "refusals");
    assert_eq!(
        h.txq.take_used(&h.mem),
        heads,
        "each chain back once, length 0"
    );
    assert_eq!(h.metric(|m| &m.tx_dropped), faults.len() as u64);
    assert_eq!(h.metric(|m| &m.tx_frames), 0);
    // Short, EIO (errno 0), short, EPERM, EINVAL, EIO.
    assert_eq!(h.metric(|m| &m.tx_refusal_runs), 6);
    let lines = test_log::lines()[before..].to_vec();
    // Runs 1, 2 and 4 are logged (the rate limit's powers of two).
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(
        lines[0].contains("backend took 5 bytes of a 112-byte TX frame"),
        "{lines:#?}"
    );
    assert!(lines[1].contains("Input/output error"), "{lines:#?}");
    assert!(lines[2].contains("Operation not permitted"), "{lines:#?}");
    assert_eq!(
        h.metric(|m| &m.host_errors),
        0,
        "a refusal is no host fault"
    );
}

/// WouldBlock without an errno is a push-back like EAGAIN: the frame waits
/// for the backend and goes out, nothing is dropped. Any other error
/// without an errno is a refusal (EIO).
#[test]
fn would_block_without_an_errno_is_retried_and_other_errors_refuse() {
    let mut h = harness(NetConfig::default(), FEATURES);
    {
        let s = script(&h);
        let mut s = s.lock().unwrap();
        s.write_fault_at(0, Fault::Kind(std::io::ErrorKind::WouldBlock));
        s.write_fault_at(0, Fault::Kind(std::io::ErrorKind::Other));
    }
    let second = frame(12 + 100, 2);
    h.post_tx(&frame(12 + 100, 1), &[]);
    h.post_tx(&second, &[]);
    let before = test_log::lines().len();
    h.kick_tx();
    idle(&mut h, "would block");
    assert_eq!(h.txq.take_used(&h.mem).len(), 2);
    // The first frame waited (it is not dropped), its retry met the other
    // error and was refused, and the second went out.
    assert_eq!(h.peer_frames(), vec![second]);
    assert_eq!(h.metric(|m| &m.tap_eagain), 1);
    assert_eq!(h.metric(|m| &m.tx_dropped), 1);
    let lines = test_log::lines()[before..].to_vec();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("backend refused a TX frame: Input/output error")),
        "{lines:#?}"
    );
}

/// A TX pass with a time budget looks, before each batch after the first,
/// whether one more batch of what the batches so far cost would end past
/// the deadline, and yields if so: writes of 1 ms each, batches of
/// [`MAX_BATCH`](crate::virtio::io_engine::MAX_BATCH) frames and a 50 ms
/// budget end the first pass after one batch (32 ms or more), where a pass
/// that only read the clock while filling a batch would start a second.
#[test]
fn a_tx_pass_does_not_start_a_batch_its_time_budget_cannot_hold() {
    use crate::virtio::io_engine::MAX_BATCH;
    let mut h = harness(
        NetConfig {
            tx_weight_bytes: 0,
            tx_weight_packets: 0,
            pass_time_budget_us: 50_000,
            ..NetConfig::default()
        },
        FEATURES,
    );
    {
        let s = script(&h);
        let mut s = s.lock().unwrap();
        s.hook = Some(Box::new(|| std::thread::sleep(Duration::from_millis(1))));
        for _ in 0..2 * MAX_BATCH {
            s.write_fault_at(0, Fault::Hook);
        }
    }
    h.offer_tx_frames(2 * MAX_BATCH, 12 + 64);
    h.run_once(0);
    assert_eq!(h.peer_frames().len(), MAX_BATCH, "{}", h.metrics.to_json());
    assert_eq!(h.metric(|m| &m.time_budget_hits), 1);
    idle(&mut h, "the rest");
    assert_eq!(h.peer_frames().len(), MAX_BATCH);
}

fn ip(args: &[&str]) -> bool {
    let ok = Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        print_skip(&format!("`ip {args:?}` failed"));
    }
    ok
}

/// An ARP request for 10.78.0.1 from the "guest", vnet header included.
fn arp_request() -> Vec<u8> {
    let mac = [0x06, 0x00, 0xac, 0x10, 0x00, 0x02];
    let mut f = vec![0u8; 12];
    f.extend([0xff; 6]);
    f.extend(mac);
    f.extend([0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend(mac);
    f.extend([10, 78, 0, 2]);
    f.extend([0; 6]);
    f.extend([10, 78, 0, 1]);
    f
}

/// The TAP set down, set up again and then deleted under a running device.
/// Down: every TX frame is refused (EIO), returned to the guest and counted
/// as dropped, with one log line for the lot; the loop stays idle. Up again:
/// the host answers ARP. Deleted: the fd reports EPOLLERR for good; the
/// device logs it once, counts it (`backend_hangups`), stops polling the fd
/// instead of spinning on it, still returns every TX chain (dropped) and
/// still resets; a re-activation over the gone TAP is refused.
#[test]
fn real_tap_set_down_and_deleted_under_a_running_device() {
    if !enter_private_netns() {
        return;
    }
    let tap = Tap::open_named("mvflt%d").unwrap();
    let name = tap.if_name().to_string();
    if !ip(&["link", "set", "dev", &name, "up"])
        || !ip(&["addr", "add", "10.78.0.1/24", "dev", &name])
    {
        return;
    }
    let (_unused, peer) = SeqPacket::pair().unwrap();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap();
    let mut h = NetFixture::with_backend(tap, peer, NetConfig::default(), mem);
    h.activate(MRG_FEATURES);
    for _ in 0..32 {
        h.post_rx_shaped(&[1526], Layout::Direct);
    }
    h.kick_rx();
    let log0 = test_log::lines().len();

    let arp_reply = |h: &mut NetFixture<Tap>| -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            h.run_once(20);
            for f in h.take_rx_frames() {
                h.post_rx_shaped(&[1526], Layout::Direct);
                h.kick_rx();
                if f.data.len() >= 12 + 42
                    && f.data[24..26] == [0x08, 0x06]
                    && f.data[32..34] == [0, 2]
                {
                    return true;
                }
            }
        }
        false
    };
    let send = |h: &mut NetFixture<Tap>, n: usize| -> Vec<(u32, u32)> {
        let heads: Vec<(u32, u32)> = (0..n)
            .map(|_| {
                (
                    u32::from(h.post_tx_shaped(&arp_request(), &[54], Layout::Direct)),
                    0,
                )
            })
            .collect();
        h.kick_tx();
        heads
    };

    let heads = send(&mut h, 1);
    assert!(arp_reply(&mut h), "no ARP reply from the host");
    assert_eq!(h.txq.take_used(&h.mem), heads);

    // Down.
    assert!(ip(&["link", "set", "dev", &name, "down"]));
    let heads = send(&mut h, 20);
    idle(&mut h, "TAP down");
    assert_eq!(h.txq.take_used(&h.mem), heads);
    assert_eq!(h.metric(|m| &m.tx_dropped), 20);
    let lines = test_log::lines()[log0..].to_vec();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(lines[0].contains("Input/output error"), "{lines:#?}");

    // Up again.
    assert!(ip(&["link", "set", "dev", &name, "up"]));
    let heads = send(&mut h, 1);
    assert!(arp_reply(&mut h), "no ARP reply once the TAP is up again");
    assert_eq!(h.txq.take_used(&h.mem), heads);

    // Deleted.
    let log1 = test_log::lines().len();
    assert!(ip(&["link", "del", &name]));
    let heads = send(&mut h, 20);
    idle(&mut h, "TAP deleted");
    assert_eq!(h.txq.take_used(&h.mem), heads);
    assert_eq!(h.metric(|m| &m.tx_dropped), 40);
    assert_eq!(h.metric(|m| &m.backend_hangups), 1);
    assert_eq!(h.dev().registered.backend, None);
    let lines = test_log::lines()[log1..].to_vec();
    assert!(lines.len() <= 2, "{lines:#?}");
    // Still serves the driver: it can reset the device, and a re-activation
    // is refused (the TAP cannot take its offloads any more) instead of
    // bringing up a device over a backend that is gone.
    h.dev().reset();
    idle(&mut h, "TAP deleted, reset");
    h.rxq = DriverQueue::packed(&h.mem, GuestAddress(0x10000), 256);
    h.txq = DriverQueue::packed(&h.mem, GuestAddress(0x80000), 256);
    let queues = rx_tx_queues(&h.mem, &h.rxq, &h.txq, MRG_FEATURES);
    let irq = h.irq.clone();
    let err = h.dev().activate(MRG_FEATURES, queues, irq).unwrap_err();
    assert!(
        matches!(err, crate::virtio::ActivateError::Backend(_)),
        "{err:?}"
    );
    assert!(!h.dev().is_activated());
    assert_eq!(h.run_once(50), 0);
}
