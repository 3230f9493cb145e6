// SPDX-License-Identifier: Apache-2.0
//! Per-frame cost of the network device's own thread, for callgrind.
//!
//! The real [`Net`] runs on an `EventManager` in its own thread (the first
//! thread this program spawns, so callgrind's `-02` file), activated through
//! the real [`MmioTransport`] by the [`MockDriver`]. The backend is an
//! `AF_UNIX` `SOCK_SEQPACKET` pair, so no privileges are needed. The driver
//! runs rounds of `batch` frames: it holds the device lock while it posts the
//! whole round (TX: the chains, RX: the frames into the peer socket), then
//! kicks, so the device sees every round as one batch whatever the
//! scheduling, then waits for the used entries.
//!
//! Instructions per frame are the device thread's instructions over two runs
//! that differ only in the number of frames, divided by the difference (which
//! cancels start-up and tear-down). `devices/benches/callgrind-frames.sh`
//! does exactly that:
//!
//! ```sh
//! bash devices/benches/callgrind-frames.sh            # TX and RX at 64 and 1514 B
//! ```
//!
//! Without valgrind the program just runs and prints frames per second (a
//! smoke figure: unix-socket backend, shared machine).
//!
//! The device runs with its default weights and a pass time budget of 10 s:
//! it reads the clock as often as with the default budget, so those reads
//! are counted, but under valgrind's slowdown the default 100 µs would end
//! nearly every pass after a few frames, which no real run does.
//! `--time-budget-us N` sets another budget (0: none). TX frames go out in
//! io_uring batches (the default `IoEngine::Async`), or with `--sync` one
//! `writev` each. TX frames are IPv4 to 10.201.0.1 (an EtherType and a
//! destination address in a counting byte pattern). `--mmds` puts MMDS on
//! the card, unused (the frames are not for its address): what a card MMDS
//! serves pays for every other frame.
//!
//! Usage: `frame_cost tx|rx FRAME_BYTES FRAMES [BATCH] [--event-idx] [--bounce] [--sync] [--mmds] [--time-budget-us N]`

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use devices::virtio::mmio::MmioTransport;
use devices::virtio::net::{IoEngine, Net, NetConfig, Offloads, SeqPacket, RX_INDEX, TX_INDEX};
use devices::virtio::test_utils::{guest_memory, MockDriver, Segment};
use devices::virtio::{DeviceMetrics, VirtioDevice};
use event_manager::{EventManager, SubscriberOps};
use vm_memory::GuestAddress;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

const VERSION_1: u64 = 1 << VIRTIO_F_VERSION_1;
const MAC: u64 = 1 << VIRTIO_NET_F_MAC;
const STATUS: u64 = 1 << VIRTIO_NET_F_STATUS;
const MRG_RXBUF: u64 = 1 << VIRTIO_NET_F_MRG_RXBUF;
const EVENT_IDX: u64 = 1 << VIRTIO_RING_F_EVENT_IDX;
const VNET_HDR_LEN: usize = 12;
const QUEUE_SIZE: u16 = 256;
/// Header-inclusive RX buffer: one MTU frame each.
const RX_BUF_LEN: u32 = 1526;

struct Args {
    tx: bool,
    frame: usize,
    frames: usize,
    batch: usize,
    event_idx: bool,
    bounce: bool,
    sync: bool,
    mmds: bool,
    time_budget_us: u64,
}

/// A pass time budget that reads the clock as the default one does but
/// never ends a pass, even under valgrind.
const NEVER_REACHED_US: u64 = 10_000_000;

