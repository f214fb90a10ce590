//! Announced orders: what is written to `<mnt>/.loosefs/order` — the coming epoch's file paths,
//! one per line, in the order they will be read — becomes an order the read-ahead follows
//! ([`crate::readahead::order`]).
//!
//! The mount answers no OPEN (zero-message open), so an announcement is known by its writes
//! alone: a write at offset 0 starts a new order for the writing process (replacing its
//! previous one), and each later write must continue where the last one ended. Every complete
//! line is resolved and appended at once, so the order is in force when `write` returns; a last
//! line without its newline is never taken. A path is relative to the mount root, or absolute
//! under the mountpoint; a decoded view's path names its JPEG. Paths that name no file are
//! counted (`unresolved_paths`) and the first of each order is logged. Everything else that
//! would change the mount answers EROFS.

use super::{Entry, Fs};
use crate::catalog::FsError;
use crate::ino::{Node, ROOT_INO};
use crate::stats::Op;
use std::sync::Mutex;
use std::time::Instant;

/// Announcements being written at once, at most (the oldest is forgotten).
const MAX_PENDING: usize = 64;
/// Longest line taken, bytes (`PATH_MAX`).
const MAX_LINE: usize = 4096;
/// Records resolved before they are handed to the order in one go.
const BATCH: usize = 4096;
/// Lines an announcement may hold per sample of the mount (a sampler with replacement repeats
/// samples; an epoch order holds each once): beyond it the write is refused, so an order's
/// memory is bounded by the mount's size whoever writes it (~4.5 bytes a line).
const LINES_PER_SAMPLE: u64 = 2;
/// Bytes of an unresolved path shown in the log, at most.
const LOGGED_PATH: usize = 256;

/// An announcement being written.
#[derive(Debug)]
struct Pending {
    pid: u32,
    /// The order it fills.
    id: u32,
    /// Offset the next write must start at.
    next: u64,
    /// The last line's bytes so far.
    partial: Vec<u8>,
    /// Whether an unresolved path was logged for it.
    logged: bool,
    /// Lines taken so far (resolved or not).
    lines: u64,
}

/// Announcements in progress, by writing process.
#[derive(Debug, Default)]
pub(super) struct Announcing {
    pending: Mutex<Vec<Pending>>,
}

