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
//! A reader following an announced order (`order.rs`) is pushed the same way along that
//! order: at a READ of a sample of the order, the samples after it that the order read ahead
//! (up to [`ORDER_PUSH_BYTES`] of the order past it) are pushed, starting [`ORDER_LEAD`] positions on, so the push
//! thread starts ahead of a reader already on its way to the next sample.
//!
//! Only samples whose stored bytes are cached are pushed, so pushing never adds device reads.
//! The stored pages of a pushed sample are released one run later, not at once: a reader that
//! opened the sample just before it was pushed still sends its READ, and had the pages been
//! released already, that READ would read the sample from the device a second time.

use super::ReadAhead;
use crate::catalog::Extent;
use crate::catalog::Transform;
use crate::ino::{Bitset, record_ino};
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
/// Positions after a reader's sample of an announced order that the push along it leaves to
/// the reader: it reads those itself (READs) while the push thread gets ahead of it.
const ORDER_LEAD: usize = 8;
/// Positions of an announced order a push run leaves to a reader that overtook it (a sample
/// unserved when the run began, read since): the reader READs them itself, served by the ring
/// threads in parallel with the run, which goes on past them instead of pushing each sample as
/// the reader asks for it. 1 reader, 30k set, cold shuffled with the order announced, ÷
/// 4-thread `pread` in the same round: 0.78–0.86× without leaving any, 0.87–1.00× leaving 8,
/// 0.99–1.30× leaving 96 (`docs/DESIGN.md`, "Push-ahead along an order").
const OVERTAKEN_LEAVE: usize = 96;
/// Samples pushed along an announced order per request at most.
const ORDER_PUSH_FILES: usize = 4096;
/// Bytes of an announced order past the reader's last READ that push-ahead pushes at most:
/// the kernel's cache holds at most this much pushed ahead of the reader (its next READ, at
/// the end of what was pushed, asks for the next run).
const ORDER_PUSH_BYTES: u64 = 256 << 20;

/// The push-ahead state of a mount.
#[derive(Debug)]
pub(super) struct Pusher {
    /// Records pushed into the kernel's cache since the last reset.
    pushed: Arc<Bitset>,
    /// Records whose inodes the kernel holds (sent in a LOOKUP or READDIRPLUS answer, not
    /// forgotten since): only those can be pushed, the kernel refusing a store to any other.
    known: Bitset,
    tx: OnceLock<SyncSender<Request>>,
}

/// What the push thread is asked.
enum Request {
    /// Push the samples after inode `.0` that end before storage offset `.1`.
    Push(u64, u64),
    /// Push the samples of the announced order after record `.0`.
    Order(u32),
    /// Answer once every request sent before this one is done.
    Settle(SyncSender<()>),
}

