// SPDX-License-Identifier: Apache-2.0
//! The device under test with a lean driver in front of it.
//!
//! The real `devices::virtio::net::Net` runs on an event-manager loop in its
//! own thread, as the VMM runs it. Negotiation and queue setup go through the
//! real `MmioTransport` (via `MockDriver`), so activation is exactly what a
//! guest triggers. After that the benchmark drives the rings itself: every
//! descriptor is written once and points at a fixed buffer, so posting a
//! buffer again is one avail-ring slot plus an index store, and reaping is a
//! used-index load plus two 32-bit reads. Kicks write the queue's eventfd
//! directly, as KVM's ioeventfd does; interrupts are the transport's irqfd.
//!
//! Why not the shared driver-side ring writer
//! (`devices::virtio::test_utils::DriverQueue`, which `MockDriver` uses):
//! it goes through `vm-memory` for every field and writes each chain's
//! descriptors again from a free list, so that tests can post any chain.
//! Measured on the development host (release build, 5 M one-descriptor
//! chains posted, returned by a stand-in device and reaped, no device
//! thread), its driver side cost 157 to 236 ns per frame against 1.6 to
//! 4.5 ns for this ring's avail-slot store and used-entry loads, over three
//! runs each: at a million frames per second, 16 to 24 % of a core taken
//! from the device under test, which the raw TAP loop it is compared
//! against does not pay.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use devices::virtio::mmio::MmioTransport;
use devices::virtio::net::{Net, NetConfig, NetMetrics, NUM_BUFFERS_OFFSET, RX_INDEX, TX_INDEX};
use devices::virtio::queue::{VIRTQ_DESC_F_WRITE, VIRTQ_USED_F_NO_NOTIFY};
use devices::virtio::test_utils::{guest_memory, MockDriver, QueueLayout};
use devices::virtio::{DeviceMetrics, GuestMemory};
use event_manager::{EventManager, SubscriberOps};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use self::host_mem::HostRange;
use crate::frames;
use crate::host::{Counts, Measured, Window, TAP_NAME};
use crate::sys::{self, VNET_HDR_LEN};

/// Feature bits (virtio 1.1 §5.1.3 and §6) as masks, from the device's
/// virtio-bindings constants.
pub mod feature {
    use devices::virtio::net::device::features as f;

    /// Device handles packets with partial checksum.
    pub const CSUM: u64 = 1 << f::VIRTIO_NET_F_CSUM;
    /// Driver handles packets with partial checksum.
    pub const GUEST_CSUM: u64 = 1 << f::VIRTIO_NET_F_GUEST_CSUM;
    /// Device has a MAC address.
    pub const MAC: u64 = 1 << f::VIRTIO_NET_F_MAC;
    /// Driver can receive TSOv4.
    pub const GUEST_TSO4: u64 = 1 << f::VIRTIO_NET_F_GUEST_TSO4;
    /// Driver can receive TSOv6.
    pub const GUEST_TSO6: u64 = 1 << f::VIRTIO_NET_F_GUEST_TSO6;
    /// Driver can receive UFO.
    pub const GUEST_UFO: u64 = 1 << f::VIRTIO_NET_F_GUEST_UFO;
    /// Device can receive TSOv4.
    pub const HOST_TSO4: u64 = 1 << f::VIRTIO_NET_F_HOST_TSO4;
    /// Device can receive TSOv6.
    pub const HOST_TSO6: u64 = 1 << f::VIRTIO_NET_F_HOST_TSO6;
    /// Device can receive UFO.
    pub const HOST_UFO: u64 = 1 << f::VIRTIO_NET_F_HOST_UFO;
    /// Driver can merge receive buffers.
    pub const MRG_RXBUF: u64 = 1 << f::VIRTIO_NET_F_MRG_RXBUF;
    /// virtio 1.x.
    pub const VERSION_1: u64 = 1 << f::VIRTIO_F_VERSION_1;
    /// used_event / avail_event notification suppression (virtio 1.1 §2.6.7).
    pub const EVENT_IDX: u64 = 1 << f::VIRTIO_RING_F_EVENT_IDX;
    /// Everything the benchmark knows how to drive.
    pub const ALL: u64 = CSUM
        | GUEST_CSUM
        | MAC
        | GUEST_TSO4
        | GUEST_TSO6
        | GUEST_UFO
        | HOST_TSO4
        | HOST_TSO6
        | HOST_UFO
        | MRG_RXBUF
        | VERSION_1;
}

