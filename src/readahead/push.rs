//! Push-ahead: while a reader walks the catalog in storage order, the samples after the one it
//! reads are pushed into the kernel's page cache of their inodes (FUSE_NOTIFY_STORE through
//! the [`Store`] callback), so the reader's next opens and reads are answered by the kernel
//! with no round trip to the daemon. One thread does the pushing, fed through a short queue
//! that drops requests while it is busy.
//!
//! A sample is marked pushed only once stored, and a later READ of a marked sample means the
//! kernel dropped its copy (`drop_caches`, memory pressure): the marks are then forgotten so
//! pushing resumes.
//!
//! Only samples whose stored bytes are cached are pushed, so pushing never adds device reads.
//! The stored pages of a pushed sample are released one run later, not at once: a reader that
//! opened the sample just before it was pushed still sends its READ, and had the pages been
//! released already, that READ would read the sample from the device a second time.

use super::ReadAhead;
use crate::catalog::Extent;
use crate::catalog::Transform;
use crate::ino::Bitset;
use std::collections::VecDeque;
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
    pushed: Arc<Bitset>,
    tx: OnceLock<SyncSender<Request>>,
}

/// What the push thread is asked.
enum Request {
    /// Push the samples after inode `.0` that end before storage offset `.1`.
    Push(u64, u64),
    /// Answer once every request sent before this one is done.
    Settle(SyncSender<()>),
}

impl Pusher {
    pub(super) fn new(records: u64) -> Pusher {
        Pusher {
            pushed: Arc::new(Bitset::new(records)),
            tx: OnceLock::new(),
        }
    }

    /// The records the kernel holds whole (shared with the announced orders, which need not
    /// read them).
    pub(super) fn held(&self) -> Arc<Bitset> {
        self.pushed.clone()
    }

    pub(super) fn is_pushed(&self, record: u32) -> bool {
        self.pushed.contains(record)
    }

    /// Marks `record` as in the kernel's cache (pushed, or read in full by the kernel).
    pub(super) fn mark(&self, record: u32) {
        self.pushed.insert(record);
    }

    /// The kernel no longer holds `record` (its inode was forgotten).
    pub(super) fn unmark(&self, record: u32) {
        self.pushed.remove(record);
    }

    pub(super) fn reset(&self) {
        self.pushed.clear();
    }

    /// Asks the push thread to push the samples after inode `ino` that end before storage
    /// offset `ahead` (what the reader's stream read ahead); dropped when the thread is busy.
    pub(super) fn request(&self, ino: u64, ahead: u64) {
        if let Some(tx) = self.tx.get() {
            let _ = tx.try_send(Request::Push(ino, ahead));
        }
    }

    /// Waits until the push thread has done every request made before this call (a
    /// completion signal for tests and benchmarks; returns at once without a push thread).
    pub(super) fn settle(&self) {
        if let Some(tx) = self.tx.get() {
            let (done, wait) = std::sync::mpsc::sync_channel(1);
            if tx.send(Request::Settle(done)).is_ok() {
                let _ = wait.recv();
            }
        }
    }
}

/// Starts the push thread of `ra`: up to `files` samples ahead of each request.
pub(super) fn start(ra: &Arc<ReadAhead>, files: usize, store: Store) {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Request>(64);
    let weak = Arc::downgrade(ra);
    let spawned = std::thread::Builder::new()
        .name("loosefs-push".into())
        .spawn(move || {
            let mut buf = Vec::new();
            // Samples pushed by the previous run, whose stored pages are still cached.
            let mut unreleased: VecDeque<Extent> = VecDeque::new();
            for req in rx {
                let (ino, ahead) = match req {
                    Request::Push(ino, ahead) => (ino, ahead),
                    Request::Settle(done) => {
                        let _ = done.send(());
                        continue;
                    }
                };
                let Some(ra) = weak.upgrade() else { break };
                let before = unreleased.len();
                push_run(&ra, ino, ahead, files, &store, &mut buf, &mut unreleased);
                for ext in unreleased.drain(..before) {
                    ra.release_served(&ext, 0..ext.len());
                }
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

/// Pushes up to `files` samples following `ino` in storage order (at most [`PUSH_BYTES`]),
/// stopping at the first that does not end before `ahead` in the same object. The samples read
/// are appended to `unreleased`.
fn push_run(
    ra: &ReadAhead,
    ino: u64,
    ahead: u64,
    files: usize,
    store: &Store,
    buf: &mut Vec<u8>,
    unreleased: &mut VecDeque<Extent>,
) {
    let catalog = ra.samples.catalog();
    let Ok(origin) = catalog.extent(ino).map(|e| e.object) else {
        return;
    };
    let (mut cur, mut bytes) = (ino, 0u64);
    for _ in 0..files {
        let Some(next) = catalog.next_file(cur) else {
            return;
        };
        cur = next;
        let Ok(ext) = catalog.extent(next) else {
            continue;
        };
        if ext.object != origin || ext.range.end > ahead {
            return; // past what the stream expects its reader to read
        }
        // A sample in the kernel's cache is never READ by the reader: the stream moves past
        // it here, so the reader's next READ still continues the stream.
        if ra.push.is_pushed(ext.record) {
            ra.skip(&ext);
            continue;
        }
        if ext.transform != Transform::Identity || ext.len() > MAX_PUSH_SAMPLE {
            continue; // a decoded view's inode serves pixels, not these bytes
        }
        // Pushing never reads the device: a sample not cached is still being read ahead (its
        // reader may well READ it before the read-ahead completes), or was just served and
        // released (a reader got there first). Either way reading it here could read it
        // twice; its reader READs it itself.
        if !ra.samples.storage().resident(ext.object, &ext.range) {
            continue;
        }
        // A failed read was logged once by the checked read; nothing is pushed for it.
        if let Ok(data) = ra.samples.read_extent(&ext, 0, ext.len() as u32, buf) {
            if store(next, data).is_ok() {
                ra.push.mark(ext.record);
                ra.skip(&ext);
                let (unread, _) = ra.order.first_read(&ext, false);
                ra.release_unread(&unread);
                ra.stats.pushed_samples.fetch_add(1, Relaxed);
                ra.stats.pushed_bytes.fetch_add(ext.len(), Relaxed);
            }
        }
        bytes += ext.len();
        unreleased.push_back(ext);
        if bytes >= PUSH_BYTES {
            return;
        }
    }
}
