// SPDX-License-Identifier: Apache-2.0
//! A writer of whole lines that never blocks, for the log and the metrics:
//! a regular file or a FIFO.
//!
//! Operators collect Firecracker's logs and metrics through named pipes, so
//! the path may be a FIFO. It is opened once, read-write and non-blocking (a
//! FIFO opened that way needs no reader yet, and the open never blocks) and
//! kept for the life of the process: never replaced by a file. A regular file
//! is opened for appending (created if missing).
//!
//! Writing must never stall the VMM because a reader is slow or absent: a
//! line the pipe cannot take now waits in a bounded buffer and goes out with
//! the next write, ahead of it; whole lines that do not fit the buffer are
//! dropped and counted. Lines are never interleaved or cut.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

/// Bytes waiting for a slow reader before whole lines are dropped.
const MAX_PENDING: usize = 1 << 20;

/// A file or FIFO taking whole lines without ever blocking the caller.
#[derive(Debug)]
pub struct NonBlockingLineWriter {
    file: File,
    pending: Vec<u8>,
    dropped_lines: u64,
}

impl NonBlockingLineWriter {
    /// Opens `path`: a FIFO as it is, anything else as a file to append to.
    pub fn open(path: &Path) -> io::Result<NonBlockingLineWriter> {
        let is_fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
        let file = if is_fifo {
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(path)?
        } else {
            OpenOptions::new()
                .append(true)
                .create(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)?
        };
        Ok(NonBlockingLineWriter {
            file,
            pending: Vec::new(),
            dropped_lines: 0,
        })
    }

    /// Queues `line` (which should end in '\n') and writes as much as the
    /// file takes without blocking.
    pub fn write_line(&mut self, line: &[u8]) {
        if self.pending.len() + line.len() > MAX_PENDING {
            self.dropped_lines += 1;
        } else {
            self.pending.extend_from_slice(line);
        }
        // An error other than EAGAIN (EPIPE, EIO) keeps the lines pending;
        // nothing better can be done with them, and the cap bounds memory.
        let _ = self.push();
    }

    /// Writes pending bytes until done or the file would block.
    fn push(&mut self) -> io::Result<()> {
        while !self.pending.is_empty() {
            match self.file.write(&self.pending) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// At exit: keeps trying to hand pending lines to a slow reader for up
    /// to `timeout`.
    pub fn drain(&mut self, timeout: Duration) {
        let end = Instant::now() + timeout;
        while self.push().is_err() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whole lines dropped because a reader did not keep up.
    pub fn dropped_lines(&self) -> u64 {
        self.dropped_lines
    }

    /// Bytes still waiting for the reader.
    pub fn pending_bytes(&self) -> usize {
        self.pending.len()
    }
}

/// The logger writes through this: every formatted record is one line.
impl Write for NonBlockingLineWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_line(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::process::Command;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("minivmm-line-writer-{}-{name}", std::process::id()))
    }

    #[test]
    fn a_file_is_appended_to() {
        let p = tmp("file");
        std::fs::write(&p, "earlier\n").unwrap();
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        s.write_line(b"one\n");
        s.write_line(b"two\n");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "earlier\none\ntwo\n");
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn a_fifo_stays_a_fifo_and_never_blocks() {
        let p = tmp("fifo");
        let _ = std::fs::remove_file(&p);
        let st = Command::new("mkfifo").arg(&p).status().unwrap();
        assert!(st.success());
        // No reader yet: the open does not block.
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        let line = vec![b'x'; 1000];
        let mut line = line;
        line.push(b'\n');
        // Far more than the pipe holds: the writer neither blocks nor errs,
        // lines wait (bounded) and the surplus is counted.
        for _ in 0..2000 {
            s.write_line(&line);
        }
        assert!(s.pending_bytes() > 0);
        assert!(s.pending_bytes() <= MAX_PENDING);
        assert!(s.dropped_lines() > 0);
        // A reader gets whole lines, in order.
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = reader.read(&mut buf).unwrap();
        assert!(n > 0);
        assert!(buf[..n].iter().all(|&b| b == b'x' || b == b'\n'));
        assert!(std::fs::metadata(&p).unwrap().file_type().is_fifo());
        std::fs::remove_file(&p).unwrap();
    }

    /// `n` numbered lines of `len` bytes each (newline included).
    fn numbered(n: usize, len: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let mut l = format!("line {i:06} ").into_bytes();
                l.resize(len - 1, b'.');
                l.push(b'\n');
                l
            })
            .collect()
    }

    fn fifo(name: &str) -> std::path::PathBuf {
        let p = tmp(name);
        let _ = std::fs::remove_file(&p);
        assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
        p
    }

    /// Everything a reader of `p` gets until the writer is dropped.
    fn read_all(p: &Path) -> Vec<u8> {
        let mut reader = File::open(p).unwrap();
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        got
    }

    #[test]
    fn a_partial_write_keeps_the_rest_of_the_line_for_later() {
        // Lines of 10,000 bytes take three pipe pages each: the sixth finds
        // one page of the sixteen free, and the pipe takes only its start.
        // The rest must go out ahead of the next line.
        let p = fifo("partial");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        let lines = numbered(20, 10_000);
        for l in &lines[..10] {
            s.write_line(l);
        }
        let pending = s.pending_bytes();
        assert!(pending > 0, "the pipe took everything");
        assert_ne!(pending % 10_000, 0, "the pipe took whole lines only");
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || read_all(&p))
        };
        for l in &lines[10..] {
            s.write_line(l);
        }
        s.drain(Duration::from_secs(10));
        assert_eq!(s.pending_bytes(), 0);
        assert_eq!(s.dropped_lines(), 0);
        drop(s);
        assert_eq!(reader.join().unwrap(), lines.concat());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn dropped_lines_are_counted_in_lines_and_never_cut() {
        // No reader: the pipe and the pending buffer fill, the rest is
        // dropped whole.
        let p = fifo("dropped");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        let lines = numbered(1500, 1000);
        for l in &lines {
            s.write_line(l);
        }
        let dropped = s.dropped_lines();
        assert!(dropped > 0);
        let reader = {
            let p = p.clone();
            std::thread::spawn(move || read_all(&p))
        };
        s.drain(Duration::from_secs(10));
        drop(s);
        let got = reader.join().unwrap();
        // Whole lines, in order, the first ones; the rest counted.
        assert_eq!(got.len() % 1000, 0);
        let received = got.len() / 1000;
        assert_eq!(got, lines[..received].concat());
        assert_eq!(received as u64 + dropped, 1500);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn the_pending_buffer_fills_to_its_bound_exactly() {
        // Page-sized lines: whatever the pipe takes, the buffer behind it
        // holds exactly MAX_PENDING bytes of them before the first drop.
        let p = fifo("bound");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        let mut line = vec![b'y'; 4095];
        line.push(b'\n');
        let mut written = 0;
        while s.dropped_lines() == 0 {
            s.write_line(&line);
            written += 1;
            assert!(written < 10_000, "nothing dropped");
        }
        assert_eq!(s.pending_bytes(), MAX_PENDING);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn drain_returns_as_soon_as_nothing_is_pending() {
        let p = tmp("drain");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        s.write_line(b"one\n");
        let t = Instant::now();
        s.drain(Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\n");
        std::fs::remove_file(&p).unwrap();
    }
}