fn parse() -> Result<Args, String> {
    let usage = "usage: frame_cost tx|rx FRAME_BYTES FRAMES [BATCH] [--event-idx] [--bounce] \
                 [--sync] [--mmds] [--time-budget-us N]";
    let mut pos = Vec::new();
    let (mut event_idx, mut bounce, mut sync, mut mmds) = (false, false, false, false);
    let mut time_budget_us = NEVER_REACHED_US;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--event-idx" => event_idx = true,
            "--bounce" => bounce = true,
            "--sync" => sync = true,
            "--mmds" => mmds = true,
            "--time-budget-us" => {
                time_budget_us = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("--time-budget-us needs a number; {usage}"))?;
            }
            _ => pos.push(a),
        }
    }
    let num = |i: usize, default: Option<usize>| -> Result<usize, String> {
        match (pos.get(i), default) {
            (Some(s), _) => s
                .parse()
                .map_err(|_| format!("{s:?} is not a number; {usage}")),
            (None, Some(d)) => Ok(d),
            (None, None) => Err(usage.to_string()),
        }
    };
    let tx = match pos.first().map(String::as_str) {
        Some("tx") => true,
        Some("rx") => false,
        _ => return Err(usage.to_string()),
    };
    let frame = num(1, None)?;
    let frames = num(2, None)?;
    let batch = num(3, Some(128))?;
    if !(14..=1514).contains(&frame) || batch == 0 || batch > usize::from(QUEUE_SIZE) {
        return Err(format!("frame 14..=1514 bytes, batch 1..=256; {usage}"));
    }
    Ok(Args {
        tx,
        frame,
        frames,
        batch,
        event_idx,
        bounce,
        sync,
        mmds,
        time_budget_us,
    })
}

fn wait_irq(fd: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one live pollfd; poll writes only its `revents`.
    unsafe { libc::poll(&mut p, 1, 10) };
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("frame_cost: {e}");
        std::process::exit(1);
    }
}