impl Pusher {
    pub(super) fn new(records: u64) -> Pusher {
        Pusher {
            pushed: Arc::new(Bitset::new(records)),
            known: Bitset::new(records),
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

    /// The kernel was sent `record`'s inode.
    pub(super) fn looked_up(&self, record: u32) {
        self.known.insert(record);
    }

    /// The kernel forgot `record`'s inode.
    pub(super) fn forget(&self, record: u32) {
        self.known.remove(record);
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

    /// Asks the push thread to push the samples that follow record `record` in its announced
    /// order and were read ahead already; dropped when the thread is busy.
    pub(super) fn request_order(&self, record: u32) {
        if let Some(tx) = self.tx.get() {
            let _ = tx.try_send(Request::Order(record));
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
                if let Request::Settle(done) = req {
                    let _ = done.send(());
                    continue;
                }
                let Some(ra) = weak.upgrade() else { break };
                let before = unreleased.len();
                let mut run = Run {
                    ra: &ra,
                    store: &store,
                    buf: &mut buf,
                    unreleased: &mut unreleased,
                };
                match req {
                    Request::Push(ino, ahead) => run.stream(ino, ahead, files),
                    Request::Order(record) => run.order(record),
                    Request::Settle(_) => {}
                }
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

/// One push run: the push thread's state while it answers a request.
struct Run<'a> {
    ra: &'a ReadAhead,
    store: &'a Store,
    buf: &'a mut Vec<u8>,
    /// Samples read by this run and earlier ones, whose stored pages are released later.
    unreleased: &'a mut VecDeque<Extent>,
}

impl Run<'_> {
    /// Pushes up to `files` samples following `ino` in storage order (at most
    /// [`PUSH_BYTES`]), stopping at the first that does not end before `ahead` in the same
    /// object.
    fn stream(&mut self, ino: u64, ahead: u64, files: usize) {
        let ra = self.ra;
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
            // A sample in the kernel's cache is never READ by the reader: the stream moves
            // past it here, so the reader's next READ still continues the stream.
            if ra.push.is_pushed(ext.record) {
                ra.skip(&ext);
                continue;
            }
            bytes += self.push(next, ext);
            if bytes >= PUSH_BYTES {
                return;
            }
        }
    }

    /// Pushes the samples of the announced order after record `record` that its read-ahead
    /// brought in, from [`ORDER_LEAD`] positions on, up to [`ORDER_PUSH_BYTES`] of the order
    /// past `record`. Where the reader overtakes the run (a sample unserved when the run
    /// began has been read since), the run leaves it the next [`OVERTAKEN_LEAVE`] positions
    /// and goes on past them, rather than pushing each sample just as the reader asks for it.
    fn order(&mut self, record: u32) {
        let ra = self.ra;
        let catalog = ra.samples.catalog();
        let mut bytes = 0u64;
        // Positions still to leave to a reader that overtook this run.
        let mut leave = 0usize;
        for (r, served) in ra.order.ahead(record, ORDER_LEAD, ORDER_PUSH_FILES) {
            let ino = record_ino(r);
            let Ok(ext) = catalog.extent(ino) else {
                continue;
            };
            // Every sample counts, pushed now or before: the kernel holds at most
            // ORDER_PUSH_BYTES pushed past the READ that asked.
            bytes += ext.len();
            if bytes > ORDER_PUSH_BYTES {
                return;
            }
            if served {
                continue;
            }
            if ra.push.is_pushed(ext.record) {
                leave = OVERTAKEN_LEAVE; // read since the run began: the reader is here
            } else if leave > 0 {
                leave -= 1;
            } else {
                self.push(ino, ext);
            }
        }
    }

    /// Pushes sample `ext` (inode `ino`) when it is a stored sample small enough and its
    /// stored bytes are cached; returns the bytes read for it (0 when skipped).
    fn push(&mut self, ino: u64, ext: Extent) -> u64 {
        let ra = self.ra;
        if ext.transform != Transform::Identity || ext.len() > MAX_PUSH_SAMPLE {
            return 0; // a decoded view's inode serves pixels, not these bytes
        }
        // Pushing never reads the device: a sample not cached is still being read ahead (its
        // reader may well READ it before the read-ahead completes), or was just served and
        // released (a reader got there first). Either way reading it here could read it
        // twice; its reader READs it itself.
        if !ra.samples.storage().resident(ext.object, &ext.range) {
            return 0;
        }
        // The kernel would refuse it (no such inode yet): not read at all.
        if !ra.push.known.contains(ext.record) {
            return 0;
        }
        // A failed read was logged once by the checked read; nothing is pushed for it.
        let Ok(data) = ra.samples.read_extent(&ext, 0, ext.len() as u32, self.buf) else {
            return 0;
        };
        // A store the kernel refused leaves the sample to its reader's READ, from the stored
        // pages read ahead for it: they must stay until then, so only a sample the kernel took
        // is released later (releasing the others read each such sample from the device
        // twice: 1.8x the bytes served on a cold pass, before this was checked).
        if let Err(e) = (self.store)(ino, data) {
            if e.kind() == std::io::ErrorKind::NotFound {
                ra.push.forget(ext.record); // forgotten, its FORGET not seen yet
            }
            return 0;
        }
        ra.push.mark(ext.record);
        ra.skip(&ext);
        let (unread, _) = ra.order.first_read(&ext, false);
        ra.release_unread(&unread);
        ra.stats.pushed_samples.fetch_add(1, Relaxed);
        ra.stats.pushed_bytes.fetch_add(ext.len(), Relaxed);
        let n = ext.len();
        self.unreleased.push_back(ext);
        n
    }
}