/// How to build one device rig.
#[derive(Debug, Clone)]
pub struct RigConfig {
    /// Device configuration (weights, offloads, MRG_RXBUF, bounce buffer).
    pub net: NetConfig,
    /// Size of each posted RX buffer (one descriptor each).
    pub rx_buf_len: u32,
    /// The TX frame (vnet header + frame) every TX descriptor points at.
    pub tx_msg: Vec<u8>,
    /// Post the RX buffers. TX-only runs leave RX empty, as the raw TX loop
    /// never reads the TAP: the host's replies to TSO frames (a RST per
    /// frame, the fake guest has no TCP peer) must not cost only one side.
    pub post_rx: bool,
    /// Negotiate VIRTIO_RING_F_EVENT_IDX, as every Linux guest does
    /// (`netbench --event-idx on`, [`crate::scenarios::Timing::event_idx`]).
    pub event_idx: bool,
    /// The card serves MMDS at its default address, an empty store
    /// (`netbench --mmds on`, [`crate::scenarios::Timing::mmds`]).
    pub mmds: bool,
}

/// One queue as the lean driver sees it.
///
/// The driver reaches the rings and the buffers' headers through host
/// pointers taken once, as a guest's driver uses plain loads and stores on
/// its own memory: a `vm-memory` call per access (a region lookup and a
/// volatile copy each) made the driver's reaping of 64 used entries take
/// the device's core for a median 36 µs in the RX 65000 GSO cell, time the
/// raw loop, which has no driver, does not lose.
#[derive(Debug)]
struct Ring {
    layout: QueueLayout,
    /// Guest address of each descriptor's buffer.
    bufs: Vec<GuestAddress>,
    /// Each descriptor's buffer, for the driver's reads of `num_buffers`
    /// (RX; empty for TX, whose buffers the driver never reads).
    buf_ptrs: Vec<HostRange>,
    /// The avail and used rings.
    avail: HostRange,
    used: HostRange,
    next_avail: u16,
    last_used: u16,
    kick: EventFd,
    /// VIRTIO_RING_F_EVENT_IDX negotiated: kicks follow `avail_event`,
    /// interrupts are asked for through `used_event`.
    event_idx: bool,
    /// `avail.idx` at the last publish, for `vring_need_event`.
    published: u16,
}

/// Guest memory the driver reaches through host pointers (also the block
/// scenario's driver).
#[allow(unsafe_code)]
pub(crate) mod host_mem {
    use std::sync::atomic::AtomicU16;

    use anyhow::{Context, Result};
    use devices::virtio::GuestMemory;
    use vm_memory::{GuestAddress, GuestMemoryBackend};

    /// `len` bytes of guest memory that lie in one region, at a host
    /// address taken once. It holds a clone of the memory, so the mapping
    /// outlives it; every access is checked against `len`.
    #[derive(Debug, Clone)]
    pub struct HostRange {
        _mem: GuestMemory,
        ptr: *mut u8,
        len: usize,
    }

    impl HostRange {
        pub fn new(mem: &GuestMemory, addr: GuestAddress, len: usize) -> Result<HostRange> {
            let ptr = mem
                .get_slice(addr, len)
                .with_context(|| format!("{len} bytes at {addr:?} in one region"))?
                .ptr_guard_mut()
                .as_ptr();
            Ok(HostRange {
                _mem: mem.clone(),
                ptr,
                len,
            })
        }

        /// The 16-bit field at byte `off`, which the device accesses
        /// concurrently (ring indexes and flags).
        pub fn u16_at(&self, off: usize) -> &AtomicU16 {
            assert!(off + 2 <= self.len && (self.ptr as usize + off) & 1 == 0);
            // SAFETY: the two bytes lie in the range (checked above), which
            // stays mapped while `self` holds the memory, and are 2-byte
            // aligned; the device only ever accesses them atomically or
            // volatile, never through a Rust reference.
            unsafe { AtomicU16::from_ptr(self.ptr.add(off).cast()) }
        }

        /// The two little-endian 32-bit words at byte `off` (a used ring
        /// element: id and length), read volatile with one check.
        pub fn read_u32_pair(&self, off: usize) -> (u32, u32) {
            assert!(off + 8 <= self.len && (self.ptr as usize + off) & 3 == 0);
            // SAFETY: in the range, mapped and aligned for [u32; 2] (as in
            // `u16_at`); volatile because the device writes it concurrently.
            let [a, b] = unsafe { self.ptr.add(off).cast::<[u32; 2]>().read_volatile() };
            (u32::from_le(a), u32::from_le(b))
        }

        /// Stores the little-endian 64-bit word `v` at byte `off`, volatile.
        pub fn write_u64(&self, off: usize, v: u64) {
            assert!(off + 8 <= self.len && (self.ptr as usize + off) & 7 == 0);
            // SAFETY: in the range, mapped and aligned (as in `u16_at`);
            // volatile because the device reads it.
            unsafe { self.ptr.add(off).cast::<u64>().write_volatile(v.to_le()) }
        }

