// SPDX-License-Identifier: Apache-2.0
//! Intel MultiProcessor Specification 1.4 table.
//!
//! Without ACPI, Linux learns about application processors, the IOAPIC and the ISA interrupt
//! wiring only from an MP table; with none it boots a single CPU and uses the 8259 PIC. The
//! table is two parts, both written at [`MPTABLE_START`] (the EBDA, which Linux scans for the
//! `_MP_` signature):
//!
//! * the 16-byte floating pointer structure (MP spec §4.1), pointing at
//! * the configuration table (§4.2): a 44-byte header followed by one processor entry per
//!   vCPU, one ISA bus, the IOAPIC, one I/O interrupt entry per IOAPIC pin in use (ISA IRQ n
//!   to pin n, KVM's default GSI routing) and the two local interrupts of the virtual-wire
//!   mode (LINT0 ExtINT, LINT1 NMI), matching [`crate::x86_64::set_lint`].
//!
//! The structures are serialised field by field in little-endian into a byte vector rather
//! than through `#[repr(packed)]` structs, so no unsafe `ByteValued` impls are needed.

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::layout::{APIC_START, HIMEM_START, IOAPIC_START, IRQ_MAX, MPTABLE_START};

/// Most vCPUs the table describes: xAPIC ids are 8 bits, 0xff is the broadcast id, and the
/// IOAPIC takes the id after the last vCPU.
pub const MAX_SUPPORTED_CPUS: u8 = 254;

const MPF_SIGNATURE: &[u8; 4] = b"_MP_";
const MPC_SIGNATURE: &[u8; 4] = b"PCMP";
/// MP specification revision 1.4.
const MP_SPEC_REV: u8 = 4;
const OEM_ID: &[u8; 8] = b"MINIVMM ";
const PRODUCT_ID: &[u8; 12] = b"MINIVMM-0001";

const MPF_SIZE: usize = 16;
const MPC_HEADER_SIZE: usize = 44;
const PROCESSOR_ENTRY_SIZE: usize = 20;
const SMALL_ENTRY_SIZE: usize = 8;

const MP_PROCESSOR: u8 = 0;
const MP_BUS: u8 = 1;
const MP_IOAPIC: u8 = 2;
const MP_INTSRC: u8 = 3;
const MP_LINTSRC: u8 = 4;

/// Local APIC version of an integrated xAPIC; below 0x10 Linux would assume an external
/// 82489DX.
const APIC_VERSION: u8 = 0x14;
/// Version the KVM in-kernel IOAPIC reports in its version register.
const IOAPIC_VERSION: u8 = 0x11;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTPROCESSOR: u8 = 2;
/// CPU signature of the processor entries: family 6. Linux only prints it.
const CPU_SIGNATURE: u32 = 0x600;
/// Feature flags of the processor entries: on-chip FPU (bit 0) and APIC (bit 9).
const CPU_FEATURES: u32 = 0x201;
const MPC_APIC_USABLE: u8 = 1;

const MP_IRQ_INT: u8 = 0;
const MP_IRQ_NMI: u8 = 1;
const MP_IRQ_EXTINT: u8 = 3;
/// Polarity and trigger mode "conforms to the bus": edge, active high on ISA.
const MP_IRQFLAG_DEFAULT: u16 = 0;
const ISA_BUS_ID: u8 = 0;
const BUS_TYPE_ISA: &[u8; 6] = b"ISA   ";
/// Destination local APIC id meaning "all local APICs".
const ALL_LOCAL_APICS: u8 = 0xff;

