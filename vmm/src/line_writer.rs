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
//! dropped and counted. Lines are never interleaved or cut while minivmm
//! runs.
//!
//! Nor does the exit wait ([`NonBlockingLineWriter::finish`]): the last line
//! goes out behind what is pending if the pipe takes it now, and whatever the
//! pipe does not take is counted as dropped. (Waiting for a reader would
//! stall a stop request on a stalled reader, and sleeping is not even allowed
//! on the thread that exits.) A line the pipe took only the start of stays
//! cut: a reader sees it without its newline at the end of the stream.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

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

    /// At exit, never waiting: queues `last` as [`write_line`] does, writes
    /// what the file takes now, and counts every line it did not take as
    /// dropped (the rest of one it took only the start of included).
    /// Returns how many lines that was: those pending and, if it did not go
    /// out, `last`.
    ///
    /// [`write_line`]: Self::write_line
    pub fn finish(&mut self, last: &[u8]) -> u64 {
        let before = self.dropped_lines;
        self.write_line(last);
        let stuck = self.pending.iter().filter(|&&b| b == b'\n').count() as u64;
        // A line without its newline is one too (the caller's last line
        // should end in one; a log record always does).
        let unterminated = u64::from(self.pending.last().is_some_and(|&b| b != b'\n'));
        self.dropped_lines += stuck + unterminated;
        self.pending.clear();
        self.dropped_lines - before
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
    use std::time::{Duration, Instant};

    /// Keeps handing pending lines to a reader (a test's thread) until none
    /// is left or 10 s passed.
    fn drain(s: &mut NonBlockingLineWriter) {
        let end = Instant::now() + Duration::from_secs(10);
        while s.push().is_err() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

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
        drain(&mut s);
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
        drain(&mut s);
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
    fn finish_writes_the_last_line_where_there_is_room() {
        let p = tmp("finish-file");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        s.write_line(b"one\n");
        assert_eq!(s.finish(b"last\n"), 0);
        assert_eq!(s.dropped_lines(), 0);
        assert_eq!(s.pending_bytes(), 0);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "one\nlast\n");
        std::fs::remove_file(&p).unwrap();

        // A FIFO with room: the reader gets the last line too.
        let p = fifo("finish-room");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        let lines = numbered(3, 100);
        s.write_line(&lines[0]);
        s.write_line(&lines[1]);
        assert_eq!(s.finish(&lines[2]), 0);
        // Opened while minivmm's end is open (so the open does not wait),
        // read to the end once it is closed.
        let mut reader = File::open(&p).unwrap();
        drop(s);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        assert_eq!(got, lines.concat());
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn finish_on_a_full_fifo_counts_what_the_reader_never_gets() {
        // No reader takes anything: the pipe fills, 40 lines wait behind
        // it, and the last line cannot go either.
        let p = fifo("finish-full");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        let lines = numbered(201, 1000);
        for l in &lines[..200] {
            s.write_line(l);
        }
        assert_eq!(s.dropped_lines(), 0);
        let pending = s.pending_bytes();
        assert!(pending > 0, "the pipe took everything");
        // Lines of 1000 bytes in pages of 4096: the pipe took one of them
        // in part, whose rest is among the pending bytes.
        let waiting = pending.div_ceil(1000) as u64;
        let lost = s.finish(&lines[200]);
        assert_eq!(lost, waiting + 1, "{pending} bytes were pending");
        assert_eq!(s.dropped_lines(), lost);
        assert_eq!(s.pending_bytes(), 0);
        // The reader gets exactly what the pipe held: the first lines whole,
        // then the start of the one it took in part.
        let mut reader = File::open(&p).unwrap();
        drop(s);
        let mut got = Vec::new();
        reader.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 200 * 1000 - pending);
        assert_eq!(got[..], lines.concat()[..got.len()]);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn finish_returns_the_lines_lost_at_exit_beside_those_dropped_before() {
        // No reader: the pipe and the 1 MiB buffer fill and lines drop.
        let p = fifo("finish-after-drops");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        let lines = numbered(1500, 1000);
        for l in &lines[..1499] {
            s.write_line(l);
        }
        let dropped_before = s.dropped_lines();
        assert!(dropped_before > 0);
        let waiting = s.pending_bytes().div_ceil(1000) as u64;
        // The last line does not fit the buffer either: dropped whole, once.
        let lost = s.finish(&lines[1499]);
        assert_eq!(lost, waiting + 1);
        assert_eq!(s.dropped_lines(), dropped_before + lost);
        std::fs::remove_file(&p).unwrap();
    }

    #[test]
    fn finish_counts_a_last_line_without_newline_once() {
        let p = fifo("finish-unterminated");
        let mut s = NonBlockingLineWriter::open(&p).unwrap();
        // Fill the pipe with page-sized lines until one waits.
        let mut line = vec![b'z'; 4095];
        line.push(b'\n');
        while s.pending_bytes() == 0 {
            s.write_line(&line);
        }
        assert_eq!(s.pending_bytes(), 4096);
        assert_eq!(s.finish(b"no newline"), 2);
        assert_eq!(s.dropped_lines(), 2);
        std::fs::remove_file(&p).unwrap();
    }
}