        /// The byte at `off`, read volatile.
        pub fn read_u8(&self, off: usize) -> u8 {
            assert!(off < self.len);
            // SAFETY: in the range and mapped (as in `u16_at`).
            unsafe { self.ptr.add(off).read_volatile() }
        }

        /// Stores the byte `v` at `off`, volatile.
        pub fn write_u8(&self, off: usize, v: u8) {
            assert!(off < self.len);
            // SAFETY: in the range and mapped (as in `u16_at`).
            unsafe { self.ptr.add(off).write_volatile(v) }
        }

        /// One `pread` (`write` false) or `pwrite` of the whole range at
        /// `at` of `file`, continued after a short transfer: the raw loop's
        /// request, on the very memory the device's request uses.
        pub fn transfer(&self, file: &std::fs::File, at: u64, write: bool) -> Result<()> {
            use std::os::fd::AsRawFd;
            let mut done = 0;
            while done < self.len {
                let (buf, left) = (self.ptr.wrapping_add(done), self.len - done);
                let pos = (at + done as u64) as libc::off_t;
                let n = if write {
                    // SAFETY: the kernel reads `left` bytes at `buf`: the
                    // rest of the range, mapped while `self` lives.
                    unsafe { libc::pwrite(file.as_raw_fd(), buf.cast(), left, pos) }
                } else {
                    // SAFETY: the kernel writes `left` bytes at `buf`, the
                    // rest of the range, which nothing else touches during
                    // the call (the device has no request in flight while
                    // the raw loop runs) and no Rust reference covers.
                    unsafe { libc::pread(file.as_raw_fd(), buf.cast(), left, pos) }
                };
                match n {
                    n if n > 0 => done += n as usize,
                    0 => anyhow::bail!("raw transfer at {at}: end of file"),
                    _ => {
                        let e = std::io::Error::last_os_error();
                        if e.kind() != std::io::ErrorKind::Interrupted {
                            return Err(e).context("raw transfer");
                        }
                    }
                }
            }
            Ok(())
        }

        /// One `write` (`write` true) of the `len` bytes at `off` of the range to
        /// `fd`, or one `read` from `fd` into them: a raw relay's transfer, on
        /// the very memory the device's packets use. The bytes moved.
        pub fn fd_io(
            &self,
            fd: std::os::fd::RawFd,
            off: usize,
            len: usize,
            write: bool,
        ) -> std::io::Result<usize> {
            assert!(off + len <= self.len);
            let at = self.ptr.wrapping_add(off);
            let n = if write {
                // SAFETY: the kernel reads `len` bytes at `at`, inside the
                // range (checked above), mapped while `self` lives.
                unsafe { libc::write(fd, at.cast(), len) }
            } else {
                // SAFETY: the kernel writes `len` bytes at `at`, inside the
                // range, which no Rust reference covers and the device does
                // not touch while the raw relay runs.
                unsafe { libc::read(fd, at.cast(), len) }
            };
            usize::try_from(n).map_err(|_| std::io::Error::last_os_error())
        }

        /// One `writev` (`write` true) to `fd` of the parts, each `(range,
        /// off, len)`, in order, or one `readv` from `fd` into them: a
        /// batched raw relay's transfer, on the very memory the device's
        /// packets use. The bytes moved. At most 64 parts.
        pub fn fd_io_vectored(
            fd: std::os::fd::RawFd,
            parts: &[(&HostRange, usize, usize)],
            write: bool,
        ) -> std::io::Result<usize> {
            let mut iov = [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 64];
            assert!(parts.len() <= iov.len());
            for (v, &(r, off, len)) in iov.iter_mut().zip(parts) {
                assert!(off + len <= r.len);
                *v = libc::iovec {
                    iov_base: r.ptr.wrapping_add(off).cast(),
                    iov_len: len,
                };
            }
            let n = parts.len() as libc::c_int;
            let res = if write {
                // SAFETY: each of the first `n` vectors lies inside its range
                // (checked above), mapped while the ranges live; the kernel
                // only reads them.
                unsafe { libc::writev(fd, iov.as_ptr(), n) }
            } else {
                // SAFETY: as above; the kernel writes into the ranges, which
                // no Rust reference covers and the device does not touch
                // while the raw relay runs.
                unsafe { libc::readv(fd, iov.as_ptr(), n) }
            };
            usize::try_from(res).map_err(|_| std::io::Error::last_os_error())
        }