/// Errors while building or writing the MP table.
#[derive(Debug, thiserror::Error)]
pub enum MptableError {
    /// At least one vCPU is needed.
    #[error("the MP table needs at least one CPU")]
    NoCpus,
    /// More vCPUs than 8-bit APIC ids can number.
    #[error("{0} CPUs requested, the MP table supports at most {MAX_SUPPORTED_CPUS}")]
    TooManyCpus(u8),
    /// An IRQ beyond the last IOAPIC pin.
    #[error("IRQ {0} is beyond the last IOAPIC pin {IRQ_MAX}")]
    IrqOutOfRange(u8),
    /// The table would reach into high memory.
    #[error("the MP table ({0} bytes) does not fit below 1 MiB")]
    TooLarge(usize),
    /// Writing the table into guest memory failed.
    #[error("failed to write the MP table into guest memory")]
    Write(#[source] vm_memory::GuestMemoryError),
}

/// Value that makes the bytes of `data` (with its checksum byte still 0) sum to 0 mod 256.
fn checksum(data: &[u8]) -> u8 {
    data.iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

fn push_processor(buf: &mut Vec<u8>, apic_id: u8) {
    let flags = if apic_id == 0 {
        CPU_ENABLED | CPU_BOOTPROCESSOR
    } else {
        CPU_ENABLED
    };
    buf.extend_from_slice(&[MP_PROCESSOR, apic_id, APIC_VERSION, flags]);
    buf.extend_from_slice(&CPU_SIGNATURE.to_le_bytes());
    buf.extend_from_slice(&CPU_FEATURES.to_le_bytes());
    buf.extend_from_slice(&[0u8; 8]);
}

fn push_bus(buf: &mut Vec<u8>) {
    buf.extend_from_slice(&[MP_BUS, ISA_BUS_ID]);
    buf.extend_from_slice(BUS_TYPE_ISA);
}

fn push_ioapic(buf: &mut Vec<u8>, ioapic_id: u8) {
    buf.extend_from_slice(&[MP_IOAPIC, ioapic_id, IOAPIC_VERSION, MPC_APIC_USABLE]);
    // The IOAPIC is below 4 GiB by definition of the layout.
    buf.extend_from_slice(&(IOAPIC_START as u32).to_le_bytes());
}

fn push_intsrc(buf: &mut Vec<u8>, irq: u8, ioapic_id: u8) {
    buf.extend_from_slice(&[MP_INTSRC, MP_IRQ_INT]);
    buf.extend_from_slice(&MP_IRQFLAG_DEFAULT.to_le_bytes());
    buf.extend_from_slice(&[ISA_BUS_ID, irq, ioapic_id, irq]);
}

fn push_lintsrc(buf: &mut Vec<u8>, irq_type: u8, dest_apic: u8, lint: u8) {
    buf.extend_from_slice(&[MP_LINTSRC, irq_type]);
    buf.extend_from_slice(&MP_IRQFLAG_DEFAULT.to_le_bytes());
    buf.extend_from_slice(&[ISA_BUS_ID, 0, dest_apic, lint]);
}

/// Serialises the floating pointer and configuration table for a table placed at `base`.
fn build_mptable(base: u64, num_cpus: u8, max_irq: u8) -> Result<Vec<u8>, MptableError> {
    if num_cpus == 0 {
        return Err(MptableError::NoCpus);
    }
    if num_cpus > MAX_SUPPORTED_CPUS {
        return Err(MptableError::TooManyCpus(num_cpus));
    }
    if u32::from(max_irq) > IRQ_MAX {
        return Err(MptableError::IrqOutOfRange(max_irq));
    }
    let ioapic_id = num_cpus;
    let irq_count = usize::from(max_irq) + 1;

    // Configuration table body first, so its length and entry count are known.
    let mut entries = Vec::new();
    for apic_id in 0..num_cpus {
        push_processor(&mut entries, apic_id);
    }
    push_bus(&mut entries);
    push_ioapic(&mut entries, ioapic_id);
    for irq in 0..=max_irq {
        push_intsrc(&mut entries, irq, ioapic_id);
    }
    // LINT0 of the BSP receives the 8259's ExtINT (virtual-wire mode); LINT1 of every CPU
    // receives NMI.
    push_lintsrc(&mut entries, MP_IRQ_EXTINT, 0, 0);
    push_lintsrc(&mut entries, MP_IRQ_NMI, ALL_LOCAL_APICS, 1);
    let entry_count = usize::from(num_cpus) + 2 + irq_count + 2;
    debug_assert_eq!(
        entries.len(),
        usize::from(num_cpus) * PROCESSOR_ENTRY_SIZE
            + (entry_count - usize::from(num_cpus)) * SMALL_ENTRY_SIZE
    );

    let table_len = MPC_HEADER_SIZE + entries.len();
    let total = MPF_SIZE + table_len;
    if base + total as u64 > HIMEM_START {
        return Err(MptableError::TooLarge(total));
    }
    // Both fit u16: the table is below 1 MiB in size and has at most 254 + 28 entries.
    let table_len16 = table_len as u16;
    let entry_count16 = entry_count as u16;

    let config_addr = base + MPF_SIZE as u64;
    let mut mpf = Vec::with_capacity(MPF_SIZE);
    mpf.extend_from_slice(MPF_SIGNATURE);
    // Below 1 MiB, checked above.
    mpf.extend_from_slice(&(config_addr as u32).to_le_bytes());
    // Length in 16-byte units, spec revision, checksum, then feature bytes 1..5 all zero:
    // a configuration table is present and IMCR is absent (virtual-wire mode).
    mpf.extend_from_slice(&[1, MP_SPEC_REV, 0, 0, 0, 0, 0, 0]);
    mpf[10] = checksum(&mpf);

    let mut mpc = Vec::with_capacity(table_len);
    mpc.extend_from_slice(MPC_SIGNATURE);
    mpc.extend_from_slice(&table_len16.to_le_bytes());
    mpc.extend_from_slice(&[MP_SPEC_REV, 0]);
    mpc.extend_from_slice(OEM_ID);
    mpc.extend_from_slice(PRODUCT_ID);
    // No OEM table.
    mpc.extend_from_slice(&0u32.to_le_bytes());
    mpc.extend_from_slice(&0u16.to_le_bytes());
    mpc.extend_from_slice(&entry_count16.to_le_bytes());
    mpc.extend_from_slice(&(APIC_START as u32).to_le_bytes());
    // No extended table: length, checksum, reserved.
    mpc.extend_from_slice(&[0u8; 4]);
    mpc.extend_from_slice(&entries);
    mpc[7] = checksum(&mpc);

    mpf.extend_from_slice(&mpc);
    Ok(mpf)
}

/// Writes an MP table for `num_cpus` vCPUs (APIC ids 0..num_cpus, the IOAPIC gets id
/// `num_cpus`) and ISA IRQs `0..=max_irq` at [`MPTABLE_START`].
pub fn setup_mptable(
    mem: &GuestMemoryMmap<()>,
    num_cpus: u8,
    max_irq: u8,
) -> Result<(), MptableError> {
    let table = build_mptable(MPTABLE_START, num_cpus, max_irq)?;
    mem.write_slice(&table, GuestAddress(MPTABLE_START))
        .map_err(MptableError::Write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem() -> GuestMemoryMmap<()> {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x20_0000)]).unwrap()
    }

