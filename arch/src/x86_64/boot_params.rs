// SPDX-License-Identifier: Apache-2.0
//! The zero page (`struct boot_params`), the e820 memory map, the kernel command line and
//! initramfs placement (Linux boot protocol, Documentation/x86/boot.rst and zero-page.rst).
//!
//! A bzImage carries a `setup_header` that the boot loader must copy into the zero page
//! (linux-loader returns it in `KernelLoaderResult::setup_header`); an ELF vmlinux has none,
//! so the fields the kernel checks are filled in by hand. Either way the boot loader then
//! adds what only it knows: loader type, command line, initrd and the e820 map.

use linux_loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::cmdline::Cmdline;
use linux_loader::loader::KernelLoaderResult;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion,
};

use super::layout::{
    CMDLINE_MAX_SIZE, CMDLINE_START, EBDA_END, EBDA_START, HIMEM_START, MMIO_GAP_START,
    ZERO_PAGE_START,
};

/// e820 type of usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 type of reserved memory.
pub const E820_RESERVED: u32 = 2;

/// `boot_flag` magic at offset 0x1fe of the setup sector.
pub const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// `header` magic: "HdrS".
pub const KERNEL_HDR_MAGIC: u32 = 0x5372_6448;
/// `type_of_loader` for a boot loader without an assigned id.
pub const KERNEL_LOADER_OTHER: u8 = 0xff;
/// Physical alignment the kernel requires; 16 MiB is the x86_64 default
/// (`CONFIG_PHYSICAL_ALIGN`).
pub const KERNEL_MIN_ALIGNMENT_BYTES: u32 = 0x0100_0000;
/// Highest initrd address for protocol 2.02 and older, used when no setup header is given.
pub const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;
/// Offset of the 64-bit entry point (`startup_64`) from the start of a bzImage's protected-mode
/// kernel (boot.rst, "64-bit Boot Protocol").
pub const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

/// Number of e820 slots in the zero page.
const E820_MAX_ENTRIES: usize = 128;
/// Initrd placement granularity.
const PAGE_SIZE: u64 = 0x1000;

