//! Push-ahead: while a reader walks the catalog in storage order, the samples after the one it
//! reads are pushed into the kernel's page cache of their inodes (FUSE_NOTIFY_STORE through
//! the [`Store`] callback), so the reader's next opens and reads are answered by the kernel
//! with no round trip to the daemon. One thread does the pushing, fed through a short queue
//! that drops requests while it is busy.
//!
//! A sample is marked pushed only once stored, and a later READ of a marked sample means the
//! kernel dropped its copy (`drop_caches`, memory pressure): the marks are then forgotten so
//! pushing resumes.

use super::ReadAhead;
use crate::catalog::Transform;
use crate::ino::Bitset;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, OnceLock};

/// Callback that puts a file's whole content into the kernel's page cache for its inode.
pub type Store = Box<dyn Fn(u64, &[u8]) -> std::io::Result<()> + Send + Sync>;

/// Samples larger than this are not pushed (the kernel's own read-ahead does well on them),
/// bytes.
const MAX_PUSH_SAMPLE: u64 = 1 << 20;
/// Bytes pushed per run at most.
const PUSH_BYTES: u64 = 16 << 20;
/// Largest buffer the push thread keeps between runs, bytes.
const MAX_KEPT_BUF: usize = 1 << 20;

/// The push-ahead state of a mount.
#[derive(Debug)]
pub(super) struct Pusher {
    /// Records pushed into the kernel's cache since the last reset.
    pushed: Bitset,
    tx: OnceLock<SyncSender<u64>>,
}

impl Pusher {
    pub(super) fn new(records: u64) -> Pusher {
        Pusher {
            pushed: Bitset::new(records),
            tx: OnceLock::new(),
        }
    }

    pub(super) fn is_pushed(&self, record: u32) -> bool {
        self.pushed.contains(record)
    }

    /// Marks `record` as in the kernel's cache (pushed, or read in full by the kernel).
    pub(super) fn mark(&self, record: u32) {
        self.pushed.insert(record);
    }

    pub(super) fn reset(&self) {
        self.pushed.clear();
    }

    /// Asks the push thread to push the samples after inode `ino` (dropped when it is busy).
    pub(super) fn request(&self, ino: u64) {
        if let Some(tx) = self.tx.get() {
            let _ = tx.try_send(ino);
        }
    }
}

/// Starts the push thread of `ra`: up to `files` samples ahead of each request.
pub(super) fn start(ra: &Arc<ReadAhead>, files: usize, store: Store) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(64);
    let weak = Arc::downgrade(ra);
    let spawned = std::thread::Builder::new()
        .name("loosefs-push".into())
        .spawn(move || {
            let mut buf = Vec::new();
            for ino in rx {
                let Some(ra) = weak.upgrade() else { break };
                push_run(&ra, ino, files, &store, &mut buf);
                if buf.capacity() > MAX_KEPT_BUF {
                    buf = Vec::new();
                }
            }
        });
    match spawned {
        Ok(_) => {
            let _ = ra.push.tx.set(tx);
        }
        Err(e) => log::error!("cannot start the push-ahead thread: {e}"),
    }
}

/// Pushes up to `files` samples following `ino` in storage order (at most [`PUSH_BYTES`]).
fn push_run(ra: &ReadAhead, ino: u64, files: usize, store: &Store, buf: &mut Vec<u8>) {
    let catalog = ra.samples.catalog();
    let (mut cur, mut bytes) = (ino, 0u64);
    for _ in 0..files {
        let Some(next) = catalog.next_file(cur) else {
            return;
        };
        cur = next;
        let Ok(ext) = catalog.extent(next) else {
            continue;
        };
        // A sample in the kernel's cache is never READ by the reader: the stream moves past
        // it here, so the reader's next READ still continues the stream.
        if ra.push.is_pushed(ext.record) {
            ra.skip(&ext);
            continue;
        }
        if ext.transform != Transform::Identity || ext.len() > MAX_PUSH_SAMPLE {
            continue; // a decoded view's inode serves pixels, not these bytes
        }
        // A failed read was logged once by the checked read; nothing is pushed for it.
        if let Ok(data) = ra.samples.read_extent(&ext, 0, ext.len() as u32, buf) {
            if store(next, data).is_ok() {
                ra.push.mark(ext.record);
                ra.skip(&ext);
                ra.stats.pushed_samples.fetch_add(1, Relaxed);
                ra.stats.pushed_bytes.fetch_add(ext.len(), Relaxed);
            }
        }
        ra.release_served(&ext, 0..ext.len());
        bytes += ext.len();
        if bytes >= PUSH_BYTES {
            return;
        }
    }
}