        /// Copies `data` to byte `off` of the range (a packet header).
        pub fn write_bytes(&self, off: usize, data: &[u8]) {
            assert!(off + data.len() <= self.len);
            // SAFETY: the destination is inside the range (checked above),
            // mapped while `self` lives; `data` is a distinct host slice.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(off), data.len()) }
        }

        /// The first `N` bytes at `off`, read as plain bytes (a header the
        /// device wrote and published before the used index the caller read).
        pub fn read_array<const N: usize>(&self, off: usize) -> [u8; N] {
            assert!(off + N <= self.len);
            let mut out = [0u8; N];
            // SAFETY: the source is inside the range and mapped; the device
            // no longer writes a buffer it has put in the used ring.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), out.as_mut_ptr(), N) }
            out
        }

        /// The little-endian 16-bit value at byte `off`, at any alignment.
        pub fn read_u16_unaligned(&self, off: usize) -> u16 {
            assert!(off + 2 <= self.len);
            // SAFETY: both bytes are in the range, mapped while `self`
            // lives; byte reads need no alignment.
            let b = unsafe {
                [
                    self.ptr.add(off).read_volatile(),
                    self.ptr.add(off + 1).read_volatile(),
                ]
            };
            u16::from_le_bytes(b)
        }
    }
}

/// Whether an index moving from `old` to `new` crossed `event` (virtio 1.1
/// §2.6.7.2, Linux's `vring_need_event`).
pub(crate) fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// The offset in an avail (`entry` 2) or used (`entry` 8) ring of its
/// entry for index `i`. A split ring's size is a power of two (virtio 1.1
/// §2.6), so the index is masked, as Linux's driver does: a 16-bit `div`
/// costs the measured thread tens of cycles, twice a packet.
#[inline]
pub(crate) fn ring_slot(i: u16, size: u16, entry: usize) -> usize {
    debug_assert!(size.is_power_of_two());
    4 + entry * usize::from(i & size.wrapping_sub(1))
}

/// The avail and used rings of `layout` through host pointers, as every
/// lean driver reaches them (virtio 1.1 §2.6: flags, idx, the entries and
/// the event index). The size must be a power of two, as a split ring's
/// is: [`ring_slot`] masks indexes with it.
pub(crate) fn ring_ranges(
    mem: &GuestMemory,
    layout: &QueueLayout,
) -> Result<(HostRange, HostRange)> {
    ensure!(
        layout.size.is_power_of_two(),
        "queue size {} is not a power of two",
        layout.size
    );
    let n = usize::from(layout.size);
    Ok((
        HostRange::new(mem, layout.avail_ring, 4 + 2 * n + 2)?,
        HostRange::new(mem, layout.used_ring, 4 + 8 * n + 2)?,
    ))
}

/// A lean driver's view of one queue, as both benchmark rigs hold it:
/// the avail and used rings through host pointers, and the kick eventfd.
pub(crate) struct LeanRing<'a> {
    pub(crate) avail: &'a HostRange,
    pub(crate) used: &'a HostRange,
    pub(crate) size: u16,
    pub(crate) event_idx: bool,
    pub(crate) kick: &'a EventFd,
}

impl LeanRing<'_> {
    /// Stores `next_avail` as the avail index, then kicks unless the device
    /// said not to (EVENT_IDX's avail_event against the index at the last
    /// decision, `published`, which this moves on; or NO_NOTIFY).
    pub(crate) fn publish(&self, next_avail: u16, published: &mut u16) -> std::io::Result<()> {
        self.avail
            .u16_at(2)
            .store(next_avail.to_le(), Ordering::Release);
        std::sync::atomic::fence(Ordering::SeqCst);
        let kick = if self.event_idx {
            let off = 4 + 8 * usize::from(self.size);
            let avail_event = u16::from_le(self.used.u16_at(off).load(Ordering::Acquire));
            need_event(avail_event, next_avail, *published)
        } else {
            let flags = u16::from_le(self.used.u16_at(0).load(Ordering::Acquire));
            flags & VIRTQ_USED_F_NO_NOTIFY == 0
        };
        *published = next_avail;
        if kick {
            self.kick.write(1)?;
        }
        Ok(())
    }
}

impl Ring {
    /// A ring over `layout` whose descriptor `id` points at `bufs[id]`,
    /// each `buf_len` bytes long.
    fn new(
        mem: &GuestMemory,
        layout: QueueLayout,
        bufs: Vec<GuestAddress>,
        read_len: usize,
        kick: EventFd,
        event_idx: bool,
    ) -> Result<Ring> {
        let (avail, used) = ring_ranges(mem, &layout)?;
        let buf_ptrs = match read_len {
            0 => Vec::new(),
            len => bufs
                .iter()
                .map(|&b| HostRange::new(mem, b, len))
                .collect::<Result<_>>()?,
        };
        Ok(Ring {
            layout,
            bufs,
            buf_ptrs,
            avail,
            used,
            next_avail: 0,
            last_used: 0,
            kick,
            event_idx,
            published: 0,
        })
    }

