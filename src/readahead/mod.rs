//! Read-ahead: everything the read path does to have stored bytes in memory before a reader
//! asks for them, and to drop them once served.
//!
//! The kernel reads ahead within one file; it cannot know that file k+1 follows file k in the
//! pack, and a loader opens a fresh file for every sample. [`ReadAhead`] sees every READ of
//! stored bytes with its [`Extent`] and works in *storage order*:
//!
//! - **Residency** ([`ReadAhead::before_read`]): a READ whose bytes are not all cached counts a
//!   page-cache miss and asks the storage for the rest of the sample in one request
//!   (`will_need`) instead of page-by-page faults.
//! - **Streams** ([`stream`]): the first READ of each sample (offset 0) is fed to a stream
//!   detector over storage offsets. A read that continues a stream reads ahead as far as the
//!   runs readers have made so far say it will be served (up to `--prefetch-max-mb`); a
//!   background thread asks the storage for it (`will_need`), so FUSE threads never block
//!   submitting read-ahead I/O. The decoder asks the same detector whether a view read
//!   continues a stream ([`ReadAhead::walk`]) to decide when to decode ahead.
//! - **Ledger** ([`ledger`]): bytes read ahead are marked until served, so no byte is asked for
//!   twice before it is served, and the stats say what read-ahead earned (bytes read ahead and
//!   served, against bytes read ahead).
//! - **Push-ahead** ([`push`]): a READ that hits an established stream asks the push thread to
//!   put the next samples, up to what the stream has read ahead, into the kernel's page cache of
//!   their inodes, so the reader's next files need no round trip at all.
//! - **Release** ([`ReadAhead::after_read`]): the stored pages of what a READ served are
//!   dropped (unless pinned, warming or `--keep-pack-cache`): the kernel now holds those bytes
//!   in the mount's own page cache, and keeping both would cache every sample twice. Each READ
//!   drops only what it served, since the kernel sends the READs of one file concurrently.
//! - **Pin** ([`pin`]) keeps a prefix locked in memory; **warm** ([`warm`]) streams the
//!   sample data in with several reads in flight.
//!
//! `docs/DESIGN.md` has the measurements behind each knob.

pub mod ledger;
pub mod order;
pub mod pin;
pub mod push;
mod report;
pub mod stream;
pub mod warm;

use crate::catalog::{Extent, ObjectId};
use crate::ino::record_ino;
use crate::samples::Samples;
use ledger::Ledger;
use order::Orders;
use pin::Pinner;
use push::{Pusher, Store};
use std::ops::Range;

/// The page size the kernel drops page-cache pages by, bytes.
const PAGE: u64 = 4096;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::SyncSender;
use stream::{Advice, Streams};
use warm::Warmer;

/// Read-ahead settings (`loosefs mount` options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAheadOptions {
    /// Largest read-ahead window in storage order, bytes (0 disables read-ahead).
    pub window_max: u64,
    /// Samples pushed ahead of an in-order reader (0 disables push-ahead).
    pub push_ahead: usize,
    /// Keep stored pages cached after serving them.
    pub keep_cache: bool,
    /// Bytes of the first object to pin from its start; `Some(u64::MAX)` for all.
    pub pin: Option<u64>,
    /// Bytes read ahead along an announced order and not yet served, at most (0: announced
    /// orders are counted but not read ahead).
    pub order_window: u64,
}

/// Read-ahead counters.
#[derive(Debug, Default)]
pub struct ReadAheadStats {
    /// READs whose stored bytes were all resident when served.
    pub page_cache_hits: AtomicU64,
    /// READs that had to wait for at least one page from the device.
    pub page_cache_misses: AtomicU64,
    /// Read-ahead requests issued (ranges sent to the storage).
    pub prefetch_requests: AtomicU64,
    /// READs that fell inside a range already read ahead by their stream.
    pub prefetch_hits: AtomicU64,
    /// Samples pushed into the kernel's page cache.
    pub pushed_samples: AtomicU64,
    /// Bytes pushed.
    pub pushed_bytes: AtomicU64,
    /// Times a pushed sample was READ (the kernel dropped it) and pushing restarted.
    pub push_resets: AtomicU64,
    /// Samples whose stored pages were dropped after being served in full.
    pub samples_evicted: AtomicU64,
}

/// The read-ahead of one mount.
pub struct ReadAhead {
    samples: Arc<Samples>,
    /// One detector per storage object.
    streams: Vec<Streams>,
    /// One ledger per storage object.
    ledgers: Arc<Vec<Ledger>>,
    prefetch: SyncSender<Prefetch>,
    push: Pusher,
    pin: Arc<Pinner>,
    /// Where each object starts in the pinned sequence (objects one after the other), bytes.
    bases: Vec<u64>,
    warm: Arc<Warmer>,
    /// Announced epoch orders.
    pub order: Orders,
    opts: ReadAheadOptions,
    /// Counters.
    pub stats: ReadAheadStats,
}