    fn read(mem: &GuestMemoryMmap<()>, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
    }

    /// Reads back the floating pointer and config table, checking both checksums, and
    /// returns the entries as (type, bytes).
    fn parse(mem: &GuestMemoryMmap<()>) -> (Vec<u8>, Vec<(u8, Vec<u8>)>) {
        let mpf = read(mem, MPTABLE_START, MPF_SIZE);
        assert_eq!(&mpf[0..4], b"_MP_");
        assert_eq!(mpf[8], 1, "length in paragraphs");
        assert_eq!(mpf[9], 4, "spec 1.4");
        assert_eq!(sum(&mpf), 0, "floating pointer checksum");
        let config = u64::from(u32::from_le_bytes(mpf[4..8].try_into().unwrap()));
        assert_eq!(config, MPTABLE_START + 16);

        let header = read(mem, config, MPC_HEADER_SIZE);
        assert_eq!(&header[0..4], b"PCMP");
        let len = usize::from(u16::from_le_bytes([header[4], header[5]]));
        let table = read(mem, config, len);
        assert_eq!(sum(&table), 0, "configuration table checksum");
        assert_eq!(
            u32::from_le_bytes(table[36..40].try_into().unwrap()),
            0xfee0_0000
        );
        let count = usize::from(u16::from_le_bytes([table[34], table[35]]));

        let mut entries = Vec::new();
        let mut off = MPC_HEADER_SIZE;
        while off < len {
            let ty = table[off];
            let size = if ty == MP_PROCESSOR {
                PROCESSOR_ENTRY_SIZE
            } else {
                SMALL_ENTRY_SIZE
            };
            entries.push((ty, table[off..off + size].to_vec()));
            off += size;
        }
        assert_eq!(off, len, "entries end exactly at the table length");
        assert_eq!(entries.len(), count, "entry count in header");
        (table, entries)
    }

