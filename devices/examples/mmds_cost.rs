// SPDX-License-Identifier: Apache-2.0
//! MMDS GETs through the whole network device, from the driver side: the
//! requests per second and, under callgrind, the device thread's
//! instructions per GET.
//!
//! The real [`Net`] runs on an `EventManager` in its own thread (the first
//! thread this program spawns, callgrind's `-02` file) with an MMDS stack
//! on the card, activated through the real [`MmioTransport`] by the
//! [`MockDriver`]; the backend is a `SOCK_SEQPACKET` pair that nothing
//! reaches. The driver plays a guest's TCP client on one kept-alive
//! connection (as curl with several URLs, or cloud-init): each GET is one
//! TX frame (the request, acknowledging the previous response) and one RX
//! frame back (the whole response, which fits one segment), one at a time,
//! so the figure is round trips through the device, with the driver's own
//! work (building and reading frames) inside the loop.
//!
//! `devices/benches/callgrind-mmds.sh` runs it under callgrind for two
//! counts of GETs and divides the difference of the device thread's
//! instructions by the difference of the counts.
//!
//! Usage: `mmds_cost GETS [--v2]` (`--v2`: MMDS V2, each GET with a token
//! taken once before the loop).

use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use devices::mmds::guest::{read_reply, GuestClient, Reply};
use devices::mmds::packet::flags::{ACK, PSH, SYN};
use devices::mmds::{lock, Mmds, MmdsStack, MmdsVersion, DEFAULT_IPV4};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::net::{Net, NetConfig, Offloads, SeqPacket, RX_INDEX, TX_INDEX};
use devices::virtio::test_utils::{guest_memory, MockDriver, Segment};
use devices::virtio::{DeviceMetrics, VirtioDevice};
use event_manager::{EventManager, SubscriberOps};
use vm_memory::GuestAddress;

use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_net::{VIRTIO_NET_F_MAC, VIRTIO_NET_F_MRG_RXBUF, VIRTIO_NET_F_STATUS};

const FEATURES: u64 = 1 << VIRTIO_F_VERSION_1
    | 1 << VIRTIO_NET_F_MAC
    | 1 << VIRTIO_NET_F_STATUS
    | 1 << VIRTIO_NET_F_MRG_RXBUF;
const QUEUE_SIZE: u16 = 256;
const RX_BUF_LEN: u32 = 1526;

type Error = Box<dyn std::error::Error>;

struct Guest {
    drv: MockDriver,
    irq: i32,
    tx_kick: vmm_sys_util::eventfd::EventFd,
    tx_slot: GuestAddress,
    rx_slots: HashMap<u32, GuestAddress>,
    client: GuestClient,
}