impl ReadAhead {
    /// Read-ahead over `samples`; starts the read-ahead thread, and the pin when asked (the
    /// caller has checked the pin budget).
    pub fn new(samples: Arc<Samples>, opts: ReadAheadOptions) -> ReadAhead {
        let objects = samples.catalog().objects();
        let streams = objects
            .iter()
            .map(|o| Streams::new(o.data_end, opts.window_max))
            .collect();
        let ledgers: Arc<Vec<Ledger>> =
            Arc::new(objects.iter().map(|o| Ledger::new(o.len)).collect());
        let mut bases = Vec::with_capacity(objects.len());
        let mut next = 0;
        for o in objects {
            bases.push(next);
            next += o.len;
        }
        let push = Pusher::new(samples.catalog().records());
        let ra = ReadAhead {
            prefetch: start_prefetch_thread(samples.clone(), ledgers.clone()),
            order: Orders::new(
                samples.clone(),
                ledgers.clone(),
                opts.order_window,
                push.held(),
            ),
            ledgers,
            push,
            streams,
            pin: Arc::default(),
            warm: Arc::default(),
            bases,
            opts,
            stats: ReadAheadStats::default(),
            samples,
        };
        if let Some(bytes) = opts.pin {
            let objs = (0..ra.bases.len() as ObjectId).collect();
            ra.pin.start(ra.samples.storage().clone(), objs, bytes);
        }
        ra
    }

    /// Starts pushing samples ahead of in-order readers through `store` (no-op when disabled).
    pub fn start_push(self: &Arc<Self>, store: Store) {
        if self.opts.push_ahead > 0 {
            push::start(self, self.opts.push_ahead, store);
        }
    }

    /// Waits until the push thread has done every push asked before this call.
    pub fn settle_push(&self) {
        self.push.settle();
    }

    /// Before serving `[offset, offset+size)` of the stored bytes of `ext`: residency
    /// accounting and `will_need`, and for a sample's first READ (offset 0, counted as a read of
    /// the whole sample) the stream walk and push-ahead.
    pub fn before_read(&self, ext: &Extent, offset: u64, size: u32) {
        if offset == 0 && self.push.is_pushed(ext.record) {
            // The kernel asked for a sample it was given: its copy was dropped (drop_caches,
            // memory pressure). Forget what was pushed so pushing resumes.
            self.push.reset();
            self.stats.push_resets.fetch_add(1, Relaxed);
        }
        let s = ext.range.start + offset.min(ext.len());
        let e = s.saturating_add(u64::from(size)).min(ext.range.end);
        if s >= e {
            return;
        }
        let storage = self.samples.storage();
        if storage.resident(ext.object, &(s..e)) {
            self.stats.page_cache_hits.fetch_add(1, Relaxed);
        } else {
            self.stats.page_cache_misses.fetch_add(1, Relaxed);
            self.ask_missing(ext, s);
        }
        if offset == 0 {
            let a = self.walk(ext);
            if a.hit {
                self.push.request(record_ino(ext.record), a.ahead);
            } else if a.followed {
                self.push.request_order(ext.record);
            }
        }
    }

    /// After serving bytes `served` (offsets within the sample) of `ext`: a sample read to its
    /// end is in the kernel's cache now (nothing to push), and the served pages are released.
    pub fn after_read(&self, ext: &Extent, served: Range<u64>) {
        if served.end >= ext.len() {
            self.push.mark(ext.record);
        }
        self.release_served(ext, served);
    }

    /// A file whose reads the kernel serves itself from the original (FUSE passthrough) was
    /// opened: counted as a whole-sample read for the stream detector, which reads ahead the
    /// files after it, and marked served in the ledger (no READ will come to mark it). Its
    /// pages are the original file's own: nothing is released.
    pub fn opened(&self, ext: &Extent) {
        self.walk(ext);
        if let Some(l) = self.ledgers.get(ext.object as usize) {
            l.serve(&ext.range);
        }
    }

    /// Feeds a whole-sample read of `ext` to its object's stream detector and issues the
    /// read-ahead it advises.
    pub fn walk(&self, ext: &Extent) -> Advice {
        let (unread, followed) = self.order.first_read(ext, true);
        self.release_unread(&unread);
        let Some(streams) = self.streams.get(ext.object as usize) else {
            return Advice {
                followed,
                ..Advice::default()
            };
        };
        let catalog = self.samples.catalog();
        let mut sample_end = |k: u64, cap: u64| {
            let (mut ino, mut end) = (record_ino(ext.record), ext.range.end);
            for _ in 0..k {
                let Some(next) = catalog.next_file(ino) else {
                    break;
                };
                ino = next;
                match catalog.extent(next) {
                    Ok(e) if e.object == ext.object => end = e.range.end.max(end),
                    _ => break,
                }
                if end >= cap {
                    break;
                }
            }
            end
        };
        let mut advice = streams.on_read(ext.range.start, ext.range.end, &mut sample_end);
        advice.followed = followed;
        if advice.hit {
            self.stats.prefetch_hits.fetch_add(1, Relaxed);
        }
        if let Some(r) = advice.prefetch.as_ref().filter(|_| !followed) {
            // Reads along an announced order are read ahead by it alone. A full queue drops
            // the request: the thread is behind, and the reader's own misses ask for it.
            let pass = self
                .ledgers
                .get(ext.object as usize)
                .map_or(1, |l| l.pass_of(&ext.range));
            if self
                .prefetch
                .try_send((ext.object, r.clone(), pass))
                .is_ok()
            {
                self.stats.prefetch_requests.fetch_add(1, Relaxed);
            }
        }
        advice
    }

