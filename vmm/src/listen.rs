// SPDX-License-Identifier: Apache-2.0
//! Unix-socket listeners whose file appears only once they listen: the
//! API socket and the vsock device's `uds_path`. Clients of both (as
//! Firecracker's SDKs and host agents do) wait for the file, then connect
//! at once; a plain `bind` makes the file a system call before `listen`,
//! and a client coming between the two is refused.

use std::io::ErrorKind;
use std::os::unix::net::UnixListener;
use std::path::Path;

/// A listener at `path` that already listens when `path` appears: bound
/// (and listening) at a hidden name of its own beside `path`, then linked
/// to `path`, which fails if `path` exists, and the hidden name removed. A
/// client that connects the moment the file appears (Firecracker's SDKs
/// wait for the file, then send) could otherwise come between the bind and
/// the listen and be refused. Where the hidden name does not fit a socket
/// address (or is taken), or the file system takes no link, the listener
/// is bound at `path` itself.
pub fn bind_listening(path: &Path) -> std::io::Result<UnixListener> {
    bind_listening_with(path, |from, to| std::fs::hard_link(from, to))
}

/// [`bind_listening`] with the link made by `link` (a test's, to see a file
/// system that takes none).
pub fn bind_listening_with(
    path: &Path,
    link: impl FnOnce(&Path, &Path) -> std::io::Result<()>,
) -> std::io::Result<UnixListener> {
    let Some(name) = path.file_name() else {
        return UnixListener::bind(path);
    };
    let mut hidden = std::ffi::OsString::from(".");
    hidden.push(name);
    hidden.push(format!(".{}.binding", std::process::id()));
    let hidden = path.with_file_name(hidden);
    // Refused where it does not fit a socket address (or is taken).
    let Ok(listener) = UnixListener::bind(&hidden) else {
        return UnixListener::bind(path);
    };
    let linked = link(&hidden, path);
    let _ = std::fs::remove_file(&hidden);
    match linked {
        Ok(()) => Ok(listener),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(e),
        Err(_) => UnixListener::bind(path),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::path::PathBuf;

    use super::*;

    /// A fresh directory of this test's own.
    fn bind_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("minivmm-bind-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// The socket is at `path` and listening, and nothing else is left
    /// beside it: the hidden name it was bound at first is gone. A path
    /// whose hidden name would not fit a socket address, and a path taken
    /// in the meantime (the link refuses to replace it), are served and
    /// refused as by a plain bind.
    #[test]
    fn the_listener_appears_at_its_path_listening_and_alone() {
        use std::os::unix::fs::FileTypeExt;
        let dir = bind_dir("alone");
        let path = dir.join("api.sock");
        let listener = bind_listening(&path).unwrap();
        assert!(std::fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_socket());
        assert_eq!(names(&dir), ["api.sock"]);
        let _client = UnixStream::connect(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        assert!(
            listener.accept().is_ok(),
            "no connection came through the path"
        );

        // 107 bytes in all (`sun_path` less its NUL): the path fits, its
        // hidden name does not.
        let room = 107 - dir.as_os_str().len() - 1;
        let long = dir.join("l".repeat(room));
        let _long = bind_listening(&long).unwrap();
        let _client = UnixStream::connect(&long).unwrap();

        // A file system that takes no link: bound at the path itself.
        let unlinked = dir.join("nolink.sock");
        let _nolink = bind_listening_with(&unlinked, |_, _| {
            Err(std::io::Error::from_raw_os_error(libc::EPERM))
        })
        .unwrap();
        let _client = UnixStream::connect(&unlinked).unwrap();

        let taken = dir.join("taken.sock");
        std::fs::write(&taken, b"").unwrap();
        let e = bind_listening(&taken).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read(&taken).unwrap(), b"", "replaced");
        let mut left = names(&dir);
        left.retain(|n| n.starts_with('.'));
        assert!(left.is_empty(), "hidden names left: {left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
