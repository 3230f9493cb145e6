// SPDX-License-Identifier: Apache-2.0
//! The drives' image files, checked before any device opens one.
//!
//! The configuration names each image by its path only (it is plain data);
//! here, on the host, the builder checks them before it attaches a device,
//! and the pre-boot API when a drive is put, so that a bad image is one
//! line naming its drive before anything of the VM exists: a missing or
//! unreadable file, one minivmm could not write for a read-write drive, a
//! non-regular file, or one file given to two drives (compared by device
//! and inode, so two spellings of one path are caught; two read-only
//! drives would otherwise share it under their shared locks). Whether
//! another process holds an image locked is found when the device opens and
//! locks it, also before boot.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::config::DriveConfig;

/// An image a drive cannot use.
#[derive(Debug, thiserror::Error)]
#[error("drive '{id}': {reason}")]
pub struct ImageError {
    /// The drive.
    pub id: String,
    /// What is wrong with its image, naming it.
    pub reason: String,
}

/// Checks every drive's image (see the module doc).
pub fn check_images(drives: &[DriveConfig]) -> Result<(), ImageError> {
    let mut files: Vec<((u64, u64), &str)> = Vec::with_capacity(drives.len());
    for drive in drives {
        let d = &drive.device;
        let err = |reason: String| ImageError {
            id: d.id.clone(),
            reason,
        };
        let key = check_image(&d.path, d.read_only).map_err(err)?;
        if let Some((_, other)) = files.iter().find(|(k, _)| *k == key) {
            return Err(err(format!(
                "disk image {} is already drive '{other}'",
                d.path.display()
            )));
        }
        files.push((key, &d.id));
    }
    Ok(())
}

/// One image: a regular file minivmm can open as the drive will (read-only
/// or read-write). Returns its device and inode.
fn check_image(path: &Path, read_only: bool) -> Result<(u64, u64), String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("disk image {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "disk image {} is not a regular file",
            path.display()
        ));
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(!read_only)
        // A FIFO put in the file's place since the check above must not
        // hold this open up (the file is only looked at, then closed).
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| format!("disk image {}: {e}", path.display()))?;
    Ok((meta.dev(), meta.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::drive::{finish_drives, parse_disk};
    use std::os::unix::fs::PermissionsExt;

    /// The drives `--disk` makes of `specs`.
    fn drives(specs: &[String]) -> Vec<DriveConfig> {
        finish_drives(specs.iter().map(|s| parse_disk(s).unwrap()).collect()).unwrap()
    }

    #[test]
    fn bad_images_are_refused_naming_the_drive() {
        let d = std::env::temp_dir().join(format!("minivmm-images-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("a.img"), d.join("b.img"));
        for p in [&a, &b] {
            std::fs::write(p, vec![0u8; 4096]).unwrap();
        }
        let ro = d.join("ro.img");
        std::fs::write(&ro, vec![0u8; 4096]).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
        let (a, b, ro, dir) = (a.display(), b.display(), ro.display(), d.display());
        assert!(check_images(&drives(&[format!("path={a}"), format!("path={b}")])).is_ok());
        let cases: Vec<(Vec<String>, String)> = vec![
            (
                vec![format!("path={dir}/missing.img")],
                format!("drive 'disk0': disk image {dir}/missing.img: No such file or directory (os error 2)"),
            ),
            (
                vec![format!("path={dir}")],
                format!("drive 'disk0': disk image {dir} is not a regular file"),
            ),
            (
                vec![format!("path={a}"), format!("path={dir}/./a.img")],
                format!("drive 'disk1': disk image {dir}/./a.img is already drive 'disk0'"),
            ),
            (
                vec![format!("path={a},readonly=on"), format!("path={a},readonly=on,id=again")],
                format!("drive 'again': disk image {a} is already drive 'disk0'"),
            ),
        ];
        for (specs, want) in cases {
            let e = check_images(&drives(&specs)).unwrap_err();
            assert_eq!(e.to_string(), want);
        }
        // A read-only file serves a read-only drive; a read-write drive
        // needs to write it (root may write anything: then both pass).
        assert!(check_images(&drives(&[format!("path={ro},readonly=on")])).is_ok());
        let rw = check_images(&drives(&[format!("path={ro}")]));
        assert_eq!(rw.is_ok(), may_override_modes(), "{rw:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Whether this process may write a file whatever its mode
    /// (CAP_DAC_OVERRIDE, bit 1 of the effective set).
    fn may_override_modes() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .is_some_and(|caps| u64::from_str_radix(caps.trim(), 16).unwrap() & 2 != 0)
    }
}