    #[test]
    fn checksums_and_processor_count() {
        for cpus in [1u8, 2, 4, 16] {
            let m = mem();
            setup_mptable(&m, cpus, 23).unwrap();
            let (_, entries) = parse(&m);
            let procs: Vec<_> = entries.iter().filter(|e| e.0 == MP_PROCESSOR).collect();
            assert_eq!(procs.len(), usize::from(cpus));
            for (i, (_, p)) in procs.iter().enumerate() {
                assert_eq!(p[1], i as u8, "APIC id");
                assert_eq!(p[2], APIC_VERSION);
                let expected_flags = if i == 0 { 3 } else { 1 };
                assert_eq!(p[3], expected_flags, "enabled / BSP flags");
            }
        }
    }

    #[test]
    fn ioapic_and_interrupt_entries() {
        let m = mem();
        setup_mptable(&m, 2, 23).unwrap();
        let (_, entries) = parse(&m);

        let buses: Vec<_> = entries.iter().filter(|e| e.0 == MP_BUS).collect();
        assert_eq!(buses.len(), 1);
        assert_eq!(&buses[0].1[2..8], b"ISA   ");

        let ioapics: Vec<_> = entries.iter().filter(|e| e.0 == MP_IOAPIC).collect();
        assert_eq!(ioapics.len(), 1);
        let io = &ioapics[0].1;
        assert_eq!(io[1], 2, "IOAPIC id follows the CPUs");
        assert_eq!(io[3], 1, "usable");
        assert_eq!(
            u32::from_le_bytes(io[4..8].try_into().unwrap()),
            0xfec0_0000
        );

        let intsrc: Vec<_> = entries.iter().filter(|e| e.0 == MP_INTSRC).collect();
        assert_eq!(intsrc.len(), 24);
        for (irq, (_, e)) in intsrc.iter().enumerate() {
            assert_eq!(e[1], MP_IRQ_INT);
            assert_eq!(e[4], ISA_BUS_ID);
            assert_eq!(e[5], irq as u8, "source IRQ");
            assert_eq!(e[6], 2, "destination IOAPIC");
            assert_eq!(e[7], irq as u8, "IOAPIC pin");
        }

        let lint: Vec<_> = entries.iter().filter(|e| e.0 == MP_LINTSRC).collect();
        assert_eq!(lint.len(), 2);
        assert_eq!((lint[0].1[1], lint[0].1[7]), (MP_IRQ_EXTINT, 0));
        assert_eq!(
            (lint[1].1[1], lint[1].1[6], lint[1].1[7]),
            (MP_IRQ_NMI, 0xff, 1)
        );
    }

    #[test]
    fn fewer_irqs() {
        let m = mem();
        setup_mptable(&m, 1, 5).unwrap();
        let (_, entries) = parse(&m);
        assert_eq!(entries.iter().filter(|e| e.0 == MP_INTSRC).count(), 6);
    }

    #[test]
    fn largest_table_fits() {
        let m = mem();
        setup_mptable(&m, MAX_SUPPORTED_CPUS, 23).unwrap();
        let (_, entries) = parse(&m);
        assert_eq!(entries.len(), 254 + 1 + 1 + 24 + 2);
    }

    #[test]
    fn invalid_arguments() {
        let m = mem();
        assert!(matches!(
            setup_mptable(&m, 0, 23),
            Err(MptableError::NoCpus)
        ));
        assert!(matches!(
            setup_mptable(&m, 255, 23),
            Err(MptableError::TooManyCpus(255))
        ));
        assert!(matches!(
            setup_mptable(&m, 1, 24),
            Err(MptableError::IrqOutOfRange(24))
        ));
    }

    #[test]
    fn too_large_for_base() {
        // Just below 1 MiB there is no room for even a 1-CPU table.
        assert!(matches!(
            build_mptable(HIMEM_START - 32, 1, 23),
            Err(MptableError::TooLarge(_))
        ));
    }

    #[test]
    fn memory_too_small() {
        let m = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x9_0000)]).unwrap();
        assert!(matches!(
            setup_mptable(&m, 1, 23),
            Err(MptableError::Write(_))
        ));
    }
}