/// Errors while building the zero page, the command line or the initrd placement.
#[derive(Debug, thiserror::Error)]
pub enum BootParamsError {
    /// The command line is longer than the kernel accepts.
    #[error("kernel command line is {size} bytes with its NUL, the limit is {max}")]
    CmdlineTooLong {
        /// Length including the NUL terminator.
        size: usize,
        /// Largest accepted length including the NUL terminator.
        max: usize,
    },
    /// The command line cannot be turned into a C string.
    #[error("invalid kernel command line")]
    InvalidCmdline(#[source] linux_loader::cmdline::Error),
    /// The command line could not be written into guest memory.
    #[error("failed to write the kernel command line")]
    WriteCmdline(#[source] linux_loader::loader::Error),
    /// The memory map has more regions than the zero page has e820 slots.
    #[error("the memory map needs more than {E820_MAX_ENTRIES} e820 entries")]
    TooManyE820Entries,
    /// Guest memory does not start at 0 or does not reach past 1 MiB.
    #[error("guest memory must start at 0 and extend beyond 1 MiB")]
    MemoryTooSmall,
    /// The initrd is larger than the space between `min_addr` and the top of low memory.
    #[error("initramfs of {size} bytes does not fit: {available} bytes free below {top:#x}")]
    InitrdTooBig {
        /// Initrd size in bytes.
        size: usize,
        /// Bytes available for it.
        available: u64,
        /// Exclusive upper bound of the initrd (top of low RAM or `initrd_addr_max` + 1).
        top: u64,
    },
    /// An address does not fit the 64-bit split fields of the zero page.
    #[error("{0} address {1:#x} is above 4 GiB")]
    AddressAbove4G(&'static str, u64),
    /// Writing the zero page into guest memory failed.
    #[error("failed to write the zero page into guest memory")]
    WriteZeroPage(#[source] vm_memory::GuestMemoryError),
}

/// What [`configure_zero_page`] needs to know besides the memory map.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZeroPageConfig {
    /// Where the command line was written (usually [`CMDLINE_START`]).
    pub cmdline_addr: GuestAddress,
    /// Command-line length in bytes including the terminating NUL, as returned by
    /// [`write_cmdline`].
    pub cmdline_size: usize,
    /// Initramfs address and size, if one was loaded.
    pub initrd: Option<(GuestAddress, usize)>,
    /// The bzImage setup header (`KernelLoaderResult::setup_header`); `None` for an ELF
    /// vmlinux.
    pub setup_header: Option<setup_header>,
}

/// Writes `cmdline` NUL-terminated at [`CMDLINE_START`] and returns its length including the
/// NUL, for [`ZeroPageConfig::cmdline_size`].
pub fn write_cmdline(
    mem: &GuestMemoryMmap<()>,
    cmdline: &Cmdline,
) -> Result<usize, BootParamsError> {
    let size = cmdline
        .as_cstring()
        .map_err(BootParamsError::InvalidCmdline)?
        .as_bytes_with_nul()
        .len();
    if size > CMDLINE_MAX_SIZE {
        return Err(BootParamsError::CmdlineTooLong {
            size,
            max: CMDLINE_MAX_SIZE,
        });
    }
    linux_loader::loader::load_cmdline(mem, GuestAddress(CMDLINE_START), cmdline)
        .map_err(BootParamsError::WriteCmdline)?;
    Ok(size)
}

/// The guest address the vCPU starts at for a kernel loaded by linux-loader: the ELF entry
/// for a vmlinux, `startup_64` (load address + 0x200) for a bzImage.
pub fn kernel_entry_point(kernel: &KernelLoaderResult) -> GuestAddress {
    if kernel.setup_header.is_some() {
        kernel.kernel_load.unchecked_add(BZIMAGE_64BIT_ENTRY_OFFSET)
    } else {
        kernel.kernel_load
    }
}

/// End (exclusive) of the RAM region that starts at 0, which is low memory below the gap.
fn low_ram_end(mem: &GuestMemoryMmap<()>) -> Result<u64, BootParamsError> {
    let low = mem
        .find_region(GuestAddress(0))
        .ok_or(BootParamsError::MemoryTooSmall)?;
    let end = low.start_addr().raw_value() + low.len();
    if end <= HIMEM_START {
        return Err(BootParamsError::MemoryTooSmall);
    }
    Ok(end)
}

/// Chooses a page-aligned address for an initramfs of `initrd_size` bytes at the top of low
/// memory, as high as the kernel allows.
///
/// The upper bound is the end of the RAM region at 0 (never above [`MMIO_GAP_START`]) and the
/// header's `initrd_addr_max` when a bzImage setup header (protocol 2.03+) is given, else the
/// conservative protocol-2.02 value [`DEFAULT_INITRD_ADDR_MAX`]. The initrd must also start at
/// or above `min_addr`: pass the end of the loaded kernel (`KernelLoaderResult::kernel_end`,
/// plus the bzImage's `init_size` if known) so the two cannot overlap.
pub fn initrd_load_addr(
    mem: &GuestMemoryMmap<()>,
    initrd_size: usize,
    setup_header: Option<&setup_header>,
    min_addr: GuestAddress,
) -> Result<GuestAddress, BootParamsError> {
    let addr_max = match setup_header {
        Some(hdr) if hdr.version >= 0x0203 && hdr.initrd_addr_max != 0 => {
            u64::from(hdr.initrd_addr_max)
        }
        _ => DEFAULT_INITRD_ADDR_MAX,
    };
    let top = low_ram_end(mem)?
        .min(MMIO_GAP_START)
        .min(addr_max.saturating_add(1));
    let floor = min_addr.raw_value().max(HIMEM_START);
    let available = top.saturating_sub(floor);
    top.checked_sub(initrd_size as u64)
        .map(|a| a & !(PAGE_SIZE - 1))
        .filter(|&start| start >= floor)
        .map(GuestAddress)
        .ok_or(BootParamsError::InitrdTooBig {
            size: initrd_size,
            available,
            top,
        })
}

fn e820(addr: u64, size: u64, r#type: u32) -> boot_e820_entry {
    boot_e820_entry { addr, size, r#type }
}

/// The e820 map for guest RAM `regions` (as from
/// [`arch_memory_regions`](crate::x86_64::arch_memory_regions)).
///
/// The region at 0 is split around the legacy area: `[0, EBDA)` RAM, the EBDA reserved (it
/// holds the MP table), nothing for the VGA/ROM hole, and `[1 MiB, end)` RAM. Every other
/// region (RAM above 4 GiB) is reported as it is.
pub fn e820_entries(
    regions: &[(GuestAddress, u64)],
) -> Result<Vec<boot_e820_entry>, BootParamsError> {
    let mut entries = Vec::new();
    let mut saw_low = false;
    for &(start, size) in regions {
        if size == 0 {
            continue;
        }
        if start.raw_value() == 0 {
            if size <= HIMEM_START {
                return Err(BootParamsError::MemoryTooSmall);
            }
            saw_low = true;
            entries.push(e820(0, EBDA_START, E820_RAM));
            entries.push(e820(EBDA_START, EBDA_END - EBDA_START, E820_RESERVED));
            entries.push(e820(HIMEM_START, size - HIMEM_START, E820_RAM));
        } else {
            entries.push(e820(start.raw_value(), size, E820_RAM));
        }
    }
    if !saw_low {
        return Err(BootParamsError::MemoryTooSmall);
    }
    if entries.len() > E820_MAX_ENTRIES {
        return Err(BootParamsError::TooManyE820Entries);
    }
    entries.sort_by_key(|e| e.addr);
    Ok(entries)
}

fn low32(what: &'static str, addr: u64) -> Result<u32, BootParamsError> {
    u32::try_from(addr).map_err(|_| BootParamsError::AddressAbove4G(what, addr))
}

/// Builds the zero page for `mem` and `cfg` without writing it.
pub fn build_zero_page(
    mem: &GuestMemoryMmap<()>,
    cfg: &ZeroPageConfig,
) -> Result<boot_params, BootParamsError> {
    let mut params = boot_params::default();

    match cfg.setup_header {
        Some(hdr) => params.hdr = hdr,
        None => {
            // What a bzImage would have brought along and the kernel validates.
            params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
            params.hdr.header = KERNEL_HDR_MAGIC;
            params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT_BYTES;
        }
    }
    params.hdr.type_of_loader = KERNEL_LOADER_OTHER;

    params.hdr.cmd_line_ptr = low32("command line", cfg.cmdline_addr.raw_value())?;
    params.hdr.cmdline_size = cfg.cmdline_size as u32;

    if let Some((addr, size)) = cfg.initrd {
        params.hdr.ramdisk_image = low32("initrd", addr.raw_value())?;
        params.hdr.ramdisk_size = low32("initrd size", size as u64)?;
    }

    let regions: Vec<(GuestAddress, u64)> = mem.iter().map(|r| (r.start_addr(), r.len())).collect();
    let entries = e820_entries(&regions)?;
    for (slot, entry) in params.e820_table.iter_mut().zip(&entries) {
        *slot = *entry;
    }
    // e820_entries() returns at most E820_MAX_ENTRIES (128) entries, which fits a u8.
    params.e820_entries = entries.len() as u8;

    Ok(params)
}

/// Builds the zero page and writes it at [`ZERO_PAGE_START`].
pub fn configure_zero_page(
    mem: &GuestMemoryMmap<()>,
    cfg: &ZeroPageConfig,
) -> Result<(), BootParamsError> {
    let params = build_zero_page(mem, cfg)?;
    mem.write_obj(params, GuestAddress(ZERO_PAGE_START))
        .map_err(BootParamsError::WriteZeroPage)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::x86_64::layout::{arch_memory_regions, MMIO_GAP_END};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn guest_mem(size: u64) -> GuestMemoryMmap<()> {
        GuestMemoryMmap::from_ranges(&arch_memory_regions(size)).unwrap()
    }

    fn regions(size: u64) -> Vec<(GuestAddress, u64)> {
        arch_memory_regions(size)
            .into_iter()
            .map(|(a, s)| (a, s as u64))
            .collect()
    }

    fn as_tuples(entries: &[boot_e820_entry]) -> Vec<(u64, u64, u32)> {
        entries.iter().map(|e| (e.addr, e.size, e.r#type)).collect()
    }

    /// What every map starts with: conventional memory up to the EBDA,
    /// then the EBDA reserved.
    const BELOW_640K: [(u64, u64, u32); 2] =
        [(0, 0x9_fc00, E820_RAM), (0x9_fc00, 0x400, E820_RESERVED)];

    /// The e820 map of a guest of `mem_size` bytes, as (addr, size, type).
    fn e820_map(mem_size: u64) -> Vec<(u64, u64, u32)> {
        as_tuples(&e820_entries(&regions(mem_size)).unwrap())
    }

    fn read_params(mem: &GuestMemoryMmap<()>) -> boot_params {
        mem.read_obj(GuestAddress(ZERO_PAGE_START)).unwrap()
    }

    /// A boot protocol 2.15 header whose kernel takes an initrd ending at or
    /// below `initrd_addr_max`.
    fn header_with_initrd_max(initrd_addr_max: u32) -> setup_header {
        setup_header {
            version: 0x020f,
            initrd_addr_max,
            ..Default::default()
        }
    }

    #[test]
    fn e820_256m() {
        assert_eq!(
            e820_map(256 * MIB),
            [&BELOW_640K[..], &[(0x10_0000, 255 * MIB, E820_RAM)]].concat()
        );
    }

    #[test]
    fn e820_5g_has_gap() {
        let map = e820_map(5 * GIB);
        assert_eq!(
            map,
            [
                &BELOW_640K[..],
                &[
                    (0x10_0000, 3 * GIB - MIB, E820_RAM),
                    (MMIO_GAP_END, 2 * GIB, E820_RAM),
                ]
            ]
            .concat()
        );
        // Nothing is RAM inside the gap.
        for &(addr, size, _) in &map {
            let end = addr + size;
            assert!(end <= MMIO_GAP_START || addr >= MMIO_GAP_END);
        }
    }

    #[test]
    fn e820_rejects_tiny_or_missing_low_memory() {
        assert!(matches!(
            e820_entries(&[(GuestAddress(0), MIB)]),
            Err(BootParamsError::MemoryTooSmall)
        ));
        assert!(matches!(
            e820_entries(&[(GuestAddress(MMIO_GAP_END), GIB)]),
            Err(BootParamsError::MemoryTooSmall)
        ));
    }

    #[test]
    fn zero_page_elf_fields() {
        let mem = guest_mem(256 * MIB);
        let cfg = ZeroPageConfig {
            cmdline_addr: GuestAddress(CMDLINE_START),
            cmdline_size: 42,
            initrd: Some((GuestAddress(0x0f00_0000), 0x12345)),
            setup_header: None,
        };
        configure_zero_page(&mem, &cfg).unwrap();
        let p = read_params(&mem);
        // Copy packed fields out before comparing (references to them are not allowed).
        let hdr = p.hdr;
        assert_eq!({ hdr.boot_flag }, 0xaa55);
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert_eq!(hdr.type_of_loader, 0xff);
        assert_eq!({ hdr.kernel_alignment }, 0x0100_0000);
        assert_eq!({ hdr.cmd_line_ptr }, CMDLINE_START as u32);
        assert_eq!({ hdr.cmdline_size }, 42);
        assert_eq!({ hdr.ramdisk_image }, 0x0f00_0000);
        assert_eq!({ hdr.ramdisk_size }, 0x12345);
        assert_eq!(p.e820_entries, 3);
        let e2 = p.e820_table[2];
        assert_eq!(
            ({ e2.addr }, { e2.size }, { e2.r#type }),
            (MIB, 255 * MIB, 1)
        );

        // The raw bytes sit at the offsets the boot protocol documents.
        let at = |off: u64| GuestAddress(ZERO_PAGE_START + off);
        assert_eq!(mem.read_obj::<u16>(at(0x1fe)).unwrap(), 0xaa55);
        assert_eq!(mem.read_obj::<u32>(at(0x202)).unwrap(), 0x5372_6448);
        assert_eq!(mem.read_obj::<u8>(at(0x210)).unwrap(), 0xff);
        assert_eq!(mem.read_obj::<u32>(at(0x218)).unwrap(), 0x0f00_0000);
        assert_eq!(
            mem.read_obj::<u32>(at(0x228)).unwrap(),
            CMDLINE_START as u32
        );
        assert_eq!(mem.read_obj::<u8>(at(0x1e8)).unwrap(), 3);
        assert_eq!(mem.read_obj::<u64>(at(0x2d0)).unwrap(), 0);
        assert_eq!(mem.read_obj::<u64>(at(0x2d0 + 20 * 2)).unwrap(), MIB);
    }

    #[test]
    fn zero_page_copies_bzimage_header() {
        let mem = guest_mem(256 * MIB);
        let hdr = setup_header {
            setup_sects: 27,
            boot_flag: 0xaa55,
            header: 0x5372_6448,
            version: 0x020f,
            loadflags: 1,
            kernel_alignment: 0x20_0000,
            initrd_addr_max: 0x7fff_ffff,
            type_of_loader: 0,
            ..Default::default()
        };
        let cfg = ZeroPageConfig {
            cmdline_addr: GuestAddress(CMDLINE_START),
            cmdline_size: 10,
            initrd: None,
            setup_header: Some(hdr),
        };
        configure_zero_page(&mem, &cfg).unwrap();
        let got = read_params(&mem).hdr;
        assert_eq!(got.setup_sects, 27);
        assert_eq!({ got.version }, 0x020f);
        assert_eq!(got.loadflags, 1);
        // The kernel's own alignment wins over our default.
        assert_eq!({ got.kernel_alignment }, 0x20_0000);
        assert_eq!(got.type_of_loader, 0xff);
        assert_eq!({ got.cmd_line_ptr }, CMDLINE_START as u32);
        assert_eq!({ got.ramdisk_image }, 0);
        assert_eq!({ got.ramdisk_size }, 0);
    }

    #[test]
    fn zero_page_5g_e820() {
        // 5 GiB of address space is only reserved, never touched beyond the written pages.
        let mem = guest_mem(5 * GIB);
        configure_zero_page(&mem, &ZeroPageConfig::default()).unwrap();
        let p = read_params(&mem);
        assert_eq!(p.e820_entries, 4);
        let last = p.e820_table[3];
        assert_eq!(({ last.addr }, { last.size }), (MMIO_GAP_END, 2 * GIB));
    }

    #[test]
    fn zero_page_rejects_high_initrd() {
        let mem = guest_mem(256 * MIB);
        let cfg = ZeroPageConfig {
            initrd: Some((GuestAddress(MMIO_GAP_END), 4096)),
            ..Default::default()
        };
        assert!(matches!(
            configure_zero_page(&mem, &cfg),
            Err(BootParamsError::AddressAbove4G("initrd", _))
        ));
    }

    #[test]
    fn initrd_at_top_of_small_memory() {
        let mem = guest_mem(256 * MIB);
        let addr = initrd_load_addr(&mem, 0x1234, None, GuestAddress(HIMEM_START)).unwrap();
        // Page-aligned, ends within RAM, as high as possible.
        assert_eq!(addr.raw_value(), 256 * MIB - 0x2000);
        assert_eq!(addr.raw_value() % 4096, 0);
    }

    #[test]
    fn initrd_respects_addr_max() {
        let mem = guest_mem(2 * GIB);
        // No header: protocol 2.02 limit.
        let addr = initrd_load_addr(&mem, 4096, None, GuestAddress(0)).unwrap();
        assert_eq!(addr.raw_value(), 0x3800_0000 - 4096);
        // Header allowing 2 GiB - 1.
        let hdr = header_with_initrd_max(0x7fff_ffff);
        let addr = initrd_load_addr(&mem, 4096, Some(&hdr), GuestAddress(0)).unwrap();
        assert_eq!(addr.raw_value(), 0x8000_0000 - 4096);
    }

    #[test]
    fn initrd_stays_below_gap() {
        let mem = guest_mem(5 * GIB);
        let hdr = header_with_initrd_max(0xffff_ffff);
        let addr = initrd_load_addr(&mem, 8192, Some(&hdr), GuestAddress(0)).unwrap();
        assert_eq!(addr.raw_value(), MMIO_GAP_START - 8192);
    }

    #[test]
    fn initrd_too_big() {
        let mem = guest_mem(64 * MIB);
        let kernel_end = GuestAddress(32 * MIB);
        let err = initrd_load_addr(&mem, (40 * MIB) as usize, None, kernel_end).unwrap_err();
        match err {
            BootParamsError::InitrdTooBig {
                size,
                available,
                top,
            } => {
                assert_eq!(size, (40 * MIB) as usize);
                assert_eq!(available, 32 * MIB);
                assert_eq!(top, 64 * MIB);
            }
            other => panic!("unexpected error {other}"),
        }
        // Larger than all of memory underflows the subtraction: same error.
        assert!(matches!(
            initrd_load_addr(&mem, usize::MAX, None, kernel_end),
            Err(BootParamsError::InitrdTooBig { .. })
        ));
        // Exactly the free space fits.
        let addr = initrd_load_addr(&mem, (32 * MIB) as usize, None, kernel_end).unwrap();
        assert_eq!(addr, kernel_end);
    }

    #[test]
    fn cmdline_written_with_nul() {
        let mem = guest_mem(16 * MIB);
        let mut cl = Cmdline::new(CMDLINE_MAX_SIZE).unwrap();
        cl.insert_str("console=ttyS0 panic=-1").unwrap();
        let size = write_cmdline(&mem, &cl).unwrap();
        assert_eq!(size, 23);
        let mut buf = [0u8; 23];
        mem.read_slice(&mut buf, GuestAddress(CMDLINE_START))
            .unwrap();
        assert_eq!(&buf, b"console=ttyS0 panic=-1\0");
    }

    #[test]
    fn cmdline_too_long() {
        let mem = guest_mem(16 * MIB);
        let mut cl = Cmdline::new(4096).unwrap();
        cl.insert_str("x".repeat(CMDLINE_MAX_SIZE)).unwrap();
        assert!(matches!(
            write_cmdline(&mem, &cl),
            Err(BootParamsError::CmdlineTooLong {
                size: 2049,
                max: 2048
            })
        ));
    }

    #[test]
    fn entry_point_elf_and_bzimage() {
        let mut res = KernelLoaderResult {
            kernel_load: GuestAddress(0x100_0000),
            ..Default::default()
        };
        assert_eq!(kernel_entry_point(&res), GuestAddress(0x100_0000));
        res.setup_header = Some(setup_header::default());
        assert_eq!(kernel_entry_point(&res), GuestAddress(0x100_0200));
    }
}