    /// Moves the stream `ext` continues past it without a READ (a pushed sample).
    fn skip(&self, ext: &Extent) {
        if let Some(s) = self.streams.get(ext.object as usize) {
            s.skip(&ext.range);
        }
    }

    /// Asks the storage for the stored bytes of `ext` now (decode-ahead).
    pub fn will_need(&self, ext: &Extent) {
        self.samples.storage().will_need(ext.object, &ext.range);
    }

    /// Releases the stored pages of bytes `served` of `ext` (see the module doc). Returns true
    /// when pages were dropped.
    pub fn release_served(&self, ext: &Extent, served: Range<u64>) -> bool {
        let r = ext.range.start + served.start..ext.range.start + served.end;
        if let Some(l) = self.ledgers.get(ext.object as usize) {
            l.serve(&r);
        }
        // The kernel drops whole pages only: a sample's last page goes too where the rest of
        // it is padding (samples aligned to pages), else it stays until the next sample's
        // bytes in it are served and the kernel reclaims it.
        let align = (self.samples.catalog().objects())
            .get(ext.object as usize)
            .map_or(1, |o| o.align);
        let end = if r.end >= ext.range.end && align >= PAGE && align % PAGE == 0 {
            r.end.next_multiple_of(PAGE)
        } else {
            r.end
        };
        if !self.release_stored(ext.object, &(r.start..end)) {
            return false;
        }
        if r.end >= ext.range.end {
            self.stats.samples_evicted.fetch_add(1, Relaxed);
        }
        true
    }

    /// Drops the stored pages of `r` in `obj` unless kept (a warm running would read them again;
    /// `--keep-pack-cache`; the pinned prefix). True when any were dropped.
    fn release_stored(&self, obj: ObjectId, r: &Range<u64>) -> bool {
        if self.opts.keep_cache || self.warm.running() {
            return false;
        }
        let start = r.start.max(self.pinned_in(obj));
        if start >= r.end {
            return false;
        }
        let _ = self.samples.storage().release(obj, &(start..r.end));
        true
    }

    /// Bytes of object `obj` pinned, from its start, rounded up to pages (objects are pinned
    /// one after the other in object order).
    fn pinned_in(&self, obj: ObjectId) -> u64 {
        let base = self.bases.get(obj as usize).copied().unwrap_or(u64::MAX);
        let len = self.samples.storage().len(obj);
        self.pin.pinned_in(base, len)
    }

    /// The kernel forgot inode `ino` (and with it any page it held of it): it may be pushed
    /// again.
    pub fn forgotten(&self, ino: u64) {
        if let Some(r) = crate::ino::record_of(ino) {
            self.push.unmark(r);
            self.push.forget(r);
        }
    }

    /// The kernel was sent inode `ino` (a LOOKUP or READDIRPLUS answer): samples may be
    /// pushed into its page cache from now on.
    pub fn looked_up(&self, ino: u64) {
        if let Some(r) = crate::ino::record_of(ino) {
            self.push.looked_up(r);
        }
    }
}

/// A read-ahead request: object, byte range, and the pass of the read that advised it (see
/// [`ledger`]).
type Prefetch = (ObjectId, Range<u64>, u8);

/// Read-ahead requests waiting for the read-ahead thread at most.
const PREFETCH_QUEUE: usize = 256;

/// Starts the thread that turns read-ahead requests into `will_need` calls (which the storage
/// splits into requests the kernel honours whole), in order, for the bytes its ledger has not
/// had asked for yet, so the FUSE threads never block submitting read-ahead I/O.
fn start_prefetch_thread(samples: Arc<Samples>, ledgers: Arc<Vec<Ledger>>) -> SyncSender<Prefetch> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Prefetch>(PREFETCH_QUEUE);
    let spawned = std::thread::Builder::new()
        .name("loosefs-prefetch".into())
        .spawn(move || {
            let storage = samples.storage();
            for (obj, r, pass) in rx {
                let Some(ledger) = ledgers.get(obj as usize) else {
                    continue;
                };
                for span in ledger.claim(&r, pass) {
                    storage.will_need(obj, &span);
                }
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start the read-ahead thread: {e}");
    }
    tx
}