    /// Writes descriptor `id` once: address and length never change.
    fn write_desc(&self, mem: &GuestMemory, id: u16, len: u32, flags: u16) -> Result<()> {
        let d = GuestAddress(self.layout.desc_table.0 + 16 * u64::from(id));
        mem.write_obj(self.bufs[usize::from(id)].0, d)?;
        mem.write_obj(len, GuestAddress(d.0 + 8))?;
        mem.write_obj(flags, GuestAddress(d.0 + 12))?;
        mem.write_obj(0u16, GuestAddress(d.0 + 14))?;
        Ok(())
    }

    fn post(&mut self, id: u16) {
        let slot = ring_slot(self.next_avail, self.layout.size, 2);
        // Published by the Release store of `avail.idx` in `publish`.
        self.avail.u16_at(slot).store(id.to_le(), Ordering::Relaxed);
        self.next_avail = self.next_avail.wrapping_add(1);
    }

    /// Makes posted buffers visible and kicks unless the device said not to.
    fn publish(&mut self) -> Result<()> {
        let ring = LeanRing {
            avail: &self.avail,
            used: &self.used,
            size: self.layout.size,
            event_idx: self.event_idx,
            kick: &self.kick,
        };
        ring.publish(self.next_avail, &mut self.published)?;
        Ok(())
    }

    /// Asks for an interrupt once `ahead` more entries than the driver has
    /// reaped are used (`used_event`, after the avail ring's entries), as
    /// Linux's `virtqueue_enable_cb_prepare` (ahead 0) and
    /// `virtqueue_enable_cb_delayed` (3/4 of what is outstanding) do.
    /// Returns false when the device has already gone past it: the driver
    /// must look at the ring again instead of sleeping, or it would wait for
    /// an interrupt that was never sent. Without EVENT_IDX every used entry
    /// interrupts and sleeping is always safe.
    fn arm_interrupt(&self, ahead: u16) -> bool {
        if !self.event_idx {
            return true;
        }
        let event = self.last_used.wrapping_add(ahead);
        let off = 4 + 2 * usize::from(self.layout.size);
        self.avail
            .u16_at(off)
            .store(event.to_le(), Ordering::Release);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.used_idx().wrapping_sub(self.last_used) <= ahead
    }

    fn used_idx(&self) -> u16 {
        u16::from_le(self.used.u16_at(2).load(Ordering::Acquire))
    }

    /// The used element at position `i`: (descriptor id, bytes written).
    /// Called after `used_idx` (Acquire) showed it.
    fn used_elem(&self, i: u16) -> Result<(u16, u32)> {
        let off = ring_slot(i, self.layout.size, 8);
        let (id, len) = self.used.read_u32_pair(off);
        let id = u16::try_from(id).map_err(|_| anyhow!("used id {id} out of range"))?;
        if id >= self.layout.size {
            return Err(anyhow!("used id {id} out of range"));
        }
        Ok((id, len))
    }

    /// `num_buffers` of the frame the device wrote into descriptor `id`'s
    /// buffer (virtio 1.1 §5.1.6); RX buffers only (`Rig::new` refuses
    /// ones shorter than the header).
    fn num_buffers(&self, id: u16) -> u16 {
        self.buf_ptrs[usize::from(id)].read_u16_unaligned(NUM_BUFFERS_OFFSET)
    }
}

/// Running RX totals, with MRG_RXBUF continuation tracking.
#[derive(Debug, Default)]
struct RxTotals {
    frames: u64,
    bytes: u64,
    buffers: u64,
    /// Buffers still to come for the current frame.
    pending: u16,
}

/// A live device with its driver.
pub struct Rig {
    mem: GuestMemory,
    metrics: Arc<NetMetrics>,
    rx: Ring,
    tx: Ring,
    irq: EventFd,
    mrg: bool,
    stop: Arc<AtomicBool>,
    dev_thread: Option<JoinHandle<Result<()>>>,
    dev_clock: libc::clockid_t,
    rx_totals: RxTotals,
    /// TX used entries reaped: frames sent and frames the TAP refused.
    tx_used: u64,
    tx_len: u64,
    /// Keeps the transport (and through it the device) alive.
    _driver: MockDriver,
}

