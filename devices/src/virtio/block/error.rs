// SPDX-License-Identifier: Apache-2.0
//! [`BlockError`]: why a block device could not be made, its image opened
//! or a change refused. Its own file, the lowest of the device: the
//! backend that opens images and the device that checks settings both
//! return it, and neither imports the other for it.

/// Why a block device could not be made; each names the image file.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The image cannot be opened (missing, unreadable, not writable).
    #[error("cannot open disk image {}: {source}", path.display())]
    Open {
        /// The image.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The path is a directory or another non-regular file.
    #[error("disk image {} is not a regular file", .0.display())]
    NotAFile(std::path::PathBuf),
    /// Another process (another minivmm) holds the image's lock.
    #[error("disk image {} is in use by another process (locked)", .0.display())]
    Locked(std::path::PathBuf),
    /// A setting is outside its bounds.
    #[error("drive {id}: {msg}")]
    Config {
        /// The drive id.
        id: String,
        /// What is wrong.
        msg: String,
    },
}