impl Fs {
    /// Writes `data` at `offset` of `ino` for process `pid`: the `order` control file takes an
    /// announcement; every other inode answers [`FsError::ReadOnly`]. Returns the bytes taken.
    /// Errors: [`FsError::Invalid`] for a write away from the announcement's end or a line
    /// over 4096 bytes.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8], pid: u32) -> Result<u32, FsError> {
        let t0 = Instant::now();
        let r = match Node::of(ino) {
            Some(n) if self.control.is_order(n) => self.announce(offset, data, pid),
            _ => Err(FsError::ReadOnly),
        };
        self.stats.done(Op::Write, t0);
        r
    }

    /// Sets attributes of `ino`: only the `order` control file may be truncated to 0 (opening
    /// it with `O_TRUNC`) or have its times set; everything else answers
    /// [`FsError::ReadOnly`].
    pub fn setattr(&self, ino: u64, size: Option<u64>) -> Result<Entry, FsError> {
        let t0 = Instant::now();
        let r = match Node::of(ino) {
            Some(n) if self.control.is_order(n) && size.unwrap_or(0) == 0 => {
                self.control.getattr(n).map(|mut e| {
                    e.attr.size = 0;
                    e
                })
            }
            _ => Err(FsError::ReadOnly),
        };
        self.stats.done(Op::Write, t0);
        r
    }

    /// Counts a change refused (mkdir, unlink, rename, ...) and returns why:
    /// [`FsError::ReadOnly`].
    pub fn refuse(&self) -> FsError {
        self.stats.done(Op::Write, Instant::now());
        FsError::ReadOnly
    }

    fn announce(&self, offset: u64, data: &[u8], pid: u32) -> Result<u32, FsError> {
        let mut pending = self.announcing.pending.lock().map_err(|_| {
            FsError::Internal("the announcement table was poisoned by a panic".into())
        })?;
        let k = match pending.iter().position(|p| p.pid == pid) {
            _ if offset == 0 => {
                pending.retain(|p| p.pid != pid);
                if pending.len() >= MAX_PENDING {
                    pending.remove(0);
                }
                let id = self.data.readahead.announce(pid);
                pending.push(Pending {
                    pid,
                    id,
                    next: 0,
                    partial: Vec::new(),
                    logged: false,
                    lines: 0,
                });
                pending.len() - 1
            }
            Some(k) if pending[k].next == offset => k,
            _ => {
                return Err(FsError::Invalid(format!(
                    "a write to .loosefs/order at byte {offset} does not continue an \
                     announcement (write the whole order from byte 0)"
                )));
            }
        };
        let p = &mut pending[k];
        p.next = offset + data.len() as u64;
        let cap = LINES_PER_SAMPLE * self.catalog.files().max(1);
        let order = &self.data.readahead.order;
        let (mut records, mut unresolved) = (Vec::new(), 0u64);
        let mut rest = data;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            p.partial.extend_from_slice(&rest[..nl]);
            rest = &rest[nl + 1..];
            let line = std::mem::take(&mut p.partial);
            p.lines += 1;
            if p.lines > cap {
                self.data.readahead.extend_order(p.id, &records);
                order.unresolved(unresolved);
                // The rest of this announcement is refused; what came before stays in force.
                p.next = u64::MAX;
                let why = format!(
                    "an announced order holds at most {cap} lines ({LINES_PER_SAMPLE} per \
                     sample of the mount); the rest of process {pid}'s order is refused (EINVAL)"
                );
                log::warn!("{why}");
                return Err(FsError::Invalid(why));
            }
            match self.resolve(&line) {
                Some(r) => records.push(r),
                None if line.iter().all(u8::is_ascii_whitespace) => {}
                None => {
                    unresolved += 1;
                    if !std::mem::replace(&mut p.logged, true) {
                        let shown = &line[..line.len().min(LOGGED_PATH)];
                        log::warn!(
                            "announced order: {:?}{} names no file of the mount; it is not \
                             read ahead (stats count such paths as unresolved_paths)",
                            String::from_utf8_lossy(shown),
                            if shown.len() < line.len() { "..." } else { "" }
                        );
                    }
                }
            }
            if records.len() >= BATCH {
                self.data.readahead.extend_order(p.id, &records);
                records.clear();
            }
        }
        p.partial.extend_from_slice(rest);
        let too_long = p.partial.len() > MAX_LINE;
        self.data.readahead.extend_order(p.id, &records);
        order.unresolved(unresolved);
        if too_long {
            p.partial.clear();
            return Err(FsError::Invalid(format!(
                "a line of .loosefs/order is longer than {MAX_LINE} bytes"
            )));
        }
        Ok(data.len() as u32)
    }

    /// The catalog record whose stored bytes file `line` reads (a view's JPEG), if it names a
    /// file: relative to the mount root, or absolute under the mountpoint.
    fn resolve(&self, line: &[u8]) -> Option<u32> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let mnt = self.opts.mountpoint.as_bytes();
        let rel = match line.strip_prefix(mnt) {
            Some(r) if line.first() == Some(&b'/') && r.first() == Some(&b'/') => r,
            _ if line.first() == Some(&b'/') => return None,
            _ => line,
        };
        let mut ino = ROOT_INO;
        for name in rel.split(|&b| b == b'/') {
            if name.is_empty() || name == b"." {
                continue;
            }
            ino = self.catalog.lookup(ino, name).ok()?.ino;
        }
        self.catalog.extent(ino).ok().map(|e| e.record)
    }
}