impl Rig {
    /// Opens the TAP through `Net::new`, negotiates through MMIO, posts every
    /// RX buffer and starts the device thread.
    pub fn new(cfg: &RigConfig) -> Result<Rig> {
        let qsize = cfg.net.queue_size;
        let mem_len = 2 * 1024 * 1024
            + usize::from(qsize) * cfg.rx_buf_len as usize
            + cfg.tx_msg.len()
            + 64 * 1024;
        let mem = guest_memory(mem_len.next_power_of_two()).context("guest memory")?;
        let mut net =
            Net::new(TAP_NAME, cfg.net.clone(), mem.clone()).context("Net::new on the TAP")?;
        if cfg.mmds {
            let store = Arc::new(Mutex::new(devices::mmds::Mmds::default()));
            net.set_mmds(Some(devices::mmds::MmdsStack::new(
                devices::mmds::DEFAULT_IPV4,
                store,
            )));
        }
        let metrics = net.metrics();
        let kicks = {
            use devices::virtio::VirtioDevice;
            net.queue_events()
                .iter()
                .map(|e| e.try_clone())
                .collect::<std::io::Result<Vec<_>>>()?
        };
        let net = Arc::new(Mutex::new(net));
        let transport = MmioTransport::new(mem.clone(), net.clone()).context("MMIO transport")?;
        let irq = transport.interrupt_evt().try_clone()?;
        let mut drv = MockDriver::new(mem.clone(), transport).context("driver")?;

        let offered = drv.device_features();
        let wanted = if cfg.event_idx {
            feature::ALL | feature::EVENT_IDX
        } else {
            feature::ALL
        };
        let acked = offered & wanted;
        // `--event-idx on` must measure an EVENT_IDX driver, or say why not.
        if cfg.event_idx && acked & feature::EVENT_IDX == 0 {
            return Err(anyhow!(
                "--event-idx on: the device does not offer EVENT_IDX"
            ));
        }
        drv.negotiate(acked).context("feature negotiation")?;
        let rx_layout = drv.setup_queue(RX_INDEX, qsize).context("RX queue")?;
        let tx_layout = drv.setup_queue(TX_INDEX, qsize).context("TX queue")?;

        let mut kicks = kicks.into_iter();
        let (rx_kick, tx_kick) = match (kicks.next(), kicks.next()) {
            (Some(r), Some(t)) => (r, t),
            _ => return Err(anyhow!("device has fewer than two queue eventfds")),
        };
        if (cfg.rx_buf_len as usize) < VNET_HDR_LEN {
            return Err(anyhow!(
                "RX buffers of {} bytes cannot hold the vnet header",
                cfg.rx_buf_len
            ));
        }
        let event_idx = acked & feature::EVENT_IDX != 0;
        let rx_bufs = (0..qsize)
            .map(|_| drv.alloc(u64::from(cfg.rx_buf_len), 64))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let mut rx = Ring::new(
            &mem,
            rx_layout,
            rx_bufs,
            cfg.rx_buf_len as usize,
            rx_kick,
            event_idx,
        )?;
        let tx_buf = drv.alloc(cfg.tx_msg.len() as u64, 64)?;
        mem.write_slice(&cfg.tx_msg, tx_buf)?;
        let tx = Ring::new(
            &mem,
            tx_layout,
            vec![tx_buf; usize::from(qsize)],
            0,
            tx_kick,
            event_idx,
        )?;
        for id in 0..qsize {
            rx.write_desc(&mem, id, cfg.rx_buf_len, VIRTQ_DESC_F_WRITE)?;
            tx.write_desc(&mem, id, cfg.tx_msg.len() as u32, 0)?;
            if cfg.post_rx {
                rx.post(id);
            }
        }
        drv.driver_ok().context("DRIVER_OK")?;

        // The device thread: the VMM's event loop with only this device on it.
        let stop = Arc::new(AtomicBool::new(false));
        let (clk_tx, clk_rx) = std::sync::mpsc::channel();
        let stop_dev = stop.clone();
        let dev_thread = std::thread::Builder::new()
            .name("net-device".into())
            .spawn(move || -> Result<()> {
                let _ = clk_tx.send(sys::current_thread_cpu_clock());
                let mut em = EventManager::<Arc<Mutex<Net>>>::new()
                    .map_err(|e| anyhow!("event manager: {e:?}"))?;
                em.add_subscriber(net);
                while !stop_dev.load(Ordering::Relaxed) {
                    em.run_with_timeout(20)
                        .map_err(|e| anyhow!("event loop: {e:?}"))?;
                }
                Ok(())
            })?;
        let dev_clock = clk_rx.recv().context("device thread start")?;

        let mut rig = Rig {
            mem,
            metrics,
            rx,
            tx,
            irq,
            mrg: acked & feature::MRG_RXBUF != 0,
            stop,
            dev_thread: Some(dev_thread),
            dev_clock,
            rx_totals: RxTotals::default(),
            tx_used: 0,
            tx_len: cfg.tx_msg.len().saturating_sub(VNET_HDR_LEN) as u64,
            _driver: drv,
        };
        rig.rx.publish()?;
        Ok(rig)
    }