impl Guest {
    fn wait_irq(&self) {
        let mut p = libc::pollfd {
            fd: self.irq,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `p` is one live pollfd; poll writes only its `revents`.
        unsafe { libc::poll(&mut p, 1, 10) };
    }

    /// Sends one frame and returns the frames that came back, reposting
    /// their buffers.
    fn exchange(&mut self, frame: &[u8], want: usize) -> Result<Vec<Reply>, Error> {
        self.drv.write_mem(self.tx_slot, frame)?;
        self.drv.add_chain(
            TX_INDEX,
            &[Segment::readable(self.tx_slot, frame.len() as u32)],
        )?;
        self.drv.publish(TX_INDEX)?;
        self.tx_kick.write(1)?;
        let mut out = Vec::new();
        let mut used = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < want {
            if Instant::now() > deadline {
                return Err(format!("{} of {want} frames back", out.len()).into());
            }
            self.wait_irq();
            let _ = self.drv.take_irq_count();
            let _ = self.drv.used_into(TX_INDEX, &mut Vec::new())?;
            used.clear();
            self.drv.used_into(RX_INDEX, &mut used)?;
            for e in &used {
                let slot = self.rx_slots.remove(&e.id).ok_or("unknown RX head")?;
                let bytes = self.drv.read_mem(slot, e.len as usize)?;
                let c = &self.client;
                out.push(read_reply(&bytes, c.mac, c.ip).ok_or("a malformed MMDS frame")?);
                let head = self
                    .drv
                    .add_chain(RX_INDEX, &[Segment::writable(slot, RX_BUF_LEN)])?;
                self.rx_slots.insert(u32::from(head), slot);
            }
            self.drv.publish(RX_INDEX)?;
        }
        Ok(out)
    }

    /// Takes the data of the replies into the connection; returns it.
    fn take(&mut self, replies: &[Reply]) -> Vec<u8> {
        let mut data = Vec::new();
        for r in replies {
            if let Reply::Tcp {
                seq,
                flags,
                payload,
                ..
            } = r
            {
                if flags & SYN != 0 {
                    self.client.ack = seq.wrapping_add(1);
                } else if *seq == self.client.ack {
                    self.client.ack = seq.wrapping_add(payload.len() as u32);
                    data.extend_from_slice(payload);
                }
            }
        }
        data
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let gets: usize = match args.next().and_then(|a| a.parse().ok()) {
        Some(n) => n,
        None => {
            eprintln!("usage: mmds_cost GETS [--v2]");
            std::process::exit(2);
        }
    };
    let v2 = args.next().as_deref() == Some("--v2");
    if let Err(e) = run(gets, v2) {
        eprintln!("mmds_cost: {e}");
        std::process::exit(1);
    }
}

fn run(gets: usize, v2: bool) -> Result<(), Error> {
    let mem = guest_memory(16 << 20)?;
    let (dev_end, _peer) = SeqPacket::pair()?;
    let cfg = NetConfig {
        queue_size: QUEUE_SIZE,
        offloads: Offloads::NONE,
        ..NetConfig::default()
    };
    let store = Arc::new(Mutex::new(Mmds::default()));
    {
        let mut s = lock(&store);
        s.put(serde_json::json!({"latest": {"meta-data": {
            "ami-id": "ami-87654321", "reservation-id": "r-79054aef",
            "local-hostname": "ip-10-251-50-12.ec2.internal"}}}))?;
        s.configure(if v2 { MmdsVersion::V2 } else { MmdsVersion::V1 }, false);
    }
    let mut net = Net::with_backend(dev_end, cfg, mem.clone())?;
    net.set_mmds(Some(MmdsStack::new(DEFAULT_IPV4, store)));
    let net = Arc::new(Mutex::new(net));
    let metrics = net.lock().map_err(|_| "poisoned")?.metrics();
    let tx_kick = net.lock().map_err(|_| "poisoned")?.queue_events()[TX_INDEX].try_clone()?;

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
    drv.negotiate(FEATURES)?;
    drv.setup_queues(Some(QUEUE_SIZE))?;
    drv.driver_ok()?;
    let tx_slot = drv.alloc(2048, 64)?;
    let mut rx_slots = HashMap::new();
    for _ in 0..64 {
        let s = drv.alloc(2048, 64)?;
        let head = drv.add_chain(RX_INDEX, &[Segment::writable(s, RX_BUF_LEN)])?;
        rx_slots.insert(u32::from(head), s);
    }
    drv.publish(RX_INDEX)?;
    let mut g = Guest {
        drv,
        irq,
        tx_kick,
        tx_slot,
        rx_slots,
        client: GuestClient::new(DEFAULT_IPV4, 40000),
    };

    let syn = g.client.send(SYN, b"");
    let r = g.exchange(&syn, 1)?;
    g.take(&r);
    // The first request's segment acknowledges the SYN-ACK (no pure ACK
    // first: one TX slot, reused once the reply shows the device took it).
    let mut token_header = String::new();
    if v2 {
        let put = g.client.send(
            ACK | PSH,
            b"PUT /latest/api/token HTTP/1.1\r\nX-metadata-token-ttl-seconds: 21600\r\n\r\n",
        );
        let r = g.exchange(&put, 1)?;
        let resp = String::from_utf8(g.take(&r))?;
        let token = resp.split("\r\n\r\n").nth(1).ok_or("no token")?;
        token_header = format!("X-metadata-token: {token}\r\n");
    }
    let request = format!(
        "GET /latest/meta-data/ami-id HTTP/1.1\r\nHost: 169.254.169.254\r\nUser-Agent: curl/7.88.1\r\n\
         Accept: */*\r\n{token_header}\r\n"
    );
    let t = Instant::now();
    for _ in 0..gets {
        let frame = g.client.send(ACK | PSH, request.as_bytes());
        let r = g.exchange(&frame, 1)?;
        let body = g.take(&r);
        if !body.ends_with(b"\r\n\r\nami-87654321") {
            return Err(format!("unexpected answer {:?}", String::from_utf8_lossy(&body)).into());
        }
    }
    let secs = t.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    dev.join().map_err(|_| "device thread panicked")?;
    let m = metrics.to_json();
    println!(
        "mmds {} GET x {gets}: {:.0} requests/s; mmds_requests_accepted {} mmds_rx_frames {} mmds_tx_frames {} tx_frames {}",
        if v2 { "V2" } else { "V1" },
        gets as f64 / secs,
        m["mmds_requests_accepted"],
        m["mmds_rx_frames"],
        m["mmds_tx_frames"],
        m["tx_frames"],
    );
    if m["tx_frames"] != 0 {
        return Err("an MMDS frame reached the backend".into());
    }
    Ok(())
}