fn run(a: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let mem = guest_memory(16 << 20)?;
    let (dev_end, peer) = SeqPacket::pair()?;
    // Room for a whole TX round in the socket, so the device never sees EAGAIN.
    // (Capped by net.core.wmem_max; a round that does not fit fails below
    // instead of blocking with the device lock held.)
    dev_end.set_send_buffer(4 << 20)?;
    peer.set_send_buffer(4 << 20)?;
    peer.set_nonblocking(true)?;
    let cfg = NetConfig {
        queue_size: QUEUE_SIZE,
        offloads: Offloads::NONE,
        bounce_buffer: a.bounce,
        io_engine: if a.sync {
            IoEngine::Sync
        } else {
            IoEngine::Async
        },
        pass_time_budget_us: a.time_budget_us,
        ..NetConfig::default()
    };
    // The peer keeps up (a round always fits its buffer): batching may not
    // reorder anything here.
    let mut net = Net::with_backend(dev_end.with_batched_writes(), cfg, mem.clone())?;
    if a.mmds {
        let store = Arc::new(Mutex::new(devices::mmds::Mmds::default()));
        net.set_mmds(Some(devices::mmds::MmdsStack::new(
            devices::mmds::DEFAULT_IPV4,
            store,
        )));
    }
    let net = Arc::new(Mutex::new(net));
    let metrics = net.lock().map_err(|_| "poisoned")?.metrics();
    let kick = {
        let n = net.lock().map_err(|_| "poisoned")?;
        n.queue_events()[if a.tx { TX_INDEX } else { RX_INDEX }].try_clone()?
    };

    // The device thread first, so callgrind numbers it 2.
    let stop = Arc::new(AtomicBool::new(false));
    let dev = {
        let (net, stop) = (net.clone(), stop.clone());
        std::thread::Builder::new()
            .name("net-device".into())
            .spawn(move || {
                let mut em =
                    EventManager::<Arc<Mutex<Net<SeqPacket>>>>::new().expect("event manager");
                em.add_subscriber(net);
                while !stop.load(Ordering::Relaxed) {
                    em.run_with_timeout(20).expect("event loop");
                }
            })?
    };

    let transport = MmioTransport::new(mem.clone(), net.clone())?;
    let irq = transport.interrupt_evt().as_raw_fd();
    let mut drv = MockDriver::new(mem.clone(), transport)?;
    let mut features = VERSION_1 | MAC | STATUS | MRG_RXBUF;
    if a.event_idx {
        features |= EVENT_IDX;
    }
    drv.negotiate(features)?;
    drv.setup_queues(Some(QUEUE_SIZE))?;
    drv.driver_ok()?;

    let mut msg: Vec<u8> = (0..VNET_HDR_LEN + a.frame)
        .map(|i| if i < VNET_HDR_LEN { 0 } else { i as u8 })
        .collect();
    // IPv4 to 10.201.0.1 (EtherType at frame byte 12, destination at 30),
    // as far as the frame holds them: on a card MMDS serves, an IPv4 frame
    // makes the claim read both fields, as most of a guest's traffic does.
    for (at, field) in [(12, &[0x08u8, 0x00][..]), (30, &[10, 201, 0, 1][..])] {
        for (i, b) in field.iter().enumerate() {
            if let Some(slot) = msg.get_mut(VNET_HDR_LEN + at + i) {
                *slot = *b;
            }
        }
    }
    let slots: Vec<GuestAddress> = (0..QUEUE_SIZE)
        .map(|_| drv.alloc(2048, 64))
        .collect::<Result<_, _>>()?;
    for s in &slots {
        drv.write_mem(*s, &msg)?;
    }
    let q = if a.tx { TX_INDEX } else { RX_INDEX };
    if !a.tx {
        for s in &slots {
            drv.add_chain(RX_INDEX, &[Segment::writable(*s, RX_BUF_LEN)])?;
        }
        drv.publish(RX_INDEX)?;
    }

    let mut used = Vec::with_capacity(usize::from(QUEUE_SIZE));
    let mut buf = vec![0u8; 2048];
    let mut done = 0usize;
    let mut slot = 0usize;
    let t = Instant::now();
    while done < a.frames {
        let n = a.batch.min(a.frames - done);
        {
            let _g = net.lock().map_err(|_| "poisoned")?;
            for _ in 0..n {
                if a.tx {
                    let s = slots[slot % slots.len()];
                    slot += 1;
                    drv.add_chain(TX_INDEX, &[Segment::readable(s, msg.len() as u32)])?;
                } else {
                    peer.send(&msg)?;
                }
            }
            if a.tx {
                drv.publish(TX_INDEX)?;
            }
            // With EVENT_IDX, one interrupt when the round is complete.
            if a.event_idx {
                let seen = drv.used_idx(q)?;
                drv.set_used_event(q, seen.wrapping_add(n as u16 - 1))?;
            }
        }
        // Kick with the lock released, so a TX pass never starts by waiting
        // for it (an RX pass may, having woken on the first frame).
        kick.write(1)?;
        let mut got = 0;
        while got < n {
            wait_irq(irq);
            let _ = drv.take_irq_count();
            used.clear();
            got += drv.used_into(q, &mut used)?;
            if !a.tx {
                for e in &used {
                    let s = slots[e.id as usize % slots.len()];
                    drv.add_chain(RX_INDEX, &[Segment::writable(s, RX_BUF_LEN)])?;
                }
                drv.publish(RX_INDEX)?;
            }
        }
        if a.tx {
            for _ in 0..n {
                while let Err(e) = peer.recv(&mut buf) {
                    if e.kind() != std::io::ErrorKind::WouldBlock {
                        return Err(e.into());
                    }
                    wait_irq(peer.as_raw_fd());
                }
            }
        }
        done += n;
    }
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    dev.join().map_err(|_| "device thread panicked")?;
    let m = metrics.to_json();
    println!(
        "{} {} B x {}: {:.0} frames/s; tx_frames {} rx_frames {} tap_eagain {} malformed {} passes rx {} tx {}",
        if a.tx { "tx" } else { "rx" },
        a.frame,
        a.frames,
        a.frames as f64 / secs,
        m["tx_frames"],
        m["rx_frames"],
        m["tap_eagain"],
        m["malformed_chains"],
        m["rx_passes"],
        m["tx_passes"],
    );
    let expect = if a.tx {
        &m["tx_frames"]
    } else {
        &m["rx_frames"]
    };
    if expect.as_u64() != Some(a.frames as u64) || m["tap_eagain"] != 0 {
        return Err("the device did not move every frame cleanly".into());
    }
    Ok(())
}