    /// The device's metrics as JSON.
    pub fn metrics_json(&self) -> serde_json::Value {
        self.metrics.to_json()
    }

    /// The device's metrics.
    pub fn metrics(&self) -> &NetMetrics {
        &self.metrics
    }

    /// The device's metrics, for a thread that samples them while the rig
    /// runs.
    pub fn shared_metrics(&self) -> Arc<NetMetrics> {
        self.metrics.clone()
    }

    fn wait_irq(&self, timeout: Duration) {
        if sys::poll_fd(self.irq.as_raw_fd(), false, timeout) {
            let _ = self.irq.read();
        }
    }

    /// Reaps RX used entries, reposts their buffers; with a `probe`, calls
    /// it with each frame's send timestamp if it is a latency probe. The
    /// throughput windows pass none: reading every frame's head for a probe
    /// nobody looks at would only add driver work that competes with the
    /// device for the two cores (the raw loop reads no frame either).
    fn reap_rx(&mut self, mut probe: Option<&mut dyn FnMut(u64)>) -> Result<usize> {
        let used = self.rx.used_idx();
        let mut n = 0;
        while self.rx.last_used != used {
            let (id, len) = self.rx.used_elem(self.rx.last_used)?;
            self.rx.last_used = self.rx.last_used.wrapping_add(1);
            let buf = self.rx.bufs[usize::from(id)];
            let t = &mut self.rx_totals;
            t.buffers += 1;
            if t.pending > 0 {
                t.pending -= 1;
                t.bytes += u64::from(len);
            } else {
                t.frames += 1;
                t.bytes += u64::from(len).saturating_sub(VNET_HDR_LEN as u64);
                if self.mrg {
                    t.pending = self.rx.num_buffers(id).saturating_sub(1);
                }
                if let Some(probe) = probe.as_mut() {
                    if len as usize >= VNET_HDR_LEN + frames::UDP_OVERHEAD + 16 {
                        let mut head = [0u8; VNET_HDR_LEN + frames::UDP_OVERHEAD + 16];
                        self.mem.read_slice(&mut head, buf)?;
                        if let Some(ts) = frames::parse_probe(&head) {
                            probe(ts);
                        }
                    }
                }
            }
            self.rx.post(id);
            n += 1;
        }
        if n > 0 {
            self.rx.publish()?;
        }
        Ok(n)
    }

    fn reap_tx(&mut self) -> Result<usize> {
        let used = self.tx.used_idx();
        let mut n = 0;
        while self.tx.last_used != used {
            let (id, _) = self.tx.used_elem(self.tx.last_used)?;
            self.tx.last_used = self.tx.last_used.wrapping_add(1);
            self.tx.post(id);
            n += 1;
        }
        self.tx_used += n as u64;
        if n > 0 {
            self.tx.publish()?;
        }
        Ok(n)
    }

    /// TX totals: used entries minus the frames the TAP refused (the device
    /// returns those used too, and counts them in `tx_dropped`), as the raw
    /// loop counts only frames the TAP took. The device adds `tx_dropped`
    /// at the end of the pass that publishes the used entries, so the two
    /// agree whenever the driver sees the entries.
    fn tx_counts(&self) -> Counts {
        let dropped = self.metrics.tx_dropped.load(Ordering::Relaxed);
        let frames = self.tx_used.saturating_sub(dropped);
        Counts {
            frames,
            bytes: frames * self.tx_len,
            buffers: 0,
            dropped,
            passes: self.metrics.tx_passes.load(Ordering::Relaxed),
        }
    }

    fn rx_counts(&self) -> Counts {
        let t = &self.rx_totals;
        Counts {
            frames: t.frames,
            bytes: t.bytes,
            buffers: t.buffers,
            dropped: 0,
            passes: self.metrics.rx_passes.load(Ordering::Relaxed),
        }
    }

    /// Posts every TX descriptor (once, at the start of a TX run).
    fn fill_tx(&mut self) -> Result<()> {
        for id in 0..self.tx.layout.size {
            self.tx.post(id);
        }
        self.tx.publish()
    }

    /// RX throughput while the caller's host sender (whose running count is
    /// `offered`) floods the TAP: the driver sleeps on the interrupt like a
    /// guest would.
    pub fn run_rx(
        &mut self,
        offered: Arc<AtomicU64>,
        warmup: Duration,
        dur: Duration,
    ) -> Result<Measured> {
        let mut w = Window::new(warmup, dur, self.dev_clock, Some(offered));
        loop {
            if !w.tick(self.rx_counts()) {
                break;
            }
            self.reap_rx(None)?;
            if self.rx.arm_interrupt(0) {
                self.wait_irq(Duration::from_millis(5));
            }
        }
        self.check_device()?;
        Ok(w.out)
    }

