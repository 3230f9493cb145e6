// SPDX-License-Identifier: Apache-2.0
//! The guest kernel and its initramfs: opened and recognised before KVM is
//! touched, loaded into guest memory once it exists.
//!
//! A kernel is an ELF vmlinux or a bzImage, told apart by its first bytes
//! ([`detect_kernel_format`]). linux-loader reads what is there, so a cut
//! bzImage would boot into garbage: its length is checked against its own
//! setup header ([`bzimage_expected_len`]) when it is opened.
//!
//! Both files are opened without blocking and must be regular files
//! ([`open_regular`]): a path naming a FIFO (or a device) would otherwise
//! hold the opening thread until some process opened its other end, and
//! read as whatever that process wrote.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use arch::x86_64::boot_params::{initrd_load_addr, BootParamsError};
use arch::x86_64::layout::HIMEM_START;
use linux_loader::loader::{bzimage::BzImage, elf::Elf, KernelLoader, KernelLoaderResult};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, ReadVolatile};

/// Errors opening or loading the kernel and initramfs; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The kernel file cannot be opened.
    #[error("cannot open kernel '{0}'")]
    Open(PathBuf, #[source] std::io::Error),
    /// The kernel or initramfs path names something other than a regular
    /// file (the first field says which).
    #[error("{0} '{1}' is not a regular file")]
    NotAFile(&'static str, PathBuf),
    /// The kernel file is neither ELF nor bzImage.
    #[error("kernel '{0}' is neither an ELF vmlinux nor a bzImage")]
    Format(PathBuf),
    /// The bzImage is shorter than its own header says.
    #[error("kernel '{0}' is truncated: its header promises {1} bytes, the file has {2}")]
    Truncated(PathBuf, u64, u64),
    /// The kernel could not be loaded (truncated, corrupt, too big for memory).
    #[error("cannot load kernel '{0}' (truncated image, or too big for guest memory?)")]
    Load(PathBuf, #[source] linux_loader::loader::Error),
    /// The initramfs file cannot be opened.
    #[error("cannot open initramfs '{0}'")]
    OpenInitramfs(PathBuf, #[source] std::io::Error),
    /// The initramfs does not fit in guest memory.
    #[error("initramfs '{0}' does not fit in guest memory (raise --mem)")]
    InitramfsFit(PathBuf, #[source] BootParamsError),
    /// The initramfs could not be copied into guest memory.
    #[error("cannot read initramfs '{0}' into guest memory")]
    ReadInitramfs(PathBuf, #[source] vm_memory::GuestMemoryError),
}

/// What the kernel file turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// An ELF vmlinux, entered at its 64-bit entry point.
    Elf,
    /// A bzImage, entered through the 64-bit boot protocol.
    BzImage,
}

/// Recognises a kernel image from its first bytes: the ELF magic, or the
/// "HdrS" boot-protocol signature at offset 0x202 of a bzImage.
pub fn detect_kernel_format(head: &[u8]) -> Option<KernelFormat> {
    if head.starts_with(b"\x7fELF") {
        return Some(KernelFormat::Elf);
    }
    if head.get(0x202..0x206) == Some(b"HdrS") {
        return Some(KernelFormat::BzImage);
    }
    None
}

/// The size a bzImage must have according to its setup header (Linux boot
/// protocol: `setup_sects` at 0x1f1, 0 meaning 4, plus the boot sector, then
/// `syssize` 16-byte paragraphs of protected-mode code at 0x1f4).
pub fn bzimage_expected_len(head: &[u8]) -> Option<u64> {
    let setup_sects = match *head.get(0x1f1)? {
        0 => 4,
        n => u64::from(n),
    };
    let syssize = u32::from_le_bytes(head.get(0x1f4..0x1f8)?.try_into().ok()?);
    Some((setup_sects + 1) * 512 + u64::from(syssize) * 16)
}

/// Opens `path` read-only without blocking (a FIFO does not wait for a
/// writer) and checks that it is a regular file: `Ok(None)` when it is
/// something else. On a regular file `O_NONBLOCK` changes nothing, so the
/// flag stays.
pub fn open_regular(path: &Path) -> std::io::Result<Option<File>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    Ok(file.metadata()?.is_file().then_some(file))
}

/// [`open_regular`] for `what` (`"kernel"` or `"initramfs"`), `open_err`
/// wrapping an I/O error.
fn open_boot_file(
    what: &'static str,
    path: &Path,
    open_err: impl Fn(std::io::Error) -> KernelError,
) -> Result<File, KernelError> {
    open_regular(path)
        .map_err(open_err)?
        .ok_or_else(|| KernelError::NotAFile(what, path.into()))
}

/// A kernel image, opened and recognised, not yet loaded.
#[derive(Debug)]
pub struct KernelImage {
    path: PathBuf,
    file: File,
    format: KernelFormat,
}

impl KernelImage {
    /// Opens `path` and recognises its format; a bzImage shorter than its
    /// header says is refused here.
    pub fn open(path: &Path) -> Result<Self, KernelError> {
        let open_err = |e| KernelError::Open(path.into(), e);
        let mut file = open_boot_file("kernel", path, open_err)?;
        let mut head = [0u8; 0x206];
        let n = read_up_to(&mut file, &mut head).map_err(open_err)?;
        let format = detect_kernel_format(&head[..n]).ok_or(KernelError::Format(path.into()))?;
        if format == KernelFormat::BzImage {
            let len = file.metadata().map_err(open_err)?.len();
            let want = bzimage_expected_len(&head[..n]).unwrap_or(u64::MAX);
            if len < want {
                return Err(KernelError::Truncated(path.into(), want, len));
            }
        }
        file.seek(SeekFrom::Start(0)).map_err(open_err)?;
        Ok(KernelImage {
            path: path.into(),
            file,
            format,
        })
    }

    /// What the image is.
    pub fn format(&self) -> KernelFormat {
        self.format
    }

    /// Loads the image into `mem` at [`HIMEM_START`].
    pub fn load(&mut self, mem: &GuestMemoryMmap) -> Result<KernelLoaderResult, KernelError> {
        let at = Some(GuestAddress(HIMEM_START));
        match self.format {
            KernelFormat::Elf => Elf::load(mem, None, &mut self.file, at),
            KernelFormat::BzImage => BzImage::load(mem, None, &mut self.file, at),
        }
        .map_err(|e| KernelError::Load(self.path.clone(), e))
    }
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// An initramfs, opened and sized, not yet loaded.
#[derive(Debug)]
pub struct Initramfs {
    path: PathBuf,
    file: File,
    len: u64,
}

impl Initramfs {
    /// Opens `path` and takes its size.
    pub fn open(path: &Path) -> Result<Self, KernelError> {
        let open_err = |e| KernelError::OpenInitramfs(path.into(), e);
        let file = open_boot_file("initramfs", path, open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        Ok(Initramfs {
            path: path.into(),
            file,
            len,
        })
    }

    /// Copies the initramfs into `mem`, clear of the loaded `kernel`, and
    /// returns where it went and its size.
    pub fn load(
        mut self,
        mem: &GuestMemoryMmap,
        kernel: &KernelLoaderResult,
    ) -> Result<(GuestAddress, usize), KernelError> {
        // Keep the initramfs clear of the kernel, including the room a
        // bzImage needs to decompress itself into (init_size).
        let init_size = kernel.setup_header.map_or(0, |h| u64::from(h.init_size));
        // kernel_end is an absolute guest address; init_size counts from
        // the load address.
        let min = GuestAddress(kernel.kernel_end.max(kernel.kernel_load.0 + init_size));
        let size = usize::try_from(self.len).unwrap_or(usize::MAX);
        let addr = initrd_load_addr(mem, size, kernel.setup_header.as_ref(), min)
            .map_err(|e| KernelError::InitramfsFit(self.path.clone(), e))?;
        let mut slice = mem
            .get_slice(addr, size)
            .map_err(|e| KernelError::ReadInitramfs(self.path.clone(), e))?;
        self.file
            .read_exact_volatile(&mut slice)
            .map_err(|e| KernelError::ReadInitramfs(self.path.clone(), e.into()))?;
        Ok((addr, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_formats_are_recognised_from_their_magic() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        assert_eq!(detect_kernel_format(&elf), Some(KernelFormat::Elf));
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        assert_eq!(detect_kernel_format(&bz), Some(KernelFormat::BzImage));
        assert_eq!(
            detect_kernel_format(b"#!/bin/sh\necho not a kernel\n"),
            None
        );
        assert_eq!(detect_kernel_format(&[]), None);
        // A file cut before the signature is not a bzImage.
        assert_eq!(detect_kernel_format(&bz[..0x204]), None);
    }

    #[test]
    fn a_fifo_or_a_directory_is_refused_without_waiting() {
        let dir = std::env::temp_dir().join(format!("minivmm-kernel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("k.fifo");
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        // No writer: a blocking open would never return.
        for (path, what) in [(&fifo, "k.fifo"), (&dir, "minivmm-kernel-")] {
            let e = KernelImage::open(path).unwrap_err().to_string();
            assert!(e.starts_with("kernel '") && e.contains(what), "{e}");
            assert!(e.ends_with("' is not a regular file"), "{e}");
            let e = Initramfs::open(path).unwrap_err().to_string();
            assert!(e.starts_with("initramfs '"), "{e}");
            assert!(e.ends_with("' is not a regular file"), "{e}");
            assert!(open_regular(path).unwrap().is_none());
        }
        let missing = dir.join("missing");
        let e = KernelImage::open(&missing).unwrap_err();
        assert!(matches!(e, KernelError::Open(..)), "{e}");
        let e = Initramfs::open(&missing).unwrap_err();
        assert!(matches!(e, KernelError::OpenInitramfs(..)), "{e}");
        // A regular file opens, and reads as usual.
        let file = dir.join("initrd");
        std::fs::write(&file, b"0707010").unwrap();
        assert_eq!(Initramfs::open(&file).unwrap().len, 7);
        let mut text = String::new();
        open_regular(&file)
            .unwrap()
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "0707010");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bzimage_length_comes_from_the_setup_header() {
        let mut bz = vec![0u8; 0x400];
        bz[0x202..0x206].copy_from_slice(b"HdrS");
        bz[0x1f1] = 27;
        bz[0x1f4..0x1f8].copy_from_slice(&0x1_0000u32.to_le_bytes());
        assert_eq!(bzimage_expected_len(&bz), Some(28 * 512 + 0x10_0000));
        // setup_sects 0 means the historical 4.
        bz[0x1f1] = 0;
        assert_eq!(bzimage_expected_len(&bz), Some(5 * 512 + 0x10_0000));
        assert_eq!(bzimage_expected_len(&bz[..0x1f6]), None);
    }
}