    /// TX throughput: every descriptor carries the frame; the driver sleeps
    /// on the interrupt and reposts every completed descriptor with one kick.
    /// (A busy-polling driver was tried: on 2 cores it steals the device
    /// thread's CPU and kicks every frame or two, and TX fell to a third.)
    pub fn run_tx(&mut self, warmup: Duration, dur: Duration) -> Result<Measured> {
        self.fill_tx()?;
        let mut w = Window::new(warmup, dur, self.dev_clock, None);
        let delayed = self.tx.layout.size / 4 * 3;
        while w.tick(self.tx_counts()) {
            self.reap_tx()?;
            self.reap_rx(None)?;
            // A transmitting Linux guest asks for the TX interrupt only
            // once 3/4 of what it posted is done (`virtqueue_enable_cb_delayed`).
            if self.tx.arm_interrupt(delayed) && self.rx.arm_interrupt(0) {
                self.wait_irq(Duration::from_millis(5));
            }
        }
        self.check_device()?;
        Ok(w.out)
    }

    /// RX probe latency (µs, host send → visible in the used ring) for `dur`.
    /// With `flood` the driver busy-polls both rings and keeps the TX ring
    /// full of the configured frame (a vCPU transmitting flat out); without,
    /// it sleeps on the interrupt like an idle guest. Returns the samples and the TX
    /// throughput over the same window.
    pub fn run_latency(&mut self, dur: Duration, flood: bool) -> Result<(Vec<f64>, Measured)> {
        if flood {
            self.fill_tx()?;
        }
        let mut samples = Vec::with_capacity(8192);
        // Probes sent while no device had the TAP open sat in the TAP's
        // qdisc (no carrier) and arrive in a burst at start: only probes
        // sent after the warm-up count.
        let warmup = Duration::from_millis(200);
        let counted_from = sys::now_ns() + warmup.as_nanos() as u64;
        let mut w = Window::new(warmup, dur, self.dev_clock, None);
        while w.tick(self.tx_counts()) {
            self.reap_rx(Some(&mut |ts| {
                if ts >= counted_from {
                    let now = sys::now_ns();
                    samples.push(now.saturating_sub(ts) as f64 / 1000.0);
                }
            }))?;
            if flood {
                self.reap_tx()?;
            } else if self.rx.arm_interrupt(0) {
                // An idle guest halts until the interrupt: so does the driver.
                self.wait_irq(Duration::from_millis(5));
            }
        }
        self.check_device()?;
        Ok((samples, w.out))
    }

    /// Fails if the device thread died.
    fn check_device(&mut self) -> Result<()> {
        if self.dev_thread.as_ref().is_some_and(|h| h.is_finished()) {
            if let Some(h) = self.dev_thread.take() {
                h.join().map_err(|_| anyhow!("device thread panicked"))??;
            }
            return Err(anyhow!("device thread stopped"));
        }
        Ok(())
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.dev_thread.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{need_event, ring_slot};

    #[test]
    fn ring_slots_wrap_at_the_ring_size() {
        // The first entry sits after flags and idx.
        assert_eq!(ring_slot(0, 256, 2), 4);
        assert_eq!(ring_slot(255, 256, 2), 4 + 2 * 255);
        // Index 256 is slot 0 again, and the u16 index wraps with the ring.
        assert_eq!(ring_slot(256, 256, 8), 4);
        assert_eq!(ring_slot(259, 256, 8), 4 + 8 * 3);
        assert_eq!(ring_slot(u16::MAX, 1024, 8), 4 + 8 * 1023);
    }

    #[test]
    fn need_event_fires_when_the_index_crosses_the_event() {
        // Moving from 10 to 11 crosses event 10 only.
        assert!(need_event(10, 11, 10));
        assert!(!need_event(11, 11, 10));
        assert!(!need_event(9, 11, 10));
        // A batch from 10 to 20 crosses every event in 10..20.
        assert!(need_event(10, 20, 10) && need_event(19, 20, 10));
        assert!(!need_event(20, 20, 10));
        // Across the 16-bit wrap.
        assert!(need_event(0xffff, 2, 0xfffe));
        assert!(need_event(1, 2, 0xfffe));
        assert!(!need_event(2, 2, 0xfffe));
        // Nothing published, nothing crossed.
        assert!(!need_event(5, 5, 5));
    }
}
